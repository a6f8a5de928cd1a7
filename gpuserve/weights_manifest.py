"""Checkpoint revisions on disk: manifests, verification records, hashing, what to hardlink or
fetch, space, and which revisions a repository directory holds. Reads and hashes; the only write
is a manifest's (atomic). Staging them on a host (lock, prepare, commit) is :mod:`gpuserve.weights`.

One directory per repository holds its revisions (``gpuserve.layout.model_repo_dir``)::

    <repo dir>/<sha>/                      a COMPLETE revision: every file verified (size + sha256)
    <repo dir>/<sha>/.gpuserve-manifest.json    file -> size, sha256 (+ verification records)
    <repo dir>/<sha>.partial/              a revision being staged: only verified files ...
    <repo dir>/<sha>.partial/.incoming/    ... plus files still in flight (resumable)
    <repo dir>/.gpuserve-weights.lock      flock held while staging or committing

A revision directory without ``.partial`` exists only once every file was verified: staging ends with
an atomic ``rename(<sha>.partial, <sha>)``. That is the contract for the service layer:
``<repo dir>/<sha>/`` exists  <=>  the revision is complete and verified.

Standard library only (Python >= 3.9, no gpuserve imports), like ``weights.py``, which imports it:
hosts run both (the weights layer's command carries this module's source too, and the fan-out
installs it beside ``weights.py``; ``gpuserve.facts.checkpoints.HOST_MODULES``).

Verification records: when a file is verified its (size, mtime_ns, inode, sha256) is recorded in the
manifest. ``verify = "changed"`` (the default) re-hashes only files whose size, mtime or inode differ
from their record; ``"full"`` re-hashes everything. A corruption that leaves size and mtime alone
(a disk's bit rot, or a write followed by restoring the mtime) is found only by ``"full"``.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import stat
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
# A repository directory: which revisions it holds, which files can be hardlinked
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
    return {k: v[0] for k, v in hashed_link_sources(repo_dir, exclude).items()}


def hashed_link_sources(repo_dir: str, exclude: str) -> Dict[str, Tuple[str, str]]:
    """:func:`link_sources` with each file's recorded sha256: content key -> (file, sha256)."""
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
