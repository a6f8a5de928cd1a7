"""Where alertmanager sends the alerts (issue 29): the ``alert_receivers`` setting, checked, and
the alertmanager configuration made from it. Alertmanager's own integrations: webhook, email
(SMTP), Slack, PagerDuty. Pure: the secrets are read by the caller (``secret``), which holds them
in memory only (gpuserve.secret_sources).

    alert_receivers = [
        {"type": "webhook", "url": "http://127.0.0.1:9999/alerts"},
        {"type": "webhook", "url_command": ["pass", "show", "oncall/webhook-url"]},
        {"type": "email", "to": "oncall@example.com", "from": "gpuserve@example.com",
         "smarthost": "mail.example.com:587", "auth_username": "gpuserve",
         "auth_password_command": ["vault", "kv", "get", "-field=password", "secret/smtp"]},
        {"type": "slack", "api_url_file": "secrets/slack-webhook", "channel": "#oncall"},
        {"type": "pagerduty", "routing_key_command": ["sops", "-d", "secrets/pd.sops"]},
    ]

A secret field (``url`` of a webhook that carries a token, Slack's ``api_url``, PagerDuty's
``routing_key``, email's ``auth_password``) is given as ``<field>_file`` (a 0600 file on the control
node) or ``<field>_command`` (a command that prints it), never inline.

A webhook whose URL is a secret is not written into alertmanager.yml: alertmanager 0.25 (Debian
12's) logs a webhook it cannot reach, or one that answers other than 2xx, with its whole URL
(notify/webhook/webhook.go returns the transport's error unredacted, and its errDetails adds
conf.URL), and has no ``url_file`` for webhooks (0.26 added it). alertmanager.yml names the
monitor's alert relay instead, ``http://127.0.0.1:RELAY_PORT/<n>`` (``relay_targets``: the real
URLs, a systemd credential of the relay's unit; gpuserve/files/gpuserve-alert-relay), which never
logs a URL. Slack's ``api_url`` stays with alertmanager: 0.25 redacts it from its errors
(notify.RedactURL in notify/slack/slack.go) and keeps it a SecretURL; PagerDuty's key travels in
the body and SMTP's password in the AUTH exchange, neither in a URL.
"""

from __future__ import annotations

import stat
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Mapping

from gpuserve import layout, templating
from gpuserve.secret_sources import SecretCommand, command_problem
from gpuserve.values import url_problem

# type -> (plain fields: required, optional), secret fields: (required, optional)
TYPES: dict[str, tuple[tuple[str, ...], tuple[str, ...], tuple[str, ...], tuple[str, ...]]] = {
    "webhook": ((), (), (), ()),   # url: plain or secret, one of them (below)
    "email": (("to", "from", "smarthost"), ("auth_username",), (), ("auth_password",)),
    "slack": ((), ("channel",), ("api_url",), ()),
    "pagerduty": ((), (), ("routing_key",), ()),
}
CONFIGS = {"webhook": "webhook_configs", "email": "email_configs", "slack": "slack_configs",
           "pagerduty": "pagerduty_configs"}
RECEIVER = "gpuserve"
RELAY_PORT = 9095   # the alert relay, on the monitor's loopback (the monitor guard's: root, prometheus)


@dataclass(frozen=True)
class Receiver:
    type: str
    plain: Mapping[str, Any]        # fields written as they are (send_resolved, require_tls too)
    secrets: Mapping[str, Any]      # field -> a file path (str) or a SecretCommand

    def describe(self) -> str:
        """What `gpuserve plan` may show: the type and where its secrets come from."""
        where = ", ".join(f"{k} from {v}" for k, v in self.secrets.items())
        return f"{self.type}" + (f" ({where})" if where else "")


def check(value: Any, *, deploying: bool = False) -> tuple[tuple[Receiver, ...], list[tuple[str, str]]]:
    """The receivers of ``alert_receivers``, and its problems as (path, message) pairs."""
    problems: list[tuple[str, str]] = []
    if not isinstance(value, (list, tuple)):
        return (), [("alert_receivers", f"{value!r} is not a list of receivers (mappings with a "
                     f"'type': {', '.join(TYPES)})")]
    out = []
    for i, entry in enumerate(value):
        path = f"alert_receivers[{i}]"
        if not isinstance(entry, Mapping) or entry.get("type") not in TYPES:
            kind = entry.get("type") if isinstance(entry, Mapping) else entry
            problems.append((path, f"{kind!r} is not a receiver; use a mapping whose 'type' is one "
                             f"of {', '.join(TYPES)}"))
            continue
        before = len(problems)
        receiver = _one(entry, path, problems, deploying)
        if len(problems) == before:
            out.append(receiver)
    return tuple(out), problems


def _one(entry: Mapping[str, Any], path: str, problems: list, deploying: bool) -> Receiver:
    kind = entry["type"]
    required, optional, secret_required, secret_optional = TYPES[kind]
    plain: dict[str, Any] = {}
    secrets: dict[str, Any] = {}
    secret_fields = secret_required + secret_optional + (("url",) if kind == "webhook" else ())
    known = {"type", "send_resolved", *required, *optional,
             *(f"{f}_{s}" for f in secret_fields for s in ("file", "command"))}
    if kind == "webhook":
        known.add("url")
    if kind == "email":
        known.add("require_tls")
    for key in entry:
        if key not in known:
            inline = key in secret_fields
            problems.append((f"{path}.{key}", "secrets given inline: use "
                             f"{key}_file or {key}_command" if inline else
                             f"unknown key for a {kind} receiver; use {', '.join(sorted(known))}"))
    for key in required:
        if not (isinstance(entry.get(key), str) and entry[key].strip()):
            problems.append((f"{path}.{key}", f"{entry.get(key)!r} is not allowed; a {kind} receiver "
                             "needs it (a string)"))
        else:
            plain[key] = entry[key]
    for key in optional:
        if key in entry:
            if not (isinstance(entry[key], str) and entry[key].strip()):
                problems.append((f"{path}.{key}", f"{entry[key]!r} is not allowed; use a string"))
            else:
                plain[key] = entry[key]
    for key, default in (("send_resolved", True), ("require_tls", True)):
        if key == "require_tls" and kind != "email":
            continue
        flag = entry.get(key, default)
        if not isinstance(flag, bool):
            problems.append((f"{path}.{key}", f"{flag!r} is not allowed; use True or False"))
        plain[key] = flag
    if kind == "webhook" and "url" in entry:
        why = url_problem(entry["url"])
        if why:
            problems.append((f"{path}.url", why + " (a URL with a token in it: give it as "
                             "url_file or url_command)"))
        else:
            plain["url"] = entry["url"]
    for field in secret_fields:
        source = _secret(entry, field, path, problems, deploying)
        if source is not None:
            secrets[field] = source
    if kind == "webhook" and ("url" in plain) == ("url" in secrets):
        problems.append((f"{path}.url", "a webhook receiver needs exactly one of url, url_file "
                         "and url_command"))
    for field in secret_required:
        if field not in secrets:
            problems.append((f"{path}.{field}_file", f"a {kind} receiver needs {field}_file or "
                             f"{field}_command"))
    return Receiver(kind, plain, secrets)


def _secret(entry: Mapping[str, Any], field: str, path: str, problems: list,
            deploying: bool) -> str | SecretCommand | None:
    file, command = entry.get(f"{field}_file"), entry.get(f"{field}_command")
    if file is not None and command is not None:
        problems.append((f"{path}.{field}_command", f"set {field}_file or {field}_command, not both"))
        return None
    if command is not None:
        why = command_problem(command)
        if why:
            problems.append((f"{path}.{field}_command", why))
            return None
        return SecretCommand(tuple(command), f"{path}.{field}_command")
    if file is None:
        return None
    if not (isinstance(file, str) and file):
        problems.append((f"{path}.{field}_file", f"{file!r} is not a path to a file on the control node"))
        return None
    p = Path(file)
    if not p.is_file():
        if deploying:
            problems.append((f"{path}.{field}_file", f"{file} does not exist on this control node"))
        return file
    if p.stat().st_mode & (stat.S_IRWXG | stat.S_IRWXO):
        problems.append((f"{path}.{field}_file", f"{file} is readable by others; `chmod 600 {file}`"))
    return file


def relayed(r: Receiver) -> bool:
    """Whether alertmanager reaches ``r`` through the alert relay: a webhook whose URL is a secret."""
    return r.type == "webhook" and "url" in r.secrets


def relay_url(n: int) -> str:
    """What alertmanager.yml names for the ``n``-th relayed webhook: no secret in it."""
    return f"http://127.0.0.1:{RELAY_PORT}/{n}"


def relay_targets(receivers: tuple[Receiver, ...], secret: Callable[[Any], str]) -> tuple[str, ...]:
    """The relayed webhooks' URLs (the secrets), in the order of ``relay_url``'s ``n``: the relay's
    credential. Empty: no relay."""
    return tuple(secret(r.secrets["url"]).strip() for r in receivers if relayed(r))


def alertmanager_receiver(receivers: tuple[Receiver, ...], secret: Callable[[Any], str]) -> dict:
    """Alertmanager's one receiver, ``gpuserve``, with every integration the settings name.
    ``secret(source)`` reads a secret (a file path or a SecretCommand); its value is stripped of
    surrounding whitespace (one line). A webhook whose URL is a secret is the relay's URL
    (``relay_url``), its own left to ``relay_targets``."""
    out: dict[str, Any] = {"name": RECEIVER}
    n = 0
    for r in receivers:
        if relayed(r):
            conf = {**r.plain, "url": relay_url(n)}
            n += 1
        else:
            conf = {**r.plain, **{k: secret(v).strip() for k, v in r.secrets.items()}}
        conf.pop("type", None)
        out.setdefault(CONFIGS[r.type], []).append(conf)
    return out


def relay_unit_text() -> str:
    """gpuserve-alert-relay.service (templates/gpuserve-alert-relay.service.j2): the relay as a
    dynamic user, its receivers' URLs a credential it loads itself, confined."""
    return templating.render("gpuserve-alert-relay.service.j2", program=layout.ALERT_RELAY_BIN, port=RELAY_PORT,
                             credential=layout.ALERT_RELAY_CREDENTIAL, credential_file=layout.ALERT_RELAY_CRED)
