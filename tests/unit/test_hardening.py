"""The serving path's hardening, as rendered and validated on the control node (issue 12)."""

from __future__ import annotations

import re
import subprocess

import pytest

from gpuserve import proxy_conf
from gpuserve.proxy_conf import ProxyLimits, server_conf

from .helpers import SHA, make_inventory, one_problem, settings_of


def _conf(**kw) -> str:
    args = dict(deployment="minimax", bind="0.0.0.0", port=8443, server_names=["sandbox-1", "10.0.0.2"],
                engine_host="127.0.0.1", engine_port=8000, drain_flag="/etc/gpuserve/minimax/drain",
                read_timeout_s=600, operator_networks=["127.0.0.1/32"], limits=ProxyLimits())
    return server_conf(**{**args, **kw})


def _locations(conf: str) -> dict[str, str]:
    """location argument -> its block."""
    return {m[1]: m[2] for m in re.finditer(r"\n    location ([^{]+?) \{\n(.*?)\n    \}\n", conf, re.S)}


def test_key_patterns_are_exact_and_case_sensitive():
    pattern = proxy_conf.key_pattern("Ab.c+d/e=")
    assert pattern == '"~^Bearer\\ Ab\\.c\\+d\\/e\\=$"'
    regex = re.compile(pattern.strip('"')[1:].replace("\\ ", " "))
    assert regex.fullmatch("Bearer Ab.c+d/e=")
    for other in ("Bearer ab.c+d/e=", "bearer Ab.c+d/e=", "Bearer AbXc+d/e=", "Bearer Ab.c+d/e=x",
                  "xBearer Ab.c+d/e="):
        assert not regex.fullmatch(other), other
    with pytest.raises(ValueError):
        proxy_conf.key_pattern("a b")
    with pytest.raises(ValueError):
        proxy_conf.key_pattern("k" * 201)


def test_clients_reach_only_the_inference_routes_and_everything_else_is_operator_only():
    locations = _locations(_conf())
    client = [loc for loc in locations if loc not in ("= /health", "/", "@gpuserve_minimax_prompt")
              and loc not in proxy_conf.MONITOR_ROUTES]
    assert [loc for loc, _ in proxy_conf.CLIENT_ROUTES] == client
    for loc in client:
        assert 'if ($gpuserve_minimax_inference = 401) {\n            return 401' in locations[loc]
        assert 'if ($gpuserve_minimax_inference = 403) {\n            return 403' in locations[loc]
    for route in ("/scale_elastic_ep", "/docs", "/openapi.json", "/sleep", "/collective_rpc",
                  "/reset_prefix_cache", "/invocations", "/ping", "/v1/chat/completions/batch"):
        assert f"= {route}" not in locations      # falls to location /, the operator block
    operator = locations["/"]
    assert "if ($gpuserve_minimax_operator = 403)" in operator
    assert "if ($gpuserve_minimax_operator = 401)" in operator
    conf = _conf()
    # every other route: an operator key, whatever the peer; a client key is 403, none 401
    assert ("map $gpuserve_minimax_key $gpuserve_minimax_operator {\n"
            "    ~^o 0;\n    ~^[cs] 403;\n    default 401;\n}\n") in conf
    # the client routes: a client or operator key; a scrape key (the monitor's) 403
    assert ("map $gpuserve_minimax_key $gpuserve_minimax_inference {\n"
            "    ~^[co] 0;\n    ~^s 403;\n    default 401;\n}\n") in conf
    assert "    127.0.0.1/32 1;\n" in conf


def test_operator_networks_read_only_the_monitoring_routes_without_a_key():
    """A peer in proxy_operator_networks (loopback by default: every local user) may read
    metrics, version and load, and gets no inference (/invocations) or control without a key."""
    locations = _locations(_conf())
    assert proxy_conf.MONITOR_ROUTES == ("= /metrics", "= /version", "= /load")
    for loc in proxy_conf.MONITOR_ROUTES:
        assert "if ($gpuserve_minimax_monitor = 401)" in locations[loc]
        assert "if ($gpuserve_minimax_monitor = 403)" in locations[loc]
        assert "_operator" not in locations[loc]
    assert "_monitor" not in locations["/"]
    conf = _conf()
    # an operator key, or a peer in the operator networks; a client key is 403, none 401
    assert ('map "$gpuserve_minimax_key:$gpuserve_minimax_opnet" $gpuserve_minimax_monitor {\n'
            "    ~^[os] 0;\n    ~:1$ 0;\n    ~^c 403;\n    default 401;\n}\n") in conf
    # the operator networks decide nothing else
    assert conf.count("$gpuserve_minimax_opnet") == 2


def test_a_front_without_admin_routes_proxies_only_health_and_the_client_routes():
    """Issue 26 (1): the gateway's public front passed every other path, with an operator key,
    to smg's admin API (POST /workers added a rogue worker). With admin_routes=False no key opens
    anything but /health and the client routes."""
    conf = _conf(deployment="gateway", admin_routes=False)
    locations = _locations(conf)
    assert set(locations) == {"= /health", "/", "@gpuserve_gateway_prompt",
                              *(loc for loc, _ in proxy_conf.CLIENT_ROUTES)}
    assert locations["/"].strip().startswith("return 403")
    assert "proxy_pass" not in locations["/"]
    # the default keeps the operator routes (the serving hosts' fronts)
    assert "proxy_pass" in _locations(_conf())["/"]


def test_prompt_routes_count_messages_and_hold_a_fair_share_per_key():
    """Issue 26 (3): 8 concurrent chats of 120,000 one-character messages, inside every limit,
    stalled everyone's inference. The prompt routes go through limits.js (njs), which refuses
    more than max_messages, and each key holds at most prompt_conn_per_key of them at once."""
    conf = _conf(limits=ProxyLimits(max_messages=500, prompt_conn_per_key=3))
    locations = _locations(conf)
    prompts = [loc for loc, body in proxy_conf.CLIENT_ROUTES if body == "prompt"]
    for loc in prompts:
        block = locations[loc]
        assert "limit_conn gpuserve_minimax_pconn 3;" in block
        assert "set $gpuserve_max_messages 500;" in block
        assert "set $gpuserve_prompt_location @gpuserve_minimax_prompt;" in block
        assert block.rstrip().endswith("js_content gpuserve_limits.prompt;")
        assert "client_body_buffer_size 4096k;" in block   # the body in memory, for njs
        assert "proxy_pass" not in block
    for loc, body in proxy_conf.CLIENT_ROUTES:
        if body != "prompt":
            assert "js_content" not in locations[loc] and "proxy_pass" in locations[loc]
    named = locations["@gpuserve_minimax_prompt"]
    assert "proxy_pass http://gpuserve_minimax_engine;" in named
    assert "include /etc/nginx/gpuserve/minimax.upstream-auth;" in named
    # counted per client key id (operator keys exempt), like the other per-key limits
    assert "limit_conn_zone $gpuserve_minimax_client zone=gpuserve_minimax_pconn:1m;" in conf
    assert f"js_import gpuserve_limits from {proxy_conf.LIMITS_JS};" in proxy_conf.common_conf()
    js = proxy_conf.LIMITS_JS_TEXT
    assert "r.internalRedirect(r.variables.gpuserve_prompt_location)" in js
    assert "r.return(413" in js and "export default {prompt, large};" in js
    for name in ("messages", "input", "prompt"):
        assert f"'{name}'" in js


def test_a_client_key_holds_at_most_its_large_prompts_in_flight():
    """Issue 26 (3), the engine's CPU time: templating and tokenizing a prompt costs the engine
    time that every client waits on, and it grows with the body. A prompt request over
    large_prompt_kib (by its Content-Length, or chunked) counts in a per-key zone of its own,
    before the body is read; operator keys are exempt (limits.js ``large``)."""
    conf = _conf(limits=ProxyLimits(large_prompt_kib=100, large_prompts_per_key=2))
    locations = _locations(conf)
    assert "limit_conn_zone $gpuserve_large_prompt zone=gpuserve_minimax_lconn:1m;" in conf
    for loc in (loc for loc, body in proxy_conf.CLIENT_ROUTES if body == "prompt"):
        assert "set $gpuserve_large_kib 100;" in locations[loc]
        assert "limit_conn gpuserve_minimax_lconn 2;" in locations[loc]
    for loc in (loc for loc, body in proxy_conf.CLIENT_ROUTES if body != "prompt"):
        assert "lconn" not in locations[loc] and "gpuserve_large_kib" not in locations[loc]
    assert "js_set $gpuserve_large_prompt gpuserve_limits.large;" in proxy_conf.common_conf()
    js = proxy_conf.LIMITS_JS_TEXT
    large = js[js.index("function large(r)"):js.index("export default")]
    # the key's id (client keys only), the route's threshold, the header: no body needed
    for needle in ("r.variables.gpuserve_key_id", "id.charAt(0) !== 'c'", "r.variables.gpuserve_large_kib",
                   "r.headersIn['Content-Length']", "kib * 1024"):
        assert needle in large, needle


def test_the_large_prompt_limit_must_narrow_the_limits_it_lies_in():
    """A large-prompt limit that could never apply is refused, naming the host, the key, the
    limit it must stay inside and what is allowed."""
    for data, start, allowed in (
            ({"proxy_large_prompt_kib": 4096}, "h1: proxy_large_prompt_kib (from group 'fleet'): 4096 "
             "is not below proxy_prompt_body_kib (4096)", "use a number from 1 to 4095 (KiB)"),
            ({"proxy_large_prompts_per_key": 9}, "h1: proxy_large_prompts_per_key (from group 'fleet'): 9 "
             "is above proxy_prompt_conn_per_key (8)", "use a number from 1 to 8")):
        msg = one_problem(make_inventory(group="cpu", fleet={"model_revision": SHA, **data}))
        assert msg.startswith(start) and allowed in msg, msg


def test_body_limits_per_route_and_limits_per_key_never_the_key_itself():
    conf = _conf(limits=ProxyLimits(prompt_body_kib=2048, body_kib=32, rate_per_key=7,
                                    burst_per_key=3, conn_per_key=5))
    locations = _locations(conf)
    assert "client_max_body_size 2048k;" in locations["= /v1/chat/completions"]
    assert "client_max_body_size 32k;" in locations["= /tokenize"]
    assert "client_max_body_size 32k;" in locations["= /v1/models"]
    # counted per key id (c1, o1: the map's values), never per raw header
    assert "limit_req_zone $gpuserve_minimax_client zone=gpuserve_minimax_rate:1m rate=7r/s;" in conf
    assert "map $gpuserve_minimax_key $gpuserve_minimax_client {\n    ~^c[0-9] $gpuserve_minimax_key;\n" in conf
    assert "limit_req zone=gpuserve_minimax_rate burst=3 nodelay;" in conf
    assert "limit_conn gpuserve_minimax_conn 5;" in conf
    assert "$http_authorization" not in conf.split("map $http_authorization", 1)[1].split("}", 1)[1]
    assert "client_header_timeout 10s;" in conf and "client_body_timeout 10s;" in conf


def test_log_format_has_no_query_string_and_no_key():
    common = proxy_conf.common_conf()
    fmt = common.split("log_format", 1)[1]
    assert "$request " not in fmt and "$request_uri" not in fmt and "$args" not in fmt
    assert "$http_authorization" not in fmt and "$uri" in fmt and "key=$gpuserve_key_id" in fmt
    assert "server_tokens off;" in common


def test_tls_hsts_default_server_and_forwarded_headers():
    tls = proxy_conf.tls_conf("/c", "/k")
    assert "ssl_protocols TLSv1.2 TLSv1.3;" in tls
    ciphers = re.search(r"ssl_ciphers (\S+);", tls)[1].split(":")
    assert ciphers and all(c.startswith("ECDHE-") and ("GCM" in c or "CHACHA20" in c) for c in ciphers)
    conf = _conf()
    default, main = conf.split("\nserver {\n")[1:]
    assert "default_server" in default and "return 421;" in default
    assert "client_header_timeout 10s;" in default     # headers are read before the Host is known
    assert "server_name sandbox-1 10.0.0.2;" in main and "Strict-Transport-Security" in main
    assert "\n    proxy_set_header X-Forwarded-For $remote_addr;\n" in main   # /health inherits it
    for block in _locations(conf).values():
        if "proxy_set_header" in block:      # a block with any inherits none: all of them here
            assert "proxy_set_header X-Forwarded-For $remote_addr;" in block


def test_proxy_limits_and_networks_are_validated():
    inv = make_inventory(group="cpu", fleet={"model_revision": SHA, "proxy_body_kib": 0})
    assert one_problem(inv).startswith("h1: proxy_body_kib (from group 'fleet'): 0 is not allowed")
    inv = make_inventory(group="cpu", fleet={"model_revision": SHA,
                                             "proxy_operator_networks": ["10.0.0.0/33"]})
    assert "'10.0.0.0/33' is not an address or network" in one_problem(inv)
    s = settings_of(make_inventory(group="cpu"))
    assert s.proxy_limits["prompt_body_kib"] == 4096 and s.proxy_limits["conn_per_key"] == 32
    assert ProxyLimits(**s.proxy_limits) == ProxyLimits()   # config defaults == the renderer's


@pytest.mark.parametrize("serve_host", ["0.0.0.0", "10.0.0.5", "::"])
def test_engine_beyond_loopback_without_the_proxy_is_refused(serve_host):
    msg = one_problem(make_inventory(group="cpu", fleet={"model_revision": SHA, "serve_host": serve_host}))
    assert msg.startswith(f"h1: serve_host (from group 'fleet'): {serve_host} is beyond loopback")
    assert "proxy = True, or trusted_network = True" in msg
    trusted = make_inventory(group="cpu", fleet={"model_revision": SHA, "serve_host": serve_host,
                                                 "trusted_network": True})
    assert settings_of(trusted).trusted_network is True


def test_loopback_engine_needs_no_proxy():
    for host in ("127.0.0.1", "::1", "localhost", "127.0.0.2"):
        inv = make_inventory(group="cpu", fleet={"model_revision": SHA, "serve_host": host})
        assert settings_of(inv).deployments[0].serve_host == host


def _unit(devices, loopback_only=True) -> str:
    from gpuserve import templating
    return templating.render(
        "gpuserve.service.j2",
        deployment="minimax", engine="vllm", deployment_dir="/etc/gpuserve/minimax",
        current="/etc/gpuserve/minimax/current", secrets_env="/etc/gpuserve/minimax/secrets.env",
        user_name="gpuserve", group_name="gpuserve", home="/var/lib/gpuserve", cache="/mnt/nvme/c",
        start_timeout_s=3600, stop_timeout_s=90, devices=devices, supplementary_groups=[], after=[],
        loopback_only=loopback_only, guard=None, listeners=None,
        credentials_bin="/opt/gpuserve/bin/gpuserve-credentials")


def test_engine_unit_is_confined_but_keeps_its_gpus():
    nvidia = ["char-nvidia-frontend", "char-nvidia-uvm", "char-nvidia-caps", "/dev/nvidiactl"]
    unit = _unit(nvidia)
    for dev in nvidia:
        assert f"DeviceAllow={dev} rw\n" in unit
    for line in ("DevicePolicy=closed", "CapabilityBoundingSet=\n", "NoNewPrivileges=yes",
                 "ProtectSystem=strict", "ProtectKernelTunables=yes", "RestrictNamespaces=yes",
                 "SystemCallFilter=@system-service", "SystemCallArchitectures=native",
                 "IPAddressDeny=any", "Restart=always", "StartLimitBurst=10"):
        assert line in unit, line
    assert "\nMemoryDenyWriteExecute=" not in unit      # the JITs need W then X memory
    assert "IPAddressDeny" not in _unit([], loopback_only=False)   # a trusted network beyond loopback
    amd = _unit(["/dev/kfd", "char-drm"])
    assert "DeviceAllow=/dev/kfd rw\nDeviceAllow=char-drm rw\n" in amd


def _exposure(tmp_path, name: str, text: str) -> float:
    """systemd's own score of a unit file (`systemd-analyze security --offline`, systemd 252)."""
    (tmp_path / name).write_text(text)
    out = subprocess.run(["systemd-analyze", "security", "--offline=yes", f"./{name}"], cwd=tmp_path,
                         capture_output=True, text=True, check=True).stdout
    return float(re.search(r"Overall exposure level for \S+: (\d+\.\d+)", out)[1])


def test_every_gpuserve_unit_scores_3_or_less(tmp_path):
    """Issue 12: `systemd-analyze security` 3.0 or less for every unit gpuserve writes. The
    engine's is checked on a converged host too (tests/integration/test_hardening.py); nginx's
    drop-in needs Debian's unit beside it, so there only."""
    from gpuserve import engine_guard, meter
    from gpuserve.config import validate_inventory
    from gpuserve.gateway import unit as gateway_unit
    from gpuserve.layers import watchdog

    from .test_gateway import fleet as gateway_fleet

    g = validate_inventory(gateway_fleet())["gw1"].gateway
    units = {
        "gpuserve-minimax.service": _unit(["char-nvidia-frontend", "/dev/nvidiactl"]),
        "gpuserve-cpu.service": _unit([], loopback_only=True),
        "gpuserve-engine-guard.service": engine_guard.unit_text(),
        "gpuserve-watchdog@.service": watchdog.unit_text(),
        "gpuserve-gateway.service": gateway_unit(g, "/opt/gpuserve/envs/smg-1.13.0-py3.11"),
        "gpuserve-meter.service": meter.unit_text(),
    }
    scores = {name: _exposure(tmp_path, name, text) for name, text in units.items()}
    assert all(score <= 3.0 for score in scores.values()), scores


@pytest.mark.parametrize("bind, engine, listen, server", [
    ("::1", "::1", "listen [::1]:8443 ssl;", "server [::1]:8000;"),
    ("::", "127.0.0.1", "listen [::]:8443 ssl;", "server 127.0.0.1:8000;"),
    ("0.0.0.0", "127.0.0.1", "listen 0.0.0.0:8443 ssl;", "server 127.0.0.1:8000;"),
])
def test_ipv6_addresses_are_bracketed_for_nginx(bind, engine, listen, server):
    # unbracketed, nginx reads "listen ::1:8443" as port 1 of host "::" (or refuses the file)
    conf = _conf(bind=bind, engine_host=engine)
    assert f"    {listen}\n" in conf and f"    {server}\n" in conf


@pytest.mark.parametrize("name", proxy_conf.OWN_NAMES)
def test_a_deployment_named_after_a_file_the_proxy_writes_for_itself_is_refused(name):
    inv = make_inventory(group="cpu", fleet={"model_revision": SHA, "deployments": {name: {}}})
    msg = one_problem(inv)
    assert msg.startswith(f"h1: deployments.{name} (from group 'fleet'): '{name}' is the name of a "
                          "file the proxy writes for itself")


def test_the_proxy_files_a_deployment_could_collide_with_are_the_ones_listed():
    # every name conf.d/gpuserve-<x>.conf the proxy layer (or the gateway's) writes for itself
    # is in OWN_NAMES
    from gpuserve import gateway, layout
    from gpuserve.layers import proxy as layer

    modules = (layer, gateway, proxy_conf, layout)   # layout.py: the host paths' one source
    source = "".join(open(m.__file__).read() for m in modules)
    source += "".join(v for m in modules for v in vars(m).values() if isinstance(v, str))
    own = set(re.findall(r"/etc/nginx/conf\.d/gpuserve-([a-z0-9_][a-z0-9_-]*)\.conf", source))
    # (the exporters' gpuserve--exporters.conf: no deployment name starts with "-")
    # "common": the shared settings' old name, which a converge still removes
    assert own == set(proxy_conf.OWN_NAMES)


def test_paths_with_dot_segments_or_encoded_separators_are_refused():
    # the pattern as nginx reads it (inside double quotes nginx turns \\ into \ and keeps \.)
    line = next(ln for ln in _conf().splitlines() if "$request_uri" in ln)
    raw = re.search(r'~\* "(.*)"\) \{$', line)[1]
    pattern = re.compile(raw.replace("\\\\", "\\"), re.I)   # an unbalanced pattern fails here, as in nginx
    for bad in ("/metrics/../v1/models", "/v1/%2e%2e/metrics", "/v1/models/..%2Fmetrics", "/v1/./models"):
        assert pattern.search(bad), bad
    for good in ("/v1/chat/completions", "/v1/models", "/v1/models/minimax-m3.1-flash", "/health"):
        assert not pattern.search(good), good


def test_the_shared_settings_load_before_every_site_that_names_their_log_format():
    """nginx reads conf.d/*.conf in name order; a site naming the log format "gpuserve" before
    the file that defines it fails `nginx -t` (a deployment "api" or "chat" did, before
    "gpuserve-common.conf")."""
    import os

    from gpuserve import gateway, removal
    from gpuserve.layers import monitoring, proxy

    assert "log_format gpuserve " in proxy_conf.common_conf()
    assert "access_log /var/log/nginx/access.log gpuserve;" in _conf(deployment="api")
    sites = [proxy.conf_path(name) for name in ("0", "00-a", "00", "a", "api", "chat", "common-x")]
    sites += [gateway.NGINX_CONF, monitoring.EXPORTERS_CONF]
    names = sorted(os.path.basename(p) for p in [*sites, proxy_conf.COMMON_CONF])
    assert names[0] == os.path.basename(proxy_conf.COMMON_CONF), names
    assert all(os.path.dirname(p) == os.path.dirname(proxy_conf.COMMON_CONF) for p in sites)
    # decommission removes it, and the old name a converge replaces
    assert {proxy_conf.COMMON_CONF, proxy_conf.OLD_COMMON_CONF} <= set(removal.HOST_PATHS)
