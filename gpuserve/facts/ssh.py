"""The host's SSH host key: what the fan-out's peers pin in their known_hosts
(``gpuserve.layers.fanout``)."""

from __future__ import annotations

from pyinfra.api import FactBase


class SshHostKey(FactBase):
    """The host's ed25519 SSH host key (``type base64``), what its peers pin in known_hosts."""

    def command(self) -> str:
        return "cat /etc/ssh/ssh_host_ed25519_key.pub 2>/dev/null || true"

    def process(self, output: list[str]) -> str:
        parts = " ".join(output).split()
        return " ".join(parts[:2]) if len(parts) >= 2 else ""
