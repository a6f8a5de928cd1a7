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


@deploy("Ordering point: every host's own layers before the gateways")
def ordering_point() -> None:
    """One operation every serving and gateway host runs from the same call site.

    pyinfra 3 orders a run's operations as a DAG: each host's operations in the order it adds
    them, and operations from the same call site are one node shared by every host. A gateway
    host adds only gateway operations, so without a shared node its first one (reading the
    serving hosts' proxy certificates) would run at the serving hosts' first step, before any
    proxy exists. This node comes after every serving host's proxy layer, so what the gateway
    layer adds after it does too. It only makes sure the configuration root exists: no change
    once a host has it (its owner and mode are the base layout's to set).
    """
    files.directory(name="Configuration root exists", path=layout.ETC_DIR)
