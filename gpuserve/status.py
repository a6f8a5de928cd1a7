"""``gpuserve status inventories/<inv>.py``: per host and deployment, what runs and whether it answers.

Reads only (pyinfra facts over SSH, the same connection settings as a deploy); changes nothing.
Hosts are asked in parallel (``PARALLEL`` at a time), each bounded by ``HOST_TIMEOUT_S``: a host
that does not answer in time is reported as such and does not hold up the others. Each host's
deployments, units and health URLs come from its plan (gpuserve.host_plan), the one a deploy
reads, made without the engine spec (no wheelhouse read).
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import click
import gevent
from pyinfra.api import Config, State
from pyinfra.api.connect import connect_all, disconnect_all

from gpuserve import engine_guard, fanout, gateway, layout, monitoring, stack
from gpuserve.config import ConfigError, validate_inventory
from gpuserve.facts.checkpoints import FanoutProgress
from gpuserve.facts.gpus import Gpus
# what status asks a host (one module of facts, beside the others)
from gpuserve.facts.status import EngineStatus, UnitResult, UnitStates, WatchdogCounts  # noqa: F401 - API
from gpuserve.facts.deployment import Deployment
from gpuserve.host_plan import HostPlan, plan_host
from gpuserve.plan import _override_data, limit_hosts, load_inventory
from gpuserve.layers.watchdog import unit_name as watchdog_unit
from gpuserve.release_files import probe_url


def proxy_state(active: str, result: str) -> str:
    """The proxy column: "active", or what is wrong ("failed (signal)", "inactive", ...)."""
    if active == "active":
        return "active"
    if not active:
        return "not installed"
    return f"{active} ({result})" if result and result != "success" else active


def host_units(settings, monitored: bool) -> list[str]:
    """Every unit gpuserve runs on a host besides its engines (and besides the serving proxy's
    nginx, which has its own column): the engine guard and the watchdogs on a serving host, smg
    and its nginx front on a gateway, the exporters (and their nginx front) on every host of an
    inventory with a monitor, Prometheus and alertmanager on a monitor."""
    units: list[str] = []
    if settings.serves:
        units.append(engine_guard.UNIT)
    if settings.gateway:
        units += [engine_guard.GATEWAY_UNIT, gateway.UNIT, "nginx.service"]
    if monitored:
        if not (settings.serves and settings.proxy) and "nginx.service" not in units:
            units.append("nginx.service")   # the exporters' TLS front
        units.append("prometheus-node-exporter.service")
        if settings.serves:
            units += [watchdog_unit(d.name) for d in settings.deployments]
            if settings.stack.vendor == "nvidia" and settings.stack.dcgm:
                units.append(f"{stack.DCGM_EXPORTER_UNIT}.service")
        if monitoring.MONITOR_GROUP in settings.groups:
            units += [engine_guard.MONITOR_UNIT, "prometheus.service", "prometheus-alertmanager.service"]
    return units


def units_state(states: dict[str, tuple[str, str]], units: list[str]) -> str:
    """The units column: "ok (N)", or each unit that is not active and why."""
    down = []
    for unit in units:
        active, result = states.get(unit, ("", ""))
        if active != "active":
            down.append(f"{unit} {proxy_state(active, result) if active != 'not-found' else 'not installed'}")
    return f"down: {'; '.join(down)}" if down else f"ok ({len(units)})" if units else "-"


def watchdog_note(restarts: int, gave_up: bool) -> str:
    if gave_up:
        return ", watchdog gave up (host out of rotation)"
    return f", watchdog restarted it {restarts}x" if restarts else ""


def engine_health(active: str, result: str, health: int | None, drained: bool) -> str:
    text = active or "not installed"
    if active == "failed" and result == "start-limit-hit":
        text += " (gave up: start-limit-hit; converge or systemctl reset-failed to retry)"
    elif active == "failed" and result:
        text += f" ({result})"
    if active:
        text += f", /health {health or 'no answer'}"
    if drained:   # a rollout has it out of the proxy (or was killed doing so)
        text += ", drained"
    return text


@dataclass
class Row:
    host: str
    deployment: str
    release: str
    previous: str
    health: str
    models: str
    gpus: str
    proxy: str = "-"
    units: str = "-"   # the host's other gpuserve units (host_units): "ok (N)" or what is down
    staging: str = ""   # a weights fan-out copy on the host, printed below the table


ROLE_HOST = "(serves no model)"   # the health of a gateway's or monitor's row


def staging_line(docs: list[dict], now: float) -> str:
    """The host's weights fan-out copy still running (or failed), as the run prints it; "" when
    none is."""
    for doc in docs:   # newest first
        label = f"{doc.get('repo', '?')}@{str(doc.get('revision', ''))[:12]}"
        if doc.get("state") == "running":
            return f"{label}: {fanout.progress_line(doc, now)}"
        if doc.get("state") == "failed":
            return f"{label}: failed: {doc.get('error') or '?'}"
    return ""


def _gpus(report) -> str:
    if report is None:
        return "?"
    if report.error:
        return f"error: {report.error[:40]}"
    profile = report.profile
    if profile is None:
        return "mixed"
    if profile.gpu_count == 0:
        return "none"
    return f"{profile.gpu_count}x {profile.gpu_model}" + (
        f" ({profile.driver_version})" if profile.driver_version else "")


PARALLEL = 32          # hosts asked at once
HOST_TIMEOUT_S = 60    # one host's questions, all together


def _host_rows(host, plan: HostPlan, monitored: bool = False) -> list[Row]:
    gpus = _gpus(host.get_fact(Gpus))
    proxy = (proxy_state(*host.get_fact(UnitResult, unit="nginx.service"))
             if plan.settings.proxy and plan.settings.serves else "-")
    others = host_units(plan.settings, monitored)
    units = units_state(host.get_fact(UnitStates, units=" ".join(others)) if others else {}, others)
    staging = ""
    if plan.settings.serves and plan.settings.weights_fanout == "hosts":
        repo_dir = layout.model_repo_dir(plan.settings.nvme_path, plan.settings.model_repo)
        staging = staging_line(host.get_fact(FanoutProgress, repo_dir=repo_dir), time.time())
    rows = []
    for dep in plan.deployments.values():
        url = probe_url(dep.serve_host, dep.serve_port, "")
        st = host.get_fact(Deployment, deployment=dep.name, health_url=dep.health_url)
        engine = host.get_fact(EngineStatus, deployment=dep.name, url=url)
        _, result = host.get_fact(UnitResult, unit=dep.unit)
        health = engine_health(st.active_state, result, st.health, st.drained)
        if monitored:
            health += watchdog_note(*host.get_fact(WatchdogCounts, deployment=dep.name))
        rows.append(Row(host.name, dep.name, st.current or "-", st.previous or "-", health,
                        ",".join(engine.get("models") or []) or "-", gpus, proxy, units, staging))
        staging = ""   # once per host
    if not rows:   # a gateway or monitor host: its units are what it runs
        rows.append(Row(host.name, "-", "-", "-", ROLE_HOST, "-", gpus, proxy, units))
    return rows


def _bounded_rows(host, plan: HostPlan, timeout: float, monitored: bool = False) -> list[Row]:
    try:
        with gevent.Timeout(timeout):
            return _host_rows(host, plan, monitored)
    except gevent.Timeout:
        return [Row(host.name, "-", "-", "-", f"no answer in {timeout:g} s", "-", "-")]
    except Exception as exc:  # noqa: BLE001 - one host's failure is its row, not the command's
        return [Row(host.name, "-", "-", "-", f"error: {type(exc).__name__}: {exc}"[:80], "-", "-")]


def collect(inventory, limit: list[str] | None = None, timeout: float = HOST_TIMEOUT_S) -> list[Row]:
    """Rows for the hosts in ``limit`` (host names; None: every host), in inventory order."""
    settings = validate_inventory(inventory, require_revision=False)
    hosts = [h for h in inventory if limit is None or h.name in limit]
    state = State(inventory, Config(CONNECT_TIMEOUT=10, PARALLEL=PARALLEL), initial_limit=hosts)
    monitored = any(monitoring.MONITOR_GROUP in s.groups for s in settings.values())
    try:
        connect_all(state)
        jobs = {h.name: state.pool.spawn(_bounded_rows, h, plan_host(settings[h.name]), timeout, monitored)
                for h in hosts if h in state.active_hosts}
        gevent.joinall(list(jobs.values()))
        rows: list[Row] = []
        for h in hosts:
            if h.name in jobs:
                rows += jobs[h.name].value
            else:
                rows.append(Row(h.name, "-", "-", "-", "unreachable", "-", "-"))
    finally:
        disconnect_all(state)
    return rows


def render_table(rows: list[Row]) -> str:
    header = Row("HOST", "DEPLOYMENT", "RELEASE", "PREVIOUS", "HEALTH", "SERVED MODEL", "GPUS", "PROXY",
                 "UNITS")
    table = [header, *rows]
    fields = [f for f in Row.__dataclass_fields__ if f != "staging"]
    fields.insert(fields.index("proxy"), fields.pop(fields.index("units")))   # the proxy column last
    widths = {f: max(len(getattr(r, f)) for r in table) for f in fields}
    text = "\n".join("  ".join(getattr(r, f).ljust(widths[f]) for f in fields).rstrip() for r in table)
    staging = [f"  {r.host}  {r.staging}" for r in rows if r.staging]
    return text + ("\n\nweights staging (fan-out):\n" + "\n".join(staging) if staging else "")


@click.command()
@click.argument("inventory")
@click.option("--data", "data", multiple=True, metavar="KEY=VALUE", help="Override data, as for pyinfra.")
@click.option("--limit", "limit", multiple=True, metavar="HOST|GROUP|GLOB",
              help="Only these hosts, as pyinfra's --limit.")
def status(inventory: str, data: tuple[str, ...], limit: tuple[str, ...]) -> None:
    """Per host and deployment: current and previous release, health, served model, GPUs, proxy;
    below the table, each weights fan-out copy still running (bytes, rate, ETA) or failed.

    Exits 1 when a host is unreachable or does not answer, an engine is not healthy (or gave up
    restarting, or its watchdog gave up), a host is drained, its proxy is not active, or another
    unit gpuserve runs there is down (UNITS: the gateway, watchdogs, exporters, monitor stack).""" 
    try:
        inv = load_inventory(inventory, _override_data(data))
        rows = collect(inv, limit_hosts(inv, limit))
    except ConfigError as exc:
        raise click.ClickException(str(exc)) from exc
    click.echo(render_table(rows))
    if any(failing(r) for r in rows):
        raise SystemExit(1)


def failing(r: Row) -> bool:
    engine_bad = r.health != ROLE_HOST and ("/health 200" not in r.health or "drained" in r.health
                                            or "watchdog gave up" in r.health)
    return engine_bad or r.proxy not in ("active", "-") or r.units.startswith("down")
