"""The control node's side of the weights layer: resolve, list, download once, verify.

* :func:`resolve` turns a branch or tag into the 40-hex commit sha to pin (``gpuserve resolve``).
* :func:`hub_manifest` reads a pinned revision's files (size, sha256 / git blob sha1) from the hub's
  metadata, with the real ``huggingface_hub`` client pointed at ``hf_endpoint``.
* :func:`stage` downloads a revision ONCE into the control node's cache (``weights_cache``, same
  layout as on hosts: ``<cache>/<org>--<name>/<sha>/``), hardlinking files an earlier cached revision
  already has, and verifies every file's sha256 itself: ``huggingface_hub`` accepts a same-size
  corrupt body (docs/sandbox-engine.md). Hosts then copy from this cache over SSH.
* :func:`fleet_manifest` / :func:`fleet_stage` do the above once per run and repository revision,
  whatever the number of hosts (pyinfra runs hosts in greenlets: a lock per revision makes the others
  wait for the first, and a failure is remembered so the hub is not asked again by every host).

Sources: ``huggingface`` (any HF_ENDPOINT-compatible mirror), ``modelscope`` (needs the optional
``modelscope`` package on the control node), ``local`` (a directory on the control node, hashed once;
its manifest is cached beside the download cache).
"""

from __future__ import annotations

import json
import os
import threading
from dataclasses import dataclass
from typing import Any, Callable

import click

from gpuserve import weights as w

DEFAULT_CACHE = "~/.cache/gpuserve/checkpoints"
HF_DEFAULT_ENDPOINT = "https://huggingface.co"
RETRIES = 2  # downloads of one file whose bytes fail verification, before giving up

Log = Callable[[str], None]


class CheckpointError(Exception):
    """A revision could not be resolved, listed or staged; the message names repo, file, source."""


@dataclass(frozen=True)
class Source:
    kind: str  # huggingface | modelscope | local
    repo: str
    endpoint: str | None = None  # huggingface: the hub or mirror (None: huggingface_hub's default)
    local_path: str | None = None  # local: the checkpoint directory on the control node

    @classmethod
    def of(cls, settings: Any) -> Source:
        """From a :class:`gpuserve.config.HostSettings`."""
        return cls(settings.model_source, settings.model_repo, settings.hf_endpoint,
                   settings.model_local_path)

    def describe(self) -> str:
        if self.kind == "local":
            return f"{self.repo} (local directory {self.local_path})"
        if self.kind == "modelscope":
            return f"{self.repo} on ModelScope"
        return f"{self.repo} on {self.endpoint or HF_DEFAULT_ENDPOINT}"

    def resolve_url(self, sha: str) -> str:
        """Base URL of the revision's files for a plain HTTP client (hosts with weights_fanout=hub)."""
        if self.kind != "huggingface":
            raise CheckpointError(f"{self.describe()}: hosts can download directly only from a "
                                  "Hugging Face compatible hub")
        return f"{(self.endpoint or HF_DEFAULT_ENDPOINT).rstrip('/')}/{self.repo}/resolve/{sha}"


def cache_root(path: str | None) -> str:
    return os.path.abspath(os.path.expanduser(path or DEFAULT_CACHE))


def cache_repo_dir(root: str, repo: str) -> str:
    return os.path.join(cache_root(root), repo.replace("/", "--"))


# --------------------------------------------------------------------------------------------------
# Resolving and listing
# --------------------------------------------------------------------------------------------------


def _hf_api(source: Source):
    from huggingface_hub import HfApi

    return HfApi(endpoint=source.endpoint)


def _hf_errors() -> tuple[type[BaseException], ...]:
    from huggingface_hub.errors import HfHubHTTPError

    try:  # huggingface_hub 2.x talks httpx2; its connection errors are not HfHubHTTPError
        from httpx2 import HTTPError as TransportError
    except ImportError:  # pragma: no cover - another huggingface_hub build
        from httpx import HTTPError as TransportError

    return (HfHubHTTPError, TransportError, OSError, ValueError)


def _modelscope_api() -> Any:
    try:
        from modelscope.hub.api import HubApi
    except ImportError:
        raise CheckpointError("model_source 'modelscope' needs the modelscope package on the control "
                              "node (pip install modelscope); it is not a gpuserve dependency") from None
    return HubApi()


def resolve(source: Source, revision: str) -> str:
    """The commit sha a branch, tag or sha names now (asks the hub; a local source cannot resolve)."""
    if source.kind == "local":
        if w.SHA_RE.fullmatch(revision):
            return revision
        raise CheckpointError(f"{source.describe()}: a local directory has no branches; pin a 40-hex "
                              "revision (the id you give that copy of the checkpoint)")
    if source.kind == "modelscope":
        api = _modelscope_api()
        try:
            history = api.list_repo_commits(source.repo, revision=revision, page_size=1)
            sha = history.commits[0].id
        except Exception as exc:  # noqa: BLE001 - the client raises many kinds
            raise CheckpointError(f"resolving {source.describe()} @ {revision}: {exc}") from exc
    else:
        try:
            sha = _hf_api(source).model_info(source.repo, revision=revision).sha
        except _hf_errors() as exc:
            raise CheckpointError(f"resolving {source.describe()} @ {revision}: {exc}") from exc
    if not (isinstance(sha, str) and w.SHA_RE.fullmatch(sha)):
        raise CheckpointError(f"{source.describe()} @ {revision}: the hub answered {sha!r}, not a sha")
    return sha


def hub_manifest(source: Source, sha: str) -> w.Manifest:
    """What the hub says the files of ``sha`` are. Top-level dotfiles (.gitattributes) are skipped."""
    if source.kind == "local":
        raise CheckpointError("a local source has no hub metadata; use local_manifest")
    if source.kind == "modelscope":
        api = _modelscope_api()
        try:
            listed = api.get_model_files(source.repo, revision=sha, recursive=True)
        except Exception as exc:  # noqa: BLE001
            raise CheckpointError(f"listing {source.describe()} @ {sha}: {exc}") from exc
        entries = [(f["Path"], f.get("Size"), (f.get("Sha256") or "").lower() or None, None)
                   for f in listed if f.get("Type", "blob") == "blob"]
    else:
        try:
            info = _hf_api(source).model_info(source.repo, revision=sha, files_metadata=True)
        except _hf_errors() as exc:
            raise CheckpointError(f"listing {source.describe()} @ {sha}: {exc}") from exc
        if info.sha != sha:
            raise CheckpointError(f"{source.describe()}: asked for revision {sha}, the hub answered "
                                  f"for {info.sha}")
        entries = [(s.rfilename, s.size, s.lfs.sha256 if s.lfs else None, s.blob_id)
                   for s in info.siblings or []]
    entries = [e for e in entries if not e[0].split("/")[0].startswith(".")]
    try:
        return w.Manifest.from_hub_files(source.repo, sha, entries)
    except w.WeightsError as exc:
        raise CheckpointError(f"{source.describe()} @ {sha}: {exc}") from exc


def local_manifest(source: Source, sha: str, root: str) -> w.Manifest:
    """Hash the local checkpoint directory; records are kept in the cache, so a re-run re-hashes only
    files whose size, mtime or inode changed. A directory that is itself a gpuserve revision (it holds
    a .gpuserve-manifest.json, e.g. copied from a host) must be for ``sha``."""
    src = source.local_path or ""
    if not os.path.isdir(src):
        raise CheckpointError(f"{source.describe()}: not a directory on this control node")
    name = os.path.basename(os.path.normpath(src))
    if w.SHA_RE.fullmatch(name) and name != sha:
        raise CheckpointError(f"{source.describe()}: the directory is named after revision {name}, "
                              f"but model_revision is {sha}")
    own = w.read_manifest(src)
    if own is not None and own.revision != sha:
        raise CheckpointError(f"{source.describe()}: its manifest is for revision {own.revision}, "
                              f"not {sha}")
    memo_dir = cache_repo_dir(root, source.repo)
    os.makedirs(memo_dir, exist_ok=True)
    memo_path = os.path.join(memo_dir, f".local-{sha}.json")
    try:
        with open(memo_path, encoding="utf-8") as fh:
            memo = {p: w.Record.from_json(r) for p, r in json.load(fh).items()}
    except (FileNotFoundError, ValueError):
        memo = {}
    files, records = {}, {}
    for dirpath, dirnames, filenames in os.walk(src):
        rel_dir = os.path.relpath(dirpath, src)
        dirnames[:] = sorted(d for d in dirnames if not (rel_dir == "." and d.startswith(".")))
        for fn in sorted(filenames):
            rel = fn if rel_dir == "." else f"{rel_dir}/{fn}"
            if rel_dir == "." and fn.startswith("."):
                continue
            full = os.path.join(dirpath, fn)
            st = os.stat(full)
            rec = memo.get(rel)
            if rec is None or not rec.fresh(st):
                rec = w.Record.of(st, w.hash_file(full)[0])
            files[rel] = w.FileSpec(rec.size, rec.sha256)
            records[rel] = rec
    if not files:
        raise CheckpointError(f"{source.describe()}: the directory holds no files")
    tmp = f"{memo_path}.tmp-{os.getpid()}"
    with open(tmp, "w", encoding="utf-8") as fh:
        json.dump({p: r.to_json() for p, r in records.items()}, fh)
    os.replace(tmp, memo_path)
    manifest = w.Manifest(source.repo, sha, files)
    if own is not None and not own.same_files(manifest):
        raise CheckpointError(f"{source.describe()}: files differ from its own manifest")
    return manifest


# --------------------------------------------------------------------------------------------------
# Downloading into the control node's cache
# --------------------------------------------------------------------------------------------------


def _quiet_progress() -> type:
    """No progress bars (pyinfra owns the terminal) and no tqdm monitor thread: a thread started
    before pyinfra's gevent monkey-patching breaks its locks later in the same process."""
    from tqdm.auto import tqdm

    class Quiet(tqdm):  # type: ignore[misc, valid-type]
        monitor_interval = 0

        def __init__(self, *args: Any, **kwargs: Any) -> None:
            kwargs["disable"] = True
            super().__init__(*args, **kwargs)

    return Quiet


def _download(source: Source, path: str, sha: str, incoming: str, root: str) -> None:
    """One file into ``incoming/<path>`` with the source's own client."""
    if source.kind == "modelscope":
        _modelscope_api()
        from modelscope.hub.file_download import model_file_download

        try:
            model_file_download(source.repo, path, revision=sha, local_dir=incoming)
        except Exception as exc:  # noqa: BLE001
            raise CheckpointError(f"downloading {source.describe()} @ {sha} file {path}: {exc}") from exc
        return
    from huggingface_hub import hf_hub_download

    try:
        hf_hub_download(source.repo, path, revision=sha, local_dir=incoming, endpoint=source.endpoint,
                        force_download=True, cache_dir=os.path.join(cache_root(root), ".hf-hub-cache"),
                        tqdm_class=_quiet_progress())
    except _hf_errors() as exc:
        raise CheckpointError(f"downloading {source.describe()} @ {sha} file {path}: {exc}") from exc


def stage(source: Source, manifest: w.Manifest, root: str, log: Log = lambda _m: None) -> tuple[str, w.Manifest]:
    """Make revision ``manifest.revision`` complete and verified in the control node's cache.

    Returns (directory hosts copy from, manifest with every sha256). Resumes what an interrupted run
    left (verified files are kept; the hub client cannot resume a half file across processes), hardlinks
    files another cached revision has, refuses before downloading when the cache's filesystem lacks
    the space, and fetches a file again when its bytes fail verification (RETRIES times).
    A ``local`` source is not copied: its directory is the source (after hashing).
    """
    if source.kind == "local":
        return os.path.abspath(source.local_path or ""), manifest
    sha = manifest.revision
    repo_dir = cache_repo_dir(root, source.repo)
    final = w.final_dir(repo_dir, sha)
    where = f"control node cache ({source.describe()} @ {sha[:12]})"
    try:
        for attempt in range(RETRIES + 1):
            prep = w.prepare(repo_dir, manifest, where=where)
            if prep["mode"] == "repair" and not prep["transfer"] and not prep["link"]:
                break
            if prep["link"] or prep["transfer"]:
                log(f"control node: {len(prep['transfer'])} file(s) to download from "
                    f"{source.describe()} @ {sha[:12]}, {prep['link']} hardlinked from cached revisions")
            incoming = os.path.join(w.partial_dir(repo_dir, sha), w.INCOMING)
            for path in prep["transfer"]:
                _download(source, path, sha, incoming, root)
            done = w.commit(repo_dir, manifest)
            if done["complete"]:
                break
            if attempt == RETRIES:
                bad = "; ".join(f"{b['path']}: {b['reason']}" for b in done["bad"]) or \
                    f"missing {', '.join(done['missing'])}"
                raise CheckpointError(f"{source.describe()} @ {sha}: files failed verification "
                                      f"{RETRIES + 1} times ({bad})")
            for b in done["bad"]:
                log(f"control node: {b['path']} from {source.describe()} failed verification "
                    f"({b['reason']}); fetching it again")
    except w.SpaceError:
        raise
    except w.WeightsError as exc:
        raise CheckpointError(str(exc)) from exc
    verified = w.read_manifest(final)
    assert verified is not None
    return final, verified


def cached_manifest(source: Source, sha: str, root: str) -> w.Manifest | None:
    """The manifest of a complete revision in the cache (no hub call), or None."""
    if source.kind == "local":
        return None
    final = w.final_dir(cache_repo_dir(root, source.repo), sha)
    try:
        return w.read_manifest(final)
    except w.WeightsError:
        return None


# --------------------------------------------------------------------------------------------------
# Once per fleet
# --------------------------------------------------------------------------------------------------


class _Once:
    """Results (or the exception) of a call per key, computed by the first caller only."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._entries: dict[Any, tuple[threading.Lock, list]] = {}

    def __call__(self, key: Any, fn: Callable[[], Any]) -> Any:
        with self._lock:
            lock, slot = self._entries.setdefault(key, (threading.Lock(), []))
        with lock:
            if not slot:
                try:
                    slot.append(("ok", fn()))
                except Exception as exc:  # noqa: BLE001 - remembered and re-raised to every caller
                    slot.append(("error", exc))
        kind, value = slot[0]
        if kind == "error":
            raise value
        return value

    def clear(self) -> None:
        with self._lock:
            self._entries.clear()


_manifests = _Once()
_stages = _Once()


def fleet_manifest(source: Source, sha: str, root: str) -> w.Manifest:
    """The revision's manifest, once per run: from the cache if complete there, else from the hub
    (metadata only: no file is downloaded), or by hashing a local directory."""
    def get() -> w.Manifest:
        if source.kind == "local":
            return local_manifest(source, sha, root)
        return cached_manifest(source, sha, root) or hub_manifest(source, sha)

    return _manifests((source, sha, cache_root(root)), get)


def fleet_stage(source: Source, sha: str, root: str, log: Log = lambda _m: None) -> tuple[str, w.Manifest]:
    """:func:`stage` once per run for the whole fleet; every host gets the same result or error."""
    return _stages((source, sha, cache_root(root)),
                   lambda: stage(source, fleet_manifest(source, sha, root), root, log))


def forget_fleet() -> None:
    """Drop the per-run memory (tests and API users running several batches in one process)."""
    _manifests.clear()
    _stages.clear()


def cached_revisions(root: str, repo: str) -> list[str]:
    return w.complete_revisions(cache_repo_dir(root, repo))


def describe_manifest(manifest: w.Manifest) -> dict[str, Any]:
    return {"repo": manifest.repo, "revision": manifest.revision, "files": len(manifest.files),
            "total_size": manifest.total_size}


__all__ = [
    "CheckpointError", "Source", "resolve", "hub_manifest", "local_manifest", "stage",
    "fleet_manifest", "fleet_stage", "forget_fleet", "cached_manifest", "cache_repo_dir",
    "cached_revisions", "DEFAULT_CACHE",
]


# --------------------------------------------------------------------------------------------------
# gpuserve resolve
# --------------------------------------------------------------------------------------------------


@click.command("resolve")
@click.argument("repo")
@click.argument("revision", default="main")
@click.option("--endpoint", metavar="URL", help="An HF_ENDPOINT-compatible hub or mirror "
              "(default: huggingface_hub's, i.e. $HF_ENDPOINT or https://huggingface.co).")
@click.option("--source", type=click.Choice(["huggingface", "modelscope"]), default="huggingface",
              show_default=True)
@click.option("--json", "as_json", is_flag=True, help="Also list the revision's files (count, bytes).")
def resolve_command(repo: str, revision: str, endpoint: str | None, source: str, as_json: bool) -> None:
    """Print the commit sha that REVISION (a branch, tag or sha; default main) of REPO names now.

    Pin it as model_revision in group data: a converge only ever serves a sha.
    """
    src = Source(source, repo, endpoint)
    try:
        sha = resolve(src, revision)
        if not as_json:
            click.echo(sha)
            return
        manifest = hub_manifest(src, sha)
    except CheckpointError as exc:
        raise click.ClickException(str(exc)) from exc
    click.echo(json.dumps({**describe_manifest(manifest), "asked": revision}, indent=2))
