"""The fleet gateway (smg), rendered on the control node (pure: no host access). docs/gateway.md.

A host in the inventory group ``gateway`` runs smg (PyPI ``smg``, its own pinned uv venv) behind
the host's nginx:

    client --TLS, client key--> nginx (gateway_bind:gateway_port; client routes only)
           --loopback, no key--> smg (127.0.0.1:gateway_smg_port; its admin API never leaves it)
           --TLS, from the gateway's address--> each serving host's nginx (proxy_port)
           --loopback, the engine's own key--> the engine

    /opt/gpuserve/gateway/smg-<version>-py<python>/   the venv (uv, like the engines)
    /etc/gpuserve-gateway/workers.json                 the worker file smg watches (this module)
    /etc/gpuserve-gateway/workers-ca.pem               what smg trusts on the serving hosts

smg gets no secret at all: nginx checks the client keys and strips them before smg, and the
serving hosts' nginx trusts the gateway by its address (``gateway_addresses``).
"""

from __future__ import annotations

import json
import shlex
from dataclasses import dataclass
from typing import Any, Iterable, Mapping, Sequence

from gpuserve import engine_guard, layout, schema, templating

# Inventory groups whose hosts serve no model unless they also set gpu_model (a hardware group).
# The monitoring tier adds "monitor" here the same way.
GATEWAY_GROUP = "gateway"

SMG_PACKAGE = "smg"
SMG_VERSION = schema.default("smg_version")   # the version evaluated in issue 14 (gpuserve.schema)
UNIT = "gpuserve-gateway.service"
# beside /etc/gpuserve, not in it: on a host that also serves, /etc/gpuserve is root:gpuserve
# 0750, and smg (a dynamic user) could not read its CA file there, so it never started
ETC = f"{layout.ETC_DIR}-gateway"
OLD_ETC = f"{layout.ETC_DIR}/gateway"   # their old place (CHANGELOG, Unreleased): a converge removes it
WORKERS_FILE = f"{ETC}/workers.json"
WORKERS_CA = f"{ETC}/workers-ca.pem"
ENVS = f"{layout.OPT_DIR}/gateway"
NGINX_NAME = "gateway"   # gpuserve/gateway.keys, ... beside the deployments' (proxy_conf)
NGINX_CONF = layout.GATEWAY_NGINX_CONF   # proxy_conf.OWN_NAMES has "gateway"
MANIFEST_VERSION = 1     # smg 1.13.0 service_discovery/file.rs: {"version": 1, "workers": [...]}

HEADER_NAME = r"[A-Za-z0-9-]{1,64}"


@dataclass(frozen=True)
class GatewaySettings:
    bind: str                 # nginx's TLS front for clients
    port: int
    smg_port: int             # smg's API and admin API, on loopback only
    metrics_host: str         # smg's Prometheus endpoint: loopback or the monitor network
    metrics_port: int
    policy: str
    balance_abs_threshold: int
    balance_rel_threshold: float
    sticky_header: str | None  # a header naming the conversation: sticky sessions by it
    health_interval_s: int
    health_failures: int   # consecutive failed checks before smg ejects a worker (its default: 3)
    smg_version: str
    workers_ca_file: str | None   # control node; None: the serving hosts' own certificates
    addresses: tuple[str, ...]    # what the serving hosts see this gateway connect from
    # control node: a file, or a gpuserve.secret_sources.SecretCommand (the *_command settings)
    api_keys_file: Any = None              # control node: the clients' keys, checked here
    operator_keys_file: Any = None         # control node: keys for the operator routes


@dataclass(frozen=True)
class Worker:
    """One deployment on one serving host, as the gateway reaches it."""
    id: str          # <host>/<deployment>: stable, and how rotation finds it in smg's /workers
    url: str
    model_id: str


def worker_id(host: str, deployment: str) -> str:
    return f"{host}/{deployment}"


def url_host(address: str) -> str:
    return f"[{address}]" if ":" in address else address


def workers(serving: Iterable[tuple[str, str, Sequence]]) -> list[Worker]:
    """The workers of the fleet from (host name, address, deployments) of every serving host,
    in inventory order; each deployment is reached through its host's TLS front."""
    out = []
    for name, address, deployments in serving:
        for dep in deployments:
            out.append(Worker(worker_id(name, dep.name), f"https://{url_host(address)}:{dep.proxy_port}",
                              dep.served_model_name))
    return out


def manifest(ws: Sequence[Worker], without: Iterable[str] = ()) -> str:
    """The worker file smg reads (--discovery-file), without the worker ids in ``without``
    (the ones a rollout has out). Keys sorted, one trailing newline: the same fleet gives the
    same bytes, so a converge that changes nothing rewrites nothing."""
    out = set(without)
    body = {"version": MANIFEST_VERSION,
            "workers": [{"id": w.id, "url": w.url, "model_id": w.model_id} for w in ws if w.id not in out]}
    return json.dumps(body, indent=2, sort_keys=True) + "\n"


def manifest_ids(text: str) -> list[str]:
    """The worker ids in a worker file (a rollout reads the gateway's, to remove one)."""
    return [w["id"] for w in json.loads(text).get("workers", [])]


def venv_dir(version: str, python: str) -> str:
    return f"{ENVS}/smg-{version}-py{python}"


def smg_argv(g: GatewaySettings, venv: str) -> list[str]:
    """smg's command line: no secret (it gets none), listeners on loopback or the monitor network."""
    argv = [
        f"{venv}/bin/smg", "launch",
        "--host", "127.0.0.1", "--port", str(g.smg_port),
        "--prometheus-host", g.metrics_host, "--prometheus-port", str(g.metrics_port),
        "--discovery-provider", "file", "--discovery-file", WORKERS_FILE,
        "--ca-cert-paths", WORKERS_CA,
        "--policy", g.policy,
        "--balance-abs-threshold", str(g.balance_abs_threshold),
        "--balance-rel-threshold", str(g.balance_rel_threshold),
        "--health-check-interval-secs", str(g.health_interval_s),
        "--health-failure-threshold", str(g.health_failures),
        "--discovery-check-interval-secs", "5",   # besides the reread on every change
        "--log-level", "info",
    ]
    if g.sticky_header:
        argv += ["--routing-key-override", "--routing-key-headers", g.sticky_header]
    return argv


def unit(g: GatewaySettings, venv: str) -> str:
    """The systemd unit of smg: an unprivileged dynamic user, read-only system, loopback API."""
    exec_start = " ".join(shlex.quote(a) for a in smg_argv(g, venv))
    return templating.render("gpuserve-gateway.service.j2", smg_version=g.smg_version,
                             guard=engine_guard.GATEWAY_UNIT, exec_start=exec_start)


def admin_url(g: GatewaySettings, path: str) -> str:
    return f"http://127.0.0.1:{g.smg_port}{path}"


def worker_states(workers_json: str) -> dict[str, dict]:
    """smg's GET /workers, by gpuserve worker id (smg keeps the file's id as the label
    ``smg.ai/discovery-id``): {id: {"status", "healthy", "load"}}."""
    body = json.loads(workers_json)
    out = {}
    for w in body.get("workers", []):
        wid = (w.get("labels") or {}).get("smg.ai/discovery-id")
        if wid:
            out[wid] = {"status": w.get("status"), "healthy": bool(w.get("is_healthy")),
                        "load": int(w.get("load") or 0)}
    return out


def drained(states: Mapping[str, dict], wid: str) -> bool:
    """smg has let go of the worker: gone from its list, or draining with nothing in flight."""
    state = states.get(wid)
    return state is None or (state["status"] != "ready" and state["load"] == 0)


def serving_healthy(states: Mapping[str, dict], wid: str) -> bool:
    state = states.get(wid)
    return state is not None and state["healthy"] and state["status"] == "ready"


def addresses(settings: Mapping) -> list[str]:
    """Every gateway's addresses, as the serving hosts' proxies admit them (HostSettings by name)."""
    return list(dict.fromkeys(a for s in settings.values() if s.gateway for a in s.gateway.addresses))


def build_script(version: str, python: str, python_downloads: str, uv: str,
                 wheels: str | None) -> str:
    """smg's venv, built like the engines' (gpuserve.engine.build_script): under .partial,
    checked (smg runs and says its version), then renamed. ``wheels``: a pushed wheel set."""
    q = shlex.quote
    final = venv_dir(version, python)
    partial = final + ".partial"
    index = f"--no-index --find-links {q(wheels)} " if wheels else ""
    managed = "--managed-python" if python_downloads == "automatic" else "--no-managed-python"
    return "\n".join([
        "set -eu",
        "umask 022",
        f"export UV_NO_CONFIG=1 UV_CACHE_DIR={q(layout.OPT_DIR)}/cache/uv UV_PYTHON_DOWNLOADS={q(python_downloads)}"
        f" UV_PYTHON_INSTALL_DIR={q(layout.OPT_DIR)}/python",
        f"mkdir -p {q(ENVS)}",
        f"rm -rf {q(partial)}",
        f"{q(uv)} venv --relocatable {managed} --python {q(python)} {q(partial)}",
        f"{q(uv)} pip install --python {q(partial)}/bin/python --compile-bytecode {index}"
        f"{q(f'{SMG_PACKAGE}=={version}')}",
        f"{q(partial)}/bin/smg --version | grep -q {q(version)}",
        f"mv -f {q(partial)} {q(final)}",
    ])
