"""The keys of a host in the group ``gateway`` (docs/gateway.md): smg's front and ports, its
policy and health checks, the addresses the serving hosts see it connect from, the clients' keys."""

from __future__ import annotations

import ipaddress
import re
from pathlib import Path
from typing import Any

from gpuserve import gateway, schema, secret_sources
from gpuserve.config.engine_keys import VERSION
from gpuserve.config.secret_values import _secret_command
from gpuserve.config.sources import _Checker
from gpuserve.values import is_host, key_file_problem, key_lines_problem


def _gateway(c: _Checker) -> gateway.GatewaySettings | None:
    before = len(c.problems)
    bind = c.get("gateway_bind")
    if not (isinstance(bind, str) and is_host(bind)):
        c.problem("gateway_bind", f"{bind!r} is not an IP address or host name")
    ports = _gateway_ports(c)
    metrics = _gateway_metrics_host(c)
    policy = c.choice("gateway_policy")
    abs_t = c.ranged("gateway_balance_abs_threshold")
    rel = c.get("gateway_balance_rel_threshold")
    span = schema.allowed("gateway_balance_rel_threshold")
    if isinstance(rel, bool) or not isinstance(rel, (int, float)) or not span.lo <= rel <= span.hi:
        c.problem("gateway_balance_rel_threshold", f"{rel!r} is not allowed; use a number from {span.lo} "
                  f"(a multiple of the fleet's mean load) to {span.hi}")
    sticky = c.get("gateway_sticky_header")
    if sticky is not None and not (isinstance(sticky, str) and re.fullmatch(gateway.HEADER_NAME, sticky)):
        c.problem("gateway_sticky_header", f"{sticky!r} is not a header name (letters, digits, '-')")
    health = c.ranged("gateway_health_interval_s")
    failures = c.ranged("gateway_health_failures")
    version = c.get("smg_version")
    if not (isinstance(version, str) and VERSION.fullmatch(version)):
        c.problem("smg_version", f"{version!r} is not a version like '{gateway.SMG_VERSION}' (a string)")
    ca = c.get("gateway_workers_ca_file")
    if ca is not None and not (isinstance(ca, str) and Path(ca).is_file()):
        c.problem("gateway_workers_ca_file", f"{ca!r} is not a file on this control node")
    addresses = _gateway_addresses(c)
    keys = _gateway_keys(c)
    if len(c.problems) > before:
        return None
    return gateway.GatewaySettings(
        api_keys_file=keys["api_keys_file"], operator_keys_file=keys["operator_keys_file"],
        bind=bind, port=ports["gateway_port"], smg_port=ports["gateway_smg_port"],
        metrics_host=metrics, metrics_port=ports["gateway_metrics_port"], policy=policy,
        balance_abs_threshold=abs_t, balance_rel_threshold=float(rel), sticky_header=sticky,
        health_interval_s=health, health_failures=failures, smg_version=version, workers_ca_file=ca,
        addresses=tuple(str(a) for a in addresses or ()))


def _gateway_ports(c: _Checker) -> dict[str, int | None]:
    """The clients' front, smg's own port and its metrics port: three different ports."""
    ports = {k: c.ranged(k) for k in
             ("gateway_port", "gateway_smg_port", "gateway_metrics_port")}
    seen: dict[int, str] = {}
    for key, port in ports.items():
        if port is not None and port in seen:
            c.problem(key, f"port {port} is also {seen[port]}; smg, its metrics and the clients' "
                      "front each need their own port")
        elif port is not None:
            seen[port] = key
    return ports


def _gateway_metrics_host(c: _Checker) -> Any:
    metrics = c.get("gateway_metrics_host")
    try:
        ipaddress.ip_address(metrics)
    except (TypeError, ValueError):
        c.problem("gateway_metrics_host", f"{metrics!r} is not an IP address (loopback, or the "
                  "gateway's address on the monitor network)")
    else:
        if metrics in ("0.0.0.0", "::"):
            c.problem("gateway_metrics_host", f"{metrics} is every interface; smg's metrics go on "
                      "loopback or the monitor network's address only")
    return metrics


def _gateway_addresses(c: _Checker) -> Any:
    """The addresses the serving hosts see the gateway connect from: as set, else its
    ssh_hostname when that is an address; None when there are none to use."""
    addresses = c.get("gateway_addresses")
    if addresses is None:
        ssh = c.host.data.get("ssh_hostname")
        try:
            addresses = [str(ipaddress.ip_address(ssh))]
        except (TypeError, ValueError):
            c.problem("gateway_addresses", f"the gateway's address ({ssh or c.name}) is not an IP "
                      "address; list the addresses the serving hosts see it connect from, e.g. "
                      "['10.0.5.10']", "gpuserve default")
            addresses = None
    if addresses is not None and not (isinstance(addresses, (list, tuple)) and addresses):
        c.problem("gateway_addresses", f"{addresses!r} is not allowed; use a list of addresses or "
                  "networks (CIDR)")
        addresses = None
    for a in addresses or ():
        try:
            ipaddress.ip_network(a, strict=False)
        except (TypeError, ValueError):
            c.problem("gateway_addresses", f"{a!r} is not an address or network (CIDR)")
    return addresses


def _gateway_keys(c: _Checker) -> dict[str, Any]:
    """The clients' and the operators' keys at the gateway: a file, or a command (issue 29)."""
    keys = {}
    for key in ("api_keys_file", "operator_keys_file"):
        file, command = c.get(key), c.get(secret_sources.SECRET_SETTINGS[key])
        if command is not None:   # the keys from a command (issue 29)
            keys[key] = _secret_command(c, key, file, command, c.problem, keys=True)
            continue
        if file is None and key == "api_keys_file":
            c.problem(key, "a gateway lets no client in without keys: name a file of client keys "
                      "on the control node (the clients' keys are checked at the gateway)")
        elif file is not None and not (isinstance(file, str) and Path(file).is_file()):
            c.problem(key, f"{file!r} is not a file on this control node")
        elif file is not None and (why := key_file_problem(Path(file)) or key_lines_problem(Path(file))):
            c.problem(key, why)
        keys[key] = file
    return keys
