//! Feed-forward blocks: the gated MLP and the mixture of experts (router, chosen experts
//! through the CPU kernel's `qmve` or gathered in the graph, Qwen2-MoE's shared expert).

use super::layer::{MlpPlan, MoePlan};
use super::{R, Step, V};
use crate::backend::ExpertProducts;
use crate::config::{Activation, Routing};
use crate::layout::Form;
use crate::layout::Packing;
use hlo_emit::{Cmp, DotDims, ElementType::*};

/// gpt-oss's clamped SwiGLU (mlx-lm's `swiglu_oai` defaults).
const SWIGLU_ALPHA: f64 = 1.702;
const SWIGLU_LIMIT: f64 = 7.0;

impl<'c, 'b> Step<'_, 'c, 'b> {
    /// The mixture-of-experts block under `block` (`model.layers.0.mlp`) on `x [T, d]`, as
    /// mlx-lm's sparse MoE blocks compute it: the router's logits, the top `k` experts of each
    /// row with their weights (softmax then top k, or top k then softmax), each chosen
    /// expert's SwiGLU, their weighted sum, plus Qwen2-MoE's gated shared expert.
    ///
    /// A step of few rows (`T * k` below the experts: decode) gathers the chosen experts'
    /// matrices and runs one matrix-vector product per (row, choice), so it reads only those
    /// experts' weights; a prompt chunk runs every expert on every row (each expert's
    /// weights read once) and weighs the unchosen ones by zero.
    ///
    /// The router reads `routed` (Gemma 4's: the layer's input before the experts' own norm),
    /// the experts `x`.
    pub(super) fn moe(&self, x: V<'c, 'b>, routed: V<'c, 'b>, moe: &MoePlan<'_>) -> R<V<'c, 'b>> {
        let (names, moe) = (&moe.names, moe.config);
        let f = self.f;
        let (t, d) = (x.shape()[0], x.shape()[1]);
        let (k, e) = (moe.top_k as i64, moe.experts as i64);
        let router_input = match moe.routing {
            // mlx-lm's gemma4 Router: rms_norm(x, scale * hidden^-0.5).
            Routing::ScaledTopKSoftmax => {
                let w = f.mul_scalar(self.param(&names.router_scale())?, (d as f64).powf(-0.5))?;
                f.rms_norm(routed, w, self.cfg.rms_eps)?
            }
            _ => routed,
        };
        let logits = self.linear(router_input, &names.router(), moe.biased)?;
        let (scores, chosen) = match moe.routing {
            Routing::SoftmaxTopK { normalize } => {
                let (v, i) = f.top_k(f.softmax(logits)?, moe.top_k)?;
                if normalize {
                    (f.div(v, f.broadcast_in_dim(f.reduce_sum(v, &[1])?, &[t, k], &[0])?)?, i)
                } else {
                    (v, i)
                }
            }
            Routing::TopKSoftmax => {
                let (v, i) = f.top_k(logits, moe.top_k)?;
                (f.softmax(v)?, i)
            }
            Routing::Grouped { groups, top_groups, scale, normalize } => {
                self.grouped_routing(logits, &names.router_bias(), moe.top_k, groups, top_groups, scale, normalize)?
            }
            Routing::ScaledTopKSoftmax => {
                let (v, i) = f.top_k(logits, moe.top_k)?;
                // Each chosen expert's `per_expert_scale`, gathered by its index.
                let per_expert = f.reshape(self.param(&names.per_expert_scale())?, &[e, 1])?;
                let scale = f.reshape(f.gather_rows(per_expert, f.reshape(i, &[t * k])?)?, &[t, k])?;
                (f.mul(f.softmax(v)?, scale)?, i)
            }
        };
        let experts = |name: &str| names.experts(name);
        let in_kernel = |name: &str| self.layout.form(&experts(name)).is_some_and(|f| f.in_cpu_kernel());
        let mut y = if t * k < e || ["gate_proj", "up_proj", "down_proj"].iter().any(|n| in_kernel(n)) {
            // One row per (row, choice), each against its expert: the CPU kernel's `qmve` on
            // its packed blocks (by pair for a few pairs, by expert for many), else the
            // gathered matrices [n, out, in] · [n, in] -> [n, out] (few pairs only).
            let n = t * k;
            let chosen = f.reshape(chosen, &[n])?;
            let rows = f.reshape(f.broadcast_in_dim(x, &[t, k, d], &[0, 2])?, &[n, d])?;
            let apply = |name: &str, h: V<'c, 'b>| -> R<V<'c, 'b>> {
                let y = match self.layout.form(&experts(name)) {
                    Some(Form::CpuPacked(p)) => self.expert_dispatch(h, chosen, &experts(name), &p, n >= e)?,
                    _ => self.chosen_experts(&experts(name), chosen, h)?,
                };
                if !moe.biased {
                    return Ok(y);
                }
                // gpt-oss: each pair's expert's bias.
                f.add(y, f.gather_rows(self.param(&crate::names::bias(&experts(name)))?, chosen)?)
            };
            let hidden = self.times_up(self.activation(apply("gate_proj", rows)?)?, apply("up_proj", rows)?)?;
            let out = f.reshape(apply("down_proj", hidden)?, &[t, k, d])?;
            f.reduce_sum(f.mul(out, f.broadcast_in_dim(scores, &[t, k, d], &[0, 1])?)?, &[1])?
        } else {
            // [E, I, d] · [T, d] -> [E, I, T]; then [E, d, I] · [E, I, T] -> [E, d, T].
            // gpt-oss: each expert's bias `[E, out]` on each of its rows' outputs `[E, out, T]`.
            let biased = |name: &str, y: V<'c, 'b>| -> R<V<'c, 'b>> {
                if !moe.biased {
                    return Ok(y);
                }
                let b = self.param(&crate::names::bias(&experts(name)))?;
                f.add(y, f.broadcast_in_dim(b, &y.shape(), &[0, 1])?)
            };
            let up_side = |name: &str| {
                let y = f.dot_general(self.expert_weights(&experts(name), None)?, x, DotDims::contract(&[2], &[1]))?;
                biased(name, y)
            };
            let hidden = self.times_up(self.activation(up_side("gate_proj")?)?, up_side("up_proj")?)?;
            let down = self.expert_weights(&experts("down_proj"), None)?;
            let out = f.dot_general(down, hidden, DotDims::contract(&[2], &[1]).batch(&[0], &[0]))?;
            let out = biased("down_proj", out)?;
            // Each row's weight of each expert [T, E]: its score where chosen, else 0.
            let column = f.iota(&I32.tensor(&[t, e]), 1)?;
            let mut weights = f.splat(0.0, &F32.tensor(&[t, e]))?;
            for j in 0..k {
                let pick =
                    |v: V<'c, 'b>| f.broadcast_in_dim(f.reshape(f.slice_dim(v, 1, j, j + 1)?, &[t])?, &[t, e], &[0]);
                let here = f.compare(column, pick(chosen)?, Cmp::Eq)?;
                weights = f.add(weights, f.select(here, pick(scores)?, f.splat(0.0, &F32.tensor(&[t, e]))?)?)?;
            }
            // [T, E] · [E, d, T] -> [T, d], batched over the rows.
            f.dot_general(weights, out, DotDims::contract(&[1], &[0]).batch(&[0], &[2]))?
        };
        if let Some(shared) = &moe.shared_expert {
            let part = |p: &str| names.shared_expert(shared, p);
            let hidden = self.times_up(
                self.activation(self.linear(x, &part("gate_proj"), false)?)?,
                self.linear(x, &part("up_proj"), false)?,
            )?;
            let out = self.linear(hidden, &part("down_proj"), false)?;
            let out = if shared.gated {
                let g = f.logistic(self.linear(x, &names.shared_expert_gate(), false)?)?;
                f.mul(f.broadcast_in_dim(f.reshape(g, &[t])?, &[t, d], &[0])?, out)?
            } else {
                out
            };
            y = f.add(y, out)?;
        }
        Ok(y)
    }

    /// mlx-lm's `group_expert_select` on the router's `logits [T, E]`: each row's chosen
    /// experts `[T, k]` (i32) and their weights `[T, k]` ([`Routing::Grouped`]). The scores are
    /// `sigmoid(logits)`; the experts are chosen by the scores plus `bias` (the router's
    /// `e_score_correction_bias`), with every expert outside the `top_groups` best groups
    /// (a group's worth: the sum of its two best) set to 0, as mlx-lm does, not to -inf.
    #[allow(clippy::too_many_arguments)]
    fn grouped_routing(
        &self,
        logits: V<'c, 'b>,
        bias: &str,
        k: usize,
        groups: usize,
        top_groups: usize,
        scale: f32,
        normalize: bool,
    ) -> R<(V<'c, 'b>, V<'c, 'b>)> {
        let f = self.f;
        let (t, e) = (logits.shape()[0], logits.shape()[1]);
        let scores = f.logistic(logits)?;
        let bias = f.load(self.global(bias)?)?;
        let mut choice = f.add(scores, f.broadcast_in_dim(bias, &[t, e], &[1])?)?;
        if groups > 1 {
            let (g, per) = (groups as i64, e / groups as i64);
            let by_group = f.reshape(choice, &[t * g, per])?;
            let (best, _) = f.top_k(by_group, 2)?;
            let worth = f.reshape(f.reduce_sum(best, &[1])?, &[t, g])?;
            let (_, kept) = f.top_k(worth, top_groups)?;
            // A group is kept when it is one of the row's `top_groups` best.
            let group = f.iota(&I32.tensor(&[t, g]), 1)?;
            let mut keep =
                f.compare(group, f.broadcast_in_dim(f.slice_dim(kept, 1, 0, 1)?, &[t, g], &[0, 1])?, Cmp::Eq)?;
            for j in 1..top_groups as i64 {
                let pick = f.broadcast_in_dim(f.slice_dim(kept, 1, j, j + 1)?, &[t, g], &[0, 1])?;
                keep = f.or(keep, f.compare(group, pick, Cmp::Eq)?)?;
            }
            let keep = f.broadcast_in_dim(keep, &[t, g, per], &[0, 1])?;
            let zero = f.splat(0.0, &F32.tensor(&[t, g, per]))?;
            choice = f.reshape(f.select(keep, f.reshape(choice, &[t, g, per])?, zero)?, &[t, e])?;
        }
        let (_, chosen) = f.top_k(choice, k)?;
        // Each chosen expert's unbiased score: a one-hot sum over the experts (exact).
        let column = f.iota(&I32.tensor(&[t, e]), 1)?;
        let zero = f.splat(0.0, &F32.tensor(&[t, e]))?;
        let mut picked = Vec::with_capacity(k);
        for j in 0..k as i64 {
            let here =
                f.compare(column, f.broadcast_in_dim(f.slice_dim(chosen, 1, j, j + 1)?, &[t, e], &[0, 1])?, Cmp::Eq)?;
            picked.push(f.reshape(f.reduce_sum(f.select(here, scores, zero)?, &[1])?, &[t, 1])?);
        }
        let mut weights = f.concatenate(&picked, 1)?;
        if k > 1 && normalize {
            weights = f.div(weights, f.broadcast_in_dim(f.reduce_sum(weights, &[1])?, &[t, k as i64], &[0])?)?;
        }
        Ok((f.mul_scalar(weights, f64::from(scale))?, chosen))
    }

    /// `x [N, in]` through the stacked experts `prefix` in the CPU kernel's layout, row `n`
    /// against expert `chosen[n]` (`qmve`): `[N, out]`. `by_expert` numbers the workgroups by
    /// expert (each expert's blocks read once for all its rows) instead of by row.
    fn expert_dispatch(
        &self,
        x: V<'c, 'b>,
        chosen: V<'c, 'b>,
        prefix: &str,
        p: &Packing,
        by_expert: bool,
    ) -> R<V<'c, 'b>> {
        let f = self.f;
        let (w, s) = self.packed_globals(prefix)?;
        let (experts, blocks) = (w.shape()[0], w.shape()[1]);
        let out = blocks * kernels::cpu::BLOCK_ROWS as i64;
        let (n, inp) = (x.shape()[0], x.shape()[1]);
        let dims = [n, inp, out, p.group_size as i64, experts, i64::from(by_expert)].map(|d| d as i32);
        let op = kernels::cpu::Op::Experts;
        let entry = p.kernel_entry(op);
        self.linked.borrow_mut().packed.insert(entry);
        let mut args = vec![x, chosen, w, s];
        args.extend(self.kernel_biases(prefix, &entry)?);
        let workload = if by_expert { experts } else { n } * blocks;
        f.dispatch(kernels::cpu::EXECUTABLE, &entry.export(), workload, &dims, &args, F32.tensor(&[n, out]))
    }

    /// `h [N, in]` through expert `chosen[n]` of the stacked experts `prefix`, in the graph
    /// form: the chosen matrices gathered, then one matrix-vector product per row as the
    /// target wants it ([`ExpertProducts`]), `[N, out]`.
    fn chosen_experts(&self, prefix: &str, chosen: V<'c, 'b>, h: V<'c, 'b>) -> R<V<'c, 'b>> {
        let f = self.f;
        let w = self.expert_weights(prefix, Some(chosen))?;
        match self.options.expert_products {
            ExpertProducts::Contraction => f.dot_general(w, h, DotDims::contract(&[2], &[1]).batch(&[0], &[0])),
            ExpertProducts::Reduction => {
                let products = f.mul(w, f.broadcast_in_dim(h, &w.shape(), &[0, 2])?)?;
                f.reduce_sum(products, &[2])
            }
        }
    }

    /// Stacked expert weights `prefix` as f32 `[N, out, in]`: the experts `chosen` (i32
    /// `[N]`) gathered first, else all of them; widened (dense) or dequantized (packed:
    /// MLX's values from the low bits of each byte up, `q * scale + bias` per group; mxfp8's
    /// codes as `Step::mxfp8_decode` widens them) after the gather, so only the gathered
    /// experts are converted.
    fn expert_weights(&self, prefix: &str, chosen: Option<V<'c, 'b>>) -> R<V<'c, 'b>> {
        let f = self.f;
        let pick = |name: &str| self.global_rows(&format!("{prefix}.{name}"), chosen);
        if self.layout.form(prefix) == Some(Form::GraphMxfp8) {
            return self.mxfp8_decode(pick("weight")?, pick("scales")?);
        }
        let Some(p) = self.layout.packing(prefix) else {
            return self.widen(pick("weight")?);
        };
        let (w, scales, biases) = (pick("weight")?, pick("scales")?, pick("biases")?);
        let (n, o, bytes) = (w.shape()[0], w.shape()[1], w.shape()[2]);
        let (groups, gs) = (scales.shape()[2], p.group_size as i64);
        let int = |v: f64| f.splat(v, &I32.tensor(&[n, o, bytes]));
        let unsigned = f.and(f.convert(w, I32)?, int(255.0)?)?;
        let q = if p.bits == 4 {
            let low = f.and(unsigned, int(15.0)?)?;
            let high = f.shift_right_arithmetic(unsigned, int(4.0)?)?;
            let pair = |v| f.reshape(v, &[n, o, bytes, 1]);
            f.concatenate(&[pair(low)?, pair(high)?], 3)?
        } else {
            unsigned
        };
        let w = self.dequantize(q, scales, biases, &[n, o, groups, gs])?;
        f.reshape(w, &[n, o, groups * gs])
    }

    /// `activation(gate_proj(x)) * up_proj(x)` of the gated MLP `prefix`: one dispatch of the
    /// CUDA kernel's `Glu` where it takes both matrices alike and the activation is SiLU.
    pub(super) fn gated_mlp(&self, x: V<'c, 'b>, mlp: &MlpPlan) -> R<V<'c, 'b>> {
        let (gate, up, bias) = (mlp.gate.as_str(), mlp.up.as_str(), mlp.bias);
        if let Some(y) = self.glu(x, gate, up, bias)? {
            return Ok(y);
        }
        let g = self.linear(x, gate, bias)?;
        let u = self.linear(x, up, bias)?;
        self.times_up(self.activation(g)?, u)
    }

    fn activation(&self, x: V<'c, 'b>) -> R<V<'c, 'b>> {
        let f = self.f;
        match self.cfg.activation {
            Activation::Silu => f.mul(x, f.logistic(x)?),
            Activation::GeluErf => {
                let e = f.erf(f.mul_scalar(x, std::f64::consts::FRAC_1_SQRT_2)?)?;
                f.mul_scalar(f.mul(x, f.add_scalar(e, 1.0)?)?, 0.5)
            }
            Activation::GeluTanh => self.gelu_tanh(x),
            // The clamped gate's `g * sigmoid(1.702 g)`; `times_up` clamps the other half.
            Activation::SwigluOai => {
                let g = f.min(x, f.splat(SWIGLU_LIMIT, &x.ty())?)?;
                f.mul(g, f.logistic(f.mul_scalar(g, SWIGLU_ALPHA)?)?)
            }
        }
    }

    /// The activated gate times the up projection: `up` as it is, or gpt-oss's `clip(up,
    /// -7, 7) + 1`.
    fn times_up(&self, activated: V<'c, 'b>, up: V<'c, 'b>) -> R<V<'c, 'b>> {
        let f = self.f;
        match self.cfg.activation {
            Activation::SwigluOai => {
                let (lo, hi) = (f.splat(-SWIGLU_LIMIT, &up.ty())?, f.splat(SWIGLU_LIMIT, &up.ty())?);
                f.mul(f.add_scalar(f.max(f.min(up, hi)?, lo)?, 1.0)?, activated)
            }
            _ => f.mul(activated, up),
        }
    }

    /// MLX's `gelu_approx`: `0.5 x (1 + tanh(sqrt(2 / pi) (x + 0.044715 x^3)))`.
    pub(super) fn gelu_tanh(&self, x: V<'c, 'b>) -> R<V<'c, 'b>> {
        let f = self.f;
        let x3 = f.mul(f.mul(x, x)?, x)?;
        let inner = f.mul_scalar(f.add(x, f.mul_scalar(x3, 0.044715)?)?, (2.0 / std::f64::consts::PI).sqrt())?;
        f.mul_scalar(f.mul(x, f.add_scalar(f.tanh(inner)?, 1.0)?)?, 0.5)
    }
}
