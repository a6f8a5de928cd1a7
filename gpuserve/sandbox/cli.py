"""``gpuserve sandbox``: build, list and remove local test hosts."""

from __future__ import annotations

import click


@click.group()
def sandbox() -> None:
    """Real Debian test hosts on this machine (systemd-nspawn + network namespaces)."""
