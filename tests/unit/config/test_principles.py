"""The validator's principles (docs/configuration.md, "How values are checked"): each value is
checked as what it becomes. One section per principle; each test gives a mistake no other test
names and expects the principle to refuse it (and a near miss to pass)."""

from __future__ import annotations

import math
import time

import pytest
from pyinfra.api import Inventory

from gpuserve import values
from gpuserve.config import validate_inventory

from tests.unit.helpers import HARDWARE, SHA, key_file, make_inventory, problems_of, settings_of, tls_pair


def _one(inv) -> str:
    found = problems_of(inv)
    assert len(found) == 1, found
    return found[0]


# --- 1. text: what is shown is what programs compare ------------------------------------------

@pytest.mark.parametrize("key,value,says", [
    ("served_model_name", "minimax\u200b", "U+200B ZERO WIDTH SPACE"),          # invisible
    ("served_model_name", "minimax\u202e", "U+202E RIGHT-TO-LEFT OVERRIDE"),     # bidi override
    ("served_model_name", "ｍｉｎｉｍａｘ", "reads as 'minimax'"),                # full-width letters
    ("served_model_name", "mіnimax", "CYRILLIC SMALL LETTER BYELORUSSIAN-UKRAINIAN I"),  # look-alike
    ("hf_endpoint", "https://hf-mіrror.example", "not ASCII"),
    ("hf_endpoint", "https://hf.example/\u2060mirror", "U+2060 WORD JOINER"),
])
def test_text_is_visible_normal_and_ascii_where_programs_match_it(key, value, says):
    msg = _one(make_inventory(host_data={key: value}))
    assert f"h1: {key} " in msg and says in msg, msg


def test_a_deployment_name_with_a_look_alike_letter_is_refused():
    msg = _one(make_inventory(group_data={"deployments": {"mіnimax": {}}}))   # Cyrillic i
    assert "mіnimax" in msg and "lowercase letters" in msg, msg   # its own check, said once


def test_flag_values_and_env_values_may_be_prose_but_never_invisible():
    assert settings_of(make_inventory(host_data={"serve_env": {"GREETING": "héllo"}}))
    msg = _one(make_inventory(host_data={"serve_env": {"GREETING": "hi\u200d"}}))
    assert "serve_env.GREETING" in msg and "ZERO WIDTH JOINER" in msg, msg


def test_a_control_node_path_may_be_spelled_in_any_script(tmp_path):
    (tmp_path / "clés").mkdir()
    keys = key_file(tmp_path / "clés")
    assert settings_of(make_inventory(host_data={"api_keys_file": str(keys)}))


def test_text_problem_unit():
    assert values.text_problem("vllm-0.32.0", ascii_only=True) is None
    assert values.text_problem("ﬁle", ascii_only=False).startswith("is not in Unicode normal form")
    assert values.text_problem("a\tb", ascii_only=False, multiline=True) is None
    assert "U+0009" in values.text_problem("a\tb", ascii_only=True)


# --- 2. numbers are finite ----------------------------------------------------------------------

@pytest.mark.parametrize("key,value", [("weights_free_margin_gib", math.nan),
                                       ("weights_free_margin_gib", math.inf),
                                       ("gpu_memory_gib", math.nan),
                                       ("serve_flags", {"gpu-memory-utilization": math.nan})])
def test_nan_and_infinity_are_never_a_setting(key, value):
    msg = _one(make_inventory(host_data={key: value}))
    assert "not a finite number" in msg or "is not allowed" in msg, msg
    assert key in msg


# --- 3. units and scale: a value in the neighbouring unit is named as such -----------------------

@pytest.mark.parametrize("key,value,meant", [
    ("canary_error_ratio_max", 5, "did you mean 0.05?"),       # percent for a fraction
    ("gpu_memory_gib", 81920, "did you mean 80?"),             # MiB for GiB
    ("max_model_len", 32, "did you mean 32768?"),              # 32 meant as 32K
    ("drain_s", 5000, "did you mean 5?"),                      # milliseconds for seconds
])
def test_a_value_given_in_the_neighbouring_unit_is_refused_and_named(key, value, meant):
    msg = _one(make_inventory(host_data={key: value}))
    assert meant in msg, msg


def test_no_number_means_unlimited_every_numeric_key_is_bounded():
    from gpuserve import schema
    unbounded = [k.name for k in schema.KEYS
                 if isinstance(k.allowed, (schema.Int, schema.Number)) and k.allowed.hi is None]
    assert unbounded == ["max_num_seqs"], unbounded   # a count of sequences: the engine's own bound
    assert all(k.allowed.lo >= 0 for k in schema.KEYS if isinstance(k.allowed, (schema.Int, schema.Number)))


# --- 4. URLs, as the URL gpuserve builds from them ---------------------------------------------

@pytest.mark.parametrize("url,says", [("https://hf.example/mirror#main", "has a fragment"),
                                      ("https://hf.example/mirror?token_free=1", "has a query")])
def test_a_base_url_gpuserve_appends_paths_to_has_no_fragment_or_query(url, says):
    msg = _one(make_inventory(host_data={"hf_endpoint": url}))
    assert says in msg, msg


def test_a_repository_url_is_checked_as_the_apt_source_it_becomes():
    msg = _one(make_inventory(host_data={"cuda_repo_url": "https://mirror.example/cuda#x"}))
    assert "cuda_repo_url" in msg and "has a fragment" in msg, msg


# --- 5. control-node files are read as what they must be ---------------------------------------

@pytest.mark.parametrize("content,says", [
    ("-----BEGIN PRIVATE KEY-----\nMIIEv" + "A" * 40 + "\n-----END PRIVATE KEY-----\n", "PEM block"),
    ("ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIGx" + "a" * 30 + " ops@laptop\n", "SSH key"),
    ("k" * 32 + " " + "k" * 32 + "\n", "has spaces"),
])
def test_an_api_keys_file_is_a_file_of_keys(tmp_path, content, says):
    f = tmp_path / "keys"
    f.write_text(content)
    f.chmod(0o600)
    msg = _one(make_inventory(host_data={"proxy": True, "api_keys_file": str(f)}))
    assert says in msg, msg


def test_a_tls_certificate_parses_matches_its_key_and_is_current(tmp_path):
    crt, key = tls_pair(tmp_path, "good")
    ok = {"proxy": True, "api_keys_file": str(key_file(tmp_path)), "proxy_tls_cert_file": str(crt),
          "proxy_tls_key_file": str(key)}
    assert settings_of(make_inventory(host_data=ok))
    _, other_key = tls_pair(tmp_path, "other")
    assert "is not the private key of" in _one(make_inventory(host_data={**ok, "proxy_tls_key_file": str(other_key)}))
    old_crt, old_key = tls_pair(tmp_path, "old", not_before_days=-60, not_after_days=-1)
    assert "expired on" in _one(make_inventory(host_data={**ok, "proxy_tls_cert_file": str(old_crt),
                                                          "proxy_tls_key_file": str(old_key)}))
    junk = tmp_path / "junk.crt"
    junk.write_text("not a certificate\n")
    assert "is not a PEM certificate" in _one(make_inventory(host_data={**ok, "proxy_tls_cert_file": str(junk)}))
    assert values.pem_problems(crt, key, time.time()) == []


# --- 6. across hosts and deployments: one name per thing, one owner per port and unit ------------

def test_the_same_machine_under_two_names_is_refused(tmp_path):
    inv = Inventory(([("gpu-a", {"ssh_hostname": "10.0.0.5"}), ("gpu-b", {"ssh_hostname": "10.0.0.5"})], {}),
                    cpu=(["gpu-a", "gpu-b"], dict(HARDWARE["cpu"])),
                    fleet=(["gpu-a", "gpu-b"], {"model_revision": SHA}))
    msg = _one(inv)
    assert msg.startswith("gpu-b: ssh_hostname") and "is also host 'gpu-a'" in msg, msg
    other_port = Inventory(([("gpu-a", {"ssh_hostname": "10.0.0.5"}),
                             ("gpu-b", {"ssh_hostname": "10.0.0.5", "ssh_port": 2222})], {}),
                           cpu=(["gpu-a", "gpu-b"], dict(HARDWARE["cpu"])),
                           fleet=(["gpu-a", "gpu-b"], {"model_revision": SHA}))
    assert len(validate_inventory(other_port)) == 2    # two machines behind one address (NAT)


@pytest.mark.parametrize("data,says", [
    ({"serve_port": 9100}, "the node exporter"),
    ({"serve_port": 9400}, "the DCGM exporter"),
])
def test_a_port_gpuserve_itself_listens_on_is_refused(data, says):
    msg = _one(make_inventory(host_data=data))
    assert says in msg and "serve_port" in msg, msg


@pytest.mark.parametrize("name", ["engine-guard"])
def test_a_deployment_whose_unit_is_one_of_gpuserves_own_is_refused(name):
    msg = _one(make_inventory(group_data={"deployments": {name: {}}}))
    assert f"gpuserve-{name}.service is one gpuserve runs itself" in msg, msg


# --- 7. settings that only make sense together ---------------------------------------------------

def test_a_tls_certificate_for_a_front_the_host_does_not_run_is_refused(tmp_path):
    crt, key = tls_pair(tmp_path)
    msg = _one(make_inventory(host_data={"proxy_tls_cert_file": str(crt), "proxy_tls_key_file": str(key)}))
    assert "a TLS certificate for a front this host does not run" in msg, msg
