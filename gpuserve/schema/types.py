"""The types of the schema's rows: a key, and what it allows (a choice, an int or number range)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

SCOPES = ("host", "deployment", "gpu stack", "monitor", "gateway")


@dataclass(frozen=True)
class Choice:
    """One of these values, exactly."""
    values: tuple

    def text(self) -> str:
        return ", ".join(f"`{v}`" for v in self.values)


@dataclass(frozen=True)
class Int:
    """A whole number (never a bool) from lo to hi (no upper bound when hi is None); None too
    when optional."""
    lo: int
    hi: int | None = None
    optional: bool = False

    def text(self) -> str:
        return f"int {self.lo}-{self.hi}" if self.hi is not None else f"int >= {self.lo}"


@dataclass(frozen=True)
class Number:
    """An int or a float (never a bool) from lo to hi."""
    lo: float
    hi: float | None = None

    def text(self) -> str:
        return f"number {self.lo}-{self.hi}" if self.hi is not None else f"number >= {self.lo}"


BOOL = Choice((True, False))


@dataclass(frozen=True, eq=False)
class Key:
    name: str
    default: Any         # None: unset (default_doc says what that means: required, derived, ...)
    kind: str            # str, int, number, bool, list, mapping
    allowed: Choice | Int | Number | str   # a str is prose: a function in config/stack checks it
    doc: str             # the doc table's last column
    section: str         # the docs/configuration.md table it is listed in
    scope: str           # which part of gpuserve validates it (SCOPES)
    default_doc: str | None = None   # the doc's default column when the value is None
    note: str = ""       # added after a structured ``allowed`` in the doc
    stack: bool = False  # the GPU stack layer (gpuserve.stack) reads it too

    def allowed_text(self) -> str:
        text = self.allowed if isinstance(self.allowed, str) else self.allowed.text()
        return f"{text}{self.note}"

    def default_text(self) -> str:
        if self.default is None:
            return self.default_doc or "unset"
        return code(self.default)


def code(value: Any) -> str:
    """A value as the docs write it: `vllm`, `8000`, `False`, `["127.0.0.1/32"]`."""
    if isinstance(value, (list, tuple, dict)):
        return f"`{json.dumps(list(value) if isinstance(value, tuple) else value)}`"
    return f"`{value}`"
