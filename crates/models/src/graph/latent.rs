//! DeepSeek-V3's multi-head latent attention over a cache of latents: the queries brought
//! into the latent space per head (`embed_q`), scored against each position's latent and
//! rotated key, the softmax's sum of latents brought out per head (`unembed_out`).

use super::layer::{Cache, LatentPlan, LatentQuery};
use super::{R, Step, V};
use crate::names;
use hlo_emit::{Cmp, DotDims, ElementType::*};

/// The epsilon of the latent attention's own norms (`q_a_layernorm`, `kv_a_layernorm`), which
/// mlx-lm's deepseek_v3 fixes whatever `rms_norm_eps` says.
const LATENT_NORM_EPS: f64 = 1e-6;

impl<'c, 'b> Step<'_, 'c, 'b> {
    /// One latent attention layer on the normed input `hn [R, d]`, with `angles` (cos, sin)
    /// for the rotated features. Returns the heads' output `[R, heads * v_dim]` (before
    /// `o_proj`) and the step's new cache rows as one layer's (`[1, R, 1, kv_rank]` latents
    /// for the `k` cache, `[1, R, 1, rope_dim]` rotated keys for the `v` cache).
    ///
    /// Every row (decode or a prompt chunk) runs mlx-lm's decode form: head h's query in the
    /// latent space, `W_k[h]ᵀ q_nope` (`[kv_rank]`), and its rotated part score position j
    /// as `scale * (q_lat · c_j + q_pe · k_pe_j)`; the softmax's sum of the latents `c_j`
    /// goes through `W_v[h]`. mlx-lm's prompt form (keys and values expanded per head
    /// first) sums the same products in another order.
    pub(super) fn latent_attention(
        &self,
        hn: V<'c, 'b>,
        plan: &LatentPlan<'_>,
        (cos, sin): (V<'c, 'b>, V<'c, 'b>),
        cache: &Cache<'c, 'b>,
    ) -> R<(V<'c, 'b>, V<'c, 'b>, V<'c, 'b>)> {
        let (f, cfg) = (self.f, self.cfg);
        let (n, m) = self.function.split();
        let (n, m, r) = (n as i64, m as i64, self.rows());
        let lat = plan.config;
        let (h, rank, nope, rope) = (cfg.heads as i64, lat.kv_rank as i64, lat.nope_dim as i64, lat.rope_dim as i64);
        let q = match &plan.query {
            LatentQuery::Compressed { a, norm, b } => {
                let qa = self.norm_eps(self.linear(hn, a, plan.in_bias)?, norm, LATENT_NORM_EPS)?;
                self.linear(qa, b, false)?
            }
            LatentQuery::Plain(q) => self.linear(hn, q, false)?,
        };
        let q = f.reshape(q, &[r, h, nope + rope])?;
        let (q_nope, q_pe) = (f.slice_dim(q, 2, 0, nope)?, f.slice_dim(q, 2, nope, nope + rope)?);
        let kv = self.linear(hn, &plan.kv_a, plan.in_bias)?;
        let latents = self.norm_eps(f.slice_dim(kv, 1, 0, rank)?, &plan.kv_norm, LATENT_NORM_EPS)?;
        let keys = f.reshape(f.slice_dim(kv, 1, rank, rank + rope)?, &[r, 1, rope])?;
        let (q_pe, keys) = (self.rope(q_pe, cos, sin)?, self.rope(keys, cos, sin)?);
        // [R, H, nope] · [H, rank, nope] -> [H, R, rank] -> [R, H, rank].
        let embed_q = self.param(&names::weight(&plan.embed_q))?;
        let q_lat = f.dot_general(q_nope, embed_q, DotDims::contract(&[2], &[2]).batch(&[1], &[0]))?;
        let q_lat = f.transpose(q_lat, &[1, 0, 2])?;

        let latents = f.reshape(latents, &[r, 1, rank])?;
        let l = plan.kv_layer;
        let Cache { k: kc, v: vc, slots, positions, .. } = *cache;
        // Each sequence's window with its own rows put in: [n, W, rank] and [n, W, rope].
        let w = self.function.window() as i64;
        let lw = f.reshape(self.window_with(kc, l, slots, latents, positions)?, &[n, w, rank])?;
        let kw = f.reshape(self.window_with(vc, l, slots, keys, positions)?, &[n, w, rope])?;
        // [n, m * H, rank] · [n, W, rank] -> [n, m * H, W], and the same for the rotated part.
        let by_seq = DotDims::contract(&[2], &[2]).batch(&[0], &[0]);
        let scores = f.add(
            f.dot_general(f.reshape(q_lat, &[n, m * h, rank])?, lw, by_seq.clone())?,
            f.dot_general(f.reshape(q_pe, &[n, m * h, rope])?, kw, by_seq)?,
        )?;
        let shape = [n, m, h, w];
        let scores = f.reshape(f.mul_scalar(scores, cfg.attn_scale)?, &shape)?;
        let kpos = f.iota(&I32.tensor(&[n, m, w]), 2)?;
        let qpos = f.broadcast_in_dim(f.reshape(positions, &[n, m])?, &[n, m, w], &[0, 1])?;
        let visible = f.broadcast_in_dim(self.visible(kpos, qpos, Cmp::Le, None)?, &shape, &[0, 1, 3])?;
        let scores = f.select(visible, scores, f.splat(f32::MIN as f64, &F32.tensor(&shape))?)?;
        let probs = f.reshape(f.softmax(scores)?, &[n, m * h, w])?;
        // [n, m * H, W] · [n, W, rank] -> [n, m * H, rank] -> [R, H, rank].
        let o_lat = f.dot_general(probs, lw, DotDims::contract(&[2], &[1]).batch(&[0], &[0]))?;
        let o_lat = f.reshape(o_lat, &[r, h, rank])?;
        // [R, H, rank] · [H, v_dim, rank] -> [H, R, v_dim] -> [R, H * v_dim].
        let unembed = self.param(&names::weight(&plan.unembed_out))?;
        let v_dim = lat.v_dim as i64;
        let o = f.dot_general(o_lat, unembed, DotDims::contract(&[2], &[2]).batch(&[1], &[0]))?;
        let o = f.reshape(f.transpose(o, &[1, 0, 2])?, &[r, h * v_dim])?;
        let as_rows = |x: V<'c, 'b>, width: i64| f.reshape(x, &[1, r, 1, width]);
        Ok((o, as_rows(latents, rank)?, as_rows(keys, rope)?))
    }
}
