"""The steps every host move shares, written once (docs/rollout.md):

    out -> drained -> stop -> change -> reboot if needed -> verify -> start -> gate -> bake -> in
    ^^^^^^^^^^^^^^                      ^^^^^^                        ^^^^^^^^^^^^^^^^      ^^
    out_drained                         reboot                        start_gate_in (start, gate, in)

A release move (gpuserve.layers.rollout), a GPU-stack move and an OS-update move
(gpuserve.layers.stack_move) each take their deployments out through ``out_drained`` (so does
the removal of a deployment, gpuserve.layers.removal), bring them back through
``start_gate_in``, and reboot a host through ``reboot`` (gpuserve.rollout.rebooting: the
converge's GPU-stack layer reboots through it too). The caller supplies the readiness gate and
the way back into rotation (gpuserve.rollout.gate, gpuserve.layers.rotation.back_in): both read
every host's settings through the layer context, which sits above this package.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Callable, Sequence

from pyinfra import logger

from gpuserve.rollout import commands
# the move's reboot step, the one reboot path
from gpuserve.rollout.rebooting import BOOT_ID, reboot  # noqa: F401
from gpuserve.rollout.remote import run

if TYPE_CHECKING:
    from gpuserve.config import HostSettings

Gate = Callable[[object, "HostSettings", str], "tuple[bool, str]"]   # (host, settings, deployment)
BackIn = Callable[[object, "HostSettings", str], None]
Rotation = Callable[[object, "HostSettings", str], None]   # take_out, wait_drained, back_in


def out_drained(h, s: HostSettings, deployments: Sequence[str], *, take_out: Rotation,
                wait_drained: Rotation | None) -> None:
    """out -> drained: every deployment out of rotation first, then each waited for until it
    runs no request (at most drain_timeout_s: gpuserve.layers.rotation). ``wait_drained`` None:
    nothing to wait for (a removed deployment whose engine address is unknown)."""
    for dep in deployments:
        take_out(h, s, dep)
    if wait_drained is not None:
        for dep in deployments:
            wait_drained(h, s, dep)


def start_gate_in(h, s: HostSettings, deployments: Sequence[str], *, gate: Gate, back_in: BackIn,
                  failed: Callable[[str, str], None] | None = None,
                  before_in: Callable[[list[str]], None] | None = None) -> dict[str, str]:
    """start -> gate -> in: every deployment started, then each through its readiness gate, then
    those that passed back into rotation. ``failed(deployment, why)`` is called at the first
    failed gate and may raise: the move stops there and nothing goes back in. Without it every
    deployment is gated and those that failed stay out. ``before_in(passed)``: after the gates,
    before the first goes back in. Returns the failed gates (deployment -> the gate's last line)."""
    for dep in deployments:
        run(h, commands.start(dep))
    failures: dict[str, str] = {}
    for dep in deployments:
        logger.info(f"    [{h.name}] {dep} started; readiness gate")
        ok, why = gate(h, s, dep)
        if not ok:
            failures[dep] = why
            if failed is not None:
                failed(dep, why)
    passed = [dep for dep in deployments if dep not in failures]
    if before_in is not None:
        before_in(passed)
    for dep in passed:
        back_in(h, s, dep)
    return failures
