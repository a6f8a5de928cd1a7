"""One plan per host (issue 11): validation's settings become one immutable HostPlan per host; a
pyinfra run adds the engine spec and the releases once per host, and every deploy reads them."""

from __future__ import annotations

import ast
import dataclasses
import json
import runpy
from pathlib import Path
from types import SimpleNamespace

import pytest
from pyinfra.context import ctx_host, ctx_state

from gpuserve import engine, layout, proxy_conf, release_files
from gpuserve.config import validate_inventory
from gpuserve.host_plan import HostPlan, SecretInstall, plan_host, with_engine

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


# --- a simulated serve deploy: the real deploys/*.py and layer context, the layers stubbed ------

class _Calls:
    def __init__(self, monkeypatch):
        self.spec_for = 0
        self.desired = 0
        real_spec, real_desired = engine.spec_for, release_files.desired_releases

        def spec_for(*a, **kw):
            self.spec_for += 1
            return real_spec(*a, **kw)

        def desired(*a, **kw):
            self.desired += 1
            return real_desired(*a, **kw)

        monkeypatch.setattr(engine, "spec_for", spec_for)
        monkeypatch.setattr(release_files, "desired_releases", desired)


def _stub_layers(monkeypatch, seen: dict):
    from gpuserve import rollout
    from gpuserve.layers import (base, engine as engine_layer, gateway, gpu_stack, monitoring, packages,
                                 patch, proxy, removal, rollout as rollout_layer, units, watchdog, weights)

    none = lambda *a, **kw: None   # noqa: E731
    for module, names in [(base, ["base_layout", "ordering_point"]), (gateway, ["gateway"]),
                          (gpu_stack, ["gpu_stack", "stack_move", "stack_rollback_move"]),
                          (monitoring, ["node_exporter", "monitor"]), (proxy, ["proxy"]),
                          (watchdog, ["watchdog"]), (weights, ["weights"]),
                          (patch, ["refuse_unfinished_patch"]), (packages, ["early_packages"]),
                          (rollout_layer, ["hold_writer_lock"])]:
        for name in names:
            monkeypatch.setattr(module, name, none)
    monkeypatch.setattr(gpu_stack, "serving", lambda s: False)
    monkeypatch.setattr(monitoring, "monitor_hosts", lambda every: [])
    monkeypatch.setattr(removal, "removal", lambda s: SimpleNamespace(releases=(), proxy_sites=False,
                                                                       drain_flags=()))
    # serve.py starts the venv's build early and waits for it later; upgrade.py does both at once
    for name in ("engine_begin", "engine"):
        monkeypatch.setattr(engine_layer, name, lambda plan: seen.setdefault("engine", []).append(plan.engine))
    monkeypatch.setattr(engine_layer, "engine_wait", none)
    monkeypatch.setattr(units, "service",
                        lambda plan, **kw: seen.setdefault("service", []).append(plan.releases))
    monkeypatch.setattr(units, "service_install", lambda plan: {})
    monkeypatch.setattr(rollout_layer, "deployment_state", lambda plan, name: SimpleNamespace(
        current=None, previous=None, releases=(), interrupted=False,
        url=seen.setdefault("health", []).append(plan.deployment(name).health_url)))
    monkeypatch.setattr(units, "gate_after_reboot",
                        lambda plan, rebooted: seen.setdefault("gate_after_reboot", []).append(plan))
    monkeypatch.setattr(rollout_layer, "add_rollout", none)
    monkeypatch.setattr(rollout, "upgrade_move", none)
    monkeypatch.setattr(rollout, "rollback_move", none)


def _run(state, inventory, host_name: str, deploy: str) -> None:
    with ctx_state.use(state), ctx_host.use(inventory.get_host(host_name)):
        runpy.run_path(str(ROOT / "deploys" / deploy), run_name="__gpuserve_test__")


def test_a_serve_and_upgrade_run_resolve_the_engine_and_the_releases_once_per_host(monkeypatch):
    calls, seen = _Calls(monkeypatch), {}
    _stub_layers(monkeypatch, seen)
    inventory = make_inventory(group_data=TWO, hosts=("h1", "h2"))
    state = SimpleNamespace(inventory=inventory)   # what the layer context reads of pyinfra's state
    for name in ("h1", "h2"):
        _run(state, inventory, name, "serve.py")
    assert (calls.spec_for, calls.desired) == (2, 2)   # once per host
    for name in ("h1", "h2"):
        _run(state, inventory, name, "upgrade.py")
        _run(state, inventory, name, "rollback.py")
    assert (calls.spec_for, calls.desired) == (2, 2)   # the same plans, read again
    plans = state._gpuserve_plans
    h1 = plans[("h1", True)]
    assert isinstance(h1, HostPlan) and plans[("h1", False)].engine is None
    # each deploy got the plan's own engine spec and releases, not copies made again
    assert seen["engine"] == [h1.engine, plans[("h2", True)].engine] * 2
    assert seen["service"][0] is h1.releases and seen["service"][2] is h1.releases
    assert seen["health"][:2] == [h1.deployment("a").health_url, h1.deployment("b").health_url]


def test_a_rollback_or_gpu_stack_run_reads_no_engine_spec(monkeypatch):
    calls, seen = _Calls(monkeypatch), {}
    _stub_layers(monkeypatch, seen)
    inventory = make_inventory(group_data=TWO)
    state = SimpleNamespace(inventory=inventory)
    _run(state, inventory, "h1", "rollback.py")
    _run(state, inventory, "h1", "gpu_stack.py")
    assert (calls.spec_for, calls.desired) == (0, 0)
    assert len(seen["health"]) == 2
    [plan] = seen["gate_after_reboot"]
    assert plan is state._gpuserve_plans[("h1", False)] and plan.engine is None


def test_only_the_plan_resolves_the_engine_spec_and_the_releases():
    """desired_releases is called by gpuserve/host_plan.py alone, spec_for (outside gpuserve/engine.py)
    by the engine layer's resolver alone, which only the layer context calls."""
    callers: dict[str, set[str]] = {"desired_releases": set(), "spec_for": set(), "resolve_engine": set()}
    for path in [*(ROOT / "gpuserve").rglob("*.py"), *(ROOT / "deploys").glob("*.py")]:
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Call):
                func = node.func
                name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", None)
                if name in callers:
                    callers[name].add(str(path.relative_to(ROOT)))
    assert callers == {"desired_releases": {"gpuserve/host_plan.py"},
                       "spec_for": {"gpuserve/layers/engine.py"},
                       "resolve_engine": {"gpuserve/layers/context.py"}}


# --- gpuserve plan and gpuserve status read the same plan, without the engine ----------------

def test_gpuserve_plan_prints_the_plans_ports_paths_and_secrets(monkeypatch, tmp_path):
    from gpuserve import plan as plan_cmd

    calls = _Calls(monkeypatch)
    settings = _settings(group_data=TWO, host_data={"api_keys_file": "secrets/prod-api-keys"})
    [host] = json.loads(plan_cmd.render_plan(settings, "json"))
    want = plan_host(settings["h1"])
    for name, d in want.deployments.items():
        got = host["deployments"][name]
        assert got["ports"] == {"serve": f"{d.serve_host}:{d.serve_port}", "proxy": None}
        assert got["paths"] == {"deployment": d.deployment_dir, "releases": d.releases_dir,
                                "current": d.current_link, "previous": d.previous_link,
                                "secrets_env": d.secrets_env, "cache": d.cache_dir,
                                "checkpoint": d.checkpoint_dir}
    assert host["secrets"] == [{"deployment": x.deployment, "kind": x.kind, "source": x.source,
                                "dest": x.dest} for x in want.secrets] and host["secrets"]
    assert (calls.spec_for, calls.desired) == (0, 0)   # no engine spec: no wheelhouse read


def test_gpuserve_status_asks_each_host_from_its_plan(monkeypatch):
    from gpuserve import status

    calls = _Calls(monkeypatch)
    inv = make_inventory(group_data=TWO)
    monkeypatch.setattr(status, "connect_all", lambda state: [state.activate_host(h) for h in state.inventory])
    monkeypatch.setattr(status, "disconnect_all", lambda state: None)
    got = []
    monkeypatch.setattr(status, "_host_rows", lambda host, plan, *_: got.append(plan) or [])
    status.collect(inv)
    [plan] = got
    assert isinstance(plan, HostPlan) and plan.engine is None and list(plan.deployments) == ["a", "b"]
    assert (calls.spec_for, calls.desired) == (0, 0)


# --- the layers install the plan's secrets ---------------------------------------------------

def test_the_service_layer_installs_the_plans_engine_key(tmp_path, monkeypatch):
    from gpuserve.layers.units import _secrets_content

    keys = key_file(tmp_path)
    behind = _settings(fleet={"model_revision": SHA, "proxy": True, "api_keys_file": str(keys)})["h1"]
    assert _secrets_content(plan_host(behind), "minimax") is None   # made on the host
    assert _secrets_content(plan_host(_settings()["h1"]), "minimax") == ""   # no key configured
    direct = _settings(host_data={"api_keys_file": str(keys)})["h1"]
    assert _secrets_content(plan_host(direct), "minimax") == f"VLLM_API_KEY={'k' * 32}\n"


def test_the_proxy_layer_reads_the_plans_key_files_and_names_the_setting(tmp_path):
    from pyinfra.api.exceptions import OperationError

    from gpuserve.layers.proxy import _read_keys

    keys = key_file(tmp_path)
    plan = plan_host(_settings(fleet={"model_revision": SHA, "proxy": True,
                                      "api_keys_file": str(keys)})["h1"])
    assert _read_keys(plan.secret("minimax", "client-keys"), required=True) == ["k" * 32]
    assert _read_keys(plan.secret("minimax", "operator-keys"), required=False) == []
    keys.unlink()
    inventory = make_inventory()
    with ctx_host.use(inventory.get_host("h1")), \
            pytest.raises(OperationError, match=r"h1: deployments.minimax.api_keys_file .* is missing"):
        _read_keys(plan.secret("minimax", "client-keys"), required=True)


def test_a_tls_front_gets_the_tls_key_of_its_plan(tmp_path):
    from tests.unit.layers.test_patch_roles import _fleet

    from tests.unit.helpers import tls_pair

    crt, key = tls_pair(tmp_path)   # a certificate is read as one (it parses and matches its key)
    tls = {"proxy_tls_cert_file": str(crt), "proxy_tls_key_file": str(key)}
    every = validate_inventory(_fleet(tmp_path, gw=tls))
    assert plan_host(every["gw1"]).secret(None, "tls-key") == SecretInstall(
        None, "tls-key", str(key), f"{proxy_conf.NGINX_DIR}/tls.key", "proxy_tls_key_file")
    assert plan_host(every["h1"]).secret(None, "tls-key") is None   # its own self-signed one
