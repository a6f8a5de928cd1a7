"""Commands of other distributions join `gpuserve` through the entry-point group gpuserve.commands
(gpuserve/cli.py): the sandbox's does, and one that does not load leaves the product working."""

from __future__ import annotations

from importlib.metadata import EntryPoint

import click
from click.testing import CliRunner

from gpuserve import cli


def test_the_sandbox_distribution_adds_gpuserve_sandbox():
    from gpuserve_sandbox.cli import sandbox

    assert cli.main.commands["sandbox"] is sandbox
    assert "up" in CliRunner().invoke(cli.main, ["sandbox", "--help"]).output


def test_a_command_that_does_not_load_says_why_and_the_others_still_run():
    group = click.Group("g", commands=[click.Command("plan", callback=lambda: click.echo("planned"))])
    cli.add_commands(group, [EntryPoint("sandbox", "gpuserve_nowhere.cli:sandbox", cli.COMMAND_GROUP)])
    result = CliRunner().invoke(group, ["sandbox", "up", "--instance", "3"])
    assert result.exit_code == 1
    assert ("gpuserve sandbox: gpuserve_nowhere.cli:sandbox does not load: ModuleNotFoundError: "
            "No module named 'gpuserve_nowhere'") in result.output
    assert "does not load" in CliRunner().invoke(group, ["--help"]).output
    assert CliRunner().invoke(group, ["plan"]).output == "planned\n"
