"""Checkpoint revisions staged on a host: the lock, scan, prepare, commit, accept a file, fetch over
HTTP, and the command line the control node drives a host with.

The revisions themselves (manifests, verification records, hashing, the plan, space, the directory
layout and its contract: ``<repo dir>/<sha>/`` exists <=> complete and verified) are
:mod:`gpuserve.weights_manifest`; this module re-exports its names, so ``weights.Manifest`` and the
like are the one way in for its users.

The same code runs in three places, which is why both modules are standard library only (Python >=
3.9, no gpuserve imports but each other): the control node (its download cache has the same layout),
each host, and the unit tests. A host gets no gpuserve install: the weights layer's command carries
both modules' source and runs this one's :func:`main` with ``python3 -c`` (``scan``, ``prepare``,
``commit``, ``fetch``; ``gpuserve.facts.checkpoints``), and the fan-out installs both beside
``fanout_agent.py`` (``gpuserve.layout.AGENT_DIR``), where this module imports the other from beside
itself.
"""

from __future__ import annotations

import fcntl
import json
import os
import shutil
import stat
import sys
import time
import urllib.error
import urllib.request
from typing import Any, Dict, Iterable, List, Mapping, Optional, Tuple

try:
    from gpuserve.weights_manifest import (  # noqa: F401 - re-exported
        CHUNK, FORMAT, INCOMING, LOCK_NAME, MANIFEST_NAME, PARTIAL_SUFFIX, SHA256_RE, SHA_RE, VERIFY_MODES,
        FetchPlan, FileSpec, Manifest, Record, SpaceError, WeightsError, audit, check_file, check_relpath,
        check_space, complete_revisions, content_key, final_dir, free_bytes, hash_file, hashed_link_sources,
        human, link_sources, partial_dir, partial_revisions, plan_fetch, read_manifest, write_manifest)
except ImportError:  # on a host: beside this file, or loaded by the command that carries both
    from weights_manifest import (  # type: ignore[no-redef]  # noqa: F401 - re-exported
        CHUNK, FORMAT, INCOMING, LOCK_NAME, MANIFEST_NAME, PARTIAL_SUFFIX, SHA256_RE, SHA_RE, VERIFY_MODES,
        FetchPlan, FileSpec, Manifest, Record, SpaceError, WeightsError, audit, check_file, check_relpath,
        check_space, complete_revisions, content_key, final_dir, free_bytes, hash_file, hashed_link_sources,
        human, link_sources, partial_dir, partial_revisions, plan_fetch, read_manifest, write_manifest)

EXIT_SPACE = 3  # what `main` exits with when it refuses for lack of space
EXIT_ERROR = 2


class _Lock:
    """flock on the repository directory's lock file, failing fast when another sync holds it."""

    def __init__(self, repo_dir: str, wait: float = 0):
        os.makedirs(repo_dir, exist_ok=True)
        self.path = os.path.join(repo_dir, LOCK_NAME)
        self.fh = None
        self.wait = wait  # seconds to wait for another holder (the fan-out agent's short holds)

    def __enter__(self) -> "_Lock":
        self.fh = open(self.path, "a")
        deadline = time.monotonic() + self.wait
        while True:
            try:
                fcntl.flock(self.fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
                return self
            except BlockingIOError:
                if time.monotonic() < deadline:
                    time.sleep(0.05)
                    continue
                self.fh.close()
                raise WeightsError(f"another gpuserve weights sync holds {self.path}; run one "
                                   "converge per host at a time") from None

    def __exit__(self, *exc: Any) -> None:
        fcntl.flock(self.fh, fcntl.LOCK_UN)
        self.fh.close()


def _incoming_sizes(incoming_dir: str, manifest: Manifest) -> Dict[str, int]:
    """Sizes of files being received; anything that cannot be resumed (too long, hardlinked,
    not a file) is removed so a transfer never writes through into another revision."""
    sizes: Dict[str, int] = {}
    for path, spec in manifest.files.items():
        full = os.path.join(incoming_dir, path)
        try:
            st = os.lstat(full)
        except FileNotFoundError:
            continue
        if not stat.S_ISREG(st.st_mode) or st.st_nlink > 1 or st.st_size > spec.size:
            _remove(full)
            continue
        sizes[path] = st.st_size
    return sizes


def _remove(path: str) -> None:
    if os.path.isdir(path) and not os.path.islink(path):
        shutil.rmtree(path)
    else:
        try:
            os.unlink(path)
        except FileNotFoundError:
            pass


def _fsync_dir(path: str) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _link_into(src: str, dst: str) -> None:
    os.makedirs(os.path.dirname(dst), exist_ok=True)
    tmp = f"{dst}.gpuserve-link-{os.getpid()}"
    _remove(tmp)
    os.link(src, tmp)
    os.replace(tmp, dst)


def scan(repo_dir: str, sha: str, verify: str = "changed") -> Dict[str, Any]:
    """The state of one revision (what the weights layer's pyinfra fact returns). Reads only,
    except for hashing files whose records do not hold (``verify="full"``: every file)."""
    free, measured = free_bytes(repo_dir)
    out: Dict[str, Any] = {
        "repo_dir": repo_dir, "revision": sha, "free_bytes": free, "free_path": measured,
        "complete": complete_revisions(repo_dir), "partials": partial_revisions(repo_dir),
        "status": "absent", "broken": [], "refresh": [], "have": [], "incoming": {}, "links": {},
    }
    final, stage = final_dir(repo_dir, sha), partial_dir(repo_dir, sha)
    if sha in out["complete"]:
        manifest = read_manifest(final)
        assert manifest is not None
        broken, refreshed = audit(final, manifest, verify)
        out.update(status="complete", broken=broken, refresh=sorted(refreshed),
                   files=len(manifest.files), total_size=manifest.total_size)
    elif os.path.isdir(stage):
        out["status"] = "partial"
        staged = read_manifest(stage)
        if staged is not None:
            out["have"] = sorted(p for p, rec in staged.verified.items()
                                 if _fresh(os.path.join(stage, p), rec))
            out["incoming"] = _sizes_only(os.path.join(stage, INCOMING), staged)
    out["links"] = {h: os.path.relpath(p, repo_dir) for h, p in link_sources(repo_dir, sha).items()}
    return out


def _fresh(path: str, rec: Record) -> bool:
    try:
        return rec.fresh(os.lstat(path))
    except FileNotFoundError:
        return False


def _sizes_only(incoming_dir: str, manifest: Manifest) -> Dict[str, int]:
    sizes = {}
    for path in manifest.files:
        try:
            sizes[path] = os.lstat(os.path.join(incoming_dir, path)).st_size
        except FileNotFoundError:
            pass
    return sizes


def prepare(repo_dir: str, manifest: Manifest, *, margin: int = 0, where: str = "host",
            broken: Iterable[str] = ()) -> Dict[str, Any]:
    """Get ready to fetch the files ``manifest`` needs in ``repo_dir``; returns what to transfer.

    New revision: stage in ``<sha>.partial/``, hardlink every file another complete revision already
    has, keep what an interrupted run verified or half-received. Complete revision (repair): find the
    broken files (``broken`` from a full audit, plus a cheap audit here) and stage only those.
    Partials of other revisions are removed (one revision is staged per repository at a time; a
    complete revision is never touched here). Refuses (SpaceError) before anything is fetched when
    the files to fetch do not fit with ``margin`` bytes to spare.
    """
    sha = manifest.revision
    final, stage = final_dir(repo_dir, sha), partial_dir(repo_dir, sha)
    with _Lock(repo_dir):
        removed = _remove_other_partials(repo_dir, sha)
        full_links = hashed_link_sources(repo_dir, sha)
        links = {k: v[0] for k, v in full_links.items()}
        if os.path.isfile(os.path.join(final, MANIFEST_NAME)):
            mode = "repair"
            recorded, bad, refreshed = _audit_complete(final, manifest, where, broken)
            # A broken file's inode, which other revisions may share, is no source for a hardlink.
            bad_inodes = {_ino(os.path.join(final, p)) for p in bad}
            links = {k: p for k, p in links.items() if _ino(p) not in bad_inodes}
            have = [p for p in recorded.files if p not in bad]
            if not bad:
                if os.path.isdir(stage):
                    shutil.rmtree(stage)
                return {"mode": mode, "transfer": [], "link": 0, "need_bytes": 0,
                        "removed_partials": removed, "refreshed": sorted(refreshed)}
        else:
            mode = "new"
            recorded, have = _staged(stage, manifest)
        incoming_dir = os.path.join(stage, INCOMING)
        incoming = _incoming_sizes(incoming_dir, manifest) if os.path.isdir(incoming_dir) else {}
        plan = plan_fetch(manifest, have, links, incoming)
        free, measured = free_bytes(repo_dir)
        check_space(where, measured, plan.need_bytes, free, margin)  # before anything is staged
        os.makedirs(incoming_dir, exist_ok=True)
        for path, src in plan.link.items():
            if mode == "new":
                _link_into(src, os.path.join(stage, path))
                sha256 = full_links[content_key(manifest.files[path])][1]
                recorded.verified[path] = Record.of(os.lstat(src), sha256)
            else:
                _link_into(src, os.path.join(incoming_dir, path))  # committed like a fetched file
        if mode == "new":
            write_manifest(stage, recorded)
        return {"mode": mode, "transfer": plan.transfer, "link": len(plan.link),
                "need_bytes": plan.need_bytes, "free_bytes": free, "removed_partials": removed,
                "incoming": incoming_dir}


def _remove_other_partials(repo_dir: str, sha: str) -> List[str]:
    """Remove the partials of every other revision (one is staged per repository at a time)."""
    removed = []
    for other in partial_revisions(repo_dir):
        if other != sha:
            shutil.rmtree(partial_dir(repo_dir, other))
            removed.append(other)
    return removed


def _audit_complete(final: str, manifest: Manifest, where: str,
                    broken: Iterable[str]) -> Tuple[Manifest, List[str], Dict[str, Record]]:
    """A complete revision's manifest after a cheap audit, its broken files (the audit's and
    ``broken``) and the records the audit refreshed. A broken file is unverified until replaced
    (commit then waits for it); the manifest is written when anything changed."""
    sha = manifest.revision
    recorded = read_manifest(final)
    assert recorded is not None
    if not recorded.same_files(manifest):
        raise WeightsError(f"{where}: {final} holds other files than the hub lists for "
                           f"{manifest.repo}@{sha}; move it away and converge again")
    bad, refreshed = audit(final, recorded, "changed")
    bad = sorted(set(bad) | set(broken))
    recorded.verified.update(refreshed)
    for path in bad:
        recorded.verified.pop(path, None)
    if refreshed or bad:
        write_manifest(final, recorded)
    return recorded, bad, refreshed


def _staged(stage: str, manifest: Manifest) -> Tuple[Manifest, List[str]]:
    """A new revision's manifest with what an interrupted run verified in ``stage`` and is still
    fresh, and those files; a stage that is not ours, or for other files, is removed first."""
    staged = read_manifest(stage) if os.path.isdir(stage) else None
    if os.path.isdir(stage) and (staged is None or not staged.same_files(manifest)):
        shutil.rmtree(stage)  # not ours, or for other files: start over
        staged = None
    recorded = Manifest(manifest.repo, manifest.revision, dict(manifest.files),
                        dict(staged.verified) if staged else {})
    have = [p for p, rec in recorded.verified.items() if _fresh(os.path.join(stage, p), rec)]
    recorded.verified = {p: recorded.verified[p] for p in have}
    return recorded, have


def commit(repo_dir: str, manifest: Manifest) -> Dict[str, Any]:
    """Verify what arrived in ``<sha>.partial/.incoming/`` and move it into place.

    A new revision is renamed to ``<sha>/`` once every file is verified. A repaired file replaces the
    broken one atomically (``rename`` over it) and hardlinks to the broken inode in other complete
    revisions (the rollback copy shares unchanged files) are pointed at the repaired file too.
    Bad files are deleted (fetched again next time) and reported.
    """
    sha = manifest.revision
    final, stage = final_dir(repo_dir, sha), partial_dir(repo_dir, sha)
    incoming_dir = os.path.join(stage, INCOMING)
    with _Lock(repo_dir):
        repair = os.path.isfile(os.path.join(final, MANIFEST_NAME))
        target = final if repair else stage
        if not os.path.isdir(target):
            raise WeightsError(f"nothing staged for {manifest.repo}@{sha} in {repo_dir}")
        recorded = read_manifest(target) or Manifest(manifest.repo, sha, dict(manifest.files))
        files = dict(manifest.files)
        for path, spec in recorded.files.items():  # keep what the other side learnt (sha256s)
            if spec.sha256 and not files[path].sha256:
                files[path] = FileSpec(files[path].size, spec.sha256, files[path].git_sha1)
        verified, bad, relinked = [], [], []
        for path, spec in sorted(files.items()):
            src = os.path.join(incoming_dir, path)
            if not os.path.lexists(src):
                continue
            rec, why = check_file(src, spec)
            if rec is None:
                _remove(src)
                bad.append({"path": path, "reason": why})
                continue
            dst = os.path.join(target, path)
            old_ino = _ino(dst) if repair else None
            os.makedirs(os.path.dirname(dst), exist_ok=True)
            os.chmod(src, 0o644)
            os.replace(src, dst)
            recorded.verified[path] = rec
            files[path] = FileSpec(spec.size, rec.sha256, spec.git_sha1)
            verified.append(path)
            if old_ino is not None:
                relinked += _relink_others(repo_dir, sha, old_ino, dst, rec)
        recorded.files = files
        still = [p for p in files if p not in recorded.verified
                 or not _fresh(os.path.join(target, p), recorded.verified[p])]
        complete = False
        if repair:
            write_manifest(final, recorded)
            if not still and os.path.isdir(stage):
                shutil.rmtree(stage)
            complete = not still
        else:
            write_manifest(stage, recorded)
            if not still:
                if os.path.isdir(incoming_dir):
                    shutil.rmtree(incoming_dir)
                _fsync_dir(stage)
                os.rename(stage, final)
                _fsync_dir(repo_dir)
                complete = True
        return {"mode": "repair" if repair else "new", "complete": complete, "verified": verified,
                "bad": bad, "missing": sorted(still), "relinked": relinked,
                "directory": final if complete else stage}


def accept_file(repo_dir: str, manifest: Manifest, src: str, path: str) -> Dict[str, Any]:
    """Verify one received file (``src``, complete in size) of a revision being staged and move it
    into ``<sha>.partial/<path>``: from then on it is served onward (the fan-out forwards a shard as
    soon as it is verified, while other files are still in flight, which :func:`commit` would
    delete). Returns ``{"ok": bool, "reason": str}``; a bad file is deleted. A file already verified
    there (it came twice, from two sources) is dropped and reported ``ok`` with reason ``dup``."""
    sha = manifest.revision
    stage = partial_dir(repo_dir, sha)
    spec = manifest.files[path]
    rec, why = check_file(src, spec)  # hashing outside the lock: other stripes go on meanwhile
    with _Lock(repo_dir, wait=60):
        if not os.path.isdir(stage):
            _remove(src)
            return {"ok": os.path.isdir(final_dir(repo_dir, sha)), "reason": "no partial"}
        recorded = read_manifest(stage) or Manifest(manifest.repo, sha, dict(manifest.files))
        have = recorded.verified.get(path)
        if have is not None and _fresh(os.path.join(stage, path), have):
            _remove(src)
            return {"ok": True, "reason": "dup"}
        if rec is None:
            _remove(src)
            return {"ok": False, "reason": why}
        dst = os.path.join(stage, path)
        os.makedirs(os.path.dirname(dst), exist_ok=True)
        os.chmod(src, 0o644)
        os.replace(src, dst)
        recorded.verified[path] = Record.of(os.lstat(dst), rec.sha256)
        write_manifest(stage, recorded)
        return {"ok": True, "reason": "verified"}


def _ino(path: str) -> Optional[int]:
    try:
        return os.lstat(path).st_ino
    except FileNotFoundError:
        return None


def _relink_others(repo_dir: str, sha: str, old_ino: int, good: str, rec: Record) -> List[str]:
    """Point other revisions' hardlinks to a replaced (broken) inode at the repaired file."""
    out = []
    for other in complete_revisions(repo_dir):
        if other == sha:
            continue
        other_dir = final_dir(repo_dir, other)
        manifest = read_manifest(other_dir)
        if manifest is None:
            continue
        changed = False
        for path, spec in manifest.files.items():
            full = os.path.join(other_dir, path)
            if _ino(full) == old_ino and spec.sha256 == rec.sha256:
                _link_into(good, full)
                manifest.verified[path] = rec
                out.append(f"{other}/{path}")
                changed = True
        if changed:
            write_manifest(other_dir, manifest)
    return out


# ------------------------------------------------------------------------------------------------
# Fetching over HTTP on a host (weights_fanout = "hub")
# ------------------------------------------------------------------------------------------------


def http_fetch(url_base: str, incoming_dir: str, paths: Iterable[str], sizes: Mapping[str, int], *,
               bwlimit_kib: Optional[int] = None, timeout: float = 60) -> Dict[str, Any]:
    """GET ``<url_base>/<path>`` into ``incoming_dir/<path>`` for each path, resuming a partial
    file with a Range request. Raises WeightsError naming the file on any HTTP error."""
    received = 0
    for path in paths:
        dst = os.path.join(incoming_dir, path)
        os.makedirs(os.path.dirname(dst), exist_ok=True)
        have = os.path.getsize(dst) if os.path.exists(dst) else 0
        if have >= sizes[path]:
            continue
        url = f"{url_base}/{urllib.request.quote(path)}"
        req = urllib.request.Request(url, headers={"User-Agent": "gpuserve-weights/1",
                                                   **({"Range": f"bytes={have}-"} if have else {})})
        try:
            with urllib.request.urlopen(req, timeout=timeout) as resp:  # noqa: S310 - http(s) only
                if have and resp.status != 206:
                    have = 0  # the server ignored the range: start over
                with open(dst, "ab" if have else "wb") as fh:
                    t0, got = time.monotonic(), 0
                    while True:
                        chunk = resp.read(1 << 20 if not bwlimit_kib else max(1024, bwlimit_kib * 256))
                        if not chunk:
                            break
                        fh.write(chunk)
                        got += len(chunk)
                        if bwlimit_kib:
                            ahead = got / (bwlimit_kib * 1024) - (time.monotonic() - t0)
                            if ahead > 0:
                                time.sleep(ahead)
                    received += got
        except urllib.error.HTTPError as exc:
            raise WeightsError(f"GET {url}: HTTP {exc.code} {exc.reason}") from exc
        except (urllib.error.URLError, OSError) as exc:
            raise WeightsError(f"GET {url}: {exc}") from exc
    return {"received": received}


# ------------------------------------------------------------------------------------------------
# Command line (how the control node drives a host: python3 - <command> with a JSON request)
# ------------------------------------------------------------------------------------------------


def main(argv: List[str]) -> int:
    """``scan REPO_DIR SHA VERIFY`` | ``prepare`` | ``commit`` | ``fetch`` (JSON on stdin).

    Prints one JSON object. Exit 0 on success, EXIT_SPACE when refusing for space, EXIT_ERROR with
    {"error": ...} otherwise.
    """
    try:
        cmd = argv[0] if argv else ""
        if cmd == "scan":
            result = scan(argv[1], argv[2], argv[3] if len(argv) > 3 else "changed")
        else:
            req = json.loads(sys.stdin.read())
            manifest = Manifest.from_json(req["manifest"])
            if cmd == "prepare":
                result = prepare(req["repo_dir"], manifest, margin=int(req.get("margin", 0)),
                                 where=req.get("where", "host"), broken=req.get("broken", ()))
            elif cmd == "commit":
                result = commit(req["repo_dir"], manifest)
            elif cmd == "fetch":
                incoming = os.path.join(partial_dir(req["repo_dir"], manifest.revision), INCOMING)
                result = http_fetch(req["url_base"], incoming, req["paths"],
                                    {p: s.size for p, s in manifest.files.items()},
                                    bwlimit_kib=req.get("bwlimit_kib"))
            else:
                raise WeightsError(f"unknown command {cmd!r}")
    except SpaceError as exc:
        print(json.dumps({"error": str(exc), "space": True}))
        return EXIT_SPACE
    except (WeightsError, OSError) as exc:
        print(json.dumps({"error": f"{type(exc).__name__}: {exc}" if isinstance(exc, OSError)
                          else str(exc)}))
        return EXIT_ERROR
    print(json.dumps(result, sort_keys=True))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
