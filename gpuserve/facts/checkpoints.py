"""What a host holds of a model repository: the ``CheckpointState`` fact, and how the control node
runs ``gpuserve.weights`` on a host.

Hosts get no gpuserve install: the source of every module in ``HOST_MODULES`` (standard library
only) travels inside the command, compressed, and runs with the host's ``python3`` (>= 3.9). Each
module but the last is loaded under its own name first (``weights.py`` imports it by that name where
there is no gpuserve package); the last runs as the program::

    python3 -c 'import base64,sys,types,zlib;u=lambda s:zlib.decompress(base64.b64decode(s));
        m=sys.modules["weights_manifest"]=types.ModuleType("weights_manifest");exec(u("..."),m.__dict__);
        exec(u("..."))' scan <dir> <sha> changed
"""

from __future__ import annotations

import base64
import functools
import json
import shlex
import zlib
from pathlib import Path
from types import ModuleType
from typing import Any

from pyinfra.api import FactBase

from gpuserve import layout, weights, weights_manifest

# What a host runs of gpuserve, each module after the ones it imports: the command below carries them
# all, and the fan-out installs them all in layout.AGENT_DIR (gpuserve.layers.fanout).
HOST_MODULES = (weights_manifest, weights)


def _packed(module: ModuleType) -> str:
    return base64.b64encode(zlib.compress(Path(module.__file__).read_bytes(), 9)).decode()


@functools.lru_cache(maxsize=1)
def _boot() -> str:
    *imported, program = HOST_MODULES
    parts = ["import base64,sys,types,zlib", "u=lambda s:zlib.decompress(base64.b64decode(s))"]
    for module in imported:
        name = module.__name__.rpartition(".")[2]
        parts.append(f'm=sys.modules["{name}"]=types.ModuleType("{name}");exec(u("{_packed(module)}"),m.__dict__)')
    parts.append(f'exec(u("{_packed(program)}"))')
    return ";".join(parts)


def host_command(*args: str) -> str:
    """The shell command that runs ``gpuserve.weights.main(args)`` on a host."""
    return " ".join(["python3", "-c", shlex.quote(_boot()), *(shlex.quote(a) for a in args)])


def parse_output(lines: list[str]) -> dict[str, Any]:
    """The JSON object ``gpuserve.weights.main`` printed (its last line)."""
    for line in reversed(lines):
        line = line.strip()
        if line.startswith("{"):
            return json.loads(line)
    raise ValueError("no JSON result in the output: " + " | ".join(lines[-5:]))


class CheckpointState(FactBase):
    """One revision of a model repository on the host (``gpuserve.weights.scan``).

    ``{"status": "complete" | "partial" | "absent", "broken": [...], "refresh": [...],
    "complete": [shas], "partials": [shas], "free_bytes", "free_path", "have": [...],
    "incoming": {path: bytes}, "links": {sha256: path relative to the repo dir}}``, or
    ``{"error": "..."}`` when the host cannot tell. ``verify="full"`` hashes every file of a
    complete revision (slow on a real checkpoint: that is the point of asking for it).
    """

    requires_command = "python3"

    def command(self, repo_dir: str, sha: str, verify: str = "changed") -> str:
        # `|| true`: a failure still prints {"error": ...}, which process() passes on
        return f"{host_command('scan', repo_dir, sha, verify)} || true"

    def process(self, output: list[str]) -> dict[str, Any]:
        try:
            return parse_output(output)
        except ValueError as exc:
            return {"error": str(exc)}


class FanoutProgress(FactBase):
    """The fan-out agent's progress files in one model repository directory (``weights_fanout =
    "hosts"``): a list of their JSON documents, one per revision staged that way, newest first."""

    def command(self, repo_dir: str) -> str:
        pattern = layout.fanout_progress(shlex.quote(repo_dir), "*")
        return (f"ls -t {pattern} 2>/dev/null | while read -r f; do tr -d '\\n' < \"$f\"; echo; done; "
                "true")

    def process(self, output: list[str]) -> list[dict[str, Any]]:
        docs = []
        for line in output:
            try:
                doc = json.loads(line)
            except ValueError:
                continue
            if isinstance(doc, dict):
                docs.append(doc)
        return docs
