"""Rolling upgrade to the release pinned in group_data.

    pyinfra inventories/prod.py deploys/upgrade.py

Every host first gets the new release staged beside the one it serves (engine, weights, files),
and the GPU stack's repositories and pins; then hosts move max_unavailable at a time, in inventory
order: out of rotation, drain, stop, switch, start, readiness gate, back in. A host whose GPU
stack (driver, fabric manager, DCGM, ROCm) differs from group data first moves its stack: every
engine out and stopped, unhold -> install -> hold, a reboot only if the loaded module differs,
verify, admission checks, start, gate, back in. A failed gate puts that host back on its release
and stops the rollout (exit non-zero); a host that fails after its stack changed stays out of
rotation with its engines stopped; hosts not reached keep their release and stack. Running it again once every
host serves the pinned release changes nothing; running it again after an interrupted rollout
(the run killed, a host unreachable) finishes it. A host whose OS update move (deploys/patch.py)
did not finish refuses the whole run before anything changes: deploys/patch.py finishes it first.
"""

from gpuserve.layers.base import base_layout
from gpuserve.layers.context import host_plan, host_settings
from gpuserve.layers.engine import engine
from gpuserve.layers.gpu_stack import gpu_stack, stack_move
from gpuserve.layers.patch import refuse_unfinished_patch
from gpuserve.layers.proxy import proxy
from gpuserve.layers.rollout import add_rollout, deployment_state
from gpuserve.layers.units import service
from gpuserve.layers.weights import weights
from gpuserve.rollout import upgrade_move

settings = host_settings()

moves = []
if settings.serves:   # a host of role groups only (gateway, monitor) serves no model: nothing to move
    refuse_unfinished_patch("upgrade", settings)   # out mid-patch: deploys/patch.py finishes it
    plan = host_plan()   # engine spec and releases: made once for this host and run
    base_layout(settings.nvme_path, [d.name for d in settings.deployments])
    engine(plan)
    weights(settings)
    service(plan, start=False)
    proxy(plan)
    gpu_stack(disruptive=False)
    moves = [m for m in [stack_move(settings)] if m]
    for dep in settings.deployments:
        st = deployment_state(plan, dep.name)
        if move := upgrade_move(settings.host, dep.name, st.current, plan.release(dep.name).id,
                                st.previous, st.interrupted):
            moves.append(move)
add_rollout("upgrade", moves)
