"""Rollouts that are interrupted: the pyinfra run killed with -9 half-way through a rolling
upgrade, and a host that drops off the network in the middle of a rollback. Two sandbox hosts
serving the real engine behind the proxy; running the same command again must finish the job.

Slow (two full converges' worth of engine restarts): `pytest -m slow`, or bench/faults.py.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest

from gpuserve import layout
from gpuserve.rollout import LOCK_FILE, LockHolder, drain_flag
from gpuserve_sandbox import fleet as view
from gpuserve_sandbox.hub import SANDBOX_REPO, SANDBOX_SEED, publish_tiny_checkpoint
from gpuserve_sandbox.loadloop import LoadLoop
from gpuserve_sandbox.runner import REPO, pyinfra_in_background

pytestmark = pytest.mark.slow

INV, SERVE, UPGRADE, ROLLBACK = ("inventories/sandbox.py", "deploys/serve.py", "deploys/upgrade.py",
                                 "deploys/rollback.py")
DEP = "minimax"
MODEL = "tiny-chat"


@pytest.fixture(scope="module")
def fleet(make_hosts, sandbox, sandbox_hub, tmp_path_factory):
    hosts = make_hosts(["cpu", "cpu"])
    sha1, _ = publish_tiny_checkpoint(sandbox_hub.root, SANDBOX_REPO, seed=SANDBOX_SEED, variant=1,
                                      branch="v1")
    return {"hosts": hosts, "sha1": sha1, "certs": tmp_path_factory.mktemp("certs"),
            "key": view.client_key(sandbox)}


def _drained(sandbox, h) -> bool:
    return sandbox.ssh(h, f"test -e {drain_flag(DEP)}", check=False).returncode == 0


def _start_pyinfra(sandbox, deploy: str, *extra: str, log) -> subprocess.Popen:
    pyinfra = os.path.join(os.path.dirname(sys.executable), "pyinfra")
    return subprocess.Popen([pyinfra, "-y", INV, deploy, *extra], cwd=REPO, stdout=log,
                            stderr=subprocess.STDOUT, start_new_session=True,
                            env={**os.environ, "GPUSERVE_SANDBOX_INSTANCE": str(sandbox.instance)})


def _wait_for(what: str, check, timeout: float, proc: subprocess.Popen, log_path) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        if proc.poll() is not None:
            pytest.fail(f"pyinfra ended (rc {proc.returncode}) before {what}:\n"
                        + open(log_path).read()[-4000:])
        if time.monotonic() > deadline:
            pytest.fail(f"no {what} within {timeout} s")
        time.sleep(0.2)


def test_the_fleet_serves(fleet, sandbox, pyinfra):
    pyinfra(INV, SERVE).check()
    for h in fleet["hosts"]:
        assert view.chat(sandbox, h, fleet["certs"], fleet["key"], MODEL)[0] == 200
    fleet["old"] = {h.name: view.pointers(sandbox, h, DEP)[0] for h in fleet["hosts"]}


@pytest.mark.faults
def test_kill_9_during_a_rolling_upgrade_then_the_rerun_finishes_it(fleet, sandbox, pyinfra, tmp_path):
    first, second = fleet["hosts"]
    second_pid = view.main_pid(sandbox, second, DEP)
    new_rev = f"model_revision={fleet['sha1']}"
    log_path = tmp_path / "killed-upgrade.log"
    with LoadLoop(view.endpoints(sandbox, fleet["hosts"], fleet["certs"]), fleet["key"], MODEL) as loop:
        loop.wait_until_serving()
        with open(log_path, "w") as log:
            proc = _start_pyinfra(sandbox, UPGRADE, "--data", new_rev, log=log)
            try:
                # the worst moment: the first host is out of the proxy, its engine stopped, and
                # `current` already switched to the new release, which has not started yet
                _wait_for("pointer switch on the first host",
                          lambda: fleet["sha1"][:8] in view.pointers(sandbox, first, DEP)[0],
                          600, proc, log_path)
                os.killpg(proc.pid, signal.SIGKILL)
            finally:
                proc.wait()
        assert proc.returncode == -signal.SIGKILL
        assert _drained(sandbox, first)                 # left out of rotation, not serving
        assert view.proxy_request(sandbox, first, fleet["certs"], "/health")[0] != 200
        assert view.pointers(sandbox, second, DEP)[0] == fleet["old"][second.name]
        assert view.main_pid(sandbox, second, DEP) == second_pid

        rerun = pyinfra(INV, UPGRADE, "--data", new_rev).check()
    stats = loop.stats
    assert "interrupted rollout" in rerun.output, rerun.output[-4000:]
    # the killed run's lock is still on the hosts; its pid is gone on this control node, so the
    # rerun breaks it without being told to
    assert "breaking the rollout lock of upgrade run" in rerun.output, rerun.output[-4000:]
    assert "on this control node) is gone" in rerun.output
    assert stats.failed == 0, stats.failures           # the drained host never got traffic
    assert stats.min_in_rotation >= 1
    for h in fleet["hosts"]:
        current, previous = view.pointers(sandbox, h, DEP)
        assert fleet["sha1"][:8] in current and previous == fleet["old"][h.name]
        assert not _drained(sandbox, h)
        assert view.chat(sandbox, h, fleet["certs"], fleet["key"], MODEL)[0] == 200
    again = pyinfra(INV, UPGRADE, "--data", new_rev).check()
    assert again.changed == 0, again.output[-3000:]
    print(f"\nkill -9 mid-upgrade: rerun {rerun.seconds:.0f} s; load loop {stats.ok} ok, "
          f"{stats.failed} failed, at least {stats.min_in_rotation} host(s) in rotation")


@pytest.mark.faults
def test_a_host_unreachable_mid_rollback_halts_it_and_the_rerun_finishes_it(fleet, sandbox, pyinfra,
                                                                            tmp_path):
    first, second = fleet["hosts"]
    new = view.pointers(sandbox, second, DEP)[0]
    veth = f"{second.machine}h"      # the host's end of its link on the sandbox bridge
    args = ("--data", f"model_revision={fleet['sha1']}")
    log_path = tmp_path / "rollback.log"
    try:
        with open(log_path, "w") as log, pyinfra_in_background(INV, ROLLBACK, *args, instance=sandbox.instance,
                                                               log=log) as proc:
            _wait_for("pointer switch on the first host",
                      lambda: view.pointers(sandbox, first, DEP)[0] == fleet["old"][first.name],
                      600, proc, log_path)
            subprocess.run(["ip", "link", "set", veth, "down"], check=True)
            proc.wait(timeout=900)
        output = log_path.read_text()
        assert proc.returncode != 0, output[-4000:]
        assert "rollback halted in batch 2/2" in output, output[-4000:]
        assert f"{second.name}: `" in output and "is the host reachable?" in output, output[-4000:]
    finally:
        subprocess.run(["ip", "link", "set", veth, "up"], check=True)
    # the first host finished its move and serves the old release; the second was never switched
    assert view.pointers(sandbox, first, DEP)[0] == fleet["old"][first.name]
    assert view.chat(sandbox, first, fleet["certs"], fleet["key"], MODEL)[0] == 200
    deadline = time.monotonic() + 60
    while sandbox.ssh(second, "true", check=False, timeout=10).returncode != 0:
        assert time.monotonic() < deadline, f"{second.name} did not come back on the network"
        time.sleep(1)
    assert view.pointers(sandbox, second, DEP)[0] == new

    rerun = pyinfra(INV, ROLLBACK, *args).check()
    assert "Rolling rollback" in rerun.output
    for h in fleet["hosts"]:
        assert view.pointers(sandbox, h, DEP) == (fleet["old"][h.name], fleet["old"][h.name])
        assert not _drained(sandbox, h)
        assert view.chat(sandbox, h, fleet["certs"], fleet["key"], MODEL)[0] == 200
    again = pyinfra(INV, ROLLBACK, *args).check()
    assert again.changed == 0, again.output[-3000:]
    unit = layout.unit_name(DEP)
    assert sandbox.ssh(second, f"systemctl is-active {unit}").stdout.strip() == "active"


def _lock_of(sandbox, h) -> LockHolder | None:
    out = sandbox.ssh(h, f"cat {LOCK_FILE}", check=False)
    return LockHolder.from_json(out.stdout) if out.returncode == 0 else None


@pytest.mark.faults
def test_two_rollouts_at_once_the_second_is_refused_naming_the_first(fleet, sandbox, pyinfra, tmp_path):
    first, second = fleet["hosts"]
    new_rev = f"model_revision={fleet['sha1']}"
    log_path = tmp_path / "first-upgrade.log"
    # drain_s=45: each host waits that long out of rotation, so the first rollout is still
    # moving hosts while the second one reaches its lock
    with open(log_path, "w") as log, pyinfra_in_background(INV, UPGRADE, "--data", new_rev, "--data", "drain_s=45",
                                                           instance=sandbox.instance, log=log) as proc:
        _wait_for("the first rollout's lock on both hosts",
                  lambda: all(_lock_of(sandbox, h) for h in fleet["hosts"]), 600, proc, log_path)
        holder = _lock_of(sandbox, first)
        other = pyinfra(INV, UPGRADE, "--data", new_rev)
        assert proc.poll() is None, "the first rollout should still be moving hosts"
        proc.wait(timeout=900)
    assert proc.returncode == 0, log_path.read_text()[-4000:]
    assert other.returncode != 0
    assert (f"upgrade refused: {first.name} is locked by upgrade run {holder.run} by "
            f"{holder.who} (pid {holder.pid})") in other.output, other.output[-4000:]
    # both hosts moved once, by the first rollout; its lock is gone
    for h in fleet["hosts"]:
        assert fleet["sha1"][:8] in view.pointers(sandbox, h, DEP)[0]
        assert _lock_of(sandbox, h) is None
    assert pyinfra(INV, UPGRADE, "--data", new_rev).check().changed == 0


@pytest.mark.faults
def test_a_lock_left_by_another_control_node_is_broken_only_by_force_unlock(fleet, sandbox, pyinfra):
    first, second = fleet["hosts"]
    args = ("--data", f"model_revision={fleet['sha1']}")
    before = {h.name: view.pointers(sandbox, h, DEP) for h in fleet["hosts"]}
    now = time.time()
    gone = LockHolder(run="r0123456789a", who="ops@ctl-gone", node="ctl-gone", pid=4242,
                      kind="upgrade", since=now - 60, beat=now - 60)
    sandbox.ssh(second, f"mkdir -p -m 700 {os.path.dirname(LOCK_FILE)} && "
                        f"printf '%s\\n' '{gone.to_json()}' > {LOCK_FILE}")
    refused = pyinfra(INV, ROLLBACK, *args)
    assert refused.returncode != 0
    assert (f"rollback refused: {second.name} is locked by upgrade run r0123456789a by ops@ctl-gone "
            "(pid 4242)") in refused.output, refused.output[-4000:]
    assert "--data force_unlock=r0123456789a" in refused.output
    # nothing moved, and the lock the refused run took on the first host was given back
    assert {h.name: view.pointers(sandbox, h, DEP) for h in fleet["hosts"]} == before
    assert _lock_of(sandbox, first) is None and _lock_of(sandbox, second) == gone

    run = pyinfra(INV, ROLLBACK, *args, "--data", "force_unlock=r0123456789a").check()
    assert "force_unlock=r0123456789a names it" in run.output
    for h in fleet["hosts"]:
        assert view.pointers(sandbox, h, DEP)[0] == before[h.name][1]
        assert _lock_of(sandbox, h) is None
