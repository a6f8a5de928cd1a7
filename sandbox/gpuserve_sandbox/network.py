"""This machine's side of a sandbox's network.

Instance k owns bridge ``gsbr<k>`` with 10.231.k.1/24; its hosts are 10.231.k.2, .3, ...
Hosts have no route out: apt goes through an apt-cacher-ng listening on the bridge address only,
so test traffic never leaves loopback and the bridge. lxcfs (shared by all instances) gives each
host its own /proc/uptime, which pyinfra's server.reboot needs to see a reboot happen.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import time
from pathlib import Path

from gpuserve_sandbox.util import SandboxError, log, run

APT_CACHE_PORT = 3142


def subnet_prefix(instance: int) -> str:
    if not 0 <= instance <= 255:
        raise SandboxError(f"sandbox instance must be 0..255, got {instance}")
    return f"10.231.{instance}"


def bridge_ip(instance: int) -> str:
    return f"{subnet_prefix(instance)}.1"


def bridge_name(instance: int) -> str:
    return f"gsbr{instance}"


def apt_proxy_url(instance: int) -> str:
    return f"http://{bridge_ip(instance)}:{APT_CACHE_PORT}"


def link_exists(name: str) -> bool:
    return run(["ip", "link", "show", name], check=False).returncode == 0


def ensure_bridge(instance: int) -> None:
    br = bridge_name(instance)
    if not link_exists(br):
        run(["ip", "link", "add", br, "type", "bridge"])
        run(["ip", "addr", "add", f"{bridge_ip(instance)}/24", "dev", br])
    run(["ip", "link", "set", br, "up"])


def delete_bridge(instance: int) -> None:
    run(["ip", "link", "del", bridge_name(instance)], check=False)


def port_open(host: str, port: int) -> bool:
    try:
        with socket.create_connection((host, port), timeout=0.5):
            return True
    except OSError:
        return False


def pid_alive(pidfile: Path) -> int | None:
    try:
        pid = int(pidfile.read_text().strip())
        os.kill(pid, 0)
        return pid
    except (OSError, ValueError):
        return None


def signal_pid(pid: int, sig: int) -> bool:
    """Send sig to pid; False when the process is gone.

    A process can exit between a check and the signal (lxcfs leaves as soon as its mount is
    unmounted), so for a stop "no such process" is the outcome we wanted, not an error.
    """
    try:
        os.kill(pid, sig)
        return True
    except ProcessLookupError:
        return False


def signal_pidfile(pidfile: Path, sig: int) -> int | None:
    """Send sig to the process named in pidfile; the pid it reached, or None when it is gone."""
    pid = pid_alive(pidfile)
    return pid if pid and signal_pid(pid, sig) else None


def ensure_apt_cache(instance: int, state_dir: Path, mirror: str) -> str:
    """Start this instance's apt-cacher-ng on the bridge address (its cache persists on disk)."""
    addr = bridge_ip(instance)
    url = apt_proxy_url(instance)
    acng = state_dir / "acng"
    if pid_alive(acng / "launcher.pid") and port_open(addr, APT_CACHE_PORT):
        return url
    binary = shutil.which("apt-cacher-ng") or "/usr/sbin/apt-cacher-ng"
    if not Path(binary).exists():
        raise SandboxError("apt-cacher-ng is not installed here: run dev/bootstrap.sh")
    # our own copy of its configuration: the package's default Debian backend (ftp.debian.org)
    # does not resolve everywhere, and we must not edit this machine's /etc
    conf = acng / "conf"
    shutil.rmtree(conf, ignore_errors=True)
    shutil.copytree("/etc/apt-cacher-ng", conf)
    (conf / "backends_debian").write_text(mirror.rstrip("/") + "/\n")
    for sub in ("cache", "log"):
        (acng / sub).mkdir(parents=True, exist_ok=True)
    run(["chown", "-R", "apt-cacher-ng:", str(acng)])
    out = open(acng / "stdout", "ab")
    proc = subprocess.Popen(
        ["runuser", "-u", "apt-cacher-ng", "--", binary, "-c", str(conf), "ForeGround=1",
         f"BindAddress={addr}", f"Port={APT_CACHE_PORT}", f"CacheDir={acng / 'cache'}",
         f"LogDir={acng / 'log'}", f"PidFile={acng / 'pid'}"],
        stdin=subprocess.DEVNULL, stdout=out, stderr=out, start_new_session=True,
    )
    (acng / "launcher.pid").write_text(str(proc.pid))
    for _ in range(100):
        if port_open(addr, APT_CACHE_PORT):
            return url
        if proc.poll() is not None:
            break
        time.sleep(0.1)
    raise SandboxError(f"apt-cacher-ng did not start on {addr}:{APT_CACHE_PORT}; see {acng / 'stdout'}")


def stop_apt_cache(state_dir: Path) -> None:
    acng = state_dir / "acng"
    for name in ("pid", "launcher.pid"):
        signal_pidfile(acng / name, signal.SIGTERM)
        (acng / name).unlink(missing_ok=True)


def lxcfs_serving(mnt: Path) -> bool:
    """True when lxcfs answers on mnt (a mount whose lxcfs process died answers ENOTCONN)."""
    try:
        (mnt / "proc" / "uptime").read_text()
        return True
    except OSError:
        return False


def _listed_as_mount(mnt: Path) -> bool:
    target = str(mnt)
    with open("/proc/self/mountinfo") as f:
        return any(line.split()[4] == target for line in f)


def ensure_lxcfs(root: Path) -> Path | None:
    """Mount lxcfs at <root>/lxcfs (once for all instances). None when lxcfs is not installed.

    A mount left behind by an lxcfs that died (killed with its session, say) answers every
    access with "Transport endpoint is not connected"; it is detached and lxcfs started again.
    """
    mnt = root / "lxcfs"
    if lxcfs_serving(mnt):
        return mnt
    if _listed_as_mount(mnt):
        log(f"lxcfs on {mnt} no longer answers (its process is gone); detaching it and starting lxcfs again")
        signal_pidfile(root / "lxcfs.pid", signal.SIGKILL)
        run(["umount", "-l", str(mnt)], check=False)
    binary = shutil.which("lxcfs")
    if not binary:
        log("lxcfs is not installed: hosts share this machine's /proc/uptime (pyinfra server.reboot "
            "cannot see a reboot); run dev/bootstrap.sh")
        return None
    mnt.mkdir(parents=True, exist_ok=True)
    out = open(root / "lxcfs.log", "ab")
    subprocess.Popen([binary, "-f", "-p", str(root / "lxcfs.pid"), str(mnt)],
                     stdin=subprocess.DEVNULL, stdout=out, stderr=out, start_new_session=True)
    for _ in range(50):
        if lxcfs_serving(mnt):
            return mnt
        time.sleep(0.1)
    raise SandboxError(f"lxcfs did not mount on {mnt}; see {root / 'lxcfs.log'}")


def stop_lxcfs(root: Path) -> None:
    mnt = root / "lxcfs"
    run(["umount", str(mnt)], check=False)
    signal_pidfile(root / "lxcfs.pid", signal.SIGTERM)   # lxcfs usually leaves by itself once unmounted


# --- link shaping (benches): every link at the same rate, so bandwidth decides, not CPU ----------
# tbf (token bucket) on each egress: the bridge device (what this machine, the control node, sends
# to the hosts), each host's bridge-side veth (what the host receives) and each host's eth0 inside
# its namespace (what it sends). netem is not in this kernel; tbf is.


def shaped_links(instance: int, machines: list[str]) -> list[tuple[str | None, str]]:
    """(network namespace or None for this machine, device) of every egress a sandbox link has."""
    links: list[tuple[str | None, str]] = [(None, bridge_name(instance))]
    for m in machines:
        links += [(None, f"{m}h"), (m, "eth0")]
    return links


def _in(ns: str | None) -> list[str]:
    """The prefix that runs a command inside network namespace ``ns`` (None: on this machine)."""
    return ["ip", "netns", "exec", ns] if ns else []


def _tc(ns: str | None, *args: str, check: bool = True) -> subprocess.CompletedProcess:
    return run([*_in(ns), "tc", *args], check=check)


def shape(instance: int, machines: list[str], rate_mbit: float) -> None:
    """Limit every link of the instance to ``rate_mbit`` megabits per second in each direction.
    The bucket holds 64 KiB segments (veths do GSO) and 50 ms of queue."""
    burst = max(256 * 1024, int(rate_mbit * 1e6 / 8 / 100))
    for ns, dev in shaped_links(instance, machines):
        _tc(ns, "qdisc", "replace", "dev", dev, "root", "tbf", "rate", f"{rate_mbit}mbit",
            "burst", str(burst), "latency", "50ms")


def unshape(instance: int, machines: list[str]) -> None:
    for ns, dev in shaped_links(instance, machines):
        _tc(ns, "qdisc", "del", "dev", dev, "root", check=False)


def tx_bytes(dev: str, ns: str | None = None) -> int:
    """Bytes the device has sent (this machine's device, or one inside a host's namespace)."""
    out = run([*_in(ns), "cat",
               f"/sys/class/net/{dev}/statistics/tx_bytes"], check=False).stdout
    return int(out.strip() or 0)
