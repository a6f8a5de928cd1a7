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

A package, one concern a module (gpuserve/__init__.py's ``stack/`` section lists them); every name
stack.py had is importable from ``gpuserve.stack`` as before the split (issue 28).
"""

from __future__ import annotations

# every name stack.py had, importable from gpuserve.stack as before the split (issue 28)
from gpuserve.stack.settings import (  # noqa: F401 - re-exported
    CUDA_MIN_BRANCH, DEFAULTS, FLAVOURS, MIN_BRANCH, REBOOT_POLICIES, SUPPORTED_OS, StackConfigError,
    StackError, StackSettings, _DRIVER_VERSION, _ROCM_VERSION, _TOOLKIT, _bool, _driver, _hardware, _int,
    _optional_int, _toolkit, _url, _versions, admission_settings_from, settings_from)
from gpuserve.stack.packages import (  # noqa: F401 - re-exported
    APT_INSTALL, PackagePlan, PackageSpec, cuda_arch, obsolete_packages, os_key, plan_packages, satisfied,
    upstream, version_matches)
from gpuserve.stack.nvidia import (  # noqa: F401 - re-exported
    CUDA_KEYRING, DCGM_EXPORTER_DROPIN, DCGM_EXPORTER_DROPIN_TEXT, DCGM_EXPORTER_LISTEN, DCGM_EXPORTER_PORT,
    DCGM_EXPORTER_UNIT, DCGM_UNIT, FABRIC_MANAGER_UNIT, NOUVEAU_BLACKLIST, NOUVEAU_BLACKLIST_TEXT,
    NVIDIA_PIN_PATTERNS, NVIDIA_PREFERENCES, PERSISTENCED_UNIT, _ubuntu_branch_suffix, companions,
    cuda_keyring_url, cuda_repo_dir, cuda_sources, nvidia_family, nvidia_kernel_module_package,
    nvidia_packages, nvidia_preferences, nvidia_units)
from gpuserve.stack.amd import (  # noqa: F401 - re-exported
    GPU_GROUPS, ROCM_KEY, ROCM_PREFERENCES, ROCM_PREFERENCES_TEXT, ROCM_SOURCES, ROCM_SUITES, amd_packages,
    rocm_key_url, rocm_sources)
from gpuserve.stack.checks import (  # noqa: F401 - re-exported
    AmdObserved, CUDA_ERRORS, FREE_SPACE_COMMAND, NvidiaObserved, _bus, check_amd, check_gpus, check_nvidia,
    failure_message, free_mib, module_differs, reboot_needed, reboot_refused_message)
from gpuserve.stack.target import (  # noqa: F401 - re-exported
    PIN_KEYS, STACK_MOVING, STACK_RECORD, StackTarget, describe, parse_record, pending_reason, pins,
    record_after, rollback_pins, target, with_pins)
