"""The validated settings, and the plan, of the host a deploy is running for.

The whole inventory is validated once per pyinfra run, when the first host asks, before any
operation is added: one bad value anywhere fails the run with every problem listed (host,
source, key), and no host is touched.

Each host's plan (gpuserve.host_plan) is made once per run, when a deploy first asks for it:
the settings' plan plus the engine spec (which reads the control node's wheelhouse manifest)
and the releases it decides. Every layer and deploy of the run reads that one plan.
"""

from __future__ import annotations

from pyinfra import host, logger
from pyinfra.context import ctx_state

from gpuserve import host_plan as plans
from gpuserve.config import HostSettings, validate_inventory
from gpuserve.facts.deployment import Deployment, DeploymentState
from gpuserve.layers import engine as engine_layer


def all_settings() -> dict[str, HostSettings]:
    """Every host's settings by name, validated once per run."""
    state = ctx_state.get()
    validated = getattr(state, "_gpuserve_settings", None)
    if validated is None:
        # raises ConfigError listing everything
        validated = validate_inventory(state.inventory, deploying=True)
        state._gpuserve_settings = validated
        for name, settings in validated.items():  # what `gpuserve plan` would warn about
            for warning in settings.warnings:
                logger.warning(f"{name}: {warning}")
    return validated


def host_settings() -> HostSettings:
    return all_settings()[host.name]


def host_plan(engine: bool = True) -> plans.HostPlan:
    """This host's plan, made once per run: on a serving host with its engine spec (resolved
    once, reading the wheelhouse manifest) and its releases (rendered once). ``engine=False``:
    the plan without them, for a deploy that installs no release (rollback): no wheelhouse read."""
    state = ctx_state.get()
    made = getattr(state, "_gpuserve_plans", None)
    if made is None:
        made = state._gpuserve_plans = {}
    key = (host.name, engine)
    if key not in made:
        plan = made.get((host.name, False)) or plans.plan_host(host_settings())
        made[(host.name, False)] = plan
        if engine and plan.settings.serves:   # a role-only host (gateway, monitor) runs no engine
            spec, wset = engine_layer.resolve_engine(plan.settings)
            plan = plans.with_engine(plan, spec, wset)
        made[key] = plan
    return made[key]


def deployment_state(plan: plans.HostPlan, name: str) -> DeploymentState:
    """The one reader of a deployment's state on this host (current and previous release, unit,
    drain flag, /health), asked at the health URL of the host's plan. Every layer and deploy reads
    it through here; ``gpuserve status`` asks the same fact with its own plan's URL."""
    return host.get_fact(Deployment, deployment=name, health_url=plan.deployment(name).health_url)
