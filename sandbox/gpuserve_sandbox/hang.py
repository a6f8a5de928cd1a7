"""Hang a sandbox engine on purpose and watch what the watchdog and the monitor do about it.

The engine core process (``VLLM::EngineCore``) is stopped with SIGSTOP while requests stream
through the host's proxy: the API server keeps answering /health 200 and /metrics, but no token
is produced (vLLM issue 39863's wedge). Used by tests/integration/test_monitoring.py and
bench/monitoring.py. Every loop here is bounded in time.
"""

from __future__ import annotations

import json
import shlex
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from gpuserve import layout
from gpuserve_sandbox.fleet import main_pid, proxy_request
from gpuserve_sandbox.hosts import Sandbox, SandboxHost

ENGINE_CORE = "VLLM::EngineCore"


@dataclass
class HangRecord:
    stopped_at: float = 0.0
    restart_after_s: float | None = None     # the watchdog's restart, seconds after SIGSTOP
    new_engine_after_s: float | None = None  # a new engine process (the old one stopped)
    health_during_hang: dict = field(default_factory=dict)   # /health status -> count
    watchdog_log: str = ""
    requests_done: dict = field(default_factory=dict)       # status -> count of the load
    running_before: float = 0.0


def engine_metric(sandbox: Sandbox, host: SandboxHost, names: tuple[str, ...]) -> float:
    """Sum of the engine's samples of ``names`` (its own /metrics, on the host's loopback)."""
    pattern = "|".join(names)
    out = sandbox.ssh(host, f"curl -fsS --max-time 10 http://127.0.0.1:8000/metrics | "
                            f"grep -E {shlex.quote('^(' + pattern + ')[{ ]')} || true",
                      check=False, timeout=30).stdout
    total = 0.0
    for line in out.splitlines():
        try:
            total += float(line.rsplit(None, 1)[1])
        except (IndexError, ValueError):
            continue
    return total


def prometheus(sandbox: Sandbox, monitor: SandboxHost, promql: str) -> list[dict]:
    """An instant query to the monitor's Prometheus (loopback there), over SSH."""
    out = sandbox.ssh(monitor, "curl -fsS --max-time 20 --get --data-urlencode "
                               f"{shlex.quote('query=' + promql)} http://127.0.0.1:9090/api/v1/query",
                      check=False, timeout=40).stdout
    try:
        return json.loads(out)["data"]["result"]
    except (ValueError, KeyError):
        return []


def _load(sandbox, host, certs, key, model, results, stop_at, n) -> list[threading.Thread]:
    """``n`` long completions through the proxy, each bounded by the deadline ``stop_at``."""
    def one():
        timeout = max(5.0, stop_at - time.time())
        status, _ = proxy_request(sandbox, host, certs, "/v1/completions", key, {
            "model": model, "prompt": "Count slowly:", "max_tokens": 2000, "ignore_eos": True},
            timeout=timeout)
        results[status] = results.get(status, 0) + 1

    threads = [threading.Thread(target=one, daemon=True) for _ in range(n)]
    for t in threads:
        t.start()
    return threads


def hang_engine(sandbox: Sandbox, host: SandboxHost, certs: Path, key: str, model: str,
                deployment: str = "minimax", wait_s: float = 300, requests: int = 3) -> HangRecord:
    """Start ``requests`` long requests, SIGSTOP the engine core once they run, and watch until
    the watchdog restarts the engine (at most ``wait_s`` after the stop)."""
    rec = HangRecord()
    unit = layout.unit_name(deployment)
    since = sandbox.ssh(host, "date '+%Y-%m-%d %H:%M:%S'").stdout.strip()
    stop_at = time.time() + wait_s + 120
    _load(sandbox, host, certs, key, model, rec.requests_done, stop_at, requests)
    deadline = time.time() + 120
    while time.time() < deadline:
        rec.running_before = engine_metric(sandbox, host, ("vllm:num_requests_running",))
        if rec.running_before > 0:
            break
        time.sleep(0.5)
    else:
        raise AssertionError("the load never showed up in vllm:num_requests_running")
    time.sleep(2)   # tokens flowing
    pid = main_pid(sandbox, host, deployment)
    journal = (f"journalctl -u gpuserve-watchdog@{deployment} --since {shlex.quote(since)} "
               "--no-pager -o short-unix")
    sandbox.ssh(host, f"pkill -STOP -f '^{ENGINE_CORE}'")
    rec.stopped_at = time.time()
    deadline = rec.stopped_at + wait_s
    while time.time() < deadline:
        if rec.restart_after_s is None:
            status, _ = proxy_request(sandbox, host, certs, "/health", timeout=10)
            rec.health_during_hang[status] = rec.health_during_hang.get(status, 0) + 1
            line = sandbox.ssh(host, f"{journal} | grep -m1 'restarting {unit}' || true",
                               check=False).stdout.strip()
            if line:   # the watchdog's own time stamp: when it decided (same clock here)
                rec.restart_after_s = float(line.split()[0]) - rec.stopped_at
        elif main_pid(sandbox, host, deployment) != pid:
            rec.new_engine_after_s = time.time() - rec.stopped_at
            break
        time.sleep(1)
    rec.watchdog_log = sandbox.ssh(host, f"{journal} -o cat | grep -v '^$' | tail -20",
                                   check=False).stdout
    if rec.restart_after_s is None:
        sandbox.ssh(host, f"pkill -CONT -f '^{ENGINE_CORE}'; systemctl restart {unit}", check=False)
    return rec


def wait_ready(sandbox: Sandbox, host: SandboxHost, certs: Path, wait_s: float = 600) -> bool:
    deadline = time.time() + wait_s
    while time.time() < deadline:
        if proxy_request(sandbox, host, certs, "/health", timeout=10)[0] == 200:
            return True
        time.sleep(2)
    return False


def wait_alert(sandbox: Sandbox, monitor: SandboxHost, alert: str, wait_s: float = 120) -> list[dict]:
    """The firing ``alert`` series in the monitor's Prometheus (ALERTS), within ``wait_s``."""
    deadline = time.time() + wait_s
    while time.time() < deadline:
        found = prometheus(sandbox, monitor, f'ALERTS{{alertname="{alert}",alertstate="firing"}}')
        if found:
            return found
        time.sleep(2)
    return []
