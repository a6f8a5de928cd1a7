"""Host-to-host weights fan-out end to end (``weights_fanout = "hosts"``, docs/weights.md): four
real sandbox hosts, the real pyinfra command, the control node's pusher and each host's
``gpuserve-weights-fetch`` unit, rsync over SSH with the fleet key between the hosts.

A checkpoint of 8 shards travels in 2 stripes (degree 2). Each transfer is limited to 128 KiB/s
(``weights_bwlimit_kib``) so the copy lasts long enough to kill an interior parent mid-copy: its
child must take the rest from another holder, every live host must end verified, and the control
node must still have sent each byte about once. In file order: the killed parent, then a rerun
over the live hosts that changes nothing, then the key's limits as a peer sees them.

In the default run (about a minute).
"""

from __future__ import annotations

import json
import os
import time

import pytest

from gpuserve import fanout, layout
from gpuserve_sandbox import fleet as fleet_view
from gpuserve_sandbox.hub import publish_checkpoint, write_sharded_checkpoint
from gpuserve_sandbox.runner import pyinfra_in_background

NVME = "/srv/nvme"  # group_data/sandbox.py
MODEL = "gpuserve-test/fanout"
REPO_DIR = layout.model_repo_dir(NVME, MODEL)
INVENTORY, DEPLOY = "inventories/sandbox.py", "deploys/weights.py"
SHARD = 512 << 10


@pytest.fixture(scope="module")
def hosts(make_hosts, sandbox_hub):
    return make_hosts(["cpu"] * 4)


@pytest.fixture(scope="module")
def ckpt(sandbox_hub, tmp_path_factory):
    src = tmp_path_factory.mktemp("fanout-ckpt")
    files = write_sharded_checkpoint(src, 8, SHARD, __import__("random").Random(7).randbytes)
    sha = publish_checkpoint(sandbox_hub.root, MODEL, src, branch=None)
    return {"sha": sha, "files": files, "total": 8 * SHARD + (src / "config.json").stat().st_size}


@pytest.fixture(scope="module")
def cache(tmp_path_factory):
    return str(tmp_path_factory.mktemp("control-node-cache"))


def data(ckpt, cache) -> list[str]:
    return ["--data", "weights_fanout=hosts", "--data", f"model_repo={MODEL}",
            "--data", f"model_revision={ckpt['sha']}", "--data", "weights_bwlimit_kib=128",
            "--data", "weights_progress_s=2", "--data", f"weights_cache={cache}"]


def sums(sandbox, host, sha: str) -> dict[str, str]:
    return fleet_view.checkpoint_sums(sandbox, host, f"{REPO_DIR}/{sha}")


def progress(sandbox, host, sha: str) -> dict:
    return fleet_view.fanout_progress(sandbox, host, REPO_DIR, sha)


def kill_host(sandbox, host) -> None:
    """The host goes away for good: powered off, its network namespace removed (a SIGKILL of its
    container is not enough: the sandbox's nspawn loop boots it again, and the copy resumes)."""
    sandbox._stop(host)


def test_a_parent_killed_mid_copy_does_not_stop_its_children(sandbox, hosts, ckpt, cache, sandbox_hub):
    names = [h.name for h in hosts]
    plan = fanout.plan(names, {p: SHARD for p in ckpt["files"]}, 2)
    # an interior host that is not a root: its child must fall back to another holder
    victim_name = next(h for h in names if any(plan.children(j, h) and plan.parents[j][h]
                                                for j in range(2)))
    stripe = next(j for j in range(2) if plan.children(j, victim_name))
    orphan_name = plan.children(stripe, victim_name)[0]
    victim = hosts[names.index(victim_name)]
    sandbox_hub.reset_stats()
    log_path = os.path.join(cache, "..", "fanout-run.log")
    t0 = time.monotonic()
    with open(log_path, "w") as log, pyinfra_in_background(INVENTORY, DEPLOY, *data(ckpt, cache),
                                                           instance=sandbox.instance, log=log) as proc:
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline:  # bounded: until the victim serves a verified shard
            doc = progress(sandbox, victim, ckpt["sha"])
            if any(e["path"] in plan.stripes[stripe] for e in doc.get("events", [])):
                break
            assert proc.poll() is None, open(log_path).read()[-4000:]
            time.sleep(0.3)
        else:
            pytest.fail("the victim never verified a shard of its stripe")
        kill_host(sandbox, victim)
        killed_at = time.monotonic() - t0
        proc.wait(timeout=600)
    output = open(log_path).read()
    stage_s = time.monotonic() - t0
    live = [h for h in hosts if h.name != victim_name]
    for h in live:
        assert sums(sandbox, h, ckpt["sha"]) == ckpt["files"], (h.name, output[-4000:])
        assert sandbox.ssh(h, f"systemctl is-enabled {layout.FANOUT_UNIT}", check=False).stdout.strip() \
            in ("disabled", "")  # nothing of the copy left running
        assert sandbox.ssh(h, f"test -e {layout.FANOUT_JOB}", check=False).returncode == 1
    orphan = hosts[names.index(orphan_name)]
    notes = progress(sandbox, orphan, ckpt["sha"])["notes"]
    assert any(victim_name in n for n in notes), notes   # the orphan says whom it lost
    assert f"weights fan-out: " in output and victim_name in output  # and the run says so
    assert proc.returncode != 0   # the dead host's own weights step failed, by name
    # the hub was asked once for the fleet, and the control node sent each byte about once
    assert sandbox_hub.bytes_served == ckpt["total"]
    push = json.load(open(os.path.join(cache, "fanout", f"push-{ckpt['sha']}.state.json")))
    assert push["state"] == "done" and push["sent_bytes"] <= 1.05 * ckpt["total"], push
    print(f"\nfan-out over 4 hosts, {victim_name} killed at {killed_at:.1f} s: every live host "
          f"verified after {stage_s:.1f} s; control node sent {push['sent_bytes']} bytes for a "
          f"{ckpt['total']}-byte checkpoint; {orphan_name}: {notes}")


def test_a_rerun_over_the_live_hosts_changes_nothing(sandbox, hosts, ckpt, cache, pyinfra):
    live = [h.name for h in hosts if sums(sandbox, h, ckpt["sha"])]
    # one --limit per host: pyinfra splits no commas (a "a,b" pattern matched no host, and the
    # run changed nothing because it converged nothing)
    run = pyinfra(INVENTORY, DEPLOY, *data(ckpt, cache), *(a for h in live for a in ("--limit", h))).check()
    assert all(f"[{h}]" in run.output for h in live), run.output[-3000:]
    assert run.changed == 0, run.output[-3000:]


def test_the_fleet_key_reads_checkpoints_and_nothing_else(sandbox, hosts, ckpt):
    a, b = [h for h in hosts if sums(sandbox, h, ckpt["sha"])][:2]
    # the key is a systemd credential on the hosts (issue 29): decrypted here into tmpfs, as the
    # fetch unit's LoadCredentialEncrypted= does
    key = "/run/test-fleet-key"
    sandbox.ssh(a, f"umask 077; systemd-creds decrypt --name={layout.FANOUT_KEY_CREDENTIAL} "
                   f"{layout.FANOUT_KEY_CRED} {key}")
    ssh = (f"ssh -i {key} -o IdentitiesOnly=yes -o BatchMode=yes "
           f"-o UserKnownHostsFile={layout.FANOUT_KNOWN_HOSTS} -o StrictHostKeyChecking=yes")
    # the key, from a peer: a shell command is refused; a read works; a write is refused
    out = sandbox.ssh(a, f"{ssh} {layout.FANOUT_USER}@{b.ip} cat /etc/shadow", check=False)
    assert out.returncode != 0 and "refused" in out.stderr
    sandbox.ssh(a, f"mkdir -p /tmp/got && rsync -e '{ssh}' {layout.FANOUT_USER}@{b.ip}:"
                   f"{os.path.basename(REPO_DIR)}/{ckpt['sha']}/config.json /tmp/got/")
    out = sandbox.ssh(a, f"rsync -e '{ssh}' /etc/hostname {layout.FANOUT_USER}@{b.ip}:x", check=False)
    assert out.returncode != 0
    # the private key is root's only, encrypted at rest, and appears in no unit or job
    assert sandbox.ssh(b, f"stat -c '%U %a' {layout.FANOUT_KEY_CRED}").stdout.strip() == "root 600"
    assert sandbox.ssh(b, f"test -e {layout.FANOUT_KEY}", check=False).returncode == 1
    sandbox.ssh(a, f"rm -f {key}")
