"""What this machine provides a sandbox instance besides its hosts, so that a converge of
inventories/sandbox.py works with no network beyond the package registries:

    the hub       a Hugging Face look-alike on <bridge>:8900 serving the tiny test checkpoint
                  at the sha group_data/sandbox.py pins (and variant 1, tag "v1", to try bumps)
    the wheels    the engine pin's wheelhouse (built once per machine, kept across runs)
    the API key   <instance dir>/api-keys, the client key the sandbox's proxy accepts
(The stand-in NVIDIA/AMD apt repositories are standin_repo's.)
"""

from __future__ import annotations

import os
import platform
import secrets
import signal
import subprocess
import sys
import time
from pathlib import Path

from gpuserve_sandbox import network
from gpuserve_sandbox.hub import SANDBOX_PORT, SANDBOX_REPO, SANDBOX_SEED, publish_tiny_checkpoint
from gpuserve_sandbox.util import SandboxError, file_lock, log

REPO_ROOT = Path(__file__).resolve().parents[2]   # the checkout: sandbox/gpuserve_sandbox/services.py


def sandbox_group_data() -> dict:
    """group_data/sandbox.py's values: the one place the sandbox's pins are written down."""
    data: dict = {}
    exec(compile((REPO_ROOT / "group_data/sandbox.py").read_text(), "group_data/sandbox.py", "exec"), data)
    return data


def api_keys_path(state_dir: Path) -> Path:
    return state_dir / "api-keys"


def ensure_api_keys(state_dir: Path) -> Path:
    """One random client key for the sandbox's proxy (0600), made once per instance."""
    path = api_keys_path(state_dir)
    if not path.is_file():
        state_dir.mkdir(parents=True, exist_ok=True)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as fh:
            fh.write(f"sandbox-{secrets.token_urlsafe(24)}\n")
    return path


def ensure_wheelhouse():
    """The wheel set (gpuserve.wheelhouse.WheelSet) of the sandbox's engine pin; downloaded once (about a minute, ~900 MB).
    torch's CPU build comes from pip's own configuration here; elsewhere set
    GPUSERVE_TORCH_INDEX (e.g. https://download.pytorch.org/whl/cpu)."""
    from gpuserve.engine import UV_VERSION
    from gpuserve.wheelhouse import build_set

    data = sandbox_group_data()
    return build_set(data["wheelhouse"], data["engine_package"], data["engine_version"],
                     data["python_version"], data["torch_backend"], platform.machine(), UV_VERSION,
                     torch_index=os.environ.get("GPUSERVE_TORCH_INDEX") or None)


def ensure_gateway_wheelhouse():
    """smg's wheel set (docs/gateway.md) beside the engine's, for the sandbox's gateway hosts."""
    from gpuserve.engine import UV_VERSION
    from gpuserve.gateway import SMG_PACKAGE, SMG_VERSION
    from gpuserve.wheelhouse import build_set

    data = sandbox_group_data()
    return build_set(data["wheelhouse"], SMG_PACKAGE, SMG_VERSION, data["python_version"], "none",
                     platform.machine(), UV_VERSION, torch_index=None)


def publish_sandbox_checkpoints(root: Path) -> str:
    """The tiny checkpoint at the pinned sha (main), and variant 1 tagged ``v1``."""
    publish_tiny_checkpoint(root, SANDBOX_REPO, seed=SANDBOX_SEED, variant=1, branch="v1")
    sha, _ = publish_tiny_checkpoint(root, SANDBOX_REPO, seed=SANDBOX_SEED, variant=0)
    return sha


def start_hub(state_dir: Path, instance: int) -> str:
    """The instance's hub on its bridge address (a background process, stopped by stop_hub)."""
    addr = network.bridge_ip(instance)
    base = state_dir / "hub"
    url = f"http://{addr}:{SANDBOX_PORT}"
    with file_lock(state_dir / "hub.lock"):
        if network.pid_alive(base / "server.pid") and network.port_open(addr, SANDBOX_PORT):
            return url
        pinned = sandbox_group_data()["model_revision"]
        sha = publish_sandbox_checkpoints(base / "repos")
        if sha != pinned:
            raise SandboxError(f"the tiny checkpoint hashes to {sha} but group_data/sandbox.py pins "
                               f"{pinned}: regenerate the pin (sandbox/tests/test_sandbox_pin.py)")
        out = open(base / "server.log", "ab")
        proc = subprocess.Popen(
            [sys.executable, "-m", "gpuserve_sandbox.hub", "--root", str(base / "repos"),
             "--bind", addr, "--port", str(SANDBOX_PORT)],
            stdin=subprocess.DEVNULL, stdout=out, stderr=out, start_new_session=True)
        (base / "server.pid").write_text(str(proc.pid))
        for _ in range(100):
            if network.port_open(addr, SANDBOX_PORT):
                log(f"hub: {url} serving {SANDBOX_REPO}@{sha[:8]} (main) and v1")
                return url
            if proc.poll() is not None:
                break
            time.sleep(0.1)
    raise SandboxError(f"the sandbox hub did not start on {url}; see {base / 'server.log'}")


def stop_hub(state_dir: Path) -> None:
    network.signal_pidfile(state_dir / "hub" / "server.pid", signal.SIGTERM)
    (state_dir / "hub" / "server.pid").unlink(missing_ok=True)
