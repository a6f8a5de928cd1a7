"""Removal: what gpuserve put on a host that the plan no longer keeps (pure: no host access).

A converge (deploys/serve.py) removes every deployment the host's group data no longer names;
deploys/decommission.py removes all of gpuserve from a host. Both start from the host's
*footprint*, read by one fact (gpuserve.facts.removal.Footprint, whose command is
``footprint_command`` below), and only ever remove what gpuserve made:

- a deployment is gpuserve's when ``/etc/gpuserve/<name>/releases`` (its release ledger) exists,
  or when ``/etc/systemd/system/gpuserve-<name>.service`` starts with the line gpuserve's unit
  template writes (UNIT_MARKER) and serves ``/etc/gpuserve/<name>/current``. Another unit named
  gpuserve-*.service (a gateway's, a watchdog's, anybody's) is not a deployment and is left alone;
- its paths are the ones gpuserve.layout, the proxy layer and the service layer name for it,
  and only those of them that exist are listed; its hang watchdog instance
  ``gpuserve-watchdog@<name>.service`` (gpuserve.layers.watchdog) is stopped and disabled first,
  and the watchdog's node-exporter textfiles of it go with the other paths;
- on decommission, the host-wide files: those named after gpuserve (HOST_PATHS), and files in
  other programs' places (a systemd unit, Debian's /etc/default files, Prometheus's
  configuration) only when their first line is gpuserve's MANAGED marker (MARKED). The service
  such a file configures is stopped and disabled before it goes (SERVICES): Debian's packages
  stay (docs/removal.md), and a service whose configuration went must not come back on its
  Debian defaults (node-exporter's would listen on every address).

The order of a deployment's removal matters for a run killed half-way: the ledger directory
goes last, so a rerun still finds the deployment and finishes.
"""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass, field, replace
from typing import Iterable, Mapping
from urllib.parse import urlsplit

from gpuserve import engine_guard, gateway, layout, meter, monitoring, proxy_conf, rollout
from gpuserve.rollout.preconditions import refused_hosts  # noqa: F401 - decommission's rule

# the first line of templates/gpuserve.service.j2
UNIT_MARKER = "# Managed by gpuserve (pyinfra): do not edit here, change group_data and converge."
# the start of the first line of every other file gpuserve writes in another program's place
MANAGED = "# Managed by gpuserve (pyinfra)"
NAME = re.compile(r"[a-z0-9][a-z0-9_-]{0,39}")   # gpuserve.config.DEPLOYMENT_NAME
SYSTEMD_DIR = layout.SYSTEMD_DIR
USER_COMMENT = "gpuserve inference engine"   # gpuserve.layers.base gives the service user this
# the proxy's per-deployment files: the keys are systemd credentials (<file>.cred) with <file> a link
# to their decrypted copy in /run (issue 29)
KEY_SUFFIXES = (".keys", ".keys.cred", ".operator-keys", ".operator-keys.cred", ".upstream-auth",
                ".upstream-auth.cred", ".drain")
# a deployment's decrypted credentials in /run: the proxy's keys and the engine's secrets.env
RUN_SUFFIXES = (".keys", ".operator-keys", ".upstream-auth", ".secrets.env")
# host-wide directories and files of gpuserve besides the deployments' (deploys/decommission.py)
HOST_PATHS = (
    proxy_conf.COMMON_CONF,
    proxy_conf.OLD_COMMON_CONF,
    proxy_conf.NGINX_DIR,                 # TLS pair, keys, drain flags
    layout.NGINX_DROPIN_PATH,
    layout.NGINX_CREDENTIALS_DROPIN,      # decrypts nginx's keys at start (issue 29): before OPT_DIR's script goes
    layout.PROMETHEUS_CREDENTIALS_DROPIN,     # ... and a monitor's scrape keys and alertmanager.yml
    layout.ALERTMANAGER_CREDENTIALS_DROPIN,
    monitoring.ALERTMANAGER_YML + ".cred",     # alertmanager.yml with the receivers' secrets, encrypted
    layout.ETC_DIR,                       # ledgers, secrets
    layout.OPT_DIR,                       # engine envs, uv, wheels, the readiness gate
    layout.SERVICE_HOME,
    layout.ROLLOUT_LOCK_DIR,              # the rollout lock (gpuserve.rollout.LOCK_FILE)
    layout.ENGINE_LOG_DIR,                # engine build logs (gpuserve.engine.LOG_DIR)
    layout.DOWNLOADS_DIR,                 # GPU-stack downloads
    layout.RUN_DIR,                       # decrypted credentials (tmpfs)
    # --- the fleet tier: the GPU stack's record, the exporters' front, a gateway, a monitor ---
    layout.STACK_STATE_DIR,               # GPU stack record and move markers (stack and patch)
    layout.EXPORTERS_CONF,                # gpuserve.layers.monitoring.EXPORTERS_CONF
    layout.EXPORTERS_DIR,                 # its TLS pair (gpuserve.layers.monitoring.EXPORTERS_DIR)
    gateway.NGINX_CONF,                   # a gateway's front (its keys are in proxy_conf.NGINX_DIR)
    gateway.ETC,                          # a gateway's worker file and workers' CA
    *layout.GATEWAY_STATE_DIRS,           # smg's StateDirectory (DynamicUser: a link to private/)
    monitoring.RULES_YML,                 # a monitor's alert rules
    monitoring.SCRAPE_SECRETS_DIR,        # a monitor's operator keys to scrape with
    monitoring.SCRAPE_CA_DIR,             # a monitor's copies of the hosts' certificates
    meter.PROGRAM_DIR,                    # the token meter's mtail program (gpuserve.meter)
    proxy_conf.USAGE_LOG,                 # the proxy's usage log (key ids, never keys); rotated copies stay
    layout.GATEWAY_GUARD_RULES,           # the gateway's and the monitor's guards' rulesets (the engine
    layout.MONITOR_GUARD_RULES,           # guard's is in ETC_DIR)
    # the drop-ins that make a monitor's services require its guard (layers/engine_guard.service_guard)
    layout.systemd_dropin_path("prometheus", layout.GUARD_DROPIN),
    layout.systemd_dropin_path("prometheus-alertmanager", layout.GUARD_DROPIN),
    f"{SYSTEMD_DIR}/{layout.ALERT_RELAY_UNIT}.d",   # the alert relay's (its unit is MARKED)
)
WATCHDOG_TEMPLATE = layout.WATCHDOG_UNIT_PATH   # gpuserve.layers.watchdog.UNIT
GATEWAY_UNIT = layout.systemd_unit_path(gateway.UNIT)
# files in other programs' places, gpuserve's only when their first line starts with MANAGED,
# each with the service it configures (stopped and disabled before the file goes), in order
MARKED: tuple[tuple[str, str | None], ...] = (
    (WATCHDOG_TEMPLATE, None),            # its instances go with their deployments
    (GATEWAY_UNIT, gateway.UNIT),
    # the guards after what they guard (stopping one drops its nftables table)
    (layout.systemd_unit_path(engine_guard.GATEWAY_UNIT), engine_guard.GATEWAY_UNIT),   # a gateway's smg
    (engine_guard.UNIT_PATH, engine_guard.UNIT),
    (layout.systemd_unit_path(meter.UNIT), meter.UNIT),   # the token meter (mtail)
    (layout.systemd_unit_path(layout.ALERT_RELAY_UNIT), layout.ALERT_RELAY_UNIT),   # a monitor's alert relay
    (layout.NODE_EXPORTER_DEFAULTS, "prometheus-node-exporter.service"),
    (layout.PROMETHEUS_DEFAULTS, "prometheus.service"),
    (monitoring.PROMETHEUS_YML, "prometheus.service"),
    (layout.ALERTMANAGER_DEFAULTS, "prometheus-alertmanager.service"),
    (monitoring.ALERTMANAGER_YML, "prometheus-alertmanager.service"),
    (layout.systemd_unit_path(engine_guard.MONITOR_UNIT), engine_guard.MONITOR_UNIT),   # Prometheus, alertmanager
)


def watchdog_unit(name: str) -> str:
    """The hang watchdog instance of one deployment (gpuserve.layers.watchdog.unit_name)."""
    return f"gpuserve-watchdog@{name}.service"


def textfiles(name: str) -> tuple[str, ...]:
    """The node-exporter textfile the watchdog writes for one deployment, and its temporary."""
    prom = f"{monitoring.TEXTFILE_DIR}/gpuserve-{name}.prom"
    return prom, f"{prom}.tmp"


def unit_path(name: str) -> str:
    return layout.unit_path(name)


def proxy_site(name: str) -> str:
    return layout.proxy_site(name)


def deployment_paths(name: str, nvme_path: str) -> tuple[str, ...]:
    """Every path gpuserve makes for one deployment, in the order removal takes them: the proxy
    site and keys, the compile caches, the unit file, and the ledger (releases, secrets) last."""
    if not NAME.fullmatch(name):
        raise ValueError(f"{name!r} is not a deployment name gpuserve makes")
    return _deployment_paths(name, nvme_path)


def _deployment_paths(name: str, nvme_path: str) -> tuple[str, ...]:
    proxy = () if name in proxy_conf.OWN_NAMES else (
        proxy_site(name), *(f"{proxy_conf.NGINX_DIR}/{name}{s}" for s in KEY_SUFFIXES))
    run = tuple(f"{layout.SECRETS_RUN_DIR}/{name}{s}" for s in RUN_SUFFIXES)
    return (*proxy, layout.cache_dir(nvme_path, name), *textfiles(name), *run, unit_path(name),
            layout.deployment_dir(name))


def host_paths(nvme_path: str) -> tuple[str, ...]:
    """Everything of gpuserve's on a host that is not one deployment's (decommission)."""
    return (*HOST_PATHS, layout.gpuserve_root(nvme_path))


def marked_paths() -> tuple[str, ...]:
    return tuple(p for p, _ in MARKED)


def services() -> tuple[str, ...]:
    return tuple(dict.fromkeys(svc for _, svc in MARKED if svc))


def is_nginx_path(path: str) -> bool:
    return path.startswith((layout.NGINX_ETC_DIR + "/", layout.NGINX_DROPIN_PATH, layout.NGINX_CREDENTIALS_DROPIN))


def is_unit_path(path: str) -> bool:
    """A path whose removal systemd must be told of (daemon-reload)."""
    return path.startswith(SYSTEMD_DIR + "/")


# --- the footprint fact's command and its output ------------------------------------------------

def footprint_command(nvme_path: str) -> str:
    """One shell command that prints what gpuserve has on the host (parse_footprint reads it)."""
    marker = shlex.quote(UNIT_MARKER)
    candidates = " ".join(shlex.quote(p) for p in host_paths(nvme_path))
    marked = " ".join(shlex.quote(p) for p in marked_paths())
    managed = shlex.quote("^" + MANAGED)   # a basic regular expression: ( and ) are literal
    # the shell loop's own $n stands for the name (deployment names need no quoting)
    per_deployment = " ".join(_deployment_paths("$n", nvme_path))
    return (
        "names=; "
        f"for d in {layout.ETC_DIR}/*/releases; do [ -d \"$d\" ] || continue; "
        "n=${d%/releases}; n=${n##*/}; case $n in *[!a-z0-9_-]*) continue;; esac; names=\"$names $n\"; echo \"ledger $n\"; done; "
        f"for u in {SYSTEMD_DIR}/gpuserve-*.service; do [ -f \"$u\" ] || continue; "
        "n=${u##*/gpuserve-}; n=${n%.service}; case $n in *[!a-z0-9_-]*) continue;; esac; "
        f"head -n1 \"$u\" | grep -qxF {marker} && grep -qF \"{layout.ETC_DIR}/$n/current\" \"$u\" "
        "&& { names=\"$names $n\"; echo \"unit $n\"; }; done; "
        "for n in $(echo $names | tr ' ' '\\n' | sort -u); do "
        f"u=gpuserve-$n.service; "
        "echo \"state $n $(systemctl show -p ActiveState --value $u 2>/dev/null || true) "
        "$(systemctl is-enabled $u 2>/dev/null | head -n1)\"; "
        f"echo \"url $n $(sed -n 's/^url=//p' {layout.ETC_DIR}/$n/current/wait-ready 2>/dev/null | head -n1)\"; "
        "w=gpuserve-watchdog@$n.service; "
        "echo \"watchdog $n $(systemctl show -p ActiveState --value $w 2>/dev/null || true) "
        "$(systemctl is-enabled $w 2>/dev/null | head -n1)\"; "
        f"for p in {per_deployment}; do "
        "{ [ -e \"$p\" ] || [ -L \"$p\" ]; } && echo \"path $n $p\"; done; done; "
        f"for p in {candidates}; do {{ [ -e \"$p\" ] || [ -L \"$p\" ]; }} && echo \"host $p\"; "
        "[ -L \"$p\" ] && echo \"link $p\"; done; "
        f"for p in {marked}; do [ -f \"$p\" ] && head -n1 \"$p\" | grep -q {managed} "
        "&& echo \"marked $p\"; done; "
        f"for s in {' '.join(services())}; do "
        "echo \"svc $s $(systemctl show -p ActiveState --value $s 2>/dev/null || true) "
        "$(systemctl is-enabled $s 2>/dev/null | head -n1)\"; done; "
        "echo \"nginx $(systemctl is-active nginx 2>/dev/null || true)\"; "
        # the user only when it is the one gpuserve.layers.base made (its comment says so)
        f"getent passwd {layout.SERVICE_USER} | cut -d: -f5 | grep -qxF {shlex.quote(USER_COMMENT)} "
        f"&& echo \"user {layout.SERVICE_USER}\"; "
        f"getent passwd {layout.SERVICE_USER} >/dev/null || echo \"nouser\"; "
        f"getent group {layout.SERVICE_GROUP} >/dev/null && echo \"group {layout.SERVICE_GROUP}\"; true"
    )


def _running(active: str) -> bool:
    return active in ("active", "activating", "reloading", "deactivating")


def _enabled(enabled: str) -> bool:
    return enabled in ("enabled", "enabled-runtime", "linked", "linked-runtime")


@dataclass(frozen=True)
class Found:
    """One deployment gpuserve set up on the host, as it is there now."""

    name: str
    ledger: bool = False              # /etc/gpuserve/<name>/releases is there
    unit: bool = False                # gpuserve's unit file for it is there
    active: str = ""                  # systemd ActiveState ("" when systemd knows no such unit)
    enabled: str = "-"                # systemctl is-enabled ("-" when it says nothing)
    health_url: str | None = None     # where the host reaches its engine's /health (its release says)
    paths: tuple[str, ...] = ()       # the deployment_paths that exist, in removal order
    watchdog_active: str = ""         # its gpuserve-watchdog@<name>.service, as above
    watchdog_enabled: str = "-"

    @property
    def running(self) -> bool:
        return _running(self.active)

    @property
    def is_enabled(self) -> bool:
        return _enabled(self.enabled)

    @property
    def watchdog_running(self) -> bool:
        return _running(self.watchdog_active)

    @property
    def watchdog_is_enabled(self) -> bool:
        return _enabled(self.watchdog_enabled)

    def engine_address(self) -> tuple[str, int] | None:
        """(serve_host, serve_port) from its /health URL, for the drain (None: unknown)."""
        if not self.health_url:
            return None
        parts = urlsplit(self.health_url)
        if parts.scheme != "http" or parts.hostname is None or parts.port is None:
            return None
        return parts.hostname, parts.port


@dataclass(frozen=True)
class Footprint:
    deployments: Mapping[str, Found] = field(default_factory=dict)
    host_paths: tuple[str, ...] = ()   # the HOST_PATHS (and the NVMe root) that exist
    nginx_active: bool = False
    user: bool = False                 # the service user
    group: bool = False                # the service group
    marked: tuple[str, ...] = ()       # the MARKED files that are there and start with MANAGED
    links: tuple[str, ...] = ()        # those of host_paths that are symbolic links
    service_states: Mapping[str, tuple[str, str]] = field(default_factory=dict)  # (active, enabled)

    @property
    def empty(self) -> bool:
        return not (self.deployments or self.host_paths or self.user or self.group or self.marked)


def parse_footprint(lines: Iterable[str], nvme_path: str) -> Footprint:
    """Read footprint_command's output. A name that is not a deployment name gpuserve could have
    made, or a path that is not one of that deployment's, is ignored (never removed)."""
    deps: dict[str, dict] = {}
    host: list[str] = []
    links: set[str] = set()
    marked: set[str] = set()
    svc_states: dict[str, tuple[str, str]] = {}
    nginx = user = group = no_user = False
    allowed_host = set(host_paths(nvme_path))
    for line in lines:
        kind, _, rest = line.strip().partition(" ")
        if kind in ("ledger", "unit", "state", "url", "path", "watchdog"):
            name, _, value = rest.partition(" ")
            if not NAME.fullmatch(name):
                continue
            d = deps.setdefault(name, {"name": name, "paths": []})
            if kind in ("ledger", "unit"):
                d[kind] = True
            elif kind in ("state", "watchdog"):
                active, _, enabled = value.partition(" ")
                prefix = "" if kind == "state" else "watchdog_"
                d[prefix + "active"], d[prefix + "enabled"] = active, enabled.strip() or "-"
            elif kind == "url":
                d["health_url"] = value.strip() or None
            elif value in deployment_paths(name, nvme_path):
                d["paths"].append(value)
        elif kind == "host" and rest in allowed_host:
            host.append(rest)
        elif kind == "link" and rest in allowed_host:
            links.add(rest)
        elif kind == "marked" and rest in marked_paths():
            marked.add(rest)
        elif kind == "svc":
            name, _, value = rest.partition(" ")
            if name in services():
                active, _, enabled = value.partition(" ")
                svc_states[name] = (active, enabled.strip() or "-")
        elif kind == "nginx":
            nginx = rest.strip() == "active"
        elif kind == "user":
            user = True
        elif kind == "nouser":
            no_user = True
        elif kind == "group":
            group = True
    found = {}
    for name, d in sorted(deps.items()):
        if not (d.get("ledger") or d.get("unit")):
            continue   # state/url/path lines without a reason to think it is gpuserve's
        have = set(d.pop("paths"))
        paths = tuple(p for p in deployment_paths(name, nvme_path) if p in have)
        found[name] = Found(**d, paths=paths)
    order = host_paths(nvme_path)
    # the group goes with gpuserve's user, or alone once that user is gone (a rerun); never
    # while another user of that name exists
    return Footprint(found, tuple(p for p in order if p in host), nginx, user,
                     group and (user or no_user), tuple(p for p in marked_paths() if p in marked),
                     tuple(p for p in order if p in host and p in links), svc_states)


# --- what goes ----------------------------------------------------------------------------------

@dataclass(frozen=True)
class Removal:
    """What removing one deployment takes on its host, in order."""

    name: str
    drain: bool                # running: out of rotation, wait for its requests, then stop
    stop: bool
    disable: bool
    paths: tuple[str, ...]     # removed in this order (the ledger last)
    engine_address: tuple[str, int] | None = None
    watchdog_stop: bool = False      # its hang watchdog runs: stopped before anything else
    watchdog_disable: bool = False   # ... and is enabled

    @property
    def watchdog_unit(self) -> str:
        return watchdog_unit(self.name)

    @property
    def nginx_changed(self) -> bool:
        return any(is_nginx_path(p) for p in self.paths)

    @property
    def behind_proxy(self) -> bool:
        return proxy_site(self.name) in self.paths

    @property
    def drain_flag(self) -> str | None:
        """The flag the drain creates (gpuserve.rollout.drain_flag) when the deployment is behind
        the proxy: it is made during the run, after the footprint was read, so it is removed by
        name once the engine is stopped (the proxy's /health answers 503 until then)."""
        return rollout.drain_flag(self.name) if self.drain and self.behind_proxy else None

    @property
    def files(self) -> tuple[str, ...]:
        """The paths removed after the stop (the drain flag apart, when the drain makes it)."""
        return tuple(p for p in self.paths if p != self.drain_flag)

    def describe(self) -> list[str]:
        steps = []
        if self.watchdog_stop or self.watchdog_disable:
            steps.append(f"{self.watchdog_unit} "
                         + " and ".join(w for w, on in (("stopped", self.watchdog_stop),
                                                        ("disabled", self.watchdog_disable)) if on))
        if self.drain:
            steps.append("out of rotation, drained")
        if self.stop:
            steps.append(f"{layout.unit_name(self.name)} stopped")
        if self.disable:
            steps.append("disabled")
        if self.drain_flag:
            steps.append(f"remove {self.drain_flag}")
        steps += [f"remove {p}" for p in self.files]
        return steps


def removal(found: Found) -> Removal:
    return Removal(name=found.name, drain=found.running and found.active == "active",
                   stop=found.running, disable=found.is_enabled, paths=found.paths,
                   engine_address=found.engine_address(), watchdog_stop=found.watchdog_running,
                   watchdog_disable=found.watchdog_is_enabled)


def leftovers(footprint: Footprint, keep: Iterable[str]) -> list[Removal]:
    """The deployments on the host that the plan does not keep, each with what removing it takes."""
    kept = set(keep)
    return [removal(f) for name, f in footprint.deployments.items() if name not in kept]


def without_the_runs_lock(footprint: Footprint) -> Footprint:
    """The footprint less the rollout lock's directory: a decommission holds that lock while it
    runs (deploys/decommission.py), and its release removes the directory last, once every
    operation has ended (gpuserve.rollout.lock.lock_release)."""
    lock_dir = layout.ROLLOUT_LOCK_DIR
    return replace(footprint, host_paths=tuple(p for p in footprint.host_paths if p != lock_dir),
                   links=tuple(p for p in footprint.links if p != lock_dir))


def decommission_paths(footprint: Footprint) -> tuple[str, ...]:
    """Host-wide paths decommission removes after every deployment's own; a path under one
    already listed is left to it (removing /opt/gpuserve takes /opt/gpuserve/envs). The MARKED
    files of gpuserve's come last (their services are stopped before: decommission_services)."""
    out: list[str] = []
    for p in footprint.host_paths:
        if not any(p.startswith(q.rstrip("/") + "/") for q in footprint.host_paths if q != p):
            out.append(p)
    return (*out, *footprint.marked)


@dataclass(frozen=True)
class ServiceStop:
    """A service whose configuration decommission removes: what stopping it takes. ``stop`` is
    systemd's ActiveState, not pyinfra's running fact: a unit in a restart loop (activating,
    auto-restart) is not "running" to pyinfra, and would come back after its files went."""

    name: str
    stop: bool
    disable: bool


def decommission_services(footprint: Footprint) -> tuple[ServiceStop, ...]:
    """The services whose configuration decommission removes (MARKED files that are gpuserve's):
    stopped and disabled before their files go, where they run or are enabled. Their packages
    stay."""
    out = []
    for name in dict.fromkeys(svc for p, svc in MARKED if svc and p in footprint.marked):
        active, enabled = footprint.service_states.get(name, ("", "-"))
        if _running(active) or _enabled(enabled):
            out.append(ServiceStop(name, _running(active), _enabled(enabled)))
    return tuple(out)


FILE_SUFFIXES = (".conf", ".service", ".yml", ".prom", ".tmp", ".cred", ".log", ".nft", *KEY_SUFFIXES, *RUN_SUFFIXES)


def is_file(path: str) -> bool:
    """Whether one of the paths above is a file (else a directory gpuserve made)."""
    return path.endswith(FILE_SUFFIXES) or path in marked_paths()
