"""SGLang behind the proxy and the gateway (issue 27): the proxy authenticates the clients' keys,
the engine serves keyless on loopback behind the engine guard, and the gateway reaches it only
through the proxy. SGLang cannot take a key from a file (only argv or its --config, where gpuserve
never writes secrets), so without the proxy an api_keys_file is still refused.

SGLang's own parser reads the same rendered config in tests/truth/test_sglang_behind_proxy.py
(it needs the engine's venv, which the truth suite builds)."""

from __future__ import annotations

import yaml
from pyinfra.api import Inventory

from gpuserve import engine_guard, gateway, layout
from gpuserve.config import serving_workers, validate_inventory
from gpuserve.host_plan import plan_host
from gpuserve.values import is_loopback

from .helpers import HARDWARE, SHA, key_file, make_inventory, one_problem


def _fleet(tmp_path, **fleet) -> Inventory:
    keys = key_file(tmp_path)
    return Inventory(
        ([("h1", {"ssh_hostname": "10.0.0.1"}), ("gw1", {"ssh_hostname": "10.0.0.9"})], {}),
        hopper_x8=(["h1"], dict(HARDWARE["hopper_x8"])),
        gateway=(["gw1"], {}),
        fleet=(["h1", "gw1"], {"model_revision": SHA, "engine": "sglang", "torch_backend": "cu130",
                               "proxy": True, "api_keys_file": str(keys), **fleet}),
    )


def test_sglang_behind_the_proxy_and_the_gateway_serves_keyless_on_loopback_behind_the_guard(tmp_path):
    settings = validate_inventory(_fleet(tmp_path))
    h1 = settings["h1"]
    config = h1.serve_configs["minimax"]
    assert config.engine == "sglang"
    rendered = yaml.safe_load(config.config_yaml())
    assert is_loopback(rendered["host"])
    assert not any("key" in flag for flag in rendered), rendered   # no api-key, in the config
    assert config.secret_env == {} and "key" not in " ".join(config.argv("/etc/serve.yaml"))
    # the proxy holds the clients' keys; the engine gets no key and no secret to inject
    plan = plan_host(h1)
    assert plan.secret("minimax", "client-keys").source == h1.deployments[0].api_keys_file
    assert plan.secret("minimax", "engine-key") is None
    # the guard: only root, the service user and nginx open the engine's port, nothing from outside
    from gpuserve.layers.engine_guard import guard_of
    guard = guard_of(h1)
    assert guard.network and h1.deployments[0].serve_port in guard.ports
    assert set(guard.users) == {"root", layout.SERVICE_USER, engine_guard.PROXY_USER}
    # the gateway sends to the host's TLS proxy, never to the engine's port
    (worker,) = serving_workers(_fleet(tmp_path), settings)
    assert worker.url == f"https://10.0.0.1:{h1.deployments[0].proxy_port}"
    assert worker.id == gateway.worker_id("h1", "minimax")


def test_sglang_with_keys_but_without_the_proxy_is_refused():
    msg = one_problem(make_inventory(fleet={"model_revision": SHA, "engine": "sglang", "torch_backend": "cu130",
                                            "api_keys_file": "secrets/k"}))
    assert "with engine sglang the keys are checked by the proxy alone" in msg
    assert "proxy False" in msg


def test_sglang_behind_the_proxy_but_listening_beyond_loopback_is_refused(tmp_path):
    keys = key_file(tmp_path)
    msg = one_problem(make_inventory(fleet={
        "model_revision": SHA, "engine": "sglang", "torch_backend": "cu130", "proxy": True,
        "api_keys_file": str(keys), "serve_host": "0.0.0.0", "trusted_network": True}))
    assert "serve_host '0.0.0.0'" in msg
