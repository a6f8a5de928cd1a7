"""Rolling upgrades and rollbacks: which host moves when, and the commands of one move.

A move takes one deployment on one host from the release it serves to a target release:

    out of the proxy -> stop (drains) -> switch current -> start -> readiness gate -> back in

Hosts move in batches of ``max_unavailable``, in inventory order. A host whose gate fails goes back
to the release it served, the rollout stops, and hosts not yet reached are never touched. Pure
Python; gpuserve.layers.rollout runs it against the hosts.
"""

from __future__ import annotations

import json
import posixpath
import re
import shlex
import time
from dataclasses import asdict, dataclass
from typing import Callable, Iterable, Mapping, Sequence

from gpuserve import layout


@dataclass(frozen=True)
class Move:
    host: str
    deployment: str
    from_release: str | None
    to_release: str
    previous: str | None   # what ``previous`` points at after the move

    @property
    def resumes(self) -> bool:
        """Finishes a move that was interrupted after its switch (the run was killed, say)."""
        return self.from_release == self.to_release

    def __str__(self) -> str:
        if self.resumes:
            return (f"{self.host} {self.deployment}: {self.to_release} is current but not serving "
                    "in rotation (an interrupted rollout): restart, gate, back in")
        return f"{self.host} {self.deployment}: {self.from_release or '(none)'} -> {self.to_release}"


@dataclass(frozen=True)
class StackMove:
    """A GPU-stack change on one host: every deployment out, drained and stopped; the held set
    changed; a reboot if the loaded module differs; verify; admission; start; gate; back in."""
    host: str
    to_stack: str                           # gpuserve.stack.describe of the target
    reason: str                             # why the host is not there yet (gpuserve.stack.pending_reason)
    pins: tuple[tuple[str, object], ...]    # the target's stack pins (gpuserve.stack.PIN_KEYS)
    deployments: tuple[str, ...]            # the engines it stops and starts again
    os: str = "debian12"                    # gpuserve.stack.os_key of the host
    rollback: bool = False                  # deploys/rollback.py: the record ends on the target alone
    reboot_needed: str = ""                 # why the move must reboot the host ("" if it need not)

    def __str__(self) -> str:
        return f"{self.host} GPU stack -> {self.to_stack} ({self.reason})"


def stack_moves_first(moves: Sequence) -> list:
    """A host's stack move runs before its release moves (it restarts every engine anyway)."""
    return sorted(moves, key=lambda m: not isinstance(m, StackMove))


def upgrade_move(host: str, deployment: str, current: str | None, desired: str,
                 previous: str | None = None, interrupted: bool = False) -> Move | None:
    """The move an upgrade makes; None when the host already serves ``desired``.

    ``interrupted``: the host is not serving, or is still out of the proxy's rotation, which a
    rollout killed half-way leaves behind. If ``current`` is already ``desired`` the move then
    resumes (restart, gate, back in) instead of leaving the host down.
    """
    if current == desired:
        return Move(host, deployment, current, desired, previous=previous) if interrupted else None
    return Move(host, deployment, current, desired, previous=current)


def rollback_move(host: str, deployment: str, current: str | None, previous: str | None,
                  releases: Iterable[str], named: str | None = None,
                  interrupted: bool = False) -> Move | None:
    """The move a rollback makes; None when the host already serves the target.

    The target is ``previous`` or the named release. Afterwards both pointers name the target:
    running the rollback again finds nothing to do (idempotent), and the release rolled away from
    stays on disk until retention collects it. ``interrupted``: as for upgrade_move.
    """
    if named is not None:
        if named not in set(releases):
            raise ValueError(f"{host}: release {named} of {deployment} is not on the host")
        target = named
    elif previous is None:
        raise ValueError(f"{host}: {deployment} has no previous release to roll back to")
    else:
        target = previous
    if current == target:
        return Move(host, deployment, current, target, previous=target) if interrupted else None
    return Move(host, deployment, current, target, previous=target)


PERCENT = re.compile(r"([1-9][0-9]?|100)%")


def batch_size(max_unavailable: int | str, hosts: int) -> int:
    """Hosts per batch: a number as it is, or a percentage of the ``hosts`` in the run, rounded
    down and at least 1 (as Ansible's ``serial: 10%``): 10% of 25 hosts is 2, of 5 hosts 1."""
    if isinstance(max_unavailable, str):
        m = PERCENT.fullmatch(max_unavailable)
        if not m:
            raise ValueError(f"max_unavailable {max_unavailable!r} is not a percentage like '10%'")
        return max(1, hosts * int(m.group(1)) // 100)
    return max_unavailable


def canary_batches(moves: Sequence, host_order: Sequence[str], max_unavailable: int,
                   canary_hosts: int) -> list[list]:
    """As ``batches``, but the first batch is the first ``canary_hosts`` hosts (the canary, which
    bakes before the rest moves); then ``max_unavailable`` hosts at a time."""
    if canary_hosts < 1:
        raise ValueError("canary_hosts must be at least 1")
    first = batches(moves, host_order, canary_hosts)[:1]
    moved = {m.host for b in first for m in b}
    rest = [m for m in moves if m.host not in moved]
    return first + batches(rest, host_order, max_unavailable)


def canary_hosts_per_kind(moving: Sequence[str], kind_of: Mapping[str, str], per_kind: int) -> list[str]:
    """The first ``per_kind`` moving hosts of each hardware kind (recipe), in inventory order: a
    release that works on one kind can fail on another, so every kind the rollout changes gets its
    own canary. A host without a kind counts as one kind of its own with the others without one."""
    if per_kind < 1:
        raise ValueError("canary_hosts must be at least 1")
    seen: dict[str, int] = {}
    out = []
    for h in moving:
        kind = kind_of.get(h, "")
        if seen.get(kind, 0) < per_kind:
            seen[kind] = seen.get(kind, 0) + 1
            out.append(h)
    return out


def canary_plan(moves: Sequence, host_order: Sequence[str], max_unavailable: int, canary_hosts: int,
                kind_of: Mapping[str, str]) -> tuple[list[list], int]:
    """(batches, how many of the first ones are canaries). The canaries (``canary_hosts`` per
    hardware kind, canary_hosts_per_kind) move first, never more than ``max_unavailable`` at once;
    each canary batch bakes before the next batch moves; then the rest, ``max_unavailable`` hosts at
    a time, in inventory order."""
    moving = [h for h in host_order if any(m.host == h for m in moves)]
    canaries = canary_hosts_per_kind(moving, kind_of, canary_hosts)
    first = batches([m for m in moves if m.host in canaries], canaries, max_unavailable)
    rest = [m for m in moves if m.host not in canaries]
    return first + batches(rest, host_order, max_unavailable), len(first)


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


def skipped_message(kind: str, skipped: Sequence[str]) -> str:
    """What a rollout that went on without some hosts says at its end (it exits non-zero)."""
    return (f"{kind} finished on the reachable hosts but SKIPPED {', '.join(skipped)} (unreachable "
            f"or failed to prepare; within max_fail_percentage): they still serve their old release "
            f"and stack. Run the same command again once they answer, to finish them")


def reboot_refusals(moves: Sequence, reboot_allowed: Mapping[str, bool]) -> list[str]:
    """The stack moves that would strand their host: the change loads a new kernel module, which
    needs a reboot, and the host may not be rebooted. Asked before any host leaves rotation."""
    return [f"{m.host}: {m.reboot_needed} needs a reboot and this host may not be rebooted "
            "(reboot: never)" for m in moves
            if isinstance(m, StackMove) and m.reboot_needed and not reboot_allowed.get(m.host, False)]


def batches(moves: Sequence[Move], host_order: Sequence[str], max_unavailable: int) -> list[list[Move]]:
    """Group moves by host (all deployments of a host move together), ``max_unavailable`` hosts
    per batch, hosts in inventory order."""
    if max_unavailable < 1:
        raise ValueError("max_unavailable must be at least 1")
    by_host: dict[str, list[Move]] = {}
    for move in moves:
        by_host.setdefault(move.host, []).append(move)
    hosts = [h for h in host_order if h in by_host]
    out = []
    for i in range(0, len(hosts), max_unavailable):
        out.append([m for h in hosts[i:i + max_unavailable] for m in by_host[h]])
    return out


# --- the commands of a move (run as root on the host) ------------------------------------------

def drain_flag(deployment: str) -> str:
    """While this file exists the proxy's /health answers 503: load balancers take the host out.
    (Beside the proxy's configuration: nginx's workers must be able to see it.)"""
    return f"/etc/nginx/gpuserve/{deployment}.drain"


def pointer_commands(deployment: str, current: str, previous: str | None) -> list[str]:
    """Point current (and previous) at releases; each an atomic rename over the old link."""
    d = layout.deployment_dir(deployment)
    commands = [f"test -f {d}/releases/{current}/release.json",
                f"ln -sfn releases/{current} {d}/.current.new && mv -T {d}/.current.new {d}/current"]
    if previous:
        commands.append(f"ln -sfn releases/{previous} {d}/.previous.new && "
                        f"mv -T {d}/.previous.new {d}/previous")
    return commands


def out_of_rotation(deployment: str) -> str:
    return f"touch {drain_flag(deployment)}"


def into_rotation(deployment: str) -> str:
    return f"rm -f {drain_flag(deployment)}"


RUNNING_METRICS = ("vllm:num_requests_running", "sglang:num_running_reqs")


def running_requests(metrics_url: str) -> str:
    """Print the engine's running-request gauges (vLLM's or SGLang's), one sample per line."""
    pattern = "|".join(RUNNING_METRICS)
    return (f"curl -fsS --max-time 5 {shlex.quote(metrics_url)} | "
            f"grep -E {shlex.quote('^(' + pattern + ')[{ ]')} || true")


def parse_running(text: str) -> int:
    """Sum of the running-request samples that ``running_requests`` printed (0 when none)."""
    total = 0.0
    for line in text.splitlines():
        parts = line.rsplit(None, 1)
        if len(parts) == 2 and parts[0].split("{", 1)[0] in RUNNING_METRICS:
            try:
                total += float(parts[1])
            except ValueError:
                continue
    return int(total)


def stop(deployment: str) -> str:
    """systemd sends SIGTERM to the engine only; in-flight requests get --shutdown-timeout s."""
    return f"systemctl stop {layout.unit_name(deployment)}"


def start(deployment: str) -> str:
    unit = layout.unit_name(deployment)
    return f"systemctl reset-failed {unit} 2>/dev/null; systemctl start --no-block {unit}"


def read_pointers(deployment: str) -> str:
    d = layout.deployment_dir(deployment)
    return f"echo \"$(readlink {d}/current) $(readlink {d}/previous)\""


# --- the fleet-wide rollout lock ----------------------------------------------------------------
# One rollout at a time: a rollout takes this lock on every host of its run, in inventory order,
# before its first move, refreshes it at every batch and releases it at the end. A second rollout
# (another terminal, another control node) finds it held and refuses, naming the holder.

LOCK_FILE = "/var/lib/gpuserve-rollout/lock"   # root-only; not the service user's home
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


def lock_release(run: str) -> str:
    """Remove the lock only if this run holds it."""
    q = shlex.quote
    return _locked(f"if grep -qF {q(_marker(run))} {LOCK_FILE} 2>/dev/null; "
                   f"then rm -f {LOCK_FILE}; fi")


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
