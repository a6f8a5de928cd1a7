"""AMD facts: GPUs per `amd-smi static`, ROCm and loaded amdgpu versions per `amd-smi version`.

Overlap note: gpuserve/facts/gpus.py (another branch) parses amd-smi CSV for the recipes; these
parse the plain-text formats the GPU stack layer verifies with. Parsers are pure and unit-tested.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from pyinfra.api import FactBase

from gpuserve.facts.nvidia import dpkg_status_command, parse_dpkg_status
from gpuserve.stack import FoundGpu

_PACKAGES_MARK = "--- packages"


@dataclass(frozen=True)
class AmdSmi:
    gpus: list[FoundGpu] = field(default_factory=list)
    error: str | None = None


def parse_amd_smi_static(lines: list[str]) -> AmdSmi:
    """`amd-smi static --asic --vram` (stderr merged): one `GPU: n` block per GPU with
    `MARKET_NAME: AMD Instinct MI355X` and `SIZE: 294896 MB` under VRAM."""
    gpus: list[dict] = []
    other = []
    for line in lines:
        text = line.strip()
        key, sep, value = text.partition(":")
        if re.fullmatch(r"GPU: \d+", text):
            gpus.append({"name": "", "memory": 0, "bdf": ""})
        elif gpus and sep and key == "MARKET_NAME":
            gpus[-1]["name"] = value.strip()
        elif gpus and sep and key == "SIZE":
            m = re.match(r"\s*(\d+)\s*MB", value)
            gpus[-1]["memory"] = int(m.group(1)) if m else 0
        elif gpus and sep and key == "BDF":
            gpus[-1]["bdf"] = value.strip()
        elif text and not line[:1].isspace():   # GPU fields are indented; anything else is an error
            other.append(text)
    found = [FoundGpu(name=g["name"], memory_mib=g["memory"], bus_id=g["bdf"]) for g in gpus]
    return AmdSmi(found, " ".join(other) or None)


class AmdSmiGpus(FactBase[AmdSmi]):
    def command(self) -> str:
        return ("if command -v amd-smi >/dev/null 2>&1; then amd-smi static --asic --vram 2>&1 "
                "|| echo \"amd-smi exited $?\"; else echo 'amd-smi: command not found'; fi")

    @staticmethod
    def default() -> AmdSmi:
        return AmdSmi(error="no output")

    def process(self, output: list[str]) -> AmdSmi:
        return parse_amd_smi_static(output)


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
