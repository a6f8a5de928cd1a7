"""OS and kernel updates as a rollout reason: the host's PatchMove from its facts now.

deploys/patch.py adds one move per host with something to update (gpuserve.patch); the rollout
(gpuserve.layers.rollout) runs them through the GPU-stack move's pipeline
(gpuserve.layers.stack_move): out, drained, stopped, updated within the holds, rebooted if the
kernel changed (after checking its GPU driver module was built), verified, admitted, started,
gated, back in. A gateway or monitor host (no deployment, no GPU driver) is updated, rebooted
if its kernel changed, and waits for its role's services; a gateway first needs another gateway
that serves (other_gateways_serve), unless patch_last_gateway. Also the refusal of an upgrade on
a host whose patch move did not finish (refuse_unfinished_patch). docs/patching.md.
"""

from __future__ import annotations

import time

from pyinfra import host, logger
from pyinfra.api.exceptions import PyinfraError
from pyinfra.context import ctx_state
from pyinfra.facts.files import File

from gpuserve import gateway, monitoring, patch, stack
from gpuserve.config import HostSettings
from gpuserve.facts.apt import AptHolds
from gpuserve.facts.kernel import KernelState, PendingUpgrades
from gpuserve.layers.context import all_settings, deployment_state, host_plan
from gpuserve.layers.gpu_stack import host_os, recorded_stack
from gpuserve.rollout.remote import COMMAND_TIMEOUT_S, MoveFailed, connected, shell
from gpuserve.patch import PatchMove
from gpuserve.rollout import preconditions


def patch_move(settings: HostSettings) -> PatchMove | None:
    """The host's OS update move; None when nothing is to update, no kernel waits for a reboot,
    and no earlier patch move is unfinished. Raises ValueError naming the host when apt would
    move a held package (it never should: apt keeps held packages back)."""
    upgrades = host.get_fact(PendingUpgrades)
    kernels = host.get_fact(KernelState)
    touched = patch.held_in(upgrades, host.get_fact(AptHolds))
    if touched:
        raise ValueError(f"{host.name}: apt would change held packages {', '.join(touched)}; "
                         "deploys/patch.py never changes the GPU stack's set (deploys/upgrade.py does)")
    reason = patch.pending_reason(upgrades, kernels)
    if reason is None and host.get_fact(File, path=patch.PATCH_MOVING):
        reason = "an earlier OS update move did not finish (the host is still out of rotation)"
    if reason is None:
        return None
    s = settings.stack
    os = host_os() if s.enabled and s.vendor else "debian12"   # unused by a patch move's steps
    if s.enabled and s.vendor:   # the move verifies the driver against group data's pins
        why = preconditions.stack_change_refusal(host.name, stack.pins(s), recorded_stack())
        if why:
            raise PyinfraError(why)
    kernels_new = patch.new_kernels(upgrades)
    plan = host_plan(engine=False)
    serving = tuple(d.name for d in settings.deployments if deployment_state(plan, d.name).current)
    is_gateway = settings.gateway is not None
    role = patch.role_of(settings.serves, is_gateway)
    if role == patch.GATEWAY and settings.patch_last_gateway:
        reason += "; patch_last_gateway: may go while no other gateway serves"
    move = PatchMove(host.name, stack.describe(s) if s.vendor else "no GPU stack", reason,
                     tuple(sorted(stack.pins(s).items())), serving, os,
                     upgrades=tuple(u.package for u in upgrades),
                     kernel=patch.newest(kernels_new) if kernels_new else kernels.change,
                     role=role, units=patch.role_units(is_gateway, monitoring.MONITOR_GROUP in settings.groups))
    for u in upgrades:
        logger.debug(f"    [{host.name}] update {u.package} {u.installed or '(new)'} -> {u.version}")
    return move


def refuse_unfinished_patch(kind: str, settings: HostSettings) -> None:
    """Raise (the run stops before any host is touched) when an OS update move did not finish on
    this host: only deploys/patch.py may finish it (gpuserve.patch.unfinished_patch_refusal)."""
    why = preconditions.unfinished_patch_refusal(kind, settings.host, bool(host.get_fact(File, path=patch.PATCH_MOVING)))
    if why:
        raise PyinfraError(why)


# --- during the move of a gateway or monitor host (gpuserve.layers.stack_move) --------------------
ROLE_READY_S = 180   # a role's services up again, and a gateway serving a worker, after the update


def _gateway_state(gh, g, need_worker: bool = True) -> str | None:
    """Why gateway ``gh`` does not serve clients now (None: it does)."""
    try:
        connected(gh, "a gateway that must serve while another one is updated")
        active = shell(gh, patch.gateway_units_command(), COMMAND_TIMEOUT_S)[0]
        ok, out = shell(gh, f"curl -fsS --max-time 5 {gateway.admin_url(g, '/workers')}", COMMAND_TIMEOUT_S)
    except MoveFailed as exc:
        return str(exc)
    return preconditions.gateway_problem(active, out.stdout if ok else None, need_worker)


def other_gateways_serve(h, s: HostSettings) -> None:
    """Before a gateway's update: if it serves clients, another gateway of the inventory must
    too, unless patch_last_gateway allows the last one to go. Raises MoveFailed (nothing changed
    yet)."""
    state = ctx_state.get()
    every = all_settings()
    others = {gh.name: _gateway_state(gh, every[gh.name].gateway) for gh in state.inventory
              if gh.name != h.name and gh.name in every and every[gh.name].gateway is not None}
    mine = _gateway_state(h, s.gateway)
    why = preconditions.last_gateway_refusal(mine is None, others, s.patch_last_gateway)
    if why:
        raise MoveFailed(f"{h.name}: OS update move refused before any change: {why}")
    serving = [n for n, v in others.items() if v is None]
    if mine is not None:
        logger.warning(f"    [{h.name}] this gateway does not serve now ({mine}): updated all the same")
    elif serving:
        logger.info(f"    [{h.name}] another gateway serves: {', '.join(serving)}")
    else:
        logger.warning(f"    [{h.name}] the last serving gateway is updated (patch_last_gateway): its "
                       "clients get errors until it is back")


def role_ready(h, move: PatchMove, s: HostSettings) -> str | None:
    """After the update (and reboot): the role's services this host runs (enabled) active, and a
    gateway's smg answering with a worker ready and healthy, within ROLE_READY_S. Why not (None:
    ready): the next gateway never goes while this one does not serve. A gateway that serves too
    has its own deployments still out here: its smg must answer (back_in then waits for them)."""
    if not move.units:
        return None
    out = shell(h, patch.enabled_units_command(move.units), COMMAND_TIMEOUT_S)[1]
    units = [u for u in out.stdout.split() if u in move.units]
    smg = s.gateway is not None and gateway.UNIT in units
    deadline = time.monotonic() + ROLE_READY_S
    while units:
        out = shell(h, f"systemctl is-active {' '.join(units)}", COMMAND_TIMEOUT_S)[1]
        down = patch.inactive(units, out.stdout)
        why = f"not active: {', '.join(down)}" if down else None
        if why is None and smg:
            why = _gateway_state(h, s.gateway, need_worker=not move.deployments)
        if why is None:
            logger.info(f"    [{h.name}] {' '.join(units)} active" + ("; the gateway serves" if smg else ""))
            return None
        if time.monotonic() > deadline:
            return f"{h.name}: {ROLE_READY_S} s after the update: {why}"
        time.sleep(2)
    logger.info(f"    [{h.name}] none of {', '.join(move.units)} is enabled here: nothing to wait for")
    return None
