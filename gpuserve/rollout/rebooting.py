"""The one reboot path (issue 28; docs/rollout.md): the converge's GPU-stack layer
(gpuserve.operations.gpu_stack.reboot_for_driver) and every host move
(gpuserve.rollout.pipeline) reboot a host through ``reboot``.

It sits below the operations, beside the bounded commands it uses (gpuserve.rollout.remote), so
that an operation can call it from a FunctionCommand and a move from the rollout's one operation.
"""

from __future__ import annotations

import time

import gevent
from pyinfra import logger

from gpuserve.rollout.remote import COMMAND_TIMEOUT_S, MoveFailed, run, shell

BOOT_ID = "cat /proc/sys/kernel/random/boot_id"
REBOOT = "( sleep 1 && reboot ) </dev/null >/dev/null 2>&1 &"   # detached: the channel closes at once


def reboot(h, delay_s: int, timeout_s: int, why: str) -> None:
    """Reboot ``h`` and wait until it answers with a new boot id, within ``timeout_s``; each
    connection try is bounded (30 s). MoveFailed when it does not come back: the message names
    the host and the setting (``reboot_timeout``). Unlike pyinfra's server.reboot it has no sudo
    askpass file to clean up: the plan refuses ``_sudo_password`` (docs/non-root.md)."""
    before = run(h, BOOT_ID).strip()
    logger.info(f"    [{h.name}] rebooting {why}")
    shell(h, REBOOT, COMMAND_TIMEOUT_S)
    time.sleep(max(delay_s, 1))
    deadline = time.monotonic() + timeout_s
    h.disconnect()
    while True:
        try:
            with gevent.Timeout(30):
                h.connect(show_errors=False)
        except (gevent.Timeout, Exception):   # noqa: BLE001 - still down, or half up
            pass
        if h.connected:
            try:
                now = run(h, BOOT_ID, timeout=30).strip()
            except MoveFailed:
                now = before
            if now != before:
                logger.info(f"    [{h.name}] back after its reboot")
                return
            h.disconnect()
        if time.monotonic() > deadline:
            raise MoveFailed(f"{h.name}: the host did not come back from its reboot ({why}) "
                             f"within reboot_timeout = {timeout_s} s")
        time.sleep(1)
