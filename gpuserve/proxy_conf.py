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

from gpuserve import layout, templating

KEY_CHARS = re.compile(r"[A-Za-z0-9._~+/=-]+")
MAX_KEY_LEN = 200
NGINX_DIR = layout.NGINX_GPUSERVE_DIR

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
    large_prompt_kib: int = 256     # a prompt body over this (or chunked) is a large one
    large_prompts_per_key: int = 1  # large prompt requests in flight per client key


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
COMMON_CONF = layout.NGINX_COMMON_CONF
OLD_COMMON_CONF = layout.NGINX_OLD_COMMON_CONF


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
# The engine's CPU time for templating and tokenizing grows with the body too: a prompt request
# larger than proxy_large_prompt_kib is a large one, and a client key has at most
# proxy_large_prompts_per_key of those in flight (``large``, a js_set variable that limit_conn
# counts by key id); past it: 429.
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

// $gpuserve_large_prompt (js_set; read by limit_conn in the preaccess phase, before the body):
// a client key's id when its prompt request is a large one, else empty (not counted)
function large(r) {
    var id = r.variables.gpuserve_key_id || '';
    var kib = Number(r.variables.gpuserve_large_kib);
    if (id.charAt(0) !== 'c' || !kib) {
        return '';   // operator keys are exempt, as from every per-key limit; not a prompt route
    }
    var length = r.headersIn['Content-Length'];
    if (length === undefined) {
        return id;   // a chunked body: its size is known only once read
    }
    return Number(length) > kib * 1024 ? id : '';
}

export default {prompt, large};
"""


# Token metering per key (issue 29). The prompt routes' named location reads the engine's answer
# with meter.js (a js_body_filter: it passes every byte on unchanged) and picks out the last
# `usage` object, whole JSON answer or SSE stream: vLLM's prompt_tokens/completion_tokens
# (chat, completions), or input_tokens/output_tokens (responses, messages). Each field's last
# value wins: a stream with continuous usage counts up to its final chunk. A `"usage":` inside a
# generated text cannot match: JSON escapes its quotes (\"usage\"). The chunks are scanned with
# the last METER_KEEP characters of the previous one in front, so a usage object split between
# two chunks is found whole. Then the request's line in USAGE_LOG (log_format gpuserve_usage):
# the deployment, the key's id and its tenant (never the key), the status and the two counts,
# or "-" where the answer had no usage (an error, or a stream whose client did not ask for
# usage: docs/monitoring.md, "Tokens per key"). gpuserve.meter's mtail program reads that log.
# Only requests with a key id are logged: on a serving host behind a gateway, the gateway's
# requests carry no key (gpuserve/layers/gateway.py strips it) and are metered at the gateway.
METER_JS = f"{NGINX_DIR}/meter.js"
USAGE_LOG = layout.USAGE_LOG   # Debian's logrotate rotates /var/log/nginx/*.log
METER_KEEP = 4096
METER_JS_TEXT = """\
// Managed by gpuserve (pyinfra): the engine's token usage per request (gpuserve/proxy_conf.py)
var USAGE = /"usage"\\s*:\\s*\\{(?:[^{}]|\\{[^{}]*\\})*\\}/g;
var PROMPT = /"(?:prompt_tokens|input_tokens)"\\s*:\\s*(\\d+)/;
var COMPLETION = /"(?:completion_tokens|output_tokens)"\\s*:\\s*(\\d+)/;
var tail = '';   // per request: njs gives each request its own copy of the module

function usage(r, data, flags) {
    r.sendBuffer(data, flags);
    var text = tail + data, end = 0, m, p, c;
    USAGE.lastIndex = 0;
    while ((m = USAGE.exec(text)) !== null) {
        p = PROMPT.exec(m[0]);
        c = COMPLETION.exec(m[0]);
        if (p) {
            r.variables.gpuserve_prompt_tokens = p[1];
        }
        if (c) {
            r.variables.gpuserve_completion_tokens = c[1];
        }
        end = USAGE.lastIndex;
    }
    tail = text.slice(Math.max(end, text.length - KEEP));
}

export default {usage};
""".replace("KEEP", str(METER_KEEP))


def common_conf() -> str:
    """http-level settings shared by every deployment (COMMON_CONF; templates/nginx-common.conf.j2)."""
    return templating.render("nginx-common.conf.j2", limits_js=LIMITS_JS, meter_js=METER_JS)


def tls_conf(cert: str, key: str) -> str:
    """TLS settings included by every gpuserve server block (TLS 1.2 ECDHE+AEAD only, and 1.3;
    templates/nginx-tls.conf.j2)."""
    return templating.render("nginx-tls.conf.j2", cert=cert, key=key, ciphers=TLS_CIPHERS)


# nginx's idle upstream connections close after this, before the engine's own idle timeout: vLLM's
# uvicorn closes a keep-alive connection idle for VLLM_HTTP_TIMEOUT_KEEP_ALIVE (vllm/envs.py, 5 s
# by default; vllm/entrypoints/launchers/api_server/entry.py passes it as timeout_keep_alive);
# nginx's default is 60 s, so it could send a request on a connection the engine was closing
UPSTREAM_IDLE_S = 4
ENGINE_IDLE_TIMEOUT_S = 5


def server_conf(*, deployment: str, bind: str, port: int, server_names: Sequence[str],
                engine_host: str, engine_port: int, drain_flag: str, read_timeout_s: int,
                operator_networks: Sequence[str], limits: ProxyLimits,
                gateways: Sequence[str] = (), admin_routes: bool = True, tenants_http: str = "",
                tenants_server: str = "", tenant_conns: Sequence[tuple[str, int]] = ()) -> str:
    """The front of one deployment (conf.d/gpuserve-<deployment>.conf; templates/nginx-site.conf.j2).
    /health is open; the client routes (CLIENT_ROUTES) need a client or operator key; the
    monitoring routes (MONITOR_ROUTES) an operator key or a peer in ``operator_networks``; every
    other route an operator key. Per-key limits count client keys by id; a prompt route goes
    through limits.js (the message count), then to the named location that proxies it. With
    ``gateways`` (the addresses of the fleet's gateways, docs/gateway.md) the client routes
    answer only them and operator keys: the client's key was checked once, at the gateway; from
    anywhere else a client key gets 403. The per-address limit does not count the gateways (they
    carry the whole fleet's traffic). ``admin_routes=False``: no route but /health and the client
    routes is proxied, for any key (the gateway's front: smg's admin API stays on its loopback).
    ``tenants_http``/``tenants_server``: gpuserve.tenants' lines, at http and server level;
    ``tenant_conns``: its connection limits (zone, limit), in the server and in every location
    with a connection limit of its own (nginx inherits none into such a location). Every
    proxying block sets all the proxy headers (a block that sets any inherits none), so the engine
    logs the peer nginx saw, never an X-Forwarded-For a client sent."""
    return templating.render(
        "nginx-site.conf.j2", deployment=deployment, v=var(deployment), nginx_dir=NGINX_DIR,
        listen=host_port(bind, port), server_names=server_names, engine=host_port(engine_host, engine_port),
        drain_flag=drain_flag, read_timeout_s=read_timeout_s, operator_networks=operator_networks,
        limits=limits, gateways=gateways, admin_routes=admin_routes, tenants_http=tenants_http,
        tenants_server=tenants_server, tenant_conns=tenant_conns, client_routes=CLIENT_ROUTES,
        monitor_routes=MONITOR_ROUTES, usage_log=USAGE_LOG, upstream_idle_s=UPSTREAM_IDLE_S,
        upstream_auth=f"{NGINX_DIR}/{deployment}.upstream-auth")


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
