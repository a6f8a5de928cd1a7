"""AMD's stack: ROCm's repository (one directory per release, so the release is the pin), its
key, AMD's origin pin and the package set."""

from __future__ import annotations

from gpuserve import layout
from gpuserve.stack.packages import PackageSpec
from gpuserve.stack.settings import StackError, StackSettings

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
