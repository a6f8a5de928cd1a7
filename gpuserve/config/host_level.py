"""Host-level keys that other layers read and rendering does not: the NVMe path, reboots, the
rollout's budget and lock, the TLS proxy's front, limits and access, rollbacks, removal
(docs/removal.md) and patching (docs/patching.md)."""

from __future__ import annotations

import ipaddress
import time
from pathlib import Path
from types import MappingProxyType
from typing import Any

from gpuserve import gateway, rollout, schema
from gpuserve.config.secret_values import _secret_command
from gpuserve.config.sources import _Checker
from gpuserve.releases import RELEASE_ID
from gpuserve.values import finite_problem, host_path_problem, is_host, pem_problems, scale_hint

PROXY_LIMITS = {key: (schema.allowed(key).lo, schema.allowed(key).hi)  # key -> (minimum, maximum)
                for key in ("proxy_prompt_body_kib", "proxy_body_kib", "proxy_rate_per_key",
                            "proxy_burst_per_key", "proxy_conn_per_key", "proxy_conn_per_address",
                            "proxy_client_timeout_s", "proxy_prompt_conn_per_key", "proxy_max_messages",
                            "proxy_large_prompt_kib", "proxy_large_prompts_per_key")}


def _host_level(c: _Checker) -> dict[str, Any]:
    """Keys other layers use (no effect on rendering); invalid ones are recorded as problems."""
    nvme = c.get("nvme_path")
    why = host_path_problem(nvme)
    if why:
        c.problem("nvme_path", why)
    margin = c.get("weights_free_margin_gib")
    least, most = schema.allowed("weights_free_margin_gib").lo, schema.allowed("weights_free_margin_gib").hi
    if (isinstance(margin, bool) or not isinstance(margin, (int, float)) or finite_problem(margin)
            or not least <= margin <= most):
        c.problem("weights_free_margin_gib", f"{margin!r} is not allowed; use a number from {least} to "
                  f"{most} (GiB)" + scale_hint("weights_free_margin_gib", margin, least, most))
    reboot = c.choice("reboot")
    unavailable = c.get("max_unavailable")
    if not (isinstance(unavailable, str) and rollout.PERCENT.fullmatch(unavailable)) and not (
            isinstance(unavailable, int) and not isinstance(unavailable, bool) and unavailable >= 1):
        c.problem("max_unavailable", f"{unavailable!r} is not allowed; use a whole number >= 1 or a "
                  "percentage of the run's hosts like '10%' (1%-100%, rounded down, at least 1)")
        unavailable = None
    keep = c.ranged("keep_releases")
    drain = c.ranged("drain_s")
    drain_timeout = c.ranged("drain_timeout_s")
    proxy = c.boolean("proxy")
    bind = c.get("proxy_bind")
    if not (isinstance(bind, str) and is_host(bind)):
        c.problem("proxy_bind", f"{bind!r} is not an IP address or host name")
    tls = _proxy_tls(c, proxy)
    stale = c.ranged("rollout_lock_stale_s")
    fail_pct = c.ranged("max_fail_percentage")
    force = c.get("force_unlock")
    if force is not None and not (isinstance(force, str) and rollout.RUN_ID.fullmatch(force)):
        c.problem("force_unlock", f"{force!r} is not a rollout run id (12 hex digits, printed by the "
                  "rollout that was refused)")
        force = None
    rollback_to = c.get("rollback_to")
    if rollback_to is not None and not (isinstance(rollback_to, str) and RELEASE_ID.fullmatch(rollback_to)):
        c.problem("rollback_to", f"{rollback_to!r} is not a release id (like "
                  "vllm-0.33.0-0123abcd-0123456789; see gpuserve status)")
    trusted = c.boolean("trusted_network")
    rollback_stack = c.boolean("rollback_stack")
    return dict(rollback_stack=rollback_stack, nvme_path=nvme, weights_free_margin_gib=margin, reboot=reboot,
                max_unavailable=unavailable, keep_releases=keep, drain_s=drain, drain_timeout_s=drain_timeout,
                proxy=proxy, proxy_bind=bind, rollback_to=rollback_to, rollout_lock_stale_s=stale,
                max_fail_percentage=fail_pct, force_unlock=force, trusted_network=trusted, **tls, **_proxy_access(c))


def _proxy_tls(c: _Checker, proxy: Any) -> dict[str, Any]:
    """The TLS front's certificate and key (the key a file, or a command's output: issue 29),
    both or neither, and only where the host runs a front (the proxy, or a gateway's)."""
    tls = {k: c.get(k) for k in ("proxy_tls_cert_file", "proxy_tls_key_file")}
    for key, value in tls.items():
        if value is not None and not (isinstance(value, str) and Path(value).is_file()) \
                and not (key == "proxy_tls_key_file" and c.get("proxy_tls_key_command") is not None):
            c.problem(key, f"{value!r} is not a file on this control node")
    if c.get("proxy_tls_key_command") is not None:   # the key from a command (issue 29)
        tls["proxy_tls_key_file"] = _secret_command(c, "proxy_tls_key_file", tls["proxy_tls_key_file"],
                                                    c.get("proxy_tls_key_command"), c.problem, keys=False)
    if (tls["proxy_tls_cert_file"] is None) != (tls["proxy_tls_key_file"] is None):
        c.problem("proxy_tls_key_file", "set both proxy_tls_cert_file and proxy_tls_key_file, or neither")
    elif (tls["proxy_tls_cert_file"] is not None and proxy is False
          and gateway.GATEWAY_GROUP not in c.host.groups):   # settings that only make sense together
        c.problem("proxy_tls_cert_file", "a TLS certificate for a front this host does not run (proxy "
                  "is False and it is no gateway): set proxy = True, or drop the certificate")
    elif tls["proxy_tls_cert_file"] is not None and all(Path(str(v)).is_file() for v in tls.values()):
        for why in pem_problems(Path(tls["proxy_tls_cert_file"]), Path(tls["proxy_tls_key_file"]), time.time()):
            c.problem("proxy_tls_cert_file", why)
    return tls


def _proxy_access(c: _Checker) -> dict[str, Any]:
    """The proxy's limits, operator networks and server names; invalid ones are problems."""
    limits = {key.removeprefix("proxy_"): c.integer(key, lo, maximum=hi)
              for key, (lo, hi) in PROXY_LIMITS.items()}
    _large_prompt_limits(c, limits)
    nets = c.get("proxy_operator_networks")
    if not (isinstance(nets, (list, tuple)) and all(isinstance(n, str) for n in nets)):
        c.problem("proxy_operator_networks", f"{nets!r} is not allowed; use a list of addresses or "
                  "networks (CIDR), e.g. [\"127.0.0.1/32\", \"10.0.5.0/24\"]")
        nets = []
    for net in nets:
        try:
            ipaddress.ip_network(net, strict=False)
        except ValueError:
            c.problem("proxy_operator_networks", f"{net!r} is not an address or network (CIDR)")
    names = c.get("proxy_server_names")
    if not (isinstance(names, (list, tuple)) and all(isinstance(n, str) for n in names)):
        c.problem("proxy_server_names", f"{names!r} is not allowed; use a list of host names")
        names = []
    for name in names:
        if not is_host(name):
            c.problem("proxy_server_names", f"{name!r} is not a host name or address")
    return dict(proxy_limits=MappingProxyType(limits), proxy_operator_networks=tuple(nets),
                proxy_server_names=tuple(names))


def _large_prompt_limits(c: _Checker, limits: dict) -> None:
    """The large-prompt limit only makes sense inside the limits it narrows."""
    large, body = limits.get("large_prompt_kib"), limits.get("prompt_body_kib")
    if isinstance(large, int) and isinstance(body, int) and large >= body:
        c.problem("proxy_large_prompt_kib", f"{large} is not below proxy_prompt_body_kib ({body}): no "
                  f"prompt could be a large one; use a number from 1 to {body - 1} (KiB)")
    per_key, share = limits.get("large_prompts_per_key"), limits.get("prompt_conn_per_key")
    if isinstance(per_key, int) and isinstance(share, int) and per_key > share:
        c.problem("proxy_large_prompts_per_key", f"{per_key} is above proxy_prompt_conn_per_key ({share}), "
                  f"which already limits every prompt request of a key; use a number from 1 to {share}")


def _removal_keys(c: _Checker) -> dict[str, Any]:
    decommission = c.boolean("decommission", "deploys/decommission.py may remove gpuserve from this host")
    return {"decommission": decommission is True}   # a refused value counts as False


def _patch_keys(c: _Checker) -> dict[str, Any]:
    last = c.boolean("patch_last_gateway", "deploys/patch.py may update this gateway while no other "
                     "gateway serves: a maintenance window")
    return {"patch_last_gateway": last is True}   # a refused value counts as False
