"""Host and group data -> frozen settings, validated at plan time, before any host is touched.

Data is plain pyinfra data (``--data`` > host data > group data, later group wins > all.py);
every key is documented in docs/configuration.md. ``validate_inventory`` checks every host,
renders every deployment (``gpuserve.recipes``) and raises one ``ConfigError`` listing all
problems, each naming the host, where the value came from and the key.

A package, one concern a module (gpuserve/__init__.py's ``config/`` section lists them); every
name config.py had is importable from ``gpuserve.config`` as before the split (issue 28).
``check_host``, ``_role_host`` and ``validate_inventory`` live here and call each step by its
name in this module, so that a test that replaces a step here
(``monkeypatch.setattr(config, "_hardware", ...)``) replaces it for them.
"""

from __future__ import annotations

import os
from dataclasses import replace
from types import MappingProxyType
from typing import TYPE_CHECKING

from gpuserve import engine_pins, gateway, recipes, schema
from gpuserve.config_repo import engine_overlays
from gpuserve.errors import ConfigError, Problem
from gpuserve.hardware import HardwareProfile

# every name config.py had, importable from gpuserve.config as before the split (issue 28), and
# the steps check_host and _role_host call
from gpuserve.config.sources import (  # noqa: F401 - re-exported
    _MISSING, DEFAULT, DEPLOYMENT_DEFAULTS, GATEWAY_DEFAULTS, HOST_DEFAULTS, KEYS, MONITOR_DEFAULTS,
    _Checker, data_source)
from gpuserve.config.settings import DeploymentSettings, HostSettings
from gpuserve.config.connection import (  # noqa: F401 - re-exported
    LOGIN_ESCALATIONS_REFUSED, LOGIN_PASSWORD_KEYS, _host_names, _login)
from gpuserve.config.machine import (  # noqa: F401 - re-exported
    GPU_MEMORY_MAX_GIB, ROLE_GROUPS, _gpu_stack, _hardware, _hardware_groups, _recipe, _serves)
from gpuserve.config.model import REPO, SHA, _model, _weights  # noqa: F401 - re-exported
from gpuserve.config.engine_keys import (  # noqa: F401 - re-exported
    PACKAGE, PYTHON_VERSIONS, TORCH_BACKEND, UV_VERSION, VERSION, _engine, _engine_build, _python_version)
from gpuserve.config.secret_values import (  # noqa: F401 - re-exported
    INLINE, SECRET_ENV_NAME, SECRET_KEYS, SECRET_VALUE, _scan_values, _secret_command, _unknown_keys)
from gpuserve.config.host_level import (  # noqa: F401 - re-exported
    PROXY_LIMITS, _host_level, _patch_keys, _proxy_access, _removal_keys)
from gpuserve.config.deployments import (  # noqa: F401 - re-exported
    DEPLOYMENT_NAME, ENV_NAME, PARALLEL_FLAG, _deployment, _deployments, _flag_value_ok, _free_port,
    _in_front_of_engines, _int_key, _port_clash, _port_clashes)
from gpuserve.config.monitor import MONITOR_NUMBERS, RETENTION, _monitor  # noqa: F401 - re-exported
from gpuserve.config.gateway_keys import _gateway
from gpuserve.config.principles import (  # noqa: F401 - re-exported
    CONTROL_NODE_PATHS, OWN_PORTS, OWN_UNITS, ROLE_PORTS, _own_names_and_ports, _principled, _principles)
from gpuserve.config.fleet import _fleet_gateway, _same_machine_twice, serving_workers  # noqa: F401 - re-exported

if TYPE_CHECKING:
    from pyinfra.api import Host, Inventory

__all__ = [
    "ConfigError",
    "Problem",
    "HostSettings",
    "DeploymentSettings",
    "check_host",
    "validate_inventory",
    "data_source",
]


def check_host(host: Host, *, require_revision: bool = True, deploying: bool = False,
               overlays: tuple[engine_pins.Overlays, list[str]] | None = None,
               ) -> tuple[HostSettings | None, list[Problem]]:
    """Settings for one pyinfra host, and every problem found (settings None when any).
    ``deploying``: a pyinfra run, where files only a deploy reads must exist already.
    ``overlays``: the config repo's engine releases (gpuserve.config_repo.engine_overlays)."""
    c = _Checker(host, deploying, overlays)
    _unknown_keys(c)
    _login(c)
    _host_names(c)
    if not _serves(c):
        _principles(c)
        return _role_host(c)
    _hardware_groups(c)
    hw = _hardware(c)
    recipe, explicit = _recipe(c, hw)
    model = _model(c, require_revision)
    engine = _engine(c, recipe)
    level = _host_level(c)
    build = _engine_build(c)
    weights = _weights(c, model)
    proxy_bind = level["proxy_bind"] if level["proxy"] is True else None
    deployments = _deployments(c, model["model_repo"], proxy_bind)
    gpu_stack = _gpu_stack(c)
    mon = _monitor(c)
    level.update(_removal_keys(c))
    level.update(_patch_keys(c))   # --- patching ---
    _in_front_of_engines(c, deployments or (), level)
    gw = _gateway(c) if gateway.GATEWAY_GROUP in host.groups else None  # a gateway that serves too
    _own_names_and_ports(c, deployments or (), level.get("proxy") is True)
    _principles(c)
    settings = None
    problems = list(c.problems)
    renderable = (
        hw is not None and recipe is not None and deployments is not None and gpu_stack is not None
        and mon is not None
        and None not in (model["model_repo"], model["model_source"], engine["engine"],
                         engine["engine_package"], engine["engine_version"],
                         engine["torch_backend"])
    )
    if renderable:  # recipe-level checks too, so one run reports everything
        settings = HostSettings(
            host=host.name, groups=tuple(host.groups), hardware=hw, recipe=recipe,
            recipe_explicit=explicit, deployments=deployments, stack=gpu_stack,
            sources=MappingProxyType(dict(c.sources)), warnings=tuple(c.warnings), monitor=mon,
            gateway=gw, **model, **engine, **level, **build, **weights,
        )
        configs, found = recipes.render(settings)  # the host's one render, kept in its settings
        problems += found
        settings = replace(settings, serve_configs=MappingProxyType(configs))
    return (None if problems else settings), problems


def validate_inventory(inventory: Inventory, *, require_revision: bool = True,
                       deploying: bool = False) -> dict[str, HostSettings]:
    """Settings of every host by name; raises one ConfigError with every host's problems.
    Never a traceback: a value the checks did not foresee is reported against its host too."""
    settings: dict[str, HostSettings] = {}
    problems: list[Problem] = []
    # engines/ of the config repo: the directory pyinfra (or gpuserve plan) runs in, as group_data/
    pins, unusable = engine_overlays(os.getcwd())
    overlays = (MappingProxyType(pins), unusable)
    for host in inventory:
        try:
            one, found = check_host(host, require_revision=require_revision, deploying=deploying,
                                    overlays=overlays)
        except Exception as exc:  # noqa: BLE001 - one host's surprise must not hide the others
            one, found = None, [Problem(host.name, "its data", "?", f"validation failed on a value "
                                        f"gpuserve did not expect ({type(exc).__name__}: {exc}); "
                                        "please report this with the host's data")]
        problems += found
        if one is not None:
            settings[host.name] = one
    problems += _fleet_gateway(inventory, settings)
    named = {(p.host, p.key) for p in problems}   # the gateway's "worker named twice" says it already
    problems += [p for p in _same_machine_twice(inventory) if (p.host, p.key) not in named]
    if problems:
        raise ConfigError(problems)
    return settings


def _role_host(c: _Checker) -> tuple[HostSettings | None, list[Problem]]:
    """Settings of a host that serves nothing: its host-level keys and its role's keys."""
    level = _host_level(c)
    build = _engine_build(c)   # uv and the wheelhouse build smg's venv too
    gw = _gateway(c) if gateway.GATEWAY_GROUP in c.host.groups else None
    mon = _monitor(c)
    gpu_stack = _gpu_stack(c)
    level.update(_removal_keys(c))   # --- removal: a role host can be decommissioned too ---
    level.update(_patch_keys(c))   # --- patching: a gateway's own override ---
    if c.problems or mon is None or gpu_stack is None:
        return None, list(c.problems)
    settings = HostSettings(
        host=c.name, groups=tuple(c.host.groups), hardware=HardwareProfile("cpu", 0, False), recipe="",
        recipe_explicit=False, model_repo="", model_revision=None, model_source="",
        hf_endpoint=None, model_local_path=None, engine="", engine_version="", engine_package="",
        python_version=_python_version(c) or schema.default("python_version"), torch_backend="", deployments=(),
        stack=gpu_stack, sources=MappingProxyType(dict(c.sources)),
        warnings=tuple(c.warnings), serves=False, gateway=gw, monitor=mon, **level, **build)
    return settings, []
