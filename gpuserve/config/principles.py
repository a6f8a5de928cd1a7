"""The principles (docs/configuration.md, "How values are checked"): rules about what a value
becomes, applied to every value, so a mistake nobody listed is caught by the rule it breaks. Each
adds a problem only where the key's own check found none. And a deployment's unit and ports
against what gpuserve itself runs on the host."""

from __future__ import annotations

from typing import Any, Iterable, Mapping

from gpuserve import gateway, layout, monitoring, stack
from gpuserve.config.settings import DeploymentSettings
from gpuserve.config.sources import DEFAULT, KEYS, _Checker, data_source
from gpuserve.values import finite_problem, text_problem

# values that are paths on the control node: a user's home may be spelled in any script
CONTROL_NODE_PATHS = {"api_keys_file", "operator_keys_file", "proxy_tls_cert_file", "proxy_tls_key_file",
                      "gateway_workers_ca_file", "model_local_path", "weights_cache", "wheelhouse"}
# what gpuserve itself listens on, on every host (monitoring's exporters, the GPUs' exporter) and
# on the hosts of its roles: a deployment's port there would fail to bind, or take its place
OWN_PORTS = {22: "ssh", monitoring.NODE_EXPORTER_PORT: "the node exporter",
             monitoring.NODE_EXPORTER_TLS_PORT: "the exporters' TLS front",
             stack.DCGM_EXPORTER_PORT: "the DCGM exporter"}
ROLE_PORTS = {monitoring.MONITOR_GROUP: {monitoring.PROMETHEUS_PORT: "Prometheus",
                                         monitoring.ALERTMANAGER_PORT: "Alertmanager"}}
OWN_UNITS = {layout.unit_name("engine-guard"), gateway.UNIT}   # gpuserve-engine-guard, -gateway


def _principles(c: _Checker) -> None:
    """Every value the host's data sets, walked whole (deployments, flags and env included): text
    is what it looks like (no invisible characters, NFKC, ASCII where other programs match it) and
    numbers are finite."""
    flagged = {p.key for p in c.problems}
    for key in KEYS:
        if key in c.host.data.dict() or c.host.data.get(key) is not None:
            value = c.host.data.get(key)
            if value is not None:
                _principled(c, value, key, data_source(c.host, key), flagged)


def _principled(c: _Checker, value: Any, path: str, src: str, flagged: set[str]) -> None:
    if path in flagged:
        return
    leaf = path.rsplit(".", 1)[-1].split("[", 1)[0]
    free = path.split(".", 1)[0] in ("serve_flags", "serve_env") or ".serve_flags" in path or ".serve_env" in path
    why = finite_problem(value)
    if isinstance(value, str):
        why = text_problem(value, ascii_only=not free and leaf not in CONTROL_NODE_PATHS, multiline=free)
    if why:
        shown = f"{value!r} " if isinstance(value, str) and len(value) < 80 else ""
        c.problem(path, shown + why, src)
        return
    if isinstance(value, Mapping):
        for k, v in value.items():
            if f"{path}.{k}" in flagged:
                continue
            name_why = text_problem(k, ascii_only=True) if isinstance(k, str) else None
            if name_why:
                c.problem(f"{path}.{k!r}", f"the name {k!r} {name_why}", src)
                continue
            _principled(c, v, f"{path}.{k}", src, flagged)
    elif isinstance(value, (list, tuple)):
        for i, v in enumerate(value):
            _principled(c, v, f"{path}[{i}]", src, flagged)


def _own_names_and_ports(c: _Checker, deployments: Iterable[DeploymentSettings], proxy: bool) -> None:
    """A deployment's unit and ports are the host's, shared with what gpuserve itself runs there:
    a unit named like one of gpuserve's own would replace it; a port one of its services listens
    on would never bind."""
    own = dict(OWN_PORTS)
    for group, ports in ROLE_PORTS.items():
        if group in c.host.groups:
            own.update(ports)
    for dep in deployments:
        if layout.unit_name(dep.name) in OWN_UNITS:
            c.problem(f"deployments.{dep.name}", f"its unit {layout.unit_name(dep.name)} is one gpuserve "
                      "runs itself; name the deployment otherwise", c.sources.get("deployments", DEFAULT))
        for key in ("serve_port",) + (("proxy_port",) if proxy else ()):
            port = getattr(dep, key)
            if port in own:
                path, src = dep.origin(key)
                c.problem(path, f"port {port} is {own[port]}'s, which gpuserve runs on this host; "
                          f"give {dep.name} another {key}", src)
