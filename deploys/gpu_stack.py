"""Converge only the GPU stack: driver, CUDA or ROCm, fabric manager, holds, reboot, verify.

    pyinfra inventories/prod.py deploys/gpu_stack.py --limit gpu-h200-01.prod.example

This runs the whole layer at once, engines or not: a driver change stops them and may reboot the
host. On a serving fleet, change the driver pin in group data and run deploys/upgrade.py instead:
it moves the stack host by host, out of rotation first (docs/gpu-stack.md, "Rolling stack
changes"). Use this for hosts you took out of service yourself.
A host that rebooted starts its engines and passes their readiness gate before the run ends.
Idempotent: a second run changes nothing. docs/gpu-stack.md. A host whose OS update move
(deploys/patch.py) did not finish refuses the run: deploys/patch.py finishes it first. It holds
the rollout lock while it runs: during a rollout it refuses, naming it.
"""

from gpuserve.layers.base import base_layout
from gpuserve.layers.context import host_plan, host_settings
from gpuserve.layers.gpu_stack import gpu_stack
from gpuserve.layers.patch import refuse_unfinished_patch
from gpuserve.layers.rollout import hold_writer_lock
from gpuserve.layers.units import gate_after_reboot

settings = host_settings()
hold_writer_lock("GPU stack converge")   # it stops engines and reboots: never during a rollout

if settings.serves:   # a host of role groups only (gateway, monitor) has no GPU stack
    refuse_unfinished_patch("GPU stack converge", settings)   # deploys/patch.py finishes it
    base_layout(settings.nvme_path, [d.name for d in settings.deployments])
    gate_after_reboot(host_plan(engine=False), gpu_stack())   # starts what is there: no engine spec
