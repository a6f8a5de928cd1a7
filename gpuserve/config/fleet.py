"""Checks across the hosts of an inventory, after each host's own: the gateway's workers (each
once, each behind its host's proxy) and one machine under two names."""

from __future__ import annotations

from typing import TYPE_CHECKING, Mapping

from gpuserve import gateway
from gpuserve.config.settings import HostSettings
from gpuserve.config.sources import data_source
from gpuserve.errors import Problem

if TYPE_CHECKING:
    from pyinfra.api import Inventory


def serving_workers(inventory: Inventory, settings: Mapping[str, HostSettings]) -> list[gateway.Worker]:
    """The workers every gateway gets: each deployment of each serving host, in inventory order."""
    return gateway.workers(
        (h.name, str(h.data.get("ssh_hostname") or h.name), settings[h.name].deployments)
        for h in inventory if h.name in settings and settings[h.name].serves)


def _fleet_gateway(inventory: Inventory, settings: Mapping[str, HostSettings]) -> list[Problem]:
    """Across hosts: a gateway needs workers; each worker once; workers behind their proxy."""
    gateways = [s for s in settings.values() if s.gateway is not None]
    if not gateways:
        return []
    problems = []
    serving = [s for s in settings.values() if s.serves]
    first = gateways[0].host
    if not serving:
        problems.append(Problem(first, "inventory", "gateway", "a gateway without workers: no host "
                                "of this inventory serves a model (put serving hosts in a hardware "
                                "group, or run the gateway with the inventory of its fleet)"))
    for s in serving:
        if not s.proxy:
            problems.append(Problem(s.host, s.source("proxy"), "proxy", "a gateway fronts this "
                                    "host: it reaches the engines through the host's TLS proxy and "
                                    "the proxy lets only the gateways in; set proxy = True"))
    seen: dict[str, str] = {}
    for w in serving_workers(inventory, settings):
        if w.url in seen:
            problems.append(Problem(w.id.split("/")[0], "inventory", "ssh_hostname",
                                    f"worker {w.url} is named twice: {seen[w.url]} and {w.id} are the "
                                    "same address and port; list each host once"))
        seen.setdefault(w.url, w.id)
    return problems


def _same_machine_twice(inventory: Inventory) -> list[Problem]:
    """One machine, two names: the same address and SSH port under two inventory names would be
    converged twice at once and counted twice in every rollout budget."""
    seen: dict[tuple[str, int], str] = {}
    out = []
    for h in inventory:
        if h.name.startswith("@"):
            continue
        address = str(h.data.get("ssh_hostname") or h.name).lower().rstrip(".")
        where = (address, h.data.get("ssh_port") or 22)
        if where in seen:
            out.append(Problem(h.name, data_source(h, "ssh_hostname"), "ssh_hostname",
                               f"{where[0]}:{where[1]} is also host {seen[where]!r}: one machine under two "
                               "names; list it once"))
        seen.setdefault(where, h.name)
    return out
