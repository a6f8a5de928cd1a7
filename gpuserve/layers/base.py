"""Base layer: the service user and the directory layout every other layer writes into."""

from __future__ import annotations

from pyinfra.api import deploy
from pyinfra.operations import files, server

from gpuserve import layout


@deploy("gpuserve base layout")
def base_layout(nvme_path: str, deployments: list[str]) -> None:
    """Create the unprivileged service user and the directories of gpuserve.layout.

    Configuration and releases are root-owned and only readable by the service group (the
    env files in them hold API keys); caches are the only place the service itself writes.
    """
    server.group(name="Service group", group=layout.SERVICE_GROUP, system=True)
    server.user(
        name="Service user (no login shell)",
        user=layout.SERVICE_USER,
        group=layout.SERVICE_GROUP,
        home=layout.SERVICE_HOME,
        shell="/usr/sbin/nologin",
        system=True,
        create_home=False,
        comment="gpuserve inference engine",
    )
    files.directory(name="Service home", path=layout.SERVICE_HOME,
                    user=layout.SERVICE_USER, group=layout.SERVICE_GROUP, mode="750")
    files.directory(name="Engine environments", path=layout.ENVS_DIR,
                    user="root", group="root", mode="755")
    files.directory(name="Configuration root", path=layout.ETC_DIR,
                    user="root", group=layout.SERVICE_GROUP, mode="750")
    files.directory(name="gpuserve directory on NVMe", path=layout.gpuserve_root(nvme_path),
                    user="root", group="root", mode="755")
    files.directory(name="Checkpoints on NVMe", path=layout.models_dir(nvme_path),
                    user="root", group=layout.SERVICE_GROUP, mode="755")
    for name in deployments:
        files.directory(name=f"Releases of {name}", path=layout.releases_dir(name),
                        user="root", group=layout.SERVICE_GROUP, mode="750")
        files.directory(name=f"Compile caches of {name}", path=layout.cache_dir(nvme_path, name),
                        user=layout.SERVICE_USER, group=layout.SERVICE_GROUP, mode="750")
