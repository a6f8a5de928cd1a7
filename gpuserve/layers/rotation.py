"""Rotation: the first and last steps of every move (docs/rollout.md), for one deployment on one host.

    out       take the deployment out of rotation: out of every gateway's worker file (smg drains
              it), and the proxy's /health answers 503; without gateways, wait drain_s
    drained   with gateways: until every gateway reports it drained (smg lists it no more, or
              draining with no request in flight); then, always, until the engine runs no request
              (its own metric). Both within drain_timeout_s
    ...       (the move's own steps: stop, change, reboot, verify, start, gate)
    back_in   back into rotation: /health 200, back in every gateway's worker file, and every
              gateway reports it healthy before the move ends

Every rollout reason (upgrade, rollback, GPU stack, removal) goes through these. A gateway that
does not answer fails the step (MoveFailed names it): a rollout never moves on believing a host
is out of a gateway that may still send to it. docs/gateway.md, "Rollouts".
"""

from __future__ import annotations

import time

import gevent.lock
from pyinfra import logger
from pyinfra.context import ctx_state

from gpuserve import gateway, rollout
from gpuserve.config import HostSettings, serving_workers
from gpuserve.layers.context import all_settings
from gpuserve.rollout.remote import COMMAND_TIMEOUT_S, MoveFailed, connected, put_text, run, shell
from gpuserve.release_files import probe_url

DRAIN_POLL_S = 1.0
BACK_IN_MIN_S = 60   # the least a gateway gets to see a worker back and healthy
_file_locks: dict[str, gevent.lock.Semaphore] = {}   # one writer per gateway's worker file


def _gateways() -> list:
    """(pyinfra host, GatewaySettings) of every gateway in the inventory (whether or not in this
    run's --limit: a host out of rotation must be out of every gateway). None outside a pyinfra
    run (no inventory)."""
    state = ctx_state.get()
    if state is None or getattr(state, "inventory", None) is None:
        return []
    settings = all_settings()
    out = []
    for h in state.inventory:
        if h.name in settings and settings[h.name].gateway is not None:
            # outside this run's --limit it is connected only now; unreachable: MoveFailed
            connected(h, "a gateway: a host out of rotation must be out of every gateway")
            out.append((h, settings[h.name].gateway))
    return out


def _set_worker(gh, wid: str, present: bool) -> None:
    """Rewrite one gateway's worker file with ``wid`` left out or put back (its place in
    inventory order); the others stay as the gateway has them (another move may have one out)."""
    lock = _file_locks.setdefault(gh.name, gevent.lock.Semaphore())
    with lock:
        current = gateway.manifest_ids(run(gh, f"cat {gateway.WORKERS_FILE}"))
        if (wid in current) == present:
            return
        every = serving_workers(ctx_state.get().inventory, all_settings())
        keep = set(current) | {wid} if present else set(current) - {wid}
        text = gateway.manifest(every, without=[w.id for w in every if w.id not in keep])
        put_text(gh, gateway.WORKERS_FILE, text)


def _states(gh, g) -> dict[str, dict]:
    text = run(gh, f"curl -fsS --max-time 5 {gateway.admin_url(g, '/workers')}")
    try:
        return gateway.worker_states(text)
    except ValueError:
        raise MoveFailed(f"{gh.name}: the gateway's /workers is not JSON: {text[:200]!r}") from None


def take_out(h, s: HostSettings, dep_name: str) -> None:
    """Out of rotation: out of every gateway (each must answer), and /health 503 at the proxy.
    Without gateways, drain_s for load balancers to notice (nothing to wait for without the
    proxy: then nothing balances onto the host through gpuserve)."""
    gws = _gateways()
    if s.proxy:
        run(h, rollout.out_of_rotation(dep_name))
    wid = gateway.worker_id(h.name, dep_name)
    for gh, _ in gws:
        _set_worker(gh, wid, present=False)
        logger.info(f"    [{h.name}] {dep_name} out of gateway {gh.name}'s worker file")
    if gws or not s.proxy:
        return
    logger.info(f"    [{h.name}] {dep_name} out of the proxy; waiting {s.drain_s} s for load balancers")
    time.sleep(s.drain_s)


def wait_drained(h, s: HostSettings, dep_name: str) -> None:
    """Until every gateway has let the deployment go, then until the engine runs no request; at
    most drain_timeout_s for both. Whatever still runs then gets the engine's own
    shutdown_timeout_s when it stops. An engine that is not up (or whose metrics do not answer)
    has nothing to drain."""
    deadline = time.monotonic() + s.drain_timeout_s
    wid = gateway.worker_id(h.name, dep_name)
    for gh, g in _gateways():
        while not gateway.drained(states := _states(gh, g), wid):
            if time.monotonic() >= deadline:
                logger.warning(f"    [{h.name}] {dep_name}: gateway {gh.name} still has "
                               f"{states[wid]['load']} request(s) on it after drain_timeout_s = "
                               f"{s.drain_timeout_s} s; going on")
                break
            time.sleep(DRAIN_POLL_S)
        else:
            logger.info(f"    [{h.name}] {dep_name}: gateway {gh.name} reports it drained")
    dep = s.deployment(dep_name)
    command = rollout.running_requests(probe_url(dep.serve_host, dep.serve_port, "/metrics"))
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
    """Back into rotation; with gateways, returns once every one of them reports the deployment
    healthy and ready (MoveFailed when one does not within its bound)."""
    if s.proxy:
        run(h, rollout.into_rotation(dep_name))
        logger.info(f"    [{h.name}] {dep_name} back in the proxy")
    wid = gateway.worker_id(h.name, dep_name)
    gws = _gateways()
    for gh, _ in gws:
        _set_worker(gh, wid, present=True)
    for gh, g in gws:
        bound = max(BACK_IN_MIN_S, 6 * g.health_interval_s)
        deadline = time.monotonic() + bound
        while not gateway.serving_healthy(states := _states(gh, g), wid):
            if time.monotonic() >= deadline:
                raise MoveFailed(f"{h.name} {dep_name}: back in gateway {gh.name}'s worker file, but "
                                 f"the gateway does not report it healthy after {bound} s "
                                 f"(it reports {states.get(wid, 'no such worker')})")
            time.sleep(DRAIN_POLL_S)
        logger.info(f"    [{h.name}] {dep_name} back in gateway {gh.name}: healthy")


__all__ = ["take_out", "wait_drained", "back_in", "MoveFailed"]
