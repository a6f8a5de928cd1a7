"""What a deployment looks like on a host: its releases, pointers, unit state and health."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from pyinfra.api import FactBase

from gpuserve import layout
from gpuserve.rollout import drain_flag

if TYPE_CHECKING:
    from gpuserve.releases import Release


@dataclass(frozen=True)
class DeploymentState:
    releases: tuple[str, ...]        # release ids, oldest first (by directory mtime)
    current: str | None
    previous: str | None
    active_state: str                # systemd ActiveState: active, activating, failed, inactive, ""
    enabled: bool
    health: int                      # HTTP status of the engine's /health, 0 when unreachable
    drained: bool = False            # the rollout's drain flag is there: out of the proxy's rotation

    @property
    def serving(self) -> bool:
        return self.active_state == "active" and self.health == 200

    @property
    def interrupted(self) -> bool:
        """Has a release but is down or still drained: what a rollout killed half-way leaves."""
        return self.current is not None and (not self.serving or self.drained)


def parse_deployment_state(lines: list[str]) -> DeploymentState:
    releases: list[tuple[int, str]] = []
    values: dict[str, str] = {}
    for line in lines:
        if line.startswith("release "):
            _, mtime, rid = line.split(" ", 2)
            releases.append((int(mtime), rid))
        else:
            key, _, value = line.partition(":")
            values[key.strip()] = value.strip()

    def release_id(link: str) -> str | None:
        return link.rstrip("/").rsplit("/", 1)[-1] or None

    health = values.get("health", "")
    return DeploymentState(
        releases=tuple(rid for _, rid in sorted(releases)),
        current=release_id(values.get("current", "")),
        previous=release_id(values.get("previous", "")),
        active_state=values.get("active", ""),
        enabled=values.get("enabled") == "enabled",
        health=int(health) if health.isdigit() else 0,
        drained=values.get("drained") == "yes",
    )


class Deployment(FactBase):
    """One deployment's state on the host (gpuserve.layout), read with one command."""

    def command(self, deployment: str, health_url: str) -> str:
        d = layout.deployment_dir(deployment)
        unit = layout.unit_name(deployment)
        return (
            f'for r in {d}/releases/*/; do [ -f "$r/release.json" ] && '
            f'echo "release $(stat -c %Y "$r") $(basename "$r")"; done 2>/dev/null; '
            f'echo "current: $(readlink {d}/current 2>/dev/null)"; '
            f'echo "previous: $(readlink {d}/previous 2>/dev/null)"; '
            f'echo "active: $(systemctl show -p ActiveState --value {unit} 2>/dev/null)"; '
            f'echo "enabled: $(systemctl is-enabled {unit} 2>/dev/null)"; '
            f'echo "drained: $(test -e {drain_flag(deployment)} && echo yes)"; '
            f'echo "health: $(curl -s -o /dev/null -w %{{http_code}} --max-time 3 {health_url} 2>/dev/null)"'
        )

    def process(self, output: list[str]) -> DeploymentState:
        return parse_deployment_state(output)


def parse_release_records(lines: list[str]) -> dict[str, Release]:
    """``== <id>`` followed by that release's release.json; unreadable records are left out
    (retention never removes what it cannot read)."""
    from gpuserve.releases import Release

    records: dict[str, Release] = {}
    blocks: list[tuple[str, list[str]]] = []
    for line in lines:
        if line.startswith("== "):
            blocks.append((line[3:].strip(), []))
        elif blocks:
            blocks[-1][1].append(line)
    for rid, body in blocks:
        try:
            release = Release.from_json("\n".join(body))
        except (ValueError, TypeError, KeyError):
            continue
        if release.id == rid:
            records[rid] = release
    return records


class ReleaseRecords(FactBase):
    """Each release of a deployment on the host: its release.json, parsed and checked."""

    def command(self, deployment: str) -> str:
        d = layout.releases_dir(deployment)
        return (f'for f in {d}/*/release.json; do [ -f "$f" ] && '
                f'echo "== $(basename "$(dirname "$f")")" && cat "$f"; done 2>/dev/null; true')

    @staticmethod
    def default() -> dict:  # no release on the host yet
        return {}

    def process(self, output: list[str]) -> dict:
        return parse_release_records(output)
