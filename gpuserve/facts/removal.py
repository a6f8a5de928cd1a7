"""What gpuserve has on a host, for removal and decommission (gpuserve.removal reads it)."""

from __future__ import annotations

from pyinfra.api import FactBase

from gpuserve import removal


class Footprint(FactBase):
    """gpuserve's deployments (ledgers, its units), their paths, and its host-wide paths."""

    def command(self, nvme_path: str) -> str:
        return removal.footprint_command(nvme_path)

    def process(self, output: list[str]) -> list[str]:
        return list(output)   # parsed with the nvme_path: gpuserve.removal.parse_footprint
