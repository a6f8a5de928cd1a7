"""Releases: the immutable, pinned tuple a host serves, and the bookkeeping around them.

A release is engine pin + checkpoint sha + rendered serve config (hashed) + GPU stack. Its id is
derived from its content, so converging the same pins twice yields the same release (nothing to
do), and any change to a pin yields a new one. On a host (see gpuserve.layout):

    /etc/gpuserve/<deployment>/releases/<id>/release.json   this record
    /etc/gpuserve/<deployment>/current  -> releases/<id>    what the unit serves
    /etc/gpuserve/<deployment>/previous -> releases/<id>    the rollback target

Pure Python: no host access here.
"""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import asdict, dataclass, field
from typing import Iterable, Mapping

RELEASE_ID = re.compile(r"^[a-z0-9][a-z0-9.+-]*-[0-9a-f]{8}-[0-9a-f]{10}$")


def canonical_json(value) -> str:
    return json.dumps(value, sort_keys=True, separators=(",", ":"))


def sha256_text(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


@dataclass(frozen=True)
class Release:
    deployment: str
    engine: Mapping[str, str]          # name, package, version, python, torch_backend, env_id
    checkpoint: Mapping[str, str]      # repo, sha, path
    config_sha256: str                 # of the rendered files the unit reads (serve.yaml, env, launch)
    gpu_stack: Mapping[str, str] = field(default_factory=dict)

    @property
    def id(self) -> str:
        """``<engine>-<version>-<sha[:8]>-<content hash[:10]>``: readable, and unique per content."""
        digest = sha256_text(canonical_json(self.record(with_id=False)))[:10]
        engine = f"{self.engine['name']}-{self.engine['version']}".lower()
        return f"{engine}-{self.checkpoint['sha'][:8]}-{digest}"

    def record(self, *, with_id: bool = True) -> dict:
        data = {k: (dict(v) if isinstance(v, Mapping) else v) for k, v in asdict(self).items()}
        if with_id:
            data = {"id": self.id, **data}
        return data

    def to_json(self) -> str:
        return json.dumps(self.record(), indent=2, sort_keys=True) + "\n"

    @classmethod
    def from_json(cls, text: str) -> "Release":
        data = json.loads(text)
        stored_id = data.pop("id", None)
        release = cls(**data)
        if stored_id is not None and stored_id != release.id:
            raise ValueError(f"release.json says id {stored_id} but its content hashes to {release.id}")
        return release


def config_digest(files: Mapping[str, str]) -> str:
    """Hash of the rendered files a release consists of (name -> content), order-independent."""
    return sha256_text(canonical_json(dict(files)))


@dataclass(frozen=True)
class Ledger:
    """What a host has: its release ids and the two pointers."""

    releases: tuple[str, ...]
    current: str | None
    previous: str | None

    def after_switch(self, new: str) -> "Ledger":
        """Pointers after switching to ``new``: the old current becomes the rollback target.

        Switching to the release that is already current changes nothing.
        """
        if new not in self.releases:
            raise ValueError(f"release {new} is not on the host (have: {', '.join(self.releases) or 'none'})")
        if new == self.current:
            return self
        return Ledger(self.releases, new, self.current)

    def to_collect(self, keep_previous: int, order: Iterable[str]) -> list[str]:
        """Releases retention removes: all but current, previous and the newest ``keep_previous``
        others, where ``order`` lists release ids oldest first (e.g. by directory mtime)."""
        keep = {r for r in (self.current, self.previous) if r}
        others = [r for r in order if r in self.releases and r not in keep]
        extra = max(0, keep_previous - (1 if self.previous else 0))
        kept_others = set(others[len(others) - extra:]) if extra else set()
        return [r for r in others if r not in kept_others]


def unreferenced(collected: Iterable[Release], kept: Iterable[Release]) -> tuple[list[str], list[str]]:
    """Engine envs and checkpoint dirs that collected releases used and no kept release uses.

    Only paths a release names are ever returned: directories gpuserve knows nothing about
    are never candidates for removal.
    """
    kept = list(kept)
    keep_envs = {r.engine.get("env") for r in kept}
    keep_ckpts = {r.checkpoint.get("path") for r in kept}
    envs, ckpts = set(), set()
    for r in collected:
        env, ckpt = r.engine.get("env"), r.checkpoint.get("path")
        if env and env not in keep_envs:
            envs.add(env)
        if ckpt and ckpt not in keep_ckpts:
            ckpts.add(ckpt)
    return sorted(envs), sorted(ckpts)
