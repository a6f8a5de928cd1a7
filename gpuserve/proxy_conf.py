"""The nginx configuration of the TLS front, rendered on the control node (pure: no host access).

Who may reach what (docs/configuration.md, "Proxy"):

- ``/health`` is open (load balancers poll it; 503 while a rollout drains the host);
- the CLIENT_ROUTES (the inference API vLLM documents for clients) need a client key or an
  operator key;
- the MONITOR_ROUTES (read-only: metrics, version, load) need an operator key
  (``operator_keys_file``), a scrape key (``scrape_keys_file``: the monitor's credential, which
  opens these routes and nothing else) or a peer address in ``proxy_operator_networks``;
- every other path, including inference outside the client API (/invocations) and routes a
  future engine adds, is an operator route: it needs an operator key, from any address. A peer
  in the operator networks (loopback by default: every local user) gets no inference and no
  control without a key. A client key or a scrape key gets 403, no key 401.
- a front with ``admin_routes=False`` (the gateway's, docs/gateway.md) has no operator routes at
  all: smg's admin API (/workers, ...) answers on the gateway's loopback only, and every path but
  /health and the client routes gets 403 whatever the key.

Keys are matched exactly and case-sensitively (an nginx ``map`` compares plain strings without
regard to case; a ``~`` regex is case-sensitive). Each key maps to a short id (c1, o1, s1, ...):
the rate and connection limits count per client id (operator keys are exempt), and the access
log writes the id, never the key, and never the query string.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Sequence

from gpuserve import templating

KEY_CHARS = re.compile(r"[A-Za-z0-9._~+/=-]+")
MAX_KEY_LEN = 200
NGINX_DIR = "/etc/nginx/gpuserve"

# The client routes of vLLM's OpenAI-compatible server (0.32/0.33): (nginx location, body class).
# "prompt" routes carry prompts (proxy_prompt_body_kib); "small" the rest (proxy_body_kib).
CLIENT_ROUTES: tuple[tuple[str, str], ...] = (
    ("= /v1/chat/completions", "prompt"),
    ("= /v1/completions", "prompt"),
    ("= /v1/responses", "prompt"),
    ("~ ^/v1/responses/[A-Za-z0-9_.-]+(/cancel)?$", "small"),   # retrieve, cancel
    ("= /v1/messages", "prompt"),
    ("= /v1/messages/count_tokens", "small"),
    ("= /v1/models", "small"),
    ("= /tokenize", "small"),
    ("= /detokenize", "small"),
)
# Read-only routes a peer in proxy_operator_networks may read without a key (monitoring, probes).
MONITOR_ROUTES: tuple[str, ...] = ("= /metrics", "= /version", "= /load")
# Not client routes (operator key only, like any route not listed): /invocations and /ping
# (SageMaker: /invocations runs any inference without the engine's key), /v1/chat/completions/batch,
# /generative_scoring, /metrics, /load, /version, /docs, /openapi.json, /scale_elastic_ep, /sleep,
# /reset_prefix_cache, /collective_rpc, /pause, /update_weights, ...

TLS_CIPHERS = ":".join((
    "ECDHE-ECDSA-AES128-GCM-SHA256", "ECDHE-RSA-AES128-GCM-SHA256",
    "ECDHE-ECDSA-AES256-GCM-SHA384", "ECDHE-RSA-AES256-GCM-SHA384",
    "ECDHE-ECDSA-CHACHA20-POLY1305", "ECDHE-RSA-CHACHA20-POLY1305",
))


@dataclass(frozen=True)
class ProxyLimits:
    prompt_body_kib: int = 4096     # chat/completions/responses/embeddings bodies
    body_kib: int = 64              # every other route (tokenize included)
    rate_per_key: int = 20          # requests per second per key, burst below
    burst_per_key: int = 40
    conn_per_key: int = 32          # requests in flight per key
    conn_per_address: int = 64      # connections per client address (keys or not)
    client_timeout_s: int = 10      # header read (whole), body read (between reads), send, idle
    prompt_conn_per_key: int = 8    # prompt requests in flight per client key (its fair share)
    max_messages: int = 2048        # messages (input items, prompts) per prompt request


def check_key(key: str) -> None:
    if not KEY_CHARS.fullmatch(key):
        raise ValueError("an API key may only hold letters, digits and ._~+/=-")
    if len(key) > MAX_KEY_LEN:
        raise ValueError(f"an API key may be at most {MAX_KEY_LEN} characters long")


def key_pattern(key: str) -> str:
    """The exact, case-sensitive nginx map regex for ``Authorization: Bearer <key>``."""
    check_key(key)
    escaped = "".join(c if c.isalnum() else "\\" + c for c in key)
    return f'"~^Bearer\\ {escaped}$"'


def keys_map(keys: Sequence[str], prefix: str) -> str:
    """nginx map entries: each accepted Authorization header -> its id (``prefix`` + n)."""
    return "".join(f"{key_pattern(key)} {prefix}{n};\n" for n, key in enumerate(keys, 1))


def var(deployment: str) -> str:
    return "gpuserve_" + re.sub(r"\W", "_", deployment)


# The proxy's own files share the names deployments get: conf.d/gpuserve-<deployment>.conf beside
# conf.d/gpuserve-gateway.conf. A deployment may not take one of these names (config refuses it;
# "common": the shared file's old name, still removed by a converge).
OWN_NAMES = ("common", "gateway")   # gateway: the gateway host's own front (gpuserve.gateway)
# The settings every front shares, the access log's format among them. nginx reads conf.d/*.conf
# in name order and a site that names the format before its definition fails `nginx -t`, so the
# file sorts before every gpuserve-* file ("gpuserve-common.conf" came after a deployment "api").
COMMON_CONF = "/etc/nginx/conf.d/000-gpuserve-common.conf"
OLD_COMMON_CONF = "/etc/nginx/conf.d/gpuserve-common.conf"


def host_port(host: str, port: int) -> str:
    """``host:port`` as nginx reads it: an IPv6 literal goes in brackets (``[::1]:8443``)."""
    return f"[{host.strip('[]')}]:{port}" if ":" in host else f"{host}:{port}"


# The prompt routes' cost limit (issue 26: 8 chats of 120,000 one-character messages, each
# answered 400, stalled every other client for seconds while the engine templated and tokenized
# them). nginx's njs module (Debian: libnginx-mod-http-js) reads the body (in memory:
# client_body_buffer_size is the route's body limit) and counts its messages before the engine
# sees it. N items of a JSON array need N-1 commas, so a body with fewer commas than the limit is
# passed unparsed; only a larger one is parsed (JSON.parse: about 80 ms for 4 MB, bounded by the
# body limit); past the limit: 413. Then the request goes on,
# body and all, to the location that proxies it (an internal redirect).
LIMITS_JS = f"{NGINX_DIR}/limits.js"
NJS_PACKAGE = "libnginx-mod-http-js"
LIMITS_JS_TEXT = """\
// Managed by gpuserve (pyinfra): the prompt routes' message limit (gpuserve/proxy_conf.py)
function commas_over(body, max) {
    var n = 0, at = body.indexOf(',');
    while (at >= 0) {
        n += 1;
        if (n >= max) {
            return true;
        }
        at = body.indexOf(',', at + 1);
    }
    return false;
}

function items(j) {
    var n = 0;
    ['messages', 'input', 'prompt'].forEach(function (k) {
        if (Array.isArray(j[k]) && j[k].length > n) {
            n = j[k].length;
        }
    });
    return n;
}

function prompt(r) {
    var max = Number(r.variables.gpuserve_max_messages);
    var body = r.requestText;
    if (body && commas_over(body, max)) {
        var n = 0;
        try {
            n = items(JSON.parse(body));
        } catch (e) {
            n = 0;   // not JSON: the engine answers that
        }
        if (n > max) {
            r.headersOut['Content-Type'] = 'application/json';
            r.return(413, '{"error": "' + n + ' messages in one request; at most ' + max +
                     ' (proxy_max_messages)"}\\n');
            return;
        }
    }
    r.internalRedirect(r.variables.gpuserve_prompt_location);
}

export default {prompt};
"""


def common_conf() -> str:
    """http-level settings shared by every deployment (COMMON_CONF)."""
    return (
        "# Managed by gpuserve (pyinfra): settings of every gpuserve front\n"
        f"js_import gpuserve_limits from {LIMITS_JS};\n"
        "map_hash_bucket_size 256;\n"
        "server_tokens off;\n"
        "# no query string (it may carry a credential) and no key: the key's id is logged instead\n"
        "log_format gpuserve '$remote_addr [$time_local] \"$request_method $uri $server_protocol\" '\n"
        "                    '$status $body_bytes_sent $request_time key=$gpuserve_key_id';\n"
    )


def tls_conf(cert: str, key: str) -> str:
    """TLS settings included by every gpuserve server block (TLS 1.2 ECDHE+AEAD only, and 1.3)."""
    return (
        "# Managed by gpuserve (pyinfra)\n"
        f"ssl_certificate {cert};\n"
        f"ssl_certificate_key {key};\n"
        "ssl_protocols TLSv1.2 TLSv1.3;\n"
        f"ssl_ciphers {TLS_CIPHERS};\n"
        "ssl_prefer_server_ciphers on;\n"
        "ssl_session_tickets off;\n"
    )


def server_conf(*, deployment: str, bind: str, port: int, server_names: Sequence[str],
                engine_host: str, engine_port: int, drain_flag: str, read_timeout_s: int,
                operator_networks: Sequence[str], limits: ProxyLimits,
                gateways: Sequence[str] = (), admin_routes: bool = True, tenants_http: str = "",
                tenants_server: str = "") -> str:
    """The front of one deployment (conf.d/gpuserve-<deployment>.conf). With ``gateways`` (the
    addresses of the fleet's gateways, docs/gateway.md) the client routes answer only them and
    operator keys: the client's key was checked once, at the gateway; from anywhere else a
    client key gets 403. The per-address limit does not count the gateways (they carry the
    whole fleet's traffic). ``admin_routes=False``: no route but /health and the client routes
    is proxied, for any key (the gateway's front: smg's admin API stays on its loopback)."""
    v = var(deployment)
    lim = limits
    t = lim.client_timeout_s
    # the default server's header timeout is the one that applies while a request's headers
    # are read (before nginx knows the Host), so both servers get them
    timeouts = [f"    client_header_timeout {t}s;\n", f"    client_body_timeout {t}s;\n",
                f"    send_timeout {max(t, 60)}s;\n", f"    keepalive_timeout {t}s;\n"]
    out = [
        f"# Managed by gpuserve (pyinfra): the TLS front of deployment {deployment}.\n",
        "# /health is open; the client routes need a client or operator key; the monitoring routes an\n",
        "# operator key or a peer in proxy_operator_networks; every other route an operator key\n",
        "# (gpuserve/proxy_conf.py).\n",
        f"map $http_authorization ${v}_key {{\n",
        "    default \"\";\n",
        f"    include {NGINX_DIR}/{deployment}.keys;\n",
        f"    include {NGINX_DIR}/{deployment}.operator-keys;\n",
        "}\n",
        f"geo ${v}_opnet {{\n",
        "    default 0;\n",
        *(f"    {net} 1;\n" for net in operator_networks),
        "}\n",
        "# the monitoring routes: 0: allowed; 401: no (known) key; 403: a client key\n",
        f"map \"${v}_key:${v}_opnet\" ${v}_monitor {{\n",
        "    ~^[os] 0;\n",
        "    ~:1$ 0;\n",
        "    ~^c 403;\n",
        "    default 401;\n",
        "}\n",
        "# every other route: an operator key, whatever the peer's address (a scrape key: 403)\n",
        f"map ${v}_key ${v}_operator {{\n",
        "    ~^o 0;\n",
        "    ~^[cs] 403;\n",
        "    default 401;\n",
        "}\n",
        "# the client routes: a client or operator key (a scrape key opens no inference)\n",
        f"map ${v}_key ${v}_inference {{\n",
        "    ~^[co] 0;\n",
        "    ~^s 403;\n",
        "    default 401;\n",
        "}\n",
        "# the per-key limits count client keys (by id); operator keys (scrapers, tools) are exempt;\n",
        "# a tenant's keys (c-<tenant>-n) count in their tenant's zones (gpuserve/tenants.py)\n",
        f"map ${v}_key ${v}_client {{\n",
        f"    ~^c[0-9] ${v}_key;\n",
        "    default \"\";\n",
        "}\n",
        f"limit_req_zone ${v}_client zone={v}_rate:1m rate={lim.rate_per_key}r/s;\n",
        f"limit_conn_zone ${v}_client zone={v}_conn:1m;\n",
        f"limit_conn_zone ${v}_client zone={v}_pconn:1m;\n",
        tenants_http,
        *(_gateway_maps(v, gateways) if gateways else
          [f"limit_conn_zone $binary_remote_addr zone={v}_addr:10m;\n"]),
        "\n",
        f"upstream {v}_engine {{\n",
        f"    server {host_port(engine_host, engine_port)};\n",
        "    keepalive 16;\n",
        "}\n",
        "\n",
        "# any other Host name on this address and port: 421, never a redirect to it\n",
        "server {\n",
        f"    listen {host_port(bind, port)} ssl default_server;\n",
        f"    include {NGINX_DIR}/tls.conf;\n",
        *timeouts,
        "    access_log /var/log/nginx/access.log gpuserve;\n",
        "    set $gpuserve_key_id -;\n",
        "    return 421;\n",
        "}\n",
        "\n",
        "server {\n",
        f"    listen {host_port(bind, port)} ssl;\n",
        f"    server_name {' '.join(server_names)};\n",
        f"    include {NGINX_DIR}/tls.conf;\n",
        "    add_header Strict-Transport-Security \"max-age=31536000\" always;\n",
        "    absolute_redirect off;\n",
        f"    set $gpuserve_key_id ${v}_key;\n",
        "    access_log /var/log/nginx/access.log gpuserve;\n",
        *timeouts,
        f"    client_max_body_size {lim.body_kib}k;\n",
        f"    client_body_buffer_size {lim.body_kib}k;\n",
        f"    limit_conn {v}_addr {lim.conn_per_address};\n",
        f"    limit_conn {v}_conn {lim.conn_per_key};\n",
        f"    limit_req zone={v}_rate burst={lim.burst_per_key} nodelay;\n",
        tenants_server,
        "    limit_req_status 429;\n",
        "    limit_conn_status 429;\n",
        "    proxy_http_version 1.1;\n",
        *_headers("    "),
        "    # nginx picks the location from the normalized path but forwards the raw one: a client\n",
        "    # route with dot segments or encoded separators could reach another route upstream\n",
        "    if ($request_uri ~* \"(/\\.|%2e|%2f|%5c)\") {\n",
        "        return 400;\n",
        "    }\n",
        "\n",
        "    location = /health {\n",
        f"        if (-f {drain_flag}) {{\n",
        "            return 503 \"draining\\n\";\n",
        "        }\n",
        f"        proxy_pass http://{v}_engine/health;\n",
        "    }\n",
    ]
    out += [
        "\n",
        "    # the prompt routes' requests, once limits.js counted their messages\n",
        f"    location @{v}_prompt {{\n",
        *_headers("        ", f"{NGINX_DIR}/{deployment}.upstream-auth"),
        f"        proxy_pass http://{v}_engine;\n",
        "        proxy_buffering off;\n",
        f"        proxy_read_timeout {read_timeout_s}s;\n",
        "    }\n",
    ]
    for location, body in CLIENT_ROUTES:
        size = lim.prompt_body_kib if body == "prompt" else lim.body_kib
        out += [
            "\n",
            f"    location {location} {{\n",
            *(_gateway_only(v) if gateways else [
                f"        if (${v}_inference = 401) {{\n",
                "            return 401 \"{\\\"error\\\": \\\"missing or unknown API key\\\"}\\n\";\n",
                "        }\n",
                f"        if (${v}_inference = 403) {{\n",
                "            return 403 \"{\\\"error\\\": \\\"a scrape key reaches the monitoring routes only\\\"}\\n\";\n",
                "        }\n"]),
            f"        client_max_body_size {size}k;\n",
            *(_prompt_block(v, size, lim) if body == "prompt" else [
                *_headers("        ", f"{NGINX_DIR}/{deployment}.upstream-auth"),
                f"        proxy_pass http://{v}_engine;\n",
                "        proxy_buffering off;\n",
                f"        proxy_read_timeout {read_timeout_s}s;\n"]),
            "    }\n",
        ]
    if not admin_routes:
        return "".join(out + [
            "\n",
            "    # no operator route on this front, whatever the key: the admin API answers on this\n",
            "    # host's loopback only (docs/gateway.md, \"Operator rights\")\n",
            "    location / {\n",
            "        return 403 \"{\\\"error\\\": \\\"not a client route; the admin API is on the host's loopback only\\\"}\\n\";\n",
            "    }\n",
            "}\n"])
    for location in MONITOR_ROUTES:
        out += ["\n", f"    location {location} {{\n",
                *_operator_block(v, f"{v}_monitor", deployment, read_timeout_s)]
    out += ["\n",
            "    # everything else (inference outside the client API, docs, scaling, sleep, cache resets,\n",
            "    # routes not known yet): an operator key only\n",
            "    location / {\n",
            *_operator_block(v, f"{v}_operator", deployment, read_timeout_s),
            "}\n"]
    return "".join(out)


def _prompt_block(v: str, size_kib: int, lim: ProxyLimits) -> list[str]:
    """A prompt route: the key's fair share of requests in flight, then limits.js counts the
    messages (the body in memory) and hands the request to @<v>_prompt."""
    return [
        f"        limit_conn {v}_pconn {lim.prompt_conn_per_key};\n",
        f"        client_body_buffer_size {size_kib}k;\n",
        f"        set $gpuserve_max_messages {lim.max_messages};\n",
        f"        set $gpuserve_prompt_location @{v}_prompt;\n",
        "        js_content gpuserve_limits.prompt;\n",
    ]


def _operator_block(v: str, verdict: str, deployment: str, read_timeout_s: int) -> list[str]:
    """The body of an operator location, refused unless ``$<verdict>`` is 0."""
    return [
        f"        if (${verdict} = 401) {{\n",
        "            return 401 \"{\\\"error\\\": \\\"missing or unknown API key\\\"}\\n\";\n",
        "        }\n",
        f"        if (${verdict} = 403) {{\n",
        "            return 403 \"{\\\"error\\\": \\\"an operator route: client keys are not allowed\\\"}\\n\";\n",
        "        }\n",
        *_headers("        ", f"{NGINX_DIR}/{deployment}.upstream-auth"),
        f"        proxy_pass http://{v}_engine;\n",
        "        proxy_buffering off;\n",
        f"        proxy_read_timeout {read_timeout_s}s;\n",
        "    }\n",
    ]


def _gateway_maps(v: str, gateways: Sequence[str]) -> list[str]:
    return [
        "# the fleet's gateways (docs/gateway.md): they alone reach the client routes without a key\n",
        f"geo ${v}_gateway {{\n",
        "    default 0;\n",
        *(f"    {net} 1;\n" for net in gateways),
        "}\n",
        f"map \"${v}_gateway:${v}_key\" ${v}_client_ok {{\n",
        "    ~^1: 1;\n",
        "    ~^0:o 1;\n",
        "    default 0;\n",
        "}\n",
        f"map ${v}_gateway ${v}_addr_key {{\n",
        "    1 \"\";\n",
        "    default $binary_remote_addr;\n",
        "}\n",
        f"limit_conn_zone ${v}_addr_key zone={v}_addr:10m;\n",
    ]


def _gateway_only(v: str) -> list[str]:
    return [
        f"        if (${v}_client_ok = 0) {{\n",
        "            return 403 \"{\\\"error\\\": \\\"this host serves clients only through the gateway\\\"}\\n\";\n",
        "        }\n",
    ]


def _headers(indent: str, auth: str | None = None) -> list[str]:
    """proxy_set_header lines; a block that sets any inherits none, so each proxying block gets
    all of them: the engine logs the peer nginx saw, never an X-Forwarded-For a client sent."""
    lines = ["proxy_set_header Host $host;", "proxy_set_header X-Forwarded-For $remote_addr;",
             "proxy_set_header X-Real-IP $remote_addr;", 'proxy_set_header Forwarded "";',
             'proxy_set_header Connection "";']
    if auth:
        lines.append(f"include {auth};")
    return [f"{indent}{line}\n" for line in lines]


# systemd's unit syntax: $$ is a literal $ (the shell's), no % specifier, no single quote
_CLEAR_LEFTOVERS = (
    "cg=/sys/fs/cgroup$$(sed -n s/^0:://p /proc/self/cgroup); "
    "for p in $$(cat $$cg/cgroup.procs); do "
    "[ \"$$(cat /proc/$$p/comm 2>/dev/null)\" = nginx ] || continue; "
    "kill -KILL $$p && echo gpuserve: killed nginx process $$p left over in the cgroup of nginx.service; "
    "for i in $$(seq 50); do grep -qs ^State:.Z /proc/$$p/status || [ ! -e /proc/$$p ] && break; "
    "sleep 0.1; done; "
    "done; exit 0"
)
# nginx's drop-in (templates/dropin-nginx.conf.j2): back after a crash, confined
NGINX_DROPIN = templating.render("dropin-nginx.conf.j2", clear_leftovers=_CLEAR_LEFTOVERS)
