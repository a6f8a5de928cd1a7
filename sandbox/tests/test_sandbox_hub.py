"""The local test hub, driven by the REAL huggingface_hub client (never a public hub)."""

from __future__ import annotations

import hashlib
import json
import os
import urllib.error
import urllib.request

import pytest

# Belt and braces: anything that forgets endpoint= hits a dead local port, never huggingface.co.
os.environ.setdefault("HF_ENDPOINT", "http://127.0.0.1:9")
os.environ.setdefault("HF_HUB_DISABLE_TELEMETRY", "1")
os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")

pytest.importorskip("numpy")
pytest.importorskip("safetensors")
pytest.importorskip("tokenizers")

from huggingface_hub import HfApi, hf_hub_download, snapshot_download  # noqa: E402
from huggingface_hub.errors import (  # noqa: E402
    EntryNotFoundError,
    HfHubHTTPError,
    RepositoryNotFoundError,
    RevisionNotFoundError,
)

from gpuserve_sandbox.hub import (  # noqa: E402
    commit_sha_for_dir,
    git_blob_sha1,
    publish_checkpoint,
    publish_tiny_checkpoint,
    serve_in_thread,
    set_ref,
)
from gpuserve_sandbox.tiny_checkpoint import make_tiny_checkpoint  # noqa: E402

REPO = "acme/tiny-moe"
SHARD = "model-00002-of-00004.safetensors"


def sha256_of(path) -> str:
    return hashlib.sha256(open(path, "rb").read()).hexdigest()


class _NoRedirect(urllib.request.HTTPRedirectHandler):
    def redirect_request(self, *args, **kwargs):
        return None


_opener = urllib.request.build_opener(_NoRedirect)


def http(method, url, headers=None, data=None):
    """One request, redirects not followed: (status, headers, body)."""
    req = urllib.request.Request(url, method=method, headers=headers or {}, data=data)
    try:
        with _opener.open(req, timeout=10) as r:
            return r.status, dict(r.headers), r.read()
    except urllib.error.HTTPError as e:
        return e.code, dict(e.headers), e.read()


@pytest.fixture(scope="module")
def published(tmp_path_factory):
    base = tmp_path_factory.mktemp("hub")
    v0 = make_tiny_checkpoint(base / "src-v0", seed=11)
    v1 = make_tiny_checkpoint(base / "src-v1", seed=11, variant=1)
    sha1 = publish_checkpoint(base / "root", REPO, base / "src-v1", branch=None)
    sha0 = publish_checkpoint(base / "root", REPO, base / "src-v0")  # main -> v0
    return {"root": base / "root", "v0": v0, "v1": v1, "sha0": sha0, "sha1": sha1}


@pytest.fixture
def hub(published):
    server = serve_in_thread(published["root"])
    yield server
    server.stop()


@pytest.fixture
def api(hub):
    return HfApi(endpoint=hub.url, token=False)


def test_publish_is_content_addressed(published, tmp_path):
    assert published["sha0"] != published["sha1"]
    assert len(published["sha0"]) == 40 and int(published["sha0"], 16) >= 0
    assert commit_sha_for_dir(published["v0"]["path"]) == published["sha0"]
    assert publish_checkpoint(published["root"], REPO, published["v0"]["path"]) == published["sha0"]
    commit_dir = published["root"] / "acme" / "tiny-moe" / published["sha0"]
    assert sorted(p.name for p in commit_dir.iterdir()) == sorted(published["v0"]["files"])
    assert (published["root"] / "acme" / "tiny-moe" / "refs" / "main").read_text().strip() == published["sha0"]


def test_model_info_files_metadata(api, published):
    info = api.model_info(REPO, revision=published["sha0"], files_metadata=True)
    assert info.sha == published["sha0"] and info.id == REPO
    files = published["v0"]["files"]
    assert {s.rfilename for s in info.siblings} == set(files)
    commit_dir = published["root"] / "acme" / "tiny-moe" / published["sha0"]
    for s in info.siblings:
        assert s.size == files[s.rfilename]["size"]
        if s.rfilename.endswith(".safetensors"):
            assert s.lfs is not None and s.lfs.sha256 == files[s.rfilename]["sha256"] and s.lfs.size == s.size
        else:  # small git files: no LFS pointer, the git blob id instead (as on the real Hub)
            assert s.lfs is None and s.blob_id == git_blob_sha1(commit_dir / s.rfilename)
    bare = api.model_info(REPO)
    assert bare.sha == published["sha0"] and bare.siblings[0].size is None


def test_branch_resolves_to_sha(api, published, hub):
    assert api.model_info(REPO, revision="main").sha == published["sha0"]
    refs = api.list_repo_refs(REPO)
    assert [(b.name, b.target_commit) for b in refs.branches] == [("main", published["sha0"])]
    status, headers, _ = http("HEAD", f"{hub.url}/{REPO}/resolve/main/config.json")
    assert status == 200 and headers["X-Repo-Commit"] == published["sha0"]


def test_tree_and_paths_info(api, published):
    tree = {f.path: f for f in api.list_repo_tree(REPO, revision="main", recursive=True)}
    assert set(tree) == set(published["v0"]["files"])
    assert tree[SHARD].lfs.sha256 == published["v0"]["files"][SHARD]["sha256"]
    got = api.get_paths_info(REPO, ["config.json", SHARD, "missing.bin"], revision="main")
    assert [p.path for p in got] == ["config.json", SHARD]
    assert got[1].lfs.size == published["v0"]["files"][SHARD]["size"]


def test_snapshot_download_counts_bytes(hub, published, tmp_path):
    out = snapshot_download(REPO, revision="main", endpoint=hub.url, local_dir=tmp_path / "m", token=False)
    files = published["v0"]["files"]
    for name, meta in files.items():
        assert sha256_of(os.path.join(out, name)) == meta["sha256"]
    stats = hub.stats()
    assert hub.bytes_served == stats["bytes_files"] == sum(m["size"] for m in files.values())
    assert stats["bytes_total"] > stats["bytes_files"]  # + API JSON
    assert hub.bytes_by_file == {f"{REPO}/{n}": m["size"] for n, m in files.items()}
    assert all(v["gets"] == 1 for v in stats["files"].values())
    # the same numbers over HTTP, for processes other than the test's
    status, _, body = http("GET", f"{hub.url}/_stats")
    assert status == 200 and json.loads(body)["bytes_files"] == hub.bytes_served
    hub.reset_stats()
    assert hub.bytes_served == 0 and hub.stats()["files"] == {}


def test_revision_bump_downloads_only_the_changed_shard(hub, published, tmp_path):
    snapshot_download(REPO, revision=published["sha0"], endpoint=hub.url, local_dir=tmp_path / "m", token=False)
    hub.reset_stats()
    out = snapshot_download(REPO, revision=published["sha1"], endpoint=hub.url, local_dir=tmp_path / "m",
                            token=False)
    varied = published["v1"]["varied_shard"]
    assert hub.bytes_by_file == {f"{REPO}/{varied}": published["v1"]["files"][varied]["size"]}
    assert sha256_of(os.path.join(out, varied)) == published["v1"]["files"][varied]["sha256"]


def test_cache_dir_download_and_main_moves(hub, published, tmp_path):
    root = published["root"]
    try:
        set_ref(root, REPO, "main", published["sha1"])
        path = hf_hub_download(REPO, published["v1"]["varied_shard"], revision="main", endpoint=hub.url,
                               cache_dir=tmp_path / "cache", token=False)
        assert f"/snapshots/{published['sha1']}/" in path
        assert sha256_of(path) == published["v1"]["files"][published["v1"]["varied_shard"]]["sha256"]
    finally:
        set_ref(root, REPO, "main", published["sha0"])


def test_range_requests(hub, published):
    url = f"{hub.url}/{REPO}/resolve/{published['sha0']}/{SHARD}"
    data = (published["v0"]["path"] + "/" + SHARD)
    full = open(data, "rb").read()
    status, headers, body = http("GET", url, {"Range": "bytes=100-199"})
    assert status == 206 and body == full[100:200]
    assert headers["Content-Range"] == f"bytes 100-199/{len(full)}" and headers["Content-Length"] == "100"
    status, _, body = http("GET", url, {"Range": f"bytes={len(full) - 10}-"})
    assert status == 206 and body == full[-10:]
    status, _, body = http("GET", url, {"Range": "bytes=-5"})
    assert status == 206 and body == full[-5:]
    status, headers, _ = http("GET", url, {"Range": f"bytes={len(full)}-"})
    assert status == 416 and headers["Content-Range"] == f"bytes */{len(full)}"
    status, headers, _ = http("HEAD", url)
    assert status == 200 and headers["Content-Length"] == str(len(full)) and headers["Accept-Ranges"] == "bytes"
    assert headers["ETag"] == headers["X-Linked-Etag"] == f'"{published["v0"]["files"][SHARD]["sha256"]}"'
    assert hub.bytes_by_file[f"{REPO}/{SHARD}"] == 100 + 10 + 5


def test_truncated_small_file_is_fetched_again(hub, published, tmp_path):
    """A cut body is retried; below the client's 10 MiB read chunk nothing was kept, so it starts over."""
    size = published["v0"]["files"][SHARD]["size"]
    fault = hub.inject_fault("truncate", match=f"*/{SHARD}", truncate_at=size // 3)
    path = hf_hub_download(REPO, SHARD, revision=published["sha0"], endpoint=hub.url, cache_dir=tmp_path,
                           token=False)
    assert fault.fired == 1
    assert sha256_of(path) == published["v0"]["files"][SHARD]["sha256"]
    assert hub.stats()["files"][f"{REPO}/{SHARD}"] == {"bytes": size // 3 + size, "gets": 2, "heads": 1}


def test_truncated_large_file_resumes_with_range(tmp_path):
    """huggingface_hub keeps what it got in whole 10 MiB chunks and asks for the rest with Range."""
    mib = 1024 * 1024
    src = tmp_path / "src"
    src.mkdir()
    blob = hashlib.sha256(b"seed").digest() * (12 * mib // 32)  # 12 MiB, LFS by extension
    (src / "big.bin").write_bytes(blob)
    sha = publish_checkpoint(tmp_path / "root", "acme/big", src)
    server = serve_in_thread(tmp_path / "root")
    try:
        server.inject_fault("truncate", match="*/big.bin", truncate_at=11 * mib)
        path = hf_hub_download("acme/big", "big.bin", revision=sha, endpoint=server.url,
                               cache_dir=tmp_path / "cache", token=False)
        assert sha256_of(path) == hashlib.sha256(blob).hexdigest()
        stats = server.stats()
        assert stats["statuses"]["206"] == 1
        # 11 MiB before the cut, then bytes=10MiB- (the 11th MiB was never handed over by the client)
        assert stats["files"]["acme/big/big.bin"]["bytes"] == 11 * mib + 2 * mib
    finally:
        server.stop()


def test_injected_status_surfaces_in_client(hub, published, tmp_path, api):
    hub.inject_fault("status", status=500, match="*/resolve/*", methods=["GET"])
    with pytest.raises(HfHubHTTPError) as err:
        hf_hub_download(REPO, SHARD, revision=published["sha0"], endpoint=hub.url, cache_dir=tmp_path, token=False)
    assert err.value.response.status_code == 500
    hub.inject_fault("status", status=503, match="/api/models/*")
    with pytest.raises(HfHubHTTPError) as err:
        api.model_info(REPO, revision="main")
    assert err.value.response.status_code == 503
    # a single HEAD failure is retried by the client and the download goes through
    hub.inject_fault("status", status=503, match="*/resolve/*", methods=["HEAD"])
    path = hf_hub_download(REPO, SHARD, revision=published["sha0"], endpoint=hub.url, cache_dir=tmp_path,
                           token=False)
    assert sha256_of(path) == published["v0"]["files"][SHARD]["sha256"]
    assert hub.stats()["faults_fired"] == 3


def test_corrupt_body_is_not_caught_by_the_client(hub, published, tmp_path):
    """Same size, wrong bytes: huggingface_hub accepts it (FACTS: verify sha256 yourself)."""
    hub.inject_fault("corrupt", match=f"*/{SHARD}")
    path = hf_hub_download(REPO, SHARD, revision=published["sha0"], endpoint=hub.url, cache_dir=tmp_path,
                           token=False)
    assert os.path.getsize(path) == published["v0"]["files"][SHARD]["size"]
    assert sha256_of(path) != published["v0"]["files"][SHARD]["sha256"]


def test_faults_over_http(hub, published, api):
    status, _, body = http("POST", f"{hub.url}/_faults", {"Content-Type": "application/json"},
                           json.dumps({"kind": "status", "status": 502, "count": 1, "match": "/api/*"}).encode())
    assert status == 200 and json.loads(body)["kind"] == "status"
    with pytest.raises(HfHubHTTPError):
        api.model_info(REPO)
    assert api.model_info(REPO).sha == published["sha0"]  # count=1: spent
    status, _, body = http("POST", f"{hub.url}/_faults", {"Content-Type": "application/json"},
                           json.dumps({"kind": "nonsense"}).encode())
    assert status == 400
    http("POST", f"{hub.url}/_faults", {"Content-Type": "application/json"},
         json.dumps({"kind": "status", "count": None}).encode())
    assert http("DELETE", f"{hub.url}/_faults")[0] == 200
    assert api.model_info(REPO).sha == published["sha0"]
    assert http("POST", f"{hub.url}/_stats/reset", data=b"")[0] == 200
    assert json.loads(http("GET", f"{hub.url}/_stats")[2])["requests"] == {}


def test_not_found_errors(api, hub, published, tmp_path):
    with pytest.raises(RepositoryNotFoundError):
        api.model_info("acme/nope")
    with pytest.raises(RevisionNotFoundError):
        api.model_info(REPO, revision="no-such-branch")
    with pytest.raises(EntryNotFoundError):
        hf_hub_download(REPO, "nope.json", revision=published["sha0"], endpoint=hub.url, cache_dir=tmp_path,
                        token=False)


def test_token_and_lfs_redirect(published, tmp_path):
    server = serve_in_thread(published["root"], token="s3cret", lfs_redirect=True)
    try:
        with pytest.raises(RepositoryNotFoundError):
            HfApi(endpoint=server.url, token=False).model_info(REPO)
        status, headers, _ = http("HEAD", f"{server.url}/{REPO}/resolve/main/{SHARD}",
                                  {"Authorization": "Bearer s3cret"})
        assert status == 302 and headers["Location"].startswith(server.state.cdn_base + "/_cdn/")
        assert headers["X-Linked-Size"] == str(published["v0"]["files"][SHARD]["size"])
        out = snapshot_download(REPO, revision="main", endpoint=server.url, local_dir=tmp_path / "m", token="s3cret")
        for name, meta in published["v0"]["files"].items():
            assert sha256_of(os.path.join(out, name)) == meta["sha256"]
        stats = server.stats()
        assert stats["requests"]["GET /_cdn"] == 4  # the four shards came from the "CDN"
        assert server.bytes_served == sum(m["size"] for m in published["v0"]["files"].values())
    finally:
        server.stop()


def test_publish_tiny_and_cli(tmp_path):
    import subprocess
    import sys
    import time

    sha, info = publish_tiny_checkpoint(tmp_path / "root", "acme/cli", seed=5, variant=2)
    assert (tmp_path / "root" / "acme" / "cli" / sha / info["varied_shard"]).is_file()
    with __import__("socket").socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = subprocess.Popen([sys.executable, "-m", "gpuserve_sandbox.hub", "--root", str(tmp_path / "root"),
                             "--bind", "127.0.0.1", "--port", str(port), "--publish-tiny", "acme/cli2", "--seed", "5",
                             "--variant", "2"], stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline().strip() == f"published acme/cli2@{sha} (main)"  # content-addressed
        for _ in range(100):
            try:
                info2 = HfApi(endpoint=f"http://127.0.0.1:{port}", token=False).model_info("acme/cli2")
                break
            except Exception:
                time.sleep(0.05)
        assert info2.sha == sha
    finally:
        proc.terminate()
        assert proc.wait(10) == 0
