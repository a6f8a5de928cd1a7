"""Converge only the GPU stack: driver, CUDA or ROCm, fabric manager, holds, reboot, verify.

    pyinfra inventories/prod.py deploys/gpu_stack.py --limit gpu-h200-01.prod.example

For driver changes host by host (a driver change needs a reboot, which stops the engine on that
host): take the host out of your load balancer first, or let deploys/serve.py restart it after.
Idempotent: a second run changes nothing. docs/gpu-stack.md.
"""

from gpuserve.layers.base import base_layout
from gpuserve.layers.context import host_settings
from gpuserve.layers.gpu_stack import gpu_stack

settings = host_settings()

base_layout(settings.nvme_path, [d.name for d in settings.deployments])
gpu_stack()
