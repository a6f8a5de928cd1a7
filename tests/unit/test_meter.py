"""Token metering per key (issue 29, gpuserve/meter.py): the pure parts.

- meter.js's patterns (JavaScript regexes that Python's re reads the same way) pick the engine's
  usage out of vLLM's answers: a JSON answer, an SSE stream with a final usage chunk, continuous
  usage, a usage object split between two chunks, and never a "usage" inside generated text;
- the usage log's format (templates/nginx-common.conf.j2) and the mtail program agree: a line as
  nginx writes it is the line the program's patterns read (tenant, counts, "-" for none);
- the meter is scraped through the exporters' front on hosts with a proxy or a gateway, and
  decommission removes its unit, program and log.

The whole path (nginx, njs 0.7.9, mtail, the engine's usage) runs on a real host in
tests/integration/test_key_limits.py.
"""

from __future__ import annotations

import json
import re

from gpuserve import meter, monitoring, proxy_conf, removal
from gpuserve.config import validate_inventory

from .helpers import HARDWARE, SHA, Inventory


def _js_regex(name: str) -> re.Pattern:
    src = re.search(rf"^var {name} = /(.*)/g?;$", proxy_conf.METER_JS_TEXT, re.M)[1]
    return re.compile(src)


USAGE, PROMPT, COMPLETION = (_js_regex(n) for n in ("USAGE", "PROMPT", "COMPLETION"))


def scan(chunks: list[str]) -> dict[str, str]:
    """meter.js's usage(), step by step: the variables it sets over the chunks of one answer."""
    out: dict[str, str] = {}
    tail = ""
    for data in chunks:
        text, end = tail + data, 0
        for m in USAGE.finditer(text):
            if p := PROMPT.search(m[0]):
                out["prompt"] = p[1]
            if c := COMPLETION.search(m[0]):
                out["completion"] = c[1]
            end = m.end()
        tail = text[max(end, len(text) - proxy_conf.METER_KEEP):]
    return out


def _json(obj) -> str:
    return json.dumps(obj, separators=(",", ":"))   # as vLLM (pydantic, starlette) writes it


def test_a_json_answer_gives_its_usage_and_generated_text_cannot_fake_one():
    body = _json({"id": "chatcmpl-1", "choices": [{"message": {
        "content": 'say "usage":{"prompt_tokens":999,"completion_tokens":999}'}}],
        "usage": {"prompt_tokens": 7, "total_tokens": 19, "completion_tokens": 12,
                  "prompt_tokens_details": None}})
    assert scan([body]) == {"prompt": "7", "completion": "12"}


def test_a_stream_gives_its_last_usage_even_split_between_chunks():
    chunks = [f"data: {_json({'choices': [{'delta': {'content': 'x'}}], 'usage': {'prompt_tokens': 5, 'total_tokens': 5 + i, 'completion_tokens': i}})}\n\n"
              for i in (1, 2, 3)]   # continuous usage (enable-force-include-usage)
    final = "data: " + _json({"choices": [], "usage": {
        "prompt_tokens": 5, "total_tokens": 9, "completion_tokens": 4,
        "prompt_tokens_details": {"cached_tokens": 0}}}) + "\n\ndata: [DONE]\n\n"
    for cut in range(1, len(final)):   # wherever the network splits the last chunk
        assert scan([*chunks, final[:cut], final[cut:]]) == {"prompt": "5", "completion": "4"}, cut


def test_a_stream_without_usage_sets_nothing_and_responses_names_count_too():
    assert scan(['data: {"choices":[{"delta":{"content":"hi"}}],"usage":null}\n\n', "data: [DONE]\n\n"]) == {}
    responses = _json({"type": "response.completed", "response": {"usage": {
        "input_tokens": 11, "input_tokens_details": {"cached_tokens": 0}, "output_tokens": 3,
        "output_tokens_details": {"reasoning_tokens": 0}, "total_tokens": 14}}})
    assert scan([responses]) == {"prompt": "11", "completion": "3"}


def _log_line(key_id: str, tenant: str, status: int, prompt: str, completion: str) -> str:
    """One line of log_format gpuserve_usage, with nginx's variables filled in."""
    fmt = re.search(r"log_format gpuserve_usage ((?:'[^']*'\s*)+);", proxy_conf.common_conf())[1]
    line = "".join(re.findall(r"'([^']*)'", fmt))
    values = {"time_iso8601": "2026-12-06T10:00:00+00:00", "gpuserve_deployment": "chat",
              "gpuserve_key_id": key_id, "gpuserve_tenant": tenant, "status": str(status),
              "gpuserve_prompt_tokens": prompt, "gpuserve_completion_tokens": completion}
    return re.sub(r"\$(\w+)", lambda m: values[m[1]], line)


def _program_patterns() -> tuple[re.Pattern, re.Pattern]:
    outer, inner = re.findall(r"^\s*/(.*)/ \{$", meter.PROGRAM_TEXT, re.M)
    return re.compile(outer), re.compile(inner)


def test_the_mtail_program_reads_the_lines_the_log_format_writes():
    outer, inner = _program_patterns()
    m = outer.search(_log_line("c-solo-1", "solo", 200, "7", "12"))
    assert m.groupdict() == {"deployment": "chat", "key_id": "c-solo-1", "tenant": "solo", "status": "200"}
    assert inner.search(m.string).groupdict() == {"prompt": "7", "completion": "12"}
    unmetered = _log_line("c1", "-", 200, "-", "-")   # js_var's default: no usage in the answer
    assert outer.search(unmetered)["tenant"] == "-" and not inner.search(unmetered)
    assert f"counter {meter.TOKENS} by deployment, key_id, tenant, kind" in meter.PROGRAM_TEXT
    assert "$status == 200" in meter.PROGRAM_TEXT   # an error answer is neither metered nor unmetered


def test_the_tenant_comes_from_the_key_id_and_the_log_never_holds_the_key():
    common = proxy_conf.common_conf()
    tenant = re.search(r'"~(\^c-\(\?<gpuserve_tenant_name>.*\$)"', common)[1].replace("?<", "?P<")
    assert re.fullmatch(tenant, "c-batch2-14")["gpuserve_tenant_name"] == "batch2"
    assert not re.fullmatch(tenant, "c14") and not re.fullmatch(tenant, "o1")
    fmt = re.search(r"log_format gpuserve_usage [^;]*;", common)[0]
    assert "$http_authorization" not in fmt and "$request_uri" not in fmt and "$args" not in fmt
    site = proxy_conf.server_conf(deployment="chat", bind="0.0.0.0", port=8443, server_names=["h"],
                                  engine_host="127.0.0.1", engine_port=8000, drain_flag="/x",
                                  read_timeout_s=600, operator_networks=["127.0.0.1/32"],
                                  limits=proxy_conf.ProxyLimits())
    prompt = site[site.index("location @gpuserve_chat_prompt"):]
    prompt = prompt[:prompt.index("\n    }\n")]
    assert "js_body_filter gpuserve_meter.usage;" in prompt
    # gateway traffic reaches a serving host without a key: metered at the gateway, not twice
    assert f"access_log {proxy_conf.USAGE_LOG} gpuserve_usage if=$gpuserve_key_id;" in prompt
    assert "access_log /var/log/nginx/access.log gpuserve;" in prompt   # the location's own logs


def test_the_meter_is_scraped_on_hosts_with_a_proxy_or_a_gateway(tmp_path):
    from gpuserve.layers.monitoring import exporters_conf

    keys = tmp_path / "api-keys"
    keys.write_text("client-key-0123456789abcdef\n")
    keys.chmod(0o600)
    inv = Inventory(
        ([("gpu-1", {"ssh_hostname": "10.0.0.11"}), ("gw-1", {"ssh_hostname": "10.0.0.30"}), ("mon-1", {})], {}),
        hopper_x8=(["gpu-1"], {**HARDWARE["hopper_x8"], "proxy": True, "api_keys_file": str(keys)}),
        gateway=(["gw-1"], {}), monitor=(["mon-1"], {}),
        fleet=(["gpu-1", "gw-1", "mon-1"], {"model_revision": SHA, "api_keys_file": str(keys)}))
    settings = validate_inventory(inv)
    plan = monitoring.plan_targets(settings, {"gpu-1": "10.0.0.11", "gw-1": "10.0.0.30"})
    assert [(n.host, n.meter) for n in plan.nodes] == [("gpu-1", True), ("gw-1", True), ("mon-1", False)]
    jobs = [j for j in monitoring.scrape_configs(plan) if j["job_name"].startswith(monitoring.METER_JOB)]
    assert [(j["job_name"], j["metrics_path"], j["static_configs"][0]["targets"]) for j in jobs] == [
        (f"{monitoring.METER_JOB}/gpu-1", meter.METRICS_PATH, [f"10.0.0.11:{monitoring.NODE_EXPORTER_TLS_PORT}"]),
        (f"{monitoring.METER_JOB}/gw-1", meter.METRICS_PATH, [f"10.0.0.30:{monitoring.NODE_EXPORTER_TLS_PORT}"])]
    front = exporters_conf(["10.0.0.5/32"], False, "/etc/x.conf", None, True)
    assert (f"location = {meter.METRICS_PATH} {{\n        proxy_pass http://127.0.0.1:{meter.PORT}/metrics;"
            in front)
    assert meter.METRICS_PATH not in exporters_conf(["10.0.0.5/32"], False, "/etc/x.conf")


def test_the_meter_listens_on_loopback_and_decommission_removes_it():
    unit = meter.unit_text()
    assert f"--address 127.0.0.1 --port {meter.PORT}" in unit and "IPAddressAllow=localhost" in unit
    assert "User=mtail" in unit and "SupplementaryGroups=adm" in unit   # nginx's logs: www-data:adm 0640
    assert unit.startswith(removal.MANAGED)
    assert (f"/etc/systemd/system/{meter.UNIT}", meter.UNIT) in removal.MARKED
    assert meter.PROGRAM_DIR in removal.HOST_PATHS and proxy_conf.USAGE_LOG in removal.HOST_PATHS
