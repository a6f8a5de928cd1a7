"""uv, the wheels it installs from, and the venvs it builds: the engine's and smg's.

    /opt/gpuserve/bin/uv-<version>               extracted from the uv wheel the control node pushes
    /opt/gpuserve/wheelhouse/<set>/              the pushed wheel set (with a wheelhouse)
    /opt/gpuserve/envs/<engine id>/              the engine's venv: built as <id>.partial, verified, renamed

Each looks at the host first and does nothing when its result is there ("No Change"); none ever
deletes a venv. The engine layer (gpuserve.layers.engine) and the gateway layer
(gpuserve.layers.gateway) call them.
"""

from __future__ import annotations

from pyinfra import host
from pyinfra.api import operation
from pyinfra.facts.files import Directory, File
from pyinfra.facts.server import Arch
from pyinfra.operations import files

from gpuserve import engine as eng
from gpuserve import gateway as gw
from gpuserve import wheelhouse


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


@operation()
def venv(spec: eng.EngineSpec, uv: str, remote_set: str | None):
    """The engine venv ``spec.env_dir``, built atomically (``gpuserve.engine.build_script``)."""
    if host.get_fact(Directory, path=spec.env_dir):
        host.noop(f"{spec.env_dir} is built")
        return
    yield eng.build_script(spec, uv, remote_set)


@operation()
def smg_venv(version: str, python_version: str, python_downloads: str, uv: str, wheels: str | None):
    """smg's venv, built once per (version, python); an existing one is never touched."""
    if host.get_fact(Directory, path=gw.venv_dir(version, python_version)):
        host.noop(f"smg {version} is installed")
        return
    yield gw.build_script(version, python_version, python_downloads, uv, wheels)
