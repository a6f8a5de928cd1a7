"""What every bench shares: fresh sandbox hosts on their own instance, the hub serving the tiny
checkpoint on the instance's bridge (in this process, so its byte counters can be read), the
engine's wheelhouse and the proxy's API key, and a table printer.

The benches run the real commands (pyinfra over SSH, the real engine) and print ratios of
quantities measured side by side in the same run: absolute seconds on a shared 2-core machine
say little, ratios say how the thing scales.
"""

from __future__ import annotations

import argparse
import os
import platform
import subprocess
import sys
import tempfile
import time
from contextlib import contextmanager
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from gpuserve_sandbox import network  # noqa: E402
from gpuserve_sandbox.hosts import Sandbox  # noqa: E402
from gpuserve_sandbox.hub import (SANDBOX_PORT, SANDBOX_REPO, SANDBOX_SEED,  # noqa: E402
                                  publish_checkpoint, publish_tiny_checkpoint, serve_in_thread)
from gpuserve_sandbox.runner import PyinfraRun, run_pyinfra  # noqa: E402
from gpuserve_sandbox.services import (ensure_api_keys, ensure_gateway_wheelhouse,  # noqa: E402
                                      ensure_wheelhouse)
from gpuserve_sandbox.simgpu import HostSpec  # noqa: E402
from gpuserve_sandbox.tiny_checkpoint import make_tiny_checkpoint  # noqa: E402

INV = "inventories/sandbox.py"


def arguments(description: str, default_instance: int, hosts: int = 4,
              extra=None) -> argparse.Namespace:
    """The options every bench has; ``extra(parser)`` adds a bench's own."""
    ap = argparse.ArgumentParser(description=description)
    ap.add_argument("--instance", type=int, default=default_instance,
                    help=f"sandbox instance to use (its hosts are replaced; default {default_instance})")
    ap.add_argument("--hosts", type=int, default=hosts, help=f"hosts to bring up (default {hosts})")
    ap.add_argument("--keep", action="store_true", help="leave the hosts up afterwards")
    if extra:
        extra(ap)
    return ap.parse_args()


def machine() -> str:
    cpu = next((line.split(":", 1)[1].strip() for line in open("/proc/cpuinfo")
                if line.startswith("model name")), platform.processor())
    mem = int(next(line.split()[1] for line in open("/proc/meminfo") if line.startswith("MemTotal"))) // 2**20
    rev = subprocess.run(["git", "-C", str(REPO), "rev-parse", "--short", "HEAD"], capture_output=True,
                         text=True).stdout.strip() or "?"
    return f"{os.cpu_count()} cores ({cpu}), {mem} GiB RAM, {platform.platform()}, gpuserve {rev}"


class Fleet:
    def __init__(self, sandbox: Sandbox, hosts, hub, tmp: Path):
        self.sandbox, self.hosts, self.hub = sandbox, hosts, hub
        self.cache = str(tmp / "weights-cache")   # the control node's copy starts empty
        self.certs = tmp / "certs"                  # each host's proxy certificate, for clients
        self.certs.mkdir()

    def pyinfra(self, deploy: str, *extra: str, check: bool = True) -> PyinfraRun:
        run = run_pyinfra(INV, deploy, "--data", f"weights_cache={self.cache}", *extra,
                          instance=self.sandbox.instance)
        return run.check() if check else run

    def limit(self, n: int) -> list[str]:
        """pyinfra arguments that limit a run to the first n hosts."""
        return [arg for h in self.hosts[:n] for arg in ("--limit", h.name)]

    def publish(self, *, seed: int = SANDBOX_SEED, variant: int = 0, repo: str = SANDBOX_REPO,
                branch: str | None = None, hidden_size: int | None = None) -> tuple[str, dict]:
        """A tiny checkpoint as a new commit of ``repo`` (variant k differs from 0 in one shard);
        ``hidden_size`` makes it bigger (512: 33 MB) but then vLLM cannot serve it here."""
        if hidden_size is None:
            return publish_tiny_checkpoint(self.hub.root, repo, seed=seed, variant=variant, branch=branch)
        with tempfile.TemporaryDirectory(prefix="bench-ckpt-") as tmp:
            info = make_tiny_checkpoint(tmp, seed=seed, variant=variant, hidden_size=hidden_size)
            return publish_checkpoint(self.hub.root, repo, tmp, branch=branch), info


@contextmanager
def fleet(args: argparse.Namespace, profile: str = "cpu", extra: tuple[str, ...] = ()):
    """Fresh hosts, the hub in this process, an empty control-node weights cache. ``extra``:
    profiles of more hosts after the ``args.hosts`` of ``profile`` (e.g. "gateway")."""
    sandbox = Sandbox(instance=args.instance)
    t0 = time.monotonic()
    print(f"machine: {machine()}", flush=True)
    ensure_wheelhouse()
    if "gateway" in extra or profile == "gateway":
        ensure_gateway_wheelhouse()   # smg's wheel set, for the gateway hosts
    ensure_api_keys(sandbox.state_dir)
    hosts = sandbox.up([HostSpec.parse(profile)] * args.hosts + [HostSpec.parse(p) for p in extra],
                       services=False)
    network.ensure_bridge(sandbox.instance)
    with tempfile.TemporaryDirectory(prefix="gpuserve-bench-") as tmp:
        root = Path(tmp) / "hub"
        publish_tiny_checkpoint(root, SANDBOX_REPO, seed=SANDBOX_SEED, variant=0)
        hub = serve_in_thread(root, host=sandbox.bridge_ip, port=SANDBOX_PORT)
        print(f"{len(hosts)} sandbox host(s) up on instance {sandbox.instance} in "
              f"{time.monotonic() - t0:.0f} s; hub {hub.url}", flush=True)
        try:
            yield Fleet(sandbox, hosts, hub, Path(tmp))
        finally:
            hub.stop()
            if not args.keep:
                sandbox.down()
            print(f"\nbench ran {time.monotonic() - t0:.0f} s in all", flush=True)


def table(title: str, rows: list[tuple[str, str, str]]) -> None:
    """rows: (what, measured, target)."""
    width = max(len(r[0]) for r in rows)
    mwidth = max(len(r[1]) for r in rows)
    print(f"\n{title}")
    for what, measured, target in rows:
        print(f"  {what.ljust(width)}  {measured.rjust(mwidth)}   {target}")
    sys.stdout.flush()


def median(values: list[float]) -> float:
    v = sorted(values)
    mid = len(v) // 2
    return v[mid] if len(v) % 2 else (v[mid - 1] + v[mid]) / 2
