"""Converge the fleet gateway: smg (pinned, its own venv), its worker file, nginx in front.

    pyinfra inventories/prod.py deploys/gateway.py

Run it with the inventory of the whole fleet: the worker file lists every deployment of every
serving host in it. Hosts outside the group `gateway` are left as they are. docs/gateway.md.
"""

from gpuserve.layers.context import host_settings
from gpuserve.layers.gateway import gateway
from gpuserve.layers.rollout import hold_writer_lock

hold_writer_lock("gateway converge")   # it rewrites the worker file: never during a rollout
gateway(host_settings())
