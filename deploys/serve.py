"""Converge every host: drivers -> engine -> weights -> unit -> ready.

    pyinfra inventories/prod.py deploys/serve.py

The whole inventory is validated before any host is touched. A host that serves nothing yet is
started and gated; a host that is serving keeps serving its release while the new one is staged
beside it (roll it out with deploys/upgrade.py). A deployment the group data no longer names is
drained, stopped and removed before the planned ones start (docs/removal.md). Idempotent: a
second run reports no changes.
"""

from gpuserve.layers.base import base_layout
from gpuserve.layers.context import host_settings
from gpuserve.layers.engine import engine
from gpuserve.layers.gpu_stack import gpu_stack
from gpuserve.layers.proxy import proxy
from gpuserve.layers.removal import removal
from gpuserve.layers.service import service
from gpuserve.layers.weights import weights
from gpuserve.service import desired_releases

settings = host_settings()

base_layout(settings.nvme_path, [d.name for d in settings.deployments])
gpu_stack()
spec = engine(settings)
weights(settings)
removed = removal(settings)   # frees the GPUs and ports of deployments that left the plan
service(settings, desired_releases(settings, spec), removed=removed.releases)
proxy(settings, sites_removed=removed.proxy_sites, drain_flags=removed.drain_flags)
