"""The local test hosts made by `gpuserve sandbox up` (see README.md).

Groups are the simulated hardware profiles; pyinfra also puts every host in group `sandbox`
(this file's name), whose group_data/sandbox.py serves the tiny test model with the cpu recipe.
Instance: $GPUSERVE_SANDBOX_INSTANCE (default 0). Empty until the sandbox is up.
"""

from gpuserve_sandbox.inventory import group

hopper_x8 = group("hopper_x8")
blackwell_x4 = group("blackwell_x4")
mi355x_x4 = group("mi355x_x4")
cpu = group("cpu")
monitor = group("monitor")   # Prometheus and alertmanager (docs/monitoring.md)
gateway = group("gateway")   # the fleet gateway (no GPU): `gpuserve sandbox up --profile gateway`
