"""Storage facts: NVMe mounts and their free space (where checkpoints and caches go)."""

from __future__ import annotations

import re
from dataclasses import dataclass

from pyinfra.api import FactBase, QuoteString, StringCommand


@dataclass(frozen=True)
class Mount:
    source: str
    target: str
    fstype: str
    size_bytes: int
    avail_bytes: int


def _unescape(text: str) -> str:
    """findmnt -r writes spaces and other odd characters as \\x20."""
    return re.sub(r"\\x([0-9a-fA-F]{2})", lambda m: chr(int(m.group(1), 16)), text)


def parse_findmnt(lines: list[str]) -> list[Mount]:
    """`findmnt -rn -b -o SOURCE,TARGET,FSTYPE,SIZE,AVAIL` -> every mount with sizes."""
    mounts = []
    for line in lines:
        parts = line.split()
        if len(parts) != 5:
            continue
        size, avail = (int(p) if p.isdigit() else 0 for p in parts[3:])
        mounts.append(Mount(_unescape(parts[0]), _unescape(parts[1]), parts[2], size, avail))
    return mounts


def nvme_mounts(mounts: list[Mount]) -> list[Mount]:
    """Mounts backed by an NVMe namespace (/dev/nvme0n1, /dev/nvme0n1p2, ...)."""
    return [m for m in mounts if re.match(r"/dev/nvme\d+n\d+", m.source)]


class NvmeMounts(FactBase[list]):
    """Mounted NVMe filesystems with size and free space in bytes."""

    def command(self) -> str:
        return "findmnt -rn -b -o SOURCE,TARGET,FSTYPE,SIZE,AVAIL"

    def requires_command(self) -> str:
        return "findmnt"

    default = list

    def process(self, output: list[str]) -> list[Mount]:
        return nvme_mounts(parse_findmnt(output))


def parse_df(lines: list[str]) -> Mount | None:
    """`df -P -B1 -T PATH` -> the filesystem holding PATH (None when PATH does not exist)."""
    for line in lines[1:]:
        parts = line.split()
        if len(parts) >= 7 and parts[2].isdigit() and parts[4].isdigit():
            return Mount(parts[0], " ".join(parts[6:]), parts[1], int(parts[2]), int(parts[4]))
    return None


class FreeSpace(FactBase):
    """The filesystem holding a path, with its free space (None when the path does not exist)."""

    def command(self, path: str) -> StringCommand:
        return StringCommand("df", "-P", "-B1", "-T", QuoteString(path), "2>/dev/null; true")

    def process(self, output: list[str]) -> Mount | None:
        return parse_df(output)
