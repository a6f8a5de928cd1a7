"""The recipe catalogue's types: a recipe and its engine tables, and the model families whose
flags a recipe must carry."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, Mapping

from gpuserve import schema

def _frozen(mapping: Mapping[str, Any]) -> Mapping[str, Any]:
    return MappingProxyType(dict(mapping))


@dataclass(frozen=True)
class EngineTable:
    """One engine's flags (flag name -> value; ``True`` is a bare switch) and environment."""

    flags: Mapping[str, Any]
    env: Mapping[str, str] = field(default_factory=lambda: _frozen({}))


@dataclass(frozen=True)
class Recipe:
    name: str
    summary: str
    gpu_models: tuple[str, ...]  # hardware it is written for (the cpu recipe runs anywhere)
    gpu_count: int  # GPUs it uses; 0 for cpu
    model_families: tuple[str, ...] | None  # None: any model
    vllm: EngineTable
    sglang: EngineTable | None
    torch_backend: str  # default for this hardware (CUDA: the pinned engine's torch decides)
    torch_backend_pattern: str  # what uv --torch-backend values fit this hardware
    min_vram_gb: int | None  # model weights + headroom, all GPUs together
    source: str
    # engine package -> the version this recipe's flags need (docs/recipes.md, "Engine pins");
    # engine_version overrides it, gpuserve.engine_pins refuses one that cannot serve the flags
    pins: Mapping[str, str] = field(default_factory=lambda: _frozen({}))

    @property
    def rocm(self) -> bool:
        """AMD recipes: PyPI's vLLM/SGLang wheels are CUDA builds, useless here."""
        return self.torch_backend.startswith("rocm")

    @property
    def uses_gpus(self) -> bool:
        return self.gpu_count > 0

    def table(self, engine: str) -> EngineTable | None:
        return self.vllm if engine == "vllm" else self.sglang


@dataclass(frozen=True)
class ModelFamily:
    name: str
    pattern: str  # regex on model_repo
    required_flags: Mapping[str, Mapping[str, Any]]  # engine -> flag -> the only value allowed
    why: str


MINIMAX_M3 = ModelFamily(
    name="minimax-m3",
    pattern=r"(^|/)MiniMax-M3",
    # MSA's sparse block size is 128; the KV cache block (vLLM) / page (SGLang) must match.
    required_flags=_frozen(
        {"vllm": _frozen({"block-size": 128}), "sglang": _frozen({"page-size": 128})}
    ),
    why="the MiniMax M3 family's sparse/index (MSA) cache needs a KV cache block of 128",
)
GENERIC = ModelFamily(
    name="generic",
    pattern=r".",
    required_flags=_frozen({"vllm": _frozen({}), "sglang": _frozen({})}),
    why="",
)
MODEL_FAMILIES = (MINIMAX_M3, GENERIC)

REASONING_EFFORTS = schema.choices("reasoning_effort")  # max is the model's default (gpuserve.schema)
EFFORT_KWARG = "reasoning_effort"  # chat_template_kwargs key (vLLM's MiniMax-M3.1-Flash recipe)


def model_family(model_repo: str) -> ModelFamily:
    return next(f for f in MODEL_FAMILIES if re.search(f.pattern, model_repo, re.IGNORECASE))
