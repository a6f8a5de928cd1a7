"""Alert receivers from settings on a real monitor host (issue 29).

One monitor host, with two real receivers on it: Debian's exim4 (local delivery only) delivering
to the mailbox of a user `oncall`, and a webhook endpoint (a small HTTP server that appends each
POST to a file). deploys/monitoring.py writes alertmanager.yml from ``alert_receivers``, the
webhook's URL given as a command (a secret source: alertmanager.yml then is a systemd credential,
decrypted root:prometheus 0640 into /run, and not shown). An alert posted to alertmanager's API, as Prometheus posts one, arrives in the
mailbox and at the webhook. With ``alertmanager_managed = False`` the converge leaves a
hand-edited alertmanager.yml alone.

Slow (a monitor host's Prometheus and alertmanager, and exim4, installed from the apt cache):
about 4 minutes on 2 cores.
"""

from __future__ import annotations

import json
import shlex
import time

import pytest

pytestmark = pytest.mark.slow

INV, MONITORING = "inventories/sandbox.py", "deploys/monitoring.py"
HOOK_PORT = 9988
ALERT = "GpuserveReceiverTest"

WEBHOOK = f"""
import http.server
class H(http.server.BaseHTTPRequestHandler):
    def do_POST(self):
        body = self.rfile.read(int(self.headers["Content-Length"]))
        with open("/var/lib/webhook/alerts.jsonl", "ab") as f:
            f.write(body.replace(b"\\n", b" ") + b"\\n")
        self.send_response(200)
        self.end_headers()
http.server.HTTPServer(("127.0.0.1", {HOOK_PORT}), H).serve_forever()
"""


@pytest.fixture(scope="module")
def monitor(make_hosts, sandbox):
    (host,) = make_hosts(["monitor"])
    # the mail system: exim4's Debian default is local delivery only, on loopback
    sandbox.ssh(host, "apt-get update -q >/dev/null && DEBIAN_FRONTEND=noninteractive apt-get install -y -q exim4-daemon-light "
                      ">/dev/null && useradd -m oncall && systemctl is-active exim4", timeout=600)
    sandbox.ssh(host, "mkdir -p /var/lib/webhook && cat > /var/lib/webhook/hook.py <<'EOF'\n"
                      f"{WEBHOOK}\nEOF\n"
                      "systemd-run --unit=test-webhook python3 /var/lib/webhook/hook.py")
    return host


def _data(**kw) -> list[str]:
    out = []
    for k, v in kw.items():
        out += ["--data", f"{k}={json.dumps(v)}"]
    return out


RECEIVERS = [
    {"type": "email", "to": "oncall@localhost", "from": "gpuserve@localhost",
     "smarthost": "127.0.0.1:25", "require_tls": False},
    {"type": "webhook", "url_command": ["echo", f"http://127.0.0.1:{HOOK_PORT}/alerts"]},
]


@pytest.fixture(scope="module")
def converged(monitor, sandbox):
    from gpuserve_sandbox.runner import run_pyinfra

    return run_pyinfra(INV, MONITORING, "--diff", *_data(alert_receivers=RECEIVERS),
                       instance=sandbox.instance).check()


def test_a_fired_alert_arrives_in_the_mailbox_and_at_the_webhook(monitor, converged, sandbox):
    assert "alertmanager.yml with the receivers' secrets (encrypted, not shown)" in converged.output
    assert f"127.0.0.1:{HOOK_PORT}/alerts" not in converged.output
    # a credential at rest (issue 29): the file is a link to its decrypted copy in /run
    mode = sandbox.ssh(monitor, "stat -L -c '%U:%G %a' /etc/prometheus/alertmanager.yml; "
                                "readlink /etc/prometheus/alertmanager.yml; "
                                "test -f /etc/prometheus/alertmanager.yml.cred && echo cred").stdout.split()
    assert mode == ["root:prometheus", "640", "/run/gpuserve/secrets/alertmanager.yml", "cred"]
    # the webhook's URL is a secret: alertmanager posts to the alert relay, which holds it in its
    # credential (alertmanager 0.25 logs a URL it cannot reach)
    conf = sandbox.ssh(monitor, "cat /etc/prometheus/alertmanager.yml").stdout
    assert "http://127.0.0.1:9095/0" in conf and str(HOOK_PORT) not in conf
    assert sandbox.ssh(monitor, "systemctl is-active gpuserve-alert-relay").stdout.strip() == "active"
    # as Prometheus does: an alert posted to alertmanager's API
    sandbox.ssh(monitor, "amtool --alertmanager.url=http://127.0.0.1:9093 alert add "
                         f"alertname={ALERT} severity=critical host={monitor.name} "
                         "--annotation=summary=receiver-test")
    mail, hooks = "", []
    for _ in range(60):   # group_wait is 30 s; bounded
        mail = sandbox.ssh(monitor, "cat /var/mail/oncall 2>/dev/null", check=False).stdout
        lines = sandbox.ssh(monitor, "cat /var/lib/webhook/alerts.jsonl 2>/dev/null", check=False).stdout
        hooks = [json.loads(x) for x in lines.splitlines() if x.strip()]
        if ALERT in mail and hooks:
            break
        time.sleep(2)
    assert ALERT in mail, sandbox.ssh(monitor, "journalctl -u prometheus-alertmanager -n 30 --no-pager",
                                      check=False).stdout
    assert [a["labels"]["alertname"] for h in hooks for a in h["alerts"]] == [ALERT]
    assert hooks[0]["status"] == "firing" and hooks[0]["receiver"] == "gpuserve"


def test_alertmanager_managed_false_leaves_a_hand_edited_file_alone(monitor, converged, sandbox):
    from gpuserve_sandbox.runner import run_pyinfra

    path = "/etc/prometheus/alertmanager.yml"
    sandbox.ssh(monitor, f"echo '# edited by hand' >> {path}")
    before = sandbox.ssh(monitor, f"sha256sum {path}").stdout
    run = run_pyinfra(INV, MONITORING, *_data(alertmanager_managed=False),
                      instance=sandbox.instance).check()
    assert "alertmanager.yml is yours" in run.output
    assert sandbox.ssh(monitor, f"sha256sum {shlex.quote(path)}").stdout == before
