"""A local Hugging Face Hub look-alike, FOR TESTS, BENCHES AND THE SANDBOX ONLY.

It is not a mirror and not for production: no real authentication (an optional shared bearer token), no
uploads over HTTP, no Xet, everything held as plain files. It exists so that the weights layer can be
exercised with the real ``huggingface_hub`` client (2.4.x) without any test ever reaching a public hub.

Storage (``root``), written by :func:`publish_checkpoint`::

    <root>/<org>/<name>/<commit-sha>/<files...>     one directory per commit, never modified
    <root>/<org>/<name>/refs/<branch>               text file holding the 40-hex sha

Endpoints, i.e. exactly what huggingface_hub 2.4 calls for model repos (read from its source):

    GET  /api/models/<org>/<name>[/revision/<rev>][?blobs=true]   HfApi.model_info / repo_info
    GET  /api/models/<org>/<name>/tree/<rev>[/<path>][?recursive=]  list_repo_tree (snapshot_download)
    POST /api/models/<org>/<name>/paths-info/<rev>                   get_paths_info (form: paths=..)
    GET  /api/models/<org>/<name>/refs                               list_repo_refs
    HEAD/GET /<org>/<name>/resolve/<rev>/<path>                      hf_hub_download (Range honoured)

Resolve responses carry ``X-Repo-Commit``, ``ETag`` (git blob sha1, or sha256 for LFS files),
``X-Linked-Etag``/``X-Linked-Size`` for LFS files, ``Content-Length``, ``Accept-Ranges``. With
``lfs_redirect=True`` LFS files answer 302 with ``Location`` on a second listener (another origin, like
the real Hub's CDN), so the client takes its metadata from the redirect, as in production.
Errors carry ``X-Error-Code`` (RepoNotFound, RevisionNotFound, EntryNotFound) so the client raises its
typed errors.

Test hooks: byte counters (total and per file; :meth:`HubServer.stats`, ``GET /_stats``,
``POST /_stats/reset``) and fault injection (:meth:`HubServer.inject_fault`, ``POST /_faults``,
``DELETE /_faults``): answer N requests with an HTTP status, truncate or corrupt a body, delay, or drop
the connection.
"""

from __future__ import annotations

import argparse
import email.utils
import fnmatch
import hashlib
import json
import os
import re
import shutil
import signal
import socket
import sys
import tempfile
import threading
import time
from dataclasses import asdict, dataclass, field
from datetime import datetime, timezone
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, Callable
from urllib.parse import parse_qs, quote, unquote, urlsplit

from gpuserve.weights import hash_file

SHA_RE = re.compile(r"^[0-9a-f]{40}$")
NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")
REF_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")

# What the Hub's default .gitattributes sends to LFS, plus anything >= 10 MiB.
LFS_PATTERNS = (
    "*.safetensors", "*.bin", "*.pt", "*.pth", "*.ckpt", "*.h5", "*.msgpack", "*.onnx", "*.gguf",
    "*.model", "*.npy", "*.npz", "*.tar", "*.tar.gz", "*.zip", "*.zst", "*.arrow", "*.parquet",
)
LFS_MIN_SIZE = 10 * 1024 * 1024
CHUNK = 256 * 1024

# The sandbox's own hub: listens on the instance's bridge address (hosts reach it, nothing else does)
# at this port, and serves the tiny model group_data/sandbox.py pins.
SANDBOX_PORT = 8900
SANDBOX_REPO = "gpuserve-test/tiny-chat"
SANDBOX_SEED = 0


def sandbox_endpoint(instance: int | None = None) -> str:
    """``http://10.231.<instance>.1:8900``; instance from $GPUSERVE_SANDBOX_INSTANCE (default 0)."""
    from gpuserve_sandbox.network import bridge_ip

    if instance is None:
        instance = int(os.environ.get("GPUSERVE_SANDBOX_INSTANCE", "0"))
    return f"http://{bridge_ip(instance)}:{SANDBOX_PORT}"


def is_lfs(path: str, size: int) -> bool:
    name = path.rsplit("/", 1)[-1]
    return size >= LFS_MIN_SIZE or any(fnmatch.fnmatch(name, p) for p in LFS_PATTERNS)


def git_blob_sha1(path: Path) -> str:
    return hash_file(str(path), git=True)[1]


def file_sha256(path: Path) -> str:
    return hash_file(str(path))[0]


# --------------------------------------------------------------------------------------------------------
# Publishing (writes the storage layout; the server only reads it)
# --------------------------------------------------------------------------------------------------------


def _split_repo(repo_id: str) -> tuple[str, str]:
    parts = repo_id.split("/")
    if len(parts) != 2 or not all(NAME_RE.match(p) for p in parts):
        raise ValueError(f"repo id must be <org>/<name>, got {repo_id!r}")
    return parts[0], parts[1]


def _walk_files(src: Path) -> list[str]:
    out = []
    for dirpath, dirnames, filenames in os.walk(src):
        dirnames[:] = sorted(d for d in dirnames if not d.startswith("."))
        for fn in filenames:
            if fn.startswith("."):
                continue
            out.append(Path(dirpath, fn).relative_to(src).as_posix())
    return sorted(out)


def commit_sha_for_dir(src_dir: str | os.PathLike) -> str:
    """Deterministic 40-hex "commit" id of a directory: sha1 over sorted (path, sha256) of its files.

    Same contents, same id (publishing twice is a no-op); dotfiles are ignored.
    """
    src = Path(src_dir)
    h = hashlib.sha1(b"gpuserve-sandbox-hub-commit-v1\n")
    for rel in _walk_files(src):
        h.update(rel.encode() + b"\0" + file_sha256(src / rel).encode() + b"\n")
    return h.hexdigest()


def set_ref(root: str | os.PathLike, repo_id: str, ref: str, sha: str) -> None:
    """Point branch/tag ``ref`` of ``repo_id`` at commit ``sha`` (atomically)."""
    org, name = _split_repo(repo_id)
    if not REF_RE.match(ref):
        raise ValueError(f"bad ref name {ref!r}")
    if not SHA_RE.match(sha) or not (Path(root, org, name, sha)).is_dir():
        raise ValueError(f"unknown commit {sha!r} in {repo_id}")
    refs = Path(root, org, name, "refs")
    refs.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=refs, prefix=".tmp-")
    with os.fdopen(fd, "w") as f:
        f.write(sha + "\n")
    os.replace(tmp, refs / ref)


def publish_checkpoint(
    root: str | os.PathLike,
    repo_id: str,
    src_dir: str | os.PathLike,
    *,
    branch: str | None = "main",
    tags: tuple[str, ...] = (),
) -> str:
    """Publish the files of ``src_dir`` as a commit of ``repo_id`` under the hub ``root``.

    Files are copied (never hard-linked: the caller may rewrite its directory in place). The commit id is
    :func:`commit_sha_for_dir`; ``branch`` (None: none) and ``tags`` are moved to it. Returns the sha.
    """
    org, name = _split_repo(repo_id)
    src = Path(src_dir)
    sha = commit_sha_for_dir(src)
    repo = Path(root, org, name)
    dest = repo / sha
    if not dest.is_dir():
        repo.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(dir=repo, prefix=".tmp-commit-"))
        for rel in _walk_files(src):
            (tmp / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src / rel, tmp / rel)
        os.replace(tmp, dest)
    for ref in ([branch] if branch else []) + list(tags):
        set_ref(root, repo_id, ref, sha)
    return sha


def write_sharded_checkpoint(src_dir: str | os.PathLike, shards: int, shard_bytes: int,
                             random_bytes: Callable[[int], bytes]) -> dict[str, str]:
    """Write a checkpoint of ``shards`` shards of ``random_bytes(shard_bytes)`` each
    (``model-00001-of-0000N.safetensors``, ...) and a ``config.json`` into ``src_dir``: what a
    weights test copies around. Returns each file's sha256 by name."""
    src = Path(src_dir)
    sums = {}
    for i in range(1, shards + 1):
        data = random_bytes(shard_bytes)
        name = f"model-{i:05d}-of-{shards:05d}.safetensors"
        (src / name).write_bytes(data)
        sums[name] = hashlib.sha256(data).hexdigest()
    config = json.dumps({"architectures": ["Test"]}).encode()
    (src / "config.json").write_bytes(config)
    sums["config.json"] = hashlib.sha256(config).hexdigest()
    return sums


def publish_tiny_checkpoint(root: str | os.PathLike, repo_id: str, *, seed: int, variant: int = 0,
                            branch: str | None = "main") -> tuple[str, dict[str, Any]]:
    """Make the tiny checkpoint (``seed``, ``variant``) and publish it as a commit of ``repo_id``.

    Returns ``(sha, info)`` with ``info`` from :func:`~gpuserve_sandbox.tiny_checkpoint.make_tiny_checkpoint`
    (its ``path`` is a temporary directory, already removed).
    """
    from gpuserve_sandbox.tiny_checkpoint import make_tiny_checkpoint

    with tempfile.TemporaryDirectory(prefix="tiny-ckpt-") as tmp:
        info = make_tiny_checkpoint(tmp, seed=seed, variant=variant)
        sha = publish_checkpoint(root, repo_id, tmp, branch=branch)
    return sha, info


# --------------------------------------------------------------------------------------------------------
# Faults and statistics
# --------------------------------------------------------------------------------------------------------

FAULT_KINDS = ("status", "truncate", "corrupt", "delay", "drop")


@dataclass
class Fault:
    """One injected fault. ``match`` is an fnmatch glob on the decoded URL path (e.g. ``*/resolve/*``);
    ``methods`` limits it (e.g. ``["GET"]``); ``count`` is how many matching requests it hits (None: all).

    kinds: ``status`` answer ``status`` (with ``retry_after`` if set); ``truncate`` send the full
    Content-Length but only ``truncate_at`` body bytes (default half), then close; ``corrupt`` flip one
    byte in the middle of the body (same length); ``delay`` sleep ``delay_s`` then answer normally;
    ``drop`` close the connection without answering. Body faults only touch /resolve and /_cdn GETs.
    """

    kind: str
    count: int | None = 1
    match: str = "*"
    methods: list[str] | None = None
    status: int = 503
    retry_after: int | None = None
    truncate_at: int | None = None
    delay_s: float = 0.0
    id: int = 0
    fired: int = 0

    def __post_init__(self) -> None:
        if self.kind not in FAULT_KINDS:
            raise ValueError(f"fault kind must be one of {FAULT_KINDS}, got {self.kind!r}")


@dataclass
class _Stats:
    bytes_total: int = 0  # every response body byte (API JSON included)
    bytes_files: int = 0  # file bodies only (/resolve and /_cdn)
    files: dict[str, dict[str, int]] = field(default_factory=dict)
    requests: dict[str, int] = field(default_factory=dict)
    statuses: dict[str, int] = field(default_factory=dict)
    faults_fired: int = 0


class _HubState:
    def __init__(self, root: Path, token: str | None, lfs_redirect: bool) -> None:
        self.root = root
        self.token = token
        self.lfs_redirect = lfs_redirect
        self.cdn_base: str | None = None
        self.lock = threading.Lock()
        self.stats = _Stats()
        self.faults: list[Fault] = []
        self._next_fault_id = 1
        self._hash_cache: dict[tuple[str, int, int], tuple[str, str]] = {}

    # -- hashing (commit dirs are immutable, but key on size/mtime anyway) --
    def hashes(self, path: Path) -> tuple[str, str]:
        st = path.stat()
        key = (str(path), st.st_size, st.st_mtime_ns)
        with self.lock:
            hit = self._hash_cache.get(key)
        if hit is None:
            sha256, blob = hash_file(str(path), git=True)   # one read for both
            hit = (blob, sha256)
            with self.lock:
                self._hash_cache[key] = hit
        return hit

    def add_fault(self, fault: Fault) -> Fault:
        with self.lock:
            fault.id = self._next_fault_id
            self._next_fault_id += 1
            self.faults.append(fault)
        return fault

    def take_fault(self, method: str, path: str, *, body: bool) -> Fault | None:
        """The first armed fault matching this request; ``body``: look at body faults (truncate/corrupt,
        only consulted when a file body is about to be sent), else at the others."""
        with self.lock:
            for f in self.faults:
                if f.count is not None and f.count <= 0:
                    continue
                if (f.kind in ("truncate", "corrupt")) != body:
                    continue
                if f.methods and method not in f.methods:
                    continue
                if not fnmatch.fnmatchcase(path, f.match):
                    continue
                if f.count is not None:
                    f.count -= 1
                f.fired += 1
                self.stats.faults_fired += 1
                return f
        return None

    def count_request(self, kind: str) -> None:
        with self.lock:
            self.stats.requests[kind] = self.stats.requests.get(kind, 0) + 1

    def count_status(self, status: int) -> None:
        with self.lock:
            self.stats.statuses[str(status)] = self.stats.statuses.get(str(status), 0) + 1

    def count_bytes(self, file_key: str | None, n: int) -> None:
        with self.lock:
            self.stats.bytes_total += n
            if file_key is not None:
                self.stats.bytes_files += n
                entry = self.stats.files.setdefault(file_key, {"bytes": 0, "gets": 0, "heads": 0})
                entry["bytes"] += n

    def count_file_request(self, file_key: str, method: str) -> None:
        with self.lock:
            entry = self.stats.files.setdefault(file_key, {"bytes": 0, "gets": 0, "heads": 0})
            entry["gets" if method == "GET" else "heads"] += 1

    def snapshot(self) -> dict[str, Any]:
        with self.lock:
            return json.loads(json.dumps(asdict(self.stats)))

    def reset(self) -> None:
        with self.lock:
            self.stats = _Stats()


class _HubError(Exception):
    def __init__(self, status: int, code: str | None, message: str, commit: str | None = None) -> None:
        super().__init__(message)
        self.status, self.code, self.message, self.commit = status, code, message, commit


def _iso(ts: float) -> str:
    return datetime.fromtimestamp(ts, timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.000Z")


# --------------------------------------------------------------------------------------------------------
# Request handler
# --------------------------------------------------------------------------------------------------------


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server_version = "gpuserve-sandbox-hub/1"
    state: _HubState  # set on the per-server subclass
    is_cdn = False

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - stdlib signature
        if os.environ.get("GPUSERVE_HUB_LOG"):
            super().log_message(format, *args)

    # ---- plumbing ----
    def _send(self, status: int, body: bytes = b"", headers: dict[str, str] | None = None,
              content_type: str = "application/json") -> None:
        self.state.count_status(status)
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        for k, v in (headers or {}).items():
            self.send_header(k, v)
        self.end_headers()
        if self.command != "HEAD" and body:
            self.wfile.write(body)
            self.state.count_bytes(None, len(body))

    def _json(self, status: int, obj: Any, headers: dict[str, str] | None = None) -> None:
        self._send(status, json.dumps(obj).encode(), headers)

    def _error(self, err: _HubError) -> None:
        headers = {"X-Error-Message": err.message}
        if err.code:
            headers["X-Error-Code"] = err.code
        if err.commit:
            headers["X-Repo-Commit"] = err.commit
        self._json(err.status, {"error": err.message}, headers)

    def _read_body(self) -> bytes:
        n = int(self.headers.get("Content-Length") or 0)
        return self.rfile.read(n) if n else b""

    # ---- dispatch ----
    def do_GET(self) -> None:
        self._dispatch()

    def do_HEAD(self) -> None:
        self._dispatch()

    def do_POST(self) -> None:
        self._dispatch()

    def do_DELETE(self) -> None:
        self._dispatch()

    def _dispatch(self) -> None:
        split = urlsplit(self.path)
        raw_parts = [p for p in split.path.split("/") if p != ""]
        decoded_path = unquote(split.path)
        query = parse_qs(split.query)
        try:
            if raw_parts and raw_parts[0] in ("_stats", "_faults"):
                return self._control(raw_parts, query)
            fault = self.state.take_fault(self.command, decoded_path, body=False)
            if fault is not None:
                if fault.kind == "delay":
                    time.sleep(fault.delay_s)
                elif fault.kind == "drop":
                    self.close_connection = True
                    self.connection.shutdown(socket.SHUT_RDWR)
                    return
                elif fault.kind == "status":
                    self._read_body()
                    hdrs = {"X-Error-Message": f"injected fault {fault.id}"}
                    if fault.retry_after is not None:
                        hdrs["Retry-After"] = str(fault.retry_after)
                    self.state.count_request(f"{self.command} fault")
                    return self._json(fault.status, {"error": f"injected fault {fault.id}"}, hdrs)
            self._auth()
            if self.is_cdn:
                if raw_parts[:1] == ["_cdn"] and self.command in ("GET", "HEAD"):
                    return self._cdn(raw_parts[1:], decoded_path)
                raise _HubError(404, None, "not found")
            if raw_parts[:2] == ["api", "models"] and len(raw_parts) >= 4:
                return self._api(raw_parts[2:], query)
            if len(raw_parts) >= 5 and raw_parts[2] == "resolve" and self.command in ("GET", "HEAD"):
                return self._resolve(raw_parts, decoded_path)
            raise _HubError(404, None, f"no such endpoint: {self.command} {split.path}")
        except _HubError as err:
            self._error(err)
        except (BrokenPipeError, ConnectionResetError):
            self.close_connection = True

    def _auth(self) -> None:
        if self.state.token is None or self.is_cdn:
            return
        if self.headers.get("Authorization") != f"Bearer {self.state.token}":
            # the Hub answers a private repo without (valid) credentials like a missing one
            raise _HubError(401, "RepoNotFound", "Invalid username or password.")

    # ---- repo lookups ----
    def _repo(self, org: str, name: str) -> Path:
        org, name = unquote(org), unquote(name)
        repo = self.state.root / org / name
        if not (NAME_RE.match(org) and NAME_RE.match(name)) or not repo.is_dir():
            raise _HubError(404, "RepoNotFound", f"Repository {org}/{name} not found")
        return repo

    def _resolve_rev(self, repo: Path, rev: str) -> str:
        if SHA_RE.match(rev) and (repo / rev).is_dir():
            return rev
        if REF_RE.match(rev):
            ref = repo / "refs" / rev
            if ref.is_file():
                sha = ref.read_text().strip()
                if SHA_RE.match(sha) and (repo / sha).is_dir():
                    return sha
        raise _HubError(404, "RevisionNotFound", f"Invalid rev id: {rev}")

    def _entry(self, commit_dir: Path, rel: str, *, expand: bool = False) -> dict[str, Any]:
        p = commit_dir / rel
        if p.is_dir():
            h = hashlib.sha1(b"tree\0" + "\n".join(_walk_files(p)).encode()).hexdigest()
            return {"type": "directory", "oid": h, "path": rel}
        size = p.stat().st_size
        sha1, sha256 = self.state.hashes(p)
        entry: dict[str, Any] = {"type": "file", "oid": sha1, "size": size, "path": rel}
        if is_lfs(rel, size):
            entry["lfs"] = {"oid": sha256, "size": size, "pointerSize": 134}
        return entry

    # ---- /api/models/<org>/<name>/... ----
    def _api(self, parts: list[str], query: dict[str, list[str]]) -> None:
        repo = self._repo(parts[0], parts[1])
        repo_id = f"{unquote(parts[0])}/{unquote(parts[1])}"
        rest = parts[2:]
        if self.command == "GET" and (not rest or rest[0] == "revision"):
            rev = unquote(rest[1]) if len(rest) >= 2 else "main"
            self.state.count_request("GET /api/models info")
            return self._model_info(repo, repo_id, rev, blobs=query.get("blobs", ["false"])[0].lower() == "true")
        if self.command == "GET" and rest and rest[0] == "tree" and len(rest) >= 2:
            self.state.count_request("GET /api/models tree")
            sha = self._resolve_rev(repo, unquote(rest[1]))
            sub = "/".join(unquote(p) for p in rest[2:])
            recursive = query.get("recursive", ["false"])[0].lower() in ("true", "1")
            return self._tree(repo / sha, sub, recursive, sha)
        if self.command == "POST" and rest and rest[0] == "paths-info" and len(rest) >= 2:
            self.state.count_request("POST /api/models paths-info")
            sha = self._resolve_rev(repo, unquote(rest[1]))
            body = self._read_body().decode()
            ctype = self.headers.get("Content-Type", "")
            if "json" in ctype:
                paths = json.loads(body or "{}").get("paths", [])
            else:
                paths = parse_qs(body).get("paths", [])
            out = []
            for rel in paths:
                rel = rel.strip("/")
                if rel and (repo / sha / rel).exists() and ".." not in rel.split("/"):
                    out.append(self._entry(repo / sha, rel))
            return self._json(200, out)
        if self.command == "GET" and rest == ["refs"]:
            self.state.count_request("GET /api/models refs")
            branches = []
            refs_dir = repo / "refs"
            for ref in sorted(refs_dir.iterdir()) if refs_dir.is_dir() else []:
                if ref.is_file() and not ref.name.startswith("."):
                    branches.append({"name": ref.name, "ref": f"refs/heads/{ref.name}",
                                     "targetCommit": ref.read_text().strip()})
            return self._json(200, {"branches": branches, "tags": [], "converts": []})
        raise _HubError(404, None, f"no such endpoint: {self.command} {self.path}")

    def _model_info(self, repo: Path, repo_id: str, rev: str, *, blobs: bool) -> None:
        sha = self._resolve_rev(repo, rev)
        commit_dir = repo / sha
        siblings = []
        used = 0
        for rel in _walk_files(commit_dir):
            if not blobs:
                siblings.append({"rfilename": rel})
                continue
            e = self._entry(commit_dir, rel)
            used += e["size"]
            s: dict[str, Any] = {"rfilename": rel, "size": e["size"], "blobId": e["oid"]}
            if "lfs" in e:
                s["lfs"] = {"size": e["size"], "sha256": e["lfs"]["oid"], "pointerSize": e["lfs"]["pointerSize"]}
            siblings.append(s)
        cfg: dict[str, Any] = {}
        try:
            raw = json.loads((commit_dir / "config.json").read_text())
            cfg = {k: raw[k] for k in ("architectures", "model_type") if k in raw}
        except (OSError, ValueError):
            pass
        mtime = commit_dir.stat().st_mtime
        info = {
            "_id": hashlib.sha1(repo_id.encode()).hexdigest()[:24],
            "id": repo_id,
            "modelId": repo_id,
            "author": repo_id.split("/")[0],
            "sha": sha,
            "lastModified": _iso(mtime),
            "createdAt": _iso(mtime),
            "private": self.state.token is not None,
            "disabled": False,
            "gated": False,
            "downloads": 0,
            "likes": 0,
            "tags": ["sandbox"],
            "library_name": "transformers",
            "config": cfg,
            "siblings": siblings,
        }
        if blobs:
            info["usedStorage"] = used
        self._json(200, info)

    def _tree(self, commit_dir: Path, sub: str, recursive: bool, sha: str) -> None:
        base = commit_dir / sub if sub else commit_dir
        if ".." in sub.split("/") or not base.is_dir():
            raise _HubError(404, "EntryNotFound", f"{sub} does not exist on {sha}", commit=sha)
        out = []
        if recursive:
            dirs = set()
            for rel in _walk_files(base):
                full = f"{sub}/{rel}" if sub else rel
                parts = full.split("/")
                for i in range(1, len(parts)):
                    dirs.add("/".join(parts[:i]))
                out.append(self._entry(commit_dir, full))
            out = [self._entry(commit_dir, d) for d in sorted(dirs) if not sub or d.startswith(sub + "/")] + out
        else:
            for child in sorted(base.iterdir()):
                if child.name.startswith("."):
                    continue
                out.append(self._entry(commit_dir, child.relative_to(commit_dir).as_posix()))
        self._json(200, out)

    # ---- downloads ----
    def _resolve(self, raw_parts: list[str], decoded_path: str) -> None:
        repo = self._repo(raw_parts[0], raw_parts[1])
        repo_id = f"{unquote(raw_parts[0])}/{unquote(raw_parts[1])}"
        sha = self._resolve_rev(repo, unquote(raw_parts[3]))
        rel = "/".join(unquote(p) for p in raw_parts[4:])
        path = repo / sha / rel
        if ".." in rel.split("/") or rel.startswith(".") or not path.is_file():
            raise _HubError(404, "EntryNotFound", f"{rel} does not exist on {sha}", commit=sha)
        size = path.stat().st_size
        sha1, sha256 = self.state.hashes(path)
        lfs = is_lfs(rel, size)
        file_key = f"{repo_id}/{rel}"
        self.state.count_request(f"{self.command} /resolve")
        self.state.count_file_request(file_key, self.command)
        headers = {
            "X-Repo-Commit": sha,
            "ETag": f'"{sha256 if lfs else sha1}"',
            "Accept-Ranges": "bytes",
            "Content-Disposition": f'inline; filename="{rel.rsplit("/", 1)[-1]}"',
        }
        if lfs:
            headers["X-Linked-Etag"] = f'"{sha256}"'
            headers["X-Linked-Size"] = str(size)
        if lfs and self.state.lfs_redirect and self.state.cdn_base:
            loc = f"{self.state.cdn_base}/_cdn/{quote(repo_id)}/{sha}/{quote(rel)}"
            headers["Location"] = loc
            return self._send(302, b"", headers)
        self._send_file(path, size, headers, file_key, decoded_path)

    def _cdn(self, parts: list[str], decoded_path: str) -> None:
        # /_cdn/<org>/<name>/<sha>/<path>: what the 302 points at; no auth (a signed URL, in spirit)
        if len(parts) < 4:
            raise _HubError(404, None, "not found")
        repo = self._repo(parts[0], parts[1])
        repo_id = f"{unquote(parts[0])}/{unquote(parts[1])}"
        sha = self._resolve_rev(repo, unquote(parts[2]))
        rel = "/".join(unquote(p) for p in parts[3:])
        path = repo / sha / rel
        if ".." in rel.split("/") or not path.is_file():
            raise _HubError(404, None, "not found")
        size = path.stat().st_size
        _, sha256 = self.state.hashes(path)
        file_key = f"{repo_id}/{rel}"
        self.state.count_request(f"{self.command} /_cdn")
        self.state.count_file_request(file_key, self.command)
        headers = {"ETag": f'"{sha256}"', "Accept-Ranges": "bytes", "X-Repo-Commit": sha}
        self._send_file(path, size, headers, file_key, decoded_path)

    def _send_file(self, path: Path, size: int, headers: dict[str, str], file_key: str,
                   decoded_path: str) -> None:
        start, end, status = 0, size - 1, 200
        rng = self.headers.get("Range")
        if rng:
            m = re.fullmatch(r"\s*bytes=(\d*)-(\d*)\s*", rng)
            if m and (m.group(1) or m.group(2)):
                if m.group(1):
                    start = int(m.group(1))
                    end = min(int(m.group(2)), size - 1) if m.group(2) else size - 1
                else:  # suffix range
                    start = max(size - int(m.group(2)), 0)
                if start >= size or start > end:
                    headers = dict(headers, **{"Content-Range": f"bytes */{size}"})
                    return self._send(416, b"", headers)
                status = 206
                headers = dict(headers, **{"Content-Range": f"bytes {start}-{end}/{size}"})
            # anything else (multi-range, junk): ignore the header and send the whole file (RFC 9110)
        length = end - start + 1 if size else 0
        self.state.count_status(status)
        self.send_response(status)
        self.send_header("Content-Type", "application/octet-stream")
        self.send_header("Content-Length", str(length))
        self.send_header("Last-Modified", email.utils.formatdate(path.stat().st_mtime, usegmt=True))
        for k, v in headers.items():
            self.send_header(k, v)
        self.end_headers()
        if self.command == "HEAD":
            return
        fault = self.state.take_fault(self.command, decoded_path, body=True)
        limit = length
        corrupt_at = None
        if fault is not None and fault.kind == "truncate":
            limit = min(length, fault.truncate_at if fault.truncate_at is not None else length // 2)
        elif fault is not None and fault.kind == "corrupt" and length:
            corrupt_at = length // 2
        sent = 0
        with open(path, "rb") as f:
            f.seek(start)
            while sent < limit:
                chunk = f.read(min(CHUNK, limit - sent))
                if not chunk:
                    break
                if corrupt_at is not None and sent <= corrupt_at < sent + len(chunk):
                    i = corrupt_at - sent
                    chunk = chunk[:i] + bytes([chunk[i] ^ 0xFF]) + chunk[i + 1:]
                self.wfile.write(chunk)
                sent += len(chunk)
                self.state.count_bytes(file_key, len(chunk))
        if sent < length:  # truncated: make the client see a short body, not a hang
            self.wfile.flush()
            self.close_connection = True
            try:
                self.connection.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

    # ---- /_stats, /_faults ----
    def _control(self, parts: list[str], query: dict[str, list[str]]) -> None:
        if parts == ["_stats"] and self.command == "GET":
            return self._json(200, self.state.snapshot())
        if parts == ["_stats", "reset"] and self.command == "POST":
            self._read_body()
            self.state.reset()
            return self._json(200, {"ok": True})
        if parts == ["_faults"] and self.command == "GET":
            with self.state.lock:
                return self._json(200, [asdict(f) for f in self.state.faults])
        if parts == ["_faults"] and self.command == "POST":
            try:
                spec = json.loads(self._read_body() or b"{}")
                fault = self.state.add_fault(Fault(**{k: v for k, v in spec.items() if k not in ("id", "fired")}))
            except (TypeError, ValueError) as e:
                return self._json(400, {"error": str(e)})
            return self._json(200, asdict(fault))
        if parts == ["_faults"] and self.command == "DELETE":
            with self.state.lock:
                self.state.faults.clear()
            return self._json(200, {"ok": True})
        return self._json(404, {"error": "no such control endpoint"})


# --------------------------------------------------------------------------------------------------------
# Server objects
# --------------------------------------------------------------------------------------------------------


class HubServer(ThreadingHTTPServer):
    """The hub. ``port=0`` picks a free port (see :attr:`url`). Use :func:`serve_in_thread` to run it."""

    daemon_threads = True
    allow_reuse_address = True

    def __init__(self, root: str | os.PathLike, host: str = "127.0.0.1", port: int = 0, *,
                 token: str | None = None, lfs_redirect: bool = False) -> None:
        self.state = _HubState(Path(root).resolve(), token, lfs_redirect)
        handler = type("HubHandler", (_Handler,), {"state": self.state})
        super().__init__((host, port), handler)
        self.cdn: ThreadingHTTPServer | None = None
        if lfs_redirect:
            cdn_handler = type("CdnHandler", (_Handler,), {"state": self.state, "is_cdn": True})
            self.cdn = ThreadingHTTPServer((host, 0), cdn_handler)
            self.cdn.daemon_threads = True
            self.state.cdn_base = f"http://{_url_host(host)}:{self.cdn.server_address[1]}"
        self._serve_threads: list[threading.Thread] = []

    @property
    def url(self) -> str:
        host, port = self.server_address[:2]
        return f"http://{_url_host(host)}:{port}"

    @property
    def root(self) -> Path:
        return self.state.root

    # -- statistics --
    def stats(self) -> dict[str, Any]:
        """``{"bytes_total", "bytes_files", "files": {"org/name/path": {"bytes", "gets", "heads"}}, "requests",
        "statuses", "faults_fired"}`` (a copy). Control endpoints (/_stats, /_faults) are not counted."""
        return self.state.snapshot()

    @property
    def bytes_served(self) -> int:
        """File body bytes sent so far (what a download costs; API JSON is in ``stats()["bytes_total"]``)."""
        return self.state.snapshot()["bytes_files"]

    @property
    def bytes_by_file(self) -> dict[str, int]:
        """``{"org/name/path": bytes}`` for files that had body bytes sent (HEAD-only files left out)."""
        return {k: v["bytes"] for k, v in self.state.snapshot()["files"].items() if v["bytes"]}

    def reset_stats(self) -> None:
        self.state.reset()

    # -- faults --
    def inject_fault(self, kind: str, *, count: int | None = 1, match: str = "*", methods: list[str] | None = None,
                     status: int = 503, retry_after: int | None = None, truncate_at: int | None = None,
                     delay_s: float = 0.0) -> Fault:
        """Arm a fault (see :class:`Fault`); returns it (``.fired`` counts hits)."""
        return self.state.add_fault(Fault(kind=kind, count=count, match=match, methods=methods, status=status,
                                          retry_after=retry_after, truncate_at=truncate_at, delay_s=delay_s))

    def clear_faults(self) -> None:
        with self.state.lock:
            self.state.faults.clear()

    # -- lifecycle --
    def start(self) -> HubServer:
        for srv in (self, self.cdn):
            if srv is not None:
                t = threading.Thread(target=srv.serve_forever, kwargs={"poll_interval": 0.1},
                                     name=f"sandbox-hub-{srv.server_address[1]}", daemon=True)
                t.start()
                self._serve_threads.append(t)
        return self

    def stop(self) -> None:
        for srv in (self, self.cdn):
            if srv is not None:
                srv.shutdown()
                srv.server_close()
        for t in self._serve_threads:
            t.join(timeout=5)

    def __enter__(self) -> HubServer:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.stop()


def _url_host(host: str) -> str:
    return f"[{host}]" if ":" in host else host


def serve_in_thread(root: str | os.PathLike, host: str = "127.0.0.1", port: int = 0, **kwargs: Any) -> HubServer:
    """Start a :class:`HubServer` on background threads and return it (``server.url``, ``server.stop()``)."""
    return HubServer(root, host, port, **kwargs).start()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="python -m gpuserve_sandbox.hub",
        description="Local Hugging Face Hub look-alike for tests and the sandbox (not for production).",
    )
    ap.add_argument("--root", required=True, help="hub storage directory (<org>/<name>/<sha>/..., refs/)")
    ap.add_argument("--bind", default="127.0.0.1")
    ap.add_argument("--port", type=int, default=8900)
    ap.add_argument("--token", default=os.environ.get("GPUSERVE_HUB_TOKEN"),
                    help="require 'Authorization: Bearer TOKEN' (env GPUSERVE_HUB_TOKEN)")
    ap.add_argument("--lfs-redirect", action="store_true", help="302 LFS files to a second (CDN) listener")
    ap.add_argument("--publish-tiny", metavar="ORG/NAME", help="first publish a tiny checkpoint to this repo (main)")
    ap.add_argument("--seed", type=int, default=0, help="seed for --publish-tiny")
    ap.add_argument("--variant", type=int, default=0, help="variant for --publish-tiny")
    args = ap.parse_args(argv)
    Path(args.root).mkdir(parents=True, exist_ok=True)
    if args.publish_tiny:
        sha, _ = publish_tiny_checkpoint(args.root, args.publish_tiny, seed=args.seed, variant=args.variant)
        print(f"published {args.publish_tiny}@{sha} (main)", flush=True)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    server = HubServer(args.root, args.bind, args.port, token=args.token, lfs_redirect=args.lfs_redirect)
    print(f"sandbox hub serving {server.root} on {server.url}"
          + (f" (cdn {server.state.cdn_base})" if server.cdn else ""), flush=True)
    if server.cdn is not None:
        threading.Thread(target=server.cdn.serve_forever, daemon=True).start()
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        server.server_close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
