"""Packages layer: the Debian packages the service and proxy layers use, installed early.

On a fresh host these installs are the slowest of those layers' operations, and they need
neither the engine's venv nor the weights, so deploys/serve.py runs them while the venv builds in
the background (issue 24: a fresh host's time to serve is its longest step, not the sum). The
layers keep their own ``apt.packages`` operations (the proxy's are the same functions,
``nginx_packages`` and ``mtail_package``), which find everything installed here and change
nothing.
"""

from __future__ import annotations

from pyinfra.api import deploy
from pyinfra.operations import apt, server

from gpuserve.config import HostSettings
from gpuserve.layers.proxy import mtail_package, nginx_packages

SERVICE_PACKAGES = ["curl", "nftables"]   # the readiness checks; the engine guard


@deploy("Packages (while the engine venv builds)")
def early_packages(settings: HostSettings) -> None:
    """The service layer's packages and, on a host with the proxy, nginx (its default site off at
    once: Debian's package starts it serving that site on port 80) and mtail (Debian's own unit
    off: the proxy layer runs its own)."""
    apt.packages(name=f"{', '.join(SERVICE_PACKAGES)} (readiness checks, engine guard)", packages=SERVICE_PACKAGES)
    if not settings.proxy:
        return
    default_site = nginx_packages()
    server.shell(name="nginx without its default site now (its package started it with it)",
                 commands=["! systemctl is-active -q nginx || systemctl reload nginx"],
                 _if=default_site.did_change)
    mtail_package()
