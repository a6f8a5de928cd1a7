"""The ``gpuserve`` command. Each subcommand lives beside the logic it drives.

Commands from other installed distributions join through the entry-point group
``gpuserve.commands``: that is how the sandbox (the distribution ``gpuserve-sandbox`` in sandbox/,
a test tool the product never imports) adds ``gpuserve sandbox``.
"""

from __future__ import annotations

import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from contextlib import contextmanager
from importlib.metadata import EntryPoint, entry_points
from typing import Callable, Iterable, Iterator

import click

from gpuserve import top as top_view
from gpuserve.checkpoints import resolve_command
from gpuserve.config import ConfigError, validate_inventory
from gpuserve.engine_add import engine
from gpuserve.monitoring import MONITOR_GROUP
from gpuserve.monitoring_export import monitoring_export
from gpuserve.plan import _override_data, limit_hosts, load_inventory, plan
from gpuserve.status import status
from gpuserve.wheelhouse import wheelhouse

COMMAND_GROUP = "gpuserve.commands"


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="gpuserve")
def main() -> None:
    """gpuserve: GPU hosts to LLM inference servers, with pyinfra."""


# --- gpuserve top (the view itself: gpuserve/top.py) ---------------------------------------------

def _http_fetch(url: str) -> Callable[[list[str]], list[str]]:
    """Ask a Prometheus the user reaches directly (``--prometheus URL``)."""
    def fetch(queries: list[str]) -> list[str]:
        texts = []
        for q in queries:
            full = f"{url.rstrip('/')}/api/v1/query?{urllib.parse.urlencode({'query': q})}"
            try:
                with urllib.request.urlopen(full, timeout=top_view.QUERY_TIMEOUT_S) as r:
                    texts.append(r.read().decode())
            except urllib.error.HTTPError as exc:   # Prometheus says why in the body (400, 422)
                texts.append(exc.read().decode(errors="replace"))
            except (OSError, ValueError) as exc:
                raise click.ClickException(f"cannot reach Prometheus at {url}: {exc}") from None
        return texts
    return fetch


@contextmanager
def _ssh_fetch(inventory, monitor: str) -> Iterator[Callable[[list[str]], list[str]]]:
    """Ask the monitor host's Prometheus (its loopback only) with curl over SSH: the connection
    settings of a deploy, as ``gpuserve status`` and the canary bake use them."""
    from pyinfra.api import Config, State
    from pyinfra.api.connect import connect_all, disconnect_all
    from pyinfra.api.exceptions import PyinfraError

    from gpuserve.rollout.remote import MoveFailed, run

    host = inventory.get_host(monitor)
    state = State(inventory, Config(CONNECT_TIMEOUT=10), initial_limit=[host])
    try:
        try:
            connect_all(state)
        except PyinfraError:   # pyinfra: "No hosts remaining!" (it logged why above)
            pass
        if host not in state.active_hosts:
            raise click.ClickException(f"cannot connect to the monitor host {monitor} over SSH (pyinfra "
                                       "says why above); reach its Prometheus another way and pass "
                                       "--prometheus URL")

        def fetch(queries: list[str]) -> list[str]:
            try:
                out = run(host, top_view.batch_command(queries), top_view.QUERY_TIMEOUT_S * len(queries) + 10)
                return top_view.split_batch(out, len(queries))
            except (MoveFailed, ValueError) as exc:
                raise click.ClickException(f"cannot ask Prometheus on {monitor}: {exc}") from None
        yield fetch
    finally:
        disconnect_all(state)


@click.command()
@click.argument("inventory")
@click.option("--prometheus", metavar="URL",
              help="Ask this Prometheus (http:// or https://) instead of the monitor host's over SSH.")
@click.option("--once", is_flag=True, help="Print one frame and exit.")
@click.option("--interval", type=click.FloatRange(*top_view.INTERVAL_S), default=5.0,
              show_default=True, help="Seconds between frames.")
@click.option("--iterations", type=click.IntRange(0, None), default=0,
              help="Stop after this many frames (0: until Ctrl-C).")
@click.option("--data", "data", multiple=True, metavar="KEY=VALUE", help="Override data, as for pyinfra.")
@click.option("--limit", "limit", multiple=True, metavar="HOST|GROUP|GLOB",
              help="Only these hosts, as pyinfra's --limit.")
def top(inventory: str, prometheus: str | None, once: bool, interval: float, iterations: int,
        data: tuple[str, ...], limit: tuple[str, ...]) -> None:
    """Live view per host from Prometheus: release, engine, requests running and waiting,
    tokens/s, TTFT p50/p95, KV-cache use, prefix-cache hit ratio, GPU health (DCGM).

    Reads the Prometheus of the inventory's first host in group monitor (over SSH, where it
    listens on 127.0.0.1:9090), or the one --prometheus names. Redraws in place, like top."""
    if prometheus and urllib.parse.urlparse(prometheus).scheme not in ("http", "https"):
        raise click.BadParameter(f"{prometheus!r}: give an http:// or https:// URL, e.g. "
                                 "http://127.0.0.1:9090", param_hint="--prometheus")
    try:
        inv = load_inventory(inventory, _override_data(data))
        settings = validate_inventory(inv, require_revision=False)
        chosen = limit_hosts(inv, limit)
    except ConfigError as exc:
        raise click.ClickException(str(exc)) from exc
    monitors = [name for name, s in settings.items() if MONITOR_GROUP in s.groups]
    if not prometheus and not monitors:
        raise click.ClickException(
            f"gpuserve top reads Prometheus, and {inventory} has no host in group "
            f"{MONITOR_GROUP!r} (docs/monitoring.md). Add one (monitor = [\"mon-01\"]) and run "
            "deploys/monitoring.py, or pass --prometheus URL (http:// or https://) of a Prometheus "
            "you reach, e.g. --prometheus http://127.0.0.1:9090 through "
            "`ssh -L 9090:127.0.0.1:9090 <monitor host>`")
    targets = [(name, d.name) for name, s in settings.items() if s.serves
               and (chosen is None or name in chosen) for d in s.deployments]
    scrape = settings[monitors[0]].monitor.scrape_interval_s if monitors else 15
    qs = top_view.queries(scrape)
    source = f"Prometheus {prometheus}" if prometheus else f"Prometheus on {monitors[0]}"
    once = once or iterations == 1

    def run_view(fetch) -> None:
        def draw() -> str:
            return top_view.frame(targets, top_view.ask_all(fetch, qs), source=source,
                                  interval=None if once else interval)
        try:
            top_view.loop(draw, lambda text: (click.echo(text, nl=False), sys.stdout.flush()),
                          interval=interval, iterations=1 if once else iterations,
                          clear=not once and sys.stdout.isatty(), sleep=time.sleep)
        except KeyboardInterrupt:
            click.echo()

    if prometheus:
        run_view(_http_fetch(prometheus))
    else:
        with _ssh_fetch(inv, monitors[0]) as fetch:
            run_view(fetch)


main.add_command(plan)
main.add_command(status)
main.add_command(top)
main.add_command(monitoring_export)
main.add_command(wheelhouse)
main.add_command(resolve_command)
main.add_command(engine)


def add_commands(group: click.Group, found: Iterable[EntryPoint] | None = None) -> None:
    """Add the commands other installed distributions declare (``gpuserve.commands``). One that
    does not load (a stale or half-removed install) becomes a command that says so and fails;
    gpuserve's own commands work on."""
    for ep in entry_points(group=COMMAND_GROUP) if found is None else found:
        try:
            command = ep.load()
        except Exception as exc:   # whatever its import raises: the product must still start
            command = _unloadable(ep, f"{type(exc).__name__}: {exc}")
        group.add_command(command, ep.name)


def _unloadable(ep: EntryPoint, why: str) -> click.Command:
    source = f"{ep.value} (from {ep.dist.name})" if ep.dist else ep.value
    message = (f"gpuserve {ep.name}: {source} does not load: {why}. Reinstall it "
               "(in a gpuserve checkout: ./dev/bootstrap.sh)")

    def fail() -> None:
        raise click.ClickException(message)

    return click.Command(ep.name, callback=fail, help=message, short_help="does not load (see --help)",
                         context_settings={"ignore_unknown_options": True, "allow_extra_args": True})


add_commands(main)
