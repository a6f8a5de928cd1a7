#!/usr/bin/env python3
"""Cold-cache installs of one engine pin in a row: do they give the same files? (issue 25)

    sudo .venv/bin/python dev/venv_determinism.py --runs 5 vllm==0.33.0
    sudo .venv/bin/python dev/venv_determinism.py --runs 3 --override flashinfer-python==0.7.4 vllm==0.34.0

Each run empties uv's cache, makes a fresh venv at the same path (uv venv --relocatable --seed,
the interpreter given by --python), and runs the engine layer's own install command
(``gpuserve.engine.install_command``, with the pin's ``gpuserve.engine.CONSTRAINTS`` and the
--override lines), removes ``gpuserve.engine.STRAY_FILES`` and compiles the bytecode as the build
does (``gpuserve.engine.bytecode``; ``--uv-bytecode``: uv's --compile-bytecode, as gpuserve did
before engine id format 3), then hashes every
file of the venv. It prints, per run: seconds, bytes uv downloaded into its empty cache, files,
the digest of all files without bytecode (``__pycache__``), the digest with it, and the files
that two distributions own (``gpuserve.venv_files``; the build fails on any). ``--no-constraints``
installs the way gpuserve did before issue 25. Run it through /work/slot: it downloads ~9 GB per
run and uses ~20 GB of disk under --work at a time.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from gpuserve import engine as eng  # noqa: E402
from gpuserve import engine_pins, venv_files  # noqa: E402
from gpuserve.engine import bytecode  # noqa: E402


def tree_digest(root: Path, listing: Path | None = None) -> tuple[int, str, str]:
    """(files, sha256 over path+content of every file but bytecode, the same with bytecode);
    ``listing``: also write one ``path sha256`` line per file there (to name what differs)."""
    without, with_pyc = hashlib.sha256(), hashlib.sha256()
    lines = []
    count = 0
    for dirpath, dirnames, files in os.walk(root):
        dirnames.sort()
        for name in sorted(files):
            path = Path(dirpath) / name
            rel = str(path.relative_to(root))
            if path.is_symlink():
                line = f"{rel} -> {os.readlink(path)}\n".encode()
            else:
                with open(path, "rb") as fh:
                    line = f"{rel} {hashlib.file_digest(fh, 'sha256').hexdigest()}\n".encode()
            count += 1
            lines.append(line)
            with_pyc.update(line)
            if "__pycache__" not in rel:
                without.update(line)
    if listing is not None:
        listing.write_bytes(b"".join(lines))
    return count, without.hexdigest(), with_pyc.hexdigest()


def du(path: Path) -> int:
    return int(subprocess.run(["du", "-sb", str(path)], capture_output=True, text=True,
                              check=True).stdout.split()[0])


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("requirement", help="PACKAGE==VERSION, e.g. vllm==0.33.0")
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--override", action="append", default=[], help="a uv --overrides line")
    ap.add_argument("--no-constraints", action="store_true", help="as before issue 25")
    ap.add_argument("--timestamp-bytecode", action="store_true",
                    help="without SOURCE_DATE_EPOCH, as before issue 25 (mtime-stamped .pyc)")
    ap.add_argument("--uv-bytecode", action="store_true",
                    help="uv's --compile-bytecode, as before engine id format 3 (pool-compiled .pyc)")
    ap.add_argument("--resolved-as-of", default=None, metavar="YYYY-MM-DDTHH:MM:SSZ",
                    help="uv --exclude-newer (default: the pin's, gpuserve.engine_pins.PACKAGED_AS_OF)")
    ap.add_argument("--python", default="3.12", help="the venv's Python (the hosts': 3.12)")
    ap.add_argument("--uv", required=True, help="the uv binary (gpuserve's pinned uv_version)")
    ap.add_argument("--work", default="/var/tmp/gpuserve-determinism")
    args = ap.parse_args()
    package, version = args.requirement.split("==")
    spec = eng.EngineSpec(
        engine="sglang" if package == "sglang" else "vllm", package=package, version=version,
        python=args.python, torch_backend="cu130", python_downloads="never", excludes=(),
        kernels=False, uv_version=eng.UV_VERSION, torch_backend_arg=False,
        constraints=() if args.no_constraints else eng.default_constraints(package),
        # as the layer: PyPI as of when the pin was checked (torch from PyPI here)
        resolved_as_of=args.resolved_as_of or engine_pins.resolved_as_of(package, version))
    work = Path(args.work)
    cache, venv = work / "cache", work / "venv"
    env = {**os.environ, "UV_NO_CONFIG": "1", "UV_CACHE_DIR": str(cache),
           "UV_PYTHON_DOWNLOADS": "never", "UV_LINK_MODE": "hardlink"}
    if not args.timestamp_bytecode:  # the layer's own (gpuserve.engine.uv_environment)
        env["SOURCE_DATE_EPOCH"] = eng.uv_environment(spec)["SOURCE_DATE_EPOCH"]
    print(f"# {args.requirement} constraints={list(spec.constraints)} overrides={args.override} "
          f"python={args.python} uv={args.uv} resolved_as_of={spec.resolved_as_of} "
          f"SOURCE_DATE_EPOCH={env.get('SOURCE_DATE_EPOCH')} "
          f"bytecode={'uv --compile-bytecode' if args.uv_bytecode else 'gpuserve.engine.bytecode'}",
          flush=True)
    results = []
    for run in range(1, args.runs + 1):
        shutil.rmtree(cache, ignore_errors=True)
        shutil.rmtree(venv, ignore_errors=True)
        subprocess.run([args.uv, "venv", "-q", "--relocatable", "--seed", "--no-managed-python",
                        "--python", args.python, str(venv)], check=True, env=env)
        if spec.constraints:
            Path(eng.constraints_path(str(venv))).write_text("\n".join(spec.constraints) + "\n")
        cmd = eng.install_command(spec, args.uv, str(venv))
        if args.uv_bytecode:
            cmd.insert(cmd.index("install") + 1, "--compile-bytecode")
        if args.override:
            ov = work / "overrides.txt"
            ov.write_text("\n".join(args.override) + "\n")
            cmd[-1:-1] = ["--overrides", str(ov)]
        started = time.monotonic()
        done = subprocess.run(cmd, env=env, capture_output=True, text=True)
        if done.returncode != 0:
            print(done.stderr[-3000:])
            return 1
        site = next((venv / "lib").glob("python3*/site-packages"))
        for stray in eng.STRAY_FILES:
            (site / stray).unlink(missing_ok=True)
        if not args.uv_bytecode:  # the build's own step, after the install (build_script)
            python = site.parent.name.removeprefix("python")
            done = subprocess.run(bytecode.compile_command(str(venv), python), env=env,
                                  capture_output=True, text=True)
            if done.returncode != 0:
                print(done.stderr[-3000:])
                return 1
            print("  " + done.stdout.strip(), flush=True)
        seconds = time.monotonic() - started
        shared = venv_files.report(str(site))
        count, digest, digest_pyc = tree_digest(venv, work / f"run-{run}.files")
        row = {"run": run, "seconds": round(seconds, 1), "downloaded_bytes": du(cache),
               "venv_bytes": du(venv), "files": count, "digest": digest[:16],
               "digest_with_bytecode": digest_pyc[:16], "shared_files": len(shared)}
        results.append(row)
        print(json.dumps(row), flush=True)
        for line in shared[:5]:
            print("  shared:", line)
    first = set((work / "run-1.files").read_text().splitlines())
    differing = sorted({line.split(" ")[0] for r in results[1:] for line in
                        set((work / f"run-{r['run']}.files").read_text().splitlines()) ^ first})
    print(f"files that differ from run 1 in some run: {len(differing)}")
    for path in differing[:20]:
        print("  ", path)
    same = len({r["digest"] for r in results}) == 1
    same_pyc = len({r["digest_with_bytecode"] for r in results}) == 1
    print(f"RESULT {args.requirement}: {len(results)} cold installs, identical files "
          f"(without bytecode): {same}, identical with bytecode: {same_pyc}, files owned twice: "
          f"{sorted({r['shared_files'] for r in results})}")
    shutil.rmtree(cache, ignore_errors=True)
    shutil.rmtree(venv, ignore_errors=True)
    return 0 if same else 2


if __name__ == "__main__":
    sys.exit(main())
