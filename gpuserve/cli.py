"""The ``gpuserve`` command. Each subcommand lives beside the logic it drives.

Commands from other installed packages join through the entry-point group ``gpuserve.commands``:
that is how the sandbox (``gpuserve_sandbox``, a test tool the product never imports) adds
``gpuserve sandbox``.
"""

from __future__ import annotations

from importlib.metadata import entry_points

import click

from gpuserve.checkpoints import resolve_command
from gpuserve.plan import plan
from gpuserve.status import status
from gpuserve.wheelhouse import wheelhouse

COMMAND_GROUP = "gpuserve.commands"


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="gpuserve")
def main() -> None:
    """gpuserve: GPU hosts to LLM inference servers, with pyinfra."""


main.add_command(plan)
main.add_command(status)
main.add_command(wheelhouse)
main.add_command(resolve_command)
for _ep in entry_points(group=COMMAND_GROUP):
    main.add_command(_ep.load(), _ep.name)
