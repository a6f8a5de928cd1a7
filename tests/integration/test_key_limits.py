"""Per-key limits by tenant on a real sandbox host (issue 29).

One cpu host behind the proxy. The sandbox's client key keeps the host's limits
(`proxy_conn_per_key` 32); a tenant `solo` has one key, given by a command, with
`conn_per_key = 1`. While a chat of the tenant's key is in flight at the proxy (held while nginx
reads its body: `gpuserve_sandbox.fleet.held_prompt`), a second request with that key gets 429
and the sandbox key is served (200). No timing: the held request is what makes the second one
the tenant's second connection. The access log
names the tenant's id (c-solo-1), never the key.

Slow (a fresh cpu host's engine install and start): about 5 minutes on 2 cores.
"""

from __future__ import annotations

import json
import secrets
import ssl

import pytest

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
            "certs": tmp_path_factory.mktemp("certs")}


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
