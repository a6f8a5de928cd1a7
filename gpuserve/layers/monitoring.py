"""Monitoring layer: node-exporter on every host, Prometheus and alertmanager on monitor hosts.

All from Debian 12's packages. Nothing listens beyond loopback except nginx's TLS front of the
exporters (NODE_EXPORTER_TLS_PORT), which lets in only the operator networks and the monitor
hosts' addresses (nginx ``allow``/``deny``): node-exporter on 127.0.0.1:9100, under ``/metrics``,
and NVIDIA's DCGM exporter (:9400) under ``/dcgm/metrics`` on NVIDIA hosts with ``dcgm``.
Prometheus (127.0.0.1:9090) and alertmanager (127.0.0.1:9093, no cluster port) stay on the
monitor's loopback: reach them over SSH (docs/monitoring.md). The configuration comes from
gpuserve.monitoring; the scrape keys (monitoring routes only, never operator keys) prometheus
scrapes the engines with are secret files
(gpuserve.operations.secrets), never in prometheus.yml.
"""

from __future__ import annotations

import ipaddress
import json
import posixpath
import shlex
from io import StringIO
from pathlib import Path
from typing import Any

from pyinfra import host, logger
from pyinfra.api import deploy
from pyinfra.api.exceptions import OperationError
from pyinfra.context import ctx_state
from pyinfra.facts.files import File
from pyinfra.operations import apt, files, server, systemd
from pyinfra.operations.util import any_changed

from gpuserve import (api_keys, certs, engine_guard, layout, meter, monitoring, proxy_conf, receivers, secret_sources,
                      stack, templating)
from gpuserve.config import HostSettings
from gpuserve.layers import proxy as proxy_layer
from gpuserve.operations import secrets as secrets_ops
from gpuserve.layers.engine_guard import service_guard
from gpuserve.secret_sources import SecretCommand, SecretSourceError

EXPORTERS_DIR = layout.EXPORTERS_DIR   # root 0700: its TLS key
EXPORTERS_CONF = layout.EXPORTERS_CONF   # no deployment has this name
NO_RECOMMENDS = "--no-install-recommends"
RELAY_SRC = Path(__file__).resolve().parents[1] / "files" / "gpuserve-alert-relay"
RELAY_UNIT_PATH = layout.systemd_unit_path(layout.ALERT_RELAY_UNIT)


def address_of(name: str) -> str:
    """Where other hosts reach ``name``: its ssh_hostname, else its inventory name."""
    inventory = ctx_state.get().inventory
    other = inventory.get_host(name)
    return str(other.data.get("ssh_hostname") or name) if other is not None else name


def monitor_hosts(all_settings: dict[str, HostSettings]) -> list[str]:
    return [name for name, s in all_settings.items() if monitoring.MONITOR_GROUP in s.groups]


def _networks(settings: HostSettings, monitors: list[str]) -> list[str]:
    """Who may scrape the exporters: the operator networks and each monitor's address."""
    nets = list(settings.proxy_operator_networks)
    for name in monitors:
        address = address_of(name)
        try:
            nets.append(str(ipaddress.ip_network(address)))
        except ValueError:   # a DNS name: nginx's allow takes addresses only
            raise OperationError(f"{host.name}: monitor host {name} is reached as {address!r}; "
                                 "the exporters' front allows addresses only: give it an "
                                 "ssh_hostname that is an IP address, or add its network to "
                                 "proxy_operator_networks") from None
    return list(dict.fromkeys(nets))


def exporters_conf(networks: list[str], dcgm: bool, tls_include: str, smg_metrics: str | None = None,
                   token_meter: bool = False) -> str:
    """The exporters' TLS front (templates/nginx-exporters.conf.j2): node-exporter, and the DCGM
    exporter (NVIDIA hosts with dcgm), smg's metrics (gateway hosts, ``smg_metrics`` =
    host:port) and the token meter (hosts with a proxy or a gateway) where the host has them; the
    monitor hosts and the operator networks only."""
    return templating.render("nginx-exporters.conf.j2", networks=networks, dcgm=dcgm, tls_include=tls_include,
                             smg_metrics=smg_metrics, tls_port=monitoring.NODE_EXPORTER_TLS_PORT,
                             node_exporter_port=monitoring.NODE_EXPORTER_PORT, dcgm_port=stack.DCGM_EXPORTER_PORT,
                             smg_path=monitoring.GATEWAY_METRICS_PATH, meter=token_meter,
                             meter_path=meter.METRICS_PATH, meter_port=meter.PORT)


def _exporters_tls() -> tuple[str, list]:
    """A self-signed pair of the exporters' front (the monitor does not verify it, it only
    encrypts: docs/monitoring.md), made on the host once; the TLS settings file including it."""
    crt, key = f"{EXPORTERS_DIR}/tls.crt", f"{EXPORTERS_DIR}/tls.key"
    ops = [files.directory(name="Exporters' TLS directory (0700)", path=EXPORTERS_DIR,
                           user="root", group="root", mode="700")]
    if host.get_fact(File, path=key) is None:
        ops.append(server.shell(
            name="Exporters' self-signed TLS certificate",
            commands=[certs.self_signed(host.name, key, crt)]))
    include = f"{EXPORTERS_DIR}/tls.conf"
    # the one TLS profile of every gpuserve front (TLS 1.2 ECDHE+AEAD, 1.3): issue 26 found
    # static-RSA and CBC suites offered here
    ops.append(files.put(
        name="Exporters' TLS settings (TLS 1.2 ECDHE+AEAD, 1.3)", dest=include, user="root",
        group="root", mode="600", src=StringIO(proxy_conf.tls_conf(crt, key))))
    return include, ops


@deploy("Node exporter")
def node_exporter(settings: HostSettings, all_settings: dict[str, HostSettings]) -> None:
    """prometheus-node-exporter on 127.0.0.1:9100 with the textfile directory the watchdog writes,
    behind nginx's TLS front on NODE_EXPORTER_TLS_PORT."""
    monitors = monitor_hosts(all_settings)
    if not monitors and not settings.monitor.external_prometheus:   # issue 29: your own Prometheus
        return
    apt.packages(name="prometheus-node-exporter, nginx, openssl",
                 packages=["prometheus-node-exporter", "nginx", "openssl"],
                 extra_install_args=NO_RECOMMENDS)
    files.link(name="No default nginx site", path=layout.NGINX_DEFAULT_SITE, present=False)
    # the same confinement and crash restart as the serving hosts' and the gateway's nginx
    dropin = files.put(name="nginx restarts on failure, confined (systemd drop-in)",
                       src=StringIO(proxy_conf.NGINX_DROPIN), dest=proxy_layer.DROPIN, user="root",
                       group="root", mode="644")
    systemd.daemon_reload(name="Reload systemd units (nginx drop-in)", _if=dropin.did_change)
    defaults = files.put(
        name="node-exporter on loopback only",
        src=StringIO("# Managed by gpuserve (pyinfra): loopback only; the monitor scrapes through "
                     "nginx's TLS front\n"
                     f'ARGS="--web.listen-address=127.0.0.1:{monitoring.NODE_EXPORTER_PORT} '
                     f'--collector.textfile.directory={monitoring.TEXTFILE_DIR}"\n'),
        dest=layout.NODE_EXPORTER_DEFAULTS, user="root", group="root", mode="644")
    files.directory(name="node-exporter textfile directory", path=monitoring.TEXTFILE_DIR,
                    user="root", group="root", mode="755")
    systemd.service(name="node-exporter running", service="prometheus-node-exporter",
                    running=True, enabled=True)
    systemd.service(name="node-exporter restarted (its arguments changed)",
                    service="prometheus-node-exporter", restarted=True, _if=defaults.did_change)
    include, tls = _exporters_tls()
    dcgm = settings.serves and settings.stack.vendor == "nvidia" and settings.stack.dcgm
    conf = files.put(name="Exporters' TLS front (monitor and operator networks only)",
                     src=StringIO(exporters_conf(_networks(settings, monitors), dcgm, include,
                                                 monitoring.smg_metrics(settings),
                                                 monitoring.has_meter(settings))),
                     dest=EXPORTERS_CONF, user="root", group="root", mode="644")
    systemd.service(name="nginx running", service="nginx", running=True, enabled=True)
    systemd.service(name="Restart nginx (its drop-in changed)", service="nginx.service",
                    restarted=True, _if=dropin.did_change, **proxy_layer.NGINX_RETRY)
    server.shell(name="Reload nginx (exporters' front)",
                 commands=["nginx -t -q", "systemctl reload nginx"], _if=any_changed(conf, *tls))


def _first_key(path: Any) -> str:
    try:   # a file, or the keys a command prints (gpuserve.secret_sources)
        keys = api_keys.read_api_keys(path if isinstance(path, SecretCommand) else Path(path))
    except SecretSourceError as exc:
        raise OperationError(f"{host.name}: {exc}") from None
    if not keys:
        where = path if isinstance(path, SecretCommand) else f"scrape_keys_file {path}"
        raise OperationError(f"{host.name}: {where} holds no key to scrape with")
    return keys[0]


def _scrape_key(what: str, source: Any, dest: str) -> Any:
    """One scrape key Prometheus reads (``credentials_file``): a systemd credential at rest (issue 29),
    decrypted into /run (root:prometheus 0640) by Prometheus's drop-in; ``dest`` links to it."""
    return secrets_ops.credential_file(name=f"Scrape key for {what} (encrypted, not shown)",
                                       content=_first_key(source) + "\n", dest=dest,
                                       cred_name=f"scrape.{posixpath.basename(dest)}", user="root",
                                       group="prometheus", mode="640")


def monitor_dropins() -> tuple[tuple[str, str, str], ...]:
    """(unit, the directory of its credentials, its credentials drop-in) of Prometheus and alertmanager."""
    return (("prometheus", monitoring.SCRAPE_SECRETS_DIR, layout.PROMETHEUS_CREDENTIALS_DROPIN),
            ("prometheus-alertmanager", posixpath.dirname(monitoring.ALERTMANAGER_YML),
             layout.ALERTMANAGER_CREDENTIALS_DROPIN))


def monitor_credentials() -> Any:
    """Prometheus and alertmanager decrypt their credentials (scrape keys, alertmanager.yml) into
    /run before they start (drop-ins); the reload of systemd when one changed, to test with."""
    secrets_ops.credentials_tool()
    dropins = [files.put(name=f"{unit} decrypts its credentials when it starts (systemd drop-in)",
                         src=StringIO(secrets_ops.credentials_dropin(directory)), dest=dest,
                         user="root", group="root", mode="644")
               for unit, directory, dest in monitor_dropins()]
    systemd.daemon_reload(name="Reload systemd units (monitor credentials drop-ins)", _if=any_changed(*dropins))
    return dropins


def _alertmanager_yml(m: monitoring.MonitorSettings) -> Any:
    """alertmanager.yml with the receivers of ``alert_receivers`` (issue 29). With a secret in it
    (a Slack URL, a PagerDuty key, an SMTP password), root:prometheus 0640, never shown; with
    ``alertmanager_managed = False``, left alone (None)."""
    if not m.alertmanager_managed:
        # not host.noop: outside an operation pyinfra does not print it
        logger.warning(f"    [{host.name}] alertmanager.yml is yours (alertmanager_managed = False): "
                       "left alone")
        return None
    if not any(r.secrets for r in m.alert_receivers):
        receiver = receivers.alertmanager_receiver(m.alert_receivers, secret_sources.read_text)
        secrets_ops.no_credential(name="alertmanager.yml holds no secret: no credential", dest=monitoring.ALERTMANAGER_YML)
        return files.put(name="alertmanager.yml", src=StringIO(monitoring.alertmanager_yml(receiver)),
                         dest=monitoring.ALERTMANAGER_YML, user="root", group="root", mode="644")
    try:
        receiver = receivers.alertmanager_receiver(m.alert_receivers, secret_sources.read_text)
    except (OSError, SecretSourceError) as exc:   # names the source, never a secret
        raise OperationError(f"{host.name}: alert_receivers: {getattr(exc, 'strerror', None) or exc}") from None
    # a systemd credential at rest (issue 29), decrypted into /run by alertmanager's drop-in
    return secrets_ops.credential_file(name="alertmanager.yml with the receivers' secrets (encrypted, not shown)",
                                       content=monitoring.alertmanager_yml(receiver),
                                       dest=monitoring.ALERTMANAGER_YML, cred_name="alertmanager.yml",
                                       user="root", group="prometheus", mode="640")


def _alert_relay(m: monitoring.MonitorSettings) -> list:
    """The alert relay (gpuserve.receivers, issue 29) where a webhook's URL is a secret: its
    program, its receivers' URLs (a credential its unit loads, never shown) and its unit, running;
    where none is, the relay stopped and gone. With ``alertmanager_managed = False`` left as it is
    (the hand-edited alertmanager.yml may name it). The operations whose change restarts it."""
    if not m.alertmanager_managed:
        return []
    try:
        targets = receivers.relay_targets(m.alert_receivers, secret_sources.read_text)
    except (OSError, SecretSourceError) as exc:   # names the source, never a secret
        raise OperationError(f"{host.name}: alert_receivers: {getattr(exc, 'strerror', None) or exc}") from None
    if not targets:
        if host.get_fact(File, path=RELAY_UNIT_PATH) is not None:
            systemd.service(name="No alert relay (no webhook with a secret URL): stopped",
                            service=layout.ALERT_RELAY_UNIT, running=False, enabled=False)
            files.file(name="No alert relay unit", path=RELAY_UNIT_PATH, present=False)
            files.file(name="No alert relay credential", path=layout.ALERT_RELAY_CRED, present=False)
            files.directory(name="No alert relay guard drop-in",
                            path=f"{RELAY_UNIT_PATH}.d", present=False)
            systemd.daemon_reload(name="Reload systemd units (alert relay gone)")
        return []
    apt.packages(name="python3 (the alert relay)", packages=["python3"], extra_install_args=NO_RECOMMENDS)
    program = files.put(name="Alert relay program", src=str(RELAY_SRC), dest=layout.ALERT_RELAY_BIN,
                        user="root", group="root", mode="755")
    files.directory(name="Alert relay credential directory (0700)", path=posixpath.dirname(layout.ALERT_RELAY_CRED),
                    user="root", group="root", mode="700")
    urls = secrets_ops.encrypted_credential(
        name="Alert relay: the webhooks' secret URLs (encrypted, not shown)",
        content=json.dumps(list(targets)) + "\n", cred=layout.ALERT_RELAY_CRED,
        cred_name=layout.ALERT_RELAY_CREDENTIAL)
    unit = files.put(name="Alert relay unit", src=StringIO(receivers.relay_unit_text()), dest=RELAY_UNIT_PATH,
                     user="root", group="root", mode="644")
    systemd.daemon_reload(name="Reload systemd units (alert relay)", _if=unit.did_change)
    return [program, urls, unit]


@deploy("Prometheus and alertmanager")
def monitor(settings: HostSettings, all_settings: dict[str, HostSettings]) -> None:
    """On a monitor host: Prometheus scraping the inventory, alertmanager, both on loopback."""
    if monitoring.MONITOR_GROUP not in settings.groups:
        return
    m = settings.monitor
    apt.packages(name="prometheus, prometheus-alertmanager",
                 packages=["prometheus", "prometheus-alertmanager"], extra_install_args=NO_RECOMMENDS)
    addresses = {name: address_of(name) for name in all_settings}
    addresses[host.name] = "127.0.0.1"   # itself: over loopback (an operator network)
    plan = monitoring.plan_targets(all_settings, addresses)
    for why in plan.skipped:
        host.noop(why)
    files.directory(name="Scrape keys (root:prometheus 0750)", path=monitoring.SCRAPE_SECRETS_DIR,
                    user="root", group="prometheus", mode="750")
    monitor_credentials()
    secrets = []
    for t in plan.engines:
        if t.operator_key_file:
            dep = all_settings[t.host].deployment(t.deployment)
            # a scrape key (monitoring routes only): the monitor never holds an operator key
            secrets.append(_scrape_key(f"{t.host} {t.deployment}", dep.scrape_keys_file, t.operator_key_file))
    for n in plan.nodes:
        if n.operator_key_file:
            dep = next(d for d in all_settings[n.host].deployments if d.scrape_keys_file)
            secrets.append(_scrape_key(f"{n.host}'s exporters", dep.scrape_keys_file, n.operator_key_file))
    cas = []
    if any(t.ca_file for t in plan.engines) or any(n.ca_file for n in plan.nodes):
        files.directory(name="Hosts' certificates", path=monitoring.SCRAPE_CA_DIR,
                        user="root", group="root", mode="755")
        for name, s in all_settings.items():
            if s.proxy and s.proxy_tls_cert_file:
                cas.append(files.put(name=f"{name}'s certificate", src=s.proxy_tls_cert_file,
                                     dest=f"{monitoring.SCRAPE_CA_DIR}/{name}.crt", mode="644"))
    files.directory(name="Prometheus storage", path=m.storage_path, user="prometheus",
                    group="prometheus", mode="750")
    rules = files.put(name="Alert and recording rules", src=StringIO(monitoring.rules_yml(m)),
                      dest=monitoring.RULES_YML, user="root", group="root", mode="644")
    conf = files.put(name="prometheus.yml (from the inventory)",
                     src=StringIO(monitoring.prometheus_yml(plan, m)),
                     dest=monitoring.PROMETHEUS_YML, user="root", group="root", mode="644")
    args = files.put(
        name="Prometheus on loopback, retention and storage",
        src=StringIO("# Managed by gpuserve (pyinfra)\n"
                     f'ARGS="--web.listen-address=127.0.0.1:{monitoring.PROMETHEUS_PORT} '
                     f"--config.file={monitoring.PROMETHEUS_YML} "
                     f"--storage.tsdb.path={m.storage_path} "
                     f'--storage.tsdb.retention.time={m.retention}"\n'),
        dest=layout.PROMETHEUS_DEFAULTS, user="root", group="root", mode="644")
    am_conf = _alertmanager_yml(m)
    relay = _alert_relay(m)
    am_args = files.put(
        name="alertmanager on loopback, no cluster port",
        src=StringIO("# Managed by gpuserve (pyinfra)\n"
                     f'ARGS="--web.listen-address=127.0.0.1:{monitoring.ALERTMANAGER_PORT} '
                     f"--cluster.listen-address= "
                     f'--config.file={monitoring.ALERTMANAGER_YML}"\n'),
        dest=layout.ALERTMANAGER_DEFAULTS, user="root", group="root", mode="644")
    # only root and Prometheus's own user open 9090 and 9093 (any local user could silence
    # every alert: issue 26); Prometheus and alertmanager do not start without the guard
    # and the alert relay's port (only alertmanager posts alerts on to the receivers)
    service_guard("monitor", engine_guard.monitor_guard((monitoring.PROMETHEUS_PORT,
                                                         monitoring.ALERTMANAGER_PORT, receivers.RELAY_PORT)),
                  engine_guard.MONITOR_TABLE, engine_guard.MONITOR_RULES_PATH, engine_guard.MONITOR_UNIT,
                  dependents=("prometheus", "prometheus-alertmanager",
                              *([layout.ALERT_RELAY] if relay else [])))
    server.shell(name="promtool checks the configuration",
                 commands=[f"promtool check config {shlex.quote(monitoring.PROMETHEUS_YML)} >/dev/null"],
                 _if=any_changed(rules, conf, *secrets, *cas))
    systemd.service(name="Prometheus running", service="prometheus", running=True, enabled=True)
    systemd.service(name="Prometheus restarted (its arguments changed)", service="prometheus",
                    restarted=True, _if=args.did_change)
    # not right after a restart: Debian's ExecReload is a SIGHUP, which kills a Prometheus that
    # has not set up its handler yet (seen in the sandbox: the next converge found it stopped)
    config_changed = any_changed(rules, conf, *secrets, *cas)
    server.shell(name="Prometheus reloads its configuration", commands=["systemctl reload prometheus"],
                 _if=lambda: config_changed() and not args.did_change())
    if relay:
        systemd.service(name="Alert relay running", service=layout.ALERT_RELAY_UNIT, running=True, enabled=True)
        systemd.service(name="Alert relay restarted (its program, receivers or unit changed)",
                        service=layout.ALERT_RELAY_UNIT, restarted=True, _if=any_changed(*relay))
    systemd.service(name="alertmanager running", service="prometheus-alertmanager", running=True,
                    enabled=True)
    systemd.service(name="alertmanager restarted (its configuration changed)",
                    service="prometheus-alertmanager", restarted=True,
                    _if=any_changed(am_args, *([am_conf] if am_conf else [])))
