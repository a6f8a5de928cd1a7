"""gpuserve status asks hosts in parallel, each bounded, and takes --limit like pyinfra.

SSH is replaced by stand-in hosts here (the real command runs against sandbox hosts in
tests/integration/test_serve_e2e.py); what is tested is how the hosts are asked."""

from __future__ import annotations

import gevent
import pytest

from gpuserve import status
from gpuserve.status import Row

from .helpers import make_inventory


@pytest.fixture
def fleet(monkeypatch):
    inv = make_inventory(group="cpu", hosts=tuple(f"h{i}" for i in range(1, 9)))

    def connect_all(state):
        for host in state.inventory:
            if state.is_host_in_limit(host) and host.name != "h3":   # h3 is unreachable
                state.activate_host(host)

    monkeypatch.setattr(status, "connect_all", connect_all)
    monkeypatch.setattr(status, "disconnect_all", lambda state: None)
    return inv


def test_hosts_are_asked_at_the_same_time_and_reported_in_inventory_order(fleet, monkeypatch):
    in_flight, most = [0], [0]

    def rows(host, settings, *_):
        in_flight[0] += 1
        most[0] = max(most[0], in_flight[0])
        gevent.sleep(0.05)                 # a fact round trip: yields to the other hosts
        in_flight[0] -= 1
        return [Row(host.name, "minimax", "r1", "-", "active, /health 200", "tiny", "none")]

    monkeypatch.setattr(status, "_host_rows", rows)
    got = status.collect(fleet)
    assert [r.host for r in got] == [f"h{i}" for i in range(1, 9)]
    assert got[2].health == "unreachable"
    assert most[0] == 7                    # every reachable host at once, not one after another


def test_a_host_that_does_not_answer_in_time_is_its_own_row(fleet, monkeypatch):
    def rows(host, settings, *_):
        if host.name == "h2":
            gevent.sleep(30)               # hangs: never answers within the bound
        if host.name == "h4":
            raise OSError("channel closed")
        return [Row(host.name, "minimax", "r1", "-", "active, /health 200", "tiny", "none")]

    monkeypatch.setattr(status, "_host_rows", rows)
    got = {r.host: r.health for r in status.collect(fleet, timeout=0.2)}
    assert got["h2"] == "no answer in 0.2 s"
    assert got["h4"] == "error: OSError: channel closed"
    assert got["h1"] == "active, /health 200"


def test_limit_asks_only_the_hosts_it_names(fleet, monkeypatch):
    asked = []
    monkeypatch.setattr(status, "_host_rows", lambda host, s, *_: asked.append(host.name) or [])
    status.collect(fleet, limit=["h5", "h1"])
    assert sorted(asked) == ["h1", "h5"]
