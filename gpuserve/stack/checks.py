"""Reboot and verification: whether a move must reboot, free space for it, and the host's GPUs,
driver and units against what is declared and configured."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from gpuserve.hardware import GpuInfo
from gpuserve.stack.nvidia import nvidia_units
from gpuserve.stack.packages import upstream, version_matches
from gpuserve.stack.settings import StackSettings

if TYPE_CHECKING:
    from gpuserve.stack.target import StackTarget

# --- reboot and verification --------------------------------------------------------------------
def module_differs(loaded: str | None, installed_pkg_version: str | None) -> bool:
    """A reboot is needed when a kernel module package is installed whose version is not the
    loaded module's (none loaded counts as different)."""
    if installed_pkg_version is None:
        return False
    return loaded is None or not version_matches(installed_pkg_version, loaded)


def reboot_needed(t: "StackTarget", vendor: str | None, loaded: str | None) -> str:
    """Why moving to ``t`` must reboot the host ("" when it need not): its kernel module package
    pins a version that is not the loaded module's. Known before anything is installed, so a
    rollout refuses a move it could not finish before the host leaves rotation. NVIDIA only: the
    amdgpu module's version does not follow the ROCm release it ships with."""
    if vendor != "nvidia":
        return ""
    wanted = next((p.version for p in t.specs if p.name == t.module_package), None)
    if wanted is None or (loaded is not None and version_matches(loaded, wanted)):
        return ""
    return f"loading kernel module {wanted} (loaded now: {loaded or 'none'})"


FREE_SPACE_COMMAND = "df -Pk /var/cache/apt/archives /var/lib/dkms /usr 2>/dev/null || df -Pk /var /usr"


def free_mib(df_output: str) -> int | None:
    """The least free space (MiB) among the filesystems ``df -Pk`` listed; None when unreadable."""
    free = []
    for line in df_output.splitlines()[1:]:
        parts = line.split()
        if len(parts) >= 6 and parts[3].isdigit():
            free.append(int(parts[3]) // 1024)
    return min(free) if free else None


def reboot_refused_message(host: str, what: str, installed: str, loaded: str | None) -> str:
    return (f"{host}: a reboot is needed to load {what} {upstream(installed)} (loaded now: "
            f"{loaded or 'none'}), and this host may not be rebooted (reboot: never). The packages "
            "are installed and held; services and verification wait for the reboot. Allow it with "
            "`reboot: allowed` in the host's group data (or `--data reboot=allowed`), or reboot the "
            "host yourself and converge again.")


def _bus(bus_id: str) -> str:
    """'00000000:18:00.0' (nvidia-smi) and '0000:18:00.0' (/proc) -> '18:00.0'."""
    return bus_id.lower().split(":", 1)[-1] if bus_id.count(":") == 2 else bus_id.lower()


def check_gpus(s: StackSettings, gpus: Sequence[GpuInfo], tool: str, driver_bus_ids: list[str] = ()) -> list[str]:
    """Declared gpu_model x gpu_count against what the vendor tool lists. driver_bus_ids: the
    GPUs the kernel driver probed, to name one the tool no longer lists (fallen off the bus)."""
    problems = []
    if len(gpus) != s.gpu_count:
        seen = ", ".join(g.bus_id or g.name for g in gpus) or "none"
        if len(gpus) < s.gpu_count:
            what = f"{s.gpu_count - len(gpus)} x {s.gpu_model} missing"
            listed = {_bus(g.bus_id or "") for g in gpus}
            lost = [b for b in driver_bus_ids if _bus(b) not in listed]
            if lost:
                what += f"; the driver probed {', '.join(lost)} but {tool} does not list it"
        else:
            what = f"{len(gpus) - s.gpu_count} more than declared"
        problems.append(f"gpu_count: declared {s.gpu_count} x {s.gpu_model}, {tool} found "
                        f"{len(gpus)} ({what}; found: {seen})")
    wrong = sorted({g.name for g in gpus if g.model != s.gpu_model})
    if wrong:
        problems.append(f"gpu_model: declared {s.gpu_model}, {tool} found {', '.join(wrong)}")
    return problems


CUDA_ERRORS = {
    100: "CUDA_ERROR_NO_DEVICE",
    802: "CUDA_ERROR_SYSTEM_NOT_READY: fabric manager not running or not matching the driver",
    803: "CUDA_ERROR_SYSTEM_DRIVER_MISMATCH: libcuda does not match the loaded kernel module",
    999: "CUDA_ERROR_UNKNOWN",
}


@dataclass(frozen=True)
class NvidiaObserved:
    """What the host shows after the converge, from gpuserve.facts.nvidia."""

    loaded_driver: str | None
    gpus: Sequence[GpuInfo]
    smi_error: str | None
    driver_gpus: list[str]          # bus IDs under /proc/driver/nvidia/gpus
    nvswitches: int
    units_active: Mapping[str, bool]
    cuda_count: int | None
    cuda_error: str | None


def check_nvidia(s: StackSettings, seen: NvidiaObserved) -> list[str]:
    """Everything declared and configured, against what the host shows. [] when all is well."""
    problems = []
    if seen.loaded_driver != s.driver_version:
        problems.append(f"nvidia_driver_version: configured {s.driver_version}, loaded kernel module "
                        f"{seen.loaded_driver or 'none'}")
    if seen.smi_error:
        problems.append(f"nvidia-smi: {seen.smi_error}")
    if seen.gpus or not seen.smi_error:
        problems += check_gpus(s, seen.gpus, "nvidia-smi", seen.driver_gpus)
        drivers = sorted({g.driver_version or "none" for g in seen.gpus if g.driver_version != s.driver_version})
        if drivers:
            problems.append(f"nvidia_driver_version: configured {s.driver_version}, nvidia-smi reports "
                            f"{', '.join(drivers)}")
    if s.nvswitch and not seen.nvswitches:
        problems.append("nvswitch: declared True, found no NVSwitch in /proc/driver/nvidia-nvswitch/devices")
    if not s.nvswitch and seen.nvswitches:
        problems.append(f"nvswitch: declared False, found {seen.nvswitches} NVSwitch devices "
                        "(fabric manager is not installed)")
    for unit in nvidia_units(s):
        if not seen.units_active.get(unit):
            problems.append(f"{unit} is not running (systemctl status {unit})")
    if seen.cuda_error:
        problems.append(f"CUDA check failed: {seen.cuda_error}")
    elif seen.cuda_count != s.gpu_count:
        problems.append(f"gpu_count: declared {s.gpu_count}, CUDA (cuDeviceGetCount) sees {seen.cuda_count}")
    return problems


@dataclass(frozen=True)
class AmdObserved:
    gpus: Sequence[GpuInfo]
    smi_error: str | None
    rocm_version: str | None


def check_amd(s: StackSettings, seen: AmdObserved) -> list[str]:
    problems = [f"amd-smi: {seen.smi_error}"] if seen.smi_error else []
    if seen.gpus or not seen.smi_error:
        problems += check_gpus(s, seen.gpus, "amd-smi")
    if not seen.rocm_version or not version_matches(seen.rocm_version, s.rocm_version):
        problems.append(f"rocm_version: configured {s.rocm_version}, amd-smi reports ROCm "
                        f"{seen.rocm_version or 'none'}")
    return problems


def failure_message(host: str, problems: list[str]) -> str:
    return f"{host}: GPU stack verification failed:\n" + "\n".join(f"  - {p}" for p in problems)
