"""The ``gpuserve`` command. Each subcommand lives beside the logic it drives."""

from __future__ import annotations

import click

from gpuserve.checkpoints import resolve_command
from gpuserve.plan import plan
from gpuserve.sandbox.cli import sandbox
from gpuserve.status import status
from gpuserve.wheelhouse import wheelhouse


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="gpuserve")
def main() -> None:
    """gpuserve: GPU hosts to LLM inference servers, with pyinfra."""


main.add_command(sandbox)
main.add_command(plan)
main.add_command(status)
main.add_command(wheelhouse)
main.add_command(resolve_command)
