"""The generated Prometheus configuration and rules, checked by Prometheus's own promtool.

promtool comes with Debian's ``prometheus`` package (dev/bootstrap.sh installs it): these tests
fail, not skip, without it. ``promtool test rules`` runs every alert against input series where
it must fire (host "fire") and series where it must stay quiet (host "quiet", and earlier times).
"""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest
from pyinfra.api import Inventory

from gpuserve import monitoring
from gpuserve.config import validate_inventory
from gpuserve.monitoring import MonitorSettings

from .helpers import HARDWARE, SHA, problems_of

PROMTOOL = shutil.which("promtool")


def promtool(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    assert PROMTOOL, "promtool is missing: run dev/bootstrap.sh (Debian package prometheus)"
    return subprocess.run([PROMTOOL, *args], cwd=cwd, capture_output=True, text=True, timeout=120)


def fleet_inventory(tmp_path: Path, extra_monitor: dict | None = None, scrape: bool = True) -> Inventory:
    op = tmp_path / "operator-keys"
    op.write_text("operator-key-0123456789abcdef\n")
    op.chmod(0o600)
    keys = tmp_path / "api-keys"
    keys.write_text("client-key-0123456789abcdef\n")
    keys.chmod(0o600)
    scrape_file = tmp_path / "scrape-keys"
    scrape_file.write_text("scrape-key-0123456789abcdef\n")
    scrape_file.chmod(0o600)
    return Inventory(
        ([("gpu-1", {"ssh_hostname": "10.0.0.11"}), ("cpu-1", {}), ("mon-1", {})], {}),
        hopper_x8=(["gpu-1"], {**HARDWARE["hopper_x8"], "proxy": True, "dcgm": True,
                               "api_keys_file": str(keys), "operator_keys_file": str(op),
                               **({"scrape_keys_file": str(scrape_file)} if scrape else {})}),
        cpu=(["cpu-1"], {**HARDWARE["cpu"], "trusted_network": True, "serve_host": "0.0.0.0"}),
        monitor=(["mon-1"], dict(extra_monitor or {})),
        fleet=(["gpu-1", "cpu-1", "mon-1"], {"model_revision": SHA}),
    )


def test_a_monitor_host_without_hardware_serves_nothing_and_needs_no_engine_keys(tmp_path):
    settings = validate_inventory(fleet_inventory(tmp_path))
    assert settings["mon-1"].serves is False
    assert settings["mon-1"].deployments == ()
    assert settings["gpu-1"].serves and settings["cpu-1"].serves


def test_a_bad_monitoring_value_names_the_host_and_key(tmp_path):
    found = problems_of(fleet_inventory(tmp_path, {"monitor_retention": "forever",
                                                   "watchdog_stall_s": 0}))
    assert any("mon-1" in p and "monitor_retention" in p and "'15d'" in p for p in found), found
    assert any("mon-1" in p and "watchdog_stall_s" in p and "from 10" in p for p in found), found


def test_the_scrape_plan_follows_the_inventory(tmp_path):
    settings = validate_inventory(fleet_inventory(tmp_path))
    plan = monitoring.plan_targets(settings, {"gpu-1": "10.0.0.11"})
    by_host = {t.host: t for t in plan.engines}
    assert set(by_host) == {"gpu-1", "cpu-1"}          # the monitor serves nothing
    gpu = by_host["gpu-1"]
    assert (gpu.scheme, gpu.address, gpu.port) == ("https", "10.0.0.11", 8443)   # the proxy
    assert gpu.operator_key_file == f"{monitoring.SCRAPE_SECRETS_DIR}/gpu-1-minimax.key"
    cpu = by_host["cpu-1"]
    assert (cpu.scheme, cpu.address, cpu.port) == ("http", "cpu-1", 8000)   # trusted network
    assert [n.host for n in plan.nodes] == ["gpu-1", "cpu-1", "mon-1"]
    assert [n.dcgm for n in plan.nodes] == [True, False, False]   # NVIDIA host with dcgm
    assert all(n.operator_key_file is None and n.ca_file is None for n in plan.nodes)


def test_the_monitor_scrapes_with_a_scrape_key_never_an_operator_key(tmp_path):
    """Issue 26 (1): the monitor held the deployment's full operator key as its scrape
    credential. It scrapes with the scrape key; without one it holds no key at all."""
    settings = validate_inventory(fleet_inventory(tmp_path))
    gpu = settings["gpu-1"].deployments[0]
    assert gpu.scrape_keys_file == str(tmp_path / "scrape-keys")
    assert monitoring.plan_targets(settings, {}).engines[0].operator_key_file
    settings = validate_inventory(fleet_inventory(tmp_path, scrape=False))
    assert settings["gpu-1"].deployments[0].operator_keys_file   # still has operator keys
    gpu_target = next(t for t in monitoring.plan_targets(settings, {}).engines if t.host == "gpu-1")
    assert gpu_target.operator_key_file is None


def test_an_engine_on_loopback_without_proxy_is_not_scraped_and_says_why():
    why = monitoring.engine_target("h", "h", "d", proxy=False, trusted_network=False,
                                   proxy_port=8443, serve_host="127.0.0.1", serve_port=8000,
                                   has_scrape_key=False, has_cert_file=False)
    assert isinstance(why, str) and "proxy = True" in why


def test_promtool_accepts_the_generated_config_and_rules(tmp_path):
    settings = validate_inventory(fleet_inventory(tmp_path))
    plan = monitoring.plan_targets(settings, {"gpu-1": "10.0.0.11"})
    etc = tmp_path / "etc"
    text = monitoring.prometheus_yml(plan, MonitorSettings()).replace(monitoring.PROMETHEUS_DIR,
                                                                      str(etc))
    (etc / "gpuserve-keys").mkdir(parents=True)
    (etc / "gpuserve-keys/gpu-1-minimax.key").write_text("k\n")
    (etc / "gpuserve-keys/gpu-1-node.key").write_text("k\n")
    (etc / "prometheus.yml").write_text(text)
    (etc / "gpuserve-rules.yml").write_text(monitoring.rules_yml(MonitorSettings()))
    (etc / "alertmanager.yml").write_text(monitoring.alertmanager_yml())
    for args in (("check", "config", "prometheus.yml"), ("check", "rules", "gpuserve-rules.yml")):
        result = promtool(*args, cwd=etc)
        assert result.returncode == 0, result.stdout + result.stderr
    conf = json.loads(text.split("\n", 1)[1])
    jobs = {j["job_name"]: j for j in conf["scrape_configs"]}
    engine = jobs["gpuserve-engine/gpu-1/minimax"]
    assert engine["scheme"] == "https" and engine["tls_config"] == {"insecure_skip_verify": True}
    assert engine["static_configs"][0]["labels"] == {"host": "gpu-1", "deployment": "minimax"}
    assert "dcgm/gpu-1" in jobs and "dcgm/cpu-1" not in jobs
    assert jobs["node/mon-1"]["static_configs"][0]["targets"] == ["mon-1:9101"]


# --- promtool test rules: every alert fires where it must and stays quiet where it must ---------

E = 'job="gpuserve-engine",deployment="d"'
N = 'job="node",deployment="d"'
D = 'job="dcgm",gpu="0"'


def s(name: str, labels: str, host: str, values: str) -> dict:
    return {"series": f'{name}{{{labels},host="{host}"}}', "values": values}


def histogram(name: str, labels: str, host: str, counts: dict[str, str]) -> list[dict]:
    return [{"series": f'{name}_bucket{{{labels},host="{host}",le="{le}"}}', "values": v}
            for le, v in counts.items()]


# alert -> (input series, eval time, the fired alert's labels besides alertname and severity)
CASES: dict[str, tuple[list[dict], str, dict]] = {
    "GpuserveEngineDown": (
        [s("up", E, "fire", "0x40"), s("up", E, "quiet", "1x40")],
        "5m", {"job": "gpuserve-engine", "host": "fire", "deployment": "d"}),
    "GpuserveNodeExporterDown": (
        [s("up", 'job="node"', "fire", "0x60"), s("up", 'job="node"', "quiet", "1x60")],
        "10m", {"job": "node", "host": "fire"}),
    "GpuserveEngineHang": (
        [s("vllm:num_requests_running", E, "fire", "2x80"),
         s("vllm:generation_tokens_total", E, "fire", "0+5x20 100x60"),   # stops at 5m
         s("vllm:num_requests_running", E, "quiet", "2x80"),
         s("vllm:generation_tokens_total", E, "quiet", "0+5x80"),         # keeps generating
         s("vllm:num_requests_running", E, "idle", "0x80"),
         s("vllm:generation_tokens_total", E, "idle", "7x80")],           # nothing to do
        "10m", {"host": "fire", "deployment": "d"}),
    "GpuserveKvCacheFull": (
        [s("vllm:kv_cache_usage_perc", E, "fire", "0.97x60"),
         s("vllm:kv_cache_usage_perc", E, "quiet", "0.90x60")],
        "10m", {"host": "fire", "deployment": "d"}),
    "GpuserveTtftSlo": (
        histogram("vllm:time_to_first_token_seconds", E, "fire",
                  {"0.5": "0x100", "1": "0x100", "5": "0+10x100", "+Inf": "0+10x100"})
        + histogram("vllm:time_to_first_token_seconds", E, "quiet",
                    {"0.5": "0+10x100", "1": "0+10x100", "5": "0+10x100", "+Inf": "0+10x100"}),
        "20m", {"host": "fire", "deployment": "d"}),
    "GpuserveE2eSlo": (
        histogram("vllm:e2e_request_latency_seconds", E, "fire",
                  {"30": "0x100", "60": "0x100", "120": "0+10x100", "+Inf": "0+10x100"})
        + histogram("vllm:e2e_request_latency_seconds", E, "quiet",
                    {"30": "0+10x100", "60": "0+10x100", "120": "0+10x100", "+Inf": "0+10x100"}),
        "20m", {"host": "fire", "deployment": "d"}),
    "GpuserveErrorRatio": (
        [s("http_requests_total", E + ',handler="/v1/completions",status="2xx"', "fire", "0+90x60"),
         s("http_requests_total", E + ',handler="/v1/completions",status="5xx"', "fire", "0+10x60"),
         s("http_requests_total", E + ',handler="/v1/completions",status="2xx"', "quiet", "0+90x60"),
         # client errors are not the engine's failures
         s("http_requests_total", E + ',handler="/v1/completions",status="4xx"', "quiet", "0+10x60"),
         s("http_requests_total", E + ',handler="/v1/completions",status="5xx"', "quiet", "0x60")],
        "12m", {"host": "fire", "deployment": "d"}),
    "GpuserveGpuXid": (
        [s("DCGM_FI_DEV_XID_ERRORS", D, "fire", "0x4 79x20"),
         s("DCGM_FI_DEV_XID_ERRORS", D, "quiet", "0x24")],
        "3m", {"job": "dcgm", "host": "fire", "gpu": "0"}),
    "GpuserveGpuUncorrectableEcc": (
        [s("DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS", D, "fire", "0x10 1x20"),
         s("DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS", D, "quiet", "3x30")],   # old, not new
        "5m", {"job": "dcgm", "host": "fire", "gpu": "0"}),
    "GpuserveGpuRowRemapFailure": (
        [s("DCGM_FI_DEV_ROW_REMAP_FAILURE", D, "fire", "0 1x10"),
         s("DCGM_FI_DEV_ROW_REMAP_FAILURE", D, "quiet", "0x10")],
        "1m", {"job": "dcgm", "host": "fire", "gpu": "0"}),
    "GpuserveNvmeLow": (
        [s("gpuserve_nvme_avail_bytes", 'job="node",path="/mnt/nvme"', "fire", f"{50 << 30}x80"),
         s("gpuserve_nvme_alert_bytes", 'job="node",path="/mnt/nvme"', "fire", f"{100 << 30}x80"),
         s("gpuserve_nvme_avail_bytes", 'job="node",path="/mnt/nvme"', "quiet", f"{200 << 30}x80"),
         s("gpuserve_nvme_alert_bytes", 'job="node",path="/mnt/nvme"', "quiet", f"{100 << 30}x80")],
        "15m", {"job": "node", "host": "fire", "path": "/mnt/nvme"}),
    "GpuserveTlsExpiry": (
        [s("gpuserve_tls_cert_not_after_timestamp_seconds", N, "fire",
           f"{30 * 86400} {10 * 86400}x10"),
         s("gpuserve_tls_cert_not_after_timestamp_seconds", N, "quiet", f"{30 * 86400}x10")],
        "1m", {"job": "node", "host": "fire", "deployment": "d"}),
    "GpuserveWatchdogRestarted": (
        [s("gpuserve_watchdog_restarts_total", N, "fire", "0x10 1x10"),
         s("gpuserve_watchdog_restarts_total", N, "quiet", "0x20")],
        "4m", {"job": "node", "host": "fire", "deployment": "d"}),
    "GpuserveWatchdogGaveUp": (
        [s("gpuserve_watchdog_gave_up", N, "fire", "0 1x5"),
         s("gpuserve_watchdog_gave_up", N, "quiet", "0x5")],
        "1m", {"job": "node", "host": "fire", "deployment": "d"}),
    "GpuserveWatchdogSilent": (
        [s("gpuserve_watchdog_last_check_timestamp_seconds", N, "fire", "0x80"),          # stopped
         s("gpuserve_watchdog_last_check_timestamp_seconds", N, "quiet", "0+15x80")],     # current
        "15m", {"job": "node", "host": "fire", "deployment": "d"}),
}
SEVERITY = {rule["alert"]: rule["labels"]["severity"]
            for rule in monitoring.alert_rules(MonitorSettings())}


def test_every_alert_has_a_case():
    assert sorted(CASES) == sorted(monitoring.ALERTS) == sorted(SEVERITY)


def rules_without_annotations() -> str:
    """The rules as generated, without annotations: promtool compares annotations exactly, and
    their templates are checked by `promtool check rules` above."""
    conf = json.loads(monitoring.rules_yml(MonitorSettings()).split("\n", 1)[1])
    for group in conf["groups"]:
        for rule in group["rules"]:
            rule.pop("annotations", None)
    return json.dumps(conf)


@pytest.mark.parametrize("alert", sorted(CASES))
def test_promtool_the_alert_fires_and_stays_quiet(tmp_path, alert):
    series, at, labels = CASES[alert]
    tests = {
        "rule_files": ["rules.yml"],
        "evaluation_interval": "15s",
        "tests": [{
            "interval": "15s",
            "input_series": series,
            "alert_rule_test": [
                # at the eval time only the "fire" series alert (the others stay quiet) ...
                {"eval_time": at, "alertname": alert,
                 "exp_alerts": [{"exp_labels": {**labels, "severity": SEVERITY[alert]}}]},
                # ... and nothing has fired at the very start
                {"eval_time": "0m", "alertname": alert, "exp_alerts": []},
            ],
        }],
    }
    (tmp_path / "rules.yml").write_text(rules_without_annotations())
    (tmp_path / "test.yml").write_text(json.dumps(tests))
    result = promtool("test", "rules", "test.yml", cwd=tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr


def test_promtool_sglang_names_drive_the_same_rules(tmp_path):
    """SGLang's metric names (sglang:num_running_reqs, ...) feed the recording rules too."""
    series = [s("sglang:num_queue_reqs", E, "fire", "3x80"),
              s("sglang:generation_tokens_total", E, "fire", "0+5x20 100x60"),
              s("sglang:token_usage", E, "fire", "0.99x80")]
    tests = {"rule_files": ["rules.yml"], "evaluation_interval": "15s", "tests": [{
        "interval": "15s", "input_series": series,
        "alert_rule_test": [
            {"eval_time": "10m", "alertname": "GpuserveEngineHang",
             "exp_alerts": [{"exp_labels": {"host": "fire", "deployment": "d",
                                            "severity": "critical"}}]},
            {"eval_time": "10m", "alertname": "GpuserveKvCacheFull",
             "exp_alerts": [{"exp_labels": {"host": "fire", "deployment": "d",
                                            "severity": "warning"}}]}],
        "promql_expr_test": [{"expr": "gpuserve:requests_waiting", "eval_time": "1m",
                              "exp_samples": [{"labels": 'gpuserve:requests_waiting{host="fire",'
                                                         'deployment="d"}', "value": 3}]}],
    }]}
    (tmp_path / "rules.yml").write_text(rules_without_annotations())
    (tmp_path / "test.yml").write_text(json.dumps(tests))
    result = promtool("test", "rules", "test.yml", cwd=tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr


def test_plan_shows_a_monitor_host_as_serving_nothing(tmp_path):
    from gpuserve.plan import render_plan

    settings = validate_inventory(fleet_inventory(tmp_path))
    text = render_plan(settings, "text")
    assert "mon-1\n  groups:   monitor, fleet\n  monitor:  Prometheus and alertmanager" in text
    assert "gpu-1" in text and "cpu-1" in text
    entries = json.loads(render_plan(settings, "json"))
    assert {"host": "mon-1", "groups": ["monitor", "fleet"], "serves": False, "gateway": None} in entries


def test_a_gateway_host_is_scraped_through_its_exporters_front(tmp_path):
    """smg's metrics listen on the gateway's loopback: the monitor scrapes them under /smg on the
    TLS front the monitor and operator networks reach; no other host gets that job."""
    from gpuserve.layers.monitoring import exporters_conf

    keys = tmp_path / "api-keys"
    keys.write_text("client-key-0123456789abcdef\n")
    keys.chmod(0o600)
    inv = Inventory(
        ([("gpu-1", {"ssh_hostname": "10.0.0.11"}), ("gw-1", {"ssh_hostname": "10.0.0.30"}), ("mon-1", {})], {}),
        hopper_x8=(["gpu-1"], {**HARDWARE["hopper_x8"], "proxy": True,
                               "api_keys_file": str(tmp_path / "api-keys")}),
        gateway=(["gw-1"], {}), monitor=(["mon-1"], {}),
        fleet=(["gpu-1", "gw-1", "mon-1"], {"model_revision": SHA, "api_keys_file": str(tmp_path / "api-keys")}))
    settings = validate_inventory(inv)
    plan = monitoring.plan_targets(settings, {"gpu-1": "10.0.0.11", "gw-1": "10.0.0.30"})
    assert [(n.host, n.smg_metrics) for n in plan.nodes] == [
        ("gpu-1", None), ("gw-1", "127.0.0.1:29000"), ("mon-1", None)]
    jobs = [j for j in monitoring.scrape_configs(plan) if j["job_name"].startswith("smg/")]
    assert [(j["job_name"], j["metrics_path"], j["static_configs"][0]["targets"]) for j in jobs] == [
        ("smg/gw-1", "/smg/metrics", [f"10.0.0.30:{monitoring.NODE_EXPORTER_TLS_PORT}"])]
    front = exporters_conf(["10.0.0.5/32"], False, "/etc/x.conf", monitoring.smg_metrics(settings["gw-1"]))
    assert "location = /smg/metrics {\n        proxy_pass http://127.0.0.1:29000/metrics;" in front
    assert "smg" not in exporters_conf(["10.0.0.5/32"], False, "/etc/x.conf", monitoring.smg_metrics(settings["gpu-1"]))
