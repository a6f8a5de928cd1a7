"""One plan per host (issue 11): validation's settings become one immutable HostPlan per host."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from gpuserve import engine, layout, proxy_conf, release_files
from gpuserve.config import validate_inventory
from gpuserve.host_plan import plan_host, with_engine

from .helpers import SHA, key_file, make_inventory

ROOT = Path(__file__).resolve().parents[2]
TWO = {"deployments": {"a": {"serve_flags": {"tensor-parallel-size": 4}},
                       "b": {"serve_port": 8001, "proxy_port": 8444,
                             "serve_flags": {"tensor-parallel-size": 4}}}}


def _settings(**kw):
    return validate_inventory(make_inventory(**kw))


def test_the_plan_is_immutable():
    s = _settings(group_data=TWO)["h1"]
    plan = with_engine(plan_host(s), engine.spec_for(s))
    with pytest.raises(dataclasses.FrozenInstanceError):
        plan.engine = None
    with pytest.raises(dataclasses.FrozenInstanceError):
        plan.deployments["a"].serve_port = 9000
    with pytest.raises(TypeError):
        plan.deployments["c"] = plan.deployments["a"]
    with pytest.raises(TypeError):
        plan.releases["a"] = plan.releases["b"]
    assert isinstance(plan.secrets, tuple)


def test_ports_and_paths_are_gpuserve_layouts():
    s = _settings(group_data=TWO)["h1"]
    plan = plan_host(s)
    assert list(plan.deployments) == ["a", "b"]
    for dep in s.deployments:
        p = plan.deployment(dep.name)
        assert (p.unit, p.deployment_dir, p.releases_dir, p.current_link, p.previous_link) == (
            layout.unit_name(dep.name), layout.deployment_dir(dep.name), layout.releases_dir(dep.name),
            layout.current_link(dep.name), layout.previous_link(dep.name))
        assert p.cache_dir == layout.cache_dir(s.nvme_path, dep.name)
        assert p.checkpoint_dir == layout.checkpoint_dir(s.nvme_path, s.model_repo, SHA)
        assert p.secrets_env == release_files.secrets_env_path(dep.name)
        assert (p.serve_host, p.serve_port) == (dep.serve_host, dep.serve_port)
        assert p.health_url == f"http://127.0.0.1:{dep.serve_port}/health"
        assert p.proxy_port is None   # no proxy in front
    assert plan.deployment("b").serve_port == 8001


def test_the_engine_spec_and_releases_come_with_the_engine_only():
    s = _settings(group_data=TWO)["h1"]
    bare = plan_host(s)
    assert bare.engine is None and dict(bare.releases) == {}
    with pytest.raises(LookupError, match="no engine spec"):
        bare.release("a")
    spec = engine.spec_for(s)
    plan = with_engine(bare, spec)
    assert plan.engine == spec and plan.settings is s and plan.serve_configs is s.serve_configs
    assert plan.recipe.name == s.recipe
    want = release_files.desired_releases(s, spec)
    assert {n: r.id for n, r in plan.releases.items()} == {n: r.id for n, r in want.items()}
    assert plan.release_dir("a") == layout.release_dir("a", want["a"].id)


def test_the_secrets_to_install_name_sources_and_destinations_never_contents(tmp_path):
    keys = key_file(tmp_path)
    ops = tmp_path / "ops"
    ops.write_text("o" * 32 + "\n")
    ops.chmod(0o600)
    behind = _settings(fleet={"model_revision": SHA, "proxy": True, "api_keys_file": str(keys),
                              "operator_keys_file": str(ops)})["h1"]
    got = {(x.deployment, x.kind): (x.source, x.dest) for x in plan_host(behind).secrets}
    assert got == {
        ("minimax", "engine-key"): (None, "/etc/gpuserve/minimax/secrets.env"),   # made on the host
        ("minimax", "client-keys"): (str(keys), f"{proxy_conf.NGINX_DIR}/minimax.keys"),
        ("minimax", "operator-keys"): (str(ops), f"{proxy_conf.NGINX_DIR}/minimax.operator-keys"),
    }
    assert plan_host(behind).deployment("minimax").proxy_port == behind.deployment("minimax").proxy_port
    # no proxy: the engine's key file goes to the engine's secrets env, its path as given
    direct = _settings(host_data={"api_keys_file": "secrets/prod-api-keys"})["h1"]
    assert [(x.kind, x.source, x.dest) for x in plan_host(direct).secrets] == [
        ("engine-key", "secrets/prod-api-keys", "/etc/gpuserve/minimax/secrets.env")]
    assert "k" * 32 not in repr(plan_host(behind))
