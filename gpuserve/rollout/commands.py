"""The commands of a move, run as root on the host: the drain flag, the release pointers, the
engine unit's stop and start, its running-request gauges. Pure (strings in, strings out);
gpuserve.rollout.pipeline and the service layer run them."""

from __future__ import annotations

import shlex

from gpuserve import layout


def drain_flag(deployment: str) -> str:
    """While this file exists the proxy's /health answers 503: load balancers take the host out.
    (Beside the proxy's configuration: nginx's workers must be able to see it.)"""
    return f"{layout.DRAIN_FLAG_DIR}/{deployment}.drain"


def pointer_commands(deployment: str, current: str, previous: str | None) -> list[str]:
    """Point current (and previous) at releases; each an atomic rename over the old link."""
    d = layout.deployment_dir(deployment)
    commands = [f"test -f {d}/releases/{current}/release.json",
                f"ln -sfn releases/{current} {d}/.current.new && mv -T {d}/.current.new {d}/current"]
    if previous:
        commands.append(f"ln -sfn releases/{previous} {d}/.previous.new && "
                        f"mv -T {d}/.previous.new {d}/previous")
    return commands


def out_of_rotation(deployment: str) -> str:
    return f"touch {drain_flag(deployment)}"


def into_rotation(deployment: str) -> str:
    return f"rm -f {drain_flag(deployment)}"


RUNNING_METRICS = ("vllm:num_requests_running", "sglang:num_running_reqs")


def running_requests(metrics_url: str) -> str:
    """Print the engine's running-request gauges (vLLM's or SGLang's), one sample per line."""
    pattern = "|".join(RUNNING_METRICS)
    return (f"curl -fsS --max-time 5 {shlex.quote(metrics_url)} | "
            f"grep -E {shlex.quote('^(' + pattern + ')[{ ]')} || true")


def parse_running(text: str) -> int:
    """Sum of the running-request samples that ``running_requests`` printed (0 when none)."""
    total = 0.0
    for line in text.splitlines():
        parts = line.rsplit(None, 1)
        if len(parts) == 2 and parts[0].split("{", 1)[0] in RUNNING_METRICS:
            try:
                total += float(parts[1])
            except ValueError:
                continue
    return int(total)


def stop(deployment: str) -> str:
    """systemd sends SIGTERM to the engine only; in-flight requests get --shutdown-timeout s."""
    return f"systemctl stop {layout.unit_name(deployment)}"


def start(deployment: str) -> str:
    unit = layout.unit_name(deployment)
    return f"systemctl reset-failed {unit} 2>/dev/null; systemctl start --no-block {unit}"


def read_pointers(deployment: str) -> str:
    d = layout.deployment_dir(deployment)
    return f"echo \"$(readlink {d}/current) $(readlink {d}/previous)\""
