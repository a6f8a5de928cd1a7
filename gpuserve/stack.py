"""The GPU stack, as pure data: which packages, which versions, which repository, for which host.

No pyinfra here: the layer (gpuserve.layers.gpu_stack) reads host facts and group data, hands
them to these functions, and turns the answers into operations. Everything here is unit-tested.

NVIDIA (Debian 12, Ubuntu 22.04 / 24.04, from NVIDIA's CUDA apt repository):
    cuda-keyring (trust root + sources entry) -> nvidia-driver-pinning-<branch> (NVIDIA's branch
    lock) + an apt preference of ours that pins every NVIDIA driver package to the *exact*
    configured version (the driver metas depend with ">=", so without it apt would pull the
    newest point release of the branch under an older meta) -> the driver flavour meta, the
    kernel module package, nvidia-persistenced -> nvidia-fabricmanager + libnvidia-nscq at that
    same exact version when the host has NVSwitches (+ nvlsm on NVLink 5) -> cuda-toolkit-<x-y>,
    optional DCGM -> `apt-mark hold` on the whole set.
AMD (ROCm from repo.radeon.com, one directory per release, so the release *is* the pin):
    rocm key + sources for <release> + AMD's origin pin (600) -> amdgpu-dkms + rocm -> hold.
"""

from __future__ import annotations

import fnmatch
import json
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, replace

from gpuserve import admission, layout, schema, templating
from gpuserve.hardware import GPU_MODELS, GpuInfo
from gpuserve.values import base_url_problem, url_problem


class StackError(Exception):
    """The GPU stack cannot be converged as configured on this host."""


class StackConfigError(StackError, ValueError):
    """A group-data key has a value the GPU stack cannot use (the lead maps it to config.ConfigError)."""

    def __init__(self, key: str, message: str):
        self.key = key
        self.message = message
        super().__init__(f"{key}: {message}")


# --- group data ---------------------------------------------------------------------------------
# Documented in docs/configuration.md ("GPU stack"). Hardware (gpu_model, gpu_count, nvswitch) is
# declared by the hardware groups (group_data/hopper_x8.py, ...); the rest are settings. Their
# defaults and bounds: gpuserve.schema (this is its view for the stack's keys).
DEFAULTS: dict[str, object] = schema.defaults("gpu stack", stack=True)


FLAVOURS = schema.choices("nvidia_driver_flavour")
# oldest driver branch each CUDA major runs on
CUDA_MIN_BRANCH = {12: 525, 13: 580}
# pinning packages (and the exact fabric manager naming this module knows) start with 580
MIN_BRANCH = 580
REBOOT_POLICIES = schema.choices("reboot")
SUPPORTED_OS = ("debian12", "ubuntu2204", "ubuntu2404")

_DRIVER_VERSION = re.compile(r"^(\d{3})\.\d{1,3}(\.\d{1,3})?$")
_TOOLKIT = re.compile(r"^(\d{2})-(\d)$")
_ROCM_VERSION = re.compile(r"^\d+\.\d+(\.\d+)?$")


@dataclass(frozen=True)
class StackSettings:
    enabled: bool
    gpu_model: str | None
    gpu_count: int
    nvswitch: bool
    driver_version: str
    flavour: str
    cuda_toolkit: str | None
    cuda_repo_url: str
    cuda_keyring_version: str
    cuda_keyring_sha256: str | None
    dcgm: bool
    rocm_version: str
    rocm_repo_url: str
    reboot_allowed: bool
    reboot_delay: int
    reboot_timeout: int
    admission: admission.AdmissionSettings = admission.AdmissionSettings()
    dcgm_version: str = schema.default("dcgm_version")

    @property
    def vendor(self) -> str | None:
        """nvidia | amd; None for hosts without GPUs (gpu_model unset or "cpu")."""
        vendor = GPU_MODELS[self.gpu_model].vendor if self.gpu_model else None
        return None if vendor == "cpu" else vendor

    @property
    def branch(self) -> int:
        return int(self.driver_version.split(".")[0])

    @property
    def nvlink_gen(self) -> int:
        return GPU_MODELS[self.gpu_model].nvlink_gen if self.gpu_model and self.nvswitch else 0

    @property
    def cuda_major(self) -> int:
        return int(self.cuda_toolkit.split("-")[0]) if self.cuda_toolkit else 13


def _bool(data: Mapping, key: str) -> bool:
    value = data.get(key, DEFAULTS[key])
    if not isinstance(value, bool):
        raise StackConfigError(key, f"must be True or False, got {value!r}")
    return value


def _int(data: Mapping, key: str, low: int | None = None, high: int | None = None,
         missing: object = None) -> int:
    """A whole number; ``low``/``high`` default to the schema's bounds for ``key``."""
    spec = schema.allowed(key)
    low = spec.lo if low is None else low
    high = spec.hi if high is None else high
    value = data.get(key, DEFAULTS[key] if missing is None else missing)
    if isinstance(value, str) and value.isdigit():   # --data k=v gives strings
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise StackConfigError(key, f"must be a whole number from {low} to {high}, got {value!r}")
    return value


def _url(data: Mapping, key: str) -> str:
    value = data.get(key, DEFAULTS[key])
    why = url_problem(value) or base_url_problem(value)
    if why:
        raise StackConfigError(key, why)
    return value.rstrip("/")


def _optional_int(data: Mapping, key: str) -> int | None:
    if data.get(key, DEFAULTS[key]) is None:
        return None
    low, high = schema.allowed(key).lo, schema.allowed(key).hi
    try:
        return _int(data, key, low, high)
    except StackConfigError:
        raise StackConfigError(key, f"must be None (the GPU's own maximum) or a whole number from {low} to "
                                    f"{high}, got {data.get(key)!r}") from None


def admission_settings_from(data: Mapping) -> admission.AdmissionSettings:
    """The admission thresholds of one host's data; StackConfigError naming the key otherwise."""
    xids = data.get("admission_xid_fatal", DEFAULTS["admission_xid_fatal"])
    if isinstance(xids, str):   # --data admission_xid_fatal=48,79
        xids = [x.strip() for x in xids.split(",") if x.strip()]
        xids = [int(x) if x.isdigit() else x for x in xids]
    if (not isinstance(xids, (list, tuple))
            or not all(isinstance(x, int) and not isinstance(x, bool) and 1 <= x <= 999 for x in xids)):
        raise StackConfigError("admission_xid_fatal", f"must be a list of XID numbers (1-999), e.g. "
                                                      f"{list(admission.DEFAULT_XID_FATAL)}, got {xids!r}")
    return admission.AdmissionSettings(
        enabled=_bool(data, "admission"),
        max_uncorrectable_ecc=_int(data, "admission_max_uncorrectable_ecc"),
        allow_pending_retired_pages=_bool(data, "admission_allow_pending_retired_pages"),
        xid_fatal=tuple(sorted(set(xids))),
        pcie_min_gen=_optional_int(data, "admission_pcie_min_gen"),
        pcie_min_width=_optional_int(data, "admission_pcie_min_width"),
    )


def settings_from(data: Mapping) -> StackSettings:
    """Validate the GPU-stack keys of one host's data (group data + host data + --data).

    Raises StackConfigError naming the key and what is allowed. Keys a host does not set take
    DEFAULTS. `--data key=value` arrives as strings: booleans accept only real booleans.
    """
    enabled = _bool(data, "gpu_stack")
    model = data.get("gpu_model", DEFAULTS["gpu_model"])
    if model is not None and (not isinstance(model, str) or model not in GPU_MODELS):
        raise StackConfigError("gpu_model", f"unknown GPU model {model!r}; known: {', '.join(GPU_MODELS)}")
    # unset: no GPUs here (gpuserve.config requires gpu_count on a serving host)
    count = _int(data, "gpu_count", 1 if model not in (None, "cpu") else 0, missing=0)
    nvswitch = _bool(data, "nvswitch")
    if nvswitch and model and GPU_MODELS[model].vendor != "nvidia":
        raise StackConfigError("nvswitch", f"{model} hosts have no NVSwitches; set nvswitch: False")

    driver = str(data.get("nvidia_driver_version", DEFAULTS["nvidia_driver_version"]))
    m = _DRIVER_VERSION.fullmatch(driver)
    if not m:
        raise StackConfigError("nvidia_driver_version",
                               f"must be an exact driver version like '580.95.05', got {driver!r}")
    if int(m.group(1)) < MIN_BRANCH:
        raise StackConfigError("nvidia_driver_version",
                               f"branch {m.group(1)} predates NVIDIA's driver pinning packages; "
                               f"use branch {MIN_BRANCH} or later")
    flavour = data.get("nvidia_driver_flavour", DEFAULTS["nvidia_driver_flavour"])
    if flavour not in FLAVOURS:
        raise StackConfigError("nvidia_driver_flavour", f"must be one of {', '.join(FLAVOURS)}, got {flavour!r}")
    if flavour == "proprietary" and model and GPU_MODELS[model].arch == "blackwell":
        raise StackConfigError("nvidia_driver_flavour",
                               f"{model} (Blackwell) needs the open kernel modules: use 'open'")

    toolkit = data.get("cuda_toolkit", DEFAULTS["cuda_toolkit"])
    if toolkit is not None:
        tm = _TOOLKIT.fullmatch(str(toolkit))
        if not tm or int(tm.group(1)) not in CUDA_MIN_BRANCH:
            raise StackConfigError("cuda_toolkit", f"must be like '13-0' (CUDA {'/'.join(map(str, CUDA_MIN_BRANCH))}) "
                                                   f"or None, got {toolkit!r}")
        need = CUDA_MIN_BRANCH[int(tm.group(1))]
        if int(m.group(1)) < need:
            raise StackConfigError("cuda_toolkit", f"CUDA {tm.group(1)} needs driver branch {need} or later, "
                                                   f"nvidia_driver_version is {driver}")
        toolkit = str(toolkit)

    sha = data.get("cuda_keyring_sha256", DEFAULTS["cuda_keyring_sha256"])
    if sha is not None and not re.fullmatch(r"[0-9a-f]{64}", str(sha)):
        raise StackConfigError("cuda_keyring_sha256", f"must be 64 lowercase hex digits or None, got {sha!r}")
    keyring_version = str(data.get("cuda_keyring_version", DEFAULTS["cuda_keyring_version"]))
    if not re.fullmatch(r"\d+(\.\d+)*-\d+", keyring_version):
        raise StackConfigError("cuda_keyring_version", f"must be like '1.1-1', got {keyring_version!r}")

    rocm = str(data.get("rocm_version", DEFAULTS["rocm_version"]))
    if not _ROCM_VERSION.fullmatch(rocm):
        raise StackConfigError("rocm_version", f"must be a ROCm release like '7.2' or '7.2.1', got {rocm!r}")

    dcgm_version = str(data.get("dcgm_version", DEFAULTS["dcgm_version"]))
    if not re.fullmatch(r"\d+\.\d+\.\d+", dcgm_version):
        raise StackConfigError("dcgm_version", f"must be an exact DCGM release like '4.4.1', got {dcgm_version!r}")

    reboot = data.get("reboot", DEFAULTS["reboot"])
    if reboot not in REBOOT_POLICIES:
        raise StackConfigError("reboot", f"must be one of {', '.join(REBOOT_POLICIES)}, got {reboot!r}")

    return StackSettings(
        enabled=enabled, gpu_model=model, gpu_count=count, nvswitch=nvswitch,
        driver_version=driver, flavour=flavour, cuda_toolkit=toolkit,
        cuda_repo_url=_url(data, "cuda_repo_url"), cuda_keyring_version=keyring_version,
        cuda_keyring_sha256=sha, dcgm=_bool(data, "dcgm"), rocm_version=rocm,
        rocm_repo_url=_url(data, "rocm_repo_url"), reboot_allowed=reboot == "allowed",
        reboot_delay=_int(data, "reboot_delay"),
        reboot_timeout=_int(data, "reboot_timeout"),
        admission=admission_settings_from(data), dcgm_version=dcgm_version,
    )


# --- the host's OS ------------------------------------------------------------------------------
def os_key(release_meta: Mapping) -> str:
    """/etc/os-release (pyinfra LinuxDistribution.release_meta) -> debian12 | ubuntu2204 | ubuntu2404."""
    key = f"{release_meta.get('ID', '')}{str(release_meta.get('VERSION_ID', '')).replace('.', '')}"
    if key not in SUPPORTED_OS:
        found = f"{release_meta.get('ID', '?')} {release_meta.get('VERSION_ID', '?')}"
        raise StackError(f"the GPU stack supports {', '.join(SUPPORTED_OS)}; this host runs {found}")
    return key


def cuda_arch(deb_arch: str) -> str:
    """dpkg architecture -> the CUDA repository's directory name."""
    archs = {"amd64": "x86_64", "arm64": "sbsa"}
    if deb_arch not in archs:
        raise StackError(f"no CUDA repository for architecture {deb_arch!r}; known: {', '.join(archs)}")
    return archs[deb_arch]


# --- apt package sets ---------------------------------------------------------------------------
@dataclass(frozen=True)
class PackageSpec:
    """A package of the held set. version: the upstream version it must have (exact, or a
    release prefix such as '7.2' for ROCm); None: any version, upgraded with the set."""

    name: str
    version: str | None = None


def upstream(version: str) -> str:
    """'1:580.95.05-1' -> '580.95.05' (no epoch, no Debian revision)."""
    version = version.split(":", 1)[-1]
    return version.rsplit("-", 1)[0] if "-" in version else version


def version_matches(version: str, wanted: str) -> bool:
    """Whether a Debian version is the wanted upstream release ('7.2' matches '7.2.0.70200-43~22.04')."""
    up = upstream(version)
    return up == wanted or up.startswith(wanted + ".")


def satisfied(spec: PackageSpec, installed: str | None) -> bool:
    if installed is None:
        return False
    return spec.version is None or version_matches(installed, spec.version)


def obsolete_packages(installed: Iterable[str], specs: Iterable[PackageSpec],
                      family: Iterable[str]) -> list[str]:
    """Installed packages of the managed family (fnmatch patterns) that the set no longer wants,
    e.g. nvidia-driver-pinning-580 after a bump to 590."""
    wanted = {s.name for s in specs}
    patterns = list(family)
    return sorted(p for p in installed
                  if p not in wanted and any(fnmatch.fnmatchcase(p, pat) for pat in patterns))


@dataclass(frozen=True)
class PackagePlan:
    unhold: list[str]      # held packages that must move (or go) first
    install: list[str]     # apt-get install arguments: name=version, name, or name- (remove)
    hold: list[str]        # packages of the set not yet held
    problems: list[str]    # why the set cannot be installed from the configured repositories

    @property
    def changes(self) -> bool:
        return bool(self.install)


def plan_packages(specs: list[PackageSpec], installed: Mapping[str, str], held: Iterable[str],
                  available: Mapping[str, list[str]] | None = None,
                  family: Iterable[str] = ()) -> PackagePlan:
    """Unhold -> install -> hold, as one plan for the whole set.

    installed: name -> installed version; held: `apt-mark showhold`; available: name -> versions
    the configured repositories offer (newest first, as `apt-cache policy` lists them), or None
    when not known yet (then versioned specs are planned by name only, for a dry run).
    Nothing to do when every spec is satisfied and nothing obsolete is installed; otherwise the
    whole set moves together: every held member is released, installed at its target (versioned
    specs at the newest offered version of that release, the others at apt's candidate), and
    held again, so apt never meets a held package it must change ("held broken packages").
    """
    held = set(held)
    obsolete = obsolete_packages(installed, specs, family)
    names = [s.name for s in specs]
    if all(satisfied(s, installed.get(s.name)) for s in specs) and not obsolete:
        return PackagePlan([], [], sorted(set(names) - held), [])
    install, problems = [], []
    for spec in specs:
        if spec.version is None:
            install.append(spec.name)
            continue
        if available is None:
            install.append(spec.name)
            continue
        offered = available.get(spec.name, [])
        match = next((v for v in offered if version_matches(v, spec.version)), None)
        if match is None:
            problems.append(f"{spec.name} {spec.version} is not offered by the configured repositories "
                            f"(offered: {', '.join(offered[:5]) or 'none'})")
        else:
            install.append(f"{spec.name}={match}")
    install += [f"{name}-" for name in obsolete]
    unhold = sorted(held & (set(names) | set(obsolete)))
    return PackagePlan(unhold, install, [], problems)


APT_INSTALL = ("DEBIAN_FRONTEND=noninteractive apt-get install -y -q --allow-downgrades "
               "-o Dpkg::Options::=--force-confdef -o Dpkg::Options::=--force-confold")


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


# --- AMD ----------------------------------------------------------------------------------------
ROCM_KEY = f"{layout.APT_KEYRINGS_DIR}/rocm.asc"
ROCM_SOURCES = f"{layout.APT_SOURCES_DIR}/rocm.list"
ROCM_PREFERENCES = f"{layout.APT_PREFERENCES_DIR}/rocm-pin-600"
ROCM_SUITES = {"ubuntu2204": "jammy", "ubuntu2404": "noble", "debian12": "jammy"}
GPU_GROUPS = ("render", "video")


def rocm_key_url(s: StackSettings) -> str:
    return f"{s.rocm_repo_url}/rocm/rocm.gpg.key"


def rocm_sources(s: StackSettings, os: str, deb_arch: str) -> str:
    if deb_arch != "amd64":
        raise StackError(f"ROCm packages exist for amd64 only, this host is {deb_arch}")
    opts = f"[arch=amd64 signed-by={ROCM_KEY}]"
    suite = ROCM_SUITES[os]
    return (f"deb {opts} {s.rocm_repo_url}/amdgpu/{s.rocm_version}/ubuntu {suite} main\n"
            f"deb {opts} {s.rocm_repo_url}/rocm/apt/{s.rocm_version} {suite} main\n")


ROCM_PREFERENCES_TEXT = ("# gpuserve: ROCm from AMD's repository before any same-named distribution package\n"
                         "Package: *\nPin: release o=repo.radeon.com\nPin-Priority: 600\n")


def amd_packages(s: StackSettings) -> list[PackageSpec]:
    return [PackageSpec("amdgpu-dkms"), PackageSpec("rocm", s.rocm_version)]


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


# --- the stack as a rollout target (deploys/upgrade.py, deploys/rollback.py) ---------------------
# A GPU-stack change on a host that serves is a move of the rollout (docs/rollout.md): the host leaves
# rotation, its engines stop, the held set changes, it reboots if the loaded module differs, it is
# verified and admitted, and only then serves again. The host records the stack it was moved to
# and the one before, so deploys/rollback.py can go back to the previous pinned stack.

STACK_RECORD = layout.STACK_RECORD   # root-only, beside nothing the service user reads
STACK_MOVING = layout.STACK_MOVING   # a stack move began here and has not finished
PIN_KEYS = ("driver_version", "flavour", "cuda_toolkit", "dcgm", "dcgm_version", "rocm_version")


@dataclass(frozen=True)
class StackTarget:
    """What a host's stack must be: the held set, the packages it replaces, and the package whose
    kernel module must be the loaded one."""
    specs: list[PackageSpec]
    family: tuple[str, ...]
    module_package: str
    label: str


def target(s: StackSettings, os: str) -> StackTarget:
    if s.vendor == "nvidia":
        return StackTarget(nvidia_packages(s, os), nvidia_family(os), nvidia_kernel_module_package(s, os),
                           describe(s))
    return StackTarget(amd_packages(s), (), "amdgpu-dkms", describe(s))


def describe(s: StackSettings) -> str:
    if s.vendor == "amd":
        return f"ROCm {s.rocm_version}"
    extra = [f"CUDA toolkit {s.cuda_toolkit}"] if s.cuda_toolkit else []
    extra += [f"DCGM {s.dcgm_version}"] if s.dcgm else []
    return f"NVIDIA {s.driver_version} ({s.flavour}{', ' + ', '.join(extra) if extra else ''})"


def pins(s: StackSettings) -> dict:
    return {k: getattr(s, k) for k in PIN_KEYS}


def with_pins(s: StackSettings, recorded: Mapping) -> StackSettings:
    """The host's stack settings moved to recorded pins (the hardware and repositories stay)."""
    return replace(s, **{k: recorded[k] for k in PIN_KEYS if k in recorded})


def pending_reason(plan: PackagePlan, module_package_version: str | None, loaded: str | None,
                   specs: Iterable[PackageSpec] = (), installed: Mapping[str, str] | None = None) -> str | None:
    """Why the host's stack is not the target yet (None: it is): packages to change, or an
    installed module that is not the loaded one (a reboot still owed)."""
    if plan.changes:
        installed = installed or {}
        moving = [f"{s.name} {upstream(installed[s.name]) if s.name in installed else '(none)'} -> {s.version}"
                  for s in specs if s.version and not satisfied(s, installed.get(s.name))]
        moving += [a[:-1] + " (removed)" for a in plan.install if a.endswith("-")]
        return "packages change: " + ", ".join(moving or plan.install)
    if module_differs(loaded, module_package_version):
        return (f"kernel module {upstream(module_package_version)} installed, "
                f"{loaded or 'none'} loaded (a reboot is owed)")
    return None


def record_after(record: Mapping | None, now: Mapping) -> dict:
    """The record once the host serves stack ``now``: ``previous`` is what it served before, kept
    when ``now`` is what it already served (a rerun), so a rollback always has somewhere to go."""
    current = dict(record.get("current") or {}) if record else {}
    previous = dict(record.get("previous") or {}) if record else {}
    if current and current != dict(now):
        previous = current
    out = {"current": dict(now)}
    if previous and previous != dict(now):
        out["previous"] = previous
    return out


def parse_record(text: str) -> dict | None:
    try:
        data = json.loads(text)
    except ValueError:
        return None
    if not isinstance(data, dict) or not isinstance(data.get("current"), dict):
        return None
    return data


def rollback_pins(record: Mapping | None, host: str) -> dict:
    """The pins deploys/rollback.py --data rollback_stack=True goes back to; ValueError naming
    the host when no earlier stack was recorded there."""
    if not record or not record.get("previous"):
        raise ValueError(f"{host}: no previous GPU stack is recorded ({STACK_RECORD}); it has only "
                         "ever served the one it has")
    return dict(record["previous"])
