"""The fleet-wide rollout lock: its commands run in a real shell, its rules as pure logic."""

from __future__ import annotations

import subprocess

import pytest

from gpuserve.rollout import lock as rollout
from gpuserve.rollout import LockHolder


def holder(run="raaaaaaaaaaa", node="ctl-a", pid=100, beat=1000.0) -> LockHolder:
    return LockHolder(run=run, who=f"ops@{node}", node=node, pid=pid, kind="upgrade",
                      since=900.0, beat=beat)


@pytest.fixture
def lock_file(tmp_path, monkeypatch):
    path = tmp_path / "gpuserve-rollout" / "lock"
    monkeypatch.setattr(rollout, "LOCK_FILE", str(path))
    return path


def sh(command: str) -> subprocess.CompletedProcess:
    return subprocess.run(["sh", "-c", command], capture_output=True, text=True)


def test_the_first_taker_gets_it_the_second_reads_the_holder(lock_file):
    a, b = holder("raaaaaaaaaaa"), holder("rbbbbbbbbbbb", node="ctl-b")
    assert rollout.parse_lock_output(sh(rollout.lock_take(a)).stdout) == (True, None)
    assert oct(lock_file.parent.stat().st_mode & 0o777) == "0o700"
    taken, held = rollout.parse_lock_output(sh(rollout.lock_take(b)).stdout)
    assert not taken and held == a
    # b cannot release or refresh a's lock; a can
    sh(rollout.lock_release(b.run))
    assert lock_file.exists()
    assert sh(rollout.lock_replace(b.run, b)).returncode != 0
    assert LockHolder.from_json(lock_file.read_text()) == a
    sh(rollout.lock_release(a.run))
    assert not lock_file.exists()


def test_breaking_a_stale_lock_replaces_it_only_while_it_is_still_the_stale_one(lock_file):
    a, b, c = holder("raaaaaaaaaaa"), holder("rbbbbbbbbbbb"), holder("rcccccccccc0")
    sh(rollout.lock_take(a))
    assert sh(rollout.lock_replace(a.run, b)).returncode == 0      # b breaks a's lock
    assert sh(rollout.lock_replace(a.run, c)).returncode != 0      # c was too late
    assert LockHolder.from_json(lock_file.read_text()) == b


def test_two_takers_at_once_exactly_one_wins(lock_file):
    takers = [holder(f"r{i:011x}") for i in range(8)]
    procs = [subprocess.Popen(["sh", "-c", rollout.lock_take(t)], stdout=subprocess.PIPE, text=True)
             for t in takers]
    results = [rollout.parse_lock_output(p.communicate()[0])[0] for p in procs]
    assert results.count(True) == 1


@pytest.mark.parametrize("held, force, alive, now, expected", [
    (holder(), None, True, 1010.0, None),                               # live, on another node: respected
    (holder(node="me"), None, True, 1010.0, None),                      # live on this node: respected
    (holder(node="me"), None, False, 1010.0, "its rollout (pid 100 on this control node) is gone"),
    (holder(), "raaaaaaaaaaa", True, 1010.0, "force_unlock=raaaaaaaaaaa names it"),
    (holder(), "rbbbbbbbbbbb", True, 1010.0, None),                     # force names another run
    (holder(), None, True, 1000.0 + 7201, "not refreshed for 7201 s, longer than rollout_lock_stale_s (7200 s)"),
    (None, None, True, 1010.0, "the lock file is unreadable (not written by gpuserve, or cut short)"),
])
def test_when_a_held_lock_may_be_broken(held, force, alive, now, expected):
    me = holder("rddddddddddd", node="me", pid=200)
    assert rollout.stale_reason(held, me, now, 7200, force, lambda pid: alive) == expected


def test_the_holder_is_described_for_people():
    text = holder().describe(1060.0)
    assert text == ("upgrade run raaaaaaaaaaa by ops@ctl-a (pid 100) since 1970-01-01 00:15:00 UTC, "
                    "last seen 60 s ago")


def test_the_lock_file_is_private_and_never_seen_half_written(lock_file):
    a = holder()
    sh(rollout.lock_take(a))
    assert oct(lock_file.stat().st_mode & 0o777) == "0o600"
    # the file appears by a hard link of a complete temp file: whoever reads it reads JSON
    assert LockHolder.from_json(lock_file.read_text()) == a
    assert sorted(p.name for p in lock_file.parent.iterdir()) == [".mutex", "lock"]


def test_run_ids_start_with_a_letter_so_data_never_reads_them_as_numbers():
    from pyinfra_cli.util import parse_cli_arg

    from gpuserve.layers.rollout import _holder

    for _ in range(50):
        run = _holder("upgrade").run
        assert rollout.RUN_ID.fullmatch(run) and parse_cli_arg(run) == run
