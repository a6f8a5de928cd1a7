"""Where things live on a served host. One place, so every layer and every test agrees.

    /opt/gpuserve/envs/<engine-id>/                     immutable uv venvs, one per engine pin
    <nvme>/gpuserve/models/<org>--<name>/<sha>/         immutable checkpoint revisions
    <nvme>/gpuserve/cache/<deployment>/                 persistent compile caches (vLLM, torch)
    /etc/gpuserve/<deployment>/releases/<release-id>/   serve.yaml, env (0600), release.json
    /etc/gpuserve/<deployment>/current -> releases/<id> what the unit serves
    /etc/gpuserve/<deployment>/previous -> releases/<id> the rollback target
    gpuserve-<deployment>.service                       the systemd unit
    /opt/gpuserve/lib/{weights,fanout_agent}.py         the fan-out agent (weights_fanout = "hosts")
    /etc/gpuserve/fanout/{id_ed25519,known_hosts,job.json}   its fleet key (0600), peers, job
    gpuserve-weights-fetch.service                      the fan-out agent's unit
    /var/lib/gpuserve-fanout/.ssh/authorized_keys       the fleet key, forced to read checkpoints only
"""

from __future__ import annotations

import posixpath

SERVICE_USER = "gpuserve"
SERVICE_GROUP = "gpuserve"
SERVICE_HOME = "/var/lib/gpuserve"

OPT_DIR = "/opt/gpuserve"
ENVS_DIR = f"{OPT_DIR}/envs"
ETC_DIR = "/etc/gpuserve"

# host-to-host weights fan-out (gpuserve.layers.fanout)
AGENT_DIR = f"{OPT_DIR}/lib"
FANOUT_ETC = f"{ETC_DIR}/fanout"
FANOUT_KEY = f"{FANOUT_ETC}/id_ed25519"
FANOUT_KNOWN_HOSTS = f"{FANOUT_ETC}/known_hosts"
FANOUT_JOB = f"{FANOUT_ETC}/job.json"
FANOUT_USER = "gpuserve-fanout"
FANOUT_HOME = "/var/lib/gpuserve-fanout"
FANOUT_UNIT = "gpuserve-weights-fetch.service"
FANOUT_RUN_DIR = "/run/gpuserve-fanout"   # the unit's RuntimeDirectory (ssh control sockets)


def fanout_progress(repo_dir: str, sha: str) -> str:
    """The agent's progress file (JSON), beside the revision it stages."""
    return posixpath.join(repo_dir, f".gpuserve-fanout-{sha}.json")


def gpuserve_root(nvme_path: str) -> str:
    """The directory gpuserve owns on the NVMe mount."""
    return posixpath.join(nvme_path, "gpuserve")


def models_dir(nvme_path: str) -> str:
    return posixpath.join(gpuserve_root(nvme_path), "models")


def model_repo_dir(nvme_path: str, repo_id: str) -> str:
    """``MiniMaxAI/MiniMax-M3.1-Flash`` -> ``<nvme>/gpuserve/models/MiniMaxAI--MiniMax-M3.1-Flash``."""
    return posixpath.join(models_dir(nvme_path), repo_id.replace("/", "--"))


def checkpoint_dir(nvme_path: str, repo_id: str, sha: str) -> str:
    return posixpath.join(model_repo_dir(nvme_path, repo_id), sha)


def cache_dir(nvme_path: str, deployment: str) -> str:
    return posixpath.join(gpuserve_root(nvme_path), "cache", deployment)


def env_dir(engine_id: str) -> str:
    return posixpath.join(ENVS_DIR, engine_id)


def deployment_dir(deployment: str) -> str:
    return posixpath.join(ETC_DIR, deployment)


def releases_dir(deployment: str) -> str:
    return posixpath.join(deployment_dir(deployment), "releases")


def release_dir(deployment: str, release_id: str) -> str:
    return posixpath.join(releases_dir(deployment), release_id)


def current_link(deployment: str) -> str:
    return posixpath.join(deployment_dir(deployment), "current")


def previous_link(deployment: str) -> str:
    return posixpath.join(deployment_dir(deployment), "previous")


def unit_name(deployment: str) -> str:
    return f"gpuserve-{deployment}.service"
