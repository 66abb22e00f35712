//! Checkpoint names, spelled once. The parameter list ([`crate::param_specs`]), the layer
//! plan the graph runs (`graph/layer.rs`) and the layout's stacked projections all build
//! their names here, so the graph cannot read a tensor under another name than the loader
//! binds (and the plan still checks every name it reads against the parameter list). A
//! family whose checkpoints spell some parts otherwise (LFM2's `feed_forward.w1`) reads
//! them through its renames (`Rules::renames` in config.rs), so these stay its names.
//! Matrices are named by prefix (`model.layers.0.mlp.up_proj`, whose tensor is
//! `<prefix>.weight`, quantized ones beside it `<prefix>.scales` and `<prefix>.biases`),
//! vectors by their full key.

use crate::config::{Moe, SharedExpert};

/// The embedding table's prefix.
pub const EMBEDDING: &str = "model.embed_tokens";
/// The output projection's prefix, where the model does not tie it to the embedding.
pub const LM_HEAD: &str = "lm_head";
/// The final norm's weight.
pub const FINAL_NORM: &str = "model.norm.weight";
/// Gemma 4's per-layer inputs: the second embedding table (`[vocab, layers * width]`), the
/// projection of the scaled embedding (`[layers * width, hidden]`) and its norm's weight.
pub const PER_LAYER_EMBEDDING: &str = "model.embed_tokens_per_layer";
pub const PER_LAYER_PROJECTION: &str = "model.per_layer_model_projection";
pub const PER_LAYER_PROJECTION_NORM: &str = "model.per_layer_projection_norm.weight";

/// Attention's projections that read the same input: the stacked matrix's name and its
/// parts', under a layer's prefix (Phi-3 stores them stacked; the layouts stack them where a
/// kernel takes them).
pub const QKV: (&str, &[&str]) = ("self_attn.qkv_proj", &["self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj"]);
/// The gated MLP's gate and up projections, likewise.
pub const GATE_UP: (&str, &[&str]) = ("mlp.gate_up_proj", &["mlp.gate_proj", "mlp.up_proj"]);

/// A matrix's weight tensor.
pub fn weight(prefix: &str) -> String {
    format!("{prefix}.weight")
}

/// A linear layer's bias tensor.
pub fn bias(prefix: &str) -> String {
    format!("{prefix}.bias")
}

/// The names of one decoder layer's tensors.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LayerNames {
    prefix: String,
}

impl LayerNames {
    pub fn new(layer: usize) -> LayerNames {
        LayerNames { prefix: format!("model.layers.{layer}") }
    }

    /// `model.layers.{i}`.
    pub fn prefix(&self) -> &str {
        &self.prefix
    }

    /// `rest` under the layer's prefix.
    pub fn at(&self, rest: &str) -> String {
        format!("{}.{rest}", self.prefix)
    }

    pub fn q_proj(&self) -> String {
        self.at("self_attn.q_proj")
    }

    pub fn k_proj(&self) -> String {
        self.at("self_attn.k_proj")
    }

    pub fn v_proj(&self) -> String {
        self.at("self_attn.v_proj")
    }

    pub fn o_proj(&self) -> String {
        self.at("self_attn.o_proj")
    }

    /// A latent attention layer's tensor or projection (`kv_a_proj_with_mqa`, `embed_q`, ...).
    pub fn latent(&self, part: &str) -> String {
        self.at(&format!("self_attn.{part}"))
    }

    /// gpt-oss's attention sinks: a logit per query head (`[heads]`).
    pub fn sinks(&self) -> String {
        self.at("self_attn.sinks")
    }

    /// The RMSNorm weight of each query head (Qwen3, Gemma 3).
    pub fn q_norm(&self) -> String {
        self.at("self_attn.q_norm.weight")
    }

    pub fn k_norm(&self) -> String {
        self.at("self_attn.k_norm.weight")
    }

    pub fn input_norm(&self) -> String {
        self.at("input_layernorm.weight")
    }

    /// Before the feed-forward block in pre-norm layers; after attention in Gemma 2/3's.
    pub fn post_attention_norm(&self) -> String {
        self.at("post_attention_layernorm.weight")
    }

    pub fn pre_ffn_norm(&self) -> String {
        self.at("pre_feedforward_layernorm.weight")
    }

    pub fn post_ffn_norm(&self) -> String {
        self.at("post_feedforward_layernorm.weight")
    }

    /// Gemma 4's per-layer input block: its gate and projection (matrices) and the norm after
    /// them (`[gate, projection, norm]`).
    pub fn per_layer_block(&self) -> [String; 3] {
        ["per_layer_input_gate", "per_layer_projection", "post_per_layer_input_norm.weight"].map(|p| self.at(p))
    }

    /// Gemma 4's norms around its two feed-forward branches when it has experts: after the
    /// dense MLP, before and after the experts (`[post_mlp, pre_moe, post_moe]`).
    pub fn branch_norms(&self) -> [String; 3] {
        ["post_feedforward_layernorm_1", "pre_feedforward_layernorm_2", "post_feedforward_layernorm_2"]
            .map(|p| self.at(&format!("{p}.weight")))
    }

    /// Gemma 4's scale of the layer's output (`[1]`).
    pub fn layer_scalar(&self) -> String {
        self.at("layer_scalar")
    }

    /// The dense MLP's `gate_proj`, `up_proj` or `down_proj`.
    pub fn mlp(&self, part: &str) -> String {
        self.at(&format!("mlp.{part}"))
    }

    /// A gated DeltaNet layer's tensor or projection (`in_proj_qkv`, `conv1d.weight`, …).
    pub fn linear_attn(&self, part: &str) -> String {
        self.at(&format!("linear_attn.{part}"))
    }

    /// An LFM2 short-convolution layer's tensor or projection (`in_proj`, `conv.weight`, …).
    pub fn short_conv(&self, part: &str) -> String {
        self.at(&format!("conv.{part}"))
    }

    /// The mixture-of-experts block's module (`mlp`, Mixtral's `block_sparse_moe`).
    pub fn moe_block(&self, block: &str) -> MoeNames {
        let block = self.at(block);
        MoeNames { router: format!("{block}.gate"), experts: format!("{block}.switch_mlp"), block }
    }

    /// The names of `moe`'s experts in this layer: under its block, or Gemma 4's modules beside
    /// the dense MLP (`router.proj`, `router.scale`, `router.per_expert_scale`,
    /// `experts.switch_glu.*`), or gpt-oss's (`mlp.router`, `mlp.experts.*`).
    pub fn moe(&self, moe: &Moe) -> MoeNames {
        if moe.beside_mlp {
            MoeNames {
                router: self.at("router.proj"),
                experts: self.at("experts.switch_glu"),
                block: self.prefix.clone(),
            }
        } else if moe.biased {
            // gpt-oss: `mlp.router` and `mlp.experts.*`, each with its `.bias`.
            let block = self.at(moe.block);
            MoeNames { router: format!("{block}.router"), experts: format!("{block}.experts"), block }
        } else {
            self.moe_block(moe.block)
        }
    }
}

/// The names inside one layer's mixture-of-experts block.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MoeNames {
    /// The block's prefix (`model.layers.0.mlp`; Gemma 4's: the layer's).
    block: String,
    router: String,
    /// The stacked experts' module.
    experts: String,
}

impl MoeNames {
    /// The block's prefix (`model.layers.0.mlp`).
    pub fn block(&self) -> &str {
        &self.block
    }

    /// The router `[experts, hidden]`.
    pub fn router(&self) -> String {
        self.router.clone()
    }

    /// Gemma 4's router: the weight of the RMSNorm of its input (`[hidden]`, times
    /// `hidden^-0.5`), and each expert's output scale (`[experts]`).
    pub fn router_scale(&self) -> String {
        format!("{}.router.scale", self.block)
    }

    pub fn per_expert_scale(&self) -> String {
        format!("{}.router.per_expert_scale", self.block)
    }

    /// The stacked experts' `gate_proj`, `up_proj` or `down_proj` (`[experts, out, in]`).
    pub fn experts(&self, part: &str) -> String {
        format!("{}.{part}", self.experts)
    }

    /// The router's bias added to its sigmoid scores to choose (never to weigh) experts
    /// (`[experts]`, GLM-4.5 MoE and DeepSeek-V3).
    pub fn router_bias(&self) -> String {
        format!("{}.gate.e_score_correction_bias", self.block)
    }

    /// The shared expert's `gate_proj`, `up_proj` or `down_proj`: Qwen2-MoE's gated
    /// `shared_expert`, or DeepSeek's `shared_experts`.
    pub fn shared_expert(&self, shared: &SharedExpert, part: &str) -> String {
        let module = if shared.gated { "shared_expert" } else { "shared_experts" };
        format!("{}.{module}.{part}", self.block)
    }

    /// The shared expert's gate `[1, hidden]`.
    pub fn shared_expert_gate(&self) -> String {
        format!("{}.shared_expert_gate", self.block)
    }
}

/// The three projections of a gated MLP, in the order the parameters list them.
pub const MLP_PARTS: [&str; 3] = ["gate_proj", "up_proj", "down_proj"];
