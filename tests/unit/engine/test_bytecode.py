"""The venv's bytecode is the same bytes on every build (issue 25, gpuserve/engine/bytecode.py).

These run the build's own compile code with a Python 3.12 (the hosts' minor version: from 3.12 on
the bytes depend on the interpreter's history, see the first test) on a copy of pycparser, whose
c_parser.py is one of the three files that differed between cold vLLM installs."""

from __future__ import annotations

import glob
import hashlib
import importlib.util
import os
import shutil
import subprocess
from pathlib import Path

import pytest

from gpuserve.engine import bytecode


def _python312() -> str | None:
    for candidate in (shutil.which("python3.12"), "/usr/bin/python3.12",
                      *sorted(glob.glob(os.path.expanduser("~/.pyenv/versions/3.12.*/bin/python3.12")))):
        if candidate and os.access(candidate, os.X_OK) and subprocess.run(
                [candidate, "-c", "import sys; assert sys.version_info[:2] == (3, 12)"],
                capture_output=True).returncode == 0:
            return candidate
    return None


PY312 = _python312()
PYCPARSER = importlib.util.find_spec("pycparser")
pytestmark = pytest.mark.skipif(PY312 is None or PYCPARSER is None,
                                reason="needs a python3.12 and pycparser's sources")


@pytest.fixture()
def site(tmp_path) -> Path:
    site = tmp_path / "lib" / "python3.12" / "site-packages"
    shutil.copytree(Path(PYCPARSER.origin).parent, site / "pycparser",
                    ignore=shutil.ignore_patterns("__pycache__"))
    (site / "broken.py").write_text("def f(:\n")  # some wheels ship sources Python cannot compile
    return site


def _pycs(site: Path) -> dict[str, str]:
    return {str(p.relative_to(site)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(site.rglob("*.pyc"))}


def _compile(site: Path, chunk: int, jobs: int) -> subprocess.CompletedProcess:
    return subprocess.run([PY312, "-s", "-c", bytecode.COMPILE_CODE, str(site), str(chunk), str(jobs)],
                          capture_output=True, text=True, check=True)


def _py_compile_in_one_process(site: Path, *names: str) -> bytes:
    """What one of uv's pool workers does: py_compile each file it is handed, in turn."""
    code = ("import py_compile, sys\n"
            "for f in sys.argv[1:]:\n"
            "    out = py_compile.compile(f, invalidation_mode=py_compile.PycInvalidationMode.CHECKED_HASH)\n"
            "print(out)\n")
    out = subprocess.run([PY312, "-s", "-c", code, *(str(site / "pycparser" / n) for n in names)],
                         capture_output=True, text=True, check=True).stdout.strip()
    return Path(out).read_bytes()


def test_one_source_gives_other_bytes_after_other_files_in_the_same_interpreter(site):
    """Why uv's --compile-bytecode is not reproducible: which files its worker compiled before."""
    fresh = _py_compile_in_one_process(site, "c_parser.py")
    after_the_lexer = _py_compile_in_one_process(site, "c_lexer.py", "c_parser.py")
    assert fresh != after_the_lexer


def test_the_chunked_compile_writes_the_same_bytes_whatever_the_cores(site):
    done = _compile(site, chunk=3, jobs=1)
    first = _pycs(site)
    sources = [p for p in site.rglob("*.py")]
    assert f"compiled {len(sources) - 1} sources in" in done.stdout
    assert "1 do not compile" in done.stdout
    assert len(first) == len(sources) - 1  # every source but the broken one
    for jobs in (4, 2):
        for pyc in site.rglob("*.pyc"):
            pyc.unlink()
        _compile(site, chunk=3, jobs=jobs)
        assert _pycs(site) == first


def test_the_pyc_files_are_checked_hash_and_python_imports_them(site):
    _compile(site, chunk=500, jobs=0)
    pyc = site / "pycparser" / "__pycache__" / "c_parser.cpython-312.pyc"
    flags = int.from_bytes(pyc.read_bytes()[4:8], "little")
    assert flags == 0b11  # hash-based, checked: the source's hash, not its mtime
    before = pyc.read_bytes()
    subprocess.run([PY312, "-s", "-c", "import pycparser.c_parser"], cwd=site, check=True)
    assert pyc.read_bytes() == before  # Python took it as current: it did not write another


def test_compile_command_runs_the_venvs_own_python_on_its_site_packages():
    assert bytecode.compile_command("/opt/e.partial", "3.12")[:3] == ["/opt/e.partial/bin/python", "-s", "-c"]
    assert bytecode.compile_command("/opt/e.partial", "3.12")[4:] == [
        "/opt/e.partial/lib/python3.12/site-packages", str(bytecode.CHUNK_FILES), "0"]
