"""Stage the pinned checkpoint on every host, verified, without touching the service.

    pyinfra inventories/prod.py deploys/weights.py

Useful before a rollout: the new revision lands beside the one being served (unchanged files
hardlinked), so the upgrade itself moves no weights. Idempotent: a second run changes nothing.
"""

from gpuserve.layers.base import base_layout
from gpuserve.layers.context import host_settings
from gpuserve.layers.fanout import stage_begin, stage_end

settings = host_settings()

if settings.serves:   # a host of role groups only (gateway, monitor) holds no weights
    base_layout(settings.nvme_path, [d.name for d in settings.deployments])
    stage_begin(settings)   # weights_fanout = "hosts": the copy runs from here, beside the next steps
    stage_end(settings)     # the weights step: waits for that copy, or stages it now
