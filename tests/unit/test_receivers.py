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
