//! Attention over the KV cache: the CPU kernel's dispatch where it runs, else the graph
//! form (one row per sequence against its window, or a prompt chunk by contractions), with
//! causal and sliding-window masks and Gemma 2's soft cap.

use super::{Function, KvElem, R, Step, V};
use crate::backend::SlotRead;
use hlo_emit::{Cmp, DotDims, ElementType::*, GatherDims, ScatterDims};

impl<'c, 'b> Step<'_, 'c, 'b> {
    /// Positions `[0, window)` of layer `l` of each sequence's slot as f32 `[n, W, heads, width]`
    /// (the cache's `[.., heads, width]`: `kv_heads, hd`, or a latent layer's), with this step's
    /// rows `x [R, heads, width]` put in at their (sequence, position).
    pub(super) fn window_with(
        &self,
        cache: V<'c, 'b>,
        l: usize,
        slots: V<'c, 'b>,
        x: V<'c, 'b>,
        positions: V<'c, 'b>,
    ) -> R<V<'c, 'b>> {
        let f = self.f;
        let (n, m) = self.function.split();
        let r = (n * m) as i64;
        let row_seq = f.reshape(f.iota(&I32.tensor(&[n as i64, m as i64]), 0)?, &[r, 1])?;
        let at = f.concatenate(&[row_seq, f.reshape(positions, &[r, 1])?], 1)?;
        // In the cache's own type, widened after: a conversion between the gather and the
        // scatter made IREE 3.13 fuse them into one dispatch that keeps the whole window on
        // the stack ("exceeded stack allocation limit of 32768 bytes") for an f16 cache.
        let read = self.raw_window(cache, l, slots)?;
        let x = self.kv_elem.store(f, x)?;
        let dims = ScatterDims {
            update_window_dims: vec![1, 2],
            inserted_window_dims: vec![0, 1],
            scatter_dims_to_operand_dims: vec![0, 1],
            index_vector_dim: 1,
            ..ScatterDims::default()
        };
        self.kv_elem.load(f, f.scatter(read, at, x, dims)?)
    }

    /// Positions `[0, window)` of layer `l` of each sequence's slot, as f32 `[n, W, kv_heads, hd]`,
    /// for reductions that read it where it lies (decode).
    pub(super) fn window(&self, cache: V<'c, 'b>, l: usize, slots: V<'c, 'b>) -> R<V<'c, 'b>> {
        let f = self.f;
        let n = slots.shape()[0];
        let (k, hd, w) = (cache.shape()[3], cache.shape()[4], self.function.window() as i64);
        // The layer is a static slice and only the slot is gathered. With the layer among the
        // gather's indices IREE 3.13 copied each window into a temporary element by element
        // (index arithmetic per element): in a probe of 30 layers' decode attention at 2,048
        // positions, 33 ms a call against 12 ms this way.
        let (s, p) = (cache.shape()[1], cache.shape()[2]);
        let read = if s == 1 {
            // One slot: the window is a contiguous prefix of the layer, read in place.
            let one = f.reshape(
                f.slice(cache, &[l as i64, 0, 0, 0, 0], &[l as i64 + 1, 1, w, k, hd], &[1; 5])?,
                &[1, w, k, hd],
            )?;
            if n == 1 { one } else { f.broadcast_in_dim(one, &[n, w, k, hd], &[0, 1, 2, 3])? }
        } else {
            // The whole layer (every slot and position: one contiguous block, a view). Slicing the
            // window's positions first made IREE copy every slot's window before the slot gather
            // (4x the attention time at 8 slots, window 128 of 2,048 positions).
            let layer = f.reshape(
                f.slice(cache, &[l as i64, 0, 0, 0, 0], &[l as i64 + 1, s, p, k, hd], &[1; 5])?,
                &[s, p, k, hd],
            )?;
            if n == 1 && self.options.slot_read == SlotRead::Slice {
                let slot = f.reshape(slots, &[])?;
                let zero = f.splat(0.0, &I32.tensor(&[]))?;
                f.dynamic_slice(layer, &[slot, zero, zero, zero], &[1, w, k, hd])?
            } else {
                let dims = GatherDims {
                    offset_dims: vec![1, 2, 3],
                    collapsed_slice_dims: vec![0],
                    start_index_map: vec![0],
                    index_vector_dim: 1,
                    ..GatherDims::default()
                };
                f.gather(layer, f.reshape(slots, &[n, 1])?, dims, &[1, w, k, hd])?
            }
        };
        self.kv_elem.load(f, read)
    }

    /// Positions `[0, window)` of layer `l` of each sequence's slot in the cache's element type,
    /// gathered at (layer, slot): a copy, which the prefill's scatter of its own rows needs (a
    /// static layer slice there made IREE fuse slice and scatter into one dispatch that keeps
    /// the window on the stack).
    fn raw_window(&self, cache: V<'c, 'b>, l: usize, slots: V<'c, 'b>) -> R<V<'c, 'b>> {
        let f = self.f;
        let n = slots.shape()[0];
        let (k, hd, w) = (cache.shape()[3], cache.shape()[4], self.function.window() as i64);
        let layer = f.splat(l as f64, &I32.tensor(&[n, 1]))?;
        let indices = f.concatenate(&[layer, f.reshape(slots, &[n, 1])?], 1)?;
        let dims = GatherDims {
            offset_dims: vec![1, 2, 3],
            collapsed_slice_dims: vec![0, 1],
            start_index_map: vec![0, 1],
            index_vector_dim: 1,
            ..GatherDims::default()
        };
        f.gather(cache, indices, dims, &[1, 1, w, k, hd])
    }

    /// Attention scores `x · key * scale`, soft-capped when the model caps them.
    fn scaled(&self, scores: V<'c, 'b>) -> R<V<'c, 'b>> {
        let f = self.f;
        let scores = f.mul_scalar(scores, self.cfg.attn_scale)?;
        match self.cfg.attn_softcap {
            Some(cap) => f.mul_scalar(f.tanh(f.mul_scalar(scores, 1.0 / cap)?)?, cap),
            None => Ok(scores),
        }
    }

    /// Whether key position `kpos` is visible from query position `p` (same shape): `kpos
    /// cmp p` (`Le`, or `Lt` to leave p itself out), and `p - W' < kpos` under a sliding
    /// window W'.
    pub(super) fn visible(&self, kpos: V<'c, 'b>, p: V<'c, 'b>, cmp: Cmp, sliding: Option<usize>) -> R<V<'c, 'b>> {
        let f = self.f;
        let causal = f.compare(kpos, p, cmp)?;
        let Some(win) = sliding else { return Ok(causal) };
        let recent = f.compare(f.add(kpos, f.splat(win as f64, &kpos.ty())?)?, p, Cmp::Gt)?;
        f.and(causal, recent)
    }

    /// Chunk attention (prefill: m rows of each of n sequences): queries `q [R, heads, hd]`
    /// against each sequence's window `kl`, `vl` (`[n, W, kv_heads, hd]`, the chunk's own rows
    /// included), key j visible from a row at position p when j <= p (and p - W' < j under a
    /// sliding window W'). Contractions: prefill has enough rows for them. `sinks` (`[heads]`,
    /// gpt-oss) join each row's softmax as one more logit with no value. Returns
    /// `[R, heads * hd]`.
    pub(super) fn attend_chunk(
        &self,
        q: V<'c, 'b>,
        kl: V<'c, 'b>,
        vl: V<'c, 'b>,
        positions: V<'c, 'b>,
        sliding: Option<usize>,
        sinks: Option<V<'c, 'b>>,
    ) -> R<V<'c, 'b>> {
        let f = self.f;
        let (n, m) = self.function.split();
        let (n, m, w) = (n as i64, m as i64, self.function.window() as i64);
        // The layer's heads, as the window holds them.
        let (k, hd) = (kl.shape()[2], kl.shape()[3]);
        let g = self.cfg.heads as i64 / k;
        let scores_shape = [n, k, g, m, w];
        let kpos = f.iota(&I32.tensor(&[n, m, w]), 2)?;
        let qpos = f.broadcast_in_dim(f.reshape(positions, &[n, m])?, &[n, m, w], &[0, 1])?;
        let visible = self.visible(kpos, qpos, Cmp::Le, sliding)?;
        let visible = f.broadcast_in_dim(visible, &scores_shape, &[0, 3, 4])?;
        let qh = f.transpose(f.reshape(q, &[n, m, k, g, hd])?, &[0, 2, 3, 1, 4])?;
        let qh = f.reshape(qh, &[n, k, g * m, hd])?;
        // [n, K, G*m, W]: batch over (sequence, kv head), the window as [n, W, K, hd].
        let scores = f.dot_general(qh, kl, DotDims::contract(&[3], &[3]).batch(&[0, 1], &[0, 2]))?;
        let neg = f.splat(f32::MIN as f64, &F32.tensor(&scores_shape))?;
        let scores = f.select(visible, f.reshape(self.scaled(scores)?, &scores_shape)?, neg)?;
        let probs = match sinks {
            None => f.softmax(scores)?,
            Some(s) => {
                let column = f.broadcast_in_dim(f.reshape(s, &[k, g])?, &[n, k, g, m, 1], &[1, 2])?;
                f.slice_dim(f.softmax(f.concatenate(&[scores, column], 4)?)?, 4, 0, w)?
            }
        };
        let probs = f.reshape(probs, &[n, k, g * m, w])?;
        let o = f.dot_general(probs, vl, DotDims::contract(&[3], &[1]).batch(&[0, 1], &[0, 2]))?;
        let o = f.transpose(f.reshape(o, &[n, k, g, m, hd])?, &[0, 3, 1, 2, 4])?;
        f.reshape(o, &[n * m, k * g * hd])
    }

    /// Attention through the CPU kernel (`kernels::cpu`, `cpu/attn.h`), where the module
    /// links the kernel object and the kernel takes the model's heads: the same attention as
    /// [`Step::attend_one`] (decode) and [`Step::attend_chunk`] (a prompt chunk), read straight
    /// from the cache (`kc`, `vc`, whole) at each row's slot for the positions before the
    /// call's rows of its sequence (below W), and from the call's new rows after them, one
    /// dispatch per layer. `None` where the graph form runs instead (no object: other targets
    /// or dense weights; soft-capped scores; heads the kernel does not take).
    #[allow(clippy::too_many_arguments)]
    pub(super) fn attend_kernel(
        &self,
        q: V<'c, 'b>,
        kk: V<'c, 'b>,
        vv: V<'c, 'b>,
        (kc, vc): (V<'c, 'b>, V<'c, 'b>),
        l: usize,
        slots: V<'c, 'b>,
        positions: V<'c, 'b>,
        sliding: Option<usize>,
    ) -> R<Option<V<'c, 'b>>> {
        let (f, cfg) = (self.f, self.cfg);
        let (h, k, hd) = (cfg.heads, cfg.kv_heads, cfg.head_dim);
        if !super::attention_in_kernel(cfg, self.layout) {
            return Ok(None);
        }
        let cache = match self.kv_elem {
            KvElem::F32 => kernels::cpu::CacheElem::F32,
            KvElem::F16 => kernels::cpu::CacheElem::F16,
            KvElem::Q8 => kernels::cpu::CacheElem::Q8,
        };
        // A prompt chunk of two tiles or more in whole rows, whose tiles share their cache reads
        // (the same bits per row); other calls in a row's kv heads, two workgroups or more a row.
        let units = match self.function {
            Function::Prefill { tokens, .. } if tokens >= 2 * kernels::cpu::ATTN_TILE_ROWS => {
                kernels::cpu::attention_tile_units(k)
            }
            _ => kernels::cpu::attention_units(h, k, hd),
        };
        let entry = kernels::cpu::Attention { cache, units };
        self.linked.borrow_mut().attention.insert(entry);
        let n = q.shape()[0];
        let (dims, window) = (kc.shape(), self.function.window());
        // In `kernels::cpu::Attention::CONSTANTS`' order; the scale travels as its f32 bits.
        let scale = (cfg.attn_scale as f32).to_bits() as i32;
        let sizes = [l, dims[1] as usize, dims[2] as usize, k, h / k, hd, window, sliding.unwrap_or(0)];
        let constants: Vec<i32> = sizes.iter().map(|&c| c as i32).chain([scale, n as i32]).collect();
        let flat = |x: V<'c, 'b>, width: usize| f.reshape(x, &[n, width as i64]);
        // The new rows in f32: the kernel rounds them through the cache's type itself (a
        // conversion here was three dispatches a layer for an f16 cache).
        let args = [flat(q, h * hd)?, flat(kk, k * hd)?, flat(vv, k * hd)?, kc, vc, positions, slots];
        let o = f.dispatch(
            kernels::cpu::EXECUTABLE,
            &entry.export(),
            n * k as i64,
            &constants,
            &args,
            F32.tensor(&[n, (h * hd) as i64]),
        )?;
        Ok(Some(o))
    }

    /// Decode attention (one row per sequence): each row's query `q [n, heads, hd]` against
    /// the positions before its own in the old window (`kl`, `vl`: `[n, W, kv_heads, hd]`)
    /// and against its own new key and value (`kk`, `vv`: `[n, kv_heads, hd]`), one softmax
    /// over both. Written as broadcast products and reductions, with the row's own key apart,
    /// so the window is never copied to put the row in. IREE 3.13 still raises the products to
    /// contractions (`matmul_like`), so in the data-tiled decode module each window is relaid
    /// out (`set_encoding`, one copy) before its contraction. `sinks` (`[heads]`, gpt-oss)
    /// join the softmax as one more logit with no value. Returns `[n, heads * hd]`.
    pub(super) fn attend_one(
        &self,
        q: V<'c, 'b>,
        (kk, vv): (V<'c, 'b>, V<'c, 'b>),
        (kl, vl): (V<'c, 'b>, V<'c, 'b>),
        positions: V<'c, 'b>,
        sliding: Option<usize>,
        sinks: Option<V<'c, 'b>>,
    ) -> R<V<'c, 'b>> {
        let f = self.f;
        let (n, w) = (kl.shape()[0], kl.shape()[1]);
        let (k, hd) = (kl.shape()[2], kl.shape()[3]);
        let g = self.cfg.heads as i64 / k;
        // Scores as [n, K, G, W]: the softmax then reduces over the innermost dim (over the
        // outer W of [n, W, K, G] each of its reductions cost about a quarter of the window
        // products).
        let (full, scores) = ([n, k, g, w, hd], [n, k, g, w]);
        let q = f.reshape(q, &[n, k, g, hd])?;
        // Rounded through the cache's type, so attention sees exactly what later steps read.
        let (kk, vv) = (self.kv_elem.round(f, kk)?, self.kv_elem.round(f, vv)?);

        let old = f.mul(f.broadcast_in_dim(q, &full, &[0, 1, 2, 4])?, f.broadcast_in_dim(kl, &full, &[0, 3, 1, 4])?)?;
        let old = self.scaled(f.reduce_sum(old, &[4])?)?;
        let own = f.mul(q, f.broadcast_in_dim(kk, &[n, k, g, hd], &[0, 1, 3])?)?;
        let own = self.scaled(f.reduce_sum(own, &[3])?)?;

        // Old key j is visible from a row at position p when j < p (p itself is this row's
        // own key).
        let kpos = f.iota(&I32.tensor(&[n, w]), 1)?;
        let p = f.broadcast_in_dim(positions, &[n, w], &[0])?;
        let visible = self.visible(kpos, p, Cmp::Lt, sliding)?;
        let old = f.select(
            f.broadcast_in_dim(visible, &scores, &[0, 3])?,
            old,
            f.splat(f32::MIN as f64, &F32.tensor(&scores))?,
        )?;

        let sinks = match sinks {
            Some(s) => Some(f.broadcast_in_dim(f.reshape(s, &[k, g])?, &[n, k, g], &[1, 2])?),
            None => None,
        };
        let top = f.max(f.reduce_max(old, &[3])?, own)?;
        let top = match sinks {
            Some(s) => f.max(top, s)?,
            None => top,
        };
        let e_old = f.exp(f.sub(old, f.broadcast_in_dim(top, &scores, &[0, 1, 2])?)?)?;
        let e_own = f.exp(f.sub(own, top)?)?;
        let total = f.add(f.reduce_sum(e_old, &[3])?, e_own)?;
        let total = match sinks {
            Some(s) => f.add(total, f.exp(f.sub(s, top)?)?)?,
            None => total,
        };
        let o =
            f.mul(f.broadcast_in_dim(e_old, &full, &[0, 1, 2, 3])?, f.broadcast_in_dim(vl, &full, &[0, 3, 1, 4])?)?;
        let o = f.reduce_sum(o, &[3])?;
        let head = [n, k, g, hd];
        let o = f.add(
            o,
            f.mul(f.broadcast_in_dim(e_own, &head, &[0, 1, 2])?, f.broadcast_in_dim(vv, &head, &[0, 1, 3])?)?,
        )?;
        let o = f.div(o, f.broadcast_in_dim(total, &head, &[0, 1, 2])?)?;
        f.reshape(o, &[n, k * g * hd])
    }
}
