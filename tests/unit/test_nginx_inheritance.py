"""Every limit and header a server block sets holds in each of its locations, as nginx reads them.

nginx inherits an array directive (limit_conn, limit_req, add_header, proxy_set_header) into a
block only when that block sets none of its own. A location that adds one connection limit of its
own therefore drops every connection limit of its server: the prompt routes' fair share
(`proxy_prompt_conn_per_key`) once silently lifted the per-address, per-key and per-tenant
connection limits on exactly the routes that cost the engine most. This checks the principle,
not the case: each rendered site (tests/unit/layers/test_rendered_files.py's cases) is parsed by nginx's
own configuration parser (crossplane), and each block that sets any of these directives must
keep everything its parent had in effect.
"""

from __future__ import annotations

import pytest

import crossplane

from gpuserve import proxy_conf

from tests.unit.layers.test_rendered_files import _sites

ARRAY_DIRECTIVES = ("limit_conn", "limit_req", "add_header", "proxy_set_header")


def _parse(text: str, tmp_path) -> list[dict]:
    path = tmp_path / "site.conf"
    path.write_text(text)
    parsed = crossplane.parse(str(path), single=True, check_ctx=False, check_args=False, comments=False)
    assert parsed["status"] == "ok", parsed["errors"]
    return parsed["config"][0]["parsed"]


def _own(block: list[dict], name: str) -> set[tuple[str, ...]]:
    return {tuple(d["args"]) for d in block if d["directive"] == name}


def _dropped(block: list[dict], inherited: dict[str, set], where: str) -> list[str]:
    """What a child block of ``block`` loses of its parent's array directives, recursively."""
    effective = {}
    for name in ARRAY_DIRECTIVES:
        own = _own(block, name)
        effective[name] = own if own else inherited.get(name, set())
    out = []
    for d in block:
        if "block" not in d:
            continue
        child = f"{where} > {d['directive']} {' '.join(d['args'])}".rstrip()
        for name in ARRAY_DIRECTIVES:
            own = _own(d["block"], name)
            lost = effective[name] - own if own else set()
            out += [f"{child}: sets its own {name} and so drops `{name} {' '.join(a)}`" for a in sorted(lost)]
        out += _dropped(d["block"], effective, child)
    return out


SITES = {name: text for name, text in _sites().items() if "server {" in text}


@pytest.mark.parametrize("name", sorted(SITES))
def test_no_location_drops_a_limit_or_header_of_its_server(name, tmp_path):
    parsed = _parse(SITES[name], tmp_path)
    servers = [d for d in parsed if d["directive"] == "server"]
    assert servers, f"{name}: no server block"
    assert _dropped(parsed, {}, name) == []


def test_the_check_finds_a_location_that_drops_a_limit(tmp_path):
    """The check itself: a location with a limit_conn of its own and not its server's."""
    parsed = _parse("server {\n  limit_conn a 5;\n  location / {\n    limit_conn b 2;\n  }\n}\n", tmp_path)
    assert _dropped(parsed, {}, "x") == [
        "x > server > location /: sets its own limit_conn and so drops `limit_conn a 5`"]


def test_every_site_case_is_checked():
    names = set(SITES)
    assert {"sites/gpuserve-minimax.conf", "sites/gpuserve-minimax-tenants.conf",
            "sites/gpuserve-minimax-gateways.conf", "sites/gpuserve-gateway.conf"} <= names


@pytest.mark.parametrize("name", sorted(SITES))
def test_every_upstream_closes_idle_connections_before_the_engine_does(name, tmp_path):
    """nginx keeps idle upstream connections 60 s by default; the engine's uvicorn closes them
    after 5 s (vLLM's VLLM_HTTP_TIMEOUT_KEEP_ALIVE). A request nginx sends on a connection the
    engine is closing fails, and a POST is not retried: the client gets 502."""
    upstreams = [d for d in _parse(SITES[name], tmp_path) if d["directive"] == "upstream"]
    if "exporters" not in name:   # the exporters' front proxies without an upstream block
        assert upstreams, name
    for u in upstreams:
        own = {d["directive"]: d["args"] for d in u["block"]}
        if "keepalive" not in own:
            continue
        assert "keepalive_timeout" in own, f"{name}: upstream {u['args']} keeps idle connections 60 s"
        seconds = int(own["keepalive_timeout"][0].rstrip("s"))
        assert seconds < proxy_conf.ENGINE_IDLE_TIMEOUT_S, (name, seconds)
