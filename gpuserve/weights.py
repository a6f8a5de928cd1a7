"""Checkpoint revisions on disk: manifests, what to hardlink or fetch, space, verification.

One directory per repository holds its revisions (``gpuserve.layout.model_repo_dir``)::

    <repo dir>/<sha>/                      a COMPLETE revision: every file verified (size + sha256)
    <repo dir>/<sha>/.gpuserve-manifest.json    file -> size, sha256 (+ verification records)
    <repo dir>/<sha>.partial/              a revision being staged: only verified files ...
    <repo dir>/<sha>.partial/.incoming/    ... plus files still in flight (resumable)
    <repo dir>/.gpuserve-weights.lock      flock held while staging or committing

A revision directory without ``.partial`` exists only once every file was verified: staging ends with
an atomic ``rename(<sha>.partial, <sha>)``. That is the contract for the service layer:
``<repo dir>/<sha>/`` exists  <=>  the revision is complete and verified.

The same code runs in three places, which is why this module is standard library only (Python >= 3.9,
no gpuserve imports): the control node (its download cache has the same layout), each host (the
weights layer sends this file's source over SSH and runs ``python3 - <command>``, see :func:`main`),
and the unit tests.

Verification records: when a file is verified its (size, mtime_ns, inode, sha256) is recorded in the
manifest. ``verify = "changed"`` (the default) re-hashes only files whose size, mtime or inode differ
from their record; ``"full"`` re-hashes everything. A corruption that leaves size and mtime alone
(a disk's bit rot, or a write followed by restoring the mtime) is found only by ``"full"``.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import re
import shutil
import stat
import sys
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from typing import Any, Dict, Iterable, List, Mapping, Optional, Tuple

FORMAT = 1
MANIFEST_NAME = ".gpuserve-manifest.json"
PARTIAL_SUFFIX = ".partial"
INCOMING = ".incoming"
LOCK_NAME = ".gpuserve-weights.lock"
VERIFY_MODES = ("changed", "full")
SHA_RE = re.compile(r"[0-9a-f]{40}")
SHA256_RE = re.compile(r"[0-9a-f]{64}")
CHUNK = 4 << 20
EXIT_SPACE = 3  # what `main` exits with when it refuses for lack of space
EXIT_ERROR = 2


class WeightsError(Exception):
    """Something about a checkpoint revision is wrong; the message says what and where."""


class SpaceError(WeightsError):
    """Not enough free space to stage a revision. Raised before a single byte is fetched."""

    def __init__(self, where: str, path: str, need: int, free: int, margin: int):
        self.where, self.path, self.need, self.free, self.margin = where, path, need, free, margin
        super().__init__(
            f"{where}: refusing to download: {path} has {human(free)} free ({free} bytes), "
            f"the checkpoint needs {human(need)} ({need} bytes) + a margin of {human(margin)} "
            f"(weights_free_margin_gib); free space on that filesystem or lower the margin")


def human(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n} B"  # pragma: no cover


# ------------------------------------------------------------------------------------------------
# Manifests
# ------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class FileSpec:
    """What the hub says one file is. Non-LFS files on a Hugging Face hub carry only the git blob
    sha1; the control node fills in the sha256 once it has verified the bytes."""

    size: int
    sha256: Optional[str] = None
    git_sha1: Optional[str] = None

    def to_json(self) -> Dict[str, Any]:
        out: Dict[str, Any] = {"size": self.size}
        if self.sha256:
            out["sha256"] = self.sha256
        if self.git_sha1:
            out["git_sha1"] = self.git_sha1
        return out


@dataclass(frozen=True)
class Record:
    """A file as it was when last verified."""

    size: int
    mtime_ns: int
    ino: int
    sha256: str

    def fresh(self, st: os.stat_result) -> bool:
        return (stat.S_ISREG(st.st_mode) and st.st_size == self.size
                and st.st_mtime_ns == self.mtime_ns and st.st_ino == self.ino)

    def to_json(self) -> List[Any]:
        return [self.size, self.mtime_ns, self.ino, self.sha256]

    @classmethod
    def from_json(cls, raw: List[Any]) -> "Record":
        return cls(int(raw[0]), int(raw[1]), int(raw[2]), str(raw[3]))

    @classmethod
    def of(cls, st: os.stat_result, sha256: str) -> "Record":
        return cls(st.st_size, st.st_mtime_ns, st.st_ino, sha256)


@dataclass
class Manifest:
    repo: str
    revision: str
    files: Dict[str, FileSpec]
    verified: Dict[str, Record] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not SHA_RE.fullmatch(self.revision):
            raise WeightsError(f"{self.repo}: revision {self.revision!r} is not a 40-hex commit sha")
        if not self.files:
            raise WeightsError(f"{self.repo}@{self.revision}: the revision has no files")
        for path, spec in self.files.items():
            check_relpath(path)
            if spec.size < 0 or not (spec.sha256 or spec.git_sha1):
                raise WeightsError(f"{self.repo}@{self.revision}: {path} has no size or checksum")
            if spec.sha256 and not SHA256_RE.fullmatch(spec.sha256):
                raise WeightsError(f"{self.repo}@{self.revision}: {path}: bad sha256 {spec.sha256!r}")

    @property
    def total_size(self) -> int:
        return sum(f.size for f in self.files.values())

    @property
    def fully_hashed(self) -> bool:
        """Every file has a sha256 (true for manifests the control node has verified)."""
        return all(f.sha256 for f in self.files.values())

    def same_files(self, other: "Manifest") -> bool:
        """Same paths and sizes, and no checksum that both know differs."""
        if set(self.files) != set(other.files):
            return False
        for path, a in self.files.items():
            b = other.files[path]
            if a.size != b.size:
                return False
            if a.sha256 and b.sha256 and a.sha256 != b.sha256:
                return False
            if a.git_sha1 and b.git_sha1 and a.git_sha1 != b.git_sha1:
                return False
        return True

    def to_json(self, records: bool = True) -> Dict[str, Any]:
        out: Dict[str, Any] = {
            "format": FORMAT, "repo": self.repo, "revision": self.revision,
            "files": {p: s.to_json() for p, s in sorted(self.files.items())},
        }
        if records:
            out["verified"] = {p: r.to_json() for p, r in sorted(self.verified.items())}
        return out

    @classmethod
    def from_json(cls, raw: Mapping[str, Any]) -> "Manifest":
        if raw.get("format") != FORMAT:
            raise WeightsError(f"unknown manifest format {raw.get('format')!r}")
        files = {p: FileSpec(int(s["size"]), s.get("sha256"), s.get("git_sha1"))
                 for p, s in raw["files"].items()}
        verified = {p: Record.from_json(r) for p, r in raw.get("verified", {}).items() if p in files}
        return cls(str(raw["repo"]), str(raw["revision"]), files, verified)

    @classmethod
    def from_hub_files(cls, repo: str, revision: str,
                       entries: Iterable[Tuple[str, int, Optional[str], Optional[str]]]) -> "Manifest":
        """From hub metadata: (path, size, sha256 or None, git blob sha1 or None) per file."""
        files = {}
        for path, size, sha256, git_sha1 in entries:
            if size is None:
                raise WeightsError(f"{repo}@{revision}: the hub gave no size for {path}")
            files[path] = FileSpec(int(size), sha256 or None, git_sha1 or None)
        return cls(repo, revision, files)


def check_relpath(path: str) -> None:
    """Refuse paths that could escape a revision directory or clash with gpuserve's own files."""
    parts = path.split("/")
    if (not path or path.startswith("/") or "\\" in path or "\0" in path or "\n" in path
            or any(p in ("", ".", "..") for p in parts) or parts[0].startswith(".")):
        raise WeightsError(f"refusing the file name {path!r} (absolute, '..', or a dot-name at the top)")


def read_manifest(directory: str) -> Optional[Manifest]:
    try:
        with open(os.path.join(directory, MANIFEST_NAME), encoding="utf-8") as fh:
            return Manifest.from_json(json.load(fh))
    except FileNotFoundError:
        return None
    except (ValueError, KeyError, TypeError) as exc:
        raise WeightsError(f"{directory}/{MANIFEST_NAME} is unreadable: {exc}") from exc


def write_manifest(directory: str, manifest: Manifest) -> None:
    """Atomically (write, fsync, rename)."""
    path = os.path.join(directory, MANIFEST_NAME)
    tmp = f"{path}.tmp-{os.getpid()}"
    with open(tmp, "w", encoding="utf-8") as fh:
        json.dump(manifest.to_json(), fh, indent=1, sort_keys=True)
        fh.write("\n")
        fh.flush()
        os.fsync(fh.fileno())
    os.chmod(tmp, 0o644)
    os.replace(tmp, path)


# ------------------------------------------------------------------------------------------------
# Hashing and verification
# ------------------------------------------------------------------------------------------------


def hash_file(path: str, git: bool = False) -> Tuple[str, Optional[str]]:
    """(sha256, git blob sha1 when ``git``) of a file, in one read."""
    size = os.stat(path).st_size
    h256 = hashlib.sha256()
    h1 = hashlib.sha1(b"blob %d\0" % size) if git else None
    with open(path, "rb") as fh:
        while True:
            chunk = fh.read(CHUNK)
            if not chunk:
                break
            h256.update(chunk)
            if h1 is not None:
                h1.update(chunk)
    return h256.hexdigest(), (h1.hexdigest() if h1 is not None else None)


def check_file(path: str, spec: FileSpec) -> Tuple[Optional[Record], str]:
    """(record, "") when ``path`` is what ``spec`` says, else (None, why not)."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return None, "missing"
    if not stat.S_ISREG(st.st_mode):
        return None, "not a regular file"
    if st.st_size != spec.size:
        return None, f"size {st.st_size}, expected {spec.size}"
    sha256, git_sha1 = hash_file(path, git=not spec.sha256)
    if spec.sha256 and sha256 != spec.sha256:
        return None, f"sha256 {sha256}, expected {spec.sha256}"
    if not spec.sha256 and git_sha1 != spec.git_sha1:
        return None, f"git blob sha1 {git_sha1}, expected {spec.git_sha1}"
    return Record.of(os.stat(path), sha256), ""


def audit(directory: str, manifest: Manifest, mode: str) -> Tuple[List[str], Dict[str, Record]]:
    """Check a revision directory against its manifest.

    Returns (broken paths, records to update): ``"changed"`` re-hashes only files whose record is
    missing or no longer matches the file's size/mtime/inode; ``"full"`` re-hashes every file. A
    re-hashed file that is still good comes back as a record to update (its stat changed).
    """
    if mode not in VERIFY_MODES:
        raise WeightsError(f"verify mode must be one of {VERIFY_MODES}, not {mode!r}")
    broken: List[str] = []
    refreshed: Dict[str, Record] = {}
    for path, spec in sorted(manifest.files.items()):
        full = os.path.join(directory, path)
        rec = manifest.verified.get(path)
        if mode == "changed" and rec is not None and (not spec.sha256 or rec.sha256 == spec.sha256):
            try:
                if rec.fresh(os.lstat(full)):
                    continue
            except FileNotFoundError:
                broken.append(path)
                continue
        new, _why = check_file(full, spec)
        if new is None:
            broken.append(path)
        elif new != rec:
            refreshed[path] = new
    return broken, refreshed


# ------------------------------------------------------------------------------------------------
# Planning: what to hardlink, what to fetch, how much space
# ------------------------------------------------------------------------------------------------


@dataclass
class FetchPlan:
    link: Dict[str, str]  # path -> an existing verified file with the same content
    transfer: List[str]  # paths to fetch
    need_bytes: int  # new bytes on disk (what links cost nothing; resumed bytes are counted as had)

    def to_json(self) -> Dict[str, Any]:
        return {"link": self.link, "transfer": self.transfer, "need_bytes": self.need_bytes}


def plan_fetch(manifest: Manifest, have: Iterable[str], links: Mapping[str, str],
               incoming: Mapping[str, int]) -> FetchPlan:
    """Which files of ``manifest`` to hardlink and which to fetch.

    ``have``: paths already verified in place; ``links``: sha256 -> path of a verified file with that
    content (another revision of the same repository); ``incoming``: bytes already received of a file
    being fetched (a resumable transfer). Files without a sha256 (small non-LFS files before the
    control node hashed them) are always fetched.
    """
    have = set(have)
    link: Dict[str, str] = {}
    transfer: List[str] = []
    need = 0
    for path, spec in sorted(manifest.files.items()):
        if path in have:
            continue
        src = links.get(content_key(spec))
        if src is not None:
            link[path] = src
            continue
        transfer.append(path)
        got = incoming.get(path, 0)
        need += spec.size - (got if 0 <= got <= spec.size else 0)
    return FetchPlan(link, transfer, need)


def free_bytes(path: str) -> Tuple[int, str]:
    """(bytes this user may still write, the directory measured). Measured at the nearest existing
    ancestor of ``path``, so a directory that does not exist yet is measured where it will live."""
    probe = os.path.abspath(path)
    while not os.path.exists(probe):
        parent = os.path.dirname(probe)
        if parent == probe:
            break
        probe = parent
    st = os.statvfs(probe)
    return st.f_bavail * st.f_frsize, probe


def check_space(where: str, path: str, need: int, free: int, margin: int) -> None:
    """Raise SpaceError when ``need`` bytes (> 0) do not fit in ``free`` with ``margin`` to spare."""
    if need > 0 and free < need + margin:
        raise SpaceError(where, path, need, free, margin)


# ------------------------------------------------------------------------------------------------
# A repository directory: state, staging, committing
# ------------------------------------------------------------------------------------------------


def final_dir(repo_dir: str, sha: str) -> str:
    return os.path.join(repo_dir, sha)


def partial_dir(repo_dir: str, sha: str) -> str:
    return os.path.join(repo_dir, sha + PARTIAL_SUFFIX)


def complete_revisions(repo_dir: str) -> List[str]:
    """Shas of the complete revisions in ``repo_dir`` (a manifest inside, no ``.partial``)."""
    try:
        names = os.listdir(repo_dir)
    except FileNotFoundError:
        return []
    return sorted(n for n in names if SHA_RE.fullmatch(n)
                  and os.path.isfile(os.path.join(repo_dir, n, MANIFEST_NAME)))


def partial_revisions(repo_dir: str) -> List[str]:
    try:
        names = os.listdir(repo_dir)
    except FileNotFoundError:
        return []
    return sorted(n[: -len(PARTIAL_SUFFIX)] for n in names if n.endswith(PARTIAL_SUFFIX)
                  and SHA_RE.fullmatch(n[: -len(PARTIAL_SUFFIX)]))


def link_sources(repo_dir: str, exclude: str = "") -> Dict[str, str]:
    """Content key -> a file in another complete revision whose verification record still holds
    (stat only, nothing is hashed). Only such files are hardlinked into a new revision. Keys are
    the sha256, and ``git:<blob sha1>`` for files the hub knows only by their git id."""
    return {k: v[0] for k, v in _link_sources(repo_dir, exclude).items()}


def _link_sources(repo_dir: str, exclude: str) -> Dict[str, Tuple[str, str]]:
    out: Dict[str, Tuple[str, str]] = {}
    for sha in complete_revisions(repo_dir):
        if sha == exclude:
            continue
        try:
            manifest = read_manifest(final_dir(repo_dir, sha))
        except WeightsError:
            continue
        if manifest is None:
            continue
        for path, rec in manifest.verified.items():
            full = os.path.join(repo_dir, sha, path)
            try:
                if not rec.fresh(os.lstat(full)):
                    continue
            except FileNotFoundError:
                continue
            out.setdefault(rec.sha256, (full, rec.sha256))
            git = manifest.files[path].git_sha1
            if git:
                out.setdefault(f"git:{git}", (full, rec.sha256))
    return out


def content_key(spec: FileSpec) -> str:
    return spec.sha256 or f"git:{spec.git_sha1}"


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
        full_links = _link_sources(repo_dir, sha)
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
