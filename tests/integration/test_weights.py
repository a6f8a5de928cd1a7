"""The weights layer end to end: two real sandbox hosts, the real pyinfra command over SSH, the
real huggingface_hub client against the local hub on the sandbox bridge. No public hub is reached.

The tests run in file order and build on each other (one revision history on the same hosts):
converge -> no-op -> bump -> flipped byte -> kill -9 mid-transfer -> full disk -> hub errors ->
per-host hub downloads.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time

import pytest

from gpuserve import layout
from gpuserve import weights as w
from gpuserve_sandbox.fleet import rx_bytes, wire
from gpuserve_sandbox.hub import SANDBOX_REPO, SANDBOX_SEED, publish_tiny_checkpoint
from gpuserve_sandbox.runner import REPO

NVME = "/srv/nvme"  # group_data/sandbox.py
REPO_DIR = layout.model_repo_dir(NVME, SANDBOX_REPO)
INVENTORY, DEPLOY = "inventories/sandbox.py", "deploys/weights.py"
os.environ.setdefault("HF_ENDPOINT", "http://127.0.0.1:9")  # anything that forgets endpoint= fails
os.environ.setdefault("HF_HUB_DISABLE_TELEMETRY", "1")


@pytest.fixture(scope="module")
def hosts(make_hosts, sandbox_hub):
    return make_hosts(["cpu", "cpu"])


@pytest.fixture(scope="module")
def revs(sandbox_hub):
    """Variant k of the sandbox's tiny model: same files except one shard (k=0 is the pin)."""
    out = {}
    for k in (0, 1, 3, 4, 5):
        sha, info = publish_tiny_checkpoint(sandbox_hub.root, SANDBOX_REPO, seed=SANDBOX_SEED,
                                            variant=k, branch="main" if k == 0 else None)
        out[k] = {"sha": sha, **info}
    return out


@pytest.fixture(scope="module")
def cache(tmp_path_factory):
    return str(tmp_path_factory.mktemp("control-node-cache"))


@pytest.fixture
def converge(pyinfra, cache, sandbox_hub):
    def go(*extra: str, ok: bool = True):
        sandbox_hub.reset_stats()
        run = pyinfra(INVENTORY, DEPLOY, "--data", f"weights_cache={cache}", *extra)
        return run.check() if ok else run
    return go


def op_row(output: str, name: str) -> tuple[int, int, int]:
    """(success, error, no change) of one operation in pyinfra's results table."""
    m = re.search(rf"^\s*Weights \| {re.escape(name)} \S+\s+\d+\s+(\d+|-)\s+(\d+|-)\s+(\d+|-)\s*$",
                  output, re.M)
    assert m, output[-3000:]
    return tuple(0 if v == "-" else int(v) for v in m.groups())


def sums(sandbox, host, sha: str) -> dict[str, str]:
    out = sandbox.ssh(host, f"cd {REPO_DIR}/{sha} && sha256sum $(find . -type f ! -name '.*' | sort)")
    return {line.split()[1][2:]: line.split()[0] for line in out.stdout.splitlines()}


def inode(sandbox, host, path: str) -> int:
    return int(sandbox.ssh(host, f"stat -c %i {path}").stdout)


def listing(sandbox, host) -> list[str]:
    return sorted(sandbox.ssh(host, f"ls -A {REPO_DIR} 2>/dev/null || true").stdout.split())


def test_two_hosts_converge_and_the_hub_is_asked_once(sandbox, hosts, revs, converge, sandbox_hub):
    v0 = revs[0]
    run = converge()
    assert run.changed > 0 and run.errors == 0
    assert sandbox_hub.bytes_served == v0["total_size"]  # once for the fleet, not once per host
    moved = wire(run.output)
    assert set(moved) == {h.name for h in hosts}
    for h in hosts:
        assert moved[h.name]["files"] == len(v0["files"]) and moved[h.name]["linked"] == 0
        assert sums(sandbox, h, v0["sha"]) == {p: f["sha256"] for p, f in v0["files"].items()}
        assert listing(sandbox, h) == [w.LOCK_NAME, v0["sha"]]  # no partial left
        modes = sandbox.ssh(h, f"stat -c '%U %a' {REPO_DIR}/{v0['sha']}/*.json | sort -u").stdout
        assert modes.split("\n")[0] == "root 644"
    print(f"\nfirst converge, 2 hosts: hub sent {sandbox_hub.bytes_served} bytes for a "
          f"{v0['total_size']}-byte checkpoint; rsync sent {[m['bytes'] for m in moved.values()]}")


def test_a_second_run_changes_nothing_and_moves_nothing(sandbox, hosts, converge, sandbox_hub):
    before = {h.name: rx_bytes(sandbox, h) for h in hosts}
    run = converge()
    assert run.changed == 0, run.output[-3000:]
    assert sandbox_hub.stats()["requests"] == {} and sandbox_hub.bytes_served == 0
    assert wire(run.output) == {} and op_row(run.output, "Checkpoint") == (0, 0, 2)
    received = {h.name: rx_bytes(sandbox, h) - before[h.name] for h in hosts}
    assert all(n < 150_000 for n in received.values()), received  # pyinfra's own SSH traffic
    print(f"\nno-op converge: {run.seconds:.1f} s, hub requests 0, host rx {received}")


def test_a_revision_bump_moves_only_the_changed_shard_and_keeps_the_previous(sandbox, hosts, revs,
                                                                               converge, sandbox_hub):
    v0, v1 = revs[0], revs[1]
    varied = v1["varied_shard"]
    changed = v1["files"][varied]["size"]
    before = {h.name: rx_bytes(sandbox, h) for h in hosts}
    run = converge("--data", f"model_revision={v1['sha']}")
    assert sandbox_hub.bytes_by_file == {f"{SANDBOX_REPO}/{varied}": changed}
    moved = wire(run.output)
    for h in hosts:
        m = moved[h.name]
        assert m["files"] == 1 and m["linked"] == len(v1["files"]) - 1
        assert m["bytes"] < changed * 1.02 + 4096, m
        received = rx_bytes(sandbox, h) - before[h.name]
        assert received < changed + 200_000 < v1["total_size"], received
        assert sums(sandbox, h, v1["sha"]) == {p: f["sha256"] for p, f in v1["files"].items()}
        assert listing(sandbox, h) == sorted([w.LOCK_NAME, v0["sha"], v1["sha"]])  # previous kept
        for name in v1["files"]:
            a = inode(sandbox, h, f"{REPO_DIR}/{v0['sha']}/{name}")
            b = inode(sandbox, h, f"{REPO_DIR}/{v1['sha']}/{name}")
            assert (a == b) == (name != varied), name
    print(f"\nbump: {changed} bytes changed; hub sent {sandbox_hub.bytes_served}; rsync sent "
          f"{[m['bytes'] for m in moved.values()]} per host")


@pytest.mark.faults
def test_a_flipped_byte_is_caught_and_only_that_file_is_repaired(sandbox, hosts, revs, converge,
                                                                   sandbox_hub):
    v0, v1 = revs[0], revs[1]
    victim, other = hosts
    shard = v1["shards"][1]  # shared with v0 through a hardlink
    path = f"{REPO_DIR}/{v1['sha']}/{shard}"
    sandbox.ssh(victim, f"python3 -c \"f=open('{path}','r+b'); f.seek(4096); b=f.read(1); "
                f"f.seek(4096); f.write(bytes([b[0]^255]))\"")
    untouched = {n: inode(sandbox, victim, f"{REPO_DIR}/{v1['sha']}/{n}") for n in v1["files"] if n != shard}
    run = converge("--data", f"model_revision={v1['sha']}")
    assert op_row(run.output, "Checkpoint") == (1, 0, 1)  # the other host: No Change
    moved = wire(run.output)
    assert set(moved) == {victim.name} and moved[victim.name]["how"] == "repaired"
    assert moved[victim.name]["files"] == 1
    assert moved[victim.name]["bytes"] < v1["files"][shard]["size"] * 1.02 + 4096
    assert f"relinked {v0['sha']}/{shard}" in run.output  # the rollback copy is repaired too
    assert sandbox_hub.bytes_served == 0  # from the control node's cache
    for sha, rev in ((v1["sha"], v1), (v0["sha"], v0)):
        assert sums(sandbox, victim, sha) == {p: f["sha256"] for p, f in rev["files"].items()}
    assert inode(sandbox, victim, path) == inode(sandbox, victim, f"{REPO_DIR}/{v0['sha']}/{shard}")
    assert {n: inode(sandbox, victim, f"{REPO_DIR}/{v1['sha']}/{n}") for n in untouched} == untouched
    assert converge("--data", f"model_revision={v1['sha']}").changed == 0


@pytest.mark.faults
def test_kill_9_mid_transfer_then_rerun_ends_verified(sandbox, hosts, sandbox_hub, cache, converge,
                                                      tmp_path):
    # a bigger revision (33 MB, every shard new), sent at 4 MiB/s: time to kill it mid-transfer
    from gpuserve_sandbox.hub import publish_checkpoint
    from gpuserve_sandbox.tiny_checkpoint import make_tiny_checkpoint

    big = make_tiny_checkpoint(tmp_path / "big", seed=SANDBOX_SEED, variant=2, hidden_size=512)
    sha = publish_checkpoint(sandbox_hub.root, SANDBOX_REPO, tmp_path / "big", branch=None)
    incoming = f"{REPO_DIR}/{sha}.partial/{w.INCOMING}"
    env = {**os.environ, "GPUSERVE_SANDBOX_INSTANCE": str(sandbox.instance)}
    proc = subprocess.Popen(
        [os.path.join(os.path.dirname(sys.executable), "pyinfra"), "-y", INVENTORY, DEPLOY,
         "--data", f"weights_cache={cache}", "--data", f"model_revision={sha}",
         "--data", "weights_bwlimit_kib=4096"],
        cwd=REPO, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    got = {}
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and not any(n > 3_000_000 for n in got.values()):
            for h in hosts:
                out = sandbox.ssh(h, f"du -sb {incoming} 2>/dev/null || echo 0").stdout
                got[h.name] = int(out.split()[0])
            time.sleep(0.2)
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    assert any(0 < n < big["total_size"] for n in got.values()), got
    time.sleep(1)
    rsyncs = subprocess.run(["pgrep", "-f", f"rsync .*{sha}"], capture_output=True, text=True)
    assert rsyncs.stdout == "", "a transfer outlived the killed pyinfra"
    for h in hosts:
        assert sha not in listing(sandbox, h)  # never a final dir before verification
        assert sandbox.ssh(h, "pgrep -x rsync || true").stdout.strip() == ""
    run = converge("--data", f"model_revision={sha}")
    moved = wire(run.output)
    for h in hosts:
        assert sha in listing(sandbox, h) and f"{sha}.partial" not in listing(sandbox, h)
        assert sums(sandbox, h, sha) == {p: f["sha256"] for p, f in big["files"].items()}
        assert moved[h.name]["bytes"] < big["total_size"] - got[h.name] + 65536, (moved, got)
    print(f"\nkill -9: hosts had {got} of {big['total_size']} bytes; the rerun sent "
          f"{[m['bytes'] for m in moved.values()]}")


@pytest.mark.faults
def test_a_full_disk_is_refused_before_any_download(sandbox, hosts, revs, cache, converge, sandbox_hub):
    v3 = revs[3]
    run = converge("--data", f"model_revision={v3['sha']}", "--data", "weights_free_margin_gib=16384",   # the most allowed: 16 TiB
                   ok=False)
    assert run.returncode != 0
    for h in hosts:
        msg = re.search(rf"{h.name}: refusing to download: (\S+) has .* free \((\d+) bytes\), the "
                        r"checkpoint needs .* \((\d+) bytes\) \+ a margin of", run.output)
        assert msg, run.output[-3000:]
        assert msg[1] == REPO_DIR and int(msg[3]) == v3["files"][v3["varied_shard"]]["size"]
        assert not [n for n in listing(sandbox, h) if n.startswith(v3["sha"])]
    assert sandbox_hub.bytes_served == 0
    assert not os.path.exists(os.path.join(cache, SANDBOX_REPO.replace("/", "--"), v3["sha"]))
    assert "No hosts remaining" in run.output  # both refused at the first weights operation


@pytest.mark.faults
def test_hub_errors_fail_clearly_and_leave_nothing_half_done(sandbox, hosts, revs, cache, converge,
                                                              sandbox_hub):
    v4 = revs[4]
    sandbox_hub.inject_fault("status", status=500, count=None, match="*/resolve/*", methods=["GET"])
    try:
        run = converge("--data", f"model_revision={v4['sha']}", ok=False)
    finally:
        sandbox_hub.clear_faults()
    assert run.returncode != 0
    for h in hosts:
        assert re.search(rf"{h.name}: checkpoint {SANDBOX_REPO}@{v4['sha'][:12]}: downloading "
                         rf"{SANDBOX_REPO} on http://\S+ @ {v4['sha']} file {v4['varied_shard']}: .*500",
                         run.output), run.output[-3000:]
        assert not [n for n in listing(sandbox, h) if n.startswith(v4["sha"])]
    assert sandbox_hub.stats()["faults_fired"] == 1  # asked once for the fleet, not per host
    assert not os.path.exists(os.path.join(cache, SANDBOX_REPO.replace("/", "--"), v4["sha"]))
    converge("--data", f"model_revision={v4['sha']}")  # the hub is back: converges


def test_per_host_hub_downloads_fetch_only_what_each_host_lacks(sandbox, hosts, revs, converge,
                                                               sandbox_hub):
    v5 = revs[5]
    varied = v5["varied_shard"]
    run = converge("--data", f"model_revision={v5['sha']}", "--data", "weights_fanout=hub")
    assert sandbox_hub.bytes_by_file == {f"{SANDBOX_REPO}/{varied}": 2 * v5["files"][varied]["size"]}
    for h in hosts:
        assert sums(sandbox, h, v5["sha"]) == {p: f["sha256"] for p, f in v5["files"].items()}
    assert converge("--data", f"model_revision={v5['sha']}", "--data", "weights_fanout=hub").changed == 0
    assert run.errors == 0


@pytest.mark.faults
def test_corruption_that_keeps_size_and_mtime_needs_a_full_verify(sandbox, hosts, revs, converge):
    """What the cheap default does not catch, and the key that does (docs/weights.md)."""
    v5 = revs[5]
    victim = hosts[0]
    path = f"{REPO_DIR}/{v5['sha']}/{v5['shards'][0]}"
    sandbox.ssh(victim, f"python3 -c \"import os; p='{path}'; st=os.stat(p); f=open(p,'r+b'); "
                f"f.seek(2048); b=f.read(1); f.seek(2048); f.write(bytes([b[0]^255])); f.close(); "
                f"os.utime(p, ns=(st.st_atime_ns, st.st_mtime_ns))\"")
    assert converge("--data", f"model_revision={v5['sha']}").changed == 0  # not seen: by design
    run = converge("--data", f"model_revision={v5['sha']}", "--data", "weights_verify=full")
    assert op_row(run.output, "Checkpoint") == (1, 0, 1)
    assert wire(run.output)[victim.name]["how"] == "repaired", run.output[-2500:]
    assert sums(sandbox, victim, v5["sha"]) == {p: f["sha256"] for p, f in v5["files"].items()}
