"""Rollouts over what is reachable (issue 27): the failure budget (max_fail_percentage), one canary
per hardware kind within max_unavailable, and the stack moves that would strand a host refused
before any host leaves rotation. Pure planning (gpuserve.rollout) and the rollout operation
(gpuserve.layers.rollout._roll) against recording stand-in hosts; the sandbox runs the same in
tests/integration/test_rollout_reach.py and tests/integration/test_stack_rollout.py."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from gpuserve import rollout
from gpuserve.layers import rollout as layer
from gpuserve.layers import rotation
from gpuserve.rollout import LockHolder, Move, StackMove

from tests.unit.helpers import key_file, make_inventory, settings_of
from tests.unit.layers.test_rollout_moves import RecordingHost


def _moves(hosts):
    return [Move(h, "minimax", "r1", "r2", "r1") for h in hosts]


# --- pure: canaries per hardware kind -----------------------------------------------------------

def test_every_hardware_kind_the_rollout_changes_gets_its_own_canary_first():
    kinds = {"a": "hopper_x8", "b": "hopper_x8", "c": "blackwell_x4", "d": "mi355x_x4", "e": "hopper_x8"}
    plan, canaries = rollout.canary_plan(_moves("abcde"), list("abcde"), 1, 1, kinds)
    assert [[m.host for m in b] for b in plan] == [["a"], ["c"], ["d"], ["b"], ["e"]]
    assert canaries == 3
    # within max_unavailable: the three canaries move two at a time
    plan, canaries = rollout.canary_plan(_moves("abcde"), list("abcde"), 2, 1, kinds)
    assert [[m.host for m in b] for b in plan] == [["a", "c"], ["d"], ["b", "e"]]
    assert canaries == 2


def test_a_kind_the_rollout_does_not_change_gets_no_canary():
    kinds = {"a": "hopper_x8", "b": "blackwell_x4", "c": "blackwell_x4"}
    plan, canaries = rollout.canary_plan(_moves("ac"), list("abc"), 1, 1, kinds)   # b is not moving
    assert [[m.host for m in b] for b in plan] == [["a"], ["c"]] and canaries == 2
    plan, canaries = rollout.canary_plan(_moves("abc"), list("abc"), 1, 2, kinds)
    assert [[m.host for m in b] for b in plan] == [["a"], ["b"], ["c"]] and canaries == 3
    with pytest.raises(ValueError):
        rollout.canary_hosts_per_kind(list("abc"), kinds, 0)


# --- pure: the failure budget ----------------------------------------------------------------------

def test_failed_hosts_within_the_budget_let_the_rollout_go_on_over_it_they_refuse():
    assert rollout.fail_budget_refusal("upgrade", [], 4, 0) is None
    assert rollout.fail_budget_refusal("upgrade", ["h4"], 4, 25) is None
    why = rollout.fail_budget_refusal("upgrade", ["h4"], 4, 0)
    assert why.startswith("upgrade not started: unreachable or failed to prepare: h4 (1 of 4 hosts, 25%, "
                          "over max_fail_percentage = 0); no host was switched")
    assert "over max_fail_percentage = 40" in rollout.fail_budget_refusal("upgrade", ["h1", "h2"], 4, 40)
    msg = rollout.skipped_message("upgrade", ["h4"])
    assert "SKIPPED h4" in msg and "Run the same command again" in msg


def test_a_stack_move_that_needs_a_refused_reboot_is_named():
    bump = StackMove("h1", "NVIDIA 2", "packages change", (), ("minimax",),
                     reboot_needed="loading kernel module 2 (loaded now: 1)")
    same = StackMove("h2", "NVIDIA 2", "packages change", (), ("minimax",))
    assert rollout.reboot_refusals([bump, same], {"h1": False, "h2": False}) == [
        "h1: loading kernel module 2 (loaded now: 1) needs a reboot and this host may not be rebooted "
        "(reboot: never)"]
    assert rollout.reboot_refusals([bump], {"h1": True}) == []


# --- the rollout operation against stand-in hosts ---------------------------------------------------

class Fleet(RecordingHost):
    def __init__(self, name):
        super().__init__({"minimax": "r1"})
        self.name = name


def _run(tmp_path, monkeypatch, failed, moves=None, kinds=None, **data):
    names = ["h1", "h2", "h3", "h4"]
    keys = key_file(tmp_path)
    inv = make_inventory(host_data={"proxy": True, "api_keys_file": str(keys), "drain_s": 0,
                                    "canary_bake_s": 0, **data}, hosts=tuple(names))
    settings = {n: settings_of(inv, n) for n in names}
    for n, (model, count) in (kinds or {}).items():
        hw = settings[n].hardware.__class__(model, count)
        settings[n] = settings[n].__class__(**{**settings[n].__dict__, "hardware": hw})
    hosts = {n: Fleet(n) for n in names}
    state = SimpleNamespace(inventory=list(hosts.values()),
                            failed_hosts={hosts[n] for n in failed},
                            active_hosts={h for n, h in hosts.items() if n not in failed},
                            _gpuserve_moves={n: [m for m in (moves or _moves(names)) if m.host == n]
                                             for n in names if n not in failed})
    monkeypatch.setattr(layer, "all_settings", lambda: settings)
    monkeypatch.setattr(layer, "_gate", lambda h, s, dep: (True, "ok"))
    monkeypatch.setattr(rotation, "DRAIN_POLL_S", 0)
    monkeypatch.setattr(layer, "_lock_all", lambda hs, me, s: list(hs))
    monkeypatch.setattr(layer, "_unlock", lambda hs, me: None)
    monkeypatch.setattr(layer, "_beat", lambda hs, me: None)
    order = []
    real = layer._move_host
    monkeypatch.setattr(layer, "_move_host", lambda h, ms, s: (order.append(h.name), real(h, ms, s)))
    logged = []
    monkeypatch.setattr(layer.logger, "error", logged.append)
    ok = layer._roll(state, None, "upgrade")
    return ok, hosts, logged, order


def _switched(h) -> bool:
    return any("releases/r2" in c and "current.new" in c for c in h.ran)


def test_an_unreachable_host_within_the_budget_is_skipped_named_and_the_run_fails(tmp_path, monkeypatch):
    ok, hosts, logged, _ = _run(tmp_path, monkeypatch, failed={"h4"}, max_fail_percentage=25)
    assert ok is False                      # the run exits non-zero: automation notices
    assert all(_switched(hosts[n]) for n in ("h1", "h2", "h3"))
    assert hosts["h4"].ran == []
    assert any("SKIPPED h4" in m for m in logged), logged


def test_an_unreachable_host_over_the_budget_stops_the_rollout_before_any_move(tmp_path, monkeypatch):
    ok, hosts, logged, _ = _run(tmp_path, monkeypatch, failed={"h4"})   # max_fail_percentage 0
    assert ok is False
    assert not any(h.ran for h in hosts.values())
    assert any("no host was switched" in m and "h4" in m for m in logged), logged


def test_a_mixed_fleet_moves_one_canary_per_recipe_first(tmp_path, monkeypatch):
    kinds = {"h1": ("H200", 8), "h2": ("H200", 8), "h3": ("B200", 8), "h4": ("B200", 8)}
    ok, hosts, logged, order = _run(tmp_path, monkeypatch, failed=set(), kinds=kinds)
    assert ok is True, logged
    assert order == ["h1", "h3", "h2", "h4"]
    # the same recipe on other GPUs is another kind: its own canary
    assert layer.hardware_kind(layer.all_settings()["h3"]).endswith("on 8x B200")


def test_a_driver_bump_that_needs_a_refused_reboot_moves_no_host(tmp_path, monkeypatch):
    moves = [StackMove(n, "NVIDIA 2", "packages change", (), ("minimax",),
                       reboot_needed="loading kernel module 2 (loaded now: 1)") for n in ("h1", "h2")]
    ok, hosts, logged, order = _run(tmp_path, monkeypatch, failed=set(), moves=moves, reboot="never")
    assert ok is False and order == []
    assert not any(h.ran for h in hosts.values())
    assert any("refused before any host left rotation: h1: loading kernel module 2" in m for m in logged)


# --- one writer at a time: deploys/serve.py and deploys/gateway.py hold the rollout lock -----------

class LockHost(Fleet):
    """Keeps a rollout lock file as the lock commands would."""

    def __init__(self, name, held: str | None = None):
        super().__init__(name)
        self.lock = held

    def run_shell_command(self, command, _sudo=False, _timeout=None):
        text = str(command.bits[0]) if hasattr(command, "bits") else str(command)
        if rollout.LOCK_TAKEN in text:
            self.ran.append("take")
            if self.lock is None:
                self.lock = "ours"
                return True, SimpleNamespace(stdout=rollout.LOCK_TAKEN, stderr="", output="")
            out = f"{rollout.LOCK_HELD}\n{self.lock}"
            return True, SimpleNamespace(stdout=out, stderr="", output=out)
        if f"rm -f {rollout.LOCK_FILE}" in text:
            self.ran.append("release")
            if self.lock == "ours":
                self.lock = None
            return True, SimpleNamespace(stdout="", stderr="", output="")
        return super().run_shell_command(command, _sudo, _timeout)


def _converge(tmp_path, monkeypatch, hosts):
    from pyinfra.context import ctx_host, ctx_state
    keys = key_file(tmp_path)
    inv = make_inventory(host_data={"proxy": True, "api_keys_file": str(keys)}, hosts=tuple(hosts))
    settings = {n: settings_of(inv, n) for n in hosts}
    monkeypatch.setattr(layer, "all_settings", lambda: settings)
    handlers = []
    state = SimpleNamespace(add_callback_handler=handlers.append, get_op_order=lambda: ["op1", "op2"])
    for h in hosts.values():
        with ctx_state.use(state), ctx_host.use(h):
            layer.hold_writer_lock("converge")
    return state, handlers


def test_a_converge_holds_the_rollout_lock_until_its_last_operation_ends(tmp_path, monkeypatch):
    hosts = {"h1": LockHost("h1"), "h2": LockHost("h2")}
    state, handlers = _converge(tmp_path, monkeypatch, hosts)
    assert all(h.lock == "ours" for h in hosts.values())
    (writer,) = handlers
    writer.operation_end(state, "op1")
    assert all(h.lock == "ours" for h in hosts.values())     # still running
    writer.operation_end(state, "op2")
    assert all(h.lock is None for h in hosts.values())


def test_a_converge_during_a_rollout_refuses_naming_it_and_gives_back_what_it_took(tmp_path, monkeypatch):
    import time

    from pyinfra.api.exceptions import PyinfraError
    now = time.time()
    rolling = LockHolder(run="r0123456789a", who="ops@ctl-b", node="ctl-b", pid=4242, kind="upgrade",
                         since=now - 60, beat=now - 5)
    hosts = {"h1": LockHost("h1"), "h2": LockHost("h2", held=rolling.to_json())}
    with pytest.raises(PyinfraError, match="converge refused: h2 is locked by upgrade run r0123456789a by "
                                           "ops@ctl-b .pid 4242."):
        _converge(tmp_path, monkeypatch, hosts)
    assert hosts["h1"].lock is None and hosts["h1"].ran == ["take", "release"]
    assert hosts["h2"].lock == rolling.to_json()      # the rollout's lock is untouched
