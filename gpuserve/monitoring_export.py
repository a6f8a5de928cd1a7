"""For teams with their own Prometheus (issue 29): the inventory's scrape targets as file_sd files
and gpuserve's rules, written by ``gpuserve monitoring-export INVENTORY DIR``.

    DIR/gpuserve-engine.json   DIR/node.json   DIR/dcgm.json   DIR/smg.json   DIR/gpuserve-meter.json
                               (file_sd, one per job)
    DIR/gpuserve-rules.yml     (the recording and alert rules, as the monitor host gets them)

Each file_sd entry carries the ``host`` and ``deployment`` labels the rules group by, and
``__scheme__`` and ``__metrics_path__`` (file_sd may set these). Authentication and TLS are no
file_sd business: the job that reads a file sets them (``prometheus_job`` prints a sketch). The
hosts' exporters, their TLS front and the watchdog are installed without a monitor host when
``external_prometheus = True``; the Prometheus's address goes into ``proxy_operator_networks``,
which lets it through the exporters' front and onto the proxies' operator routes (/metrics)
without a key.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Mapping

import click

from gpuserve import monitoring
from gpuserve.monitoring import Plan

RULES_FILE = "gpuserve-rules.yml"


def file_sd(plan: Plan) -> dict[str, list[dict]]:
    """job name -> its file_sd entries (the same targets and labels the monitor host scrapes)."""
    out: dict[str, list[dict]] = {}
    for job in monitoring.scrape_configs(plan):
        name = job["relabel_configs"][0]["replacement"]
        for static in job["static_configs"]:
            out.setdefault(name, []).append({
                "targets": list(static["targets"]),
                "labels": {**static["labels"], "__scheme__": job.get("scheme", "http"),
                           "__metrics_path__": job.get("metrics_path", "/metrics")},
            })
    return out


def export_files(settings: Mapping[str, object], addresses: Mapping[str, str],
                 m: monitoring.MonitorSettings) -> tuple[dict[str, str], tuple[str, ...]]:
    """(file name -> content: one file_sd JSON per job, and the rules; why a deployment is not
    a target)."""
    plan = monitoring.plan_targets(settings, addresses)
    files = {f"{job}.json": json.dumps(entries, indent=2, sort_keys=True) + "\n"
             for job, entries in sorted(file_sd(plan).items())}
    files[RULES_FILE] = monitoring.rules_yml(m)
    return files, plan.skipped


def prometheus_job(directory: str, jobs: list[str]) -> str:
    """A sketch of the scrape jobs that read the exported files (to adapt, not a whole config)."""
    lines = ["rule_files:", f"  - {directory}/{RULES_FILE}", "scrape_configs:"]
    for job in jobs:
        lines += [f"  - job_name: {job}",
                  f"    file_sd_configs: [{{files: ['{directory}/{job}.json']}}]",
                  "    tls_config: {insecure_skip_verify: true}   # or ca_file: the hosts' "
                  "proxy_tls_cert_file CA"]
    return "\n".join(lines)


@click.command("monitoring-export")
@click.argument("inventory", type=click.Path(exists=True, dir_okay=False))
@click.argument("directory", type=click.Path(file_okay=False))
@click.option("--data", "data", multiple=True, metavar="KEY=VALUE",
              help="Override data for every host, as pyinfra's --data.")
def monitoring_export(inventory: str, directory: str, data: tuple[str, ...]) -> None:
    """Write INVENTORY's scrape targets (file_sd) and gpuserve's rules into DIRECTORY, for a
    Prometheus of your own (docs/monitoring.md, "Your own Prometheus"). No SSH."""
    import sys

    from gpuserve.config import ConfigError, validate_inventory
    from gpuserve.plan import _override_data, load_inventory

    inv = load_inventory(inventory, _override_data(data))
    try:
        settings = validate_inventory(inv)
    except ConfigError as error:
        click.echo(str(error), err=True)
        sys.exit(1)
    addresses = {h.name: str(h.data.get("ssh_hostname") or h.name) for h in inv}
    first = next(iter(settings.values()))
    files, skipped = export_files(settings, addresses, first.monitor)
    for why in skipped:
        click.echo(why, err=True)
    out = Path(directory)
    out.mkdir(parents=True, exist_ok=True)
    for name, content in files.items():
        (out / name).write_text(content)
    jobs = [n[:-5] for n in files if n.endswith(".json")]
    click.echo(f"wrote {', '.join(sorted(files))} into {out}\n\n" + prometheus_job(str(out.resolve()), jobs))
