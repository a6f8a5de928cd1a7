"""Tenants: named groups of client keys with limits of their own (issue 29).

A deployment's ``tenants`` setting maps a tenant name to where its keys come from and its
per-key limits; the keys of ``api_keys_file`` keep the host's ``proxy_*_per_key`` limits:

    tenants = {
        "batch": {"keys_command": ["pass", "show", "gpuserve/batch-keys"],
                  "rate_per_key": 2, "burst_per_key": 4, "conn_per_key": 4},
        "chat":  {"keys_file": "secrets/chat-keys", "rate_per_key": 50},
    }

At the proxy each key maps to an id (gpuserve.proxy_conf): ``c1, c2, ...`` for the keys of
``api_keys_file``, ``c-<tenant>-1, ...`` for a tenant's. The limits count per id, in one nginx
zone per tenant, so one tenant's keys never eat another's allowance; the access log writes the id
(which names the tenant), never the key. Pure: rendering and checks only.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Mapping, Sequence

from gpuserve import proxy_conf
from gpuserve.secret_sources import SecretCommand, command_problem

NAME = re.compile(r"[a-z][a-z0-9]{0,15}")
LIMITS = {"rate_per_key": (1, 100000), "burst_per_key": (0, 100000), "conn_per_key": (1, 100000)}


@dataclass(frozen=True)
class Tenant:
    name: str
    keys: Any                 # a control-node file (str) or a SecretCommand
    rate_per_key: int
    burst_per_key: int
    conn_per_key: int


def id_prefix(tenant: str) -> str:
    return f"c-{tenant}-"


def check(value: Any, defaults: Mapping[str, int], where: str) -> tuple[tuple[Tenant, ...], list[tuple[str, str]]]:
    """The tenants of a ``tenants`` mapping and its problems as (path, message); ``defaults``: the
    host's per-key limits (rate_per_key, burst_per_key, conn_per_key)."""
    if not isinstance(value, Mapping):
        return (), [(where, f"{value!r} is not a mapping of tenant name -> its keys and limits")]
    out, problems = [], []
    for name, entry in value.items():
        path = f"{where}.{name}"
        if not (isinstance(name, str) and NAME.fullmatch(name)):
            problems.append((path, f"{name!r} is not a tenant name: a lower-case letter, then up to "
                             "15 lower-case letters or digits"))
            continue
        if not isinstance(entry, Mapping):
            problems.append((path, f"{entry!r} is not a mapping (keys_file or keys_command, limits)"))
            continue
        before = len(problems)
        for key in entry:
            if key not in ("keys_file", "keys_command", *LIMITS):
                problems.append((f"{path}.{key}", f"unknown tenant key; use keys_file or keys_command, "
                                 f"{', '.join(LIMITS)}"))
        file, command = entry.get("keys_file"), entry.get("keys_command")
        keys: Any = None
        if (file is None) == (command is None):
            problems.append((f"{path}.keys_file", "a tenant needs exactly one of keys_file and keys_command"))
        elif command is not None:
            why = command_problem(command)
            if why:
                problems.append((f"{path}.keys_command", why))
            else:
                keys = SecretCommand(tuple(command), f"{path}.keys_command")
        elif not (isinstance(file, str) and file):
            problems.append((f"{path}.keys_file", f"{file!r} is not a path to a file on the control node"))
        else:
            keys = file
        limits = {}
        for key, (lo, hi) in LIMITS.items():
            v = entry.get(key, defaults[key])
            if isinstance(v, bool) or not isinstance(v, int) or not lo <= v <= hi:
                problems.append((f"{path}.{key}", f"{v!r} is not allowed; use a whole number from {lo} to {hi}"))
            limits[key] = v
        if len(problems) == before:
            out.append(Tenant(name, keys, **limits))
    return tuple(out), problems


def keys_map(tenant: str, keys: Sequence[str]) -> str:
    """nginx map entries: each of the tenant's keys -> its id (``c-<tenant>-<n>``)."""
    return "".join(f"{proxy_conf.key_pattern(k)} {id_prefix(tenant)}{n};\n"
                   for n, k in enumerate(keys, 1))


def http_conf(deployment: str, tenants: Sequence[Tenant]) -> str:
    """http-level lines: per tenant, a variable that holds the id of its keys only (empty for any
    other request: not counted) and its rate and connection zones."""
    v = proxy_conf.var(deployment)
    out = []
    for t in tenants:
        prefix = re.escape(id_prefix(t.name))
        out += [f"map ${v}_key ${v}_t_{t.name} {{\n", f"    ~^{prefix} ${v}_key;\n",
                "    default \"\";\n", "}\n",
                f"limit_req_zone ${v}_t_{t.name} zone={v}_t_{t.name}_rate:1m rate={t.rate_per_key}r/s;\n",
                f"limit_conn_zone ${v}_t_{t.name} zone={v}_t_{t.name}_conn:1m;\n"]
    return "".join(out)


def server_conf(deployment: str, tenants: Sequence[Tenant]) -> str:
    """server-level lines: each tenant's rate limit (a request counts in its own tenant's zones);
    its connection limit is ``conn_limits``' (the site repeats those where a location has one of
    its own)."""
    v = proxy_conf.var(deployment)
    return "".join(f"    limit_req zone={v}_t_{t.name}_rate burst={t.burst_per_key} nodelay;\n"
                   for t in tenants)


def conn_limits(deployment: str, tenants: Sequence[Tenant]) -> tuple[tuple[str, int], ...]:
    """Each tenant's connection zone and its limit per key (proxy_conf.server_conf's ``tenant_conns``)."""
    v = proxy_conf.var(deployment)
    return tuple((f"{v}_t_{t.name}_conn", t.conn_per_key) for t in tenants)


def site_args(deployment: str, tenants: Sequence[Tenant]) -> dict:
    """What proxy_conf.server_conf takes of a deployment's tenants: their http-level lines, their
    server-level rate limits and their connection limits."""
    return {"tenants_http": http_conf(deployment, tenants), "tenants_server": server_conf(deployment, tenants),
            "tenant_conns": conn_limits(deployment, tenants)}
