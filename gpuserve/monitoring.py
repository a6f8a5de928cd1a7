"""What the monitor hosts run, rendered on the control node (pure: no host access).

- ``prometheus_yml``: the scrape configuration, generated from the inventory: every serving
  deployment's /metrics (through the host's TLS proxy as an operator route, or plain http where
  ``trusted_network`` lets the engine leave loopback), every host's node-exporter (through the
  nginx TLS port NODE_EXPORTER_TLS_PORT, operator/monitor networks only) and, on NVIDIA hosts with
  ``dcgm``, NVIDIA's dcgm-exporter (:9400). Every target carries the labels ``host`` and
  ``deployment``; the release a deployment serves comes from ``gpuserve_release_info{deployment,
  release}``, which the watchdog writes into node-exporter's textfile directory on each host
  (so an upgrade needs no change here).
- ``rules_yml``: recording rules (``gpuserve:*``) and the alert rules, in vLLM's and SGLang's own
  metric names (docs/monitoring.md lists them and where they come from).
- ``alertmanager_yml``: a receiver-less alertmanager (alerts are visible on its API and UI; add
  receivers by editing the routes in docs/monitoring.md's way).

Settings live in gpuserve.config (``monitor_*``, ``slo_*``, ``alert_*``, ``watchdog*``).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Iterable, Mapping, Sequence

from gpuserve import layout, meter, schema

MONITOR_GROUP = "monitor"
PROMETHEUS_PORT = 9090       # on the monitor host, loopback only
ALERTMANAGER_PORT = 9093     # on the monitor host, loopback only
NODE_EXPORTER_PORT = 9100    # on every host, loopback only
NODE_EXPORTER_TLS_PORT = 9101  # nginx in front of it: operator/monitor networks only
GATEWAY_METRICS_PATH = "/smg/metrics"   # smg's /metrics on a gateway host's exporters' front

PROMETHEUS_DIR = layout.PROMETHEUS_DIR
PROMETHEUS_YML = f"{PROMETHEUS_DIR}/prometheus.yml"
RULES_YML = f"{PROMETHEUS_DIR}/gpuserve-rules.yml"
ALERTMANAGER_YML = f"{PROMETHEUS_DIR}/alertmanager.yml"
SCRAPE_SECRETS_DIR = f"{PROMETHEUS_DIR}/gpuserve-keys"   # operator keys prometheus scrapes with
SCRAPE_CA_DIR = f"{PROMETHEUS_DIR}/gpuserve-ca"          # certificates of hosts' fronts
TEXTFILE_DIR = layout.NODE_EXPORTER_TEXTFILE_DIR

ENGINE_JOB, NODE_JOB, DCGM_JOB, GATEWAY_JOB = "gpuserve-engine", "node", "dcgm", "smg"
METER_JOB = "gpuserve-meter"   # tokens per key (gpuserve.meter), on hosts with a proxy or a gateway

# vLLM's names (vllm/v1/metrics/loggers.py) and SGLang's (sglang/srt/metrics/collector.py)
RUNNING = ("vllm:num_requests_running", "sglang:num_running_reqs")
WAITING = ("vllm:num_requests_waiting", "sglang:num_queue_reqs")
GENERATION_TOKENS = ("vllm:generation_tokens_total", "sglang:generation_tokens_total")
KV_CACHE = ("vllm:kv_cache_usage_perc", "sglang:token_usage")
TTFT = ("vllm:time_to_first_token_seconds", "sglang:time_to_first_token_seconds")
E2E = ("vllm:e2e_request_latency_seconds", "sglang:e2e_request_latency_seconds")
ITL = ("vllm:inter_token_latency_seconds", "sglang:inter_token_latency_seconds")
PREFIX_HITS = ("vllm:prefix_cache_hits_total",)
PREFIX_QUERIES = ("vllm:prefix_cache_queries_total",)
# vLLM's API server counts HTTP responses (prometheus-fastapi-instrumentator: status "2xx".."5xx",
# /health and /metrics excluded); a 5xx is a request the engine failed
HTTP_REQUESTS = "http_requests_total"
# NVIDIA dcgm-exporter's default counters (etc/default-counters.csv); the ECC DBE counter is
# commented out there, so the uncorrectable-ECC alert rests on the remapped rows (Ampere and
# later remap a row on every uncorrectable error) and uses the DBE counter only where enabled
DCGM_XID = "DCGM_FI_DEV_XID_ERRORS"
DCGM_UNCORRECTABLE_ROWS = "DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS"
DCGM_ROW_REMAP_FAILURE = "DCGM_FI_DEV_ROW_REMAP_FAILURE"
DCGM_ECC_DBE = "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL"
# written by the watchdog (gpuserve/files/gpuserve-watchdog) into TEXTFILE_DIR
RELEASE_INFO = "gpuserve_release_info"
WATCHDOG_RESTARTS = "gpuserve_watchdog_restarts_total"
WATCHDOG_GAVE_UP = "gpuserve_watchdog_gave_up"
WATCHDOG_LAST_CHECK = "gpuserve_watchdog_last_check_timestamp_seconds"
NVME_AVAIL = "gpuserve_nvme_avail_bytes"
NVME_ALERT = "gpuserve_nvme_alert_bytes"
TLS_NOT_AFTER = "gpuserve_tls_cert_not_after_timestamp_seconds"
# counted by the token meter (mtail) from the proxy's usage log (gpuserve.meter)
METER_TOKENS, METER_UNMETERED = meter.TOKENS, meter.UNMETERED

TLS_EXPIRY_DAYS = 14
KV_CACHE_FULL = 0.95
SCOPE = "host, deployment"   # what every per-engine series is kept by


@dataclass(frozen=True)
class MonitorSettings:
    """The monitoring keys of one host (validated by gpuserve.config; defaults: gpuserve.schema)."""
    retention: str = schema.default("monitor_retention")
    storage_path: str = schema.default("monitor_storage_path")
    scrape_interval_s: int = schema.default("monitor_scrape_interval_s")
    slo_ttft_p95_s: float = schema.default("slo_ttft_p95_s")
    slo_e2e_p95_s: float = schema.default("slo_e2e_p95_s")
    slo_error_ratio: float = schema.default("slo_error_ratio")
    alert_nvme_free_gib: float = schema.default("alert_nvme_free_gib")
    watchdog: bool = schema.default("watchdog")
    watchdog_stall_s: int = schema.default("watchdog_stall_s")
    watchdog_probe_timeout_s: int = schema.default("watchdog_probe_timeout_s")
    watchdog_max_restarts: int = schema.default("watchdog_max_restarts")
    watchdog_window_s: int = schema.default("watchdog_window_s")
    canary_hosts: int = schema.default("canary_hosts")
    canary_bake_s: int = schema.default("canary_bake_s")
    canary_error_ratio_max: float = schema.default("canary_error_ratio_max")
    canary_ttft_p95_ratio_max: float = schema.default("canary_ttft_p95_ratio_max")
    canary_e2e_p95_ratio_max: float = schema.default("canary_e2e_p95_ratio_max")
    alert_receivers: tuple = ()        # gpuserve.receivers.Receiver
    alertmanager_managed: bool = schema.default("alertmanager_managed")
    external_prometheus: bool = schema.default("external_prometheus")


@dataclass(frozen=True)
class EngineTarget:
    """One deployment on one serving host, as the monitor reaches it."""
    host: str                 # inventory name (the ``host`` label)
    address: str              # where the monitor connects (ssh_hostname or the name)
    deployment: str
    scheme: str               # https (the proxy) | http (trusted_network)
    port: int
    operator_key_file: str | None = None   # on the monitor: SCRAPE_SECRETS_DIR/<host>-<dep>.key,
    # holding a key of the deployment's scrape_keys_file (monitoring routes only), never an operator key
    ca_file: str | None = None             # on the monitor; None: skip verification (self-signed)
    server_name: str | None = None


@dataclass(frozen=True)
class NodeTarget:
    host: str
    address: str
    ca_file: str | None = None
    dcgm: bool = False        # an NVIDIA host with the DCGM exporter
    operator_key_file: str | None = None
    smg_metrics: str | None = None   # a gateway host: where smg's /metrics listens there (host:port)
    meter: bool = False       # a host with a proxy or a gateway: its token meter (gpuserve.meter)


@dataclass(frozen=True)
class Plan:
    engines: tuple[EngineTarget, ...]
    nodes: tuple[NodeTarget, ...]
    skipped: tuple[str, ...] = field(default=())   # why a deployment is not scraped


def address_of(host: str, address: str) -> str:
    return address or host


def engine_target(host: str, address: str, deployment: str, *, proxy: bool, trusted_network: bool,
                  proxy_port: int, serve_host: str, serve_port: int, has_scrape_key: bool,
                  has_cert_file: bool) -> EngineTarget | str:
    """How the monitor scrapes one deployment, or why it cannot (a sentence)."""
    key = f"{SCRAPE_SECRETS_DIR}/{host}-{deployment}.key" if has_scrape_key else None
    ca = f"{SCRAPE_CA_DIR}/{host}.crt" if has_cert_file else None
    if proxy:
        return EngineTarget(host, address, deployment, "https", proxy_port, key, ca, host)
    if trusted_network and serve_host not in ("127.0.0.1", "::1", "localhost"):
        target = address if serve_host in ("0.0.0.0", "::") else serve_host
        return EngineTarget(host, target, deployment, "http", serve_port)
    return (f"{host} {deployment}: not scraped: the engine listens on {serve_host} only and "
            "there is no proxy (set proxy = True, or trusted_network = True with a serve_host the "
            "monitor reaches)")


def _hostport(address: str, port: int) -> str:
    return f"[{address}]:{port}" if ":" in address else f"{address}:{port}"


def _tls(ca_file: str | None, server_name: str | None) -> dict:
    if ca_file:
        tls = {"ca_file": ca_file}
        if server_name:
            tls["server_name"] = server_name
        return tls
    # the proxy's default certificate is self-signed per host: encrypted, but not verifiable
    # (set proxy_tls_cert_file to get it verified: docs/monitoring.md)
    return {"insecure_skip_verify": True}


def _relabel_job(job: str) -> list[dict]:
    return [{"target_label": "job", "replacement": job}]


def scrape_configs(plan: Plan) -> list[dict]:
    """One job per target (each has its own key and certificate); ``job`` is relabelled to the
    shared name (gpuserve-engine, node, dcgm) so rules select them as one."""
    jobs: list[dict] = []
    for t in plan.engines:
        job = {
            "job_name": f"{ENGINE_JOB}/{t.host}/{t.deployment}",
            "metrics_path": "/metrics",
            "scheme": t.scheme,
            "static_configs": [{"targets": [_hostport(t.address, t.port)],
                                "labels": {"host": t.host, "deployment": t.deployment}}],
            "relabel_configs": _relabel_job(ENGINE_JOB),
        }
        if t.scheme == "https":
            job["tls_config"] = _tls(t.ca_file, t.server_name)
        if t.operator_key_file:
            job["authorization"] = {"type": "Bearer", "credentials_file": t.operator_key_file}
        jobs.append(job)
    for n in plan.nodes:
        job = {
            "job_name": f"{NODE_JOB}/{n.host}",
            "scheme": "https",
            "tls_config": _tls(n.ca_file, n.host if n.ca_file else None),
            "static_configs": [{"targets": [_hostport(n.address, NODE_EXPORTER_TLS_PORT)],
                                "labels": {"host": n.host}}],
            "relabel_configs": _relabel_job(NODE_JOB),
        }
        if n.operator_key_file:
            job["authorization"] = {"type": "Bearer", "credentials_file": n.operator_key_file}
        jobs.append(job)
        if n.dcgm:
            # the DCGM exporter has no TLS of its own: nginx fronts it like node-exporter, under
            # /dcgm on the same TLS port (gpuserve.layers.monitoring)
            jobs.append({
                "job_name": f"{DCGM_JOB}/{n.host}",
                "scheme": "https",
                "metrics_path": "/dcgm/metrics",
                "tls_config": _tls(n.ca_file, n.host if n.ca_file else None),
                "static_configs": [{"targets": [_hostport(n.address, NODE_EXPORTER_TLS_PORT)],
                                    "labels": {"host": n.host}}],
                "relabel_configs": _relabel_job(DCGM_JOB),
                **({"authorization": {"type": "Bearer", "credentials_file": n.operator_key_file}}
                   if n.operator_key_file else {}),
            })
        if n.smg_metrics:
            # smg's metrics listen on the gateway's loopback (or the monitor network): nginx fronts
            # them under /smg on the same TLS port, for the monitor and operator networks only
            jobs.append({
                "job_name": f"{GATEWAY_JOB}/{n.host}",
                "scheme": "https",
                "metrics_path": GATEWAY_METRICS_PATH,
                "tls_config": _tls(n.ca_file, n.host if n.ca_file else None),
                "static_configs": [{"targets": [_hostport(n.address, NODE_EXPORTER_TLS_PORT)],
                                    "labels": {"host": n.host}}],
                "relabel_configs": _relabel_job(GATEWAY_JOB),
            })
        if n.meter:
            # the token meter (mtail) listens on loopback: nginx fronts it under /meter
            jobs.append({
                "job_name": f"{METER_JOB}/{n.host}",
                "scheme": "https",
                "metrics_path": meter.METRICS_PATH,
                "tls_config": _tls(n.ca_file, n.host if n.ca_file else None),
                "static_configs": [{"targets": [_hostport(n.address, NODE_EXPORTER_TLS_PORT)],
                                    "labels": {"host": n.host}}],
                "relabel_configs": _relabel_job(METER_JOB),
            })
    return jobs


def prometheus_yml(plan: Plan, m: MonitorSettings) -> str:
    """prometheus.yml (YAML is a superset of JSON: written as sorted, indented JSON, so the file
    is byte-stable between converges and needs no YAML library)."""
    conf = {
        "global": {"scrape_interval": f"{m.scrape_interval_s}s",
                   "evaluation_interval": f"{m.scrape_interval_s}s",
                   "scrape_timeout": f"{min(10, m.scrape_interval_s)}s"},
        "rule_files": [RULES_YML],
        "alerting": {"alertmanagers": [{"static_configs": [
            {"targets": [f"127.0.0.1:{ALERTMANAGER_PORT}"]}]}]},
        "scrape_configs": [
            {"job_name": "prometheus",
             "static_configs": [{"targets": [f"127.0.0.1:{PROMETHEUS_PORT}"]}]},
            *scrape_configs(plan),
        ],
    }
    return "# Managed by gpuserve (pyinfra): generated from the inventory (gpuserve/monitoring.py)\n" + \
        json.dumps(conf, indent=2, sort_keys=True) + "\n"


def alertmanager_yml(receiver: dict | None = None) -> str:
    """alertmanager.yml; ``receiver``: the one receiver with the integrations of
    ``alert_receivers`` (gpuserve.receivers.alertmanager_receiver), else one without any."""
    conf = {
        "route": {"receiver": "gpuserve", "group_by": ["alertname", "host", "deployment"],
                  "group_wait": "30s", "group_interval": "5m", "repeat_interval": "4h"},
        "receivers": [receiver or {"name": "gpuserve"}],
    }
    return "# Managed by gpuserve (pyinfra): receivers from alert_receivers (docs/monitoring.md)\n" + \
        json.dumps(conf, indent=2, sort_keys=True) + "\n"


# --- rules --------------------------------------------------------------------------------------

def names(metrics: Iterable[str], suffix: str = "") -> str:
    """A selector matching any of ``metrics`` (vLLM's or SGLang's name) from the engine job."""
    alternatives = "|".join(re.escape(m + suffix).replace("\\:", ":") for m in metrics)
    return f'{{__name__=~"{alternatives}",job="{ENGINE_JOB}"}}'


def _quantile(q: float, histogram: Sequence[str], window: str) -> str:
    return (f"histogram_quantile({q}, sum by ({SCOPE}, le) "
            f"(rate({names(histogram, '_bucket')}[{window}])))")


def recording_rules() -> list[dict]:
    return [
        {"record": "gpuserve:requests_running", "expr": f"sum by ({SCOPE}) ({names(RUNNING)})"},
        {"record": "gpuserve:requests_waiting", "expr": f"sum by ({SCOPE}) ({names(WAITING)})"},
        {"record": "gpuserve:requests_active",
         "expr": f"sum by ({SCOPE}) ({names(RUNNING + WAITING)})"},
        {"record": "gpuserve:generation_tokens:rate1m",
         "expr": f"sum by ({SCOPE}) (rate({names(GENERATION_TOKENS)}[1m]))"},
        {"record": "gpuserve:generation_tokens:increase2m",
         "expr": f"sum by ({SCOPE}) (increase({names(GENERATION_TOKENS)}[2m]))"},
        {"record": "gpuserve:kv_cache_usage:ratio", "expr": f"max by ({SCOPE}) ({names(KV_CACHE)})"},
        {"record": "gpuserve:ttft_seconds:p95_5m", "expr": _quantile(0.95, TTFT, "5m")},
        {"record": "gpuserve:ttft_seconds:p50_5m", "expr": _quantile(0.5, TTFT, "5m")},
        {"record": "gpuserve:e2e_seconds:p95_5m", "expr": _quantile(0.95, E2E, "5m")},
        {"record": "gpuserve:itl_seconds:p95_5m", "expr": _quantile(0.95, ITL, "5m")},
        {"record": "gpuserve:request_errors:ratio_rate5m",
         "expr": (f'sum by ({SCOPE}) (rate({HTTP_REQUESTS}{{job="{ENGINE_JOB}",status="5xx"}}[5m]))'
                  f' / sum by ({SCOPE}) (rate({HTTP_REQUESTS}{{job="{ENGINE_JOB}"}}[5m]) > 0)')},
        {"record": "gpuserve:prefix_cache_hit:ratio_rate5m",
         "expr": (f"sum by ({SCOPE}) (rate({names(PREFIX_HITS)}[5m])) / "
                  f"sum by ({SCOPE}) (rate({names(PREFIX_QUERIES)}[5m]) > 0)")},
    ]


RUNBOOKS = "docs/runbooks.md"   # one section per alert (tests/unit/test_runbooks.py)


def runbook_url(alert: str) -> str:
    """The alert's section of docs/runbooks.md (a heading's anchor: its name in lower case)."""
    return f"{RUNBOOKS}#{alert.lower()}"


def _alert(name: str, expr: str, for_: str, severity: str, summary: str, **extra: str) -> dict:
    rule = {"alert": name, "expr": expr, "labels": {"severity": severity},
            "annotations": {"summary": summary, "runbook_url": runbook_url(name), **extra}}
    if for_ != "0s":
        rule["for"] = for_
    return rule


def alert_rules(m: MonitorSettings) -> list[dict]:
    stall = f"{max(30, m.watchdog_stall_s // 2)}s"
    return [
        _alert("GpuserveEngineDown", f'up{{job="{ENGINE_JOB}"}} == 0', "2m", "critical",
               "{{ $labels.host }} {{ $labels.deployment }}: /metrics does not answer "
               "(the engine, or the proxy in front of it, is down)"),
        _alert("GpuserveNodeExporterDown", f'up{{job=~"{NODE_JOB}|{DCGM_JOB}"}} == 0', "5m",
               "warning", "{{ $labels.host }}: {{ $labels.job }} exporter does not answer"),
        _alert("GpuserveEngineHang",
               "gpuserve:requests_active > 0 and on (host, deployment) "
               "gpuserve:generation_tokens:increase2m == 0", stall, "critical",
               "{{ $labels.host }} {{ $labels.deployment }}: {{ $value }} request(s) running or "
               "waiting and no token generated for 2 minutes (a hung engine; /health may still "
               "answer 200)"),
        _alert("GpuserveKvCacheFull", f"gpuserve:kv_cache_usage:ratio > {KV_CACHE_FULL}", "5m",
               "warning", "{{ $labels.host }} {{ $labels.deployment }}: KV cache "
               "{{ $value | humanizePercentage }} full for 5 minutes (requests queue or are "
               "preempted)"),
        _alert("GpuserveTtftSlo", f"gpuserve:ttft_seconds:p95_5m > {m.slo_ttft_p95_s}", "10m",
               "warning", "{{ $labels.host }} {{ $labels.deployment }}: time to first token p95 "
               f"{{{{ $value | humanizeDuration }}}} above the SLO ({m.slo_ttft_p95_s} s)"),
        _alert("GpuserveE2eSlo", f"gpuserve:e2e_seconds:p95_5m > {m.slo_e2e_p95_s}", "10m",
               "warning", "{{ $labels.host }} {{ $labels.deployment }}: request latency p95 "
               f"{{{{ $value | humanizeDuration }}}} above the SLO ({m.slo_e2e_p95_s} s)"),
        _alert("GpuserveErrorRatio", f"gpuserve:request_errors:ratio_rate5m > {m.slo_error_ratio}",
               "5m", "critical", "{{ $labels.host }} {{ $labels.deployment }}: "
               "{{ $value | humanizePercentage }} of requests failed (5xx) over 5 minutes; "
               f"the SLO is {m.slo_error_ratio}"),
        _alert("GpuserveGpuXid", f'{DCGM_XID}{{job="{DCGM_JOB}"}} > 0', "0s", "critical",
               "{{ $labels.host }} GPU {{ $labels.gpu }}: XID {{ $value }} (see the driver's XID "
               "catalogue; admission refuses the host on a fatal one)"),
        _alert("GpuserveGpuUncorrectableEcc",
               f'increase({DCGM_UNCORRECTABLE_ROWS}{{job="{DCGM_JOB}"}}[1h]) > 0 or '
               f'increase({DCGM_ECC_DBE}{{job="{DCGM_JOB}"}}[1h]) > 0', "0s", "critical",
               "{{ $labels.host }} GPU {{ $labels.gpu }}: uncorrectable ECC error(s) in the last "
               "hour"),
        _alert("GpuserveGpuRowRemapFailure", f'{DCGM_ROW_REMAP_FAILURE}{{job="{DCGM_JOB}"}} > 0',
               "0s", "critical", "{{ $labels.host }} GPU {{ $labels.gpu }}: row remapping failed "
               "(the GPU needs service)"),
        _alert("GpuserveNvmeLow", f"{NVME_AVAIL} < {NVME_ALERT}", "10m", "warning",
               "{{ $labels.host }}: {{ $value | humanize1024 }}B free on {{ $labels.path }}, "
               "below alert_nvme_free_gib (the next revision needs room)"),
        _alert("GpuserveTlsExpiry", f"{TLS_NOT_AFTER} - time() < {TLS_EXPIRY_DAYS} * 86400", "0s",
               "warning", "{{ $labels.host }} {{ $labels.deployment }}: the proxy's TLS "
               f"certificate expires within {TLS_EXPIRY_DAYS} days"),
        _alert("GpuserveWatchdogRestarted", f"increase({WATCHDOG_RESTARTS}[15m]) > 0", "0s",
               "warning", "{{ $labels.host }} {{ $labels.deployment }}: the watchdog restarted a "
               "hung engine (journalctl -u gpuserve-watchdog@{{ $labels.deployment }} says why)"),
        _alert("GpuserveWatchdogGaveUp", f"{WATCHDOG_GAVE_UP} == 1", "0s", "critical",
               "{{ $labels.host }} {{ $labels.deployment }}: the watchdog gave up after "
               "watchdog_max_restarts and took the host out of rotation"),
        _alert("GpuserveWatchdogSilent", f"time() - {WATCHDOG_LAST_CHECK} > "
               f"{max(300, 5 * m.watchdog_stall_s)}", "5m", "warning",
               "{{ $labels.host }} {{ $labels.deployment }}: the watchdog has not checked the "
               "engine for minutes (is gpuserve-watchdog@ running?)"),
    ]


ALERTS = ("GpuserveEngineDown", "GpuserveNodeExporterDown", "GpuserveEngineHang",
          "GpuserveKvCacheFull", "GpuserveTtftSlo", "GpuserveE2eSlo", "GpuserveErrorRatio",
          "GpuserveGpuXid", "GpuserveGpuUncorrectableEcc", "GpuserveGpuRowRemapFailure",
          "GpuserveNvmeLow", "GpuserveTlsExpiry", "GpuserveWatchdogRestarted",
          "GpuserveWatchdogGaveUp", "GpuserveWatchdogSilent")


def rules_yml(m: MonitorSettings) -> str:
    conf = {"groups": [
        {"name": "gpuserve-recording", "rules": recording_rules()},
        {"name": "gpuserve-alerts", "rules": alert_rules(m)},
    ]}
    return "# Managed by gpuserve (pyinfra): gpuserve/monitoring.py\n" + \
        json.dumps(conf, indent=2) + "\n"


def smg_metrics(settings) -> str | None:
    """Where smg's /metrics listens on a gateway host (host:port, as the host itself reaches it);
    None on other hosts."""
    gw = getattr(settings, "gateway", None)
    return _hostport(gw.metrics_host, gw.metrics_port) if gw else None


def has_meter(settings) -> bool:
    """Whether the host runs the token meter: it has a proxy (a serving host) or a gateway's front."""
    return bool((settings.serves and settings.proxy) or getattr(settings, "gateway", None))


def plan_targets(hosts: Mapping[str, object], addresses: Mapping[str, str]) -> Plan:
    """The scrape plan from validated settings (gpuserve.config.HostSettings by host name).
    ``addresses``: where the monitor reaches each host (its ssh_hostname, else its name)."""
    engines: list[EngineTarget] = []
    nodes: list[NodeTarget] = []
    skipped: list[str] = []
    for name, s in hosts.items():
        address = address_of(name, addresses.get(name, ""))
        cert = bool(s.proxy and s.proxy_tls_cert_file)
        # the exporters' front has a self-signed certificate and lets in addresses, not keys
        nodes.append(NodeTarget(name, address,
                                dcgm=bool(s.serves and s.stack.vendor == "nvidia" and s.stack.dcgm),
                                smg_metrics=smg_metrics(s), meter=has_meter(s)))
        if not s.serves:
            continue
        for d in s.deployments:
            t = engine_target(name, address, d.name, proxy=s.proxy, trusted_network=s.trusted_network,
                              proxy_port=d.proxy_port, serve_host=d.serve_host,
                              serve_port=d.serve_port, has_scrape_key=bool(d.scrape_keys_file),
                              has_cert_file=cert)
            if isinstance(t, str):
                skipped.append(t)
            else:
                engines.append(t)
    return Plan(tuple(engines), tuple(nodes), tuple(skipped))
