"""Removal layer: take off a host what gpuserve put there and the plan no longer keeps.

``removal`` (deploys/serve.py): every deployment the host's group data no longer names leaves
rotation, drains (gpuserve.layers.rotation), stops, is disabled, and loses its unit, release
ledger (releases, secrets), compile caches, proxy site and keys. It returns the releases it
removed, so the service layer's retention collects the engine envs and checkpoints that no kept
release uses.

``decommission`` (deploys/decommission.py): every deployment goes that way, then the services
gpuserve configured on the host are stopped and disabled (a gateway's smg, node-exporter,
Prometheus, alertmanager: gpuserve.removal.decommission_services), then gpuserve's host-wide
files go (gpuserve.removal.HOST_PATHS, the NVMe root, the MARKED files that are gpuserve's), and
its service user. Debian's packages stay (docs/removal.md).

What exists is read by one fact (gpuserve.facts.removal.Footprint), so ``--dry`` lists each step
and a second run finds nothing to do. Nothing gpuserve did not make is touched
(gpuserve.removal).
"""

from __future__ import annotations

import dataclasses

from pyinfra import host, logger
from pyinfra.api import deploy
from pyinfra.operations import files, python, server

from gpuserve import layout
from gpuserve import removal as plan
from gpuserve.config import HostSettings
from gpuserve.facts.removal import Footprint
from gpuserve.facts.deployment import ReleaseRecords
from gpuserve.layers import rotation
from gpuserve.layers.proxy import RELOAD_AND_WAIT
from gpuserve.rollout import pipeline
from gpuserve.releases import Release


def footprint(settings: HostSettings) -> plan.Footprint:
    lines = host.get_fact(Footprint, nvme_path=settings.nvme_path) or []
    return plan.parse_footprint(lines, settings.nvme_path)


@dataclasses.dataclass(frozen=True)
class Removed:
    releases: list[Release]     # of the removed deployments: the service layer's retention
    proxy_sites: bool           # a proxy site or key went: the proxy layer reloads nginx
    drain_flags: tuple[str, ...] = ()   # the proxy layer removes these after that reload


@deploy("Removal of deployments no longer planned")
def removal(settings: HostSettings) -> Removed:
    """Remove the deployments the plan no longer names.

    With the proxy on, nginx is reloaded by the proxy layer once the planned sites are written
    (the shared settings alone, without a site, do not load); until then the running nginx
    still has the old site, whose engine is stopped, so its /health is not 200 either."""
    found = footprint(settings)
    gone = plan.leftovers(found, [d.name for d in settings.deployments])
    records: list[Release] = []
    for r in gone:
        logger.info(f"    [{host.name}] {r.name} is no longer planned: " + "; ".join(r.describe()))
        records += host.get_fact(ReleaseRecords, deployment=r.name).values()
        _remove(settings, r)
    sites = any(r.nginx_changed for r in gone)
    flags = tuple(r.drain_flag for r in gone if r.drain_flag)
    # the running nginx keeps the old site until it is reloaded; its drain flag keeps that
    # site's /health at 503 until then (else it would answer for the next engine on that port)
    defer = settings.proxy
    _after(found, gone, [], reload_nginx=sites and not defer, flags=() if defer else flags)
    return Removed(records, sites and defer, flags if defer else ())


@deploy("Decommission")
def decommission(settings: HostSettings) -> None:
    """Remove every deployment, then everything else gpuserve made on the host. The rollout lock
    this run holds (deploys/decommission.py) goes last, with its directory, when the run releases
    it."""
    found = plan.without_the_runs_lock(footprint(settings))
    gone = plan.leftovers(found, [])
    rest = plan.decommission_paths(found)
    for r in gone:
        logger.info(f"    [{host.name}] decommission {r.name}: " + "; ".join(r.describe()))
        _remove(settings, r)
    for svc in plan.decommission_services(found):
        logger.info(f"    [{host.name}] decommission: stop and disable {svc.name} (its package stays)")
        _stop(f"gpuserve: stop and disable {svc.name} (its configuration goes)", svc.name,
              svc.stop, svc.disable)
    for path in rest:
        logger.info(f"    [{host.name}] decommission: remove {path}")
        _remove_path(path, f"gpuserve: remove {path}", link=path in found.links)
    _after(found, gone, rest, reload_nginx=True,
           flags=tuple(r.drain_flag for r in gone if r.drain_flag))
    if found.user:
        server.user(name=f"gpuserve: remove the service user {layout.SERVICE_USER}",
                    user=layout.SERVICE_USER, present=False)
    if found.group:
        server.group(name=f"gpuserve: remove the service group {layout.SERVICE_GROUP}",
                     group=layout.SERVICE_GROUP, present=False)
    if found.empty:
        logger.info(f"    [{host.name}] nothing of gpuserve's is left on this host")


def _remove(settings: HostSettings, r: plan.Removal) -> None:
    unit = layout.unit_name(r.name)
    # first: a watchdog would restart the engine the stop below takes down
    _stop(f"{r.name}: stop and disable {r.watchdog_unit}", r.watchdog_unit, r.watchdog_stop,
          r.watchdog_disable)
    if r.drain:
        python.call(name=f"{r.name}: out of rotation, wait for its running requests",
                    function=_drain, settings=settings, r=r)
    # stopping drains what still runs (SIGTERM: in-flight requests get shutdown_timeout_s)
    _stop(f"{r.name}: stop and disable {unit}", unit, r.stop, r.disable)
    for path in r.files:
        _remove_path(path, f"{r.name}: remove {path}")


def _stop(name: str, unit: str, stop: bool, disable: bool) -> None:
    """systemctl stop/disable as the footprint's systemd state asks (pyinfra's own running fact
    counts a unit in a restart loop as stopped, and would not stop it); nothing when neither."""
    commands = ([f"systemctl stop {unit}"] if stop else []) + ([f"systemctl disable {unit}"] if disable else [])
    if commands:
        server.shell(name=name, commands=commands)


def _remove_path(path: str, name: str, link: bool = False) -> None:
    if link:
        files.link(name=name, path=path, present=False)
    elif plan.is_file(path):   # force: a secret's link into /run (a credential) goes too
        files.file(name=name, path=path, present=False, force=True)
    else:
        files.directory(name=name, path=path, present=False)


def _after(found: plan.Footprint, gone: list[plan.Removal], host_paths, *, reload_nginx: bool,
           flags: tuple[str, ...]) -> None:
    """systemd forgets removed units; nginx drops removed sites (when it runs, and
    ``reload_nginx``: else the proxy layer reloads it); then the drain flags go."""
    units = [r for r in gone if plan.unit_path(r.name) in r.paths]
    if units or any(plan.is_unit_path(p) for p in host_paths):
        server.shell(name="Reload systemd (units removed)",
                     commands=["systemctl daemon-reload"]
                     + [f"systemctl reset-failed {layout.unit_name(r.name)} 2>/dev/null || true"
                        for r in units])
    nginx = any(r.nginx_changed for r in gone) or any(plan.is_nginx_path(p) for p in host_paths)
    if nginx and reload_nginx and found.nginx_active:
        server.shell(name="Reload nginx (gpuserve sites removed)",
                     commands=["nginx -t -q", RELOAD_AND_WAIT])
    _remove_drain_flags(flags)


def _remove_drain_flags(flags) -> None:
    """Drain flags the drain made during this run (after the facts were read): removed by name,
    once nginx no longer serves the removed sites."""
    if flags:
        server.shell(name=f"Remove the drain flags of removed deployments ({', '.join(flags)})",
                     commands=[f"rm -f {' '.join(flags)}"])


def _drain(state, host, settings: HostSettings, r: plan.Removal) -> None:  # noqa: A002 (pyinfra's names)
    """The move pipeline's out -> drained (gpuserve.rollout.pipeline.out_drained), for a
    deployment the settings no longer describe: its address comes from its release on the host,
    and it is behind the proxy when its site is there (even if the proxy is now off). pyinfra passes ``state`` and ``host`` by these names."""
    h = host
    if not settings.deployments:   # a host that now serves nothing (a role host): no rotation
        logger.info(f"    [{h.name}] {r.name}: no planned deployment to take the rotation's "
                    "settings from; its stop drains what still runs")
        return
    address = r.engine_address or ("127.0.0.1", 0)
    gone = dataclasses.replace(settings.deployments[0], name=r.name, serve_host=address[0],
                               serve_port=address[1])
    s = dataclasses.replace(settings, deployments=(*settings.deployments, gone), proxy=r.behind_proxy)
    pipeline.out_drained(h, s, [r.name], take_out=rotation.take_out,
                         wait_drained=rotation.wait_drained if r.engine_address else None)
    logger.info(f"    [{h.name}] {r.name}: drained, stopping it")
