"""Converge every host: drivers -> engine -> weights -> unit -> ready.

    pyinfra inventories/prod.py deploys/serve.py

Idempotent: a second run reports no changes.
"""

from pyinfra import host

from gpuserve.layers.base import base_layout
from gpuserve.layers.weights import weights

base_layout(
    nvme_path=host.data.get("nvme_path"),
    deployments=sorted(host.data.get("deployments")),
)
weights()
