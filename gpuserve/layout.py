"""Where things live on a served host. One place, so every layer and every test agrees.

    /opt/gpuserve/envs/<engine-id>/                     immutable uv venvs, one per engine pin
    <nvme>/gpuserve/models/<org>--<name>/<sha>/         immutable checkpoint revisions
    <nvme>/gpuserve/cache/<deployment>/                 persistent compile caches (vLLM, torch)
    /etc/gpuserve/<deployment>/releases/<release-id>/   serve.yaml, env (0600), release.json
    /etc/gpuserve/<deployment>/current -> releases/<id> what the unit serves
    /etc/gpuserve/<deployment>/previous -> releases/<id> the rollback target
    gpuserve-<deployment>.service                       the systemd unit
"""

from __future__ import annotations

import posixpath

SERVICE_USER = "gpuserve"
SERVICE_GROUP = "gpuserve"
SERVICE_HOME = "/var/lib/gpuserve"

OPT_DIR = "/opt/gpuserve"
ENVS_DIR = f"{OPT_DIR}/envs"
ETC_DIR = "/etc/gpuserve"


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
