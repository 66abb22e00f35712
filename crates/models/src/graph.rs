//! The decoder as StableHLO: one `step` body emitted for a prompt bucket (`prefill`) and for
//! one token (`decode`), with the KV cache passed in and returned so it stays on the device.
//!
//! Function signature (both functions):
//! `(tokens: i32[T], start: i32, last: i32, k: f32[L,K,S,hd], v: f32[L,K,S,hd])
//!   -> (next: i32[1], logits: f32[V], k', v')`
//! tokens sit at positions `start..start+T`; their keys/values are written there; `last`
//! picks the row whose logits are returned (the last real token of a padded prompt).
//! Callers keep `start + T <= S` (StableHLO clamps out-of-range update offsets).

use crate::config::{Activation, ModelConfig};
use crate::error::Result;
use crate::layout::{Layout, Packing};
use crate::params::layer_prefix;
use crate::rope::RopeTable;
use hlo_emit::{Cmp, Context, DotDims, ElementType::*, Func, Global, Module, Value};
use std::cell::RefCell;
use std::collections::{BTreeSet, HashMap};

/// Static sizes a module is compiled for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GraphShape {
    /// KV cache capacity S (positions).
    pub capacity: usize,
    /// Prompt bucket T of `prefill`.
    pub prefill: usize,
}

/// Parameter scope name the globals are bound to.
pub const SCOPE: &str = "model";

pub fn kv_cache_shape(cfg: &ModelConfig, capacity: usize) -> [usize; 4] {
    [cfg.num_layers(), cfg.kv_heads, capacity, cfg.head_dim]
}

/// The two entry points, emitted from one step body.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Function {
    /// `T` = the prompt bucket.
    Prefill,
    /// `T` = 1.
    Decode,
}

impl Function {
    pub fn name(self) -> &'static str {
        match self {
            Function::Prefill => "prefill",
            Function::Decode => "decode",
        }
    }

    fn tokens(self, shape: GraphShape) -> usize {
        match self {
            Function::Prefill => shape.prefill,
            Function::Decode => 1,
        }
    }
}

/// Emits the module text: globals for every parameter, then `prefill` and `decode`.
pub fn emit(cfg: &ModelConfig, layout: &Layout, shape: GraphShape) -> Result<String> {
    emit_functions(cfg, layout, shape, &[Function::Prefill, Function::Decode], None)
}

/// Emits only `functions`, in a module named `module_name` when given (modules loaded
/// side by side in one session need distinct names; they share the parameter scope).
pub fn emit_functions(
    cfg: &ModelConfig,
    layout: &Layout,
    shape: GraphShape,
    functions: &[Function],
    module_name: Option<&str>,
) -> Result<String> {
    if shape.prefill == 0 || shape.prefill > shape.capacity {
        return Err(crate::Error::Invalid(format!(
            "prefill bucket {} must be in 1..={} (the cache capacity)",
            shape.prefill, shape.capacity
        )));
    }
    let ctx = Context::new();
    let m = match module_name {
        Some(name) => Module::named(&ctx, name)?,
        None => Module::new(&ctx),
    };
    let mut globals = HashMap::new();
    for (i, p) in layout.device_params(cfg).iter().enumerate() {
        let dims: Vec<i64> = p.dims.iter().map(|d| *d as i64).collect();
        globals.insert(p.global.clone(), m.global_param(&format!("p{i}"), SCOPE, &p.key, &p.elem.tensor(&dims))?);
    }
    let cache: Vec<i64> = kv_cache_shape(cfg, shape.capacity).iter().map(|d| *d as i64).collect();
    let entries = RefCell::new(BTreeSet::new());
    for function in functions {
        let (name, t) = (function.name(), function.tokens(shape));
        let inputs = [I32.tensor(&[t as i64]), I32.scalar(), I32.scalar(), F32.tensor(&cache), F32.tensor(&cache)];
        m.func(name, &inputs, |f, a| {
            let step = Step {
                f,
                cfg,
                layout,
                globals: &globals,
                entries: &entries,
                merged_out: RefCell::new(HashMap::new()),
                t: t as i64,
                s: shape.capacity as i64,
            };
            step.emit(a[0], a[1], a[2], a[3], a[4]).map_err(|e| match e {
                crate::Error::Graph(g) => g,
                other => hlo_emit::Error::Mlir { what: "decoder step".into(), detail: other.to_string() },
            })
        })?;
    }
    if let Some(object) = layout.kernel_object() {
        let entries: Vec<_> = entries.into_inner().into_iter().collect();
        if !entries.is_empty() {
            m.append_source(kernels::cpu::EXECUTABLE, &kernels::cpu::executable_source(object, &entries))?;
        }
    }
    Ok(m.to_text())
}

struct Step<'a, 'c, 'b> {
    f: &'a Func<'c, 'b>,
    cfg: &'a ModelConfig,
    layout: &'a Layout,
    globals: &'a HashMap<String, Global>,
    /// Kernel entry points the functions dispatch (declared once, after emission).
    entries: &'a RefCell<BTreeSet<kernels::cpu::Entry>>,
    /// Outputs of merged projections already computed in this function.
    merged_out: RefCell<HashMap<String, V<'c, 'b>>>,
    t: i64,
    s: i64,
}

type V<'c, 'b> = Value<'c, 'b>;
type R<T> = std::result::Result<T, hlo_emit::Error>;

impl<'a, 'c, 'b> Step<'a, 'c, 'b> {
    fn global(&self, key: &str) -> R<&'a Global> {
        self.globals
            .get(key)
            .ok_or_else(|| hlo_emit::Error::Mlir { what: "parameter".into(), detail: format!("no global for {key}") })
    }

    /// A parameter as f32: reduced-precision matrices are widened where they are used, so
    /// IREE can fold the conversion into the contraction that reads them.
    fn param(&self, key: &str) -> R<V<'c, 'b>> {
        let v = self.f.load(self.global(key)?)?;
        if v.elem() == F32 { Ok(v) } else { self.f.convert(v, F32) }
    }

    /// `x [T, in]` through the linear layer `prefix`: `W · xᵀ` with the weight on the
    /// left (BRIEF 4), then back to `[T, out]`.
    fn linear(&self, x: V<'c, 'b>, prefix: &str, bias: bool) -> R<V<'c, 'b>> {
        let f = self.f;
        let y = match self.layout.packing(prefix) {
            Some(p) => self.packed_linear(x, prefix, p)?,
            None => {
                let w = self.param(&format!("{prefix}.weight"))?;
                f.transpose(f.dot_general(w, x, DotDims::contract(&[1], &[1]))?, &[1, 0])?
            }
        };
        if bias {
            let b = self.param(&format!("{prefix}.bias"))?;
            return f.add(y, f.broadcast_in_dim(b, &y.shape(), &[1])?);
        }
        Ok(y)
    }

    /// `x [T, in]` through a packed matrix, with the dequantization inside the contraction:
    /// `y[t,o] = sx[t] Σ_g s[o,g] Σ_k q[o,g,k] xq[t,g,k] + Σ_g b[o,g] Σ_k x[t,g,k]`, where
    /// `q` are the signed packed values, `xq = round(x / sx)` is `x` quantized to i16 per row
    /// (15 bits of the row's largest magnitude) and `b` the biases with the offset folded in.
    /// The integer contraction over each group reads the packed weight directly (one
    /// `batch_matmul ... i16xi4xi32` dispatch); scales and biases apply once per group.
    fn packed_linear(&self, x: V<'c, 'b>, prefix: &str, p: &Packing) -> R<V<'c, 'b>> {
        if let Some((merged, first, rows)) = self.layout.merged(prefix) {
            // One dispatch for all parts (they read this same `x`), computed at the first
            // part's use; each part is a column slice of it.
            let cached = self.merged_out.borrow().get(merged).copied();
            let all = match cached {
                Some(v) => v,
                None => {
                    let v = self.kernel_dispatch(kernels::cpu::Op::Matvec, x, merged, p)?;
                    self.merged_out.borrow_mut().insert(merged.to_owned(), v);
                    v
                }
            };
            return self.f.slice_dim(all, 1, first as i64, (first + rows) as i64);
        }
        if p.kernel {
            return self.kernel_dispatch(kernels::cpu::Op::Matvec, x, prefix, p);
        }
        let f = self.f;
        let w = f.load(self.global(&format!("{prefix}.weight"))?)?;
        let (t, k) = (x.shape()[0], x.shape()[1]);
        let (o, gs) = (w.shape()[0], p.group_size as i64);
        let g = k / gs;
        let w = f.convert(f.reshape(w, &[o, g, gs])?, I16)?;

        const I16_MAX: f64 = 32767.0;
        let amax = f.max(f.reduce_max(f.abs(x)?, &[1])?, f.splat(1e-30, &F32.tensor(&[t]))?)?;
        let inv = f.div(f.splat(I16_MAX, &F32.tensor(&[t]))?, amax)?;
        let xq = f.round_nearest_even(f.mul(x, f.broadcast_in_dim(inv, &[t, k], &[0])?)?)?;
        let xq = f.transpose(f.reshape(f.convert(xq, I16)?, &[t, g, gs])?, &[1, 0, 2])?;
        // [G, T, O] integer dot products per group.
        let acc = f.convert(f.dot_general_to(xq, w, DotDims::contract(&[2], &[2]).batch(&[0], &[1]), I32)?, F32)?;

        let full = [g, t, o];
        let scales = f.transpose(self.param(&format!("{prefix}.scales"))?, &[1, 0])?;
        let biases = f.transpose(self.param(&format!("{prefix}.biases"))?, &[1, 0])?;
        let sx = f.mul_scalar(amax, 1.0 / I16_MAX)?;
        let xsum = f.transpose(f.reduce_sum(f.reshape(x, &[t, g, gs])?, &[2])?, &[1, 0])?;
        let scaled =
            f.mul(f.mul(acc, f.broadcast_in_dim(scales, &full, &[0, 2])?)?, f.broadcast_in_dim(sx, &full, &[1])?)?;
        let offset = f.mul(f.broadcast_in_dim(biases, &full, &[0, 2])?, f.broadcast_in_dim(xsum, &full, &[0, 1])?)?;
        f.reduce_sum(f.add(scaled, offset)?, &[0])
    }

    /// A packed matrix through the hand-written CPU kernel: the matvec `x [T, in] -> [T, out]`
    /// or the lookup of rows `x` (i32 ids `[T]`) -> `[T, in]`, both f32 and exact.
    fn kernel_dispatch(&self, op: kernels::cpu::Op, x: V<'c, 'b>, prefix: &str, p: &Packing) -> R<V<'c, 'b>> {
        let f = self.f;
        let (w, s, b) = (
            f.load(self.global(&format!("{prefix}.weight"))?)?,
            f.load(self.global(&format!("{prefix}.scales"))?)?,
            f.load(self.global(&format!("{prefix}.biases"))?)?,
        );
        let blocks = w.shape()[0];
        let out = blocks * kernels::cpu::BLOCK_ROWS as i64;
        let inp = s.shape()[1] / kernels::cpu::BLOCK_ROWS as i64 * p.group_size as i64;
        let t = x.shape()[0];
        let (workload, result) = match op {
            kernels::cpu::Op::Matvec => (blocks, [t, out]),
            kernels::cpu::Op::Rows => (t, [t, inp]),
        };
        let dims = [t, inp, out, p.group_size as i64].map(|d| d as i32);
        let entry = kernels::cpu::Entry { op, bits: p.bits, scale: p.kernel_scale() };
        self.entries.borrow_mut().insert(entry);
        let export = kernels::cpu::export(op, p.bits, p.kernel_scale());
        f.dispatch(kernels::cpu::EXECUTABLE, &export, workload, &dims, &[x, w, s, b], F32.tensor(&result))
    }

    /// Rows `tokens` of the embedding table as f32 `[T, hidden]`: gathered in the table's
    /// own type, then widened (dense) or dequantized (packed) for those rows only.
    fn embed(&self, tokens: V<'c, 'b>) -> R<V<'c, 'b>> {
        let f = self.f;
        const PREFIX: &str = crate::layout::EMBEDDING;
        let Some(p) = self.layout.packing(PREFIX) else {
            let rows = f.gather_rows(f.load(self.global(&format!("{PREFIX}.weight"))?)?, tokens)?;
            return if rows.elem() == F32 { Ok(rows) } else { f.convert(rows, F32) };
        };
        if p.kernel {
            return self.kernel_dispatch(kernels::cpu::Op::Rows, tokens, PREFIX, p);
        }
        let (t, d) = (self.t, self.cfg.hidden as i64);
        let q = if p.weight_elem() == I4 {
            // Gather the rows' bytes, then split each into its two signed nibbles (element
            // 2j in the low one), interleaved back to [T, d].
            let bytes = f.gather_rows(f.load(self.global(&format!("{PREFIX}.weight.rows"))?)?, tokens)?;
            let four = f.splat(4.0, &I8.tensor(&[t, d / 2]))?;
            let low = f.shift_right_arithmetic(f.shift_left(bytes, four)?, four)?;
            let high = f.shift_right_arithmetic(bytes, four)?;
            let pair = |v| f.reshape(v, &[t, d / 2, 1]);
            f.reshape(f.concatenate(&[pair(low)?, pair(high)?], 2)?, &[t, d])?
        } else {
            f.gather_rows(f.load(self.global(&format!("{PREFIX}.weight"))?)?, tokens)?
        };
        let gs = p.group_size as i64;
        let grouped = [t, d / gs, gs];
        let gather = |name: &str| -> R<V<'c, 'b>> {
            let table = f.load(self.global(&format!("{PREFIX}.{name}"))?)?;
            let v = f.convert(f.gather_rows(table, tokens)?, F32)?;
            f.broadcast_in_dim(v, &grouped, &[0, 1])
        };
        let q = f.reshape(f.convert(q, F32)?, &grouped)?;
        f.reshape(f.add(f.mul(q, gather("scales")?)?, gather("biases")?)?, &[t, d])
    }

    fn norm(&self, x: V<'c, 'b>, key: &str) -> R<V<'c, 'b>> {
        let mut w = self.param(key)?;
        if self.cfg.norm_plus_one {
            w = self.f.add_scalar(w, 1.0)?;
        }
        self.f.rms_norm(x, w, self.cfg.rms_eps)
    }

    /// Rotates `x [T, heads, hd]` by the positions' angles (MLX's non-traditional layout:
    /// the first and second halves of each head form the pairs). Written as one elementwise
    /// expression, `x * cos + [-x2, x1] * sin` with the swap as a `reverse` of the two
    /// halves, so it fuses into one dispatch (a `concatenate` became copies of its own).
    fn rope(&self, x: V<'c, 'b>, cos: V<'c, 'b>, sin: V<'c, 'b>) -> R<V<'c, 'b>> {
        let f = self.f;
        let shape = x.shape();
        let half = shape[2] / 2;
        let split = [shape[0], shape[1], 2, half];
        let x = f.reshape(x, &split)?;
        let swapped = f.reverse(x, &[2])?;
        // [-1, 1] along the halves: the first half of the swapped value is -x2.
        let sign = f.broadcast_in_dim(f.constant_f32(&[-1.0, 1.0], &[2])?, &split, &[2])?;
        let c = f.broadcast_in_dim(cos, &split, &[0, 3])?;
        let s = f.broadcast_in_dim(sin, &split, &[0, 3])?;
        let out = f.add(f.mul(x, c)?, f.mul(f.mul(swapped, sign)?, s)?)?;
        f.reshape(out, &shape)
    }

    fn rope_tables(&self, pos_f: V<'c, 'b>, table: &RopeTable) -> R<(V<'c, 'b>, V<'c, 'b>)> {
        let f = self.f;
        let half = table.inv_freq.len() as i64;
        let inv = f.constant_f32(&table.inv_freq, &[half])?;
        let p = f.mul_scalar(pos_f, table.position_scale as f64)?;
        let ang =
            f.mul(f.broadcast_in_dim(p, &[self.t, half], &[0])?, f.broadcast_in_dim(inv, &[self.t, half], &[1])?)?;
        Ok((f.cos(ang)?, f.sin(ang)?))
    }

    fn emit(
        &self,
        tokens: V<'c, 'b>,
        start: V<'c, 'b>,
        last: V<'c, 'b>,
        mut kc: V<'c, 'b>,
        mut vc: V<'c, 'b>,
    ) -> crate::Result<Vec<V<'c, 'b>>> {
        let (f, cfg, t, s) = (self.f, self.cfg, self.t, self.s);
        let (h, k, hd) = (cfg.heads as i64, cfg.kv_heads as i64, cfg.head_dim as i64);
        let g = h / k;

        let mut x = self.embed(tokens)?;
        if let Some(scale) = cfg.embed_scale {
            x = f.mul_scalar(x, scale as f64)?;
        }

        // Absolute positions of the T rows, and the causal mask over the S cache slots.
        let pos = f.add(f.iota(&I32.tensor(&[t]), 0)?, f.broadcast_in_dim(start, &[t], &[])?)?;
        let pos_f = f.convert(pos, F32)?;
        let kpos = f.iota(&I32.tensor(&[t, s]), 1)?;
        let qpos = f.broadcast_in_dim(pos, &[t, s], &[0])?;
        let causal = f.compare(kpos, qpos, Cmp::Le)?;
        let mut masks: HashMap<Option<usize>, V<'c, 'b>> = HashMap::new();
        let mut ropes: HashMap<String, (V<'c, 'b>, V<'c, 'b>)> = HashMap::new();
        let neg = f.splat(f32::MIN as f64, &F32.tensor(&[k, g, t, s]))?;
        let zero = f.scalar(0.0, I32)?;

        for (l, layer) in cfg.layers.iter().enumerate() {
            let p = layer_prefix(l);
            let mask = match masks.get(&layer.sliding_window) {
                Some(m) => *m,
                None => {
                    let m = match layer.sliding_window {
                        None => causal,
                        // Key j is visible from query i when i - W < j.
                        Some(w) => {
                            let recent =
                                f.compare(f.add(kpos, f.splat(w as f64, &I32.tensor(&[t, s]))?)?, qpos, Cmp::Gt)?;
                            f.and(causal, recent)?
                        }
                    };
                    masks.insert(layer.sliding_window, m);
                    m
                }
            };
            let table = RopeTable::new(layer, cfg.head_dim);
            let rope_key = format!("{:?}", table);
            let (cos, sin) = match ropes.get(&rope_key) {
                Some(cs) => *cs,
                None => {
                    let cs = self.rope_tables(pos_f, &table)?;
                    ropes.insert(rope_key, cs);
                    cs
                }
            };

            let hn = self.norm(x, &format!("{p}.input_layernorm.weight"))?;
            let q = f.reshape(self.linear(hn, &format!("{p}.self_attn.q_proj"), cfg.qkv_bias)?, &[t, h, hd])?;
            let kk = f.reshape(self.linear(hn, &format!("{p}.self_attn.k_proj"), cfg.qkv_bias)?, &[t, k, hd])?;
            let vv = f.reshape(self.linear(hn, &format!("{p}.self_attn.v_proj"), cfg.qkv_bias)?, &[t, k, hd])?;
            let (q, kk) = if cfg.qk_norm {
                (
                    self.norm(q, &format!("{p}.self_attn.q_norm.weight"))?,
                    self.norm(kk, &format!("{p}.self_attn.k_norm.weight"))?,
                )
            } else {
                (q, kk)
            };
            let q = self.rope(q, cos, sin)?;
            let kk = self.rope(kk, cos, sin)?;

            // Write this step's keys/values into layer l of the cache at `start`.
            let lidx = f.scalar(l as f64, I32)?;
            let as_cache = |x: V<'c, 'b>| -> R<V<'c, 'b>> { f.reshape(f.transpose(x, &[1, 0, 2])?, &[1, k, t, hd]) };
            kc = f.dynamic_update_slice(kc, as_cache(kk)?, &[lidx, zero, start, zero])?;
            vc = f.dynamic_update_slice(vc, as_cache(vv)?, &[lidx, zero, start, zero])?;
            let kl = f.reshape(f.slice_dim(kc, 0, l as i64, l as i64 + 1)?, &[k, s, hd])?;
            let vl = f.reshape(f.slice_dim(vc, 0, l as i64, l as i64 + 1)?, &[k, s, hd])?;

            // Grouped-query attention: head n = kv * G + r attends with kv head `kv`.
            let qh = f.reshape(f.transpose(f.reshape(q, &[t, k, g, hd])?, &[1, 2, 0, 3])?, &[k, g * t, hd])?;
            let mut scores = f.dot_general(qh, kl, DotDims::contract(&[2], &[2]).batch(&[0], &[0]))?;
            scores = f.mul_scalar(scores, cfg.attn_scale)?;
            if let Some(cap) = cfg.attn_softcap {
                scores = f.mul_scalar(f.tanh(f.mul_scalar(scores, 1.0 / cap)?)?, cap)?;
            }
            let scores = f.reshape(scores, &[k, g, t, s])?;
            let scores = f.select(f.broadcast_in_dim(mask, &[k, g, t, s], &[2, 3])?, scores, neg)?;
            let probs = f.reshape(f.softmax(scores)?, &[k, g * t, s])?;
            let o = f.dot_general(probs, vl, DotDims::contract(&[2], &[1]).batch(&[0], &[0]))?;
            let o = f.reshape(f.transpose(f.reshape(o, &[k, g, t, hd])?, &[2, 0, 1, 3])?, &[t, h * hd])?;
            let mut a = self.linear(o, &format!("{p}.self_attn.o_proj"), cfg.o_bias)?;
            if cfg.sandwich_norms {
                a = self.norm(a, &format!("{p}.post_attention_layernorm.weight"))?;
            }
            x = f.add(x, a)?;

            let pre_mlp = if cfg.sandwich_norms { "pre_feedforward_layernorm" } else { "post_attention_layernorm" };
            let hn = self.norm(x, &format!("{p}.{pre_mlp}.weight"))?;
            let gate = self.linear(hn, &format!("{p}.mlp.gate_proj"), cfg.mlp_bias)?;
            let up = self.linear(hn, &format!("{p}.mlp.up_proj"), cfg.mlp_bias)?;
            let act = self.activation(gate)?;
            let mut mo = self.linear(f.mul(act, up)?, &format!("{p}.mlp.down_proj"), cfg.mlp_bias)?;
            if cfg.sandwich_norms {
                mo = self.norm(mo, &format!("{p}.post_feedforward_layernorm.weight"))?;
            }
            x = f.add(x, mo)?;
        }

        let x = self.norm(x, "model.norm.weight")?;
        let row = f.dynamic_slice(x, &[last, zero], &[1, cfg.hidden as i64])?;
        let head = if cfg.tie_embeddings { "model.embed_tokens" } else { "lm_head" };
        let mut logits = f.reshape(self.linear(row, head, false)?, &[cfg.vocab as i64])?;
        if let Some(cap) = cfg.final_softcap {
            logits = f.mul_scalar(f.tanh(f.mul_scalar(logits, 1.0 / cap)?)?, cap)?;
        }
        let next = f.reshape(f.argmax(logits, 0)?, &[1])?;
        Ok(vec![next, logits, kc, vc])
    }

    fn activation(&self, x: V<'c, 'b>) -> R<V<'c, 'b>> {
        let f = self.f;
        match self.cfg.activation {
            Activation::Silu => f.mul(x, f.logistic(x)?),
            Activation::GeluErf => {
                let e = f.erf(f.mul_scalar(x, std::f64::consts::FRAC_1_SQRT_2)?)?;
                f.mul_scalar(f.mul(x, f.add_scalar(e, 1.0)?)?, 0.5)
            }
            Activation::GeluTanh => {
                let x3 = f.mul(f.mul(x, x)?, x)?;
                let inner =
                    f.mul_scalar(f.add(x, f.mul_scalar(x3, 0.044715)?)?, (2.0 / std::f64::consts::PI).sqrt())?;
                f.mul_scalar(f.mul(x, f.add_scalar(f.tanh(inner)?, 1.0)?)?, 0.5)
            }
        }
    }
}
