"""The service layer (its file is named units.py; its deploy is "Service"): per deployment its
release files, secrets, systemd unit, the converge's start and readiness gate, and release
retention; and ``gate_after_reboot``, which starts and gates engines after deploys/gpu_stack.py
rebooted a host.

A converge (deploys/serve.py) installs the desired release beside the others. It points
``current`` at it and starts the engine only when that costs no serving capacity: on a fresh
host, or when the deployment is not serving anyway. A host that is serving another release keeps
serving it: moving a serving fleet is ``deploys/upgrade.py``'s job (host by host, behind the proxy).
The unit is restarted when the unit, the secrets or the pointer changed, or when the engine is
down; nothing else restarts it.
"""

from __future__ import annotations

from dataclasses import dataclass
from io import StringIO
from pathlib import Path
from typing import Any, Sequence

from pyinfra import host, logger
from pyinfra.api import deploy
from pyinfra.api.exceptions import OperationError
from pyinfra.operations import apt, files, server, systemd

from gpuserve import api_keys, engine_guard, layout, rollout, templating
from gpuserve.config import DeploymentSettings, HostSettings
from gpuserve.layers import cache_seed
from gpuserve.operations import secrets as secrets_ops
from gpuserve.layers.engine_guard import engine_guard_layer
from gpuserve.facts.deployment import DeploymentState, ReleaseRecords
from gpuserve.layers.context import deployment_state
from gpuserve.host_plan import HostPlan
from gpuserve.secret_sources import SecretCommand
from gpuserve.releases import Ledger, Release, unreferenced
from gpuserve.values import is_loopback
from gpuserve.release_files import GATE, STOP_MARGIN_S, gate_command, tools_enabled

GATE_SRC = Path(__file__).resolve().parents[1] / "files" / "gpuserve-gate"


def unit_path(deployment: str) -> str:
    return layout.unit_path(deployment)


def engine_unit_vars(plan: HostPlan, dep: DeploymentSettings) -> dict:
    """The variables of one deployment's systemd unit (gpuserve.service.j2): pure, from the plan."""
    settings, where, name = plan.settings, plan.deployment(dep.name), dep.name
    serve = plan.serve_configs[name]
    return dict(
        deployment=name, engine=serve.engine, deployment_dir=where.deployment_dir,
        current=where.current_link, secrets_env=where.secrets_env,
        user_name=layout.SERVICE_USER, group_name=layout.SERVICE_GROUP, home=layout.SERVICE_HOME,
        cache=where.cache_dir,
        start_timeout_s=dep.ready_timeout_s, stop_timeout_s=dep.shutdown_timeout_s + STOP_MARGIN_S,
        devices=_devices(settings), supplementary_groups=_groups(settings), after=_after(settings),
        # GPU engines with several ranks reach each other (NCCL/gloo bootstrap) on the host's
        # own address, not loopback: the address filter is for engines without GPUs only
        loopback_only=is_loopback(dep.serve_host) and not serve.gpus,
        guard=engine_guard.UNIT, listeners=listeners_path(where.deployment_dir),
        credentials_bin=secrets_ops.CREDENTIALS_BIN,
    )


def engine_unit(plan: HostPlan, dep: DeploymentSettings) -> str:
    """One deployment's systemd unit (templates/gpuserve.service.j2), as the service layer writes it."""
    return templating.render("gpuserve.service.j2", **engine_unit_vars(plan, dep))


def listeners_path(deployment_dir: str) -> str:
    return f"{deployment_dir}/listeners.nft"


def _secrets_content(plan: HostPlan, name: str) -> str | None:
    """The engine's secrets env, or None when it must be generated on the host (behind the proxy):
    as the plan's engine-key secret says (gpuserve.host_plan)."""
    secret = plan.secret(name, "engine-key")
    if secret is None:
        return ""   # the engine takes no key, or none is configured
    if secret.source is None:
        return None  # an internal key the proxy injects; clients use their own keys at the proxy
    path = secret.source   # a file, or a command that prints the key (gpuserve.secret_sources)
    if not isinstance(path, SecretCommand) and not Path(path).is_file():
        raise OperationError(f"{host.name}: deployments.{name}.{secret.setting} {path} does not exist "
                             "on this control node")
    serve = plan.serve_configs[name]
    # relative to where pyinfra runs, as validation read it (joining the parent again read
    # secrets/secrets/<file> for the prod example's "secrets/prod-api-keys")
    env = api_keys.secret_env(serve)
    return "".join(f"{k}={v}\n" for k, v in env.items())


@dataclass(frozen=True)
class Installed:
    """What :func:`service_install` did for one deployment, which its start decides on."""
    state: DeploymentState
    unit: Any               # the unit file's operation (did it change?)
    changed_secrets: bool


@deploy("Service: install")
def service_install(plan: HostPlan) -> dict[str, Installed]:
    """Each deployment's release files, secrets, listener guard and unit (enabled, not started):
    nothing here needs the engine's venv or the weights, so deploys/serve.py runs it while they
    arrive (issue 24). :func:`service` starts and gates with what it returns."""
    apt.packages(name="curl for the readiness checks", packages=["curl"])
    files.directory(name="gpuserve tools", path=f"{layout.OPT_DIR}/bin", user="root", group="root",
                    mode="755")
    files.put(name="Readiness gate", src=str(GATE_SRC), dest=GATE, user="root", group="root", mode="755")
    secrets_ops.credentials_tool()   # the engine units' ExecStartPre=+ decrypts their secrets with it
    return {dep.name: _install(plan, dep) for dep in plan.settings.deployments}


@deploy("Service")
def service(plan: HostPlan, *, start: bool = True, removed: Sequence[Release] = (),
            installed: dict[str, Installed] | None = None) -> None:
    """Install each deployment's release (the plan's), unit and secrets (``installed``: what
    :func:`service_install` did earlier in this run; None: install here); start and gate where
    that is safe.

    ``start=False`` only stages (upgrade and rollback switch releases themselves, host by host).
    ``removed``: the releases of deployments the removal layer took off the host, whose engine
    envs and checkpoints retention collects unless a kept release uses them.
    """
    if installed is None:
        installed = service_install(plan)
    # before any engine starts: only the proxy and gpuserve open the engine ports (issue 12, 6);
    # after the removal layer, which stops the engines of the ports this leaves unguarded
    settings = plan.settings
    engine_guard_layer(settings)
    pointers = {dep.name: _start(plan, dep, installed[dep.name], start) for dep in settings.deployments}
    _retention(plan, pointers, removed)


def _install(plan: HostPlan, dep: DeploymentSettings) -> Installed:
    """One deployment's release files, secrets, listener guard and unit."""
    where, rendered = plan.deployment(dep.name), plan.release(dep.name)
    name, rid = dep.name, rendered.id
    state: DeploymentState = deployment_state(plan, name)

    rdir = plan.release_dir(name)
    files.directory(name=f"{name}: release {rid}", path=rdir, user="root",
                    group=layout.SERVICE_GROUP, mode="750")
    for fname, content in rendered.files.items():
        files.put(name=f"{name}: release file {fname}", src=StringIO(content), dest=f"{rdir}/{fname}",
                  user="root", group=layout.SERVICE_GROUP,
                  mode="750" if fname in ("launch", "wait-ready") else "640")

    secrets = _secrets_content(plan, name)
    secrets_path = where.secrets_env
    # a systemd credential at rest (issue 29), decrypted into /run by the unit's ExecStartPre=+;
    # secrets.env is the link to that copy, which the readiness gate and the watchdog read
    if secrets is None:
        # behind the proxy the engine gets a random key made on the host once, never sent anywhere
        # (nor shown: the operation prints neither the key nor a diff)
        op = secrets_ops.generated_credential(
            name=f"{name}: internal engine key (encrypted, made on the host)", dest=secrets_path,
            cred_name=f"{name}.secrets.env", check="^VLLM_API_KEY=.",
            make="printf 'VLLM_API_KEY=%s\\n' \"$(head -c 32 /dev/urandom | base64 | tr '+/' '-_' | tr -d '=\\n')\"")
    else:
        op = secrets_ops.credential_file(name=f"{name}: engine secrets (encrypted, not shown)", content=secrets,
                                         dest=secrets_path, cred_name=f"{name}.secrets.env")

    listeners_file = listeners_path(where.deployment_dir)
    listeners = files.put(
        name=f"{name}: listener guard (only root and {layout.SERVICE_USER} open the engine's other ports)",
        src=StringIO(engine_guard.listeners_ruleset(name, where.unit, dep.serve_port,
                                                    ("root", layout.SERVICE_USER))),
        dest=listeners_file, user="root", group="root", mode="644")
    server.shell(name=f"{name}: listener guard loaded for the running engine",
                 commands=[f"if systemctl is-active -q {where.unit}; then nft -f {listeners_file}; fi"],
                 _if=listeners.did_change)
    unit = files.put(name=f"{name}: systemd unit", src=StringIO(engine_unit(plan, dep)), dest=unit_path(name),
                     user="root", group="root", mode="644")
    systemd.daemon_reload(name=f"{name}: reload systemd units", _if=unit.did_change)
    systemd.service(name=f"{name}: unit enabled at boot", service=where.unit,
                    running=None, enabled=True)
    return Installed(state, unit, op.will_change)


def _start(plan: HostPlan, dep: DeploymentSettings, installed: Installed,
           start: bool) -> tuple[str | None, str | None]:
    """Start and gate one installed deployment where that is safe; its (current, previous)
    releases after this run, for retention."""
    settings, state, unit = plan.settings, installed.state, installed.unit
    name, rid, serve = dep.name, plan.release(dep.name).id, plan.serve_configs[dep.name]
    if not start:
        return state.current, state.previous
    ledger = Ledger(tuple(dict.fromkeys((*state.releases, rid))), state.current, state.previous)
    switch = state.current != rid and not state.serving and state.active_state != "activating"
    if state.current not in (None, rid) and not switch:
        logger.info(f"    [{host.name}] {name}: release {rid} is staged beside the serving "
                    f"{state.current}; roll it out with deploys/upgrade.py")
    after = ledger.after_switch(rid) if switch else ledger
    if switch:
        server.shell(name=f"{name}: current -> {after.current}"
                          + (f", previous -> {after.previous}" if after.previous else ""),
                     commands=rollout.pointer_commands(name, after.current, after.previous))
    restart = (switch or unit.will_change or installed.changed_secrets
               or state.active_state in ("", "inactive", "failed")
               or (state.active_state == "active" and state.health != 200))
    if switch:   # a release's first start on this host: from the fleet's compiled caches
        cache_seed.seed_operation(settings, name, rid)
    if restart:
        server.shell(name=f"{name}: (re)start the engine",
                     # the stop drains in-flight requests; the start's reset-failed may fail
                     commands=[rollout.stop(name), rollout.start(name)])
    if restart or state.active_state == "activating":
        server.shell(name=f"{name}: readiness gate (/health, /v1/models, chat"
                          + (", tool call)" if tools_enabled(serve) else ")"),
                     commands=[gate_command(dep, tool=tools_enabled(serve), timeout=dep.ready_timeout_s)])
    if after.current == rid:
        cache_seed.publish_operation(settings, name, rid)
    if settings.proxy:  # serving: in the proxy's rotation, even if a killed rollout left it out
        files.file(name=f"{name}: in the proxy's rotation (no drain flag)", path=rollout.drain_flag(name),
                   present=False)
    return after.current, after.previous


@deploy("Readiness after a reboot")
def gate_after_reboot(plan: HostPlan, rebooted) -> None:
    """After an operation that may reboot the host (``rebooted``, e.g. the GPU stack's): every
    deployment with a release started and gated, so the run ends only once the host serves again
    or fails naming it. Nothing runs when the host did not reboot."""
    if rebooted is None:
        return
    for dep in plan.settings.deployments:
        state = deployment_state(plan, dep.name)
        if state.current is None:
            continue
        serve = plan.serve_configs[dep.name]
        server.shell(name=f"{dep.name}: started and gated after the reboot",
                     commands=[rollout.start(dep.name),
                               gate_command(dep, tool=tools_enabled(serve), timeout=dep.ready_timeout_s)],
                     _if=rebooted.did_change)


def _retention(plan: HostPlan, pointers: dict[str, tuple[str | None, str | None]],
               removed: Sequence[Release] = ()) -> None:
    """Keep current, previous and keep_releases - 1 more per deployment (and the release this run
    wants); remove the rest, and the releases of removed deployments, with the engine envs and
    checkpoints no kept release uses."""
    settings, releases = plan.settings, plan.releases
    collected, kept = list(removed), [r.release for r in releases.values()]
    for dep in settings.deployments:
        records = host.get_fact(ReleaseRecords, deployment=dep.name)
        state = deployment_state(plan, dep.name)
        current, previous = pointers[dep.name]
        desired = releases[dep.name].id
        ledger = Ledger(tuple(records), current, previous)
        gone = [r for r in ledger.to_collect(settings.keep_releases, state.releases) if r != desired]
        for rid in gone:
            files.directory(name=f"{dep.name}: retention removes release {rid}",
                            path=layout.release_dir(dep.name, rid), present=False)
        collected += [records[r] for r in gone]
        kept += [rec for rid, rec in records.items() if rid not in gone]
    envs, checkpoints = unreferenced(collected, kept)
    for path in envs:
        if path.startswith(layout.ENVS_DIR + "/"):
            files.directory(name=f"Retention removes engine env {path}", path=path, present=False)
    for path in checkpoints:
        if path.startswith(layout.models_dir(settings.nvme_path) + "/"):
            files.directory(name=f"Retention removes checkpoint {path}", path=path, present=False)


def _devices(settings: HostSettings) -> list[str]:
    vendor = settings.hardware.vendor if settings.uses_gpus else None
    if vendor == "nvidia":
        return ["char-nvidia-frontend", "char-nvidia-uvm", "char-nvidia-caps", "char-nvidia-nvswitch",
                "/dev/nvidiactl", "/dev/nvidia-uvm", "/dev/nvidia-uvm-tools"]
    if vendor == "amd":
        return ["/dev/kfd", "char-drm"]
    return []


def _groups(settings: HostSettings) -> list[str]:
    return ["render", "video"] if settings.uses_gpus and settings.hardware.vendor == "amd" else []


def _after(settings: HostSettings) -> list[str]:
    if not settings.uses_gpus or settings.hardware.vendor != "nvidia":
        return []
    units = ["nvidia-persistenced.service"]
    if settings.hardware.nvswitch:
        units.append("nvidia-fabricmanager.service")
    return units
