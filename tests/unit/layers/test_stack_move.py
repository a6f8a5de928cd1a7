"""The GPU-stack move of a rollout (gpuserve.layers.stack_move) and its pure parts
(gpuserve.stack: pending_reason, record_after, rollback_pins).

The move's commands are recorded from a stand-in connection, with the host's facts answered by
the test; the same move runs on sandbox hosts in tests/integration/test_stack_rollout.py."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from gpuserve import admission, rollout, stack
from gpuserve.layers import rotation
from gpuserve.layers import stack_move as layer
from gpuserve.rollout.remote import MoveFailed
from gpuserve.operations import gpu_stack as gpu_ops
from gpuserve.rollout import Move, StackMove, batches, stack_moves_first

from tests.unit.helpers import key_file, make_inventory, settings_of

OLD, NEW = "580.95.05", "580.105.08"


# --- pure ----------------------------------------------------------------------------------------

def test_pending_reason_names_packages_then_an_owed_reboot_then_nothing():
    moving = stack.PackagePlan(["nvidia-open"], [f"nvidia-open={NEW}-1", "nvidia-driver-pinning-580"], [], [])
    assert (stack.pending_reason(moving, f"{OLD}-1", OLD)
            == f"packages change: nvidia-open={NEW}-1, nvidia-driver-pinning-580")
    specs = [stack.PackageSpec("nvidia-open", NEW), stack.PackageSpec("nvidia-driver-pinning-580")]
    assert (stack.pending_reason(moving, f"{OLD}-1", OLD, specs, {"nvidia-open": f"{OLD}-1"})
            == f"packages change: nvidia-open {OLD} -> {NEW}")
    done = stack.PackagePlan([], [], [], [])
    assert "a reboot is owed" in stack.pending_reason(done, f"{NEW}-1", OLD)
    assert stack.pending_reason(done, f"{NEW}-1", NEW) is None


def test_the_record_keeps_the_stack_served_before_and_survives_a_rerun():
    a, b = {"driver_version": OLD}, {"driver_version": NEW}
    first = stack.record_after(None, a)
    assert first == {"current": a}
    bumped = stack.record_after(first, b)
    assert bumped == {"current": b, "previous": a}
    assert stack.record_after(bumped, b) == bumped       # a rerun keeps somewhere to roll back to
    assert stack.rollback_pins(bumped, "h1") == a
    with pytest.raises(ValueError, match="h1: no previous GPU stack is recorded"):
        stack.rollback_pins(first, "h1")
    assert stack.parse_record("not json") is None and stack.parse_record('{"current": {}}') == {"current": {}}


def test_with_pins_moves_only_the_pins(tmp_path):
    s = settings_of(make_inventory(host_data={"nvidia_driver_version": NEW}))
    back = stack.with_pins(s.stack, {"driver_version": OLD})
    assert back.driver_version == OLD and back.gpu_count == s.stack.gpu_count == 8
    assert stack.describe(back).startswith(f"NVIDIA {OLD} (open")


def test_a_hosts_stack_move_comes_before_its_release_moves_and_batches_keep_hosts_together():
    sm = StackMove("h1", "NVIDIA x", "packages change", (), ("fast",))
    rm = Move("h1", "fast", "r1", "r2", "r1")
    assert stack_moves_first([rm, sm]) == [sm, rm]
    plan = batches([rm, sm, Move("h2", "fast", "r1", "r2", "r1")], ["h1", "h2"], 1)
    assert [[m.host for m in b] for b in plan] == [["h1", "h1"], ["h2"]]


# --- the move, against a recording host ----------------------------------------------------------

class Host:
    """Answers run_shell_command like pyinfra's Host; records every command."""

    def __init__(self):
        self.name, self.data, self.ran, self.connected, self.boots = "h1", {}, [], True, iter(["b1", "b2"])
        self.boot = "b1"

    def run_shell_command(self, command, _sudo=False, _timeout=None):
        text = str(command.bits[0]) if hasattr(command, "bits") else str(command)
        self.ran.append(text)
        out = ""
        if text == layer.BOOT_ID:
            out = self.boot
        elif text.startswith("( sleep 1 && reboot )"):
            self.boot = "b2"
        elif text == "dpkg --print-architecture":
            out = "amd64"
        return True, SimpleNamespace(stdout=out, stderr="", output=out, stdout_lines=out.splitlines())

    def disconnect(self):
        self.connected = False

    def connect(self, show_errors=False):
        self.connected = True


@pytest.fixture
def settings(tmp_path):
    keys = key_file(tmp_path)
    return settings_of(make_inventory(host_data={
        "proxy": True, "api_keys_file": str(keys), "drain_s": 0, "reboot": "allowed", "reboot_delay": 0,
        "nvidia_driver_version": NEW}))


@pytest.fixture
def host_state(monkeypatch):
    """The facts the move reads, as the test sets them: packages planned, module, GPUs, admission."""
    st = SimpleNamespace(installed=False, loaded=OLD, verify=[], admission_ok=True, gates=[])

    def plan(specs, family, with_versions=False, get=None):
        if st.installed:
            return stack.PackagePlan([], [], [], [])
        return stack.PackagePlan(["nvidia-open"], [f"nvidia-open={NEW}-1"], [], [])

    def module(vendor, package, get=None):
        return (f"{NEW}-1" if st.installed else f"{OLD}-1"), st.loaded

    def findings(settings, get=None):
        ok = "0" if st.admission_ok else "3"
        return [admission.Finding("ecc_uncorrectable", "0000:18:00.0", ok, "0", st.admission_ok)]

    monkeypatch.setattr(gpu_ops, "_plan", plan)
    monkeypatch.setattr(gpu_ops, "module_state", module)
    monkeypatch.setattr(gpu_ops, "nvidia_problems", lambda s, get=None: list(st.verify))
    monkeypatch.setattr(gpu_ops, "admission_findings", findings)
    monkeypatch.setattr(layer, "gate", lambda h, s, dep: (st.gates.append(dep) or True, "ok"))
    monkeypatch.setattr(rotation, "DRAIN_POLL_S", 0)
    monkeypatch.setattr(layer.time, "sleep", lambda s: None)
    return st


def _apt_install(h, st):
    """What the stand-in host does when the move installs: the packages are there afterwards."""
    orig = h.run_shell_command

    def run(command, _sudo=False, _timeout=None):
        text = str(command.bits[0]) if hasattr(command, "bits") else str(command)
        if text.startswith(stack.APT_INSTALL):
            st.installed = True
        elif text.startswith("( sleep 1 && reboot )"):
            st.loaded = NEW
        return orig(command, _sudo, _timeout)
    h.run_shell_command = run


def _steps(h) -> list[str]:
    names = {rollout.out_of_rotation("minimax"): "out", rollout.stop("minimax"): "stop",
             rollout.into_rotation("minimax"): "in", layer.BOOT_ID: None}
    out = []
    for c in h.ran:
        if c in names:
            if names[c]:
                out.append(names[c])
        elif c.startswith(stack.APT_INSTALL):
            out.append("install")
        elif c.startswith("apt-mark unhold"):
            out.append("unhold")
        elif c.startswith("( sleep 1 && reboot )"):
            out.append("reboot")
        elif c.startswith("systemctl enable --now"):
            out.append("units")
        elif c.startswith(rollout.start("minimax")):
            out.append("start")
        elif c.startswith("umask 077; mkdir -p") and "record.json" in c:
            out.append("record")
    return out


def _move(s) -> StackMove:
    return StackMove("h1", stack.describe(s.stack), "packages change", tuple(sorted(stack.pins(s.stack).items())),
                     ("minimax",))


def test_the_move_drains_before_it_changes_reboots_once_and_admits_before_it_serves(settings, host_state):
    h = Host()
    _apt_install(h, host_state)
    layer.move_stack(h, _move(settings), settings)
    assert _steps(h) == ["out", "stop", "unhold", "install", "reboot", "units", "record", "start", "in"]
    assert host_state.gates == ["minimax"]
    assert f"rm -f {stack.STACK_MOVING}" in h.ran


def test_no_reboot_when_the_loaded_module_is_already_the_installed_one(settings, host_state):
    h = Host()
    host_state.loaded = NEW
    _apt_install(h, host_state)
    layer.move_stack(h, _move(settings), settings)
    assert "reboot" not in _steps(h)


@pytest.mark.parametrize("fault", ["verify", "admission"])
def test_a_host_that_fails_after_its_change_stays_out_with_its_engine_stopped(settings, host_state, fault):
    h = Host()
    _apt_install(h, host_state)
    if fault == "verify":
        host_state.verify = ["GPU 0000:18:00.0 is missing"]
    else:
        host_state.admission_ok = False
    with pytest.raises(MoveFailed, match=f"(?s)h1: GPU stack move to .* failed at {fault}: .*stays out of rotation"):
        layer.move_stack(h, _move(settings), settings)
    steps = _steps(h)
    assert steps[:5] == ["out", "stop", "unhold", "install", "reboot"]
    assert "start" not in steps and "in" not in steps and "record" not in steps
    assert steps[-1] == "stop"    # the unit started again at boot: stopped before the host is left out
    assert f"rm -f {stack.STACK_MOVING}" not in h.ran     # the next plan resumes the move


class Fresh(Host):
    """A host no earlier move left out of rotation; ``df`` answers ``free_kib`` free."""

    def __init__(self, free_kib=50_000_000):
        super().__init__()
        self.free_kib = free_kib

    def run_shell_command(self, command, _sudo=False, _timeout=None):
        text = str(command.bits[0]) if hasattr(command, "bits") else str(command)
        if text == f"test -e {stack.STACK_MOVING}":
            self.ran.append(text)
            return False, SimpleNamespace(stdout="", stderr="", output="", stdout_lines=[])
        if text == stack.FREE_SPACE_COMMAND:
            self.ran.append(text)
            out = ("Filesystem 1024-blocks Used Available Capacity Mounted on\n"
                   f"/dev/root 100000000 1 {self.free_kib} 1% /\n")
            return True, SimpleNamespace(stdout=out, stderr="", output=out, stdout_lines=out.splitlines())
        return super().run_shell_command(command, _sudo, _timeout)


def test_a_move_that_needs_a_refused_reboot_is_refused_before_the_host_leaves_rotation(settings, host_state):
    s = settings_of(make_inventory(host_data={
        "proxy": True, "api_keys_file": settings.deployments[0].api_keys_file, "drain_s": 0,
        "reboot": "never", "nvidia_driver_version": NEW}))
    h = Fresh()
    _apt_install(h, host_state)
    with pytest.raises(MoveFailed, match=f"refused before the host left rotation: loading kernel module "
                                         f"{NEW} .loaded now: {OLD}. needs a reboot .*reboot: never.*"
                                         "serves on its old stack"):
        layer.move_stack(h, _move(s), s)
    assert _steps(h) == []     # never out, never stopped, nothing installed
    assert f"touch {stack.STACK_MOVING}" not in " ".join(h.ran)


def test_a_move_without_the_free_disk_it_needs_is_refused_before_the_host_leaves_rotation(settings,
                                                                                        host_state):
    h = Fresh(free_kib=(layer.STACK_FREE_MIB - 1) * 1024)
    with pytest.raises(MoveFailed, match=f"refused before the host left rotation: {layer.STACK_FREE_MIB - 1} "
                                         "MiB free"):
        layer.move_stack(h, _move(settings), settings)
    assert _steps(h) == []
    enough = Fresh()
    _apt_install(enough, host_state)
    layer.move_stack(enough, _move(settings), settings)
    assert _steps(enough)[:4] == ["out", "stop", "unhold", "install"]


def test_a_move_whose_packages_the_host_cannot_see_is_refused_before_the_host_leaves_rotation(
        settings, host_state, monkeypatch):
    """The third precondition: the target's packages offered to the host's apt (its pin or
    sources written first). stack.plan_packages says which are not; the move refuses on it."""
    offered = {"nvidia-open": [f"{OLD}-1"]}   # the host's repositories lack the new driver
    target = stack.target(settings.stack, _move(settings).os)
    real = stack.plan_packages(target.specs, {"nvidia-open": f"{OLD}-1"}, ["nvidia-open"], offered,
                               target.family)
    assert real.problems and f"is not offered by the configured repositories (offered: {OLD}-1)" in real.problems[0]
    monkeypatch.setattr(gpu_ops, "_plan", lambda specs, family, with_versions=False, get=None: real)
    h = Fresh()
    _apt_install(h, host_state)
    with pytest.raises(MoveFailed, match="refused before the host left rotation: .* is not offered by the "
                                         "configured repositories.*serves on its old stack"):
        layer.move_stack(h, _move(settings), settings)
    assert _steps(h) == []     # never out, never stopped, nothing installed


def test_free_mib_reads_the_least_free_filesystem():
    out = ("Filesystem 1024-blocks Used Available Capacity Mounted on\n"
           "/dev/a 10 1 4096 1% /var\n/dev/b 10 1 1048576 1% /usr\n")
    assert stack.free_mib(out) == 4 and stack.free_mib("garbage") is None


def test_reboot_needed_compares_the_target_module_with_the_loaded_one(settings):
    t = stack.target(settings.stack, "debian12")
    assert stack.reboot_needed(t, "nvidia", NEW) == ""
    assert stack.reboot_needed(t, "nvidia", OLD) == f"loading kernel module {NEW} (loaded now: {OLD})"
    assert "loaded now: none" in stack.reboot_needed(t, "nvidia", None)
    assert stack.reboot_needed(t, "amd", OLD) == ""


def test_a_downgrade_takes_the_drivers_other_packages_along():
    # libcuda1 is not in the held set; the metapackages depend on it with '>=', so apt would
    # leave it at the newer release after a downgrade (CUDA: 803, libcuda vs the loaded module)
    installed = {"libcuda1": f"{NEW}-1", "nvidia-smi": f"{NEW}-1", "nvidia-open": f"{NEW}-1",
                 "nvidia-container-toolkit": "1.17.8-1", "libcuda-extra": f"{OLD}-1"}
    offered = {"libcuda1": [f"{NEW}-1", f"{OLD}-1"], "nvidia-smi": [f"{NEW}-1", f"{OLD}-1"],
               "nvidia-container-toolkit": ["1.17.8-1"]}
    assert stack.companions(installed, ["nvidia-open"], offered, OLD) == [f"libcuda1={OLD}-1",
                                                                         f"nvidia-smi={OLD}-1"]


@pytest.mark.parametrize("resuming", [False, True])
def test_a_failure_before_any_package_changed_serves_the_old_stack_again_unless_resuming(settings, host_state,
                                                                                          resuming):
    class MirrorDown(Host):
        def run_shell_command(self, command, _sudo=False, _timeout=None):
            text = str(command.bits[0]) if hasattr(command, "bits") else str(command)
            if text == f"test -e {stack.STACK_MOVING}":
                self.ran.append(text)
                return resuming, SimpleNamespace(stdout="", stderr="", output="", stdout_lines=[])
            if "apt-get update" in text:
                self.ran.append(text)
                return False, SimpleNamespace(stdout="", stderr="", output="Could not resolve mirror",
                                              stdout_lines=[])
            return super().run_shell_command(command, _sudo, _timeout)
    h = MirrorDown()
    if resuming:   # an earlier move left it out with its stack changed: it stays out
        with pytest.raises(MoveFailed, match="(?s)failed at change: .*Could not resolve mirror.*stays out"):
            layer.move_stack(h, _move(settings), settings)
        assert "start" not in _steps(h) and "in" not in _steps(h)
    else:
        with pytest.raises(MoveFailed, match="(?s)Could not resolve mirror.*nothing was installed; the host "
                                             "serves on its old stack"):
            layer.move_stack(h, _move(settings), settings)
        assert _steps(h) == []   # checked before the host left rotation: it never stopped serving
        assert f"touch {stack.STACK_MOVING}" not in " ".join(h.ran)
