"""OS and kernel security updates, rolled host by host (docs/patching.md).

    pyinfra inventories/prod.py deploys/patch.py            # --dry lists each host's updates

Every serving host whose apt offers updates (held packages - the GPU driver, fabric manager,
DCGM - are kept back and never change) moves max_unavailable at a time, in inventory order,
under the rollout lock: out of rotation, drained, engines stopped, `apt-get upgrade` within the
holds, and where a new kernel was installed: its GPU driver module (DKMS) checked for that
kernel, a reboot, the new kernel and the driver verified; then the admission checks, engines
started, readiness gate, back in. A host that fails after its update stays out of rotation with
its engines stopped and the rollout halts naming it; hosts not reached are not touched. A second
run changes nothing; a run after a failure finishes the move once the host is fixed.
"""

from gpuserve.layers.base import base_layout
from gpuserve.layers.context import host_settings
from gpuserve.layers.patch import patch_move
from gpuserve.layers.rollout import add_rollout

settings = host_settings()

moves = []
if settings.serves:   # role hosts (gateway, monitor) are not patched by this deploy (docs/patching.md)
    base_layout(settings.nvme_path, [d.name for d in settings.deployments])
    moves = [m for m in [patch_move(settings)] if m]
add_rollout("patch", moves)
