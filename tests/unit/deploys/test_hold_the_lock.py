"""Every entry point that changes what a rollout moves (engines, units, drain flags, rotation, a
gateway's worker file, reboots) is a rollout itself or holds the rollout lock while it runs: two
writers never move one host at once, whichever deploys they are (issue 28: "the lock, the budget
and the preconditions live in one place"). A deploy left out says why, here."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from gpuserve.rollout import lock as rollout_lock

DEPLOYS = Path(__file__).resolve().parents[3] / "deploys"

# the deploys that move nothing a rollout moves, and why
LOCK_FREE = {
    "__init__.py": "not a deploy",
    "__main__.py": "not a deploy",
    "weights.py": "stages a revision beside the served one, under the weights' own per-repository lock",
    "monitoring.py": "exporters, Prometheus, alertmanager and the watchdog units: no engine, unit of an "
                     "engine, drain flag or worker file",
}


def _calls(path: Path) -> set[str]:
    names = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Call):
            f = node.func
            names.add(f.id if isinstance(f, ast.Name) else getattr(f, "attr", ""))
    return names


@pytest.mark.parametrize("deploy", sorted(p.name for p in DEPLOYS.glob("*.py")))
def test_every_deploy_rolls_or_holds_the_lock_or_says_why_not(deploy):
    calls = _calls(DEPLOYS / deploy)
    if deploy in LOCK_FREE:
        assert not calls & {"add_rollout", "hold_writer_lock"}, f"{deploy} locks now: take it off LOCK_FREE"
        return
    assert calls & {"add_rollout", "hold_writer_lock"}, (
        f"deploys/{deploy} neither rolls out (add_rollout) nor holds the rollout lock (hold_writer_lock); "
        "if it changes nothing a rollout moves, add it to LOCK_FREE with the reason")


def test_a_decommission_releases_the_lock_with_its_directory_and_leaves_another_runs(tmp_path, monkeypatch):
    import subprocess

    from gpuserve.rollout import LockHolder

    lock = tmp_path / "gpuserve-rollout" / "lock"
    monkeypatch.setattr(rollout_lock, "LOCK_FILE", str(lock))
    mine = LockHolder(run="rdecom000001", who="ops@ctl", node="ctl", pid=1, kind="decommission",
                      since=1.0, beat=1.0)

    def sh(command: str) -> None:
        subprocess.run(["sh", "-c", command], check=True, capture_output=True)

    sh(rollout_lock.lock_take(mine))
    sh(rollout_lock.lock_release("rsomeoneelse", remove_dir=True))   # not ours: everything stays
    assert lock.exists()
    sh(rollout_lock.lock_release(mine.run, remove_dir=True))
    assert not lock.parent.exists()
    sh(rollout_lock.lock_release(mine.run, remove_dir=True))   # gone already: nothing made again
    assert not lock.parent.exists()
