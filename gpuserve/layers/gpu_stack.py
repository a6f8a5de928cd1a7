"""GPU stack layer: the vendor driver stack, pinned and held, loaded, and verified.

Settings are group data (docs/gpu-stack.md); the hardware is declared by the host's hardware
group (gpu_model, gpu_count, nvswitch) and checked against the host after the install. What to
install is decided by gpuserve.stack (pure, unit-tested); the operations that decide at execute
time (holds, reboot, verification) are in gpuserve.layers.gpu_ops.
"""

from __future__ import annotations

from io import StringIO

from pyinfra import host
from pyinfra.api import deploy
from pyinfra.facts.deb import DebArch
from pyinfra.facts.server import LinuxDistribution
from pyinfra.operations import apt, files, server, systemd

from gpuserve import layout, stack
from gpuserve.layers import gpu_ops
from gpuserve.layers.context import host_settings

DOWNLOADS = "/var/cache/gpuserve"


@deploy("GPU stack")
def gpu_stack() -> None:
    """Install, pin, hold, load and verify the GPU stack the host's group data declares.

    Nothing happens on hosts without a declared gpu_model (cpu hosts) or with gpu_stack: False
    (hosts whose drivers are managed elsewhere).
    """
    settings = host_settings().stack
    if not settings.enabled or settings.vendor is None:
        return
    try:
        os = stack.os_key(host.get_fact(LinuxDistribution)["release_meta"])
        arch = host.get_fact(DebArch)
        if settings.vendor == "nvidia":
            _nvidia(settings, os, arch)
        else:
            _amd(settings, os, arch)
    except stack.StackError as exc:   # the host itself (OS, architecture) does not fit
        raise stack.StackError(f"{host.name}: {exc}") from None


def _held_set(label: str, specs: list[stack.PackageSpec], family: tuple[str, ...] = ()) -> None:
    """unhold -> install -> hold, each deciding on the host's state when it runs."""
    gpu_ops.refresh_lists_for(name=f"Refresh apt lists for the {label}", specs=specs, family=family)
    gpu_ops.unhold_for_change(name=f"Release the holds on the {label} for its change", specs=specs, family=family)
    gpu_ops.install_set(name=f"Install the {label}", specs=specs, family=family)
    gpu_ops.hold_set(name=f"Hold the {label}", specs=specs, family=family)


def _nvidia(s: stack.StackSettings, os: str, deb_arch: str) -> None:
    arch = stack.cuda_arch(deb_arch)
    blacklist = files.put(name="Blacklist nouveau", src=StringIO(stack.NOUVEAU_BLACKLIST_TEXT),
                          dest=stack.NOUVEAU_BLACKLIST, mode="644")
    server.shell(name="Rebuild the initramfs without nouveau",
                 commands=["if command -v update-initramfs >/dev/null; then update-initramfs -u; fi"],
                 _if=blacklist.did_change)
    files.directory(name="Download cache", path=DOWNLOADS, mode="755")
    keyring = f"{DOWNLOADS}/cuda-keyring_{s.cuda_keyring_version}_all.deb"
    files.download(name="Download the CUDA repository keyring", src=stack.cuda_keyring_url(s, os, arch),
                   dest=keyring, sha256sum=s.cuda_keyring_sha256)
    apt.deb(name="Install the CUDA repository keyring", src=keyring)
    sources, line = stack.cuda_sources(s, os, arch)
    files.put(name="CUDA repository source", src=StringIO(line), dest=sources, mode="644")
    files.put(name=f"Pin the NVIDIA driver packages to {s.driver_version}",
              src=StringIO(stack.nvidia_preferences(s)), dest=stack.NVIDIA_PREFERENCES, mode="644")
    apt.packages(name="Python for the CUDA check", packages=["python3"])
    _held_set(f"NVIDIA stack ({s.driver_version}, {s.flavour})", stack.nvidia_packages(s, os),
              stack.nvidia_family(os))
    gpu_ops.reboot_for_driver(name="Reboot to load the NVIDIA driver", vendor="nvidia",
                              package=stack.nvidia_kernel_module_package(s, os),
                              allowed=s.reboot_allowed, delay=s.reboot_delay, timeout=s.reboot_timeout)
    for unit in stack.nvidia_units(s):
        systemd.service(name=f"Run {unit}", service=f"{unit}.service", running=True, enabled=True)
    gpu_ops.verify_nvidia(name="Verify GPUs, NVSwitches, services and CUDA", settings=s)
    gpu_ops.admission(name="Admission checks (ECC, retired pages, row remap, PCIe, NVLink, XID)", settings=s)


def _amd(s: stack.StackSettings, os: str, deb_arch: str) -> None:
    files.directory(name="apt keyrings", path="/etc/apt/keyrings", mode="755")
    files.download(name="Download the ROCm repository key", src=stack.rocm_key_url(s),
                   dest=stack.ROCM_KEY, mode="644")
    files.put(name=f"ROCm {s.rocm_version} repository sources",
              src=StringIO(stack.rocm_sources(s, os, deb_arch)), dest=stack.ROCM_SOURCES, mode="644")
    files.put(name="Prefer ROCm packages from AMD's repository", src=StringIO(stack.ROCM_PREFERENCES_TEXT),
              dest=stack.ROCM_PREFERENCES, mode="644")
    _held_set(f"ROCm {s.rocm_version} stack", stack.amd_packages(s))
    for group in stack.GPU_GROUPS:
        server.group(name=f"Group {group}", group=group, system=True)
    server.user(name="Service user may use the GPUs (render, video)", user=layout.SERVICE_USER,
                groups=list(stack.GPU_GROUPS), append=True)
    gpu_ops.reboot_for_driver(name="Reboot to load the amdgpu driver", vendor="amd", package="amdgpu-dkms",
                              allowed=s.reboot_allowed, delay=s.reboot_delay, timeout=s.reboot_timeout)
    gpu_ops.verify_amd(name="Verify GPUs and ROCm", settings=s)
    gpu_ops.admission(name="Admission checks (ECC, PCIe)", settings=s)
