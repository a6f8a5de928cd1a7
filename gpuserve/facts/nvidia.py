"""NVIDIA facts: GPUs per nvidia-smi (parsed by gpuserve.facts.gpus), the loaded vs installed
kernel module, NVSwitches, CUDA.

Every fact prints something in every state (no driver, no nvidia-smi yet), so its parser can say
what is missing instead of pyinfra failing the fact. Parsers are pure and unit-tested against the
real tools' output formats.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from pyinfra.api import FactBase

from gpuserve.facts.gpus import NVIDIA_QUERY, GpuReport, parse_nvidia_smi
from gpuserve.stack import CUDA_ERRORS

_MODULE = re.compile(r"Kernel Module(?:\s+for\s+\S+)?\s+(\d+\.\d+(?:\.\d+)?)\s")
_PACKAGES_MARK = "--- packages"


class NvidiaSmiGpus(FactBase[GpuReport]):
    """The GPUs nvidia-smi lists, or why it lists none (gpuserve.facts.gpus.parse_nvidia_smi)."""

    def command(self) -> str:
        return (f"if command -v nvidia-smi >/dev/null 2>&1; then {NVIDIA_QUERY} 2>&1 "
                "|| echo \"nvidia-smi exited $?\"; else echo 'nvidia-smi: command not found'; fi")

    @staticmethod
    def default() -> GpuReport:
        return GpuReport("nvidia", (), error="no output")

    def process(self, output: list[str]) -> GpuReport:
        return parse_nvidia_smi("\n".join(output))


def parse_loaded_module(version_text: str) -> str | None:
    """/proc/driver/nvidia/version -> '580.95.05' (open or proprietary module), None if absent."""
    m = _MODULE.search(version_text + " ")
    return m.group(1) if m else None


def parse_dpkg_status(lines: list[str]) -> dict[str, str]:
    """`dpkg-query -W -f='${db:Status-Abbrev}|${Package}|${Version}\\n'` -> installed name: version."""
    installed = {}
    for line in lines:
        parts = line.split("|")
        if len(parts) == 3 and len(parts[0]) >= 2 and parts[0][1] == "i":
            installed[parts[1]] = parts[2].strip()
    return installed


@dataclass(frozen=True)
class ModuleVersions:
    loaded: str | None                                       # the module running now
    installed: dict[str, str] = field(default_factory=dict)  # kernel module package -> version


def parse_module_versions(lines: list[str]) -> ModuleVersions:
    """The output of NvidiaKernelModule's command: the loaded module, then the packages."""
    if _PACKAGES_MARK in lines:
        cut = lines.index(_PACKAGES_MARK)
        head, tail = lines[:cut], lines[cut + 1:]
    else:
        head, tail = lines, []
    return ModuleVersions(parse_loaded_module("\n".join(head)), parse_dpkg_status(tail))


def dpkg_status_command(*patterns: str) -> str:
    quoted = " ".join(f"'{p}'" for p in patterns)
    return (f"echo '{_PACKAGES_MARK}'; dpkg-query -W "
            f"-f='${{db:Status-Abbrev}}|${{Package}}|${{Version}}\\n' {quoted} 2>/dev/null; true")


class NvidiaKernelModule(FactBase[ModuleVersions]):
    """The loaded NVIDIA kernel module (/proc/driver/nvidia/version) and the installed module
    packages (dpkg): they differ between a driver install and the reboot that loads it."""

    def command(self) -> str:
        return ("head -n1 /proc/driver/nvidia/version 2>/dev/null; "
                + dpkg_status_command("nvidia-kernel-*dkms", "nvidia-dkms*"))

    @staticmethod
    def default() -> ModuleVersions:
        return ModuleVersions(None)

    def process(self, output: list[str]) -> ModuleVersions:
        return parse_module_versions(output)


class _ProcDriverEntries(FactBase[list]):
    directory: str

    def command(self) -> str:
        return f"ls -1 {self.directory} 2>/dev/null; true"

    default = list

    def process(self, output: list[str]) -> list[str]:
        return [line.strip() for line in output if line.strip()]


class NvSwitchDevices(_ProcDriverEntries):
    """NVSwitch devices the loaded driver sees (HGX / NVL baseboards); [] without a driver."""

    directory = "/proc/driver/nvidia-nvswitch/devices"


class NvidiaDriverGpus(_ProcDriverEntries):
    """Bus IDs of the GPUs the loaded driver probed (one may be missing from nvidia-smi)."""

    directory = "/proc/driver/nvidia/gpus"


# The CUDA-level check: nvidia-smi can list GPUs while CUDA cannot use them (error 802 when an
# NVSwitch host's fabric manager is missing or mismatched), so ask the driver API itself.
CUDA_CHECK = (
    "import ctypes; c = ctypes.CDLL('libcuda.so.1'); n = ctypes.c_int(); r = c.cuInit(0); "
    "r = r or c.cuDeviceGetCount(ctypes.byref(n)); print('error %d' % r if r else 'count %d' % n.value)"
)


@dataclass(frozen=True)
class CudaCheck:
    count: int | None
    error_code: int | None = None
    error: str | None = None


def parse_cuda_check(lines: list[str]) -> CudaCheck:
    last = next((line.strip() for line in reversed(lines) if line.strip()), "")
    m = re.fullmatch(r"count (\d+)", last)
    if m:
        return CudaCheck(int(m.group(1)))
    m = re.fullmatch(r"error (\d+)", last)
    if m:
        code = int(m.group(1))
        name = f" ({CUDA_ERRORS[code]})" if code in CUDA_ERRORS else ""
        return CudaCheck(None, code, f"cuInit/cuDeviceGetCount returned {code}{name}")
    return CudaCheck(None, None, last or "no output")


class CudaDeviceCount(FactBase[CudaCheck]):
    """cuInit + cuDeviceGetCount through libcuda.so.1 (python3 ctypes, no toolkit needed)."""

    def command(self) -> str:
        return ("if command -v python3 >/dev/null 2>&1; then "
                f"python3 -c \"{CUDA_CHECK}\" 2>&1 | tail -n1; else echo 'python3: command not found'; fi")

    @staticmethod
    def default() -> CudaCheck:
        return CudaCheck(None, None, "no output")

    def process(self, output: list[str]) -> CudaCheck:
        return parse_cuda_check(output)
