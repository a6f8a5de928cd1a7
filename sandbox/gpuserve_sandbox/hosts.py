"""Sandbox hosts: real Debian hosts on this machine, reachable over SSH like production ones.

Each host boots the shared base image through its own overlayfs (copy-on-write, so a new host
costs a mount, not a copy) with systemd-nspawn: systemd is PID 1, sshd and apt are real, and the
host lives in its own network namespace with its own address on the instance's bridge. Only the
GPUs are simulated (see simgpu).

Several instances (0..255) can run side by side: instance k uses bridge gsbr<k>, 10.231.k.0/24
and the state directory <root>/instance-<k>/. Everything needs root.
"""

from __future__ import annotations

import json
import os
import shlex
import shutil
import signal
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass
from pathlib import Path

from gpuserve_sandbox import image, network, simgpu, standin_repo
from gpuserve_sandbox import services as services_mod
from gpuserve_sandbox.simgpu import HostSpec
from gpuserve_sandbox.util import SandboxError, file_lock, log, run

DEFAULT_ROOT = "/var/tmp/gpuserve-sandbox"
# every host also has this non-root login user: the sandbox's SSH key, passwordless sudo (as most
# fleets forbid root logins); inventories/sandbox.py logs in as it unless told otherwise (inventory.py)
LOGIN_USER = "deploy"
DEFAULT_MIRROR = "http://deb.debian.org/debian"
# profiles given to `up --hosts N` when none are named: one of each NVIDIA shape, in turn
DEFAULT_PROFILES = ("hopper_x8", "blackwell_x4")
REQUIRED_TOOLS = {
    "debootstrap": "debootstrap", "systemd-nspawn": "systemd-container", "ip": "iproute2",
    "ssh": "openssh-client", "ssh-keygen": "openssh-client", "mountpoint": "util-linux",
    "apt-cacher-ng": "apt-cacher-ng", "gcc": "gcc", "gpg": "gnupg", "dpkg-scanpackages": "dpkg-dev",
}


@dataclass(frozen=True)
class SandboxHost:
    name: str       # inventory name and hostname, e.g. sandbox-1
    index: int      # 1-based within the instance
    ip: str
    spec: str       # simulated hardware, e.g. "hopper_x8" or "hopper_x8:no-nvswitch"
    machine: str    # nspawn machine / netns name, unique on this machine

    @property
    def host_spec(self) -> HostSpec:
        return HostSpec.parse(self.spec)


def default_instance() -> int:
    return int(os.environ.get("GPUSERVE_SANDBOX_INSTANCE", "0"))


def default_root() -> Path:
    return Path(os.environ.get("GPUSERVE_SANDBOX_ROOT", DEFAULT_ROOT))


class Sandbox:
    """One instance of the sandbox: its network, its hosts and its state on disk."""

    def __init__(self, instance: int | None = None, root: Path | str | None = None,
                 mirror: str | None = None):
        self.instance = default_instance() if instance is None else instance
        network.subnet_prefix(self.instance)  # validates the range
        self.root = Path(root) if root is not None else default_root()
        self.mirror = mirror or os.environ.get("GPUSERVE_SANDBOX_MIRROR", DEFAULT_MIRROR)
        self.state_dir = self.root / f"instance-{self.instance}"

    # --- paths everybody needs (inventory, tests, ssh) ----------------------------------------
    @property
    def key(self) -> Path:
        return self.root / "id_ed25519"

    @property
    def known_hosts(self) -> Path:
        return self.state_dir / "known_hosts"

    @property
    def ssh_config(self) -> Path:
        return self.state_dir / "ssh_config"

    @property
    def state_file(self) -> Path:
        return self.state_dir / "sandbox.json"

    @property
    def bridge_ip(self) -> str:
        return network.bridge_ip(self.instance)

    def host_dir(self, host: SandboxHost) -> Path:
        return self.state_dir / "hosts" / host.name

    def hosts(self) -> list[SandboxHost]:
        """The hosts of this instance, as the last `up` left them ([] when none)."""
        try:
            data = json.loads(self.state_file.read_text())
        except FileNotFoundError:
            return []
        return [SandboxHost(**h) for h in data["hosts"]]

    def ssh_args(self, host: SandboxHost, *, batch: bool = True, user: str = "root") -> list[str]:
        return ["ssh", "-i", str(self.key), "-o", f"UserKnownHostsFile={self.known_hosts}",
                "-o", "StrictHostKeyChecking=yes", "-o", f"BatchMode={'yes' if batch else 'no'}",
                "-o", "IdentitiesOnly=yes", "-o", "ConnectTimeout=3", "-o", "LogLevel=ERROR",
                f"{user}@{host.ip}"]

    def ssh(self, host: SandboxHost, command: str, *, check: bool = True,
            timeout: float = 120) -> subprocess.CompletedProcess:
        return run([*self.ssh_args(host), command], check=check, timeout=timeout)

    def reboot(self, host: SandboxHost, wait: float = 90) -> None:
        """`systemctl reboot` inside the host, and wait until it runs again under a new boot ID."""
        boot_id = self.ssh(host, "cat /proc/sys/kernel/random/boot_id").stdout
        self.ssh(host, "systemctl reboot", check=False)
        deadline = time.monotonic() + wait
        while time.monotonic() < deadline:
            p = self.ssh(host, "systemctl is-system-running --wait; cat /proc/sys/kernel/random/boot_id",
                         check=False, timeout=30)
            if p.returncode in (0, 1) and p.stdout.split()[-1:] != boot_id.split():
                return
            time.sleep(0.5)
        raise SandboxError(f"{host.name} did not come back from its reboot within {wait:.0f} s")

    # --- simulated hardware faults (simgpu.FAULTS) ----------------------------------------------
    def set_fault(self, host: SandboxHost, gpu: int, fault: str, value: int | None = None,
                  persistent: bool = True) -> dict:
        """Switch a hardware fault on for one GPU of a running host: the stand-in tools report it
        from now on; an XID is logged to the host's kernel log at once (and again at every boot
        while the fault is set and persistent). Transient faults end at the host's next boot."""
        root = self.host_dir(host) / "root"
        entry = simgpu.add_fault(root, gpu, fault, value, persistent)
        if fault == "xid":
            self.ssh(host, f"/{simgpu.BIN_DIR}/kmsg log {shlex.quote(entry['line'])}")
        return entry

    def clear_faults(self, host: SandboxHost, gpu: int | None = None, fault: str | None = None) -> list[dict]:
        """Switch faults off (all of the host's, one GPU's, or one kind). A logged XID stays in
        the kernel log until the host reboots, as on real hardware."""
        return simgpu.clear_faults(self.host_dir(host) / "root", gpu, fault)

    def faults(self, host: SandboxHost) -> list[dict]:
        return simgpu.read_faults(self.host_dir(host) / "root")

    # --- up / down ----------------------------------------------------------------------------
    def up(self, specs: list[HostSpec], *, wait: float = 120, services: bool = True) -> list[SandboxHost]:
        """Replace this instance's hosts with fresh ones, booted and answering SSH.

        ``services``: also start the instance's hub and make sure the engine's wheelhouse exists
        (gpuserve_sandbox.services); tests that serve their own hub pass False.
        """
        if os.geteuid() != 0:
            raise SandboxError("the sandbox needs root (network namespaces, mounts, nspawn)")
        missing = sorted({pkg for tool, pkg in REQUIRED_TOOLS.items() if not shutil.which(tool)
                          and not Path(f"/usr/sbin/{tool}").exists()})
        if missing:
            raise SandboxError(f"missing Debian packages: {' '.join(missing)}; run dev/bootstrap.sh")
        if not specs:
            raise SandboxError("ask for at least one host")
        if len(specs) > 250:
            raise SandboxError("an instance holds at most 250 hosts")
        t0 = time.monotonic()
        with file_lock(self.state_dir / "lock"):
            self._down_hosts()
            base = image.ensure_image(self.root, self.mirror, in_use=self._image_in_use())
            self._ensure_key()
            network.ensure_bridge(self.instance)
            apt_proxy = network.ensure_apt_cache(self.instance, self.state_dir, self.mirror)
            standin_repo.ensure(self.root, self.state_dir, self.instance)
            lxcfs = network.ensure_lxcfs(self.root)
            prefix = network.subnet_prefix(self.instance)
            hosts = [SandboxHost(name=f"sandbox-{i}", index=i, ip=f"{prefix}.{i + 1}",
                                 spec=str(spec), machine=f"gs{self.instance}-{i}")
                     for i, spec in enumerate(specs, start=1)]
            self._write_state(hosts)
            t_prepare = time.monotonic()
            with ThreadPoolExecutor(max_workers=min(8, len(hosts))) as pool:
                keys = list(pool.map(lambda h: self._prepare(h, base, apt_proxy), hosts))
            self._write_access_files(hosts, keys)
            for host in hosts:
                self._boot(host, lxcfs)
            with ThreadPoolExecutor(max_workers=min(8, len(hosts))) as pool:
                states = list(pool.map(lambda h: self._wait_ready(h, wait), hosts))
            t_end = time.monotonic()
        for host, state in zip(hosts, states):
            log(f"{host.name} {host.ip} [{host.spec}] {state}")
        log(f"{len(hosts)} host(s) up in {t_end - t0:.1f} s "
            f"(image/network {t_prepare - t0:.1f} s, hosts {t_end - t_prepare:.1f} s); "
            f"inventory: inventories/sandbox.py (instance {self.instance})")
        services_mod.ensure_api_keys(self.state_dir)
        if services:
            t1 = time.monotonic()
            services_mod.start_hub(self.state_dir, self.instance)
            wheels = services_mod.ensure_wheelhouse()
            log(f"hub and wheelhouse ({wheels.path}) ready in {time.monotonic() - t1:.1f} s")
        return hosts

    def down(self) -> None:
        """Stop and remove this instance's hosts, its apt cache process and its bridge."""
        with file_lock(self.state_dir / "lock"):
            self._down_hosts()
            network.stop_apt_cache(self.state_dir)
            standin_repo.stop(self.state_dir)
            services_mod.stop_hub(self.state_dir)
            network.delete_bridge(self.instance)

    @classmethod
    def instances(cls, root: Path | None = None) -> list["Sandbox"]:
        root = root or default_root()
        found = sorted(int(p.name.split("-", 1)[1]) for p in root.glob("instance-*") if p.is_dir())
        return [cls(k, root) for k in found]

    # --- internals ----------------------------------------------------------------------------
    def _image_in_use(self) -> bool:
        base = str(image.base_dir(self.root))
        with open("/proc/self/mounts") as fh:
            return any(f"lowerdir={base}" in line for line in fh)

    def _ensure_key(self) -> None:
        with file_lock(self.root / "key.lock"):
            if not self.key.is_file():
                self.root.mkdir(parents=True, exist_ok=True)
                run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "gpuserve-sandbox",
                     "-f", str(self.key)])

    def _write_state(self, hosts: list[SandboxHost]) -> None:
        self.state_dir.mkdir(parents=True, exist_ok=True)
        tmp = self.state_file.with_suffix(".tmp")
        tmp.write_text(json.dumps({"instance": self.instance, "bridge_ip": self.bridge_ip,
                                   "hosts": [asdict(h) for h in hosts]}, indent=2) + "\n")
        tmp.rename(self.state_file)

    def _write_access_files(self, hosts: list[SandboxHost], host_keys: list[str]) -> None:
        self.known_hosts.write_text("".join(f"{h.ip} {k}\n" for h, k in zip(hosts, host_keys)))
        prefix = network.subnet_prefix(self.instance)
        self.ssh_config.write_text(
            f"Host {prefix}.*\n  User root\n  IdentityFile {self.key}\n  IdentitiesOnly yes\n"
            f"  UserKnownHostsFile {self.known_hosts}\n  StrictHostKeyChecking yes\n"
            "  BatchMode yes\n  LogLevel ERROR\n"
        )

    def _prepare(self, host: SandboxHost, base: Path, apt_proxy: str) -> str:
        """Network namespace, copy-on-write root and identity of one host. Returns its host key."""
        ns, veth = host.machine, f"{host.machine}h"
        run(["ip", "netns", "add", ns])
        run(["ip", "link", "add", veth, "type", "veth", "peer", "name", "eth0", "netns", ns])
        run(["ip", "link", "set", veth, "master", network.bridge_name(self.instance), "up"])
        for cmd in (["link", "set", "lo", "up"], ["addr", "add", f"{host.ip}/24", "dev", "eth0"],
                    ["link", "set", "eth0", "up"], ["route", "add", "default", "via", self.bridge_ip]):
            run(["ip", "-n", ns, *cmd])
        hdir = self.host_dir(host)
        shutil.rmtree(hdir, ignore_errors=True)
        root = hdir / "root"
        for sub in ("upper", "work", "root", "sim/proc-driver"):
            (hdir / sub).mkdir(parents=True)
        run(["mount", "-t", "overlay", "overlay", "-o",
             f"lowerdir={base},upperdir={hdir / 'upper'},workdir={hdir / 'work'}", str(root)])
        (root / "etc/hostname").write_text(host.name + "\n")
        (root / "etc/hosts").write_text(
            f"127.0.0.1 localhost\n127.0.1.1 {host.name}\n::1 localhost ip6-localhost\n")
        run(["systemd-machine-id-setup", f"--root={root}"])
        run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", f"root@{host.name}",
             "-f", str(root / "etc/ssh/ssh_host_ed25519_key")])
        # no resolver: apt reaches the mirror through the cache by address, nothing else goes out
        (root / "etc/resolv.conf").write_text(f"nameserver {self.bridge_ip}\n")
        (root / "etc/apt/apt.conf.d/01gpuserve-sandbox-proxy").write_text(
            f'Acquire::http::Proxy "{apt_proxy}";\n'
            f'Acquire::http::Proxy::{self.bridge_ip} "DIRECT";\n')
        ssh_dir = root / "root/.ssh"
        ssh_dir.mkdir(mode=0o700, exist_ok=True)
        shutil.copyfile(f"{self.key}.pub", ssh_dir / "authorized_keys")
        (ssh_dir / "authorized_keys").chmod(0o600)
        self._add_login_user(root)
        simgpu.install(root, host.host_spec, host.name)
        pub = (root / "etc/ssh/ssh_host_ed25519_key.pub").read_text().split()
        return f"{pub[0]} {pub[1]}"

    def _add_login_user(self, root: Path) -> None:
        """LOGIN_USER in the host's root: the sandbox's key, passwordless sudo, no password ("*").
        Made per host (a few ms) rather than in the shared base image, so no rebuild is needed."""
        run(["useradd", f"--root={root}", "--create-home", "--shell=/bin/bash", "--user-group", "--password=*",
             LOGIN_USER])
        uid, gid = next((int(f[2]), int(f[3])) for f in
                        (line.split(":") for line in (root / "etc/passwd").read_text().splitlines())
                        if f[0] == LOGIN_USER)
        ssh_dir = root / "home" / LOGIN_USER / ".ssh"
        ssh_dir.mkdir(mode=0o700)
        shutil.copyfile(f"{self.key}.pub", ssh_dir / "authorized_keys")
        (ssh_dir / "authorized_keys").chmod(0o600)
        for path in (ssh_dir, ssh_dir / "authorized_keys"):
            os.chown(path, uid, gid)
        sudoers = root / "etc/sudoers.d/gpuserve-sandbox"
        sudoers.write_text(f"# gpuserve sandbox: the login user of a fleet that forbids root logins\n"
                           f"{LOGIN_USER} ALL=(ALL:ALL) NOPASSWD: ALL\n")
        sudoers.chmod(0o440)

    def _boot(self, host: SandboxHost, lxcfs: Path | None) -> None:
        hdir = self.host_dir(host)
        args = [
            "--boot", f"--directory={hdir / 'root'}", f"--machine={host.machine}",
            f"--hostname={host.name}", "--register=no", "--keep-unit",
            f"--network-namespace-path=/run/netns/{host.machine}", "--resolv-conf=off",
            "--link-journal=no", "--console=read-only",
            # a real host's root may load nftables rules (the engine guard, gpuserve/engine_guard.py):
            # only in the host's own network namespace, as nspawn's --private-network grants it
            "--capability=CAP_NET_ADMIN",
            # a bind over /proc takes its source from inside the container: bind the dir in first
            f"--bind-ro={hdir / 'sim'}:/run/gpuserve-sim-host",
            "--bind-ro=/run/gpuserve-sim-host/proc-driver:/proc/driver",
            # the simulated running kernel (gpuserve_sandbox.simgpu.on_boot; deploys/patch.py)
            "--bind-ro=/run/gpuserve-sim-host/osrelease:/proc/sys/kernel/osrelease",
        ]
        if lxcfs is not None:
            args += [f"--bind-ro={lxcfs}:/run/lxcfs", "--bind-ro=/run/lxcfs/proc/uptime:/proc/uptime"]
        loop = simgpu.FILES / "nspawn-loop.sh"
        with open(hdir / "console.log", "ab") as out:
            proc = subprocess.Popen(
                ["bash", str(loop), sys.executable, str(hdir / "root"), str(hdir / "sim/proc-driver"),
                 "--", *args],
                stdin=subprocess.DEVNULL, stdout=out, stderr=out, start_new_session=True,
                # a pure cgroup2 tree inside, in a cgroup of this host's own (own_cgroups)
                env={**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1]),
                     "SYSTEMD_NSPAWN_UNIFIED_HIERARCHY": "1"},
                preexec_fn=_enter_cgroups(own_cgroups(host.machine)),
            )
        (hdir / "nspawn.pid").write_text(str(proc.pid))

    def _wait_ready(self, host: SandboxHost, wait: float) -> str:
        """Wait until sshd answers and systemd finished booting; return the system state."""
        deadline = time.monotonic() + wait
        pidfile = self.host_dir(host) / "nspawn.pid"
        state, retried = "unknown", False
        while time.monotonic() < deadline:
            if not _alive(pidfile):
                raise SandboxError(f"{host.name}: nspawn exited during boot; see "
                                   f"{self.host_dir(host) / 'console.log'}")
            proc = run([*self.ssh_args(host), "systemctl is-system-running --wait"],
                       check=False, timeout=max(5.0, deadline - time.monotonic()))
            state = proc.stdout.strip() or state
            if state == "running":
                return state
            if state == "degraded":
                failed = self._failed_units(host)
                if failed and not retried and self._retry_cgroup_failures(host, failed):
                    retried = True
                    continue
                return f"degraded (failed: {' '.join(failed)})"
            time.sleep(0.3)
        raise SandboxError(f"{host.name} ({host.ip}) not ready after {wait:.0f} s (state {state}); "
                           f"see {self.host_dir(host) / 'console.log'}")

    def journal_report(self, lines: int = 25) -> str:
        """For a failed test's report: on each running host, its failed units and the errors its
        journal logged this boot (a unit that failed and came back by Restart= is only there)."""
        # systemd's own notices say why a unit failed ("status=219/CGROUP", "start-limit-hit")
        script = ("systemctl --failed --no-legend --plain; echo '-- systemd:'; "
                  f"journalctl -b _PID=1 -p notice -n {lines} --no-pager -o short-monotonic; "
                  "echo '-- other errors:'; journalctl -b -p err -n 200 --no-pager -o short-monotonic "
                  f"| grep -v -e pam_env -e 'systemd\\[1\\]' | tail -n {lines}")
        parts = []
        for host in self.hosts():
            try:
                proc = run([*self.ssh_args(host), script], check=False, timeout=20)
                text = (proc.stdout + proc.stderr).strip() or "(nothing)"
            except subprocess.TimeoutExpired:
                text = "(no answer within 20 s)"
            parts.append(f"== {host.name} ({host.ip})\n{text}")
        return "\n".join(parts)

    def _failed_units(self, host: SandboxHost) -> list[str]:
        out = run([*self.ssh_args(host), "systemctl --failed --no-legend --plain"], check=False).stdout
        return [line.split()[0] for line in out.splitlines() if line.split() and "." in line.split()[0]]

    def _retry_cgroup_failures(self, host: SandboxHost, failed: list[str]) -> bool:
        """Start again, once, the units that failed "at step CGROUP" (exit status 219): under load, nspawn on this
        kind of machine sometimes fails the first units systemd spawns that way (a failure of the
        container runtime, not of the unit: systemd-remount-fs, systemd-tmpfiles-setup-dev were
        seen). Any other failure is left for the caller to report. True if it retried."""
        # 219 is systemd's EXIT_CGROUP ("status=219/CGROUP"): the unit never ran
        status = run([*self.ssh_args(host), "systemctl show -p ExecMainStatus --value "
                      + " ".join(shlex.quote(u) for u in failed)], check=False).stdout.split()
        cgroup = [u for u, code in zip(failed, status) if code == "219"]
        if not cgroup or len(cgroup) != len(failed):
            return False
        log(f"{host.name}: {' '.join(cgroup)} failed at step CGROUP during boot (a container "
            "runtime race under load); starting them again once")
        run([*self.ssh_args(host), f"systemctl reset-failed; systemctl restart {' '.join(cgroup)}"],
            check=False, timeout=60)
        return True

    def _down_hosts(self) -> None:
        hosts_dir = self.state_dir / "hosts"
        names = {h.name: h for h in self.hosts()}
        # also hosts a crashed `up` left behind before it wrote its state
        for leftover in (hosts_dir.iterdir() if hosts_dir.is_dir() else []):
            if leftover.name not in names:
                i = int(leftover.name.rsplit("-", 1)[1])
                names[leftover.name] = SandboxHost(leftover.name, i, "", "cpu", f"gs{self.instance}-{i}")
        if names:
            with ThreadPoolExecutor(max_workers=min(8, len(names))) as pool:
                list(pool.map(self._stop, names.values()))
        self.state_file.unlink(missing_ok=True)

    def _stop(self, host: SandboxHost) -> None:
        hdir = self.host_dir(host)
        pidfile = hdir / "nspawn.pid"
        pid = _alive(pidfile)
        if pid:
            network.signal_pid(pid, signal.SIGTERM)  # orderly poweroff of the host's systemd
            for _ in range(100):
                if not _alive(pidfile):
                    break
                time.sleep(0.2)
            else:
                log(f"{host.name}: no orderly shutdown after 20 s, killing it")
                run(["pkill", "-KILL", "-P", str(pid)], check=False)
                network.signal_pid(pid, signal.SIGKILL)   # its loop may have left with nspawn
                time.sleep(0.5)
        root = hdir / "root"
        if run(["mountpoint", "-q", str(root)], check=False).returncode == 0:
            run(["umount", str(root)])
        run(["ip", "netns", "del", host.machine], check=False)
        run(["ip", "link", "del", f"{host.machine}h"], check=False)
        shutil.rmtree(f"/run/systemd/nspawn/propagate/{host.machine}", ignore_errors=True)
        if run(["mountpoint", "-q", str(root)], check=False).returncode != 0:
            shutil.rmtree(hdir, ignore_errors=True)
        for cg in own_cgroups(host.machine):
            _remove_cgroup(cg)


# Each host's nspawn runs in a cgroup of its own. This machine has no systemd to give it a scope,
# and nspawn --keep-unit makes its container's tree under the cgroup it was started in: started
# from the root cgroup, every host of every instance got the same /payload, so the nginx.service
# cgroup of one host held another host's nginx. Inside a host such a process reads as PID 0 in
# cgroup.procs; systemd then stops killing a unit's leftovers with "Failed to kill control group
# ... Input/output error", and a crashed nginx's workers kept the port (issue 26).
CGROUP_PARENT = "gpuserve-sandbox"
CGROUP_FS = Path("/sys/fs/cgroup")


def own_cgroups(machine: str) -> list[Path]:
    """The host's cgroups on this machine: in the unified hierarchy (the container's tree) and,
    on a hybrid layout, in the name=systemd one (where nspawn looks up its own cgroup)."""
    if (CGROUP_FS / "unified").is_dir():   # hybrid: cgroup v1 controllers + unified
        return [CGROUP_FS / "unified" / CGROUP_PARENT / machine, CGROUP_FS / "systemd" / CGROUP_PARENT / machine]
    return [CGROUP_FS / CGROUP_PARENT / machine]


def cgroup_root(host: SandboxHost) -> Path:
    """The host's root cgroup (its /sys/fs/cgroup) as this machine sees it."""
    return own_cgroups(host.machine)[0] / "payload"


def _enter_cgroups(cgroups: list[Path]):
    for cg in cgroups:
        cg.mkdir(parents=True, exist_ok=True)

    def enter() -> None:   # in the child, before nspawn runs
        for cg in cgroups:
            (cg / "cgroup.procs").write_text("0")
    return enter


def _remove_cgroup(cg: Path) -> None:
    """rmdir the (empty) cgroup tree, deepest first; a cgroup still in use is left."""
    if not cg.is_dir():
        return
    for sub in sorted((p for p in cg.rglob("*") if p.is_dir()), key=lambda p: -len(p.parts)):
        try:
            sub.rmdir()
        except OSError:
            pass
    try:
        cg.rmdir()
    except OSError:
        pass


def _alive(pidfile: Path) -> int | None:
    """The nspawn-loop PID in pidfile if that process still runs."""
    try:
        pid = int(pidfile.read_text())
        with open(f"/proc/{pid}/cmdline", "rb") as fh:
            if b"nspawn-loop" not in fh.read():
                return None
        return pid
    except (OSError, ValueError):
        return None
