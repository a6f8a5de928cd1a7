"""Converge every host: drivers -> engine -> weights -> unit -> ready.

    pyinfra inventories/prod.py deploys/serve.py

The whole inventory is validated before any host is touched. Idempotent: a second run reports
no changes.
"""

from gpuserve.layers.base import base_layout
from gpuserve.layers.context import host_settings
from gpuserve.layers.gpu_stack import gpu_stack

settings = host_settings()

base_layout(settings.nvme_path, [d.name for d in settings.deployments])
gpu_stack()
