"""Inventory groups for the sandbox hosts (used by inventories/sandbox.py).

Hosts join the group named after their simulated hardware profile (hopper_x8, blackwell_x4, ...),
so they pick up that group's group_data exactly like production hosts; pyinfra also puts them in
the group ``sandbox`` (the inventory file's name), whose group_data switches serving to the cpu
recipe. Which instance: $GPUSERVE_SANDBOX_INSTANCE (default 0).

Login: as most fleets forbid root logins, pyinfra logs in as the hosts' non-root user
(hosts.LOGIN_USER) with ``_sudo`` set in host data, so every operation, fact and host command runs
through sudo. ``GPUSERVE_SANDBOX_LOGIN=root`` logs in as root instead (no sudo).
"""

from __future__ import annotations

import os

from gpuserve_sandbox.hosts import LOGIN_USER, Sandbox, SandboxHost
from gpuserve_sandbox.util import SandboxError

LOGINS = (LOGIN_USER, "root")


def login_user() -> str:
    """The user pyinfra logs in as: $GPUSERVE_SANDBOX_LOGIN, default the non-root LOGIN_USER."""
    user = os.environ.get("GPUSERVE_SANDBOX_LOGIN") or LOGIN_USER
    if user not in LOGINS:
        raise SandboxError(f"GPUSERVE_SANDBOX_LOGIN={user!r}: sandbox hosts accept "
                           f"{' or '.join(LOGINS)}")
    return user


def login_data(user: str) -> dict:
    """pyinfra's own keys for logging in as ``user``: a non-root user goes through sudo."""
    return {"ssh_user": user} if user == "root" else {"ssh_user": user, "_sudo": True}


def host_data(sandbox: Sandbox, host: SandboxHost) -> dict:
    data = {
        "ssh_hostname": host.ip,
        **login_data(login_user()),
        "ssh_key": str(sandbox.key),
        "ssh_known_hosts_file": str(sandbox.known_hosts),
        "ssh_strict_host_key_checking": "yes",   # host-up wrote each host's real key
        "ssh_allow_agent": False,
        "ssh_look_for_keys": False,
        "sandbox_instance": sandbox.instance,
        "sandbox_bridge_ip": sandbox.bridge_ip,   # where this machine serves test repos/files
    }
    if not host.host_spec.nvswitch:
        data["nvswitch"] = False   # the ":no-nvswitch" variant of an NVSwitch profile
    return data


def group(profile: str, sandbox: Sandbox | None = None) -> list[tuple[str, dict]]:
    """The sandbox hosts of one hardware profile, as pyinfra inventory entries."""
    sandbox = sandbox or Sandbox()
    return [(h.name, host_data(sandbox, h)) for h in sandbox.hosts() if h.host_spec.profile == profile]
