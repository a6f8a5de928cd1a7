"""NVIDIA's stack: the CUDA repository and its keyring, the driver pin, the package set and units."""

from __future__ import annotations

import fnmatch
from collections.abc import Iterable, Mapping

from gpuserve import layout, templating
from gpuserve.stack.packages import PackageSpec, version_matches
from gpuserve.stack.settings import StackSettings

# --- NVIDIA -------------------------------------------------------------------------------------
CUDA_KEYRING = layout.CUDA_KEYRING
NVIDIA_PREFERENCES = f"{layout.APT_PREFERENCES_DIR}/gpuserve-nvidia-driver"
NOUVEAU_BLACKLIST = f"{layout.MODPROBE_DIR}/gpuserve-blacklist-nouveau.conf"
NOUVEAU_BLACKLIST_TEXT = "# gpuserve: the NVIDIA driver needs nouveau out of the way\nblacklist nouveau\noptions nouveau modeset=0\n"
FABRIC_MANAGER_UNIT = "nvidia-fabricmanager"
PERSISTENCED_UNIT = "nvidia-persistenced"
DCGM_UNIT = "nvidia-dcgm"
DCGM_EXPORTER_UNIT = "nvidia-dcgm-exporter"   # datacenter-gpu-manager-exporter, metrics on :9400
DCGM_EXPORTER_PORT = 9400
# dcgm-exporter listens on every address (":9400") unless told otherwise; its `--address` flag
# reads DCGM_EXPORTER_LISTEN too. Loopback only: the monitor reaches it through the host's TLS
# exporter front (layers/monitoring.py), never directly.
DCGM_EXPORTER_DROPIN = layout.systemd_unit_path(f"{DCGM_EXPORTER_UNIT}.service.d/gpuserve-listen.conf")
DCGM_EXPORTER_LISTEN = f"127.0.0.1:{DCGM_EXPORTER_PORT}"
DCGM_EXPORTER_DROPIN_TEXT = templating.render("dropin-dcgm-exporter-listen.conf.j2", listen=DCGM_EXPORTER_LISTEN)


def cuda_repo_dir(s: StackSettings, os: str, arch: str) -> str:
    return f"{s.cuda_repo_url}/{os}/{arch}"


def cuda_keyring_url(s: StackSettings, os: str, arch: str) -> str:
    return f"{cuda_repo_dir(s, os, arch)}/cuda-keyring_{s.cuda_keyring_version}_all.deb"


def cuda_sources(s: StackSettings, os: str, arch: str) -> tuple[str, str]:
    """Path and content of the sources entry: the one cuda-keyring writes, at the configured URL."""
    return (f"{layout.APT_SOURCES_DIR}/cuda-{os}-{arch}.list",
            f"deb [signed-by={CUDA_KEYRING}] {cuda_repo_dir(s, os, arch)}/ /\n")


NVIDIA_PIN_PATTERNS = ("*nvidia*", "libcuda*", "libnvcuvid*", "libnvoptix*")


def companions(installed: Mapping[str, str], spec_names: Iterable[str], available: Mapping[str, list[str]],
               driver_version: str) -> list[str]:
    """apt-get install arguments that bring the driver's other installed packages (libcuda1,
    nvidia-smi, ...) to ``driver_version``: the held set's metapackages depend on them with
    '>=', so a downgrade would leave them at the newer release (CUDA then fails with 803,
    libcuda not matching the loaded module). Only packages the repositories offer at that version."""
    names = set(spec_names)
    out = []
    for name in sorted(installed):
        if name in names or not any(fnmatch.fnmatchcase(name, p) for p in NVIDIA_PIN_PATTERNS):
            continue
        if version_matches(installed[name], driver_version):
            continue
        match = next((v for v in available.get(name, []) if version_matches(v, driver_version)), None)
        if match:
            out.append(f"{name}={match}")
    return out


def nvidia_preferences(s: StackSettings) -> str:
    """Every NVIDIA driver package at exactly the configured version (any packaging revision)."""
    return (f"# gpuserve: NVIDIA driver packages at exactly {s.driver_version} (group data "
            "nvidia_driver_version).\n# nvidia-driver-pinning-<branch> keeps the branch; this keeps the "
            "version, because the\n# driver metapackages depend with '>=' on their parts.\n"
            f"Package: {' '.join(NVIDIA_PIN_PATTERNS)}\n"
            f"Pin: version {s.driver_version}-*\n"
            "Pin-Priority: 1001\n")


def _ubuntu_branch_suffix(s: StackSettings, os: str) -> str:
    """Ubuntu's CUDA repository names some packages per branch up to 580 (renamed from 590 on)."""
    return f"-{s.branch}" if os.startswith("ubuntu") and s.branch < 590 else ""


def nvidia_kernel_module_package(s: StackSettings, os: str) -> str:
    if os.startswith("ubuntu"):
        sfx = _ubuntu_branch_suffix(s, os)
        return f"nvidia-dkms{sfx}-open" if s.flavour == "open" else f"nvidia-dkms{sfx}"
    return "nvidia-kernel-open-dkms" if s.flavour == "open" else "nvidia-kernel-dkms"


def nvidia_packages(s: StackSettings, os: str) -> list[PackageSpec]:
    """The held NVIDIA set for this host, in install order."""
    v, sfx = s.driver_version, _ubuntu_branch_suffix(s, os)
    persistenced = f"nvidia-compute-utils{sfx}" if os.startswith("ubuntu") else "nvidia-persistenced"
    specs = [
        PackageSpec(f"nvidia-driver-pinning-{s.branch}"),
        PackageSpec("nvidia-open" if s.flavour == "open" else "cuda-drivers", v),
        PackageSpec(nvidia_kernel_module_package(s, os), v),
        PackageSpec(persistenced, v),
    ]
    if s.nvswitch:
        specs += [PackageSpec(f"nvidia-fabricmanager{sfx}", v), PackageSpec("libnvidia-nscq", v)]
        if s.nvlink_gen >= 5:
            specs.append(PackageSpec("nvlsm"))
    if s.cuda_toolkit:
        specs.append(PackageSpec(f"cuda-toolkit-{s.cuda_toolkit}"))
    if s.dcgm:   # DCGM at its exact release, held with the driver; the exporter follows the set
        specs += [PackageSpec("datacenter-gpu-manager-4-core", s.dcgm_version),
                  PackageSpec(f"datacenter-gpu-manager-4-cuda{s.cuda_major}", s.dcgm_version),
                  PackageSpec("datacenter-gpu-manager-exporter")]
    return specs


def nvidia_family(os: str) -> tuple[str, ...]:
    """Packages a branch or flavour change replaces: removed when no longer wanted."""
    if os.startswith("ubuntu"):
        return ("nvidia-driver-pinning-*", "nvidia-open", "cuda-drivers", "nvidia-dkms-*")
    return ("nvidia-driver-pinning-*", "nvidia-open", "cuda-drivers",
            "nvidia-kernel-open-dkms", "nvidia-kernel-dkms")


def nvidia_units(s: StackSettings) -> list[str]:
    """Services that must run once the driver is loaded."""
    units = [PERSISTENCED_UNIT]
    if s.nvswitch:
        units.append(FABRIC_MANAGER_UNIT)
    if s.dcgm:
        units += [DCGM_UNIT, DCGM_EXPORTER_UNIT]
    return units
