"""gpuserve/__init__.py's docstring lists every module of the package (issue 28: it used to say
README.md did, and 17 of 36 were missing there)."""

from __future__ import annotations

import re
from pathlib import Path

import gpuserve

PACKAGE = Path(gpuserve.__file__).resolve().parent


def listed(doc: str) -> dict[str, set[str]]:
    """Section ('' for the top level, 'layers/', 'facts/') -> the module names it lists."""
    out: dict[str, set[str]] = {"": set()}
    section = ""
    for line in doc.splitlines():
        head = re.match(r"(\w+/):", line)
        if head:
            section = head.group(1)
            out.setdefault(section, set())
            continue
        entry = re.match(r" {4}(\w+) {2,}\S", line)
        if entry:
            out[section].add(entry.group(1))
    return out


def modules(folder: Path) -> set[str]:
    return {p.stem for p in folder.glob("*.py") if p.stem != "__init__"}


def test_the_package_docstring_lists_every_module_and_no_other():
    doc = listed(gpuserve.__doc__)
    for section, folder in (("", PACKAGE), ("layers/", PACKAGE / "layers"), ("facts/", PACKAGE / "facts")):
        have = modules(folder)
        assert not have - doc[section], (f"gpuserve/{section} modules missing from gpuserve/__init__.py's "
                                         f"docstring: {sorted(have - doc[section])}; add one line each")
        assert not doc[section] - have, (f"gpuserve/__init__.py's docstring lists modules that gpuserve/"
                                         f"{section} does not have: {sorted(doc[section] - have)}")


def test_every_subpackage_is_a_section():
    subpackages = {p.name + "/" for p in PACKAGE.iterdir() if (p / "__init__.py").is_file()}
    assert subpackages <= set(listed(gpuserve.__doc__)), sorted(subpackages)
