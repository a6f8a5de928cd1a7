"""Classes of bad input a new user tried that the validator accepted, or crashed on.

Each is refused at plan time naming the host, where the value came from, the key and what is
allowed; none ends in a traceback. (Every case here was accepted, or raised, before.)
"""

from __future__ import annotations

import pytest
from pyinfra.api import Inventory

from gpuserve import config
from gpuserve.config import ConfigError, validate_inventory

from tests.unit.helpers import HARDWARE, SHA, make_inventory, one_problem, problems_of, settings_of

RELEASE = "vllm-0.33.0-0123abcd-0123456789"


# -- regexes anchored at both ends: a trailing newline is not part of a valid value ----------
@pytest.mark.parametrize("key, value", [
    ("rollback_to", RELEASE + "\n"),
    ("nvidia_driver_version", "580.95.05\n"),
    ("cuda_toolkit", "13-0\n"),
    ("rocm_version", "7.2\n"),
])
def test_a_trailing_newline_is_refused(key, value):
    msg = one_problem(make_inventory(host_data={key: value}))
    assert msg.startswith(f"h1: {key} (from host data): ")


def test_the_same_values_without_the_newline_pass():
    settings_of(make_inventory(host_data={"rollback_to": RELEASE, "nvidia_driver_version": "580.95.05",
                                          "cuda_toolkit": "13-0"}))


# -- secrets inside URLs ------------------------------------------------------------------------
@pytest.mark.parametrize("key", ["hf_endpoint", "cuda_repo_url", "engine_index"])
@pytest.mark.parametrize("url", ["https://user:hunter2-secret@mirror.example/x",
                                 "https://hunter2-secret@mirror.example/x",
                                 "file://user:hunter2-secret@localhost/srv/wheels"])
def test_credentials_in_a_url_are_refused_and_not_echoed(key, url):
    msg = one_problem(make_inventory(host_data={key: url}))
    if url.startswith("file:") and key != "engine_index":
        assert msg.startswith(f"h1: {key} (from host data): ") and "is not an http(s) URL" in msg
        return
    assert msg.startswith(f"h1: {key} (from host data): holds credentials (user:password@)")
    assert "hunter2" not in msg


@pytest.mark.parametrize("key", ["hf_endpoint", "rocm_repo_url", "engine_index"])
@pytest.mark.parametrize("query, names", [("?token=hunter2-secret", "token"),
                                          ("?a=1&API_KEY=hunter2-secret&sig=x", "API_KEY, sig"),
                                          ("?X-Amz-Signature=hunter2-secret", "X-Amz-Signature"),
                                          ("?X-Amz-Security-Token=hunter2-secret", "X-Amz-Security-Token")])
def test_a_credential_in_a_url_query_is_refused_and_not_echoed(key, query, names):
    msg = one_problem(make_inventory(host_data={key: "https://mirror.example/simple" + query}))
    assert msg.startswith(f"h1: {key} (from host data): holds a credential in its query "
                          f"({names}=...)"), msg
    assert "hunter2" not in msg


@pytest.mark.parametrize("url", ["https://mirror.example/x?token=hunter2 secret",
                                 "ftp://user:hunter2@mirror.example/x", "https://user:hunter2@mirror example/"])
def test_a_value_that_is_no_url_is_refused_without_echoing_its_credential(url):
    msg = one_problem(make_inventory(host_data={"hf_endpoint": url}))
    assert "is not an http(s) URL" in msg and "hunter2" not in msg, msg


def test_a_plain_mirror_url_passes():
    s = settings_of(make_inventory(host_data={"hf_endpoint": "https://mirror.example:8443/hf",
                                              "engine_index": "https://w.example/simple?v=2"}))
    assert s.hf_endpoint == "https://mirror.example:8443/hf"
    assert s.engine_index == "https://w.example/simple?v=2"


@pytest.mark.parametrize("index", ["file:///srv/wheels", "file://localhost/srv/wheels",
                                   "http://10.0.0.5:8080/simple"])
def test_an_engine_index_may_be_a_file_url(index):
    assert settings_of(make_inventory(host_data={"engine_index": index})).engine_index == index


@pytest.mark.parametrize("index", ["wheels.example/simple", "ftp://w.example/simple",
                                   "https://w.example/simple\n", "file://", 3])
def test_an_engine_index_that_is_no_url_is_refused(index):
    msg = one_problem(make_inventory(host_data={"engine_index": index}))
    assert msg == (f"h1: engine_index (from host data): {index!r} is not an http(s) URL or a "
                   "file:// URL")


# -- a host in two hardware groups ---------------------------------------------------------------
def test_a_host_in_two_hardware_groups_is_refused():
    inv = Inventory(
        ([("h1", {})], {}),
        hopper_x8=(["h1"], dict(HARDWARE["hopper_x8"])),
        blackwell_x4=(["h1"], dict(HARDWARE["blackwell_x4"])),
        fleet=(["h1"], {"model_revision": SHA}),
    )
    found = problems_of(inv)
    assert any(p.startswith("h1: gpu_model (from groups hopper_x8, blackwell_x4): the host is in "
                            "the hardware groups hopper_x8, blackwell_x4; put it in exactly one")
               for p in found), found


# -- parallel sizes that are zero, negative or strings --------------------------------------------
@pytest.mark.parametrize("value", [0, -8, "8", 2.0, True])
@pytest.mark.parametrize("flag", ["tensor-parallel-size", "data_parallel_size", "--pipeline-parallel-size"])
def test_a_parallel_size_must_be_a_whole_number_of_at_least_one(flag, value):
    msg = one_problem(make_inventory(host_data={"serve_flags": {flag: value}}))
    assert msg.startswith(f"h1: serve_flags.{flag} (from host data): {value!r} is not allowed; "
                          "a parallel size is a whole number >= 1")


def test_sglang_parallel_sizes_are_checked_too():
    msg = one_problem(make_inventory(fleet={"model_revision": SHA, "engine": "sglang",
                                            "torch_backend": "cu130",
                                            "serve_flags": {"tp-size": -8}}))
    assert msg.startswith("h1: serve_flags.tp-size (from group 'fleet'): -8 is not allowed")


# -- address clashes compared as addresses, not strings --------------------------------------------
@pytest.mark.parametrize("a, b", [("127.0.0.1", "localhost"), ("::1", "localhost"),
                                  ("::ffff:127.0.0.1", "127.0.0.1"), ("::", "127.0.0.1")])
def test_the_same_address_written_two_ways_clashes(a, b):
    # trusted_network: '::' beyond loopback without a proxy is refused on its own otherwise
    inv = make_inventory(group="cpu", host_data={"trusted_network": True, "deployments": {
        "one": {"serve_host": a}, "two": {"serve_host": b}}})
    msg = one_problem(inv)
    assert "deployments.two.serve_port" in msg and "clashes with deployment 'one'" in msg


def test_two_loopback_addresses_do_not_clash():
    settings_of(make_inventory(group="cpu", host_data={"deployments": {
        "one": {"serve_host": "127.0.0.1"}, "two": {"serve_host": "127.0.0.2"}}}))


# -- host paths ---------------------------------------------------------------------------------
@pytest.mark.parametrize("path, text", [
    ("/mnt/../etc", "is not a normalized directory"),
    ("/mnt/nvme disk", "has characters a unit file or env file cannot hold safely"),
    ("/mnt/nv\nme", "has characters a unit file or env file cannot hold safely"),
    ("/mnt/nvme/", "is not a normalized directory"),
    ("/etc/gpuserve-data", "is inside the system directory /etc"),
    ("mnt/nvme", "is not an absolute path"),
])
def test_an_nvme_path_that_would_land_elsewhere_is_refused(path, text):
    msg = one_problem(make_inventory(host_data={"nvme_path": path}))
    assert msg.startswith("h1: nvme_path (from host data): ") and text in msg, msg


# -- deployment names that collide once normalised -------------------------------------------------
def test_deployment_names_equal_up_to_dash_and_underscore_are_refused():
    inv = make_inventory(group="cpu", host_data={"deployments": {
        "a-b": {}, "a_b": {"serve_port": 8001, "proxy_port": 8444}}})
    msg = one_problem(inv)
    assert msg.startswith("h1: deployments.a_b (from host data): 'a_b' and 'a-b' are the same name")


# -- serve_env ----------------------------------------------------------------------------------
@pytest.mark.parametrize("value", ["$PATH:/opt/bin", "`id`", 'a"b', "c:\\dir"])
def test_env_values_systemd_would_not_read_literally_are_refused(value):
    msg = one_problem(make_inventory(host_data={"serve_env": {"MY_VAR": value}}))
    assert msg.startswith("h1: serve_env.MY_VAR (from host data): ")
    assert "does not expand $VARIABLES" in msg


def test_cuda_visible_devices_naming_a_gpu_the_host_lacks():
    inv = make_inventory(host_data={"serve_env": {"CUDA_VISIBLE_DEVICES": "0,1,2,3,4,5,6,9"}})
    msg = one_problem(inv)
    assert msg.startswith("h1: serve_env.CUDA_VISIBLE_DEVICES (from host data): GPU 9 does not "
                          "exist: the host has gpu_count 8")


def test_gpu_sets_that_overlap_between_deployments():
    inv = make_inventory(group_data={"deployments": {
        "a": {"serve_flags": {"tensor-parallel-size": 4},
              "serve_env": {"CUDA_VISIBLE_DEVICES": "0,1,2,3"}},
        "b": {"serve_port": 8001, "serve_flags": {"tensor-parallel-size": 4},
              "serve_env": {"CUDA_VISIBLE_DEVICES": "2,3,4,5"}}}})
    found = problems_of(inv)
    assert found == [
        "h1: deployments.b.serve_env.CUDA_VISIBLE_DEVICES (from group 'hopper_x8'): GPU 2 is "
        "already used by deployment 'a'; give each deployment its own GPUs",
        "h1: deployments.b.serve_env.CUDA_VISIBLE_DEVICES (from group 'hopper_x8'): GPU 3 is "
        "already used by deployment 'a'; give each deployment its own GPUs",
    ]


def test_an_explicit_gpu_set_beside_the_automatic_one_is_checked():
    # b takes GPUs 4-7 automatically; a names 4-7 itself
    inv = make_inventory(group_data={"deployments": {
        "a": {"serve_flags": {"tensor-parallel-size": 4},
              "serve_env": {"CUDA_VISIBLE_DEVICES": "4,5,6,7"}},
        "b": {"serve_port": 8001, "serve_flags": {"tensor-parallel-size": 4}}}})
    assert any("GPU 4 is already used by deployment 'a'" in p for p in problems_of(inv))


# -- on AMD hosts: HIP_VISIBLE_DEVICES and ROCR_VISIBLE_DEVICES too ----------------------------------
def amd(env: dict, second: dict | None = None):
    """An MI355X x4 host; with ``second``, two deployments of 2 GPUs each (the second's env)."""
    if second is None:
        return make_inventory(group="mi355x_x4", host_data={"serve_env": env})
    return make_inventory(group="mi355x_x4", host_data={"deployments": {
        "a": {"serve_flags": {"tensor-parallel-size": 2}, "serve_env": env},
        "b": {"serve_port": 8001, "serve_flags": {"tensor-parallel-size": 2}, "serve_env": second}}})


def test_hip_visible_devices_that_differ_from_the_deployments_gpus_are_refused():
    # vLLM's ROCm platform raises at import when HIP_ and CUDA_VISIBLE_DEVICES differ
    msg = one_problem(amd({"HIP_VISIBLE_DEVICES": "0,1,2,9"}))
    assert msg == ("h1: serve_env.HIP_VISIBLE_DEVICES (from host data): '0,1,2,9' differs from "
                   "CUDA_VISIBLE_DEVICES '0,1,2,3' (the deployment's GPUs), and vLLM refuses to start "
                   "when they differ; on ROCm they mean the same: pick the GPUs with "
                   "CUDA_VISIBLE_DEVICES only")


def test_rocr_visible_devices_naming_a_gpu_the_host_lacks():
    msg = one_problem(amd({"ROCR_VISIBLE_DEVICES": "0,1,2,3,9"}))
    assert msg.startswith("h1: serve_env.ROCR_VISIBLE_DEVICES (from host data): GPU 9 does not "
                          "exist: the host has gpu_count 4")


def test_rocr_visible_devices_leaving_fewer_gpus_than_the_deployment_picks():
    found = problems_of(amd({"ROCR_VISIBLE_DEVICES": "7"}))
    assert found == [
        "h1: serve_env.ROCR_VISIBLE_DEVICES (from host data): leaves 1 GPU visible ('7'), and "
        "CUDA_VISIBLE_DEVICES '0,1,2,3' picks GPU 1, 2, 3 of them (counted from 0)",
        "h1: serve_env.ROCR_VISIBLE_DEVICES (from host data): GPU 7 does not exist: the host has "
        "gpu_count 4 (GPUs 0-3, from group 'mi355x_x4')"]


def test_rocr_visible_devices_count_as_the_host_gpus_between_deployments():
    # b sees physical GPUs 1,2 as 0,1: GPU 1 is a's (automatic 0,1)
    found = problems_of(amd({}, {"ROCR_VISIBLE_DEVICES": "1,2", "CUDA_VISIBLE_DEVICES": "0,1"}))
    assert found == ["h1: deployments.b.serve_env.ROCR_VISIBLE_DEVICES (from host data): GPU 1 is "
                     "already used by deployment 'a'; give each deployment its own GPUs"]


@pytest.mark.parametrize("env, second", [
    ({"HIP_VISIBLE_DEVICES": "0,1,2,3"}, None),
    ({"ROCR_VISIBLE_DEVICES": "3,2,1,0"}, None),
    ({}, {"ROCR_VISIBLE_DEVICES": "2,3", "CUDA_VISIBLE_DEVICES": "0,1"}),
])
def test_amd_gpu_sets_that_fit_pass(env, second):
    settings_of(amd(env, second))


# -- warnings that could change what a host serves ------------------------------------------------
def test_a_missing_key_file_is_an_error_when_deploying(tmp_path):
    inv = make_inventory(host_data={"api_keys_file": str(tmp_path / "nope")})
    with pytest.raises(ConfigError) as caught:
        validate_inventory(inv, deploying=True)
    (msg,) = [str(p) for p in caught.value.problems]
    assert msg.startswith("h1: api_keys_file (from host data): ")
    assert "does not exist on this control node; create it" in msg


@pytest.mark.parametrize("content, mode, text", [
    ("", 0o600, "holds no key"),
    ("# only a comment\n\n", 0o600, "holds no key"),
    ("short-key\n", 0o600, "key 1 (counting keys, not lines) is shorter than 24 characters"),
    ("k" * 40 + "\n", 0o644, "is readable by others (mode 0644); `chmod 600"),
    ("k" * 40 + "\n", 0o640, "is readable by others (mode 0640)"),
])
def test_key_files_that_are_empty_short_or_readable_by_others(tmp_path, content, mode, text):
    keys = tmp_path / "keys"
    keys.write_text(content)
    keys.chmod(mode)
    msg = one_problem(make_inventory(host_data={"api_keys_file": str(keys)}))
    assert msg.startswith("h1: api_keys_file (from host data): ") and text in msg, msg
    assert "short-key" not in msg  # never the key itself


def test_a_private_file_of_long_keys_passes(tmp_path):
    keys = tmp_path / "keys"
    keys.write_text("# client A\n" + "a" * 32 + "\n")
    keys.chmod(0o600)
    settings_of(make_inventory(host_data={"api_keys_file": str(keys)}))


# -- a list or a mapping where one name goes ---------------------------------------------------------
@pytest.mark.parametrize("value", [["H200"], {"model": "H200"}, {"H200"}])
def test_a_gpu_model_that_is_a_list_or_mapping_names_its_key(value):
    msg = one_problem(make_inventory(host_data={"gpu_model": value}))
    assert msg == (f"h1: gpu_model (from host data): {value!r} is not allowed; gpu_model is one GPU "
                   "model's name (a string), one of H100, H200, B200, GB200, MI355X, MI350X, cpu")


@pytest.mark.parametrize("group", ["monitor", "gateway"])
def test_a_gpu_model_list_on_a_role_host_names_its_key(group):
    found = problems_of(make_inventory(group=group, host_data={"gpu_model": ["H200"]}))
    assert any(p.startswith("h1: gpu_model (from host data): unknown GPU model ['H200']")
               for p in found), found


# -- never a traceback; every host listed -----------------------------------------------------------
def test_an_unforeseen_failure_names_its_host_and_keeps_the_others(monkeypatch):
    real = config._hardware

    def explode(c):
        if c.name == "h1":
            raise TypeError("unsupported operand")
        return real(c)

    monkeypatch.setattr(config, "_hardware", explode)
    inv = make_inventory(hosts=("h1", "h2"), host_data={"serve_port": 1})
    found = problems_of(inv)
    assert found[0].startswith("h1: ? (from its data): validation failed on a value gpuserve did "
                               "not expect (TypeError: unsupported operand)")
    assert any(p.startswith("h2: serve_port (from host data)") for p in found)
