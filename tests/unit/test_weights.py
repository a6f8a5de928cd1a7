"""gpuserve.weights: manifests, the hardlink/fetch plan, space, staging, verification and repair,
on plain directories (the "transfer" is a file copy), plus the exact command hosts run."""

from __future__ import annotations

import hashlib
import json
import os
import shlex
import shutil
import subprocess
import time

import pytest

from gpuserve import weights as w
from gpuserve.facts.checkpoints import host_command, parse_output

SHA_A = "a" * 40
SHA_B = "b" * 40


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def git_sha1(data: bytes) -> str:
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


def make_source(tmp_path, name: str, files: dict[str, bytes]):
    src = tmp_path / name
    for rel, data in files.items():
        (src / rel).parent.mkdir(parents=True, exist_ok=True)
        (src / rel).write_bytes(data)
    return src


def manifest_for(sha: str, files: dict[str, bytes], lfs=lambda p: p.endswith(".safetensors")):
    return w.Manifest.from_hub_files("acme/tiny", sha, [
        (p, len(d), sha256(d) if lfs(p) else None, git_sha1(d)) for p, d in files.items()])


V0 = {"config.json": b'{"a": 1}\n', "model-1.safetensors": b"\x01" * 5000,
      "model-2.safetensors": b"\x02" * 7000, "sub/tokenizer.json": b"{}\n"}
V1 = {**V0, "model-2.safetensors": b"\x03" * 7000}


def sync(repo_dir, src, manifest, **kw):
    """prepare -> copy what it asks for -> commit (what the layer does with rsync)."""
    prep = w.prepare(str(repo_dir), manifest, **kw)
    for rel in prep["transfer"]:
        dst = os.path.join(prep["incoming"], rel)
        os.makedirs(os.path.dirname(dst), exist_ok=True)
        shutil.copyfile(src / rel, dst)
    return prep, w.commit(str(repo_dir), manifest)


# ------------------------------------------------------------------------------------------------
# pure parts
# ------------------------------------------------------------------------------------------------


def test_manifest_round_trip_and_totals():
    m = manifest_for(SHA_A, V0)
    assert m.total_size == sum(len(d) for d in V0.values())
    assert m.files["model-1.safetensors"].sha256 == sha256(V0["model-1.safetensors"])
    assert m.files["config.json"].sha256 is None and m.files["config.json"].git_sha1
    assert not m.fully_hashed
    again = w.Manifest.from_json(json.loads(json.dumps(m.to_json())))
    assert again.files == m.files and again.same_files(m)
    assert not m.same_files(manifest_for(SHA_A, V1))


@pytest.mark.parametrize("bad", ["/etc/passwd", "../x", "a/../../x", ".gpuserve-manifest.json",
                                 ".cache/x", "a//b", "", "a\\b"])
def test_paths_that_could_escape_are_refused(bad):
    with pytest.raises(w.WeightsError):
        w.check_relpath(bad)


def test_revision_must_be_a_sha():
    with pytest.raises(w.WeightsError, match="not a 40-hex"):
        manifest_for("main", V0)


def test_plan_links_known_content_and_counts_only_new_bytes():
    m = w.Manifest("acme/tiny", SHA_B, {
        "a": w.FileSpec(100, "1" * 64), "b": w.FileSpec(200, "2" * 64),
        "c": w.FileSpec(300, "3" * 64), "d": w.FileSpec(50, None, "f" * 40)})
    plan = w.plan_fetch(m, have={"a"}, links={"2" * 64: "/x/old/b", "f" * 40: "/nope"},
                        incoming={"c": 120})
    assert plan.link == {"b": "/x/old/b"}
    assert plan.transfer == ["c", "d"]
    assert plan.need_bytes == (300 - 120) + 50
    # a file the hub knows only by its git blob id links by that id
    plan = w.plan_fetch(m, have={"a"}, links={"git:" + "f" * 40: "/x/old/d"}, incoming={})
    assert plan.link == {"d": "/x/old/d"} and "d" not in plan.transfer


def test_plan_ignores_an_incoming_file_longer_than_expected():
    m = w.Manifest("acme/tiny", SHA_B, {"c": w.FileSpec(300, "3" * 64)})
    assert w.plan_fetch(m, (), {}, {"c": 999}).need_bytes == 300


def test_space_refusal_names_host_path_need_and_free():
    w.check_space("h1", "/srv/nvme", 0, 0, 10)  # nothing to fetch: nothing to refuse
    with pytest.raises(w.SpaceError) as caught:
        w.check_space("h1", "/srv/nvme", 5 << 30, 3 << 30, 50 << 30)
    msg = str(caught.value)
    assert msg.startswith("h1: refusing to download: /srv/nvme has 3.0 GiB free")
    assert "needs 5.0 GiB" in msg and "margin of 50.0 GiB" in msg and str(5 << 30) in msg


# ------------------------------------------------------------------------------------------------
# staging on disk
# ------------------------------------------------------------------------------------------------


def test_new_revision_is_staged_verified_and_renamed(tmp_path):
    src = make_source(tmp_path, "src0", V0)
    repo = tmp_path / "models" / "acme--tiny"
    prep, done = sync(repo, src, manifest_for(SHA_A, V0))
    assert sorted(prep["transfer"]) == sorted(V0) and prep["need_bytes"] == sum(map(len, V0.values()))
    assert done["complete"] and not (repo / f"{SHA_A}.partial").exists()
    final = repo / SHA_A
    for rel, data in V0.items():
        assert (final / rel).read_bytes() == data
        assert oct((final / rel).stat().st_mode & 0o777) == "0o644"
    recorded = w.read_manifest(str(final))
    assert recorded.fully_hashed and set(recorded.verified) == set(V0)  # sha256 filled in for JSONs
    state = w.scan(str(repo), SHA_A)
    assert state["status"] == "complete" and state["broken"] == [] and state["refresh"] == []
    # nothing left to do
    again = w.prepare(str(repo), recorded)
    assert again["transfer"] == [] and again["mode"] == "repair"


def test_bump_transfers_only_the_changed_file_and_hardlinks_the_rest(tmp_path):
    repo = tmp_path / "acme--tiny"
    sync(repo, make_source(tmp_path, "src0", V0), manifest_for(SHA_A, V0))
    v0 = w.read_manifest(str(repo / SHA_A))
    m1 = manifest_for(SHA_B, V1, lfs=lambda p: True)  # every file hashed: all can be linked
    prep, done = sync(repo, make_source(tmp_path, "src1", V1), m1)
    assert prep["transfer"] == ["model-2.safetensors"] and prep["link"] == 3
    assert prep["need_bytes"] == 7000
    assert done["complete"]
    for rel in V0:
        same = os.stat(repo / SHA_A / rel).st_ino == os.stat(repo / SHA_B / rel).st_ino
        assert same == (rel != "model-2.safetensors"), rel
    assert w.read_manifest(str(repo / SHA_A)).verified == v0.verified  # previous revision untouched
    assert w.complete_revisions(str(repo)) == [SHA_A, SHA_B]


def test_interrupted_transfer_resumes_and_stale_partials_go(tmp_path):
    repo = tmp_path / "acme--tiny"
    src = make_source(tmp_path, "src0", V0)
    m = manifest_for(SHA_A, V0)
    # an unwanted revision's leftovers
    (repo / f"{SHA_B}.partial" / ".incoming").mkdir(parents=True)
    prep = w.prepare(str(repo), m)
    assert prep["removed_partials"] == [SHA_B]
    # half of one shard arrived, another arrived whole, then the run died
    inc = prep["incoming"]
    shutil.copyfile(src / "config.json", os.path.join(inc, "config.json"))
    with open(os.path.join(inc, "model-2.safetensors"), "wb") as fh:
        fh.write(V0["model-2.safetensors"][:3000])
    state = w.scan(str(repo), SHA_A)
    assert state["status"] == "partial" and state["incoming"]["model-2.safetensors"] == 3000
    again = w.prepare(str(repo), m)
    assert again["need_bytes"] == sum(map(len, V0.values())) - 3000 - len(V0["config.json"])
    # append the rest, as rsync --append-verify does, then commit
    with open(os.path.join(inc, "model-2.safetensors"), "ab") as fh:
        fh.write(V0["model-2.safetensors"][3000:])
    for rel in ("model-1.safetensors", "sub/tokenizer.json"):
        os.makedirs(os.path.dirname(os.path.join(inc, rel)), exist_ok=True)
        shutil.copyfile(src / rel, os.path.join(inc, rel))
    done = w.commit(str(repo), m)
    assert done["complete"] and sorted(os.listdir(repo)) == [".gpuserve-weights.lock", SHA_A]


def test_a_bad_file_is_reported_removed_and_fetched_again(tmp_path):
    repo = tmp_path / "acme--tiny"
    src = make_source(tmp_path, "src0", V0)
    m = manifest_for(SHA_A, V0)
    prep = w.prepare(str(repo), m)
    for rel in V0:
        os.makedirs(os.path.dirname(os.path.join(prep["incoming"], rel)), exist_ok=True)
        shutil.copyfile(src / rel, os.path.join(prep["incoming"], rel))
    bad = os.path.join(prep["incoming"], "model-1.safetensors")
    with open(bad, "r+b") as fh:  # same size, one byte flipped (what the hub client lets through)
        fh.seek(100)
        fh.write(b"\xff")
    done = w.commit(str(repo), m)
    assert not done["complete"] and [b["path"] for b in done["bad"]] == ["model-1.safetensors"]
    assert "sha256" in done["bad"][0]["reason"] and not os.path.exists(bad)
    assert not (repo / SHA_A).exists()  # never a final dir with a bad file
    prep, done = sync(repo, src, m)
    assert prep["transfer"] == ["model-1.safetensors"] and done["complete"]


def test_a_flipped_byte_is_caught_and_only_that_file_is_repaired_in_both_revisions(tmp_path):
    repo = tmp_path / "acme--tiny"
    sync(repo, make_source(tmp_path, "src0", V0), manifest_for(SHA_A, V0, lfs=lambda p: True))
    src1 = make_source(tmp_path, "src1", V1)
    sync(repo, src1, manifest_for(SHA_B, V1, lfs=lambda p: True))
    shared = repo / SHA_B / "model-1.safetensors"
    assert shared.stat().st_nlink == 2
    with open(shared, "r+b") as fh:
        fh.seek(10)
        fh.write(b"\x00")
    state = w.scan(str(repo), SHA_B)
    assert state["broken"] == ["model-1.safetensors"]
    others = {rel: os.stat(repo / SHA_B / rel).st_ino for rel in V1 if rel != "model-1.safetensors"}
    recorded = w.read_manifest(str(repo / SHA_B))
    prep, done = sync(repo, src1, recorded)
    assert prep["mode"] == "repair" and prep["transfer"] == ["model-1.safetensors"]
    assert done["complete"] and done["verified"] == ["model-1.safetensors"]
    assert done["relinked"] == [f"{SHA_A}/model-1.safetensors"]  # the rollback copy is good again
    assert (repo / SHA_B / "model-1.safetensors").read_bytes() == V0["model-1.safetensors"]
    assert os.stat(repo / SHA_A / "model-1.safetensors").st_ino == shared.stat().st_ino
    assert {rel: os.stat(repo / SHA_B / rel).st_ino for rel in others} == others
    assert w.scan(str(repo), SHA_A)["broken"] == [] and w.scan(str(repo), SHA_B)["broken"] == []
    assert not (repo / f"{SHA_B}.partial").exists()


def test_changed_mode_misses_what_full_mode_catches(tmp_path):
    repo = tmp_path / "acme--tiny"
    sync(repo, make_source(tmp_path, "src0", V0), manifest_for(SHA_A, V0))
    f = repo / SHA_A / "model-2.safetensors"
    st = f.stat()
    with open(f, "r+b") as fh:
        fh.write(b"\x09")
    os.utime(f, ns=(st.st_atime_ns, st.st_mtime_ns))  # corruption that keeps size and mtime
    assert w.scan(str(repo), SHA_A, "changed")["broken"] == []
    assert w.scan(str(repo), SHA_A, "full")["broken"] == ["model-2.safetensors"]


def test_touched_but_intact_files_are_re_recorded_not_refetched(tmp_path):
    repo = tmp_path / "acme--tiny"
    src = make_source(tmp_path, "src0", V0)
    m = manifest_for(SHA_A, V0)
    sync(repo, src, m)
    os.utime(repo / SHA_A / "config.json", ns=(1, 1))
    state = w.scan(str(repo), SHA_A)
    assert state["broken"] == [] and state["refresh"] == ["config.json"]
    prep = w.prepare(str(repo), w.read_manifest(str(repo / SHA_A)))
    assert prep["transfer"] == [] and prep["refreshed"] == ["config.json"]
    assert w.scan(str(repo), SHA_A)["refresh"] == []


def test_space_is_checked_before_anything_is_staged(tmp_path):
    repo = tmp_path / "acme--tiny"
    with pytest.raises(w.SpaceError, match="refusing to download"):
        w.prepare(str(repo), manifest_for(SHA_A, V0), margin=1 << 60, where="h1")
    assert not (repo / f"{SHA_A}.partial").exists() and not (repo / SHA_A).exists()


def test_a_second_sync_at_the_same_time_is_refused(tmp_path):
    repo = tmp_path / "acme--tiny"
    with w._Lock(str(repo)):
        with pytest.raises(w.WeightsError, match="another gpuserve weights sync"):
            w.prepare(str(repo), manifest_for(SHA_A, V0))


def test_http_fetch_resumes_with_a_range_request(tmp_path):
    from gpuserve_sandbox.hub import publish_checkpoint, serve_in_thread

    src = make_source(tmp_path, "src", {"model.safetensors": os.urandom(300_000)})
    sha = publish_checkpoint(tmp_path / "hub", "acme/tiny", src)
    data = (src / "model.safetensors").read_bytes()
    inc = tmp_path / "inc"
    inc.mkdir()
    (inc / "model.safetensors").write_bytes(data[:100_000])
    server = serve_in_thread(tmp_path / "hub")
    try:
        out = w.http_fetch(f"{server.url}/acme/tiny/resolve/{sha}", str(inc), ["model.safetensors"],
                           {"model.safetensors": len(data)})
        assert out["received"] == 200_000
        for _ in range(100):  # the server counts a chunk after the client may have read it
            if server.bytes_served == 200_000:
                break
            time.sleep(0.02)
        assert server.bytes_served == 200_000
        assert (inc / "model.safetensors").read_bytes() == data
        server.inject_fault("status", status=500, count=None, match="*/resolve/*")
        with pytest.raises(w.WeightsError, match=r"other\.bin: HTTP 500"):
            w.http_fetch(f"{server.url}/acme/tiny/resolve/{sha}", str(inc), ["other.bin"],
                         {"other.bin": 10})
    finally:
        server.stop()


# ------------------------------------------------------------------------------------------------
# what hosts run: this module's source, shipped inside the command
# ------------------------------------------------------------------------------------------------


def run_host(*args, stdin: dict | None = None):
    proc = subprocess.run(["sh", "-c", host_command(*args)], capture_output=True, text=True,
                          input=json.dumps(stdin) if stdin is not None else "", timeout=60)
    return proc.returncode, parse_output(proc.stdout.splitlines())


def test_the_shipped_command_runs_the_same_code(tmp_path):
    repo = tmp_path / "acme--tiny"
    src = make_source(tmp_path, "src0", V0)
    m = manifest_for(SHA_A, V0)
    rc, state = run_host("scan", str(repo), SHA_A, "changed")
    assert rc == 0 and state["status"] == "absent" and state["free_bytes"] > 0
    req = {"repo_dir": str(repo), "manifest": m.to_json(records=False), "where": "h1"}
    rc, prep = run_host("prepare", stdin=req)
    assert rc == 0 and sorted(prep["transfer"]) == sorted(V0)
    for rel in prep["transfer"]:
        os.makedirs(os.path.dirname(os.path.join(prep["incoming"], rel)), exist_ok=True)
        shutil.copyfile(src / rel, os.path.join(prep["incoming"], rel))
    rc, done = run_host("commit", stdin=req)
    assert rc == 0 and done["complete"]
    rc, refused = run_host("prepare", stdin={**req, "manifest": manifest_for(SHA_B, V1).to_json(),
                                             "margin": 1 << 60})
    assert rc == w.EXIT_SPACE and refused["space"] and refused["error"].startswith("h1: refusing")
    rc, err = run_host("commit", stdin={**req, "manifest": manifest_for(SHA_B, V1).to_json()})
    assert rc == w.EXIT_ERROR and "nothing staged" in err["error"]


def test_the_shipped_command_needs_no_gpuserve_package(tmp_path):
    # a host has no gpuserve to import: weights.py takes weights_manifest from the command itself
    # (run from the repository root, python3 -c would import the package from the working directory)
    probe = ("import atexit,sys;atexit.register(lambda:print(sys.modules['__main__'].Manifest.__module__,"
             "'gpuserve' in sys.modules));")
    boot = shlex.split(host_command("scan", str(tmp_path / "acme--tiny"), SHA_A))
    proc = subprocess.run([boot[0], "-c", probe + boot[2], *boot[3:]], capture_output=True, text=True,
                          cwd=tmp_path, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert parse_output(proc.stdout.splitlines()[:-1])["status"] == "absent"
    assert proc.stdout.splitlines()[-1] == "weights_manifest False"


def test_the_fanout_agent_imports_weights_from_beside_itself(tmp_path):
    # what the fan-out layer installs in layout.AGENT_DIR: HOST_MODULES and the agent, nothing else
    from gpuserve import fanout_agent
    from gpuserve.facts.checkpoints import HOST_MODULES

    for module in (*HOST_MODULES, fanout_agent):
        shutil.copy(module.__file__, tmp_path)
    code = ("import sys;sys.path.insert(0,sys.argv[1]);import fanout_agent as a;"
            "print(a.w.__name__,a.w.Manifest.__module__,'gpuserve' in sys.modules,a.have(sys.argv[1],'r',sys.argv[2],'f'))")
    proc = subprocess.run(["python3", "-c", code, str(tmp_path), SHA_A], capture_output=True, text=True,
                          cwd="/", timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == ["weights", "weights_manifest", "False", "none"]


def test_a_full_audit_finding_a_shared_inode_broken_fetches_instead_of_linking_it(tmp_path):
    """Corruption that kept size and mtime, in a file two revisions share: the other revision's
    record still looks fresh, but its (same) inode must not be the repair's source."""
    repo = tmp_path / "acme--tiny"
    sync(repo, make_source(tmp_path, "src0", V0), manifest_for(SHA_A, V0, lfs=lambda p: True))
    src1 = make_source(tmp_path, "src1", V1)
    sync(repo, src1, manifest_for(SHA_B, V1, lfs=lambda p: True))
    f = repo / SHA_B / "model-1.safetensors"
    st = f.stat()
    with open(f, "r+b") as fh:
        fh.write(b"\x07")
    os.utime(f, ns=(st.st_atime_ns, st.st_mtime_ns))
    broken = w.scan(str(repo), SHA_B, "full")["broken"]
    assert broken == ["model-1.safetensors"]
    recorded = w.read_manifest(str(repo / SHA_B))
    prep = w.prepare(str(repo), recorded, broken=broken)
    assert prep["transfer"] == ["model-1.safetensors"] and prep["link"] == 0
    # a run that dies here leaves the file unverified, so the cheap check finds it next time
    assert w.scan(str(repo), SHA_B)["broken"] == ["model-1.safetensors"]
    shutil.copyfile(src1 / "model-1.safetensors", os.path.join(prep["incoming"], "model-1.safetensors"))
    done = w.commit(str(repo), recorded)
    assert done["complete"] and done["relinked"] == [f"{SHA_A}/model-1.safetensors"]
    assert w.scan(str(repo), SHA_A, "full")["broken"] == [] == w.scan(str(repo), SHA_B, "full")["broken"]
