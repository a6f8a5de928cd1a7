"""Engine layer: uv at a pinned version, then one immutable venv per engine pin.

    /opt/gpuserve/bin/uv-<version>               extracted from the uv wheel the control node pushes
    /opt/gpuserve/wheelhouse/<set>/              the pushed wheel set (with a wheelhouse)
    /opt/gpuserve/envs/<engine id>/              the venv: built as <id>.partial, verified, renamed
    /opt/gpuserve/cache/uv/                      uv's cache, on the venvs' filesystem (hard links)

Two halves (issue 24): :func:`engine_begin` pushes uv and the wheels and starts the venv's build
in a host-side unit; :func:`engine_wait` waits for it. deploys/serve.py puts the steps that need
neither the venv nor the weights between them, so a fresh host builds its venv while they run.

The same operations every run (gpuserve.operations.venv); each looks at the host first and does
nothing when its result is there: a host whose venv for this pin exists gets no push and no uv
call, so a second converge changes and transfers nothing. A changed pin is a new engine id, so a
new venv beside the old ones; this layer never deletes a venv (retention belongs to the service
layer), only a ``.partial`` left by a killed build.
"""

from __future__ import annotations

from pyinfra import host
from pyinfra.api import deploy
from pyinfra.facts.server import Arch
from pyinfra.operations import apt, files

from gpuserve import engine as eng
from gpuserve import layout, wheelhouse
from gpuserve.config import HostSettings
from gpuserve.host_plan import HostPlan
from gpuserve.operations.venv import pushed_wheels, uv_binary, venv, venv_begin


def resolve_engine(settings: HostSettings) -> tuple[eng.EngineSpec, wheelhouse.WheelSet | None]:
    """The host's engine spec and the wheel set it installs from (None: the index). Reads the
    control node's wheelhouse manifest: the layer context calls it once per host per run and
    keeps the result in the host's plan (gpuserve.layers.context.host_plan)."""
    if settings.wheelhouse is None:
        return eng.spec_for(settings), None
    wset = wheelhouse.load_set(settings.wheelhouse, settings.engine_package, settings.engine_version,
                               settings.python_version, settings.torch_backend, host.get_fact(Arch))
    return eng.spec_for(settings, wheelset=wset.digest), wset


def _spec(plan: HostPlan) -> eng.EngineSpec:
    if plan.engine is None:
        raise ValueError(f"{plan.settings.host}: the engine layer needs a plan with its engine spec "
                         "(gpuserve.layers.context.host_plan)")
    return plan.engine


def _remote_set(plan: HostPlan) -> str | None:
    return f"{eng.WHEELHOUSE_DIR}/{plan.wheelset.name}" if plan.wheelset is not None else None


@deploy("Engine")
def engine_begin(plan: HostPlan) -> eng.EngineSpec:
    """uv (pinned, from a wheel pushed by the control node) and the wheels, then the build of the
    engine venv for this host's pin started in the background, in a host-side unit
    (``gpuserve.operations.venv.venv_begin``): the converge's next steps run while it builds, and
    :func:`engine_wait` waits for it. Returns the plan's spec (its ``env_dir``, ``id``)."""
    settings, spec, wset = plan.settings, _spec(plan), plan.wheelset
    files.directory(name="Engine tools", path=eng.BIN_DIR, user="root", group="root", mode="755")
    files.directory(name="Engine caches (uv)", path=f"{layout.OPT_DIR}/cache",
                    user="root", group="root", mode="700")
    files.directory(name="Pushed wheels", path=eng.WHEELHOUSE_DIR, user="root", group="root",
                    mode="755")
    if eng.runtime_debs(spec.package):
        apt.packages(name="Engine runtime libraries", packages=list(eng.runtime_debs(spec.package)))
    if spec.python_downloads == "automatic":
        files.directory(name="uv-managed Pythons", path=eng.PYTHON_INSTALL_DIR,
                        user="root", group="root", mode="755")
    uv_binary(name=f"uv {settings.uv_version}", version=settings.uv_version,
              wheelhouse_dir=settings.wheelhouse)
    if wset is not None:
        pushed_wheels(name=f"Wheel set {wset.name} ({wset.size(spec.excludes) / 1e6:.0f} MB)",
                      wset=wset, spec=spec)
    venv_begin(name=f"Engine venv {spec.id}: build started in the background "
                    f"({layout.engine_build_unit(spec.id)})",
               spec=spec, uv=eng.uv_path(settings.uv_version), remote_set=_remote_set(plan))
    return spec


@deploy("Engine: wait")
def engine_wait(plan: HostPlan) -> eng.EngineSpec:
    """The engine venv for this host's pin: waits for the build :func:`engine_begin` started
    (its steps as it reaches them), or builds it now; atomically either way."""
    spec = _spec(plan)
    steps = "uv venv, uv pip install" + (", vllm download-kernels" if spec.kernels else "")
    venv(name=f"Engine venv {spec.id} ({steps}, verify, rename)", spec=spec)
    return spec


def engine(plan: HostPlan) -> eng.EngineSpec:
    """The whole engine layer in one place (deploys/upgrade.py stages a release with it):
    :func:`engine_begin`, then :func:`engine_wait` right away."""
    engine_begin(plan)
    return engine_wait(plan)
