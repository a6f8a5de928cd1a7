"""The offline wheelhouse: the control node gathers an engine's wheels once; hosts install with no index.

On the control node (the ``wheelhouse`` key names the directory)::

    <wheelhouse>/<package>-<version>-py<python>-<torch backend>-<arch>/   one wheel set per engine pin
        *.whl              the engine, every dependency, and pip/setuptools/wheel for `uv venv --seed`
        manifest.json      file, project, version, sha256, size of each wheel (+ how it was built)
        SHA256SUMS         the same hashes, for `sha256sum -c` on the host
    <wheelhouse>/uv/uv-<version>-py3-none-manylinux_2_17_<arch>....whl      uv itself

``gpuserve wheelhouse build`` fills it (pip download, once); the engine layer pushes the set's
wheels (minus the excluded packages) to ``/opt/gpuserve/wheelhouse/<set>/`` on each host and
installs with ``uv pip install --no-index --find-links``. The set's digest (the sha256 of its
manifest's wheel list) is part of the engine id: other wheels, another venv.

Without a wheelhouse the uv wheel is still pushed from the control node: it is downloaded once
into ``$XDG_CACHE_HOME/gpuserve/uv`` (``~/.cache``).
"""

from __future__ import annotations

import hashlib
import json
import os
import platform
import shutil
import subprocess
import sys
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Any, Iterable

import click

from gpuserve import recipes
from gpuserve.packages import normalize
from gpuserve.locks import file_lock

MANIFEST = "manifest.json"
SUMS = "SHA256SUMS"
MANIFEST_FORMAT = 1
PYTORCH_INDEX = "https://download.pytorch.org/whl/{backend}"
ARCHES = ("x86_64", "aarch64")
# glibc tags pip may pick for a cross download (bookworm has 2.36; llguidance ships 2_31 only)
MANYLINUX = [f"manylinux_2_{minor}" for minor in range(39, 16, -1)] + ["manylinux2014"]


class WheelhouseError(RuntimeError):
    """A wheelhouse is missing or broken; the message says how to (re)build it."""


def set_name(package: str, version: str, python: str, torch_backend: str, arch: str) -> str:
    return f"{normalize(package)}-{version}-py{python}-{torch_backend}-{arch}"


def sha256_file(path: Path) -> str:
    with open(path, "rb") as fh:
        return hashlib.file_digest(fh, "sha256").hexdigest()


def wheel_project(filename: str) -> tuple[str, str]:
    """``opencv_python_headless-5.1.0.95-....whl`` -> (``opencv-python-headless``, ``5.1.0.95``)."""
    parts = filename[: -len(".whl")].split("-")
    return normalize(parts[0]), parts[1]


@dataclass(frozen=True)
class WheelSet:
    """One built set on the control node, read from its manifest."""

    path: Path
    manifest: dict[str, Any] = field(repr=False)

    @property
    def name(self) -> str:
        return self.path.name

    @property
    def wheels(self) -> list[dict[str, Any]]:
        return self.manifest["wheels"]

    @property
    def digest(self) -> str:
        """sha256 over every wheel's name and hash: what the engine id records."""
        lines = sorted(f"{w['file']} {w['sha256']}\n" for w in self.wheels)
        return hashlib.sha256("".join(lines).encode()).hexdigest()

    def excluded_files(self, excludes: Iterable[str]) -> list[str]:
        """Wheels of excluded packages: not pushed (uv never reads them with --excludes)."""
        names = {normalize(e) for e in excludes}
        return sorted(w["file"] for w in self.wheels if w["project"] in names)

    def size(self, excludes: Iterable[str] = ()) -> int:
        skip = set(self.excluded_files(excludes))
        return sum(w["size"] for w in self.wheels if w["file"] not in skip)


@lru_cache(maxsize=None)
def _read_manifest(path: str, mtime_ns: int) -> dict[str, Any]:
    return json.loads(Path(path).read_text())


def load_set(wheelhouse: str | os.PathLike, package: str, version: str, python: str,
             torch_backend: str, arch: str) -> WheelSet:
    """The set a host of this engine pin and architecture installs from."""
    name = set_name(package, version, python, torch_backend, arch)
    path = Path(wheelhouse) / name
    manifest = path / MANIFEST
    if not manifest.is_file():
        raise WheelhouseError(
            f"wheelhouse {wheelhouse} has no set {name} (no {manifest}); build it on the control "
            f"node: gpuserve wheelhouse build <inventory> (arch {arch}, see docs/configuration.md)")
    data = _read_manifest(str(manifest), manifest.stat().st_mtime_ns)
    if data.get("format") != MANIFEST_FORMAT:
        raise WheelhouseError(f"{manifest}: unknown manifest format; rebuild with --force")
    return WheelSet(path, data)


# --- uv ------------------------------------------------------------------------------------------
def uv_cache_dir() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache")
    return Path(base) / "gpuserve" / "uv"


def _find_uv_wheel(directory: Path, version: str, arch: str) -> Path | None:
    found = sorted(directory.glob(f"uv-{version}-py3-none-manylinux*_{arch}.whl"))
    return found[0] if found else None


def uv_wheel(version: str, arch: str, wheelhouse: str | os.PathLike | None = None) -> Path:
    """The uv wheel for a host's architecture, on the control node. From the wheelhouse when
    there is one (air-gapped: never downloads); otherwise downloaded once into the cache."""
    if arch not in ARCHES:
        raise WheelhouseError(f"no uv wheel for architecture {arch!r} (gpuserve knows {ARCHES})")
    if wheelhouse is not None:
        found = _find_uv_wheel(Path(wheelhouse) / "uv", version, arch)
        if found is None:
            raise WheelhouseError(f"wheelhouse {wheelhouse} has no uv {version} wheel for {arch}; "
                                  "run gpuserve wheelhouse build")
        return found
    cache = uv_cache_dir()
    found = _find_uv_wheel(cache, version, arch)
    if found is None:
        download_uv(version, arch, cache)
        found = _find_uv_wheel(cache, version, arch)
        if found is None:
            raise WheelhouseError(f"pip download uv=={version} for {arch} left no wheel in {cache}")
    return found


def download_uv(version: str, arch: str, dest: Path) -> None:
    dest.mkdir(parents=True, exist_ok=True)
    _pip_download([f"uv=={version}"], dest, ["--no-deps", "--platform", f"manylinux_2_17_{arch}"])


# --- building a set --------------------------------------------------------------------------
def _pip_download(requirements: list[str], dest: Path, extra_args: list[str],
                  quiet: bool = False) -> None:
    cmd = [sys.executable, "-m", "pip", "download", "--disable-pip-version-check",
           "--only-binary=:all:", "--dest", str(dest), *extra_args, *requirements]
    if quiet:
        cmd.insert(4, "-q")
    print(f"wheelhouse: {' '.join(cmd)}", file=sys.stderr, flush=True)
    proc = subprocess.run(cmd, stdout=sys.stderr)
    if proc.returncode != 0:
        raise WheelhouseError(f"pip download failed (exit {proc.returncode}): {' '.join(cmd)}")


def target_args(python: str, arch: str) -> list[str]:
    """pip download for the hosts' Python and architecture: nothing when they are this
    machine's, else explicit tags (wheels only)."""
    here = f"{sys.version_info.major}.{sys.version_info.minor}"
    if python == here and arch == platform.machine():
        return []
    args = ["--python-version", python, "--implementation", "cp"]
    for tag in MANYLINUX:
        args += ["--platform", f"{tag}_{arch}"]
    return args


def write_manifest(path: Path, info: dict[str, Any]) -> dict[str, Any]:
    wheels = []
    for whl in sorted(path.glob("*.whl")):
        project, version = wheel_project(whl.name)
        wheels.append({"file": whl.name, "project": project, "version": version,
                       "sha256": sha256_file(whl), "size": whl.stat().st_size})
    others = sorted(p.name for p in path.iterdir() if p.suffix != ".whl" and p.name not in (MANIFEST, SUMS))
    if others:
        raise WheelhouseError(f"{path}: not wheels (an sdist needs a build step on every host): "
                              f"{', '.join(others)}")
    manifest = {"format": MANIFEST_FORMAT, **info, "wheels": wheels}
    (path / SUMS).write_text("".join(f"{w['sha256']}  {w['file']}\n" for w in wheels))
    (path / MANIFEST).write_text(json.dumps(manifest, indent=1, sort_keys=True) + "\n")
    return manifest


def build_set(dest: str | os.PathLike, package: str, version: str, python: str, torch_backend: str,
              arch: str, uv_version: str, torch_index: str | None = "pytorch",
              extras: Iterable[str] = (), force: bool = False,
              constraints: Iterable[str] = ()) -> WheelSet:
    """Download one engine pin's wheels (and uv's) into ``dest``; a set already built is kept
    as is (``force`` rebuilds it). Built under ``<set>.partial`` and renamed when complete.

    ``torch_index``: "pytorch" adds PyTorch's index for the backend (torch builds such as
    2.13.0+cpu or +cu129 live there, not on PyPI); None uses only pip's own configuration
    (e.g. a find-links directory that already holds the torch wheel); else an index URL.
    ``constraints``: the engine's (``gpuserve.engine.CONSTRAINTS``), so that the set holds the
    wheels the host's constrained uv install picks.
    """
    dest = Path(dest)
    dest.mkdir(parents=True, exist_ok=True)
    name = set_name(package, version, python, torch_backend, arch)
    final = dest / name
    with file_lock(dest / ".lock"):
        if _find_uv_wheel(dest / "uv", uv_version, arch) is None:
            download_uv(uv_version, arch, dest / "uv")
        if (final / MANIFEST).is_file() and not force:
            print(f"wheelhouse: {final} is built (use --force to rebuild)", file=sys.stderr)
            return load_set(dest, package, version, python, torch_backend, arch)
        partial = dest / f"{name}.partial"
        shutil.rmtree(partial, ignore_errors=True)
        partial.mkdir()
        index_args: list[str] = []
        if torch_index == "pytorch":
            torch_index = PYTORCH_INDEX.format(backend=torch_backend)
        if torch_index:
            index_args = ["--extra-index-url", torch_index]
        requirements = [f"{package}=={version}", "pip", "setuptools", "wheel", *extras]
        constraint_args: list[str] = []
        constraints = list(constraints)
        if constraints:
            cfile = dest / f"{name}.constraints.txt"
            cfile.write_text("".join(f"{c}\n" for c in constraints))
            constraint_args = ["--constraint", str(cfile)]
        _pip_download(requirements, partial,
                      [*index_args, *constraint_args, *target_args(python, arch)])
        write_manifest(partial, {
            "set": name, "requirements": requirements, "python": python, "arch": arch,
            "torch_backend": torch_backend, "torch_index": torch_index,
            **({"constraints": constraints} if constraints else {}),
        })
        if final.exists():
            old = dest / f"{name}.old"
            shutil.rmtree(old, ignore_errors=True)
            final.rename(old)
            partial.rename(final)
            shutil.rmtree(old)
        else:
            partial.rename(final)
        return load_set(dest, package, version, python, torch_backend, arch)


# --- the command ---------------------------------------------------------------------------------
@click.group()
def wheelhouse() -> None:
    """The offline wheelhouse: gather the engine's wheels once on this control node."""


def _torch_index(option: str, s) -> str | None:
    """Where a host's torch comes from, for ``build_set``'s ``torch_index``."""
    from gpuserve import engine_pins

    if option == "none":
        return None
    if option != "auto":
        return option
    if s.engine_index:
        return s.engine_index  # e.g. vLLM's ROCm index, which carries its torch
    if s.torch_backend == engine_pins.pypi_torch_backend(s.engine_package, s.engine_version, s.engine_overlays):
        return None  # PyPI's torch is the backend's build
    return "pytorch"


@wheelhouse.command()
@click.argument("inventory", required=False, type=click.Path(exists=True, dir_okay=False))
@click.option("--profile", type=click.Choice(sorted(recipes.RECIPES)),
              help="One host of a recipe's reference hardware instead of an inventory.")
@click.option("--data", "data", multiple=True, metavar="KEY=VALUE",
              help="Override data for every host, as pyinfra's --data.")
@click.option("--dest", type=click.Path(file_okay=False),
              help="Wheelhouse directory (default: the hosts' `wheelhouse` key).")
@click.option("--arch", "arches", multiple=True, type=click.Choice(ARCHES),
              help=f"Host architecture(s) (default: this machine's, {platform.machine()}).")
@click.option("--torch-index", default="auto", show_default=True,
              help="'auto': the host's engine_index when set, none when PyPI's torch is the "
              "backend's build (torch 2.14 = cu130), else 'pytorch'; 'pytorch': PyTorch's "
              "index for the torch backend; 'none': only pip's own configuration "
              "(find-links, index-url); or an index URL.")
@click.option("--extra", "extras", multiple=True, metavar="REQ",
              help="More requirements for the set, e.g. FlashInfer's kernel wheels for "
              "`vllm download-kernels` on air-gapped GPU hosts.")
@click.option("--force", is_flag=True, help="Rebuild sets that are already built.")
def build(inventory: str | None, profile: str | None, data: tuple[str, ...], dest: str | None,
          arches: tuple[str, ...], torch_index: str, extras: tuple[str, ...], force: bool) -> None:
    """Download every engine pin of INVENTORY (or --profile) into the wheelhouse, once.

    One set per (package, version, python, torch backend, arch); sets already built are kept.
    Hosts then install with no index. Example (the sandbox, whose torch comes from pip's
    find-links here): gpuserve wheelhouse build inventories/sandbox.py --torch-index none
    """
    from gpuserve.config import ConfigError, validate_inventory
    from gpuserve.plan import _override_data, load_inventory, profile_inventory

    if (inventory is None) == (profile is None):
        raise click.UsageError("give an INVENTORY file or --profile NAME (one of them)")
    override = _override_data(data)
    inv = profile_inventory(profile, override) if profile else load_inventory(inventory, override)
    try:
        settings = validate_inventory(inv, require_revision=profile is None)
    except ConfigError as error:
        raise click.ClickException(str(error)) from error
    if not settings:
        raise click.ClickException("no hosts in the inventory")
    wanted: dict[tuple, str] = {}
    for s in settings.values():
        where = dest or s.wheelhouse
        if where is None:
            raise click.ClickException(f"{s.host}: no wheelhouse key and no --dest")
        for arch in arches or (platform.machine(),):
            if s.serves:
                key = (where, s.engine_package, s.engine_version, s.python_version, s.torch_backend,
                       arch, s.uv_version, _torch_index(torch_index, s))
                wanted[key] = s.host
            if s.gateway is not None:   # smg (docs/gateway.md): no torch, PyPI's wheels only
                wanted[(where, "smg", s.gateway.smg_version, s.python_version, "none", arch,
                        s.uv_version, None)] = s.host
    from gpuserve.engine import default_constraints

    for (where, package, version, python, backend, arch, uv, index) in wanted:
        try:
            ws = build_set(where, package, version, python, backend, arch, uv,
                           torch_index=index, extras=extras, force=force,
                           constraints=default_constraints(package))
        except WheelhouseError as error:
            raise click.ClickException(str(error)) from error
        click.echo(f"{ws.path}: {len(ws.wheels)} wheels, {ws.size() / 1e6:.0f} MB, "
                   f"digest {ws.digest[:12]}")
