"""The foundation: sandbox hosts are real Debian hosts; only their GPUs are simulated.

The full converge over SSH (and its idempotency) is tests/integration/test_serve_e2e.py."""

import subprocess
import time

import pytest


@pytest.fixture(scope="module")
def hosts(make_hosts):
    return make_hosts(["hopper_x8", "blackwell_x4:no-nvswitch"])


def test_hosts_are_real_debian_hosts_with_their_own_network(sandbox, hosts, testinfra_host):
    seen_ips = set()
    for h in hosts:
        t = testinfra_host(h)
        assert t.check_output("cat /proc/1/comm") == "systemd"
        assert t.run("systemctl is-system-running").stdout.strip() == "running"
        assert t.check_output("hostname") == h.name
        assert t.service("ssh").is_running
        assert t.file("/etc/os-release").contains("bookworm")
        addrs = t.check_output("ip -4 -o addr show dev eth0")
        assert f"inet {h.ip}/24" in addrs
        seen_ips.add(h.ip)
        # apt works, through the cache on the bridge only
        assert t.run("apt-get update -q").rc == 0
        assert t.file("/etc/machine-id").content_string.strip() != ""
    assert len(seen_ips) == len(hosts)
    ids = {testinfra_host(h).file("/etc/machine-id").content_string for h in hosts}
    assert len(ids) == len(hosts), "hosts must not share an identity"


def test_the_login_user_has_the_key_and_passwordless_sudo_and_root_still_logs_in(sandbox, hosts):
    """inventories/sandbox.py logs in as LOGIN_USER with _sudo (tests/conftest.py: sandbox_login);
    root keeps logging in with the same key."""
    from gpuserve_sandbox.hosts import LOGIN_USER

    for h in hosts:
        ssh = sandbox.ssh_args(h, user=LOGIN_USER)
        me = run_ok([*ssh, "id -un; id -u; sudo -n id -un; sudo -n cat /etc/shadow >/dev/null && echo read"])
        assert me.split() == [LOGIN_USER, me.split()[1], "root", "read"] and me.split()[1] != "0"
        # without sudo it is an ordinary user: root's files stay closed to it
        assert "Permission denied" in run_fail([*ssh, "cat /etc/shadow"])
        assert sandbox.ssh(h, "id -u").stdout.strip() == "0"
        # no password to guess: the account has none, sudo asks for none
        shadow = sandbox.ssh(h, f"getent shadow {LOGIN_USER}").stdout.split(":")
        assert shadow[1] == "*"


def run_ok(args: list[str]) -> str:
    proc = subprocess.run(args, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout


def run_fail(args: list[str]) -> str:
    proc = subprocess.run(args, capture_output=True, text=True, timeout=60)
    assert proc.returncode != 0, proc.stdout
    return proc.stderr


def test_only_the_gpus_are_simulated(sandbox, hosts):
    hopper, blackwell = hosts
    smi = "/usr/local/lib/gpuserve-sim/bin/nvidia-smi --query-gpu=name,memory.total --format=csv,noheader"
    # no driver loaded yet: the stand-in fails the way the real tool does
    assert sandbox.ssh(hopper, smi, check=False).returncode == 9
    # a (stand-in) kernel module installed, then a real reboot: the module is "loaded"
    for h in hosts:
        sandbox.ssh(h, "echo 580.95.05 > /var/lib/gpuserve-sim/nvidia-module-version")
        sandbox.reboot(h, wait=60)
    assert sandbox.ssh(hopper, smi).stdout.splitlines() == ["NVIDIA H200, 143771 MiB"] * 8
    assert sandbox.ssh(blackwell, smi).stdout.splitlines() == ["NVIDIA GB200, 189471 MiB"] * 4
    nvswitch = "ls /proc/driver/nvidia-nvswitch/devices 2>/dev/null | wc -l"
    assert sandbox.ssh(hopper, nvswitch).stdout.strip() == "4"
    assert sandbox.ssh(blackwell, nvswitch).stdout.strip() == "0"   # the :no-nvswitch variant


def test_a_dead_lxcfs_mount_is_detached_and_lxcfs_started_again(sandbox, tmp_path):
    """A previous run's lxcfs killed with its session leaves a mount that answers ENOTCONN;
    bringing hosts up must recover from that, not fail on it (a CI machine hit exactly this)."""
    import os
    import shutil
    import signal

    from gpuserve_sandbox import network

    if not shutil.which("lxcfs"):
        pytest.skip("lxcfs is not installed (dev/bootstrap.sh installs it)")
    root = tmp_path
    mnt = network.ensure_lxcfs(root)
    try:
        assert network.lxcfs_serving(mnt)
        os.kill(int((root / "lxcfs.pid").read_text()), signal.SIGKILL)
        deadline = time.monotonic() + 10
        while network.lxcfs_serving(mnt) and time.monotonic() < deadline:
            time.sleep(0.1)
        with pytest.raises(OSError) as dead:
            (mnt / "proc" / "uptime").read_text()
        assert dead.value.errno == 107      # Transport endpoint is not connected
        assert network.ensure_lxcfs(root) == mnt
        assert float((mnt / "proc" / "uptime").read_text().split()[0]) >= 0
    finally:
        network.stop_lxcfs(root)
