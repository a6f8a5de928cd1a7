"""Canary checks: the PromQL they build (run by promtool against series), and their verdicts."""

from __future__ import annotations

import json
import math

import pytest

from gpuserve import canary
from gpuserve.monitoring import MonitorSettings

from .test_monitoring import promtool

M = MonitorSettings(canary_bake_s=300)
NEW, OLD = "vllm-0.33.0-new", "vllm-0.32.0-old"
E = 'job="gpuserve-engine",deployment="d"'


def series(tmp_path, canary_slow: bool) -> list[dict]:
    """Host c1 (the canary) on NEW, hosts r1 and r2 on OLD, and a host x9 on NEW that is not
    the canary (it must count in neither side)."""
    def s(name, host, labels, values):
        return {"series": f'{name}{{{E},host="{host}"{labels}}}', "values": values}

    out = []
    for host, release in (("c1", NEW), ("r1", OLD), ("r2", OLD), ("x9", NEW)):
        out.append({"series": f'gpuserve_release_info{{job="node",host="{host}",deployment="d",'
                              f'release="{release}"}}', "values": "1x40"})
        slow = host == "c1" and canary_slow
        # TTFT: every request in (1, 5] when slow, else in (0, 0.5]
        for le, v in (("0.5", "0x40" if slow else "0+10x40"), ("1", "0x40" if slow else "0+10x40"),
                      ("5", "0+10x40"), ("+Inf", "0+10x40")):
            out.append(s("vllm:time_to_first_token_seconds_bucket", host, f',le="{le}"', v))
            out.append(s("vllm:e2e_request_latency_seconds_bucket", host, f',le="{le}"', v))
        errors = "0+1x40" if host == "c1" and canary_slow else "0x40"
        out.append(s("http_requests_total", host, ',status="2xx"', "0+9x40"))
        out.append(s("http_requests_total", host, ',status="5xx"', errors))
        if host == "x9":   # not the canary: its errors must not count
            out[-1] = s("http_requests_total", host, ',status="5xx"', "0+50x40")
    return out


@pytest.mark.parametrize("slow", [True, False])
def test_promtool_evaluates_the_canary_queries(tmp_path, slow):
    checks = canary.bake_checks(M, "d", ["c1"], NEW, OLD)
    want = {
        checks[0].query: 0.1 if slow else 0.0,          # 1 of 10 responses a 5xx
        checks[1].query: 4.8 if slow else 0.475,        # 1 + 0.95 x 4, or 0.95 x 0.5
        checks[1].rest_query: 0.475,                    # r1 and r2 only (not x9, not c1)
        checks[2].query: 4.8 if slow else 0.475,
    }
    tests = {"rule_files": [], "evaluation_interval": "15s", "tests": [{
        "interval": "15s", "input_series": series(tmp_path, slow),
        "promql_expr_test": [{"expr": f"round({q}, 0.0001)", "eval_time": "9m",
                              "exp_samples": [{"labels": "{}", "value": v}]}
                             for q, v in want.items()]}]}
    (tmp_path / "test.yml").write_text(json.dumps(tests))
    result = promtool("test", "rules", "test.yml", cwd=tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr
    verdicts = canary.run_checks(checks, lambda q: {**want, checks[2].rest_query: 0.475}[q])
    assert [r.ok for r in verdicts] == ([False, False, False] if slow else [True, True, True])


def test_a_canary_without_any_5xx_series_has_an_error_ratio_of_0(tmp_path):
    # vLLM makes http_requests_total{status="5xx"} only at its first 5xx: a clean canary has none
    clean = [x for x in series(tmp_path, False)
             if not ('status="5xx"' in x["series"] and 'host="c1"' in x["series"])]
    check = canary.bake_checks(M, "d", ["c1"], NEW, OLD)[0]
    tests = {"rule_files": [], "evaluation_interval": "15s", "tests": [{
        "interval": "15s", "input_series": clean,
        "promql_expr_test": [{"expr": check.query, "eval_time": "9m",
                              "exp_samples": [{"labels": "{}", "value": 0}]}]}]}
    (tmp_path / "test.yml").write_text(json.dumps(tests))
    result = promtool("test", "rules", "test.yml", cwd=tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr


def test_a_slow_canary_breaches_and_the_message_names_query_value_and_threshold():
    check = canary.bake_checks(M, "d", ["c1"], NEW, OLD)[1]
    r = canary.evaluate(check, 4.8, 0.475)
    assert not r.ok and r.threshold == pytest.approx(0.475 * M.canary_ttft_p95_ratio_max)
    text = canary.format_breach(r)
    assert "TTFT p95" in text and "value 4.8" in text and "threshold 0.7125" in text
    assert check.query in text and check.rest_query in text


def test_within_the_ratio_holds():
    check = canary.bake_checks(M, "d", ["c1"], NEW, OLD)[2]
    assert canary.evaluate(check, 1.4, 1.0).ok
    assert not canary.evaluate(check, 1.6, 1.0).ok


def test_no_canary_data_is_a_breach_not_a_pass():
    for check in canary.bake_checks(M, "d", ["c1"], NEW, OLD):
        r = canary.evaluate(check, None, 1.0)
        assert not r.ok and "no data" in r.why
        assert not canary.evaluate(check, math.nan, 1.0).ok


def test_without_old_release_data_the_slo_is_the_threshold():
    check = canary.bake_checks(M, "d", ["c1"], NEW, OLD)[1]
    assert canary.evaluate(check, M.slo_ttft_p95_s * 0.9, None).ok
    r = canary.evaluate(check, M.slo_ttft_p95_s * 1.1, None)
    assert not r.ok and "SLO" in r.why


def test_error_ratio_is_absolute():
    check = canary.bake_checks(M, "d", ["c1"], NEW, OLD)[0]
    assert check.rest_query is None
    assert canary.evaluate(check, 0.005, None).ok
    assert not canary.evaluate(check, 0.02, None).ok


def test_the_window_is_the_bake_but_never_under_four_scrapes():
    assert "[300s]" in canary.bake_checks(M, "d", ["c1"], NEW, OLD)[0].query
    short = MonitorSettings(canary_bake_s=10, scrape_interval_s=15)
    assert "[60s]" in canary.bake_checks(short, "d", ["c1"], NEW, OLD)[0].query


def test_host_names_are_matched_literally():
    q = canary.bake_checks(M, "d", ["gpu-1.prod.example", "gpu-2"], NEW, OLD)[1].query
    assert 'host=~"gpu-1\\\\.prod\\\\.example|gpu-2"' in q


def test_query_command_keeps_the_query_one_argument():
    cmd = canary.query_command('sum(rate(x{a="b c"}[5m]))')
    assert "--data-urlencode 'query=sum(rate(x{a=\"b c\"}[5m]))'" in cmd
    assert cmd.endswith("http://127.0.0.1:9090/api/v1/query")


def test_parse_response():
    vec = {"status": "success", "data": {"resultType": "vector",
                                         "result": [{"metric": {}, "value": [1, "0.25"]}]}}
    assert canary.parse_response(json.dumps(vec)) == 0.25
    empty = {"status": "success", "data": {"resultType": "vector", "result": []}}
    assert canary.parse_response(json.dumps(empty)) is None
    nan = {"status": "success", "data": {"resultType": "vector",
                                         "result": [{"metric": {}, "value": [1, "NaN"]}]}}
    assert math.isnan(canary.parse_response(json.dumps(nan)))
    with pytest.raises(ValueError, match="refused"):
        canary.parse_response(json.dumps({"status": "error", "error": "parse error"}))
