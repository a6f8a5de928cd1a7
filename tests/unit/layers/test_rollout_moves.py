"""A host with several deployments moves one deployment at a time: it keeps serving the others.

The move's commands are recorded from a stand-in connection (the commands themselves run on
sandbox hosts in tests/integration/test_serve_e2e.py and test_rollout_faults.py)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from gpuserve import rollout
from gpuserve.layers import rollout as layer
from gpuserve.rollout import Move

from tests.unit.helpers import key_file, make_inventory, settings_of


class RecordingHost:
    """Answers run_shell_command like pyinfra's Host: (ok, output); records what ran."""

    def __init__(self, current: dict[str, str], drained: set[str] = frozenset()):
        self.name, self.data, self.ran = "h1", {}, []
        self.current, self.drained = dict(current), set(drained)

    def run_shell_command(self, command, _sudo=False, _timeout=None):
        text = str(command.bits[0]) if hasattr(command, "bits") else str(command)
        self.ran.append(text)
        out = ""
        for dep, release in self.current.items():
            if text == rollout.read_pointers(dep):
                out = f"releases/{release} releases/old"
            if text == f"test -e {rollout.drain_flag(dep)}":
                return dep in self.drained, SimpleNamespace(stdout="", stderr="", output="")
        return True, SimpleNamespace(stdout=out, stderr="", output=out)


@pytest.fixture
def settings(tmp_path):
    keys = key_file(tmp_path)
    return settings_of(make_inventory(host_data={
        "proxy": True, "api_keys_file": str(keys), "drain_s": 0,
        "deployments": {"fast": {"serve_flags": {"tensor-parallel-size": 4}},
                        "deep": {"serve_port": 8001, "proxy_port": 8444,
                                 "serve_flags": {"tensor-parallel-size": 4}}}}))


def _events(h) -> list[str]:
    out = []
    for cmd in h.ran:
        for dep in ("fast", "deep"):
            if cmd == rollout.out_of_rotation(dep):
                out.append(f"out {dep}")
            elif cmd == rollout.into_rotation(dep):
                out.append(f"in {dep}")
            elif cmd.startswith(rollout.start(dep)):
                out.append(f"start {dep}")
    return out


def test_each_deployment_is_back_in_before_the_next_leaves(settings, monkeypatch):
    gated = []
    monkeypatch.setattr(layer, "_gate", lambda h, s, dep: (gated.append(dep) or True, "ok"))
    h = RecordingHost({"fast": "r1", "deep": "r1"})
    layer._move_host(h, [Move("h1", "fast", "r1", "r2", "r1"), Move("h1", "deep", "r1", "r2", "r1")],
                     settings)
    assert _events(h) == ["out fast", "start fast", "in fast", "out deep", "start deep", "in deep"]
    assert gated == ["fast", "deep"]


def test_a_failed_gate_leaves_the_deployments_already_moved_serving(settings, monkeypatch):
    # fast moves fine; deep's new release fails its gate and goes back to r1 (which passes)
    answers = iter([True, False, True])
    monkeypatch.setattr(layer, "_gate", lambda h, s, dep: (next(answers), "engine died"))
    h = RecordingHost({"fast": "r1", "deep": "r1"})
    with pytest.raises(layer._MoveFailed, match="deep: gate failed on r2 .engine died.; rolled back "
                                                 "to r1, serving again"):
        layer._move_host(h, [Move("h1", "fast", "r1", "r2", "r1"),
                             Move("h1", "deep", "r1", "r2", "r1")], settings)
    assert _events(h) == ["out fast", "start fast", "in fast", "out deep", "start deep",
                          "start deep", "in deep"]


def test_a_deployment_another_rollout_already_moved_is_skipped(settings, monkeypatch):
    monkeypatch.setattr(layer, "_gate", lambda h, s, dep: (True, "ok"))
    h = RecordingHost({"fast": "r2", "deep": "r1"})       # fast: moved since the plan was made
    layer._move_host(h, [Move("h1", "fast", "r1", "r2", "r1"), Move("h1", "deep", "r1", "r2", "r1")],
                     settings)
    assert _events(h) == ["out deep", "start deep", "in deep"]


def test_a_drained_deployment_on_its_target_is_finished_not_skipped(settings, monkeypatch):
    # a rollout killed after its switch leaves it drained on the target: finish it (gate, in)
    monkeypatch.setattr(layer, "_gate", lambda h, s, dep: (True, "ok"))
    h = RecordingHost({"fast": "r2", "deep": "r2"}, drained={"fast"})
    layer._move_host(h, [Move("h1", "fast", "r1", "r2", "r1")], settings)
    assert _events(h) == ["out fast", "start fast", "in fast"]


def test_running_requests_are_summed_over_engines_and_both_engines_metric_names():
    text = ('vllm:num_requests_running{engine="0",model_name="m"} 3.0\n'
            'vllm:num_requests_running{engine="1",model_name="m"} 1.0\n'
            'sglang:num_running_reqs{model_name="m"} 2\n'
            'vllm:num_requests_waiting{engine="0"} 9.0\n')
    assert rollout.parse_running(text) == 6
    assert rollout.parse_running("") == 0


def test_a_move_waits_for_running_requests_before_it_stops_the_engine(settings, monkeypatch):
    from gpuserve.layers import rotation
    monkeypatch.setattr(layer, "_gate", lambda h, s, dep: (True, "ok"))
    monkeypatch.setattr(rotation, "DRAIN_POLL_S", 0)
    running = iter(["2", "1", "0"])

    class Busy(RecordingHost):
        def run_shell_command(self, command, _sudo=False, _timeout=None):
            text = str(command.bits[0]) if hasattr(command, "bits") else str(command)
            if "/metrics" in text:
                self.ran.append("metrics")
                out = f"vllm:num_requests_running{{engine=\"0\"}} {next(running)}\n"
                return True, SimpleNamespace(stdout=out, stderr="", output=out)
            return super().run_shell_command(command, _sudo, _timeout)

    h = Busy({"fast": "r1"})
    layer._move_host(h, [Move("h1", "fast", "r1", "r2", "r1")], settings)
    stop_at = h.ran.index(rollout.stop("fast"))
    assert h.ran[:stop_at].count("metrics") == 3     # polled until 0, and only then stopped
