"""Proxy layer: nginx (Debian's) with TLS and API keys in front of every deployment.

vLLM checks its key only on /v1 and a few other prefixes (/health, /metrics, /tokenize stay open),
so remote clients go through this proxy: every route needs a client key except /health, which
load balancers poll and which answers 503 while a rollout has the host out of rotation. Client
keys live only here: rotating them is an nginx reload, never an engine restart. The engine gets
its own key, made on the host, which the proxy adds to each request.
"""

from __future__ import annotations

import re
from io import StringIO
from pathlib import Path

from pyinfra import host
from pyinfra.api import deploy
from pyinfra.api.exceptions import OperationError
from pyinfra.facts.files import File, FindInFile
from pyinfra.operations import apt, files, server, systemd
from pyinfra.operations.util import any_changed

from gpuserve import api_keys, rollout
from gpuserve.config import DeploymentSettings, HostSettings
from gpuserve.service import secrets_env_path

TEMPLATES = Path(__file__).resolve().parents[2] / "templates"
NGINX_DIR = "/etc/nginx/gpuserve"


def conf_path(deployment: str) -> str:
    return f"/etc/nginx/conf.d/gpuserve-{deployment}.conf"


def keys_map(keys: list[str]) -> str:
    """nginx map entries: each accepted Authorization header -> 1."""
    for key in keys:
        if not re.fullmatch(r"[A-Za-z0-9._~+/=-]+", key):
            raise ValueError("an API key may only hold letters, digits and ._~+/=-")
        if len(key) > 200:   # map_hash_bucket_size 256 holds "Bearer " + 200 characters
            raise ValueError("an API key may be at most 200 characters long")
    return "".join(f'"Bearer {key}" 1;\n' for key in keys)


def _client_keys(dep: DeploymentSettings) -> list[str]:
    path = Path(dep.api_keys_file or "")
    if dep.api_keys_file is None or not path.is_file():
        raise OperationError(f"{host.name}: deployments.{dep.name}.api_keys_file "
                             f"{dep.api_keys_file} is missing on this control node; the proxy "
                             "lets no client in without one")
    keys = api_keys.read_api_keys(path)
    if not keys:
        raise OperationError(f"{host.name}: {path} holds no API key")
    return keys


@deploy("Proxy")
def proxy(settings: HostSettings) -> None:
    if not settings.proxy:
        return
    apt.packages(name="nginx and openssl", packages=["nginx", "openssl"])
    default_site = files.link(name="No default nginx site", path="/etc/nginx/sites-enabled/default",
                              present=False)
    files.directory(name="Proxy configuration", path=NGINX_DIR, user="root", group="root", mode="755")
    common = files.put(name="Proxy settings shared by the deployments",
                       src=StringIO("# Managed by gpuserve: API keys are long map keys\n"
                                    "map_hash_bucket_size 256;\n"),
                       dest="/etc/nginx/conf.d/gpuserve-common.conf", user="root", group="root",
                       mode="644")
    tls = _tls(settings)
    changed = [default_site, common, *tls]
    for dep in settings.deployments:
        keys = files.put(name=f"{dep.name}: client API keys (0600)",
                         src=StringIO(keys_map(_client_keys(dep))),
                         dest=f"{NGINX_DIR}/{dep.name}.keys", user="root", group="root", mode="600")
        upstream = f"{NGINX_DIR}/{dep.name}.upstream-auth"
        if not host.get_fact(FindInFile, path=upstream, pattern="Bearer [A-Za-z0-9_-]"):
            # from the engine key the service layer made on this host; it never leaves the host
            changed.append(server.shell(
                name=f"{dep.name}: the engine's key for the proxy (0600)",
                commands=[f"umask 077; . {secrets_env_path(dep.name)} && "
                          f"printf 'proxy_set_header Authorization \"Bearer %s\";\\n' \"$VLLM_API_KEY\""
                          f" > {upstream}"]))
        conf = files.template(
            name=f"{dep.name}: TLS front on {settings.proxy_bind}:{dep.proxy_port}",
            src=str(TEMPLATES / "nginx-gpuserve.conf.j2"), dest=conf_path(dep.name),
            user="root", group="root", mode="644",
            deployment=dep.name, var="gpuserve_" + re.sub(r"\W", "_", dep.name),
            bind=settings.proxy_bind, port=dep.proxy_port,
            engine_host="127.0.0.1" if dep.serve_host in ("0.0.0.0", "::") else dep.serve_host,
            engine_port=dep.serve_port, drain_flag=rollout.drain_flag(dep.name),
            read_timeout_s=max(600, dep.ready_timeout_s),
        )
        changed += [keys, conf]
    systemd.service(name="nginx running and enabled", service="nginx.service", running=True,
                    enabled=True)
    server.shell(name="Reload nginx (keys or configuration changed; the engine keeps running)",
                 commands=["nginx -t -q", "systemctl reload nginx"], _if=any_changed(*changed))


def _tls(settings: HostSettings) -> list:
    crt, key = f"{NGINX_DIR}/tls.crt", f"{NGINX_DIR}/tls.key"
    if settings.proxy_tls_cert_file:
        return [
            files.put(name="TLS certificate", src=settings.proxy_tls_cert_file, dest=crt,
                      user="root", group="root", mode="644"),
            files.put(name="TLS key (0600)", src=settings.proxy_tls_key_file, dest=key,
                      user="root", group="root", mode="600"),
        ]
    if host.get_fact(File, path=key) is not None:
        return []
    names = [f"DNS:{host.name}"]
    address = host.data.get("ssh_hostname") or host.name
    if re.fullmatch(r"[0-9.]+|[0-9a-fA-F:]+", address):
        names.append(f"IP:{address}")
    return [server.shell(
        name="Self-signed TLS certificate (set proxy_tls_cert_file for a real one)",
        commands=[f"umask 077; openssl req -x509 -newkey rsa:2048 -nodes -days 825 -subj "
                  f"'/CN={host.name}' -addext 'subjectAltName={','.join(names)}' "
                  f"-keyout {key} -out {crt} 2>/dev/null", f"chmod 644 {crt}"])]
