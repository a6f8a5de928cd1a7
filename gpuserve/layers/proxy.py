"""Proxy layer: nginx (Debian's) with TLS and API keys in front of every deployment.

vLLM checks its key only on /v1 (/invocations, /metrics, /tokenize, /scale_elastic_ep stay open),
so remote clients go through this proxy: clients reach only the inference routes, every other
route needs an operator key (the monitoring routes: or a peer in an operator network), and
/health, which load balancers poll, is open and answers 503 while a rollout has the host out of rotation (gpuserve/proxy_conf.py).
Client keys live only here: rotating them is an nginx reload, never an engine restart. The engine
gets its own key, made on the host, which the proxy adds to each request. No secret is uploaded
with files.put (its --diff would print it): gpuserve/operations/secrets.py.
"""

from __future__ import annotations

from io import StringIO
from pathlib import Path

from pyinfra import host
from pyinfra.api import deploy
from pyinfra.api.exceptions import OperationError
from pyinfra.facts.files import File
from pyinfra.operations import apt, files, server, systemd
from pyinfra.operations.util import any_changed

from gpuserve import api_keys, certs, gateway, layout, meter, proxy_conf, rollout, secret_sources, tenants
from gpuserve.config import HostSettings
from gpuserve.host_plan import HostPlan, SecretInstall
from gpuserve.operations import secrets as secrets_ops
from gpuserve.layers.context import all_settings
from gpuserve.secret_sources import SecretCommand, SecretSourceError
from gpuserve.values import is_host

NGINX_DIR = proxy_conf.NGINX_DIR
PROXY_PACKAGES = ["nginx", proxy_conf.NJS_PACKAGE, "openssl"]


# `systemctl reload nginx` returns once the master got the signal, while the old workers (old keys)
# still accept connections: wait (5 s at most) until none of them does, so a rotated key is live
# when the converge says so
# (a failed reload fails the operation; old workers still streaming after 5 s are only reported:
# they finish their requests and exit, and accept no new connections meanwhile)
RELOAD_AND_WAIT = (
    "old=$(pgrep -f '^nginx: worker process$' | tr '\\n' ' '); systemctl reload nginx || exit 1; "
    "for i in $(seq 50); do busy=; for p in $old; do "
    "ps -o args= -p $p 2>/dev/null | grep -q 'worker process$' && busy=1; done; "
    "[ -z \"$busy\" ] && break; sleep 0.1; done; "
    "[ -z \"$busy\" ] || echo 'gpuserve: old nginx workers are still finishing requests'"
)


def conf_path(deployment: str) -> str:
    return layout.proxy_site(deployment)


DROPIN = layout.NGINX_DROPIN_PATH
# issue 29: nginx's keys are systemd credentials at rest, decrypted into /run before it starts
CREDENTIALS_DROPIN = layout.NGINX_CREDENTIALS_DROPIN
NGINX_TEST = "/usr/sbin/nginx -t -q -g 'daemon on; master_process on;'"   # Debian's ExecStartPre=


def nginx_credentials() -> None:
    """What decrypts nginx's credentials (gpuserve.operations.secrets.credential_file) when it
    starts: the script and nginx's drop-in that runs it. No restart: a running nginx already
    reads the /run copies the converge writes."""
    secrets_ops.credentials_tool()
    dropin = files.put(name="nginx decrypts its credentials when it starts (systemd drop-in)",
                       src=StringIO(secrets_ops.credentials_dropin(NGINX_DIR, NGINX_TEST)),
                       dest=CREDENTIALS_DROPIN, user="root", group="root", mode="644")
    systemd.daemon_reload(name="Reload systemd units (nginx credentials drop-in)", _if=dropin.did_change)
# nginx's restart and reload are tried up to twice more, 3 s apart, before the host fails: in
# one CI run under load, a fresh host's restart and the other host's reload failed, and the
# module's 8 tests passed here on the same code. The cause is unknown (CI kept only pyinfra's
# results table; failed sandbox tests now report the hosts' journals, tests/conftest.py), and
# over 300 restarts by hand, some of fresh installs and under load, never failed. Like the
# engine guard's spawn failures (status=219/CGROUP, gpuserve/layers/engine_guard.py), a
# transient failure is tried again; three in a row fail the host.
NGINX_RETRY = {"_retries": 2, "_retry_delay": 3}


def keys_map(keys: list[str], prefix: str = "c") -> str:
    """nginx map entries: each accepted Authorization header, exactly -> its id."""
    return proxy_conf.keys_map(keys, prefix)


def _read_keys(secret: SecretInstall, required: bool) -> list[str]:
    """The keys of one of the plan's client-keys or operator-keys secrets (gpuserve.host_plan),
    read from its source on the control node."""
    name, key, file = secret.deployment, secret.setting, secret.source
    if file is None and not required:
        return []
    if isinstance(file, SecretCommand):   # issue 29: the keys a command prints, held in memory
        key, path = file.setting, file
    else:
        path = Path(file or "")
        if file is None or not path.is_file():
            raise OperationError(f"{host.name}: deployments.{name}.{key} {file} is missing on this "
                                 "control node; the proxy lets no client in without one")
    try:
        keys = api_keys.read_api_keys(path)
    except SecretSourceError as exc:
        raise OperationError(f"{host.name}: deployments.{name}.{key}: {exc}") from None
    if required and not keys:
        raise OperationError(f"{host.name}: deployments.{name}.{key} {path} holds no API key")
    for k in keys:
        try:
            proxy_conf.check_key(k)
        except ValueError as exc:   # never the key itself in the message
            raise OperationError(f"{host.name}: deployments.{name}.{key} {path}: {exc}") from None
    return keys


def _tenant_keys(dep, taken: set[str]) -> list[tuple[tenants.Tenant, list[str]]]:
    """Each tenant of ``dep`` with its keys, read from its source; a key in two places fails
    (it would count in one tenant's zones only)."""
    out = []
    for t in dep.tenants:
        what = SecretInstall(dep.name, "client-keys", t.keys, "", f"tenants.{t.name}.keys_file")
        keys = _read_keys(what, required=True)
        if taken & set(keys):
            raise OperationError(f"{host.name}: deployments.{dep.name}: tenant {t.name} has a key that "
                                 "is also in api_keys_file, operator_keys_file, scrape_keys_file or another tenant")
        taken |= set(keys)
        out.append((t, keys))
    return out


def server_names(settings: HostSettings) -> list[str]:
    names = [host.name, "localhost", "127.0.0.1"]
    address = host.data.get("ssh_hostname")
    if address:
        names.append(str(address))
    names += list(settings.proxy_server_names)
    # nginx reads server_name's words as they are: only host names and addresses (validation
    # refuses anything else; a pyinfra connector's name like @local is no name a client sends)
    return [n for n in dict.fromkeys(names) if is_host(n, underscore=True)]


@deploy("Proxy")
def proxy(plan: HostPlan, *, sites_removed: bool = False,
          drain_flags: tuple[str, ...] = ()) -> None:
    """nginx in front of the plan's deployments, with the plan's secrets (keys, TLS key).
    ``sites_removed``: the removal layer took a deployment's site away (gpuserve.layers.removal),
    so nginx is reloaded even if nothing here changed; ``drain_flags``: that layer's drain flags,
    which kept the removed sites' /health at 503 until this reload and go after it."""
    settings = plan.settings
    if not settings.proxy:
        return
    default_site = nginx_packages()
    # 0711: nginx's workers (www-data) only stat the drain flag here by name; they cannot list
    # the directory; the keys, the engine's key and the TLS key in it are links to their root 0600
    # copies in /run, systemd credentials at rest (issue 29: gpuserve/operations/secrets.py)
    files.directory(name="Proxy configuration (0711)", path=NGINX_DIR, user="root", group="root",
                    mode="711")
    common = files.put(name="Proxy settings shared by the deployments",
                       src=StringIO(proxy_conf.common_conf()),
                       dest=proxy_conf.COMMON_CONF, user="root", group="root",
                       mode="644")
    limits_js = files.put(name="The prompt routes' message limit (njs)", src=StringIO(proxy_conf.LIMITS_JS_TEXT),
                          dest=proxy_conf.LIMITS_JS, user="root", group="root", mode="644")
    old_common = files.file(name="No shared settings in their old place (they defined the log format "
                                 "after a site that sorts first)", path=proxy_conf.OLD_COMMON_CONF,
                            present=False)
    meter_js = meter_files()
    nginx_credentials()
    tls = tls_files(plan)
    gateways = gateway.addresses(all_settings())   # docs/gateway.md: only they reach the client routes
    tls_conf = files.put(name="TLS settings (TLS 1.2 ECDHE+AEAD, 1.3)",
                         src=StringIO(proxy_conf.tls_conf(f"{NGINX_DIR}/tls.crt", f"{NGINX_DIR}/tls.key")),
                         dest=f"{NGINX_DIR}/tls.conf", user="root", group="root", mode="644")
    dropin = files.put(name="nginx restarts on failure, confined (systemd drop-in)",
                       src=StringIO(proxy_conf.NGINX_DROPIN), dest=DROPIN, user="root", group="root",
                       mode="644")
    systemd.daemon_reload(name="Reload systemd units (nginx drop-in)", _if=dropin.did_change)
    changed = [default_site, common, limits_js, meter_js, old_common, tls_conf, *tls]
    limits = proxy_conf.ProxyLimits(**settings.proxy_limits)
    for dep in settings.deployments:
        client_secret = plan.secret(dep.name, "client-keys")
        operator_secret = plan.secret(dep.name, "operator-keys")
        clients = _read_keys(client_secret, required=True)
        operators = _read_keys(operator_secret, required=False)
        # the monitor's keys (monitoring routes only) go in the operator file with ids s1, s2, ...
        scrapers = _read_keys(SecretInstall(dep.name, "scrape-keys", dep.scrape_keys_file, "",
                                            "scrape_keys_file"), required=False)
        if set(clients) & set(operators):
            raise OperationError(f"{host.name}: deployments.{dep.name}: a key is in both api_keys_file "
                                 "and operator_keys_file; an operator key must be a separate key")
        if set(scrapers) & (set(clients) | set(operators)):
            raise OperationError(f"{host.name}: deployments.{dep.name}: a key of scrape_keys_file is "
                                 "also in api_keys_file or operator_keys_file; a scrape key must be "
                                 "a separate key")
        groups = _tenant_keys(dep, set(clients) | set(operators) | set(scrapers))   # issue 29: their own limits
        keys = secrets_ops.credential_file(name=f"{dep.name}: client API keys (encrypted, not shown)",
                                           content=keys_map(clients, "c") + "".join(
                                               tenants.keys_map(t.name, k) for t, k in groups),
                                           dest=client_secret.dest,
                                           cred_name=f"{dep.name}.keys")
        op_keys = secrets_ops.credential_file(name=f"{dep.name}: operator and scrape keys (encrypted, not shown)",
                                              content=keys_map(operators, "o") + keys_map(scrapers, "s"),
                                              dest=operator_secret.dest, cred_name=f"{dep.name}.operator-keys")
        upstream = f"{NGINX_DIR}/{dep.name}.upstream-auth"
        if plan.secret(dep.name, "engine-key") is None:
            # the engine takes no key (SGLang): it serves keyless on loopback behind the engine
            # guard, and the proxy, which checked the client's key, sends none upstream
            secrets_ops.no_credential(name=f"{dep.name}: no engine key credential for the proxy", dest=upstream)
            changed.append(files.put(name=f"{dep.name}: no engine key for the proxy (the engine takes none)",
                                     src=StringIO("# the engine takes no key (gpuserve)\n"), dest=upstream,
                                     user="root", group="root", mode="600"))
        else:
            # from the engine key the service layer made on this host; it never leaves the host, and
            # is a credential here too (issue 29), decrypted into /run by nginx's drop-in
            changed.append(secrets_ops.generated_credential(
                name=f"{dep.name}: the engine's key for the proxy (encrypted, made on the host)", dest=upstream,
                cred_name=f"{dep.name}.upstream-auth", check="^proxy_set_header Authorization \"Bearer [A-Za-z0-9_-]",
                make=f". {plan.deployment(dep.name).secrets_env} && "
                     "printf 'proxy_set_header Authorization \"Bearer %s\";\\n' \"$VLLM_API_KEY\""))
        conf = files.put(
            name=f"{dep.name}: TLS front on {settings.proxy_bind}:{dep.proxy_port}",
            src=StringIO(proxy_conf.server_conf(
                deployment=dep.name, bind=settings.proxy_bind, port=dep.proxy_port,
                server_names=server_names(settings),
                engine_host="127.0.0.1" if dep.serve_host in ("0.0.0.0", "::") else dep.serve_host,
                engine_port=dep.serve_port, drain_flag=rollout.drain_flag(dep.name),
                read_timeout_s=max(600, dep.ready_timeout_s),
                operator_networks=settings.proxy_operator_networks, limits=limits,
                gateways=gateways, **tenants.site_args(dep.name, dep.tenants))),
            dest=conf_path(dep.name), user="root", group="root", mode="644")
        changed += [keys, op_keys, conf]
    # a crashed nginx (kill -9 of the master) is restarted by its drop-in; a stopped one here
    systemd.service(name="nginx running and enabled", service="nginx.service", running=True,
                    enabled=True)
    systemd.service(name="Restart nginx (its drop-in changed)", service="nginx.service",
                    restarted=True, _if=dropin.did_change, **NGINX_RETRY)
    server.shell(name="Reload nginx (keys or configuration changed; the engine keeps running)",
                 commands=["nginx -t -q", RELOAD_AND_WAIT],
                 _if=None if sites_removed else any_changed(*changed), **NGINX_RETRY)
    if drain_flags:
        server.shell(name=f"Remove the drain flags of removed deployments ({', '.join(drain_flags)})",
                     commands=[f"rm -f {' '.join(drain_flags)}"])
    token_meter()


def nginx_packages():
    """nginx with its njs module and openssl, and without Debian's default site; the site's
    operation (a change reloads nginx). The packages layer runs it early too (it changes
    nothing here then)."""
    apt.packages(name=f"nginx, its njs module ({proxy_conf.NJS_PACKAGE}: the message limit) and openssl",
                 packages=PROXY_PACKAGES)
    return files.link(name="No default nginx site", path=layout.NGINX_DEFAULT_SITE, present=False)


def mtail_package() -> None:
    """mtail, with Debian's own mtail.service off (the token meter runs its own unit)."""
    apt.packages(name="mtail (tokens per key from the proxy's usage log)", packages=[meter.PACKAGE],
                 extra_install_args="--no-install-recommends")
    systemd.service(name="Debian's mtail.service off (gpuserve-meter runs mtail)", service=meter.DEBIAN_UNIT,
                    running=False, enabled=False)


def meter_files():
    """The prompt routes' usage reader (njs, gpuserve.proxy_conf.METER_JS_TEXT) and the usage log,
    made before nginx opens it; the reader's operation (a change reloads nginx)."""
    # nginx's master (root, UMask=0027 in its drop-in) would make the log root:root 0640, which
    # mtail (group adm) cannot read; Debian's logrotate makes each new one www-data:adm 0640
    files.file(name="The proxy's usage log (www-data:adm 0640, as logrotate makes it)", path=proxy_conf.USAGE_LOG,
               user="www-data", group="adm", mode="640")
    return files.put(name="The prompt routes' token usage reader (njs)", src=StringIO(proxy_conf.METER_JS_TEXT),
                     dest=proxy_conf.METER_JS, user="root", group="root", mode="644")


def token_meter() -> None:
    """mtail counting tokens per key from the usage log nginx writes (gpuserve.meter): on
    127.0.0.1:meter.PORT, confined; Debian's own mtail.service stays off. A changed program is
    reloaded (counters kept), a changed unit restarts it."""
    mtail_package()
    files.directory(name="Token meter program directory", path=meter.PROGRAM_DIR, user="root", group="root",
                    mode="755")
    program = files.put(name="Token meter program (mtail)", src=StringIO(meter.PROGRAM_TEXT), dest=meter.PROGRAM,
                        user="root", group="root", mode="644")
    unit = files.put(name=f"{meter.UNIT}", src=StringIO(meter.unit_text()),
                     dest=layout.systemd_unit_path(meter.UNIT), user="root", group="root", mode="644")
    systemd.daemon_reload(name=f"Reload systemd units ({meter.UNIT})", _if=unit.did_change)
    systemd.service(name="Token meter running and enabled", service=meter.UNIT, running=True, enabled=True)
    systemd.service(name="Token meter restarted (its unit changed)", service=meter.UNIT, restarted=True,
                    _if=unit.did_change)
    systemd.service(name="Token meter reloads its program", service=meter.UNIT, reloaded=True,
                    _if=lambda: program.did_change() and not unit.did_change())


def tls_files(plan: HostPlan) -> list:
    settings = plan.settings
    crt, key = f"{NGINX_DIR}/tls.crt", f"{NGINX_DIR}/tls.key"
    if settings.proxy_tls_cert_file:
        tls_key = plan.secret(None, "tls-key")   # validation: set with the certificate, or neither
        return [
            files.put(name="TLS certificate", src=settings.proxy_tls_cert_file, dest=crt,
                      user="root", group="root", mode="644"),
            secrets_ops.credential_file(name="TLS key (encrypted, not shown)",
                                        content=secret_sources.read_text(tls_key.source), dest=tls_key.dest,
                                        cred_name="tls.key"),
        ]
    if host.get_fact(File, path=key) is not None:
        return []
    address = str(host.data.get("ssh_hostname") or host.name)
    return [server.shell(
        name="Self-signed TLS certificate (set proxy_tls_cert_file for a real one)",
        commands=[certs.self_signed(host.name, key, crt, address=address, leaf=True),
                  f"chmod 644 {crt}"])]
