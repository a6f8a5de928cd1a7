"""``gpuserve plan``: what each host would serve, validated, without touching any host.

The inventory is loaded with pyinfra's own loader, so group data resolves exactly as in a
deploy; no SSH connection is made. What it prints is each host's plan (gpuserve.host_plan), the
one a deploy reads, without the engine spec and releases: those need the control node's
wheelhouse, which a plan does not read.
"""

from __future__ import annotations

import json
import os
import sys
from typing import Any, Mapping

import click
from pyinfra.api import Inventory, State
from pyinfra.context import ctx_state

from gpuserve import engine_pins, hardware, recipes
from gpuserve.host_plan import HostPlan, plan_host
from gpuserve.config import ConfigError, HostSettings, validate_inventory
from gpuserve.config_repo import no_group_data_hint
from gpuserve.recipes import ServeConfig

FORMATS = ("text", "argv", "yaml", "json")

# The hardware a bare ``--profile`` plan assumes (the recipes' reference machines, gpuserve.hardware.PROFILES).
PROFILE_HARDWARE = {name: hw.group_data() for name, hw in hardware.PROFILES.items()}


def _override_data(pairs: tuple[str, ...]) -> dict[str, Any]:
    from pyinfra_cli.util import parse_cli_arg  # pyinfra_cli monkey-patches with gevent on import

    data = {}
    for pair in pairs:
        if "=" not in pair:
            raise click.BadParameter(f"{pair!r} is not key=value", param_hint="--data")
        key, value = pair.split("=", 1)
        data[key] = parse_cli_arg(value)
    return data


def load_inventory(path: str, override_data: dict[str, Any] | None = None) -> Inventory:
    """pyinfra's CLI loader: group_data/ from the cwd and from beside the inventory. The cwd
    goes on sys.path as pyinfra's CLI puts it, so a config repo's own helper modules import
    the same under ``gpuserve plan`` as under pyinfra (docs/config-repo.md)."""
    from pyinfra_cli.inventory import make_inventory  # imported late: it gevent-patches

    cwd = os.getcwd()
    if cwd not in sys.path:
        sys.path.append(cwd)
    with ctx_state.use(State()):
        return make_inventory(path, override_data=override_data, cwd=cwd)


def profile_inventory(profile: str, override_data: dict[str, Any] | None = None) -> Inventory:
    """One imaginary host of a recipe's reference hardware, with gpuserve's defaults."""
    return Inventory(([profile], {}), override_data=override_data,
                     **{profile: ([profile], dict(PROFILE_HARDWARE[profile]))})


def _flags_from(s: HostSettings) -> str | None:
    """Where the pin's flag list comes from: gpuserve's generated list or the config repo's file."""
    pin = engine_pins.choose(s.engine_package, s.engine_version, s.engine_overlays)[0]
    return pin.source if pin is not None else None


def _describe_recipe(s: HostSettings) -> str:
    how = "set explicitly" if s.recipe_explicit else "derived from the hardware"
    return f"{s.recipe} ({how}): {recipes.RECIPES[s.recipe].summary}"


def _gpus(sc: ServeConfig) -> str:
    if not sc.gpus:
        return "no GPUs"
    return f"GPUs {sc.gpus[0]}-{sc.gpus[-1]}" if len(sc.gpus) > 1 else f"GPU {sc.gpus[0]}"


def _model_dir(s: HostSettings, profile: bool) -> str | None:
    return None if profile else s.checkpoint_dir


def _text(s: HostSettings, configs: Mapping[str, ServeConfig], profile: bool) -> str:
    rev = s.model_revision or "(not pinned)"
    lines = [
        s.host,
        f"  groups:   {', '.join(s.groups)}",
        f"  hardware: {s.hardware.describe()} (declared)",
        f"  recipe:   {_describe_recipe(s)}",
        f"  engine:   {s.engine_package}=={s.engine_version}, python {s.python_version}, "
        f"torch backend {s.torch_backend}"
        + (f", extra index {s.engine_index}" if s.engine_index else "")
        + (f", flags from the config repo's {_flags_from(s)}"
           if (s.engine_package, s.engine_version) in s.engine_overlays else ""),
        f"  model:    {s.model_repo}@{rev} ({s.model_source})",
    ]
    for name, sc in configs.items():
        dep = s.deployment(name)
        lines.append(f"  deployment {name} ({dep.unit}, {_gpus(sc)})")
        lines.append(f"    argv: {sc.shell_line(_model_dir(s, profile))}")
        env = sc.env_lines()
        lines.append(f"    env:  {env[0] if env else '(none)'}")
        lines += [f"          {line}" for line in env[1:]]
    lines += [f"  warning: {w}" for w in s.warnings]
    return "\n".join(lines)


def _json(p: HostPlan, profile: bool) -> dict[str, Any]:
    s, configs = p.settings, p.serve_configs
    return {
        "host": s.host,
        "groups": list(s.groups),
        "hardware": {
            "gpu_model": s.hardware.gpu_model,
            "gpu_count": s.hardware.gpu_count,
            "nvswitch": s.hardware.nvswitch,
            "gpu_memory_gib": s.hardware.gpu_memory_gib,
        },
        "recipe": s.recipe,
        "recipe_explicit": s.recipe_explicit,
        "engine": {"name": s.engine, "package": s.engine_package, "version": s.engine_version,
                   "python": s.python_version, "torch_backend": s.torch_backend,
                   "index": s.engine_index, "flags_from": _flags_from(s)},
        "model": {"repo": s.model_repo, "revision": s.model_revision, "source": s.model_source},
        "deployments": {
            name: {
                "unit": s.deployment(name).unit,
                "gpus": list(sc.gpus),
                "argv": sc.argv(_model_dir(s, profile)),
                "config": json.loads(json.dumps(dict(sc.config))),
                "env": dict(sc.env),
                "secret_env": {k: "***" for k in sc.secret_env},
                **_where(p, name, profile),
            }
            for name, sc in configs.items()
        },
        # which control-node file goes where on the host (null: made on the host), never contents
        "secrets": [{"deployment": x.deployment, "kind": x.kind,
                     "source": None if x.source is None else str(x.source), "dest": x.dest}
                    for x in p.secrets],
        "warnings": list(s.warnings),
    }


def _where(p: HostPlan, name: str, profile: bool) -> dict[str, Any]:
    """A deployment's ports and paths on its host, as the plan holds them."""
    d = p.deployment(name)
    paths = {"deployment": d.deployment_dir, "releases": d.releases_dir, "current": d.current_link,
             "previous": d.previous_link, "secrets_env": d.secrets_env, "cache": d.cache_dir,
             "checkpoint": None if profile else d.checkpoint_dir}
    return {"ports": {"serve": f"{d.serve_host}:{d.serve_port}", "proxy": d.proxy_port},
            "paths": paths}


def limit_hosts(inventory: Inventory, patterns: tuple[str, ...]) -> list[str] | None:
    """The host names ``--limit`` selects, as pyinfra's own --limit does (a group name, else a
    glob on host names; several patterns add up). None without patterns: every host."""
    if not patterns:
        return None
    from pyinfra_cli.cli import _apply_inventory_limit  # the CLI's own rule (pyinfra is pinned)

    hosts = _apply_inventory_limit(inventory, patterns) or []
    if not hosts:
        raise click.BadParameter(f"no host or group matches {', '.join(patterns)}", param_hint="--limit")
    order = [h.name for h in inventory]
    return sorted((h.name for h in hosts), key=order.index)


def errors_json(error: ConfigError) -> str:
    """A ConfigError as ``--format json`` prints it: ``{"errors": [{host, source, key, message}]}``."""
    return json.dumps({"errors": [{"host": p.host, "source": p.source, "key": p.key,
                                   "message": p.message} for p in error.problems]}, indent=2)


def _role_text(s: HostSettings) -> str:
    """A host that serves no model (docs/gateway.md): what it runs instead."""
    g = s.gateway
    if g is None and "monitor" in s.groups:
        return (f"{s.host}\n  groups:   {', '.join(s.groups)}\n  monitor:  Prometheus and "
                "alertmanager; serves nothing")
    if g is None:
        return f"{s.host}: serves no model (groups {', '.join(s.groups)})"
    return (f"{s.host}: gateway, serves no model\n"
            f"  smg {g.smg_version} on 127.0.0.1:{g.smg_port} (metrics {g.metrics_host}:{g.metrics_port}), "
            f"policy {g.policy} (balance {g.balance_abs_threshold} / {g.balance_rel_threshold})\n"
            f"  clients: TLS front {g.bind}:{g.port}; serving hosts admit {', '.join(g.addresses)}")


def render_plan(settings: dict[str, HostSettings], fmt: str, profile: bool = False) -> str:
    # hosts of role groups only (gateway, monitor) serve no model (docs/gateway.md, docs/monitoring.md)
    roles = {n: s for n, s in settings.items() if not s.serves}
    plans = {name: plan_host(s) for name, s in settings.items() if s.serves}
    rendered = {name: p.serve_configs for name, p in plans.items()}  # validation's, rendered once
    if fmt == "json":
        return json.dumps([_json(plans[n], profile) for n in rendered]
                          + [{"host": n, "serves": False, "groups": list(s.groups),
                              "gateway": s.gateway.__dict__ if s.gateway else None}
                             for n, s in roles.items()], indent=2)
    chunks = [_role_text(s) for s in roles.values()] if fmt == "text" else []
    for name, configs in rendered.items():
        s = settings[name]
        if fmt == "text":
            chunks.append(_text(s, configs, profile))
            continue
        for dep, sc in configs.items():
            header = "" if profile else f"# {name} {dep}\n"
            if fmt == "argv":
                chunks.append(header + sc.shell_line(_model_dir(s, profile)))
            else:  # one YAML document per deployment, each opened by '---'
                chunks.append(f"---\n{header}{sc.config_yaml().rstrip()}")
    return ("\n\n" if fmt == "text" else "\n").join(chunks)


@click.command()
@click.argument("inventory", required=False, type=click.Path(exists=True, dir_okay=False))
@click.option("--profile", type=click.Choice(sorted(recipes.RECIPES)),
              help="Plan one host of a recipe's reference hardware instead of an inventory.")
@click.option("--format", "fmt", type=click.Choice(FORMATS), default="text", show_default=True,
              help="text: per host summary; argv: one shell-quoted command per deployment; "
              "yaml: the vLLM --config files; json: everything, machine-readable.")
@click.option("--data", "data", multiple=True, metavar="KEY=VALUE",
              help="Override data for every host, as pyinfra's --data (highest precedence).")
@click.option("--limit", "limit", multiple=True, metavar="HOST|GROUP|GLOB",
              help="Show only these hosts, as pyinfra's --limit (the whole inventory is still "
              "validated, as a pyinfra run validates it).")
def plan(inventory: str | None, profile: str | None, fmt: str, data: tuple[str, ...],
         limit: tuple[str, ...]) -> None:
    """Validate an inventory and print what each host would serve (no SSH).

    INVENTORY is a pyinfra inventory file, e.g. inventories/prod.py; group_data/ is read from
    the current directory as pyinfra does. Exits 1 listing every problem on invalid data.
    """
    if (inventory is None) == (profile is None):
        raise click.UsageError("give an INVENTORY file or --profile NAME (one of them)")
    override = _override_data(data)
    if profile is not None:
        inv = profile_inventory(profile, override)
    else:
        inv = load_inventory(inventory, override)
    shown = limit_hosts(inv, limit)
    try:
        settings = validate_inventory(inv, require_revision=profile is None)
        if shown is not None:
            settings = {name: settings[name] for name in shown}
        output = render_plan(settings, fmt, profile=profile is not None)
    except ConfigError as error:
        if fmt == "json":
            click.echo(errors_json(error))
        else:
            click.echo(str(error), err=True)
        hint = None if inventory is None else no_group_data_hint(inventory, os.getcwd())
        if hint:   # a run from outside the config repo (docs/config-repo.md)
            click.echo(hint, err=True)
        sys.exit(1)
    click.echo(output)
