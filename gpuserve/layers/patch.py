"""OS and kernel updates as a rollout reason: the host's PatchMove from its facts now.

deploys/patch.py adds one move per serving host with something to update (gpuserve.patch); the
rollout (gpuserve.layers.rollout) runs them through the GPU-stack move's pipeline
(gpuserve.layers.stack_move): out, drained, stopped, updated within the holds, rebooted if the
kernel changed (after checking its GPU driver module was built), verified, admitted, started,
gated, back in. docs/patching.md.
"""

from __future__ import annotations

from pyinfra import host, logger
from pyinfra.facts.files import File

from gpuserve import patch, stack
from gpuserve.config import HostSettings
from gpuserve.facts.apt import AptHolds
from gpuserve.facts.kernel import KernelState, PendingUpgrades
from gpuserve.layers.gpu_stack import _state, host_os
from gpuserve.patch import PatchMove


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
    kernels_new = patch.new_kernels(upgrades)
    serving = tuple(d.name for d in settings.deployments if _state(settings, d.name).current)
    move = PatchMove(host.name, stack.describe(s) if s.vendor else "no GPU stack", reason,
                     tuple(sorted(stack.pins(s).items())), serving, os,
                     upgrades=tuple(u.package for u in upgrades),
                     kernel=patch.newest(kernels_new) if kernels_new else kernels.change)
    for u in upgrades:
        logger.debug(f"    [{host.name}] update {u.package} {u.installed or '(new)'} -> {u.version}")
    return move
