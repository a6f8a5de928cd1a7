"""Small helpers shared by the sandbox modules."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Sequence

from gpuserve.locks import file_lock  # noqa: F401 - the sandbox's modules import it from here


class SandboxError(RuntimeError):
    """A sandbox operation failed; the message says what and how to recover."""


def log(message: str) -> None:
    print(f"sandbox: {message}", file=sys.stderr, flush=True)


def run(cmd: Sequence[str], *, check: bool = True, timeout: float | None = None,
        input: str | None = None, cwd: Path | str | None = None,
        text: bool = True) -> subprocess.CompletedProcess:
    """Run a command on this machine; on failure raise SandboxError with its output."""
    try:
        proc = subprocess.run(list(cmd), capture_output=True, text=text, timeout=timeout, input=input, cwd=cwd)
    except FileNotFoundError as exc:
        raise SandboxError(f"{cmd[0]} is not installed here: run dev/bootstrap.sh") from exc
    if check and proc.returncode != 0:
        out = (proc.stderr or proc.stdout)
        out = (out if text else out.decode(errors="replace")).strip()[-2000:]
        raise SandboxError(f"`{' '.join(cmd)}` failed (exit {proc.returncode}): {out}")
    return proc
