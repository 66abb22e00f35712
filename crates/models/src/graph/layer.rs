//! The typed plan of a decoder and the step that runs it. Each layer is planned once from
//! the config: its mixer ([`Mixer`]: attention with its projections, q/k norms, biases,
//! sliding window and RoPE table, or a recurrent layer), where its norms sit, and its
//! feed-forward block ([`FeedForward`]: a gated MLP or a mixture of experts), each with
//! the checkpoint names it reads. The plan checks every
//! name against the parameters the model declares ([`crate::param_specs`]), so a name the
//! graph would read and no parameter has fails when the plan is built, before any compile,
//! instead of as "no global for ..." halfway through emission.

use super::{Function, R, Step, V};
use crate::config::{
    LatentAttention, LayerMixer, LinearAttention, ModelConfig, Moe, NormPlacement, Routing, ShortConv,
};
use crate::error::{Error, Result};
use crate::names::{self, FINAL_NORM, LM_HEAD, LayerNames, MoeNames};
use crate::params::{Kind, param_specs};
use crate::rope::RopeTable;
use hlo_emit::ElementType::*;
use std::collections::{HashMap, HashSet};

/// Where a layer's norms sit around its two blocks after the mixer's input norm (the layer's
/// `input_norm`, where it has one).
#[derive(Debug)]
pub(super) enum Norms {
    /// Pre-norm: the feed-forward input normed by `ffn` (`post_attention_layernorm`); each
    /// block's output projection adds the residual.
    Pre { ffn: String },
    /// Gemma 2/3: each block's output normed before its residual add, the feed-forward input
    /// by `pre_ffn`.
    Sandwich { post_attention: String, pre_ffn: String, post_ffn: String },
    /// OLMo 2: no norm before either block (the layer has no `input_norm`); each block's
    /// output normed before its residual add.
    Post { post_attention: String, post_ffn: String },
}

impl Norms {
    /// The norm of each block's output before its residual add, where there is one:
    /// (after attention, after the feed-forward block).
    fn after(&self) -> Option<(&str, &str)> {
        match self {
            Norms::Pre { .. } => None,
            Norms::Sandwich { post_attention, post_ffn, .. } | Norms::Post { post_attention, post_ffn } => {
                Some((post_attention, post_ffn))
            }
        }
    }
}

/// One layer's attention: its projections' prefixes and what surrounds them.
#[derive(Debug)]
pub(super) struct AttentionPlan {
    pub q: String,
    pub keys: Keys,
    pub o: String,
    pub qkv_bias: bool,
    pub o_bias: bool,
    /// RMSNorm weight of each query head (Qwen3, Gemma 3; the keys' is in [`Keys::Own`]).
    pub q_norm: Option<String>,
    /// The layer's kv heads and head size (Gemma 4's full layers differ from the model's).
    pub kv_heads: usize,
    pub head_dim: usize,
    /// Values RMS-normed per head without a weight (Gemma 4).
    pub value_norm: bool,
    /// A logit per query head that joins each softmax with no value (gpt-oss's sinks).
    pub sinks: Option<String>,
    /// Keys older than this many positions are masked.
    pub sliding_window: Option<usize>,
    /// The rotation of queries and keys; `None` for a NoPE layer (SmolLM3).
    pub rope: Option<RopeTable>,
    /// `q_proj` also gives a gate per head; the heads' output is multiplied by its sigmoid
    /// (Qwen3-Next, Qwen3.5).
    pub output_gate: bool,
    /// This layer's index in the KV cache (attention layers only are cached); a KV-shared
    /// layer's is its source's.
    pub kv_layer: usize,
}

/// Where an attention layer's keys and values come from.
#[derive(Debug)]
pub(super) enum Keys {
    /// Its own projections: `v` none where the values are the keys as projected (Gemma 4's
    /// `attention_k_eq_v`), `k_norm` the keys' per-head norm where the model has one.
    Own { k: String, v: Option<String>, k_norm: Option<String> },
    /// The keys and values of the layer at the same `kv_layer`, cached and new (Gemma 4's
    /// KV-shared layers).
    Shared,
}

/// Gemma 4's per-layer input block of one layer ([`crate::config::PerLayerInput`]).
#[derive(Debug)]
pub(super) struct PerLayerPlan {
    /// Its row of the per-layer inputs.
    pub index: usize,
    pub gate: String,
    pub projection: String,
    pub norm: String,
}

/// One layer's latent attention (mlx-lm's `DeepseekV3Attention`): its tensors' names, the
/// rotation of the rotated features and its place in the caches (its latents in `k`, its
/// rotated keys in `v`).
#[derive(Debug)]
pub(super) struct LatentPlan<'a> {
    pub query: LatentQuery,
    /// `[kv_rank + rope_dim, hidden]`: the latent, then the shared key's rotated features.
    pub kv_a: String,
    pub kv_norm: String,
    /// `[heads, kv_rank, nope_dim]` and `[heads, v_dim, kv_rank]`.
    pub embed_q: String,
    pub unembed_out: String,
    pub o: String,
    /// Biases on `q_a_proj` and `kv_a_proj_with_mqa` (`attention_bias`), and on `o_proj`.
    pub in_bias: bool,
    pub o_bias: bool,
    pub rope: RopeTable,
    pub config: &'a LatentAttention,
    /// This layer's index in the caches.
    pub kv_layer: usize,
}

/// How a latent attention layer makes its queries.
#[derive(Debug)]
pub(super) enum LatentQuery {
    /// `q_b_proj(rms_norm(q_a_proj(x)))` (DeepSeek-V3).
    Compressed { a: String, norm: String, b: String },
    /// `q_proj(x)` (`q_lora_rank` null).
    Plain(String),
}

/// A gated DeltaNet layer (mlx-lm's `GatedDeltaNet`): its tensors' names, its sizes and
/// which of the model's state buffers are its own.
#[derive(Debug)]
pub(super) struct LinearPlan<'a> {
    pub in_proj: InProj,
    /// The depthwise convolution's weight `[channels, kernel, 1]`.
    pub conv: String,
    pub dt_bias: String,
    pub a_log: String,
    /// The gated RMSNorm's weight (over one value head).
    pub norm: String,
    pub out_proj: String,
    pub config: &'a LinearAttention,
    /// Its first state buffer (`ModelConfig::state_parts`): the convolution's last
    /// inputs; the delta rule's matrix is the next.
    pub state: usize,
}

/// An LFM2 short-convolution layer (mlx-lm's `ShortConv`): its tensors' names and its state
/// buffer (the convolution's last inputs).
#[derive(Debug)]
pub(super) struct ShortConvPlan<'a> {
    /// `[3 * hidden, hidden]`: B, C and x.
    pub in_proj: String,
    /// The depthwise convolution's weight `[hidden, kernel, 1]`.
    pub conv: String,
    /// The convolution's bias, where `conv_bias` (with `in_proj`'s and `out_proj`'s).
    pub conv_bias: Option<String>,
    pub out_proj: String,
    pub config: &'a ShortConv,
    /// Its state buffer (`ModelConfig::state_parts`).
    pub state: usize,
}

/// A gated DeltaNet's in-projections as the checkpoint stores them.
#[derive(Debug)]
pub(super) enum InProj {
    /// Qwen3-Next: `in_proj_qkvz` and `in_proj_ba`, grouped by key head.
    Fused { qkvz: String, ba: String },
    /// Qwen3.5: `in_proj_qkv` (q, k, v one after the other), `in_proj_z`, `in_proj_b`, `in_proj_a`.
    Split { qkv: String, z: String, b: String, a: String },
}

/// How a layer mixes tokens.
#[derive(Debug)]
pub(super) enum Mixer<'a> {
    /// Attention over the KV cache.
    Attention(AttentionPlan),
    /// Latent attention over a cache of latents.
    Latent(LatentPlan<'a>),
    /// A gated DeltaNet with a state per sequence.
    Linear(LinearPlan<'a>),
    /// A gated short convolution with a state per sequence.
    ShortConv(ShortConvPlan<'a>),
}

/// A gated MLP: `down(activation(gate(x)) * up(x))`.
#[derive(Debug)]
pub(super) struct MlpPlan {
    pub gate: String,
    pub up: String,
    pub down: String,
    pub bias: bool,
}

/// A mixture-of-experts block: its names (router, stacked experts, shared expert) and the
/// config's routing.
#[derive(Debug)]
pub(super) struct MoePlan<'a> {
    pub names: MoeNames,
    pub config: &'a Moe,
}

/// A layer's feed-forward block.
#[derive(Debug)]
pub(super) enum FeedForward<'a> {
    Mlp(MlpPlan),
    Moe(MoePlan<'a>),
    /// Gemma 4's: the dense MLP and the experts side by side, each normed after (and the
    /// experts' input before, by `pre_moe`); the experts routed by the block's input.
    MlpAndMoe {
        mlp: MlpPlan,
        moe: MoePlan<'a>,
        post_mlp: String,
        pre_moe: String,
        post_moe: String,
    },
}

/// One decoder layer.
#[derive(Debug)]
pub(super) struct LayerPlan<'a> {
    /// The mixer's input norm (`input_layernorm`); none with [`Norms::Post`].
    pub input_norm: Option<String>,
    pub mixer: Mixer<'a>,
    pub norms: Norms,
    pub ffn: FeedForward<'a>,
    /// After the feed-forward block (Gemma 4).
    pub per_layer: Option<PerLayerPlan>,
    /// The layer's output scale `[1]` (Gemma 4).
    pub scalar: Option<String>,
}

impl<'a> LayerPlan<'a> {
    /// Every layer of `cfg`, checked against the model's parameters.
    ///
    /// # Errors
    /// A name the plan reads that no parameter of the model declares, or a combination the
    /// step does not run (a mixture of experts with sandwich norms).
    pub(super) fn all(cfg: &'a ModelConfig) -> Result<Vec<LayerPlan<'a>>> {
        let (mut kv_layer, mut state) = (0, 0);
        // Each layer's place in the cache, for the KV-shared layers that read it.
        let mut cached: Vec<usize> = Vec::with_capacity(cfg.num_layers());
        let mut plans = Vec::with_capacity(cfg.num_layers());
        for l in 0..cfg.num_layers() {
            // A KV-shared layer's place is its (earlier) source's.
            let at = match cfg.layers[l].kv_source {
                None => kv_layer,
                Some(s) => *cached.get(s).ok_or_else(|| {
                    Error::Invalid(format!("{}: layer {l} shares a later layer's keys", cfg.model_type))
                })?,
            };
            let plan = LayerPlan::new(cfg, l, at, state)?;
            cached.push(at);
            match &plan.mixer {
                Mixer::Attention(a) if matches!(a.keys, Keys::Shared) => {}
                Mixer::Attention(_) | Mixer::Latent(_) => kv_layer += 1,
                Mixer::Linear(_) | Mixer::ShortConv(_) => state += cfg.layer_state_parts().len(),
            }
            plans.push(plan);
        }
        let per_layer_input = cfg
            .per_layer_input
            .iter()
            .flat_map(|_| [names::PER_LAYER_EMBEDDING, names::PER_LAYER_PROJECTION, names::PER_LAYER_PROJECTION_NORM]);
        let read = plans
            .iter()
            .flat_map(LayerPlan::names)
            .chain([FINAL_NORM, head(cfg)].into_iter().chain(per_layer_input).map(str::to_owned));
        check_declared(cfg, read)?;
        Ok(plans)
    }

    fn new(cfg: &'a ModelConfig, l: usize, kv_layer: usize, state: usize) -> Result<LayerPlan<'a>> {
        let n = LayerNames::new(l);
        let layer = &cfg.layers[l];
        let mixer = match cfg.mixer(layer) {
            LayerMixer::ShortConv(config) => Mixer::ShortConv(ShortConvPlan {
                in_proj: n.short_conv("in_proj"),
                conv: n.short_conv("conv.weight"),
                conv_bias: config.bias.then(|| n.short_conv("conv.bias")),
                out_proj: n.short_conv("out_proj"),
                config,
                state,
            }),
            LayerMixer::Linear(config) => Mixer::Linear(LinearPlan {
                in_proj: if config.fused_in_proj {
                    InProj::Fused { qkvz: n.linear_attn("in_proj_qkvz"), ba: n.linear_attn("in_proj_ba") }
                } else {
                    InProj::Split {
                        qkv: n.linear_attn("in_proj_qkv"),
                        z: n.linear_attn("in_proj_z"),
                        b: n.linear_attn("in_proj_b"),
                        a: n.linear_attn("in_proj_a"),
                    }
                },
                conv: n.linear_attn("conv1d.weight"),
                dt_bias: n.linear_attn("dt_bias"),
                a_log: n.linear_attn("A_log"),
                norm: n.linear_attn("norm.weight"),
                out_proj: n.linear_attn("out_proj"),
                config,
                state,
            }),
            LayerMixer::Latent(config) => Mixer::Latent(LatentPlan {
                query: match config.q_rank {
                    Some(_) => LatentQuery::Compressed {
                        a: n.latent("q_a_proj"),
                        norm: n.latent("q_a_layernorm.weight"),
                        b: n.latent("q_b_proj"),
                    },
                    None => LatentQuery::Plain(n.q_proj()),
                },
                kv_a: n.latent("kv_a_proj_with_mqa"),
                kv_norm: n.latent("kv_a_layernorm.weight"),
                embed_q: n.latent("embed_q"),
                unembed_out: n.latent("unembed_out"),
                o: n.o_proj(),
                in_bias: cfg.qkv_bias,
                o_bias: cfg.o_bias,
                rope: RopeTable::new(layer, layer.rope_dims),
                config,
                kv_layer,
            }),
            LayerMixer::Attention => Mixer::Attention(AttentionPlan {
                q: n.q_proj(),
                keys: match layer.kv_source {
                    Some(_) => Keys::Shared,
                    None => Keys::Own {
                        k: n.k_proj(),
                        v: (!layer.values_are_keys).then(|| n.v_proj()),
                        k_norm: cfg.qk_norm.then(|| n.k_norm()),
                    },
                },
                o: n.o_proj(),
                qkv_bias: cfg.qkv_bias,
                o_bias: cfg.o_bias,
                q_norm: cfg.qk_norm.then(|| n.q_norm()),
                kv_heads: layer.kv_heads,
                head_dim: layer.head_dim,
                value_norm: cfg.value_norm,
                sinks: cfg.attn_sinks.then(|| n.sinks()),
                sliding_window: layer.sliding_window,
                rope: layer.rope.then(|| RopeTable::new(layer, layer.rope_dims)),
                output_gate: cfg.attn_output_gate,
                kv_layer,
            }),
        };
        let norms = match cfg.norm_placement {
            NormPlacement::Pre => Norms::Pre { ffn: n.post_attention_norm() },
            NormPlacement::Sandwich => Norms::Sandwich {
                post_attention: n.post_attention_norm(),
                pre_ffn: n.pre_ffn_norm(),
                post_ffn: n.post_ffn_norm(),
            },
            NormPlacement::Post => {
                if !matches!(mixer, Mixer::Attention(_)) {
                    return Err(Error::Invalid(format!(
                        "{}: a recurrent layer with norms only after its blocks is not supported",
                        cfg.model_type
                    )));
                }
                Norms::Post { post_attention: n.post_attention_norm(), post_ffn: n.post_ffn_norm() }
            }
        };
        let input_norm = (cfg.norm_placement != NormPlacement::Post).then(|| n.input_norm());
        let mlp =
            MlpPlan { gate: n.mlp("gate_proj"), up: n.mlp("up_proj"), down: n.mlp("down_proj"), bias: cfg.mlp_bias };
        let ffn = match cfg.moe.as_ref().filter(|_| layer.moe) {
            Some(moe) if moe.beside_mlp => {
                let [post_mlp, pre_moe, post_moe] = n.branch_norms();
                FeedForward::MlpAndMoe {
                    mlp,
                    moe: MoePlan { names: n.moe(moe), config: moe },
                    post_mlp,
                    pre_moe,
                    post_moe,
                }
            }
            Some(moe) => {
                if cfg.norm_placement != NormPlacement::Pre {
                    return Err(Error::Invalid(format!(
                        "{}: a mixture of experts with norms after its blocks is not supported",
                        cfg.model_type
                    )));
                }
                FeedForward::Moe(MoePlan { names: n.moe(moe), config: moe })
            }
            None => FeedForward::Mlp(mlp),
        };
        let per_layer = cfg.per_layer_input.map(|_| {
            let [gate, projection, norm] = n.per_layer_block();
            PerLayerPlan { index: l, gate, projection, norm }
        });
        let scalar = cfg.layer_scalar.then(|| n.layer_scalar());
        Ok(LayerPlan { input_norm, mixer, norms, ffn, per_layer, scalar })
    }

    /// Every parameter name the layer reads: matrices by prefix, vectors by key.
    fn names(&self) -> Vec<String> {
        let mut read: Vec<String> = self.input_norm.iter().cloned().collect();
        match &self.mixer {
            Mixer::Attention(a) => {
                let mut projections = vec![&a.q];
                if let Keys::Own { k, v, k_norm } = &a.keys {
                    projections.push(k);
                    projections.extend(v);
                    read.extend(k_norm.iter().cloned());
                }
                read.extend(projections.iter().map(|m| (*m).clone()));
                read.push(a.o.clone());
                if a.qkv_bias {
                    read.extend(projections.iter().map(|m| names::bias(m)));
                }
                if a.o_bias {
                    read.push(names::bias(&a.o));
                }
                read.extend(a.q_norm.iter().cloned());
                read.extend(a.sinks.iter().cloned());
            }
            Mixer::Latent(lat) => {
                match &lat.query {
                    LatentQuery::Compressed { a, norm, b } => {
                        read.extend([a.clone(), norm.clone(), b.clone()]);
                        if lat.in_bias {
                            read.push(names::bias(a));
                        }
                    }
                    LatentQuery::Plain(q) => read.push(q.clone()),
                }
                read.extend([&lat.kv_a, &lat.kv_norm, &lat.embed_q, &lat.unembed_out, &lat.o].map(String::clone));
                if lat.in_bias {
                    read.push(names::bias(&lat.kv_a));
                }
                if lat.o_bias {
                    read.push(names::bias(&lat.o));
                }
            }
            Mixer::Linear(lin) => {
                match &lin.in_proj {
                    InProj::Fused { qkvz, ba } => read.extend([qkvz.clone(), ba.clone()]),
                    InProj::Split { qkv, z, b, a } => read.extend([qkv.clone(), z.clone(), b.clone(), a.clone()]),
                }
                read.extend([&lin.conv, &lin.dt_bias, &lin.a_log, &lin.norm, &lin.out_proj].map(String::clone));
            }
            Mixer::ShortConv(sc) => {
                read.extend([sc.in_proj.clone(), sc.conv.clone(), sc.out_proj.clone()]);
                read.extend(sc.conv_bias.clone());
                if sc.config.bias {
                    read.extend([&sc.in_proj, &sc.out_proj].map(|m| names::bias(m)));
                }
            }
        }
        match &self.norms {
            Norms::Pre { ffn } => read.push(ffn.clone()),
            Norms::Sandwich { post_attention, pre_ffn, post_ffn } => {
                read.extend([post_attention.clone(), pre_ffn.clone(), post_ffn.clone()]);
            }
            Norms::Post { post_attention, post_ffn } => read.extend([post_attention.clone(), post_ffn.clone()]),
        }
        let mlp_names = |read: &mut Vec<String>, m: &MlpPlan| {
            read.extend([m.gate.clone(), m.up.clone(), m.down.clone()]);
            if m.bias {
                read.extend([&m.gate, &m.up, &m.down].map(|n| names::bias(n)));
            }
        };
        let moe = match &self.ffn {
            FeedForward::Mlp(m) => {
                mlp_names(&mut read, m);
                None
            }
            FeedForward::Moe(m) => Some(m),
            FeedForward::MlpAndMoe { mlp, moe, post_mlp, pre_moe, post_moe } => {
                mlp_names(&mut read, mlp);
                read.extend([post_mlp.clone(), pre_moe.clone(), post_moe.clone()]);
                Some(moe)
            }
        };
        if let Some(m) = moe {
            read.push(m.names.router());
            match m.config.routing {
                Routing::Grouped { .. } => read.push(m.names.router_bias()),
                Routing::ScaledTopKSoftmax => read.extend([m.names.router_scale(), m.names.per_expert_scale()]),
                Routing::SoftmaxTopK { .. } | Routing::TopKSoftmax => {}
            }
            read.extend(names::MLP_PARTS.map(|part| m.names.experts(part)));
            if m.config.biased {
                read.push(names::bias(&m.names.router()));
                read.extend(names::MLP_PARTS.map(|part| names::bias(&m.names.experts(part))));
            }
            if let Some(shared) = &m.config.shared_expert {
                read.extend(names::MLP_PARTS.map(|part| m.names.shared_expert(shared, part)));
                if shared.gated {
                    read.push(m.names.shared_expert_gate());
                }
            }
        }
        if let Some(p) = &self.per_layer {
            read.extend([p.gate.clone(), p.projection.clone(), p.norm.clone()]);
        }
        read.extend(self.scalar.iter().cloned());
        read
    }
}

/// Refuses the first of the names a graph reads (matrices by prefix, vectors by key) that no
/// parameter of `cfg` declares.
fn check_declared(cfg: &ModelConfig, read: impl Iterator<Item = String>) -> Result<()> {
    let specs = param_specs(cfg);
    let declared: HashSet<&str> =
        specs.iter().map(|s| if s.kind == Kind::Vector { s.key.as_str() } else { s.prefix() }).collect();
    let undeclared: Vec<String> = read.filter(|n| !declared.contains(n.as_str())).collect();
    match undeclared.first() {
        Some(first) => Err(Error::Invalid(format!(
            "the {} graph reads {first}, which no parameter of the model declares (names undeclared: {})",
            cfg.model_type,
            undeclared.len()
        ))),
        None => Ok(()),
    }
}

/// The output projection's prefix: the embedding where the model ties them.
fn head(cfg: &ModelConfig) -> &'static str {
    if cfg.tie_embeddings { names::EMBEDDING } else { LM_HEAD }
}

impl<'c, 'b> Step<'_, 'c, 'b> {
    /// The step: embed the tokens, run every layer of `plan`, norm, and the logits and
    /// greedy next id of the rows the function returns, beside every attention layer's new
    /// keys and values (`[L, R, K, hd]`) for `write_kv` and, where the model has recurrent
    /// layers (`states`: every state buffer, `[slots, len]` each), each sequence's part of
    /// each buffer after its rows (`[n, len]`) for `write_state`.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn emit(
        &self,
        plan: &[LayerPlan<'_>],
        tokens: V<'c, 'b>,
        positions: V<'c, 'b>,
        slots: V<'c, 'b>,
        last: Option<V<'c, 'b>>,
        kc: V<'c, 'b>,
        vc: V<'c, 'b>,
        states: &[V<'c, 'b>],
    ) -> R<Vec<V<'c, 'b>>> {
        let (f, cfg) = (self.f, self.cfg);
        let m = self.function.split().1;
        let r = self.rows();

        let mut x = self.embed(tokens)?;
        if let Some(scale) = cfg.embed_scale {
            x = f.mul_scalar(x, scale as f64)?;
        }

        let per_layer_inputs = match &cfg.per_layer_input {
            Some(pli) => Some(self.per_layer_inputs(tokens, x, pli)?),
            None => None,
        };
        // Each KV-shared layer's source keys and values, by cache layer.
        let mut sources = HashMap::new();

        let pos_f = f.convert(positions, F32)?;
        // Each row's slot (a chunk's rows share their sequence's), for the attention kernel;
        // the graph form reads `slots` per sequence.
        let row_slots = if m == 1 || !super::attention_in_kernel(cfg, self.layout) {
            slots
        } else {
            f.reshape(f.broadcast_in_dim(slots, &[slots.shape()[0], m as i64], &[0])?, &[r])?
        };
        let (mut new_k, mut new_v, mut new_state) = (Vec::new(), Vec::new(), Vec::new());
        let mut ropes: HashMap<String, (V<'c, 'b>, V<'c, 'b>)> = HashMap::new();
        let cache = Cache { k: kc, v: vc, slots, row_slots, positions };
        let state = match states {
            [] => None,
            all => Some(self.state_in(all, slots, positions)?),
        };

        let state = state.as_ref();
        let no_state = || hlo_emit::Error::Op {
            op: "step",
            expected: "a state input for a recurrent layer".into(),
            got: "none".into(),
        };
        // Each distinct RoPE table's angles, computed once per step.
        let mut angles_of = |table: &crate::rope::RopeTable| -> R<(V<'c, 'b>, V<'c, 'b>)> {
            let rope_key = format!("{table:?}");
            Ok(match ropes.get(&rope_key) {
                Some(cs) => *cs,
                None => {
                    let cs = self.rope_tables(pos_f, table)?;
                    ropes.insert(rope_key, cs);
                    cs
                }
            })
        };
        for layer in plan {
            x = match &layer.mixer {
                Mixer::Latent(lat) => {
                    let angles = angles_of(&lat.rope)?;
                    let hn = self.mixer_input(x, layer)?;
                    let (o, latents, keys) = self.latent_attention(hn, lat, angles, &cache)?;
                    new_k.push(latents);
                    new_v.push(keys);
                    self.linear_residual(x, o, &lat.o, lat.o_bias)?
                }
                Mixer::Attention(a) => {
                    let angles = match &a.rope {
                        None => None,
                        Some(table) => Some(angles_of(table)?),
                    };
                    let hn = self.mixer_input(x, layer)?;
                    let (o, rows) = self.attention(hn, a, angles, &cache, &mut sources)?;
                    if let Some((k_rows, v_rows)) = rows {
                        new_k.push(k_rows);
                        new_v.push(v_rows);
                    }
                    match layer.norms.after() {
                        Some((post_attention, _)) => {
                            let out = self.linear(o, &a.o, a.o_bias)?;
                            f.add(x, self.norm(out, post_attention)?)?
                        }
                        None => self.linear_residual(x, o, &a.o, a.o_bias)?,
                    }
                }
                // The recurrent mixers: output before the out-projection, and new state rows.
                Mixer::Linear(lin) => {
                    let hn = self.mixer_input(x, layer)?;
                    let (o, next) = self.gated_delta(hn, lin, state.ok_or_else(no_state)?, last)?;
                    new_state.extend(next);
                    self.linear_residual(x, o, &lin.out_proj, false)?
                }
                Mixer::ShortConv(sc) => {
                    let hn = self.mixer_input(x, layer)?;
                    let (o, next) = self.short_conv(hn, sc, state.ok_or_else(no_state)?, last)?;
                    new_state.push(next);
                    self.linear_residual(x, o, &sc.out_proj, sc.config.bias)?
                }
            };
            x = self.feed_forward(x, layer)?;
            if let (Some(p), Some(inputs)) = (&layer.per_layer, per_layer_inputs) {
                x = self.per_layer_input(x, p, inputs)?;
            }
            if let Some(scalar) = &layer.scalar {
                let s = f.broadcast_in_dim(self.param(scalar)?, &x.shape(), &[1])?;
                x = f.mul(x, s)?;
            }
        }

        let x = self.norm(x, FINAL_NORM)?;
        // The rows whose logits are returned: the `last` row of a prompt chunk or a mixed
        // call's chosen rows (indices as data, not slice offsets), or every row of a decode
        // step or a verify call (whose `last`, a recurrent model's, is its layers' alone).
        let rows = match (last, self.function) {
            (_, Function::Verify { .. }) | (None, _) => x,
            (Some(last), _) => f.gather_rows(x, last)?,
        };
        let mut logits = self.linear(rows, head(cfg), false)?;
        if let Some(divisor) = cfg.logits_divisor {
            let shape = logits.shape();
            logits = f.div(logits, f.splat(f64::from(divisor), &F32.tensor(&shape))?)?;
        }
        if let Some(cap) = cfg.final_softcap {
            logits = f.mul_scalar(f.tanh(f.mul_scalar(logits, 1.0 / cap)?)?, cap)?;
        }
        let next = f.argmax(logits, 1)?;
        let mut out = vec![next, logits, f.concatenate(&new_k, 0)?, f.concatenate(&new_v, 0)?];
        out.extend(new_state);
        Ok(out)
    }

    /// Gemma 4's per-layer inputs `[R, layers, width]` of the rows' `tokens` and scaled
    /// embeddings `x`, as mlx-lm's `_get_per_layer_inputs` and `_project_per_layer_inputs`.
    fn per_layer_inputs(&self, tokens: V<'c, 'b>, x: V<'c, 'b>, pli: &crate::config::PerLayerInput) -> R<V<'c, 'b>> {
        let f = self.f;
        let (r, layers, width) = (self.rows(), self.cfg.num_layers() as i64, pli.width as i64);
        let shape = [r, layers, width];
        let rows = self.table_rows(names::PER_LAYER_EMBEDDING, tokens, pli.width * self.cfg.num_layers())?;
        let rows = f.reshape(f.mul_scalar(rows, (pli.width as f64).sqrt())?, &shape)?;
        let projected = self.linear(x, names::PER_LAYER_PROJECTION, false)?;
        let projected = f.mul_scalar(projected, (self.cfg.hidden as f64).powf(-0.5))?;
        let projected = self.norm(f.reshape(projected, &shape)?, names::PER_LAYER_PROJECTION_NORM)?;
        f.mul_scalar(f.add(projected, rows)?, 0.5f64.sqrt())
    }

    /// Gemma 4's per-layer input block: `x + norm(projection(gelu_tanh(gate(x)) * input))`,
    /// the input this layer's row of `inputs`.
    fn per_layer_input(&self, x: V<'c, 'b>, p: &PerLayerPlan, inputs: V<'c, 'b>) -> R<V<'c, 'b>> {
        let f = self.f;
        let (r, width) = (self.rows(), inputs.shape()[2]);
        let input = f.reshape(f.slice_dim(inputs, 1, p.index as i64, p.index as i64 + 1)?, &[r, width])?;
        let gate = f.mul(self.gelu_tanh(self.linear(x, &p.gate, false)?)?, input)?;
        let out = self.linear(gate, &p.projection, false)?;
        f.add(x, self.norm(out, &p.norm)?)
    }

    /// The mixer's input: `x` normed by the layer's input norm, or `x` where it has none.
    fn mixer_input(&self, x: V<'c, 'b>, layer: &LayerPlan<'_>) -> R<V<'c, 'b>> {
        match &layer.input_norm {
            Some(norm) => self.norm(x, norm),
            None => Ok(x),
        }
    }

    /// A layer's feed-forward block on `x` (normed first as the layer's norms say), with
    /// its residual.
    fn feed_forward(&self, x: V<'c, 'b>, layer: &LayerPlan<'_>) -> R<V<'c, 'b>> {
        let f = self.f;
        {
            let hn = match &layer.norms {
                Norms::Pre { ffn } => self.norm(x, ffn)?,
                Norms::Sandwich { pre_ffn, .. } => self.norm(x, pre_ffn)?,
                Norms::Post { .. } => x,
            };
            Ok(match (&layer.ffn, layer.norms.after()) {
                (FeedForward::Moe(moe), _) => f.add(x, self.moe(hn, hn, moe)?)?,
                (FeedForward::MlpAndMoe { mlp, moe, post_mlp, pre_moe, post_moe }, after) => {
                    let hidden = self.gated_mlp(hn, mlp)?;
                    let dense = self.norm(self.linear(hidden, &mlp.down, mlp.bias)?, post_mlp)?;
                    let experts = self.norm(self.moe(self.norm(x, pre_moe)?, x, moe)?, post_moe)?;
                    let both = f.add(dense, experts)?;
                    let out = match after {
                        Some((_, post_ffn)) => self.norm(both, post_ffn)?,
                        None => both,
                    };
                    f.add(x, out)?
                }
                (FeedForward::Mlp(mlp), Some((_, post_ffn))) => {
                    let hidden = self.gated_mlp(hn, mlp)?;
                    let out = self.linear(hidden, &mlp.down, mlp.bias)?;
                    f.add(x, self.norm(out, post_ffn)?)?
                }
                (FeedForward::Mlp(mlp), None) => {
                    let hidden = self.gated_mlp(hn, mlp)?;
                    self.linear_residual(x, hidden, &mlp.down, mlp.bias)?
                }
            })
        }
    }

    /// One layer's attention on the normed input `hn [R, d]`: q, k, v (q/k normed where the
    /// model does, v where Gemma 4 does), rotated by `angles` (cos, sin) unless the layer has
    /// no RoPE, then attention over the cache through the CPU kernel where it runs, else the
    /// graph form (a decode row against its window, or a prompt chunk). A KV-shared layer
    /// takes its source's keys and values from `sources` (by cache layer), where an own layer
    /// leaves them. Returns the heads' output `[R, heads * hd]` (before the output
    /// projection) and, for an own layer, the step's new keys and values as one layer's rows
    /// for `write_kv` (`[1, R, heads, width]` of the cache: `kv_heads, hd`, or flat and
    /// padded where the layers' heads differ).
    fn attention(
        &self,
        hn: V<'c, 'b>,
        a: &AttentionPlan,
        angles: Option<(V<'c, 'b>, V<'c, 'b>)>,
        cache: &Cache<'c, 'b>,
        sources: &mut HashMap<usize, (V<'c, 'b>, V<'c, 'b>)>,
    ) -> R<(V<'c, 'b>, Option<(V<'c, 'b>, V<'c, 'b>)>)> {
        let (f, cfg) = (self.f, self.cfg);
        let (m, r) = (self.function.split().1, self.rows());
        let (h, k, hd) = (cfg.heads as i64, a.kv_heads as i64, a.head_dim as i64);
        let l = a.kv_layer;
        // A gated attention's q_proj gives per head its query, then its gate (mlx-lm's
        // Qwen3NextAttention splits the heads' `2 * hd` features in two).
        let (q, gate) = if a.output_gate {
            let both = f.reshape(self.linear(hn, &a.q, a.qkv_bias)?, &[r, h, 2 * hd])?;
            let gate = f.reshape(f.slice(both, &[0, 0, hd], &[r, h, 2 * hd], &[1; 3])?, &[r, h * hd])?;
            (f.slice(both, &[0, 0, 0], &[r, h, hd], &[1; 3])?, Some(gate))
        } else {
            (f.reshape(self.linear(hn, &a.q, a.qkv_bias)?, &[r, h, hd])?, None)
        };
        // Per head, or (OLMo 2) over every head's features at once, then split again.
        let head_norm = |x: V<'c, 'b>, n: &str, heads: i64| -> R<V<'c, 'b>> {
            if cfg.qk_norm_full_width {
                f.reshape(self.norm(f.reshape(x, &[r, heads * hd])?, n)?, &[r, heads, hd])
            } else {
                self.norm(x, n)
            }
        };
        let rotate = |x: V<'c, 'b>| -> R<V<'c, 'b>> {
            match angles {
                Some((cos, sin)) => self.rope(x, cos, sin),
                None => Ok(x),
            }
        };
        // An own layer's keys and values as projected (the emission order the MLIR goldens
        // of the other families pin: q, k, v, their norms, RoPE).
        let projected = match &a.keys {
            Keys::Shared => None,
            Keys::Own { k: k_proj, v, .. } => {
                let keys = f.reshape(self.linear(hn, k_proj, a.qkv_bias)?, &[r, k, hd])?;
                // Gemma 4's k_eq_v layers: the values are the keys as projected.
                let values = match v {
                    Some(v) => f.reshape(self.linear(hn, v, a.qkv_bias)?, &[r, k, hd])?,
                    None => keys,
                };
                Some((keys, values))
            }
        };
        let q = match &a.q_norm {
            Some(n) => head_norm(q, n, h)?,
            None => q,
        };
        let normed = match (&a.keys, projected) {
            (Keys::Own { k_norm, .. }, Some((keys, values))) => {
                let kk = match k_norm {
                    Some(n) => head_norm(keys, n, k)?,
                    None => keys,
                };
                let vv = if a.value_norm { self.norm_unscaled(values)? } else { values };
                Some((kk, vv))
            }
            _ => None,
        };
        let q = rotate(q)?;
        let rotated = match normed {
            Some((kk, vv)) => Some((rotate(kk)?, vv)),
            None => None,
        };
        // Ministral 3: each row's queries times 1 + beta * ln(1 + floor(position / original)).
        let q = match cfg.query_position_scale {
            Some(s) => {
                let pos = f.convert(cache.positions, F32)?;
                let original = f.splat(f64::from(s.original), &F32.tensor(&[r]))?;
                let steps = f.add_scalar(f.floor(f.div(pos, original)?)?, 1.0)?;
                let scale = f.add_scalar(f.mul_scalar(f.log(steps)?, f64::from(s.beta))?, 1.0)?;
                f.mul(q, f.broadcast_in_dim(scale, &[r, h, hd], &[0])?)?
            }
            None => q,
        };
        let (kk, vv, own) = match rotated {
            Some((kk, vv)) => {
                sources.insert(l, (kk, vv));
                (kk, vv, true)
            }
            None => {
                let (kk, vv) = sources.get(&l).copied().ok_or_else(|| hlo_emit::Error::Op {
                    op: "attention",
                    expected: format!("the keys of cache layer {l} before a layer that shares them"),
                    got: "none".into(),
                })?;
                (kk, vv, false)
            }
        };
        // The cache's rows: a layer's own heads, or flat and padded to the widest layer's
        // (Gemma 4, [`ModelConfig::uniform_heads`]).
        let Cache { k: kc, v: vc, slots, row_slots, positions } = *cache;
        let (cache_heads, width) = (kc.shape()[3], self.kv_elem.width(kc.shape()[4] as usize) as i64);
        let flat = (cache_heads, width) != (k, hd);
        let as_cached = |x: V<'c, 'b>| -> R<V<'c, 'b>> {
            if !flat {
                return Ok(x);
            }
            let x = f.reshape(x, &[r, 1, k * hd])?;
            if width == k * hd {
                return Ok(x);
            }
            f.concatenate(&[x, f.splat(0.0, &F32.tensor(&[r, 1, width - k * hd]))?], 2)
        };
        let heads_of = |window: V<'c, 'b>| -> R<V<'c, 'b>> {
            if !flat {
                return Ok(window);
            }
            let (n, w) = (window.shape()[0], window.shape()[1]);
            f.reshape(f.slice_dim(window, 3, 0, k * hd)?, &[n, w, k, hd])
        };
        // The step's keys and values go to the cache in `write_kv`, after this call, which
        // rounds them to the cache's type.
        let (k_cached, v_cached) = (as_cached(kk)?, as_cached(vv)?);
        let rows = |x: V<'c, 'b>| f.reshape(x, &[1, r, cache_heads, width]);
        let new_rows = if own { Some((rows(k_cached)?, rows(v_cached)?)) } else { None };

        // Grouped-query attention: head j = kv * G + i attends with kv head `kv`.
        let sinks = match &a.sinks {
            Some(name) => Some(self.param(name)?),
            None => None,
        };
        let o = match self.attend_kernel(q, kk, vv, (kc, vc), l, row_slots, positions, a.sliding_window)? {
            Some(o) => o,
            None if m == 1 => {
                let (kl, vl) = (heads_of(self.window(kc, l, slots)?)?, heads_of(self.window(vc, l, slots)?)?);
                self.attend_one(q, (kk, vv), (kl, vl), positions, a.sliding_window, sinks)?
            }
            None => {
                let kl = heads_of(self.window_with(kc, l, slots, k_cached, positions)?)?;
                let vl = heads_of(self.window_with(vc, l, slots, v_cached, positions)?)?;
                self.attend_chunk(q, kl, vl, positions, a.sliding_window, sinks)?
            }
        };
        let o = match gate {
            Some(gate) => f.mul(o, f.logistic(gate)?)?,
            None => o,
        };
        Ok((o, new_rows))
    }
}

/// What attention reads of the step's inputs: the whole caches, each sequence's slot, each
/// row's slot (for the kernel) and each row's position.
#[derive(Clone, Copy)]
pub(super) struct Cache<'c, 'b> {
    pub k: V<'c, 'b>,
    pub v: V<'c, 'b>,
    pub slots: V<'c, 'b>,
    pub row_slots: V<'c, 'b>,
    pub positions: V<'c, 'b>,
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::Path;

    fn config(family: &str) -> ModelConfig {
        let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures").join(family).join("f32");
        ModelConfig::from_file(&dir.join("config.json")).unwrap_or_else(|e| panic!("{family}: {e}"))
    }

    #[test]
    fn every_fixture_family_plans_with_declared_names() {
        for family in ["llama_llama3_tied", "phi3", "qwen2", "qwen2_moe", "qwen3_moe", "gemma2", "gemma3_text"] {
            let cfg = config(family);
            let plans = LayerPlan::all(&cfg).unwrap_or_else(|e| panic!("{family}: {e}"));
            assert_eq!(plans.len(), cfg.num_layers(), "{family}");
        }
        // The kinds the plan chose: qwen3_moe's layer 1 is in `mlp_only_layers`.
        let cfg = config("qwen3_moe");
        let plans = LayerPlan::all(&cfg).unwrap_or_else(|e| panic!("{e}"));
        let kinds: Vec<bool> = plans.iter().map(|p| matches!(p.ffn, FeedForward::Moe(_))).collect();
        assert_eq!(kinds, [true, false, true]);
        let cfg = config("gemma2");
        let plans = LayerPlan::all(&cfg).unwrap_or_else(|e| panic!("{e}"));
        assert!(matches!(plans[0].norms, Norms::Sandwich { .. }));
        let Mixer::Attention(a) = &plans[0].mixer else { panic!("gemma2's layer 0 attends") };
        assert_eq!(a.q, "model.layers.0.self_attn.q_proj");
        // qwen3_next: linear, attention, linear; the attention layer is the cache's first,
        // the second linear layer's buffers (convolution inputs, matrix) follow the first's.
        let cfg = config("qwen3_next");
        let plans = LayerPlan::all(&cfg).unwrap_or_else(|e| panic!("{e}"));
        let kinds: Vec<(bool, usize)> = plans
            .iter()
            .map(|p| match &p.mixer {
                Mixer::Attention(a) => (false, a.kv_layer),
                Mixer::Latent(l) => (false, l.kv_layer),
                Mixer::Linear(l) => (true, l.state),
                Mixer::ShortConv(sc) => (true, sc.state),
            })
            .collect();
        assert_eq!(kinds, [(true, 0), (false, 0), (true, 2)]);
        let (conv, matrix) = (3 * (2 * 2 * 16 + 4 * 16), 4 * 16 * 16);
        assert_eq!(cfg.state_parts(), [conv, matrix, conv, matrix]);
        assert_eq!(cfg.state_len(), 2 * (conv + matrix));
        // lfm2: one buffer per convolution layer.
        let cfg = config("lfm2");
        let plans = LayerPlan::all(&cfg).unwrap_or_else(|e| panic!("{e}"));
        let states: Vec<usize> = plans
            .iter()
            .filter_map(|p| if let Mixer::ShortConv(sc) = &p.mixer { Some(sc.state) } else { None })
            .collect();
        assert_eq!(states, (0..cfg.state_parts().len()).collect::<Vec<_>>());
    }

    /// deepseek_v3: every layer's latent attention in the caches in order, its queries
    /// compressed; layer 0 dense, then experts routed by groups; the caches hold a latent and a
    /// rotated key per position.
    #[test]
    fn latent_attention_plans_and_caches() {
        let cfg = config("deepseek_v3");
        let plans = LayerPlan::all(&cfg).unwrap_or_else(|e| panic!("{e}"));
        let layers: Vec<(usize, bool)> = plans
            .iter()
            .map(|p| match (&p.mixer, &p.ffn) {
                (Mixer::Latent(l), ffn) => (l.kv_layer, matches!(ffn, FeedForward::Moe(_))),
                _ => panic!("every deepseek_v3 layer is latent attention"),
            })
            .collect();
        assert_eq!(layers, [(0, false), (1, true), (2, true)]);
        let Mixer::Latent(l) = &plans[1].mixer else { unreachable!() };
        assert!(matches!(&l.query, LatentQuery::Compressed { b, .. } if b == "model.layers.1.self_attn.q_b_proj"));
        assert_eq!((l.embed_q.as_str(), l.in_bias, l.o_bias), ("model.layers.1.self_attn.embed_q", false, false));
        assert_eq!((cfg.heads, cfg.kv_heads, cfg.head_dim, cfg.rope_dims), (4, 1, 48, 16));
        assert_eq!(cfg.cache_rows(), [(1, 32), (1, 16)]);
        let cache = crate::CacheShape { slots: 2, positions: 8, elem: crate::KvElem::F32, scratch: false };
        assert_eq!(cache.dims(&cfg), [[3, 2, 8, 1, 32], [3, 2, 8, 1, 16]]);
        assert_eq!(crate::CacheShape::bytes_per_position(&cfg, crate::KvElem::F16), 3 * 48 * 2);
    }

    /// gemma4_text: the KV-shared layers read their sources' place in the cache and have no
    /// key projections; every layer has its per-layer input block and scalar.
    #[test]
    fn kv_shared_layers_plan_their_sources() {
        let cfg = config("gemma4_text");
        let plans = LayerPlan::all(&cfg).unwrap_or_else(|e| panic!("{e}"));
        let keys: Vec<(usize, bool, usize)> = plans
            .iter()
            .map(|p| match &p.mixer {
                Mixer::Attention(a) => (a.kv_layer, matches!(a.keys, Keys::Shared), a.head_dim),
                _ => panic!("every gemma4 layer attends"),
            })
            .collect();
        assert_eq!(keys, [(0, false, 16), (1, false, 16), (2, false, 32), (1, true, 16), (2, true, 32)]);
        assert!(plans.iter().enumerate().all(|(i, p)| p.per_layer.as_ref().is_some_and(|b| b.index == i)));
        assert_eq!(plans[4].scalar.as_deref(), Some("model.layers.4.layer_scalar"));
        let cfg = config("gemma4");
        let plans = LayerPlan::all(&cfg).unwrap_or_else(|e| panic!("{e}"));
        let Mixer::Attention(a) = &plans[1].mixer else { panic!("gemma4's layer 1 attends") };
        assert!(matches!(&a.keys, Keys::Own { v: None, .. }), "k_eq_v: no v_proj");
        assert!(plans[1].per_layer.is_none());
        // gemma4_moe: the experts beside the dense MLP, with their own norms.
        let cfg = config("gemma4_moe");
        let plans = LayerPlan::all(&cfg).unwrap_or_else(|e| panic!("{e}"));
        let FeedForward::MlpAndMoe { mlp, moe, pre_moe, .. } = &plans[2].ffn else { panic!("experts beside the MLP") };
        assert_eq!(
            (mlp.up.as_str(), pre_moe.as_str()),
            ("model.layers.2.mlp.up_proj", "model.layers.2.pre_feedforward_layernorm_2.weight")
        );
        assert_eq!(moe.names.router(), "model.layers.2.router.proj");
    }

    #[test]
    fn a_name_no_parameter_declares_is_refused() {
        let cfg = config("qwen2");
        let read = ["model.layers.0.self_attn.q_proj", "model.layers.0.self_atn.k_proj", "model.norm.weight"];
        let err = check_declared(&cfg, read.into_iter().map(str::to_owned)).map(|_| ()).unwrap_err();
        assert_eq!(
            err.to_string(),
            "the qwen2 graph reads model.layers.0.self_atn.k_proj, which no parameter of the model declares (names undeclared: 1)"
        );
        assert!(check_declared(&cfg, read[..1].iter().map(|s| (*s).to_owned())).is_ok());
    }

    #[test]
    fn experts_with_sandwich_norms_are_refused() {
        let mut cfg = config("qwen3_moe");
        cfg.norm_placement = NormPlacement::Sandwich;
        let err = LayerPlan::all(&cfg).map(|_| ()).unwrap_err();
        assert!(err.to_string().contains("a mixture of experts with norms after its blocks is not supported"), "{err}");
    }
}
