"""OS and kernel security updates as a rollout reason (deploys/patch.py; docs/patching.md).

Pure: which packages an update moves, whether it installs a new kernel, which kernel the host
boots next, and whether the GPU driver's kernel module was built (DKMS) for that kernel. The
layer (gpuserve.layers.patch) reads the facts (gpuserve.facts.kernel) and hands them here; the
move itself is the GPU-stack move's pipeline (gpuserve.layers.stack_move) with a different
"change" step:

    out -> drained -> stop -> apt upgrade within the holds -> [a new kernel: its driver module
    built? -> reboot -> running the new kernel? -> driver loaded, GPUs, services] -> admission
    -> start -> gate -> in

Every host whose update moves any package takes this move, kernel or not: maintainer scripts
restart the services they update (nginx, the host's TLS front door, among them), and a library
replaced under a running engine is patched only once the engine restarts. A host with nothing
to update, and no kernel waiting to boot, does not move.

Hosts of the role groups (gateway, monitor) take the same move without deployments or a DKMS
check (no GPU driver), after every serving host, one at a time, the gateways last (batches), and
never the last gateway that serves (last_gateway_refusal) unless the operator allows it.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from functools import cmp_to_key
from typing import Iterable, Sequence

from gpuserve import gateway, layout, monitoring
from gpuserve.rollout.plan import StackMove
from gpuserve.rollout.plan import batches  # noqa: F401 - the one batcher: role hosts last (ROLE_ORDER)
# an OS-update move's rules, with every other precondition in one module
from gpuserve.rollout.preconditions import (DRIVER_MODULES, gateway_problem, last_gateway_refusal,  # noqa: F401
                                            module_problem, stack_change_refusal, unfinished_patch_refusal)

# a patch move that began and has not finished (the host is out of rotation): a rerun finishes it
PATCH_MOVING = layout.PATCH_MOVING

# Upgrades only what is installed, installs what an upgrade newly depends on (a kernel
# metapackage's new ABI package), removes nothing, and never touches held packages (the GPU
# stack's set: apt keeps them back; --allow-change-held-packages is never given). Configuration
# files changed locally are kept.
# Both wait up to 10 minutes for apt's lock (unattended-upgrades holds it on many Debian images)
# rather than failing at once with "Could not get lock".
APT_LOCK_WAIT = "-o DPkg::Lock::Timeout=600"
APT_UPGRADE = (f"DEBIAN_FRONTEND=noninteractive NEEDRESTART_MODE=l apt-get -q -y {APT_LOCK_WAIT} "
               "-o Dpkg::Options::=--force-confdef -o Dpkg::Options::=--force-confold "
               "--with-new-pkgs upgrade")
APT_SIMULATE = "LC_ALL=C apt-get -s -q --with-new-pkgs upgrade"
APT_UPDATE = f"DEBIAN_FRONTEND=noninteractive apt-get update -q {APT_LOCK_WAIT}"


# --- Debian version order (dpkg's verrevcmp), for versions and kernel releases -------------------
def _order(c: str) -> int:
    if c == "~":
        return -1
    if c.isdigit():
        return 0
    if c.isalpha():
        return ord(c)
    return ord(c) + 256


def _verrevcmp(a: str, b: str) -> int:
    i = j = 0
    while i < len(a) or j < len(b):
        first_diff = 0
        while (i < len(a) and not a[i].isdigit()) or (j < len(b) and not b[j].isdigit()):
            ac = _order(a[i]) if i < len(a) and not a[i].isdigit() else 0
            bc = _order(b[j]) if j < len(b) and not b[j].isdigit() else 0
            if ac != bc:
                return ac - bc
            i += 1
            j += 1
        while i < len(a) and a[i] == "0":
            i += 1
        while j < len(b) and b[j] == "0":
            j += 1
        while i < len(a) and a[i].isdigit() and j < len(b) and b[j].isdigit():
            if not first_diff:
                first_diff = ord(a[i]) - ord(b[j])
            i += 1
            j += 1
        if i < len(a) and a[i].isdigit():
            return 1
        if j < len(b) and b[j].isdigit():
            return -1
        if first_diff:
            return first_diff
    return 0


def compare_versions(a: str, b: str) -> int:
    """dpkg --compare-versions: <0, 0, >0. Kernel releases ('6.1.0-28-amd64') sort the same way,
    as Debian's `linux-version sort` and GRUB's menu order do."""
    def split(v: str) -> tuple[int, str, str]:
        epoch, _, rest = v.partition(":") if ":" in v else ("0", "", v)
        upstream, _, revision = rest.rpartition("-") if "-" in rest else (rest, "", "")
        return int(epoch or 0), upstream, revision
    ea, ua, ra = split(a)
    eb, ub, rb = split(b)
    if ea != eb:
        return ea - eb
    return _verrevcmp(ua, ub) or _verrevcmp(ra, rb)


def newest(releases: Iterable[str]) -> str | None:
    out = None
    for r in releases:
        if out is None or compare_versions(r, out) > 0:
            out = r
    return out


# --- kernel packages -------------------------------------------------------------------------------
# linux-image-6.1.0-28-amd64 (Debian), linux-image-6.8.0-50-generic and linux-image-unsigned-...
# (Ubuntu): a release starts with a digit; metapackages (linux-image-amd64, -generic) do not
_IMAGE = re.compile(r"^linux-image-(?:unsigned-)?(\d[^\s]*)$")


def kernel_release(package: str) -> str | None:
    """'linux-image-6.1.0-28-amd64' -> '6.1.0-28-amd64'; None for anything else (metapackages too)."""
    m = _IMAGE.fullmatch(package)
    return m.group(1) if m else None


@dataclass(frozen=True)
class DkmsModule:
    """One DKMS module installed for one kernel: /var/lib/dkms/<module>/kernel-<kernel>-<arch>
    is a link to <version>/<kernel>/<arch> (DKMS 2 and 3 mark an installed build this way)."""
    module: str
    version: str
    kernel: str
    arch: str


@dataclass(frozen=True)
class KernelState:
    running: str | None                 # /proc/sys/kernel/osrelease (what `uname -r` prints)
    installed: tuple[str, ...]          # releases with a /boot/vmlinuz-<release>
    dkms: tuple[DkmsModule, ...] = ()

    @property
    def boot_target(self) -> str | None:
        """The kernel the host boots next: the newest installed (GRUB's default on Debian and
        Ubuntu, unless GRUB_DEFAULT says otherwise)."""
        return newest(self.installed)

    @property
    def change(self) -> str | None:
        """The kernel a reboot would bring, when it is not the running one; None otherwise (no
        kernel installed at all, as in a container, counts as no change)."""
        target = self.boot_target
        return target if target and target != self.running else None


RUNNING_MARK, BOOT_MARK, DKMS_MARK = "running:", "boot:", "dkms:"


def kernel_state_command() -> str:
    """One round trip: the running release, the installed images, the DKMS builds."""
    return (f"echo {RUNNING_MARK}$(cat /proc/sys/kernel/osrelease); "
            f"for f in /boot/vmlinuz-*; do [ -e \"$f\" ] && echo {BOOT_MARK}${{f#/boot/vmlinuz-}}; done; "
            f"for l in /var/lib/dkms/*/kernel-*; do [ -L \"$l\" ] && echo {DKMS_MARK}$l $(readlink \"$l\"); done; "
            "true")


def parse_kernel_state(lines: Iterable[str]) -> KernelState:
    running, installed, dkms = None, [], []
    for line in lines:
        line = line.strip()
        if line.startswith(RUNNING_MARK):
            running = line[len(RUNNING_MARK):].strip() or None
        elif line.startswith(BOOT_MARK):
            release = line[len(BOOT_MARK):].strip()
            if release and not release.endswith((".old", ".bak", ".dpkg-tmp")):
                installed.append(release)
        elif line.startswith(DKMS_MARK):
            module = parse_dkms_link(*line[len(DKMS_MARK):].split(None, 1))
            if module:
                dkms.append(module)
    return KernelState(running, tuple(sorted(set(installed))), tuple(dkms))


def parse_dkms_link(path: str, target: str = "") -> DkmsModule | None:
    """('/var/lib/dkms/nvidia/kernel-6.1.0-28-amd64-x86_64', '580.95.05/6.1.0-28-amd64/x86_64')."""
    parts = path.rstrip("/").split("/")
    t = target.strip().strip("/").split("/")
    if len(parts) < 2 or len(t) != 3 or not parts[-1].startswith("kernel-"):
        return None
    version, kernel, arch = t
    if parts[-1] != f"kernel-{kernel}-{arch}":
        return None
    return DkmsModule(parts[-2], version, kernel, arch)


# --- the upgrade ------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Upgrade:
    package: str
    installed: str | None   # None: newly installed (a new kernel ABI package)
    version: str


_INST = re.compile(r"^Inst (\S+) (?:\[([^\]]+)\] )?\((\S+)")


def parse_simulation(lines: Iterable[str]) -> list[Upgrade]:
    """`apt-get -s upgrade` -> what it would install ("Inst name [old] (new suite [arch])")."""
    out = []
    for line in lines:
        m = _INST.match(line.strip())
        if m:
            out.append(Upgrade(m.group(1), m.group(2), m.group(3)))
    return out


def new_kernels(upgrades: Iterable[Upgrade]) -> list[str]:
    return sorted({r for u in upgrades if (r := kernel_release(u.package))}, key=cmp_to_key(compare_versions))


def held_in(upgrades: Iterable[Upgrade], held: Iterable[str]) -> list[str]:
    """Held packages an upgrade would move: never expected (apt keeps them back); checked anyway."""
    hold = set(held)
    return sorted(u.package for u in upgrades if u.package in hold)


def held_changed(before: dict[str, str], after: dict[str, str]) -> list[str]:
    """Held packages whose version differs after the update: 'name before -> after'."""
    return [f"{n} {before[n]} -> {after.get(n, '(removed)')}" for n in sorted(before)
            if after.get(n) != before[n]]


def pending_reason(upgrades: list[Upgrade], state: KernelState) -> str | None:
    """Why a host moves (None: it does not): packages to update, a kernel among them, or a
    kernel installed earlier and not booted yet."""
    parts = []
    if upgrades:
        names = [u.package for u in upgrades]
        shown = ", ".join(names[:8]) + (f" and {len(names) - 8} more" if len(names) > 8 else "")
        parts.append(f"{len(upgrades)} package(s) to update: {shown}")
    kernels = new_kernels(upgrades)
    if kernels:
        parts.append(f"kernel {state.running or '?'} -> {newest(kernels)} (reboot)")
    elif state.change:
        parts.append(f"kernel {state.change} installed, {state.running or '?'} running (reboot owed)")
    return "; ".join(parts) or None


@dataclass(frozen=True)
class PatchMove(StackMove):
    """The host move of deploys/patch.py: the GPU-stack move's pipeline (every deployment out,
    drained, stopped; change; reboot if needed; verify; admission; start; gate; in) whose change
    is the OS update. ``pins`` are the host's current stack pins: the GPU stack stays as it is."""
    upgrades: tuple[str, ...] = ()    # packages the plan saw (the move upgrades what apt offers then)
    kernel: str | None = None         # the kernel it expects to boot into, when one changes
    role: str | None = None           # GATEWAY, MONITOR (role_of), or None: a serving host
    units: tuple[str, ...] = ()       # the role's services, active again before the move ends

    change = "os-update"     # its change step (gpuserve.layers.stack_move.CHANGES)
    marker = PATCH_MOVING

    def __str__(self) -> str:
        return f"{self.host} OS updates ({self.reason})"

    @property
    def title(self) -> str:
        return "OS update move"


# --- hosts of role groups (gateway, monitor): docs/patching.md, "Gateway and monitor hosts" -----
GATEWAY, MONITOR = gateway.GATEWAY_GROUP, monitoring.MONITOR_GROUP
ROLE_UNITS = {GATEWAY: ("nginx.service", gateway.UNIT),
              MONITOR: ("prometheus.service", "prometheus-alertmanager.service")}


def role_of(serves: bool, is_gateway: bool) -> str | None:
    """How a host's patch move is ordered: GATEWAY for a gateway (serving too or not: every
    serving host's move goes out and back in through every gateway), MONITOR for a host of the
    group monitor that serves nothing, None for a serving host."""
    if is_gateway:
        return GATEWAY
    return None if serves else MONITOR


def role_units(is_gateway: bool, is_monitor: bool) -> tuple[str, ...]:
    """The services a host's role runs (active again before its patch move ends)."""
    return ((ROLE_UNITS[GATEWAY] if is_gateway else ()) + (ROLE_UNITS[MONITOR] if is_monitor else ()))


def gateway_units_command() -> str:
    """Exits 0 only when nginx (the clients' front) and smg are both active. One
    ``systemctl is-active`` naming both exits 0 when either is (systemctl(1)): ask each."""
    return f"systemctl is-active -q nginx.service && systemctl is-active -q {gateway.UNIT}"


def enabled_units_command(units: Sequence[str]) -> str:
    """Prints those of ``units`` that start at boot (enabled), one a line: the role's services
    this host runs (a monitor group host may never have been converged with Prometheus)."""
    return " ".join(f"systemctl is-enabled -q {u} 2>/dev/null && echo {u};" for u in units) + " true"


def inactive(units: Sequence[str], is_active_output: str) -> list[str]:
    """The units `systemctl is-active <units>` does not report active (one state per line)."""
    states = is_active_output.split()
    return [u for i, u in enumerate(units) if i >= len(states) or states[i] != "active"]
