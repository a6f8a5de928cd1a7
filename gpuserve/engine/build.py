"""The whole build of one venv as one POSIX shell script: locked, into ``.partial``, verified,
renamed onto the final path."""

from __future__ import annotations

import json
import posixpath
import shlex

from gpuserve.engine.bytecode import compile_command
from gpuserve.engine.spec import LOG_DIR, STRAY_FILES, EngineSpec
from gpuserve.engine.uv import (
    constraints_path, install_command, kernels_command, kernels_environment, overrides_path,
    uv_environment, venv_command)
from gpuserve.engine.verify import verify_code

def build_script(spec: EngineSpec, uv: str, wheelhouse: str | None = None) -> str:
    """The whole build of one venv as one POSIX shell script (one operation).

    Safe to rerun, and to run twice at once: a lock per id serializes builds; a venv already
    at the final path ends the script; a leftover ``.partial`` is removed and rebuilt. Once it
    holds the lock, the build writes only to its log (``LOG_DIR``) and hands the log to the
    caller at the end: when the caller dies (kill -9 of pyinfra, a dropped connection) the
    build never writes to a closed connection, so it finishes on its own and the next run,
    waiting on the lock, finds the venv built."""
    return "\n".join([*_locked_start(spec), *_install(spec, uv, wheelhouse), *_verify_and_rename(spec)])


def _run(argv: list[str]) -> str:
    return " ".join(shlex.quote(a) for a in argv)


def _locked_start(spec: EngineSpec) -> list[str]:
    """Take the id's lock (waiting for another build), end when the venv is built already, send
    everything after to the log, remove a leftover ``.partial`` and export uv's environment."""
    q = shlex.quote
    env = " ".join(f"{k}={q(v)}" for k, v in uv_environment(spec).items())
    return [
        "set -eu",
        "umask 022",
        "started=$(date +%s)",
        f"final={q(spec.env_dir)}",
        f"partial={q(spec.partial_dir)}",
        f"log={q(spec.log_file)}",
        f"mkdir -p {q(LOG_DIR)}",
        f"exec 9>{q(spec.lock_file)}",
        "if ! flock -n 9; then",
        f"  echo {q(f'gpuserve: another build of {spec.id} holds its lock (a killed run may have left it running): waiting')}",
        "  flock -w 7200 9",
        "fi",
        'if [ -d "$final" ]; then echo "gpuserve: $final is already built"; exit 0; fi',
        'exec 3>&2 >"$log" 2>&1',
        """trap 'rc=$?; cat "$log" >&3 2>/dev/null || true; exit $rc' EXIT""",
        'step() { echo "gpuserve: [$(( $(date +%s) - started )) s] $*"; }',
        'if [ -e "$partial" ]; then step "removing $partial, left by an interrupted build"; rm -rf "$partial"; fi',
        f"export {env}",
    ]


def _install(spec: EngineSpec, uv: str, wheelhouse: str | None) -> list[str]:
    """Into ``.partial``: the venv, the engine at its pin (with the excludes, overrides and
    constraints files it reads), stray files removed, vLLM's kernels where the spec wants them,
    and last the bytecode of everything in it, in fixed chunks (``gpuserve.engine.bytecode``)."""
    q = shlex.quote
    partial = spec.partial_dir
    excludes_file = posixpath.join(partial, "gpuserve-excludes.txt")
    constraints_file = constraints_path(partial)
    lines = []
    if spec.python_downloads == "never":
        lines.append(
            f"command -v python{spec.python} >/dev/null || {{ echo 'gpuserve: python_downloads is "
            f"never and this host has no python{spec.python}: install it, or allow uv-managed "
            f"Pythons (python_downloads = \"automatic\")'; exit 1; }}")
    if wheelhouse:
        # the pushed wheels are the ones the control node hashed (a kill mid-push leaves a short file)
        lines += ['step "checking the pushed wheels (sha256)"',
                  f"(cd {q(wheelhouse)} && sha256sum --quiet --strict --ignore-missing -c SHA256SUMS)"]
    lines += ['step "uv venv"', _run(venv_command(spec, uv, partial, wheelhouse))]
    if spec.excludes:
        lines.append(f"printf '%s\\n' {' '.join(q(e) for e in spec.excludes)} > {q(excludes_file)}")
    if spec.overrides:
        lines.append(f"printf '%s\\n' {' '.join(q(o) for o in spec.overrides)} > {q(overrides_path(partial))}")
    if spec.constraints:
        lines.append(f"printf '%s\\n' {' '.join(q(c) for c in spec.constraints)} > {q(constraints_file)}")
    lines += [f'step "uv pip install {spec.requirement}"',
              _run(install_command(spec, uv, partial, wheelhouse, excludes_file, constraints_file))]
    if STRAY_FILES:
        site = posixpath.join(partial, "lib", f"python{spec.python}", "site-packages")
        lines += [f'step "removing stray top-level files two wheels ship: {" ".join(STRAY_FILES)}"',
                  "rm -f " + " ".join(q(posixpath.join(site, f)) for f in STRAY_FILES)]
    kernels = kernels_command(spec, partial)
    if kernels:
        kenv = " ".join(f"{k}={q(v)}" for k, v in kernels_environment(wheelhouse).items())
        lines += ['step "vllm download-kernels"', f"{kenv} {_run(kernels)}".strip()]
    lines += ['step "bytecode: every source of site-packages, in fixed chunks"',
              _run(compile_command(partial, spec.python))]
    return lines


def _verify_and_rename(spec: EngineSpec) -> list[str]:
    """Verify the venv (``verify_code``), record what it is, sync, and rename it onto the final path."""
    q = shlex.quote
    return [
        f'step "verify: import {spec.import_name}, {spec.package} is {spec.version}, '
        f'load its native modules"',
        f"VLLM_NO_USAGE_STATS=1 DO_NOT_TRACK=1 HF_HUB_OFFLINE=1 "
        f"\"$partial/bin/python\" -c {q(verify_code(spec))}",
        f"printf '%s\\n' {q(json.dumps(spec.record(), sort_keys=True))} > \"$partial/gpuserve-engine.json\"",
        'step "sync"',
        'sync -f "$partial"',  # the data is on disk before the name says "complete"
        'mv -T "$partial" "$final"',
        'step "built $final"',
    ]
