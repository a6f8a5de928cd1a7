"""Packages layer: the Debian packages the service and proxy layers use, installed early.

On a fresh host these installs are the slowest of those layers' operations, and they need
neither the engine's venv nor the weights, so deploys/serve.py runs them while the venv builds in
the background (issue 24: a fresh host's time to serve is its longest step, not the sum). The
layers keep their own ``apt.packages`` operations, which find everything installed here and
change nothing.
"""

from __future__ import annotations

from pyinfra.api import deploy
from pyinfra.operations import apt, files, server, systemd

from gpuserve import layout, meter, proxy_conf
from gpuserve.config import HostSettings

SERVICE_PACKAGES = ["curl", "nftables"]   # the readiness checks; the engine guard
PROXY_PACKAGES = ["nginx", proxy_conf.NJS_PACKAGE, "openssl"]


@deploy("Packages (while the engine venv builds)")
def early_packages(settings: HostSettings) -> None:
    """The service layer's packages and, on a host with the proxy, nginx (its default site off at
    once: Debian's package starts it serving that site on port 80) and mtail (Debian's own unit
    off: the proxy layer runs its own)."""
    apt.packages(name=f"{', '.join(SERVICE_PACKAGES)} (readiness checks, engine guard)", packages=SERVICE_PACKAGES)
    if not settings.proxy:
        return
    apt.packages(name=f"nginx, its njs module ({proxy_conf.NJS_PACKAGE}: the message limit) and openssl",
                 packages=PROXY_PACKAGES)
    default_site = files.link(name="No default nginx site", path=layout.NGINX_DEFAULT_SITE, present=False)
    server.shell(name="nginx without its default site now (its package started it with it)",
                 commands=["! systemctl is-active -q nginx || systemctl reload nginx"],
                 _if=default_site.did_change)
    apt.packages(name="mtail (tokens per key from the proxy's usage log)", packages=[meter.PACKAGE],
                 extra_install_args="--no-install-recommends")
    systemd.service(name="Debian's mtail.service off (gpuserve-meter runs mtail)", service=meter.DEBIAN_UNIT,
                    running=False, enabled=False)
