"""How pyinfra reaches the host: its inventory name and ssh_hostname, which reach commands, nginx
files and certificates (issue 11), and the SSH login (issue 17, finding 2; docs/non-root.md):
pyinfra's own keys, not gpuserve settings; a login that is not root goes through `_sudo`."""

from __future__ import annotations

from gpuserve.config.sources import _Checker, data_source
from gpuserve.values import host_name_problem

# pyinfra passes these in the command it runs (`env PYINFRA_SUDO_PASSWORD=... sudo -A ...`), so
# the host's `ps` shows them while the command runs
LOGIN_PASSWORD_KEYS = ("_sudo_password", "_su_password")
# secret files go up through sudo only (gpuserve.operations.secrets)
LOGIN_ESCALATIONS_REFUSED = ("_su_user", "_doas", "_dzdo")


def _host_names(c: _Checker) -> None:
    """The inventory's name of the host and its ssh_hostname (pyinfra's key): a host name or an
    address, nothing a shell or nginx would read as syntax."""
    why = host_name_problem(c.name, connector=True)
    if why:
        c.problem("host name", why + "; gpuserve writes it into nginx files, certificates and "
                  "commands: rename the host in the inventory", "inventory")
    ssh = c.host.data.get("ssh_hostname")
    why = host_name_problem(ssh) if ssh is not None else None
    if why:
        c.problem("ssh_hostname", why + "; gpuserve writes it into nginx files, certificates and "
                  "the gateway's worker URLs", data_source(c.host, "ssh_hostname"))


def _login(c: _Checker) -> None:
    for key in LOGIN_PASSWORD_KEYS:
        if c.host.data.get(key):
            c.problem(key, "pyinfra puts this password on the host's command line, where `ps` shows "
                      "it: give the login user passwordless sudo and set _sudo = True "
                      "(docs/non-root.md)", data_source(c.host, key))
    for key in LOGIN_ESCALATIONS_REFUSED:
        if c.host.data.get(key):
            c.problem(key, "gpuserve escalates with sudo only: log in as root, or as a user with "
                      "passwordless sudo and set _sudo = True (docs/non-root.md)",
                      data_source(c.host, key))
