"""Roll back to the previous release, or to a named one that is still on the hosts.

    pyinfra inventories/prod.py deploys/rollback.py
    pyinfra inventories/prod.py deploys/rollback.py --data rollback_to=<release id>

The same path as an upgrade (out of the proxy, drain, switch, start, gate, back in), host by
host. Afterwards current and previous both name the target, so running it again changes
nothing. Release ids: gpuserve status inventories/prod.py.
"""

from pyinfra.api.exceptions import PyinfraError

from gpuserve.layers.context import host_settings
from gpuserve.layers.rollout import add_rollout, deployment_state
from gpuserve.rollout import rollback_move

settings = host_settings()

moves = []
for dep in settings.deployments:
    st = deployment_state(settings, dep.name)
    try:
        move = rollback_move(settings.host, dep.name, st.current, st.previous, st.releases,
                             settings.rollback_to, st.interrupted)
    except ValueError as exc:  # nothing to roll back to: refuse before any host is touched
        raise PyinfraError(f"rollback refused: {exc}") from None
    if move:
        moves.append(move)
add_rollout("rollback", moves)
