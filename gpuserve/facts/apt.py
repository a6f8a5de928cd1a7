"""apt facts the pinned package sets need: holds and what the repositories offer."""

from __future__ import annotations

from dataclasses import dataclass, field

from pyinfra.api import FactBase, QuoteString, StringCommand


class AptHolds(FactBase[list]):
    """Packages on hold (`apt-mark showhold`)."""

    def command(self) -> str:
        return "apt-mark showhold"

    def requires_command(self) -> str:
        return "apt-mark"

    default = list

    def process(self, output: list[str]) -> list[str]:
        return sorted(line.strip() for line in output if line.strip())


@dataclass(frozen=True)
class Policy:
    installed: str | None = None
    candidate: str | None = None
    versions: list[str] = field(default_factory=list)   # as apt lists them: newest first


def parse_apt_policy(lines: list[str]) -> dict[str, Policy]:
    """`apt-cache policy pkg...` -> name: Policy. Unknown packages are absent."""
    result: dict[str, Policy] = {}
    name = None
    data: dict = {}
    in_table = False

    def flush():
        if name is not None:
            result[name] = Policy(data.get("installed"), data.get("candidate"), data.get("versions", []))

    for line in lines:
        if line and not line[0].isspace() and line.rstrip().endswith(":"):
            flush()
            name, data, in_table = line.rstrip()[:-1], {"versions": []}, False
            continue
        text = line.strip()
        if name is None or not text:
            continue
        if text.startswith("Installed:") or text.startswith("Candidate:"):
            key, _, value = text.partition(":")
            value = value.strip()
            data[key.lower()] = None if value == "(none)" else value
        elif text.startswith("Version table:"):
            in_table = True
        elif in_table:
            parts = text.replace("***", "").split()
            # version lines are indented less than their origin lines ("500 http://... Packages")
            if len(parts) == 2 and parts[1].lstrip("-").isdigit() and not parts[0].isdigit():
                data["versions"].append(parts[0])
    flush()
    return result


class AptPolicy(FactBase[dict]):
    """What apt knows of some packages: installed version, candidate, versions offered."""

    def command(self, packages: list[str]) -> StringCommand:
        return StringCommand("apt-cache", "policy", *(QuoteString(p) for p in packages), "2>/dev/null; true")

    default = dict

    def process(self, output: list[str]) -> dict[str, Policy]:
        return parse_apt_policy(output)
