//! The model's parameters: checkpoint names and shapes derived from the config (one list
//! shared by the graph and the loader), and their f32 values read from a checkpoint.

use crate::config::ModelConfig;
use crate::error::{Error, Result};
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

/// Checkpoint names of one decoder layer's tensors, so the names appear once.
pub fn layer_prefix(i: usize) -> String {
    format!("model.layers.{i}")
}

/// Every parameter the decoder reads, in a fixed order.
pub fn param_specs(cfg: &ModelConfig) -> Vec<ParamSpec> {
    let (d, hd) = (cfg.hidden, cfg.head_dim);
    let (q_out, kv_out) = (cfg.heads * hd, cfg.kv_heads * hd);
    let mut out = Vec::new();
    // `narrow`: a matrix of few outputs (a router), which dense precisions keep in f32.
    let mut mat = |key: String, o: usize, i: usize, narrow: bool| {
        out.push(ParamSpec { key, shape: vec![o, i], kind: Kind::Matrix, part: None, narrow })
    };
    mat("model.embed_tokens.weight".into(), cfg.vocab, d, false);
    for (l, layer) in cfg.layers.iter().enumerate() {
        let p = layer_prefix(l);
        mat(format!("{p}.self_attn.q_proj.weight"), q_out, d, false);
        mat(format!("{p}.self_attn.k_proj.weight"), kv_out, d, false);
        mat(format!("{p}.self_attn.v_proj.weight"), kv_out, d, false);
        mat(format!("{p}.self_attn.o_proj.weight"), d, q_out, false);
        match cfg.moe.as_ref().filter(|_| layer.moe) {
            None => {
                mat(format!("{p}.mlp.gate_proj.weight"), cfg.intermediate, d, false);
                mat(format!("{p}.mlp.up_proj.weight"), cfg.intermediate, d, false);
                mat(format!("{p}.mlp.down_proj.weight"), d, cfg.intermediate, false);
            }
            Some(moe) => {
                let b = format!("{p}.{}", moe.block);
                mat(format!("{b}.gate.weight"), moe.experts, d, true);
                if let Some(shared) = moe.shared_expert {
                    mat(format!("{b}.shared_expert.gate_proj.weight"), shared, d, false);
                    mat(format!("{b}.shared_expert.up_proj.weight"), shared, d, false);
                    mat(format!("{b}.shared_expert.down_proj.weight"), d, shared, false);
                    mat(format!("{b}.shared_expert_gate.weight"), 1, d, true);
                }
            }
        }
    }
    if !cfg.tie_embeddings {
        mat("lm_head.weight".into(), cfg.vocab, d, false);
    }
    if let Some(moe) = &cfg.moe {
        let (e, i) = (moe.experts, moe.intermediate);
        for (l, _) in cfg.layers.iter().enumerate().filter(|(_, layer)| layer.moe) {
            let s = format!("{}.{}.switch_mlp", layer_prefix(l), moe.block);
            for (name, shape) in [("gate_proj", [e, i, d]), ("up_proj", [e, i, d]), ("down_proj", [e, d, i])] {
                out.push(ParamSpec {
                    key: format!("{s}.{name}.weight"),
                    shape: shape.to_vec(),
                    kind: Kind::Experts,
                    part: None,
                    narrow: false,
                });
            }
        }
    }
    if cfg.fused_projections {
        mark_fused_parts(cfg, &mut out);
    }
    let mut vec = |key: String, n: usize| {
        out.push(ParamSpec { key, shape: vec![n], kind: Kind::Vector, part: None, narrow: false })
    };
    for l in 0..cfg.num_layers() {
        let p = layer_prefix(l);
        vec(format!("{p}.input_layernorm.weight"), d);
        vec(format!("{p}.post_attention_layernorm.weight"), d);
        if cfg.sandwich_norms {
            vec(format!("{p}.pre_feedforward_layernorm.weight"), d);
            vec(format!("{p}.post_feedforward_layernorm.weight"), d);
        }
        if cfg.qk_norm {
            vec(format!("{p}.self_attn.q_norm.weight"), hd);
            vec(format!("{p}.self_attn.k_norm.weight"), hd);
        }
        if cfg.qkv_bias {
            vec(format!("{p}.self_attn.q_proj.bias"), q_out);
            vec(format!("{p}.self_attn.k_proj.bias"), kv_out);
            vec(format!("{p}.self_attn.v_proj.bias"), kv_out);
        }
        if cfg.o_bias {
            vec(format!("{p}.self_attn.o_proj.bias"), d);
        }
        if cfg.mlp_bias {
            vec(format!("{p}.mlp.gate_proj.bias"), cfg.intermediate);
            vec(format!("{p}.mlp.up_proj.bias"), cfg.intermediate);
            vec(format!("{p}.mlp.down_proj.bias"), d);
        }
    }
    vec("model.norm.weight".into(), d);
    out
}

/// Phi-3's `qkv_proj` holds q, k, v and `gate_up_proj` gate, up, stacked by rows: each part
/// is read from its rows there ([`ParamSpec::part`]), and the graph uses the parts as any
/// model's.
fn mark_fused_parts(cfg: &ModelConfig, out: &mut [ParamSpec]) {
    for l in 0..cfg.num_layers() {
        let p = layer_prefix(l);
        let fused: [(&str, &str, &[&str]); 2] = [
            ("self_attn", "qkv_proj", &["q_proj", "k_proj", "v_proj"]),
            ("mlp", "gate_up_proj", &["gate_proj", "up_proj"]),
        ];
        for (block, fused, parts) in fused {
            let mut first_row = 0;
            for name in parts {
                let key = format!("{p}.{block}.{name}.weight");
                let Some(spec) = out.iter_mut().find(|s| s.key == key) else { continue };
                spec.part = Some(Part { of: format!("{p}.{block}.{fused}"), first_row });
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
            Kind::Experts => {
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
        Kind::Experts => {
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

fn shape_error(ckpt: &Checkpoint, key: &str, expected: &[usize], got: &[usize]) -> Error {
    Error::Invalid(format!(
        "{}: tensor {key}: expected shape {expected:?} from config.json, got {got:?}",
        ckpt.dir().display()
    ))
}
