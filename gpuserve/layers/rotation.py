"""Rotation: the first and last steps of every move (FLEET.md), for one deployment on one host.

    out       take the deployment out of rotation (the proxy's /health answers 503), wait drain_s
    drained   wait until the engine runs no request (its own metric), at most drain_timeout_s
    ...       (the move's own steps: stop, change, reboot, verify, start, gate)
    back_in   put it back into rotation

Every rollout reason (upgrade, rollback, GPU stack, removal) goes through these, so a gateway
or any other way of taking hosts out is added here once.
"""

from __future__ import annotations

import time

from pyinfra import logger

from gpuserve import rollout
from gpuserve.config import HostSettings
from gpuserve.layers.remote import COMMAND_TIMEOUT_S, MoveFailed, run, shell
from gpuserve.service import probe_url

DRAIN_POLL_S = 1.0


def take_out(h, s: HostSettings, dep_name: str) -> None:
    """Out of rotation, then drain_s for load balancers to notice (nothing to wait for without
    the proxy: then nothing balances onto the host through gpuserve)."""
    if not s.proxy:
        return
    run(h, rollout.out_of_rotation(dep_name))
    logger.info(f"    [{h.name}] {dep_name} out of the proxy; waiting {s.drain_s} s for load balancers")
    time.sleep(s.drain_s)


def wait_drained(h, s: HostSettings, dep_name: str) -> None:
    """Until the engine runs no request, at most drain_timeout_s; whatever still runs then gets
    the engine's own shutdown_timeout_s when it stops. An engine that is not up (or whose metrics
    do not answer) has nothing to drain."""
    dep = s.deployment(dep_name)
    command = rollout.running_requests(probe_url(dep.serve_host, dep.serve_port, "/metrics"))
    deadline = time.monotonic() + s.drain_timeout_s
    waited = False
    while True:
        ok, output = shell(h, command, COMMAND_TIMEOUT_S)
        running = rollout.parse_running(output.stdout) if ok else None
        if not running:
            if waited:
                logger.info(f"    [{h.name}] {dep_name}: in-flight requests finished")
            return
        if time.monotonic() >= deadline:
            logger.warning(f"    [{h.name}] {dep_name}: {running} request(s) still running after "
                           f"drain_timeout_s = {s.drain_timeout_s} s; stopping anyway (they get "
                           f"shutdown_timeout_s = {dep.shutdown_timeout_s} s)")
            return
        if not waited:
            logger.info(f"    [{h.name}] {dep_name}: waiting for {running} running request(s) "
                        f"(at most {s.drain_timeout_s} s)")
            waited = True
        time.sleep(DRAIN_POLL_S)


def back_in(h, s: HostSettings, dep_name: str) -> None:
    if not s.proxy:
        return
    run(h, rollout.into_rotation(dep_name))
    logger.info(f"    [{h.name}] {dep_name} back in the proxy")


__all__ = ["take_out", "wait_drained", "back_in", "MoveFailed"]
