"""docs/configuration.md's key tables, generated from the schema between its markers."""

from __future__ import annotations

import re
import sys
from pathlib import Path

from gpuserve.schema.keys import (
    _ADMISSION, _DEPLOYMENT, _DEPLOYMENTS, _ENGINE, _ENV, _GATEWAY, _HW, _MODEL, _MONITOR, _OTHER, _RECIPE,
    _STACK, _WEIGHTS, KEYS)

# section -> the last column's header (the others are key, default, allowed)
SECTIONS = {_HW: "meaning", _RECIPE: "meaning", _MODEL: "meaning", _ENGINE: "meaning",
            _ENV: "meaning", _DEPLOYMENTS: "meaning", _DEPLOYMENT: "renders as (vLLM / SGLang)",
            _WEIGHTS: "meaning", _OTHER: "meaning", _GATEWAY: "meaning", _MONITOR: "meaning",
            _STACK: "meaning", _ADMISSION: "meaning"}
MARK = re.compile(r"(<!-- schema:([a-z-]+) -->\n)(.*?)(<!-- /schema:\2 -->)", re.DOTALL)


def table(section: str) -> str:
    """The markdown table of one section's keys."""
    rows = [f"| key | default | allowed | {SECTIONS[section]} |", "| --- | --- | --- | --- |"]
    for k in KEYS:
        if k.section == section:
            rows.append(f"| `{k.name}` | {k.default_text()} | {k.allowed_text()} | {k.doc} |")
    return "\n".join(rows) + "\n"


def render_doc(text: str) -> str:
    """``text`` with every marked table regenerated (the prose around them kept as it is)."""
    found = [m.group(2) for m in MARK.finditer(text)]
    missing = [s for s in SECTIONS if s not in found]
    if missing or len(found) != len(set(found)):
        raise ValueError(f"markers missing or repeated: missing {missing}, found {found}")
    return MARK.sub(lambda m: m.group(1) + table(m.group(2)) + m.group(4), text)


def main(argv: list[str]) -> int:
    """``python -m gpuserve.schema docs/configuration.md``: regenerate its key tables in place."""
    if len(argv) != 1:
        print("usage: python -m gpuserve.schema docs/configuration.md", file=sys.stderr)
        return 2
    path = Path(argv[0])
    path.write_text(render_doc(path.read_text()))
    return 0
