#!/usr/bin/env python3
"""1B-class models with random weights, for `cargo xtask bench`: Llama-3.2-1B's shape, a
Qwen3-MoE of about 1.2B parameters of which about 0.36B run per token, and a Qwen3.5 of
about 0.75B (gated DeltaNet layers with an attention layer every fourth), and gpt-oss 20B's
widths with 2 of its 24 layers (2.8B parameters, 0.83B a token).

Run by `cargo xtask bench` (one call per variant, each into its own folder):
    python make_random_llama.py --variant f16  --out target/models/llama-1b-random-f16
    python make_random_llama.py --variant 4bit --out target/models/llama-1b-random-4bit
    python make_random_llama.py --variant 8bit --out target/models/llama-1b-random-8bit
    python make_random_llama.py --shape qwen3-moe-1b --variant 4bit --out target/models/qwen3-moe-1b-random-4bit
    python make_random_llama.py --shape qwen3.5-0.8b --variant 4bit --out target/models/qwen3.5-0.8b-random-4bit
    python make_random_llama.py --shape gpt-oss-2l --variant mxfp4 --out target/models/gpt-oss-2l-random-mxfp4

The model is mlx-lm's own model class built from the shape's config.json values
(no download: the weights are random, only the shape and the RoPE settings matter for
speed), filled with seeded float16 normals of a small scale, and saved exactly as
`mlx_lm.convert --dtype float16 [-q --q-bits B --q-group-size 64]` would: cast, then
`quantize_model` (with the model class's own quant_predicate, as convert takes it: gpt-oss
keeps its router at 8 bits), then `save_model` + `save_config`. The same seed gives the same
float16 weights for every variant, so the quantized folders are quantizations of the
f16 one. No tokenizer is written: the benchmark feeds token ids.
"""

import argparse
import contextlib
import io
import sys
from pathlib import Path

import mlx.core as mx
from mlx.utils import tree_flatten, tree_unflatten
from mlx_lm.utils import _get_classes, quantize_model, save_config, save_model

# Llama-3.2-1B's config.json (meta-llama/Llama-3.2-1B), minus the token ids of its
# tokenizer, which a random model has no use for.
CONFIG = {
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "hidden_size": 2048,
    "intermediate_size": 8192,
    "num_hidden_layers": 16,
    "num_attention_heads": 32,
    "num_key_value_heads": 8,
    "head_dim": 64,
    "vocab_size": 128256,
    "max_position_embeddings": 131072,
    "rms_norm_eps": 1e-05,
    "rope_theta": 500000.0,
    "rope_scaling": {
        "factor": 32.0,
        "low_freq_factor": 1.0,
        "high_freq_factor": 4.0,
        "original_max_position_embeddings": 8192,
        "rope_type": "llama3",
    },
    "attention_bias": False,
    "mlp_bias": False,
    "hidden_act": "silu",
    "tie_word_embeddings": True,
}
# A Qwen3-MoE scaled to the 1B class: 8 experts, 2 per token, every layer sparse. Experts
# hold 8 x 3 x 2816 x 1024 x 16 = 1.11 G weights, the rest (attention, the tied embedding
# of SmolLM2's 49152-token vocabulary, whose tokenizer `cargo xtask bench` lends it,
# routers) 0.09 G: 1.20 G in all, 0.36 G per token.
QWEN3_MOE_1B = {
    "architectures": ["Qwen3MoeForCausalLM"],
    "model_type": "qwen3_moe",
    "hidden_size": 1024,
    "intermediate_size": 2816,
    "moe_intermediate_size": 2816,
    "num_experts": 8,
    "num_experts_per_tok": 2,
    "norm_topk_prob": True,
    "decoder_sparse_step": 1,
    "mlp_only_layers": [],
    "num_hidden_layers": 16,
    "num_attention_heads": 16,
    "num_key_value_heads": 4,
    "head_dim": 64,
    "vocab_size": 49152,
    "max_position_embeddings": 32768,
    "rms_norm_eps": 1e-06,
    "rope_theta": 1000000.0,
    "hidden_act": "silu",
    "tie_word_embeddings": True,
}
# A Qwen3.5 of the 0.8B class (the sizes reported for Qwen3.5-0.8B: hidden 1024, 24 layers,
# 8 heads over 2 KV heads, every fourth layer attending), settings at the top level as
# mlx-lm's qwen3_5 reads them. Gated DeltaNet layers: in_proj_qkv 1024 -> 6144, z 1024 ->
# 2048, out 2048 -> 1024; attention: q 1024 -> 4096 (with its output gate), k, v -> 512,
# o 2048 -> 1024; MLP 3 x 1024 x 3584 in every layer. 18 x 21.5 M + 6 x 18.3 M + the tied
# 248,320-row embedding (254 M) = 0.75 G weights.
QWEN3_5_08B = {
    "model_type": "qwen3_5",
    "hidden_size": 1024,
    "intermediate_size": 3584,
    "num_hidden_layers": 24,
    "num_attention_heads": 8,
    "num_key_value_heads": 2,
    "head_dim": 256,
    "linear_num_key_heads": 16,
    "linear_num_value_heads": 16,
    "linear_key_head_dim": 128,
    "linear_value_head_dim": 128,
    "linear_conv_kernel_dim": 4,
    "full_attention_interval": 4,
    "vocab_size": 248320,
    "max_position_embeddings": 262144,
    "rms_norm_eps": 1e-06,
    "rope_parameters": {"rope_type": "default", "rope_theta": 10000000.0, "partial_rotary_factor": 0.25},
    "tie_word_embeddings": True,
}
# gpt-oss 20B's config.json values (openai/gpt-oss-20b) with 2 of its 24 layers, one
# sliding-window and one full (its alternation): 32 experts of 3 x 2880 x 2880, 4 a token;
# 64 query heads over 8 KV heads of 64; the untied 201,088-row embedding and head. Experts
# 2 x 796 M, attention 2 x 26.6 M, embedding and head 2 x 579 M: 2.81 G weights, of which
# 0.83 G run per token (4 experts of 32, both 579 M matrices counted: the head is read
# whole, the embedding one row).
GPT_OSS_2L = {
    "architectures": ["GptOssForCausalLM"],
    "model_type": "gpt_oss",
    "hidden_size": 2880,
    "intermediate_size": 2880,
    "num_hidden_layers": 2,
    "layer_types": ["sliding_attention", "full_attention"],
    "num_attention_heads": 64,
    "num_key_value_heads": 8,
    "head_dim": 64,
    "num_local_experts": 32,
    "num_experts_per_tok": 4,
    "vocab_size": 201088,
    "rms_norm_eps": 1e-05,
    "sliding_window": 128,
    "rope_theta": 150000,
    "rope_scaling": {
        "rope_type": "yarn",
        "factor": 32.0,
        "beta_fast": 32.0,
        "beta_slow": 1.0,
        "original_max_position_embeddings": 4096,
        "truncate": False,
    },
    "attention_bias": True,
    "tie_word_embeddings": False,
    "swiglu_limit": 7.0,
    "max_position_embeddings": 131072,
}
SHAPES = {"llama-1b": CONFIG, "qwen3-moe-1b": QWEN3_MOE_1B, "qwen3.5-0.8b": QWEN3_5_08B, "gpt-oss-2l": GPT_OSS_2L}
# Small weights (HF's initializer_range for Llama), so activations stay well inside
# float16's range through 16 layers.
WEIGHT_STD = 0.02
NORM_STD = 0.02
SEED = 0
GROUP_SIZE = 64
# Variant -> (bits, mode, group size) of `quantize_model`, None for f16 (mlx_lm.convert's
# -q --q-bits B, or --q-mode mxfp4 / mxfp8, which fix their group size of 32).
VARIANTS = {
    "f16": None,
    "3bit": (3, "affine", GROUP_SIZE),
    "4bit": (4, "affine", GROUP_SIZE),
    "6bit": (6, "affine", GROUP_SIZE),
    "8bit": (8, "affine", GROUP_SIZE),
    "mxfp4": (4, "mxfp4", 32),
    "mxfp8": (8, "mxfp8", 32),
}


# mx.quantize on a whole large matrix keeps several float32 copies of it alive at once
# (gpt-oss-2l's [32, 2880, 2880] experts and 201,088-row embedding ran this machine's 23 GB
# out); groups lie along the last axis, so quantizing a few rows at a time and joining the
# parts gives the same arrays.
QUANTIZE_WHOLE = mx.quantize
PART_ELEMENTS = 1 << 24


def quantize_in_parts(w, *args, **kwargs):
    if w.size <= PART_ELEMENTS:
        return QUANTIZE_WHOLE(w, *args, **kwargs)
    rows = w.reshape(-1, w.shape[-1])
    step = max(1, PART_ELEMENTS // w.shape[-1])
    parts = []
    for r in range(0, rows.shape[0], step):
        part = QUANTIZE_WHOLE(rows[r : r + step], *args, **kwargs)
        mx.eval(part)
        parts.append(part)
    joined = [mx.concatenate([p[i] for p in parts]).reshape(*w.shape[:-1], -1) for i in range(len(parts[0]))]
    mx.eval(joined)
    return joined


def build(config):
    """mlx-lm's model for `config` with seeded random float16 weights."""
    model_class, args_class = _get_classes(config)
    model = model_class(args_class.from_dict(config))
    names = sorted(tree_flatten(model.parameters()))
    keys = mx.random.split(mx.random.key(SEED), len(names))
    params = []
    # One tensor at a time, each evaluated at once, so peak memory stays near the
    # float16 model's size (2.5 GB for llama-1b) rather than a float32 copy of it.
    for k, (name, p) in zip(keys, names):
        if name.endswith("norm.weight"):
            v = 1.0 + NORM_STD * mx.random.normal(p.shape, dtype=mx.float32, key=k)
            v = v.astype(mx.float16)
        else:
            v = mx.random.normal(p.shape, dtype=mx.float16, key=k) * mx.array(WEIGHT_STD, dtype=mx.float16)
        mx.eval(v)
        params.append((name, v))
    model.update(tree_unflatten(params))
    mx.eval(model.parameters())
    return model


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--variant", required=True, choices=sorted(VARIANTS))
    ap.add_argument("--shape", default="llama-1b", choices=sorted(SHAPES))
    ap.add_argument("--out", required=True, help="the model folder to write")
    args = ap.parse_args()
    mx.set_default_device(mx.cpu)
    # No cache of freed buffers: gpt-oss-2l's 2.8 G weights and their quantization's
    # intermediates filled this machine's 23 GB with it.
    mx.set_cache_limit(0)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    model = build(SHAPES[args.shape])
    config = dict(SHAPES[args.shape], torch_dtype="float16")
    quant = VARIANTS[args.variant]
    if quant is not None:
        bits, mode, group_size = quant
        # quantize_model prints a bits-per-weight line; keep the progress output short.
        mx.quantize = quantize_in_parts
        with contextlib.redirect_stdout(io.StringIO()):
            model, config = quantize_model(model, config, group_size, bits, mode=mode)
        # One tensor at a time again: evaluated all at once (by save_model), every matrix's
        # f32 intermediates would be alive together (gpt-oss-2l's ran out of 23 GB).
        for _, v in tree_flatten(model.parameters()):
            mx.eval(v)
    save_model(out, model, donate_model=True)
    save_config(config, config_path=out / "config.json")
    print(f"wrote {args.variant} random {args.shape}-shaped model to {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
