"""``gpuserve sandbox``: build, list and remove local test hosts."""

from __future__ import annotations

import json
import os

import click

from gpuserve_sandbox.hosts import DEFAULT_PROFILES, LOGIN_USER, Sandbox, default_instance
from gpuserve_sandbox.network import stop_lxcfs
from gpuserve_sandbox.simgpu import FAULTS, PROFILES, HostSpec
from gpuserve_sandbox.util import SandboxError

instance_option = click.option(
    "--instance", type=click.IntRange(0, 255), default=default_instance, show_default="0 or $GPUSERVE_SANDBOX_INSTANCE",
    help="Which sandbox: instance k uses 10.231.k.0/24, so several can run side by side.")


@click.group()
def sandbox() -> None:
    """Real Debian test hosts on this machine (systemd-nspawn + network namespaces).

    Only the GPUs are simulated. Needs root.
    """


@sandbox.command()
@click.option("--hosts", "count", type=click.IntRange(1, 250), default=None,
              help="Number of hosts; profiles cycle through --profile (default: hopper_x8, blackwell_x4).")
@click.option("--profile", "profiles", multiple=True,
              help=f"Simulated hardware per host, in order: {', '.join(PROFILES)}; "
                   "add ':no-nvswitch' for a host without NVSwitches.")
@click.option("--wait", type=float, default=120, show_default=True, help="Seconds to wait for each boot.")
@instance_option
def up(count: int | None, profiles: tuple[str, ...], wait: float, instance: int) -> None:
    """Start fresh hosts (replacing this instance's old ones) and wait until they answer SSH."""
    try:
        cycle = [HostSpec.parse(p) for p in (profiles or DEFAULT_PROFILES)]
        n = count or len(profiles) or 2
        specs = [cycle[i % len(cycle)] for i in range(n)]
        hosts = Sandbox(instance).up(specs, wait=wait)
    except SandboxError as exc:
        raise click.ClickException(str(exc)) from exc
    for h in hosts:
        click.echo(f"{h.name}\t{h.ip}\t{h.spec}")


@sandbox.command()
@click.option("--all", "everything", is_flag=True, help="Every instance, and the shared lxcfs mount.")
@instance_option
def down(everything: bool, instance: int) -> None:
    """Shut the hosts down in order and remove them, with their network."""
    boxes = Sandbox.instances() if everything else [Sandbox(instance)]
    try:
        for box in boxes:
            box.down()
            click.echo(f"instance {box.instance}: down")
        if everything:
            stop_lxcfs(Sandbox().root)
    except SandboxError as exc:
        raise click.ClickException(str(exc)) from exc


@sandbox.command()
@instance_option
def status(instance: int) -> None:
    """List the hosts of an instance and whether they answer."""
    box = Sandbox(instance)
    hosts = box.hosts()
    if not hosts:
        click.echo(f"instance {instance}: no hosts (gpuserve sandbox up --hosts 2)")
        return
    for h in hosts:
        proc = box.ssh(h, "systemctl is-system-running", check=False, timeout=10)
        click.echo(f"{h.name}\t{h.ip}\t{h.spec}\t{proc.stdout.strip() or 'unreachable'}")


FAULT_HELP = (
    "Simulate a GPU hardware fault on host NAME, e.g. `gpuserve sandbox fault sandbox-1 --gpu 3 "
    "ecc-uncorrectable`; `--clear` switches faults off; no FAULT and no --clear lists them.\n\n\b\n"
    + "\n".join(f"{k}: {v}" for k, v in FAULTS.items()))


@sandbox.command(help=FAULT_HELP)
@click.argument("name")
@click.argument("fault", required=False, type=click.Choice(sorted(FAULTS)))
@click.option("--gpu", type=int, default=None, help="GPU index (as in hardware.json); required to set a fault.")
@click.option("--value", type=int, default=None, help="The fault's number (ECC count, PCIe gen/width, link, XID).")
@click.option("--transient", is_flag=True, help="Gone at the host's next boot (default: persistent, like hardware).")
@click.option("--clear", is_flag=True, help="Switch faults off: FAULT on --gpu, all of --gpu, or all of the host.")
@instance_option
def fault(name: str, fault: str | None, gpu: int | None, value: int | None, transient: bool, clear: bool,
          instance: int) -> None:
    box = Sandbox(instance)
    host = next((h for h in box.hosts() if h.name == name), None)
    if host is None:
        raise click.ClickException(f"no host {name!r} in instance {instance}")
    try:
        if clear:
            for f in box.clear_faults(host, gpu, fault):
                click.echo(f"cleared: GPU {f['gpu']} {f['fault']}")
        elif fault:
            if gpu is None:
                raise click.ClickException("which GPU? --gpu N")
            click.echo(json.dumps(box.set_fault(host, gpu, fault, value, persistent=not transient)))
        else:
            for f in box.faults(host):
                click.echo(json.dumps(f))
    except SandboxError as exc:
        raise click.ClickException(str(exc)) from exc


@sandbox.command(context_settings={"ignore_unknown_options": True})
@click.argument("name")
@click.argument("command", nargs=-1, type=click.UNPROCESSED)
@click.option("--user", "user", default="root", show_default=True,
              help=f"Log in as this user (every host also has {LOGIN_USER!r}, with sudo).")
@instance_option
def ssh(name: str, command: tuple[str, ...], instance: int, user: str) -> None:
    """Open a shell (or run COMMAND) on host NAME, e.g. `gpuserve sandbox ssh sandbox-1`."""
    box = Sandbox(instance)
    host = next((h for h in box.hosts() if h.name == name), None)
    if host is None:
        raise click.ClickException(f"no host {name!r} in instance {instance}")
    os.execvp("ssh", [*box.ssh_args(host, batch=False, user=user), *command])
