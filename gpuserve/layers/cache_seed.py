"""Warm engine caches across hosts (issue 24): a step before an engine's start, one after its gate.

Before a deployment's engine starts on a new release, ``seed`` unpacks the fleet's seed for that
release and hardware into the host's cache dir, if the control node holds one; after its gate
passed, ``publish`` stores the host's cache dir as that seed, if none is stored yet (the first
host of a release and hardware: a canary, gpuserve.rollout). Names and commands are pure
(gpuserve.engine_cache); these run them through bounded commands (gpuserve.rollout.remote).
Neither step can fail a move or a converge: a seed only saves compile time, so a failed transfer
is logged and the engine starts (or stays) as it would have without it.

A rollout's move calls them directly (gpuserve.layers.rollout). A converge (the service layer,
gpuserve.layers.units) adds them as ``python.call`` operations, so ``--dry`` shows them, only
where they would do something: ``seed_operation`` when the store holds a seed this host's
marker does not name, ``publish_operation`` on the first host of the run with this hardware
when the store holds no seed yet. A second run adds neither.
"""

from __future__ import annotations

import os
import re

from pyinfra import host, logger
from pyinfra.context import ctx_host, ctx_state
from pyinfra.facts.files import FindInFile
from pyinfra.operations import python

from gpuserve import engine_cache, layout
from gpuserve.config import HostSettings
from gpuserve.layers.context import all_settings
from gpuserve.rollout import remote
from gpuserve.rollout.remote import MoveFailed, run

UPLOAD = layout.CACHE_SEED_UPLOAD


def _key(s: HostSettings, release: str) -> str:
    return engine_cache.seed_key(release, s.hardware.gpu_model, s.hardware.gpu_count)


def _transfer(h, method: str, *args, size: int) -> None:
    remote.transfer(h, method, *args, what="moving an engine-cache seed",
                    timeout=engine_cache.transfer_timeout_s(size))


def seed(h, s: HostSettings, deployment: str, release: str) -> None:
    """Before the engine starts on ``release``: the fleet's seed into the host's cache dir."""
    key = _key(s, release)
    path = engine_cache.seed_file(s.weights_cache, deployment, key)
    if not os.path.isfile(path):
        return
    size = os.path.getsize(path)
    cache = layout.cache_dir(s.nvme_path, deployment)
    try:
        _transfer(h, "put_file", path, UPLOAD, size=size)
        said = run(h, engine_cache.unpack_command(cache, UPLOAD, key, layout.SERVICE_USER)).strip()
    except MoveFailed as exc:
        logger.warning(f"    [{h.name}] {deployment}: not seeded from the fleet's engine caches "
                       f"({exc}); the engine compiles on its own")
        return
    if said == "seeded":
        logger.info(f"    [{h.name}] {deployment}: engine caches seeded from the fleet's seed for "
                    f"{key} ({size / 2**20:.1f} MiB)")


def publish(h, s: HostSettings, deployment: str, release: str) -> None:
    """After the gate passed on ``release``: the host's cache dir as the seed of its release and
    hardware, unless the control node holds one already. Written beside, then renamed (a reader
    never sees half a seed); older seeds of the same hardware beyond the newest
    ``engine_cache.KEEP_PER_HARDWARE`` go."""
    key = _key(s, release)
    path = engine_cache.seed_file(s.weights_cache, deployment, key)
    if os.path.isfile(path):
        return
    tmp_remote = f"{UPLOAD}.{deployment}.out"
    tmp_local = f"{path}.{os.getpid()}.part"
    try:
        size = int(run(h, engine_cache.pack_command(layout.cache_dir(s.nvme_path, deployment),
                                                    tmp_remote)).split()[-1])
        os.makedirs(os.path.dirname(path), exist_ok=True)
        _transfer(h, "get_file", tmp_remote, tmp_local, size=size)
        os.replace(tmp_local, path)
    except (MoveFailed, ValueError, IndexError, OSError) as exc:
        logger.warning(f"    [{h.name}] {deployment}: its engine caches were not published as the "
                       f"fleet's seed ({exc})")
        return
    finally:
        if os.path.exists(tmp_local):
            os.unlink(tmp_local)
        try:
            run(h, f"rm -f {tmp_remote}")
        except MoveFailed:
            pass
    store = os.path.dirname(path)
    entries = [(n, os.path.getmtime(os.path.join(store, n))) for n in os.listdir(store)]
    for name in engine_cache.stale_seeds(entries, key):
        os.unlink(os.path.join(store, name))
    logger.info(f"    [{h.name}] {deployment}: its engine caches are now the fleet's seed for {key} "
                f"({size / 2**20:.1f} MiB); the hosts moved after it start from them")


# --- in a converge -------------------------------------------------------------------------------

def seed_operation(s: HostSettings, deployment: str, release: str) -> None:
    """Before this host's engine first starts ``release``: ``seed`` as an operation, when the
    store holds a seed for it that this host has not unpacked."""
    key = _key(s, release)
    if not os.path.isfile(engine_cache.seed_file(s.weights_cache, deployment, key)):
        return
    marker = f"{layout.cache_dir(s.nvme_path, deployment)}/{engine_cache.MARKER}"
    if host.get_fact(FindInFile, path=marker, pattern=f"^{re.escape(key)}$"):
        return
    python.call(name=f"{deployment}: engine caches from the fleet's seed for {key}",
                function=seed, h=ctx_host.get(), s=s, deployment=deployment, release=release)


def publish_operation(s: HostSettings, deployment: str, release: str) -> None:
    """After this host's gate on ``release``: ``publish`` as an operation, when the store holds
    no seed for it and this host is the run's first with this deployment on this hardware."""
    key = _key(s, release)
    if os.path.isfile(engine_cache.seed_file(s.weights_cache, deployment, key)):
        return
    state, settings = ctx_state.get(), all_settings()
    hw = (s.hardware.gpu_model, s.hardware.gpu_count)
    first = next((h.name for h in state.inventory if h in state.active_hosts and h.name in settings
                  and settings[h.name].serves
                  and (settings[h.name].hardware.gpu_model, settings[h.name].hardware.gpu_count) == hw
                  and any(d.name == deployment for d in settings[h.name].deployments)), None)
    if first != host.name:
        return
    python.call(name=f"{deployment}: engine caches published as the fleet's seed for {key}",
                function=publish, h=ctx_host.get(), s=s, deployment=deployment, release=release)
