"""GPU stack layer: the vendor driver stack, pinned and held, loaded, and verified.

Settings are group data (docs/gpu-stack.md); the hardware is declared by the host's hardware
group (gpu_model, gpu_count, nvswitch) and checked against the host after the install. What to
install is decided by gpuserve.stack (pure, unit-tested); the operations that decide at execute
time (holds, reboot, verification) are in gpuserve.operations.gpu_stack.
"""

from __future__ import annotations

import json
from io import StringIO

from pyinfra import host
from pyinfra.api import deploy
from pyinfra.facts.deb import DebArch
from pyinfra.facts.files import File, FileContents
from pyinfra.facts.server import LinuxDistribution
from pyinfra.operations import apt, files, server, systemd

from gpuserve import layout, stack
from gpuserve.operations import gpu_stack as gpu_ops
from gpuserve.layers.context import deployment_state, host_plan, host_settings
from gpuserve.rollout import StackMove

DOWNLOADS = layout.DOWNLOADS_DIR


@deploy("GPU stack")
def gpu_stack(disruptive: bool = True):
    """Install, pin, hold, load and verify the GPU stack the host's group data declares.

    Nothing happens on hosts without a declared gpu_model (cpu hosts) or with gpu_stack: False
    (hosts whose drivers are managed elsewhere). ``disruptive=False`` (a host that serves, with
    a stack change pending) writes only what changes nothing under a running engine: the
    repositories, keyring and the apt pin; the change itself is a move of deploys/upgrade.py.
    Returns the reboot operation (its ``did_change`` says whether the host rebooted), or None.
    """
    settings = host_settings().stack
    if not settings.enabled or settings.vendor is None:
        return None
    try:
        os = host_os()
        arch = host.get_fact(DebArch)
        if settings.vendor == "nvidia":
            return _nvidia(settings, os, arch, disruptive)
        return _amd(settings, os, arch, disruptive)
    except stack.StackError as exc:   # the host itself (OS, architecture) does not fit
        raise stack.StackError(f"{host.name}: {exc}") from None


def host_os() -> str:
    return stack.os_key(host.get_fact(LinuxDistribution)["release_meta"])


def serving(settings) -> bool:
    """Whether any deployment of the host serves now (its unit active and /health 200)."""
    plan = host_plan(engine=False)
    return any(deployment_state(plan, d.name).serving for d in settings.deployments)


def stack_move(settings, rollback_pins: dict | None = None) -> StackMove | None:
    """The host's GPU-stack move for a rollout, from its facts now; None when its stack is the
    target (group data's, or ``rollback_pins``) and no earlier stack move is unfinished."""
    s = settings.stack
    if not s.enabled or s.vendor is None:
        return None
    os = host_os()
    t = stack.with_pins(s, rollback_pins) if rollback_pins else s
    reason = gpu_ops.pending_change(t, os)
    if reason is None and host.get_fact(File, path=stack.STACK_MOVING):
        reason = "an earlier GPU stack move did not finish (the host is still out of rotation)"
    if reason is None:
        return None
    plan = host_plan(engine=False)
    serving_deps = tuple(d.name for d in settings.deployments if deployment_state(plan, d.name).current)
    _, loaded = gpu_ops.module_state(t.vendor, stack.target(t, os).module_package)
    return StackMove(host.name, stack.describe(t), reason, tuple(sorted(stack.pins(t).items())),
                     serving_deps, os, rollback=rollback_pins is not None,
                     reboot_needed=stack.reboot_needed(stack.target(t, os), t.vendor, loaded))


def stack_rollback_move(settings) -> StackMove | None:
    """deploys/rollback.py --data rollback_stack=True: the move back to the previous stack recorded
    on the host; ValueError naming the host when none is recorded."""
    if not settings.stack.enabled or settings.stack.vendor is None:
        return None
    return stack_move(settings, rollback_pins=stack.rollback_pins(recorded_stack(), host.name))


def recorded_stack() -> dict | None:
    """The stack record on the host (gpuserve.stack.STACK_RECORD), as the run began."""
    lines = host.get_fact(FileContents, path=stack.STACK_RECORD)
    return stack.parse_record("\n".join(lines)) if lines else None


def _record(s: stack.StackSettings) -> None:
    """After a converge that verified and admitted the stack: what it serves, and what before."""
    record = stack.record_after(recorded_stack(), stack.pins(s))
    files.directory(name="GPU stack record directory", path=stack.STACK_RECORD.rsplit("/", 1)[0],
                    user="root", group="root", mode="700")
    files.put(name=f"Record the GPU stack: {stack.describe(s)}",
              src=StringIO(json.dumps(record, sort_keys=True) + "\n"), dest=stack.STACK_RECORD,
              user="root", group="root", mode="600")


def _held_set(label: str, specs: list[stack.PackageSpec], family: tuple[str, ...] = (),
              driver_version: str | None = None) -> None:
    """unhold -> install -> hold, each deciding on the host's state when it runs."""
    gpu_ops.refresh_lists_for(name=f"Refresh apt lists for the {label}", specs=specs, family=family)
    gpu_ops.unhold_for_change(name=f"Release the holds on the {label} for its change", specs=specs, family=family)
    gpu_ops.install_set(name=f"Install the {label}", specs=specs, family=family, driver_version=driver_version)
    gpu_ops.hold_set(name=f"Hold the {label}", specs=specs, family=family)


def _nvidia(s: stack.StackSettings, os: str, deb_arch: str, disruptive: bool):
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
    if s.dcgm:
        # not disruptive: the exporter serves the monitor only, and restarts in a second
        listen = files.put(name=f"DCGM exporter on {stack.DCGM_EXPORTER_LISTEN} only",
                           src=StringIO(stack.DCGM_EXPORTER_DROPIN_TEXT), dest=stack.DCGM_EXPORTER_DROPIN,
                           mode="644")
        server.shell(name="Restart the DCGM exporter on its new address",
                     commands=[f"systemctl daemon-reload && if systemctl is-active -q {stack.DCGM_EXPORTER_UNIT}; "
                               f"then systemctl restart {stack.DCGM_EXPORTER_UNIT}; fi"],
                     _if=listen.did_change)
    if not disruptive:
        return None
    _held_set(f"NVIDIA stack ({s.driver_version}, {s.flavour})", stack.nvidia_packages(s, os),
              stack.nvidia_family(os), s.driver_version)
    rebooted = gpu_ops.reboot_for_driver(name="Reboot to load the NVIDIA driver", vendor="nvidia",
                              package=stack.nvidia_kernel_module_package(s, os),
                              allowed=s.reboot_allowed, delay=s.reboot_delay, timeout=s.reboot_timeout)
    for unit in stack.nvidia_units(s):
        systemd.service(name=f"Run {unit}", service=f"{unit}.service", running=True, enabled=True)
    gpu_ops.verify_nvidia(name="Verify GPUs, NVSwitches, services and CUDA", settings=s)
    gpu_ops.admission(name="Admission checks (ECC, retired pages, row remap, PCIe, NVLink, XID)", settings=s)
    _record(s)
    return rebooted


def _amd(s: stack.StackSettings, os: str, deb_arch: str, disruptive: bool):
    files.directory(name="apt keyrings", path=layout.APT_KEYRINGS_DIR, mode="755")
    files.download(name="Download the ROCm repository key", src=stack.rocm_key_url(s),
                   dest=stack.ROCM_KEY, mode="644")
    files.put(name=f"ROCm {s.rocm_version} repository sources",
              src=StringIO(stack.rocm_sources(s, os, deb_arch)), dest=stack.ROCM_SOURCES, mode="644")
    files.put(name="Prefer ROCm packages from AMD's repository", src=StringIO(stack.ROCM_PREFERENCES_TEXT),
              dest=stack.ROCM_PREFERENCES, mode="644")
    if not disruptive:
        return None
    _held_set(f"ROCm {s.rocm_version} stack", stack.amd_packages(s))
    for group in stack.GPU_GROUPS:
        server.group(name=f"Group {group}", group=group, system=True)
    server.user(name="Service user may use the GPUs (render, video)", user=layout.SERVICE_USER,
                groups=list(stack.GPU_GROUPS), append=True)
    rebooted = gpu_ops.reboot_for_driver(name="Reboot to load the amdgpu driver", vendor="amd", package="amdgpu-dkms",
                              allowed=s.reboot_allowed, delay=s.reboot_delay, timeout=s.reboot_timeout)
    gpu_ops.verify_amd(name="Verify GPUs and ROCm", settings=s)
    gpu_ops.admission(name="Admission checks (ECC, PCIe)", settings=s)
    _record(s)
    return rebooted
