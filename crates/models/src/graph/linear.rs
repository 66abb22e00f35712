//! Gated DeltaNet layers (Qwen3-Next, Qwen3.5), as mlx-lm 0.32's `GatedDeltaNet` and
//! `gated_delta.py` compute them: in-projections, a causal depthwise convolution over the
//! sequence's last inputs and the new rows, SiLU, L2-normalised q and k (the readout scale
//! folded into q), the decay `g` and the write strength `beta`, the delta-rule update of a
//! `[v_heads, v_dim, k_dim]` matrix per sequence, its readout, a gated RMSNorm and the
//! out-projection. Beside them LFM2's gated short convolutions (mlx-lm's `ShortConv`), which
//! share the causal convolution ([`Step::causal_conv`]).
//!
//! A sequence's state is one row of several f32 buffers, `[slots, len]` each: each
//! recurrent layer's convolution inputs, and a DeltaNet's matrix (`ModelConfig::state_parts`;
//! a layer's plan names its first). A step reads each sequence's rows ([`StateIn`]: zeros
//! where the sequence starts, its first row at position 0, so a reused slot starts fresh)
//! and returns the rows after its own, which `write_state` scatters back. No buffer holds
//! more than one layer's part, so a step never gathers, concatenates or allocates the
//! whole state of its sequences (161 MB for 8 rows of the 0.8B Qwen3.5 shape), only each
//! layer's rows where that layer reads and writes them (docs/PERFORMANCE.md).
//!
//! Within a prompt chunk the update runs as a sequential scan (`stablehlo.while` over the
//! chunk's real rows: the padding rows after `last` never touch the state), in the order
//! mlx-lm's own loop takes, so a prompt gives the same state whatever its chunks. A decode
//! step (one row per sequence) is the same update, batched.
//!
//! Where the layout links the CPU kernels, the update (decode and prompt chunks alike) is
//! one dispatch per layer instead (`kernels::cpu`'s `delta`, `cpu/delta.h`): the same
//! sequential recurrence, each sequence's matrix read once where it lies in its buffer,
//! every row of the call applied to it in registers, and written back in place (the
//! dispatch's result is tied to the buffer argument, so the step returns the buffer itself
//! and `write_state` skips it: [`super::state_in_place`]).

use super::layer::{InProj, LinearPlan, ShortConvPlan};
use super::{R, Step, V};
use hlo_emit::{Cmp, ElementType::*, Func};

/// The L2 normalisation's epsilon in mlx-lm's `normalize_qk`.
const QK_EPS: f64 = 1e-6;

/// The state buffers a step reads (`[slots, len]` each), the step's sequences' slots and
/// which of them start at position 0.
pub(super) struct StateIn<'c, 'b> {
    buffers: Vec<V<'c, 'b>>,
    slots: V<'c, 'b>,
    /// `[R]`: each row's position.
    positions: V<'c, 'b>,
    /// `[n]`: the sequence's first row is at position 0.
    fresh: V<'c, 'b>,
}

impl<'c, 'b> Step<'_, 'c, 'b> {
    /// What the step's sequences read of the state `buffers`.
    pub(super) fn state_in(&self, buffers: &[V<'c, 'b>], slots: V<'c, 'b>, positions: V<'c, 'b>) -> R<StateIn<'c, 'b>> {
        let f = self.f;
        let (n, m) = self.function.split();
        let (n, m) = (n as i64, m as i64);
        let first = f.reshape(f.slice(f.reshape(positions, &[n, m])?, &[0, 0], &[n, 1], &[1, 1])?, &[n])?;
        let fresh = f.compare(first, f.splat(0.0, &I32.tensor(&[n]))?, Cmp::Eq)?;
        Ok(StateIn { buffers: buffers.to_vec(), slots, positions, fresh })
    }

    /// Every sequence's row `[n, len]` of state buffer `part`, read at its slot, zeros for a
    /// sequence whose first row is at position 0.
    fn read_state(&self, state: &StateIn<'c, 'b>, part: usize) -> R<V<'c, 'b>> {
        let f = self.f;
        let read = f.gather_rows(state.buffers[part], state.slots)?;
        let shape = read.shape();
        let fresh = f.broadcast_in_dim(state.fresh, &shape, &[0])?;
        f.select(fresh, f.splat(0.0, &F32.tensor(&shape))?, read)
    }

    /// One gated DeltaNet layer on the normed input `hn [R, d]`, each sequence starting from
    /// its rows of the layer's two state buffers. Returns the heads' gated output
    /// `[R, v_heads * v_dim]` (before `out_proj`) and what becomes of the buffers: the
    /// convolution's last inputs `[n, (kernel - 1) * channels]`, and the matrix, either the
    /// sequences' new rows `[n, v_heads * v_dim * k_dim]` or, where the update runs in the
    /// CPU kernel, the whole buffer updated in place. `last` (a prompt chunk's last real row)
    /// bounds the scan; decode rows are all real.
    pub(super) fn gated_delta(
        &self,
        hn: V<'c, 'b>,
        lin: &LinearPlan<'_>,
        state: &StateIn<'c, 'b>,
        last: Option<V<'c, 'b>>,
    ) -> R<(V<'c, 'b>, Vec<V<'c, 'b>>)> {
        let f = self.f;
        let c = lin.config;
        let (n, m) = self.function.split();
        let (n, m) = (n as i64, m as i64);
        let r = n * m;
        let (nk, nv, dk, dv) = (c.k_heads as i64, c.v_heads as i64, c.k_dim as i64, c.v_dim as i64);
        let (keys, values, channels, width) = (nk * dk, nv * dv, c.conv_dim() as i64, c.conv_kernel as i64);

        // In-projections: q, k, v (the convolution's channels, in that order), z, b, a.
        let (qkv, z, b, a) = match &lin.in_proj {
            InProj::Split { qkv, z, b, a } => (
                self.linear(hn, qkv, false)?,
                self.linear(hn, z, false)?,
                self.linear(hn, b, false)?,
                self.linear(hn, a, false)?,
            ),
            InProj::Fused { qkvz, ba } => {
                // Grouped by key head: per key head its q, k, then its value heads' v and z
                // (mlx-lm's `fix_query_key_value_ordering`).
                let per = nv / nk;
                let group = 2 * dk + 2 * per * dv;
                let all = f.reshape(self.linear(hn, qkvz, false)?, &[r, nk, group])?;
                let part = |from: i64, to: i64, flat: i64| -> R<V<'c, 'b>> {
                    f.reshape(f.slice(all, &[0, 0, from], &[r, nk, to], &[1; 3])?, &[r, flat])
                };
                let (q, k) = (part(0, dk, keys)?, part(dk, 2 * dk, keys)?);
                let (v, z) = (part(2 * dk, 2 * dk + per * dv, values)?, part(2 * dk + per * dv, group, values)?);
                let ba = f.reshape(self.linear(hn, ba, false)?, &[r, nk, 2 * per])?;
                let b = f.reshape(f.slice(ba, &[0, 0, 0], &[r, nk, per], &[1; 3])?, &[r, nv])?;
                let a = f.reshape(f.slice(ba, &[0, 0, per], &[r, nk, 2 * per], &[1; 3])?, &[r, nv])?;
                (f.concatenate(&[q, k, v], 1)?, z, b, a)
            }
        };

        // Each sequence's rows of this layer's state buffers (the matrix's where the graph
        // updates it; the kernel reads it where it lies).
        let (conv_len, matrix_len) = (c.conv_state_len() as i64, c.matrix_len() as i64);
        let conv_state = f.reshape(self.read_state(state, lin.state)?, &[n, width - 1, channels])?;
        let kernel = super::delta_in_kernel(c, self.layout);
        let matrix =
            if kernel { None } else { Some(f.reshape(self.read_state(state, lin.state + 1)?, &[n, nv, dv, dk])?) };

        // The causal depthwise convolution, then SiLU.
        let (conv, next_conv) = self.causal_conv(qkv, conv_state, &lin.conv, last)?;
        let conv = f.reshape(f.mul(conv, f.logistic(conv)?)?, &[r, channels])?;

        // q and k L2-normalised (as an RMSNorm with epsilon scaled to match, mlx-lm's
        // `normalize_qk`), the readout scale `k_dim^-0.5` folded into q; repeated to the
        // value heads.
        let heads = |x: V<'c, 'b>, from: i64, to: i64, h: i64, d: i64| -> R<V<'c, 'b>> {
            f.reshape(f.slice(x, &[0, from], &[r, to], &[1, 1])?, &[r, h, d])
        };
        let inv = (dk as f64).powf(-0.5);
        let ones = f.splat(1.0, &F32.tensor(&[dk]))?;
        let q = f.mul_scalar(f.rms_norm(heads(conv, 0, keys, nk, dk)?, ones, QK_EPS * inv * inv)?, inv * inv)?;
        let k = f.mul_scalar(f.rms_norm(heads(conv, keys, 2 * keys, nk, dk)?, ones, QK_EPS * inv * inv)?, inv)?;
        let v = heads(conv, 2 * keys, channels, nv, dv)?;
        let (q, k) = if nv == nk {
            (q, k)
        } else {
            let repeat =
                |x: V<'c, 'b>| f.reshape(f.broadcast_in_dim(x, &[r, nk, nv / nk, dk], &[0, 1, 3])?, &[r, nv, dk]);
            (repeat(q)?, repeat(k)?)
        };

        // beta = sigmoid(b); g = exp(-exp(A_log) * softplus(a + dt_bias)).
        let beta = f.logistic(b)?;
        let per_head = |key: &str| -> R<V<'c, 'b>> { f.broadcast_in_dim(self.param(key)?, &[r, nv], &[1]) };
        let x = f.add(a, per_head(&lin.dt_bias)?)?;
        // softplus(x) = max(x, 0) + log(1 + exp(-|x|)) (mlx's logaddexp(x, 0)).
        let zero = f.splat(0.0, &F32.tensor(&[r, nv]))?;
        let softplus = f.add(f.max(x, zero)?, f.log(f.add_scalar(f.exp(f.neg(f.abs(x)?)?)?, 1.0)?)?)?;
        let g = f.exp(f.neg(f.mul(f.exp(per_head(&lin.a_log)?)?, softplus)?)?)?;

        let (y, matrix) = if kernel {
            // The CPU kernel: each sequence's rows in order, its slot's matrix updated where
            // it lies (the whole buffer comes back, tied to the argument).
            let last = match last {
                Some(last) => last,
                None => f.splat(0.0, &I32.tensor(&[1]))?,
            };
            let buffer = state.buffers[lin.state + 1];
            let slots = buffer.shape()[0];
            let args = [q, k, v, g, beta, state.positions, state.slots, last, buffer];
            let dims = [n, m, nv, dk, dv, slots].map(|d| d as i32);
            let export = kernels::cpu::DELTA_EXPORT;
            let out = f.dispatch_tied(
                kernels::cpu::EXECUTABLE,
                export,
                n * nv,
                &dims,
                &args,
                &[8],
                F32.tensor(&[r, values]),
            )?;
            self.linked.borrow_mut().delta = true;
            (out[1], out[0])
        } else if let Some(matrix) = matrix {
            let (y, matrix) = match last {
                // Decode: one row per sequence.
                None => delta_step(f, matrix, q, k, v, g, beta)?,
                // A prompt chunk (one sequence): the rows up to `last`, one at a time.
                Some(last) => {
                    let end = f.add(f.reshape(last, &[])?, f.scalar(1.0, I32)?)?;
                    let ys = f.splat(0.0, &F32.tensor(&[m, nv, dv]))?;
                    let matrix = f.reshape(matrix, &[1, nv, dv, dk])?;
                    let init = [f.scalar(0.0, I32)?, matrix, ys, q, k, v, g, beta, end];
                    let out = f.while_loop(
                        &init,
                        |f, c| f.compare(c[0], c[8], Cmp::Lt),
                        |f, c| {
                            let i = c[0];
                            let zero = f.scalar(0.0, I32)?;
                            let row = |x| row_at(f, x, i);
                            let (q, k, v, g, beta) = (row(c[3])?, row(c[4])?, row(c[5])?, row(c[6])?, row(c[7])?);
                            let (y, matrix) = delta_step(f, c[1], q, k, v, g, beta)?;
                            let ys = f.dynamic_update_slice(c[2], y, &[i, zero, zero])?;
                            let next = f.add(i, f.scalar(1.0, I32)?)?;
                            Ok(vec![next, matrix, ys, c[3], c[4], c[5], c[6], c[7], c[8]])
                        },
                    )?;
                    (out[2], out[1])
                }
            };
            (y, matrix)
        } else {
            return Err(hlo_emit::Error::Op {
                op: "gated_delta",
                expected: "the matrix's rows".into(),
                got: "none".into(),
            });
        };

        // The gated RMSNorm: silu(z) * rms_norm(y) per value head.
        let y = self.norm(f.reshape(y, &[r, nv, dv])?, &lin.norm)?;
        let z = f.reshape(z, &[r, nv, dv])?;
        let o = f.mul(f.mul(z, f.logistic(z)?)?, y)?;
        // The kernel's matrix is the buffer itself; the graph's, each sequence's new rows.
        let next_conv = f.reshape(next_conv, &[n, conv_len])?;
        let matrix = if kernel { matrix } else { f.reshape(matrix, &[n, matrix_len])? };
        let next = vec![next_conv, matrix];
        Ok((f.reshape(o, &[r, values])?, next))
    }
}

impl<'c, 'b> Step<'_, 'c, 'b> {
    /// The causal depthwise convolution of `rows` (`[R, C]`: each sequence's rows) over each
    /// sequence's last `width - 1` inputs (`prev`, `[n, width - 1, C]`) and its rows, with the
    /// weight `[C, width, 1]` at `weight`: `out[t] = sum_j w[j] * in[t + j]`, the window
    /// ending at row t. Returns the convolution `[n, m, C]` and the inputs the next call's
    /// convolution reads (`[n, width - 1, C]`: the `width - 1` before the successor of the
    /// last real row, `last` for a prompt chunk, the last row for decode rows).
    pub(super) fn causal_conv(
        &self,
        rows: V<'c, 'b>,
        prev: V<'c, 'b>,
        weight: &str,
        last: Option<V<'c, 'b>>,
    ) -> R<(V<'c, 'b>, V<'c, 'b>)> {
        let f = self.f;
        let (n, m) = self.function.split();
        let (n, m) = (n as i64, m as i64);
        let (width, channels) = (prev.shape()[1] + 1, prev.shape()[2]);
        let input = f.concatenate(&[prev, f.reshape(rows, &[n, m, channels])?], 1)?;
        let w = f.reshape(self.param(weight)?, &[channels, width])?;
        let tap = |j: i64| -> R<V<'c, 'b>> {
            let rows = f.slice(input, &[0, j, 0], &[n, j + m, channels], &[1; 3])?;
            let wj = f.reshape(f.slice(w, &[0, j], &[channels, j + 1], &[1, 1])?, &[channels])?;
            f.mul(rows, f.broadcast_in_dim(wj, &[n, m, channels], &[2])?)
        };
        let mut conv = tap(0)?;
        for j in 1..width {
            conv = f.add(conv, tap(j)?)?;
        }
        let next = match last {
            None => f.slice(input, &[0, m, 0], &[n, m + width - 1, channels], &[1; 3])?,
            Some(last) => {
                let zero = f.scalar(0.0, I32)?;
                let start = f.add(f.reshape(last, &[])?, f.scalar(1.0, I32)?)?;
                f.dynamic_slice(input, &[zero, start, zero], &[1, width - 1, channels])?
            }
        };
        Ok((conv, next))
    }

    /// One LFM2 short-convolution layer (mlx-lm's `ShortConv`) on the normed input
    /// `hn [R, d]`, each sequence starting from its row of the layer's state buffer: B, C
    /// and x from `in_proj`, the causal convolution of `B * x` (plus its bias), times C.
    /// Returns that `[R, d]` (before `out_proj`) and the buffer's new rows, the
    /// convolution's last inputs `[n, (kernel - 1) * d]`.
    pub(super) fn short_conv(
        &self,
        hn: V<'c, 'b>,
        sc: &ShortConvPlan<'_>,
        state: &StateIn<'c, 'b>,
        last: Option<V<'c, 'b>>,
    ) -> R<(V<'c, 'b>, V<'c, 'b>)> {
        let f = self.f;
        let (n, _) = self.function.split();
        let n = n as i64;
        let r = self.rows();
        let d = self.cfg.hidden as i64;
        let width = sc.config.kernel as i64;
        let bcx = self.linear(hn, &sc.in_proj, sc.config.bias)?;
        let part = |i: i64| f.slice(bcx, &[0, i * d], &[r, (i + 1) * d], &[1, 1]);
        let (b, c, x) = (part(0)?, part(1)?, part(2)?);
        let len = (width - 1) * d;
        let prev = f.reshape(self.read_state(state, sc.state)?, &[n, width - 1, d])?;
        let (conv, next) = self.causal_conv(f.mul(b, x)?, prev, &sc.conv, last)?;
        let mut conv = f.reshape(conv, &[r, d])?;
        if let Some(bias) = &sc.conv_bias {
            conv = f.add(conv, f.broadcast_in_dim(self.param(bias)?, &[r, d], &[1])?)?;
        }
        Ok((f.mul(c, conv)?, f.reshape(next, &[n, len])?))
    }
}

/// Row `i` of `x` (`[1, ...]`), at a run-time index.
fn row_at<'c, 'r>(f: &Func<'c, 'r>, x: V<'c, 'r>, i: V<'c, 'r>) -> R<V<'c, 'r>> {
    let zero = f.scalar(0.0, I32)?;
    let mut at = vec![zero; x.rank()];
    at[0] = i;
    let mut size = x.shape();
    size[0] = 1;
    f.dynamic_slice(x, &at, &size)
}

/// One delta-rule step for `b` rows at once (mlx-lm's `_gated_delta_step_ops`): the state
/// `s [b, H, dv, dk]` decayed by `g [b, H]`, corrected towards `v [b, H, dv]` along
/// `k [b, H, dk]` with strength `beta [b, H]`, then read out along `q`. Returns the readout
/// `[b, H, dv]` and the new state.
fn delta_step<'c, 'r>(
    f: &Func<'c, 'r>,
    s: V<'c, 'r>,
    q: V<'c, 'r>,
    k: V<'c, 'r>,
    v: V<'c, 'r>,
    g: V<'c, 'r>,
    beta: V<'c, 'r>,
) -> R<(V<'c, 'r>, V<'c, 'r>)> {
    let full = s.shape();
    let row = [full[0], full[1], full[2]];
    let s = f.mul(s, f.broadcast_in_dim(g, &full, &[0, 1])?)?;
    let kb = f.broadcast_in_dim(k, &full, &[0, 1, 3])?;
    let kv_mem = f.reduce_sum(f.mul(s, kb)?, &[3])?;
    let delta = f.mul(f.sub(v, kv_mem)?, f.broadcast_in_dim(beta, &row, &[0, 1])?)?;
    let s = f.add(s, f.mul(kb, f.broadcast_in_dim(delta, &full, &[0, 1, 2])?)?)?;
    let y = f.reduce_sum(f.mul(s, f.broadcast_in_dim(q, &full, &[0, 1, 3])?)?, &[3])?;
    Ok((y, s))
}
