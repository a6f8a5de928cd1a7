"""Grafana dashboards for gpuserve's Prometheus (pure: JSON from the project's metric names).

Four dashboards, written to gpuserve/dashboards/*.json (package data: a wheel ships them)
by ``python -m gpuserve.grafana [DIR]`` (a unit test checks that the files there are what this
module generates, that every query is valid PromQL to promtool and returns data from the
project's series, and that it names only metrics the project knows):

- ``fleet``: every host at once: engines up, requests, tokens/s, TTFT, KV cache, errors, releases,
  tokens per tenant (the proxy's token meter, gpuserve.meter);
- ``host``: one host: its engines, latency, KV and prefix cache, GPUs (DCGM), watchdog, NVMe;
- ``kv-cache``: KV-cache use and prefix-cache hits across the fleet;
- ``rollout``: which host serves which release, and the new release against the old one.

Queries read the recording rules of gpuserve.monitoring (``gpuserve:*``, kept by host and
deployment, vLLM's and SGLang's names alike) where one exists, else the engines', DCGM's and the
watchdog's own series. The release of a series comes from joining on ``gpuserve_release_info``.
Each dashboard asks for a Prometheus data source on import (``${DS_PROMETHEUS}``).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from gpuserve import monitoring as m

DS_INPUT = "DS_PROMETHEUS"
DATASOURCE = {"type": "prometheus", "uid": "${%s}" % DS_INPUT}
SCHEMA_VERSION = 39
OUT_DIR = Path(__file__).resolve().parent / "dashboards"   # inside the package: generated output, not a template

# series the dashboards read besides gpuserve.monitoring's, with where their names come from
DCGM_GPU_UTIL = "DCGM_FI_DEV_GPU_UTIL"        # dcgm-exporter etc/default-counters.csv
DCGM_FB_USED = "DCGM_FI_DEV_FB_USED"          # idem (MiB)
DCGM_FB_FREE = "DCGM_FI_DEV_FB_FREE"          # idem (MiB)
DCGM_GPU_TEMP = "DCGM_FI_DEV_GPU_TEMP"        # idem (C)
DCGM_POWER = "DCGM_FI_DEV_POWER_USAGE"        # idem (W)
WATCHDOG_HELD = "gpuserve_watchdog_held"      # gpuserve/files/gpuserve-watchdog: a rollout holds it
NODE_LOAD1 = "node_load1"                     # node-exporter 1.5, loadavg collector
NODE_MEM_AVAILABLE = "node_memory_MemAvailable_bytes"   # node-exporter 1.5, meminfo collector
NODE_MEM_TOTAL = "node_memory_MemTotal_bytes"
EXTRA_METRICS = (DCGM_GPU_UTIL, DCGM_FB_USED, DCGM_FB_FREE, DCGM_GPU_TEMP, DCGM_POWER, WATCHDOG_HELD,
                 NODE_LOAD1, NODE_MEM_AVAILABLE, NODE_MEM_TOTAL)

ENGINE = f'job="{m.ENGINE_JOB}"'
DCGM = f'job="{m.DCGM_JOB}"'
METER = f'job="{m.METER_JOB}"'
NODE = f'job="{m.NODE_JOB}"'
RATE = "$__rate_interval"
BY = f"({m.SCOPE})"
WITH_RELEASE = f"* on ({m.SCOPE}) group_left (release) {m.RELEASE_INFO}"


def _f(selector: str, **labels: str) -> str:
    """Add the dashboard's variable filters to ``selector``'s braces."""
    extra = ",".join(f'{k}=~"{v}"' for k, v in labels.items())
    return selector[:-1] + ("," if selector[-2] != "{" else "") + extra + "}"


def target(expr: str, legend: str = "", ref: str = "A", instant: bool = False,
           table: bool = False) -> dict:
    t = {"datasource": DATASOURCE, "expr": expr, "legendFormat": legend or "__auto", "refId": ref,
         "range": not instant, "instant": instant}
    if table:
        t["format"] = "table"
    return t


def panel(kind: str, title: str, targets: list[dict], *, unit: str = "short", w: int = 12,
          h: int = 8, description: str = "", thresholds: list[tuple[float | None, str]] | None = None,
          **options) -> dict:
    steps = [{"color": c, "value": v} for v, c in (thresholds or [(None, "green")])]
    p = {"type": kind, "title": title, "description": description, "datasource": DATASOURCE,
         "gridPos": {"w": w, "h": h, "x": 0, "y": 0},
         "targets": [dict(t, refId=chr(ord("A") + i)) for i, t in enumerate(targets)],
         "fieldConfig": {"defaults": {"unit": unit, "thresholds": {"mode": "absolute", "steps": steps}},
                         "overrides": []},
         "options": options}
    return p


def _layout(panels: list[dict]) -> list[dict]:
    """Place panels left to right, wrapping at Grafana's 24 columns; ids in order."""
    x = y = row_h = 0
    for i, p in enumerate(panels, 1):
        g = p["gridPos"]
        if x + g["w"] > 24:
            x, y, row_h = 0, y + row_h, 0
        g["x"], g["y"] = x, y
        x += g["w"]
        row_h = max(row_h, g["h"])
        p["id"] = i
    return panels


def variable(name: str, label: str, query: str, *, multi: bool = True) -> dict:
    """A query variable; ``query`` is Grafana's ``label_values(<selector>, <label>)``."""
    return {"name": name, "label": label, "type": "query", "datasource": DATASOURCE,
            "query": {"query": query, "refId": f"{name}-values"}, "definition": query,
            "refresh": 2, "sort": 1, "multi": multi, "includeAll": multi,
            **({"allValue": ".*"} if multi else {}),
            "current": {}, "options": [], "hide": 0}


def dashboard(uid: str, title: str, description: str, panels: list[dict],
              variables: list[dict]) -> dict:
    return {
        "__inputs": [{"name": DS_INPUT, "label": "Prometheus", "description":
                      "gpuserve's Prometheus (the monitor host's, 127.0.0.1:9090 there)",
                      "type": "datasource", "pluginId": "prometheus", "pluginName": "Prometheus"}],
        "__requires": [{"type": "grafana", "id": "grafana", "name": "Grafana", "version": "10.0.0"},
                       {"type": "datasource", "id": "prometheus", "name": "Prometheus",
                        "version": "1.0.0"}],
        "uid": uid, "title": title, "description": description, "tags": ["gpuserve"],
        "editable": True, "graphTooltip": 1, "schemaVersion": SCHEMA_VERSION, "version": 1,
        "time": {"from": "now-3h", "to": "now"}, "refresh": "30s", "timezone": "utc",
        "templating": {"list": variables}, "annotations": {"list": []},
        "panels": _layout(panels),
    }


HOSTS_VAR = variable("host", "host", f"label_values(up{{{ENGINE}}}, host)")
DEPLOYMENT_VAR = variable("deployment", "deployment",
                          f'label_values(up{{{ENGINE},host=~"$host"}}, deployment)')
ONE_HOST_VAR = variable("host", "host", f"label_values(up{{{ENGINE}}}, host)", multi=False)
SEL = {"host": "$host", "deployment": "$deployment"}


def rec(name: str) -> str:
    """A recording rule's series, filtered by the dashboard's variables."""
    return _f(name + "{}", **SEL)


# --- the dashboards -----------------------------------------------------------------------------

def fleet() -> dict:
    up = _f(f"up{{{ENGINE}}}", **SEL)
    return dashboard("gpuserve-fleet", "gpuserve / fleet",
                     "Every serving host at once (gpuserve/grafana.py).", [
        panel("stat", "Engines up", [target(f"sum({up})", instant=True)], w=4, h=4),
        panel("stat", "Engines down", [target(f"count({up} == 0) or vector(0)", instant=True)],
              w=4, h=4, thresholds=[(None, "green"), (1, "red")]),
        panel("stat", "Requests running", [target(f"sum({rec('gpuserve:requests_running')})",
                                                  instant=True)], w=4, h=4),
        panel("stat", "Requests waiting", [target(f"sum({rec('gpuserve:requests_waiting')})",
                                                  instant=True)], w=4, h=4),
        panel("stat", "Tokens/s", [target(f"sum({rec('gpuserve:generation_tokens:rate1m')})",
                                          instant=True)], w=4, h=4, unit="short"),
        panel("stat", "Alerts firing",
              [target('count(ALERTS{alertstate="firing",alertname=~"Gpuserve.*"}) or vector(0)',
                      instant=True)], w=4, h=4, thresholds=[(None, "green"), (1, "red")]),
        panel("timeseries", "Generated tokens/s by host",
              [target(rec("gpuserve:generation_tokens:rate1m"), "{{host}} {{deployment}}")]),
        panel("timeseries", "Requests running and waiting by host",
              [target(rec("gpuserve:requests_running"), "{{host}} {{deployment}} running"),
               target(rec("gpuserve:requests_waiting"), "{{host}} {{deployment}} waiting")]),
        panel("timeseries", "Time to first token p95 (5m)",
              [target(rec("gpuserve:ttft_seconds:p95_5m"), "{{host}} {{deployment}}")], unit="s"),
        panel("timeseries", "Request latency p95 (5m)",
              [target(rec("gpuserve:e2e_seconds:p95_5m"), "{{host}} {{deployment}}")], unit="s"),
        panel("timeseries", "KV-cache use", [target(rec("gpuserve:kv_cache_usage:ratio"),
                                                    "{{host}} {{deployment}}")],
              unit="percentunit", thresholds=[(None, "green"), (m.KV_CACHE_FULL, "red")]),
        panel("timeseries", "5xx share (5m)", [target(rec("gpuserve:request_errors:ratio_rate5m"),
                                                      "{{host}} {{deployment}}")],
              unit="percentunit"),
        # the proxy's token meter: the engine's own usage counts per key, summed by tenant ("-":
        # the keys of api_keys_file, no tenant); unmetered: answers without usage (gpuserve.meter)
        panel("timeseries", "Tokens/s per tenant",
              [target(f"sum by (tenant, kind) (rate({_f(f'{m.METER_TOKENS}{{{METER}}}', **SEL)}[{RATE}]))",
                      "{{tenant}} {{kind}}"),
               target(f"sum by (tenant) (rate({_f(f'{m.METER_UNMETERED}{{{METER}}}', **SEL)}[{RATE}]))",
                      "{{tenant}} unmetered requests")],
              description="From the engines' usage fields, per client key at the proxy (and the "
                          "gateway). Tenant -: keys without a tenant. Unmetered requests: answers "
                          "without usage (docs/monitoring.md, \"Tokens per key\")"),
        dict(panel("table", "Release and engine up by host",
                   [target(_f(f"{m.RELEASE_INFO}{{}}", **SEL), instant=True, table=True),
                    target(up, instant=True, table=True)], w=24,
                   description="Value #A: 1 per release served; Value #B: the engine's /metrics "
                               "answers (1) or not (0)"),
             # one row per host and deployment: both queries joined on their labels
             transformations=[{"id": "merge", "options": {}},
                              {"id": "organize", "options": {"excludeByName": {
                                  "Time": True, "__name__": True, "instance": True, "job": True}}}]),
    ], [HOSTS_VAR, DEPLOYMENT_VAR])


def host() -> dict:
    one = {"host": "$host"}
    up = _f(f"up{{{ENGINE}}}", **SEL)
    dcgm = lambda name: _f(f"{name}{{{DCGM}}}", **one)   # noqa: E731
    return dashboard("gpuserve-host", "gpuserve / host",
                     "One host: its engines, latency, caches, GPUs and watchdog (gpuserve/grafana.py).", [
        panel("stat", "Release", [target(_f(f"{m.RELEASE_INFO}{{}}", **SEL), "{{deployment}} {{release}}",
                                         instant=True)], w=8, h=4, textMode="name"),
        panel("stat", "Engine /metrics up", [target(up, "{{deployment}}", instant=True)], w=4, h=4,
              thresholds=[(None, "red"), (1, "green")]),
        panel("stat", "Watchdog restarts (1h)",
              [target(f"increase({_f(m.WATCHDOG_RESTARTS + '{}', **SEL)}[1h])", "{{deployment}}",
                      instant=True)], w=4, h=4, thresholds=[(None, "green"), (1, "orange")]),
        panel("stat", "Watchdog gave up", [target(_f(m.WATCHDOG_GAVE_UP + "{}", **SEL), "{{deployment}}",
                                                  instant=True)], w=4, h=4,
              thresholds=[(None, "green"), (1, "red")]),
        panel("stat", "Held by a rollout", [target(_f(WATCHDOG_HELD + "{}", **SEL), "{{deployment}}",
                                                   instant=True)], w=4, h=4),
        panel("timeseries", "Requests running and waiting",
              [target(rec("gpuserve:requests_running"), "{{deployment}} running"),
               target(rec("gpuserve:requests_waiting"), "{{deployment}} waiting")]),
        panel("timeseries", "Generated tokens/s",
              [target(rec("gpuserve:generation_tokens:rate1m"), "{{deployment}}")]),
        panel("timeseries", "Latency p50 / p95 (5m)",
              [target(rec("gpuserve:ttft_seconds:p50_5m"), "{{deployment}} TTFT p50"),
               target(rec("gpuserve:ttft_seconds:p95_5m"), "{{deployment}} TTFT p95"),
               target(rec("gpuserve:itl_seconds:p95_5m"), "{{deployment}} inter-token p95"),
               target(rec("gpuserve:e2e_seconds:p95_5m"), "{{deployment}} request p95")], unit="s"),
        panel("timeseries", "KV-cache use and prefix-cache hits",
              [target(rec("gpuserve:kv_cache_usage:ratio"), "{{deployment}} KV cache"),
               target(rec("gpuserve:prefix_cache_hit:ratio_rate5m"), "{{deployment}} prefix hits")],
              unit="percentunit"),
        panel("timeseries", "GPU utilisation", [target(dcgm(DCGM_GPU_UTIL), "GPU {{gpu}}")],
              unit="percent"),
        panel("timeseries", "GPU memory used",
              [target(f"{dcgm(DCGM_FB_USED)} / ({dcgm(DCGM_FB_USED)} + {dcgm(DCGM_FB_FREE)})",
                      "GPU {{gpu}}")], unit="percentunit"),
        panel("timeseries", "GPU temperature and power",
              [target(dcgm(DCGM_GPU_TEMP), "GPU {{gpu}} C"), target(dcgm(DCGM_POWER), "GPU {{gpu}} W")]),
        panel("timeseries", "GPU faults: last XID, uncorrectable rows (1h), row-remap failure",
              [target(dcgm(m.DCGM_XID), "GPU {{gpu}} XID"),
               target(f"increase({dcgm(m.DCGM_UNCORRECTABLE_ROWS)}[1h])", "GPU {{gpu}} uncorrectable"),
               target(dcgm(m.DCGM_ROW_REMAP_FAILURE), "GPU {{gpu}} remap failure")],
              thresholds=[(None, "green"), (1, "red")]),
        panel("timeseries", "Load and memory",
              [target(_f(f"{NODE_LOAD1}{{{NODE}}}", **one), "load1"),
               target(f"1 - {_f(f'{NODE_MEM_AVAILABLE}{{{NODE}}}', **one)} / "
                      f"{_f(f'{NODE_MEM_TOTAL}{{{NODE}}}', **one)}", "memory used (ratio)")]),
        panel("timeseries", "NVMe free and the alert level",
              [target(_f(m.NVME_AVAIL + "{}", **SEL), "{{deployment}} free {{path}}"),
               target(_f(m.NVME_ALERT + "{}", **SEL), "{{deployment}} alert below")], unit="bytes"),
    ], [ONE_HOST_VAR, DEPLOYMENT_VAR])


def kv_cache() -> dict:
    kv = rec("gpuserve:kv_cache_usage:ratio")
    queries = _f(m.names(m.PREFIX_QUERIES), **SEL)
    return dashboard("gpuserve-kv-cache", "gpuserve / KV cache",
                     "KV-cache use and prefix-cache hits (gpuserve/grafana.py). Above "
                     f"{m.KV_CACHE_FULL:.0%} for 5 minutes raises GpuserveKvCacheFull.", [
        panel("stat", "Fullest KV cache", [target(f"max({kv})", instant=True)], w=6, h=4,
              unit="percentunit", thresholds=[(None, "green"), (m.KV_CACHE_FULL, "red")]),
        panel("stat", f"Engines above {m.KV_CACHE_FULL:.0%}",
              [target(f"count({kv} > {m.KV_CACHE_FULL}) or vector(0)", instant=True)], w=6, h=4,
              thresholds=[(None, "green"), (1, "red")]),
        panel("stat", "Prefix-cache hit ratio (fleet, 5m)",
              [target(f"sum(rate({_f(m.names(m.PREFIX_HITS), **SEL)}[5m])) / "
                      f"sum(rate({queries}[5m]) > 0)", instant=True)], w=6, h=4, unit="percentunit"),
        panel("stat", "Requests waiting", [target(f"sum({rec('gpuserve:requests_waiting')})",
                                                  instant=True)], w=6, h=4),
        panel("timeseries", "KV-cache use by host", [target(kv, "{{host}} {{deployment}}")],
              unit="percentunit", thresholds=[(None, "green"), (m.KV_CACHE_FULL, "red")], w=24),
        panel("timeseries", "Prefix-cache hit ratio by host (5m)",
              [target(rec("gpuserve:prefix_cache_hit:ratio_rate5m"), "{{host}} {{deployment}}")],
              unit="percentunit"),
        panel("timeseries", "Prefix-cache lookups (tokens/s) by host",
              [target(f"sum by {BY} (rate({queries}[{RATE}]))", "{{host}} {{deployment}}")]),
        panel("timeseries", "Waiting requests by host (a full KV cache queues them)",
              [target(rec("gpuserve:requests_waiting"), "{{host}} {{deployment}}")], w=24),
    ], [HOSTS_VAR, DEPLOYMENT_VAR])


def rollout() -> dict:
    info = _f(f"{m.RELEASE_INFO}{{}}", **SEL)
    http = _f(f"{m.HTTP_REQUESTS}{{{ENGINE}}}", **SEL)
    http_5xx = _f(f'{m.HTTP_REQUESTS}{{{ENGINE},status="5xx"}}', **SEL)
    by_release = "(deployment, release)"
    return dashboard("gpuserve-rollout", "gpuserve / rollout",
                     "Which host serves which release, and the new release against the old one, "
                     "as the canary bake compares them (gpuserve/canary.py, gpuserve/grafana.py).", [
        panel("timeseries", "Hosts per release", [target(f"count by {by_release} ({info})",
                                                         "{{deployment}} {{release}}")], w=12),
        panel("state-timeline", "Release by host", [target(info, "{{host}} {{deployment}} {{release}}")],
              w=12),
        panel("timeseries", "Time to first token p95 by release (5m)",
              [target(f"max by {by_release} ({rec('gpuserve:ttft_seconds:p95_5m')} {WITH_RELEASE})",
                      "{{deployment}} {{release}}")], unit="s"),
        panel("timeseries", "Request latency p95 by release (5m)",
              [target(f"max by {by_release} ({rec('gpuserve:e2e_seconds:p95_5m')} {WITH_RELEASE})",
                      "{{deployment}} {{release}}")], unit="s"),
        panel("timeseries", "5xx share by release (5m)",
              [target(f"sum by {by_release} (rate({http_5xx}[5m]) {WITH_RELEASE}) / "
                      f"sum by {by_release} (rate({http}[5m]) {WITH_RELEASE} > 0)",
                      "{{deployment}} {{release}}")], unit="percentunit"),
        panel("timeseries", "Generated tokens/s by release",
              [target(f"sum by {by_release} ({rec('gpuserve:generation_tokens:rate1m')} {WITH_RELEASE})",
                      "{{deployment}} {{release}}")]),
        panel("state-timeline", "Engine up and held by a rollout, by host",
              [target(_f(f"up{{{ENGINE}}}", **SEL), "{{host}} {{deployment}} up"),
               target(_f(WATCHDOG_HELD + "{}", **SEL), "{{host}} {{deployment}} held")], w=24),
        panel("timeseries", "Watchdog restarts (15m)",
              [target(f"increase({_f(m.WATCHDOG_RESTARTS + '{}', **SEL)}[15m])",
                      "{{host}} {{deployment}}")], w=24),
    ], [HOSTS_VAR, DEPLOYMENT_VAR])


DASHBOARDS = {"fleet": fleet, "host": host, "kv-cache": kv_cache, "rollout": rollout}


def render(name: str) -> str:
    return json.dumps(DASHBOARDS[name](), indent=2, sort_keys=True) + "\n"


def write(out_dir: Path = OUT_DIR) -> list[Path]:
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = []
    for name in DASHBOARDS:
        path = out_dir / f"{name}.json"
        path.write_text(render(name))
        paths.append(path)
    return paths


if __name__ == "__main__":   # python -m gpuserve.grafana [DIR]: (re)write the dashboards
    for p in write(Path(sys.argv[1]) if len(sys.argv) > 1 else OUT_DIR):
        print(p)
