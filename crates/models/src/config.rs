//! `config.json` -> one normalised [`ModelConfig`]: the Llama/Qwen/Gemma differences become
//! settings of a single decoder, following what mlx-lm 0.32 does for each `model_type`.

use crate::error::{Error, Result};
use serde::Deserialize;
use serde_json::Value;
use std::path::Path;

pub const SUPPORTED: &str =
    "llama, mistral, mixtral, phi3, qwen2, qwen2_moe, qwen3, qwen3_moe, gemma, gemma2, gemma3_text";

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
    final_logit_softcapping: Option<f64>,
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
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Activation {
    /// `silu(gate) * up` (Llama, Qwen).
    Silu,
    /// `gelu(gate) * up` with the exact erf GELU (mlx-lm's `gemma`).
    GeluErf,
    /// `gelu_approx(gate) * up`, the tanh approximation (`gemma2`, `gemma3_text`).
    GeluTanh,
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
    /// Qwen2-MoE's shared expert (a SwiGLU MLP of this hidden size that every token runs),
    /// its output scaled by `sigmoid(shared_expert_gate · x)`.
    pub shared_expert: Option<usize>,
}

/// How the router's logits become the chosen experts' weights.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Routing {
    /// Softmax over every expert, then the top k probabilities (Qwen2-MoE, Qwen3-MoE);
    /// `normalize` divides them by their sum (`norm_topk_prob`).
    SoftmaxTopK { normalize: bool },
    /// The top k logits, then a softmax over those k (Mixtral).
    TopKSoftmax,
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
    /// The checkpoint stores q/k/v as one `self_attn.qkv_proj` and gate/up as one
    /// `mlp.gate_up_proj`, stacked by rows in that order (Phi-3).
    pub fused_projections: bool,
    /// Biases on q/k/v projections (Qwen2; Llama `attention_bias` also on o).
    pub qkv_bias: bool,
    pub o_bias: bool,
    pub mlp_bias: bool,
    /// RMSNorm of each query and key head (Qwen3, Gemma3).
    pub qk_norm: bool,
    /// Gemma's RMSNorm scales by `1 + w` instead of `w`.
    pub norm_plus_one: bool,
    /// Norms after attention and around the MLP (Gemma2, Gemma3).
    pub sandwich_norms: bool,
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
}

fn cfg_err(path: &Path, key: &str, reason: impl Into<String>) -> Error {
    Error::Config { path: path.to_path_buf(), key: key.to_string(), reason: reason.into() }
}

fn required<T: Copy>(path: &Path, key: &str, v: Option<T>) -> Result<T> {
    v.ok_or_else(|| cfg_err(path, key, "missing"))
}

impl ModelConfig {
    /// Normalises `config.json` (already parsed; `path` names it in errors). Any
    /// `model_type` or option this crate cannot run is refused here, before any compile.
    pub fn from_json(value: &Value, path: &Path) -> Result<ModelConfig> {
        let raw: RawConfig =
            serde_json::from_value(value.clone()).map_err(|e| cfg_err(path, "config", e.to_string()))?;
        let model_type = raw.model_type.clone().ok_or_else(|| cfg_err(path, "model_type", "missing"))?;
        let family = match model_type.as_str() {
            // mlx-lm runs `mistral` as its llama model (`MODEL_REMAPPING`): a sliding window
            // applies only to layers `layer_types` marks, none in Mistral's own configs.
            "llama" | "mistral" => Family::Llama,
            "mixtral" => Family::Mixtral,
            "phi3" => Family::Phi3,
            "qwen2" => Family::Qwen2,
            "qwen2_moe" => Family::Qwen2Moe,
            "qwen3" => Family::Qwen3,
            "qwen3_moe" => Family::Qwen3Moe,
            "gemma" => Family::Gemma,
            "gemma2" => Family::Gemma2,
            "gemma3_text" => Family::Gemma3,
            _ => {
                return Err(Error::UnsupportedModelType { path: path.to_path_buf(), model_type, supported: SUPPORTED });
            }
        };
        let p = path;
        let hidden = required(p, "hidden_size", raw.hidden_size)?;
        let n_layers = required(p, "num_hidden_layers", raw.num_hidden_layers)?;
        let heads = required(p, "num_attention_heads", raw.num_attention_heads)?;
        let is_gemma = matches!(family, Family::Gemma | Family::Gemma2 | Family::Gemma3);
        let kv_heads = raw.num_key_value_heads.unwrap_or(heads);
        let head_dim = match (family, raw.head_dim) {
            // mlx-lm's phi3, mixtral and qwen2_moe derive it, whatever config.json says.
            (Family::Phi3 | Family::Mixtral | Family::Qwen2Moe, _) => hidden / heads.max(1),
            (_, Some(d)) => d,
            (Family::Llama | Family::Qwen2, None) => hidden / heads.max(1),
            (_, None) => return Err(cfg_err(p, "head_dim", "missing")),
        };
        let unsupported = |key: &str, value: String| Error::Unsupported {
            path: path.to_path_buf(),
            model_type: model_type.clone(),
            key: key.to_string(),
            value,
        };
        if raw.rope_traditional == Some(true) {
            return Err(unsupported("rope_traditional", "true".into()));
        }
        // mlx-lm's qwen3: `rope_parameters` stands in for a missing `rope_theta` and
        // `rope_scaling`, and a `rope_theta` found in neither is an error.
        let nested = raw.rope_parameters.as_ref().filter(|v| family == Family::Qwen3 && v.is_object());
        let nested_theta = nested.and_then(|v| v.get("rope_theta")).and_then(Value::as_f64);
        let raw_theta = raw.rope_theta.or(nested_theta);
        if family == Family::Qwen3 && raw_theta.is_none() {
            return Err(cfg_err(p, "rope_theta", "missing (and not in rope_parameters)"));
        }
        let rope_theta = raw_theta.unwrap_or(match family {
            Family::Qwen2 | Family::Qwen2Moe | Family::Mixtral | Family::Gemma3 => 1_000_000.0,
            _ => 10_000.0,
        });
        let max_positions = raw.max_position_embeddings.map(|m| m as f64);
        let rope_scaling = match family {
            // mlx-lm ignores it there (its MoE families build a plain `nn.RoPE`).
            Family::Gemma | Family::Gemma2 | Family::Mixtral | Family::Qwen2Moe | Family::Qwen3Moe => RopeScaling::None,
            Family::Phi3 => parse_phi3_rope_scaling(&raw, path, &unsupported)?,
            _ => {
                let scaling = raw.rope_scaling.as_ref().filter(|v| !v.is_null()).or(nested);
                parse_rope_scaling(scaling, max_positions, path, &unsupported)?
            }
        };
        // mlx-lm reads `partial_rotary_factor` for phi3 only.
        let rope_dims = match (family, raw.partial_rotary_factor) {
            (Family::Phi3, Some(f)) if f > 0.0 && f <= 1.0 => (head_dim as f64 * f) as usize,
            (Family::Phi3, Some(f)) => {
                return Err(cfg_err(p, "partial_rotary_factor", format!("{f} is not in (0, 1]")));
            }
            _ => head_dim,
        };

        let moe = parse_moe(&raw, family, p)?;
        let sparse_step = raw.decoder_sparse_step.unwrap_or(1).max(1);
        let mlp_only = raw.mlp_only_layers.clone().unwrap_or_default();
        let window = raw.sliding_window;
        let layers: Vec<LayerConfig> = (0..n_layers)
            .map(|i| -> Result<LayerConfig> {
                // mlx-lm's qwen3_moe: layers in `mlp_only_layers`, and all but every
                // `decoder_sparse_step`-th, keep the dense MLP; the other MoE families use
                // experts in every layer.
                let is_moe = moe.is_some()
                    && (family != Family::Qwen3Moe || (!mlp_only.contains(&i) && (i + 1) % sparse_step == 0));
                let global =
                    LayerConfig { rope_theta, rope_scaling: rope_scaling.clone(), sliding_window: None, moe: is_moe };
                Ok(match family {
                    Family::Llama => match raw.layer_types.as_ref().map(|t| t.get(i).map(String::as_str)) {
                        None | Some(Some("full_attention")) => global,
                        Some(Some("sliding_attention")) => {
                            LayerConfig { sliding_window: Some(required(p, "sliding_window", window)?), ..global }
                        }
                        Some(other) => return Err(cfg_err(p, "layer_types", format!("layer {i}: {other:?}"))),
                    },
                    // HF's Gemma2 alternates: even layers use the sliding window.
                    Family::Gemma2 => LayerConfig { sliding_window: window.filter(|_| i % 2 == 0), ..global },
                    Family::Gemma3 => {
                        let pattern = raw.sliding_window_pattern.unwrap_or(6).max(1);
                        if (i + 1) % pattern != 0 {
                            LayerConfig {
                                rope_theta: raw.rope_local_base_freq.unwrap_or(10_000.0),
                                rope_scaling: RopeScaling::None,
                                sliding_window: Some(window.unwrap_or(512)),
                                moe: false,
                            }
                        } else {
                            global
                        }
                    }
                    _ => global,
                })
            })
            .collect::<Result<_>>()?;

        let qpas = raw.query_pre_attn_scalar;
        let attn_scale = match family {
            Family::Gemma2 => qpas.unwrap_or(144.0).powf(-0.5),
            Family::Gemma3 => qpas.unwrap_or(256.0).powf(-0.5),
            _ => (head_dim as f64).powf(-0.5),
        };
        let embed_scale = match family {
            Family::Gemma | Family::Gemma2 => Some((hidden as f64).sqrt() as f32),
            // mlx-lm: mx.array(hidden ** 0.5, mx.bfloat16)
            Family::Gemma3 => Some(half::bf16::from_f64((hidden as f64).sqrt()).to_f32()),
            _ => None,
        };
        let attention_bias = raw.attention_bias.unwrap_or(false);
        ModelConfig {
            model_type: model_type.clone(),
            family,
            hidden,
            intermediate: required(p, "intermediate_size", raw.intermediate_size)?,
            heads,
            kv_heads,
            head_dim,
            rope_dims,
            vocab: required(p, "vocab_size", raw.vocab_size)?,
            rms_eps: raw.rms_norm_eps.unwrap_or(if is_gemma { 1e-6 } else { 1e-5 }),
            layers,
            tie_embeddings: match family {
                Family::Gemma | Family::Gemma2 => true,
                // mlx-lm's gemma3_text decides by whether lm_head.weight exists; the loader
                // corrects this from the checkpoint.
                Family::Gemma3 => raw.tie_word_embeddings.unwrap_or(true),
                Family::Qwen3 | Family::Phi3 | Family::Mixtral | Family::Qwen2Moe | Family::Qwen3Moe => {
                    raw.tie_word_embeddings.unwrap_or(false)
                }
                _ => raw.tie_word_embeddings.unwrap_or(true),
            },
            fused_projections: family == Family::Phi3,
            qkv_bias: matches!(family, Family::Qwen2 | Family::Qwen2Moe) || (family == Family::Llama && attention_bias),
            o_bias: family == Family::Llama && attention_bias,
            mlp_bias: family == Family::Llama && raw.mlp_bias.unwrap_or(false),
            qk_norm: matches!(family, Family::Qwen3 | Family::Qwen3Moe | Family::Gemma3),
            norm_plus_one: is_gemma,
            sandwich_norms: matches!(family, Family::Gemma2 | Family::Gemma3),
            embed_scale,
            activation: match family {
                Family::Gemma => Activation::GeluErf,
                Family::Gemma2 | Family::Gemma3 => Activation::GeluTanh,
                _ => Activation::Silu,
            },
            attn_scale,
            attn_softcap: if family == Family::Gemma2 {
                Some(raw.attn_logit_softcapping.unwrap_or(50.0))
            } else {
                None
            },
            final_softcap: if family == Family::Gemma2 {
                Some(raw.final_logit_softcapping.unwrap_or(30.0))
            } else {
                None
            },
            max_position_embeddings: raw.max_position_embeddings,
            moe,
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
    /// `gemma3_text` ties the output layer exactly when `lm_head.weight` is absent.
    pub fn for_checkpoint(ckpt: &weights::Checkpoint) -> Result<ModelConfig> {
        let mut cfg = Self::from_json(ckpt.config(), &ckpt.dir().join("config.json"))?;
        if cfg.family == Family::Gemma3 {
            cfg.tie_embeddings = !ckpt.contains("lm_head.weight");
        }
        // Refused here, before any compile, with the cause rather than a missing tensor.
        if let Some((l, moe)) = cfg.layers.iter().position(|l| l.moe).zip(cfg.moe.as_ref()) {
            let block = format!("{}.{}", crate::params::layer_prefix(l), moe.block);
            let wanted = format!("{block}.switch_mlp.gate_proj.weight");
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

/// The MoE block of the MoE families, with mlx-lm's defaults (Mixtral: 8 experts, top 2).
fn parse_moe(raw: &RawConfig, family: Family, p: &Path) -> Result<Option<Moe>> {
    let (block, experts, routing) = match family {
        Family::Mixtral => ("block_sparse_moe", raw.num_local_experts.unwrap_or(8), Routing::TopKSoftmax),
        Family::Qwen2Moe => {
            ("mlp", required(p, "num_experts", raw.num_experts)?, Routing::SoftmaxTopK { normalize: false })
        }
        Family::Qwen3Moe => (
            "mlp",
            required(p, "num_experts", raw.num_experts)?,
            Routing::SoftmaxTopK { normalize: required(p, "norm_topk_prob", raw.norm_topk_prob)? },
        ),
        _ => return Ok(None),
    };
    let top_k = match family {
        Family::Mixtral => raw.num_experts_per_tok.unwrap_or(2),
        _ => required(p, "num_experts_per_tok", raw.num_experts_per_tok)?,
    };
    // A qwen3_moe config with no experts is a dense model in mlx-lm.
    if experts == 0 && family == Family::Qwen3Moe {
        return Ok(None);
    }
    if experts == 0 || top_k == 0 || top_k > experts {
        return Err(cfg_err(
            p,
            "num_experts_per_tok",
            format!("{top_k} of {experts} experts; it must be 1 to the experts"),
        ));
    }
    let intermediate = match family {
        Family::Mixtral => required(p, "intermediate_size", raw.intermediate_size)?,
        _ => required(p, "moe_intermediate_size", raw.moe_intermediate_size)?,
    };
    let shared_expert = match family {
        Family::Qwen2Moe => Some(required(p, "shared_expert_intermediate_size", raw.shared_expert_intermediate_size)?),
        _ => None,
    };
    Ok(Some(Moe { block, experts, top_k, intermediate, routing, shared_expert }))
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
