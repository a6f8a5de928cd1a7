"""A driver bump on 4 serving hosts through deploys/upgrade.py, under a client loop.

    .venv/bin/python bench/stack_rollout.py     # as root: 4 fresh hopper_x8 sandbox hosts, ~40 min on 2 cores

Side by side in one run, on the same hosts:
  * one host's stop-to-ready: `systemctl stop` of its engine, then start, until the proxy's
    /health answers 200 (what any move costs at least);
  * one host's reboot-to-ready: a reboot, until the proxy's /health answers 200;
  * the rolling driver upgrade (580.95.05 -> 580.105.08, max_unavailable 1): wall time, and wall
    time / (4 x stop-to-ready) and / (4 x reboot-to-ready); failed requests; fewest hosts in rotation.

It draws the upgrade's timeline (hosts in and out of rotation, every request's latency) to
bench/stack_rollout.png (gpuserve_sandbox.timeline).
"""

from __future__ import annotations

import time
from pathlib import Path

from benchfleet import arguments, fleet, median, table

from gpuserve import layout
from gpuserve_sandbox import fleet as view
from gpuserve_sandbox import timeline
from gpuserve_sandbox.loadloop import LoadLoop

DEP = "minimax"
NEW = "580.105.08"


def _health(f, host) -> int:
    try:
        return view.proxy_request(f.sandbox, host, f.certs, "/health", timeout=10)[0]
    except OSError:   # the proxy is down with the host (a reboot): not ready yet
        return 0


def _ready(f, host, t0: float) -> float:
    deadline = t0 + 1200
    while _health(f, host) != 200:
        if time.monotonic() > deadline:
            raise SystemExit(f"{host.name}: not ready within 1200 s")
        time.sleep(0.5)
    return time.monotonic() - t0


def stop_to_ready(f, host) -> float:
    t0 = time.monotonic()
    f.sandbox.ssh(host, f"systemctl stop {layout.unit_name(DEP)} && systemctl start {layout.unit_name(DEP)}",
                  timeout=1200)
    return _ready(f, host, t0)


def reboot_to_ready(f, host) -> float:
    t0 = time.monotonic()
    f.sandbox.ssh(host, "( sleep 1 && reboot ) </dev/null >/dev/null 2>&1 &", check=False)
    time.sleep(3)
    return _ready(f, host, t0)


def main() -> None:
    args = arguments(__doc__.splitlines()[0], default_instance=32)
    with fleet(args, profile="hopper_x8") as f:
        n = len(f.hosts)
        f.pyinfra("deploys/serve.py")
        host = f.hosts[0]
        stops = [stop_to_ready(f, host) for _ in range(2)]
        reboots = [reboot_to_ready(f, host)]
        with LoadLoop(view.endpoints(f.sandbox, f.hosts, f.certs), view.client_key(f.sandbox),
                      "tiny-chat") as loop:
            loop.wait_until_serving()
            up = f.pyinfra("deploys/upgrade.py", "--data", f"nvidia_driver_version={NEW}")
        s = loop.stats
        png = timeline.plot(s, Path(__file__).with_suffix(".png"),
                            f"Driver {NEW} rolled over {n} serving hosts (deploys/upgrade.py, max_unavailable 1)")
        moved = sum(1 for h in f.hosts if f.sandbox.ssh(
            h, "dpkg-query -W -f='${Version}' nvidia-open").stdout.startswith(NEW))
        table(f"Rolling driver upgrade of {n} hosts under a client loop (max_unavailable 1)", [
            ("hosts on the new driver", f"{moved}/{n}", f"must be {n}/{n}"),
            ("one host: stop to ready", " / ".join(f"{x:.0f} s" for x in stops), ""),
            ("one host: reboot to ready", " / ".join(f"{x:.0f} s" for x in reboots), ""),
            ("upgrade run (wall)", f"{up.seconds:.0f} s", ""),
            (f"wall / ({n} x stop to ready)", f"{up.seconds / (n * median(stops)):.2f}", ""),
            (f"wall / ({n} x reboot to ready)", f"{up.seconds / (n * median(reboots)):.2f}", ""),
            ("requests ok", str(s.ok), ""),
            ("requests failed", str(s.failed), "target 0"),
            ("fewest hosts in rotation", str(s.min_in_rotation), f"target {n - 1}"),
        ])
        print(f"timeline: {png}")
        for failure in s.failures[:5]:
            print(f"  failure: {failure}")


if __name__ == "__main__":
    main()
