"""Monitoring only: node-exporter on every host, Prometheus and alertmanager on the monitor
hosts (group ``monitor``), the hang watchdog on every serving host (docs/monitoring.md).

    pyinfra inventories/prod.py deploys/monitoring.py

deploys/serve.py runs the same when the inventory has monitor hosts. Idempotent.
"""

from gpuserve.layers.context import all_settings, host_settings
from gpuserve.layers.monitoring import monitor, node_exporter
from gpuserve.layers.watchdog import watchdog

settings = host_settings()
node_exporter(settings, all_settings())
watchdog(settings)
monitor(settings, all_settings())
