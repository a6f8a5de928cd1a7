#!/usr/bin/env python3
"""Issue 26's live audit, repeated by hand on a fresh sandbox fleet, one command per finding.

    sudo .venv/bin/python dev/audit.py --instance 47          # ~20 minutes on 2 cores; --keep to look around

Brings up a serving cpu host, a gateway host and a monitor host (as tests/integration/
test_monitoring.py does), converges them with deploys/serve.py as a user would, then tries each
of the eight findings of the audit again, printing the command it ran (`$ ...`) and what came
back, and CLOSED or OPEN. Every loop is bounded; all traffic goes to the instance's own hosts.
The per-finding tests (tests/integration/test_hardening.py, test_gateway.py, test_monitoring.py)
hold the same things; this is the operator's view, with commands to copy.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "sandbox")]

from gpuserve import layout  # noqa: E402
from gpuserve_sandbox import fleet as fleet_view  # noqa: E402
from gpuserve_sandbox.hosts import Sandbox  # noqa: E402
from gpuserve_sandbox.runner import run_pyinfra  # noqa: E402
from gpuserve_sandbox.services import ensure_gateway_wheelhouse  # noqa: E402
from gpuserve_sandbox.simgpu import HostSpec  # noqa: E402

INV, SERVE = "inventories/sandbox.py", "deploys/serve.py"
OPERATOR_KEY = "audit-operator-0123456789ABCDEFabcdef0123"
SCRAPE_KEY = "audit-scrape-0123456789ABCDEFabcdef01234567"
UNIT = layout.unit_name("minimax")
RESULTS: list[tuple[str, bool]] = []


def say(finding: str, closed: bool, detail: str) -> None:
    RESULTS.append((finding, closed))
    print(f"   -> {'CLOSED' if closed else 'OPEN'}: {detail}\n", flush=True)


def on(box: Sandbox, host, command: str, timeout: float = 60) -> subprocess.CompletedProcess:
    print(f"   $ gpuserve sandbox ssh {host.name} {shlex.quote(command)}", flush=True)
    return box.ssh(host, command, check=False, timeout=timeout)


def here(argv: list[str], timeout: float = 60, **kw) -> subprocess.CompletedProcess:
    print(f"   $ {shlex.join(argv)}", flush=True)
    return subprocess.run(argv, capture_output=True, text=True, timeout=timeout, **kw)


def curl_code(argv_tail: list[str]) -> str:
    return here(["curl", "-sk", "-o", "/dev/null", "-w", "%{http_code}", "--max-time", "20",
                 *argv_tail]).stdout.strip()


def f1_admin_api(box, gw) -> None:
    print("1. An operator key reaches smg's admin API through the gateway's public port (9443)")
    rogue = json.dumps({"url": "http://10.231.0.250:8000", "worker_type": "regular"})
    codes = [curl_code(["-X", "POST", "-H", f"Authorization: Bearer {k}", "-H",
                        "Content-Type: application/json", "-d", rogue, f"https://{gw.ip}:9443/workers"])
             for k in (OPERATOR_KEY, SCRAPE_KEY)]
    workers = on(box, gw, "curl -fsS --max-time 5 http://127.0.0.1:30000/workers").stdout
    added = "10.231.0.250" in workers
    say("1", codes == ["403", "403"] and not added,
        f"POST /workers with the operator key: {codes[0]}, with the scrape key: {codes[1]}; "
        f"rogue worker {'ADDED' if added else 'not in smg'}")


def f2_engine_core(box, h, certs, key) -> None:
    print("2. kill -9 of VLLM::EngineCore: the engine is never restarted")
    before = int(on(box, h, f"systemctl show -p NRestarts --value {UNIT}").stdout or 0)
    core = on(box, h, "pgrep -f '^VLLM::EngineCore'").stdout.split()
    on(box, h, f"kill -9 {core[0]}")
    deadline, now, active = time.monotonic() + 480, before, ""
    while time.monotonic() < deadline and not (now > before and active == "active"):
        time.sleep(5)
        now = int(box.ssh(h, f"systemctl show -p NRestarts --value {UNIT}", check=False).stdout or 0)
        active = box.ssh(h, f"systemctl is-active {UNIT}", check=False).stdout.strip()
    print(f"   $ gpuserve sandbox ssh {h.name} 'systemctl show -p NRestarts -p ActiveState {UNIT}' "
          f"(every 5 s, at most 480 s): NRestarts {before} -> {now}, {active}")
    code = 0
    for _ in range(60):   # the gate of a restarted engine: model load, bounded
        code, _ = fleet_view.chat(box, h, certs, key, "tiny-chat")
        if code == 200:
            break
        time.sleep(5)
    say("2", now > before and code == 200, f"NRestarts {before} -> {now}; a chat afterwards: {code}")


def f3_flood(box, h, certs, key) -> None:
    print("3. One key's 120,000-message chats stall every other client")
    body = {"model": "tiny-chat", "max_tokens": 4, "messages": [{"role": "user", "content": "a"}] * 120_000}
    print(f"   (python) POST https://{h.ip}:8443/v1/chat/completions, {len(json.dumps(body)) // 1024} KiB, "
          "120,000 messages")
    code, text = fleet_view.proxy_request(box, h, certs, "/v1/chat/completions", key, body, timeout=60)
    say("3", code == 413, f"{code} {text.strip()[:120]} (the engine never sees it; the other key's "
        "p50 under 8 such chats: bench/hardening.py --flood, bench/RESULTS.md)")


def f4_status(box, gw, serving, data: list[str]) -> None:
    print("4. gpuserve status says nothing about the gateway or the watchdog")
    stopped = ((gw, "gpuserve-gateway.service"), (serving, "gpuserve-watchdog@minimax.service"))
    verdicts = []
    for host, unit in stopped:   # one at a time: each must turn status red on its own
        on(box, host, f"systemctl stop {unit}")
        try:
            down = here([str(ROOT / ".venv/bin/gpuserve"), "status", INV, *data], timeout=180, cwd=ROOT,
                        env={**os.environ, "GPUSERVE_SANDBOX_INSTANCE": str(box.instance)})
            named = [line for line in down.stdout.splitlines()
                     if line.startswith(host.name + " ") and unit in line]
            print("   " + "\n   ".join(named[:2] or ["(no row names it)"]))
            verdicts.append((unit, down.returncode, bool(named)))
        finally:
            on(box, host, f"systemctl start {unit}")
    say("4", all(rc != 0 and named for _, rc, named in verdicts),
        "; ".join(f"{unit} stopped: exit {rc}, {'named' if named else 'NOT named'}" for unit, rc, named in verdicts))


def f5_tls_monitor(box, mon) -> None:
    print("5. The exporters' TLS front (9101) takes static-RSA and CBC; the monitor's nginx is unhardened")
    got = {}
    for cipher in ("AES128-SHA", "ECDHE-RSA-AES128-SHA", "ECDHE-RSA-AES128-GCM-SHA256"):
        out = here(["openssl", "s_client", "-connect", f"{mon.ip}:9101", "-tls1_2", "-cipher", cipher],
                   input="", timeout=20).stdout
        got[cipher] = f"Cipher is {cipher}" in out
    head = here(["curl", "-skI", "--max-time", "5", f"https://{mon.ip}:9101/metrics"]).stdout
    server = next((line.strip() for line in head.splitlines() if line.lower().startswith("server:")), "")
    unit = on(box, mon, "systemctl show -p Restart -p NoNewPrivileges -p ProtectSystem nginx").stdout.split()
    score = on(box, mon, "systemd-analyze security nginx.service | tail -1").stdout.strip()
    ok = (got == {"AES128-SHA": False, "ECDHE-RSA-AES128-SHA": False, "ECDHE-RSA-AES128-GCM-SHA256": True}
          and server == "Server: nginx" and "Restart=on-failure" in unit)
    say("5", ok, f"handshakes {got}; {server!r}; {' '.join(unit)}; {score}")


def f6_silences(box, mon) -> None:
    print("6. Any local user on the monitor host can silence every alert")
    body = json.dumps({"matchers": [{"name": "alertname", "value": ".+", "isRegex": True}],
                       "startsAt": "2020-01-01T00:00:00Z", "endsAt": "2099-01-01T00:00:00Z",
                       "createdBy": "nobody", "comment": "audit"})
    am = on(box, mon, f"runuser -u nobody -- curl -s -o /dev/null -w '%{{http_code}}' -m 10 -X POST "
                      f"-H 'Content-Type: application/json' -d '{body}' "
                      "http://127.0.0.1:9093/api/v2/silences").stdout.strip()
    prom = on(box, mon, "runuser -u nobody -- curl -s -o /dev/null -w '%{http_code}' -m 10 "
                        "'http://127.0.0.1:9090/api/v1/query?query=up'").stdout.strip()
    say("6", am == "000" and prom == "000", f"as nobody: alertmanager {am}, Prometheus {prom} (000: refused)")


def f7_listeners(box, h) -> None:
    print("7. The engine guard covers only the serve port: EngineCore's other listeners are open")
    pids = on(box, h, f"systemctl show -p ControlGroup --value {UNIT} | xargs -I{{}} cat /sys/fs/cgroup{{}}/cgroup.procs").stdout.split()
    listening = on(box, h, "ss -Hltnp").stdout.splitlines()
    ports = sorted({line.split()[3] for line in listening if any(f"pid={p}," in line for p in pids)})
    opened = []
    for addr in ports:
        host, port = addr.rsplit(":", 1)
        host = host.strip("[]")
        host = {"*": "127.0.0.1", "0.0.0.0": "127.0.0.1", "::": "::1"}.get(host, host)   # wildcards
        r = on(box, h, f"runuser -u nobody -- timeout 5 bash -c 'exec 3<>/dev/tcp/{host}/{port}' && echo OPEN")
        if "OPEN" in r.stdout:
            opened.append(addr)
    say("7", bool(ports) and not opened, f"the engine's listeners {ports}; open to nobody: {opened or 'none'}")


def f8_nginx_crash(box, h, certs, key) -> None:
    print("8. nginx never comes back after kill -9 of its master")
    before = on(box, h, "systemctl show -p MainPID --value nginx").stdout.strip()
    on(box, h, f"kill -9 {before}")
    now, deadline = before, time.monotonic() + 30
    while time.monotonic() < deadline and now in (before, "0", ""):
        time.sleep(1)
        now = box.ssh(h, "systemctl show -p MainPID --value nginx", check=False).stdout.strip()
    parents = set(on(box, h, "ps -o ppid= -C nginx").stdout.split())
    code, _ = fleet_view.proxy_request(box, h, certs, "/v1/models", key, timeout=20)
    say("8", now not in (before, "0", "") and parents == {"1", now} and code == 200,
        f"master {before} -> {now}; workers' parents {sorted(parents)}; /v1/models {code}")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--instance", type=int, default=47)
    ap.add_argument("--keep", action="store_true", help="leave the hosts up afterwards")
    args = ap.parse_args()
    box = Sandbox(args.instance)
    ensure_gateway_wheelhouse()
    started = time.monotonic()
    serving, gw, mon = box.up([HostSpec.parse(s) for s in ("cpu", "gateway", "monitor")])
    try:
        tmp = Path(tempfile.mkdtemp(prefix="gpuserve-audit-"))
        ops = fleet_view.operator_keys_file(tmp, OPERATOR_KEY)
        scrape = fleet_view.scrape_keys_file(tmp, SCRAPE_KEY)
        # the serving host admits client routes only from its gateways; the audit's direct
        # requests come from this machine's bridge address, admitted like a gateway's
        data = ["--data", f"operator_keys_file={ops}", "--data", f"scrape_keys_file={scrape}",
                "--data", f"gateway_addresses={json.dumps([gw.ip, box.bridge_ip])}"]
        print(f"$ GPUSERVE_SANDBOX_INSTANCE={args.instance} .venv/bin/pyinfra -y {INV} {SERVE} "
              f"{shlex.join(data)}", flush=True)
        run = run_pyinfra(INV, SERVE, *data, instance=args.instance)
        if run.returncode != 0:
            print(run.output[-4000:])
            return 1
        print(f"converged in {time.monotonic() - started:.0f} s\n", flush=True)
        key = fleet_view.client_key(box)
        f1_admin_api(box, gw)
        f2_engine_core(box, serving, tmp, key)
        f3_flood(box, serving, tmp, key)
        f4_status(box, gw, serving, data)
        f5_tls_monitor(box, mon)
        f6_silences(box, mon)
        f7_listeners(box, serving)
        f8_nginx_crash(box, serving, tmp, key)
    finally:
        if not args.keep:
            box.down()
    print("audit: " + ", ".join(f"{n} {'closed' if ok else 'OPEN'}" for n, ok in RESULTS)
          + f" ({time.monotonic() - started:.0f} s)")
    return 0 if RESULTS and all(ok for _, ok in RESULTS) else 1


if __name__ == "__main__":
    sys.exit(main())
