"""``gpuserve engine add PACKAGE==VERSION``: a new engine release into the config repo, read
from the engine itself (docs/recipes.md, "Adding an engine release").

The control node's side of the one generator of engine data (dev/gen_engine_flags.py calls
it too, for the data gpuserve ships in gpuserve/engine_flags.py). From PyPI only:

1. the package's releases on PyPI (PEP 691 simple JSON): the pin must be one;
2. the engine wheel's own METADATA (PEP 658, else read from the wheel, downloaded once): its
   ``torch==`` pin, and every ``==`` requirement that PyPI does not have;
3. that torch's METADATA: its CUDA major (``cuda-toolkit==13.*`` / ``nvidia-*-cu13``), or the
   local build (``cpu``) of a ``+cpu`` version;
4. the engine's serve parser: the engine installed with uv into a throwaway venv, then
   gpuserve/engine_parser.py run by that venv's Python (every long option, with its type,
   choices and range where argparse has them). ``VLLM_TARGET_DEVICE=cpu`` lets a CUDA build of
   vLLM build its parser on a machine without a GPU; the options do not depend on the platform.

``--override PKG==VER`` (recorded in the file) lets uv install a pin whose own requirement PyPI
lacks, only to read its parser (vLLM 0.34.0 requires flashinfer-python==0.7.3; 0.7.4 is on PyPI).
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import shutil
import subprocess
import sys
import time
import urllib.request
import zipfile
from pathlib import Path
from typing import Any, Callable

import click

from gpuserve import engine_overlay, engine_parser, engine_pins
from gpuserve.engine import DEFAULT_EXCLUDES
from gpuserve.engine_pins import Pin
from gpuserve.packages import normalize as canonical   # PEP 503's name

SIMPLE = "https://pypi.org/simple/{name}/"
# the platform gpuserve's hosts are: which of a wheel's requirements apply
TARGET = {"sys_platform": "linux", "platform_system": "Linux", "platform_machine": "x86_64",
          "python_version": "3.11", "python_full_version": "3.11.7", "implementation_name": "cpython",
          "platform_python_implementation": "CPython", "os_name": "posix", "extra": ""}
HEARTBEAT_S = 30.0

Say = Callable[[str], None]


def work_dir() -> Path:
    """Where the throwaway venvs and downloaded wheels go: ``$XDG_CACHE_HOME/gpuserve/engine-add``."""
    base = os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache")
    return Path(base) / "gpuserve" / "engine-add"


# --- PyPI ----------------------------------------------------------------------------------------

def simple(name: str) -> dict:
    req = urllib.request.Request(SIMPLE.format(name=canonical(name)),
                                 headers={"Accept": "application/vnd.pypi.simple.v1+json"})
    with urllib.request.urlopen(req, timeout=60) as r:
        return json.load(r)


def metadata(name: str, version: str, wheels: Path) -> str:
    """The METADATA of ``name==version``'s Linux x86_64 wheel: the PEP 658 file beside it when
    the index serves one, else read from the wheel (downloaded once into ``wheels``)."""
    files = [f for f in simple(name)["files"]
             if f["filename"].endswith(".whl")
             and re.match(rf"{re.escape(canonical(name).replace('-', '_'))}-"
                          rf"{re.escape(version)}-", f["filename"], re.IGNORECASE)]
    files.sort(key=lambda f: ("x86_64" not in f["filename"],
                              not re.search(r"cp311|abi3|py3-none", f["filename"])))
    if not files:
        raise click.ClickException(f"no Linux wheel for {name}=={version} on PyPI")
    best = files[0]
    if best.get("core-metadata"):
        with urllib.request.urlopen(best["url"] + ".metadata", timeout=60) as r:
            return r.read().decode()
    wheels.mkdir(parents=True, exist_ok=True)
    path = wheels / best["filename"]
    if not path.exists():
        tmp = path.with_suffix(".part")
        with urllib.request.urlopen(best["url"], timeout=600) as r, open(tmp, "wb") as out:
            shutil.copyfileobj(r, out, 1 << 20)
        tmp.rename(path)
    with zipfile.ZipFile(path) as z:
        return z.read(next(n for n in z.namelist() if n.endswith(".dist-info/METADATA"))).decode()


def requirements(meta: str) -> list:
    """The ``Requires-Dist`` of a METADATA that apply on gpuserve's hosts (no extra)."""
    from packaging.requirements import Requirement

    out = []
    for line in meta.splitlines():
        if line.startswith("Requires-Dist:"):
            req = Requirement(line.split(":", 1)[1].strip())
            if req.marker is None or req.marker.evaluate(TARGET):
                out.append(req)
    return out


def exact(req) -> str | None:
    """The version of an ``==`` requirement with no other specifier, else None."""
    spec = list(req.specifier)
    return spec[0].version if len(spec) == 1 and spec[0].operator == "==" else None


def cuda_major(torch_version: str, wheels: Path) -> str:
    if "+" in torch_version:
        return torch_version.split("+", 1)[1]  # cpu, cu129, rocm7.2 ...
    for req in requirements(metadata("torch", torch_version, wheels)):
        name = canonical(req.name)
        m = re.match(r"nvidia-.*-cu(\d+)$", name)
        if m:
            return m.group(1)
        if name in ("cuda-toolkit", "nvidia-cuda-runtime") and exact(req):
            return exact(req).split(".")[0]
    return "cpu"


def newest(versions: tuple[str, ...], count: int) -> list[str]:
    """The ``count`` highest of ``versions`` (PEP 440 order; PyPI lists them as strings), highest last."""
    from packaging.version import InvalidVersion, Version

    def key(v: str) -> tuple:
        try:
            return (1, Version(v))
        except InvalidVersion:
            return (0, v)
    return sorted(versions, key=key)[-count:]


def pypi_facts(package: str, version: str, wheels: Path) -> tuple[tuple[str, ...], tuple[str, str] | None,
                                                                   list[str]]:
    """(the package's releases on PyPI, (torch pin, its CUDA major) or None, the pin's exact
    requirements PyPI lacks). A version PyPI does not have is refused, naming what it has."""
    releases = tuple(simple(package).get("versions", []))
    if version not in releases:
        raise click.ClickException(f"{package}=={version} is not on PyPI (its newest releases there: "
                                   f"{', '.join(newest(releases, 8)) or 'none'})")
    reqs = requirements(metadata(package, version, wheels))
    missing = []
    for req in reqs:
        want = exact(req)
        # a local build (torch==2.13.0+cpu) comes from torch_backend's index, not PyPI
        if want and "+" not in want and want not in simple(req.name).get("versions", []):
            missing.append(f"{canonical(req.name)}=={want}")
    torch = next((exact(r) for r in reqs if canonical(r.name) == "torch"), None)
    return releases, (torch, cuda_major(torch, wheels)) if torch else None, missing


# --- the engine's parser, from a throwaway venv --------------------------------------------------

def _run(cmd: list[str], env: dict[str, str], say: Say, what: str) -> None:
    """Run ``cmd`` (its output goes to the terminal), saying every HEARTBEAT_S that it still runs."""
    started = time.monotonic()
    proc = subprocess.Popen(cmd, env=env, stdout=sys.stderr)
    while True:
        try:
            rc = proc.wait(timeout=HEARTBEAT_S)
            break
        except subprocess.TimeoutExpired:
            say(f"{what}: still running ({time.monotonic() - started:.0f} s)")
    if rc != 0:
        raise click.ClickException(f"{what} failed (exit {rc}): {' '.join(cmd)}")


def read_parser(package: str, version: str, *, work: Path, uv: str, python: str, overrides: tuple[str, ...],
                find_links: tuple[str, ...] = (), uv_cache: str | None = None, keep: bool = False,
                say: Say = lambda line: None) -> dict[str, Any]:
    """gpuserve.engine_parser's output for ``package==version``, installed with uv into
    ``work/<package>-<version>`` (reused with ``keep`` when it is there)."""
    venv = work / f"{package}-{version}"
    env = {**os.environ, "UV_NO_CONFIG": "1", "UV_PYTHON_DOWNLOADS": "never",
           "VLLM_TARGET_DEVICE": "cpu", "VLLM_NO_USAGE_STATS": "1", "DO_NOT_TRACK": "1"}
    if uv_cache:
        env["UV_CACHE_DIR"] = uv_cache
    if not (keep and (venv / "bin" / "python").exists()):
        _run([uv, "venv", "--clear", "--no-managed-python", "--python", python, str(venv)], env, say,
             "uv venv")
        cmd = [uv, "pip", "install", "--python", str(venv / "bin" / "python")]
        for link in find_links:
            cmd += ["--find-links", link]
        if overrides:
            ov = work / f"{package}-{version}.overrides.txt"
            ov.write_text("\n".join(overrides) + "\n")
            cmd += ["--override", str(ov)]
        if DEFAULT_EXCLUDES.get(package):  # what the engine layer leaves out too
            ex = work / f"{package}.excludes.txt"
            ex.write_text("\n".join(DEFAULT_EXCLUDES[package]) + "\n")
            cmd += ["--excludes", str(ex)]
        say(f"installing {package}=={version} with uv into {venv} (minutes: torch and the engine's "
            "kernels are gigabytes)")
        _run([*cmd, f"{package}=={version}"], env, say, f"uv pip install {package}=={version}")
    say(f"reading {package}=={version}'s serve parser")
    done = subprocess.run([str(venv / "bin" / "python"), engine_parser.__file__, package], env=env,
                          capture_output=True, text=True)
    if done.returncode != 0:
        raise click.ClickException(f"{package}=={version}'s parser did not load in {venv}:\n"
                                   f"{done.stderr.strip()[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def gather(package: str, version: str, *, work: Path, uv: str, python: str, overrides: tuple[str, ...],
           find_links: tuple[str, ...] = (), uv_cache: str | None = None, keep: bool = False,
           say: Say = lambda line: None) -> tuple[Pin, str, tuple[str, ...]]:
    """(the pin, its parser's name, the package's releases on PyPI): everything gpuserve
    records of one release, from PyPI and the engine's own parser."""
    work.mkdir(parents=True, exist_ok=True)
    say(f"{package}=={version}: reading PyPI (releases, the wheel's METADATA, torch's)")
    releases, torch, missing = pypi_facts(package, version, work / "wheels")
    built = ("not pinned" if torch is None else f"=={torch[0]} ("
             + (f"CUDA {torch[1]})" if torch[1].isdigit() else f"build {torch[1]})"))
    say(f"{package}=={version}: torch{built}; missing on PyPI: {', '.join(missing) or 'none'}")
    dump = read_parser(package, version, work=work, uv=uv, python=python, overrides=overrides,
                       find_links=find_links, uv_cache=uv_cache, keep=keep, say=say)
    pin = engine_overlay.from_dump(package, version, dump["flags"], torch=torch, missing=missing,
                                   overrides=overrides)
    say(f"{package}=={version}: {len(pin.flags)} flags, {sum(map(bool, pin.specs.values()))} of them "
        "with a type, choices or as a switch")
    return pin, dump["parser"], releases


# --- the command ---------------------------------------------------------------------------------

@click.group()
def engine() -> None:
    """Engine releases: add one to the config repo, from the engine's own parser."""


@engine.command()
@click.argument("pin", metavar="PACKAGE==VERSION")
@click.option("--config-repo", default=".", show_default=True, type=click.Path(file_okay=False),
              help="The config repo's root (the directory you run the plan in); the file goes "
              "into its engines/.")
@click.option("--override", "overrides", multiple=True, metavar="PKG==VER",
              help="A uv override, only to install the release for reading its parser (a "
              "requirement PyPI lacks); recorded in the file. Repeatable.")
@click.option("--uv", default="uv", show_default=True, help="The uv binary.")
@click.option("--python", default="3.11", show_default=True, help="The venv's Python (a system one).")
@click.option("--work", type=click.Path(file_okay=False), default=None,
              help="Where the throwaway venv goes (default: $XDG_CACHE_HOME/gpuserve/engine-add).")
@click.option("--find-links", multiple=True, metavar="DIR|URL", help="Passed to uv pip install.")
@click.option("--keep", is_flag=True, help="Reuse the venv of a former run for this release.")
@click.option("--force", is_flag=True, help="Write over the config repo's file for this release.")
def add(pin: str, config_repo: str, overrides: tuple[str, ...], uv: str, python: str, work: str | None,
        find_links: tuple[str, ...], keep: bool, force: bool) -> None:
    """Add an engine release to the config repo: engines/PACKAGE-VERSION.json, with every serve
    flag of its parser (type, choices, range where the parser has them), its torch pin and CUDA
    major, and what PyPI lacks of it. The plan reads it beside gpuserve's own releases.

    Installs the release with uv into a throwaway venv (minutes). Example:
    gpuserve engine add vllm==0.34.0 --override flashinfer-python==0.7.4
    """
    from gpuserve import __version__

    package, sep, version = pin.partition("==")
    package = canonical(package.strip())
    why = "give PACKAGE==VERSION, e.g. vllm==0.35.0" if not sep else engine_overlay.pin_problem(package, version)
    if why:
        raise click.BadParameter(f"{pin!r}: {why}", param_hint="PACKAGE==VERSION")
    bad = [o for o in overrides if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._-]*==\S+", o)]
    if bad:
        raise click.BadParameter(f"{', '.join(bad)}: give PKG==VER", param_hint="--override")
    if shutil.which(uv) is None:
        raise click.ClickException(f"no uv at {uv!r}: install it (pip install uv) or pass --uv PATH")
    out = Path(config_repo) / engine_overlay.file_name(package, version)
    if out.exists() and not force:
        raise click.ClickException(f"{out} exists; pass --force to write it again")
    started = time.monotonic()

    def say(line: str) -> None:
        click.echo(f"[{time.monotonic() - started:5.0f} s] {line}", err=True)

    found, parser, releases = gather(package, version, work=Path(work) if work else work_dir(), uv=uv,
                                     python=python, overrides=overrides, find_links=find_links,
                                     keep=keep, say=say)
    # PyPI as it was when the parser was read: hosts resolve the engine's requirements as of then
    found = dataclasses.replace(found, resolved_as_of=engine_pins.as_of_now())
    doc = engine_overlay.to_document(found, parser=parser, on_pypi=version in releases,
                                     generated_by=f"gpuserve engine add {pin} (gpuserve {__version__})")
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(doc, indent=1) + "\n")
    click.echo(f"wrote {out}: {package}=={version}, {len(found.flags)} flags; the plan reads it "
               "from the config repo's root")
