"""Monitoring measurements on a converged sandbox with a monitor host (docs/monitoring.md).

    export GPUSERVE_SANDBOX_INSTANCE=N
    gpuserve sandbox up --instance N --profile cpu --profile monitor
    pyinfra -y inventories/sandbox.py deploys/serve.py --data operator_keys_file=<file> \\
        --data monitor_scrape_interval_s=5
    .venv/bin/python bench/monitoring.py [--skip-hang]

1. Scrape cost: CPU seconds that node-exporter and the engine's API server spend per scrape
   (SCRAPES back-to-back scrapes on the host, minus the same wall time idle), and so per minute
   at the default 15 s interval.
2. Hang detection: SIGSTOP of the engine core while requests run; seconds until the watchdog
   restarts the engine, /health statuses during the hang, the watchdog's log, and whether the
   monitor's Prometheus shows GpuserveWatchdogRestarted firing.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

from gpuserve_sandbox import hang
from gpuserve_sandbox.fleet import client_key
from gpuserve_sandbox.hosts import Sandbox

SCRAPES = 40
TICKS = 100   # USER_HZ on Linux


def cpu_s(sandbox, host, pid: str) -> float:
    fields = sandbox.ssh(host, f"cat /proc/{pid}/stat").stdout.rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICKS   # utime + stime


def per_scrape(sandbox, host, pid: str, url: str, headers: str = "") -> tuple[float, float]:
    """(CPU s per scrape, wall s per scrape) of ``pid`` serving ``url`` SCRAPES times."""
    t0, c0 = time.time(), cpu_s(sandbox, host, pid)
    sandbox.ssh(host, f"for i in $(seq {SCRAPES}); do curl -fsS -o /dev/null {headers} {url}; done")
    wall, busy = time.time() - t0, cpu_s(sandbox, host, pid) - c0
    c1 = cpu_s(sandbox, host, pid)
    time.sleep(wall)   # the same wall time idle: what the process spends anyway
    idle = cpu_s(sandbox, host, pid) - c1
    return max(0.0, busy - idle) / SCRAPES, wall / SCRAPES


def _s(value: float | None) -> str:
    return "never" if value is None else f"{value:.1f}"


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--skip-hang", action="store_true")
    args = p.parse_args()
    box = Sandbox()
    hosts = box.hosts()
    serving = next(h for h in hosts if h.host_spec.profile != "monitor")
    monitor = next(h for h in hosts if h.host_spec.profile == "monitor")
    ne_pid = box.ssh(serving, "systemctl show -p MainPID --value prometheus-node-exporter").stdout.strip()
    api_pid = box.ssh(serving, "systemctl show -p MainPID --value gpuserve-minimax").stdout.strip()
    ne, ne_wall = per_scrape(box, serving, ne_pid, "http://127.0.0.1:9100/metrics")
    en, en_wall = per_scrape(box, serving, api_pid, "http://127.0.0.1:8000/metrics")
    per_min = 60 / 15
    print(f"scrape cost ({SCRAPES} scrapes each, minus idle): node-exporter {ne * 1000:.1f} ms CPU "
          f"per scrape ({ne_wall * 1000:.0f} ms wall) = {ne * per_min:.3f} CPU s/min at 15 s; "
          f"engine /metrics {en * 1000:.1f} ms CPU per scrape ({en_wall * 1000:.0f} ms wall) = "
          f"{en * per_min:.3f} CPU s/min at 15 s")
    if args.skip_hang:
        return 0
    stall = int(box.ssh(serving, "python3 -c \"import json; print(json.load(open("
                                 "'/etc/gpuserve/minimax/watchdog.json'))['stall_s'])\"").stdout)
    with tempfile.TemporaryDirectory() as tmp:
        rec = hang.hang_engine(box, serving, Path(tmp), client_key(box), "tiny-chat",
                               wait_s=stall + 120)
        fired = hang.wait_alert(box, monitor, "GpuserveWatchdogRestarted", wait_s=120)
        alert_s = time.time() - rec.stopped_at   # an upper bound: checked after the restart
        ready = hang.wait_ready(box, serving, Path(tmp))
    print(f"hang: {rec.running_before:g} request(s) running at SIGSTOP; watchdog_stall_s = {stall}")
    print(f"hang: restart issued {_s(rec.restart_after_s)} s after SIGSTOP, new engine process after "
          f"{_s(rec.new_engine_after_s)} s (limit watchdog_stall_s + 30 = {stall + 30} s)")
    print(f"hang: /health through the proxy during the hang: {rec.health_during_hang}")
    print(f"hang: GpuserveWatchdogRestarted firing in Prometheus: {bool(fired)} "
          f"(seen {alert_s:.0f} s after SIGSTOP); engine ready again: {ready}")
    print("hang: watchdog log:\n  " + "\n  ".join(rec.watchdog_log.splitlines()[-4:]))
    return 0 if rec.restart_after_s is not None and fired and ready else 1


if __name__ == "__main__":
    sys.exit(main())
