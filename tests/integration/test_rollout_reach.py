"""Rollouts on a fleet where something is always wrong (issue 27). Four sandbox hosts of two
hardware kinds (a hopper_x8 host with its simulated GPUs and driver stack, three cpu hosts) serve the real engine behind the proxy; in order:

  * a driver bump with reboot = "never" refuses before any host leaves rotation (nothing drained,
    stopped, installed or rebooted; the hopper_x8 host is the one whose move needs the reboot);
  * an upgrade with one host powered off: over max_fail_percentage (0, the default) nothing moves;
    within it (25%) the other three move, one canary per hardware kind first, the fourth is named
    and the run exits non-zero;
  * the rerun, once the host is back, finishes it; deploys/serve.py started while that rerun holds
    the rollout lock refuses, naming the rollout; afterwards serve.py runs, changes nothing and
    leaves no lock behind.

"Powered off" is the host's link on the sandbox bridge taken down: to the control node a host
that is off and a host whose link is gone look the same (no answer to SSH), and the sandbox can
bring its link back without a new boot.

Slow (four engines, two rollouts): `GPUSERVE_TEST_INSTANCE=<n> pytest -m slow
tests/integration/test_rollout_reach.py`.
"""

from __future__ import annotations

import re
import subprocess
import time

import pytest

from gpuserve import layout
from gpuserve.rollout import LOCK_FILE, LockHolder, drain_flag
from gpuserve_sandbox import fleet as view
from gpuserve_sandbox.hub import SANDBOX_REPO, SANDBOX_SEED, publish_tiny_checkpoint
from gpuserve_sandbox.runner import pyinfra_in_background, run_pyinfra

pytestmark = pytest.mark.slow

INV, SERVE, UPGRADE = "inventories/sandbox.py", "deploys/serve.py", "deploys/upgrade.py"
DEP, MODEL = "minimax", "tiny-chat"
OLD, NEW = "580.95.05", "580.105.08"   # the stand-in repository offers both (group data pins OLD)


@pytest.fixture(scope="module")
def fleet(make_hosts, sandbox, sandbox_hub, sandbox_wheelhouse, tmp_path_factory):
    # one GPU host: every host with a driver reboots at its first converge, which four at once on
    # this 2-core machine do not always finish within reboot_timeout
    hosts = make_hosts(["hopper_x8", "cpu", "cpu", "cpu"])
    sha1, _ = publish_tiny_checkpoint(sandbox_hub.root, SANDBOX_REPO, seed=SANDBOX_SEED, variant=1,
                                      branch="v1")
    run_pyinfra(INV, SERVE, instance=sandbox.instance).check()
    return {"hosts": hosts, "sha1": sha1, "certs": tmp_path_factory.mktemp("certs"),
            "key": view.client_key(sandbox)}


def _view(sandbox, h) -> dict:
    out = sandbox.ssh(h, "cat /proc/sys/kernel/random/boot_id; "
                         f"systemctl show -p MainPID --value {layout.unit_name(DEP)}; "
                         f"test -e {drain_flag(DEP)} && echo drained || echo in; "
                         "dpkg-query -W -f='${Version}\n' nvidia-open 2>/dev/null || echo none"
                      ).stdout.splitlines()
    return {"boot": out[0], "pid": out[1], "drained": out[2] == "drained", "driver": out[3]}


def _lock_of(sandbox, h) -> LockHolder | None:
    out = sandbox.ssh(h, f"cat {LOCK_FILE}", check=False)
    return LockHolder.from_json(out.stdout) if out.returncode == 0 else None


def _link(h, up: bool) -> None:
    subprocess.run(["ip", "link", "set", f"{h.machine}h", "up" if up else "down"], check=True)


def _answers(sandbox, h, within: float = 60) -> None:
    deadline = time.monotonic() + within
    while sandbox.ssh(h, "true", check=False, timeout=10).returncode != 0:
        assert time.monotonic() < deadline, f"{h.name} did not come back on the network"
        time.sleep(1)


def test_a_driver_bump_with_reboot_never_refuses_before_any_host_leaves_rotation(fleet, sandbox, pyinfra):
    before = {h.name: _view(sandbox, h) for h in fleet["hosts"]}
    run = pyinfra(INV, UPGRADE, "--data", f"nvidia_driver_version={NEW}", "--data", "reboot=never")
    assert run.returncode != 0
    assert "upgrade refused before any host left rotation:" in run.output, run.output[-4000:]
    gpu = fleet["hosts"][0]
    assert f"{gpu.name}: loading kernel module {NEW} (loaded now: {OLD}) needs a reboot" in run.output
    assert _view(sandbox, gpu)["driver"].startswith(OLD + "-")
    for h in fleet["hosts"]:
        assert _view(sandbox, h) == before[h.name]        # same boot, same engine, in, same driver
        assert _lock_of(sandbox, h) is None
    assert "out of the proxy" not in run.output and "rebooting" not in run.output


def test_an_upgrade_with_a_host_powered_off_moves_the_rest_and_names_it(fleet, sandbox, pyinfra):
    hosts, off = fleet["hosts"], fleet["hosts"][3]
    old = {h.name: view.pointers(sandbox, h, DEP)[0] for h in hosts}
    new_rev = f"model_revision={fleet['sha1']}"
    _link(off, up=False)
    try:
        refused = pyinfra(INV, UPGRADE, "--data", new_rev)     # max_fail_percentage = 0
        run = pyinfra(INV, UPGRADE, "--data", new_rev, "--data", "max_fail_percentage=25")
    finally:
        _link(off, up=True)
    assert refused.returncode != 0
    assert (f"upgrade not started: unreachable or failed to prepare: {off.name} (1 of 4 hosts, 25%, "
            "over max_fail_percentage = 0); no host was switched") in refused.output, refused.output[-4000:]
    out = run.output
    assert run.returncode != 0, out[-4000:]
    assert f"upgrade finished on the reachable hosts but SKIPPED {off.name}" in out, out[-4000:]
    for h in hosts[:3]:
        assert fleet["sha1"][:8] in view.pointers(sandbox, h, DEP)[0]
        assert view.chat(sandbox, h, fleet["certs"], fleet["key"], MODEL)[0] == 200
        assert not _view(sandbox, h)["drained"]
    # one canary per hardware kind first (the hopper_x8 host and a cpu host), one host at a time
    canaries = [line for line in out.splitlines() if "(canary of" in line]
    assert len(canaries) == 2, out[-4000:]
    assert "upgrade batch 1/3: " in canaries[0] and "upgrade batch 2/3: " in canaries[1]
    assert {"8x H200" in canaries[0] or "8x H200" in canaries[1],
            "0x cpu" in canaries[0] or "0x cpu" in canaries[1]} == {True}
    _answers(sandbox, off)
    assert view.pointers(sandbox, off, DEP)[0] == old[off.name]
    assert view.chat(sandbox, off, fleet["certs"], fleet["key"], MODEL)[0] == 200


def test_serve_during_the_rerun_refuses_and_the_rerun_finishes_the_skipped_host(fleet, sandbox, pyinfra,
                                                                                   tmp_path):
    hosts, off = fleet["hosts"], fleet["hosts"][3]
    log_path = tmp_path / "rerun.log"
    # drain_s=30: the rerun holds the lock long enough for serve.py to meet it
    with open(log_path, "w") as log, pyinfra_in_background(
            INV, UPGRADE, "--data", f"model_revision={fleet['sha1']}", "--data", "drain_s=30",
            instance=sandbox.instance, log=log) as proc:
        deadline = time.monotonic() + 600
        while not all(_lock_of(sandbox, h) for h in hosts):
            assert proc.poll() is None, log_path.read_text()[-4000:]
            assert time.monotonic() < deadline, "the rerun never held the lock"
            time.sleep(0.5)
        holder = _lock_of(sandbox, hosts[0])
        serve = pyinfra(INV, SERVE)
        assert proc.poll() is None, "the rerun should still be moving its host"
        proc.wait(timeout=900)
    assert serve.returncode != 0
    assert re.search(rf"converge refused: \S+ is locked by upgrade run {holder.run} by "
                     rf"{re.escape(holder.who)} \(pid {holder.pid}\)", serve.output), serve.output[-4000:]
    assert proc.returncode == 0, log_path.read_text()[-4000:]
    assert f"batch 1/1: {off.name}" in log_path.read_text()
    for h in hosts:
        assert fleet["sha1"][:8] in view.pointers(sandbox, h, DEP)[0]
        assert _lock_of(sandbox, h) is None
    # the converge the rollout refused runs now, changes nothing and gives its lock back
    again = pyinfra(INV, SERVE).check()
    assert again.changed == 0, again.output[-3000:]
    assert all(_lock_of(sandbox, h) is None for h in hosts)
