"""The Grafana dashboards in gpuserve/dashboards/ (gpuserve/grafana.py), checked three ways:

- they are what gpuserve/grafana.py generates, in the shape Grafana imports (``__inputs`` asking
  for a Prometheus data source, used by every panel, query and variable);
- every query names only metrics the project knows (gpuserve.monitoring's names, its recording
  rules, and the few DCGM, node-exporter and watchdog names gpuserve.grafana declares);
- every query is valid PromQL to promtool (``check rules``) and returns data (``test rules``)
  from series shaped as the project's scrape configuration labels them, with the project's own
  recording rules loaded.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from gpuserve import grafana, monitoring

FILES = sorted(grafana.OUT_DIR.glob("*.json"))
PROMTOOL = shutil.which("promtool")
HOST, DEPLOYMENT = "gpu-1", "d"
# Grafana's variables, as a user picks them (the test series carry these values)
VARIABLES = {"$__rate_interval": "1m", "$host": HOST, "$deployment": DEPLOYMENT}


def dashboards() -> dict[str, dict]:
    return {p.stem: json.loads(p.read_text()) for p in FILES}


def exprs(d: dict) -> list[str]:
    found = [t["expr"] for p in d["panels"] for t in p["targets"]]
    for v in d["templating"]["list"]:   # label_values(<selector>, <label>)
        found.append(re.fullmatch(r"label_values\((.*), *\w+\)", v["query"]["query"]).group(1))
    return found


def concrete(expr: str) -> str:
    for var, value in VARIABLES.items():
        expr = expr.replace(var, value)
    assert "$" not in expr, expr
    return expr


def all_exprs() -> list[str]:
    return [concrete(e) for d in dashboards().values() for e in exprs(d)]


def test_the_files_are_what_the_module_generates():
    assert [p.stem for p in FILES] == sorted(grafana.DASHBOARDS)
    for p in FILES:
        assert p.read_text() == grafana.render(p.stem), \
            f"{p} is stale: run .venv/bin/python -m gpuserve.grafana"


def test_each_dashboard_has_the_shape_grafana_imports():
    uids = set()
    for name, d in dashboards().items():
        assert d["title"].startswith("gpuserve / ") and d["uid"] and len(d["uid"]) <= 40, name
        uids.add(d["uid"])
        [ds] = d["__inputs"]
        assert ds == {**ds, "name": "DS_PROMETHEUS", "type": "datasource", "pluginId": "prometheus"}
        want = {"type": "prometheus", "uid": "${DS_PROMETHEUS}"}
        assert d["panels"], name
        ids = [p["id"] for p in d["panels"]]
        assert len(set(ids)) == len(ids)
        for p in d["panels"]:
            assert p["datasource"] == want and p["title"] and p["type"], (name, p["title"])
            g = p["gridPos"]
            assert g["x"] + g["w"] <= 24 and g["w"] > 0 and g["h"] > 0, (name, p["title"])
            refs = [t["refId"] for t in p["targets"]]
            assert p["targets"] and len(set(refs)) == len(refs), (name, p["title"])
            assert all(t["datasource"] == want and t["expr"].strip() for t in p["targets"])
        for v in d["templating"]["list"]:
            assert v["datasource"] == want and v["type"] == "query"
    assert len(uids) == len(FILES)


# --- metric names --------------------------------------------------------------------------------

KEYWORDS = {"and", "or", "unless", "bool", "offset", "by", "without", "on", "ignoring",
            "group_left", "group_right", "inf", "nan"}


def metric_names(expr: str) -> set[str]:
    """The metric names an expression reads: bare names, and the alternatives of
    ``__name__=~"a|b"`` matchers (as gpuserve.monitoring.names writes them)."""
    found = set()
    for alternatives in re.findall(r'__name__=~"([^"]*)"', expr):
        found |= set(alternatives.split("|"))
    text = re.sub(r'"(?:[^"\\]|\\.)*"', '""', expr)
    text = re.sub(r"\{[^}]*\}|\[[^\]]*\]", " ", text)
    text = re.sub(r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", " ", text)
    for m in re.finditer(r"(?<![\w.:])([a-zA-Z_:][a-zA-Z0-9_:]*)(\s*\()?", text):
        if not m.group(2) and m.group(1).lower() not in KEYWORDS:
            found.add(m.group(1))
    return found


def known_metrics() -> set[str]:
    known = {"up", "ALERTS", *grafana.EXTRA_METRICS}
    for value in vars(monitoring).values():
        names = value if isinstance(value, tuple) else (value,)
        for n in names:
            if isinstance(n, str) and re.fullmatch(r"(vllm|sglang):\w+|DCGM_FI_\w+|gpuserve_\w+|"
                                                   r"http_requests_total", n):
                known |= {n, n + "_bucket", n + "_sum", n + "_count"}
    known |= {r["record"] for r in monitoring.recording_rules()}
    return known


def test_metric_names_finds_every_name_and_only_names():
    assert metric_names('sum by (host, le) (rate({__name__=~"vllm:a|sglang:b",job="x"}[5m])) '
                        '/ on (host) group_left (release) foo_total{l="bar baz"} > bool 0.5e3') \
        == {"vllm:a", "sglang:b", "foo_total"}


def test_every_query_names_only_metrics_the_project_knows():
    known = known_metrics()
    for name, d in dashboards().items():
        for e in exprs(d):
            assert metric_names(e), (name, e)
            unknown = metric_names(e) - known
            assert not unknown, f"{name}: {e} reads {sorted(unknown)}, unknown to gpuserve.monitoring"


def test_the_dashboards_use_the_engines_the_release_and_the_gpu_series():
    used = set().union(*(metric_names(e) for e in all_exprs()))
    for n in ("gpuserve:ttft_seconds:p95_5m", "gpuserve:ttft_seconds:p50_5m",
              "gpuserve:kv_cache_usage:ratio", "gpuserve:prefix_cache_hit:ratio_rate5m",
              "vllm:prefix_cache_hits_total", "vllm:prefix_cache_queries_total",
              "gpuserve:generation_tokens:rate1m", monitoring.RELEASE_INFO, monitoring.DCGM_XID,
              "http_requests_total"):
        assert n in used, n


# --- promtool ------------------------------------------------------------------------------------

def promtool(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    assert PROMTOOL, "promtool is missing: run dev/bootstrap.sh (Debian package prometheus)"
    return subprocess.run([PROMTOOL, *args], cwd=cwd, capture_output=True, text=True, timeout=120)


def test_promtool_accepts_every_query(tmp_path):
    rules = [{"record": f"gpuserve_dashboard:q{i}", "expr": e} for i, e in enumerate(all_exprs())]
    (tmp_path / "queries.yml").write_text(json.dumps({"groups": [{"name": "q", "rules": rules}]}))
    result = promtool("check", "rules", "queries.yml", cwd=tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr
    assert f"SUCCESS: {len(rules)} rules found" in result.stdout


ENGINE = f'job="{monitoring.ENGINE_JOB}",host="{HOST}",deployment="{DEPLOYMENT}"'
NODE = f'job="{monitoring.NODE_JOB}",host="{HOST}"'
DCGM = f'job="{monitoring.DCGM_JOB}",host="{HOST}",gpu="0"'
METER = f'job="{monitoring.METER_JOB}",host="{HOST}",deployment="{DEPLOYMENT}"'


def series() -> list[dict]:
    """One host's series as the project's Prometheus holds them: the engine's (vLLM's names,
    labelled by the engine job), the watchdog's textfile (node job, deployment from the file),
    node-exporter's and DCGM's."""
    s = [
        (f"up{{{ENGINE}}}", "1x60"),
        (f"vllm:num_requests_running{{{ENGINE}}}", "2x60"),
        (f"vllm:num_requests_waiting{{{ENGINE}}}", "1x60"),
        (f"vllm:generation_tokens_total{{{ENGINE}}}", "0+100x60"),
        (f"vllm:kv_cache_usage_perc{{{ENGINE}}}", "0.97x60"),
        (f"vllm:prefix_cache_hits_total{{{ENGINE}}}", "0+30x60"),
        (f"vllm:prefix_cache_queries_total{{{ENGINE}}}", "0+40x60"),
        (f'http_requests_total{{{ENGINE},handler="/v1/completions",method="POST",status="2xx"}}',
         "0+9x60"),
        (f'http_requests_total{{{ENGINE},handler="/v1/completions",method="POST",status="5xx"}}',
         "0+1x60"),
        (f'{monitoring.RELEASE_INFO}{{{NODE},deployment="{DEPLOYMENT}",release="r-new"}}', "1x60"),
        (f'{monitoring.WATCHDOG_RESTARTS}{{{NODE},deployment="{DEPLOYMENT}"}}', "0x30 1x30"),
        (f'{monitoring.WATCHDOG_GAVE_UP}{{{NODE},deployment="{DEPLOYMENT}"}}', "0x60"),
        (f'{grafana.WATCHDOG_HELD}{{{NODE},deployment="{DEPLOYMENT}"}}', "0x60"),
        (f'{monitoring.NVME_AVAIL}{{{NODE},deployment="{DEPLOYMENT}",path="/nvme"}}', "5e11x60"),
        (f'{monitoring.NVME_ALERT}{{{NODE},deployment="{DEPLOYMENT}",path="/nvme"}}', "1e11x60"),
        (f"{grafana.NODE_LOAD1}{{{NODE}}}", "1.5x60"),
        (f"{grafana.NODE_MEM_AVAILABLE}{{{NODE}}}", "6e10x60"),
        (f"{grafana.NODE_MEM_TOTAL}{{{NODE}}}", "1e11x60"),
        ('ALERTS{alertname="GpuserveKvCacheFull",alertstate="firing",host="gpu-1"}', "1x60"),
        (f'{monitoring.METER_TOKENS}{{{METER},key_id="c-solo-1",tenant="solo",kind="prompt"}}', "0+50x60"),
        (f'{monitoring.METER_UNMETERED}{{{METER},key_id="c1",tenant="-"}}', "0+1x60"),
    ]
    for name in (grafana.DCGM_GPU_UTIL, grafana.DCGM_FB_USED, grafana.DCGM_FB_FREE,
                 grafana.DCGM_GPU_TEMP, grafana.DCGM_POWER, monitoring.DCGM_XID,
                 monitoring.DCGM_UNCORRECTABLE_ROWS, monitoring.DCGM_ROW_REMAP_FAILURE):
        s.append((f"{name}{{{DCGM}}}", "10x60"))
    for hist in (monitoring.TTFT[0], monitoring.E2E[0], monitoring.ITL[0]):
        for le, values in (("0.1", "0+4x60"), ("1", "0+5x60"), ("+Inf", "0+5x60")):
            s.append((f'{hist}_bucket{{{ENGINE},le="{le}"}}', values))
    return [{"series": k, "values": v} for k, v in s]


def test_promtool_every_query_returns_data(tmp_path):
    """Each query (and each variable's selector), with the project's recording rules loaded,
    returns at least one sample from one host's series: ``count(q) > bool 0`` is 1 only then."""
    conf = json.loads(monitoring.rules_yml(monitoring.MonitorSettings()).split("\n", 1)[1])
    recording = [g for g in conf["groups"] if g["name"] == "gpuserve-recording"]
    (tmp_path / "rules.yml").write_text(json.dumps({"groups": recording}))
    queries = all_exprs()
    tests = {"rule_files": ["rules.yml"], "evaluation_interval": "15s", "tests": [{
        "interval": "15s", "input_series": series(),
        "promql_expr_test": [{"expr": f"count({q}) > bool 0", "eval_time": "10m",
                              "exp_samples": [{"labels": "{}", "value": 1}]} for q in queries],
    }]}
    (tmp_path / "test.yml").write_text(json.dumps(tests))
    result = promtool("test", "rules", "test.yml", cwd=tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr


def test_promtool_a_query_of_an_unknown_series_would_fail(tmp_path):
    """The check above can fail: a query nothing feeds returns no data, and promtool says so."""
    tests = {"rule_files": [], "evaluation_interval": "15s", "tests": [{
        "interval": "15s", "input_series": series(),
        "promql_expr_test": [{"expr": f'count(vllm:num_requests_running{{host="other"}}) > bool 0',
                              "eval_time": "10m", "exp_samples": [{"labels": "{}", "value": 1}]}],
    }]}
    (tmp_path / "test.yml").write_text(json.dumps(tests))
    result = promtool("test", "rules", "test.yml", cwd=tmp_path)
    assert result.returncode != 0 and "got: nil" in result.stderr


@pytest.mark.parametrize("variable", ["$host", "$deployment", "$__rate_interval"])
def test_the_dashboards_use_grafanas_variables(variable):
    assert any(variable in e for d in dashboards().values() for e in exprs(d))
