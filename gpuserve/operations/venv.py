"""uv, the wheels it installs from, and the venvs it builds: the engine's and smg's.

    /opt/gpuserve/bin/uv-<version>               extracted from the uv wheel the control node pushes
    /opt/gpuserve/wheelhouse/<set>/              the pushed wheel set (with a wheelhouse)
    /opt/gpuserve/envs/<engine id>/              the engine's venv: built as <id>.partial, verified, renamed

Each looks at the host first and does nothing when its result is there ("No Change"); none ever
deletes a venv. The engine layer (gpuserve.layers.engine) and the gateway layer
(gpuserve.layers.gateway) call them.

The engine's venv can build in the background (issue 24): ``venv_begin`` starts its build script
in a transient host-side unit (``systemd-run``, ``gpuserve.layout.engine_build_unit``) and returns
at once, so the converge's next steps run while it builds; ``venv`` then waits for that unit,
printing the build's steps as it reaches them, and fails the host with the end of the build's
output when it ended without the venv. The unit goes when it ends, and its script with it. The
script's own per-id lock keeps two builds of one id from ever running at once.
"""

from __future__ import annotations

import shlex
import time
from io import StringIO
from typing import Any

from pyinfra import host, logger
from pyinfra.api import FunctionCommand, operation
from pyinfra.facts.files import Directory, File
from pyinfra.facts.server import Arch
from pyinfra.operations import files

from gpuserve import engine as eng
from gpuserve import gateway as gw
from gpuserve import layout, wheelhouse
from gpuserve.operations.weights import connector_args

BUILD_POLL_S = 2
BUILD_QUIET_S = 30      # no new step for this long: a line that says the build still runs
BUILD_WAIT_S = 7200     # as long as the script itself waits for another build's lock
BUILD_START_S = 10      # a unit not seen running this long after the wait began: it ended


@operation()
def uv_binary(version: str, wheelhouse_dir: str | None):
    """uv ``version`` at ``/opt/gpuserve/bin/uv-<version>``, from its wheel: the wheelhouse's,
    or one downloaded once into the control node's cache."""
    if host.get_fact(File, path=eng.uv_path(version)):
        host.noop(f"uv {version} is installed")
        return
    wheel = wheelhouse.uv_wheel(version, host.get_fact(Arch), wheelhouse_dir)
    remote = f"{eng.WHEELHOUSE_DIR}/uv/{wheel.name}"
    yield from files.put._inner(src=str(wheel), dest=remote, user="root", group="root", mode="644")
    yield eng.uv_install_script(version, remote, wheelhouse.sha256_file(wheel))


@operation()
def pushed_wheels(wset: wheelhouse.WheelSet, spec: eng.EngineSpec):
    """The set's wheels (minus the excluded packages') on the host, while a venv needs them."""
    if host.get_fact(Directory, path=spec.env_dir):
        host.noop(f"{spec.id} is built: no wheels needed")
        return
    skipped = [str(wset.path / f) for f in wset.excluded_files(spec.excludes)]
    yield from files.sync._inner(src=str(wset.path), dest=f"{eng.WHEELHOUSE_DIR}/{wset.name}",
                                 user="root", group="root", mode="644", dir_mode="755",
                                 delete=False, exclude=skipped or None)


def build_start_command(spec: eng.EngineSpec) -> str:
    """Start the build script in its transient unit, unless that unit runs already (a converge
    killed while it waited leaves it building): pure. The unit goes once it ends, failed or not
    (``--collect``), and its script with it (``ExecStopPost=``): a converge killed meanwhile
    leaves nothing of the build behind but the venv, or nothing at all."""
    unit, script = layout.engine_build_unit(spec.id), layout.engine_build_script(spec.id)
    q = shlex.quote
    return (f"systemctl is-active -q {q(unit)} || systemd-run --quiet --no-block --collect --unit={q(unit)} "
            f"--description={q(f'gpuserve: build the engine venv {spec.id}')} --setenv=HOME=/root "
            f"-p {q(f'ExecStopPost=/bin/rm -f {script}')} /bin/sh {q(script)}")


@operation()
def venv_begin(spec: eng.EngineSpec, uv: str, remote_set: str | None):
    """Start building the engine venv ``spec.env_dir`` in the background (``venv`` waits for it)."""
    if host.get_fact(Directory, path=spec.env_dir):
        host.noop(f"{spec.env_dir} is built")
        return
    yield from files.directory._inner(path=eng.LOG_DIR, user="root", group="root", mode="755")
    yield from files.put._inner(src=StringIO(eng.build_script(spec, uv, remote_set)),
                                dest=layout.engine_build_script(spec.id), user="root", group="root",
                                mode="700")
    yield build_start_command(spec)


@operation()
def venv(spec: eng.EngineSpec):
    """The engine venv ``spec.env_dir``, built atomically (``gpuserve.engine.build_script``) by the
    background build ``venv_begin`` started: waits for it; when it ended without making the venv,
    fails the host with the end of the build's output."""
    if host.get_fact(Directory, path=spec.env_dir):
        host.noop(f"{spec.env_dir} is built")
        return
    yield FunctionCommand(_wait_for_build, (spec, connector_args()), {})


def _wait_for_build(state: Any, host: Any, spec: eng.EngineSpec, conn: dict) -> bool:
    """While the build's unit runs: each step it reaches, as a line ("[95 s] uv pip install
    ..."), and a line every ``BUILD_QUIET_S`` without one. A build that ended without making the
    venv fails the host, showing the end of its output (its unit's journal). ``conn``: the
    operation's connection arguments (``_sudo``: the journal of a system unit needs root)."""
    unit, q = layout.engine_build_unit(spec.id), shlex.quote
    shown, last_line, started = 0, time.monotonic(), False
    begun = last_line
    deadline = begun + BUILD_WAIT_S
    while time.monotonic() < deadline:
        ok, out = host.run_shell_command(
            f"systemctl show -p ActiveState --value {q(unit)}; grep -a '^gpuserve: \\[' {q(spec.log_file)} "
            "2>/dev/null || true", **conn)
        lines = [line.strip() for line in out.stdout_lines] if ok else []
        active = lines[0] if lines else ""
        steps = lines[1:]
        for line in steps[shown:]:
            host.log_styled(f"engine venv {spec.id}: {line.removeprefix('gpuserve: ')}", log_func=logger.info)
            last_line = time.monotonic()
        shown = max(shown, len(steps))
        if active in ("active", "activating", "deactivating", "reloading"):
            started = True
        elif host.run_shell_command(f"test -d {q(spec.env_dir)}", **conn)[0]:
            return True   # built (its transient unit, --collect, is gone)
        elif started or time.monotonic() - begun >= BUILD_START_S:
            # ended without the venv, or never seen running though systemd-run queued it
            # BUILD_START_S ago at least
            _, log = host.run_shell_command(f"journalctl -u {q(unit)} -n 40 -o cat --no-pager", **conn)
            host.log_styled(f"{host.name}: the engine venv {spec.id} failed to build ({unit}); the end of "
                            f"its output (also in {spec.log_file}):\n" + "\n".join(log.stdout_lines),
                            fg="red", log_func=logger.error)
            return False
        if time.monotonic() - last_line >= BUILD_QUIET_S:
            where = steps[-1].removeprefix("gpuserve: ") if steps else "starting"
            host.log_styled(f"engine venv {spec.id}: still building, at {where}", log_func=logger.info)
            last_line = time.monotonic()
        time.sleep(BUILD_POLL_S)
    host.log_styled(f"{host.name}: the engine venv {spec.id} was still building after {BUILD_WAIT_S} s "
                    f"(`journalctl -u {unit}` on the host)", fg="red", log_func=logger.error)
    return False


@operation()
def smg_venv(version: str, python_version: str, python_downloads: str, uv: str, wheels: str | None):
    """smg's venv, built once per (version, python); an existing one is never touched."""
    if host.get_fact(Directory, path=gw.venv_dir(version, python_version)):
        host.noop(f"smg {version} is installed")
        return
    yield gw.build_script(version, python_version, python_downloads, uv, wheels)
