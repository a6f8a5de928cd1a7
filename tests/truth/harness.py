"""The engine-truth suite's machinery: build an engine venv exactly as the engine layer would,
on this CPU machine, without writing the real /opt.

- settings: the group_data a GPU host gets (recipe x engine), loaded through gpuserve's own
  validation, with only what this machine forces changed: the hosts' Python is uv's managed
  CPython 3.12 (python_version's default), which uv downloads from GitHub, out of reach here; so
  python_downloads = never with a CPython 3.12 of this machine first on PATH (``host_python``:
  $GPUSERVE_TRUTH_PYTHON, python3.12 on PATH, /usr/bin, pyenv's), the same minor version;
- build: ``gpuserve.engine.uv_install_script`` (uv from its PyPI wheel) then
  ``gpuserve.engine.build_script``, run as root under ``unshare -m`` with /opt/gpuserve and
  /var/log bind-mounted onto folders under ``TRUTH`` (/var/tmp/gpuserve-truth);
- driver stand-in: the CUDA extensions link libcuda.so.1 (the NVIDIA driver, never in a wheel).
  There is no driver here, so after the real build has failed on exactly that, a stub
  libcuda.so.1 that exports every ``cu*`` symbol the venv's extensions import (each returns
  CUDA_ERROR_NO_DEVICE) is compiled, and the same check runs again: every other library
  (libcudart.so.13, libnvrtc.so.13, libtorch ...) must then come from the venv itself.
"""

from __future__ import annotations

import glob
import hashlib
import json
import os
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

from pyinfra.api import Inventory

from gpuserve import engine as eng
from gpuserve.config import HostSettings, check_host

TRUTH = Path(os.environ.get("GPUSERVE_TRUTH_DIR", "/var/tmp/gpuserve-truth"))
OPT = TRUTH / "opt"  # /opt/gpuserve inside the namespace
LOGS = TRUTH / "log"  # /var/log inside the namespace
UV_WHEELS = TRUTH / "uvwheel"
REPO = Path(__file__).resolve().parents[2]
SHA = "0123456789abcdef0123456789abcdef01234567"
HARDWARE = {
    "hopper_x8": {"gpu_model": "H200", "gpu_count": 8, "nvswitch": True},
    "blackwell_x4": {"gpu_model": "GB200", "gpu_count": 4, "nvswitch": True},
    "mi355x_x4": {"gpu_model": "MI355X", "gpu_count": 4, "nvswitch": False},
}


def group_data(name: str) -> dict:
    """A group_data file's keys, as pyinfra reads them (module-level names)."""
    ns: dict = {}
    exec(compile((REPO / "group_data" / f"{name}.py").read_text(), name, "exec"), ns)
    return {k: v for k, v in ns.items() if not k.startswith("_")}


PYTHON = "3.12"  # the hosts' (gpuserve.schema python_version default)


def host_python(version: str = PYTHON) -> Path:
    """A working ``python<version>`` of this machine (a pyenv shim of another version fails)."""
    candidates = [os.environ.get("GPUSERVE_TRUTH_PYTHON"), shutil.which(f"python{version}"),
                  f"/usr/bin/python{version}",
                  *sorted(glob.glob(os.path.expanduser(f"~/.pyenv/versions/{version}.*/bin/python{version}")))]
    for c in candidates:
        if c and os.path.exists(c) and subprocess.run(
                [c, "-c", f"import sys; assert sys.version.startswith('{version}.')"],
                capture_output=True).returncode == 0:
            return Path(c)
    raise RuntimeError(f"no working python{version} here: set GPUSERVE_TRUTH_PYTHON")


def path_env() -> dict[str, str]:
    """PATH with ``host_python``'s folder first: uv (python_downloads = never) finds it there."""
    return {"PATH": f"{host_python().parent}:{os.environ.get('PATH', '')}"}


def settings(recipe: str, engine: str, **data) -> tuple[HostSettings | None, list[str]]:
    """The settings group_data gives a host of ``recipe`` (plus ``data``), and the plan's problems."""
    base = {**group_data("all"), "model_revision": SHA, "python_version": PYTHON,
            "python_downloads": "never", "engine": engine}
    groups = {recipe: ([recipe], {**group_data(recipe), **HARDWARE[recipe]})}
    inv = Inventory(([recipe], base), override_data=data, **groups)
    host = inv.get_host(recipe)
    found, problems = check_host(host)
    return found, [str(p) for p in problems]


def uv_wheel(version: str = eng.UV_VERSION) -> Path:
    UV_WHEELS.mkdir(parents=True, exist_ok=True)
    found = sorted(UV_WHEELS.glob(f"uv-{version}-*manylinux*x86_64*.whl"))
    if not found:
        subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "-q", "-d",
                        str(UV_WHEELS), "--only-binary=:all:", f"uv=={version}"], check=True)
        found = sorted(UV_WHEELS.glob(f"uv-{version}-*x86_64*.whl"))
    return found[0]


def in_namespace(script: str, env: dict[str, str] | None = None,
                 timeout: int = 3600) -> subprocess.CompletedProcess:
    """Run ``script`` with /opt/gpuserve and /var/log mapped under TRUTH (mount namespace)."""
    for d in (OPT, LOGS):
        d.mkdir(parents=True, exist_ok=True)
    setup = "\n".join([
        "set -eu",
        "mount --make-rprivate /",
        "mount -t tmpfs gpuserve-truth /opt",
        "mkdir -p /opt/gpuserve",
        f"mount --bind {shlex.quote(str(OPT))} /opt/gpuserve",
        f"mount --bind {shlex.quote(str(LOGS))} /var/log",
    ])
    wrapped = f"{setup}\nsh -c {shlex.quote(script)}"
    return subprocess.run(["unshare", "-m", "sh", "-c", wrapped], capture_output=True, text=True,
                          env={**os.environ, **path_env(), **(env or {})}, timeout=timeout)


def install_uv() -> str:
    wheel = uv_wheel()
    digest = hashlib.sha256(wheel.read_bytes()).hexdigest()
    for d in (OPT / "bin",):
        d.mkdir(parents=True, exist_ok=True)
    done = in_namespace(eng.uv_install_script(eng.UV_VERSION, str(wheel), digest))
    assert done.returncode == 0, done.stdout + done.stderr
    return eng.uv_path(eng.UV_VERSION)


def build(spec: eng.EngineSpec, rebuild: bool = False) -> subprocess.CompletedProcess:
    """The engine layer's build script for ``spec``, as it runs on a host."""
    uv = install_uv()
    final = OPT / "envs" / spec.id
    if rebuild and final.exists():
        subprocess.run(["rm", "-rf", str(final)], check=True)
    return in_namespace(eng.build_script(spec, uv, None))


def host_path(path: str) -> Path:
    """Where a host path under /opt/gpuserve lies on this machine."""
    return OPT / Path(path).relative_to("/opt/gpuserve")


def venv_of(spec: eng.EngineSpec) -> Path:
    """The built venv, or the ``.partial`` a failed verify left (all installed, not renamed)."""
    final = host_path(spec.env_dir)
    return final if final.exists() else host_path(spec.partial_dir)


STUB_C = """/* gpuserve truth suite: stand-in for libcuda.so.1 (no NVIDIA driver here). */
#define STUB(name) int name(void) { return 100; /* CUDA_ERROR_NO_DEVICE */ }
"""


def cuda_symbols(venv: Path) -> list[str]:
    """Every ``cu*`` driver symbol the venv's shared objects import."""
    names: set[str] = set()
    for so in venv.rglob("*.so*"):
        if not so.is_file() or so.is_symlink():
            continue
        out = subprocess.run(["nm", "-D", "--undefined-only", str(so)], capture_output=True,
                             text=True).stdout
        for line in out.splitlines():
            sym = line.split()[-1].split("@")[0] if line.split() else ""
            if sym.startswith("cu") and sym[2:3].isupper():
                names.add(sym)
    return sorted(names)


def libcuda_stub(venv: Path) -> Path:
    """A libcuda.so.1 that exports what the venv imports; returns its folder."""
    symbols = cuda_symbols(venv)
    key = hashlib.sha256(json.dumps(symbols).encode()).hexdigest()[:12]
    folder = TRUTH / "libcuda-stub" / key
    lib = folder / "libcuda.so.1"
    if not lib.exists():
        folder.mkdir(parents=True, exist_ok=True)
        src = folder / "libcuda.c"
        src.write_text(STUB_C + "".join(f"STUB({s})\n" for s in symbols))
        subprocess.run(["cc", "-shared", "-fPIC", "-o", str(lib), str(src),
                        "-Wl,-soname,libcuda.so.1"], check=True)
    return folder


def run_python(venv: Path, code_or_file: str | Path, *args: str, env: dict | None = None,
               timeout: int = 1800) -> subprocess.CompletedProcess:
    cmd = [str(venv / "bin" / "python")]
    cmd += [str(code_or_file)] if isinstance(code_or_file, Path) else ["-c", code_or_file]
    full = {**os.environ, "VLLM_NO_USAGE_STATS": "1", "DO_NOT_TRACK": "1", "HF_HUB_OFFLINE": "1",
            "TRANSFORMERS_OFFLINE": "1", **(env or {})}
    return subprocess.run([*cmd, *args], capture_output=True, text=True, env=full, timeout=timeout)
