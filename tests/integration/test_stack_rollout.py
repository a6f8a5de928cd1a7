"""A driver bump on a serving fleet is a rollout, never an outage (issue: rolling GPU-stack
upgrades). Four hopper_x8 sandbox hosts serve the real engine behind the proxy under a client
loop; in order:

  * deploys/serve.py with a new driver pin changes no driver and reboots nothing on them;
  * deploys/upgrade.py moves the stack host by host: 0 failed requests, never more than
    max_unavailable hosts out, each host rebooted once and only after it was drained, the held
    set at the new version everywhere, and a second run changes nothing;
  * deploys/rollback.py --data rollback_stack=True with one host whose GPU fails admission after
    its reboot: that host stays out with its engine stopped, the rollback halts naming it and the
    check, the hosts after it keep their stack; with the fault cleared a rerun finishes it;
  * a reboot on a host that does not serve: the converge ends only after its readiness gate;
  * deploys/upgrade.py with one host failing admission after its reboot: the same as the
    rollback case, through the upgrade (it stays out, the upgrade halts naming it, no other host
    changes).

Slow (four engines, four reboots per rollout): `pytest -m slow tests/integration/test_stack_rollout.py`.
"""

from __future__ import annotations

import re

import pytest

from gpuserve import layout, stack
from gpuserve.rollout import drain_flag
from gpuserve_sandbox import fleet as view
from gpuserve_sandbox.loadloop import LoadLoop
from gpuserve_sandbox.runner import run_pyinfra

pytestmark = pytest.mark.slow

INV, SERVE, UPGRADE, ROLLBACK = ("inventories/sandbox.py", "deploys/serve.py", "deploys/upgrade.py",
                                 "deploys/rollback.py")
DEP = "minimax"
OLD, NEW = "580.95.05", "580.105.08"   # the stand-in repository offers both (group data pins OLD)
HELD = ("nvidia-open", "nvidia-kernel-open-dkms", "nvidia-persistenced", "nvidia-fabricmanager",
        "libnvidia-nscq")


@pytest.fixture(scope="module")
def fleet(make_hosts, sandbox, sandbox_hub, sandbox_wheelhouse, tmp_path_factory):
    hosts = make_hosts(["hopper_x8"] * 4)
    run_pyinfra(INV, SERVE, instance=sandbox.instance).check()
    return {"hosts": hosts, "certs": tmp_path_factory.mktemp("certs"), "key": view.client_key(sandbox)}


def _host_view(sandbox, h) -> dict:
    out = sandbox.ssh(h, "cat /proc/sys/kernel/random/boot_id; "
                         f"systemctl show -p MainPID --value {layout.unit_name(DEP)}; "
                         f"test -e {drain_flag(DEP)} && echo drained || echo in; "
                         "apt-mark showhold | tr '\\n' ' '; echo; "
                         "dpkg-query -W -f='${Package}=${Version}\\n' " + " ".join(HELD)).stdout.splitlines()
    return {"boot": out[0], "pid": out[1], "drained": out[2] == "drained", "held": set(out[3].split()),
            "versions": dict(line.split("=", 1) for line in out[4:] if "=" in line)}


def _on(view_: dict, version: str) -> bool:
    return all(view_["versions"].get(p, "").startswith(version + "-") for p in HELD)


def _endpoints(fleet, sandbox):
    return view.endpoints(sandbox, fleet["hosts"], fleet["certs"])


def test_serve_with_a_new_driver_pin_changes_no_driver_and_reboots_no_serving_host(fleet, sandbox, pyinfra):
    before = {h.name: _host_view(sandbox, h) for h in fleet["hosts"]}
    run = pyinfra(INV, SERVE, "--data", f"nvidia_driver_version={NEW}").check()
    for h in fleet["hosts"]:
        after = _host_view(sandbox, h)
        assert _on(after, OLD), after
        assert after["boot"] == before[h.name]["boot"] and after["pid"] == before[h.name]["pid"]
        assert f"[{h.name}] serves now: its GPU stack change" in run.output
    assert "waits for deploys/upgrade.py" in run.output
    assert "Reboot to load the NVIDIA driver" not in run.output


def test_a_driver_bump_rolls_host_by_host_with_zero_failed_requests(fleet, sandbox, pyinfra):
    hosts = fleet["hosts"]
    before = {h.name: _host_view(sandbox, h) for h in hosts}
    with LoadLoop(_endpoints(fleet, sandbox), fleet["key"], "tiny-chat") as loop:
        loop.wait_until_serving()
        run = pyinfra(INV, UPGRADE, "--data", f"nvidia_driver_version={NEW}").check()
    stats = loop.stats
    assert stats.failed == 0, stats.failures
    assert stats.min_in_rotation == len(hosts) - 1, stats.rotation   # max_unavailable 1
    out = run.output
    for i, h in enumerate(hosts, 1):
        after = _host_view(sandbox, h)
        assert _on(after, NEW) and set(HELD) <= after["held"], after
        assert after["boot"] != before[h.name]["boot"] and not after["drained"]
        # rebooted exactly once, and only after it left rotation and its requests finished
        assert out.count(f"[{h.name}] rebooting to load the new driver") == 1
        out_at = out.index(f"[{h.name}] {h.name} GPU stack -> NVIDIA {NEW}")
        drained_at = out.index(f"[{h.name}] minimax out of the proxy")
        assert out_at < drained_at < out.index(f"[{h.name}] rebooting")
        assert f"batch {i}/{len(hosts)}: {h.name}" in out
        assert re.search(rf"\[{h.name}\] serves again on NVIDIA {NEW}", out)
    again = pyinfra(INV, UPGRADE, "--data", f"nvidia_driver_version={NEW}").check()
    assert again.changed == 0 and "Rolling upgrade" not in again.output, again.output[-3000:]


def test_a_host_failing_admission_after_its_reboot_stays_out_and_halts_the_rollback(fleet, sandbox, pyinfra):
    first, second, third, fourth = fleet["hosts"]
    sandbox.set_fault(second, gpu=3, fault="ecc-uncorrectable")
    with LoadLoop(_endpoints(fleet, sandbox), fleet["key"], "tiny-chat") as loop:
        loop.wait_until_serving()
        run = pyinfra(INV, ROLLBACK, "--data", "rollback_stack=True",
                      "--data", f"nvidia_driver_version={NEW}")
    assert run.returncode != 0
    assert loop.stats.failed == 0, loop.stats.failures
    assert "rollback halted in batch 2/4" in run.output
    assert re.search(rf"{second.name}: GPU stack move to NVIDIA {OLD} .*failed at admission", run.output)
    assert "ecc_uncorrectable is 1" in run.output
    assert f"Not reached, still on their release: {third.name}, {fourth.name}" in run.output
    assert _on(_host_view(sandbox, first), OLD)
    bad = _host_view(sandbox, second)
    assert _on(bad, OLD) and bad["drained"] and bad["pid"] == "0"     # out, engine stopped
    for h in (third, fourth):
        assert _on(_host_view(sandbox, h), NEW)
    sandbox.clear_faults(second)
    rerun = pyinfra(INV, ROLLBACK, "--data", "rollback_stack=True",
                    "--data", f"nvidia_driver_version={NEW}").check()
    assert "earlier GPU stack move did not finish" in rerun.output
    for h in fleet["hosts"]:
        v = _host_view(sandbox, h)
        assert _on(v, OLD) and not v["drained"] and v["pid"] != "0"
    record = sandbox.ssh(first, f"cat {stack.STACK_RECORD}").stdout
    assert f'"driver_version": "{OLD}"' in record and NEW not in record


def test_a_converge_that_reboots_a_host_that_does_not_serve_ends_after_its_gate(fleet, sandbox, pyinfra):
    h = fleet["hosts"][0]
    sandbox.ssh(h, f"systemctl stop {layout.unit_name(DEP)}")
    before = _host_view(sandbox, h)
    run = pyinfra(INV, SERVE, "--limit", h.name, "--data", f"nvidia_driver_version={NEW}").check()
    after = _host_view(sandbox, h)
    assert after["boot"] != before["boot"] and _on(after, NEW)
    assert "readiness gate" in run.output
    # the run ended only once the host served again: asked right after pyinfra returned
    assert view.proxy_request(sandbox, h, fleet["certs"], "/health")[0] == 200


def test_a_host_failing_admission_after_its_reboot_stays_out_and_halts_the_upgrade(fleet, sandbox, pyinfra):
    """The same move through deploys/upgrade.py: the first host still to move fails admission after
    its reboot; it stays out with its engine stopped, the upgrade halts naming it and the check,
    and every other host keeps the stack it had. Runs alone as well as after the tests above."""
    before = {h.name: _host_view(sandbox, h) for h in fleet["hosts"]}
    to_move = [h for h in fleet["hosts"] if not _on(before[h.name], NEW)]
    assert len(to_move) >= 2, before
    bad, rest = to_move[0], to_move[1:]
    sandbox.set_fault(bad, gpu=5, fault="ecc-uncorrectable")
    try:
        with LoadLoop(_endpoints(fleet, sandbox), fleet["key"], "tiny-chat") as loop:
            loop.wait_until_serving()
            run = pyinfra(INV, UPGRADE, "--data", f"nvidia_driver_version={NEW}")
        assert run.returncode != 0
        assert loop.stats.failed == 0, loop.stats.failures
        assert f"upgrade halted in batch 1/{len(to_move)}" in run.output, run.output[-3000:]
        assert re.search(rf"{bad.name}: GPU stack move to NVIDIA {NEW} .*failed at admission", run.output)
        assert "ecc_uncorrectable is 1" in run.output
        assert f"Not reached, still on their release: {', '.join(h.name for h in rest)}" in run.output
        out = _host_view(sandbox, bad)
        assert _on(out, NEW) and out["boot"] != before[bad.name]["boot"]      # moved and rebooted
        assert out["drained"] and out["pid"] == "0"                             # out, engine stopped
        for h in fleet["hosts"]:
            if h is not bad:
                after = _host_view(sandbox, h)
                assert after["versions"] == before[h.name]["versions"] and after["boot"] == before[h.name]["boot"]
                assert not after["drained"] and after["pid"] == before[h.name]["pid"]
    finally:
        sandbox.clear_faults(bad)
