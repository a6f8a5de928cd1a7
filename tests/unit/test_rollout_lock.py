"""The fleet-wide rollout lock: its commands run in a real shell, its rules as pure logic."""

from __future__ import annotations

import subprocess

import pytest

from gpuserve import rollout
from gpuserve.rollout import LockHolder


def holder(run="aaaaaaaaaaaa", node="ctl-a", pid=100, beat=1000.0) -> LockHolder:
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
    a, b = holder("aaaaaaaaaaaa"), holder("bbbbbbbbbbbb", node="ctl-b")
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
    a, b, c = holder("aaaaaaaaaaaa"), holder("bbbbbbbbbbbb"), holder("cccccccccccc")
    sh(rollout.lock_take(a))
    assert sh(rollout.lock_replace(a.run, b)).returncode == 0      # b breaks a's lock
    assert sh(rollout.lock_replace(a.run, c)).returncode != 0      # c was too late
    assert LockHolder.from_json(lock_file.read_text()) == b


def test_two_takers_at_once_exactly_one_wins(lock_file):
    takers = [holder(f"{i:012x}") for i in range(8)]
    procs = [subprocess.Popen(["sh", "-c", rollout.lock_take(t)], stdout=subprocess.PIPE, text=True)
             for t in takers]
    results = [rollout.parse_lock_output(p.communicate()[0])[0] for p in procs]
    assert results.count(True) == 1


@pytest.mark.parametrize("held, force, alive, now, expected", [
    (holder(), None, True, 1010.0, None),                               # live, on another node: respected
    (holder(node="me"), None, True, 1010.0, None),                      # live on this node: respected
    (holder(node="me"), None, False, 1010.0, "its rollout (pid 100 on this control node) is gone"),
    (holder(), "aaaaaaaaaaaa", True, 1010.0, "force_unlock=aaaaaaaaaaaa names it"),
    (holder(), "bbbbbbbbbbbb", True, 1010.0, None),                     # force names another run
    (holder(), None, True, 1000.0 + 7201, "not refreshed for 7201 s, longer than rollout_lock_stale_s (7200 s)"),
    (None, None, True, 1010.0, "the lock file is unreadable (not written by gpuserve, or cut short)"),
])
def test_when_a_held_lock_may_be_broken(held, force, alive, now, expected):
    me = holder("dddddddddddd", node="me", pid=200)
    assert rollout.stale_reason(held, me, now, 7200, force, lambda pid: alive) == expected


def test_the_holder_is_described_for_people():
    text = holder().describe(1060.0)
    assert text == ("upgrade run aaaaaaaaaaaa by ops@ctl-a (pid 100) since 1970-01-01 00:15:00 UTC, "
                    "last seen 60 s ago")
