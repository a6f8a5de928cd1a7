"""The readiness gate of a move, run on another host from inside the rollout's one operation:
/health, /v1/models, a chat completion and, where the recipe enables tools, a tool call
(gpuserve-gate on the host), bounded by the deployment's ready_timeout_s."""

from __future__ import annotations

from typing import TYPE_CHECKING

from gpuserve.release_files import gate_command, tools_enabled
from gpuserve.rollout.remote import COMMAND_TIMEOUT_S, shell

if TYPE_CHECKING:
    from gpuserve.config import HostSettings


def gate(h, s: HostSettings, dep_name: str) -> tuple[bool, str]:
    """(passed, the gate's last line of output)."""
    dep = s.deployment(dep_name)
    ok, output = shell(h, gate_command(dep, tool=tools_enabled(s.serve_configs[dep_name]), timeout=dep.ready_timeout_s),
                       timeout=dep.ready_timeout_s + COMMAND_TIMEOUT_S)
    return ok, (output.stderr.strip().splitlines() or ["no output"])[-1]
