"""Roll back to the previous release, or to a named one that is still on the hosts.

    pyinfra inventories/prod.py deploys/rollback.py
    pyinfra inventories/prod.py deploys/rollback.py --data rollback_to=<release id>

The same path as an upgrade (out of the proxy, drain, switch, start, gate, back in), host by
host. Afterwards current and previous both name the target, so running it again changes
nothing. Release ids: gpuserve status inventories/prod.py.

    pyinfra inventories/prod.py deploys/rollback.py --data rollback_stack=True

moves each host's GPU stack back to the previous pinned stack recorded on it, host by host through
the same move as an upgrade's stack change (drain, stop, apt downgrade within the pins, holds
re-applied, reboot if the module differs, verify, admission, gate). Change the driver pin in
group data back too, or the next upgrade moves the hosts forward again.

A host whose OS update move (deploys/patch.py) did not finish refuses the whole run before
anything changes, as in an upgrade: deploys/patch.py finishes it first.
"""

from pyinfra.api.exceptions import PyinfraError

from gpuserve.layers.context import host_plan
from gpuserve.layers.gpu_stack import stack_rollback_move
from gpuserve.layers.patch import refuse_unfinished_patch
from gpuserve.layers.rollout import add_rollout, deployment_state
from gpuserve.rollout import rollback_move

plan = host_plan(engine=False)   # installs no release: no engine spec, no wheelhouse read
settings = plan.settings
if settings.serves:
    refuse_unfinished_patch("rollback", settings)   # out mid-patch: deploys/patch.py finishes it

moves = []
if settings.rollback_stack:
    try:
        moves = [m for m in [stack_rollback_move(settings)] if m]
    except ValueError as exc:  # no earlier stack recorded: refuse before any host is touched
        raise PyinfraError(f"rollback refused: {exc}") from None
for dep in ([] if settings.rollback_stack else settings.deployments):
    st = deployment_state(plan, dep.name)
    try:
        move = rollback_move(settings.host, dep.name, st.current, st.previous, st.releases,
                             settings.rollback_to, st.interrupted)
    except ValueError as exc:  # nothing to roll back to: refuse before any host is touched
        raise PyinfraError(f"rollback refused: {exc}") from None
    if move:
        moves.append(move)
add_rollout("rollback", moves)
