"""Gateway layer: smg (its own pinned uv venv, a hardened unit) behind nginx on a gateway host.

smg's venv is built by gpuserve.operations.venv.smg_venv, with the engine's uv.

    nginx   gateway_bind:gateway_port   TLS, client keys, client routes only (proxy_conf.server_conf):
                                        no admin route for any key, operator keys included
    smg     127.0.0.1:gateway_smg_port  API and admin API; metrics on gateway_metrics_host
    files   /etc/gpuserve-gateway/workers.json, workers-ca.pem (gpuserve.gateway)

The worker file lists every deployment of every serving host of the inventory (a rollout takes
one out and puts it back: gpuserve.layers.rotation). The CA file is what smg trusts on the
serving hosts' TLS fronts: ``gateway_workers_ca_file``, or the hosts' own self-signed
certificates, read from them when this operation runs (after their proxy layer made them).
nginx strips the client's key before smg: it never reaches the serving hosts, which admit the
gateway by its address (docs/gateway.md, "Trust").
"""

from __future__ import annotations

import hashlib
from io import StringIO
from pathlib import Path

import gevent.lock

from pyinfra import host, logger
from pyinfra.api import deploy
from pyinfra.api.exceptions import OperationError
from pyinfra.context import ctx_state
from pyinfra.facts.files import Directory, File, FileContents
from pyinfra.facts.server import Arch
from pyinfra.facts.systemd import SystemdStatus
from pyinfra.operations import apt, files, python, server, systemd
from pyinfra.operations.util import any_changed

from gpuserve import api_keys, engine_guard, gateway as gw, layout, proxy_conf, wheelhouse
from gpuserve import engine as eng
from gpuserve.config import HostSettings, serving_workers
from gpuserve.layers import proxy as proxy_layer
from gpuserve.layers.context import all_settings, host_plan
from gpuserve.secret_sources import SecretCommand, SecretSourceError
from gpuserve.layers.engine_guard import service_guard
from gpuserve.rollout.remote import COMMAND_TIMEOUT_S, MoveFailed, connected, put_text, run, shell
from gpuserve.operations import secrets as secrets_ops
from gpuserve.operations.venv import smg_venv, uv_binary

NGINX_DIR = proxy_conf.NGINX_DIR


def _keys(file: str | None, what: str, required: bool) -> list[str]:
    if file is None and not required:
        return []
    try:   # a file, or the keys a command prints (gpuserve.secret_sources)
        keys = api_keys.read_api_keys(file if isinstance(file, SecretCommand) else Path(file or ""))
    except SecretSourceError as exc:
        raise OperationError(f"{host.name}: {what}: {exc}") from None
    if required and not keys:
        raise OperationError(f"{host.name}: {what} {file} holds no API key")
    for k in keys:
        try:
            proxy_conf.check_key(k)
        except ValueError as exc:   # never the key itself
            raise OperationError(f"{host.name}: {what} {file}: {exc}") from None
    return keys


def _serving_certificates(state, host) -> bool:
    """workers-ca.pem from the serving hosts' own proxy certificates (public, not secrets);
    an unreachable or certificate-less serving host fails the operation, naming it. Added on the
    gateways without gateway_workers_ca_file only (on any other host a python.call would count
    as a change, and a second converge must report none)."""
    settings = all_settings()
    mine = settings[host.name].gateway
    if mine is None or mine.workers_ca_file:
        return True
    pems = []
    for h in state.inventory:
        s = settings.get(h.name)
        if s is None or not s.serves:
            continue
        try:
            connected(h, "a worker whose certificate the gateway trusts")
            ok, out = shell(h, f"cat {NGINX_DIR}/tls.crt", COMMAND_TIMEOUT_S)
        except MoveFailed as exc:
            logger.error(f"    [{host.name}] {exc}")
            return False
        if not ok or "BEGIN CERTIFICATE" not in out.stdout:
            logger.error(f"    [{host.name}] {h.name} has no proxy certificate ({NGINX_DIR}/tls.crt); "
                         "converge it first (deploys/serve.py)")
            return False
        pems.append(_ca_entry(h.name, out.stdout))
    return _write_if_changed(host, gw.WORKERS_CA, "".join(pems), mine.smg_port)


def _ca_entry(name: str, pem: str) -> str:
    return f"# {name}\n{pem.strip()}\n"


def _workers_ca_current(state) -> bool:
    """Plan time: whether the gateway's CA file already holds exactly every serving host's proxy
    certificate, read now. Then no step is added, so a second converge reports no change.
    False (the step is added and reads them when it runs) when a serving host is outside this
    run, has no certificate yet, or gets its certificate from the control node this run."""
    settings = all_settings()
    pems = []
    for h in state.inventory:
        s = settings.get(h.name)
        if s is None or not s.serves:
            continue
        if h not in state.activated_hosts or s.proxy_tls_cert_file:
            return False
        lines = h.get_fact(FileContents, path=f"{NGINX_DIR}/tls.crt")
        pem = "\n".join(lines or [])
        if "BEGIN CERTIFICATE" not in pem:
            return False
        pems.append(_ca_entry(h.name, pem))
    have = host.get_fact(FileContents, path=gw.WORKERS_CA)
    info = host.get_fact(File, path=gw.WORKERS_CA) or {}
    return (have is not None and "\n".join(have).strip() == "".join(pems).strip()
            and info.get("mode") == 644)   # smg, a dynamic user, reads it


SMG_READY_S = 60


def smg_ready_command(port: int, seconds: int = SMG_READY_S) -> str:
    """Exit 0 once smg's /liveness answers 200 on loopback; else print smg's last journal lines
    and exit 1."""
    return (f"for i in $(seq {seconds}); do "
            f"curl -fsS -m 2 -o /dev/null http://127.0.0.1:{port}/liveness && exit 0; sleep 1; done; "
            f"echo 'smg did not answer on 127.0.0.1:{port} within {seconds} s; its journal:' >&2; "
            f"journalctl -u {gw.UNIT} -n 15 --no-pager -o cat >&2; exit 1")


# the gateways restart smg one at a time when their CA file changes (a serving host joined or got
# a new certificate), each waiting for its smg to answer: the fleet keeps its other gateways
_ONE_RESTART_AT_A_TIME = gevent.lock.Semaphore()


def _write_if_changed(h, path: str, content: str, smg_port: int) -> bool:
    """A public file (never a secret) written atomically, 0644, when its content or mode differs;
    restarts a running smg when it changed, so it trusts the new certificates, and waits for it."""
    want = f"{hashlib.sha256(content.encode()).hexdigest()} 644"
    ok, out = shell(h, f"echo $(sha256sum {path} 2>/dev/null | cut -d' ' -f1) $(stat -c %a {path} 2>/dev/null)",
                    COMMAND_TIMEOUT_S)
    if ok and out.stdout.strip() == want:
        return True
    try:
        run(h, f"mkdir -p {gw.ETC}")
        put_text(h, path, content)
    except MoveFailed as exc:
        logger.error(f"    [{h.name}] writing {path} failed: {exc}")
        return False
    try:
        with _ONE_RESTART_AT_A_TIME:
            # the wait runs in a subshell: it ends with `exit`
            restarted = run(h, f"if systemctl is-active -q {gw.UNIT}; then systemctl restart {gw.UNIT} && "
                               f"( {smg_ready_command(smg_port)} ) && echo restarted; fi",
                            COMMAND_TIMEOUT_S + SMG_READY_S).strip().endswith("restarted")
    except MoveFailed as exc:
        logger.error(f"    [{h.name}] {path} changed, and smg did not come back after its restart: {exc}")
        return False
    logger.info(f"    [{h.name}] {path} changed" + ("; smg restarted to trust it" if restarted else ""))
    return True


@deploy("Gateway")
def gateway(settings: HostSettings) -> None:
    g = settings.gateway
    if g is None:
        return
    state = ctx_state.get()
    # smg's readiness wait asks its API with curl, and a role host gets no serving layer's tools
    apt.packages(name="curl for smg's readiness wait", packages=["curl"])
    if not g.workers_ca_file and not _workers_ca_current(state):
        # deploys/serve.py runs this after every host's proxy layer, which makes the certificates
        # it reads: behind layers.base.ordering_point, a step serving and gateway hosts share
        python.call(name="Gateway: workers' CA from the serving hosts (after their proxy)",
                    function=_serving_certificates)
    every = all_settings()
    # --- smg, pinned, in its own venv (uv from the control node; the wheelhouse when set) ---------
    files.directory(name="Engine tools", path=eng.BIN_DIR, user="root", group="root", mode="755")
    files.directory(name="Engine caches (uv)", path=f"{layout.OPT_DIR}/cache", user="root", group="root",
                    mode="700")
    uv_binary(name=f"uv {settings.uv_version}", version=settings.uv_version,
              wheelhouse_dir=settings.wheelhouse)
    wheels = None
    if settings.wheelhouse:
        wset = wheelhouse.load_set(settings.wheelhouse, gw.SMG_PACKAGE, g.smg_version,
                                   settings.python_version, "none", host.get_fact(Arch))
        name = wset.name
        wheels = f"{eng.WHEELHOUSE_DIR}/{name}"
        if not host.get_fact(Directory, path=gw.venv_dir(g.smg_version, settings.python_version)):
            files.sync(name=f"Wheel set {name}", src=str(wset.path), dest=wheels, user="root",
                       group="root", mode="644", dir_mode="755", delete=False)
    venv = smg_venv(name=f"smg {g.smg_version} venv (uv venv, uv pip install, check, rename)",
                    version=g.smg_version, python_version=settings.python_version,
                    python_downloads=settings.python_downloads, uv=eng.uv_path(settings.uv_version),
                    wheels=wheels)
    # --- the worker file, what smg trusts on the workers, the unit ---------------------------------
    files.directory(name="Gateway configuration", path=gw.ETC, user="root", group="root", mode="755")
    files.directory(name=f"No gateway configuration in its old place ({gw.OLD_ETC})", path=gw.OLD_ETC,
                    present=False)
    workers = serving_workers(state.inventory, every)
    manifest = files.put(name=f"Worker file: {len(workers)} worker(s) of the inventory",
                         src=StringIO(gw.manifest(workers)), dest=gw.WORKERS_FILE,
                         user="root", group="root", mode="644")
    if g.workers_ca_file:
        ca = files.put(name="Workers' CA (gateway_workers_ca_file)", src=g.workers_ca_file,
                       dest=gw.WORKERS_CA, user="root", group="root", mode="644")
    else:
        ca = None   # the first operation above wrote it (and restarted smg when it changed)
    # smg's API (admin routes included) and metrics: only root and nginx's workers open them here
    service_guard("gateway", engine_guard.gateway_guard((g.smg_port, g.metrics_port)),
                  engine_guard.GATEWAY_TABLE, engine_guard.GATEWAY_RULES_PATH, engine_guard.GATEWAY_UNIT)
    venv_dir = gw.venv_dir(g.smg_version, settings.python_version)
    unit = files.put(name=f"{gw.UNIT} (smg on 127.0.0.1:{g.smg_port}, no secret)",
                     src=StringIO(gw.unit(g, venv_dir)), dest=layout.systemd_unit_path(gw.UNIT),
                     user="root", group="root", mode="644")
    systemd.daemon_reload(name="Reload systemd units (gateway)", _if=unit.did_change)
    # a new unit, or an smg that is not running, starts from a clean slate: a unit that failed
    # into its start limit would refuse the start below for 10 minutes
    if unit.will_change or not (host.get_fact(SystemdStatus, services=[gw.UNIT]) or {}).get(gw.UNIT):
        server.shell(name="Forget smg's earlier failures (a new unit, or smg is not running)",
                     commands=[f"systemctl reset-failed {gw.UNIT} 2>/dev/null || true"])
    running = systemd.service(name="smg running and enabled", service=gw.UNIT, running=True, enabled=True)
    restart = systemd.service(name="Restart smg (its unit, venv or CA changed)", service=gw.UNIT,
                              restarted=True, _if=any_changed(unit, venv, *([ca] if ca else [])))
    # systemd reports a started smg at once; one that exits (a file it cannot read, a bad flag)
    # only shows later, in a restart loop: wait for its API, or fail with what it printed
    server.shell(name=f"smg answers on 127.0.0.1:{g.smg_port} (bounded: {SMG_READY_S} s)",
                 commands=[smg_ready_command(g.smg_port)], _if=any_changed(running, restart))
    del manifest   # smg rereads the worker file by itself
    _front(settings)


def _front(settings: HostSettings) -> None:
    """nginx on the gateway host: TLS, the clients' keys, the client routes to smg."""
    g = settings.gateway
    apt.packages(name=f"nginx, its njs module ({proxy_conf.NJS_PACKAGE}: the message limit) and openssl",
                 packages=["nginx", proxy_conf.NJS_PACKAGE, "openssl"])
    default_site = files.link(name="No default nginx site", path=layout.NGINX_DEFAULT_SITE,
                              present=False)
    files.directory(name="Proxy configuration (0711)", path=NGINX_DIR, user="root", group="root",
                    mode="711")
    common = files.put(name="Proxy settings shared by the fronts", src=StringIO(proxy_conf.common_conf()),
                       dest=proxy_conf.COMMON_CONF, user="root", group="root",
                       mode="644")
    limits_js = files.put(name="The prompt routes' message limit (njs)", src=StringIO(proxy_conf.LIMITS_JS_TEXT),
                          dest=proxy_conf.LIMITS_JS, user="root", group="root", mode="644")
    old_common = files.file(name="No shared settings in their old place", path=proxy_conf.OLD_COMMON_CONF,
                            present=False)
    meter_js = proxy_layer.meter_files()
    proxy_layer.nginx_credentials()
    tls = proxy_layer.tls_files(host_plan(engine=False))
    tls_conf = files.put(name="TLS settings (TLS 1.2 ECDHE+AEAD, 1.3)",
                         src=StringIO(proxy_conf.tls_conf(f"{NGINX_DIR}/tls.crt", f"{NGINX_DIR}/tls.key")),
                         dest=f"{NGINX_DIR}/tls.conf", user="root", group="root", mode="644")
    dropin = files.put(name="nginx restarts on failure, confined (systemd drop-in)",
                       src=StringIO(proxy_conf.NGINX_DROPIN), dest=proxy_layer.DROPIN, user="root",
                       group="root", mode="644")
    systemd.daemon_reload(name="Reload systemd units (nginx drop-in)", _if=dropin.did_change)
    clients = _keys(g.api_keys_file, "api_keys_file", required=True)
    operators = _keys(g.operator_keys_file, "operator_keys_file", required=False)
    if set(clients) & set(operators):
        raise OperationError(f"{host.name}: a key is in both api_keys_file and operator_keys_file")
    name = gw.NGINX_NAME
    keys = secrets_ops.credential_file(name="Gateway: client API keys (encrypted, not shown)",
                                       content=proxy_conf.keys_map(clients, "c"),
                                       dest=f"{NGINX_DIR}/{name}.keys", cred_name=f"{name}.keys")
    op_keys = secrets_ops.credential_file(name="Gateway: operator API keys (encrypted, not shown)",
                                          content=proxy_conf.keys_map(operators, "o"),
                                          dest=f"{NGINX_DIR}/{name}.operator-keys",
                                          cred_name=f"{name}.operator-keys")
    # the client's key ends here: smg and the serving hosts never see it
    strip = files.put(name="Gateway: the client's key is not forwarded",
                      src=StringIO('proxy_set_header Authorization "";\n'),
                      dest=f"{NGINX_DIR}/{name}.upstream-auth", user="root", group="root", mode="644")
    conf = files.put(
        name=f"Gateway: TLS front on {g.bind}:{g.port} (client routes -> smg)",
        src=StringIO(proxy_conf.server_conf(
            deployment=name, bind=g.bind, port=g.port, server_names=proxy_layer.server_names(settings),
            engine_host="127.0.0.1", engine_port=g.smg_port,
            drain_flag=f"{NGINX_DIR}/{name}.drain",   # never made: a gateway is not drained
            read_timeout_s=3600, operator_networks=settings.proxy_operator_networks,
            limits=proxy_conf.ProxyLimits(**settings.proxy_limits),
            admin_routes=False)),   # smg's admin API: loopback only, for any key
        dest=gw.NGINX_CONF, user="root", group="root", mode="644")
    systemd.service(name="nginx running and enabled", service="nginx.service", running=True,
                    enabled=True)
    systemd.service(name="Restart nginx (its drop-in changed)", service="nginx.service",
                    restarted=True, _if=dropin.did_change, **proxy_layer.NGINX_RETRY)
    server.shell(name="Reload nginx (gateway keys or configuration changed)",
                 commands=["nginx -t -q", proxy_layer.RELOAD_AND_WAIT],
                 _if=any_changed(default_site, common, limits_js, meter_js, old_common, tls_conf, *tls, keys,
                                 op_keys, strip, conf),
                 **proxy_layer.NGINX_RETRY)
    proxy_layer.token_meter()   # the gateway's front meters its clients' keys (gpuserve.meter)
