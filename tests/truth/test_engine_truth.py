"""Engine truth: the pins group_data ships, installed from PyPI the way the engine layer does,
then the engine's own native modules and configuration objects (issue 10).

    GPUSERVE_TRUTH_DIR=/var/tmp/gpuserve-truth .venv/bin/pytest -m truth tests/truth -v -s

Needs root (unshare -m), a C compiler, PyPI, ~40 GB under GPUSERVE_TRUTH_DIR and, the first time,
20+ minutes; later runs reuse uv's cache there. What it cannot do here (no GPU, no driver, no
ROCm index) is listed per recipe in docs/recipes.md ("Engine pins").
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from gpuserve import engine as eng
from gpuserve import recipes
from gpuserve.engine_flags import TORCH

from . import harness as h
from . import minimax_tiny

pytestmark = [
    pytest.mark.truth,
    pytest.mark.skipif(os.geteuid() != 0 or shutil.which("unshare") is None
                       or shutil.which("cc") is None, reason="needs root, unshare and cc"),
]
HERE = Path(__file__).parent
GPU = {"hopper_x8": ("H200", 8), "blackwell_x4": ("GB200", 4)}


@pytest.fixture(scope="session")
def checkpoint() -> Path:
    return minimax_tiny.write(h.TRUTH / "tiny-minimax-m3")


def spec_of(recipe: str, engine: str, **data) -> eng.EngineSpec:
    settings, problems = h.settings(recipe, engine, **data)
    assert settings is not None, problems
    # `vllm download-kernels` builds vLLM's whole CLI, whose serve parser asks the platform for a
    # device type: it cannot run without a GPU (and fetches FlashInfer's kernels from FlashInfer's
    # own index, not PyPI). Left to the GPU smoke; everything else is the layer's script.
    return dataclasses.replace(eng.spec_for(settings), kernels=False)


_built: dict[str, tuple[eng.EngineSpec, subprocess.CompletedProcess]] = {}


def built(recipe: str, engine: str) -> tuple[eng.EngineSpec, subprocess.CompletedProcess]:
    spec = spec_of(recipe, engine)
    if spec.id not in _built:
        _built[spec.id] = (spec, h.build(spec))
        done = _built[spec.id][1]
        print(f"\n[build {spec.requirement} torch_backend={spec.torch_backend}] rc={done.returncode}")
        print("\n".join(line for line in (done.stdout + done.stderr).splitlines()
                        if line.startswith("gpuserve:"))[-4000:])
    return _built[spec.id]


def rendered_yaml(recipe: str, engine: str, **data) -> Path:
    settings, problems = h.settings(recipe, engine, **data)
    assert settings is not None, problems
    path = h.TRUTH / f"{recipe}-{engine}.serve.yaml"
    path.write_text(settings.serve_configs["minimax"].config_yaml())
    return path


# --- install exactly as the engine layer does, then load every native module ------------------
@pytest.mark.parametrize("recipe,engine", [("hopper_x8", "vllm"), ("hopper_x8", "sglang"),
                                           ("blackwell_x4", "sglang")])
def test_the_pinned_engine_installs_from_pypi_and_every_native_module_loads(recipe, engine):
    spec, done = built(recipe, engine)
    out = done.stdout + done.stderr
    venv = h.venv_of(spec)
    assert (venv / "bin" / "python").exists(), out[-3000:]
    failures = re.findall(r"native module (\S+) cannot load: it needs (\S+)", out)
    # no NVIDIA driver here: the build's own check fails, naming exactly that library
    assert {lib for _, lib in failures} <= {"libcuda.so.1"}, failures
    stub = h.libcuda_stub(venv)
    again = h.run_python(venv, eng.verify_code(spec), env={"LD_LIBRARY_PATH": str(stub)})
    print(again.stdout[-1500:])
    assert again.returncode == 0, again.stdout[-3000:] + again.stderr[-3000:]
    assert "0 failed" in again.stdout


def test_the_engines_torch_is_the_cuda_major_the_plan_pins():
    spec, _ = built("hopper_x8", "vllm")
    got = h.run_python(h.venv_of(spec), "import torch; print(torch.__version__, torch.version.cuda)")
    version, cuda = got.stdout.split()[-2:]  # e.g. "2.14.0+cu130 13.0"
    assert (version.split("+")[0], cuda.split(".")[0]) == TORCH[("vllm", "0.33.0")], got.stdout
    assert spec.torch_backend == "cu13" + "0" and not spec.torch_backend_arg


def test_the_pypi_wheel_is_a_cuda_build_so_amd_hosts_need_an_index():
    spec, _ = built("hopper_x8", "vllm")
    ext = next((h.venv_of(spec) / "lib").glob("python3*/site-packages/vllm/_C_stable_libtorch*.so"))
    needed = subprocess.run(["readelf", "-d", str(ext)], capture_output=True, text=True).stdout
    assert "libcudart.so.13" in needed  # what an MI355X host would install from PyPI
    _, problems = h.settings("mi355x_x4", "vllm")
    assert any("CUDA build" in p and "engine_index" in p for p in problems), problems


def test_vllm_0_34_does_not_install_from_pypi():
    """blackwell_x4's pin: uv, as the layer runs it, cannot resolve flashinfer-python==0.7.3."""
    spec = spec_of("blackwell_x4", "vllm", engine_index="https://unused.invalid/simple")
    spec = dataclasses.replace(spec, index=None)  # PyPI only, as the plan refuses
    done = h.build(spec)
    print((done.stdout + done.stderr)[-800:])
    assert done.returncode != 0
    assert "flashinfer-python==0.7.3" in done.stdout + done.stderr


# --- the engine's own configuration objects --------------------------------------------------
def probe_vllm(venv: Path, recipe: str, checkpoint: Path, **data) -> dict:
    gpu, count = GPU[recipe]
    out = h.TRUTH / f"probe-{recipe}-{venv.name}.json"
    done = h.run_python(venv, HERE / "probe_vllm.py", str(checkpoint),
                        str(rendered_yaml(recipe, "vllm", **data)), gpu, str(out), str(count),
                        env={"LD_LIBRARY_PATH": str(h.libcuda_stub(venv))})
    print("\n".join(line for line in done.stdout.splitlines() if line.startswith("STEP"))[:6000])
    assert out.exists(), done.stdout[-2000:] + done.stderr[-3000:]
    return json.loads(out.read_text())


def test_hopper_vllm_builds_its_whole_engine_config(checkpoint):
    spec, _ = built("hopper_x8", "vllm")
    steps = probe_vllm(h.venv_of(spec), "hopper_x8", checkpoint)
    assert all(v == "OK" for v in steps.values()), steps


def test_blackwell_recipe_on_vllm_0_33_fails_on_flashinfer_ts(checkpoint):
    spec, _ = built("hopper_x8", "vllm")  # the vllm 0.33.0 venv
    steps = probe_vllm(h.venv_of(spec), "blackwell_x4", checkpoint,
                       engine_index="https://unused.invalid/simple")
    spec_step = steps["SpeculativeConfig (create_speculative_config)"]
    assert "Unknown attention backend: 'FLASHINFER_TS'" in spec_step, steps


def test_blackwell_recipe_on_vllm_0_34_builds_its_whole_engine_config(checkpoint):
    """vLLM 0.34.0 cannot install from PyPI (above); to read its config objects the suite installs
    it with uv's --override flashinfer-python==0.7.4 (the next release PyPI has) into a venv
    of its own. A stand-in for the index the plan asks for, not a way to serve."""
    venv = h.override_venv("vllm==0.34.0", ["flashinfer-python==0.7.4"])
    steps = probe_vllm(venv, "blackwell_x4", checkpoint,
                       engine_index="https://unused.invalid/simple")
    assert all(v == "OK" for v in steps.values()), steps


@pytest.mark.parametrize("recipe", ["hopper_x8", "blackwell_x4"])
def test_sglang_server_args_from_the_rendered_config(recipe, checkpoint):
    spec, _ = built(recipe, "sglang")
    out = h.TRUTH / f"probe-{recipe}-sglang.json"
    done = h.run_python(h.venv_of(spec), HERE / "probe_sglang.py", str(checkpoint),
                        str(rendered_yaml(recipe, "sglang")), str(out),
                        env={"LD_LIBRARY_PATH": str(h.libcuda_stub(h.venv_of(spec)))})
    print("\n".join(line for line in done.stdout.splitlines() if line.startswith(("STEP", "  page"))))
    steps = json.loads(out.read_text())
    first = "ServerArgs (prepare_server_args: parser, --config, __post_init__ checks)"
    assert steps[first] == "OK", steps
