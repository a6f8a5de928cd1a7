"""Which installed distribution owns which file of a venv, from each one's ``RECORD``.

Two wheels that ship the same path overwrite each other, and the installer (uv unpacks wheels
in parallel) decides which one is left: the venv then depends on timing, not on the pin. That
happened to vLLM 0.33.0 (issue 25): uv resolved ``cuda-python 12.6.2.post1`` (the last
monolithic release, which carries its own ``cuda/bindings/*.so``) beside ``cuda-bindings
13.5.0``; 28 files came from both, and 2 cold installs of 3 got the old ``cuda.bindings.runtime``
(no ``cudaLibrary_t``), which breaks flashinfer and cutlass.

``shared_files(site_packages)`` lists every path that two or more distributions' ``RECORD``
files name and that is on disk; the engine build (``gpuserve.engine.verify_code``) runs this
module's source inside the new venv and fails on any. Standard library only, Python 3.9+: the
same code runs under the venv's interpreter on the host.
"""

from __future__ import annotations

import csv
import os
from dataclasses import dataclass


@dataclass(frozen=True)
class Shared:
    """One path (relative to site-packages) that several distributions own."""

    path: str
    owners: tuple[tuple[str, str], ...]  # (distribution name-version, RECORD hash), sorted

    @property
    def same_bytes(self) -> bool:
        """Every owner's RECORD gives the same hash: whichever lands, the bytes are the same."""
        hashes = {h for _, h in self.owners}
        return len(hashes) == 1 and "" not in hashes

    def describe(self) -> str:
        how = "same bytes" if self.same_bytes else "different bytes: the last one written wins"
        return f"{self.path}: owned by {', '.join(d for d, _ in self.owners)} ({how})"


def _dist_name(dist_info: str) -> str:
    return dist_info[: -len(".dist-info")]


def records(site_packages: str) -> tuple[dict[str, list[tuple[str, str]]], list[str]]:
    """(path -> [(distribution, hash), ...], distributions without a RECORD). Paths are
    normalized relative to ``site_packages`` (``../../../bin/x`` stays outside it)."""
    owners: dict[str, list[tuple[str, str]]] = {}
    missing: list[str] = []
    for entry in sorted(os.listdir(site_packages)):
        if not entry.endswith(".dist-info"):
            continue
        record = os.path.join(site_packages, entry, "RECORD")
        if not os.path.isfile(record):
            missing.append(_dist_name(entry))
            continue
        with open(record, newline="", encoding="utf-8") as fh:
            for row in csv.reader(fh):
                if not row or not row[0]:
                    continue
                path = os.path.normpath(row[0]).replace(os.sep, "/")
                digest = row[1] if len(row) > 1 else ""
                owners.setdefault(path, []).append((_dist_name(entry), digest))
    return owners, missing


def shared_files(site_packages: str) -> list[Shared]:
    """Every path on disk that two or more distributions' RECORDs name, sorted by path.

    A path no longer on disk is left out: the build removes known stray files
    (``gpuserve.engine.STRAY_FILES``) so that the venv is the same whatever the order."""
    owners, _ = records(site_packages)
    out = []
    for path, who in sorted(owners.items()):
        if len({d for d, _ in who}) < 2:
            continue
        if not os.path.lexists(os.path.join(site_packages, path)):
            continue
        out.append(Shared(path, tuple(sorted(set(who)))))
    return out


def report(site_packages: str) -> list[str]:
    """Lines for people: each shared path with its owners; empty when there is none."""
    return [s.describe() for s in shared_files(site_packages)]
