"""The fleet-wide rollout lock's commands and rules (pure): who holds it, how a run takes,
refreshes, breaks and releases it. gpuserve.layers.rollout runs them on the hosts."""

from __future__ import annotations

import json
import posixpath
import re
import shlex
import time
from dataclasses import asdict, dataclass
from typing import Callable

from gpuserve import layout

# --- the fleet-wide rollout lock ----------------------------------------------------------------
# One rollout at a time: a rollout takes this lock on every host of its run, in inventory order,
# before its first move, refreshes it at every batch and releases it at the end. A second rollout
# (another terminal, another control node) finds it held and refuses, naming the holder.

LOCK_FILE = layout.ROLLOUT_LOCK_FILE   # root-only; not the service user's home
LOCK_TAKEN, LOCK_HELD = "gpuserve-lock: taken", "gpuserve-lock: held"
RUN_ID = re.compile(r"r[0-9a-f]{11}")   # a letter first: --data never reads it as a number


@dataclass(frozen=True)
class LockHolder:
    run: str     # a random id per rollout run (what force_unlock names)
    who: str     # user@control-node
    node: str    # the control node's host name
    pid: int     # the pyinfra process on that node
    kind: str    # upgrade | rollback | ...
    since: float  # when it was taken (epoch seconds)
    beat: float   # last refresh (the rollout refreshes it at every batch)

    def to_json(self) -> str:
        return json.dumps(asdict(self), sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> "LockHolder | None":
        try:
            data = json.loads(text)
            return cls(**{f: data[f] for f in cls.__dataclass_fields__})
        except (ValueError, TypeError, KeyError):
            return None

    def describe(self, now: float) -> str:
        since = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(self.since))
        return (f"{self.kind} run {self.run} by {self.who} (pid {self.pid}) since {since}, "
                f"last seen {max(0, now - self.beat):.0f} s ago")


def _marker(run: str) -> str:
    """How a run id appears in the lock file (LockHolder.to_json's sorted keys)."""
    return '"run": "' + run + '"'


def _locked(command: str) -> str:
    """``command`` under the lock directory's mutex (flock): takes, refreshes, breaks and releases
    never interleave on one host."""
    d = posixpath.dirname(LOCK_FILE)
    return (f"mkdir -p {d} && chmod 700 {d} && "
            f"flock -w 30 {d}/.mutex sh -c {shlex.quote(command)}")


def lock_take(holder: LockHolder) -> str:
    """Create the lock whole and at once (a private temp file, then a hard link, which fails if
    the lock exists), or print who holds it."""
    q = shlex.quote
    tmp = f"{LOCK_FILE}.{holder.run}"
    return _locked(
        f"umask 077; printf '%s\\n' {q(holder.to_json())} > {tmp} && "
        f"if ln {tmp} {LOCK_FILE} 2>/dev/null; then rm -f {tmp}; echo {q(LOCK_TAKEN)}; "
        f"else rm -f {tmp}; echo {q(LOCK_HELD)}; cat {LOCK_FILE}; fi")


def lock_replace(old_run: str, holder: LockHolder) -> str:
    """Write ``holder`` over the lock only while it still names ``old_run`` (a refresh of our own
    lock, or breaking a stale one); exits non-zero when somebody else holds it by then."""
    q = shlex.quote
    tmp = f"{LOCK_FILE}.{holder.run}"
    return _locked(f"umask 077; grep -qF {q(_marker(old_run))} {LOCK_FILE} && "
                   f"printf '%s\\n' {q(holder.to_json())} > {tmp} && mv -f {tmp} {LOCK_FILE}")


def lock_release(run: str, remove_dir: bool = False) -> str:
    """Remove the lock only if this run holds it; ``remove_dir``: its directory too (a
    decommission, which leaves nothing of gpuserve's on the host), and make none when it is gone."""
    q = shlex.quote
    if not remove_dir:
        return _locked(f"if grep -qF {q(_marker(run))} {LOCK_FILE} 2>/dev/null; "
                       f"then rm -f {LOCK_FILE}; fi")
    d = posixpath.dirname(LOCK_FILE)
    inner = f"if grep -qF {q(_marker(run))} {LOCK_FILE} 2>/dev/null; then rm -rf {d}; fi"
    return f"if [ -d {d} ]; then flock -w 30 {d}/.mutex sh -c {q(inner)}; fi"


def parse_lock_output(output: str) -> tuple[bool, LockHolder | None]:
    """``lock_take``'s output -> (taken, the holder when it was held)."""
    lines = output.strip().splitlines()
    if lines and lines[0] == LOCK_TAKEN:
        return True, None
    return False, LockHolder.from_json("\n".join(lines[1:]))


def stale_reason(held: LockHolder | None, me: LockHolder, now: float, stale_after_s: int,
                 force_unlock: str | None, pid_alive: Callable[[int], bool]) -> str | None:
    """Why a held lock may be broken, or None when it must be respected."""
    if held is None:
        return "the lock file is unreadable (not written by gpuserve, or cut short)"
    if force_unlock is not None and force_unlock == held.run:
        return f"force_unlock={held.run} names it"
    if held.node == me.node and not pid_alive(held.pid):
        return f"its rollout (pid {held.pid} on this control node) is gone"
    if now - held.beat > stale_after_s:
        return (f"not refreshed for {now - held.beat:.0f} s, longer than rollout_lock_stale_s "
                f"({stale_after_s} s)")
    return None
