"""Alert receivers from settings (issue 29): checked once, rendered into alertmanager.yml with
their secrets from files or commands, never inline."""

from __future__ import annotations

import json

import pytest

from gpuserve import monitoring, receivers, secret_sources

from .helpers import make_inventory, problems_of

SLACK = "https://hooks.slack.example/services/T000/B000/secretpart0123456789"


def monitor_inventory(receivers_value, **more):
    return make_inventory(host_data={"alert_receivers": receivers_value, **more}, group="monitor",
                          fleet={})


def test_every_kind_renders_as_alertmanagers_own_integration(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "slack").write_text(SLACK + "\n")
    (tmp_path / "slack").chmod(0o600)
    found, problems = receivers.check([
        {"type": "webhook", "url": "http://127.0.0.1:9999/alerts"},
        {"type": "email", "to": "oncall@localhost", "from": "gpuserve@localhost",
         "smarthost": "127.0.0.1:25", "require_tls": False},
        {"type": "slack", "api_url_file": "slack", "channel": "#oncall"},
        {"type": "pagerduty", "routing_key_command": ["echo", "pd-routing-key-0123456789"]},
    ])
    assert problems == []
    secret_sources.forget()
    conf = receivers.alertmanager_receiver(found, secret_sources.read_text)
    assert conf == {
        "name": "gpuserve",
        "webhook_configs": [{"url": "http://127.0.0.1:9999/alerts", "send_resolved": True}],
        "email_configs": [{"to": "oncall@localhost", "from": "gpuserve@localhost",
                           "smarthost": "127.0.0.1:25", "require_tls": False, "send_resolved": True}],
        "slack_configs": [{"channel": "#oncall", "send_resolved": True, "api_url": SLACK}],
        "pagerduty_configs": [{"send_resolved": True, "routing_key": "pd-routing-key-0123456789"}],
    }
    yml = monitoring.alertmanager_yml(conf)
    assert json.loads(yml.split("\n", 1)[1])["receivers"] == [conf]
    # where the secrets come from is describable without them
    assert found[2].describe() == "slack (api_url from slack)"
    assert "echo pd-routing-key" in found[3].describe()   # the command, as written in the settings


@pytest.mark.parametrize("entry, path, message", [
    ({"type": "slack", "api_url": SLACK}, "alert_receivers[0].api_url", "secrets given inline: use api_url_file"),
    ({"type": "pagerduty", "routing_key": "x" * 30}, "alert_receivers[0].routing_key", "secrets given inline"),
    ({"type": "email", "to": "a@b", "from": "c@d", "smarthost": "m:25", "auth_password": "pw"},
     "alert_receivers[0].auth_password", "secrets given inline"),
    ({"type": "webhook", "url": "https://h.example/x?token=abc"}, "alert_receivers[0].url",
     "give it as url_file or url_command"),
    ({"type": "webhook"}, "alert_receivers[0].url", "exactly one of url, url_file and url_command"),
    ({"type": "slack"}, "alert_receivers[0].api_url_file", "needs api_url_file or api_url_command"),
    ({"type": "email", "to": "a@b"}, "alert_receivers[0].from", "needs it"),
    ({"type": "sms"}, "alert_receivers[0]", "'sms' is not a receiver"),
    ({"type": "pagerduty", "routing_key_command": "pass show pd"}, "alert_receivers[0].routing_key_command",
     "is a string; give the command as a list of words"),
])
def test_bad_receivers_are_refused_naming_the_host_and_the_key(entry, path, message):
    found = problems_of(monitor_inventory([entry]))
    assert any(p.startswith(f"h1: {path} ") and message in p for p in found), found
    assert not any(SLACK in p or "x" * 30 in p for p in found)


def test_alertmanager_managed_false_leaves_the_file_and_takes_no_receivers():
    found = problems_of(monitor_inventory([{"type": "webhook", "url": "http://127.0.0.1:1/"}],
                                          alertmanager_managed=False))
    assert any("set alertmanager_managed = True" in p for p in found), found


def test_the_default_is_no_receiver():
    assert monitoring.alertmanager_yml().count('"name": "gpuserve"') == 1
    found, problems = receivers.check([])
    assert found == () and problems == []


def test_a_webhook_with_a_secret_url_goes_through_the_relay_and_alertmanager_yml_never_holds_it():
    """Issue 29: alertmanager 0.25 logs a webhook it cannot reach with its whole URL, so a webhook
    whose URL is a secret is the relay's loopback URL in alertmanager.yml, its own the relay's."""
    token = "http://hooks.example/T0/secret-path-0123456789"
    found, problems = receivers.check([
        {"type": "webhook", "url": "http://127.0.0.1:9999/alerts"},
        {"type": "webhook", "url_command": ["echo", token]},
        {"type": "webhook", "url_command": ["echo", token + "-2"], "send_resolved": False},
    ])
    assert problems == []
    secret_sources.forget()
    conf = receivers.alertmanager_receiver(found, secret_sources.read_text)
    assert conf["webhook_configs"] == [
        {"url": "http://127.0.0.1:9999/alerts", "send_resolved": True},    # no secret: alertmanager's own
        {"url": f"http://127.0.0.1:{receivers.RELAY_PORT}/0", "send_resolved": True},
        {"url": f"http://127.0.0.1:{receivers.RELAY_PORT}/1", "send_resolved": False},
    ]
    assert token not in monitoring.alertmanager_yml(conf)
    assert receivers.relay_targets(found, secret_sources.read_text) == (token, token + "-2")
    assert receivers.relay_targets(found[:1], secret_sources.read_text) == ()   # no relay
    unit = receivers.relay_unit_text()
    assert token not in unit and "LoadCredentialEncrypted=alert-receivers:" in unit


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_the_relay_posts_on_answers_with_the_receivers_status_and_never_writes_a_url(tmp_path):
    """gpuserve/files/gpuserve-alert-relay, run here: a body reaches the receiver, a receiver's
    status comes back (alertmanager retries a 5xx), one it cannot reach is a 502; nothing it
    writes holds a receiver's URL."""
    import http.server
    import subprocess
    import sys
    import threading
    import time
    import urllib.error
    import urllib.request
    from pathlib import Path

    got = []

    class Hook(http.server.BaseHTTPRequestHandler):
        def do_POST(self):
            got.append((self.path, self.rfile.read(int(self.headers["Content-Length"]))))
            self.send_response(200 if self.path.endswith("/ok") else 503)
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, *args):
            pass

    hook = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Hook)
    threading.Thread(target=hook.serve_forever, daemon=True).start()
    secret = "tok-" + "9" * 24
    targets = [f"http://127.0.0.1:{hook.server_port}/{secret}/ok",
               f"http://127.0.0.1:{hook.server_port}/{secret}/busy",
               f"http://127.0.0.1:{_free_port()}/{secret}/refused",
               f"gopher://{secret}"]
    (tmp_path / "alert-receivers").write_text(json.dumps(targets))
    port = _free_port()
    program = Path(__file__).resolve().parents[2] / "gpuserve" / "files" / "gpuserve-alert-relay"
    relay = subprocess.Popen([sys.executable, str(program), str(port), "alert-receivers"],
                             env={"CREDENTIALS_DIRECTORY": str(tmp_path)}, stdout=subprocess.PIPE,
                             stderr=subprocess.STDOUT, text=True)

    def post(path: str) -> tuple[int, str]:
        request = urllib.request.Request(f"http://127.0.0.1:{port}{path}", data=b'{"alerts": []}',
                                         headers={"Content-Type": "application/json"}, method="POST")
        try:
            with urllib.request.urlopen(request, timeout=10) as r:
                return r.status, r.read().decode()
        except urllib.error.HTTPError as exc:
            return exc.code, exc.read().decode()

    try:
        for _ in range(100):
            try:
                status = post("/0")
                break
            except urllib.error.URLError:
                time.sleep(0.05)
        answers = [status, post("/1"), post("/2"), post("/3"), post("/4"), post("/x")]
    finally:
        relay.terminate()
        output = relay.communicate(timeout=10)[0]
        hook.shutdown()
    assert [a[0] for a in answers] == [200, 503, 502, 502, 404, 404], answers
    assert got[0] == (f"/{secret}/ok", b'{"alerts": []}')
    assert "receiver 2: not delivered (URLError: ConnectionRefusedError)" in output
    assert "receiver 3: not delivered" in output
    assert secret not in output and not any(secret in a[1] for a in answers), output
