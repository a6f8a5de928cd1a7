"""deploys/patch.py on hosts of role groups (gateway, monitor), and an upgrade that meets an
unfinished patch move: the pure decisions (gpuserve.patch) and the role host's move against
test_patch's recording host. tests/integration/test_patch.py runs a gateway's move on sandbox
hosts."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest
from pyinfra.api import Inventory

from gpuserve import gateway, patch, stack
from gpuserve.config import validate_inventory
from gpuserve.layers import patch as patch_layer
from gpuserve.layers import stack_move as layer
from gpuserve.rollout.remote import MoveFailed
from gpuserve.patch import PatchMove
from gpuserve.rollout import Move

from tests.unit.helpers import HARDWARE, SHA, key_file, problems_of
from tests.unit.test_patch import NEW_K, OLD_K, Host, _steps, host_state  # noqa: F401 - a fixture


def _pm(host: str, role: str | None = None) -> PatchMove:
    return PatchMove(host, "no GPU stack", "updates", (), () if role else ("fast",), role=role)


# --- pure ----------------------------------------------------------------------------------------

def test_serving_hosts_go_first_then_monitors_then_gateways_one_at_a_time():
    order = ["gw1", "h1", "mon", "h2", "gw2", "h3"]
    moves = [_pm("gw1", patch.GATEWAY), _pm("h1"), Move("h1", "fast", "r1", "r2", "r1"), _pm("mon", patch.MONITOR),
             _pm("h2"), _pm("gw2", patch.GATEWAY), _pm("h3")]
    plan = patch.batches(moves, order, 2)
    assert [sorted({m.host for m in b}) for b in plan] == [["h1", "h2"], ["h3"], ["mon"], ["gw1"], ["gw2"]]
    assert len(plan[0]) == 3                           # h1's release move stays with its host
    assert patch.batches([_pm("gw1", patch.GATEWAY)], order, 5) == [[_pm("gw1", patch.GATEWAY)]]
    assert patch.batches([], order, 1) == []


def test_a_gateway_is_a_gateway_even_when_it_serves_and_a_role_host_runs_its_units():
    assert patch.role_of(serves=False, is_gateway=True) == patch.GATEWAY
    assert patch.role_of(serves=True, is_gateway=True) == patch.GATEWAY   # its rotation is every move's
    assert patch.role_of(serves=False, is_gateway=False) == patch.MONITOR
    assert patch.role_of(serves=True, is_gateway=False) is None
    assert patch.role_units(True, False) == ("nginx.service", gateway.UNIT)
    assert patch.role_units(False, True) == ("prometheus.service", "prometheus-alertmanager.service")
    assert patch.role_units(False, False) == ()
    units = ("nginx.service", gateway.UNIT)
    assert patch.inactive(units, "active\nactive\n") == []
    assert patch.inactive(units, "active\nactivating\n") == [gateway.UNIT]
    assert patch.inactive(units, "") == list(units)


def _workers(*states: tuple[str, bool]) -> str:
    return json.dumps({"workers": [{"labels": {"smg.ai/discovery-id": f"h{i}/fast"}, "status": st,
                                    "is_healthy": ok, "load": 0} for i, (st, ok) in enumerate(states)]})


def test_a_gateway_serves_when_nginx_and_smg_run_and_smg_has_a_healthy_worker():
    assert patch.gateway_problem(True, _workers(("ready", True), ("draining", True))) is None
    assert patch.gateway_problem(False, _workers(("ready", True))) == f"nginx or {gateway.UNIT} is not active"
    assert patch.gateway_problem(True, None) == "smg's /workers does not answer"
    assert patch.gateway_problem(True, _workers(("ready", False))) == "no worker is ready and healthy in smg (1 listed)"
    assert patch.gateway_problem(True, "<html>").startswith("smg's /workers is not JSON")
    # a gateway that serves too, its own worker still out after its update: smg must answer
    assert patch.gateway_problem(True, _workers(("ready", False)), need_worker=False) is None
    assert patch.gateway_problem(True, None, need_worker=False) == "smg's /workers does not answer"


def test_the_last_serving_gateway_is_not_taken_down_unless_the_operator_allows_it():
    assert patch.last_gateway_refusal(True, {"gw2": None}, False) is None
    alone = patch.last_gateway_refusal(True, {}, False)
    assert alone.startswith("no other gateway serves (the inventory has no other gateway): updating it "
                            "would take the fleet's last entry point down")
    assert "--data patch_last_gateway=True" in alone
    down = patch.last_gateway_refusal(True, {"gw2": "smg's /workers does not answer"}, False)
    assert "(gw2: smg's /workers does not answer)" in down
    assert patch.last_gateway_refusal(True, {"gw2": "down"}, True) is None      # a maintenance window
    assert patch.last_gateway_refusal(False, {"gw2": "down"}, False) is None    # it serves nothing now


def test_an_upgrade_refuses_a_host_whose_patch_move_did_not_finish():
    assert patch.unfinished_patch_refusal("upgrade", "h1", False) is None
    why = patch.unfinished_patch_refusal("upgrade", "h1", True)
    assert why.startswith(f"upgrade refused: h1: an OS update move (deploys/patch.py) did not finish there "
                          f"({patch.PATCH_MOVING} is present)")
    assert "Run deploys/patch.py again to finish it" in why


# --- settings ------------------------------------------------------------------------------------

def _fleet(tmp_path, gw: dict | None = None) -> Inventory:
    keys = key_file(tmp_path)
    return Inventory(
        ([("h1", {"ssh_hostname": "10.0.0.1"}), ("gw1", {"ssh_hostname": "10.0.0.2", **(gw or {})}),
          ("mon", {"ssh_hostname": "10.0.0.3"})], {}),
        cpu=(["h1"], dict(HARDWARE["cpu"])), gateway=(["gw1"], {}), monitor=(["mon"], {}),
        fleet=(["h1", "gw1", "mon"], {"model_revision": SHA, "proxy": True, "api_keys_file": str(keys)}))


def test_role_hosts_have_no_gpu_driver_and_patch_last_gateway_is_a_checked_boolean(tmp_path):
    every = validate_inventory(_fleet(tmp_path))
    gw, mon = every["gw1"], every["mon"]
    assert not gw.serves and gw.gateway is not None and not gw.patch_last_gateway
    assert not mon.serves and mon.gateway is None
    for s in (gw, mon):   # so no DKMS module is asked for: patch.module_problem's vendor is None
        assert s.stack.vendor is None and not s.uses_gpus
    assert validate_inventory(_fleet(tmp_path, {"patch_last_gateway": True}))["gw1"].patch_last_gateway
    assert any("gw1: patch_last_gateway" in p and "'yes' is not allowed; use True" in p
               for p in problems_of(_fleet(tmp_path, {"patch_last_gateway": "yes"})))


# --- a role host's move, against test_patch's recording host ---------------------------------------

@pytest.fixture
def gw_settings(tmp_path):
    s = validate_inventory(_fleet(tmp_path, {"reboot": "allowed", "reboot_delay": 0}))["gw1"]
    assert s.stack.reboot_allowed
    return s


class RoleHost(Host):
    """test_patch's recording host, whose units are active when ``active`` says so."""

    def __init__(self, st, active=True, enabled=None):
        super().__init__(st)
        self.active, self.enabled = active, enabled

    def run_shell_command(self, command, _sudo=False, _timeout=None):
        text = str(command.bits[0]) if hasattr(command, "bits") else str(command)
        out = None
        if text.startswith("systemctl is-enabled "):   # patch.enabled_units_command
            units = [w for w in text.split() if w.endswith(".service")]
            out = "\n".join(u for u in dict.fromkeys(units) if self.enabled is None or u in self.enabled)
        elif text.startswith("systemctl is-active ") and self.active:
            out = "\n".join("active" for _ in text.split()[2:])
        if out is None:
            return super().run_shell_command(command, _sudo, _timeout)
        self.ran.append(text)
        return True, SimpleNamespace(stdout=out, stderr="", output=out, stdout_lines=out.splitlines())


def _role_move(s, role=patch.GATEWAY, kernel=NEW_K) -> PatchMove:
    return PatchMove("h1", "no GPU stack", "updates", tuple(sorted(stack.pins(s.stack).items())), (),
                     upgrades=("libssl3",), kernel=kernel, role=role, units=patch.role_units(role == patch.GATEWAY,
                                                                                              role == patch.MONITOR))


def test_a_gateway_updates_reboots_without_a_module_check_and_waits_for_its_services(
        gw_settings, host_state, monkeypatch):
    host_state.dkms = host_state.builds = ()      # no GPU driver at all: no DKMS module is asked for
    asked = []
    monkeypatch.setattr(patch_layer, "other_gateways_serve", lambda h, s: asked.append(h.name))
    needs = []
    monkeypatch.setattr(patch_layer, "_gateway_state", lambda h, g, need_worker: needs.append(need_worker))
    h = RoleHost(host_state)
    layer.move_stack(h, _role_move(gw_settings), gw_settings)
    assert asked == ["h1"]                                     # before anything ran
    assert needs == [True]            # it serves nothing itself: smg must list a worker ready
    assert _steps(h) == ["update", "reboot"] and host_state.running == NEW_K
    units = f"systemctl is-active nginx.service {gateway.UNIT}"
    assert units in h.ran and h.ran.index(units) > h.ran.index("cat /proc/sys/kernel/random/boot_id")
    assert f"rm -f {patch.PATCH_MOVING}" in h.ran and host_state.gates == []


def test_a_gateway_refused_as_the_last_serving_one_is_not_touched(gw_settings, host_state, monkeypatch):
    def refuse(h, s):
        raise MoveFailed(f"{h.name}: OS update move refused before any change: no other gateway serves")
    monkeypatch.setattr(patch_layer, "other_gateways_serve", refuse)
    h = RoleHost(host_state)
    with pytest.raises(MoveFailed, match="refused before any change"):
        layer.move_stack(h, _role_move(gw_settings), gw_settings)
    assert h.ran == []


def test_a_monitor_whose_services_do_not_come_back_leaves_its_move_unfinished(gw_settings, host_state, monkeypatch):
    monkeypatch.setattr(patch_layer, "ROLE_READY_S", 0)
    monkeypatch.setattr(patch_layer.time, "sleep", lambda s: None)
    h = RoleHost(host_state, active=False)    # `systemctl is-active` prints nothing: none active
    with pytest.raises(MoveFailed, match=r"(?s)failed at verify: h1: 0 s after the update: not active: "
                                         r"prometheus.service, prometheus-alertmanager.service\. "
                                         r"The host's move is unfinished; fix it"):
        layer.move_stack(h, _role_move(gw_settings, role=patch.MONITOR, kernel=None), gw_settings)
    assert f"rm -f {patch.PATCH_MOVING}" not in h.ran          # the next run finishes it


def test_a_role_host_waits_only_for_the_services_it_runs(gw_settings, host_state, monkeypatch):
    """A host of the group monitor that was never converged with Prometheus: nothing enabled,
    nothing to wait for; its update and reboot still happen."""
    monkeypatch.setattr(patch_layer, "ROLE_READY_S", 0)
    h = RoleHost(host_state, active=False, enabled=())
    layer.move_stack(h, _role_move(gw_settings, role=patch.MONITOR), gw_settings)
    assert _steps(h) == ["update", "reboot"] and not any(c.startswith("systemctl is-active") for c in h.ran)
    assert f"rm -f {patch.PATCH_MOVING}" in h.ran


def _units_active(tmp_path, active: set[str]) -> int:
    """gpuserve.patch.gateway_units_command with a stand-in systemctl that behaves as systemd's:
    ``is-active`` naming several units exits 0 when any of them is active."""
    import subprocess
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    fake = bin_dir / "systemctl"
    fake.write_text("#!/bin/sh\nshift; [ \"$1\" = -q ] && shift\nfor u in \"$@\"; do case \" "
                    + " ".join(sorted(active)) + " \" in *\" $u \"*) exit 0;; esac; done\nexit 3\n")
    fake.chmod(0o755)
    return subprocess.run(["sh", "-c", patch.gateway_units_command()],
                          env={"PATH": f"{bin_dir}:/usr/bin:/bin"}).returncode


def test_a_gateway_counts_as_serving_only_with_nginx_and_smg_both_active(tmp_path):
    both = {"nginx.service", gateway.UNIT}
    assert _units_active(tmp_path, both) == 0
    assert _units_active(tmp_path, {gateway.UNIT}) != 0     # its client front (nginx) is down
    assert _units_active(tmp_path, {"nginx.service"}) != 0
    assert _units_active(tmp_path, set()) != 0


def test_a_patch_refuses_a_host_whose_gpu_stack_is_not_group_datas_yet():
    """Group data's driver pin bumped, deploys/upgrade.py not run yet: the patch move would verify
    the new pin after the reboot and leave the host out. It is refused before anything changes.
    A module that is not loaded (a patch move that halted after its reboot) is not a pin change:
    the rerun may finish that move."""
    wanted = {"driver_version": "590.44.01", "flavour": "open", "dcgm": False}
    same = {"current": {"driver_version": "590.44.01", "flavour": "open", "dcgm": False}}
    assert patch.stack_change_refusal("gpu-1", wanted, same) is None
    assert patch.stack_change_refusal("gpu-1", wanted, None) is None
    assert patch.stack_change_refusal("gpu-1", wanted, {"current": "junk"}) is None
    why = patch.stack_change_refusal("gpu-1", wanted, {"current": {**same["current"], "driver_version": "580.95.05"}})
    assert why.startswith("patch refused: gpu-1: its GPU stack is not group data's yet "
                          "(driver_version 580.95.05 -> 590.44.01)")
    assert "deploys/upgrade.py first" in why and why.endswith("nothing was touched")


def test_the_patch_layer_reads_the_hosts_record_and_refuses_a_pin_change(monkeypatch):
    from pyinfra.api.exceptions import PyinfraError
    from pyinfra.facts.files import File

    from gpuserve.facts.apt import AptHolds
    from gpuserve.facts.kernel import KernelState, PendingUpgrades

    from tests.unit.helpers import make_inventory, settings_of

    s = settings_of(make_inventory())
    facts = {PendingUpgrades: [patch.Upgrade("libssl3", "3.0.15-1", "3.0.17-1")],
             KernelState: patch.KernelState(OLD_K, (OLD_K,), ()), AptHolds: {}, File: None}
    fake = SimpleNamespace(name="gpu-1", get_fact=lambda fact, **kw: facts[fact])
    monkeypatch.setattr(patch_layer, "host", fake)
    monkeypatch.setattr(patch_layer, "host_os", lambda: "debian12")
    older = {**stack.pins(s.stack), "driver_version": "570.1.1"}
    monkeypatch.setattr(patch_layer, "recorded_stack", lambda: {"current": older})
    with pytest.raises(PyinfraError, match="patch refused: gpu-1: its GPU stack is not group data's yet "
                                           r"\(driver_version 570.1.1 -> "):
        patch_layer.patch_move(s)
