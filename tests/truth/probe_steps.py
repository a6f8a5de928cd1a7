"""Shared by probe_vllm.py and probe_sglang.py (run by an engine venv's python, which finds
this file beside them): run one step, keep ``OK`` or ``FAIL <error> [file:line]``."""

from __future__ import annotations

import json
import traceback

results: dict[str, str] = {}
objects: dict[str, object] = {}


def step(name, fn) -> bool:
    try:
        objects[name] = fn()
        results[name] = "OK"
    except BaseException as e:  # noqa: BLE001 - every failure is the result
        last = traceback.extract_tb(e.__traceback__)[-1]
        where = last.filename.split("site-packages/")[-1]
        results[name] = f"FAIL {type(e).__name__}: {str(e)[:600]} [{where}:{last.lineno}]"
    print(f"STEP {name}: {results[name]}", flush=True)
    return results[name] == "OK"


def dump(path: str) -> None:
    with open(path, "w") as f:
        json.dump(results, f, indent=1)
