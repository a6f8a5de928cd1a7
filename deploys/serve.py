"""Converge every host: drivers -> engine -> weights -> unit -> ready.

    pyinfra inventories/prod.py deploys/serve.py

The whole inventory is validated before any host is touched. A host that serves nothing yet is
started and gated; a host that is serving keeps serving its release while the new one is staged
beside it (roll it out with deploys/upgrade.py). Likewise a host that is serving never gets a new
GPU stack here and is never rebooted: its stack change waits for deploys/upgrade.py, which moves
hosts max_unavailable at a time. A deployment the group data no longer names is drained, stopped
and removed before the planned ones start (docs/removal.md). A host whose OS update move
(deploys/patch.py) did not finish refuses the run: it would start that host's engines and put it
back into rotation unchecked. It holds the rollout lock while it runs (one writer of rotation and
the gateways' worker files at a time): during a rollout it refuses, naming it. Idempotent: a
second run reports no changes.
"""

from pyinfra import host, logger

from gpuserve.layers.base import base_layout, ordering_point
from gpuserve.layers.context import all_settings, host_plan
from gpuserve.layers.engine import engine_begin, engine_wait
from gpuserve.layers.gateway import gateway
from gpuserve.layers.gpu_stack import gpu_stack, serving, stack_move
from gpuserve.layers.monitoring import monitor, monitor_hosts, node_exporter
from gpuserve.layers.packages import early_packages
from gpuserve.layers.patch import refuse_unfinished_patch
from gpuserve.layers.proxy import proxy
from gpuserve.layers.removal import removal
from gpuserve.layers.rollout import hold_writer_lock
from gpuserve.layers.units import service, service_install
from gpuserve.layers.watchdog import watchdog
from gpuserve.layers.fanout import stage_begin, stage_end

plan = host_plan()   # settings, engine spec and releases: made once for this host and run
settings = plan.settings
hold_writer_lock("converge")   # one writer at a time: refuses during a rollout (names it)

if settings.serves:   # False on a host of role groups only (gateway, monitor): it serves no model
    refuse_unfinished_patch("converge", settings)   # out mid-patch: deploys/patch.py finishes it
    base_layout(settings.nvme_path, [d.name for d in settings.deployments])
    stage_begin(settings)   # weights_fanout = "hosts": the copy runs from here, beside the next steps
    pending = stack_move(settings) if serving(settings) else None
    if pending:
        logger.warning(f"    [{host.name}] serves now: its GPU stack change ({pending.reason}) waits for "
                       "deploys/upgrade.py, which moves it out of rotation first; nothing changes here")
    gpu_stack(disruptive=pending is None)
    engine_begin(plan)      # the venv builds from here, in a host-side unit (after the driver: it loads it)
    early_packages(settings)   # meanwhile: the service and proxy layers' packages,
    installed = service_install(plan)   # and each deployment's release files, secrets and unit
    engine_wait(plan)
    stage_end(settings)     # the weights step: waits for that copy, or stages it now
    removed = removal(settings)   # frees the GPUs and ports of deployments that left the plan
    service(plan, removed=removed.releases, installed=installed)   # guard, start, gate, retention
    proxy(plan, sites_removed=removed.proxy_sites, drain_flags=removed.drain_flags)

# --- the fleet gateway (docs/gateway.md): hosts of the group `gateway`, after every host's proxy
if settings.serves or settings.gateway:
    ordering_point()   # the gateways read the serving hosts' proxy certificates: after them
gateway(settings)

# --- monitoring (docs/monitoring.md): when the inventory has hosts in group monitor, or
# external_prometheus (a Prometheus of your own: gpuserve monitoring-export) ---
if monitor_hosts(all_settings()) or settings.monitor.external_prometheus:
    node_exporter(settings, all_settings())
    watchdog(settings)
    monitor(settings, all_settings())
