"""Reading one host's data: where each value comes from, gpuserve's defaults, and the checker that
reads a host's keys and collects every problem instead of stopping at the first.

Data is plain pyinfra data (``--data`` > host data > group data, later group wins > all.py).
"""

from __future__ import annotations

from types import MappingProxyType
from typing import TYPE_CHECKING, Any, Iterable

from gpuserve import engine_pins, schema
from gpuserve.errors import Problem
from gpuserve.values import scale_hint

if TYPE_CHECKING:
    from pyinfra.api import Host

_MISSING = object()
DEFAULT = "gpuserve default"

# Every key's default, type and allowed values live in gpuserve.schema (docs/configuration.md's
# tables are generated from it); these are views of it, by who reads them.
# Top-level keys (None: no default; required ones are checked below), monitor and gateway keys too.
HOST_DEFAULTS: dict[str, Any] = schema.defaults("host", "monitor", "gateway")
# Deployment-level keys: set at top level (all deployments) or in a ``deployments`` entry.
DEPLOYMENT_DEFAULTS: dict[str, Any] = schema.defaults("deployment")
# A host in group ``monitor`` and in no hardware group runs Prometheus and serves nothing
# (HostSettings.serves False): no engine, model or deployment key is demanded of it.
MONITOR_DEFAULTS: dict[str, Any] = schema.defaults("monitor")
GATEWAY_DEFAULTS: dict[str, Any] = schema.defaults("gateway")   # hosts of the group `gateway`

# The GPU stack layer's keys are validated by gpuserve.stack (docs/gpu-stack.md)
KEYS = set(schema.BY_NAME)  # every key (host, deployment, monitor, gateway, GPU stack)


def data_source(host: Host, key: str) -> str:
    """Where pyinfra takes ``key`` from for ``host``, in its own precedence order."""
    inventory = host.inventory
    if key in inventory.get_override_data():
        return "--data"
    if key in inventory.get_host_data(host.name):
        return "host data"
    for group in reversed(host.groups):
        if key in inventory.get_group_data(group):
            return f"group '{group}'"
    if key in inventory.get_data():
        return "group 'all'"
    return DEFAULT


class _Checker:
    """Reads one host's data and collects problems instead of stopping at the first."""

    def __init__(self, host: Host, deploying: bool = False,
                 overlays: tuple[engine_pins.Overlays, list[str]] | None = None):
        self.host = host
        self.deploying = deploying  # a pyinfra run: what only a deploy needs must exist now
        # the config repo's engines/*.json, and a line per file of it the plan cannot use
        self.overlays, self.overlay_errors = overlays or (MappingProxyType({}), [])
        self.name = host.name
        self.problems: list[Problem] = []
        self.warnings: list[str] = []
        self.sources: dict[str, str] = {}

    def get(self, key: str) -> Any:
        value = self.host.data.get(key, _MISSING)
        self.sources[key] = data_source(self.host, key) if value is not _MISSING else DEFAULT
        return HOST_DEFAULTS.get(key, DEPLOYMENT_DEFAULTS.get(key)) if value is _MISSING else value

    def problem(self, key: str, message: str, source: str | None = None) -> None:
        self.problems.append(Problem(self.name, source or self.sources.get(key, DEFAULT), key, message))

    # typed readers: return the value, or None after recording a problem
    def one_of(self, key: str, allowed: Iterable[str], value: Any = _MISSING, src: str | None = None,
               path: str | None = None) -> Any:
        value = self.get(key) if value is _MISSING else value
        allowed = tuple(allowed)
        if value not in allowed:
            self.problem(path or key, f"{value!r} is not allowed; use one of {', '.join(allowed)}", src)
            return None
        return value

    # the simple checks, with the bounds and choices of gpuserve.schema
    def ranged(self, key: str) -> Any:
        """An integer key within its schema bounds (None allowed where the schema says optional)."""
        spec = schema.allowed(key)
        return self.integer(key, spec.lo, maximum=spec.hi, optional=spec.optional)

    def choice(self, key: str) -> Any:
        return self.one_of(key, schema.choices(key))

    def boolean(self, key: str, true_means: str | None = None) -> Any:
        """The value; a problem when it is not a real boolean. ``true_means``: what True does,
        said in the message."""
        value = self.get(key)
        if not isinstance(value, bool):
            what = f"True ({true_means})" if true_means else "True"
            self.problem(key, f"{value!r} is not allowed; use {what} or False")
        return value

    def integer(self, key: str, minimum: int, value: Any = _MISSING, src: str | None = None,
                path: str | None = None, maximum: int | None = None, optional: bool = False) -> Any:
        value = self.get(key) if value is _MISSING else value
        if value is None and optional:
            return None
        ok = isinstance(value, int) and not isinstance(value, bool)
        if not ok or value < minimum or (maximum is not None and value > maximum):
            bounds = f"{minimum}..{maximum}" if maximum is not None else f">= {minimum}"
            self.problem(path or key, f"{value!r} is not allowed; use an integer {bounds}"
                         + scale_hint(path or key, value, minimum, maximum), src)
            return None
        return value
