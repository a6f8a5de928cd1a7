"""The engine unit's stop and start commands, written once (gpuserve.rollout) and used by the
service layer's (re)start, the rollout's moves and the GPU stack's moves (issue 11)."""

from __future__ import annotations

import subprocess

from gpuserve import rollout


def _run(command: str, tmp_path, fail: str) -> tuple[int, list[str]]:
    """``command`` with a stand-in ``systemctl`` that logs its arguments and fails on ``fail``."""
    bin_dir, log = tmp_path / "bin", tmp_path / "log"
    bin_dir.mkdir(exist_ok=True)
    fake = bin_dir / "systemctl"
    fake.write_text(f'#!/bin/sh\necho "$*" >> {log}\n[ "$1" != "{fail}" ]\n')
    fake.chmod(0o755)
    proc = subprocess.run(["sh", "-c", command], env={"PATH": f"{bin_dir}:/usr/bin:/bin"})
    return proc.returncode, log.read_text().splitlines()


def test_start_goes_on_when_reset_failed_fails(tmp_path):
    """reset-failed fails on a unit that is not failed (or not loaded): the start still runs, and
    its own status is the command's."""
    rc, calls = _run(rollout.start("minimax"), tmp_path, fail="reset-failed")
    assert rc == 0
    assert calls == ["reset-failed gpuserve-minimax.service", "start --no-block gpuserve-minimax.service"]


def test_a_failed_start_fails_the_command(tmp_path):
    rc, calls = _run(rollout.start("minimax"), tmp_path, fail="start")
    assert rc != 0 and calls[-1] == "start --no-block gpuserve-minimax.service"


def test_stop_is_plain_systemctl_stop(tmp_path):
    assert _run(rollout.stop("minimax"), tmp_path, fail="none") == (0, ["stop gpuserve-minimax.service"])
