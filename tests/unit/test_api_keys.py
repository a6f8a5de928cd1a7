"""API keys come from a control-node file into the secret env, exactly one key."""

from __future__ import annotations

import pytest

from gpuserve.api_keys import read_api_keys, secret_env
from gpuserve.config import ConfigError

from .helpers import make_inventory, settings_of


def config_with_keys_file(path: str):
    return settings_of(make_inventory(host_data={"api_keys_file": path})).serve_configs["minimax"]


def test_one_key_with_comments_and_blank_lines(tmp_path):
    (tmp_path / "keys").write_text("# rotated 2026-10\n\n  sk-live-one  \n")
    config = config_with_keys_file("keys")
    assert secret_env(config, base_dir=tmp_path) == {"VLLM_API_KEY": "sk-live-one"}
    assert read_api_keys(tmp_path / "keys") == ["sk-live-one"]


def test_no_keys_file_no_secret_env():
    assert secret_env(settings_of(make_inventory()).serve_configs["minimax"]) == {}


@pytest.mark.parametrize("text, message", [
    ("a\nb\n", "holds 2 keys; VLLM_API_KEY takes exactly one"),
    ("# nothing\n", "holds 0 keys"),
    ("two words\n", "contains whitespace"),
])
def test_bad_key_files(tmp_path, text, message):
    (tmp_path / "keys").write_text(text)
    with pytest.raises(ConfigError) as caught:
        secret_env(config_with_keys_file("keys"), base_dir=tmp_path)
    assert message in str(caught.value)
    assert str(caught.value).splitlines()[1].startswith(
        f"  - h1: deployments.minimax.api_keys_file (from file {tmp_path / 'keys'}): ")


def test_missing_key_file(tmp_path):
    with pytest.raises(ConfigError, match="cannot read the key file"):
        secret_env(config_with_keys_file("absent"), base_dir=tmp_path)


def test_missing_key_file_only_warns_at_plan_time():
    s = settings_of(make_inventory(host_data={"api_keys_file": "secrets/not-here"}))
    assert s.warnings == ("deployments.minimax: api_keys_file secrets/not-here does not exist on "
                          "this control node yet; a deploy refuses to start without it",)


def test_a_relative_key_file_is_read_from_where_pyinfra_runs(tmp_path, monkeypatch):
    # the prod example's api_keys_file = "secrets/prod-api-keys" was read as
    # secrets/secrets/prod-api-keys when the proxy was off
    from gpuserve.host_plan import plan_host
    from gpuserve.layers.units import _secrets_content

    (tmp_path / "secrets").mkdir()
    key = "k" * 32
    (tmp_path / "secrets" / "prod-api-keys").write_text(key + "\n")
    (tmp_path / "secrets" / "prod-api-keys").chmod(0o600)
    monkeypatch.chdir(tmp_path)
    settings = settings_of(make_inventory(host_data={"api_keys_file": "secrets/prod-api-keys"}))
    dep = settings.deployment("minimax")
    assert _secrets_content(plan_host(settings), dep.name) == f"VLLM_API_KEY={key}\n"
