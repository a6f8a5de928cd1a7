"""Monitoring on real sandbox hosts: a serving cpu host, a gateway host and a monitor host
(issue 15).

- the converge installs node-exporter, the exporters' TLS front, the watchdog, Prometheus and
  alertmanager, and a second converge changes nothing;
- the monitor scrapes every target (the engine, every node-exporter, the gateway's smg); the
  exporters, smg's metrics and Prometheus are not open to this machine (a client's point of view);
- the hang: SIGSTOP of the engine core while requests run; /health stays 200 (so /health-only
  monitoring misses it), the watchdog restarts the engine within watchdog_stall_s + 30 s, and
  Prometheus shows GpuserveWatchdogRestarted firing.

Slow (a fresh cpu host's engine install and start, a gateway, then a hang): about 10 minutes on 2 cores.
"""

from __future__ import annotations

import json
import re
import subprocess

import pytest

from gpuserve_sandbox import fleet as fleet_view
from gpuserve_sandbox import hang

pytestmark = pytest.mark.slow

INV, SERVE = "inventories/sandbox.py", "deploys/serve.py"
STALL_S = 30
OPERATOR_KEY = "sandbox-operator-monitor-0123456789ABCDEFabcdef"
SCRAPE_KEY = "sandbox-scrape-monitor-0123456789ABCDEFabcdef"


@pytest.fixture(scope="module")
def fleet(make_hosts, sandbox, sandbox_hub, sandbox_wheelhouse, tmp_path_factory):
    serving, gateway, monitor = make_hosts(["cpu", "gateway", "monitor"])
    files = tmp_path_factory.mktemp("monitoring")
    keys = fleet_view.operator_keys_file(files, OPERATOR_KEY)
    scrape = fleet_view.scrape_keys_file(files, SCRAPE_KEY)   # the monitor's: monitoring routes only
    # a generous probe timeout: on a loaded 2-core machine a 1-token completion can take long;
    # this test is about the stall path
    data = ["--data", f"operator_keys_file={keys}", "--data", f"scrape_keys_file={scrape}",
            "--data", "monitor_scrape_interval_s=5", "--data", f"watchdog_stall_s={STALL_S}", "--data", "watchdog_probe_timeout_s=120",
            "--data", "alert_nvme_free_gib=1",
            # the serving host admits client routes only from its gateways: the hang test's load
            # comes from this machine, admitted like a gateway (as bench/gateway.py does)
            "--data", f"gateway_addresses={json.dumps([gateway.ip, sandbox.bridge_ip])}"]
    return {"serving": serving, "gateway": gateway, "monitor": monitor, "certs": files, "data": data,
            "key": fleet_view.client_key(sandbox)}


@pytest.fixture(scope="module")
def converged(fleet, sandbox):
    from gpuserve_sandbox.runner import run_pyinfra

    run = run_pyinfra(INV, SERVE, *fleet["data"], instance=sandbox.instance).check()
    assert "Prometheus and alertmanager" in run.output and "Hang watchdog" in run.output
    return run


def test_a_second_converge_changes_nothing(fleet, converged, sandbox):
    from gpuserve_sandbox.runner import run_pyinfra

    again = run_pyinfra(INV, SERVE, *fleet["data"], instance=sandbox.instance).check()
    rows = [line.split() for line in again.output.split("--> Results:")[-1].splitlines()]
    changed = [" ".join(r) for r in rows
               if len(r) > 4 and r[-4].isdigit() and r[-3] != "-" and "Grand" not in r]
    log = sandbox.ssh(fleet["serving"], "journalctl -u gpuserve-watchdog@minimax --no-pager -o cat "
                                        "| tail -20", check=False).stdout
    assert changed == [], "\n".join(changed) + "\nwatchdog:\n" + log


def test_the_monitor_scrapes_every_target_and_nothing_is_open_to_clients(fleet, converged, sandbox):
    serving, gateway, monitor = fleet["serving"], fleet["gateway"], fleet["monitor"]
    up = {}
    for _ in range(30):   # the first scrapes (every 5 s), bounded
        # not Debian's default job "node" (localhost:9100, no host label): the Prometheus apt
        # starts scrapes with it until the converge restarts it with gpuserve's configuration,
        # and its last sample stays visible for the 5-minute lookback
        up = {(r["metric"].get("job"), r["metric"].get("host")): r["value"][1]
              for r in hang.prometheus(sandbox, monitor, "up")
              if r["metric"].get("host") or r["metric"].get("job") == "prometheus"}
        if len(up) >= 6 and set(up.values()) == {"1"}:
            break
        subprocess.run(["sleep", "2"])
    assert up == {("gpuserve-engine", serving.name): "1", ("node", serving.name): "1",
                  ("node", gateway.name): "1", ("smg", gateway.name): "1",
                  ("node", monitor.name): "1", ("prometheus", None): "1"}, up
    # issue 26 (1): the monitor holds the scrape key only, never an operator key, and a scrape key
    # opens no inference and no operator route
    held = sandbox.ssh(monitor, "cat /etc/prometheus/gpuserve-keys/*").stdout
    assert SCRAPE_KEY in held and OPERATOR_KEY not in held
    for path, body in (("/openapi.json", None), ("/collective_rpc", {"method": "x"})):
        assert fleet_view.proxy_request(sandbox, serving, fleet["certs"], path, SCRAPE_KEY,
                                        body)[0] == 403, path
    # inference, from the monitor (this machine is one of the serving host's gateway addresses)
    chat = sandbox.ssh(monitor, f"echo 'Authorization: Bearer {SCRAPE_KEY}' | curl -sk -o /dev/null "
                                "-w '%{http_code}' -m 20 -H @- -H 'Content-Type: application/json' "
                                "-d '{\"model\": \"tiny-chat\", \"messages\": []}' "
                                f"https://{serving.ip}:8443/v1/chat/completions", check=False).stdout
    assert chat.strip() == "403", chat
    assert fleet_view.proxy_request(sandbox, serving, fleet["certs"], "/metrics", SCRAPE_KEY)[0] == 200
    release = hang.prometheus(sandbox, monitor, "gpuserve_release_info")
    assert [r["metric"]["host"] for r in release] == [serving.name]
    # from this machine (a client of the sandbox network)
    curl = ["curl", "-sk", "-o", "/dev/null", "-w", "%{http_code}", "--max-time", "5"]
    assert subprocess.run([*curl, f"https://{serving.ip}:9101/metrics"],
                          capture_output=True, text=True).stdout == "403"
    assert subprocess.run([*curl, f"https://{gateway.ip}:9101/smg/metrics"],
                          capture_output=True, text=True).stdout == "403"
    assert subprocess.run([*curl, f"https://{serving.ip}:8443/metrics"],
                          capture_output=True, text=True).stdout == "401"
    for ip, port in ((serving.ip, 9100), (gateway.ip, 29000), (monitor.ip, 9090), (monitor.ip, 9093)):
        assert subprocess.run([*curl, f"http://{ip}:{port}/"], capture_output=True,
                              text=True).stdout == "000", f"{ip}:{port} answers this machine"


def test_every_nginx_front_has_the_one_tls_profile_and_hardening(fleet, converged, sandbox):
    """Issue 26 (5): the exporters' front on 9101 offered static-RSA and CBC suites, and the
    monitor's nginx had no hardening drop-in (Restart=no, exposure 9.6) and sent its version."""
    for h in (fleet["serving"], fleet["gateway"], fleet["monitor"]):
        for cipher, ok in (("AES128-SHA", False), ("ECDHE-RSA-AES128-SHA", False),
                           ("AES256-GCM-SHA384", False), ("ECDHE-RSA-AES128-GCM-SHA256", True)):
            proc = subprocess.run(["openssl", "s_client", "-connect", f"{h.ip}:9101", "-tls1_2",
                                   "-cipher", cipher], input="", capture_output=True, text=True,
                                  timeout=20)
            assert (f"Cipher is {cipher}" in proc.stdout) == ok, (h.name, cipher, proc.stdout[-300:])
        head = subprocess.run(["curl", "-skI", "--max-time", "5", f"https://{h.ip}:9101/metrics"],
                              capture_output=True, text=True).stdout
        assert re.search(r"^Server: nginx\r?$", head, re.M), (h.name, head)   # no version
        unit = sandbox.ssh(h, "systemctl show -p Restart -p NoNewPrivileges -p ProtectSystem nginx").stdout
        assert {"Restart=on-failure", "NoNewPrivileges=yes", "ProtectSystem=strict"} <= set(unit.split()), unit


def _silence(sandbox, monitor, user: str, alertname: str) -> str:
    body = json.dumps({"matchers": [{"name": "alertname", "value": alertname, "isRegex": True}],
                       "startsAt": "2020-01-01T00:00:00Z", "endsAt": "2099-01-01T00:00:00Z",
                       "createdBy": user, "comment": "issue 26"})
    return sandbox.ssh(monitor, f"runuser -u {user} -- curl -s -o /dev/null -w '%{{http_code}}' -m 10 "
                                f"-X POST -H 'Content-Type: application/json' -d '{body}' "
                                "http://127.0.0.1:9093/api/v2/silences", check=False).stdout.strip()


def test_local_users_who_are_not_operators_reach_neither_alertmanager_nor_prometheus(fleet, converged,
                                                                                    sandbox):
    """Issue 26 (6): as nobody, POST /api/v2/silences on 127.0.0.1:9093 with alertname=~.+
    returned 200: any local user could silence every alert."""
    monitor = fleet["monitor"]
    assert _silence(sandbox, monitor, "nobody", ".+") == "000"   # reset by the monitor guard
    prom = sandbox.ssh(monitor, "runuser -u nobody -- curl -s -o /dev/null -w '%{http_code}' -m 10 "
                                "http://127.0.0.1:9090/api/v1/query?query=up", check=False).stdout.strip()
    assert prom == "000"
    # root (an operator: sudo or ssh) still does; a silence that matches no alert
    assert _silence(sandbox, monitor, "root", "gpuserve-issue-26-matches-nothing") == "200"
    assert hang.prometheus(sandbox, monitor, "up")   # as root, over SSH, as the canary bake asks


def test_a_hung_engine_is_restarted_and_alerted_while_health_says_200(fleet, converged, sandbox,
                                                                       capsys):
    serving, monitor = fleet["serving"], fleet["monitor"]
    rec = hang.hang_engine(sandbox, serving, fleet["certs"], fleet["key"], "tiny-chat",
                           wait_s=STALL_S + 30)
    with capsys.disabled():
        print(f"\nhang: {rec.running_before:g} running; restart issued {rec.restart_after_s} s after "
              f"SIGSTOP (stall {STALL_S} s); /health during the hang: {rec.health_during_hang}\n"
              f"{rec.watchdog_log}")
    assert rec.restart_after_s is not None, f"no restart within {STALL_S + 30} s:\n{rec.watchdog_log}"
    assert "no generation token" in rec.watchdog_log
    # /health-only monitoring would not have noticed: 200 all along the hang
    assert rec.health_during_hang and set(rec.health_during_hang) == {200}, rec.health_during_hang
    fired = hang.wait_alert(sandbox, monitor, "GpuserveWatchdogRestarted", wait_s=120)
    assert [a["metric"]["host"] for a in fired] == [serving.name], json.dumps(fired)
    assert hang.wait_ready(sandbox, serving, fleet["certs"]), "the engine did not come back"
    status, _ = fleet_view.chat(sandbox, serving, fleet["certs"], fleet["key"], "tiny-chat")
    assert status == 200
