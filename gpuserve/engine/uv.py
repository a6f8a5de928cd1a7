"""uv: its binary from the pushed wheel, its environment, and the commands that build a venv."""

from __future__ import annotations

import posixpath
import shlex

from gpuserve.engine.spec import BIN_DIR, PYTHON_INSTALL_DIR, UV_CACHE_DIR, EngineSpec

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
    Pythons (when allowed) in a directory the service user can read. SOURCE_DATE_EPOCH makes
    any bytecode written during the build (pip's, in ``vllm download-kernels``) checked-hash
    rather than mtime-stamped; the build then compiles every source itself
    (``gpuserve.engine.bytecode``: uv's --compile-bytecode is not reproducible)."""
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
    """``uv pip install <package>==<pin> --torch-backend=<explicit>``, without bytecode: the
    build compiles it afterwards, the same bytes every time (``gpuserve.engine.bytecode``; the
    service user cannot write the venv, so it could never cache bytecode itself). Without
    ``--torch-backend`` when torch comes from PyPI or ``spec.index`` (``torch_backend_arg``):
    uv would fetch it from the PyTorch index instead. ``spec.index`` is an extra index (uv
    takes a package from the first index that has it: the extra one before PyPI)."""
    if spec.torch_backend == "auto":
        raise ValueError("torch_backend 'auto' is refused: pin the backend explicitly")
    cmd = [uv, "pip", "install", "--python", posixpath.join(path, "bin", "python")]
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
    if spec.resolved_as_of and not wheelhouse:   # PyPI as it was then: the same files next year
        cmd += ["--exclude-newer", spec.resolved_as_of]
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
