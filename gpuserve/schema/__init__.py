"""Every gpuserve setting, once: its type, default, what is allowed and its doc line.

This table is the one place defaults live. ``gpuserve.config`` (HOST_DEFAULTS, DEPLOYMENT_DEFAULTS,
MONITOR_DEFAULTS, GATEWAY_DEFAULTS), ``gpuserve.stack.DEFAULTS`` and the settings dataclasses' field
defaults are views of it; the simple checks (choices, integer and number ranges, booleans) take
their bounds from ``allowed``; the checks that need more (paths, URLs, cross-key rules) stay
functions in gpuserve/config/ (the module of the key's section) and stack/settings.py, and ``allowed`` then
is the text the docs show.

docs/configuration.md's key tables are generated from it, between ``<!-- schema:NAME -->`` and
``<!-- /schema:NAME -->`` markers, by ``python -m gpuserve.schema docs/configuration.md`` (the
prose around them is hand-written); tests/unit/schema/test_schema.py fails when the doc is stale.

A leaf: it imports no gpuserve module but ``hardware`` (a leaf itself). A package, one concern a
module (gpuserve/__init__.py's ``schema/`` section lists them); every name schema.py had is
importable from ``gpuserve.schema`` as before the split (issue 28).
"""

from __future__ import annotations

from typing import Any

# every name schema.py had, importable from gpuserve.schema as before the split (issue 28)
from gpuserve.schema.types import BOOL, SCOPES, Choice, Int, Key, Number, code  # noqa: F401 - re-exported
from gpuserve.schema.keys import (  # noqa: F401 - re-exported
    _ADMISSION, _DEPLOYMENT, _DEPLOYMENTS, _ENGINE, _ENV, _GATEWAY, _HW, _MODEL, _MONITOR, _OTHER,
    _PROXY_INT, _RECIPE, _STACK, _WEIGHTS, BY_NAME, KEYS, D, G, H, M, S)
from gpuserve.schema.doc import MARK, SECTIONS, main, render_doc, table  # noqa: F401 - re-exported



def key(name: str) -> Key:
    return BY_NAME[name]


def default(name: str) -> Any:
    return BY_NAME[name].default


def allowed(name: str) -> Any:
    """The structured ``allowed`` of a key (Choice, Int or Number)."""
    spec = BY_NAME[name].allowed
    assert not isinstance(spec, str), f"{name}'s allowed is prose, checked by a function"
    return spec


def choices(name: str) -> tuple:
    spec = allowed(name)
    assert isinstance(spec, Choice), name
    return spec.values


def defaults(*scopes: str, stack: bool = False) -> dict[str, Any]:
    """name -> default of the keys of these scopes (and, with stack, the stack's shared keys)."""
    assert set(scopes) <= set(SCOPES), scopes
    return {k.name: k.default for k in KEYS if k.scope in scopes or (stack and k.stack)}
