"""Which host moves when (pure): the moves a rollout plans, and the batches it moves them in.

A release move takes one deployment on one host from the release it serves to a target release;
a GPU-stack move (StackMove) or an OS-update move (gpuserve.patch.PatchMove) takes a whole host.
Hosts move in batches of ``max_unavailable``, in inventory order. Pure Python;
gpuserve.rollout.pipeline moves one host, gpuserve.layers.rollout runs the batches.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Iterable, Mapping, Sequence

from gpuserve import gateway, layout, monitoring
from gpuserve.rollout.preconditions import fail_budget_refusal, reboot_refusals  # noqa: F401 - the run's rules


@dataclass(frozen=True)
class Move:
    host: str
    deployment: str
    from_release: str | None
    to_release: str
    previous: str | None   # what ``previous`` points at after the move

    # what every move tells the rollout about itself (class attributes, not fields): its change
    # step (gpuserve.layers.rollout.MOVERS), whether it takes the whole host out, its reboot, its
    # role (role hosts move last: batches)
    change = "release"
    whole_host = False
    reboot_needed = ""
    role = None

    @property
    def resumes(self) -> bool:
        """Finishes a move that was interrupted after its switch (the run was killed, say)."""
        return self.from_release == self.to_release

    def __str__(self) -> str:
        if self.resumes:
            return (f"{self.host} {self.deployment}: {self.to_release} is current but not serving "
                    "in rotation (an interrupted rollout): restart, gate, back in")
        return f"{self.host} {self.deployment}: {self.from_release or '(none)'} -> {self.to_release}"

    @property
    def bakes(self) -> bool:
        """A canary bake can judge it: a new release against the one it served."""
        return not self.resumes and self.from_release is not None


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

    change = "stack"     # its change step (gpuserve.layers.stack_move.CHANGES)
    whole_host = True    # every deployment of the host out at once
    bakes = False        # the release stays: a canary bake cannot tell it apart
    role = None
    marker = layout.STACK_MOVING   # began on the host and not finished (a rerun finishes it)

    def __str__(self) -> str:
        return f"{self.host} GPU stack -> {self.to_stack} ({self.reason})"

    @property
    def title(self) -> str:
        return f"GPU stack move to {self.to_stack}"


def stack_moves_first(moves: Sequence) -> list:
    """A host's stack move runs before its release moves (it restarts every engine anyway)."""
    return sorted(moves, key=lambda m: not m.whole_host)


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


@dataclass(frozen=True)
class RunKind:
    """What a kind of rollout (upgrade, rollback, patch) does beyond moving hosts in batches."""
    canaries: bool = False   # its first batches are canaries (canary_plan), each baked before the next


RUN_KINDS = {"upgrade": RunKind(canaries=True)}   # a rollback or a patch: plain batches


def run_kind(kind: str) -> RunKind:
    return RUN_KINDS.get(kind, RunKind())


def skipped_message(kind: str, skipped: Sequence[str]) -> str:
    """What a rollout that went on without some hosts says at its end (it exits non-zero)."""
    return (f"{kind} finished on the reachable hosts but SKIPPED {', '.join(skipped)} (unreachable "
            f"or failed to prepare; within max_fail_percentage): they still serve their old release "
            f"and stack. Run the same command again once they answer, to finish them")


# hosts of role groups move after the serving hosts, one at a time: monitors, then gateways (a
# gateway's update drops the requests in flight on it; a serving host's move goes out of and back
# into every gateway, each must answer). Only an OS-update move has a role (gpuserve.patch.role_of)
ROLE_ORDER = (monitoring.MONITOR_GROUP, gateway.GATEWAY_GROUP)


def batches(moves: Sequence[Move], host_order: Sequence[str], max_unavailable: int) -> list[list[Move]]:
    """Group moves by host (all deployments of a host move together), ``max_unavailable`` hosts
    per batch, hosts in inventory order; then the hosts of a role (``role``: ROLE_ORDER), one
    host per batch."""
    role = {m.host: m.role for m in moves if m.role}
    out = _by_host([m for m in moves if m.host not in role], host_order, max_unavailable)
    for r in ROLE_ORDER:
        out += _by_host([m for m in moves if role.get(m.host) == r], host_order, 1)
    return out


def _by_host(moves: Sequence[Move], host_order: Sequence[str], max_unavailable: int) -> list[list[Move]]:
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
