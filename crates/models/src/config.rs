//! `config.json` -> one normalised [`ModelConfig`]: the Llama/Qwen/Gemma differences become
//! settings of a single decoder, following what mlx-lm 0.32 does for each `model_type`.

use crate::error::{Error, Result};
use serde::Deserialize;
use serde_json::Value;
use std::path::Path;

pub const SUPPORTED: &str = "llama, mistral, mixtral, phi3, qwen2, qwen2_moe, qwen3, qwen3_moe, gemma, gemma2, \
gemma3_text, smollm3, qwen3_next, qwen3_5, qwen3_5_moe, lfm2, ministral3, granite, olmo2, olmo3, glm4, \
glm4_moe, deepseek_v3, kimi_k2, gpt_oss, gemma4_text, gemma3, mistral3, gemma4";

/// The checkpoint's `config.json` as written, every field optional; [`ModelConfig::from_json`]
/// decides per `model_type` which are required and what the defaults are.
#[derive(Debug, Deserialize)]
struct RawConfig {
    model_type: Option<String>,
    hidden_size: Option<usize>,
    num_hidden_layers: Option<usize>,
    intermediate_size: Option<usize>,
    num_attention_heads: Option<usize>,
    num_key_value_heads: Option<usize>,
    head_dim: Option<usize>,
    vocab_size: Option<usize>,
    rms_norm_eps: Option<f64>,
    rope_theta: Option<f64>,
    rope_traditional: Option<bool>,
    rope_scaling: Option<Value>,
    /// transformers >= 5 nests `rope_theta` and the scaling here (read for qwen3, as mlx-lm).
    rope_parameters: Option<Value>,
    rope_local_base_freq: Option<f64>,
    tie_word_embeddings: Option<bool>,
    attention_bias: Option<bool>,
    mlp_bias: Option<bool>,
    attn_logit_softcapping: Option<f64>,
    /// `null` turns Gemma 4's default cap off.
    #[serde(default, deserialize_with = "present")]
    final_logit_softcapping: Option<Option<f64>>,
    query_pre_attn_scalar: Option<f64>,
    sliding_window: Option<usize>,
    sliding_window_pattern: Option<usize>,
    layer_types: Option<Vec<String>>,
    max_position_embeddings: Option<usize>,
    original_max_position_embeddings: Option<usize>,
    partial_rotary_factor: Option<f64>,
    num_experts: Option<usize>,
    num_local_experts: Option<usize>,
    num_experts_per_tok: Option<usize>,
    moe_intermediate_size: Option<usize>,
    shared_expert_intermediate_size: Option<usize>,
    norm_topk_prob: Option<bool>,
    decoder_sparse_step: Option<usize>,
    mlp_only_layers: Option<Vec<usize>>,
    /// SmolLM3: per layer 1 to rotate, 0 for none (NoPE); else every
    /// `no_rope_layer_interval`-th layer has none.
    no_rope_layers: Option<Vec<u8>>,
    no_rope_layer_interval: Option<usize>,
    /// Qwen3-Next / Qwen3.5: the gated DeltaNet layers' sizes, and every
    /// `full_attention_interval`-th layer attention.
    linear_num_value_heads: Option<usize>,
    linear_num_key_heads: Option<usize>,
    linear_key_head_dim: Option<usize>,
    linear_value_head_dim: Option<usize>,
    linear_conv_kernel_dim: Option<usize>,
    full_attention_interval: Option<usize>,
    /// LFM2: its names for the norms' epsilon and the tied embedding, the short
    /// convolutions' width and biases, the MLP width's rule, and which layers attend.
    norm_eps: Option<f64>,
    tie_embedding: Option<bool>,
    conv_bias: Option<bool>,
    #[serde(rename = "conv_L_cache")]
    conv_l_cache: Option<usize>,
    block_ff_dim: Option<usize>,
    block_multiple_of: Option<usize>,
    block_ffn_dim_multiplier: Option<f64>,
    block_auto_adjust_ff_dim: Option<bool>,
    full_attn_idxs: Option<Vec<usize>>,
    /// Granite: the embedding, attention, residual and logit scales.
    embedding_multiplier: Option<f64>,
    attention_multiplier: Option<f64>,
    residual_multiplier: Option<f64>,
    logits_scaling: Option<f64>,
    /// GLM-4.5 MoE and DeepSeek-V3: their experts (`n_routed_experts`), shared experts
    /// (`n_shared_experts` of `moe_intermediate_size` each), group-limited sigmoid router
    /// and dense first layers.
    n_routed_experts: Option<usize>,
    n_shared_experts: Option<usize>,
    n_group: Option<usize>,
    topk_group: Option<usize>,
    routed_scaling_factor: Option<f64>,
    first_k_dense_replace: Option<usize>,
    moe_layer_freq: Option<usize>,
    scoring_func: Option<String>,
    topk_method: Option<String>,
    /// GLM-4.5 MoE: q/k norms or none.
    use_qk_norm: Option<bool>,
    /// DeepSeek-V3's latent attention: the ranks of the compressed queries (`null`: a plain
    /// `q_proj`; absent: mlx-lm's default 1536) and keys/values, and each head's sizes.
    #[serde(default, deserialize_with = "present")]
    q_lora_rank: Option<Option<usize>>,
    kv_lora_rank: Option<usize>,
    qk_nope_head_dim: Option<usize>,
    qk_rope_head_dim: Option<usize>,
    v_head_dim: Option<usize>,
    /// Gemma 4: the full-attention layers' head size and kv heads (the latter with
    /// `attention_k_eq_v`), the last layers that attend over an earlier layer's keys and
    /// values, the per-layer inputs (`null`: none), the KV-shared layers' double-wide MLP,
    /// and its experts (not run here).
    #[serde(default, deserialize_with = "present")]
    global_head_dim: Option<Option<usize>>,
    num_global_key_value_heads: Option<usize>,
    attention_k_eq_v: Option<bool>,
    num_kv_shared_layers: Option<usize>,
    #[serde(default, deserialize_with = "present")]
    hidden_size_per_layer_input: Option<Option<usize>>,
    vocab_size_per_layer_input: Option<usize>,
    use_double_wide_mlp: Option<bool>,
    enable_moe_block: Option<bool>,
    top_k_experts: Option<usize>,
}

/// A key that may be `null`: `Some(None)` for null, `None` (the default) when absent.
fn present<'de, D: serde::Deserializer<'de>, T: Deserialize<'de>>(d: D) -> std::result::Result<Option<T>, D::Error> {
    T::deserialize(d).map(Some)
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Family {
    Llama,
    Mixtral,
    Phi3,
    Qwen2,
    Qwen2Moe,
    Qwen3,
    Qwen3Moe,
    Gemma,
    Gemma2,
    Gemma3,
    SmolLm3,
    Qwen3Next,
    Qwen35,
    Lfm2,
    Ministral3,
    Granite,
    Olmo2,
    Olmo3,
    Glm4,
    Glm4Moe,
    DeepseekV3,
    Gemma4,
    GptOss,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Activation {
    /// `silu(gate) * up` (Llama, Qwen).
    Silu,
    /// `gelu(gate) * up` with the exact erf GELU (mlx-lm's `gemma`).
    GeluErf,
    /// `gelu_approx(gate) * up`, the tanh approximation (`gemma2`, `gemma3_text`).
    GeluTanh,
    /// gpt-oss's clamped SwiGLU (mlx-lm's `swiglu_oai`, alpha 1.702, limit 7): `g =
    /// min(gate, 7)`, `(clip(up, -7, 7) + 1) * g * sigmoid(1.702 g)`.
    SwigluOai,
}

#[derive(Debug, Clone, PartialEq)]
pub enum RopeScaling {
    None,
    /// Positions multiplied by `1 / factor`.
    Linear {
        factor: f64,
    },
    /// Llama 3.x frequency bands.
    Llama3 {
        factor: f64,
        low_freq_factor: f64,
        high_freq_factor: f64,
        original_max_position_embeddings: f64,
    },
    /// `longrope`/`su` (Phi-3): every frequency divided by its `long_factor` (mlx-lm's
    /// `SuScaledRoPE` uses the long factors at every length), and the rotated features
    /// scaled by `sqrt(1 + ln(max / original) / ln(original))` when `max > original`.
    Su {
        long_factor: Vec<f64>,
        max_position_embeddings: f64,
        original_max_position_embeddings: f64,
    },
    /// YaRN: frequencies blended between scaled and unscaled by a ramp over the rotated
    /// features, and those features scaled by the ratio of the two `mscale`s.
    Yarn {
        factor: f64,
        original_max_position_embeddings: f64,
        beta_fast: f64,
        beta_slow: f64,
        mscale: f64,
        mscale_all_dim: f64,
    },
    /// Gemma 4's `proportional` (mlx-lm's `ProportionalRoPE`): the whole head is paired as
    /// usual, but only the first `rotated / 2` pairs turn, at `1 / (factor * base^(2i /
    /// head_dim))` (exponents over the whole head); the other pairs stay as they are.
    Proportional {
        rotated: usize,
        factor: f64,
    },
}

/// A mixture-of-experts feed-forward block, as mlx-lm's sparse MoE blocks over `SwitchGLU`:
/// a router `gate` `[experts, hidden]`, and stacked experts `switch_mlp.{gate,up,down}_proj`
/// (`[experts, out, in]`), each a SwiGLU MLP.
#[derive(Debug, Clone, PartialEq)]
pub struct Moe {
    /// The block's module under each layer: `mlp` (Qwen MoE) or `block_sparse_moe` (Mixtral).
    pub block: &'static str,
    pub experts: usize,
    /// Experts each token runs (`num_experts_per_tok`).
    pub top_k: usize,
    /// Each expert's hidden size.
    pub intermediate: usize,
    pub routing: Routing,
    /// A shared expert every token runs (Qwen2-MoE's, gated; DeepSeek's, plain).
    pub shared_expert: Option<SharedExpert>,
    /// Gemma 4: the experts run beside the layer's dense MLP, not instead of it, as modules of
    /// the layer (`router`, `experts`; [`crate::names::LayerNames::moe`]), each branch with
    /// norms of its own (`post_feedforward_layernorm_1` after the MLP,
    /// `pre_feedforward_layernorm_2` and `post_feedforward_layernorm_2` around the experts;
    /// their sum normed by `post_feedforward_layernorm`), the router reading the layer's
    /// input un-normed.
    pub beside_mlp: bool,
    /// gpt-oss: the router (`{block}.router`) and the experts (`{block}.experts.*`) have
    /// biases.
    pub biased: bool,
}

/// How the router's logits become the chosen experts' weights.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Routing {
    /// Softmax over every expert, then the top k probabilities (Qwen2-MoE, Qwen3-MoE);
    /// `normalize` divides them by their sum (`norm_topk_prob`).
    SoftmaxTopK { normalize: bool },
    /// The top k logits, then a softmax over those k (Mixtral).
    TopKSoftmax,
    /// GLM-4.5 MoE and DeepSeek-V3 (mlx-lm's `group_expert_select`): `sigmoid(logits)` in
    /// f32 chooses after the router's `e_score_correction_bias` is added; the experts fall
    /// in `groups` equal groups, each scored by the sum of its two best biased scores, and
    /// all but the `top_groups` best groups are set to 0 before the top k. The chosen
    /// experts' unbiased scores are the weights, divided by their sum when `normalize` (and
    /// k > 1), times `scale` (`routed_scaling_factor`).
    Grouped { groups: usize, top_groups: usize, scale: f32, normalize: bool },
    /// Gemma 4's router: its input RMS-normed by `router.scale * hidden^-0.5`, the top k
    /// logits, a softmax over those k, each times its expert's `per_expert_scale`.
    ScaledTopKSoftmax,
}

/// Experts every token runs beside the routed ones.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SharedExpert {
    /// The SwiGLU MLP's hidden size.
    pub width: usize,
    /// Qwen2-MoE's: one `shared_expert`, its output scaled by `sigmoid(shared_expert_gate ·
    /// x)`. Else DeepSeek's `shared_experts`, added as it is.
    pub gated: bool,
}

/// What differs from layer to layer.
#[derive(Debug, Clone, PartialEq)]
pub struct LayerConfig {
    pub rope_theta: f64,
    pub rope_scaling: RopeScaling,
    /// Keys older than this many positions are masked (`i - W < j <= i`).
    pub sliding_window: Option<usize>,
    /// The feed-forward block is the model's [`Moe`] (else the dense MLP).
    pub moe: bool,
    /// Queries and keys are rotated (RoPE); false for SmolLM3's NoPE layers.
    pub rope: bool,
    /// The layer mixes tokens with a recurrent layer, the model's [`LinearAttention`] or
    /// [`ShortConv`] (a state per sequence), instead of attention over a KV cache.
    pub recurrent: bool,
    /// This layer's attention heads: the model's `kv_heads`, `head_dim` and `rope_dims` but
    /// in Gemma 4's full-attention layers (`global_head_dim`, `num_global_key_value_heads`).
    pub kv_heads: usize,
    pub head_dim: usize,
    pub rope_dims: usize,
    /// No `v_proj`: the values are the keys as projected, before their norm and RoPE
    /// (Gemma 4's `attention_k_eq_v` full-attention layers).
    pub values_are_keys: bool,
    /// The earlier layer whose keys and values, cached and new, this layer attends over
    /// (Gemma 4's KV-shared layers): it has no k/v projections and no cache of its own.
    pub kv_source: Option<usize>,
    /// The dense MLP's hidden size (Gemma 4 doubles it in its KV-shared layers).
    pub intermediate: usize,
}

/// Gemma 4's per-layer inputs (mlx-lm's `hidden_size_per_layer_input`): each token's row
/// of a second table `embed_tokens_per_layer` (`[vocab, layers * width]`, times
/// `sqrt(width)`) plus a projection of its scaled embedding
/// (`per_layer_model_projection`, times `hidden^-0.5`, RMS-normed by
/// `per_layer_projection_norm`), the sum times `2^-0.5`, give each layer a `width` vector;
/// after its feed-forward block a layer adds `post_per_layer_input_norm(per_layer_projection(
/// gelu_tanh(per_layer_input_gate(x)) * input))`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PerLayerInput {
    pub width: usize,
    /// Rows of `embed_tokens_per_layer` (`vocab_size_per_layer_input`).
    pub vocab: usize,
}

/// The gated DeltaNet layers of Qwen3-Next and Qwen3.5 (mlx-lm's `GatedDeltaNet`): q, k, v
/// through a causal depthwise convolution, L2-normalised q and k, and a delta-rule update
/// of a `[v_heads, v_dim, k_dim]` state per sequence, decayed by `g` each token.
#[derive(Debug, Clone, PartialEq)]
pub struct LinearAttention {
    pub k_heads: usize,
    pub v_heads: usize,
    pub k_dim: usize,
    pub v_dim: usize,
    /// The convolution's width (`linear_conv_kernel_dim`); its state keeps the last
    /// `conv_kernel - 1` inputs.
    pub conv_kernel: usize,
    /// The in-projections as stored: Qwen3-Next's two fused ones (`in_proj_qkvz`,
    /// `in_proj_ba`, grouped by key head), or Qwen3.5's four (`in_proj_qkv`, `in_proj_z`,
    /// `in_proj_b`, `in_proj_a`).
    pub fused_in_proj: bool,
}

/// LFM2's gated short convolutions (mlx-lm's `ShortConv`): `in_proj` gives B, C and x; the
/// causal depthwise convolution of `B * x` over the last `kernel` positions, times C, goes
/// through `out_proj`.
#[derive(Debug, Clone, PartialEq)]
pub struct ShortConv {
    /// `conv_L_cache`: the convolution's width; its state keeps the last `kernel - 1` inputs.
    pub kernel: usize,
    /// `conv_bias`: biases on `in_proj`, the convolution and `out_proj`.
    pub bias: bool,
}

/// DeepSeek-V3's multi-head latent attention (mlx-lm's `DeepseekV3Attention`): each position's
/// keys and values are one compressed latent `c` (`kv_rank`, RMS-normed) and one rotated key
/// `k_pe` (`rope_dim`) shared by every head, and that is all the cache keeps. Head h scores
/// key j as `scale * ((W_k[h]ᵀ q_nope) · c_j + q_pe · k_pe_j)` (`embed_q` holds `W_k
/// [heads, kv_rank, nope_dim]`) and outputs `W_v[h] Σ p_j c_j` (`unembed_out`: `[heads,
/// v_dim, kv_rank]`), which is mlx-lm's decode form; its prompt form expands the keys and values
/// per head first, the same sums in another order.
#[derive(Debug, Clone, PartialEq)]
pub struct LatentAttention {
    /// The queries' compression (`q_a_proj`, `q_a_layernorm`, `q_b_proj`), or `None` for a
    /// plain `q_proj`.
    pub q_rank: Option<usize>,
    pub kv_rank: usize,
    /// Features of each query head compared with the latent (through `embed_q`).
    pub nope_dim: usize,
    /// Features of each query head and of the shared key that RoPE rotates.
    pub rope_dim: usize,
    pub v_dim: usize,
}

/// How one layer mixes tokens, as [`ModelConfig::mixer`] reads its config.
#[derive(Debug, Clone, Copy)]
pub enum LayerMixer<'a> {
    /// Attention over the KV cache.
    Attention,
    /// Latent attention over a cache of latents (DeepSeek-V3).
    Latent(&'a LatentAttention),
    /// A gated DeltaNet (Qwen3-Next, Qwen3.5).
    Linear(&'a LinearAttention),
    /// A gated short convolution (LFM2).
    ShortConv(&'a ShortConv),
}

impl LinearAttention {
    /// `2 * k_heads * k_dim + v_heads * v_dim`: the channels the convolution runs over (q, k, v).
    pub fn conv_dim(&self) -> usize {
        2 * self.k_heads * self.k_dim + self.v_heads * self.v_dim
    }

    /// f32 values of one layer's state per sequence: the convolution's last inputs and
    /// the delta rule's matrix.
    pub fn state_len(&self) -> usize {
        self.conv_state_len() + self.matrix_len()
    }

    /// f32 values of the convolution's last `conv_kernel - 1` inputs per sequence.
    pub fn conv_state_len(&self) -> usize {
        (self.conv_kernel - 1) * self.conv_dim()
    }

    /// f32 values of the delta rule's `[v_heads, v_dim, k_dim]` matrix per sequence.
    pub fn matrix_len(&self) -> usize {
        self.v_heads * self.v_dim * self.k_dim
    }
}

#[derive(Debug, Clone, PartialEq)]
pub struct ModelConfig {
    pub model_type: String,
    pub family: Family,
    pub hidden: usize,
    pub intermediate: usize,
    pub heads: usize,
    pub kv_heads: usize,
    pub head_dim: usize,
    /// Features of each head that RoPE rotates, the first ones (`partial_rotary_factor`
    /// below 1 leaves the rest as they are); `head_dim` for most models.
    pub rope_dims: usize,
    pub vocab: usize,
    pub rms_eps: f64,
    pub layers: Vec<LayerConfig>,
    /// The output projection reuses the (possibly quantized) embedding.
    pub tie_embeddings: bool,
    /// The checkpoint stores q/k/v as one `self_attn.qkv_proj` (Phi-3), stacked by rows in
    /// that order.
    pub fused_qkv: bool,
    /// The checkpoint stores gate/up as one `mlp.gate_up_proj` (Phi-3, GLM-4), gate rows
    /// first.
    pub fused_gate_up: bool,
    /// RoPE rotates adjacent pairs of features (MLX's `traditional`: GLM-4) rather than the
    /// two halves.
    pub rope_traditional: bool,
    /// Biases on q/k/v projections (Qwen2; Llama `attention_bias` also on o).
    pub qkv_bias: bool,
    pub o_bias: bool,
    pub mlp_bias: bool,
    /// RMSNorm of each query and key head (Qwen3, Gemma3).
    pub qk_norm: bool,
    /// Gemma's RMSNorm scales by `1 + w` instead of `w`.
    pub norm_plus_one: bool,
    /// Where each layer's norms sit around attention and the MLP.
    pub norm_placement: NormPlacement,
    /// `q_norm` and `k_norm` normalise all heads' features at once (`[heads * head_dim]`,
    /// OLMo 2) rather than each head's (`[head_dim]`).
    pub qk_norm_full_width: bool,
    /// Embeddings multiplied by this (Gemma: sqrt(hidden); Gemma3 rounds it to bf16).
    pub embed_scale: Option<f32>,
    pub activation: Activation,
    /// Multiplier of q·k before the softmax.
    pub attn_scale: f64,
    pub attn_softcap: Option<f64>,
    pub final_softcap: Option<f64>,
    pub max_position_embeddings: Option<usize>,
    /// The mixture-of-experts block of the layers whose `moe` is set.
    pub moe: Option<Moe>,
    /// The gated DeltaNet layers' sizes (the layers whose `recurrent` is set, Qwen3-Next
    /// and Qwen3.5).
    pub linear: Option<LinearAttention>,
    /// The short convolutions of the layers whose `recurrent` is set (LFM2).
    pub short_conv: Option<ShortConv>,
    /// Every attention layer's latent attention (DeepSeek-V3): `heads` query heads of
    /// `head_dim = nope_dim + rope_dim`, `rope_dims = rope_dim`, and `kv_heads` 1.
    pub latent: Option<LatentAttention>,
    /// Attention's output is gated: `q_proj` gives each head's query and then a gate, and
    /// the heads' output is multiplied by `sigmoid(gate)` before `o_proj` (Qwen3-Next).
    pub attn_output_gate: bool,
    /// Queries scaled by their position after RoPE (Ministral 3, Llama 4's attention
    /// temperature).
    pub query_position_scale: Option<QueryPositionScale>,
    /// Each block's output (attention's, the MLP's, after their out-projections) times this
    /// before it joins the residual stream (Granite's `residual_multiplier`).
    pub residual_scale: Option<f32>,
    /// The logits divided by this (Granite's `logits_scaling`).
    pub logits_divisor: Option<f32>,
    /// Gemma 4's per-layer inputs.
    pub per_layer_input: Option<PerLayerInput>,
    /// Values RMS-normed per head without a weight (Gemma 4's `v_norm`).
    pub value_norm: bool,
    /// Each layer's output times its `layer_scalar` (`[1]`, Gemma 4).
    pub layer_scalar: bool,
    /// A learned logit per query head (`self_attn.sinks`) joins each softmax over the keys
    /// and takes its share of the weight with no value (gpt-oss's attention sinks).
    pub attn_sinks: bool,
}

/// Where a layer's norms sit.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NormPlacement {
    /// Before attention (`input_layernorm`) and before the MLP (`post_attention_layernorm`):
    /// Llama and most families.
    Pre,
    /// Before and after each block (Gemma 2 and 3: `input_layernorm`,
    /// `post_attention_layernorm`, `pre_feedforward_layernorm`, `post_feedforward_layernorm`).
    Sandwich,
    /// Only after each block, on its output before the residual add (OLMo 2:
    /// `post_attention_layernorm`, `post_feedforward_layernorm`).
    Post,
}

/// Ministral 3's query scale at position p: `1 + beta * ln(1 + floor(p / original))`, in
/// f32 as mlx-lm computes it (`_get_llama_4_attn_scale`): 1 below `original` positions.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct QueryPositionScale {
    /// `rope_parameters.llama_4_scaling_beta`.
    pub beta: f32,
    /// `rope_parameters.original_max_position_embeddings`.
    pub original: f32,
}

fn cfg_err(path: &Path, key: &str, reason: impl Into<String>) -> Error {
    Error::Config { path: path.to_path_buf(), key: key.to_string(), reason: reason.into() }
}

fn required<T: Copy>(path: &Path, key: &str, v: Option<T>) -> Result<T> {
    v.ok_or_else(|| cfg_err(path, key, "missing"))
}

/// How a family finds its head size.
#[derive(Debug, Clone, Copy)]
enum HeadDim {
    /// `head_dim` from config.json, required.
    Given,
    /// `head_dim` from config.json, else `hidden_size / num_attention_heads`.
    GivenOrDerived,
    /// Always `hidden_size / num_attention_heads`, whatever config.json says (mlx-lm's phi3,
    /// mixtral and qwen2_moe).
    Derived,
}

/// Which `rope_scaling` a family reads.
#[derive(Debug, Clone, Copy)]
enum Scaling {
    /// None: mlx-lm builds a plain `nn.RoPE` there (gemma, gemma2 and its MoE families).
    Ignored,
    /// `linear`, `llama3`, `yarn`, `longrope` (and qwen3's nested `rope_parameters`).
    Read,
    /// Phi-3's own: `longrope`/`su` with the model's position limits, or `linear`.
    Phi3,
}

/// Which layers use a sliding window.
#[derive(Debug, Clone, Copy)]
enum Windows {
    /// None.
    Global,
    /// Those `layer_types` marks `sliding_attention` (llama, mistral).
    LayerTypes,
    /// Even layers, when `sliding_window` is set (HF's Gemma 2).
    Even,
    /// All but every `sliding_window_pattern`-th, with their own RoPE base (Gemma 3).
    Gemma3,
    /// Those `layer_types` marks `sliding_attention`, else all but every fourth, with a
    /// plain RoPE (the scaling is the full layers'): OLMo 3.
    Olmo3,
    /// Those `layer_types` marks `sliding_attention`, else the even layers (gpt-oss).
    LayerTypesElseEven,
    /// Gemma 4: `layer_types` (else all but every `sliding_window_pattern`-th slide), each
    /// type with its own heads and `rope_parameters`, and the KV-shared last layers
    /// ([`gemma4_layers`]).
    Gemma4,
}

/// Whether the output layer reuses the embedding.
#[derive(Debug, Clone, Copy)]
enum Tie {
    /// Always (gemma, gemma2, lfm2).
    Always,
    /// Never: an `lm_head` whatever `tie_word_embeddings` says (glm4_moe, deepseek_v3).
    Never,
    /// As `tie_word_embeddings` says, with this default.
    Read(bool),
}

/// Whether attention norms each query and key head.
#[derive(Debug, Clone, Copy)]
enum QkNorm {
    No,
    Always,
    /// As `use_qk_norm` says, required (glm4_moe).
    Read,
}

/// Which layers of a family with experts run them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum MoeLayers {
    /// Every layer.
    Every,
    /// Qwen3-MoE: every `decoder_sparse_step`-th layer not in `mlp_only_layers`; no experts
    /// means a dense model.
    Sparse,
    /// GLM-4.5 MoE and DeepSeek-V3: all but the first `first_k_dense_replace` layers (and, where
    /// `freq`, only every `moe_layer_freq`-th of them by index: DeepSeek-V3).
    AfterDense { freq: bool },
}

/// Biases of the linear layers.
#[derive(Debug, Clone, Copy)]
enum Biases {
    None,
    /// On q, k and v (Qwen2).
    Qkv,
    /// `attention_bias` on q, k, v and o, `mlp_bias` on the MLP (Llama).
    Configured,
    /// `attention_bias` on q, k, v and o, never on the MLP (OLMo 3).
    Attention,
    /// `attention_bias` on q, k and v only (GLM-4).
    AttentionQkv,
    /// On q, k, v and o whatever the config says, never on an MLP (gpt-oss).
    AlwaysAttention,
}

/// Gemma's differences: the `1 + w` norm scale, 1e-6 epsilon, scaled embeddings.
#[derive(Debug, Clone, Copy)]
struct Gemma {
    activation: Activation,
    /// The embedding scale `sqrt(hidden)` rounded to bf16 (mlx-lm's gemma3_text).
    bf16_embed_scale: bool,
    /// `query_pre_attn_scalar`'s default, when the family scales by it (else `head_dim`);
    /// `Some(1.0)` with `unit_scale`.
    query_pre_attn: Option<f64>,
    /// Scores unscaled (Gemma 4: its q/k norms stand in for the scale).
    unit_scale: bool,
    /// The norms scale by `1 + w` (all but Gemma 4, whose norms are plain).
    plus_one: bool,
    /// Default attention (where scores are capped) and final logit soft caps (Gemma 2; Gemma 4
    /// caps the logits only).
    softcaps: Option<(Option<f64>, f64)>,
}

/// How a family's MoE block reads config.json.
#[derive(Debug, Clone, Copy)]
struct MoeRules {
    block: &'static str,
    /// `num_local_experts` with this default (Mixtral), else `num_experts`, required.
    local_experts: Option<usize>,
    /// `num_experts_per_tok`'s default, else required.
    top_k: Option<usize>,
    /// Softmax then top k, `norm_topk_prob` read when set (required unless
    /// `normalize_default`); else top k then softmax.
    softmax_first: Option<bool>,
    /// `norm_topk_prob`'s default, where the family has one.
    normalize_default: Option<bool>,
    /// Each expert's width: `moe_intermediate_size` (else `intermediate_size`).
    moe_width: bool,
    /// Qwen2-MoE's shared expert (`shared_expert_intermediate_size`).
    shared_expert: bool,
    /// Which layers run the experts.
    layers: MoeLayers,
    /// GLM-4.5 MoE's and DeepSeek-V3's config keys (`n_routed_experts`, `n_shared_experts`,
    /// `n_group`, ...) and router ([`Routing::Grouped`]); the other fields but `block` and
    /// `layers` are not read.
    grouped: bool,
    /// `num_experts` may be absent (a dense model, Qwen3.5).
    optional: bool,
    /// gpt-oss's router and experts with biases, under their own names ([`Moe::biased`]).
    biased: bool,
}

/// One family's reading of config.json, as mlx-lm 0.32's model file for it does: every
/// per-family rule of [`ModelConfig::from_json`] is a field here, one row per family.
#[derive(Debug, Clone, Copy)]
struct Rules {
    family: Family,
    /// The `model_type`s that map here (mlx-lm runs `mistral` as its llama model).
    model_types: &'static [&'static str],
    head_dim: HeadDim,
    rope_theta: f64,
    /// `rope_parameters` stands in for a missing `rope_theta` and `rope_scaling`, and a theta
    /// in neither is an error (qwen3).
    rope_parameters: bool,
    scaling: Scaling,
    /// `partial_rotary_factor` read (phi3), or read from `rope_parameters` with a default.
    partial_rotary: Partial,
    tie: Tie,
    biases: Biases,
    qk_norm: QkNorm,
    /// q/k/v and gate/up stored fused (phi3).
    fused_projections: bool,
    /// Only gate/up stored fused (glm4).
    fused_gate_up: bool,
    /// `rope_traditional` read, with this default (glm4); `None`: `true` is refused.
    rope_traditional: Option<bool>,
    /// Where the norms sit around each block.
    norms: NormPlacement,
    windows: Windows,
    /// `no_rope_layers` / `no_rope_layer_interval` read (smollm3).
    nope_layers: bool,
    gemma: Option<Gemma>,
    moe: Option<MoeRules>,
    /// Gated DeltaNet layers (`linear_*`, `full_attention_interval`) read, their
    /// in-projections fused (Qwen3-Next) or not (Qwen3.5).
    hybrid: Option<Hybrid>,
    /// Attention's output gated by a second half of `q_proj` (Qwen3-Next, Qwen3.5).
    attn_output_gate: bool,
    /// The text model's settings may sit under `text_config` (the multimodal Qwen3.5
    /// checkpoints), and its weights under `language_model.` ([`WEIGHTS_PREFIX`]).
    wrapped: bool,
    /// LFM2's short-convolution layers, its layer pattern and MLP width rule.
    short_conv: bool,
    /// The query scale by position of `rope_parameters` (ministral3).
    query_position_scale: bool,
    /// Granite's four multipliers (embedding, attention, residual, logits), all required.
    multipliers: bool,
    /// q/k norms over all heads' features at once (OLMo 2 and 3).
    qk_norm_full_width: bool,
    /// Latent attention in every attention layer (deepseek_v3).
    latent: bool,
    /// The family's own spelling of parts of the names in [`crate::names`], as
    /// `(ours, theirs)` ([`weights::Checkpoint::set_renames`]).
    renames: &'static [(&'static str, &'static str)],
}

/// Where the weights of a wrapped model's language model sit in its checkpoint, when they
/// do: mlx-lm's multimodal-capable classes keep the text model as `language_model`.
const WEIGHTS_PREFIX: &str = "language_model.";

/// How a family reads the share of each head RoPE rotates.
#[derive(Debug, Clone, Copy)]
enum Partial {
    /// All of it.
    No,
    /// `partial_rotary_factor`, 1 when absent (phi3, qwen3_next).
    TopLevel,
    /// `rope_parameters.partial_rotary_factor`, else the top level's, else this (qwen3_5).
    Nested(f64),
}

/// How a family lays out its gated DeltaNet layers.
#[derive(Debug, Clone, Copy)]
struct Hybrid {
    fused_in_proj: bool,
}

const DENSE: Rules = Rules {
    family: Family::Llama,
    model_types: &[],
    head_dim: HeadDim::Given,
    rope_theta: 10_000.0,
    rope_parameters: false,
    scaling: Scaling::Read,
    partial_rotary: Partial::No,
    tie: Tie::Read(false),
    biases: Biases::None,
    qk_norm: QkNorm::No,
    fused_projections: false,
    fused_gate_up: false,
    rope_traditional: None,
    norms: NormPlacement::Pre,
    windows: Windows::Global,
    nope_layers: false,
    gemma: None,
    moe: None,
    hybrid: None,
    attn_output_gate: false,
    wrapped: false,
    short_conv: false,
    query_position_scale: false,
    multipliers: false,
    qk_norm_full_width: false,
    latent: false,
    renames: &[],
};

const QWEN_MOE: MoeRules = MoeRules {
    block: "mlp",
    local_experts: None,
    top_k: None,
    softmax_first: Some(false),
    normalize_default: None,
    moe_width: true,
    shared_expert: false,
    layers: MoeLayers::Every,
    grouped: false,
    optional: false,
    biased: false,
};

/// Every family, in the order [`SUPPORTED`] names them.
const FAMILIES: &[Rules] = &[
    Rules {
        model_types: &["llama", "mistral"],
        head_dim: HeadDim::GivenOrDerived,
        tie: Tie::Read(true),
        biases: Biases::Configured,
        windows: Windows::LayerTypes,
        ..DENSE
    },
    Rules {
        family: Family::Mixtral,
        model_types: &["mixtral"],
        head_dim: HeadDim::Derived,
        rope_theta: 1_000_000.0,
        scaling: Scaling::Ignored,
        moe: Some(MoeRules {
            block: "block_sparse_moe",
            local_experts: Some(8),
            top_k: Some(2),
            softmax_first: None,
            moe_width: false,
            ..QWEN_MOE
        }),
        ..DENSE
    },
    Rules {
        family: Family::Phi3,
        model_types: &["phi3"],
        head_dim: HeadDim::Derived,
        scaling: Scaling::Phi3,
        partial_rotary: Partial::TopLevel,
        fused_projections: true,
        ..DENSE
    },
    Rules {
        family: Family::Qwen2,
        model_types: &["qwen2"],
        head_dim: HeadDim::GivenOrDerived,
        rope_theta: 1_000_000.0,
        tie: Tie::Read(true),
        biases: Biases::Qkv,
        ..DENSE
    },
    Rules {
        family: Family::Qwen2Moe,
        model_types: &["qwen2_moe"],
        head_dim: HeadDim::Derived,
        rope_theta: 1_000_000.0,
        scaling: Scaling::Ignored,
        biases: Biases::Qkv,
        moe: Some(MoeRules { shared_expert: true, ..QWEN_MOE }),
        ..DENSE
    },
    Rules { family: Family::Qwen3, model_types: &["qwen3"], rope_parameters: true, qk_norm: QkNorm::Always, ..DENSE },
    Rules {
        family: Family::Qwen3Moe,
        model_types: &["qwen3_moe"],
        scaling: Scaling::Ignored,
        qk_norm: QkNorm::Always,
        moe: Some(MoeRules { softmax_first: Some(true), layers: MoeLayers::Sparse, ..QWEN_MOE }),
        ..DENSE
    },
    Rules {
        family: Family::Gemma,
        model_types: &["gemma"],
        scaling: Scaling::Ignored,
        tie: Tie::Always,
        gemma: Some(Gemma {
            activation: Activation::GeluErf,
            bf16_embed_scale: false,
            query_pre_attn: None,
            unit_scale: false,
            plus_one: true,
            softcaps: None,
        }),
        ..DENSE
    },
    Rules {
        family: Family::Gemma2,
        model_types: &["gemma2"],
        scaling: Scaling::Ignored,
        tie: Tie::Always,
        windows: Windows::Even,
        norms: NormPlacement::Sandwich,
        gemma: Some(Gemma {
            activation: Activation::GeluTanh,
            bf16_embed_scale: false,
            query_pre_attn: Some(144.0),
            unit_scale: false,
            plus_one: true,
            softcaps: Some((Some(50.0), 30.0)),
        }),
        ..DENSE
    },
    Rules {
        family: Family::Gemma3,
        model_types: &["gemma3_text"],
        rope_theta: 1_000_000.0,
        norms: NormPlacement::Sandwich,
        // mlx-lm's gemma3_text decides by whether lm_head.weight exists;
        // `ModelConfig::for_checkpoint` corrects this from the checkpoint.
        tie: Tie::Read(true),
        qk_norm: QkNorm::Always,
        windows: Windows::Gemma3,
        gemma: Some(Gemma {
            activation: Activation::GeluTanh,
            bf16_embed_scale: true,
            query_pre_attn: Some(256.0),
            unit_scale: false,
            plus_one: true,
            softcaps: None,
        }),
        ..DENSE
    },
    Rules {
        family: Family::SmolLm3,
        model_types: &["smollm3"],
        head_dim: HeadDim::GivenOrDerived,
        tie: Tie::Read(true),
        biases: Biases::Configured,
        windows: Windows::LayerTypes,
        nope_layers: true,
        ..DENSE
    },
    Rules {
        family: Family::Qwen3Next,
        model_types: &["qwen3_next"],
        partial_rotary: Partial::TopLevel,
        qk_norm: QkNorm::Always,
        moe: Some(QWEN_NEXT_MOE),
        hybrid: Some(Hybrid { fused_in_proj: true }),
        attn_output_gate: true,
        ..DENSE
    },
    Rules {
        family: Family::Qwen35,
        model_types: &["qwen3_5", "qwen3_5_moe"],
        head_dim: HeadDim::GivenOrDerived,
        rope_theta: 100_000.0,
        rope_parameters: true,
        partial_rotary: Partial::Nested(0.25),
        qk_norm: QkNorm::Always,
        // Every layer's feed-forward block is the experts when there are any.
        moe: Some(MoeRules {
            layers: MoeLayers::Every,
            normalize_default: Some(true),
            optional: true,
            ..QWEN_NEXT_MOE
        }),
        hybrid: Some(Hybrid { fused_in_proj: false }),
        attn_output_gate: true,
        wrapped: true,
        ..DENSE
    },
    Rules {
        family: Family::Lfm2,
        model_types: &["lfm2"],
        head_dim: HeadDim::Derived,
        rope_theta: 1_000_000.0,
        scaling: Scaling::Ignored,
        // mlx-lm's lfm2 always ties (`embed_tokens.as_linear`).
        tie: Tie::Always,
        qk_norm: QkNorm::Always,
        short_conv: true,
        renames: LFM2_NAMES,
        ..DENSE
    },
    Rules {
        family: Family::Ministral3,
        model_types: &["ministral3"],
        head_dim: HeadDim::GivenOrDerived,
        rope_parameters: true,
        tie: Tie::Read(true),
        windows: Windows::LayerTypes,
        query_position_scale: true,
        ..DENSE
    },
    Rules {
        family: Family::Granite,
        model_types: &["granite"],
        head_dim: HeadDim::Derived,
        tie: Tie::Read(true),
        biases: Biases::Configured,
        multipliers: true,
        ..DENSE
    },
    Rules {
        family: Family::Olmo2,
        model_types: &["olmo2"],
        head_dim: HeadDim::GivenOrDerived,
        tie: Tie::Read(true),
        biases: Biases::Configured,
        qk_norm: QkNorm::Always,
        norms: NormPlacement::Post,
        qk_norm_full_width: true,
        ..DENSE
    },
    Rules {
        family: Family::Olmo3,
        model_types: &["olmo3"],
        head_dim: HeadDim::GivenOrDerived,
        biases: Biases::Attention,
        qk_norm: QkNorm::Always,
        windows: Windows::Olmo3,
        norms: NormPlacement::Post,
        qk_norm_full_width: true,
        ..DENSE
    },
    Rules {
        family: Family::Glm4,
        model_types: &["glm4"],
        // mlx-lm's glm4 builds a plain nn.RoPE.
        scaling: Scaling::Ignored,
        partial_rotary: Partial::TopLevel,
        biases: Biases::AttentionQkv,
        fused_gate_up: true,
        rope_traditional: Some(true),
        norms: NormPlacement::Sandwich,
        renames: GLM4_NAMES,
        ..DENSE
    },
    Rules {
        family: Family::Glm4Moe,
        model_types: &["glm4_moe"],
        // mlx-lm's glm4_moe builds a plain nn.RoPE (rope_scaling unread), halves rotated.
        scaling: Scaling::Ignored,
        partial_rotary: Partial::TopLevel,
        tie: Tie::Never,
        biases: Biases::AttentionQkv,
        qk_norm: QkNorm::Read,
        moe: Some(GROUPED_MOE),
        ..DENSE
    },
    DEEPSEEK_V3,
    Rules {
        family: Family::GptOss,
        model_types: &["gpt_oss"],
        rope_theta: 150_000.0,
        tie: Tie::Never,
        biases: Biases::AlwaysAttention,
        windows: Windows::LayerTypesElseEven,
        moe: Some(MoeRules {
            block: "mlp",
            local_experts: Some(128),
            top_k: Some(4),
            softmax_first: None,
            moe_width: false,
            biased: true,
            ..QWEN_MOE
        }),
        ..DENSE
    },
    Rules {
        family: Family::Gemma4,
        model_types: &["gemma4_text"],
        // Each layer type's RoPE is read from `rope_parameters` by `gemma4_layers`.
        scaling: Scaling::Ignored,
        tie: Tie::Read(true),
        qk_norm: QkNorm::Always,
        norms: NormPlacement::Sandwich,
        windows: Windows::Gemma4,
        gemma: Some(Gemma {
            activation: Activation::GeluTanh,
            bf16_embed_scale: false,
            query_pre_attn: None,
            unit_scale: true,
            plus_one: false,
            softcaps: Some((None, 30.0)),
        }),
        ..DENSE
    },
];

/// DeepSeek-V3 (and Kimi K2, which mlx-lm runs as it).
const DEEPSEEK_V3: Rules = Rules {
    family: Family::DeepseekV3,
    model_types: &["deepseek_v3", "kimi_k2"],
    rope_traditional: Some(true),
    tie: Tie::Never,
    biases: Biases::Attention,
    moe: Some(MoeRules { layers: MoeLayers::AfterDense { freq: true }, ..GROUPED_MOE }),
    // Each head's size is the latent's (`qk_nope_head_dim + qk_rope_head_dim`).
    head_dim: HeadDim::Derived,
    latent: true,
    ..DENSE
};

/// GLM-4.5 MoE's and DeepSeek-V3's experts: [`grouped_moe`], after the dense first layers.
const GROUPED_MOE: MoeRules = MoeRules { layers: MoeLayers::AfterDense { freq: false }, grouped: true, ..QWEN_MOE };

/// How GLM-4's checkpoints spell its four norms (in this order: each rename sees the names
/// the ones before it left).
const GLM4_NAMES: &[(&str, &str)] = &[
    ("post_attention_layernorm", "post_self_attn_layernorm"),
    ("pre_feedforward_layernorm", "post_attention_layernorm"),
    ("post_feedforward_layernorm", "post_mlp_layernorm"),
];

/// How LFM2's checkpoints spell the parts of our names.
const LFM2_NAMES: &[(&str, &str)] = &[
    ("self_attn.o_proj", "self_attn.out_proj"),
    ("self_attn.q_norm", "self_attn.q_layernorm"),
    ("self_attn.k_norm", "self_attn.k_layernorm"),
    ("input_layernorm", "operator_norm"),
    ("post_attention_layernorm", "ffn_norm"),
    ("mlp.gate_proj", "feed_forward.w1"),
    ("mlp.up_proj", "feed_forward.w3"),
    ("mlp.down_proj", "feed_forward.w2"),
    ("model.norm", "model.embedding_norm"),
];

/// Qwen3-Next's sparse MoE block: softmax then top k (`norm_topk_prob`, default false),
/// a gated shared expert, experts in every `decoder_sparse_step`-th layer outside
/// `mlp_only_layers`.
const QWEN_NEXT_MOE: MoeRules = MoeRules {
    softmax_first: Some(true),
    normalize_default: Some(false),
    shared_expert: true,
    layers: MoeLayers::Sparse,
    ..QWEN_MOE
};

/// mlx-lm's multimodal wrappers whose language model is a family of the table: the wrapper's
/// `model_type`, then the text model's settings (`text_config`, as mlx-lm's wrapper class
/// completes them) and where its weights sit (under [`WEIGHTS_PREFIX`]). A vision tower and
/// projector beside them are never read.
const WRAPPERS: [&str; 3] = ["gemma3", "mistral3", "gemma4"];

/// The text model's config of a wrapper checkpoint (`value` its whole `config.json`), as
/// mlx-lm's wrapper class builds it: `gemma3` always runs `gemma3_text` (the top level's
/// `vocab_size`, default 262,208; 8 heads over 4 kv heads where `text_config` names none);
/// `gemma4` runs `gemma4_text` likewise (vocabulary 262,144, 8 heads over 1 kv head);
/// `mistral3` runs `ministral3` for a `ministral3` text model and `llama` for any other
/// (untied unless `text_config` says), but a `mistral4` one, which this crate does not run. `None` for any other model type.
fn text_of_wrapper(value: &Value, path: &Path) -> Result<Option<Value>> {
    let Some(wrapper) = value.get("model_type").and_then(Value::as_str).filter(|t| WRAPPERS.contains(t)) else {
        return Ok(None);
    };
    let Some(Value::Object(text)) = value.get("text_config") else {
        return Err(cfg_err(path, "text_config", format!("a `{wrapper}` checkpoint needs its text model's settings")));
    };
    let mut text = text.clone();
    match wrapper {
        "gemma3" => {
            text.insert("model_type".into(), "gemma3_text".into());
            text.insert("vocab_size".into(), value.get("vocab_size").cloned().unwrap_or(262_208.into()));
            text.entry("num_attention_heads").or_insert(8.into());
            text.entry("num_key_value_heads").or_insert(4.into());
        }
        "gemma4" => {
            text.insert("model_type".into(), "gemma4_text".into());
            text.insert("vocab_size".into(), value.get("vocab_size").cloned().unwrap_or(262_144.into()));
            text.entry("num_attention_heads").or_insert(8.into());
            text.entry("num_key_value_heads").or_insert(1.into());
        }
        _ => {
            let inner = text.get("model_type").and_then(Value::as_str).unwrap_or("llama").to_owned();
            if inner == "mistral4" {
                return Err(Error::Unsupported {
                    path: path.to_path_buf(),
                    model_type: wrapper.into(),
                    key: "text_config.model_type".into(),
                    value: inner,
                });
            }
            let runs = if inner == "ministral3" { "ministral3" } else { "llama" };
            text.insert("model_type".into(), runs.into());
            text.entry("tie_word_embeddings").or_insert(false.into());
        }
    }
    Ok(Some(Value::Object(text)))
}

/// The family row that reads `model_type`.
fn rules_for(model_type: &str) -> Option<&'static Rules> {
    FAMILIES.iter().find(|r| r.model_types.contains(&model_type))
}

impl ModelConfig {
    /// Normalises `config.json` (already parsed; `path` names it in errors) by its family's
    /// row of the rules table. Any `model_type` or option this crate cannot run is refused
    /// here, before any compile.
    pub fn from_json(value: &Value, path: &Path) -> Result<ModelConfig> {
        if let Some(text) = text_of_wrapper(value, path)? {
            return Self::from_json(&text, path);
        }
        let raw: RawConfig =
            serde_json::from_value(value.clone()).map_err(|e| cfg_err(path, "config", e.to_string()))?;
        let model_type = raw.model_type.clone().ok_or_else(|| cfg_err(path, "model_type", "missing"))?;
        let Some(rules) = rules_for(&model_type) else {
            return Err(Error::UnsupportedModelType { path: path.to_path_buf(), model_type, supported: SUPPORTED });
        };
        // mlx-lm's qwen3_5: the text model's settings are `text_config` where there is one
        // (its own `model_type` aside), else the top level.
        let raw = match value.get("text_config").filter(|_| rules.wrapped) {
            Some(text) => serde_json::from_value::<RawConfig>(text.clone())
                .map_err(|e| cfg_err(path, "text_config", e.to_string()))?,
            None => raw,
        };
        let p = path;
        let hidden = required(p, "hidden_size", raw.hidden_size)?;
        let heads = required(p, "num_attention_heads", raw.num_attention_heads)?;
        let head_dim = match (rules.head_dim, raw.head_dim) {
            (HeadDim::Derived, _) | (HeadDim::GivenOrDerived, None) => hidden / heads.max(1),
            (_, Some(d)) => d,
            (HeadDim::Given, None) => return Err(cfg_err(p, "head_dim", "missing")),
        };
        let unsupported = |key: &str, value: String| Error::Unsupported {
            path: path.to_path_buf(),
            model_type: model_type.clone(),
            key: key.to_string(),
            value,
        };
        let latent = if rules.latent { Some(latent_attention(&raw, p)?) } else { None };
        let head_dim = latent.as_ref().map_or(head_dim, |l| l.nope_dim + l.rope_dim);
        let rope_traditional = match rules.rope_traditional {
            Some(default) => raw.rope_traditional.unwrap_or(default),
            None if raw.rope_traditional == Some(true) => {
                return Err(unsupported("rope_traditional", "true".into()));
            }
            None => false,
        };
        let (rope_theta, rope_scaling) = rope(&raw, rules, p, &unsupported)?;
        let factor = match rules.partial_rotary {
            Partial::No => None,
            Partial::TopLevel => raw.partial_rotary_factor,
            Partial::Nested(default) => Some(
                raw.rope_parameters
                    .as_ref()
                    .and_then(|v| v.get("partial_rotary_factor"))
                    .and_then(Value::as_f64)
                    .or(raw.partial_rotary_factor)
                    .unwrap_or(default),
            ),
        };
        let rope_dims = match (factor, &latent) {
            (_, Some(l)) => l.rope_dim,
            (Some(f), None) if f > 0.0 && f <= 1.0 => (head_dim as f64 * f) as usize,
            (Some(f), None) => return Err(cfg_err(p, "partial_rotary_factor", format!("{f} is not in (0, 1]"))),
            (None, None) => head_dim,
        };
        let gemma4 = matches!(rules.windows, Windows::Gemma4);
        let moe = match &rules.moe {
            Some(m) => parse_moe(&raw, m, p)?,
            None if gemma4 => gemma4_moe(&raw, p)?,
            None => None,
        };
        // mlx-lm's gemma4_text has one kv head by default, the others as many as queries.
        let kv_heads = match latent {
            Some(_) => 1,
            None => raw.num_key_value_heads.unwrap_or(if gemma4 { 1 } else { heads }),
        };
        let intermediate = if rules.short_conv {
            lfm2_ff_dim(&raw, p)?
        } else {
            required(p, "intermediate_size", raw.intermediate_size)?
        };
        let global = LayerConfig {
            rope_theta,
            rope_scaling,
            sliding_window: None,
            moe: false,
            rope: true,
            recurrent: false,
            kv_heads,
            head_dim,
            rope_dims,
            values_are_keys: false,
            kv_source: None,
            intermediate,
        };
        let linear = match rules.hybrid {
            Some(h) => Some(linear_attention(&raw, h, p)?),
            None => None,
        };
        let short_conv = rules
            .short_conv
            .then(|| ShortConv { kernel: raw.conv_l_cache.unwrap_or(3), bias: raw.conv_bias.unwrap_or(false) });
        let global = match (&short_conv, nested_theta(&raw)) {
            // mlx-lm's lfm2: a `rope_parameters.rope_theta` wins over the top level's.
            (Some(_), Some(theta)) => LayerConfig { rope_theta: theta, ..global },
            _ => global,
        };
        let mut layers = layers(&raw, rules, moe.is_some(), global, p)?;
        if linear.is_some() {
            mark_linear_layers(&raw, &mut layers, p)?;
        }
        if let Some(conv) = &short_conv {
            if conv.kernel < 2 {
                return Err(cfg_err(p, "conv_L_cache", format!("{} is below 2", conv.kernel)));
            }
            mark_conv_layers(&raw, &mut layers, p)?;
        }
        let per_layer_input = if gemma4 { per_layer_input(&raw, p)? } else { None };
        let gemma = rules.gemma;
        // mlx-lm's granite: four multipliers, none with a default.
        let multiplier = |key: &str, v: Option<f64>| -> Result<Option<f64>> {
            if rules.multipliers { required(p, key, v).map(Some) } else { Ok(None) }
        };
        let embedding_multiplier = multiplier("embedding_multiplier", raw.embedding_multiplier)?;
        let attention_multiplier = multiplier("attention_multiplier", raw.attention_multiplier)?;
        let residual_scale = multiplier("residual_multiplier", raw.residual_multiplier)?.map(|m| m as f32);
        let logits_divisor = multiplier("logits_scaling", raw.logits_scaling)?.map(|m| m as f32);
        if logits_divisor == Some(0.0) {
            return Err(cfg_err(p, "logits_scaling", "must not be 0"));
        }
        let attn_scale = match (gemma.and_then(|g| g.query_pre_attn), attention_multiplier) {
            (_, Some(m)) => m,
            _ if gemma.is_some_and(|g| g.unit_scale) => 1.0,
            (Some(default), None) => raw.query_pre_attn_scalar.unwrap_or(default).powf(-0.5),
            (None, None) => (head_dim as f64).powf(-0.5) * latent.as_ref().map_or(1.0, |_| yarn_softmax_scale(&raw)),
        };
        let embed_scale = gemma
            .map(|g| {
                let scale = (hidden as f64).sqrt();
                // mlx-lm's gemma3_text: mx.array(hidden ** 0.5, mx.bfloat16)
                if g.bf16_embed_scale { half::bf16::from_f64(scale).to_f32() } else { scale as f32 }
            })
            .or(embedding_multiplier.map(|m| m as f32));
        let softcaps = gemma.and_then(|g| g.softcaps);
        let attention_bias = raw.attention_bias.unwrap_or(false);
        let configured = matches!(rules.biases, Biases::Configured);
        let always = matches!(rules.biases, Biases::AlwaysAttention);
        let attention_configured = configured || matches!(rules.biases, Biases::Attention);
        let qkv_configured = attention_configured || matches!(rules.biases, Biases::AttentionQkv);
        // mlx-lm's ministral3 reads both from `rope_parameters`, with no defaults.
        let query_position_scale = if rules.query_position_scale {
            let nested = |key: &str| -> Result<f32> {
                let v = raw.rope_parameters.as_ref().and_then(|v| v.get(key));
                let v = v.ok_or_else(|| cfg_err(p, &format!("rope_parameters.{key}"), "missing"))?;
                v.as_f64()
                    .map(|x| x as f32)
                    .ok_or_else(|| cfg_err(p, &format!("rope_parameters.{key}"), "expected a number"))
            };
            let original = nested("original_max_position_embeddings")?;
            if original < 1.0 {
                return Err(cfg_err(p, "rope_parameters.original_max_position_embeddings", "must be at least 1"));
            }
            Some(QueryPositionScale { beta: nested("llama_4_scaling_beta")?, original })
        } else {
            None
        };
        ModelConfig {
            model_type: model_type.clone(),
            family: rules.family,
            hidden,
            intermediate,
            heads,
            kv_heads,
            head_dim,
            rope_dims,
            vocab: required(p, "vocab_size", raw.vocab_size)?,
            rms_eps: raw.rms_norm_eps.or(raw.norm_eps).unwrap_or(if gemma.is_some() || rules.latent {
                1e-6
            } else {
                1e-5
            }),
            layers,
            tie_embeddings: match rules.tie {
                Tie::Always => true,
                Tie::Never => false,
                Tie::Read(default) => raw.tie_word_embeddings.or(raw.tie_embedding).unwrap_or(default),
            },
            fused_qkv: rules.fused_projections,
            fused_gate_up: rules.fused_projections || rules.fused_gate_up,
            rope_traditional,
            qkv_bias: always || matches!(rules.biases, Biases::Qkv) || (qkv_configured && attention_bias),
            o_bias: always || (attention_configured && attention_bias),
            mlp_bias: configured && raw.mlp_bias.unwrap_or(false),
            qk_norm: match rules.qk_norm {
                QkNorm::No => false,
                QkNorm::Always => true,
                QkNorm::Read => required(p, "use_qk_norm", raw.use_qk_norm)?,
            },
            norm_plus_one: gemma.is_some_and(|g| g.plus_one),
            norm_placement: rules.norms,
            qk_norm_full_width: rules.qk_norm_full_width,
            embed_scale,
            activation: match (gemma, rules.family) {
                (Some(g), _) => g.activation,
                (None, Family::GptOss) => Activation::SwigluOai,
                (None, _) => Activation::Silu,
            },
            attn_scale,
            attn_softcap: softcaps.and_then(|(attn, _)| attn).map(|attn| raw.attn_logit_softcapping.unwrap_or(attn)),
            // An explicit `null` turns the cap off.
            final_softcap: softcaps.and_then(|(_, last)| raw.final_logit_softcapping.unwrap_or(Some(last))),
            max_position_embeddings: raw.max_position_embeddings,
            moe,
            linear,
            short_conv,
            latent,
            attn_output_gate: rules.attn_output_gate,
            query_position_scale,
            residual_scale,
            logits_divisor,
            per_layer_input,
            value_norm: gemma4,
            layer_scalar: gemma4,
            attn_sinks: rules.family == Family::GptOss,
        }
        .validated(path)
    }

    fn validated(self, path: &Path) -> Result<Self> {
        let p = path;
        for (key, v) in [
            ("hidden_size", self.hidden),
            ("num_attention_heads", self.heads),
            ("num_key_value_heads", self.kv_heads),
            ("head_dim", self.head_dim),
            ("vocab_size", self.vocab),
            ("intermediate_size", self.intermediate),
            ("num_hidden_layers", self.layers.len()),
        ] {
            if v == 0 {
                return Err(cfg_err(p, key, "must be > 0"));
            }
        }
        if !self.heads.is_multiple_of(self.kv_heads) {
            return Err(cfg_err(
                p,
                "num_key_value_heads",
                format!("{} does not divide num_attention_heads {}", self.kv_heads, self.heads),
            ));
        }
        if !self.head_dim.is_multiple_of(2) {
            return Err(cfg_err(p, "head_dim", format!("{} is odd; RoPE needs an even head_dim", self.head_dim)));
        }
        if self.rope_dims == 0 || !self.rope_dims.is_multiple_of(2) || self.rope_dims > self.head_dim {
            return Err(cfg_err(
                p,
                "partial_rotary_factor",
                format!(
                    "rotates {} of head_dim {}; RoPE needs an even number from 2 to head_dim",
                    self.rope_dims, self.head_dim
                ),
            ));
        }
        for l in &self.layers {
            if let RopeScaling::Su { long_factor, .. } = &l.rope_scaling
                && long_factor.len() != self.rope_dims / 2
            {
                return Err(cfg_err(
                    p,
                    "rope_scaling.long_factor",
                    format!(
                        "{} factors; {} rotated features take {}",
                        long_factor.len(),
                        self.rope_dims,
                        self.rope_dims / 2
                    ),
                ));
            }
        }
        for (i, l) in self.layers.iter().enumerate().filter(|(_, l)| !l.recurrent) {
            if l.kv_heads == 0 || !self.heads.is_multiple_of(l.kv_heads) || !l.head_dim.is_multiple_of(2) {
                return Err(cfg_err(
                    p,
                    "num_global_key_value_heads",
                    format!("layer {i}: {} kv heads of {} features for {} heads", l.kv_heads, l.head_dim, self.heads),
                ));
            }
        }
        if self.layers.iter().any(|l| l.sliding_window == Some(0)) {
            return Err(cfg_err(p, "sliding_window", "must be > 0"));
        }
        Ok(self)
    }

    /// `path`'s `config.json` loaded and normalised.
    pub fn from_file(path: &Path) -> Result<ModelConfig> {
        let text = std::fs::read_to_string(path).map_err(|e| cfg_err(path, "config.json", e.to_string()))?;
        let value: Value = serde_json::from_str(&text).map_err(|e| cfg_err(path, "config.json", e.to_string()))?;
        Self::from_json(&value, path)
    }

    /// The config of a checkpoint folder, with what only the tensors can tell: mlx-lm's
    /// `gemma3_text` ties the output layer exactly when `lm_head.weight` is absent. Points
    /// `ckpt` at the language model's weights where a wrapped family keeps them under
    /// `language_model.` (the names the graph reads stay `model.…`; a vision tower beside
    /// them is never read), and at the family's own spelling of name parts (LFM2's renames).
    pub fn for_checkpoint(ckpt: &mut weights::Checkpoint) -> Result<ModelConfig> {
        let mut cfg = Self::from_json(ckpt.config(), &ckpt.dir().join("config.json"))?;
        if let Some(rules) = rules_for(&cfg.model_type) {
            let wrapped_embedding = format!("{WEIGHTS_PREFIX}{}", crate::names::weight(crate::names::EMBEDDING));
            let wrapper =
                ckpt.config().get("model_type").and_then(Value::as_str).is_some_and(|t| WRAPPERS.contains(&t));
            if (rules.wrapped || wrapper) && ckpt.contains(&wrapped_embedding) {
                ckpt.set_prefix(WEIGHTS_PREFIX);
            }
            ckpt.set_renames(rules.renames);
        }
        if cfg.family == Family::Gemma3 {
            cfg.tie_embeddings = !ckpt.contains(&crate::names::weight(crate::names::LM_HEAD));
        }
        // Refused here, before any compile, with the cause rather than a missing tensor.
        if let Some((l, moe)) = cfg.layers.iter().position(|l| l.moe).zip(cfg.moe.as_ref()) {
            let names = crate::names::LayerNames::new(l).moe(moe);
            let block = names.block();
            let wanted = crate::names::weight(&names.experts("gate_proj"));
            let (w1, gate) = (format!("{block}.experts.0.w1.weight"), format!("{block}.experts.0.gate_proj.weight"));
            if !ckpt.contains(&wanted)
                && let Some(found) = [gate, w1].into_iter().find(|n| ckpt.contains(n))
            {
                return Err(Error::UnstackedExperts { dir: ckpt.dir().to_path_buf(), found, wanted });
            }
        }
        Ok(cfg)
    }

    pub fn num_layers(&self) -> usize {
        self.layers.len()
    }

    /// Layers with keys and values of their own in the KV cache (all but the recurrent ones
    /// and Gemma 4's KV-shared ones): the cache's leading dimension.
    pub fn kv_layers(&self) -> usize {
        self.cached_layers().count()
    }

    fn cached_layers(&self) -> impl Iterator<Item = &LayerConfig> {
        self.layers.iter().filter(|l| !l.recurrent && l.kv_source.is_none())
    }

    /// Whether every attention layer has the model's heads (`kv_heads`, `head_dim`); not
    /// Gemma 4's, whose full layers differ from its sliding ones: its cache then holds each
    /// position's keys (values) of a layer flat, `[1, width]`, padded to the widest layer's.
    pub fn uniform_heads(&self) -> bool {
        self.layers.iter().filter(|l| !l.recurrent).all(|l| (l.kv_heads, l.head_dim) == (self.kv_heads, self.head_dim))
    }

    /// How `layer` (one of [`ModelConfig::layers`]) mixes tokens.
    pub fn mixer(&self, layer: &LayerConfig) -> LayerMixer<'_> {
        match (layer.recurrent, &self.linear, &self.short_conv, &self.latent) {
            (true, Some(lin), _, _) => LayerMixer::Linear(lin),
            (true, None, Some(conv), _) => LayerMixer::ShortConv(conv),
            (false, _, _, Some(latent)) => LayerMixer::Latent(latent),
            _ => LayerMixer::Attention,
        }
    }

    /// Each cached position's (heads, features) in the two caches of every attention
    /// layer: keys and values of `kv_heads` heads of `head_dim`, or a latent layer's latent
    /// `[1, kv_rank]` and rotated key `[1, rope_dim]`, or, where the layers' heads differ
    /// ([`ModelConfig::uniform_heads`]), `[1, widest kv_heads * head_dim]`.
    pub fn cache_rows(&self) -> [(usize, usize); 2] {
        match &self.latent {
            Some(l) => [(1, l.kv_rank), (1, l.rope_dim)],
            None if self.uniform_heads() => [(self.kv_heads, self.head_dim); 2],
            None => [(1, self.cached_layers().map(|l| l.kv_heads * l.head_dim).max().unwrap_or(0)); 2],
        }
    }

    /// The state buffers of one recurrent layer, in f32 values per sequence: a gated
    /// DeltaNet's convolution inputs and its delta-rule matrix, a short convolution's
    /// inputs (empty without recurrent layers).
    pub fn layer_state_parts(&self) -> Vec<usize> {
        match (&self.linear, &self.short_conv) {
            (Some(lin), _) => vec![lin.conv_state_len(), lin.matrix_len()],
            (None, Some(conv)) => vec![(conv.kernel - 1) * self.hidden],
            (None, None) => Vec::new(),
        }
    }

    /// Every state buffer of the model, in layer order (each recurrent layer's
    /// [`ModelConfig::layer_state_parts`]): the engine keeps one `[slots, len]` f32 buffer
    /// per entry, so no buffer holds more than one layer's part.
    pub fn state_parts(&self) -> Vec<usize> {
        let per_layer = self.layer_state_parts();
        self.layers.iter().filter(|l| l.recurrent).flat_map(|_| per_layer.iter().copied()).collect()
    }

    /// f32 values of recurrent state each sequence carries (0 without recurrent layers).
    pub fn state_len(&self) -> usize {
        self.state_parts().iter().sum()
    }
}

/// DeepSeek-V3's latent attention sizes, with mlx-lm's defaults (`kv_lora_rank` 512,
/// `q_lora_rank` 1536 when absent and none when `null`, `qk_nope_head_dim` 128,
/// `qk_rope_head_dim` 64, `v_head_dim` 128).
fn latent_attention(raw: &RawConfig, p: &Path) -> Result<LatentAttention> {
    let q_rank = raw.q_lora_rank.unwrap_or(Some(1536));
    let latent = LatentAttention {
        q_rank,
        kv_rank: raw.kv_lora_rank.unwrap_or(512),
        nope_dim: raw.qk_nope_head_dim.unwrap_or(128),
        rope_dim: raw.qk_rope_head_dim.unwrap_or(64),
        v_dim: raw.v_head_dim.unwrap_or(128),
    };
    for (key, v) in [
        ("q_lora_rank", latent.q_rank.unwrap_or(1)),
        ("kv_lora_rank", latent.kv_rank),
        ("qk_nope_head_dim", latent.nope_dim),
        ("qk_rope_head_dim", latent.rope_dim),
        ("v_head_dim", latent.v_dim),
    ] {
        if v == 0 {
            return Err(cfg_err(p, key, "must be > 0"));
        }
    }
    Ok(latent)
}

/// mlx-lm's deepseek_v3 softmax scale factor: with a `rope_scaling` that has a non-zero
/// `mscale_all_dim` and a `factor` above 1, `(0.1 * mscale_all_dim * ln(factor) + 1)^2`; else 1.
fn yarn_softmax_scale(raw: &RawConfig) -> f64 {
    let scaling = raw.rope_scaling.as_ref().filter(|v| v.is_object());
    let num = |key: &str| scaling.and_then(|v| v.get(key)).and_then(Value::as_f64);
    match (num("mscale_all_dim"), num("factor")) {
        (Some(m), Some(factor)) if m != 0.0 && factor > 1.0 => {
            let s = 0.1 * m * factor.ln() + 1.0;
            s * s
        }
        _ => 1.0,
    }
}

/// The gated DeltaNet layers' sizes (mlx-lm's `GatedDeltaNet` reads them all, no defaults).
fn linear_attention(raw: &RawConfig, hybrid: Hybrid, p: &Path) -> Result<LinearAttention> {
    let k_heads = required(p, "linear_num_key_heads", raw.linear_num_key_heads)?;
    let v_heads = required(p, "linear_num_value_heads", raw.linear_num_value_heads)?;
    let linear = LinearAttention {
        k_heads,
        v_heads,
        k_dim: required(p, "linear_key_head_dim", raw.linear_key_head_dim)?,
        v_dim: required(p, "linear_value_head_dim", raw.linear_value_head_dim)?,
        conv_kernel: required(p, "linear_conv_kernel_dim", raw.linear_conv_kernel_dim)?,
        fused_in_proj: hybrid.fused_in_proj,
    };
    for (key, v) in [
        ("linear_num_key_heads", k_heads),
        ("linear_num_value_heads", v_heads),
        ("linear_key_head_dim", linear.k_dim),
        ("linear_value_head_dim", linear.v_dim),
    ] {
        if v == 0 {
            return Err(cfg_err(p, key, "must be > 0"));
        }
    }
    if linear.conv_kernel < 2 {
        return Err(cfg_err(p, "linear_conv_kernel_dim", format!("{} is below 2", linear.conv_kernel)));
    }
    if !v_heads.is_multiple_of(k_heads) {
        return Err(cfg_err(
            p,
            "linear_num_value_heads",
            format!("{v_heads} is not a multiple of linear_num_key_heads {k_heads}"),
        ));
    }
    Ok(linear)
}

/// mlx-lm's Qwen3-Next/Qwen3.5 layer pattern: every `full_attention_interval`-th layer
/// attends, the others are linear. A `layer_types` list, where config.json has one, must
/// name the same pattern (mlx-lm follows the interval; a list that disagrees is refused).
fn mark_linear_layers(raw: &RawConfig, layers: &mut [LayerConfig], p: &Path) -> Result<()> {
    let interval = raw.full_attention_interval.unwrap_or(4);
    if interval == 0 {
        return Err(cfg_err(p, "full_attention_interval", "must be > 0"));
    }
    for (i, layer) in layers.iter_mut().enumerate() {
        layer.recurrent = (i + 1) % interval != 0;
        let named = raw.layer_types.as_ref().map(|t| t.get(i).map(String::as_str));
        let linear = match named {
            None => continue,
            Some(Some("linear_attention")) => true,
            Some(Some("full_attention")) => false,
            Some(Some(other)) => {
                return Err(cfg_err(
                    p,
                    "layer_types",
                    format!("layer {i}: {other:?} is not a layer type of this model"),
                ));
            }
            Some(None) => {
                let n = raw.layer_types.as_ref().map_or(0, Vec::len);
                return Err(cfg_err(p, "layer_types", format!("{n} entries for {} layers", layers.len())));
            }
        };
        if linear != layer.recurrent {
            return Err(cfg_err(
                p,
                "layer_types",
                format!(
                    "layer {i} is {:?}, but full_attention_interval {interval} makes it the other kind",
                    named.flatten().unwrap_or_default()
                ),
            ));
        }
    }
    // mlx-lm would run such a model without any cache; the engine keeps one, so refuse it here.
    if layers.iter().all(|l| l.recurrent) {
        return Err(cfg_err(
            p,
            "full_attention_interval",
            format!("{interval} leaves no full-attention layer among {} layers (not supported)", layers.len()),
        ));
    }
    Ok(())
}

/// `rope_parameters.rope_theta`, where config.json has it.
fn nested_theta(raw: &RawConfig) -> Option<f64> {
    raw.rope_parameters.as_ref().and_then(|v| v.get("rope_theta")).and_then(Value::as_f64)
}

/// LFM2's layer pattern (mlx-lm's lfm2): the layers `full_attn_idxs` lists attend, else
/// those `layer_types` marks `full_attention`; the others (`conv`) are short convolutions.
fn mark_conv_layers(raw: &RawConfig, layers: &mut [LayerConfig], p: &Path) -> Result<()> {
    let n = layers.len();
    let attends: Vec<bool> = match (&raw.full_attn_idxs, &raw.layer_types) {
        (Some(idxs), _) => {
            if let Some(bad) = idxs.iter().find(|&&i| i >= n) {
                return Err(cfg_err(p, "full_attn_idxs", format!("layer {bad} of {n} layers")));
            }
            (0..n).map(|i| idxs.contains(&i)).collect()
        }
        (None, Some(types)) => {
            if types.len() != n {
                return Err(cfg_err(p, "layer_types", format!("{} entries for {n} layers", types.len())));
            }
            let kind = |(i, t): (usize, &String)| match t.as_str() {
                "full_attention" => Ok(true),
                "conv" => Ok(false),
                other => {
                    Err(cfg_err(p, "layer_types", format!("layer {i}: {other:?} is not a layer type of this model")))
                }
            };
            types.iter().enumerate().map(kind).collect::<Result<_>>()?
        }
        (None, None) => return Err(cfg_err(p, "layer_types", "missing (and no full_attn_idxs)")),
    };
    if !attends.contains(&true) {
        return Err(cfg_err(p, "layer_types", format!("no full_attention layer among {n} layers (not supported)")));
    }
    for (layer, attends) in layers.iter_mut().zip(attends) {
        layer.recurrent = !attends;
    }
    Ok(())
}

/// LFM2's MLP width (mlx-lm's lfm2 `MLP`): `block_ff_dim` (else `intermediate_size`); with
/// `block_auto_adjust_ff_dim`, two thirds of it, times `block_ffn_dim_multiplier`, rounded up
/// to a multiple of `block_multiple_of`.
fn lfm2_ff_dim(raw: &RawConfig, p: &Path) -> Result<usize> {
    let ff = match raw.block_ff_dim.or(raw.intermediate_size) {
        Some(ff) => ff,
        None => return Err(cfg_err(p, "block_ff_dim", "missing (and no intermediate_size)")),
    };
    if !raw.block_auto_adjust_ff_dim.unwrap_or(false) {
        return Ok(ff);
    }
    let multiple = required(p, "block_multiple_of", raw.block_multiple_of)?;
    if multiple == 0 {
        return Err(cfg_err(p, "block_multiple_of", "must be > 0"));
    }
    // Python's int() of a float truncates toward zero, as `as usize` does here.
    let mut ff = (2.0 * ff as f64 / 3.0) as usize;
    if let Some(m) = raw.block_ffn_dim_multiplier {
        ff = (m * ff as f64) as usize;
    }
    Ok(ff.div_ceil(multiple) * multiple)
}

fn parse_rope_scaling(
    v: Option<&Value>,
    max_position_embeddings: Option<f64>,
    path: &Path,
    unsupported: &dyn Fn(&str, String) -> Error,
) -> Result<RopeScaling> {
    let Some(v) = v.filter(|v| !v.is_null()) else { return Ok(RopeScaling::None) };
    let obj = v.as_object().ok_or_else(|| cfg_err(path, "rope_scaling", "expected an object"))?;
    // mlx-lm's `initialize_rope`: the old `type` key first, then `rope_type`.
    let kind = obj.get("type").or_else(|| obj.get("rope_type")).and_then(Value::as_str).unwrap_or("default");
    let num = |key: &str, default: Option<f64>| -> Result<f64> {
        match obj.get(key) {
            Some(x) => x.as_f64().ok_or_else(|| cfg_err(path, &format!("rope_scaling.{key}"), "expected a number")),
            None => default.ok_or_else(|| cfg_err(path, &format!("rope_scaling.{key}"), "missing")),
        }
    };
    match kind {
        "default" => Ok(RopeScaling::None),
        "linear" => Ok(RopeScaling::Linear { factor: num("factor", None)? }),
        "llama3" => Ok(RopeScaling::Llama3 {
            factor: num("factor", None)?,
            low_freq_factor: num("low_freq_factor", Some(1.0))?,
            high_freq_factor: num("high_freq_factor", Some(4.0))?,
            original_max_position_embeddings: num("original_max_position_embeddings", Some(8192.0))?,
        }),
        "yarn" => Ok(RopeScaling::Yarn {
            factor: num("factor", None)?,
            original_max_position_embeddings: num("original_max_position_embeddings", Some(4096.0))?,
            beta_fast: num("beta_fast", Some(32.0))?,
            beta_slow: num("beta_slow", Some(1.0))?,
            mscale: num("mscale", Some(1.0))?,
            mscale_all_dim: num("mscale_all_dim", Some(0.0))?,
        }),
        "longrope" => Ok(RopeScaling::Su {
            long_factor: factors(obj, "long_factor", path)?,
            max_position_embeddings: max_position_embeddings
                .ok_or_else(|| cfg_err(path, "max_position_embeddings", "missing (rope_scaling longrope needs it)"))?,
            original_max_position_embeddings: num("original_max_position_embeddings", None)?,
        }),
        other => Err(unsupported("rope_scaling.rope_type", format!("\"{other}\""))),
    }
}

/// The RoPE base and scaling every global layer uses, by the family's rules.
fn rope(
    raw: &RawConfig,
    rules: &Rules,
    p: &Path,
    unsupported: &dyn Fn(&str, String) -> Error,
) -> Result<(f64, RopeScaling)> {
    // mlx-lm's qwen3: `rope_parameters` stands in for a missing `rope_theta` and
    // `rope_scaling`, and a `rope_theta` found in neither is an error.
    let nested = raw.rope_parameters.as_ref().filter(|v| rules.rope_parameters && v.is_object());
    let nested_theta = nested.and_then(|v| v.get("rope_theta")).and_then(Value::as_f64);
    let raw_theta = raw.rope_theta.or(nested_theta);
    if rules.rope_parameters && raw_theta.is_none() {
        return Err(cfg_err(p, "rope_theta", "missing (and not in rope_parameters)"));
    }
    let max_positions = raw.max_position_embeddings.map(|m| m as f64);
    let scaling = match rules.scaling {
        Scaling::Ignored => RopeScaling::None,
        Scaling::Phi3 => parse_phi3_rope_scaling(raw, p, unsupported)?,
        Scaling::Read => {
            let scaling = raw.rope_scaling.as_ref().filter(|v| !v.is_null()).or(nested);
            parse_rope_scaling(scaling, max_positions, p, unsupported)?
        }
    };
    Ok((raw_theta.unwrap_or(rules.rope_theta), scaling))
}

/// Every layer's settings: `global`'s, with the family's sliding windows and MoE layers.
fn layers(raw: &RawConfig, rules: &Rules, has_moe: bool, global: LayerConfig, p: &Path) -> Result<Vec<LayerConfig>> {
    let n_layers = required(p, "num_hidden_layers", raw.num_hidden_layers)?;
    let moe_layers = rules.moe.map(|m| m.layers);
    let sparse_step = raw.decoder_sparse_step.unwrap_or(1).max(1);
    let mlp_only = raw.mlp_only_layers.clone().unwrap_or_default();
    let first_dense = raw.first_k_dense_replace.unwrap_or(0);
    let freq = raw.moe_layer_freq.unwrap_or(1);
    if freq == 0 && moe_layers == Some(MoeLayers::AfterDense { freq: true }) {
        return Err(cfg_err(p, "moe_layer_freq", "must be > 0"));
    }
    let window = raw.sliding_window;
    if let Windows::Gemma4 = rules.windows {
        return gemma4_layers(raw, global, n_layers, p);
    }
    let rotates = rotated_layers(raw, rules, n_layers, p)?;
    (0..n_layers)
        .map(|i| -> Result<LayerConfig> {
            // mlx-lm's qwen3_moe: layers in `mlp_only_layers`, and all but every
            // `decoder_sparse_step`-th, keep the dense MLP; glm4_moe and deepseek_v3 the
            // first `first_k_dense_replace` (deepseek_v3 also those off `moe_layer_freq`);
            // the other MoE families use experts in every layer.
            let moe = has_moe
                && match moe_layers {
                    None | Some(MoeLayers::Every) => true,
                    Some(MoeLayers::Sparse) => !mlp_only.contains(&i) && (i + 1) % sparse_step == 0,
                    Some(MoeLayers::AfterDense { freq: by_freq }) => {
                        i >= first_dense && (!by_freq || i.is_multiple_of(freq))
                    }
                };
            let global = LayerConfig { moe, rope: rotates[i], ..global.clone() };
            Ok(match rules.windows {
                // Gemma 4's are `gemma4_layers`'.
                Windows::Global | Windows::Gemma4 => global,
                Windows::LayerTypes => {
                    if marked_sliding(raw, i, p)?.unwrap_or(false) {
                        LayerConfig { sliding_window: Some(required(p, "sliding_window", window)?), ..global }
                    } else {
                        global
                    }
                }
                Windows::Even => LayerConfig { sliding_window: window.filter(|_| i % 2 == 0), ..global },
                Windows::LayerTypesElseEven => {
                    let sliding = marked_sliding(raw, i, p)?.unwrap_or(i % 2 == 0);
                    let window = if sliding { Some(required(p, "sliding_window", window)?) } else { None };
                    LayerConfig { sliding_window: window, ..global }
                }
                Windows::Olmo3 => {
                    if marked_sliding(raw, i, p)?.unwrap_or((i + 1) % 4 != 0) {
                        let window = Some(required(p, "sliding_window", window)?);
                        LayerConfig { sliding_window: window, rope_scaling: RopeScaling::None, ..global }
                    } else {
                        global
                    }
                }
                Windows::Gemma3 => {
                    let pattern = raw.sliding_window_pattern.unwrap_or(6).max(1);
                    if (i + 1) % pattern == 0 {
                        global
                    } else {
                        LayerConfig {
                            rope_theta: raw.rope_local_base_freq.unwrap_or(10_000.0),
                            rope_scaling: RopeScaling::None,
                            sliding_window: Some(window.unwrap_or(512)),
                            moe: false,
                            ..global
                        }
                    }
                }
            })
        })
        .collect()
}

/// Gemma 4's layers as mlx-lm's gemma4_text builds them: each `layer_types` entry (else
/// all but every `sliding_window_pattern`-th layer, default 5, slide) with its type's heads
/// (full layers: `global_head_dim`, default 512; with `attention_k_eq_v` the values are the
/// keys and `num_global_key_value_heads` the kv heads) and RoPE (`rope_parameters` by type,
/// `proportional` included); the last `num_kv_shared_layers` (default 20) attend over the
/// keys and values of the last earlier layer of their type, with a double-wide MLP
/// (`use_double_wide_mlp`, default true). With `enable_moe_block` every layer also runs
/// experts ([`gemma4_moe`]).
fn gemma4_layers(raw: &RawConfig, global: LayerConfig, n: usize, p: &Path) -> Result<Vec<LayerConfig>> {
    let moe = raw.enable_moe_block == Some(true);
    if let Some(types) = raw.layer_types.as_ref().filter(|t| t.len() != n) {
        return Err(cfg_err(p, "layer_types", format!("{} entries for {n} layers", types.len())));
    }
    let full = |i: usize| -> Result<bool> {
        match (marked_sliding(raw, i, p)?, raw.sliding_window_pattern.unwrap_or(5)) {
            (Some(sliding), _) => Ok(!sliding),
            (None, 0) => Err(cfg_err(p, "sliding_window_pattern", "must be > 0")),
            (None, pattern) => Ok((i + 1).is_multiple_of(pattern)),
        }
    };
    let shared = raw.num_kv_shared_layers.unwrap_or(20);
    if shared >= n {
        return Err(cfg_err(p, "num_kv_shared_layers", format!("{shared} leaves none of the {n} layers its own keys")));
    }
    let first_shared = n - shared;
    // mlx-lm: 512 when absent, the sliding layers' size when null or 0.
    let global_head_dim = raw.global_head_dim.map_or(512, |d| d.unwrap_or(0));
    let k_eq_v = raw.attention_k_eq_v.unwrap_or(false);
    let double_wide = raw.use_double_wide_mlp.unwrap_or(true);
    let mut layers = Vec::with_capacity(n);
    // The last layer of each type before the shared ones: the source of that type's shared layers.
    let mut last_of_type: [Option<usize>; 2] = [None; 2];
    for i in 0..n {
        let is_full = full(i)?;
        let key = if is_full { "full_attention" } else { "sliding_attention" };
        let head_dim = if is_full && global_head_dim > 0 { global_head_dim } else { global.head_dim };
        let values_are_keys = k_eq_v && is_full;
        let kv_heads = match raw.num_global_key_value_heads {
            Some(k) if values_are_keys => k,
            _ => global.kv_heads,
        };
        let (rope_theta, rope_scaling) = gemma4_rope(raw, key, head_dim, p)?;
        let kv_source = if i < first_shared {
            last_of_type[usize::from(is_full)] = Some(i);
            None
        } else {
            let source = last_of_type[usize::from(is_full)]
                .ok_or_else(|| cfg_err(p, "num_kv_shared_layers", format!("no layer before layer {i} is {key}")))?;
            Some(source)
        };
        let wide = double_wide && kv_source.is_some();
        layers.push(LayerConfig {
            rope_theta,
            rope_scaling,
            sliding_window: if is_full { None } else { Some(raw.sliding_window.unwrap_or(512)) },
            kv_heads,
            head_dim,
            rope_dims: head_dim,
            values_are_keys,
            kv_source,
            intermediate: global.intermediate * if wide { 2 } else { 1 },
            moe,
            ..global.clone()
        });
    }
    Ok(layers)
}

/// A Gemma 4 layer type's RoPE base and scaling: `rope_parameters[key]` (mlx-lm's defaults
/// where `rope_parameters` is absent: full layers `proportional` over a quarter of the head at
/// base 1e6, sliding ones plain at 1e4); base 1e4 where the entry has none.
fn gemma4_rope(raw: &RawConfig, key: &str, head_dim: usize, p: &Path) -> Result<(f64, RopeScaling)> {
    let entry = match &raw.rope_parameters {
        Some(v) if !v.is_null() => v.get(key).cloned().unwrap_or(Value::Object(Default::default())),
        _ if key == "full_attention" => serde_json::json!({
            "partial_rotary_factor": 0.25, "rope_theta": 1_000_000.0, "rope_type": "proportional"
        }),
        _ => serde_json::json!({"rope_theta": 10_000.0, "rope_type": "default"}),
    };
    let obj = entry.as_object().ok_or_else(|| cfg_err(p, &format!("rope_parameters.{key}"), "expected an object"))?;
    let num = |name: &str, default: f64| -> Result<f64> {
        match obj.get(name) {
            None => Ok(default),
            Some(x) => {
                x.as_f64().ok_or_else(|| cfg_err(p, &format!("rope_parameters.{key}.{name}"), "expected a number"))
            }
        }
    };
    let theta = num("rope_theta", 10_000.0)?;
    let kind = obj.get("type").or_else(|| obj.get("rope_type")).and_then(Value::as_str).unwrap_or("default");
    if kind != "proportional" {
        let unsupported = |k: &str, value: String| Error::Unsupported {
            path: p.to_path_buf(),
            model_type: "gemma4_text".into(),
            key: format!("rope_parameters.{key}.{}", k.trim_start_matches("rope_scaling.")),
            value,
        };
        return Ok((theta, parse_rope_scaling(Some(&entry), None, p, &unsupported)?));
    }
    // mlx-lm's ProportionalRoPE: `int(dims * partial_rotary_factor)` rotated features.
    let partial = num("partial_rotary_factor", 1.0)?;
    let rotated = (head_dim as f64 * partial) as usize;
    if !(0.0..=1.0).contains(&partial) || !rotated.is_multiple_of(2) {
        return Err(cfg_err(
            p,
            &format!("rope_parameters.{key}.partial_rotary_factor"),
            format!("{partial} rotates {rotated} of {head_dim} features; RoPE needs an even number up to the head"),
        ));
    }
    Ok((theta, RopeScaling::Proportional { rotated, factor: num("factor", 1.0)? }))
}

/// Gemma 4's per-layer inputs: `hidden_size_per_layer_input` (default 256; `null` or 0 for
/// none) and `vocab_size_per_layer_input` (default 262,144).
fn per_layer_input(raw: &RawConfig, p: &Path) -> Result<Option<PerLayerInput>> {
    let width = match raw.hidden_size_per_layer_input {
        None => 256,
        Some(None) | Some(Some(0)) => return Ok(None),
        Some(Some(w)) => w,
    };
    let vocab = raw.vocab_size_per_layer_input.unwrap_or(262_144);
    if vocab == 0 {
        return Err(cfg_err(p, "vocab_size_per_layer_input", "must be > 0"));
    }
    Ok(Some(PerLayerInput { width, vocab }))
}

/// Whether `layer_types` marks layer `i` `sliding_attention` (else `full_attention`); `None`
/// where config.json has no `layer_types`.
fn marked_sliding(raw: &RawConfig, i: usize, p: &Path) -> Result<Option<bool>> {
    match raw.layer_types.as_ref().map(|t| t.get(i).map(String::as_str)) {
        None => Ok(None),
        Some(Some("full_attention")) => Ok(Some(false)),
        Some(Some("sliding_attention")) => Ok(Some(true)),
        Some(other) => Err(cfg_err(p, "layer_types", format!("layer {i}: {other:?}"))),
    }
}

/// Whether each layer rotates its queries and keys: every one, except SmolLM3's NoPE layers
/// as mlx-lm's smollm3 reads them (`no_rope_layers`, one 0/1 per layer, 1 to rotate; else
/// every `no_rope_layer_interval`-th layer, default 4, has none).
fn rotated_layers(raw: &RawConfig, rules: &Rules, n_layers: usize, p: &Path) -> Result<Vec<bool>> {
    if !rules.nope_layers {
        return Ok(vec![true; n_layers]);
    }
    match &raw.no_rope_layers {
        Some(flags) if flags.len() != n_layers => Err(cfg_err(
            p,
            "no_rope_layers",
            format!("{} entries for {n_layers} layers (num_hidden_layers)", flags.len()),
        )),
        Some(flags) => Ok(flags.iter().map(|f| *f != 0).collect()),
        None => {
            let interval = raw.no_rope_layer_interval.unwrap_or(4);
            if interval == 0 {
                return Err(cfg_err(p, "no_rope_layer_interval", "must be > 0"));
            }
            Ok((0..n_layers).map(|i| (i + 1) % interval != 0).collect())
        }
    }
}

/// The MoE block of a family with one, by its rules (mlx-lm's defaults: Mixtral 8 experts,
/// top 2).
fn parse_moe(raw: &RawConfig, rules: &MoeRules, p: &Path) -> Result<Option<Moe>> {
    if rules.grouped {
        return grouped_moe(raw, rules, p);
    }
    let experts = match rules.local_experts {
        Some(default) => raw.num_local_experts.unwrap_or(default),
        None if rules.optional => raw.num_experts.unwrap_or(0),
        None => required(p, "num_experts", raw.num_experts)?,
    };
    let routing = match rules.softmax_first {
        Some(true) => Routing::SoftmaxTopK {
            normalize: required(p, "norm_topk_prob", raw.norm_topk_prob.or(rules.normalize_default))?,
        },
        Some(false) => Routing::SoftmaxTopK { normalize: false },
        None => Routing::TopKSoftmax,
    };
    // A qwen3_moe (qwen3_next, qwen3_5) config with no experts is a dense model in mlx-lm.
    if experts == 0 && (rules.layers == MoeLayers::Sparse || rules.optional) {
        return Ok(None);
    }
    let top_k = match rules.top_k {
        Some(default) => raw.num_experts_per_tok.unwrap_or(default),
        None => required(p, "num_experts_per_tok", raw.num_experts_per_tok)?,
    };
    if experts == 0 || top_k == 0 || top_k > experts {
        return Err(cfg_err(
            p,
            "num_experts_per_tok",
            format!("{top_k} of {experts} experts; it must be 1 to the experts"),
        ));
    }
    let intermediate = if rules.moe_width {
        required(p, "moe_intermediate_size", raw.moe_intermediate_size)?
    } else {
        required(p, "intermediate_size", raw.intermediate_size)?
    };
    let shared_expert = if rules.shared_expert {
        let width = required(p, "shared_expert_intermediate_size", raw.shared_expert_intermediate_size)?;
        Some(SharedExpert { width, gated: true })
    } else {
        None
    };
    Ok(Some(block_moe(rules, [experts, top_k, intermediate], routing, shared_expert)))
}

/// The experts of a family's MoE block (`[experts, top k, width]`), under its block's names.
fn block_moe(
    rules: &MoeRules,
    [experts, top_k, intermediate]: [usize; 3],
    routing: Routing,
    shared_expert: Option<SharedExpert>,
) -> Moe {
    Moe {
        block: rules.block,
        experts,
        top_k,
        intermediate,
        routing,
        shared_expert,
        beside_mlp: false,
        biased: rules.biased,
    }
}

/// Gemma 4's experts where `enable_moe_block` (the 26B-A4B): `num_experts`, `top_k_experts`
/// and `moe_intermediate_size`, all required, in every layer beside the dense MLP.
fn gemma4_moe(raw: &RawConfig, p: &Path) -> Result<Option<Moe>> {
    if raw.enable_moe_block != Some(true) {
        return Ok(None);
    }
    let experts = required(p, "num_experts", raw.num_experts)?;
    let top_k = required(p, "top_k_experts", raw.top_k_experts)?;
    if experts == 0 || top_k == 0 || top_k > experts {
        return Err(cfg_err(p, "top_k_experts", format!("{top_k} of {experts} experts; it must be 1 to the experts")));
    }
    Ok(Some(Moe {
        block: "experts",
        experts,
        top_k,
        intermediate: required(p, "moe_intermediate_size", raw.moe_intermediate_size)?,
        routing: Routing::ScaledTopKSoftmax,
        shared_expert: None,
        beside_mlp: true,
        biased: false,
    }))
}

/// The experts of glm4_moe and deepseek_v3 as mlx-lm reads them: `n_routed_experts` (none:
/// a dense model), `num_experts_per_tok`, `moe_intermediate_size`, `n_shared_experts` plain
/// shared experts of that width together, and the group-limited sigmoid router
/// (`scoring_func` `sigmoid` and `topk_method` `noaux_tc` are the only ones mlx-lm runs).
fn grouped_moe(raw: &RawConfig, rules: &MoeRules, p: &Path) -> Result<Option<Moe>> {
    let Some(experts) = raw.n_routed_experts else { return Ok(None) };
    for (key, value, only) in
        [("scoring_func", &raw.scoring_func, "sigmoid"), ("topk_method", &raw.topk_method, "noaux_tc")]
    {
        if let Some(v) = value.as_deref().filter(|v| *v != only) {
            return Err(cfg_err(p, key, format!("router mode {v:?} is not supported (only {only:?}, as mlx-lm)")));
        }
    }
    let top_k = required(p, "num_experts_per_tok", raw.num_experts_per_tok)?;
    if experts == 0 || top_k == 0 || top_k > experts {
        return Err(cfg_err(
            p,
            "num_experts_per_tok",
            format!("{top_k} of {experts} experts; it must be 1 to the experts"),
        ));
    }
    let groups = raw.n_group.unwrap_or(1);
    let top_groups = raw.topk_group.unwrap_or(1);
    if groups == 0 || !experts.is_multiple_of(groups) {
        return Err(cfg_err(p, "n_group", format!("{groups} groups do not divide {experts} experts")));
    }
    if groups > 1 && experts / groups < 2 {
        return Err(cfg_err(
            p,
            "n_group",
            format!("{groups} groups of {experts} experts leave fewer than 2 per group"),
        ));
    }
    if top_groups == 0 || top_groups > groups {
        return Err(cfg_err(p, "topk_group", format!("{top_groups} of {groups} groups; it must be 1 to n_group")));
    }
    let intermediate = required(p, "moe_intermediate_size", raw.moe_intermediate_size)?;
    let routing = Routing::Grouped {
        groups,
        top_groups,
        scale: raw.routed_scaling_factor.unwrap_or(1.0) as f32,
        normalize: raw.norm_topk_prob.unwrap_or(true),
    };
    let shared_expert = match raw.n_shared_experts {
        None | Some(0) => None,
        Some(n) => Some(SharedExpert { width: n * intermediate, gated: false }),
    };
    Ok(Some(block_moe(rules, [experts, top_k, intermediate], routing, shared_expert)))
}

/// mlx-lm's phi3: `rope_scaling` must hold `type` and `long_factor`; `longrope` and `su`
/// scale by the long factors with the model's own position limits, `linear` as elsewhere.
fn parse_phi3_rope_scaling(
    raw: &RawConfig,
    path: &Path,
    unsupported: &dyn Fn(&str, String) -> Error,
) -> Result<RopeScaling> {
    let Some(v) = raw.rope_scaling.as_ref().filter(|v| !v.is_null()) else { return Ok(RopeScaling::None) };
    let obj = v.as_object().ok_or_else(|| cfg_err(path, "rope_scaling", "expected an object"))?;
    let kind = obj.get("type").and_then(Value::as_str).ok_or_else(|| cfg_err(path, "rope_scaling.type", "missing"))?;
    match kind {
        "longrope" | "su" => Ok(RopeScaling::Su {
            long_factor: factors(obj, "long_factor", path)?,
            max_position_embeddings: raw.max_position_embeddings.unwrap_or(131_072) as f64,
            original_max_position_embeddings: raw.original_max_position_embeddings.unwrap_or(4096) as f64,
        }),
        "linear" => parse_rope_scaling(Some(v), None, path, unsupported),
        other => Err(unsupported("rope_scaling.type", format!("\"{other}\""))),
    }
}

/// A list of numbers in `rope_scaling`.
fn factors(obj: &serde_json::Map<String, Value>, key: &str, path: &Path) -> Result<Vec<f64>> {
    let what = format!("rope_scaling.{key}");
    let list = obj.get(key).ok_or_else(|| cfg_err(path, &what, "missing"))?;
    let list = list.as_array().ok_or_else(|| cfg_err(path, &what, "expected a list of numbers"))?;
    list.iter().map(|x| x.as_f64().ok_or_else(|| cfg_err(path, &what, "expected a list of numbers"))).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The error that lists the supported types says exactly what the rules table holds.
    #[test]
    fn supported_names_every_family_in_the_table() {
        let mut names: Vec<&str> = FAMILIES.iter().flat_map(|r| r.model_types.iter().copied()).collect();
        names.extend(WRAPPERS);
        assert_eq!(SUPPORTED, names.join(", "));
        let families: std::collections::HashSet<_> = FAMILIES.iter().map(|r| format!("{:?}", r.family)).collect();
        assert_eq!(families.len(), FAMILIES.len(), "one row per family");
    }
}
