"""Stage the pinned checkpoint on every host, verified, without touching the service.

    pyinfra inventories/prod.py deploys/weights.py

Useful before a rollout: the new revision lands beside the one being served (unchanged files
hardlinked), so the upgrade itself moves no weights. Idempotent: a second run changes nothing.
"""

from pyinfra import host

from gpuserve.layers.base import base_layout
from gpuserve.layers.weights import weights

base_layout(
    nvme_path=host.data.get("nvme_path"),
    deployments=sorted(host.data.get("deployments")),
)
weights()
