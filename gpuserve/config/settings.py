"""The frozen settings validation makes: one HostSettings per host, one DeploymentSettings per
deployment. The layers, ``gpuserve plan`` and the readiness gate read these, not the host's data."""

from __future__ import annotations

from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, Mapping

from gpuserve import engine_pins, layout, monitoring, recipes, schema
from gpuserve import gateway, stack  # noqa: F401 - in annotations, beside the fields of those names
from gpuserve.config.sources import DEFAULT
from gpuserve.hardware import HardwareProfile
from gpuserve.secret_sources import SecretCommand


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
    engine_resolved_as_of: str | None = schema.default("engine_resolved_as_of")  # uv --exclude-newer; None: the pin's
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
