"""OS and kernel updates as a rollout reason: the pure decisions (gpuserve.patch) and the move's
steps for an OS update (gpuserve.layers.stack_move with a PatchMove), recorded from a stand-in
host as tests/unit/layers/test_stack_move.py does. The same move runs on a sandbox host in
tests/integration/test_patch.py."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from gpuserve import patch, rollout, stack
from gpuserve.facts.kernel import HeldVersions, KernelState, PendingUpgrades
from gpuserve.layers import rotation
from gpuserve.layers import stack_move as layer
from gpuserve.rollout.remote import MoveFailed
from gpuserve.operations import gpu_stack as gpu_ops
from gpuserve.patch import DkmsModule, PatchMove, Upgrade
from gpuserve.rollout import Move, StackMove, stack_moves_first

from .helpers import key_file, make_inventory, settings_of
from tests.unit.layers.test_stack_move import Host as StackHost

OLD_K, NEW_K = "6.1.0-40-gpuserve-sim", "6.1.0-41-gpuserve-sim"
DRIVER = "580.95.05"


# --- pure ---------------------------------------------------------------------------------------

@pytest.mark.parametrize("a,b,want", [
    ("6.1.0-9-amd64", "6.1.0-10-amd64", -1),          # numbers compare as numbers
    ("6.1.0-28-amd64", "6.1.0-28-amd64", 0),
    ("6.8.0-50-generic", "6.8.0-49-generic", 1),
    ("1:1.0-1", "2.0-1", 1),                          # the epoch first
    ("1.0~rc1-1", "1.0-1", -1),                       # ~ sorts before anything
    ("580.105.08-1", "580.95.05-1", 1),
    ("1.0-1", "1.0-1+deb12u1", -1),
])
def test_versions_and_kernel_releases_sort_as_dpkg_does(a, b, want):
    got = patch.compare_versions(a, b)
    assert (got > 0) - (got < 0) == want


def test_kernel_image_packages_are_told_from_metapackages():
    assert patch.kernel_release("linux-image-6.1.0-28-amd64") == "6.1.0-28-amd64"
    assert patch.kernel_release("linux-image-unsigned-6.8.0-50-generic") == "6.8.0-50-generic"
    assert patch.kernel_release(f"linux-image-{NEW_K}") == NEW_K
    for meta in ("linux-image-amd64", "linux-image-generic", "linux-image-gpuserve-sim", "linux-headers-6.1.0-28-amd64"):
        assert patch.kernel_release(meta) is None


def _state(running, installed, dkms=()):
    return patch.KernelState(running, tuple(installed), tuple(dkms))


def test_the_next_boot_is_the_newest_installed_kernel_and_a_change_only_when_it_is_not_running():
    assert _state(OLD_K, [NEW_K, OLD_K]).boot_target == NEW_K
    assert _state(OLD_K, [NEW_K, OLD_K]).change == NEW_K
    assert _state(NEW_K, [NEW_K, OLD_K]).change is None
    assert _state("6.12.0-real", []).change is None            # no kernel installed (a container)
    assert _state("6.1.0-9-amd64", ["6.1.0-9-amd64", "6.1.0-10-amd64"]).change == "6.1.0-10-amd64"


def test_the_kernel_facts_parse_running_installed_and_dkms_builds():
    lines = [f"running:{OLD_K}", f"boot:{OLD_K}", f"boot:{NEW_K}", "boot:6.1.0-1-amd64.old",
             f"dkms:/var/lib/dkms/nvidia/kernel-{NEW_K}-x86_64 {DRIVER}/{NEW_K}/x86_64",
             "dkms:/var/lib/dkms/nvidia/kernel-bogus-x86_64 nonsense", ""]
    st = KernelState().process(lines)
    assert st.running == OLD_K and st.installed == (OLD_K, NEW_K)
    assert st.dkms == (DkmsModule("nvidia", DRIVER, NEW_K, "x86_64"),)


def test_the_driver_module_must_be_built_for_the_kernel_at_the_drivers_version():
    built = DkmsModule("nvidia", DRIVER, NEW_K, "x86_64")
    assert patch.module_problem(_state(OLD_K, [NEW_K], [built]), NEW_K, "nvidia", DRIVER, "h1") is None
    why = patch.module_problem(_state(OLD_K, [NEW_K], [DkmsModule("nvidia", DRIVER, OLD_K, "x86_64")]),
                               NEW_K, "nvidia", DRIVER, "h1")
    assert why.startswith(f"h1: no NVIDIA driver kernel module is built for kernel {NEW_K} (DKMS has it for {OLD_K})")
    assert f"install linux-headers-{NEW_K}" in why
    stale = patch.module_problem(_state(OLD_K, [NEW_K], [DkmsModule("nvidia", "580.105.08", NEW_K, "x86_64")]),
                                 NEW_K, "nvidia", DRIVER, "h1")
    assert "is 580.105.08, the driver is 580.95.05" in stale
    assert patch.module_problem(_state(OLD_K, [NEW_K]), NEW_K, None, None, "h1") is None   # no GPU stack
    assert patch.module_problem(_state(OLD_K, [NEW_K], [DkmsModule("amdgpu", "6.16.6", NEW_K, "x86_64")]),
                                NEW_K, "amd", None, "h1") is None


SIMULATION = """NOTE: This is only a simulation!
The following packages have been kept back:
  nvidia-open
The following NEW packages will be installed:
  linux-headers-6.1.0-41-gpuserve-sim linux-image-6.1.0-41-gpuserve-sim
Inst linux-image-6.1.0-41-gpuserve-sim (6.1.158-1 gpuserve-sim [amd64])
Inst linux-image-gpuserve-sim [6.1.153-1] (6.1.158-1 gpuserve-sim [amd64])
Inst libssl3 [3.0.15-1~deb12u1] (3.0.17-1~deb12u2 Debian-Security:12/stable-security [amd64])
Conf libssl3 (3.0.17-1~deb12u2 Debian-Security:12/stable-security [amd64])
"""


def test_the_simulation_gives_the_updates_and_the_new_kernel():
    ups = PendingUpgrades().process(SIMULATION.splitlines())
    assert ups == [Upgrade("linux-image-6.1.0-41-gpuserve-sim", None, "6.1.158-1"),
                   Upgrade("linux-image-gpuserve-sim", "6.1.153-1", "6.1.158-1"),
                   Upgrade("libssl3", "3.0.15-1~deb12u1", "3.0.17-1~deb12u2")]
    assert patch.new_kernels(ups) == [NEW_K]
    assert patch.held_in(ups, ["nvidia-open", "libssl3"]) == ["libssl3"]
    reason = patch.pending_reason(ups, _state(OLD_K, [OLD_K]))
    assert reason == (f"3 package(s) to update: linux-image-{NEW_K}, linux-image-gpuserve-sim, libssl3; "
                      f"kernel {OLD_K} -> {NEW_K} (reboot)")


def test_a_host_moves_for_updates_or_an_owed_reboot_and_not_otherwise():
    libssl = [Upgrade("libssl3", "3.0.15-1", "3.0.17-1")]
    assert patch.pending_reason(libssl, _state(OLD_K, [OLD_K])) == "1 package(s) to update: libssl3"
    assert (patch.pending_reason([], _state(OLD_K, [OLD_K, NEW_K]))
            == f"kernel {NEW_K} installed, {OLD_K} running (reboot owed)")
    assert patch.pending_reason([], _state(NEW_K, [OLD_K, NEW_K])) is None


def test_held_versions_are_compared_before_and_after():
    before = {"nvidia-open": f"{DRIVER}-1", "nvidia-kernel-open-dkms": f"{DRIVER}-1"}
    assert patch.held_changed(before, dict(before)) == []
    assert patch.held_changed(before, {"nvidia-open": "580.105.08-1"}) == [
        "nvidia-kernel-open-dkms 580.95.05-1 -> (removed)", "nvidia-open 580.95.05-1 -> 580.105.08-1"]
    assert HeldVersions().process(["nvidia-open 580.95.05-1", "x"]) == {"nvidia-open": "580.95.05-1", "x": ""}


def test_the_upgrade_command_keeps_holds_and_removes_nothing():
    assert "--with-new-pkgs upgrade" in patch.APT_UPGRADE
    assert "allow-change-held" not in patch.APT_UPGRADE and "dist-upgrade" not in patch.APT_UPGRADE
    assert "--force-confold" in patch.APT_UPGRADE


def test_a_patch_move_is_a_host_move_that_comes_before_release_moves():
    pm = PatchMove("h1", "NVIDIA x", "1 package(s) to update: libssl3", (), ("fast",))
    rm = Move("h1", "fast", "r1", "r2", "r1")
    assert isinstance(pm, StackMove) and stack_moves_first([rm, pm]) == [pm, rm]
    assert str(pm) == "h1 OS updates (1 package(s) to update: libssl3)"


# --- the move, against a recording host ----------------------------------------------------------

class Host(StackHost):
    """test_stack_move's recording host, whose kernel state and held versions are what the test
    sets; an upgrade brings st.arrives and st.builds, a reboot boots the newest installed kernel."""

    def __init__(self, st):
        super().__init__()
        self.st = st

    def run_shell_command(self, command, _sudo=False, _timeout=None):
        text = str(command.bits[0]) if hasattr(command, "bits") else str(command)
        st, out = self.st, None
        if text == f"test -e {patch.PATCH_MOVING}" or (text == patch.APT_UPDATE and st.update_fails):
            self.ran.append(text)   # no unfinished patch move here; an apt-get update that fails
            return False, SimpleNamespace(stdout="", stderr="E: lock", output="E: lock", stdout_lines=[])
        if text.startswith("( sleep 1 && reboot )"):
            st.running = patch.newest(st.installed)
        elif patch.APT_UPGRADE in text:
            st.installed, st.dkms = st.installed + st.arrives, st.dkms + st.builds
            if st.held_moves:
                st.held = {k: "9.9-1" for k in st.held}
        elif text == patch.kernel_state_command():
            out = "\n".join([f"running:{st.running}"] + [f"boot:{k}" for k in st.installed]
                            + [f"dkms:/var/lib/dkms/{m.module}/kernel-{m.kernel}-{m.arch} "
                               f"{m.version}/{m.kernel}/{m.arch}" for m in st.dkms])
        elif HeldVersions().command() in text:
            out = "\n".join(f"{k} {v}" for k, v in st.held.items())
        if out is None:
            return super().run_shell_command(command, _sudo, _timeout)
        self.ran.append(text)
        return True, SimpleNamespace(stdout=out, stderr="", output=out, stdout_lines=out.splitlines())


@pytest.fixture
def settings(tmp_path):
    keys = key_file(tmp_path)
    return settings_of(make_inventory(host_data={
        "proxy": True, "api_keys_file": str(keys), "drain_s": 0, "reboot": "allowed", "reboot_delay": 0}))


@pytest.fixture
def host_state(monkeypatch):
    st = SimpleNamespace(running=OLD_K, installed=(OLD_K,), arrives=(NEW_K,),
                         dkms=(DkmsModule("nvidia", DRIVER, OLD_K, "x86_64"),),
                         builds=(DkmsModule("nvidia", DRIVER, NEW_K, "x86_64"),),
                         held={"nvidia-open": f"{DRIVER}-1"}, held_moves=False, gates=[],
                         update_fails=False)
    monkeypatch.setattr(gpu_ops, "nvidia_problems", lambda s, get=None: [])
    monkeypatch.setattr(gpu_ops, "admission_findings", lambda s, get=None: [])
    monkeypatch.setattr(layer, "gate", lambda h, s, dep: (st.gates.append(dep) or True, "ok"))
    monkeypatch.setattr(rotation, "DRAIN_POLL_S", 0)
    monkeypatch.setattr(layer.time, "sleep", lambda s: None)
    return st


def _steps(h) -> list[str]:
    names = {rollout.out_of_rotation("minimax"): "out", rollout.stop("minimax"): "stop",
             rollout.into_rotation("minimax"): "in"}
    out = []
    for c in h.ran:
        if c in names:
            out.append(names[c])
        elif patch.APT_UPGRADE in c:
            out.append("update")
        elif c.startswith("( sleep 1 && reboot )"):
            out.append("reboot")
        elif c.startswith("systemctl enable --now"):
            out.append("units")
        elif c.startswith(rollout.start("minimax")):
            out.append("start")
    return out


def _move(s, kernel=NEW_K) -> PatchMove:
    return PatchMove("h1", stack.describe(s.stack), "updates", tuple(sorted(stack.pins(s.stack).items())),
                     ("minimax",), upgrades=("libssl3",), kernel=kernel)


def test_a_kernel_update_drains_updates_reboots_verifies_and_puts_the_host_back(settings, host_state):
    h = Host(host_state)
    layer.move_stack(h, _move(settings), settings)
    assert _steps(h) == ["out", "stop", "update", "reboot", "units", "start", "in"]
    assert host_state.running == NEW_K and host_state.gates == ["minimax"]
    assert f"rm -f {patch.PATCH_MOVING}" in h.ran
    assert not any("record.json" in c for c in h.ran)      # the GPU stack's record is not touched


def test_an_update_without_a_new_kernel_drains_and_restarts_but_does_not_reboot(settings, host_state):
    host_state.arrives, host_state.builds = (), ()
    h = Host(host_state)
    layer.move_stack(h, _move(settings, kernel=None), settings)
    assert _steps(h) == ["out", "stop", "update", "units", "start", "in"]


def test_a_kernel_without_its_driver_module_is_not_booted_and_the_host_stays_out(settings, host_state):
    host_state.builds = ()     # its headers were missing: DKMS built nothing for it
    h = Host(host_state)
    with pytest.raises(MoveFailed, match=f"(?s)h1: OS update move failed at verify: h1: no NVIDIA driver kernel "
                                         f"module is built for kernel {NEW_K}.*stays out of rotation"):
        layer.move_stack(h, _move(settings), settings)
    steps = _steps(h)
    assert steps == ["out", "stop", "update", "stop"]       # no reboot, no start, not back in
    assert f"rm -f {patch.PATCH_MOVING}" not in h.ran         # the next run resumes the move


def test_a_held_package_that_moved_leaves_the_host_out(settings, host_state):
    host_state.held_moves = True
    h = Host(host_state)
    with pytest.raises(MoveFailed, match="failed at update: held packages changed: nvidia-open"):
        layer.move_stack(h, _move(settings), settings)
    assert "reboot" not in _steps(h) and "start" not in _steps(h)


def test_a_host_that_may_not_reboot_stays_out_with_its_kernel_installed(settings, host_state):
    s = settings_of(make_inventory(host_data={
        "proxy": True, "api_keys_file": settings.deployments[0].api_keys_file, "drain_s": 0, "reboot": "never"}))
    h = Host(host_state)
    with pytest.raises(MoveFailed, match="failed at reboot: .*may not be rebooted"):
        layer.move_stack(h, _move(s), s)
    assert "reboot" not in _steps(h) and "start" not in _steps(h)


def test_an_apt_update_that_fails_changes_nothing_and_the_host_serves_again(settings, host_state):
    """apt's lists could not be read (a lock held past its 10 minutes, a mirror down): nothing
    was installed, so the host starts its engines, passes the gate and goes back in; then the
    rollout halts naming it."""
    host_state.update_fails = True
    h = Host(host_state)
    with pytest.raises(MoveFailed, match="h1: OS update move failed at update: apt-get update failed "
                                         r"\(nothing was installed; the host serves again\): E: lock"):
        layer.move_stack(h, _move(settings), settings)
    assert _steps(h) == ["out", "stop", "start", "in"]          # no upgrade, no reboot
    assert host_state.gates == ["minimax"] and f"rm -f {patch.PATCH_MOVING}" in h.ran
    assert "-o DPkg::Lock::Timeout=600" in patch.APT_UPDATE and "-o DPkg::Lock::Timeout=600" in patch.APT_UPGRADE


def test_a_gpu_host_whose_stack_gpuserve_does_not_manage_is_not_booted_without_its_module(settings, host_state):
    """gpu_stack: False (the driver installed some other way): the kernel still needs the
    vendor's DKMS module, whatever its version."""
    s = settings_of(make_inventory(host_data={
        "proxy": True, "api_keys_file": settings.deployments[0].api_keys_file, "drain_s": 0,
        "reboot": "allowed", "reboot_delay": 0, "gpu_stack": False}))
    assert not s.stack.enabled and s.uses_gpus
    host_state.builds = ()
    h = Host(host_state)
    with pytest.raises(MoveFailed, match="failed at verify: h1: no NVIDIA driver kernel module is built"):
        layer.move_stack(h, _move(s), s)
    assert "reboot" not in _steps(h)
