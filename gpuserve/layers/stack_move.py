"""The GPU-stack move and the OS-update move (deploys/patch.py) of a rollout, on a host that
serves: a driver (or ROCm) change, or `apt-get upgrade` within the holds. docs/rollout.md.

    out       every deployment out of rotation (gpuserve.layers.rotation), drained
    stop      every engine stopped
    change    the target's apt pin / sources, apt lists, unhold -> install -> hold (one transaction)
    reboot    only if the installed kernel module is not the loaded one, and reboot is allowed
    verify    the declared GPUs, NVSwitches, services, CUDA/ROCm (gpuserve.stack.check_nvidia/amd)
    admit     the admission checks per GPU (gpuserve.admission)
    record    the stack it now serves, and the one before (gpuserve.stack.STACK_RECORD)
    start     every engine, each through its readiness gate
    in        back into rotation

The same move has a second reason: an OS update (gpuserve.patch.PatchMove, deploys/patch.py),
whose change is `apt-get upgrade` within the holds and whose reboot happens only when a new
kernel was installed, after its GPU driver module (DKMS) was found built for it; it records no
stack. docs/patching.md.

Every decision reads the host's facts fresh at that moment (gpuserve.rollout.remote.fact), with
the same code the GPU-stack layer uses in a converge (gpuserve.operations.gpu_stack). A failure before
the change puts the host back into rotation on its old stack; a failure after it leaves the host
out: engines stopped, drain flags kept, and the rollout halts naming the host and the check.
"""

from __future__ import annotations

import json
import shlex
import time
from dataclasses import dataclass
from typing import Callable

from pyinfra import logger

from gpuserve import admission, patch, rollout, stack
from gpuserve.config import HostSettings
from gpuserve.facts.kernel import HeldVersions, KernelState
from gpuserve.layers import rotation
from gpuserve.rollout import pipeline, preconditions, remote
from gpuserve.rollout.pipeline import BOOT_ID  # noqa: F401 - the reboot's command, named in tests
from gpuserve.operations import gpu_stack as gpu_ops
from gpuserve.layers import patch as patch_layer
from gpuserve.rollout.gate import gate
from gpuserve.rollout.remote import COMMAND_TIMEOUT_S, MoveFailed, run, shell
from gpuserve.patch import PatchMove
from gpuserve.rollout import StackMove

APT_TIMEOUT_S = 1800    # apt-get install of a driver set (DKMS builds the module)


def target_settings(s: HostSettings, move: StackMove) -> stack.StackSettings:
    return stack.with_pins(s.stack, dict(move.pins))


def read_record(h) -> dict | None:
    ok, output = shell(h, f"cat {stack.STACK_RECORD} 2>/dev/null", COMMAND_TIMEOUT_S)
    return stack.parse_record(output.stdout) if ok else None


def record_command(record: dict) -> str:
    d = stack.STACK_RECORD.rsplit("/", 1)[0]
    return (f"umask 077; mkdir -p {d} && printf '%s\\n' {shlex.quote(json.dumps(record, sort_keys=True))}"
            f" > {stack.STACK_RECORD}.new && mv -f {stack.STACK_RECORD}.new {stack.STACK_RECORD}")


def source_commands(t: stack.StackSettings, os: str, deb_arch: str) -> list[str]:
    """What makes apt offer the target: NVIDIA's exact-version pin, or ROCm's release repository."""
    if t.vendor == "nvidia":
        path, content = stack.NVIDIA_PREFERENCES, stack.nvidia_preferences(t)
    else:
        path, content = stack.ROCM_SOURCES, stack.rocm_sources(t, os, deb_arch)
    return [f"printf '%s' {shlex.quote(content)} > {path}.new && chmod 644 {path}.new && mv -f {path}.new {path}",
            "DEBIAN_FRONTEND=noninteractive apt-get update -q"]


def move_stack(h, move: StackMove, s: HostSettings) -> None:
    """Raises MoveFailed naming the host and the step when the move cannot finish. The move's
    reason (``move.change``) picks its steps in CHANGES: a GPU-stack change, or an OS update
    (a PatchMove, deploys/patch.py); out, drained, stop, verify, start, gate and in are shared."""
    steps = CHANGES[move.change]
    t = target_settings(s, move)
    get = lambda cls, **kw: remote.fact(h, cls, **kw)   # noqa: E731 - a fresh read every time
    t0 = time.monotonic()
    ready = steps.before_out(h, move, s, t, get)   # checks while the host still serves
    logger.info(f"    [{h.name}] {move}: out of rotation")
    pipeline.out_drained(h, s, move.deployments, take_out=rotation.take_out,
                         wait_drained=rotation.wait_drained)
    for dep in move.deployments:
        run(h, rollout.stop(dep), timeout=s.deployment(dep).shutdown_timeout_s + COMMAND_TIMEOUT_S)
    label = steps.change(h, move, s, t, get, ready)   # and its reboot, when one is needed
    _verify_start_gate_in(h, move, s, t, get, t0, label, record=steps.record)


@dataclass(frozen=True)
class Change:
    """One reason's steps of a whole-host move (the rest is move_stack's)."""
    before_out: Callable   # (h, move, s, t, get) -> what change needs; MoveFailed: the host keeps serving
    change: Callable       # (h, move, s, t, get, ready) -> what the host serves now (a log label)
    record: bool           # the stack it now serves is recorded (gpuserve.stack.STACK_RECORD)


def _stack_preconditions(h, move: StackMove, s: HostSettings, t: stack.StackSettings, get):
    resuming = shell(h, f"test -e {stack.STACK_MOVING}", COMMAND_TIMEOUT_S)[0]
    return _preconditions(h, move, s, t, get, resuming)


def _install(h, move: StackMove, s: HostSettings, t: stack.StackSettings, get, plan) -> str:
    """The change of a GPU-stack move: unhold -> install -> hold, then the reboot if the loaded
    kernel module is not the installed one."""
    target = stack.target(t, move.os)
    run(h, f"mkdir -p -m 700 {stack.STACK_MOVING.rsplit('/', 1)[0]} && touch {stack.STACK_MOVING}")
    install = list(plan.install) + (gpu_ops.companions_for(t.driver_version, target.specs, get)
                                    if t.vendor == "nvidia" else [])
    logger.info(f"    [{h.name}] installing {target.label}")
    try:
        if plan.unhold:
            run(h, "apt-mark unhold " + " ".join(map(shlex.quote, plan.unhold)))
        if install:
            run(h, f"{stack.APT_INSTALL} {' '.join(map(shlex.quote, install))}", timeout=APT_TIMEOUT_S)
    finally:   # whatever apt did, the set is held again, so `apt upgrade` cannot split it
        after = gpu_ops._plan(target.specs, target.family, get=get)
        if after.hold:
            run(h, "apt-mark hold " + " ".join(map(shlex.quote, after.hold)))

    installed, loaded = gpu_ops.module_state(t.vendor, target.module_package, get)
    if stack.module_differs(loaded, installed):
        if not t.reboot_allowed:
            _stays_out(h, move, "reboot", stack.reboot_refused_message(h.name, "the driver", installed, loaded))
        pipeline.reboot(h, t.reboot_delay, t.reboot_timeout, "to load the new driver")
    return target.label


def _patch_preconditions(h, move: PatchMove, s: HostSettings, t: stack.StackSettings, get) -> None:
    if move.role == patch.GATEWAY:
        patch_layer.other_gateways_serve(h, s)   # never the last serving gateway (raises)


def _update(h, move: PatchMove, s: HostSettings, t: stack.StackSettings, get, ready) -> str:
    """The change of an OS-update move (_patch, with its reboot), then a role's services."""
    _patch(h, move, s, t, get)
    why = patch_layer.role_ready(h, move, s)   # a gateway's or monitor's services
    if why:
        _stays_out(h, move, "verify", why)
    return "the OS update"


CHANGES = {"stack": Change(_stack_preconditions, _install, record=True),
           "os-update": Change(_patch_preconditions, _update, record=False)}


STACK_FREE_MIB = 2048   # free space a driver set needs: its .debs in apt's cache and DKMS's build


def _preconditions(h, move: StackMove, s: HostSettings, t: stack.StackSettings, get, resuming: bool):
    """Everything the change needs, checked while the host still serves (MoveFailed otherwise, and
    the host keeps serving): the target's packages visible to apt (after its pin or sources), a
    reboot allowed when the new module needs one, free disk. Returns the package plan. A host an
    earlier move left out of rotation (``resuming``) stays out when a check fails."""
    target = stack.target(t, move.os)
    try:
        deb_arch = run(h, "dpkg --print-architecture").strip()
        for command in source_commands(t, move.os, deb_arch):
            run(h, command, timeout=APT_TIMEOUT_S)
        plan = gpu_ops._plan(target.specs, target.family, with_versions=True, get=get)
        _, loaded = gpu_ops.module_state(t.vendor, target.module_package, get)
        ok, df = shell(h, stack.FREE_SPACE_COMMAND, COMMAND_TIMEOUT_S)
        why = preconditions.stack_move_refusal(
            h.name, target.label, plan.problems, stack.reboot_needed(target, t.vendor, loaded),
            t.reboot_allowed, stack.free_mib(df.stdout) if ok else None, STACK_FREE_MIB)
        if why:
            raise MoveFailed(why)
    except MoveFailed as exc:
        if resuming:   # an earlier move changed the stack already: it must not serve unverified
            _stays_out(h, move, "change", str(exc))
        raise MoveFailed(f"{exc} (nothing was installed; the host serves on its old stack)") from None
    return plan


def _verify_start_gate_in(h, move: StackMove, s: HostSettings, t: stack.StackSettings, get, t0: float,
                          label: str, record: bool) -> None:
    """verify -> admission -> (record) -> start -> gate -> in: the end of every host move."""
    vendor = t.vendor if t.enabled else None   # gpu_stack: False: the drivers are managed elsewhere
    if vendor == "nvidia":
        units = stack.nvidia_units(t)
        run(h, f"systemctl enable --now {' '.join(u + '.service' for u in units)}", timeout=300)
        problems = gpu_ops.nvidia_problems(t, get)
    elif vendor == "amd":
        problems = gpu_ops.amd_problems(t, get)
    else:   # a host without GPUs (only an OS update moves one)
        problems = []
    if problems:
        _stays_out(h, move, "verify", "; ".join(problems))
    findings = gpu_ops.admission_findings(t, get) if vendor and t.admission.enabled else []
    if admission.failures(findings):
        _stays_out(h, move, "admission", admission.failure_message(h.name, findings))
    logger.info(f"    [{h.name}] verified: {t.gpu_count} GPUs as declared, {len(findings)} admission "
                f"check(s) passed")
    if record:
        pins = ({"current": stack.pins(t), "previous": stack.pins(t)} if move.rollback
                else stack.record_after(read_record(h), stack.pins(t)))
        run(h, record_command(pins))


    def failed(dep: str, why: str) -> None:   # every engine stopped again; the host stays out
        for d in move.deployments:
            shell(h, rollout.stop(d), s.deployment(d).shutdown_timeout_s + COMMAND_TIMEOUT_S)
        _stays_out(h, move, "gate", f"{dep}: {why}")
    pipeline.start_gate_in(h, s, move.deployments, gate=gate, back_in=rotation.back_in, failed=failed,
                           before_in=lambda passed: run(h, f"rm -f {move.marker}"))
    logger.info(f"    [{h.name}] serves again on {label} after {time.monotonic() - t0:.0f} s")


def _patch(h, move: PatchMove, s: HostSettings, t: stack.StackSettings, get) -> None:
    """The change of an OS update move: apt upgrade within the holds (the GPU stack's set stays
    as it is), then, when a new kernel is to boot, its GPU driver module checked and the reboot.
    A failure from here on leaves the host out (_stays_out): packages may have changed."""
    resuming = shell(h, f"test -e {patch.PATCH_MOVING}", COMMAND_TIMEOUT_S)[0]
    run(h, f"mkdir -p -m 700 {patch.PATCH_MOVING.rsplit('/', 1)[0]} && touch {patch.PATCH_MOVING}")
    held = get(HeldVersions)
    logger.info(f"    [{h.name}] applying OS updates within the holds ({len(held)} held package(s))")
    ok, output = shell(h, patch.APT_UPDATE, APT_TIMEOUT_S)
    if not ok and not resuming:   # nothing changed yet: the host serves again, then the rollout halts
        shell(h, f"rm -f {patch.PATCH_MOVING}", COMMAND_TIMEOUT_S)
        _serve_again(h, move, s)
        raise MoveFailed(f"{h.name}: {move.title} failed at update: apt-get update failed "
                         f"(nothing was installed; the host serves again): {output.output[-800:]}")
    if ok:
        ok, output = shell(h, patch.APT_UPGRADE, APT_TIMEOUT_S)
    if not ok:
        _stays_out(h, move, "update", f"apt-get upgrade failed: {output.output[-800:]}")
    changed = patch.held_changed(held, get(HeldVersions))
    if changed:   # apt keeps held packages back: this is a bug or a hand-made change, never served on
        _stays_out(h, move, "update", "held packages changed: " + ", ".join(changed))
    kernels = get(KernelState)
    target = kernels.change
    if target is None:
        logger.info(f"    [{h.name}] no kernel change (running {kernels.running}): no reboot")
        return
    # the GPUs' vendor whether or not gpuserve manages their stack (gpu_stack: False): a new
    # kernel without the driver's module leaves any GPU host unable to serve. The exact driver
    # version is known only when gpuserve pins it
    vendor = t.vendor if t.enabled else (s.hardware.vendor if s.uses_gpus else None)
    driver = t.driver_version if t.enabled and vendor == "nvidia" else None
    why = preconditions.module_problem(kernels, target, vendor, driver, h.name)
    if why:   # checked before the reboot: the old kernel still runs the GPUs
        _stays_out(h, move, "verify", why)
    if not t.reboot_allowed:
        _stays_out(h, move, "reboot", f"{h.name}: kernel {target} is installed ({kernels.running} runs) "
                   "and this host may not be rebooted (reboot: never). Allow it with `reboot: allowed` "
                   "(or `--data reboot=allowed`), or reboot the host yourself and run deploys/patch.py again")
    pipeline.reboot(h, t.reboot_delay, t.reboot_timeout, f"to boot kernel {target}")
    after = get(KernelState)
    if after.running != target:
        _stays_out(h, move, "verify", f"{h.name}: rebooted into kernel {after.running}, expected {target} "
                   "(GRUB_DEFAULT?)")
    why = preconditions.module_problem(after, target, vendor, driver, h.name)
    if why:
        _stays_out(h, move, "verify", why)
    logger.info(f"    [{h.name}] running kernel {target}; "
                + ("its GPU driver module is built" if vendor else "no GPU driver to check"))


def _serve_again(h, move: StackMove, s: HostSettings) -> None:
    """Nothing changed yet: every deployment back, those whose gate fails stay out."""
    pipeline.start_gate_in(h, s, move.deployments, gate=gate, back_in=rotation.back_in)


def _stays_out(h, move: StackMove, step: str, why: str) -> None:
    """The host keeps its engines stopped and its drain flags: it must not serve on a stack that
    failed (an enabled unit started again at boot, so it is stopped here). A rerun, once the
    operator fixed the host, finishes the move."""
    for dep in move.deployments:
        try:
            shell(h, rollout.stop(dep), COMMAND_TIMEOUT_S)
        except MoveFailed as exc:   # unreachable: the failure below says what happened
            logger.warning(f"    {exc}")
    where = ("The host stays out of rotation with its engines stopped" if move.deployments
             else "The host's move is unfinished")
    raise MoveFailed(f"{h.name}: {move.title} failed at {step}: {why}. {where}; fix it and run "
                     "the same command again to finish the rollout")
