"""Every systemd unit, drop-in and nginx file gpuserve writes, rendered for a representative set of
plans and compared byte for byte with what was recorded in tests/unit/fixtures/rendered/ (issue 28).

The files were recorded from the code before the units and sites moved to the top-level
templates/ (Jinja2, one shared hardening include): the same bytes after the move prove that no
host sees a changed file, so a converge after an upgrade of gpuserve rewrites nothing (a changed
engine unit restarts the engine). A deliberate change re-records the file (below) and says so in
its commit.

    GPUSERVE_RECORD_RENDERED=1 pytest tests/unit/layers/test_rendered_files.py    # re-record every file
"""

from __future__ import annotations

import os
import tempfile
from functools import cache
from pathlib import Path

import pytest

from gpuserve import engine_guard, gateway, meter, proxy_conf, receivers, stack, tenants
from gpuserve.config import validate_inventory
from gpuserve.host_plan import plan_host
from gpuserve.layers import monitoring, proxy, units, watchdog
from gpuserve.layers import fanout as fanout_layer
from gpuserve.operations import secrets as secrets_ops

from tests.unit.helpers import FIXTURES, SHA, make_inventory
from tests.unit.test_gateway import fleet as gateway_fleet
from tests.unit.test_sglang_behind_proxy import _fleet as sglang_fleet

RENDERED = FIXTURES / "rendered"
RECORD = os.environ.get("GPUSERVE_RECORD_RENDERED") == "1"

TWO = {"deployments": {"a": {"serve_flags": {"tensor-parallel-size": 4}},
                       "b": {"serve_port": 8001, "proxy_port": 8444,
                             "serve_flags": {"tensor-parallel-size": 4}}}}

# engine units: every vendor, both engines, proxy on and off, a trusted network beyond loopback,
# two deployments on one host
ENGINE_PLANS = {
    "cpu-vllm": dict(group="cpu"),
    "cpu-vllm-trusted": dict(group="cpu", fleet={"model_revision": SHA, "serve_host": "0.0.0.0",
                                                 "trusted_network": True}),
    "hopper-vllm": dict(group="hopper_x8"),
    "hopper-two": dict(group="hopper_x8", group_data=TWO),
    "blackwell-vllm": dict(group="blackwell_x4"),
    "mi355x-vllm": dict(group="mi355x_x4"),
}


def _engine_units() -> dict[str, str]:
    out = {}
    for case, kw in ENGINE_PLANS.items():
        plan = plan_host(validate_inventory(make_inventory(**kw))["h1"])
        for dep in plan.settings.deployments:
            out[f"engine/{case}/gpuserve-{dep.name}.service"] = units.engine_unit(plan, dep)
    # behind the proxy (keys at nginx), vLLM and SGLang, serving and gateway hosts
    inv = gateway_fleet()
    for host, s in validate_inventory(inv).items():
        if s.serves:
            plan = plan_host(s)
            for dep in s.deployments:
                out[f"engine/proxy-vllm-{host}/gpuserve-{dep.name}.service"] = units.engine_unit(plan, dep)
    s = validate_inventory(sglang_fleet(Path(tempfile.mkdtemp(prefix="gpuserve-rendered-"))))["h1"]
    assert s.proxy and s.serve_configs[s.deployments[0].name].engine == "sglang"
    plan = plan_host(s)
    for dep in s.deployments:
        out[f"engine/proxy-sglang-h1/gpuserve-{dep.name}.service"] = units.engine_unit(plan, dep)
    return out


def _other_units() -> dict[str, str]:
    g = validate_inventory(gateway_fleet())["gw1"].gateway
    sticky = validate_inventory(gateway_fleet({"gateway_sticky_header": "x-session-id"}))["gw1"].gateway
    assert sticky.sticky_header
    monitor = engine_guard.monitor_guard((9090, 9093))
    gw_guard = engine_guard.gateway_guard((g.smg_port, g.metrics_port))
    return {
        "fanout/gpuserve-weights-fetch.service": fanout_layer.fanout_unit(
            "MiniMaxAI/MiniMax-M3.1-Flash@0123abcd", "/mnt/nvme/gpuserve/models/minimax"),
        "guard/gpuserve-engine-guard.service": engine_guard.unit_text(),
        # the monitor's and the gateway's guards, as layers/engine_guard.py's service_guard writes them
        "guard/gpuserve-monitor-guard.service": engine_guard.unit_text(
            engine_guard.MONITOR_RULES_PATH, engine_guard.MONITOR_TABLE,
            f"monitor guard: only {', '.join(monitor.users)} open {', '.join(map(str, monitor.ports))}"),
        "guard/gpuserve-gateway-guard.service": engine_guard.unit_text(
            engine_guard.GATEWAY_RULES_PATH, engine_guard.GATEWAY_TABLE,
            f"gateway guard: only {', '.join(gw_guard.users)} open {', '.join(map(str, gw_guard.ports))}"),
        "guard/prometheus.service.d/gpuserve-guard.conf": engine_guard.requires_dropin(engine_guard.MONITOR_UNIT),
        "watchdog/gpuserve-watchdog@.service": watchdog.unit_text(),
        "meter/gpuserve-meter.service": meter.unit_text(),
        "monitor/gpuserve-alert-relay.service": receivers.relay_unit_text(),   # issue 29
        "gateway/gpuserve-gateway.service": gateway.unit(g, gateway.venv_dir(g.smg_version, "3.11")),
        "gateway/gpuserve-gateway-sticky.service": gateway.unit(sticky, gateway.venv_dir(g.smg_version, "3.12")),
        "nginx/nginx.service.d/gpuserve.conf": proxy_conf.NGINX_DROPIN,
        "nginx/nginx.service.d/gpuserve-credentials.conf": secrets_ops.credentials_dropin(
            proxy.NGINX_DIR, proxy.NGINX_TEST),
        "stack/nvidia-dcgm-exporter.service.d/gpuserve-listen.conf": stack.DCGM_EXPORTER_DROPIN_TEXT,
        # a monitor's scrape keys and alertmanager.yml: credentials decrypted before they start (issue 29)
        **{f"monitor/{unit}.service.d/gpuserve-credentials.conf": secrets_ops.credentials_dropin(directory)
           for unit, directory, _ in monitoring.monitor_dropins()},
    }


def _sites() -> dict[str, str]:
    limits = proxy_conf.ProxyLimits()
    base = dict(deployment="minimax", bind="0.0.0.0", port=8443, server_names=["sandbox-1", "10.0.0.2"],
                engine_host="127.0.0.1", engine_port=8000, drain_flag="/etc/gpuserve/minimax/drain",
                read_timeout_s=600, operator_networks=["127.0.0.1/32"], limits=limits)
    teams = (tenants.Tenant("batch", "f", 1, 0, 2), tenants.Tenant("chat-ui", "g", 50, 20, 8))
    return {
        "sites/gpuserve-minimax.conf": proxy_conf.server_conf(**base),
        "sites/gpuserve-minimax-ipv6.conf": proxy_conf.server_conf(**{**base, "bind": "::1",
                                                                       "engine_host": "::1"}),
        "sites/gpuserve-minimax-gateways.conf": proxy_conf.server_conf(
            **{**base, "gateways": ["10.0.0.9", "10.1.0.0/24"],
               "limits": proxy_conf.ProxyLimits(rate_per_key=7, burst_per_key=3, conn_per_key=5)}),
        "sites/gpuserve-minimax-tenants.conf": proxy_conf.server_conf(
            **base, **tenants.site_args("minimax", teams)),
        "sites/gpuserve-gateway.conf": proxy_conf.server_conf(
            **{**base, "deployment": "gateway", "engine_port": 30000, "read_timeout_s": 3600,
               "drain_flag": "/etc/nginx/gpuserve/gateway.drain", "admin_routes": False}),
        "sites/gpuserve-0-common.conf": proxy_conf.common_conf(),
        "sites/gpuserve-tls.conf": proxy_conf.tls_conf("/etc/nginx/gpuserve/tls.crt",
                                                       "/etc/nginx/gpuserve/tls.key"),
        "sites/gpuserve-exporters.conf": monitoring.exporters_conf(
            ["10.0.0.7/32", "127.0.0.1/32"], False, "/etc/gpuserve/exporters/tls.conf"),
        "sites/gpuserve-exporters-dcgm-smg.conf": monitoring.exporters_conf(
            ["10.0.0.7/32"], True, "/etc/gpuserve/exporters/tls.conf", "10.0.0.9:29000"),
    }


@cache
def rendered() -> dict[str, str]:
    return {**_engine_units(), **_other_units(), **_sites()}


def _recorded() -> set[str]:
    return {p.relative_to(RENDERED).as_posix() for p in RENDERED.rglob("*") if p.is_file()}


if RECORD:
    for _name, _text in rendered().items():
        (RENDERED / _name).parent.mkdir(parents=True, exist_ok=True)
        (RENDERED / _name).write_text(_text)


def test_every_rendered_file_is_recorded_and_nothing_else():
    assert set(rendered()) == _recorded()


@pytest.mark.parametrize("name", sorted(_recorded()))
def test_each_file_renders_byte_for_byte_as_recorded(name):
    assert rendered()[name] == (RENDERED / name).read_text(), name


def test_the_cases_cover_every_variant():
    """What the recorded set must hold, so that a variant cannot drop out unnoticed."""
    texts = rendered()
    engine = {n: t for n, t in texts.items() if n.startswith("engine/")}
    assert any("LLM inference (sglang)" in t for t in engine.values())
    assert any("LLM inference (vllm)" in t for t in engine.values())
    assert any("DeviceAllow=/dev/kfd rw" in t for t in engine.values())            # AMD
    assert any("nvidia-fabricmanager.service" in t for t in engine.values())        # NVSwitch
    assert any("IPAddressDeny=any" in t for t in engine.values())                   # loopback CPU
    assert any("IPAddressDeny" not in t and "DevicePolicy=closed\nNoNewPrivileges" in t
               for t in engine.values())                                            # CPU, trusted network
    assert any("SupplementaryGroups=render video" in t for t in engine.values())
    assert sum(n.startswith("engine/hopper-two/") for n in engine) == 2


def test_the_hardening_block_is_written_once_and_every_unit_includes_it():
    """Issue 28: the confinement lines were copied into four modules (engine_guard, layers/watchdog,
    gateway, proxy_conf) and two templates. Now templates/_hardening.j2 holds them and every unit
    and confining drop-in includes it; no module of the package and no other template spells
    them again."""
    from gpuserve import templating

    shared = ("ProtectKernelTunables=", "ProtectKernelLogs=", "ProtectControlGroups=", "RestrictNamespaces=",
              "RestrictSUIDSGID=", "SystemCallFilter=", "SystemCallArchitectures=", "RestrictAddressFamilies=")
    package = Path(templating.__file__).resolve().parent
    spelled = {p.name for p in [*package.rglob("*.py"), *templating.TEMPLATES.glob("*.j2")]
               if any(line in p.read_text() for line in shared)}
    assert spelled == {"_hardening.j2"}
    units = sorted(p.name for p in templating.TEMPLATES.glob("*.service.j2"))
    # gpuserve-meter.service.j2: the token meter, gpuserve-alert-relay.service.j2: the alert relay (issue 29)
    assert len(units) == 7, units
    for name in [*units, "dropin-nginx.conf.j2"]:
        assert '{% import "_hardening.j2" as hardening -%}' in (templating.TEMPLATES / name).read_text(), name
    # and what they render holds it: every unit of the recorded set is confined
    for name, text in rendered().items():
        if name.endswith(".service"):
            assert "ProtectKernelTunables=yes\nProtectKernelModules=yes\n" in text, name
