"""Run a rollout (upgrade or rollback) over the hosts of this pyinfra run, batch by batch.

pyinfra's own ``--serial`` visits hosts in no fixed order and does not stop a rollout reliably
(pyinfra issue 1195), so the batches are driven here: one operation, run once, that moves the
hosts in inventory order, ``max_unavailable`` at a time, and stops at the first failed gate.
The plan is computed before anything runs, so ``--dry`` prints it and changes nothing.
"""

from __future__ import annotations

import sys
import time

import gevent
from pyinfra import host, logger
from pyinfra.api.exceptions import OperationError, PyinfraError
from pyinfra.api.state import BaseStateCallback
from pyinfra.context import ctx_host, ctx_state
from pyinfra.operations import python

from gpuserve import layout, rollout
from gpuserve.config import HostSettings
from gpuserve.layers import cache_seed, rotation, stack_move
from gpuserve.rollout import canary_bake
from gpuserve.rollout.gate import gate as _gate
from gpuserve.layers.context import all_settings, deployment_state  # noqa: F401 - the deploys read it here
from gpuserve.rollout.locking import beat as _beat, holder as _holder, keep_fresh as _keep_fresh
from gpuserve.rollout.locking import lock_all as _lock_all, refresh_every_s, unlock as _unlock
from gpuserve.rollout.remote import COMMAND_TIMEOUT_S, MoveFailed as _MoveFailed
from gpuserve.rollout.remote import run as _run, shell as _shell
from gpuserve.rollout import LockHolder, Move, pipeline, preconditions


def _hosts_in_order(state) -> list:
    return [h for h in state.inventory if h in state.active_hosts]


def add_rollout(kind: str, moves: list[Move]) -> None:
    """Record this host's moves and add the rollout operation (one for the whole run; it runs
    after every host's other operations and moves the hosts batch by batch)."""
    state = ctx_state.get()
    planned = getattr(state, "_gpuserve_moves", None)
    if planned is None:
        planned = state._gpuserve_moves = {}
    planned[host.name] = moves
    for move in moves:
        logger.info(f"    [{host.name}] {kind} plan: {move}")
    if moves:
        python.call(name=f"Rolling {kind}, in inventory order, max_unavailable hosts at a time",
                    function=_roll, kind=kind, _run_once=True)


def _roll(state, host, kind: str) -> bool:
    """The rollout operation. Returns False (the run fails) with the reason logged, not raised:
    pyinfra would print a Python traceback around a plain message."""
    settings = all_settings()
    order = [h.name for h in _hosts_in_order(state)]
    moves = [m for name in order for m in state._gpuserve_moves.get(name, [])]
    # a percentage counts the hosts in this run (pyinfra's --limit narrows it); the strictest wins
    # hosts of role groups (gateway, monitor) do not count towards max_unavailable nor set it (in a
    # patch they move one at a time, after the serving hosts: gpuserve.rollout.plan.batches)
    serving = [n for n in order if settings[n].serves] or order
    max_unavailable = min((rollout.batch_size(settings[n].max_unavailable, len(serving)) for n in serving),
                          default=1)
    skipped = _skipped_hosts(state, kind, settings)
    if skipped is None:
        return False
    canaries = 0
    # serving hosts max_unavailable at a time; hosts of a role (a patch's gateways and monitors) last
    plan = rollout.batches(moves, order, max_unavailable)
    if rollout.run_kind(kind).canaries:   # the first batches are the canaries (docs/monitoring.md)
        per_kind = min((settings[n].monitor.canary_hosts for n in serving), default=1)
        # one canary (or canary_hosts) per hardware kind; never more hosts out than max_unavailable
        plan, canaries = rollout.canary_plan(moves, order, max_unavailable, min(per_kind, max_unavailable),
                                             kind_of={n: hardware_kind(settings[n]) for n in order})
        why = next((w for b in plan[:canaries] if (w := preconditions.canary_refusal(settings, b))), None)
        if why:
            logger.error(f"--> {why}")
            return False
    stranding = preconditions.reboot_refusals(moves, {n: settings[n].stack.reboot_allowed for n in order})
    if stranding:
        logger.error(f"--> {kind} refused before any host left rotation: " + "; ".join(stranding)
                     + ". Allow it with `reboot: allowed` (or --data reboot=allowed), or reboot those "
                     "hosts yourself in a maintenance window")
        return False
    hosts = _hosts_in_order(state)
    me = _holder(kind)
    taken: list = []
    refresher = None
    try:
        taken = _lock_all(hosts, me, settings)
        # refreshed at every batch, and every few minutes within one (a batch can outlast the
        # stale limit: several deployments, each a stop and a gate of up to ready_timeout_s)
        stale = min(settings[h.name].rollout_lock_stale_s for h in hosts)
        refresher = gevent.spawn(_keep_fresh, taken, me, refresh_every_s(stale))
        _roll_batches(state, kind, plan, settings, beat=lambda: _beat(taken, me), canaries=canaries)
    except OperationError as exc:
        logger.error(f"--> {exc}")
        return False
    finally:
        if refresher is not None:
            refresher.kill()
        _unlock(taken, me)
    if skipped:
        logger.error(f"--> {rollout.skipped_message(kind, skipped)}")
        return False
    return True


def hardware_kind(s: HostSettings) -> str:
    """What a canary stands for: the recipe, and the GPUs it runs on (a recipe can serve more than
    one GPU model; a release that works on one can fail on another)."""
    return f"{s.recipe} on {s.hardware.gpu_count}x {s.hardware.gpu_model}"


def _skipped_hosts(state, kind: str, settings: dict[str, HostSettings]) -> list[str] | None:
    """The hosts of this run that are unreachable or failed to prepare, when the rollout may go on
    without them (max_fail_percentage, the strictest of the run's hosts); None (logged) when not."""
    failed = [h.name for h in state.inventory if h in state.failed_hosts]
    in_run = [h.name for h in state.inventory if h in state.failed_hosts or h in state.active_hosts]
    budget = min((settings[n].max_fail_percentage for n in in_run if n in settings), default=0)
    why = preconditions.fail_budget_refusal(kind, failed, len(in_run), budget)
    if why:
        logger.error(f"--> {why}")
        return None
    for name in failed:
        logger.warning(f"    [{name}] unreachable or failed to prepare: skipped by this {kind} "
                       f"(max_fail_percentage = {budget})")
    return failed


# --- one writer at a time: deploys that touch rotation outside a rollout ---------------------------

def hold_writer_lock(kind: str, *, leaving: bool = False) -> None:
    """For a deploy that writes what a rollout moves (a gateway's worker file, drain flags, units:
    deploys/serve.py, deploys/gateway.py, deploys/decommission.py; ``leaving``: the deploy removes
    gpuserve from the host, so the release removes the lock's directory too): take the rollout
    lock on this host while the deploy prepares, keep it fresh while it runs, and give it back
    when its last operation has ended. During a rollout the deploy refuses before any host is
    touched, naming the rollout; a rollout started meanwhile refuses, naming this run. Not an operation (a second converge still changes
    nothing); with --dry only a warning when the lock is held. pyinfra --serial/--no-wait do not
    end operations one by one: there the lock stays until this process is gone (the next run on
    this control node breaks it) or rollout_lock_stale_s passes."""
    state = ctx_state.get()
    settings = all_settings()
    if "--dry" in sys.argv:
        held = _shell(host, f"cat {rollout.LOCK_FILE} 2>/dev/null", COMMAND_TIMEOUT_S)[1].stdout
        if held.strip():
            h = LockHolder.from_json(held)
            logger.warning(f"    [{host.name}] the rollout lock is held by "
                           f"{h.describe(time.time()) if h else 'an unreadable lock'}: a real run refuses")
        return
    writer = getattr(state, "_gpuserve_writer", None)
    if writer is None:
        writer = state._gpuserve_writer = _Writer(_holder(kind), remove_dir=leaving)
        state.add_callback_handler(writer)
    try:
        writer.hosts += _lock_all([ctx_host.get()], writer.me, settings)
    except OperationError as exc:
        writer.release()
        raise PyinfraError(str(exc)) from None
    if writer.refresher is None:
        stale = settings[host.name].rollout_lock_stale_s
        writer.refresher = gevent.spawn(_keep_fresh, writer.hosts, writer.me, refresh_every_s(stale))


class _Writer(BaseStateCallback):
    """The lock a converge holds; released when the run's last operation ends."""

    def __init__(self, me: LockHolder, remove_dir: bool = False):
        self.me, self.hosts, self.refresher, self.last = me, [], None, None
        self.remove_dir = remove_dir

    def operation_end(self, state, op_hash) -> None:
        if self.last is None:
            self.last = state.get_op_order()[-1]
        if op_hash == self.last:
            self.release()

    def release(self) -> None:
        if self.refresher is not None:
            self.refresher.kill()
        _unlock(self.hosts, self.me, self.remove_dir)
        self.hosts.clear()


def _roll_batches(state, kind: str, plan: list[list[Move]], settings: dict[str, HostSettings],
                  beat=lambda: None, canaries: int = 1) -> None:
    """Move ``plan`` batch by batch; the first ``canaries`` batches each bake (an upgrade's: a
    batch without a release move to judge bakes for 0 s)."""
    hosts = {h.name: h for h in state.inventory}
    for i, batch in enumerate(plan, 1):
        by_host: dict[str, list[Move]] = {}
        for move in batch:
            by_host.setdefault(move.host, []).append(move)
        canary = (f" (canary of {', '.join(sorted({hardware_kind(settings[n]) for n in by_host}))})"
                  if i <= canaries and i < len(plan) else "")
        logger.info(f"--> {kind} batch {i}/{len(plan)}: {', '.join(by_host)}{canary}")
        try:
            beat()
        except _MoveFailed as exc:
            raise OperationError(f"{kind} halted before batch {i}/{len(plan)}: {exc}") from None
        jobs = [gevent.spawn(_move_host_reporting, hosts[name], moves, settings[name])
                for name, moves in by_host.items()]
        gevent.joinall(jobs)
        errors = [job.value for job in jobs if job.value]
        if errors:
            untouched = sorted({m.host for later in plan[i:] for m in later})
            raise OperationError(
                f"{kind} halted in batch {i}/{len(plan)}: " + "; ".join(errors)
                + (f". Not reached, still on their release: {', '.join(untouched)}" if untouched else ""))
        if i <= canaries and i < len(plan):
            breaches = canary_bake.bake(settings, batch, hosts)
            if breaches:
                _canary_back(batch, hosts, settings)
                untouched = sorted({m.host for later in plan[i:] for m in later})
                raise OperationError(
                    f"{kind} halted after the canary bake: {', '.join(by_host)} went back to the "
                    f"release it served; not reached, still on their release: {', '.join(untouched)}\n"
                    + "\n".join(breaches))
        settle = max((settings[name].drain_s for name in by_host if settings[name].proxy), default=0)
        if i < len(plan) and settle:
            # load balancers see a host come back only at their next health check: without this
            # wait the next batch could leave the drained hosts and the returning ones both out
            logger.info(f"    waiting {settle} s for load balancers to send to batch {i} again")
            time.sleep(settle)


def _canary_back(batch: list, hosts: dict, settings: dict[str, HostSettings]) -> None:
    """Every canary deployment back to the release it served, host by host (each a move)."""
    for move in batch:
        if move.bakes:   # a release move: back to the release it served
            back = canary_bake.reverse(move)
            logger.warning(f"    [{move.host}] canary breach: {back}")
            try:
                _move_deployment(hosts[move.host], back, settings[move.host])
            except _MoveFailed as exc:
                logger.error(f"    [{move.host}] could not go back: {exc}")


def _switch(h, move: Move, current: str, previous: str | None, s: HostSettings,
            before_in=None) -> str | None:
    """The change of a release move: stop, point current (and previous) at releases; then the
    pipeline's start -> gate -> in (``before_in``: its hook). None when the gate passed and the
    deployment is back in; else the gate's last line."""
    stop_s = s.deployment(move.deployment).shutdown_timeout_s + COMMAND_TIMEOUT_S
    _run(h, rollout.stop(move.deployment), timeout=stop_s)
    _run(h, " && ".join(rollout.pointer_commands(move.deployment, current, previous)))
    return pipeline.start_gate_in(h, s, [move.deployment], gate=_gate, back_in=rotation.back_in,
                                  before_in=before_in).get(move.deployment)


def _moved_already(h, move: Move) -> bool:
    """The plan was made before the lock was held: another rollout may have moved the host since."""
    if move.resumes:
        return False
    pointers = _run(h, rollout.read_pointers(move.deployment)).split()
    current = pointers[0].rsplit("/", 1)[-1] if pointers else None
    drained = _shell(h, f"test -e {rollout.drain_flag(move.deployment)}", COMMAND_TIMEOUT_S)[0]
    active = _shell(h, f"systemctl is-active --quiet {layout.unit_name(move.deployment)}",
                    COMMAND_TIMEOUT_S)[0]
    if preconditions.moved_already(current, move.to_release, drained, active):
        logger.info(f"    [{h.name}] {move.deployment} already serves {move.to_release} (another "
                    "rollout moved it since this one was planned): skipped")
        return True
    return False


def _move_host_reporting(h, moves: list[Move], s: HostSettings) -> str | None:
    """_move_host in a greenlet: the reason it failed, or None."""
    try:
        _move_host(h, moves, s)
    except _MoveFailed as exc:
        return str(exc)
    except Exception as exc:  # never let a surprise count as a finished move
        logger.exception(f"    [{h.name}] move failed unexpectedly")
        return f"{h.name}: move failed unexpectedly ({type(exc).__name__}: {exc})"
    return None


def _move_host(h, moves: list[Move], s: HostSettings) -> None:
    """Move the host's deployments one at a time, so it keeps serving the others: each goes out
    of rotation, is switched and gated, and comes back in before the next one leaves. On a failed
    gate, that deployment goes back to what it served, and the move stops (raises). A GPU-stack
    move (gpuserve.layers.stack_move) comes first and takes every deployment out at once."""
    for move in rollout.stack_moves_first(moves):
        MOVERS[move.change](h, move, s)


def _move_release(h, move: Move, s: HostSettings) -> None:
    if not _moved_already(h, move):
        _move_deployment(h, move, s)


def _move_deployment(h, move: Move, s: HostSettings) -> None:
    pipeline.out_drained(h, s, [move.deployment], take_out=rotation.take_out,
                         wait_drained=rotation.wait_drained)
    before = _run(h, rollout.read_pointers(move.deployment)).split()
    old_current = before[0].rsplit("/", 1)[-1] if before else None
    old_previous = before[1].rsplit("/", 1)[-1] if len(before) > 1 else None
    t0 = time.monotonic()
    cache_seed.seed(h, s, move.deployment, move.to_release)
    logger.info(f"    [{h.name}] {move}: stopping, switching, starting")

    def ready(passed: list[str]) -> None:
        if passed:
            logger.info(f"    [{h.name}] {move.deployment} ready on {move.to_release} "
                        f"after {time.monotonic() - t0:.0f} s")
    why = _switch(h, move, move.to_release, move.previous, s, before_in=ready)
    if why is None:
        cache_seed.publish(h, s, move.deployment, move.to_release)
        return
    logger.warning(f"    [{h.name}] {move.deployment} failed its gate on {move.to_release}: {why}")
    if old_current == move.to_release:   # resuming an interrupted move: back to what it left
        old_current = old_previous if old_previous != move.to_release else None
    if old_current is None:
        raise _MoveFailed(f"{h.name} {move.deployment}: gate failed on {move.to_release} ({why}); "
                          + ("no other release to go back to" if move.resumes
                             else "it served nothing before") + ", so it stays down")
    why_back = _switch(h, move, old_current, old_previous, s)
    raise _MoveFailed(
        f"{h.name} {move.deployment}: gate failed on {move.to_release} ({why}); "
        + (f"rolled back to {old_current}, serving again" if why_back is None
           else f"rolled back to {old_current} but it is not ready either ({why_back})"))


# each reason's move (Move.change, StackMove.change, PatchMove.change): the one place where a
# move's kind picks its steps (the stack and OS-update moves share theirs: stack_move.CHANGES)
MOVERS = {"release": _move_release, "stack": stack_move.move_stack, "os-update": stack_move.move_stack}
