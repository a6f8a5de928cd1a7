"""The GPU stack's group-data keys, validated: StackSettings and the admission thresholds, and the
errors the stack raises."""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass

from gpuserve import admission, schema
from gpuserve.hardware import GPU_MODELS
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
    model, count, nvswitch = _hardware(data)
    driver, branch, flavour = _driver(data, model)
    toolkit = _toolkit(data, driver, branch)
    sha, keyring_version, rocm, dcgm_version = _versions(data)

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


def _hardware(data: Mapping) -> tuple[str | None, int, bool]:
    """gpu_model, gpu_count and nvswitch (declared by the hardware groups)."""
    model = data.get("gpu_model", DEFAULTS["gpu_model"])
    if model is not None and (not isinstance(model, str) or model not in GPU_MODELS):
        raise StackConfigError("gpu_model", f"unknown GPU model {model!r}; known: {', '.join(GPU_MODELS)}")
    # unset: no GPUs here (gpuserve.config requires gpu_count on a serving host)
    count = _int(data, "gpu_count", 1 if model not in (None, "cpu") else 0, missing=0)
    nvswitch = _bool(data, "nvswitch")
    if nvswitch and model and GPU_MODELS[model].vendor != "nvidia":
        raise StackConfigError("nvswitch", f"{model} hosts have no NVSwitches; set nvswitch: False")
    return model, count, nvswitch


def _driver(data: Mapping, model: str | None) -> tuple[str, int, str]:
    """The exact NVIDIA driver version, its branch, and the flavour of its kernel modules."""
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
    return driver, int(m.group(1)), flavour


def _toolkit(data: Mapping, driver: str, branch: int) -> str | None:
    """The CUDA toolkit ('13-0') or None; its CUDA major must run on the driver's branch."""
    toolkit = data.get("cuda_toolkit", DEFAULTS["cuda_toolkit"])
    if toolkit is not None:
        tm = _TOOLKIT.fullmatch(str(toolkit))
        if not tm or int(tm.group(1)) not in CUDA_MIN_BRANCH:
            raise StackConfigError("cuda_toolkit", f"must be like '13-0' (CUDA {'/'.join(map(str, CUDA_MIN_BRANCH))}) "
                                                   f"or None, got {toolkit!r}")
        need = CUDA_MIN_BRANCH[int(tm.group(1))]
        if branch < need:
            raise StackConfigError("cuda_toolkit", f"CUDA {tm.group(1)} needs driver branch {need} or later, "
                                                   f"nvidia_driver_version is {driver}")
        toolkit = str(toolkit)
    return toolkit


def _versions(data: Mapping) -> tuple[str | None, str, str, str]:
    """cuda_keyring_sha256, cuda_keyring_version, rocm_version and dcgm_version, each checked."""
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
    return sha, keyring_version, rocm, dcgm_version
