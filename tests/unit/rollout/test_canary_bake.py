"""The canary bake wired into the rolling upgrade (gpuserve.layers.canary_bake, layers/rollout):
the first batch is the canary; it bakes and is judged before the rest moves; a breach sends it
back to the release it served and halts; without a monitor host a bake is refused.

Moves run against a recording stand-in connection; Prometheus's answers are given by the test
(the queries themselves are checked by promtool in tests/unit/test_monitoring.py and
tests/unit/test_canary.py)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
from pyinfra.api.exceptions import OperationError

from gpuserve import rollout
from gpuserve.layers import rotation
from gpuserve.rollout import canary_bake
from gpuserve.layers import rollout as layer
from gpuserve.rollout import Move, StackMove

from tests.unit.helpers import key_file, make_inventory, settings_of
from tests.unit.layers.test_rollout_moves import RecordingHost


def _settings(tmp_path, hosts=("h1", "h2", "h3"), group="hopper_x8", **data):
    keys = key_file(tmp_path)
    inv = make_inventory(host_data={"proxy": True, "api_keys_file": str(keys), "drain_s": 0, **data},
                         hosts=hosts)
    return {h: settings_of(inv, h) for h in hosts}


def _moves(hosts):
    return [Move(h, "minimax", "r1", "r2", "r1") for h in hosts]


def test_the_first_batch_is_the_canary_then_max_unavailable_at_a_time():
    plan = rollout.canary_batches(_moves(["a", "b", "c", "d", "e"]), list("abcde"), 2, 1)
    assert [[m.host for m in b] for b in plan] == [["a"], ["b", "c"], ["d", "e"]]
    plan = rollout.canary_batches(_moves(["a", "b", "c"]), list("abc"), 1, 2)
    assert [[m.host for m in b] for b in plan] == [["a", "b"], ["c"]]


def test_a_bake_without_a_monitor_host_is_refused_unless_skipped(tmp_path):
    s = _settings(tmp_path, canary_bake_s=300)
    why = canary_bake.refusal(s, _moves(["h1"]))
    assert "upgrade refused: the canary (h1) must bake for canary_bake_s = 300 s" in why
    assert "--data canary_bake_s=0" in why
    assert canary_bake.refusal(_settings(tmp_path, canary_bake_s=0), _moves(["h1"])) is None
    # a GPU-stack move keeps the release: nothing for the release-joined queries to judge
    stack_only = [StackMove("h1", "NVIDIA x", "packages change", (), ("minimax",))]
    assert canary_bake.refusal(s, stack_only) is None


def test_bake_asks_every_check_and_reports_each_breach_with_its_query(tmp_path, monkeypatch):
    s = _settings(tmp_path, canary_bake_s=5)
    s["h1"] = s["h1"].__class__(**{**s["h1"].__dict__, "groups": ("monitor", *s["h1"].groups)})
    monkeypatch.setattr(canary_bake.time, "sleep", lambda x: None)
    asked = []

    def ask(q):
        asked.append(q)
        return 9.0 if "time_to_first_token" in q else 0.0   # TTFT 9 s, canary and rest alike
    breaches = canary_bake.bake(s, _moves(["h2"]), {"h1": SimpleNamespace(name="h1")}, ask=ask)
    assert len(asked) == 5     # error ratio; TTFT canary + rest; e2e canary + rest
    # TTFT 9 s <= 1.5 x the rest's 9 s; e2e 0 s (the rest has none: held to the SLO); no 5xx
    assert breaches == []

    def slow(q):
        if "time_to_first_token" in q:
            return 4.0 if 'host=~"h2"' in q else 1.0
        return 0.0
    breaches = canary_bake.bake(s, _moves(["h2"]), {"h1": SimpleNamespace(name="h1")}, ask=slow)
    assert len(breaches) == 1
    assert breaches[0].startswith("canary breach: TTFT p95: value 4, threshold 1.5")
    assert "query: histogram_quantile(0.95" in breaches[0]


class Fleet(RecordingHost):
    def __init__(self, name):
        super().__init__({"minimax": "r1"})
        self.name = name


def _state(names):
    hosts = {n: Fleet(n) for n in names}
    return SimpleNamespace(failed_hosts=[], inventory=list(hosts.values())), hosts


@pytest.mark.parametrize("breach", [True, False])
def test_a_breach_sends_the_canary_back_and_halts_and_a_pass_moves_the_rest(tmp_path, monkeypatch, breach):
    s = _settings(tmp_path)
    monkeypatch.setattr(layer, "_gate", lambda h, st, dep: (True, "ok"))
    monkeypatch.setattr(rotation, "DRAIN_POLL_S", 0)
    monkeypatch.setattr(canary_bake, "bake", lambda st, batch, hosts: (
        ["canary breach: TTFT p95: value 4, threshold 1.5: ...\n  query: histogram_quantile(...)"]
        if breach else []))
    state, hosts = _state(["h1", "h2", "h3"])
    plan = rollout.canary_batches(_moves(["h1", "h2", "h3"]), ["h1", "h2", "h3"], 1, 1)
    if breach:
        with pytest.raises(OperationError, match="(?s)upgrade halted after the canary bake: h1 went back "
                                                 "to the release it served; not reached, still on their "
                                                 "release: h2, h3\ncanary breach: TTFT p95"):
            layer._roll_batches(state, "upgrade", plan, s)
        switches = [c for c in hosts["h1"].ran if "current.new" in c]
        assert "releases/r2" in switches[0] and "releases/r1" in switches[1]   # there and back
        assert hosts["h2"].ran == [] and hosts["h3"].ran == []
    else:
        layer._roll_batches(state, "upgrade", plan, s)
        assert all(any("releases/r2" in c for c in hosts[n].ran) for n in ("h1", "h2", "h3"))
