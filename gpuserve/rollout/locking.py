"""The fleet-wide rollout lock on the hosts (its commands and rules: gpuserve.rollout.lock): taken
on every host of a run in inventory order, refreshed before every batch and in the background,
broken when stale, released at the end. Used by the rollout (gpuserve.layers.rollout._roll) and
by a converge that writes what a rollout moves (hold_writer_lock). docs/rollout.md, "The lock"."""

from __future__ import annotations

import getpass
import os
import socket
import time
import uuid
from typing import TYPE_CHECKING

import gevent
from pyinfra import logger
from pyinfra.api.exceptions import OperationError

from gpuserve.rollout import lock
from gpuserve.rollout.lock import LockHolder
from gpuserve.rollout.remote import COMMAND_TIMEOUT_S, MoveFailed, run, shell

if TYPE_CHECKING:
    from gpuserve.config import HostSettings


def refresh_every_s(stale_s: float) -> float:
    """How often the background refresher beats: a quarter of the stale limit, 5 to 300 s."""
    return max(5.0, min(stale_s / 4, 300.0))


def keep_fresh(hosts: list, me: LockHolder, every_s: float) -> None:
    while True:
        gevent.sleep(every_s)
        try:
            beat(hosts, me)
        except MoveFailed as exc:   # the next batch's refresh stops the rollout
            logger.warning(f"    {exc}")


def holder(kind: str) -> LockHolder:
    node = socket.gethostname()
    now = time.time()
    return LockHolder(run="r" + uuid.uuid4().hex[:11], who=f"{getpass.getuser()}@{node}", node=node,
                      pid=os.getpid(), kind=kind, since=now, beat=now)


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def lock_all(hosts: list, me: LockHolder, settings: dict[str, HostSettings]) -> list:
    """Take the lock on every host of the run, in inventory order; on a live lock held by another
    rollout, give back what was taken and refuse, naming the holder. Returns the hosts locked."""
    taken: list = []
    try:
        for h in hosts:
            s = settings[h.name]
            ok, held = lock.parse_lock_output(run(h, lock.lock_take(me)))
            if not ok:
                now = time.time()
                why = lock.stale_reason(held, me, now, s.rollout_lock_stale_s, s.force_unlock,
                                           pid_alive)
                who = held.describe(now) if held else "an unreadable lock"
                if why is None:
                    raise OperationError(
                        f"{me.kind} refused: {h.name} is locked by {who}; another rollout is moving "
                        f"hosts. Wait for it to finish. If it is gone for good (its control node "
                        f"died), break the lock with --data force_unlock={held.run if held else '?'}"
                        f" (the lock goes stale by itself after rollout_lock_stale_s = "
                        f"{s.rollout_lock_stale_s} s without a refresh)")
                logger.warning(f"    [{h.name}] breaking the rollout lock of {who}: {why}")
                if not break_stale(h, held, me):
                    raise OperationError(f"{me.kind} refused: another rollout took the lock on "
                                         f"{h.name} while this one was breaking the stale one")
            taken.append(h)
        logger.info(f"--> rollout lock {me.run} held on {len(taken)} host(s) by {me.who}")
        return taken
    except (OperationError, MoveFailed) as exc:
        unlock(taken, me)
        if isinstance(exc, MoveFailed):
            raise OperationError(f"{me.kind} not started: taking the rollout lock failed: {exc}") from None
        raise


def break_stale(h, held: LockHolder | None, me: LockHolder) -> bool:
    """Replace a stale lock with ours; False when another rollout got there first."""
    if held is not None:
        return shell(h, lock.lock_replace(held.run, me), COMMAND_TIMEOUT_S)[0]
    run(h, f"rm -f {lock.LOCK_FILE}")   # unreadable: not a lock any rollout can hold
    return lock.parse_lock_output(run(h, lock.lock_take(me)))[0]


def beat(hosts: list, me: LockHolder) -> None:
    """Refresh the lock on every host (each batch), so a long rollout never looks stale."""
    fresh = LockHolder(**{**me.__dict__, "beat": time.time()})
    for h in hosts:
        try:
            ok, _ = shell(h, lock.lock_replace(me.run, fresh), COMMAND_TIMEOUT_S)
        except MoveFailed as exc:   # unreachable now: its own move (if any) reports it
            logger.warning(f"    could not refresh the rollout lock: {exc}")
            continue
        if not ok:
            raise MoveFailed(f"{h.name}: the rollout lock is no longer this run's ({me.run}); "
                              "somebody broke it: stopping")


def unlock(hosts: list, me: LockHolder, remove_dir: bool = False) -> None:
    for h in hosts:
        try:
            shell(h, lock.lock_release(me.run, remove_dir), COMMAND_TIMEOUT_S)
        except MoveFailed as exc:   # unreachable: the lock stays until it is stale or broken
            logger.warning(f"    could not release the rollout lock: {exc}")
