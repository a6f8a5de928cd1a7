"""gpuserve.checkpoints against the local test hub with the REAL huggingface_hub client.

Nothing here reaches a public hub: every call names the local endpoint, and HF_ENDPOINT points at
a dead local port for anything that forgets.
"""

from __future__ import annotations

import os
import runpy
import threading
import time
from pathlib import Path

import pytest

os.environ.setdefault("HF_ENDPOINT", "http://127.0.0.1:9")
os.environ.setdefault("HF_HUB_DISABLE_TELEMETRY", "1")
os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")

pytest.importorskip("safetensors")

from click.testing import CliRunner  # noqa: E402
from huggingface_hub.utils import close_session  # noqa: E402

from gpuserve import checkpoints as cp  # noqa: E402
from gpuserve import weights as w  # noqa: E402
from gpuserve.cli import main as cli  # noqa: E402
from gpuserve_sandbox.hub import (  # noqa: E402
    SANDBOX_REPO, SANDBOX_SEED, publish_tiny_checkpoint, serve_in_thread)

REPO = "acme/tiny-moe"
REPO_ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def published(tmp_path_factory):
    root = tmp_path_factory.mktemp("hub")
    sha1, info1 = publish_tiny_checkpoint(root, REPO, seed=5, variant=1, branch="next")
    sha0, info0 = publish_tiny_checkpoint(root, REPO, seed=5, variant=0)  # main
    return {"root": root, "sha0": sha0, "sha1": sha1, "v0": info0, "v1": info1}


@pytest.fixture
def hub(published):
    server = serve_in_thread(published["root"])
    cp.forget_fleet()
    yield server
    # Close the client's keep-alive connections so no server thread outlives the test: a thread
    # alive when a later test imports pyinfra_cli (gevent monkey-patching) breaks that test's locks.
    close_session()
    server.stop()
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline and any(
            t.name.startswith("Thread-") and t.daemon for t in threading.enumerate()):
        time.sleep(0.05)
    cp.forget_fleet()


def source(hub, repo=REPO):
    return cp.Source("huggingface", repo, hub.url)


def test_resolve_branch_tag_and_sha(hub, published):
    assert cp.resolve(source(hub), "main") == published["sha0"]
    assert cp.resolve(source(hub), "next") == published["sha1"]
    assert cp.resolve(source(hub), published["sha1"]) == published["sha1"]
    with pytest.raises(cp.CheckpointError, match=r"acme/tiny-moe on http://127\.0\.0\.1:\d+ @ nope"):
        cp.resolve(source(hub), "nope")


def test_resolve_command_prints_the_sha_to_pin(hub, published):
    out = CliRunner().invoke(cli, ["resolve", REPO, "main", "--endpoint", hub.url])
    assert out.exit_code == 0 and out.output.strip() == published["sha0"]
    out = CliRunner().invoke(cli, ["resolve", REPO, "next", "--endpoint", hub.url, "--json"])
    assert out.exit_code == 0 and f'"revision": "{published["sha1"]}"' in out.output
    assert '"total_size": %d' % published["v1"]["total_size"] in out.output
    out = CliRunner().invoke(cli, ["resolve", "acme/none", "--endpoint", hub.url])
    assert out.exit_code == 1 and "acme/none" in out.output


def test_hub_manifest_has_sizes_sha256_for_lfs_and_git_ids_for_the_rest(hub, published):
    m = cp.hub_manifest(source(hub), published["sha0"])
    info = published["v0"]
    assert set(m.files) == set(info["files"]) and m.total_size == info["total_size"]
    shard = info["shards"][0]
    assert m.files[shard].sha256 == info["files"][shard]["sha256"]
    assert m.files["config.json"].sha256 is None and len(m.files["config.json"].git_sha1) == 40
    assert hub.bytes_served == 0  # metadata only


def test_stage_downloads_once_verifies_and_a_bump_fetches_only_the_changed_shard(hub, published, tmp_path):
    src, cache = source(hub), str(tmp_path / "cache")
    final, m = cp.stage(src, cp.hub_manifest(src, published["sha0"]), cache)
    assert hub.bytes_served == published["v0"]["total_size"]
    assert m.fully_hashed and final == w.final_dir(cp.cache_repo_dir(cache, REPO), published["sha0"])
    assert sorted(os.listdir(final)) == sorted([*published["v0"]["files"], w.MANIFEST_NAME])
    for name, spec in published["v0"]["files"].items():
        assert m.files[name].sha256 == spec["sha256"]
    hub.reset_stats()
    cp.stage(src, cp.hub_manifest(src, published["sha0"]), cache)
    assert hub.bytes_served == 0
    final1, _ = cp.stage(src, cp.hub_manifest(src, published["sha1"]), cache)
    varied = published["v1"]["varied_shard"]
    assert hub.bytes_by_file == {f"{REPO}/{varied}": published["v1"]["files"][varied]["size"]}
    for name in published["v1"]["files"]:
        same = os.stat(os.path.join(final, name)).st_ino == os.stat(os.path.join(final1, name)).st_ino
        assert same == (name != varied)


def test_fleet_stage_asks_the_hub_once_for_many_hosts(hub, published, tmp_path):
    src, cache = source(hub), str(tmp_path / "cache")
    results = []
    threads = [threading.Thread(target=lambda: results.append(
        cp.fleet_stage(src, published["sha0"], cache))) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len({r[0] for r in results}) == 1
    assert hub.bytes_served == published["v0"]["total_size"]
    assert hub.stats()["requests"].get("GET /resolve", 0) == len(published["v0"]["files"])


def test_a_corrupt_body_is_caught_and_fetched_again(hub, published, tmp_path):
    src, cache = source(hub), str(tmp_path / "cache")
    shard = published["v0"]["shards"][1]
    fault = hub.inject_fault("corrupt", count=1, match=f"*/{shard}", methods=["GET"])
    logs = []
    final, m = cp.stage(src, cp.hub_manifest(src, published["sha0"]), cache, logs.append)
    assert fault.fired == 1 and any(shard in line and "failed verification" in line for line in logs)
    assert m.files[shard].sha256 == published["v0"]["files"][shard]["sha256"]
    assert w.hash_file(os.path.join(final, shard))[0] == published["v0"]["files"][shard]["sha256"]


def test_a_hub_that_keeps_serving_bad_bytes_fails_naming_the_file(hub, published, tmp_path):
    src, cache = source(hub), str(tmp_path / "cache")
    shard = published["v0"]["shards"][2]
    hub.inject_fault("corrupt", count=None, match=f"*/{shard}", methods=["GET"])
    with pytest.raises(cp.CheckpointError, match=f"{shard}: sha256"):
        cp.stage(src, cp.hub_manifest(src, published["sha0"]), cache)
    assert not os.path.exists(w.final_dir(cp.cache_repo_dir(cache, REPO), published["sha0"]))


def test_hub_errors_fail_naming_repo_and_file_and_are_remembered_for_the_fleet(hub, published, tmp_path):
    src, cache = source(hub), str(tmp_path / "cache")
    hub.inject_fault("status", status=500, count=None, match="*/resolve/*", methods=["GET"])
    with pytest.raises(cp.CheckpointError, match=r"downloading acme/tiny-moe on http://127.*file "
                                                 r"[\w.-]+: .*500"):
        cp.fleet_stage(src, published["sha0"], cache)
    asked = hub.stats()["faults_fired"]
    assert asked >= 1
    with pytest.raises(cp.CheckpointError):
        cp.fleet_stage(src, published["sha0"], cache)  # the second host: same error, no new request
    assert hub.stats()["faults_fired"] == asked
    assert not os.path.exists(w.final_dir(cp.cache_repo_dir(cache, REPO), published["sha0"]))


def test_control_node_space_is_checked_before_downloading(hub, published, tmp_path, monkeypatch):
    monkeypatch.setattr(w, "free_bytes", lambda path: (1000, "/cache-fs"))
    with pytest.raises(w.SpaceError, match=r"control node cache .* /cache-fs has 1000 B free"):
        cp.stage(source(hub), cp.hub_manifest(source(hub), published["sha0"]), str(tmp_path / "c"))
    assert hub.bytes_served == 0


def test_a_local_directory_is_hashed_once_and_served_in_place(published, tmp_path):
    from gpuserve_sandbox.tiny_checkpoint import make_tiny_checkpoint

    info = make_tiny_checkpoint(tmp_path / "ckpt", seed=5)
    sha = "1" * 40
    src = cp.Source("local", "acme/local", local_path=str(tmp_path / "ckpt"))
    m = cp.local_manifest(src, sha, str(tmp_path / "cache"))
    assert {p: s.sha256 for p, s in m.files.items()} == {p: f["sha256"] for p, f in info["files"].items()}
    assert cp.stage(src, m, str(tmp_path / "cache"))[0] == str(tmp_path / "ckpt")
    with pytest.raises(cp.CheckpointError, match="no branches"):
        cp.resolve(src, "main")
    wrong = cp.Source("local", "acme/local", local_path=str(tmp_path / ("2" * 40)))
    os.rename(tmp_path / "ckpt", tmp_path / ("2" * 40))
    with pytest.raises(cp.CheckpointError, match="named after revision 2222"):
        cp.local_manifest(wrong, sha, str(tmp_path / "cache"))


def test_modelscope_without_its_client_says_what_to_install():
    try:
        import modelscope  # noqa: F401
    except ImportError:
        pass
    else:  # pragma: no cover
        pytest.skip("modelscope is installed here")
    with pytest.raises(cp.CheckpointError, match="pip install modelscope"):
        cp.resolve(cp.Source("modelscope", "MiniMax/MiniMax-M3"), "master")


def test_the_sandbox_pin_is_what_the_tiny_checkpoint_publishes(tmp_path):
    """group_data/sandbox.py pins the sha of the regenerated tiny model: a drift in the generator
    (or in numpy/safetensors/tokenizers output) shows up here, not as a confusing hub 404."""
    data = runpy.run_path(str(REPO_ROOT / "group_data" / "sandbox.py"))
    sha, _ = publish_tiny_checkpoint(tmp_path, SANDBOX_REPO, seed=SANDBOX_SEED, variant=0)
    assert data["model_repo"] == SANDBOX_REPO
    assert data["model_revision"] == sha
