"""The weights layer's keys: defaults, validation errors naming host, source and key."""

from __future__ import annotations

import pytest

from gpuserve.layers.weights import Target
from tests.unit.helpers import SHA, make_inventory, one_problem, settings_of


def test_defaults():
    s = settings_of(make_inventory())
    assert (s.weights_fanout, s.weights_cache, s.weights_verify, s.weights_bwlimit_kib) == (
        "control-node", "~/.cache/gpuserve/checkpoints", "changed", None)
    t = Target.of(s)
    assert t.repo_dir == "/mnt/nvme/gpuserve/models/MiniMaxAI--MiniMax-M3.1-Flash"
    assert t.final == s.checkpoint_dir == f"{t.repo_dir}/{SHA}"
    assert t.margin == 50 << 30 and t.label == f"MiniMaxAI/MiniMax-M3.1-Flash@{SHA[:12]}"


def test_values_are_taken():
    s = settings_of(make_inventory(host_data={
        "weights_fanout": "hub", "weights_cache": "/srv/cache", "weights_verify": "full",
        "weights_bwlimit_kib": 10240, "hf_endpoint": "https://hf-mirror.internal"}))
    t = Target.of(s)
    assert (t.fanout, t.cache, t.verify, t.bwlimit_kib) == ("hub", "/srv/cache", "full", 10240)
    assert t.source.resolve_url(SHA) == f"https://hf-mirror.internal/MiniMaxAI/MiniMax-M3.1-Flash/resolve/{SHA}"


@pytest.mark.parametrize("data, key, text", [
    ({"weights_fanout": "peers"}, "weights_fanout", "use one of control-node, hub"),
    ({"weights_verify": "never"}, "weights_verify", "use one of changed, full"),
    ({"weights_cache": ""}, "weights_cache", "not a directory path on the control node"),
    ({"weights_bwlimit_kib": 0}, "weights_bwlimit_kib", "use an integer >= 1"),
    ({"weights_bwlimit_kib": "fast"}, "weights_bwlimit_kib", "use an integer >= 1"),
    ({"weights_fanout": "hub", "model_source": "local", "model_local_path": "/x"}, "weights_fanout",
     "model_source 'local' (host data) needs 'control-node'"),
])
def test_bad_values_name_the_key(data, key, text):
    msg = one_problem(make_inventory(host_data=data))
    assert msg.startswith(f"h1: {key} (from host data): ")
    assert text in msg


def test_a_branch_is_still_refused_and_the_error_says_how_to_pin():
    msg = one_problem(make_inventory(fleet={"model_revision": "main"}))
    assert msg.startswith("h1: model_revision (from group 'fleet'): 'main' is not a commit sha")
    assert "gpuserve resolve <repo> <branch>" in msg
