"""Rolling upgrades and rollbacks: which host moves when, and the commands of one move.

A move takes one deployment on one host from the release it serves to a target release:

    out of the proxy -> stop (drains) -> switch current -> start -> readiness gate -> back in

Hosts move in batches of ``max_unavailable``, in inventory order. A host whose gate fails goes back
to the release it served, the rollout stops, and hosts not yet reached are never touched. Pure
Python; gpuserve.layers.rollout runs it against the hosts.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Iterable, Sequence

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


def stop(deployment: str) -> str:
    """systemd sends SIGTERM to the engine only; in-flight requests get --shutdown-timeout s."""
    return f"systemctl stop {layout.unit_name(deployment)}"


def start(deployment: str) -> str:
    unit = layout.unit_name(deployment)
    return f"systemctl reset-failed {unit} 2>/dev/null; systemctl start --no-block {unit}"


def read_pointers(deployment: str) -> str:
    d = layout.deployment_dir(deployment)
    return f"echo \"$(readlink {d}/current) $(readlink {d}/previous)\""
