"""The stack as a rollout target (deploys/upgrade.py, deploys/rollback.py): what a host's stack must
be, its pins, why it is not there yet, and the record of the stack it served before."""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace

from gpuserve import layout
from gpuserve.stack.amd import amd_packages
from gpuserve.stack.checks import module_differs
from gpuserve.stack.nvidia import nvidia_family, nvidia_kernel_module_package, nvidia_packages
from gpuserve.stack.packages import PackagePlan, PackageSpec, satisfied, upstream
from gpuserve.stack.settings import StackSettings

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
