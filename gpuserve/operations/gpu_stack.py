"""Operations of the GPU stack layer that decide at execute time.

pyinfra runs an operation's body twice: once while planning (facts as the host is before the
run) and again when it executes (facts as earlier operations left the host). These operations
read their facts in the body, so each decision (what to unhold, whether to reboot, whether the
GPUs are all there) is made on the host's state at that moment, and a host that already is as
configured yields no commands: "No Change".
"""

from __future__ import annotations

import fnmatch
import shlex

from pyinfra import host, logger, state
from pyinfra.api import FunctionCommand, StringCommand, operation
from pyinfra.facts.deb import DebPackages
from pyinfra.facts.systemd import SystemdStatus

from gpuserve import admission as admission_checks
from gpuserve import stack
from gpuserve.facts.admission import AmdAdmission, NvidiaAdmission
from gpuserve.facts.amd import AmdgpuModule, AmdSmiGpus
from gpuserve.facts.apt import AptHolds, AptPolicy
from gpuserve.facts.nvidia import (CudaDeviceCount, NvidiaDriverGpus, NvidiaKernelModule, NvidiaSmiGpus,
                                   NvSwitchDevices)
from gpuserve.rollout import rebooting
from gpuserve.rollout.remote import MoveFailed
from gpuserve.stack import PackageSpec


def fail(message: str) -> FunctionCommand:
    """A command that fails the operation with `message`, logged against the host."""

    def report(state, host) -> bool:  # noqa: ARG001 - pyinfra passes (state, host) by name
        host.log_styled(message, fg="red", log_func=logger.error)
        return False

    return FunctionCommand(report, (), {})


def _installed(get) -> dict[str, str]:
    """Installed package -> its version, from the DebPackages fact."""
    return {name: next(iter(versions)) for name, versions in get(DebPackages).items() if versions}


def _plan(specs: list[PackageSpec], family: tuple[str, ...], with_versions: bool = False,
          get=None, installed: dict[str, str] | None = None) -> stack.PackagePlan:
    """The set's plan from facts read now: ``get`` is pyinfra's ``host.get_fact`` inside an
    operation, or a rollout's fresh read of another host (gpuserve.rollout.remote.fact)."""
    get = get or host.get_fact
    installed = _installed(get) if installed is None else installed
    held = get(AptHolds)
    plan = stack.plan_packages(specs, installed, held, None, family)
    if with_versions and plan.changes:
        policy = get(AptPolicy, packages=[s.name for s in specs])
        available = {name: p.versions for name, p in policy.items()}
        plan = stack.plan_packages(specs, installed, held, available, family)
    return plan


def companions_for(driver_version: str, specs: list[PackageSpec], get=None) -> list[str]:
    """apt-get install arguments for the driver's other installed packages (libcuda1, nvidia-smi,
    ...) at ``driver_version`` (gpuserve.stack.companions): a downgrade would leave them newer."""
    get = get or host.get_fact
    installed = _installed(get)
    names = [s.name for s in specs]
    candidates = [n for n in installed
                  if n not in names and any(fnmatch.fnmatchcase(n, p) for p in stack.NVIDIA_PIN_PATTERNS)
                  and not stack.version_matches(installed[n], driver_version)]
    if not candidates:
        return []
    policy = get(AptPolicy, packages=candidates)
    return stack.companions(installed, names, {n: p.versions for n, p in policy.items()}, driver_version)


def module_state(vendor: str, package: str, get=None) -> tuple[str | None, str | None]:
    """(installed version of the kernel module package, loaded module version)."""
    get = get or host.get_fact
    found = get(NvidiaKernelModule) if vendor == "nvidia" else get(AmdgpuModule)
    return found.installed.get(package), found.loaded


def pending_change(settings: stack.StackSettings, os: str, get=None) -> str | None:
    """Why the host's GPU stack is not ``settings``' yet, or None (gpuserve.stack.pending_reason)."""
    get = get or host.get_fact
    t = stack.target(settings, os)
    module, loaded = module_state(settings.vendor, t.module_package, get)
    installed = _installed(get)   # read once: in a rollout every read is a command on the host
    return stack.pending_reason(_plan(t.specs, t.family, get=get, installed=installed), module, loaded,
                                t.specs, installed)


@operation()
def refresh_lists_for(specs: list[PackageSpec], family: tuple[str, ...] = ()):
    """`apt-get update` when the set must change (its versions may be new to the lists)."""
    if _plan(specs, family).changes:
        yield "DEBIAN_FRONTEND=noninteractive apt-get update -q"


@operation()
def unhold_for_change(specs: list[PackageSpec], family: tuple[str, ...] = ()):
    """Release the holds of a set that is about to move, so apt may change it."""
    plan = _plan(specs, family)
    if plan.unhold:
        yield StringCommand("apt-mark", "unhold", *plan.unhold)


@operation()
def install_set(specs: list[PackageSpec], family: tuple[str, ...] = (), driver_version: str | None = None):
    """Install the set at its pinned versions in one apt transaction (obsolete members removed;
    with ``driver_version``, the driver's other installed packages brought to it too)."""
    plan = _plan(specs, family, with_versions=True)
    if not plan.changes:
        return
    if plan.problems:
        yield fail(f"{host.name}: cannot install " + "; ".join(plan.problems))
        return
    extra = companions_for(driver_version, specs) if driver_version else []
    yield f"{stack.APT_INSTALL} {' '.join(shlex.quote(arg) for arg in [*plan.install, *extra])}"


@operation()
def hold_set(specs: list[PackageSpec], family: tuple[str, ...] = ()):
    """Hold every member, so `apt upgrade` cannot split the driver from its fabric manager."""
    plan = _plan(specs, family)
    if plan.hold:
        yield StringCommand("apt-mark", "hold", *plan.hold)


@operation()
def reboot_for_driver(vendor: str, package: str, allowed: bool, delay: int, timeout: int):
    """Reboot when the installed kernel module package is not the loaded module, if allowed;
    otherwise fail the host saying so (nothing after this operation runs)."""
    what = "NVIDIA driver" if vendor == "nvidia" else "amdgpu driver"
    installed, loaded = module_state(vendor, package)
    if not stack.module_differs(loaded, installed):
        return
    if not allowed:
        yield fail(stack.reboot_refused_message(host.name, what, installed, loaded))
        return
    yield FunctionCommand(_reboot, (delay, timeout, f"to load the {what}"), {})


def _reboot(state, host, delay: int, timeout: int, why: str) -> bool:  # noqa: ARG001 - by name
    """The one reboot path (gpuserve.rollout.rebooting), as every host move reboots; a host that
    does not come back within ``reboot_timeout`` fails, saying so."""
    try:
        rebooting.reboot(host, delay, timeout, why)
    except MoveFailed as exc:
        host.log_styled(str(exc), fg="red", log_func=logger.error)
        return False
    return True


def _units_active(units: list[str], get) -> dict[str, bool]:
    status = get(SystemdStatus, services=[f"{u}.service" for u in units])
    return {u: bool(status.get(f"{u}.service")) for u in units}


def nvidia_problems(settings: stack.StackSettings, get=None) -> list[str]:
    """Declared hardware and configured stack against the host now (empty: all as declared)."""
    get = get or host.get_fact
    smi = get(NvidiaSmiGpus)
    cuda = get(CudaDeviceCount)
    seen = stack.NvidiaObserved(
        loaded_driver=get(NvidiaKernelModule).loaded, gpus=smi.gpus, smi_error=smi.error,
        driver_gpus=get(NvidiaDriverGpus),
        nvswitches=len(get(NvSwitchDevices)), units_active=_units_active(stack.nvidia_units(settings), get),
        cuda_count=cuda.count, cuda_error=cuda.error)
    return stack.check_nvidia(settings, seen)


def amd_problems(settings: stack.StackSettings, get=None) -> list[str]:
    get = get or host.get_fact
    smi = get(AmdSmiGpus)
    return stack.check_amd(settings, stack.AmdObserved(smi.gpus, smi.error, get(AmdgpuModule).rocm))


@operation()
def verify_nvidia(settings: stack.StackSettings):
    """Declared hardware and configured stack against the host, after any reboot: the loaded
    driver, nvidia-smi's GPUs, NVSwitches, services and a CUDA device count."""
    if not state.is_executing:   # a prediction would only repeat the facts before the install
        return
    problems = nvidia_problems(settings)
    if problems:
        yield fail(stack.failure_message(host.name, problems))


@operation()
def verify_amd(settings: stack.StackSettings):
    """Declared hardware against amd-smi, and the ROCm release it reports."""
    if not state.is_executing:
        return
    problems = amd_problems(settings)
    if problems:
        yield fail(stack.failure_message(host.name, problems))


def admission_findings(settings: stack.StackSettings, get=None) -> list[admission_checks.Finding]:
    """Every admission check on every GPU of the host, from its facts now."""
    get = get or host.get_fact
    a = settings.admission
    if settings.vendor == "nvidia":
        seen = get(NvidiaAdmission, nvswitch=settings.nvswitch, dcgm=settings.dcgm)
        return admission_checks.evaluate_nvidia(a, seen, settings.gpu_count, settings.nvswitch)
    if settings.vendor == "amd":
        return admission_checks.evaluate_amd(a, get(AmdAdmission), settings.gpu_count)
    return []


@operation()
def admission(settings: stack.StackSettings):
    """Admission checks (docs/gpu-stack.md, "Admission"): per GPU, visibility and persistence,
    ECC mode and uncorrectable errors, pending retired pages, row-remap failures, PCIe link
    against the GPU's maximum, NVLink and fabric manager (NVSwitch hosts), fatal XIDs since boot.
    Fails the host naming host, GPU, check, value and threshold; `admission: False` skips it.
    Called after verify_nvidia / verify_amd, and by the move pipeline before a host re-enters rotation."""
    if not settings.admission.enabled or settings.vendor is None:
        return
    if not state.is_executing:   # a prediction would only repeat the facts before the install
        return
    findings = admission_findings(settings)
    for f in findings:
        if f.ok:
            logger.debug(f.message(host.name))
    if admission_checks.failures(findings):
        yield fail(admission_checks.failure_message(host.name, findings))
