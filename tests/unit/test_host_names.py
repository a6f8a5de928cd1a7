"""Host names and ssh_hostname reach shell commands (openssl's -subj), nginx's server_name and
certificates: anything but a host name or an address is refused at plan time, and the commands
quote them anyway (issue 11, "host names put unquoted into a shell command")."""

from __future__ import annotations

import shlex

import pytest
from click.testing import CliRunner
from pyinfra.api import Inventory

from gpuserve import certs
from gpuserve.cli import main

from .helpers import HARDWARE, REPO, SHA, make_inventory, one_problem, problems_of, settings_of

HOSTILE = "gpu-a';touch /tmp/pwned;'"


def _plan_inventory(tmp_path, monkeypatch, name: str):
    """`gpuserve plan` on an inventory file holding host ``name`` behind the proxy."""
    keys = tmp_path / "keys"
    keys.write_text("k" * 40 + "\n")
    keys.chmod(0o600)
    inventory = tmp_path / "lab.py"
    inventory.write_text(f"cpu = [({name!r}, {{'proxy': True, 'api_keys_file': {str(keys)!r}, "
                         f"'model_revision': {SHA!r}}})]\n")
    monkeypatch.chdir(REPO)   # group_data/ from the cwd, as pyinfra reads it
    return CliRunner().invoke(main, ["plan", str(inventory)])


def test_a_host_named_to_break_out_of_a_shell_command_is_refused_by_plan(tmp_path, monkeypatch):
    result = _plan_inventory(tmp_path, monkeypatch, HOSTILE)
    assert result.exit_code == 1, result.output
    assert (f"{HOSTILE}: host name (from inventory): {HOSTILE!r} is not a host name (letters, "
            "digits, '-' and '_' in dot-separated labels, e.g. gpu-01.example.internal) or "
            "an IP address, or a pyinfra connector like @local; gpuserve writes it into nginx "
            "files, certificates and commands: rename the host in the inventory") in result.stderr
    assert "1 configuration error:" in result.stderr


def test_the_same_inventory_with_a_plain_name_plans(tmp_path, monkeypatch):
    result = _plan_inventory(tmp_path, monkeypatch, "gpu-a")
    assert result.exit_code == 0, result.output


@pytest.mark.parametrize("name", ["-gpu", "gpu-", "gpu a", "gpu.a.", "a" * 64,
                                  "gpu$(id)", "::1%'"])
def test_host_names_that_are_not_host_names_are_refused(name):
    msg = one_problem(make_inventory(hosts=(name,)))
    assert msg.startswith(f"{name}: host name (from inventory): {name!r} is not a host name ")


@pytest.mark.parametrize("name", ["gpu-01", "gpu_01", "gpu-01.example.internal", "10.0.0.7", "fd00::7",
                                  "fe80::1%eth0", "@local", "@docker/ubuntu:24.04"])
def test_host_names_addresses_and_pyinfra_connectors_pass(name):
    # (pyinfra itself refuses an unknown connector, like @local;id)
    settings_of(make_inventory(hosts=(name,)), host=name)


@pytest.mark.parametrize("value", [HOSTILE, "10.0.0.1 evil", "gpu-a.", "-oProxyCommand=id", "gw1.example.internal\n", "@local",
                                   "::1%a;id", 10])
def test_an_ssh_hostname_that_is_no_host_name_or_address_is_refused(value):
    msg = one_problem(make_inventory(host_data={"ssh_hostname": value}))
    assert msg.startswith(f"h1: ssh_hostname (from host data): {value!r} is not a host name "
                          "(letters, digits, '-' and '_' in dot-separated labels, e.g. "
                          "gpu-01.example.internal) or an IP address; gpuserve writes it into")


def test_a_role_host_is_checked_too():
    inv = Inventory(([("mon-1", {"ssh_hostname": HOSTILE})], {}), monitor=(["mon-1"], {}))
    assert any(p.startswith("mon-1: ssh_hostname (from host data): ") for p in problems_of(inv))


@pytest.mark.parametrize("key", ["serve_host", "proxy_bind"])
def test_an_ipv6_zone_that_is_no_interface_name_is_refused(key):
    # Python's ipaddress takes any text after '%' as the zone: "::1%'" parsed as an address
    found = problems_of(make_inventory(group="cpu", host_data={
        key: "::1%';id;'", "trusted_network": True, **HARDWARE["cpu"]}))
    assert any(f"{key} (from host data): \"::1%';id;'\" is not an IP address or host name" in p
               for p in found), found


# -- the commands quote what they are given anyway ---------------------------------------------
def test_the_certificate_command_keeps_a_hostile_name_one_argument():
    command = certs.self_signed(HOSTILE, "/etc/nginx/gpuserve/tls.key", "/etc/nginx/gpuserve/tls.crt",
                                address="10.0.0.7", leaf=True)
    assert command.startswith("umask 077; ") and command.endswith(" 2>/dev/null")
    argv = shlex.split(command.removeprefix("umask 077; ").removesuffix(" 2>/dev/null"))
    assert argv == [
        "openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "825",
        "-subj", "/CN=gpu-a';touch \\/tmp\\/pwned;'",
        "-addext", f"subjectAltName=DNS:{HOSTILE},IP:10.0.0.7",
        "-addext", "basicConstraints=critical,CA:FALSE",
        "-addext", "keyUsage=critical,digitalSignature,keyEncipherment",
        "-addext", "extendedKeyUsage=serverAuth",
        "-keyout", "/etc/nginx/gpuserve/tls.key", "-out", "/etc/nginx/gpuserve/tls.crt"]


@pytest.mark.parametrize("address, san", [("10.0.0.7", "DNS:gpu-1,IP:10.0.0.7"),
                                          ("fd00::7", "DNS:gpu-1,IP:fd00::7"),
                                          ("deadbeef", "DNS:gpu-1"),   # a name, not an address
                                          ("gpu-1.example.internal", "DNS:gpu-1")])
def test_only_an_ip_address_joins_the_subject_alt_name(address, san):
    argv = shlex.split(certs.self_signed("gpu-1", "k", "c", address=address, leaf=True))
    assert argv[argv.index("-addext") + 1] == f"subjectAltName={san}"


def test_the_exporters_certificate_is_a_plain_one():
    assert certs.self_signed("gpu-1", "/k", "/c") == (
        "umask 077; openssl req -x509 -newkey rsa:2048 -nodes -days 825 -subj /CN=gpu-1 "
        "-keyout /k -out /c 2>/dev/null")
