"""OS and kernel security updates, rolled host by host (docs/patching.md).

    pyinfra inventories/prod.py deploys/patch.py            # --dry lists each host's updates

Every host whose apt offers updates (held packages - the GPU driver, fabric manager, DCGM - are
kept back and never change) moves under the rollout lock: serving hosts max_unavailable at a
time, in inventory order, then the monitor hosts, then the gateways, one at a time (a gateway
only while another gateway serves, unless patch_last_gateway). A serving host goes out of
rotation, drained, engines stopped; `apt-get upgrade` within the holds, and where a new kernel
was installed: its GPU driver module (DKMS) checked for that kernel (hosts with a GPU driver), a
reboot, the new kernel verified; then on a serving host the driver, the admission checks,
engines started, readiness gate, back in; on a gateway or monitor host its services active (a
gateway serving a worker) before the next host goes. A host that fails after its update stays
out (a serving host with its engines stopped) and the rollout halts naming it; hosts not reached
are not touched. A second run changes nothing; a run after a failure finishes the move once the
host is fixed.
"""

from gpuserve.layers.base import base_layout
from gpuserve.layers.context import host_settings
from gpuserve.layers.patch import patch_move
from gpuserve.layers.rollout import add_rollout

settings = host_settings()

if settings.serves:   # a role host (gateway, monitor) has no deployment: nothing to lay out
    base_layout(settings.nvme_path, [d.name for d in settings.deployments])
add_rollout("patch", [m for m in [patch_move(settings)] if m])
