"""Per-key limits by tenant on a real sandbox host (issue 29).

One cpu host behind the proxy. The sandbox's client key keeps the host's limits
(`proxy_conn_per_key` 32); a tenant `solo` has one key, given by a command, with
`conn_per_key = 1`. While a chat of the tenant's key is in flight at the proxy (held while nginx
reads its body: `gpuserve_sandbox.fleet.held_prompt`), a second request with that key gets 429
and the sandbox key is served (200). No timing: the held request is what makes the second one
the tenant's second connection. The access log names the tenant's id (c-solo-1), never the key.

Token metering (gpuserve/meter.py): with both keys, non-streamed and streamed chats and a
completion; the token counters mtail exports on the host equal the sums of the `usage` the engine
returned to the client, per key id and tenant, and a stream that asked for no usage is counted as
unmetered. The counters are read before and after (the first test's requests count too); mtail
reads the log by polling, so the reading is retried, a bounded number of times.

Slow (a fresh cpu host's engine install and start): about 5 minutes on 2 cores.
"""

from __future__ import annotations

import json
import re
import secrets
import ssl
import time
from collections import Counter

import pytest

from gpuserve import meter, proxy_conf
from gpuserve_sandbox import fleet as fleet_view

pytestmark = pytest.mark.slow

INV, SERVE = "inventories/sandbox.py", "deploys/serve.py"


@pytest.fixture(scope="module")
def fleet(make_hosts, sandbox, sandbox_hub, sandbox_wheelhouse, tmp_path_factory):
    from gpuserve_sandbox.runner import run_pyinfra

    (host,) = make_hosts(["cpu"])
    files = tmp_path_factory.mktemp("tenant")
    solo = f"tenant-solo-{secrets.token_hex(16)}"
    (files / "solo").write_text(solo + "\n")
    (files / "solo").chmod(0o600)
    tenants = {"solo": {"keys_command": ["cat", str(files / "solo")], "conn_per_key": 1}}
    run = run_pyinfra(INV, SERVE, "--data", f"tenants={json.dumps(tenants)}",
                      instance=sandbox.instance).check()
    assert solo not in run.output
    return {"host": host, "solo": solo, "key": fleet_view.client_key(sandbox),
            "certs": tmp_path_factory.mktemp("certs"), "tenants": tenants}


def test_one_key_gets_429_while_the_other_is_served(fleet, sandbox):
    host, certs = fleet["host"], fleet["certs"]
    ctx = ssl.create_default_context(cafile=str(fleet_view.host_ca(sandbox, host, certs)))
    ctx.check_hostname = False
    held = fleet_view.held_prompt(host.ip, ctx, fleet["solo"])
    try:
        status, body = fleet_view.chat(sandbox, host, certs, fleet["solo"], "tiny-chat")
        assert status == 429, body
        status, body = fleet_view.chat(sandbox, host, certs, fleet["key"], "tiny-chat")
        assert status == 200, body
    finally:
        held.close()
    log = sandbox.ssh(host, "tail -n 20 /var/log/nginx/access.log").stdout
    assert " 429 " in log and "key=c-solo-1" in log and "key=c1" in log
    assert fleet["solo"] not in log and fleet["key"] not in log


_SAMPLE = re.compile(r'^(gpuserve_\w+)\{([^}]*)\} (\d+)$', re.M)


def _meter(sandbox, host) -> tuple[Counter, str]:
    """The token meter's counters on the host, by (metric, key_id, tenant, kind)."""
    text = sandbox.ssh(host, f"curl -fsS -m 10 http://127.0.0.1:{meter.PORT}/metrics").stdout
    out: Counter = Counter()
    for name, labels, value in _SAMPLE.findall(text):
        lab = dict(re.findall(r'(\w+)="([^"]*)"', labels))
        out[(name, lab["key_id"], lab["tenant"], lab.get("kind", ""))] += int(value)
    return out, text


def _usage(status: int, body: str, stream: bool) -> dict | None:
    """The usage the engine returned: the JSON answer's, or the stream's last chunk with one."""
    assert status == 200, body
    if not stream:
        return json.loads(body)["usage"]
    chunks = [json.loads(line[6:]) for line in body.splitlines()
              if line.startswith("data: {")]
    found = [c["usage"] for c in chunks if c.get("usage")]
    return found[-1] if found else None


def test_token_counters_match_the_usage_the_engine_returned(fleet, sandbox):
    host, certs = fleet["host"], fleet["certs"]
    keys = {"c-solo-1": (fleet["solo"], "solo"), "c1": (fleet["key"], "-")}
    before, _ = _meter(sandbox, host)
    want: Counter = Counter()
    chat = {"model": "tiny-chat", "max_tokens": 12, "messages": [{"role": "user", "content": "Count to ten."}]}
    for key_id, (key, tenant) in keys.items():
        for path, body, stream in (
                ("/v1/chat/completions", chat, False),
                ("/v1/chat/completions", {**chat, "max_tokens": 20, "stream": True,
                                          "stream_options": {"include_usage": True}}, True),
                ("/v1/completions", {"model": "tiny-chat", "max_tokens": 7, "prompt": "One, two,"}, False)):
            usage = _usage(*fleet_view.proxy_request(sandbox, host, certs, path, key, body), stream)
            assert usage and usage["completion_tokens"] > 0, usage
            want[(meter.TOKENS, key_id, tenant, "prompt")] += usage["prompt_tokens"]
            want[(meter.TOKENS, key_id, tenant, "completion")] += usage["completion_tokens"]
            want[(meter.METERED, key_id, tenant, "")] += 1
    # a stream that asked for no usage: the engine (no enable-force-include-usage) sends none
    status, body = fleet_view.proxy_request(sandbox, host, certs, "/v1/chat/completions", fleet["key"],
                                            {**chat, "stream": True})
    assert _usage(status, body, True) is None
    want[(meter.UNMETERED, "c1", "-", "")] += 1
    for _ in range(60):   # mtail polls the log (250 ms); bounded, no timing asserted
        after, text = _meter(sandbox, host)
        got = Counter({k: after[k] - before[k] for k in want})
        if got == want:
            break
        time.sleep(1)
    if got != want:
        why = sandbox.ssh(host, f"ls -l {proxy_conf.USAGE_LOG}; tail -n 20 {proxy_conf.USAGE_LOG}; "
                                f"journalctl -u {meter.UNIT} -n 30 --no-pager", check=False).stdout
        raise AssertionError(f"{got} != {want}\n{why}\n{text[-3000:]}")
    assert fleet["solo"] not in text and fleet["key"] not in text
    log = sandbox.ssh(host, f"tail -n 50 {proxy_conf.USAGE_LOG}").stdout
    assert "key=c-solo-1 tenant=solo status=200 prompt=" in log and "key=c1 tenant=- " in log
    assert fleet["solo"] not in log and fleet["key"] not in log
    # mtail on loopback only; a second converge changes nothing (the meter included)
    assert sandbox.ssh(host, f"systemctl is-active {meter.UNIT}").stdout.strip() == "active"
    assert sandbox.ssh(host, f"ss -Hltn 'sport = :{meter.PORT}'").stdout.split()[3] == f"127.0.0.1:{meter.PORT}"
    from gpuserve_sandbox.runner import run_pyinfra
    again = run_pyinfra(INV, SERVE, "--data", f"tenants={json.dumps(fleet['tenants'])}",
                        instance=sandbox.instance).check()
    assert again.changed == 0, again.output[-3000:]
