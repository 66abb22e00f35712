#!/usr/bin/env python3
"""Tiny random-weight MLX checkpoints plus mlx-lm's own greedy trajectories, for tests.

Run by `cargo xtask fixtures` (see tests/fixtures/README.md):
    python make_fixtures.py --out tests/fixtures

For every fixture below it builds the model with mlx-lm's own model class, fills it
with seeded random weights, saves it with mlx-lm's save functions as
  <name>/f32/  float32 weights,
  <name>/q4/   mlx-lm 4-bit affine quantization, other tensors bfloat16,
  <name>/q8/   mlx-lm 8-bit affine quantization, other tensors float16,
each quantized one exactly as `mlx_lm.convert --dtype D -q --q-bits B --q-group-size G`
would (cast, then `quantize_model`, then `save_model` + `save_config`), and records
`expected.json` in each folder: mlx-lm's float32 greedy trajectories (40 steps, EOS
ignored) and first-step logits for three fixed prompts.

A seed is kept only when every trajectory of every variant has several distinct
tokens and no step is a near tie (top-2 logit gap below MIN_MARGIN), so that another
float32 implementation can reproduce the ids exactly.

One fixture (`gemma2_window`) needs a reference mlx-lm does not give: mlx-lm's gemma2
ignores `sliding_window`, Hugging Face's Gemma2 slides it on even layers. Its expected
trajectories come from mlx-lm's own gemma2 layers with that mask (see `WindowedGemma2`).
"""

import argparse
import contextlib
import copy
import io
import json
import shutil
import sys
import tempfile
from pathlib import Path

import mlx.core as mx
import mlx_lm
import numpy as np
from mlx.utils import tree_flatten, tree_map_with_path, tree_unflatten
from mlx_lm.models import gemma2
from mlx_lm.models.base import create_causal_mask
from mlx_lm.utils import _get_classes, quantize_model, save_config, save_model
from mlx_lm.convert import mixed_quant_predicate_builder

import oracle

STEPS = 40
# Prompt lengths 1, 5 and 12; every id is below the smallest fixture vocabulary (256).
PROMPTS = [
    [17],
    [1, 34, 201, 17, 88],
    [1, 250, 3, 77, 128, 5, 199, 64, 12, 230, 41, 9],
]
# Quantized variants: bits and the dtype everything that is not packed is stored in.
VARIANTS = {
    "f32": None,
    "q4": (4, "bfloat16"),
    "q8": (8, "float16"),
}
# The other formats MLX writes, made only for the fixtures that list them under "modes", with
# `--modes` (beside the variants above, which they leave as they are): the floating-point
# modes (`mlx_lm.convert --q-mode`), each with the bits and group size it fixes; affine 2, 3,
# 5 and 6 bits (`--q-bits`, at the fixture's group size); and mlx-lm's mixed recipes
# (`--quant-predicate`, its own `mixed_quant_predicate_builder`). Each: (bits, dtype, group
# size or None for the fixture's, mode, recipe).
MODE_VARIANTS = {
    "mxfp4": (4, "bfloat16", 32, "mxfp4", None),
    "nvfp4": (4, "bfloat16", 16, "nvfp4", None),
    "mxfp8": (8, "bfloat16", 32, "mxfp8", None),
    "q2": (2, "bfloat16", None, "affine", None),
    "q3": (3, "bfloat16", None, "affine", None),
    "q5": (5, "float16", None, "affine", None),
    "q6": (6, "bfloat16", None, "affine", None),
    "mixed_3_6": (3, "bfloat16", None, "affine", "mixed_3_6"),
}
# Random weights: embedding entries ~ N(0, embed^2), projections ~ N(0, linear^2 / fan_in),
# norm gains 1 + N(0, norm^2) (the final norm's centred on final_norm, which sets the
# logit scale), biases ~ N(0, bias^2). A fixture's "scales" override these; the gemma
# ones need a small embedding (it is multiplied by sqrt(hidden)) or they repeat a token.
SCALES = {"embed": 1.0, "linear": 3.0, "norm": 0.1, "final_norm": 1.0, "bias": 0.5}
MIN_DISTINCT = 6
MIN_MARGIN = 3e-3
SEED_TRIES = 64

# deepseek_v3 and deepseek_v3_kv_b share the model.
DEEPSEEK_V3_CONFIG = {
    "architectures": ["DeepseekV3ForCausalLM"],
    "model_type": "deepseek_v3",
    "vocab_size": 256,
    "hidden_size": 64,
    "intermediate_size": 128,
    "moe_intermediate_size": 32,
    "num_hidden_layers": 3,
    "num_attention_heads": 4,
    "num_key_value_heads": 4,
    "n_shared_experts": 2,
    "n_routed_experts": 8,
    "routed_scaling_factor": 1.5,
    "kv_lora_rank": 32,
    "q_lora_rank": 32,
    "qk_rope_head_dim": 16,
    "v_head_dim": 32,
    "qk_nope_head_dim": 32,
    "topk_method": "noaux_tc",
    "scoring_func": "sigmoid",
    "norm_topk_prob": True,
    "n_group": 2,
    "topk_group": 1,
    "num_experts_per_tok": 2,
    "moe_layer_freq": 1,
    "first_k_dense_replace": 1,
    "max_position_embeddings": 256,
    "rms_norm_eps": 1e-6,
    "rope_theta": 10000.0,
    "rope_scaling": {"type": "yarn", "factor": 4.0, "original_max_position_embeddings": 16,
                     "beta_fast": 32.0, "beta_slow": 1.0, "mscale": 1.0, "mscale_all_dim": 1.0},
    "attention_bias": False,
    "tie_word_embeddings": False,
    "hidden_act": "silu",
    "bos_token_id": 0,
    "eos_token_id": 0,
}

# gemma2 and gemma2_window share everything but the window.
GEMMA2_CONFIG = {
    "architectures": ["Gemma2ForCausalLM"],
    "model_type": "gemma2",
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 3,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 16,
    "vocab_size": 256,
    "rms_norm_eps": 1e-6,
    "rope_theta": 10000.0,
    "max_position_embeddings": 8192,
    "attn_logit_softcapping": 10.0,
    "final_logit_softcapping": 15.0,
    "query_pre_attn_scalar": 24,
    "sliding_window": 128,
    "hidden_act": "gelu_pytorch_tanh",
    "hidden_activation": "gelu_pytorch_tanh",
    "tie_word_embeddings": True,
    "cache_implementation": "hybrid",
    "bos_token_id": 2,
    "eos_token_id": 1,
    "pad_token_id": 0,
}

FIXTURES = [
    {
        "name": "llama_llama3_tied",
        "about": "llama, rope_scaling llama3 (all three frequency bands used), GQA 4/2, tied embeddings",
        "group_size": 64,
        "modes": ["mxfp4", "nvfp4", "mxfp8", "q2", "q3", "q5", "q6", "mixed_3_6"],
        "config": {
            "architectures": ["LlamaForCausalLM"],
            "model_type": "llama",
            "hidden_size": 64,
            "intermediate_size": 128,
            "num_hidden_layers": 2,
            "num_attention_heads": 4,
            "num_key_value_heads": 2,
            "head_dim": 16,
            "vocab_size": 256,
            "rms_norm_eps": 1e-5,
            "rope_theta": 500000.0,
            "rope_scaling": {
                "factor": 8.0,
                "low_freq_factor": 1.0,
                "high_freq_factor": 4.0,
                "original_max_position_embeddings": 64,
                "rope_type": "llama3",
            },
            "max_position_embeddings": 512,
            "tie_word_embeddings": True,
            "attention_bias": False,
            "mlp_bias": False,
            "hidden_act": "silu",
            "bos_token_id": 1,
            "eos_token_id": 2,
        },
    },
    {
        "name": "llama_linear_untied",
        "about": "llama, rope_scaling linear factor 2 (old `type` key), MHA, untied lm_head, group size 32",
        "group_size": 32,
        "config": {
            "architectures": ["LlamaForCausalLM"],
            "model_type": "llama",
            "hidden_size": 96,
            "intermediate_size": 192,
            "num_hidden_layers": 2,
            "num_attention_heads": 3,
            "num_key_value_heads": 3,
            "vocab_size": 320,
            "rms_norm_eps": 1e-6,
            "rope_theta": 10000.0,
            "rope_scaling": {"type": "linear", "factor": 2.0},
            "max_position_embeddings": 512,
            "tie_word_embeddings": False,
            "hidden_act": "silu",
            "bos_token_id": 1,
            "eos_token_id": 2,
        },
    },
    {
        "name": "mistral",
        "about": "mistral (mlx-lm runs it as llama), GQA 4/1, head_dim 16, rope_theta 1e6, untied; "
        "its config's sliding_window applies to no layer (no layer_types), as in mlx-lm; "
        "top-2 gaps of at least 0.01, so that f16 weights keep f32's choices (gate.rs)",
        "group_size": 64,
        "min_margin": 0.01,
        "config": {
            "architectures": ["MistralForCausalLM"],
            "model_type": "mistral",
            "hidden_size": 64,
            "intermediate_size": 192,
            "num_hidden_layers": 2,
            "num_attention_heads": 4,
            "num_key_value_heads": 1,
            "head_dim": 16,
            "vocab_size": 288,
            "rms_norm_eps": 1e-5,
            "rope_theta": 1000000.0,
            "sliding_window": 4096,
            "max_position_embeddings": 32768,
            "tie_word_embeddings": False,
            "hidden_act": "silu",
            "bos_token_id": 1,
            "eos_token_id": 2,
        },
    },
    {
        "name": "phi3",
        "about": "phi3 shaped like Phi-4-mini: fused qkv_proj and gate_up_proj, partial_rotary_factor 0.75 "
        "(12 of head_dim 16 rotate), rope_scaling longrope with long factors and max/original positions "
        "131072/4096 (mscale 1.19), GQA 4/2, untied; top-2 gaps of at least 0.01, so that f16 weights keep "
        "f32's choices (gate.rs)",
        "group_size": 64,
        "min_margin": 0.01,
        "seed": 27,
        "config": {
            "architectures": ["Phi3ForCausalLM"],
            "model_type": "phi3",
            "hidden_size": 64,
            "intermediate_size": 128,
            "num_hidden_layers": 2,
            "num_attention_heads": 4,
            "num_key_value_heads": 2,
            "vocab_size": 320,
            "rms_norm_eps": 1e-5,
            "rope_theta": 10000.0,
            "partial_rotary_factor": 0.75,
            "rope_scaling": {
                "type": "longrope",
                "long_factor": [1.0, 1.25, 2.0, 3.5, 6.0, 11.0],
                "short_factor": [1.0, 1.0, 1.0, 1.1, 1.2, 1.5],
            },
            "max_position_embeddings": 131072,
            "original_max_position_embeddings": 4096,
            "sliding_window": 262144,
            "tie_word_embeddings": False,
            "hidden_act": "silu",
            "bos_token_id": 1,
            "eos_token_id": 2,
        },
    },
    {
        "name": "mixtral",
        "about": "mixtral: llama attention (GQA 4/1), every layer a block_sparse_moe of 4 SwiGLU experts, "
        "top 2 by logit then softmax over the two; untied",
        "group_size": 64,
        "config": {
            "architectures": ["MixtralForCausalLM"],
            "model_type": "mixtral",
            "hidden_size": 64,
            "intermediate_size": 128,
            "num_hidden_layers": 2,
            "num_attention_heads": 4,
            "num_key_value_heads": 1,
            "num_local_experts": 4,
            "num_experts_per_tok": 2,
            "vocab_size": 256,
            "rms_norm_eps": 1e-5,
            "rope_theta": 1000000.0,
            "max_position_embeddings": 32768,
            "tie_word_embeddings": False,
            "hidden_act": "silu",
            "bos_token_id": 1,
            "eos_token_id": 2,
        },
    },
    {
        "name": "qwen2_moe",
        "about": "qwen2_moe: qwen2 attention (q/k/v biases, GQA 4/2), every layer 4 experts, top 2 of the "
        "softmax (not renormalised), plus a shared expert gated by sigmoid(shared_expert_gate); untied",
        "group_size": 64,
        "config": {
            "architectures": ["Qwen2MoeForCausalLM"],
            "model_type": "qwen2_moe",
            "hidden_size": 64,
            "intermediate_size": 128,
            "moe_intermediate_size": 64,
            "shared_expert_intermediate_size": 128,
            "num_experts": 4,
            "num_experts_per_tok": 2,
            "num_hidden_layers": 2,
            "num_attention_heads": 4,
            "num_key_value_heads": 2,
            "vocab_size": 288,
            "rms_norm_eps": 1e-6,
            "rope_theta": 1000000.0,
            "max_position_embeddings": 4096,
            "tie_word_embeddings": False,
            "hidden_act": "silu",
            "bos_token_id": 1,
            "eos_token_id": 2,
        },
    },
    {
        "name": "qwen2",
        "about": "qwen2, random non-zero q/k/v biases, GQA 4/2, tied embeddings",
        "group_size": 64,
        "config": {
            "architectures": ["Qwen2ForCausalLM"],
            "model_type": "qwen2",
            "hidden_size": 64,
            "intermediate_size": 128,
            "num_hidden_layers": 2,
            "num_attention_heads": 4,
            "num_key_value_heads": 2,
            "vocab_size": 384,
            "rms_norm_eps": 1e-6,
            "rope_theta": 1000000.0,
            "max_position_embeddings": 4096,
            "tie_word_embeddings": True,
            "hidden_act": "silu",
            "bos_token_id": 1,
            "eos_token_id": 2,
        },
    },
    {
        "name": "qwen3",
        "about": "qwen3, q/k RMSNorm, head_dim 32 with hidden 64 and 4 heads, untied; "
        "intermediate 176 is not a multiple of the group size 64, so quantization leaves down_proj dense; "
        "rope_theta and a YaRN rope_scaling (factor 4 over 32 original positions) nested in "
        "rope_parameters as transformers >= 5 writes them",
        "group_size": 64,
        "config": {
            "architectures": ["Qwen3ForCausalLM"],
            "model_type": "qwen3",
            "hidden_size": 64,
            "intermediate_size": 176,
            "num_hidden_layers": 2,
            "num_attention_heads": 4,
            "num_key_value_heads": 2,
            "head_dim": 32,
            "vocab_size": 448,
            "rms_norm_eps": 1e-6,
            "rope_scaling": None,
            "rope_parameters": {
                "rope_type": "yarn",
                "rope_theta": 1000000.0,
                "factor": 4.0,
                "original_max_position_embeddings": 32,
            },
            "max_position_embeddings": 4096,
            "tie_word_embeddings": False,
            "attention_bias": False,
            "hidden_act": "silu",
            "bos_token_id": 1,
            "eos_token_id": 2,
        },
    },
    {
        "name": "qwen3_moe",
        "about": "qwen3_moe: qwen3 attention (q/k norms, head_dim 16), 8 experts, top 2 of the softmax "
        "renormalised (norm_topk_prob); layer 1 of 3 is in mlp_only_layers (a dense MLP); the router "
        "is quantized at 8 bits as mlx-lm's quant_predicate asks; untied; top-2 gaps of at least 0.01, "
        "so that f16 weights keep f32's choices (gate.rs)",
        "group_size": 64,
        "min_margin": 0.01,
        "seed": 25,
        "modes": ["mxfp8"],
        "config": {
            "architectures": ["Qwen3MoeForCausalLM"],
            "model_type": "qwen3_moe",
            "hidden_size": 64,
            "intermediate_size": 128,
            "moe_intermediate_size": 64,
            "num_experts": 8,
            "num_experts_per_tok": 2,
            "norm_topk_prob": True,
            "decoder_sparse_step": 1,
            "mlp_only_layers": [1],
            "num_hidden_layers": 3,
            "num_attention_heads": 4,
            "num_key_value_heads": 2,
            "head_dim": 16,
            "vocab_size": 320,
            "rms_norm_eps": 1e-6,
            "rope_theta": 1000000.0,
            "max_position_embeddings": 4096,
            "tie_word_embeddings": False,
            "hidden_act": "silu",
            "bos_token_id": 1,
            "eos_token_id": 2,
        },
    },
    {
        "name": "qwen3_next",
        "about": "qwen3_next: layers 0 and 2 gated DeltaNet (fused in_proj_qkvz/in_proj_ba, 2 key heads, "
        "4 value heads, conv kernel 4), layer 1 gated attention (q/k norms, half the head rotated); "
        "experts (4, top 2, shared expert) in layers 0 and 2, layer 1 in mlp_only_layers; untied; "
        "margins of 0.01",
        "group_size": 64,
        "min_margin": 0.01,
        "seed": 20,
        "config": {
            "architectures": ["Qwen3NextForCausalLM"],
            "model_type": "qwen3_next",
            "hidden_size": 64,
            "intermediate_size": 128,
            "num_hidden_layers": 3,
            "num_attention_heads": 4,
            "num_key_value_heads": 2,
            "head_dim": 16,
            "linear_num_value_heads": 4,
            "linear_num_key_heads": 2,
            "linear_key_head_dim": 16,
            "linear_value_head_dim": 16,
            "linear_conv_kernel_dim": 4,
            "full_attention_interval": 2,
            "num_experts": 4,
            "num_experts_per_tok": 2,
            "decoder_sparse_step": 1,
            "shared_expert_intermediate_size": 64,
            "moe_intermediate_size": 64,
            "mlp_only_layers": [1],
            "norm_topk_prob": True,
            "vocab_size": 256,
            "rms_norm_eps": 1e-6,
            "rope_theta": 10000.0,
            "partial_rotary_factor": 0.5,
            "max_position_embeddings": 4096,
            "tie_word_embeddings": False,
            "hidden_act": "silu",
            "bos_token_id": 1,
            "eos_token_id": 2,
        },
    },
    {
        "name": "qwen3_5",
        "about": "qwen3_5 (dense, settings at the top level, weights under language_model.): layers 0 "
        "and 2 gated DeltaNet (split in_proj_qkv/z/b/a, 2 key heads, 4 value heads, conv kernel 4), "
        "layer 1 gated attention with rope_parameters (a quarter of the head rotated); untied; "
        "margins of 0.01",
        "group_size": 64,
        "min_margin": 0.01,
        "seed": 0,
        "config": {
            "model_type": "qwen3_5",
            "hidden_size": 64,
            "intermediate_size": 128,
            "num_hidden_layers": 3,
            "num_attention_heads": 4,
            "num_key_value_heads": 2,
            "head_dim": 32,
            "linear_num_value_heads": 4,
            "linear_num_key_heads": 2,
            "linear_key_head_dim": 16,
            "linear_value_head_dim": 16,
            "linear_conv_kernel_dim": 4,
            "full_attention_interval": 2,
            "vocab_size": 256,
            "rms_norm_eps": 1e-6,
            "rope_parameters": {
                "rope_type": "default",
                "rope_theta": 10000.0,
                "partial_rotary_factor": 0.25,
                "mrope_section": [2, 1, 1],
            },
            "max_position_embeddings": 4096,
            "tie_word_embeddings": False,
            "bos_token_id": 1,
            "eos_token_id": 2,
        },
    },
    {
        "name": "qwen3_5_moe",
        "about": "qwen3_5_moe (settings under text_config, as the multimodal checkpoints have them; "
        "weights under language_model.): 4 layers, full_attention_interval 4 (layer 3 attends), "
        "experts (4, top 2, renormalised, shared expert) in every layer, tied embeddings; margins of 0.01",
        "group_size": 64,
        "min_margin": 0.01,
        "seed": 5,
        "config": {
            "model_type": "qwen3_5_moe",
            "text_config": {
                "model_type": "qwen3_5_moe_text",
                "hidden_size": 64,
                "intermediate_size": 128,
                "num_hidden_layers": 4,
                "num_attention_heads": 4,
                "num_key_value_heads": 2,
                "head_dim": 16,
                "linear_num_value_heads": 4,
                "linear_num_key_heads": 4,
                "linear_key_head_dim": 16,
                "linear_value_head_dim": 16,
                "linear_conv_kernel_dim": 4,
                "full_attention_interval": 4,
                "num_experts": 4,
                "num_experts_per_tok": 2,
                "shared_expert_intermediate_size": 64,
                "moe_intermediate_size": 64,
                "vocab_size": 256,
                "rms_norm_eps": 1e-6,
                "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.5},
                "max_position_embeddings": 4096,
                "tie_word_embeddings": True,
            },
            "vision_config": {"model_type": "qwen3_5_moe_vision"},
        },
    },
    {
        "name": "smollm3",
        "about": "smollm3 (llama with NoPE layers): 3 layers, no_rope_layer_interval 2, so layer 1 "
        "attends without rotary embeddings, tied embeddings, GQA; margins of 0.01 so that packed's "
        "quantized activations keep mlx-lm's tokens",
        "group_size": 64,
        "min_margin": 0.01,
        "seed": 9,
        "config": {
            "architectures": ["SmolLM3ForCausalLM"],
            "model_type": "smollm3",
            "hidden_size": 64,
            "intermediate_size": 128,
            "num_hidden_layers": 3,
            "num_attention_heads": 4,
            "num_key_value_heads": 2,
            "vocab_size": 384,
            "rms_norm_eps": 1e-6,
            "rope_theta": 2000000.0,
            "rope_scaling": None,
            "max_position_embeddings": 4096,
            "no_rope_layer_interval": 2,
            "tie_word_embeddings": True,
            "attention_bias": False,
            "mlp_bias": False,
            "hidden_act": "silu",
            "bos_token_id": 1,
            "eos_token_id": 2,
        },
    },
    {
        "name": "lfm2",
        "about": "lfm2: 4 layers, layer 2 full attention (q/k layernorms, head_dim hidden/heads), "
        "the others gated short convolutions (kernel 3, with biases); block_ff_dim 192 auto-adjusted "
        "to 128 (multiple of 32); tied embeddings, final norm `embedding_norm`; margins of 0.01",
        "group_size": 64,
        "min_margin": 0.01,
        "seed": 0,
        "config": {
            "architectures": ["Lfm2ForCausalLM"],
            "model_type": "lfm2",
            "vocab_size": 256,
            "hidden_size": 64,
            "num_hidden_layers": 4,
            "num_attention_heads": 4,
            "num_key_value_heads": 2,
            "max_position_embeddings": 4096,
            "norm_eps": 1e-5,
            "conv_bias": True,
            "conv_L_cache": 3,
            "block_dim": 64,
            "block_ff_dim": 192,
            "block_multiple_of": 32,
            "block_ffn_dim_multiplier": 1.0,
            "block_auto_adjust_ff_dim": True,
            "rope_theta": 1000000.0,
            "layer_types": ["conv", "conv", "full_attention", "conv"],
            "tie_embedding": True,
            "bos_token_id": 1,
            "eos_token_id": 7,
            "pad_token_id": 0,
        },
    },
    {
        "name": "gemma",
        "scales": {"embed": 0.25, "final_norm": 4.0},
        "about": "gemma, GeGLU (mlx-lm: exact erf gelu), RMSNorm (1+w), embedding scale sqrt(hidden), "
        "MQA, head_dim 32 * 4 heads != hidden 64, tied",
        "group_size": 64,
        "config": {
            "architectures": ["GemmaForCausalLM"],
            "model_type": "gemma",
            "hidden_size": 64,
            "intermediate_size": 128,
            "num_hidden_layers": 2,
            "num_attention_heads": 4,
            "num_key_value_heads": 1,
            "head_dim": 32,
            "vocab_size": 256,
            "rms_norm_eps": 1e-6,
            "rope_theta": 10000.0,
            "max_position_embeddings": 8192,
            "hidden_act": "gelu_pytorch_tanh",
            "hidden_activation": "gelu_pytorch_tanh",
            "tie_word_embeddings": True,
            "bos_token_id": 2,
            "eos_token_id": 1,
            "pad_token_id": 0,
        },
    },
    {
        "name": "gemma2",
        "scales": {"embed": 0.02, "final_norm": 25.0},
        "about": "gemma2, attention (10) and final (15) logit soft-capping, low enough to matter, query_pre_attn_scalar 24 != head_dim 16, "
        "pre/post feed-forward norms, sliding window 128 on even layers (above the 52 tested positions: "
        "mlx-lm's gemma2 ignores it)",
        "group_size": 32,
        "config": GEMMA2_CONFIG,
    },
    {
        # Same sizes and scales as gemma2, but a window far below the tested context.
        "name": "gemma2_window",
        "scales": {"embed": 0.02, "final_norm": 25.0},
        "reference": "gemma2_even_layer_window",
        "about": "gemma2 with sliding window 6 on even layers (0 and 2 local, 1 global), below the 52 tested "
        "positions; reference: mlx-lm gemma2 classes with HF's even-layer sliding-window mask "
        "(mlx-lm itself ignores the window)",
        "group_size": 32,
        "config": {**GEMMA2_CONFIG, "sliding_window": 6},
    },
    {
        "name": "gemma3_text",
        "scales": {"embed": 0.01, "linear": 4.0, "final_norm": 40.0, "norm": 0.3},
        "about": "gemma3_text, q/k norm, pattern 3 (layers 0,1,3 local rope base 10000 with sliding window 8, "
        "layer 2 global rope base 1e6), query_pre_attn_scalar 48, tied; the window is smaller than the "
        "tested context because mlx-lm's gemma3_text honours it",
        "group_size": 64,
        "config": {
            "architectures": ["Gemma3ForCausalLM"],
            "model_type": "gemma3_text",
            "hidden_size": 64,
            "intermediate_size": 128,
            "num_hidden_layers": 4,
            "num_attention_heads": 4,
            "num_key_value_heads": 1,
            "head_dim": 32,
            "vocab_size": 256,
            "rms_norm_eps": 1e-6,
            "rope_theta": 1000000.0,
            "rope_local_base_freq": 10000.0,
            "rope_scaling": None,
            "query_pre_attn_scalar": 48,
            "sliding_window": 8,
            "sliding_window_pattern": 3,
            "layer_types": ["sliding_attention", "sliding_attention", "full_attention", "sliding_attention"],
            "max_position_embeddings": 32768,
            "final_logit_softcapping": None,
            "attn_logit_softcapping": None,
            "hidden_activation": "gelu_pytorch_tanh",
            "tie_word_embeddings": True,
            "bos_token_id": 2,
            "eos_token_id": 1,
            "pad_token_id": 0,
        },
    },
    {
        "name": "gemma3",
        "scales": {"embed": 0.01, "linear": 4.0, "final_norm": 40.0, "norm": 0.3},
        "about": "gemma3, the multimodal wrapper as released (Gemma 3 4B/12B/27B): gemma3_text's settings "
        "under text_config without head counts (mlx-lm's defaults, 8 heads over 4 kv heads), vocab_size at "
        "the top level, weights under language_model.; rope_scaling linear 8 as the 4B has it; pattern 3 with "
        "sliding window 8, smaller than the tested context; tied",
        "group_size": 64,
        "seed": 3,
        "config": {
            "architectures": ["Gemma3ForConditionalGeneration"],
            "model_type": "gemma3",
            "vocab_size": 256,
            "text_config": {
                "model_type": "gemma3_text",
                "hidden_size": 64,
                "intermediate_size": 128,
                "num_hidden_layers": 4,
                "head_dim": 16,
                "rms_norm_eps": 1e-6,
                "rope_theta": 1000000.0,
                "rope_local_base_freq": 10000.0,
                "rope_scaling": {"rope_type": "linear", "factor": 8.0},
                "query_pre_attn_scalar": 16,
                "sliding_window": 8,
                "sliding_window_pattern": 3,
                "max_position_embeddings": 131072,
                "final_logit_softcapping": None,
                "attn_logit_softcapping": None,
                "hidden_activation": "gelu_pytorch_tanh",
            },
            "vision_config": {"model_type": "siglip_vision_model", "hidden_size": 32},
            "mm_tokens_per_image": 256,
            "boi_token_index": 255999,
            "eos_token_id": [1, 106],
        },
    },
    {
        "name": "gemma4_text",
        "scales": {"embed": 0.01, "linear": 4.0, "final_norm": 40.0, "norm": 0.3},
        "about": "gemma4_text (Gemma 4 E2B/E4B's shape): layers sliding, sliding, full, sliding, full; sliding "
        "layers 2 kv heads of 16 (window 8, smaller than the tested context; RoPE base 1e4), full layers "
        "global_head_dim 32 (proportional RoPE turning a quarter of the head, base 1e6); the last 2 layers "
        "KV-shared (layer 3 reads layer 1's keys and values, layer 4 layer 2's) with a double-wide MLP; "
        "per-layer inputs of 32 per layer; plain RMSNorm q/k norms, unscaled v norm, attention scale 1, "
        "layer_scalar, final soft cap 30; tied; group size 32 so the per-layer projections quantize",
        "group_size": 32,
        "min_margin": 0.01,
        "seed": 14,
        "config": {
            "architectures": ["Gemma4ForCausalLM"],
            "model_type": "gemma4_text",
            "hidden_size": 64,
            "intermediate_size": 128,
            "num_hidden_layers": 5,
            "num_attention_heads": 4,
            "num_key_value_heads": 2,
            "head_dim": 16,
            "global_head_dim": 32,
            "vocab_size": 256,
            "vocab_size_per_layer_input": 256,
            "hidden_size_per_layer_input": 32,
            "num_kv_shared_layers": 2,
            "use_double_wide_mlp": True,
            "rms_norm_eps": 1e-6,
            "sliding_window": 8,
            "layer_types": [
                "sliding_attention", "sliding_attention", "full_attention", "sliding_attention", "full_attention",
            ],
            "rope_parameters": {
                "full_attention": {"partial_rotary_factor": 0.25, "rope_theta": 1000000.0, "rope_type": "proportional"},
                "sliding_attention": {"rope_theta": 10000.0, "rope_type": "default"},
            },
            "max_position_embeddings": 131072,
            "final_logit_softcapping": 30.0,
            "attention_k_eq_v": False,
            "enable_moe_block": False,
            "tie_word_embeddings": True,
            "hidden_activation": "gelu_pytorch_tanh",
            "bos_token_id": 2,
            "eos_token_id": 1,
            "pad_token_id": 0,
        },
    },
    {
        "name": "gemma4_moe",
        "scales": {"embed": 0.01, "linear": 4.0, "final_norm": 40.0, "norm": 0.3},
        "about": "gemma4_text with experts (Gemma 4 26B-A4B's shape): every layer's dense MLP beside 8 "
        "experts (GeGLU, width 32) of which the router (input RMS-normed by router.scale * hidden^-0.5, "
        "top 2 logits, softmax over the 2, times per_expert_scale) picks 2, the MLP's and the experts' "
        "outputs normed apart (post_feedforward_layernorm_1, pre/post_feedforward_layernorm_2) and their sum "
        "by post_feedforward_layernorm; attention_k_eq_v full layers (1 global kv head of 32) and sliding "
        "ones (2 kv heads of 16, window 8) by sliding_window_pattern 3; no per-layer inputs, no KV-shared "
        "layers; the router at 8 bits in the quantized variants as mlx-lm's quant_predicate keeps it",
        "group_size": 32,
        "seed": 0,
        "config": {
            "architectures": ["Gemma4ForCausalLM"],
            "model_type": "gemma4_text",
            "hidden_size": 64,
            "intermediate_size": 64,
            "num_hidden_layers": 3,
            "num_attention_heads": 4,
            "num_key_value_heads": 2,
            "num_global_key_value_heads": 1,
            "attention_k_eq_v": True,
            "head_dim": 16,
            "global_head_dim": 32,
            "vocab_size": 256,
            "hidden_size_per_layer_input": 0,
            "num_kv_shared_layers": 0,
            "enable_moe_block": True,
            "num_experts": 8,
            "top_k_experts": 2,
            "moe_intermediate_size": 32,
            "sliding_window": 8,
            "sliding_window_pattern": 3,
            "rms_norm_eps": 1e-6,
            "max_position_embeddings": 131072,
            "final_logit_softcapping": 30.0,
            "tie_word_embeddings": True,
        },
    },
    {
        "name": "gemma4",
        "scales": {"embed": 0.01, "linear": 4.0, "final_norm": 40.0, "norm": 0.3},
        "about": "gemma4, the multimodal wrapper as released (Gemma 4 31B's shape): text_config with "
        "attention_k_eq_v (full layers have no v_proj: the values are the keys as projected, over "
        "num_global_key_value_heads 1 of global_head_dim 32), sliding layers 2 kv heads of 16 with window 8 "
        "by sliding_window_pattern 2 (no layer_types), rope_parameters' defaults (absent), no per-layer "
        "inputs (null), no KV-shared layers; vocab_size at the top level, weights under language_model.; tied",
        "group_size": 32,
        "seed": 0,
        "config": {
            "architectures": ["Gemma4ForConditionalGeneration"],
            "model_type": "gemma4",
            "vocab_size": 256,
            "text_config": {
                "model_type": "gemma4_text",
                "hidden_size": 64,
                "intermediate_size": 128,
                "num_hidden_layers": 4,
                "num_attention_heads": 4,
                "num_key_value_heads": 2,
                "num_global_key_value_heads": 1,
                "attention_k_eq_v": True,
                "head_dim": 16,
                "global_head_dim": 32,
                "hidden_size_per_layer_input": None,
                "num_kv_shared_layers": 0,
                "sliding_window": 8,
                "sliding_window_pattern": 2,
                "rms_norm_eps": 1e-6,
                "max_position_embeddings": 131072,
                "final_logit_softcapping": 30.0,
            },
            "vision_config": {"model_type": "gemma4_vision", "hidden_size": 32},
            "eos_token_id": [1, 106],
        },
    },
    {
        "name": "gpt_oss",
        "about": "gpt_oss (gpt-oss 20B/120B's layers): attention sinks (a learned logit per head in each "
        "softmax), sliding (window 8, smaller than the tested context) and full layers alternating by "
        "default (no layer_types), q/k/v/o biases, yarn RoPE (factor 4 over 16 positions), 8 experts with "
        "biases of which a biased router picks 4 (top 4 logits, softmax over them), the clamped SwiGLU "
        "(alpha 1.702, limit 7); untied; the router at 8 bits in the quantized variants as mlx-lm's "
        "quant_predicate keeps it; also in mxfp4, the format the released checkpoints ship in",
        "group_size": 32,
        "seed": 0,
        "modes": ["mxfp4"],
        "config": {
            "architectures": ["GptOssForCausalLM"],
            "model_type": "gpt_oss",
            "hidden_size": 64,
            "intermediate_size": 64,
            "num_hidden_layers": 2,
            "num_attention_heads": 4,
            "num_key_value_heads": 2,
            "head_dim": 16,
            "num_local_experts": 8,
            "num_experts_per_tok": 4,
            "vocab_size": 256,
            "rms_norm_eps": 1e-5,
            "sliding_window": 8,
            "rope_theta": 150000,
            "rope_scaling": {"rope_type": "yarn", "factor": 4.0, "beta_fast": 32.0, "beta_slow": 1.0,
                             "original_max_position_embeddings": 16, "truncate": False},
            "attention_bias": True,
            "tie_word_embeddings": False,
            "swiglu_limit": 7.0,
            "max_position_embeddings": 4096,
        },
    },
    {
        "name": "granite",
        "scales": {"linear": 40.0, "final_norm": 8.0},
        "about": "granite (IBM Granite 3): llama's layers with its four multipliers (embeddings times 12, "
        "attention scale 0.125 instead of head_dim^-0.5, each block's output times 0.22 before the residual "
        "add, logits divided by 8), q/k/v/o biases (attention_bias), GQA 4/2, tied; mlx-lm's quant_predicate "
        "keeps o_proj and down_proj at 8 bits in the 4-bit variant",
        "group_size": 64,
        "min_margin": 0.01,
        "seed": 0,
        "config": {
            "architectures": ["GraniteForCausalLM"],
            "model_type": "granite",
            "hidden_size": 64,
            "intermediate_size": 128,
            "num_hidden_layers": 2,
            "num_attention_heads": 4,
            "num_key_value_heads": 2,
            "vocab_size": 256,
            "rms_norm_eps": 1e-5,
            "rope_theta": 10000.0,
            "max_position_embeddings": 4096,
            "attention_bias": True,
            "mlp_bias": False,
            "embedding_multiplier": 12.0,
            "attention_multiplier": 0.125,
            "residual_multiplier": 0.22,
            "logits_scaling": 8.0,
            "tie_word_embeddings": True,
            "hidden_act": "silu",
            "bos_token_id": 0,
            "eos_token_id": 0,
        },
    },
    {
        "name": "olmo2",
        "about": "olmo2 (AllenAI OLMo 2): no norm before attention or the MLP, each block's output normed "
        "(post_attention_layernorm, post_feedforward_layernorm) before its residual add; q_norm and k_norm "
        "over all heads' features at once; GQA 4/2, rope_theta 5e5, untied",
        "group_size": 64,
        "min_margin": 0.01,
        "seed": 5,
        "config": {
            "architectures": ["Olmo2ForCausalLM"],
            "model_type": "olmo2",
            "hidden_size": 64,
            "intermediate_size": 128,
            "num_hidden_layers": 2,
            "num_attention_heads": 4,
            "num_key_value_heads": 2,
            "vocab_size": 256,
            "rms_norm_eps": 1e-6,
            "rope_theta": 500000.0,
            "max_position_embeddings": 4096,
            "attention_bias": False,
            "tie_word_embeddings": False,
            "hidden_act": "silu",
            "bos_token_id": 0,
            "eos_token_id": 0,
        },
    },
    {
        "name": "olmo3",
        "about": "olmo3 (AllenAI OLMo 3): olmo2's norms, sliding windows on all but every fourth layer "
        "(no layer_types: mlx-lm's default pattern) with window 8, smaller than the tested context, and a "
        "plain RoPE there; yarn scaling (factor 8 over 16 positions) on the full layer only; GQA 4/2, untied",
        "group_size": 64,
        "seed": 0,
        "config": {
            "architectures": ["Olmo3ForCausalLM"],
            "model_type": "olmo3",
            "hidden_size": 64,
            "intermediate_size": 128,
            "num_hidden_layers": 4,
            "num_attention_heads": 4,
            "num_key_value_heads": 2,
            "vocab_size": 256,
            "rms_norm_eps": 1e-6,
            "rope_theta": 500000.0,
            "rope_scaling": {"rope_type": "yarn", "factor": 8.0, "original_max_position_embeddings": 16,
                             "beta_fast": 32.0, "beta_slow": 1.0},
            "sliding_window": 8,
            "max_position_embeddings": 128,
            "attention_bias": False,
            "tie_word_embeddings": False,
            "hidden_act": "silu",
            "bos_token_id": 0,
            "eos_token_id": 0,
        },
    },
    {
        "name": "glm4",
        "about": "glm4 (GLM-4-0414, dense): traditional RoPE (adjacent pairs) over half of each head "
        "(partial_rotary_factor 0.5), norms before and after each block (input_layernorm, "
        "post_self_attn_layernorm, post_attention_layernorm before the MLP, post_mlp_layernorm), gate and "
        "up stored as one gate_up_proj, q/k/v biases (attention_bias) and none on o, GQA 4/2, untied",
        "group_size": 64,
        "seed": 1,
        "config": {
            "architectures": ["Glm4ForCausalLM"],
            "model_type": "glm4",
            "hidden_size": 64,
            "intermediate_size": 128,
            "num_hidden_layers": 2,
            "num_attention_heads": 4,
            "num_key_value_heads": 2,
            "head_dim": 16,
            "partial_rotary_factor": 0.5,
            "attention_bias": True,
            "vocab_size": 256,
            "rms_norm_eps": 1e-5,
            "rope_theta": 10000.0,
            "max_position_embeddings": 4096,
            "tie_word_embeddings": False,
            "hidden_act": "silu",
            "bos_token_id": 0,
            "eos_token_id": 0,
        },
    },
    {
        "name": "glm4_moe",
        "about": "glm4_moe (GLM-4.5/4.6): layer 0 dense (first_k_dense_replace 1), then 8 routed experts in 4 "
        "groups, the best 2 groups (each worth its two best biased scores) kept, top 3 by sigmoid score plus "
        "e_score_correction_bias, weighted by the unbiased scores renormalised times routed_scaling_factor 2.5, "
        "one plain shared expert; q/k norms (use_qk_norm), half of each head rotated (non-traditional), q/k/v "
        "biases, GQA 4/2, lm_head whatever tie_word_embeddings says",
        "group_size": 64,
        "seed": 3,
        "config": {
            "architectures": ["Glm4MoeForCausalLM"],
            "model_type": "glm4_moe",
            "vocab_size": 256,
            "hidden_size": 64,
            "intermediate_size": 128,
            "max_position_embeddings": 4096,
            "moe_intermediate_size": 64,
            "norm_topk_prob": True,
            "num_attention_heads": 4,
            "num_key_value_heads": 2,
            "head_dim": 16,
            "n_group": 4,
            "topk_group": 2,
            "n_shared_experts": 1,
            "n_routed_experts": 8,
            "routed_scaling_factor": 2.5,
            "num_experts_per_tok": 3,
            "first_k_dense_replace": 1,
            "num_hidden_layers": 3,
            "rms_norm_eps": 1e-5,
            "rope_theta": 10000.0,
            "rope_scaling": None,
            "use_qk_norm": True,
            "tie_word_embeddings": False,
            "attention_bias": True,
            "partial_rotary_factor": 0.5,
            "hidden_act": "silu",
            "bos_token_id": 0,
            "eos_token_id": 0,
        },
    },
    {
        "name": "deepseek_v3",
        "about": "deepseek_v3 (DeepSeek-V3, Kimi K2): multi-head latent attention (queries through q_a_proj, "
        "q_a_layernorm, q_b_proj; one latent of rank 32 and one rotated key of 16 features per position, "
        "embed_q and unembed_out per head), traditional RoPE with yarn (factor 4 over 16 positions, so the "
        "tested context passes it) and the softmax scale's mscale_all_dim factor; layer 0 dense, then 8 "
        "routed experts in 2 groups, the best group kept, top 2 by sigmoid score plus e_score_correction_bias, "
        "renormalised times 1.5, two shared experts as one MLP; untied; group size 32 so the per-head "
        "matrices quantize",
        "group_size": 32,
        "seed": 2,
        "config": DEEPSEEK_V3_CONFIG,
    },
    {
        "name": "deepseek_v3_kv_b",
        "about": "deepseek_v3 as mlx-lm stored it before splitting kv_b_proj into embed_q and unembed_out (the "
        "deepseek_v3 fixture's shape, each head's key and value rows of kv_b_proj over the latent; quantized "
        "with the other layers in q4 and q8, which mlx-lm 0.32.2 dequantizes in bfloat16/float16, splits and "
        "quantizes again at load)",
        "group_size": 32,
        "min_margin": 0.01,
        "seed": 26,
        "kv_b_proj": True,
        "config": DEEPSEEK_V3_CONFIG,
    },
    {
        "name": "ministral3",
        "about": "ministral3 as Ministral 3 ships it (the mistral3 wrapper, text_config of model_type ministral3, "
        "weights under language_model.): rope_parameters with yarn (factor 16) and Llama 4's query scale "
        "(llama_4_scaling_beta 0.1) over original_max_position_embeddings 16, so positions past 16 scale the "
        "queries; layers sliding/full/sliding by layer_types with window 8, smaller than the tested context; "
        "GQA 4/2, head_dim 16, untied (the wrapper's default)",
        "group_size": 64,
        "min_margin": 0.01,
        "seed": 5,
        "config": {
            "architectures": ["Mistral3ForConditionalGeneration"],
            "model_type": "mistral3",
            "text_config": {
                "model_type": "ministral3",
                "hidden_size": 64,
                "intermediate_size": 192,
                "num_hidden_layers": 3,
                "num_attention_heads": 4,
                "num_key_value_heads": 2,
                "head_dim": 16,
                "vocab_size": 288,
                "rms_norm_eps": 1e-5,
                "rope_parameters": {
                    "rope_type": "yarn",
                    "rope_theta": 1000000.0,
                    "factor": 16.0,
                    "original_max_position_embeddings": 16,
                    "beta_fast": 32.0,
                    "beta_slow": 1.0,
                    "mscale": 1.0,
                    "mscale_all_dim": 1.0,
                    "llama_4_scaling_beta": 0.1,
                },
                "max_position_embeddings": 256,
                "layer_types": ["sliding_attention", "full_attention", "sliding_attention"],
                "sliding_window": 8,
                "hidden_act": "silu",
            },
            "vision_config": {"model_type": "pixtral", "hidden_size": 32},
            "image_token_index": 10,
            "spatial_merge_size": 2,
            "bos_token_id": 1,
            "eos_token_id": 2,
        },
    },
    {
        "name": "mistral3",
        "about": "mistral3, the multimodal wrapper of Mistral Small 3.1/3.2 (mlx-lm runs its text model as "
        "llama): a mistral text_config without tie_word_embeddings (untied, mlx-lm's default there), GQA 4/2, "
        "head_dim 16, rope_theta 1e9, weights under language_model.",
        "group_size": 64,
        "min_margin": 0.01,
        "seed": 32,
        "config": {
            "architectures": ["Mistral3ForConditionalGeneration"],
            "model_type": "mistral3",
            "text_config": {
                "model_type": "mistral",
                "hidden_size": 64,
                "intermediate_size": 192,
                "num_hidden_layers": 2,
                "num_attention_heads": 4,
                "num_key_value_heads": 2,
                "head_dim": 16,
                "vocab_size": 288,
                "rms_norm_eps": 1e-5,
                "rope_theta": 1000000000.0,
                "sliding_window": None,
                "max_position_embeddings": 131072,
                "hidden_act": "silu",
            },
            "vision_config": {"model_type": "pixtral", "hidden_size": 32},
            "image_token_index": 10,
            "spatial_merge_size": 2,
            "bos_token_id": 1,
            "eos_token_id": 2,
        },
    },
]


GEMMA_NORMS = {"gemma", "gemma2", "gemma3_text", "gemma3"}


def new_model(config):
    """mlx-lm's model for `config` (unquantized), as its loader builds it for a checkpoint
    without lm_head, with mlx's default initialisation."""
    model_class, args_class = _get_classes(config)
    model = model_class(args_class.from_dict(config))
    if config["model_type"] == "gemma3_text":
        # mlx-lm's gemma3_text ties the embeddings when the checkpoint has no lm_head;
        # its own sanitize drops the module.
        model.sanitize({})
    elif config["model_type"] == "gemma3":
        # The same, on the wrapper's language model.
        model.language_model.sanitize({})
    return model


def build(config, seed, scales):
    """mlx-lm's model for `config`, with seeded random float32 weights."""
    model = new_model(config)
    rng = np.random.default_rng(seed)
    one_plus = config["model_type"] in GEMMA_NORMS
    params = {}
    for name, p in sorted(tree_flatten(model.parameters())):
        shape = p.shape
        if name.endswith("norm.weight"):
            # Norm gains near 1, the final norm's near `final_norm` (it sets the logit
            # scale); gemma stores w with the gain being 1 + w.
            final = name in ("model.norm.weight", "language_model.model.norm.weight", "model.embedding_norm.weight")
            gain = scales["final_norm"] if final else 1.0
            base = gain - 1.0 if one_plus else gain
            v = base + scales["norm"] * rng.standard_normal(shape)
        elif name.endswith(".bias"):
            v = scales["bias"] * rng.standard_normal(shape)
        elif name.endswith("layer_scalar") or name.endswith("router.scale") or name.endswith("per_expert_scale"):
            # Gemma 4's output scale of each layer, its router's input norm and its experts'
            # output scales: near 1, as trained ones are.
            v = 1.0 + scales["norm"] * rng.standard_normal(shape)
        elif name.endswith("A_log"):
            # A gated DeltaNet's decay rates, log of A in (1, 8) like mlx-lm's initial
            # uniform(0, 16).
            v = np.log(rng.uniform(1.0, 8.0, shape))
        elif name.endswith("conv1d.weight") or name.endswith("conv.conv.weight"):
            # [channels, kernel, 1]: scaled by the kernel's width.
            v = scales["linear"] / np.sqrt(shape[1]) * rng.standard_normal(shape)
        elif name.endswith("embed_tokens.weight"):
            v = scales["embed"] * rng.standard_normal(shape)
        else:
            v = scales["linear"] / np.sqrt(shape[-1]) * rng.standard_normal(shape)
        params[name] = mx.array(v.astype(np.float32))
    model.update(tree_unflatten(list(params.items())))
    mx.eval(model.parameters())
    return model


def save_variant(model, config, out, bits, dtype, group_size, mode="affine", recipe=None):
    """Saves like mlx_lm.convert: cast floating tensors, quantize (with `recipe`, one of
    mlx-lm's mixed recipes, as `--quant-predicate` does), save weights + config."""
    config = copy.deepcopy(config)
    if bits is None:
        config["torch_dtype"] = "float32"
    else:
        config["torch_dtype"] = dtype
        target = getattr(mx, dtype)
        cast_predicate = getattr(model, "cast_predicate", lambda _: True)

        def set_dtype(k, v):
            if cast_predicate(k) and mx.issubdtype(v.dtype, mx.floating):
                return v.astype(target)
            return v

        model.update(tree_map_with_path(set_dtype, model.parameters()))
        # quantize_model prints a bits-per-weight line; keep the progress output short.
        predicate = mixed_quant_predicate_builder(recipe, model, group_size) if recipe else None
        with contextlib.redirect_stdout(io.StringIO()):
            model, config = quantize_model(model, config, group_size, bits, mode=mode, quant_predicate=predicate)
    save_model(out, model)
    save_config(config, config_path=Path(out) / "config.json")


def fuse_kv_b_proj(model, out, bits, dtype, group_size):
    """Rewrites a saved deepseek_v3 folder the way mlx-lm stored it before it split the
    latent attention's `kv_b_proj` into `embed_q` and `unembed_out` (each head's rows: its
    `qk_nope_head_dim` key rows, then its `v_head_dim` value rows, over `kv_lora_rank`),
    from `model`'s float32 weights: cast to `dtype` and quantized like every other linear
    layer where the variant is quantized. mlx-lm 0.32.2's sanitize converts it back at load."""
    weights = mx.load(str(out / "model.safetensors"))
    params = dict(tree_flatten(model.parameters()))
    for key in [k for k in weights if ".embed_q." in k or ".unembed_out." in k]:
        del weights[key]
    layers = sorted({k.split(".self_attn.")[0] for k in params if k.endswith("self_attn.embed_q.weight")})
    for layer in layers:
        wk = params[f"{layer}.self_attn.embed_q.weight"]  # [heads, rank, nope]
        wv = params[f"{layer}.self_attn.unembed_out.weight"]  # [heads, v, rank]
        fused = mx.concatenate([wk.swapaxes(-1, -2), wv], axis=1)  # [heads, nope + v, rank]
        fused = fused.reshape(-1, fused.shape[-1])
        prefix = f"{layer}.self_attn.kv_b_proj"
        if bits is None:
            weights[f"{prefix}.weight"] = fused
        else:
            q, scales, biases = mx.quantize(fused.astype(getattr(mx, dtype)), group_size, bits)
            weights[f"{prefix}.weight"], weights[f"{prefix}.scales"], weights[f"{prefix}.biases"] = q, scales, biases
    (out / "model.safetensors.index.json").unlink(missing_ok=True)
    mx.save_safetensors(str(out / "model.safetensors"), weights, metadata={"format": "mlx"})


class WindowedGemma2(gemma2.GemmaModel):
    """mlx-lm's GemmaModel (gemma2) with Hugging Face's attention masks.

    HF's Gemma2 attends through a sliding window on even layers (`layer_idx % 2 == 0`:
    query i sees keys j with i - W < j <= i) and causally on odd ones; mlx-lm's gemma2
    gives every layer the plain causal mask. Only the masks differ from mlx-lm's
    `GemmaModel.__call__`; the layers, norms and embedding are mlx-lm's own. No KV cache:
    every step recomputes the whole sequence, so the mask is the full N x N one and the
    window is obviously applied at every position. `window` None gives mlx-lm's masks.
    """

    window = None

    def __call__(self, inputs, cache=None):
        if cache is not None:
            raise ValueError("WindowedGemma2 recomputes every step; it takes no cache")
        h = self.embed_tokens(inputs)
        h = h * (self.args.hidden_size**0.5)
        n = h.shape[1]
        full = create_causal_mask(n)
        local = full if self.window is None else create_causal_mask(n, window_size=self.window)
        for i, layer in enumerate(self.layers):
            h = layer(h, local if i % 2 == 0 else full, None)
        return self.norm(h)


def recompute_trajectory(model, prompt_ids, steps, window):
    """Greedy trajectory (oracle.trajectory's record) with every step a full recompute.

    `model` is an mlx-lm gemma2 Model; its GemmaModel is switched to WindowedGemma2 with
    `window` for the duration, so Model.__call__ (tied output, final soft-capping) is
    mlx-lm's own.
    """
    inner = model.model
    saved = inner.__class__
    inner.__class__ = WindowedGemma2
    inner.window = window
    try:
        seq = [int(i) for i in prompt_ids]
        out, margins, first = [], [], None
        for _ in range(steps):
            logits = model(mx.array(seq, dtype=mx.uint32)[None])
            row = logits[0, -1].astype(mx.float32)
            top2 = mx.topk(row, 2)
            mx.eval(row, top2)
            if first is None:
                first = np.array(row)
            t = np.sort(np.array(top2))
            margins.append(float(t[-1] - t[-2]))
            tok = int(mx.argmax(row).item())
            out.append(tok)
            seq.append(tok)
    finally:
        inner.__class__ = saved
        del inner.window
    return {
        "prompt_ids": [int(i) for i in prompt_ids],
        "token_ids": out,
        "device": oracle.DEVICE,
        "precision": oracle.PRECISION,
        "min_top2_margin": round(min(margins), 6),
        "first_logits": oracle.f32_list(first),
    }


def windowed_trajectories(model, fixture):
    """gemma2_window's trajectories: HF's even-layer window, with mlx-lm's own ids
    (window ignored) alongside as `token_ids_window_ignored`.

    Checks the recompute reference first: with the window off it must give exactly the
    ids of mlx-lm's generate_step, else the reference itself is wrong.
    """
    window = fixture["config"]["sliding_window"]
    trajs = []
    for p in PROMPTS:
        ignored = oracle.trajectory(model, p, STEPS)["token_ids"]
        plain = recompute_trajectory(model, p, STEPS, None)["token_ids"]
        if plain != ignored:
            raise SystemExit(
                f"{fixture['name']}: the recompute reference without a window disagrees with mlx-lm's "
                f"generate_step for prompt {p}: {plain} vs {ignored}"
            )
        t = recompute_trajectory(model, p, STEPS, window)
        t["token_ids_window_ignored"] = ignored
        trajs.append(t)
    return trajs


def window_differences(doc):
    """(prompt length, first differing step) for each trajectory the window changes."""
    diffs = []
    for t in doc["trajectories"]:
        ignored = t.get("token_ids_window_ignored")
        if ignored is None:
            continue
        steps = [i for i, (a, b) in enumerate(zip(t["token_ids"], ignored)) if a != b]
        if steps:
            diffs.append((len(t["prompt_ids"]), steps[0]))
    return diffs


def record(model_dir, fixture, variant, seed):
    """expected.json for one saved variant, computed from the folder as saved."""
    model, _ = oracle.load_f32(model_dir)
    if fixture.get("reference") == "gemma2_even_layer_window":
        trajs = windowed_trajectories(model, fixture)
    else:
        trajs = [oracle.trajectory(model, p, STEPS) for p in PROMPTS]
    return expected_doc(fixture, variant, seed, trajs, "xtask/python/make_fixtures.py")


def expected_doc(fixture, variant, seed, trajs, script, about_suffix="", extra=None):
    """The expected.json document of one variant (tests/fixtures/README.md); `extra` keys
    go between `steps` and `generator`."""
    q = VARIANTS[variant] if variant in VARIANTS else MODE_VARIANTS[variant]
    return {
        "fixture": fixture["name"],
        "variant": variant,
        "model_type": fixture["config"]["model_type"],
        "about": fixture["about"] + about_suffix,
        "weights": {
            "dtype": q[1] if q else "float32",
            "bits": q[0] if q else None,
            "group_size": fixture["group_size"] if q else None,
        },
        "seed": seed,
        "steps": STEPS,
        **(extra or {}),
        "generator": {
            "mlx": mx.__version__,
            "mlx_lm": mlx_lm.__version__,
            "script": script,
        },
        "trajectories": trajs,
    }


def acceptable(doc, fixture):
    for t in doc["trajectories"]:
        if len(set(t["token_ids"])) < MIN_DISTINCT or t["min_top2_margin"] < fixture.get("min_margin", MIN_MARGIN):
            return False
    # A window test is only a test if the window changes the answer.
    if fixture.get("reference") == "gemma2_even_layer_window" and not window_differences(doc):
        return False
    return True


def make_one(fixture, out_root, scales, first_seed):
    for seed in range(first_seed, first_seed + SEED_TRIES):
        with tempfile.TemporaryDirectory() as tmp:
            tmp = Path(tmp)
            docs = {}
            ok = True
            for variant, q in VARIANTS.items():
                model = build(fixture["config"], seed, scales)
                bits, dtype = q if q else (None, None)
                save_variant(model, fixture["config"], tmp / variant, bits, dtype, fixture["group_size"])
                if fixture.get("kv_b_proj"):
                    fuse_kv_b_proj(build(fixture["config"], seed, scales), tmp / variant, bits, dtype, fixture["group_size"])
                doc = record(tmp / variant, fixture, variant, seed)
                docs[variant] = doc
                if not acceptable(doc, fixture):
                    ok = False
                    break
            summary = ", ".join(
                f"{v} min distinct {min(len(set(t['token_ids'])) for t in d['trajectories'])}"
                f" min margin {min(t['min_top2_margin'] for t in d['trajectories']):.4f}"
                for v, d in docs.items()
            )
            if fixture.get("reference") == "gemma2_even_layer_window":
                summary += "; window changes " + ", ".join(
                    f"{v} " + (" ".join(f"prompt len {n} from step {k}" for n, k in window_differences(d)) or "nothing")
                    for v, d in docs.items()
                )
            verdict = "kept" if ok else "rejected"
            print(f"[fixtures] {fixture['name']} seed {seed}: {summary}: {verdict}", flush=True)
            if not ok:
                continue
            install(tmp, out_root / fixture["name"], docs)
            return seed
    raise SystemExit(f"{fixture['name']}: no seed in {SEED_TRIES} tries gave acceptable trajectories")


def make_modes(fixture, out_root, scales):
    """The fixture's floating-point mode variants ("modes"), from the seed its f32 variant
    was made with, written beside its other variants; their trajectories are mlx-lm's own on
    the saved folder, like every variant's."""
    dest = out_root / fixture["name"]
    seed = json.loads((dest / "f32" / "expected.json").read_text())["seed"]
    for variant in fixture.get("modes", []):
        bits, dtype, group_size, mode, recipe = MODE_VARIANTS[variant]
        group_size = group_size or fixture["group_size"]
        with tempfile.TemporaryDirectory() as tmp:
            tmp = Path(tmp)
            model = build(fixture["config"], seed, scales)
            save_variant(model, fixture["config"], tmp / variant, bits, dtype, group_size, mode, recipe)
            doc = record(tmp / variant, fixture, variant, seed)
            doc["weights"]["group_size"], doc["weights"]["mode"] = group_size, mode
            if recipe:
                doc["weights"]["recipe"] = recipe
                doc["about"] += f"; weights by mlx-lm's {recipe} recipe (mlx_lm.convert --quant-predicate {recipe})"
            elif mode == "affine":
                doc["about"] += f"; weights in MLX affine {bits}-bit (mlx_lm.convert -q --q-bits {bits})"
            else:
                doc["about"] += f"; weights in MLX {mode} (mlx_lm.convert --q-mode {mode})"
            margin = min(t["min_top2_margin"] for t in doc["trajectories"])
            print(f"[fixtures] {fixture['name']}/{variant} seed {seed}: min margin {margin:.4f}", flush=True)
            if (dest / variant).exists():
                shutil.rmtree(dest / variant)
            shutil.copytree(tmp / variant, dest / variant)
            (dest / variant / "expected.json").write_text(json.dumps(doc, indent=1) + "\n")


def install(tmp, dest, docs):
    """Replaces `dest` with the variant folders saved under `tmp` and their expected.json."""
    if dest.exists():
        shutil.rmtree(dest)
    dest.mkdir(parents=True)
    for variant, doc in docs.items():
        shutil.copytree(tmp / variant, dest / variant)
        (dest / variant / "expected.json").write_text(json.dumps(doc, indent=1) + "\n")


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True, help="tests/fixtures")
    ap.add_argument("--only", action="append", help="make only this fixture (repeatable)")
    ap.add_argument(
        "--modes", action="store_true", help="make only the floating-point mode variants of the fixtures that list them"
    )
    args = ap.parse_args()
    mx.set_default_device(mx.cpu)
    out_root = Path(args.out)
    out_root.mkdir(parents=True, exist_ok=True)
    for fixture in FIXTURES:
        if args.only and fixture["name"] not in args.only:
            continue
        scales = dict(SCALES, **fixture.get("scales", {}))
        if args.modes:
            make_modes(fixture, out_root, scales)
        else:
            make_one(fixture, out_root, scales, fixture.get("seed", 0))
    return 0


if __name__ == "__main__":
    sys.exit(main())
