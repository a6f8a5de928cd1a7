"""The engine guard's ruleset (gpuserve/engine_guard.py) from a host's plan (issue 12, finding 6).

The rules' effect is proven on a sandbox host (tests/integration/test_hardening.py): a local user
other than root, gpuserve and nginx's gets a reset from the engine port. Here: what is rendered.
"""

import re

from gpuserve import engine_guard
from gpuserve.layers.engine_guard import guard_of

from .helpers import make_inventory, settings_of

SHA = "a" * 40


def _rules(**kw) -> str:
    args = dict(ports=[8001, 8000, 8000], service_user="gpuserve", proxy=True, trusted_network=False)
    args.update(kw)
    return engine_guard.ruleset(engine_guard.plan(**args))


def _chain(rules: str, name: str) -> list[str]:
    body = rules.split(f"\tchain {name} {{\n", 1)[1].split("\t}", 1)[0]
    return [line.strip() for line in body.splitlines() if line.strip()]


def test_behind_the_proxy_only_root_gpuserve_and_nginx_open_the_engine_ports():
    rules = _rules()
    assert "elements = { 8000, 8001 }" in rules                   # each port once, in order
    assert 'elements = { "root", "gpuserve", "www-data" }' in rules
    assert _chain(rules, "output") == [
        "type filter hook output priority filter; policy accept;",
        'oifname "lo" tcp dport @engine_ports tcp flags & (syn | ack) == syn '
        "meta skuid != @engine_users reject with tcp reset"]
    # nobody on the network: the proxy is the way in
    assert _chain(rules, "input") == [
        "type filter hook input priority filter; policy accept;",
        'iifname != "lo" tcp dport @engine_ports reject with tcp reset']


def test_the_table_is_replaced_whole_and_nothing_else_is_touched():
    rules = _rules()
    lines = rules.splitlines()
    # create-if-absent, delete, define: one transaction under `nft -f`, no flush of the ruleset
    i = lines.index("table inet gpuserve")
    assert lines[i + 1:i + 3] == ["delete table inet gpuserve", "table inet gpuserve {"]
    assert "flush ruleset" not in rules
    tables = [line.split("table ", 1)[1] for line in lines if line.startswith(("table ", "delete table "))]
    assert tables == ["inet gpuserve", "inet gpuserve", "inet gpuserve {"]


def test_without_the_proxy_nginx_is_not_let_in():
    rules = _rules(proxy=False)
    assert 'elements = { "root", "gpuserve" }' in rules and "www-data" not in rules


def test_a_trusted_network_leaves_the_network_in_and_guards_loopback_only():
    rules = _rules(proxy=False, trusted_network=True)
    assert "chain input" not in rules
    out = _chain(rules, "output")[1:]
    assert [r.split(" tcp dport")[0] for r in out] == ['oifname "lo" ip daddr 127.0.0.0/8',
                                                      'oifname "lo" ip6 daddr ::1']
    assert all(r.endswith("meta skuid != @engine_users reject with tcp reset") for r in out)


def test_no_deployment_no_port_still_a_valid_table():
    rules = _rules(ports=[])
    assert "elements = {  }" not in rules and "type inet_service" in rules


def test_the_guard_follows_the_host_plan():
    inv = make_inventory(group="cpu", fleet={"model_revision": SHA})
    s = settings_of(inv)
    guard = guard_of(s)
    assert guard.ports == tuple(d.serve_port for d in s.deployments)
    assert ("www-data" in guard.users) == s.proxy and guard.users[:2] == ("root", "gpuserve")
    assert guard.network == (not s.trusted_network)


def _unit_with(**kw) -> str:
    from gpuserve import templating
    return templating.render(
        "gpuserve.service.j2", deployment="m", engine="vllm", deployment_dir="/d", current="/d/current", secrets_env="/d/s",
        user_name="gpuserve", group_name="gpuserve", home="/h", cache="/c", start_timeout_s=60,
        stop_timeout_s=60, devices=[], supplementary_groups=[], after=[], loopback_only=True,
        guard=engine_guard.UNIT, credentials_bin="/opt/gpuserve/bin/gpuserve-credentials", **{"listeners": None, **kw})


def test_engines_require_the_guard_unit():
    unit = _unit_with()
    assert f"Requires={engine_guard.UNIT}\n" in unit and f"After={engine_guard.UNIT}\n" in unit
    text = engine_guard.unit_text()
    assert f"ExecStart=/usr/sbin/nft -f {engine_guard.RULES_PATH}\n" in text
    assert f"ExecReload=/usr/sbin/nft -f {engine_guard.RULES_PATH}\n" in text
    assert "RemainAfterExit=yes" in text
    # stopping it (decommission) drops its table; the engines that require it stop with it, so
    # no engine port is open without the table
    assert "ExecStop=-/usr/sbin/nft delete table inet gpuserve" in text


def test_the_plan_warning_names_every_unkeyed_route_and_the_guard():
    inv = make_inventory(group="cpu", fleet={"model_revision": SHA, "serve_host": "0.0.0.0",
                                                    "trusted_network": True})
    (warning,) = [w for w in settings_of(inv).warnings if "every interface" in w]
    for route in ("/invocations", "/tokenize", "/metrics", "/scale_elastic_ep"):
        assert route in warning
    assert "covers only /v1" in warning and "engine guard" in warning and "trusted_network" in warning


def test_the_monitor_guard_lets_only_root_and_prometheus_open_prometheus_and_alertmanager():
    """Issue 26 (6): as nobody, POST /api/v2/silences on 127.0.0.1:9093 returned 200."""
    from gpuserve import monitoring

    guard = engine_guard.monitor_guard((monitoring.PROMETHEUS_PORT, monitoring.ALERTMANAGER_PORT))
    rules = engine_guard.ruleset(guard, engine_guard.MONITOR_TABLE)
    assert "table inet gpuserve_monitor {" in rules and "delete table inet gpuserve_monitor" in rules
    assert "inet gpuserve\n" not in rules and "table inet gpuserve {" not in rules   # the engine's stays
    assert "elements = { 9090, 9093 }" in rules and 'elements = { "root", "prometheus" }' in rules
    assert 'oifname "lo" tcp dport @engine_ports' in rules and "reject with tcp reset" in rules
    unit = engine_guard.unit_text(engine_guard.MONITOR_RULES_PATH, engine_guard.MONITOR_TABLE, "monitor")
    assert f"ExecStart=/usr/sbin/nft -f {engine_guard.MONITOR_RULES_PATH}\n" in unit
    assert "ExecStop=-/usr/sbin/nft delete table inet gpuserve_monitor\n" in unit
    assert engine_guard.requires_dropin(engine_guard.MONITOR_UNIT) == (
        "# Managed by gpuserve (pyinfra): no start without the guard (gpuserve/engine_guard.py)\n"
        "[Unit]\nRequires=gpuserve-monitor-guard.service\nAfter=gpuserve-monitor-guard.service\n")


def test_every_listener_of_the_engine_is_guarded_not_only_its_serve_port():
    """Issue 26 (7): EngineCore's gloo listeners on 127.0.1.1 were open to local users."""
    rules = engine_guard.listeners_ruleset("mini-max", "gpuserve-mini-max.service", 8000,
                                           ("root", "gpuserve"))
    assert "table inet gpuserve_listeners_mini_max {" in rules
    assert "delete table inet gpuserve_listeners_mini_max" in rules
    assert 'elements = { "root", "gpuserve" }' in rules
    assert ('oifname "lo" tcp dport != 8000 tcp flags & (syn | ack) == syn meta skuid != @users '
            "meta mark set meta mark | 0x00260000") in rules
    levels = re.findall(r'socket cgroupv2 level (\d) "system.slice/gpuserve-mini-max.service" '
                        r"reject with tcp reset", rules)
    assert levels == [str(n) for n in range(2, 9)]
    unit = _unit_with(listeners="/etc/gpuserve/mini-max/listeners.nft")
    assert "ExecStartPre=+/usr/sbin/nft -f /etc/gpuserve/mini-max/listeners.nft\n" in unit
    assert unit.index("ExecStartPre=+") < unit.index("ExecStart=")


def test_the_gateway_guard_lets_only_root_and_nginx_open_smg_and_smg_requires_it():
    """Issue 26 (1): smg's admin API (/workers: add a worker, get the clients' chats) answered
    every local user of the gateway host on loopback."""
    from gpuserve import gateway

    rules = engine_guard.ruleset(engine_guard.gateway_guard((30000, 29000)), engine_guard.GATEWAY_TABLE)
    assert "table inet gpuserve_gateway {" in rules and "elements = { 29000, 30000 }" in rules
    assert 'elements = { "root", "www-data" }' in rules
    assert 'oifname "lo" ip daddr 127.0.0.0/8 tcp dport @engine_ports' in rules
    g = gateway.GatewaySettings(bind="0.0.0.0", port=9443, smg_port=30000, metrics_host="127.0.0.1",
                                metrics_port=29000, policy="cache_aware", balance_abs_threshold=4,
                                balance_rel_threshold=1.2, sticky_header=None, health_interval_s=5,
                                health_failures=1, smg_version="1.13.0", workers_ca_file=None, addresses=())
    unit = gateway.unit(g, "/v")
    assert "Requires=gpuserve-gateway-guard.service\nAfter=gpuserve-gateway-guard.service\n" in unit


def test_the_engine_decrypts_its_secrets_before_anything_else_starts():
    """Issue 29: secrets.env is a link to a /run copy of a credential; the unit's first
    ExecStartPre=+ decrypts it (and fails without it), and systemd reads the file again before
    ExecStart, so the EnvironmentFile= may be missing for that first command only."""
    unit = _unit_with(listeners="/d/listeners.nft")
    creds = unit.index("ExecStartPre=+/opt/gpuserve/bin/gpuserve-credentials /d\n")
    assert "EnvironmentFile=-/d/s\n" in unit and creds < unit.index("ExecStartPre=+/usr/sbin/nft")
    assert creds < unit.index("ExecStart=/d/current/launch")
