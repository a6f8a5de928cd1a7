"""A tiny MiniMax M3.1 Flash-shaped checkpoint for the truth suite: no hub, random weights.

config.json follows the MiniMax M3 VL schema the engines read: transformers'
``MiniMaxM3VLConfig`` (model_type ``minimax_m3_vl``, a ``text_config`` of
``minimax_m3_vl_text`` with the sparse-attention index fields and per-layer
``layer_types``/``mlp_layer_types``, a ``vision_config``), served by vLLM's
``MiniMaxM3SparseForConditionalGeneration`` (vllm/model_executor/models/registry.py, 0.33.0
and 0.34.0). The DSpark draft sits in ``dspark/`` as vLLM 0.34.0's
``_get_minimax_m3_dspark_draft`` expects (vllm/config/speculative.py), architecture
``DSparkMiniMaxDraftModel`` with the ``dspark_*`` fields vllm/models/minimax_m3/common/dspark.py
reads. Sizes are tiny; the weights are never loaded (no GPU), only present.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
from safetensors.numpy import save_file

from gpuserve_sandbox.tiny_checkpoint import build_tokenizer_json

TEXT = {
    "model_type": "minimax_m3_vl_text",
    "vocab_size": 320,
    "hidden_size": 64,
    "intermediate_size": 32,
    "dense_intermediate_size": 64,
    "shared_intermediate_size": 32,
    "num_hidden_layers": 2,
    # the real model's 64 query over 4 KV heads: vLLM's NVFP4 KV kernels need 16 query heads per
    # KV head on each rank at TP4 (vllm/models/minimax_m3, 0.34.0), and TP8 must divide them
    "num_attention_heads": 64,
    "num_key_value_heads": 4,
    "head_dim": 16,
    "rotary_dim": 8,
    "max_position_embeddings": 32768,
    "num_experts_per_tok": 2,
    "num_local_experts": 4,
    "index_n_heads": 2,
    "index_head_dim": 16,
    "index_block_size": 128,
    "index_topk_blocks": 4,
    "index_local_blocks": 1,
    "layer_types": ["minimax_m3_sparse", "full_attention"],
    "mlp_layer_types": ["dense", "sparse"],
    "bos_token_id": 1,
    "eos_token_id": 2,
    "torch_dtype": "bfloat16",
}
VISION = {"model_type": "minimax_m3_vl_vision", "hidden_size": 32, "intermediate_size": 64,
          "num_hidden_layers": 1, "num_attention_heads": 2, "image_size": 56, "patch_size": 14}


# The shape of MiniMax-M3.1-Flash's quantization_config as the engines read it: MXFP8
# projections with NVFP4 packed experts. Taken from what SGLang 0.5.23 reads
# (sglang/srt/arg_groups/model_overrides/minimax_m3.py, _resolve_quant_method: quant_method
# "mxfp8" plus moe_quant_algo "NVFP4" and moe_quant_format "nvfp4-pack-quantized" -> it serves
# the checkpoint as minimax_m3_nvfp4); the real config.json is not reachable from here.
QUANTIZATION = {"quant_method": "mxfp8", "moe_quant_algo": "NVFP4",
                "moe_quant_format": "nvfp4-pack-quantized"}


def config(quantized: bool = False) -> dict:
    out = {"architectures": ["MiniMaxM3SparseForConditionalGeneration"],
           "model_type": "minimax_m3_vl", "text_config": dict(TEXT), "vision_config": dict(VISION),
           "image_token_index": 300, "video_token_index": 301, "projector_hidden_size": 64,
           "torch_dtype": "bfloat16"}
    if quantized:
        out["quantization_config"] = dict(QUANTIZATION)
    return out


def draft_config(quantized: bool = False) -> dict:
    text = {**TEXT, "num_hidden_layers": 1, "layer_types": ["full_attention"],
            "mlp_layer_types": ["dense"], "dspark_markov_rank": 1, "dspark_ffn_hidden_size": 64,
            "dspark_target_layer_ids": [1], "dflash_config": {"causal": False}}
    if quantized:
        # the fields SGLang 0.5.23's configure_minimax_m3_dspark reads
        # (sglang/srt/configs/minimax_vl.py): the dense-FFN draft, its block and mask token,
        # and dflash_config's target depth, draft depth and capture layers
        text.update(dspark_use_dense_ffn=True, dspark_block_size=7, dspark_noise_token_id=3,
                    dflash_config={"causal": False, "num_target_layers": 2,
                                   "num_hidden_layers": 1, "target_layer_ids": [1]})
    return {**config(quantized), "architectures": ["DSparkMiniMaxDraftModel"], "text_config": text}


# MiniMax M3's reasoning markers (vllm/reasoning/minimax_m3_reasoning_parser.py): the parser
# looks them up in the vocabulary when the engine config is built
MARKERS = ("<mm:think>", "</mm:think>")


def tokenizer_json() -> str:
    """The sandbox's byte-level tokenizer with two reserved tokens renamed to MARKERS."""
    tok = json.loads(build_tokenizer_json())
    reserved = [t for t in tok["added_tokens"] if t["content"].startswith("<|reserved_")]
    for entry, marker in zip(reserved, MARKERS):
        tok["model"]["vocab"].pop(entry["content"], None)
        entry["content"], entry["special"] = marker, False
        tok["model"]["vocab"][marker] = entry["id"]
    return json.dumps(tok)


def write(root: Path, seed: int = 0, quantized: bool = False) -> Path:
    """Write the checkpoint (config, tokenizer, random weights, dspark/ draft) into ``root``;
    ``quantized``: config.json carries ``QUANTIZATION`` (the weights stay tiny and unquantized:
    no step reads them)."""
    rng = np.random.default_rng(seed)
    for folder, cfg in ((root, config(quantized)), (root / "dspark", draft_config(quantized))):
        folder.mkdir(parents=True, exist_ok=True)
        (folder / "config.json").write_text(json.dumps(cfg, indent=1))
        (folder / "tokenizer.json").write_text(tokenizer_json())
        (folder / "tokenizer_config.json").write_text(json.dumps(
            {"tokenizer_class": "PreTrainedTokenizerFast", "bos_token": "<|endoftext|>",
             "eos_token": "<|endoftext|>", "model_max_length": 32768}))
        emb = rng.standard_normal((TEXT["vocab_size"], TEXT["hidden_size"])).astype(np.float32)
        save_file({"model.embed_tokens.weight": emb}, str(folder / "model.safetensors"))
    return root
