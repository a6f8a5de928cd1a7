"""The fleet gateway: which hosts serve, its settings at plan time, the worker file, smg's unit."""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path

import pytest
from pyinfra.api import Inventory

from gpuserve import gateway, proxy_conf
from gpuserve.config import ConfigError, serving_workers, validate_inventory

from .helpers import HARDWARE, SHA


KEYS = Path(tempfile.mkdtemp(prefix="gpuserve-gw-test-")) / "keys"
KEYS.write_text("k" * 32 + "\n")
os.chmod(KEYS, 0o600)


def fleet(gw_data: dict | None = None, serving: tuple[str, ...] = ("h1", "h2"),
          gateways: tuple[str, ...] = ("gw1",), fleet_data: dict | None = None,
          host_data: dict | None = None) -> Inventory:
    """Serving hosts (cpu group, behind their proxy) and gateway hosts (group gateway only)."""
    addresses = {name: f"10.0.0.{i}" for i, name in enumerate(serving + gateways, 1)}
    data = {name: {"ssh_hostname": addresses[name], **(host_data or {}).get(name, {})}
            for name in serving + gateways}
    return Inventory(
        ([(name, data[name]) for name in serving + gateways], {}),
        cpu=(list(serving), dict(HARDWARE["cpu"])),
        gateway=(list(gateways), dict(gw_data or {})),
        fleet=(list(serving + gateways), {"model_revision": SHA, "proxy": True,
                                          "api_keys_file": str(KEYS), **(fleet_data or {})}),
    )


def problems(inv: Inventory) -> list[str]:
    with pytest.raises(ConfigError) as caught:
        validate_inventory(inv)
    return [str(p) for p in caught.value.problems]


def test_a_gateway_host_serves_nothing_and_gets_the_defaults():
    settings = validate_inventory(fleet())
    gw = settings["gw1"]
    assert gw.serves is False and gw.deployments == ()
    assert settings["h1"].serves is True and settings["h1"].gateway is None
    g = gw.gateway
    assert (g.policy, g.balance_abs_threshold, g.balance_rel_threshold) == ("cache_aware", 4, 1.2)
    assert g.addresses == ("10.0.0.3",)      # its ssh_hostname
    assert g.metrics_host == "127.0.0.1"


def test_a_host_of_the_gateway_group_with_hardware_serves_and_routes():
    inv = Inventory(([("both", {"ssh_hostname": "10.0.0.9"})], {}),
                    cpu=(["both"], dict(HARDWARE["cpu"])), gateway=(["both"], {}),
                    fleet=(["both"], {"model_revision": SHA, "proxy": True, "api_keys_file": str(KEYS)}))
    s = validate_inventory(inv)["both"]
    assert s.serves and s.gateway is not None and s.deployments


@pytest.mark.parametrize("key, value, expect", [
    ("gateway_policy", "least_load", "'least_load' is not allowed; use one of cache_aware, prefix_hash"),
    ("gateway_port", 80, "80 is not allowed; use an integer 1024..65535"),
    ("gateway_smg_port", 9443, "port 9443 is also gateway_port"),
    ("gateway_balance_rel_threshold", 0.9, "0.9 is not allowed; use a number from 1.0"),
    ("gateway_balance_abs_threshold", -1, "-1 is not allowed"),
    ("gateway_metrics_host", "0.0.0.0", "0.0.0.0 is every interface"),
    ("gateway_sticky_header", "x session", "'x session' is not a header name"),
    ("gateway_health_interval_s", 0, "0 is not allowed"),
    ("gateway_health_failures", 0, "0 is not allowed"),
    ("gateway_health_failures", 11, "11 is not allowed"),
    ("smg_version", 1.13, "1.13 is not a version"),
])
def test_bad_gateway_settings_name_the_host_the_group_and_the_key(key, value, expect):
    found = problems(fleet({key: value}))
    assert len(found) == 1, found
    assert found[0].startswith(f"gw1: {key} (from group 'gateway'): ")
    assert expect in found[0]


def test_a_gateway_without_workers_is_refused():
    found = problems(fleet(serving=()))
    assert any("gateway without workers" in p for p in found), found


def test_a_worker_named_twice_is_refused():
    inv = fleet(host_data={"h2": {"ssh_hostname": "10.0.0.1"}})   # h2 is h1's machine again
    found = problems(inv)
    assert len(found) == 1 and "worker https://10.0.0.1:8443 is named twice: h1/minimax and " \
        "h2/minimax" in found[0], found


def test_serving_hosts_behind_a_gateway_need_their_proxy():
    found = problems(fleet(fleet_data={"proxy": False}))
    assert sorted(p.split(":")[0] for p in found) == ["h1", "h2"]
    assert "set proxy = True" in found[0]


def test_a_gateway_whose_address_is_a_name_needs_gateway_addresses():
    inv = fleet(host_data={"gw1": {"ssh_hostname": "gw1.example.internal"}})
    found = problems(inv)
    assert len(found) == 1 and found[0].startswith("gw1: gateway_addresses") and "not an IP" in found[0]
    inv = fleet({"gateway_addresses": ["10.9.0.0/24"]},
                host_data={"gw1": {"ssh_hostname": "gw1.example.internal"}})
    assert validate_inventory(inv)["gw1"].gateway.addresses == ("10.9.0.0/24",)


def test_the_worker_file_follows_the_inventory():
    inv = fleet(serving=("h1", "h2", "h3"))
    ws = serving_workers(inv, validate_inventory(inv))
    body = json.loads(gateway.manifest(ws))
    # the format smg 1.13.0 reads (service_discovery/file.rs: version, workers[id, url, model_id])
    assert body == {"version": 1, "workers": [
        {"id": f"h{i}/minimax", "url": f"https://10.0.0.{i}:8443", "model_id": "minimax-m3.1-flash"}
        for i in (1, 2, 3)]}
    # a host taken out is left out; the same fleet gives the same bytes
    out = json.loads(gateway.manifest(ws, without=["h2/minimax"]))
    assert [w["id"] for w in out["workers"]] == ["h1/minimax", "h3/minimax"]
    assert gateway.manifest(ws) == gateway.manifest(list(ws))
    assert gateway.manifest_ids(gateway.manifest(ws, without=["h1/minimax"])) == ["h2/minimax", "h3/minimax"]


def test_smg_gets_no_secret_and_listens_on_loopback_only():
    g = validate_inventory(fleet({"gateway_sticky_header": "x-session-id"}))["gw1"].gateway
    argv = gateway.smg_argv(g, "/opt/gpuserve/gateway/smg-1.13.0-py3.12")
    assert argv[argv.index("--host") + 1] == "127.0.0.1"
    assert argv[argv.index("--prometheus-host") + 1] == "127.0.0.1"
    assert not any("key" in a and a != "--routing-key-headers" and a != "--routing-key-override"
                   for a in argv)
    assert argv[argv.index("--routing-key-headers") + 1] == "x-session-id"
    assert argv[argv.index("--balance-abs-threshold") + 1] == "4"
    # a dead worker leaves after one failed check (smg's default: three)
    assert argv[argv.index("--health-check-interval-secs") + 1] == "5"
    assert argv[argv.index("--health-failure-threshold") + 1] == "1"
    unit = gateway.unit(g, "/opt/gpuserve/gateway/smg-1.13.0-py3.12")
    assert "DynamicUser=yes" in unit and "ProtectSystem=strict" in unit


def test_smg_worker_states_drained_and_healthy():
    # smg 1.13.0's GET /workers, trimmed to what gpuserve reads
    body = json.dumps({"workers": [
        {"labels": {"smg.ai/discovery-id": "h1/minimax"}, "status": "ready", "is_healthy": True, "load": 3},
        {"labels": {"smg.ai/discovery-id": "h2/minimax"}, "status": "draining", "is_healthy": True, "load": 1},
        {"labels": {"smg.ai/discovery-id": "h3/minimax"}, "status": "draining", "is_healthy": True, "load": 0},
        {"labels": {}, "status": "ready", "is_healthy": True, "load": 0}]})
    states = gateway.worker_states(body)
    assert set(states) == {"h1/minimax", "h2/minimax", "h3/minimax"}
    assert not gateway.drained(states, "h1/minimax") and not gateway.drained(states, "h2/minimax")
    assert gateway.drained(states, "h3/minimax") and gateway.drained(states, "h4/minimax")
    assert gateway.serving_healthy(states, "h1/minimax")
    assert not gateway.serving_healthy(states, "h3/minimax") and not gateway.serving_healthy(states, "h4/minimax")


def test_hosts_behind_a_gateway_let_only_the_gateways_reach_the_client_routes():
    conf = proxy_conf.server_conf(
        deployment="minimax", bind="0.0.0.0", port=8443, server_names=["h1"], engine_host="127.0.0.1",
        engine_port=8000, drain_flag="/x", read_timeout_s=600, operator_networks=["127.0.0.1/32"],
        limits=proxy_conf.ProxyLimits(), gateways=["10.0.0.3", "10.9.0.0/24"])
    assert "    10.0.0.3 1;\n    10.9.0.0/24 1;\n" in conf
    chat = conf.split("location = /v1/chat/completions {")[1].split("}\n\n")[0]
    assert "return 403" in chat and "only through the gateway" in chat
    # without gateways: as before, a client key opens the client routes
    plain = proxy_conf.server_conf(
        deployment="minimax", bind="0.0.0.0", port=8443, server_names=["h1"], engine_host="127.0.0.1",
        engine_port=8000, drain_flag="/x", read_timeout_s=600, operator_networks=["127.0.0.1/32"],
        limits=proxy_conf.ProxyLimits())
    assert "gateway" not in plain


def test_the_plan_shows_what_a_gateway_host_runs():
    from gpuserve.plan import render_plan

    settings = validate_inventory(fleet())
    text = render_plan(settings, "text")
    assert "gw1: gateway, serves no model" in text and "policy cache_aware (balance 4 / 1.2)" in text
    assert "h1\n" in text   # the serving hosts as before
    doc = json.loads(render_plan(settings, "json"))
    assert {"host": "gw1", "serves": False}.items() <= doc[-1].items()
    assert "gw1" not in render_plan(settings, "argv")


def test_the_converge_waits_for_smg_and_fails_when_it_does_not_answer():
    """gpuserve.layers.gateway.smg_ready_command, run here against loopback: a started smg that
    exits at once (a file it cannot read) only shows later, so the converge waits for its API."""
    import http.server
    import socket
    import subprocess
    import threading

    from gpuserve.layers.gateway import smg_ready_command

    class Live(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            self.send_response(200 if self.path == "/liveness" else 404)
            self.end_headers()

        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Live)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        up = subprocess.run(["bash", "-c", smg_ready_command(server.server_address[1], seconds=5)],
                            capture_output=True, text=True, timeout=30)
    finally:
        server.shutdown()
    assert up.returncode == 0, up.stderr
    with socket.socket() as s:   # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    down = subprocess.run(["bash", "-c", smg_ready_command(port, seconds=2)], capture_output=True,
                          text=True, timeout=30)
    assert down.returncode == 1
    assert f"smg did not answer on 127.0.0.1:{port} within 2 s; its journal:" in down.stderr
