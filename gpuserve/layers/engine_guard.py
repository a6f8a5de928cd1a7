"""Engine guard layer: nftables' ``table inet gpuserve`` on every serving host, loaded by
gpuserve-engine-guard.service before any engine starts (the ruleset: gpuserve/engine_guard.py).

Installs Debian's ``nftables`` package for ``nft`` only: Debian's nftables.service (which loads
the operator's /etc/nftables.conf) is neither enabled nor started here, and the guard touches
no table but its own. A changed ruleset is a ``systemctl reload`` of the guard: the table is
replaced in one transaction, and no engine restarts.
"""

from __future__ import annotations

from io import StringIO

from pyinfra.operations import apt, files, systemd

from gpuserve import engine_guard, layout
from gpuserve.config import HostSettings


def guard_of(settings: HostSettings) -> engine_guard.Guard:
    return engine_guard.plan((d.serve_port for d in settings.deployments), service_user=layout.SERVICE_USER,
                             proxy=settings.proxy, trusted_network=settings.trusted_network)


def engine_guard_layer(settings: HostSettings) -> None:
    guard = guard_of(settings)
    apt.packages(name="nftables (nft) for the engine guard", packages=["nftables"])
    rules = files.put(name="Engine guard ruleset: only the proxy and gpuserve open the engine ports "
                           f"({', '.join(map(str, guard.ports))})",
                      src=StringIO(engine_guard.ruleset(guard)), dest=engine_guard.RULES_PATH,
                      user="root", group="root", mode="644")
    unit = files.put(name="Engine guard unit", src=StringIO(engine_guard.unit_text()),
                     dest=engine_guard.UNIT_PATH, user="root", group="root", mode="644")
    # a start or reload that systemd could not even spawn (status=219/CGROUP: seen under load in
    # the sandbox's containers, 1 in about 20 reloads) is tried again rather than failing the host
    systemd.service(name="Engine guard loaded, and at boot", service=engine_guard.UNIT, running=True,
                    enabled=True, reloaded=rules.will_change, daemon_reload=unit.will_change,
                    _retries=2, _retry_delay=3)


def service_guard(what: str, guard: engine_guard.Guard, table: str, rules_path: str, unit: str,
                  dependents: tuple[str, ...] = ()) -> None:
    """The same guard in front of another service's ports (the monitor's, the gateway's): its
    table, its unit (loaded now and at boot), and drop-ins making ``dependents`` require it."""
    apt.packages(name=f"nftables (nft) for the {what} guard", packages=["nftables"])
    rules = files.put(
        name=f"{what.capitalize()} guard ruleset: only {', '.join(guard.users)} open "
             f"{', '.join(map(str, guard.ports))}",
        src=StringIO(engine_guard.ruleset(guard, table)), dest=rules_path, user="root", group="root",
        mode="644")
    unit_file = files.put(
        name=f"{what.capitalize()} guard unit", dest=layout.systemd_unit_path(unit),
        src=StringIO(engine_guard.unit_text(rules_path, table, f"{what} guard: only {', '.join(guard.users)} "
                                            f"open {', '.join(map(str, guard.ports))}")),
        user="root", group="root", mode="644")
    needs = [files.put(name=f"{svc} requires the {what} guard (drop-in)",
                       src=StringIO(engine_guard.requires_dropin(unit)),
                       dest=layout.systemd_dropin_path(svc, layout.GUARD_DROPIN),
                       user="root", group="root", mode="644")
             for svc in dependents]
    systemd.service(name=f"{what.capitalize()} guard loaded, and at boot", service=unit, running=True,
                    enabled=True, reloaded=rules.will_change,
                    daemon_reload=unit_file.will_change or any(n.will_change for n in needs),
                    _retries=2, _retry_delay=3)

