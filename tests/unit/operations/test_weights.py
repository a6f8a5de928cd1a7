"""The weights layer's keys: defaults, validation errors naming host, source and key."""

from __future__ import annotations

import pytest

from gpuserve.operations.weights import Target
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
    ({"weights_bwlimit_kib": 0}, "weights_bwlimit_kib", "use an integer 1..12500000"),
    ({"weights_bwlimit_kib": "fast"}, "weights_bwlimit_kib", "use an integer 1..12500000"),
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


def test_one_revision_path_from_group_data_to_the_host():
    """Issue 11: the staging fills the very directory the release serves, for a repo, revision and
    NVMe path that are not the defaults (one computation: HostSettings.checkpoint_dir)."""
    import yaml

    from gpuserve import engine
    from gpuserve import weights as w
    from gpuserve.release_files import desired_releases

    sha = "fedcba9876543210fedcba9876543210fedcba98"
    s = settings_of(make_inventory(group="cpu", host_data={"nvme_path": "/srv/fast"},
                                   fleet={"model_repo": "Qwen/Qwen3-0.6B", "model_revision": sha}))
    path = f"/srv/fast/gpuserve/models/Qwen--Qwen3-0.6B/{sha}"
    t = Target.of(s)
    assert (t.sha, t.label) == (sha, f"Qwen/Qwen3-0.6B@{sha[:12]}")
    assert s.checkpoint_dir == t.final == w.final_dir(t.repo_dir, t.sha) == path   # where staging puts it
    release = desired_releases(s, engine.spec_for(s))["minimax"]
    assert release.release.checkpoint["path"] == path                             # what the release serves
    assert yaml.safe_load(release.files["serve.yaml"])["model"] == path       # what the engine loads


def test_the_staging_follows_the_releases_checkpoint_dir(monkeypatch):
    """Target derives from HostSettings.checkpoint_dir, not from a second join: were the layout
    to change, the staging would still fill the directory the release serves."""
    from gpuserve import layout

    s = settings_of(make_inventory())
    monkeypatch.setattr(layout, "checkpoint_dir", lambda nvme, repo, sha: f"{nvme}/elsewhere/{sha}")
    t = Target.of(s)
    assert t.final == s.checkpoint_dir == f"/mnt/nvme/elsewhere/{SHA}"
    assert (t.repo_dir, t.sha) == ("/mnt/nvme/elsewhere", SHA)
