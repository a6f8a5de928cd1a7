"""Weights traffic: what a converge pulls from the hub and what a revision bump moves.

    .venv/bin/python bench/weights_traffic.py     # as root: 4 fresh sandbox hosts, a few minutes

Side by side, on the same hosts, with deploys/weights.py (the weights layer alone):
  * hub egress of a 4-host converge with the default fan-out (the control node downloads once,
    then rsyncs to the hosts) vs the per-host baseline (weights_fanout=hub: every host downloads),
    each as bytes the hub served / checkpoint size;
  * a revision bump that changes one shard: bytes moved to each host / bytes changed (rsync's
    own count and the host's eth0 receive counter), and the disk the rollback copy (the previous
    revision, kept) adds / bytes changed.
"""

from __future__ import annotations

from benchfleet import SANDBOX_SEED, arguments, fleet, table

from gpuserve import layout
from gpuserve_sandbox.fleet import rx_bytes, wire

NVME = "/srv/nvme"  # group_data/sandbox.py
HIDDEN = 1024


def main() -> None:
    args = arguments(__doc__.splitlines()[0], default_instance=31)
    with fleet(args) as f:
        n = len(f.hosts)
        # the tiny model made bigger (hidden 1024: about 130 MB in 9 files), so that pyinfra's own
        # SSH traffic is small beside the bytes measured; only the weights layer runs here
        repo, baseline_repo = "gpuserve-test/bench-weights", "gpuserve-test/bench-weights-baseline"
        sha_a, a = f.publish(repo=repo, hidden_size=HIDDEN)
        sha_b, b = f.publish(repo=baseline_repo, seed=SANDBOX_SEED + 1, hidden_size=HIDDEN)

        f.hub.reset_stats()
        f.pyinfra("deploys/weights.py", "--data", f"model_repo={repo}", "--data", f"model_revision={sha_a}")
        fanout = f.hub.bytes_served / a["total_size"]

        f.hub.reset_stats()
        f.pyinfra("deploys/weights.py", "--data", f"model_repo={baseline_repo}", "--data",
                  f"model_revision={sha_b}", "--data", "weights_fanout=hub")
        per_host = f.hub.bytes_served / b["total_size"]
        table(f"Hub egress, {n}-host converge of a {a['total_size'] / 2**20:.1f} MiB checkpoint "
              "(bytes served / checkpoint size)", [
                  ("control-node fan-out (default)", f"{fanout:.2f}", "target 1.0"),
                  ("per-host download (weights_fanout=hub)", f"{per_host:.2f}", f"baseline {n}.0"),
              ])

        sha_a1, a1 = f.publish(repo=repo, variant=1, hidden_size=HIDDEN)
        varied = a1["varied_shard"]
        changed = a1["files"][varied]["size"]
        before = {h.name: rx_bytes(f.sandbox, h) for h in f.hosts}
        f.hub.reset_stats()
        run = f.pyinfra("deploys/weights.py", "--data", f"model_repo={repo}", "--data",
                        f"model_revision={sha_a1}")
        rsync = {name: moved["bytes"] for name, moved in wire(run.output).items()}
        eth0 = {h.name: rx_bytes(f.sandbox, h) - before[h.name] for h in f.hosts}
        repo_dir = layout.model_repo_dir(NVME, repo)
        extra = []
        for h in f.hosts:
            # du counts a hardlinked file once, under the first directory named: the second line
            # is what the kept previous revision adds on disk beyond the new one
            out = f.sandbox.ssh(h, f"du -sb {repo_dir}/{sha_a1} {repo_dir}/{sha_a}").stdout.split()
            extra.append(int(out[2]))
        table(f"Revision bump: 1 of {len(a1['files'])} files changed, {changed / 2**20:.2f} MiB "
              f"(checkpoint {a1['total_size'] / 2**20:.1f} MiB), {n} hosts", [
                  ("hub bytes served / changed", f"{f.hub.bytes_served / changed:.4f}", "1.0 (fetched once)"),
                  ("rsync bytes to a host / changed (max)", f"{max(rsync.values()) / changed:.4f}",
                   "target <= 1.05"),
                  ("eth0 bytes into a host / changed (max, incl. SSH)", f"{max(eth0.values()) / changed:.4f}",
                   "target <= 1.05"),
                  ("rollback copy disk / changed (max)", f"{max(extra) / changed:.4f}",
                   f"a full copy would be {a['total_size'] / changed:.1f}"),
              ])
        assert set(rsync) == {h.name for h in f.hosts}, run.output[-3000:]


if __name__ == "__main__":
    main()
