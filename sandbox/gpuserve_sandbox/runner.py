"""Run the real `pyinfra` command against a sandbox instance and read its results table.

Tests and benches use this so they exercise exactly what users type.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

REPO = Path(__file__).resolve().parents[2]   # the checkout: sandbox/gpuserve_sandbox/runner.py
_HOST_ERROR = re.compile(r"^\s+\[[^\]]+\] Error")
_TOTAL = re.compile(r"^\s*Grand total\s+(\d+|-)\s+(\d+|-)\s+(\d+|-)\s+(\d+|-)\s*$", re.M)


@dataclass
class PyinfraRun:
    args: list[str]
    returncode: int
    output: str
    seconds: float

    def _total(self, column: int) -> int:
        m = _TOTAL.findall(self.output)
        if not m:
            raise AssertionError(f"no results table in pyinfra output:\n{self.output[-3000:]}")
        value = m[-1][column]
        return 0 if value == "-" else int(value)

    @property
    def changed(self) -> int:
        """Operations that changed something (pyinfra's "Success" column)."""
        return self._total(1)

    @property
    def errors(self) -> int:
        return self._total(2)

    @property
    def unchanged(self) -> int:
        return self._total(3)

    def failures(self, limit: int = 80) -> list[str]:
        """The operations that failed, each with what pyinfra printed under it (the commands'
        output, then ``[host] Error: ...``). The results table at the end only counts them."""
        out: list[str] = []
        section: list[str] = []
        for line in self.output.splitlines() + ["--> end"]:
            if line.startswith("-->"):
                if any(_HOST_ERROR.match(s) for s in section):
                    out += section
                section = [line] if line.startswith("--> Starting operation") else []
            elif section:
                section.append(line)
        return out[-limit:]

    def check(self) -> "PyinfraRun":
        if self.returncode != 0:
            failed = "\n".join(self.failures()) or "(no failed operation printed)"
            raise AssertionError(f"pyinfra {' '.join(self.args)} exited {self.returncode}.\n"
                                 f"Failed operations and their output:\n{failed}\n"
                                 f"The end of its output:\n{self.output[-4000:]}")
        return self


def run_pyinfra(inventory: str, deploy: str, *extra: str, instance: int | None = None,
                env: dict | None = None, timeout: float = 1800) -> PyinfraRun:
    """`pyinfra -y <inventory> <deploy> <extra>` from the repository root."""
    args = ["-y", inventory, deploy, *extra]
    full_env = {**os.environ, **(env or {})}
    if instance is not None:
        full_env["GPUSERVE_SANDBOX_INSTANCE"] = str(instance)
    pyinfra = Path(sys.executable).with_name("pyinfra")
    t0 = time.monotonic()
    proc = subprocess.run([str(pyinfra), *args], cwd=REPO, env=full_env, capture_output=True,
                          text=True, timeout=timeout)
    return PyinfraRun(args, proc.returncode, proc.stdout + proc.stderr, time.monotonic() - t0)


@contextmanager
def pyinfra_in_background(inventory: str, deploy: str, *extra: str, instance: int,
                          log) -> Iterator[subprocess.Popen]:
    """`pyinfra -y <inventory> <deploy> <extra>` started in a session of its own, its output to
    ``log``: for a test that acts while it runs. Whatever the test does, the run is gone when the
    block ends (its whole process group killed if it is still running)."""
    pyinfra = Path(sys.executable).with_name("pyinfra")
    proc = subprocess.Popen([str(pyinfra), "-y", inventory, deploy, *extra], cwd=REPO, stdout=log,
                            stderr=subprocess.STDOUT, start_new_session=True,
                            env={**os.environ, "GPUSERVE_SANDBOX_INSTANCE": str(instance)})
    try:
        yield proc
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
