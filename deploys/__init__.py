"""gpuserve's deploy entry points, shipped inside the package as ``gpuserve.deploys``.

In this repository they are run as files (``pyinfra inventories/prod.py deploys/serve.py``).
Installed (pip/uv), the same files are in the package, and a config repo of its own
(docs/config-repo.md) runs them with a deploy file of one call::

    # deploys/serve.py of the config repo
    from gpuserve.deploys import include
    include("serve")

or names the packaged file itself: ``python -m gpuserve.deploys serve`` prints its path, so
``pyinfra inventories/prod.py "$(python -m gpuserve.deploys serve)"`` works with no deploy file.

The files here are not imported as modules (pyinfra executes a deploy file once per host);
this module only finds them.
"""

from __future__ import annotations

import sys
from pathlib import Path

DIR = Path(__file__).resolve().parent


def names() -> list[str]:
    """The deploys the package ships: serve, upgrade, rollback, ..."""
    return sorted(p.stem for p in DIR.glob("*.py") if not p.stem.startswith("_"))


def path(name: str) -> Path:
    """The packaged deploy file ``name`` (``serve`` or ``serve.py``); ValueError names the others."""
    stem = name[:-3] if name.endswith(".py") else name
    if stem not in names():
        raise ValueError(f"gpuserve ships no deploy {name!r}; it ships: {', '.join(names())}")
    return DIR / f"{stem}.py"


def include(name: str) -> None:
    """Run the packaged deploy ``name`` for the current host, from a config repo's deploy file.

    pyinfra's own ``local.include``: the deploy runs exactly as if pyinfra had been given its
    file, in the directory pyinfra runs in (the config repo's root), so group data and relative
    paths resolve there (docs/config-repo.md)."""
    from pyinfra import local

    local.include(str(path(name)))


def main(argv: list[str] | None = None) -> int:
    """``python -m gpuserve.deploys [NAME]``: the path of a packaged deploy, or every name."""
    args = sys.argv[1:] if argv is None else argv
    if not args:
        print("\n".join(names()))
        return 0
    try:
        print(path(args[0]))
    except ValueError as exc:
        print(exc, file=sys.stderr)
        return 2
    return 0
