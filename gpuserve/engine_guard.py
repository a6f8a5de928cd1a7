"""The engine guard: an nftables table that lets only the proxy (and gpuserve itself) open the
engines' ports on a serving host (issue 12, finding 6). Pure: the ruleset from the host's plan.

vLLM's own key covers only /v1: /invocations (full inference), /tokenize, /metrics and
/scale_elastic_ep answer anyone who can open the engine's port. SGLang checks its key the same
way, per route. Listening on loopback keeps other hosts out, not the host's other users. So
every serving host loads ``table inet gpuserve`` (``nft -f``, from the systemd unit
gpuserve-engine-guard.service that every engine unit requires):

- ``output``: a connection opened on this host (a SYN that leaves through ``lo``: any of the
  host's own addresses, 127.0.0.0/8 and ::1 included) to an engine port is reset unless the
  socket's owner (``meta skuid``) is root (gpuserve's gate, status, drain checks and watchdog run
  as root), the engine's own user (its readiness probe, ExecStartPost) or, behind the proxy,
  nginx's worker user. Only the SYN is judged: it always has a socket with an owner, while
  packets the kernel sends for a closing connection have none.
- ``input``: a connection from the network to an engine port is reset, unless the operator set
  ``trusted_network = True`` (then the network in front is trusted, and the output rule guards
  loopback only, so a monitor on the same host may still scrape the host's own address).

One mechanism for both engines: vLLM has a unix socket (``--uds``), SGLang has none, and the
health checks, drain checks and Prometheus scrapes all speak HTTP on the port. Where the check
stops: root and the engine's own user are trusted (both can read the engine's key anyway), and
so is every process running as nginx's worker user.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable

from gpuserve import layout, templating

TABLE = "gpuserve"
RULES_PATH = layout.ENGINE_GUARD_RULES
UNIT = "gpuserve-engine-guard.service"
UNIT_PATH = layout.systemd_unit_path(UNIT)
NFT = layout.NFT_BIN
# Debian's nginx starts its workers as www-data (/etc/nginx/nginx.conf `user www-data;`): they are
# what opens the engine's port for clients
PROXY_USER = "www-data"


@dataclass(frozen=True)
class Guard:
    ports: tuple[int, ...]          # every deployment's serve_port on the host
    users: tuple[str, ...]          # who may open them on the host
    network: bool                   # True: connections from the network are reset too


def plan(ports: Iterable[int], *, service_user: str, proxy: bool, trusted_network: bool) -> Guard:
    users = ("root", service_user) + ((PROXY_USER,) if proxy else ())
    return Guard(tuple(sorted(set(ports))), tuple(dict.fromkeys(users)), network=not trusted_network)


# The same guard in front of the monitor's Prometheus (9090) and alertmanager (9093), on the
# monitor's loopback: issue 26 found any local user could POST /api/v2/silences and silence every
# alert. Only root (operators: sudo or ssh) and Prometheus's own user (Debian runs both as
# prometheus; Prometheus sends its alerts to alertmanager) open them.
MONITOR_TABLE = "gpuserve_monitor"
MONITOR_RULES_PATH = layout.MONITOR_GUARD_RULES
MONITOR_UNIT = "gpuserve-monitor-guard.service"
MONITOR_USERS = ("root", "prometheus")


def ruleset(guard: Guard, table: str = TABLE) -> str:
    """The file ``nft -f`` loads: it replaces gpuserve's own table at once (one transaction) and
    touches no other table (the operator's /etc/nftables.conf stays as it is)."""
    ports = ", ".join(str(p) for p in guard.ports)
    users = ", ".join(f'"{u}"' for u in guard.users)
    syn = "tcp flags & (syn | ack) == syn"
    if guard.network:
        local = [f'oifname "lo" tcp dport @engine_ports {syn} meta skuid != @engine_users '
                 "reject with tcp reset"]
    else:   # trusted_network: the host's own non-loopback addresses are as open as the network
        local = [f'oifname "lo" {fam} daddr {addr} tcp dport @engine_ports {syn} '
                 "meta skuid != @engine_users reject with tcp reset"
                 for fam, addr in (("ip", "127.0.0.0/8"), ("ip6", "::1"))]
    lines = [
        "#!/usr/sbin/nft -f",
        "# Managed by gpuserve (pyinfra): only the users named below open these ports",
        f"# (gpuserve/engine_guard.py, docs/configuration.md). Check: nft list table inet {table}",
        f"table inet {table}",
        f"delete table inet {table}",
        f"table inet {table} {{",
        "\tset engine_ports {",
        "\t\ttype inet_service",
        *([f"\t\telements = {{ {ports} }}"] if ports else []),
        "\t}",
        "",
        "\tset engine_users {",
        "\t\ttype uid",
        f"\t\telements = {{ {users} }}",
        "\t}",
        "",
        "\tchain output {",
        "\t\ttype filter hook output priority filter; policy accept;",
        *(f"\t\t{rule}" for rule in local),
        "\t}",
    ]
    if guard.network:
        lines += [
            "",
            "\tchain input {",
            "\t\ttype filter hook input priority filter; policy accept;",
            '\t\tiifname != "lo" tcp dport @engine_ports reject with tcp reset',
            "\t}",
        ]
    lines.append("}")
    return "\n".join(lines) + "\n"


def unit_text(rules_path: str = RULES_PATH, table: str = TABLE,
              what: str = "engine guard: only the proxy and gpuserve open the engines' ports") -> str:
    """gpuserve-engine-guard.service: loads the table before any engine starts (each engine unit
    has Requires= and After= on it), at boot too; a reload replaces the table in place. With
    other arguments, the monitor's guard (MONITOR_UNIT), which Prometheus and alertmanager
    require the same way."""
    return templating.render("gpuserve-guard.service.j2", nft=NFT, rules_path=rules_path, table=table, what=what)


# And in front of smg on a gateway host (its API with the admin routes, /workers, and its
# metrics): only root (operators, gpuserve's rollout steps over SSH) and nginx's workers, which
# proxy the client routes to it and the metrics to the monitor (docs/gateway.md).
GATEWAY_TABLE = "gpuserve_gateway"
GATEWAY_RULES_PATH = layout.GATEWAY_GUARD_RULES
GATEWAY_UNIT = "gpuserve-gateway-guard.service"
GATEWAY_USERS = ("root", PROXY_USER)


def gateway_guard(ports: Iterable[int]) -> Guard:
    """smg's ports for GATEWAY_USERS only, on loopback (smg listens there; its metrics may also
    listen on the monitor network, which the guard leaves to the network's own rules)."""
    return Guard(tuple(sorted(set(ports))), GATEWAY_USERS, network=False)


def monitor_guard(ports: Iterable[int]) -> Guard:
    """Prometheus's and alertmanager's ports (gpuserve.monitoring) for MONITOR_USERS only."""
    return Guard(tuple(sorted(set(ports))), MONITOR_USERS, network=True)


def requires_dropin(unit: str) -> str:
    """A drop-in that makes a service require a guard (it starts after it, stops with it)."""
    return templating.render("dropin-guard-requires.conf.j2", unit=unit)


# --- every listener of an engine, not only its serve port ------------------------------------
# Issue 26 (7): vLLM's EngineCore opens gloo listeners (random ports, on the host name's address,
# 127.0.1.1 on Debian) that any local user could open. Their ports are not known in advance, so
# this part of the guard judges the listening socket's owner: each engine unit loads, as root,
# before it starts (ExecStartPre=+, when its cgroup exists), a table of its own that resets a
# connection opened over lo by any user but root and the engine's own, to a socket of the
# engine's cgroup on any port but the serve port (the port guard above lets nginx reach that).
# The output chain marks the SYN of such a user (a bit of the packet mark, LISTENERS_MARK), the
# input chain resets it when the socket it reaches belongs to the unit's cgroup (nft ``socket
# cgroupv2``). A unit's cgroup level counts from the machine's root cgroup, which a container
# does not see: one rule per level from 2 (system.slice/<unit> on a host) to LISTENER_LEVELS;
# only the unit's true level can match.
LISTENERS_MARK = 0x00260000
LISTENER_LEVELS = 8


def listeners_table(deployment: str) -> str:
    return "gpuserve_listeners_" + "".join(c if c.isalnum() else "_" for c in deployment)


def listeners_ruleset(deployment: str, unit: str, serve_port: int, users: Iterable[str]) -> str:
    table = listeners_table(deployment)
    mark = f"0x{LISTENERS_MARK:08x}"
    names = ", ".join(f'"{u}"' for u in dict.fromkeys(users))
    cgroup = f"system.slice/{unit}"
    return "\n".join([
        "#!/usr/sbin/nft -f",
        f"# Managed by gpuserve (pyinfra): only {', '.join(dict.fromkeys(users))} open the listeners of",
        f"# {unit} besides its serve port (gpuserve/engine_guard.py). Loaded by the unit at each start.",
        f"table inet {table}",
        f"delete table inet {table}",
        f"table inet {table} {{",
        "\tset users {",
        "\t\ttype uid",
        f"\t\telements = {{ {names} }}",
        "\t}",
        "",
        "\tchain output {",
        "\t\ttype filter hook output priority filter; policy accept;",
        f'\t\toifname "lo" tcp dport != {serve_port} tcp flags & (syn | ack) == syn meta skuid != @users '
        f"meta mark set meta mark | {mark}",
        "\t}",
        "",
        "\tchain input {",
        "\t\ttype filter hook input priority filter; policy accept;",
        *(f'\t\tiifname "lo" meta mark & {mark} == {mark} socket cgroupv2 level {level} "{cgroup}" '
          "reject with tcp reset" for level in range(2, LISTENER_LEVELS + 1)),
        "\t}",
        "}",
    ]) + "\n"
