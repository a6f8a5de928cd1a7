"""Where a config repo's files are found (docs/config-repo.md, "What resolves against what").

Pure: the same folders pyinfra 3's CLI reads group data from (pyinfra_cli.inventory.
make_inventory_from_files), so ``gpuserve plan`` can say why a run from the wrong directory finds
none, instead of refusing every host for keys it never saw; and the engine releases a config
repo adds (``engines/*.json``, gpuserve.engine_overlay), read from the same root as group_data/.
"""

from __future__ import annotations

import json
from pathlib import Path

from gpuserve import engine_overlay
from gpuserve.engine_pins import Pin


def group_data_dirs(inventory: str, cwd: str) -> list[Path]:
    """The group_data folders pyinfra reads for ``inventory`` run in ``cwd``, in its order: the
    one in the directory it runs in, then the one beside the inventory file (if different)."""
    dirs = [Path(cwd) / "group_data"]
    beside = Path(cwd, inventory).parent.resolve()
    if str(beside) != cwd:
        dirs.append(beside / "group_data")
    return dirs


def no_group_data_hint(inventory: str, cwd: str) -> str | None:
    """A line for the operator when none of those folders exists (None when one does)."""
    dirs = group_data_dirs(inventory, cwd)
    if any(d.is_dir() for d in dirs):
        return None
    return (f"note: no group data was read: neither {' nor '.join(map(str, dirs))} exists, so every "
            "host has only gpuserve's defaults. Run from your config repo's root (pyinfra: "
            "--chdir DIR); docs/config-repo.md")


def engine_overlays(root: str) -> tuple[dict[tuple[str, str], Pin], list[str]]:
    """The engine releases of the config repo at ``root`` (its ``engines/*.json``) by (package,
    version), and one line per file the plan cannot use (the plan refuses the hosts it would
    touch: a broken file is never skipped in silence)."""
    pins: dict[tuple[str, str], Pin] = {}
    errors: list[str] = []
    folder = Path(root) / engine_overlay.FOLDER
    for path in sorted(folder.glob("*.json")) if folder.is_dir() else ():
        name = f"{engine_overlay.FOLDER}/{path.name}"
        try:
            pin = engine_overlay.from_document(json.loads(path.read_text()), name)
        except (OSError, ValueError) as exc:   # json's JSONDecodeError and OverlayError are ValueErrors
            errors.append(f"{path}: {exc}; fix it or write it again with `gpuserve engine add`")
            continue
        pins[(pin.package, pin.version)] = pin
    return pins, errors
