"""Weights fan-out at fleet scale: hosts feed hosts, shard by shard, on shaped links.

    .venv/bin/python bench/fanout.py          # as root: 8 fresh sandbox hosts, about 30 minutes

Every link of the sandbox is limited to the same rate with ``tc ... tbf`` (the control node's
bridge, each host's receive side and each host's send side; ``gpuserve_sandbox.network.shape``), so
bandwidth decides, not this machine's 2 cores (at the default 40 Mbit/s; at 160 Mbit/s, 8 hosts' SSH
sessions, rsync and sha256 need more CPU than 2 cores have, and the run measures that). A random checkpoint of ``--gib`` GiB in ``--shards``
files is staged with deploys/weights.py and ``weights_fanout = "hosts"`` on N = 1, 4 and 8 hosts,
each run a fresh revision on hosts that hold nothing of it, then once more on 8 hosts with an
interior parent powered off mid-copy. Printed side by side:

* control-node egress / checkpoint: what the bridge device sent (every byte, pyinfra's SSH included)
  and what the pusher's rsync counted. The star (every host copies from the control node) is N;
* stage time at N / stage time at N = 1: the whole pyinfra run, and the copy window alone (the
  first host's fetch unit start to the last host's last verified shard). The star is about N, a
  tree that forwards whole revisions about 1 + its depth;
* the killed run: every live host verified (sha256 of every file), its stage time, and what the
  orphans said.

The staging timeline of the N = 8 runs is drawn to ``bench/fanout.png`` (a bar per shard and host,
coloured by where it came from).
"""

from __future__ import annotations

import hashlib
import json
import random
import re
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

from benchfleet import INV, REPO, arguments, fleet, table

from gpuserve import fanout, layout
from gpuserve_sandbox import fleet as fleet_view, network
from gpuserve_sandbox.hub import publish_checkpoint
from gpuserve_sandbox.runner import pyinfra_in_background

NVME = "/srv/nvme"  # group_data/sandbox.py
PLOT = REPO / "bench" / "fanout.png"
ANSI = re.compile(r"\x1b\[[0-9;]*m")
FRESH_LOG = "/var/tmp/gpuserve-bench-fanout-fresh.log"   # the fresh host's converge, line by line
PACKAGES = "Packages (while the engine venv builds)"   # gpuserve.layers.packages
BUILT = re.compile(r"engine venv \S+: \[\d+ s\] built ")   # the wait saw the build's last step


def extra_arguments(ap) -> None:
    ap.add_argument("--rate-mbit", type=float, default=40,
                    help="every link's rate, each direction (default 40 Mbit/s: 1 GiB in ~215 s; "
                         "at 160, 8 hosts' SSH and hashing outrun 2 cores)")
    ap.add_argument("--gib", type=float, default=1.0, help="checkpoint size in GiB (default 1)")
    ap.add_argument("--shards", type=int, default=32, help="checkpoint files (default 32)")
    ap.add_argument("--degree", type=int, default=2, help="weights_fanout_degree (default 2)")
    ap.add_argument("--sizes", default="1,4,8", help="fleet sizes to stage, in order (default 1,4,8)")
    ap.add_argument("--no-kill", action="store_true", help="skip the run with a parent killed")
    ap.add_argument("--fresh-gib", type=float, default=1.0,
                    help="fresh-host converge: GiB beside the servable tiny model (default 1; 0: skip)")


def random_file(path: Path, size: int, rng: random.Random) -> str:
    """``size`` random bytes (incompressible: rsync and SSH cannot shrink them); their sha256."""
    h = hashlib.sha256()
    with open(path, "wb") as fh:
        left = size
        while left:
            chunk = rng.randbytes(min(left, 8 << 20))
            h.update(chunk)
            fh.write(chunk)
            left -= len(chunk)
    return h.hexdigest()


def make_checkpoint(root: Path, gib: float, shards: int) -> dict:
    """Random shards and a config.json."""
    root.mkdir(parents=True)
    rng = random.Random(24)
    each = int(gib * 2**30) // shards
    files = {}
    for i in range(1, shards + 1):
        name = f"model-{i:05d}-of-{shards:05d}.safetensors"
        files[name] = random_file(root / name, each, rng)
    cfg = json.dumps({"architectures": ["BenchFanout"], "shards": shards}).encode()
    (root / "config.json").write_bytes(cfg)
    files["config.json"] = hashlib.sha256(cfg).hexdigest()
    return {"files": files, "sizes": {n: (each if n != "config.json" else len(cfg)) for n in files},
            "total": each * shards + len(cfg)}


def stage(f, tmp: Path, ckpt: dict, src: Path, n: int, degree: int, kill: bool = False) -> dict:
    """One fan-out of a fresh revision to the first n hosts; what it cost and how long it took."""
    repo = f"gpuserve-test/fanout-n{n}{'-kill' if kill else ''}"
    sha = publish_checkpoint(f.hub.root, repo, src, branch=None)
    repo_dir = layout.model_repo_dir(NVME, repo)
    hosts = f.hosts[:n]
    names = [h.name for h in hosts]
    cache = tmp / f"cache-{n}{'-kill' if kill else ''}"
    victim = orphan = None
    if kill:
        plan = fanout.plan(names, ckpt["sizes"], degree)
        victim = next(h for h in names if any(plan.children(j, h) and plan.parents[j][h]
                                              for j in range(len(plan.stripes))))
        stripe = next(j for j in range(len(plan.stripes)) if plan.children(j, victim))
        orphan = plan.children(stripe, victim)[0]
    bridge = network.bridge_name(f.sandbox.instance)
    tx0 = network.tx_bytes(bridge)
    log_path = tmp / f"run-{n}{'-kill' if kill else ''}.log"
    extra = ["--data", "weights_fanout=hosts", "--data", f"model_repo={repo}", "--data", f"model_revision={sha}",
             "--data", f"weights_fanout_degree={degree}", "--data", "weights_progress_s=10",
             "--data", f"weights_cache={cache}", *f.limit(n)]
    print(f"\n== N = {n}{' (a parent killed mid-copy)' if kill else ''}: {repo}@{sha[:12]}", flush=True)
    killed_at = killed_epoch = None
    t0 = time.monotonic()
    with open(log_path, "w") as log, pyinfra_in_background(INV, "deploys/weights.py", *extra,
                                                           instance=f.sandbox.instance, log=log) as proc:
        if kill:
            vh = hosts[names.index(victim)]
            deadline = time.monotonic() + 900
            while time.monotonic() < deadline:   # bounded: until the victim holds half its stripe
                doc = fleet_view.fanout_progress(f.sandbox, vh, repo_dir, sha)
                if len([e for e in doc.get("events", []) if e["path"] in plan.stripes[stripe]]) \
                        >= max(1, len(plan.stripes[stripe]) // 2):
                    break
                if proc.poll() is not None:
                    raise SystemExit(f"the run ended before the victim got its shards:\n"
                                     f"{log_path.read_text()[-3000:]}")
                time.sleep(0.5)
            else:
                raise SystemExit("the victim never verified half of its stripe")
            f.sandbox._stop(vh)   # powered off for good: its namespace and links go with it
            killed_at, killed_epoch = time.monotonic() - t0, time.time()
            print(f"   {victim} powered off at {killed_at:.1f} s (a parent of {orphan})", flush=True)
        proc.wait(timeout=3600)
    wall = time.monotonic() - t0
    egress = network.tx_bytes(bridge) - tx0
    output = log_path.read_text()
    live = [h for h in hosts if h.name != victim]
    docs = {h.name: fleet_view.fanout_progress(f.sandbox, h, repo_dir, sha) for h in live}
    verified = {h.name: fleet_view.checkpoint_sums(f.sandbox, h, f"{repo_dir}/{sha}") == ckpt["files"] for h in live}
    push = json.loads((Path(cache) / "fanout" / f"push-{sha}.state.json").read_text())
    starts = [d["started"] for d in docs.values() if d]
    ends = [max(e["t1"] for e in d["events"]) for d in docs.values() if d.get("events")]
    window = max(ends) - min(starts) if starts and ends else float("nan")
    fleet_lines = [line.strip() for line in output.splitlines() if "fleet:" in line]
    print(f"   pyinfra exit {proc.returncode} after {wall:.1f} s; copy window {window:.1f} s; "
          f"verified {sum(verified.values())}/{len(live)}; bridge sent {egress / ckpt['total']:.3f}x, "
          f"pusher {push.get('sent_bytes', 0) / ckpt['total']:.3f}x", flush=True)
    for line in fleet_lines[-2:]:
        print(f"   {line}")
    if not kill and proc.returncode != 0:
        raise SystemExit(f"N = {n}: pyinfra failed:\n{output[-4000:]}")
    notes = {name: d.get("notes", []) for name, d in docs.items() if d.get("notes")}
    for h in live:   # the next runs need the disk
        f.sandbox.ssh(h, f"rm -rf {repo_dir}", check=False, timeout=300)
    shutil.rmtree(cache, ignore_errors=True)
    return {"n": n, "wall": wall, "window": window, "egress": egress, "sent": push.get("sent_bytes", 0),
            "push_state": push.get("state"), "verified": verified, "docs": docs, "victim": victim,
            "orphan": orphan, "killed_at": killed_at, "killed_epoch": killed_epoch, "notes": notes, "rc": proc.returncode,
            "run_said": [line.strip() for line in output.splitlines()
                         if "weights fan-out" in line and victim and victim in line][:6]}


def fresh_host(f, tmp: Path, gib: float, dead: str | None) -> dict:
    """deploys/serve.py on a host that has nothing yet (no venv, no weights, no unit), with
    ``weights_fanout = "hosts"``: the copy starts at the top of the converge, in the host's unit,
    while the engine's venv builds; the weights step waits for it. The checkpoint is the tiny
    servable model plus ``gib`` GiB under ``original/`` (as Meta's repositories carry their
    original weights beside the safetensors; vLLM reads only the top-level safetensors), so that
    the copy takes as long as real weights would beside the other steps."""
    from gpuserve_sandbox.tiny_checkpoint import make_tiny_checkpoint

    src = tmp / "fresh-ckpt"
    make_tiny_checkpoint(src, seed=24)
    rng = random.Random(25)
    (src / "original").mkdir()
    parts = 8
    for i in range(parts):
        random_file(src / "original" / f"consolidated.{i:02d}.pth", int(gib * 2**30) // parts, rng)
    repo = "gpuserve-test/fanout-fresh"
    sha = publish_checkpoint(f.hub.root, repo, src, branch=None)
    repo_dir = layout.model_repo_dir(NVME, repo)
    host = next(h for h in f.hosts if h.name != dead)   # nothing of this run on it yet
    extra = ["--data", "weights_fanout=hosts", "--data", f"model_repo={repo}", "--data", f"model_revision={sha}",
             "--data", "weights_progress_s=10", "--data", f"weights_cache={tmp / 'cache-fresh'}",
             "--limit", host.name]
    print(f"\n== fresh host {host.name}: deploys/serve.py, {repo}@{sha[:12]}", flush=True)
    marks: list[tuple[float, str]] = []
    built = None   # when the wait for the venv's background build printed its last step
    lines = []
    t0 = time.monotonic()
    with pyinfra_in_background(INV, "deploys/serve.py", *extra, instance=f.sandbox.instance,
                               log=subprocess.PIPE) as proc:
        for raw in proc.stdout:   # bounded by the run itself (its own timeouts end it)
            # pyinfra styles the operation's name (bold) even into a pipe
            line = ANSI.sub("", raw.decode(errors="replace"))
            lines.append(line)
            if "Starting operation:" in line:
                marks.append((time.monotonic() - t0, line.split("Starting operation:", 1)[1].strip()))
            elif built is None and BUILT.search(line):
                built = time.monotonic() - t0
        proc.wait(timeout=60)
    wall = time.monotonic() - t0
    if proc.returncode != 0:
        raise SystemExit(f"fresh host converge failed:\n{''.join(lines)[-4000:]}")
    doc = fleet_view.fanout_progress(f.sandbox, host, repo_dir, sha)

    Path(FRESH_LOG).write_text("".join(lines))
    # when each operation started (s from the run's start): where the converge's time went
    Path(FRESH_LOG).with_suffix(".marks").write_text("".join(f"{t:7.1f} {name}\n" for t, name in marks))

    def first(prefix: str) -> float | None:
        """When the run started the first operation of a deploy layer (pyinfra names an operation
        "<deploy> | <operation>")."""
        found = [t for t, name in marks if name.split(" | ", 1)[0] == prefix]
        return found[0] if found else None

    eng0, pkg0, venv_wait0 = first("Engine"), first(PACKAGES), first("Engine: wait")
    wait0, svc0 = first("Weights fan-out: wait"), first("Service")
    if None in (eng0, pkg0, venv_wait0, wait0, svc0, built):
        raise SystemExit(f"the run's output ({FRESH_LOG}) lacks a step (or the venv's last build step); "
                         f"operations seen: {sorted({name.split(' | ', 1)[0] for _, name in marks})}")
    gpu0 = first("GPU stack")   # None: the host's recipe has no GPU stack to install (cpu)
    copy = max(e["t1"] for e in doc["events"]) - doc["started"]
    # the venv: its wheels pushed by pyinfra, then built in a host unit while the packages install
    steps = {"GPU stack": eng0 - gpu0 if gpu0 is not None else 0.0, "engine venv": built - eng0,
             "weights copy (host unit)": copy, "packages (beside the venv's build)": venv_wait0 - pkg0,
             "venv and weights waits (after the packages)": svc0 - venv_wait0,
             "unit, start, ready and proxy": wall - svc0}
    return {"host": host.name, "wall": wall, "steps": steps, "copy": copy,
            "serial": (steps["GPU stack"] + steps["engine venv"] + copy + steps["packages (beside the venv's build)"]
                       + steps["unit, start, ready and proxy"]),
            "bytes": sum(p.stat().st_size for p in src.rglob("*") if p.is_file())}


def plot(runs: list[dict], path: Path, rate_mbit: float, total: int) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(len(runs), 1, figsize=(11, 2.2 + 0.45 * sum(len(r["docs"]) for r in runs)),
                             squeeze=False)
    one_copy = total * 8 / (rate_mbit * 1e6)
    for ax, r in zip(axes[:, 0], runs):
        docs = {k: d for k, d in r["docs"].items() if d}
        t_start = min(d["started"] for d in docs.values())
        names = sorted(docs, key=lambda s: int(s.rsplit("-", 1)[1]))
        for y, name in enumerate(names):
            last: dict[str, float] = {}
            for e in sorted(docs[name]["events"], key=lambda e: e["t1"]):
                begin = max(e["t0"], last.get("t", e["t0"]))
                last["t"] = e["t1"]
                colour = "#1f4e79" if e["source"] == "control node" else "#7fb3d5"
                ax.barh(y, e["t1"] - begin, left=begin - t_start, height=0.6, color=colour,
                        edgecolor="white", linewidth=0.5)
        ax.set_yticks(range(len(names)), names)
        ax.axvline(one_copy, color="grey", linestyle=":", label=f"one copy at the link rate ({one_copy:.0f} s)")
        if r["killed_at"] is not None and r["victim"]:
            ax.axvline(r["killed_epoch"] - t_start, color="red", linestyle="--",
                       label=f"{r['victim']} powered off (run time {r['killed_at']:.0f} s)")
        ax.set_title(f"N = {r['n']}{', a parent killed' if r['victim'] else ''}: copy window "
                     f"{r['window']:.0f} s, control node sent {r['egress'] / total:.2f}x the checkpoint")
        ax.set_xlabel("seconds since the first host's fetch unit started")
        ax.bar(0, 0, color="#1f4e79", label="shard from the control node")
        ax.bar(0, 0, color="#7fb3d5", label="shard from another host")
        ax.legend(loc="lower right", fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def report(runs: list[dict], killed: dict | None, args, total: int) -> None:
    base = runs[0]
    rows = []
    for r in runs:
        rows.append((f"N = {r['n']}: control-node egress / checkpoint (bridge device)",
                     f"{r['egress'] / total:.3f}", f"star {r['n']}.0; target <= 1.05"))
        rows.append((f"N = {r['n']}: pusher's rsync bytes / checkpoint", f"{r['sent'] / total:.3f}", ""))
    for r in runs[1:]:
        rows.append((f"stage time N = {r['n']} / N = {base['n']} (pyinfra run)",
                     f"{r['wall'] / base['wall']:.2f}", f"star ~{r['n']}; target <= 1.5"))
        rows.append((f"stage time N = {r['n']} / N = {base['n']} (copy window)",
                     f"{r['window'] / base['window']:.2f}", f"star ~{r['n']}; target <= 1.5"))
    table(f"Fan-out of a {total / 2**30:.2f} GiB checkpoint in {args.shards} shards, degree "
          f"{args.degree}, every link {args.rate_mbit:g} Mbit/s", rows)
    print("\n  " + "; ".join(f"N = {r['n']}: run {r['wall']:.0f} s, window {r['window']:.0f} s"
                             for r in runs))
    plotted = [runs[-1]]
    if killed:
        k = killed
        table(f"A parent killed mid-copy, N = {k['n']}: {k['victim']} powered off at "
              f"{k['killed_at']:.0f} s", [
                  ("live hosts verified (sha256 of every file)",
                   f"{sum(k['verified'].values())}/{len(k['verified'])}", "all"),
                  ("stage time (pyinfra run, s)", f"{k['wall']:.0f}",
                   f"the unkilled N = {k['n']} run: {runs[-1]['wall']:.0f}"),
                  ("copy window (s)", f"{k['window']:.0f}", f"unkilled: {runs[-1]['window']:.0f}"),
                  ("control-node egress / checkpoint", f"{k['egress'] / total:.3f}", "target <= 1.05"),
                  ("pyinfra exit (the dead host's own step fails, by name)", str(k["rc"]), "non-zero"),
              ])
        for name, said in k["notes"].items():
            for note in said[:3]:
                print(f"  {name}: {note}")
        for line in k["run_said"][:3]:
            print(f"  run: {line}")
        plotted.append(k)
    plot(plotted, PLOT, args.rate_mbit, total)
    print(f"\ntimeline: {PLOT.relative_to(REPO)}")


def main() -> None:
    args = arguments(__doc__.splitlines()[0], default_instance=22, hosts=8, extra=extra_arguments)
    sizes = [int(x) for x in args.sizes.split(",") if x.strip()]   # "": the fresh host only
    if sizes and max(sizes) > args.hosts:
        raise SystemExit(f"--sizes {args.sizes}: at most --hosts {args.hosts}")
    with fleet(args) as f, tempfile.TemporaryDirectory(prefix="bench-fanout-", dir="/var/tmp") as t:
        tmp = Path(t)
        t0 = time.monotonic()
        ckpt = make_checkpoint(tmp / "ckpt", args.gib, args.shards)
        total = ckpt["total"]
        print(f"checkpoint: {total / 2**30:.2f} GiB in {args.shards} shards (+ config.json), made in "
              f"{time.monotonic() - t0:.0f} s; every link shaped to {args.rate_mbit:g} Mbit/s: one copy "
              f"takes {total * 8 / (args.rate_mbit * 1e6):.0f} s at that rate", flush=True)
        machines = [h.machine for h in f.hosts]
        network.shape(f.sandbox.instance, machines, args.rate_mbit)
        try:
            runs = [stage(f, tmp, ckpt, tmp / "ckpt", n, args.degree) for n in sizes]
            killed = None if args.no_kill or not sizes else stage(f, tmp, ckpt, tmp / "ckpt", max(sizes),
                                                                  args.degree, kill=True)
        finally:
            network.unshape(f.sandbox.instance, machines)   # tc is quiet about a host powered off
        if runs:
            report(runs, killed, args, total)
        if args.fresh_gib > 0:
            live = [h.machine for h in f.hosts if not killed or h.name != killed["victim"]]
            network.shape(f.sandbox.instance, live, args.rate_mbit)
            try:
                fr = fresh_host(f, tmp, args.fresh_gib, killed and killed["victim"])
            finally:
                network.unshape(f.sandbox.instance, live)
            longest = max(fr["steps"]["GPU stack"], fr["steps"]["engine venv"], fr["copy"],
                          fr["steps"]["unit, start, ready and proxy"])
            table(f"Fresh host {fr['host']}: deploys/serve.py with the copy overlapped "
                  f"({fr['bytes'] / 2**30:.2f} GiB, links {args.rate_mbit:g} Mbit/s)",
                  [(name, f"{sec:.0f} s", "") for name, sec in fr["steps"].items()] + [
                      ("converge wall", f"{fr['wall']:.0f} s", ""),
                      ("converge wall / longest step", f"{fr['wall'] / longest:.3f}", "target <= 1.2"),
                      ("steps one after another / converge wall", f"{fr['serial'] / fr['wall']:.2f}",
                       "what the overlap saved"),
                  ])


if __name__ == "__main__":
    main()
