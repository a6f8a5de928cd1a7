"""The tiny random-weight checkpoint: shards, determinism, revision-bump variants, tokenizer, chat template."""

from __future__ import annotations

import json

import pytest

np = pytest.importorskip("numpy")
pytest.importorskip("safetensors")
pytest.importorskip("tokenizers")

from safetensors.numpy import load_file  # noqa: E402

from gpuserve_sandbox.tiny_checkpoint import CHAT_TEMPLATE, VOCAB_SIZE, make_tiny_checkpoint  # noqa: E402


def _bytes(d, name):
    return (d / name).read_bytes()


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
    d = tmp_path_factory.mktemp("ckpt")
    return d, make_tiny_checkpoint(d, seed=7)


def test_layout_and_index(ckpt):
    d, info = ckpt
    shards = info["shards"]
    assert len(shards) == 4 and shards[0] == "model-00001-of-00004.safetensors"
    expected = {"config.json", "generation_config.json", "tokenizer.json", "tokenizer_config.json",
                "model.safetensors.index.json", *shards}
    assert set(info["files"]) == expected == {p.name for p in d.iterdir()}
    for name, meta in info["files"].items():
        assert (d / name).stat().st_size == meta["size"]

    index = json.loads(_bytes(d, "model.safetensors.index.json"))
    seen: dict[str, str] = {}
    total = 0
    for shard in shards:
        for tname, arr in load_file(str(d / shard)).items():
            seen[tname] = shard
            total += arr.nbytes
    assert index["weight_map"] == seen
    assert index["metadata"]["total_size"] == total


def test_shapes_match_config(ckpt):
    d, info = ckpt
    cfg = json.loads(_bytes(d, "config.json"))
    assert cfg["architectures"] == ["Qwen3MoeForCausalLM"] and cfg["model_type"] == "qwen3_moe"
    h, hd = cfg["hidden_size"], cfg["head_dim"]
    w = {}
    for shard in info["shards"]:
        w.update(load_file(str(d / shard)))
    assert w["model.embed_tokens.weight"].shape == (cfg["vocab_size"], h)
    assert w["lm_head.weight"].shape == (cfg["vocab_size"], h)
    assert w["model.layers.0.self_attn.q_proj.weight"].shape == (cfg["num_attention_heads"] * hd, h)
    assert w["model.layers.1.self_attn.k_proj.weight"].shape == (cfg["num_key_value_heads"] * hd, h)
    assert w["model.layers.0.mlp.gate.weight"].shape == (cfg["num_experts"], h)
    e = cfg["num_experts"] - 1
    assert w[f"model.layers.1.mlp.experts.{e}.down_proj.weight"].shape == (h, cfg["moe_intermediate_size"])
    assert all(a.dtype == np.float32 for a in w.values())
    q = w["model.layers.0.self_attn.q_proj.weight"]
    assert 0.01 < float(q.std()) < 0.03 and float(abs(q).max()) < 0.035  # uniform, std 0.02


def test_deterministic(tmp_path, ckpt):
    d, info = ckpt
    again = make_tiny_checkpoint(tmp_path / "again", seed=7)
    assert again["files"] == info["files"]
    for name in info["files"]:
        assert _bytes(d, name) == _bytes(tmp_path / "again", name)
    other = make_tiny_checkpoint(tmp_path / "other", seed=8)
    assert all(other["files"][s]["sha256"] != info["files"][s]["sha256"] for s in info["shards"])


def test_variant_changes_exactly_one_shard(tmp_path, ckpt):
    d, info = ckpt
    bumped = make_tiny_checkpoint(tmp_path / "v1", seed=7, variant=1)
    changed = [n for n in info["files"] if bumped["files"][n]["sha256"] != info["files"][n]["sha256"]]
    assert changed == [info["varied_shard"]] == [bumped["varied_shard"]]
    assert bumped["files"][info["varied_shard"]]["size"] == info["files"][info["varied_shard"]]["size"]
    v2 = make_tiny_checkpoint(tmp_path / "v2", seed=7, variant=2)
    assert v2["files"][info["varied_shard"]]["sha256"] not in {
        info["files"][info["varied_shard"]]["sha256"], bumped["files"][info["varied_shard"]]["sha256"]}


def test_rewrite_in_place_switches_variant(tmp_path):
    a = make_tiny_checkpoint(tmp_path, seed=3)
    b = make_tiny_checkpoint(tmp_path, seed=3, variant=1)
    c = make_tiny_checkpoint(tmp_path, seed=3)
    assert a["files"] == c["files"] != b["files"]
    assert not [p for p in tmp_path.iterdir() if p.name.endswith(".tmp")]


def test_tokenizer_roundtrip_and_specials(ckpt):
    from tokenizers import Tokenizer

    d, _ = ckpt
    tok = Tokenizer.from_file(str(d / "tokenizer.json"))
    assert tok.get_vocab_size(with_added_tokens=True) == VOCAB_SIZE
    text = 'héllo wörld <tool_call>{"name": "f", "arguments": {}}</tool_call> ✓'
    enc = tok.encode(text)
    assert tok.decode(enc.ids, skip_special_tokens=False) == text
    names = ("<|endoftext|>", "<|im_start|>", "<|im_end|>", "<tool_call>", "</tool_call>")
    ids = {t: tok.token_to_id(t) for t in names}
    assert all(i is not None and i >= 256 for i in ids.values())
    assert ids["<tool_call>"] in enc.ids and ids["</tool_call>"] in enc.ids
    # every id decodes (the model can emit any id below vocab_size)
    assert all(tok.id_to_token(i) is not None for i in range(VOCAB_SIZE))

    tcfg = json.loads(_bytes(d, "tokenizer_config.json"))
    gen = json.loads(_bytes(d, "generation_config.json"))
    cfg = json.loads(_bytes(d, "config.json"))
    assert tcfg["eos_token"] == "<|im_end|>" and tcfg["chat_template"] == CHAT_TEMPLATE
    assert cfg["eos_token_id"] == ids["<|im_end|>"] and ids["<|im_end|>"] in gen["eos_token_id"]
    assert cfg["vocab_size"] == VOCAB_SIZE
    assert tcfg["added_tokens_decoder"][str(ids["<tool_call>"])]["special"] is False


def _render(**kw):
    import jinja2

    env = jinja2.Environment(trim_blocks=True, lstrip_blocks=True)
    env.filters["tojson"] = lambda x, **_: json.dumps(x, ensure_ascii=False)  # as transformers does
    return env.from_string(CHAT_TEMPLATE).render(**kw)


def test_chat_template_renders_tools_and_tool_calls():
    tools = [{"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}}]
    msgs = [
        {"role": "user", "content": "Weather in Paris?"},
        {"role": "assistant", "content": None,
         "tool_calls": [{"type": "function", "function": {"name": "get_weather", "arguments": {"city": "Paris"}}}]},
        {"role": "tool", "content": "sunny"},
    ]
    out = _render(messages=msgs, tools=tools, add_generation_prompt=True)
    assert "<tools>\n" + json.dumps(tools[0]) + "\n</tools>" in out
    assert '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call><|im_end|>' in out
    assert "<tool_response>\nsunny\n</tool_response><|im_end|>" in out
    assert out.endswith("<|im_start|>assistant\n")
    plain = _render(messages=[{"role": "system", "content": "S"}, {"role": "user", "content": "hi"}],
                    add_generation_prompt=False)
    assert plain == "<|im_start|>system\nS<|im_end|>\n<|im_start|>user\nhi<|im_end|>\n"


def test_rejects_bad_arguments(tmp_path):
    with pytest.raises(ValueError):
        make_tiny_checkpoint(tmp_path, seed=0, dtype="bfloat16")
    with pytest.raises(ValueError):
        make_tiny_checkpoint(tmp_path, seed=0, hidden_size=48)
    with pytest.raises(ValueError):
        make_tiny_checkpoint(tmp_path, seed=0, variant=-1)
