//! Rotary position embedding: the angle tables of a step's positions (one per distinct
//! [`RopeTable`] of the layers) and the rotation of queries and keys.

use super::{R, Step, V};
use crate::rope::RopeTable;

impl<'c, 'b> Step<'_, 'c, 'b> {
    /// Rotates `x [T, heads, hd]` by the positions' angles (MLX's non-traditional layout:
    /// the first and second halves of each head form the pairs). Written as one elementwise
    /// expression, `x * cos + [-x2, x1] * sin` with the swap as a `reverse` of the two
    /// halves, so it fuses into one dispatch (a `concatenate` became copies of its own).
    ///
    /// With `rope_dims` below the head size (partial rotary) only the first `rope_dims`
    /// features rotate, paired across their own halves; the rest pass through. MLX's
    /// traditional layout (the model's `rope_traditional`, GLM-4) pairs adjacent features
    /// `(2i, 2i + 1)` instead: the same expression over `[.., half, 2]`.
    pub(super) fn rope(&self, x: V<'c, 'b>, cos: V<'c, 'b>, sin: V<'c, 'b>) -> R<V<'c, 'b>> {
        let f = self.f;
        // The layer's rotated features: two per angle of its table.
        let (hd, rd) = (x.shape()[2], 2 * cos.shape()[1]);
        if rd < hd {
            let rotated = self.rope(f.slice_dim(x, 2, 0, rd)?, cos, sin)?;
            return f.concatenate(&[rotated, f.slice_dim(x, 2, rd, hd)?], 2);
        }
        let shape = x.shape();
        let half = shape[2] / 2;
        // The pair's axis (2 elements) and the angle's (`half`), in the layout's order.
        let (split, pair, angle) = if self.cfg.rope_traditional {
            ([shape[0], shape[1], half, 2], 3, 2)
        } else {
            ([shape[0], shape[1], 2, half], 2, 3)
        };
        let x = f.reshape(x, &split)?;
        let swapped = f.reverse(x, &[pair])?;
        // [-1, 1] along the pair: the first of the swapped pair is -x2.
        let sign = f.broadcast_in_dim(f.constant_f32(&[-1.0, 1.0], &[2])?, &split, &[pair])?;
        let c = f.broadcast_in_dim(cos, &split, &[0, angle])?;
        let s = f.broadcast_in_dim(sin, &split, &[0, angle])?;
        let out = f.add(f.mul(x, c)?, f.mul(f.mul(swapped, sign)?, s)?)?;
        f.reshape(out, &shape)
    }

    pub(super) fn rope_tables(&self, pos_f: V<'c, 'b>, table: &RopeTable) -> R<(V<'c, 'b>, V<'c, 'b>)> {
        let f = self.f;
        let half = table.inv_freq.len() as i64;
        let inv = f.constant_f32(&table.inv_freq, &[half])?;
        let p = f.mul_scalar(pos_f, table.position_scale as f64)?;
        let ang = f.mul(
            f.broadcast_in_dim(p, &[self.rows(), half], &[0])?,
            f.broadcast_in_dim(inv, &[self.rows(), half], &[1])?,
        )?;
        let (cos, sin) = (f.cos(ang)?, f.sin(ang)?);
        if table.input_scale == 1.0 {
            return Ok((cos, sin));
        }
        // `rope(s * x) = x * (s * cos) + swap(x) * (s * sin)`.
        let s = table.input_scale as f64;
        Ok((f.mul_scalar(cos, s)?, f.mul_scalar(sin, s)?))
    }
}
