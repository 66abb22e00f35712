//! The model's parameters: checkpoint names and shapes derived from the config (one list
//! shared by the graph and the loader), and their f32 values read from a checkpoint.

use crate::config::{LayerMixer, ModelConfig, NormPlacement, Routing};
use crate::error::{Error, Result};
use crate::names::{
    EMBEDDING, FINAL_NORM, GATE_UP, LM_HEAD, LayerNames, MLP_PARTS, PER_LAYER_EMBEDDING, PER_LAYER_PROJECTION,
    PER_LAYER_PROJECTION_NORM, QKV, bias, weight,
};
use hlo_emit::ElementType;
use std::borrow::Cow;
use weights::{Checkpoint, Dtype, Linear};

/// What a parameter is, which decides how it is read from the checkpoint.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// A projection or embedding weight `[out, in]`, dense or MLX-quantized.
    Matrix,
    /// A 1-D tensor stored as is (norm weights, biases).
    Vector,
    /// Stacked expert weights `[experts, out, in]` (MLX's `SwitchLinear`), dense or
    /// MLX-quantized per expert.
    Experts,
    /// One matrix per head `[heads, out, in]` (mlx-lm's `MultiLinear`: latent attention's
    /// `embed_q` and `unembed_out`), dense or MLX-quantized per head; held dense in f32 at
    /// every precision (the layout's [`crate::Form::Narrow`]), as small as a layer's keys.
    Heads,
}

/// One graph parameter: its checkpoint tensor name and f32 shape.
#[derive(Debug, Clone, PartialEq)]
pub struct ParamSpec {
    /// The tensor's name, which is its checkpoint name unless `part` says where it lies.
    pub key: String,
    pub shape: Vec<usize>,
    pub kind: Kind,
    /// For a matrix the checkpoint stores inside a fused one (Phi-3's `qkv_proj`).
    pub part: Option<Part>,
    /// A matrix of few outputs (a router) that the graph reads in f32 at every dense
    /// precision ([`crate::Role::Widened`]).
    pub narrow: bool,
}

/// Rows `[first_row, first_row + shape[0])` of the checkpoint layer `of`.
#[derive(Debug, Clone, PartialEq)]
pub struct Part {
    /// The fused layer's prefix (`model.layers.0.self_attn.qkv_proj`).
    pub of: String,
    pub first_row: usize,
}

impl ParamSpec {
    /// The layer prefix of a matrix (`model.layers.0.mlp.up_proj` of `...up_proj.weight`).
    pub fn prefix(&self) -> &str {
        self.key.strip_suffix(".weight").unwrap_or(&self.key)
    }

    /// The checkpoint's layer for this matrix: its own, or its rows of a fused one.
    ///
    /// # Errors
    /// As [`Checkpoint::linear`]; a fused layer with fewer rows than config.json gives it.
    pub fn linear<'a>(&self, ckpt: &'a Checkpoint) -> Result<Linear<'a>> {
        match &self.part {
            None => Ok(ckpt.linear(self.prefix())?),
            Some(part) => Ok(ckpt.linear(&part.of)?.part(part.first_row, self.shape[0])?),
        }
    }

    /// Expert `e` of stacked expert weights ([`Kind::Experts`]), checked against the
    /// `[out, in]` config.json gives each expert.
    ///
    /// # Errors
    /// As [`Checkpoint::expert`]; a shape other than config.json's.
    pub fn expert<'a>(&self, ckpt: &'a Checkpoint, e: usize) -> Result<Linear<'a>> {
        let linear = ckpt.expert(self.prefix(), e)?;
        let (o, i) = (linear.out_features(), linear.in_features());
        if [o, i] != self.shape[1..] {
            return Err(shape_error(ckpt, &self.key, &self.shape, &[self.shape[0], o, i]));
        }
        Ok(linear)
    }
}

/// Every parameter the decoder reads, in a fixed order.
pub fn param_specs(cfg: &ModelConfig) -> Vec<ParamSpec> {
    let d = cfg.hidden;
    // A layer's query and key/value widths (its own heads: Gemma 4's full layers differ).
    let widths = |layer: &crate::config::LayerConfig| (cfg.heads * layer.head_dim, layer.kv_heads * layer.head_dim);
    let mut out = Vec::new();
    // Latent attention's per-head matrices, listed after the other matrices.
    let mut per_head = Vec::new();
    // `narrow`: a matrix of few outputs (a router), which dense precisions keep in f32.
    let mut mat = |prefix: String, o: usize, i: usize, narrow: bool| {
        out.push(ParamSpec { key: weight(&prefix), shape: vec![o, i], kind: Kind::Matrix, part: None, narrow })
    };
    mat(EMBEDDING.into(), cfg.vocab, d, false);
    if let Some(pli) = &cfg.per_layer_input {
        let all = cfg.num_layers() * pli.width;
        mat(PER_LAYER_EMBEDDING.into(), pli.vocab, all, false);
        mat(PER_LAYER_PROJECTION.into(), all, d, false);
    }
    for (l, layer) in cfg.layers.iter().enumerate() {
        let n = LayerNames::new(l);
        let (q_out, kv_out) = widths(layer);
        match cfg.mixer(layer) {
            LayerMixer::ShortConv(_) => {
                // LFM2's short convolution: B, C and x from one projection.
                mat(n.short_conv("in_proj"), 3 * d, d, false);
                mat(n.short_conv("out_proj"), d, d, false);
            }
            LayerMixer::Linear(lin) => {
                let (keys, values) = (lin.k_heads * lin.k_dim, lin.v_heads * lin.v_dim);
                if lin.fused_in_proj {
                    mat(n.linear_attn("in_proj_qkvz"), 2 * keys + 2 * values, d, false);
                    mat(n.linear_attn("in_proj_ba"), 2 * lin.v_heads, d, false);
                } else {
                    mat(n.linear_attn("in_proj_qkv"), 2 * keys + values, d, false);
                    mat(n.linear_attn("in_proj_z"), values, d, false);
                    mat(n.linear_attn("in_proj_b"), lin.v_heads, d, false);
                    mat(n.linear_attn("in_proj_a"), lin.v_heads, d, false);
                }
                mat(n.linear_attn("out_proj"), d, values, false);
            }
            LayerMixer::Latent(lat) => {
                let q_out = cfg.heads * (lat.nope_dim + lat.rope_dim);
                match lat.q_rank {
                    Some(rank) => {
                        mat(n.latent("q_a_proj"), rank, d, false);
                        mat(n.latent("q_b_proj"), q_out, rank, false);
                    }
                    None => mat(n.q_proj(), q_out, d, false),
                }
                mat(n.latent("kv_a_proj_with_mqa"), lat.kv_rank + lat.rope_dim, d, false);
                mat(n.o_proj(), d, cfg.heads * lat.v_dim, false);
                let mut heads = |part: &str, o: usize, i: usize| {
                    per_head.push(ParamSpec {
                        key: weight(&n.latent(part)),
                        shape: vec![cfg.heads, o, i],
                        kind: Kind::Heads,
                        part: None,
                        narrow: true,
                    })
                };
                heads("embed_q", lat.kv_rank, lat.nope_dim);
                heads("unembed_out", lat.v_dim, lat.kv_rank);
            }
            LayerMixer::Attention => {
                // A gated attention's q_proj gives each head's query and gate.
                mat(n.q_proj(), if cfg.attn_output_gate { 2 * q_out } else { q_out }, d, false);
                // A KV-shared layer reads another's keys and values.
                if layer.kv_source.is_none() {
                    mat(n.k_proj(), kv_out, d, false);
                    if !layer.values_are_keys {
                        mat(n.v_proj(), kv_out, d, false);
                    }
                }
                mat(n.o_proj(), d, q_out, false);
            }
        }
        let moe = cfg.moe.as_ref().filter(|_| layer.moe);
        // The dense MLP, unless experts replace it (Gemma 4's run beside it).
        if moe.is_none_or(|m| m.beside_mlp) {
            let [gate, up, down] = MLP_PARTS.map(|part| n.mlp(part));
            mat(gate, layer.intermediate, d, false);
            mat(up, layer.intermediate, d, false);
            mat(down, d, layer.intermediate, false);
        }
        if let Some(moe) = moe {
            let b = n.moe(moe);
            mat(b.router(), moe.experts, d, true);
            if let Some(shared) = &moe.shared_expert {
                let [gate, up, down] = MLP_PARTS.map(|part| b.shared_expert(shared, part));
                mat(gate, shared.width, d, false);
                mat(up, shared.width, d, false);
                mat(down, d, shared.width, false);
                if shared.gated {
                    mat(b.shared_expert_gate(), 1, d, true);
                }
            }
        }
        if let Some(pli) = &cfg.per_layer_input {
            let [gate, projection, _] = n.per_layer_block();
            mat(gate, pli.width, d, false);
            mat(projection, d, pli.width, false);
        }
    }
    if !cfg.tie_embeddings {
        mat(LM_HEAD.into(), cfg.vocab, d, false);
    }
    out.append(&mut per_head);
    if let Some(moe) = &cfg.moe {
        let (e, i) = (moe.experts, moe.intermediate);
        for (l, _) in cfg.layers.iter().enumerate().filter(|(_, layer)| layer.moe) {
            let b = LayerNames::new(l).moe(moe);
            for (part, shape) in MLP_PARTS.into_iter().zip([[e, i, d], [e, i, d], [e, d, i]]) {
                out.push(ParamSpec {
                    key: weight(&b.experts(part)),
                    shape: shape.to_vec(),
                    kind: Kind::Experts,
                    part: None,
                    narrow: false,
                });
            }
        }
    }
    if cfg.fused_qkv || cfg.fused_gate_up {
        mark_fused_parts(cfg, &mut out);
    }
    let mut vec = |key: String, shape: &[usize]| {
        out.push(ParamSpec { key, shape: shape.to_vec(), kind: Kind::Vector, part: None, narrow: false })
    };
    for (l, layer) in cfg.layers.iter().enumerate() {
        let n = LayerNames::new(l);
        match cfg.norm_placement {
            NormPlacement::Pre => {
                vec(n.input_norm(), &[d]);
                vec(n.post_attention_norm(), &[d]);
            }
            NormPlacement::Sandwich => {
                vec(n.input_norm(), &[d]);
                vec(n.post_attention_norm(), &[d]);
                vec(n.pre_ffn_norm(), &[d]);
                vec(n.post_ffn_norm(), &[d]);
            }
            NormPlacement::Post => {
                vec(n.post_attention_norm(), &[d]);
                vec(n.post_ffn_norm(), &[d]);
            }
        }
        match cfg.mixer(layer) {
            LayerMixer::ShortConv(conv) => {
                // The depthwise convolution's weight `[hidden, kernel, 1]`, as mlx-lm keeps it.
                vec(n.short_conv("conv.weight"), &[d, conv.kernel, 1]);
                if conv.bias {
                    vec(bias(&n.short_conv("in_proj")), &[3 * d]);
                    vec(n.short_conv("conv.bias"), &[d]);
                    vec(bias(&n.short_conv("out_proj")), &[d]);
                }
            }
            LayerMixer::Linear(lin) => {
                // Stored as mlx-lm keeps them: the depthwise convolution's weight
                // `[channels, kernel, 1]`, the decay's `dt_bias` and `A_log` per value head,
                // the gated RMSNorm's weight over one value head.
                vec(n.linear_attn("conv1d.weight"), &[lin.conv_dim(), lin.conv_kernel, 1]);
                vec(n.linear_attn("dt_bias"), &[lin.v_heads]);
                vec(n.linear_attn("A_log"), &[lin.v_heads]);
                vec(n.linear_attn("norm.weight"), &[lin.v_dim]);
            }
            LayerMixer::Latent(lat) => {
                if let Some(rank) = lat.q_rank {
                    vec(n.latent("q_a_layernorm.weight"), &[rank]);
                }
                vec(n.latent("kv_a_layernorm.weight"), &[lat.kv_rank]);
                if cfg.qkv_bias {
                    if let Some(rank) = lat.q_rank {
                        vec(bias(&n.latent("q_a_proj")), &[rank]);
                    }
                    vec(bias(&n.latent("kv_a_proj_with_mqa")), &[lat.kv_rank + lat.rope_dim]);
                }
                if cfg.o_bias {
                    vec(bias(&n.o_proj()), &[d]);
                }
            }
            LayerMixer::Attention => {
                let (q_out, kv_out) = widths(layer);
                if cfg.qk_norm {
                    let (q, k) =
                        if cfg.qk_norm_full_width { (q_out, kv_out) } else { (layer.head_dim, layer.head_dim) };
                    vec(n.q_norm(), &[q]);
                    if layer.kv_source.is_none() {
                        vec(n.k_norm(), &[k]);
                    }
                }
                if cfg.qkv_bias {
                    vec(bias(&n.q_proj()), &[q_out]);
                    vec(bias(&n.k_proj()), &[kv_out]);
                    vec(bias(&n.v_proj()), &[kv_out]);
                }
                if cfg.o_bias {
                    vec(bias(&n.o_proj()), &[d]);
                }
            }
        }
        match cfg.moe.as_ref().filter(|_| layer.moe) {
            Some(moe) if matches!(moe.routing, Routing::Grouped { .. }) => {
                vec(n.moe(moe).router_bias(), &[moe.experts]);
            }
            Some(moe) if moe.routing == Routing::ScaledTopKSoftmax => {
                let b = n.moe(moe);
                vec(b.router_scale(), &[d]);
                vec(b.per_expert_scale(), &[moe.experts]);
            }
            Some(moe) if moe.biased => {
                // gpt-oss: the router's bias, each expert's biases `[experts, out]`.
                let b = n.moe(moe);
                vec(bias(&b.router()), &[moe.experts]);
                let widths = [moe.intermediate, moe.intermediate, d];
                for (part, out) in MLP_PARTS.into_iter().zip(widths) {
                    vec(bias(&b.experts(part)), &[moe.experts, out]);
                }
            }
            _ => {}
        }
        if cfg.attn_sinks && matches!(cfg.mixer(layer), LayerMixer::Attention) {
            vec(n.sinks(), &[cfg.heads]);
        }
        if cfg.moe.as_ref().is_some_and(|m| layer.moe && m.beside_mlp) {
            for norm in n.branch_norms() {
                vec(norm, &[d]);
            }
        }
        if cfg.mlp_bias {
            let [gate, up, down] = MLP_PARTS.map(|part| bias(&n.mlp(part)));
            vec(gate, &[layer.intermediate]);
            vec(up, &[layer.intermediate]);
            vec(down, &[d]);
        }
        if cfg.per_layer_input.is_some() {
            let [_, _, norm] = n.per_layer_block();
            vec(norm, &[d]);
        }
        if cfg.layer_scalar {
            vec(n.layer_scalar(), &[1]);
        }
    }
    if let Some(pli) = &cfg.per_layer_input {
        vec(PER_LAYER_PROJECTION_NORM.into(), &[pli.width]);
    }
    vec(FINAL_NORM.into(), &[d]);
    out
}

/// Phi-3's `qkv_proj` holds q, k, v and `gate_up_proj` gate, up, stacked by rows: each part
/// is read from its rows there ([`ParamSpec::part`]), and the graph uses the parts as any
/// model's.
fn mark_fused_parts(cfg: &ModelConfig, out: &mut [ParamSpec]) {
    for l in 0..cfg.num_layers() {
        let n = LayerNames::new(l);
        let stored = [(QKV, cfg.fused_qkv), (GATE_UP, cfg.fused_gate_up)];
        for (fused, parts) in stored.into_iter().filter(|(_, fused)| *fused).map(|(both, _)| both) {
            let mut first_row = 0;
            for part in parts {
                let key = weight(&n.at(part));
                let Some(spec) = out.iter_mut().find(|s| s.key == key) else { continue };
                spec.part = Some(Part { of: n.at(fused), first_row });
                first_row += spec.shape[0];
            }
        }
    }
}

/// Checks that `ckpt` holds every parameter `cfg` declares, each in the shape config.json
/// gives it (matrices as dense or MLX-quantized layers, stacked experts by their count and
/// each expert's shape), from the tensors' headers only: so a checkpoint that disagrees with
/// its config.json is refused when the layout is planned, naming the tensor, before
/// anything is compiled.
///
/// # Errors
/// The first missing tensor, or the first whose shape disagrees, with both shapes.
pub fn check_checkpoint(cfg: &ModelConfig, ckpt: &Checkpoint) -> Result<()> {
    for spec in param_specs(cfg) {
        let got = match spec.kind {
            Kind::Matrix => {
                let linear = spec.linear(ckpt)?;
                vec![linear.out_features(), linear.in_features()]
            }
            Kind::Heads if !ckpt.contains(&spec.key) && cfg.latent.is_some() => {
                // Split out of `kv_b_proj` at load: check that layer's [heads * (nope + v), rank].
                let lat = cfg.latent.as_ref().expect("checked");
                let fused = fused_kv_b(&spec).unwrap_or_default();
                let linear = ckpt.linear(&fused)?;
                let want = [cfg.heads * (lat.nope_dim + lat.v_dim), lat.kv_rank];
                let got = [linear.out_features(), linear.in_features()];
                if got != want {
                    return Err(shape_error(ckpt, &weight(&fused), &want, &got));
                }
                spec.shape.clone()
            }
            Kind::Experts | Kind::Heads => {
                // The stacked tensor's leading dimension is the experts (packed or not);
                // expert 0 checks each expert's [out, in].
                let experts = ckpt.tensor(&spec.key)?.shape().first().copied().unwrap_or(0);
                if experts == spec.shape[0] {
                    spec.expert(ckpt, 0)?;
                }
                let mut got = spec.shape.clone();
                got[0] = experts;
                got
            }
            Kind::Vector => ckpt.tensor(&spec.key)?.shape().to_vec(),
        };
        if got != spec.shape {
            return Err(shape_error(ckpt, &spec.key, &spec.shape, &got));
        }
    }
    Ok(())
}

/// The bytes of one dense parameter as a graph declares it: matrices in `elem` (borrowed
/// from the checkpoint when it already has that dtype and shape, else converted with
/// round-to-nearest-even, or dequantized then converted), vectors f32.
pub fn load_param<'a>(ckpt: &'a Checkpoint, spec: &ParamSpec, elem: ElementType) -> Result<Cow<'a, [u8]>> {
    let wanted = match elem {
        ElementType::F16 => Some(Dtype::F16),
        ElementType::BF16 => Some(Dtype::BF16),
        _ => None,
    };
    if let (Kind::Matrix, Some(wanted)) = (spec.kind, wanted)
        && let Linear::Dense(d) = spec.linear(ckpt)?
    {
        let w = d.weight();
        if w.dtype() == wanted && w.shape() == &spec.shape[..] {
            return Ok(Cow::Borrowed(w.bytes()));
        }
    }
    if let (Kind::Experts, Some(wanted)) = (spec.kind, wanted)
        && let Some(w) = ckpt.get(&spec.key)
        && !ckpt.contains(&format!("{}.scales", spec.prefix()))
        && w.dtype() == wanted
        && w.shape() == &spec.shape[..]
    {
        return Ok(Cow::Borrowed(w.bytes()));
    }
    let data = load_f32(ckpt, spec)?;
    let elem = if spec.kind == Kind::Vector { ElementType::F32 } else { elem };
    Ok(Cow::Owned(crate::layout::encode_f32(data.into_iter(), elem)))
}

/// Reads one parameter as f32 (widened exactly, or dequantized at load), checking its shape.
pub fn load_f32(ckpt: &Checkpoint, spec: &ParamSpec) -> Result<Vec<f32>> {
    match spec.kind {
        Kind::Matrix => {
            let linear = spec.linear(ckpt)?;
            let (o, i) = (linear.out_features(), linear.in_features());
            if [o, i] != spec.shape[..] {
                return Err(shape_error(ckpt, &spec.key, &spec.shape, &[o, i]));
            }
            Ok(linear.weight_f32())
        }
        Kind::Heads if !ckpt.contains(&spec.key) => heads_from_kv_b(ckpt, spec),
        Kind::Experts | Kind::Heads => {
            let mut all = Vec::with_capacity(spec.shape.iter().product());
            for e in 0..spec.shape[0] {
                all.extend(spec.expert(ckpt, e)?.weight_f32());
            }
            Ok(all)
        }
        Kind::Vector => {
            let t = ckpt.tensor(&spec.key)?;
            if t.shape() != &spec.shape[..] {
                return Err(shape_error(ckpt, &spec.key, &spec.shape, t.shape()));
            }
            Ok(t.to_f32_vec()?)
        }
    }
}

/// The `kv_b_proj` a latent attention's per-head matrix (`embed_q`, `unembed_out`) is split
/// from in checkpoints converted before mlx-lm stored them apart.
fn fused_kv_b(spec: &ParamSpec) -> Option<String> {
    let prefix = spec.prefix();
    let layer = prefix.strip_suffix(".embed_q").or_else(|| prefix.strip_suffix(".unembed_out"))?;
    Some(format!("{layer}.kv_b_proj"))
}

/// Whether a per-head matrix is MLX-quantized in the checkpoint, stored as it is or in the
/// `kv_b_proj` it is split from.
///
/// # Errors
/// As [`Checkpoint::expert`] and [`Checkpoint::linear`].
pub(crate) fn heads_quantized(ckpt: &Checkpoint, spec: &ParamSpec) -> Result<bool> {
    let layer = match fused_kv_b(spec).filter(|_| !ckpt.contains(&spec.key)) {
        Some(fused) => ckpt.linear(&fused)?,
        None => spec.expert(ckpt, 0)?,
    };
    Ok(matches!(layer, Linear::Quantized(_)))
}

/// `embed_q` `[heads, rank, nope]` or `unembed_out` `[heads, v, rank]` as mlx-lm 0.32's
/// deepseek_v3 `sanitize` makes them from a `kv_b_proj` `[heads * (nope + v), rank]` (each
/// head's nope key rows, then its v value rows): split per head, the key rows transposed,
/// and where `kv_b_proj` is quantized, first dequantized in its scales' type
/// (`mx.dequantize`) and afterwards quantized again with its bits and group size, so the
/// values are those mlx-lm computes with.
fn heads_from_kv_b(ckpt: &Checkpoint, spec: &ParamSpec) -> Result<Vec<f32>> {
    let fused = fused_kv_b(spec)
        .ok_or_else(|| Error::Invalid(format!("{}: missing tensor {}", ckpt.dir().display(), spec.key)))?;
    let linear = ckpt.linear(&fused)?;
    let (heads, rows, rank) = (spec.shape[0], linear.out_features(), linear.in_features());
    let embed = spec.prefix().ends_with(".embed_q");
    // embed_q [heads, rank, nope]: its rows are the head's first `nope`; unembed_out [heads,
    // v, rank]: the last `v`.
    let (take, spec_rank) = if embed { (spec.shape[2], spec.shape[1]) } else { (spec.shape[1], spec.shape[2]) };
    let per_head = rows / heads.max(1);
    if rows % heads.max(1) != 0 || take > per_head || rank != spec_rank {
        return Err(Error::Invalid(format!(
            "{}: {fused} is [{rows}, {rank}], which holds no {:?} for config.json's heads",
            ckpt.dir().display(),
            spec.shape
        )));
    }
    let values = match &linear {
        Linear::Dense(_) => linear.weight_f32(),
        Linear::Quantized(q) => q.dequantize_in_scale_type(),
    };
    let first = if embed { 0 } else { per_head - take };
    let mut out = Vec::with_capacity(heads * take * rank);
    for h in 0..heads {
        let row = |i: usize| &values[(h * per_head + first + i) * rank..][..rank];
        if embed {
            // Transposed: [rank, nope].
            out.extend((0..rank).flat_map(|r| (0..take).map(move |i| (r, i))).map(|(r, i)| row(i)[r]));
        } else {
            out.extend((0..take).flat_map(row).copied());
        }
    }
    let Linear::Quantized(q) = linear else { return Ok(out) };
    let inputs = spec.shape[2];
    weights::quantize_dequantize(&out, inputs, q.params(), q.scales().dtype()).ok_or_else(|| {
        Error::Invalid(format!(
            "{}: {fused} splits into {} of {inputs} inputs, which group size {} does not divide",
            ckpt.dir().display(),
            spec.key,
            q.group_size()
        ))
    })
}

fn shape_error(ckpt: &Checkpoint, key: &str, expected: &[usize], got: &[usize]) -> Error {
    Error::Invalid(format!(
        "{}: tensor {key}: expected shape {expected:?} from config.json, got {got:?}",
        ckpt.dir().display()
    ))
}
