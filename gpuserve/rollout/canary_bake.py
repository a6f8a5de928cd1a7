"""The canary bake of a rolling upgrade (docs/monitoring.md, "Canary"): after the first batch
(``canary_hosts`` hosts) moved, wait ``canary_bake_s``, then ask a monitor host's Prometheus
whether the canary on its new release holds against the hosts still on the old one
(gpuserve.canary: error ratio, TTFT p95, e2e p95). On a breach the canary goes back to the
release it served and the upgrade halts, printing each query with its value and threshold.

Only release moves bake: a GPU-stack move keeps the release, so the canary and the rest cannot
be told apart by release. ``--data canary_bake_s=0`` skips the bake; without a monitor host in
the inventory a bake is refused unless skipped.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

from pyinfra import logger

from gpuserve import canary
from gpuserve.rollout.plan import Move
from gpuserve.rollout.preconditions import _judged, bake_s, monitors
from gpuserve.rollout.preconditions import canary_refusal as refusal  # noqa: F401 - its rule
from gpuserve.rollout.remote import MoveFailed, run

if TYPE_CHECKING:
    from gpuserve.config import HostSettings


def bake(settings: dict[str, HostSettings], batch: list, hosts: dict, ask=None) -> list[str]:
    """Bake ``batch`` and judge it; the breaches as printable text (empty: it holds)."""
    wait = bake_s(settings, batch)
    if not wait:
        return []
    monitor = hosts[monitors(settings)[0]]
    canary_hosts = sorted({m.host for m in batch})
    logger.info(f"--> canary bake: {', '.join(canary_hosts)} for {wait} s, then Prometheus on "
                f"{monitor.name} judges it against the hosts still on the old release")
    time.sleep(wait)
    if ask is None:
        if not monitor.connected:
            monitor.connect()

        def ask(q):
            return query(monitor, q)
    m = settings[canary_hosts[0]].monitor
    results = []
    for dep, new, old in sorted({(x.deployment, x.to_release, x.from_release) for x in batch if _judged(x)}):
        checks = canary.bake_checks(m, dep, canary_hosts, new, old)
        try:
            results += canary.run_checks(checks, ask)
        except (MoveFailed, ValueError) as exc:   # cannot judge: that is not a pass
            return [f"canary bake could not ask Prometheus on {monitor.name}: {exc}"]
    for r in results:
        logger.info(f"    canary {r.check.name}: {'holds' if r.ok else 'BREACH'}: {r.why}")
    return [canary.format_breach(r) for r in canary.breaches(results)]


def query(monitor_host, promql: str) -> float | None:
    """Ask ``monitor_host`` (a pyinfra Host of group monitor) for ``promql``'s single value."""
    return canary.parse_response(run(monitor_host, canary.query_command(promql), canary.QUERY_TIMEOUT_S + 10))


def reverse(m: Move) -> Move:
    """The move that takes a canary back to what it served (both pointers on it afterwards)."""
    return Move(m.host, m.deployment, m.to_release, m.from_release, previous=m.from_release)
