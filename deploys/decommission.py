"""Remove gpuserve from hosts: drain, stop, disable, and remove its units, files, proxy sites,
keys, engine envs and weights, and the fleet tier's (watchdogs, the exporters' front, a gateway's
smg and front, a monitor's Prometheus configuration, the GPU stack record). Opt-in per host, role
hosts (gateway, monitor) included: only hosts whose data says decommission = True.

    pyinfra inventories/prod.py deploys/decommission.py --limit <host> --dry   # what would go
    pyinfra inventories/prod.py deploys/decommission.py --limit <host>

A run that includes a host without decommission = True is refused before any host is touched.
Packages (nginx, curl, Prometheus and its exporters, the GPU driver stack) stay: they are
Debian's or the GPU stack's, not gpuserve's files; the services whose configuration gpuserve wrote
are stopped and disabled (docs/removal.md). Running it again finds nothing to remove. It holds
the rollout lock while it runs, like deploys/serve.py: during a rollout it refuses, naming it.
"""

from pyinfra.api.exceptions import PyinfraError
from pyinfra.context import ctx_state

from gpuserve.layers.context import all_settings, host_settings
from gpuserve.layers.removal import decommission
from gpuserve.layers.rollout import hold_writer_lock
from gpuserve.rollout.preconditions import refused_hosts

state = ctx_state.get()
refused = refused_hosts({h.name: s.decommission for h in state.inventory if h in state.active_hosts
                         for s in [all_settings()[h.name]]})
if refused:
    raise PyinfraError(refused)

# it drains and removes what a rollout moves: never during one; the lock's directory goes last
hold_writer_lock("decommission", leaving=True)
decommission(host_settings())
