"""Engine truth: the pins group_data ships, installed from PyPI the way the engine layer does,
then the engine's own native modules and configuration objects (issue 10).

    GPUSERVE_TRUTH_DIR=/var/tmp/gpuserve-truth .venv/bin/pytest -m truth tests/truth -v -s

On the hosts' Python, 3.12 (harness.host_python: a CPython 3.12 of this machine, as uv cannot
download its managed one here).

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
# blackwell_x4 on vLLM 0.34.0: the documented way out of the missing flashinfer-python==0.7.3
# (gpuserve.engine_pins.TESTED_OVERRIDES), built by the layer's own script like any pin
OVERRIDE = {"engine_overrides": ["flashinfer-python==0.7.4"]}


def built(recipe: str, engine: str, **data) -> tuple[eng.EngineSpec, subprocess.CompletedProcess]:
    spec = spec_of(recipe, engine, **data)
    if spec.id not in _built:
        _built[spec.id] = (spec, h.build(spec))
        done = _built[spec.id][1]
        print(f"\n[{recipe} x {engine}: built {spec.requirement} python {spec.python} "
              f"torch_backend={spec.torch_backend} constraints={list(spec.constraints)} "
              f"overrides={list(spec.overrides)} -> {spec.id}] rc={done.returncode}")
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
@pytest.mark.parametrize("recipe,engine,data", [
    ("hopper_x8", "vllm", {}), ("hopper_x8", "sglang", {}), ("blackwell_x4", "sglang", {}),
    ("blackwell_x4", "vllm", OVERRIDE)])
def test_the_pinned_engine_installs_from_pypi_and_every_native_module_loads(recipe, engine, data):
    """The layer's build: no file owned by two distributions, the kernel stack imports and
    every native module of the engine and of that stack loads (driver stubbed)."""
    spec, done = built(recipe, engine, **data)
    out = done.stdout + done.stderr
    venv = h.venv_of(spec)
    assert (venv / "bin" / "python").exists(), out[-3000:]
    assert "is owned by two distributions" in out and "file owned by two" not in out, out[-3000:]
    failures = re.findall(r"native module (\S+) cannot load: it needs (\S+)", out)
    # no NVIDIA driver here: the build's own check fails, naming exactly that library
    assert {lib for _, lib in failures} <= {"libcuda.so.1"}, failures
    stub = h.libcuda_stub(venv)
    again = h.run_python(venv, eng.verify_code(spec), env={"LD_LIBRARY_PATH": str(stub)})
    print(again.stdout[-1500:])
    assert again.returncode == 0, again.stdout[-3000:] + again.stderr[-3000:]
    assert "0 failed" in again.stdout
    if engine == "vllm" or engine == "sglang":
        assert "kernel package flashinfer imports" in again.stdout
        assert "kernel package cuda.bindings imports" in again.stdout


def test_the_build_check_fails_on_the_cuda_python_clash_put_back():
    """Issue 25's broken venv, made on purpose: hopper_x8's pin without the constraint and with
    cuda-python forced to the monolithic 12.6.2.post1 (which ships cuda/bindings/ itself)."""
    spec = dataclasses.replace(spec_of("hopper_x8", "vllm"), constraints=(),
                               overrides=("cuda-python==12.6.2.post1",))
    done = h.build(spec)
    out = done.stdout + done.stderr
    print("\n".join(line for line in out.splitlines() if line.startswith("gpuserve:"))[-2500:])
    assert done.returncode != 0
    assert not h.host_path(spec.env_dir).exists()  # never renamed onto the final path
    assert "cuda/bindings/" in out and "cuda_python-12.6.2.post1" in out
    assert "owned by more than one distribution" in out
    subprocess.run(["rm", "-rf", str(h.host_path(spec.partial_dir))], check=True)


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
    """vLLM 0.34.0 cannot install from PyPI alone (above); with the documented override
    engine_overrides = ["flashinfer-python==0.7.4"] (the next release PyPI has) the layer's own
    build installs it, and the rendered config builds vLLM's whole engine config."""
    spec, done = built("blackwell_x4", "vllm", **OVERRIDE)
    venv = h.venv_of(spec)
    got = h.run_python(venv, "import flashinfer, importlib.metadata as md; "
                             "print(md.version('flashinfer-python'))",
                       env={"LD_LIBRARY_PATH": str(h.libcuda_stub(venv))})
    assert got.stdout.split()[-1:] == ["0.7.4"], got.stdout + got.stderr[-2000:]
    steps = probe_vllm(venv, "blackwell_x4", checkpoint, **OVERRIDE)
    assert all(v == "OK" for v in steps.values()), steps


@pytest.fixture(scope="session")
def quantized_checkpoint() -> Path:
    """The tiny checkpoint with the real model's quantization_config shape (mxfp8, NVFP4
    experts) and the DSpark draft fields SGLang reads: SGLang's MiniMax-M3 overrides key on it."""
    return minimax_tiny.write(h.TRUTH / "tiny-minimax-m3-nvfp4", quantized=True)


def probe_sglang(recipe: str, checkpoint: Path, serve_yaml: Path) -> dict:
    spec, _ = built(recipe, "sglang")
    venv = h.venv_of(spec)
    gpu, count = GPU[recipe]
    out = h.TRUTH / f"probe-{serve_yaml.stem}-sglang.json"
    done = h.run_python(venv, HERE / "probe_sglang.py", str(checkpoint), str(serve_yaml), gpu,
                        str(count), str(out), env={"LD_LIBRARY_PATH": str(h.libcuda_stub(venv))})
    print("\n".join(line for line in done.stdout.splitlines() if line.startswith(("STEP", "  "))))
    assert out.exists(), done.stdout[-2000:] + done.stderr[-3000:]
    return json.loads(out.read_text())


@pytest.mark.parametrize("recipe", ["hopper_x8", "blackwell_x4"])
def test_sglang_resolves_and_checks_the_rendered_config(recipe, quantized_checkpoint):
    """What `sglang serve --model-type llm` does first: prepare_server_args, resolve_once (the
    MiniMax-M3 overrides, MegaMoE's token budget, DSpark), then check_server_args."""
    steps = probe_sglang(recipe, quantized_checkpoint, rendered_yaml(recipe, "sglang"))
    assert all(v == "OK" for v in steps.values()), steps
    assert len(steps) == 4, steps  # platform, parse, resolve_once, check_server_args


def test_sglang_on_blackwell_refuses_its_default_chunked_prefill(quantized_checkpoint):
    """Why the recipe sets chunked-prefill-size 8192: without it SGLang picks 16384 on a GB200,
    more than MegaMoE's per-rank buffer (8192), and resolve_once refuses."""
    yaml = rendered_yaml("blackwell_x4", "sglang")
    text = yaml.read_text()
    assert "chunked-prefill-size: 8192\n" in text
    unfixed = h.TRUTH / "blackwell_x4-sglang-unfixed.serve.yaml"
    unfixed.write_text(text.replace("chunked-prefill-size: 8192\n", ""))
    steps = probe_sglang("blackwell_x4", quantized_checkpoint, unfixed)
    resolve = next(v for k, v in steps.items() if k.startswith("ServerArgs.resolve_once"))
    assert "with MegaMoE requires SGLANG_OPT_DEEPGEMM_MEGA_MOE_NUM_MAX_TOKENS_PER_RANK" in resolve
    assert "chunked_prefill_size=16384" in resolve
