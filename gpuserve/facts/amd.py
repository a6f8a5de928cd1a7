"""AMD facts: GPUs per `amd-smi static` (parsed by gpuserve.facts.gpus), ROCm and loaded amdgpu
versions per `amd-smi version`. Parsers are pure and unit-tested.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from pyinfra.api import FactBase

from gpuserve.facts.gpus import AMD_STATIC, GpuReport, parse_amd_smi
from gpuserve.facts.nvidia import dpkg_status_command, parse_dpkg_status

_PACKAGES_MARK = "--- packages"


class AmdSmiGpus(FactBase[GpuReport]):
    """The GPUs amd-smi lists, or why it lists none (gpuserve.facts.gpus.parse_amd_smi)."""

    def command(self) -> str:
        return (f"if command -v amd-smi >/dev/null 2>&1; then {AMD_STATIC} 2>&1 "
                "|| echo \"amd-smi exited $?\"; else echo 'amd-smi: command not found'; fi")

    @staticmethod
    def default() -> GpuReport:
        return GpuReport("amd", (), error="no output")

    def process(self, output: list[str]) -> GpuReport:
        return parse_amd_smi("\n".join(output))


@dataclass(frozen=True)
class AmdVersions:
    rocm: str | None                                         # ROCm per amd-smi
    loaded: str | None                                       # the amdgpu module running now
    installed: dict[str, str] = field(default_factory=dict)  # amdgpu-dkms -> version


def _field(text: str, name: str) -> str | None:
    m = re.search(rf"{name}:\s*([^|\s]+)", text)
    return m.group(1) if m and m.group(1) != "N/A" else None


def parse_amd_versions(lines: list[str]) -> AmdVersions:
    """`amd-smi version` (`AMDSMI Tool: ... | ROCm version: 7.2.0 | amdgpu version: 6.16.6 | ...`),
    then the dpkg status of amdgpu-dkms."""
    if _PACKAGES_MARK in lines:
        cut = lines.index(_PACKAGES_MARK)
        head, tail = lines[:cut], lines[cut + 1:]
    else:
        head, tail = lines, []
    text = "\n".join(head)
    return AmdVersions(_field(text, "ROCm version"), _field(text, "amdgpu version"),
                       parse_dpkg_status(tail))


class AmdgpuModule(FactBase[AmdVersions]):
    """ROCm and the loaded amdgpu version as amd-smi reports them, and the installed amdgpu-dkms."""

    def command(self) -> str:
        return "amd-smi version 2>/dev/null; " + dpkg_status_command("amdgpu-dkms")

    @staticmethod
    def default() -> AmdVersions:
        return AmdVersions(None, None)

    def process(self, output: list[str]) -> AmdVersions:
        return parse_amd_versions(output)
