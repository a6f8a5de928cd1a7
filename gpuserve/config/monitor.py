"""The monitoring keys every host has: Prometheus's scrapes and retention, the SLOs and alerts, the
hang watchdog and the canary bake (gpuserve.monitoring, gpuserve.receivers, gpuserve.canary)."""

from __future__ import annotations

import re
from typing import Any

from gpuserve import monitoring, receivers, schema
from gpuserve.config.sources import _Checker
from gpuserve.values import host_path_problem, scale_hint

MONITOR_NUMBERS = {  # key -> (minimum, maximum, integer only), from gpuserve.schema
    k.name: (k.allowed.lo, k.allowed.hi, isinstance(k.allowed, schema.Int))
    for k in schema.KEYS if k.scope == "monitor" and isinstance(k.allowed, (schema.Int, schema.Number))}
RETENTION = re.compile(r"[1-9][0-9]*(ms|s|m|h|d|w|y)")


def _monitor(c: _Checker) -> monitoring.MonitorSettings | None:
    before = len(c.problems)
    values: dict[str, Any] = {}
    for key, (lo, hi, whole) in MONITOR_NUMBERS.items():
        value = c.get(key)
        kinds = (int,) if whole else (int, float)
        if isinstance(value, bool) or not isinstance(value, kinds) or not lo <= value <= hi:
            kind = "an integer" if whole else "a number"
            c.problem(key, f"{value!r} is not allowed; use {kind} from {lo} to {hi}"
                      + scale_hint(key, value, lo, hi))
        values[key] = value
    retention = c.get("monitor_retention")
    if not (isinstance(retention, str) and RETENTION.fullmatch(retention)):
        c.problem("monitor_retention", f"{retention!r} is not allowed; use a Prometheus duration "
                  "like '15d', '12h' or '2w'")
    storage = c.get("monitor_storage_path")
    why = host_path_problem(storage)
    if why:
        c.problem("monitor_storage_path", why)
    watchdog = c.boolean("watchdog")
    managed = c.boolean("alertmanager_managed", "the converge writes alertmanager.yml")
    external = c.boolean("external_prometheus", "the exporters and the watchdog without a monitor host")
    found, why = receivers.check(c.get("alert_receivers"), deploying=c.deploying)
    for path, message in why:
        c.problem(path, message, c.sources.get("alert_receivers"))
    if managed is False and found:
        c.problem("alert_receivers", "set alertmanager_managed = True to have gpuserve write "
                  "these receivers, or leave alert_receivers empty and manage alertmanager.yml yourself")
    if len(c.problems) > before:
        return None
    return monitoring.MonitorSettings(
        alert_receivers=found, alertmanager_managed=managed, external_prometheus=external,
        retention=retention, storage_path=storage,
        scrape_interval_s=values["monitor_scrape_interval_s"],
        slo_ttft_p95_s=values["slo_ttft_p95_s"], slo_e2e_p95_s=values["slo_e2e_p95_s"],
        slo_error_ratio=values["slo_error_ratio"], alert_nvme_free_gib=values["alert_nvme_free_gib"],
        watchdog=watchdog, watchdog_stall_s=values["watchdog_stall_s"],
        watchdog_probe_timeout_s=values["watchdog_probe_timeout_s"],
        watchdog_max_restarts=values["watchdog_max_restarts"],
        watchdog_window_s=values["watchdog_window_s"], canary_hosts=values["canary_hosts"],
        canary_bake_s=values["canary_bake_s"],
        canary_error_ratio_max=values["canary_error_ratio_max"],
        canary_ttft_p95_ratio_max=values["canary_ttft_p95_ratio_max"],
        canary_e2e_p95_ratio_max=values["canary_e2e_p95_ratio_max"],
    )
