"""One plan per host (issue 11): what validation decided for a host, in one immutable object.

    plan_host(settings)            settings, recipe, serve configs (validation's, rendered once),
                                   each deployment's ports and paths, the secrets to install
    with_engine(plan, spec, ...)   the same plan plus the engine spec and the releases it decides

Pure: no host access and no control-node I/O. The engine spec needs the digest of the control
node's wheelhouse set, so a pyinfra run adds it once per host (gpuserve.layers.context.host_plan);
``gpuserve plan`` and ``gpuserve status`` read the plan without it (``engine`` is None and
``releases`` is empty), so they never read a wheelhouse.

Secrets are named by where they come from and where they go, never by their content: the layers
read the files when they install them.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from types import MappingProxyType
from typing import TYPE_CHECKING, Any, Mapping

from gpuserve import layout, proxy_conf, recipes, release_files

if TYPE_CHECKING:
    from gpuserve.config import HostSettings
    from gpuserve.engine import EngineSpec


@dataclass(frozen=True)
class SecretInstall:
    """One secret file a host gets: ``source`` on the control node, ``dest`` on the host (root
    0600). No ``source``: an engine-key is made on the host and never sent; operator-keys are
    an empty list (no operator key)."""

    deployment: str | None  # None: the host's own (the proxy's TLS key)
    kind: str               # engine-key | client-keys | operator-keys | tls-key
    source: str | None
    dest: str
    setting: str | None = None   # the settings key that names ``source`` (for messages)


@dataclass(frozen=True)
class DeploymentPlan:
    """Where one deployment lives on its host and which ports it takes (gpuserve.layout's paths)."""

    name: str
    unit: str
    serve_host: str
    serve_port: int
    proxy_port: int | None   # None: no proxy in front of it
    health_url: str          # where the host itself asks the engine's /health
    deployment_dir: str
    releases_dir: str
    current_link: str
    previous_link: str
    secrets_env: str
    cache_dir: str
    checkpoint_dir: str      # the host's model revision (HostSettings.checkpoint_dir)


@dataclass(frozen=True)
class HostPlan:
    settings: HostSettings
    deployments: Mapping[str, DeploymentPlan]
    secrets: tuple[SecretInstall, ...]
    # added once per run by the layer context (needs the control node's wheelhouse digest)
    engine: EngineSpec | None = None
    wheelset: Any = None   # the gpuserve.wheelhouse.WheelSet the engine layer pushes, or None
    releases: Mapping[str, release_files.RenderedRelease] = field(
        default_factory=lambda: MappingProxyType({}))

    @property
    def host(self) -> str:
        return self.settings.host

    @property
    def recipe(self) -> recipes.Recipe:
        return recipes.RECIPES[self.settings.recipe]

    @property
    def serve_configs(self) -> Mapping[str, recipes.ServeConfig]:
        return self.settings.serve_configs   # rendered once, by validation

    def deployment(self, name: str) -> DeploymentPlan:
        return self.deployments[name]

    def secret(self, deployment: str | None, kind: str) -> SecretInstall | None:
        """The secret of ``kind`` this host installs for ``deployment``, or None."""
        return next((x for x in self.secrets if (x.deployment, x.kind) == (deployment, kind)), None)

    def release(self, name: str) -> release_files.RenderedRelease:
        if self.engine is None:
            raise LookupError(f"{self.host}: this plan has no engine spec, so no releases "
                              "(gpuserve.layers.context.host_plan adds them in a pyinfra run)")
        return self.releases[name]

    def release_dir(self, name: str) -> str:
        return layout.release_dir(name, self.release(name).id)


def _secrets(settings: HostSettings) -> tuple[SecretInstall, ...]:
    out = []
    for dep in settings.deployments:
        serve = settings.serve_configs.get(dep.name)
        engine_key = release_files.secrets_env_path(dep.name)
        if settings.proxy:
            # the engine's own key is made on the host; the proxy holds the clients' keys
            if serve is not None and serve.secret_env_keys:
                out.append(SecretInstall(dep.name, "engine-key", None, engine_key))
            out.append(SecretInstall(dep.name, "client-keys", dep.api_keys_file,
                                     f"{proxy_conf.NGINX_DIR}/{dep.name}.keys", "api_keys_file"))
            out.append(SecretInstall(dep.name, "operator-keys", dep.operator_keys_file,
                                     f"{proxy_conf.NGINX_DIR}/{dep.name}.operator-keys",
                                     "operator_keys_file"))
        elif serve is not None and serve.secret_env_keys and dep.api_keys_file is not None:
            out.append(SecretInstall(dep.name, "engine-key", dep.api_keys_file, engine_key,
                                     "api_keys_file"))
    if (settings.proxy or settings.gateway) and settings.proxy_tls_key_file:   # a TLS front
        out.append(SecretInstall(None, "tls-key", settings.proxy_tls_key_file,
                                 f"{proxy_conf.NGINX_DIR}/tls.key", "proxy_tls_key_file"))
    return tuple(out)


def plan_host(settings: HostSettings) -> HostPlan:
    """The plan of one validated host, without the engine spec (no control-node I/O)."""
    deployments = {
        dep.name: DeploymentPlan(
            name=dep.name, unit=layout.unit_name(dep.name),
            serve_host=dep.serve_host, serve_port=dep.serve_port,
            proxy_port=dep.proxy_port if settings.proxy else None,
            health_url=release_files.probe_url(dep.serve_host, dep.serve_port, "/health"),
            deployment_dir=layout.deployment_dir(dep.name),
            releases_dir=layout.releases_dir(dep.name),
            current_link=layout.current_link(dep.name),
            previous_link=layout.previous_link(dep.name),
            secrets_env=release_files.secrets_env_path(dep.name),
            cache_dir=layout.cache_dir(settings.nvme_path, dep.name),
            checkpoint_dir=settings.checkpoint_dir,
        )
        for dep in settings.deployments
    }
    return HostPlan(settings=settings, deployments=MappingProxyType(deployments),
                    secrets=_secrets(settings))


def with_engine(plan: HostPlan, spec: EngineSpec, wheelset: Any = None) -> HostPlan:
    """The plan with its engine spec and the releases that spec and the settings decide
    (``release_files.desired_releases``, called here and nowhere else)."""
    releases = release_files.desired_releases(plan.settings, spec) if plan.settings.serves else {}
    return replace(plan, engine=spec, wheelset=wheelset, releases=MappingProxyType(dict(releases)))
