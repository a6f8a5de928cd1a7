"""The fan-out plan (gpuserve.fanout) and the agent's forced command (gpuserve.fanout_agent.serve)."""

from __future__ import annotations

import os

import pytest

from gpuserve import fanout
from gpuserve import fanout_agent as agent
from gpuserve import weights as w

SHARDS = {f"model-{i:05d}-of-00016.safetensors": 64 << 20 for i in range(1, 17)}


def hosts(n: int) -> list[str]:
    return [f"h{i}" for i in range(n)]


@pytest.mark.parametrize("n", [1, 2, 3, 4, 5, 7, 8, 13, 40])
@pytest.mark.parametrize("d", [1, 2, 3, 4])
def test_every_stripe_reaches_every_host_once_through_a_tree(n, d):
    p = fanout.plan(hosts(n), SHARDS, d)
    assert sorted(x for s in p.stripes for x in s) == sorted(SHARDS)  # each file in one stripe
    for j in range(p.degree):
        roots = [h for h in p.hosts if p.parents[j][h] is None]
        assert len(roots) == 1
        for h in p.hosts:  # a tree: every host reaches the root, no cycles
            assert p.ancestors(j, h)[-1:] in ([], [roots[0]])
            assert h not in p.ancestors(j, h)


@pytest.mark.parametrize("n,d", [(4, 2), (8, 2), (9, 3), (40, 4), (1000, 4)])
def test_trees_are_interior_disjoint_so_every_host_uploads_about_one_copy(n, d):
    p = fanout.plan(hosts(n), SHARDS, d)
    interior_in = {h: [j for j in range(d) if p.children(j, h)] for h in p.hosts}
    assert all(len(js) <= 1 for js in interior_in.values()), interior_in
    # d children x 1/d of the bytes: at most one checkpoint's worth up, per host
    assert max(p.uploads().values()) <= d


def test_stripes_balance_bytes_and_keep_shard_order():
    files = {"a": 10, "b": 10, "c": 10, "d": 10, "config.json": 1}
    p = fanout.plan(hosts(4), files, 2)
    sizes = [sum(files[x] for x in s) for s in p.stripes]
    assert max(sizes) - min(sizes) <= 1
    assert all(list(s) == sorted(s) for s in p.stripes)


def test_sources_are_parent_then_ancestors_then_everyone_else():
    p = fanout.plan(hosts(8), SHARDS, 2)
    for h in p.hosts:
        for j, chain in enumerate(p.sources(h)):
            anc = p.ancestors(j, h)
            assert chain[:len(anc)] == anc
            assert sorted(chain) == sorted(x for x in p.hosts if x != h)


def test_push_targets_start_at_the_root_and_cover_everyone():
    p = fanout.plan(hosts(8), SHARDS, 2)
    for j in range(2):
        t = fanout.push_targets(p, j)
        assert t[0] == p.root(j) and sorted(t) == sorted(p.hosts)


def test_predicted_stage_time_is_near_one_copy_and_far_below_the_star():
    # 8 hosts, 16 shards, d=2: depth 4 hops from the control node -> (8 + 3) / 8
    p = fanout.plan(hosts(8), SHARDS, 2)
    assert fanout.predicted_stage_copies(p) <= 1.5
    assert fanout.predicted_stage_copies(fanout.plan(hosts(1), SHARDS, 2)) == 1.0


@pytest.mark.parametrize("bad,why", [([], "at least one host"), (["a", "a"], "listed twice")])
def test_bad_fleets_are_refused(bad, why):
    with pytest.raises(fanout.FanoutError, match=why):
        fanout.plan(bad, SHARDS, 2)


# --- the forced command -------------------------------------------------------------------------

SHA = "a" * 40


@pytest.fixture
def models(tmp_path):
    repo = tmp_path / "org--name"
    (repo / f"{SHA}.partial" / ".incoming").mkdir(parents=True)
    (repo / f"{SHA}.partial" / "verified.bin").write_bytes(b"x")
    (repo / f"{SHA}.partial" / ".incoming" / "inflight.bin").write_bytes(b"y")
    return tmp_path


def test_have_answers_only_for_verified_files(models):
    assert agent.have(str(models), "org--name", SHA, "verified.bin") == "partial"
    assert agent.have(str(models), "org--name", SHA, "inflight.bin") == "none"
    os.rename(models / "org--name" / f"{SHA}.partial", models / "org--name" / SHA)
    assert agent.have(str(models), "org--name", SHA, "verified.bin") == "final"


@pytest.mark.parametrize("command", [
    "cat /etc/shadow", "rsync --server . /tmp/x", "rsync --server -r . /srv/nvme",  # a receiver: writes
    f"gpuserve-have ../../etc {SHA} passwd 0", f"gpuserve-have org--name {SHA} ../x 0",
    f"gpuserve-have org--name notasha x 0", "gpuserve-have org--name", "",
])
def test_the_fleet_key_can_do_nothing_else(models, command, capsys):
    assert agent.serve(str(models), command) == 1
    assert "refused" in capsys.readouterr().err


def test_the_fleet_key_reads_through_rrsync_read_only(models, monkeypatch):
    seen = {}
    monkeypatch.setattr(os, "execvp", lambda f, a: seen.update(f=f, a=a))
    agent.serve(str(models), "rsync --server --sender -logDtpre.iLsfxCIvu . org--name/x")
    assert seen == {"f": "rrsync", "a": ["rrsync", "-ro", str(models)]}


def test_have_long_poll_answers_when_the_file_is_verified(models, capsys):
    assert agent.serve(str(models), f"gpuserve-have org--name {SHA} verified.bin 5") == 0
    assert capsys.readouterr().out.strip() == "partial"


def test_accept_file_publishes_a_verified_file_and_drops_a_bad_one(tmp_path):
    import hashlib
    repo = str(tmp_path / "repo")
    good, bad = b"good" * 1000, b"evil" * 1000
    m = w.Manifest("org/name", SHA, {
        "a.bin": w.FileSpec(len(good), hashlib.sha256(good).hexdigest()),
        "b.bin": w.FileSpec(len(bad), hashlib.sha256(good).hexdigest())})
    w.prepare(repo, m)
    inc = os.path.join(w.partial_dir(repo, SHA), w.INCOMING)
    open(os.path.join(inc, "a.bin"), "wb").write(good)
    open(os.path.join(inc, "b.bin"), "wb").write(bad)
    assert w.accept_file(repo, m, os.path.join(inc, "a.bin"), "a.bin") == {"ok": True, "reason": "verified"}
    assert agent.have(str(tmp_path), "repo", SHA, "a.bin") == "partial"
    r = w.accept_file(repo, m, os.path.join(inc, "b.bin"), "b.bin")
    assert not r["ok"] and "sha256" in r["reason"] and not os.path.exists(os.path.join(inc, "b.bin"))
    assert agent.have(str(tmp_path), "repo", SHA, "b.bin") == "none"
    # the same file a second time (two sources): dropped, still ok
    open(os.path.join(inc, "a.bin"), "wb").write(good)
    assert w.accept_file(repo, m, os.path.join(inc, "a.bin"), "a.bin")["reason"] == "dup"


# -- progress lines (the run's and `gpuserve status`'s) ---------------------------------------------


def test_progress_line_says_bytes_rate_and_eta_from_the_agents_window():
    doc = {"total_bytes": 4 << 30, "done_bytes": 1 << 30, "linked_bytes": 0, "started": 0.0,
           "rate_bps": 64 << 20, "state": "running"}
    # 3 GiB left at 64 MiB/s: 48 s, whatever the average since the start (1 GiB in 1000 s)
    assert fanout.progress_line(doc, 1000.0) == "1.0 GiB / 4.0 GiB (25%), 64.0 MiB/s, ETA 48 s"
    assert fanout.progress_line({**doc, "rate_bps": 0}, 1000.0).endswith("0 B/s, ETA ?")
    assert fanout.progress_line({**doc, "done_bytes": 4 << 30}, 1000.0).endswith("done")
    # a file of an older agent (no rate_bps): bytes moved (not hardlinked) since it started
    old = {k: v for k, v in doc.items() if k != "rate_bps"} | {"linked_bytes": 512 << 20}
    assert fanout.progress_line(old, 8.0) == "1.0 GiB / 4.0 GiB (25%), 64.0 MiB/s, ETA 48 s"


def test_fleet_line_sums_the_hosts_and_counts_the_finished_ones():
    run = {"total_bytes": 1 << 30, "done_bytes": 256 << 20, "started": 0.0, "rate_bps": 8 << 20,
           "state": "running"}
    done = {"total_bytes": 1 << 30, "done_bytes": 1 << 30, "started": 0.0, "rate_bps": 5 << 20,
            "state": "complete"}
    line = fanout.fleet_line({"a": run, "b": run, "c": done}, 4, 100.0)
    # 3 GiB total, 1.5 GiB done; the finished host's last rate is not part of the fleet's now
    assert line == "fleet: 1/4 host(s) done, 1.5 GiB / 3.0 GiB (50%), 16.0 MiB/s, ETA 96 s"


def test_the_agents_rate_is_over_its_last_window_not_since_the_start():
    a = agent.Agent.__new__(agent.Agent)
    a.started, a.samples = 0.0, []
    assert a.rate(10.0, 100 << 20) == pytest.approx(10 << 20)    # 100 MiB in the first 10 s
    for t in range(11, 200):                                      # then a stall ...
        a.rate(float(t), 100 << 20)
    assert a.rate(200.0, 100 << 20) == 0.0                        # ... shows as 0 B/s, not 0.5
    assert a.rate(230.0, 400 << 20) == pytest.approx(10 << 20, rel=0.05)  # and the pick-up at once


# -- issue 29: the fleet key is a systemd credential the fetch unit loads ------------------------

def test_ssh_reads_the_fleet_key_from_the_units_credentials_directory():
    assert agent.key_path("fleet-key", {"CREDENTIALS_DIRECTORY": "/run/credentials/u.service"}) == \
        "/run/credentials/u.service/fleet-key"
    assert agent.key_path("/etc/k", {}) == "/etc/k"   # a job of an older gpuserve: as it is
    with pytest.raises(RuntimeError, match=r"no \$CREDENTIALS_DIRECTORY: run it as the unit gpuserve-weights-fetch"):
        agent.key_path("fleet-key", {})


def test_the_fetch_unit_loads_the_credential_the_job_names():
    from gpuserve import layout
    from gpuserve.layers import fanout as fanout_layer

    unit = fanout_layer.fanout_unit("m@abc", "/srv/nvme/gpuserve/models/m")
    assert f"LoadCredentialEncrypted={layout.FANOUT_KEY_CREDENTIAL}:{layout.FANOUT_KEY_CRED}\n" in unit
    assert layout.FANOUT_KEY_CRED == layout.FANOUT_KEY + ".cred"
    import inspect
    assert '"key": layout.FANOUT_KEY_CREDENTIAL' in inspect.getsource(fanout_layer.job_for)


def test_a_hosts_authorized_line_names_every_peer_of_the_inventory_whatever_the_limit(tmp_path):
    """A run with --limit (the live hosts, after one went down) makes the fan-out over the run's
    hosts only, but the addresses a host lets fetch from it are the inventory's: the same
    authorized_keys whatever the run's limit, so such a rerun changes nothing
    (tests/integration/test_fanout.py, test_a_rerun_over_the_live_hosts_changes_nothing)."""
    from gpuserve.layers import fanout as fanout_layer
    from gpuserve.operations.fanout import Fleet

    (tmp_path / "k.pub").write_text("ssh-ed25519 AAAAC3Nza gpuserve weights fan-out\n")
    run = Fleet(("a", "b"), {"a": "10.0.0.2", "b": "10.0.0.3"}, None, None, str(tmp_path / "k"), "/c",
                peers=("10.0.0.2", "10.0.0.3", "10.0.0.4"))
    line = fanout_layer.authorized_line(run, "/srv/m")
    assert 'from="10.0.0.2,10.0.0.3,10.0.0.4"' in line and line.startswith("restrict,")
