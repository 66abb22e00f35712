#!/usr/bin/env python3
"""Converts a llama-architecture GGUF (SmolLM2) into a Hugging Face model folder.

Run by `cargo xtask model`:
    python gguf_to_hf.py --gguf FILE.gguf --out DIR

Writes DIR/{config.json, model.safetensors, tokenizer.json, tokenizer_config.json,
special_tokens_map.json, generation_config.json}, the layout `mlx_lm.convert` reads.

  * Weights: every tensor is dequantized with gguf's own `gguf.quants.dequantize`
    (Q8_0, Q4_1, ... -> float32) and stored as float32. llama.cpp's converter permutes
    the rows of attn_q / attn_k for its interleaved RoPE; that permutation is undone so
    the weights fit Hugging Face's (and MLX's) half-split RoPE; `check_unpermute`
    verifies that with RoPE itself on every layer.
  * config.json: LlamaForCausalLM from the GGUF metadata.
  * Tokenizer: byte-level BPE built with `tokenizers` from the GGUF's vocabulary and
    merges; the control tokens become special added tokens; the chat template goes
    into tokenizer_config.json.
"""

import argparse
import json
import sys
from pathlib import Path

import gguf
import numpy as np


def field(reader, key, default=None):
    f = reader.fields.get(key)
    if f is None:
        return default
    return f.contents()


def f32_round(x):
    """The shortest decimal of a float32 metadata value (1e-05, not 9.99999974e-06)."""
    return float(str(np.float32(x)))


def unpermute(w, n_head):
    """Inverse of llama.cpp's convert_hf_to_gguf `permute`:
    w.reshape(n_head, 2, rows // n_head // 2, *rest).swapaxes(1, 2).reshape(w.shape)."""
    rows = w.shape[0]
    return w.reshape(n_head, rows // n_head // 2, 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def check_unpermute(raw, weights, n_head, n_kv_head, head_dim, rope_base):
    """Checks the q/k rows against RoPE itself, layer by layer: the GGUF's own q/k with
    llama.cpp's RoPE for llama (adjacent pairs rotate: MLX `traditional=True`) must give
    the same attention scores as the converted q/k with the half-split RoPE of Hugging
    Face and MLX (`traditional=False`). Returns the worst relative difference."""
    import mlx.core as mx

    rng = np.random.default_rng(0)
    rep = n_head // n_kv_head
    worst = 0.0

    def scores(wq, wk, x, traditional):
        n = x.shape[0]
        q = mx.array(x @ wq.T).reshape(n, n_head, head_dim).transpose(1, 0, 2)
        k = mx.array(x @ wk.T).reshape(n, n_kv_head, head_dim).transpose(1, 0, 2)
        q = mx.fast.rope(q, head_dim, traditional=traditional, base=rope_base, scale=1.0, offset=0)
        k = mx.fast.rope(k, head_dim, traditional=traditional, base=rope_base, scale=1.0, offset=0)
        return np.array(q @ mx.repeat(k, rep, axis=0).transpose(0, 2, 1))

    for layer, (raw_q, raw_k) in sorted(raw.items()):
        wq = weights[f"model.layers.{layer}.self_attn.q_proj.weight"]
        wk = weights[f"model.layers.{layer}.self_attn.k_proj.weight"]
        x = rng.standard_normal((16, wq.shape[1])).astype(np.float32)
        ours = scores(wq, wk, x, False)
        theirs = scores(raw_q, raw_k, x, True)
        worst = max(worst, float(np.abs(ours - theirs).max() / np.abs(theirs).max()))
    return worst


LAYER_NAMES = {
    "attn_norm": "input_layernorm",
    "ffn_norm": "post_attention_layernorm",
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
}
TOP_NAMES = {
    "token_embd": "model.embed_tokens",
    "output_norm": "model.norm",
    "output": "lm_head",
}


def hf_name(name):
    base, _, suffix = name.rpartition(".")
    parts = base.split(".")
    if parts[0] == "blk" and len(parts) == 3 and parts[2] in LAYER_NAMES:
        return f"model.layers.{parts[1]}.{LAYER_NAMES[parts[2]]}.{suffix}"
    if base in TOP_NAMES:
        return f"{TOP_NAMES[base]}.{suffix}"
    raise SystemExit(f"unknown GGUF tensor {name}")


def convert_weights(reader, n_head, n_kv_head):
    """HF-named float32 weights, the count per GGUF type, and the raw q/k per layer."""
    weights = {}
    kinds = {}
    raw = {}
    for t in reader.tensors:
        w = gguf.quants.dequantize(t.data, t.tensor_type)
        w = np.asarray(w, dtype=np.float32)
        # GGUF lists dims innermost first; numpy data is already [rows, cols].
        want = tuple(int(d) for d in reversed(t.shape.tolist()))
        w = w.reshape(want)
        name = hf_name(t.name)
        if name.endswith(("self_attn.q_proj.weight", "self_attn.k_proj.weight")):
            layer = int(name.split(".")[2])
            is_q = "q_proj" in name
            raw.setdefault(layer, [None, None])[0 if is_q else 1] = w
            w = unpermute(w, n_head if is_q else n_kv_head)
        weights[name] = np.ascontiguousarray(w)
        kinds[t.tensor_type.name] = kinds.get(t.tensor_type.name, 0) + 1
    return weights, kinds, raw


def build_tokenizer(reader, out):
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, processors

    tokens = [str(t) for t in field(reader, "tokenizer.ggml.tokens")]
    types = [int(t) for t in field(reader, "tokenizer.ggml.token_type")]
    merges = [str(m) for m in field(reader, "tokenizer.ggml.merges")]
    model_kind = field(reader, "tokenizer.ggml.model")
    pre = field(reader, "tokenizer.ggml.pre")
    if model_kind != "gpt2":
        raise SystemExit(f"tokenizer.ggml.model is {model_kind!r}; only byte-level BPE ('gpt2') is handled")
    vocab = {tok: i for i, tok in enumerate(tokens)}
    bpe = models.BPE(
        vocab=vocab,
        merges=[tuple(m.split(" ", 1)) for m in merges],
        unk_token=None,
        fuse_unk=False,
        byte_fallback=False,
    )
    tok = Tokenizer(bpe)
    # llama.cpp's "smollm" pre-tokenizer (like "starcoder") splits every digit apart
    # before the GPT-2 byte-level split; SmolLM2's own tokenizer.json does the same.
    if pre in ("smollm", "starcoder", "refact", "codeshell"):
        tok.pre_tokenizer = pre_tokenizers.Sequence(
            [
                pre_tokenizers.Digits(individual_digits=True),
                pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=True, use_regex=True),
            ]
        )
    elif pre in ("gpt2", "default", None):
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=True, use_regex=True)
    else:
        raise SystemExit(f"tokenizer.ggml.pre {pre!r} is not handled")
    tok.decoder = decoders.ByteLevel(add_prefix_space=True, trim_offsets=True, use_regex=True)
    tok.post_processor = processors.ByteLevel(add_prefix_space=True, trim_offsets=False, use_regex=True)
    # Token type 3 is llama.cpp's CONTROL.
    specials = [tokens[i] for i, ty in enumerate(types) if ty == 3]
    tok.add_special_tokens([AddedToken(s, special=True, normalized=False) for s in specials])
    tok.save(str(out / "tokenizer.json"))

    def tok_at(key):
        i = field(reader, key)
        return (tokens[int(i)], int(i)) if i is not None else (None, None)

    bos, bos_id = tok_at("tokenizer.ggml.bos_token_id")
    eos, eos_id = tok_at("tokenizer.ggml.eos_token_id")
    unk, _ = tok_at("tokenizer.ggml.unknown_token_id")
    pad, pad_id = tok_at("tokenizer.ggml.padding_token_id")
    template = field(reader, "tokenizer.chat_template")
    special_map = {"bos_token": bos, "eos_token": eos, "unk_token": unk, "pad_token": pad}
    special_map = {k: v for k, v in special_map.items() if v is not None}
    special_map["additional_special_tokens"] = [s for s in specials if s not in special_map.values()]
    config = {
        "tokenizer_class": "GPT2Tokenizer",
        "add_bos_token": bool(field(reader, "tokenizer.ggml.add_bos_token", False)),
        "add_eos_token": bool(field(reader, "tokenizer.ggml.add_eos_token", False)),
        "add_prefix_space": False,
        "clean_up_tokenization_spaces": False,
        "model_max_length": int(field(reader, "llama.context_length", 2048)),
        **special_map,
    }
    if template:
        config["chat_template"] = str(template)
    (out / "tokenizer_config.json").write_text(json.dumps(config, indent=2) + "\n")
    (out / "special_tokens_map.json").write_text(json.dumps(special_map, indent=2) + "\n")
    gen = {k: v for k, v in {"bos_token_id": bos_id, "eos_token_id": eos_id, "pad_token_id": pad_id}.items() if v is not None}
    (out / "generation_config.json").write_text(json.dumps(gen, indent=2) + "\n")
    return bos_id, eos_id, pad_id


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--gguf", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument(
        "--torch-dtype",
        default="bfloat16",
        help="torch_dtype written to config.json (what mlx_lm.convert casts to when not told); "
        "SmolLM2 was trained and published in bfloat16",
    )
    args = ap.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    reader = gguf.GGUFReader(args.gguf)
    arch = field(reader, "general.architecture")
    if arch != "llama":
        raise SystemExit(f"general.architecture is {arch!r}; only 'llama' is handled")
    n_head = int(field(reader, "llama.attention.head_count"))
    n_kv_head = int(field(reader, "llama.attention.head_count_kv", n_head))
    hidden = int(field(reader, "llama.embedding_length"))
    head_dim = hidden // n_head
    rope_dim = int(field(reader, "llama.rope.dimension_count", head_dim))
    if rope_dim != head_dim:
        raise SystemExit(f"partial rotary (rope dims {rope_dim} of {head_dim}) is not handled")

    weights, kinds, raw = convert_weights(reader, n_head, n_kv_head)
    rope_base = f32_round(field(reader, "llama.rope.freq_base", 10000.0))
    worst = check_unpermute(raw, weights, n_head, n_kv_head, head_dim, rope_base)
    if worst > 1e-4:
        raise SystemExit(f"q/k un-permutation check failed: relative attention score difference {worst:.3g}")
    print(f"[gguf_to_hf] q/k rows checked against RoPE on every layer: relative score difference {worst:.2g}")
    tied = "lm_head.weight" not in weights
    vocab = weights["model.embed_tokens.weight"].shape[0]
    bos_id, eos_id, pad_id = build_tokenizer(reader, out)

    config = {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "hidden_size": hidden,
        "intermediate_size": int(field(reader, "llama.feed_forward_length")),
        "num_hidden_layers": int(field(reader, "llama.block_count")),
        "num_attention_heads": n_head,
        "num_key_value_heads": n_kv_head,
        "head_dim": head_dim,
        "vocab_size": vocab,
        "max_position_embeddings": int(field(reader, "llama.context_length")),
        "rms_norm_eps": f32_round(field(reader, "llama.attention.layer_norm_rms_epsilon")),
        "rope_theta": rope_base,
        "rope_scaling": None,
        "hidden_act": "silu",
        "attention_bias": False,
        "mlp_bias": False,
        "tie_word_embeddings": tied,
        "bos_token_id": bos_id,
        "eos_token_id": eos_id,
        "pad_token_id": pad_id,
        "torch_dtype": args.torch_dtype,
    }
    (out / "config.json").write_text(json.dumps(config, indent=2) + "\n")

    from safetensors.numpy import save_file

    save_file(weights, str(out / "model.safetensors"), metadata={"format": "pt"})
    print(
        f"[gguf_to_hf] {len(weights)} tensors ({', '.join(f'{n} {k}' for k, n in sorted(kinds.items()))}) "
        f"-> {out} (tied embeddings: {tied})"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
