"""Secrets from a command on the control node (issue 29): every ``*_file`` secret setting has a
``*_command`` twin; the output is held in memory only, run once per process, never in a message.

The age tests use Debian's age (dev/bootstrap.sh installs it)."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest

from gpuserve import schema, secret_sources
from gpuserve.api_keys import secret_env
from gpuserve.config import ConfigError, validate_inventory
from gpuserve.host_plan import SecretInstall, plan_host
from gpuserve.secret_sources import SECRET_SETTINGS, SecretCommand

from .helpers import make_inventory, settings_of

KEY = "age-held-client-key-0123456789abcdef"
needs_age = pytest.mark.skipif(shutil.which("age") is None, reason="age is not installed "
                               "(dev/bootstrap.sh installs it)")


@pytest.fixture(autouse=True)
def _fresh_cache():
    secret_sources.forget()
    yield
    secret_sources.forget()


def age_encrypted(directory: Path, plaintext: str) -> list[str]:
    """An age identity and ``keys.age`` in ``directory``: the plaintext goes to age through a pipe,
    never into a file. Returns the command that decrypts it."""
    identity = directory / "identity.txt"
    subprocess.run(["age-keygen", "-o", str(identity)], check=True, capture_output=True)
    recipient = subprocess.run(["age-keygen", "-y", str(identity)], check=True, capture_output=True,
                               text=True).stdout.strip()
    subprocess.run(["age", "-r", recipient, "-o", str(directory / "keys.age")],
                   input=plaintext.encode(), check=True)
    return ["age", "-d", "-i", str(identity), str(directory / "keys.age")]


def files_holding(directory: Path, text: str) -> list[Path]:
    return [p for p in directory.rglob("*") if p.is_file() and text.encode() in p.read_bytes()]


def test_every_file_secret_setting_has_a_command_twin_in_the_schema():
    for file_key, twin in SECRET_SETTINGS.items():
        assert schema.BY_NAME[twin].kind == "list"
        assert schema.BY_NAME[twin].scope == schema.BY_NAME[file_key].scope
    # and the plan's secrets name no setting without one
    kinds = {"api_keys_file", "operator_keys_file", "scrape_keys_file", "proxy_tls_key_file"}
    assert kinds == set(SECRET_SETTINGS)


@needs_age
def test_age_decrypted_keys_reach_the_engine_env_and_no_file(tmp_path, monkeypatch):
    command = age_encrypted(tmp_path, KEY + "\n")
    monkeypatch.chdir(tmp_path)
    inv = make_inventory(host_data={"api_keys_command": command})
    settings = validate_inventory(inv, deploying=True)["h1"]
    source = settings.deployment("minimax").api_keys_file
    assert source == SecretCommand(tuple(command), "api_keys_command")
    assert secret_env(settings.serve_configs["minimax"]) == {"VLLM_API_KEY": KEY}
    from gpuserve.layers.units import _secrets_content
    assert _secrets_content(plan_host(settings), "minimax") == f"VLLM_API_KEY={KEY}\n"
    assert files_holding(tmp_path, KEY) == []


def test_a_command_runs_once_per_process_however_many_hosts_use_it(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "k").write_text(KEY + "\n")
    # counts its runs in a file; prints the key
    command = ["sh", "-c", "echo run >> runs; cat k"]
    inv = make_inventory(host_data={"api_keys_command": command}, hosts=("h1", "h2", "h3"))
    settings = validate_inventory(inv, deploying=True)
    for s in settings.values():
        assert secret_env(s.serve_configs["minimax"]) == {"VLLM_API_KEY": KEY}
    assert (tmp_path / "runs").read_text() == "run\n"


def test_plan_time_never_runs_the_command(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    settings = settings_of(make_inventory(host_data={"api_keys_command": ["sh", "-c", "echo run >> runs"]}))
    assert isinstance(settings.deployment("minimax").api_keys_file, SecretCommand)
    assert not (tmp_path / "runs").exists()


def test_the_plan_shows_the_command_never_its_output(tmp_path, monkeypatch):
    from gpuserve.plan import _json

    monkeypatch.chdir(tmp_path)
    (tmp_path / "k").write_text(KEY + "\n")
    inv = make_inventory(host_data={"api_keys_command": ["cat", "k"], "proxy": True})
    plan = plan_host(validate_inventory(inv, deploying=True)["h1"])
    text = json.dumps(_json(plan, profile=False))
    assert "the output of `cat k` (api_keys_command)" in text
    assert KEY not in text


@pytest.mark.parametrize("data, message", [
    ({"api_keys_command": "age -d keys.age"}, "is a string; give the command as a list of words"),
    ({"api_keys_command": []}, "is not a command: use a list of words"),
    ({"api_keys_command": ["age", ""]}, "is not a command"),
    ({"api_keys_command": ["cat", "k"], "api_keys_file": "k"},
     "set api_keys_file or api_keys_command, not both"),
    ({"operator_keys_command": ["no-such-program-gpuserve"]},
     "'no-such-program-gpuserve' is not a program on this control node"),
])
def test_bad_commands_are_refused_naming_the_setting(tmp_path, monkeypatch, data, message):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "k").write_text(KEY + "\n")
    (tmp_path / "k").chmod(0o600)
    with pytest.raises(ConfigError) as caught:
        validate_inventory(make_inventory(host_data=data), deploying=True)
    text = str(caught.value)
    assert message in text and "h1:" in text
    assert "_command" in text


def test_a_missing_program_only_warns_at_plan_time():
    s = settings_of(make_inventory(host_data={"api_keys_command": ["no-such-program-gpuserve", "x"]}))
    assert s.warnings == ("api_keys_command: 'no-such-program-gpuserve' is not a program on this "
                          "control node (not on PATH); a deploy refuses to start without it",)


def test_a_failing_command_is_refused_without_showing_what_it_printed(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "k").write_text(KEY + "\n")
    command = ["sh", "-c", "cat k; exit 3"]
    with pytest.raises(ConfigError) as caught:
        validate_inventory(make_inventory(host_data={"api_keys_command": command}), deploying=True)
    text = str(caught.value)
    assert "api_keys_command" in text and "failed (exit status 3" in text
    assert KEY not in text


def test_a_short_key_from_a_command_is_refused_without_the_key(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ConfigError) as caught:
        validate_inventory(make_inventory(host_data={"operator_keys_command": ["echo", "short-key"]}),
                           deploying=True)
    text = str(caught.value)
    assert "key 1 (counting keys, not lines) is shorter than 24" in text
    assert "short-key" not in text.replace("`echo short-key`", "")


def test_a_tls_key_from_a_command(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "tls.crt").write_text("cert\n")
    (tmp_path / "tls.key").write_text("-----BEGIN PRIVATE KEY-----\nabc\n")
    inv = make_inventory(host_data={"proxy": True, "api_keys_command": ["cat", "tls.key"],
                                    "proxy_tls_cert_file": str(tmp_path / "tls.crt"),
                                    "proxy_tls_key_command": ["cat", "tls.key"]})
    plan = plan_host(validate_inventory(inv, deploying=False)["h1"])
    tls = plan.secret(None, "tls-key")
    assert tls.source == SecretCommand(("cat", "tls.key"), "proxy_tls_key_command")
    assert secret_sources.read_text(tls.source).startswith("-----BEGIN PRIVATE KEY-----")
    # a key command without the certificate is refused like a key file without it
    with pytest.raises(ConfigError, match="set both proxy_tls_cert_file and proxy_tls_key_file"):
        validate_inventory(make_inventory(host_data={"proxy": True, "api_keys_command": ["cat", "k"],
                                                     "proxy_tls_key_command": ["cat", "tls.key"]}))


def test_the_proxy_reads_client_keys_from_a_command(tmp_path, monkeypatch):
    from gpuserve.layers.proxy import _read_keys

    monkeypatch.chdir(tmp_path)
    (tmp_path / "k").write_text(f"# two keys\n{KEY}\n{KEY[::-1]}\n")
    source = SecretCommand(("cat", "k"), "api_keys_command")
    secret = SecretInstall("minimax", "client-keys", source, "/etc/gpuserve/nginx/minimax.keys",
                           "api_keys_file")
    assert _read_keys(secret, required=True) == [KEY, KEY[::-1]]


def test_a_command_is_never_taken_for_a_path():
    with pytest.raises(TypeError, match="is a command, not a file"):
        Path(SecretCommand(("cat", "k"), "api_keys_command"))
