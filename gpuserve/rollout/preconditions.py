"""Every precondition of a host move, in one place (issue 28; docs/rollout.md, "Preconditions").

Each is a pure rule: what was read of the hosts in, the refusal out (None, or an empty list: it may
go on). A refusal names the host, the setting or state, and what to do. The rules are asked where
their facts are fresh, once each:

    when                               rule                       asked by (in gpuserve/)
    a deploy plans a host              unfinished_patch_refusal   layers/patch refuse_unfinished_patch
                                       stack_change_refusal       layers/patch patch_move
                                       refused_hosts              deploys/decommission.py
    the run, before the lock and       fail_budget_refusal        layers/rollout _skipped_hosts
    before any host leaves rotation    canary_refusal             layers/rollout _roll
                                       reboot_refusals            layers/rollout _roll
    a move, while its host serves      stack_move_refusal         layers/stack_move _preconditions
                                       last_gateway_refusal       layers/patch other_gateways_serve
                                         (gateway_problem)          (a gateway's OS update)
                                       moved_already              layers/rollout _moved_already
    an OS-update move, before and      module_problem             layers/stack_move _patch
    after its reboot

The lock (gpuserve.rollout.lock) and the budget (gpuserve.rollout.plan.batch_size) are the
pipeline's other two rules, each in its own module.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Mapping, Sequence

from gpuserve import gateway, layout, monitoring

if TYPE_CHECKING:
    from gpuserve.config import HostSettings
    from gpuserve.patch import KernelState

PATCH_MOVING = layout.PATCH_MOVING


# --- a deploy plans a host -------------------------------------------------------------------------

def unfinished_patch_refusal(kind: str, host: str, patch_unfinished: bool) -> str | None:
    """Why ``kind`` (upgrade) may not plan ``host`` (None: it may): an OS update move began there
    and did not finish, so the host is out of rotation, its engines stopped, its packages or
    kernel possibly half changed. Only deploys/patch.py finishes that move (its checks: the
    kernel booted, the driver module built); an upgrade would put the host back into rotation
    unchecked."""
    if not patch_unfinished:
        return None
    return (f"{kind} refused: {host}: an OS update move (deploys/patch.py) did not finish there "
            f"({PATCH_MOVING} is present): the host is out of rotation with its engines stopped. "
            f"Run deploys/patch.py again to finish it (it names what failed), then run the {kind} "
            "again")


def stack_change_refusal(host: str, wanted: Mapping, record: Mapping | None) -> str | None:
    """Why deploys/patch.py may not move ``host`` (None: it may): group data's GPU stack pins
    (``wanted``: gpuserve.stack.pins) differ from the stack recorded on the host as current
    (gpuserve.stack.STACK_RECORD). A patch move keeps the stack and verifies the driver against
    group data's pins, so it would fail after the reboot and leave the host out: a stack change
    is deploys/upgrade.py's move. Without a record there is nothing to compare (None)."""
    current = (record or {}).get("current")
    if not isinstance(current, Mapping):
        return None
    changed = [f"{k} {current[k]} -> {wanted[k]}" for k in wanted if k in current and current[k] != wanted[k]]
    if not changed:
        return None
    return (f"patch refused: {host}: its GPU stack is not group data's yet ({', '.join(changed)}). "
            "Roll the stack change out with deploys/upgrade.py first (or put the pins back), then "
            "run deploys/patch.py again; nothing was touched")


def refused_hosts(opted_in: Mapping[str, bool]) -> str | None:
    """Decommission's refusal (None when every host of the run opted in): it names each host
    without ``decommission = True`` and what to set."""
    missing = [name for name, ok in opted_in.items() if not ok]
    if not missing:
        return None
    return (f"decommission refused: {', '.join(missing)} "
            f"{'does' if len(missing) == 1 else 'do'} not set decommission = True. Removing gpuserve "
            "from a host is opt-in: set decommission = True in that host's data (the inventory or "
            "its group data), or leave it out of the run (--limit); nothing was touched")


# --- the run, before the lock and before any host leaves rotation -------------------------------

def fail_budget_refusal(kind: str, failed: Sequence[str], hosts_in_run: int,
                        max_fail_percentage: int) -> str | None:
    """Why the rollout may not start with ``failed`` hosts (unreachable, or failed to prepare) out
    of ``hosts_in_run``; None when it may go on over the rest (within max_fail_percentage)."""
    if not failed:
        return None
    share = 100 * len(failed) / max(hosts_in_run, 1)
    if share <= max_fail_percentage:
        return None
    return (f"{kind} not started: unreachable or failed to prepare: {', '.join(failed)} "
            f"({len(failed)} of {hosts_in_run} hosts, {share:.0f}%, over max_fail_percentage = "
            f"{max_fail_percentage}); no host was switched. Fix them, or allow the rollout to go on "
            f"without them with --data max_fail_percentage=<percent>")


def bake_s(settings: dict[str, HostSettings], batch: list) -> int:
    """The bake of ``batch`` (0: none): the longest canary_bake_s of its hosts, when it has a
    release move to judge."""
    if not any(_judged(m) for m in batch):
        return 0
    return max(settings[m.host].monitor.canary_bake_s for m in batch)


def _judged(m) -> bool:
    return m.bakes


def monitors(settings: dict[str, HostSettings]) -> list[str]:
    return [name for name, s in settings.items() if monitoring.MONITOR_GROUP in s.groups]


def canary_refusal(settings: dict[str, HostSettings], first_batch: list) -> str | None:
    """Why the upgrade may not start: a bake is due and no monitor host can judge it."""
    wait = bake_s(settings, first_batch)
    if wait and not monitors(settings):
        hosts = ", ".join(sorted({m.host for m in first_batch}))
        return (f"upgrade refused: the canary ({hosts}) must bake for canary_bake_s = {wait} s and be "
                "judged by Prometheus, but the inventory has no host in group monitor "
                "(docs/monitoring.md). Add one, or skip the bake with --data canary_bake_s=0")
    return None


def reboot_refusals(moves: Sequence, reboot_allowed: Mapping[str, bool]) -> list[str]:
    """The stack moves that would strand their host: the change loads a new kernel module, which
    needs a reboot, and the host may not be rebooted. Asked before any host leaves rotation."""
    return [f"{m.host}: {m.reboot_needed} needs a reboot and this host may not be rebooted "
            "(reboot: never)" for m in moves
            if m.reboot_needed and not reboot_allowed.get(m.host, False)]


# --- a move, while its host still serves -----------------------------------------------------------

def stack_move_refusal(host: str, target: str, problems: Sequence[str], reboot: str | None,
                       reboot_allowed: bool, free_mib: int | None, min_free_mib: int) -> str | None:
    """Why a GPU-stack move to ``target`` may not begin on ``host`` (None: it may): the target's
    packages apt cannot offer (``problems``), a new module that needs a reboot (``reboot``: what)
    where the host may not be rebooted, less than ``min_free_mib`` free for the packages and the
    DKMS build (``free_mib`` None: unknown, not refused)."""
    problems = list(problems)
    if reboot and not reboot_allowed:
        problems.append(f"{reboot} needs a reboot and this host may not be rebooted (reboot: never)")
    if free_mib is not None and free_mib < min_free_mib:
        problems.append(f"{free_mib} MiB free under /var and /usr, below the {min_free_mib} MiB a "
                        "driver set needs (its packages and the DKMS build)")
    if not problems:
        return None
    return f"{host}: GPU stack move to {target} refused before the host left rotation: " + "; ".join(problems)


def gateway_problem(units_active: bool, workers_json: str | None, need_worker: bool = True) -> str | None:
    """Why a gateway does not serve clients now (None: it does): nginx or smg not active, smg's
    /workers not answering, or (``need_worker``) no worker ready and healthy in it."""
    if not units_active:
        return f"nginx or {gateway.UNIT} is not active"
    if workers_json is None:
        return "smg's /workers does not answer"
    try:
        states = gateway.worker_states(workers_json)
    except (ValueError, AttributeError):
        return f"smg's /workers is not JSON: {workers_json[:120]!r}"
    if need_worker and not any(gateway.serving_healthy(states, wid) for wid in states):
        return f"no worker is ready and healthy in smg ({len(states)} listed)"
    return None


def last_gateway_refusal(serves_now: bool, others: Mapping[str, str | None], allowed: bool) -> str | None:
    """Why a gateway may not be updated now (None: it may): it serves clients and no other
    gateway does. ``others``: every other gateway of the inventory -> why it does not serve (None:
    it does). ``allowed``: patch_last_gateway (a maintenance window). A gateway that does not
    serve itself takes nothing down."""
    if allowed or not serves_now or any(why is None for why in others.values()):
        return None
    state = ("; ".join(f"{n}: {why}" for n, why in sorted(others.items()))
             or "the inventory has no other gateway")
    return (f"no other gateway serves ({state}): updating it would take the fleet's last "
            "entry point down (nginx restarts, a new kernel reboots the host) and drop the requests "
            "in flight on it. Bring another gateway up and run deploys/patch.py again, or allow it "
            "for a maintenance window with `--data patch_last_gateway=True` (clients get errors "
            "until it is back)")


def moved_already(current: str | None, to_release: str, drained: bool, active: bool) -> bool:
    """Whether another rollout made this release move since the plan was made (the plan is made
    before the lock is held): the host serves ``to_release``, in rotation, its unit active. Drained
    or stopped on it means that rollout died half-way: this one finishes the move."""
    return current == to_release and not drained and active


# --- an OS-update move, before its reboot ------------------------------------------------------------

# the DKMS module names the vendors' packages register
DRIVER_MODULES = {"nvidia": ("nvidia", "nvidia-current", "nvidia-open", "nvidia-current-open"),
                  "amd": ("amdgpu",)}


def module_problem(state: KernelState, kernel: str, vendor: str | None, driver_version: str | None,
                   host: str) -> str | None:
    """Why the GPU driver will not load on ``kernel`` (None: its module is built for it, or the
    host has no GPU driver to build). ``driver_version``: the NVIDIA version the module must be."""
    if vendor is None:
        return None
    names = DRIVER_MODULES[vendor]
    built = [m for m in state.dkms if m.module in names and m.kernel == kernel]
    what = "NVIDIA driver" if vendor == "nvidia" else "amdgpu driver"
    if not built:
        others = sorted({m.kernel for m in state.dkms if m.module in names})
        return (f"{host}: no {what} kernel module is built for kernel {kernel} (DKMS has it for "
                f"{', '.join(others) or 'no kernel'}); booting it would leave the host without its GPUs. "
                f"DKMS builds it when the kernel's headers are installed: install linux-headers-{kernel} "
                f"(or the headers metapackage), run `dkms autoinstall -k {kernel}`, then run "
                "deploys/patch.py again")
    if vendor == "nvidia" and driver_version and not any(m.version == driver_version for m in built):
        return (f"{host}: the NVIDIA kernel module built for kernel {kernel} is "
                f"{', '.join(sorted({m.version for m in built}))}, the driver is {driver_version}")
    return None
