"""What ``gpuserve status`` asks a host (gpuserve/status.py renders it): a deployment's /health
and models, a unit's state and result, several units' at once, a watchdog's counters. Read-only."""

from __future__ import annotations

import json

from pyinfra.api import FactBase

from gpuserve.monitoring import TEXTFILE_DIR
from gpuserve.release_files import GATE, secrets_env_path


class EngineStatus(FactBase):
    """/health and the served model ids of one deployment, asked on the host (the API key is read
    there from the 0600 secrets file, never put in a command line)."""

    def command(self, deployment: str, url: str) -> str:
        return (f"test -x {GATE} && {GATE} --status --url {url} --model - "
                f"--secrets {secrets_env_path(deployment)} || echo '{{}}'")

    def process(self, output: list[str]) -> dict:
        try:
            return json.loads(output[-1])
        except (ValueError, IndexError):
            return {}


class UnitResult(FactBase):
    """(ActiveState, Result) of one systemd unit: ("failed", "start-limit-hit") once it gave up."""

    def command(self, unit: str) -> str:
        return f"systemctl show -p ActiveState -p Result {unit} 2>/dev/null || true"

    def process(self, output: list[str]) -> tuple[str, str]:
        # systemctl prints the properties in its own order, not the order asked: by name
        props = dict(line.split("=", 1) for line in output if "=" in line)
        return props.get("ActiveState", ""), props.get("Result", "")


class UnitStates(FactBase):
    """{unit: (ActiveState, Result)} of several units in one command ("not-found" for a unit
    that is not installed)."""

    def command(self, units: str) -> str:
        return f"systemctl show -p Id -p LoadState -p ActiveState -p Result {units} 2>/dev/null || true"

    def process(self, output: list[str]) -> dict[str, tuple[str, str]]:
        out: dict[str, tuple[str, str]] = {}
        props: dict[str, str] = {}
        for line in [*output, ""]:
            if "=" in line:
                key, _, value = line.partition("=")
                props[key] = value
            elif props:
                state = "not-found" if props.get("LoadState") == "not-found" else props.get("ActiveState", "")
                out[props.get("Id", "")] = (state, props.get("Result", ""))
                props = {}
        return out


class WatchdogCounts(FactBase):
    """(restarts, gave up) the watchdog of one deployment reports in its textfile metrics."""

    def command(self, deployment: str) -> str:
        return f"cat {TEXTFILE_DIR}/gpuserve-{deployment}.prom 2>/dev/null || true"

    def process(self, output: list[str]) -> tuple[int, bool]:
        restarts, gave_up = 0, False
        for line in output:
            name, _, value = line.rpartition(" ")
            if name.startswith("gpuserve_watchdog_restarts_total{"):
                restarts = int(float(value))
            elif name.startswith("gpuserve_watchdog_gave_up{"):
                gave_up = value.strip() == "1"
        return restarts, gave_up
