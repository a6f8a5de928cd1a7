"""Tenants: groups of client keys with per-key limits of their own, counted in their own nginx
zones, logged by id (issue 29)."""

from __future__ import annotations

import pytest

from gpuserve import proxy_conf, tenants
from gpuserve.secret_sources import SecretCommand

from .helpers import key_file, make_inventory, problems_of, settings_of

KEY_A = "tenant-a-key-0123456789abcdef0123"


def conf(ts) -> str:
    return proxy_conf.server_conf(
        deployment="minimax", bind="0.0.0.0", port=8443, server_names=["h1"], engine_host="127.0.0.1",
        engine_port=8000, drain_flag="/x.drain", read_timeout_s=600, operator_networks=["127.0.0.1/32"],
        limits=proxy_conf.ProxyLimits(), **tenants.site_args("minimax", ts))


def test_a_tenants_limits_and_keys_from_settings(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    keys = key_file(tmp_path)
    s = settings_of(make_inventory(host_data={
        "proxy": True, "api_keys_file": str(keys), "proxy_rate_per_key": 7,
        "tenants": {"batch": {"keys_command": ["cat", "k"], "rate_per_key": 1, "burst_per_key": 0,
                              "conn_per_key": 2},
                    "chat": {"keys_file": str(keys)}}}))
    batch, chat = s.deployment("minimax").tenants
    assert batch == tenants.Tenant("batch", SecretCommand(("cat", "k"), "tenants.batch.keys_command"),
                                   1, 0, 2)
    # unset limits are the host's proxy_*_per_key
    assert (chat.rate_per_key, chat.burst_per_key, chat.conn_per_key) == (7, 40, 32)


def test_each_tenant_counts_in_its_own_zones_and_the_default_zone_skips_them():
    t = tenants.Tenant("batch", "f", 1, 0, 2)
    text = conf((t,))
    assert "map $gpuserve_minimax_key $gpuserve_minimax_t_batch {\n    ~^c\\-batch\\- $gpuserve_minimax_key;\n" in text
    assert "limit_req_zone $gpuserve_minimax_t_batch zone=gpuserve_minimax_t_batch_rate:1m rate=1r/s;" in text
    assert "    limit_req zone=gpuserve_minimax_t_batch_rate burst=0 nodelay;\n" in text
    assert "    limit_conn gpuserve_minimax_t_batch_conn 2;\n" in text
    # the default per-key zone counts only the ids of api_keys_file's keys (c1, c2, ...)
    assert "    ~^c[0-9] $gpuserve_minimax_key;\n" in text
    entries = tenants.keys_map("batch", [KEY_A])
    assert entries.endswith(" c-batch-1;\n") and KEY_A.replace("-", "\\-") in entries
    # a tenant's id is a client id: it reaches the client routes and gets 403 on the others
    assert "    ~^c 403;\n" in text


@pytest.mark.parametrize("value, path, message", [
    ({"Batch": {"keys_file": "k"}}, "tenants.Batch", "is not a tenant name"),
    ({"batch": {"rate_per_key": 1}}, "tenants.batch.keys_file", "exactly one of keys_file and keys_command"),
    ({"batch": {"keys_command": "pass show x"}}, "tenants.batch.keys_command", "is a string"),
    ({"batch": {"keys_command": ["cat", "k"], "rate_per_key": 0}}, "tenants.batch.rate_per_key",
     "use a whole number from 1 to 100000"),
    ({"batch": {"keys_command": ["cat", "k"], "keys": ["x"]}}, "tenants.batch.keys", "unknown tenant key"),
    ({"batch": {"keys_file": "/no/such/file"}}, None, None),   # only a deploy needs the file
])
def test_bad_tenants_are_refused_naming_the_key(value, path, message):
    inv = make_inventory(host_data={"tenants": value})
    if path is None:
        assert settings_of(inv).deployment("minimax").tenants
        return
    found = problems_of(inv)
    assert any(p.startswith(f"h1: {path} ") and message in p for p in found), found
