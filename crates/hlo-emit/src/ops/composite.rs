//! Composite ops a transformer block needs (RMSNorm, softmax, top-k), built from the primitive
//! ops so every model and test states them the same way.

use crate::error::Error;
use crate::func::{Func, Value};

impl<'c, 'b> Func<'c, 'b> {
    /// RMSNorm over the last dim: `x * rsqrt(mean(x^2) + eps) * w`, with `w` of shape
    /// `[last dim]` broadcast along the leading dims.
    pub fn rms_norm(&self, x: Value<'c, 'b>, w: Value<'c, 'b>, eps: f64) -> Result<Value<'c, 'b>, Error> {
        let shape = x.shape();
        let Some(&n) = shape.last() else {
            return Err(Error::op("rms_norm", "an input of rank >= 1", x.ty().to_string()));
        };
        let last = shape.len() as i64 - 1;
        let ss = self.reduce_sum(self.mul(x, x)?, &[last])?;
        let inv = self.rsqrt(self.add_scalar(self.mul_scalar(ss, 1.0 / n as f64)?, eps)?)?;
        let inv = self.broadcast_in_dim(inv, &shape, &(0..last).collect::<Vec<_>>())?;
        self.mul(self.mul(x, inv)?, self.broadcast_in_dim(w, &shape, &[last])?)
    }

    /// Softmax over the last dim, shifted by the row max for stability.
    pub fn softmax(&self, x: Value<'c, 'b>) -> Result<Value<'c, 'b>, Error> {
        let shape = x.shape();
        if shape.is_empty() {
            return Err(Error::op("softmax", "an input of rank >= 1", x.ty().to_string()));
        }
        let last = shape.len() as i64 - 1;
        let keep: Vec<i64> = (0..last).collect();
        let m = self.broadcast_in_dim(self.reduce_max(x, &[last])?, &shape, &keep)?;
        let e = self.exp(self.sub(x, m)?)?;
        let s = self.broadcast_in_dim(self.reduce_sum(e, &[last])?, &shape, &keep)?;
        self.div(e, s)
    }

    /// The `k` largest entries of each row of `x [T, N]`, largest first, and their indices
    /// (i32; among equal values the lower index first): `([T, k], [T, k])`. Built as `k`
    /// rounds of one max-and-argmax reduction each, the entry taken masked to the lowest
    /// value for the next round; for the small `k` of expert routing (2 to 8).
    pub fn top_k(&self, x: Value<'c, 'b>, k: usize) -> Result<(Value<'c, 'b>, Value<'c, 'b>), Error> {
        let t = x.ty();
        if t.rank() != 2 || t.elem.is_bool() {
            return Err(Error::op("top_k", "a [T, N] float or integer tensor", t));
        }
        let (rows, n) = (t.shape[0], t.shape[1]);
        if k == 0 || k as i64 > n {
            return Err(Error::op("top_k", format!("k in 1..={n}"), k));
        }
        let column = self.iota(&t.with_elem(crate::ElementType::I32), 1)?;
        let lowest = self.splat(t.elem.range().0, &t)?;
        let (mut values, mut indices, mut rest) = (Vec::new(), Vec::new(), x);
        for round in 0..k {
            let (v, i) = self.max_and_argmax(rest, 1)?;
            values.push(self.reshape(v, &[rows, 1])?);
            indices.push(self.reshape(i, &[rows, 1])?);
            if round + 1 < k {
                let taken = self.compare(column, self.broadcast_in_dim(i, &[rows, n], &[0])?, crate::Cmp::Eq)?;
                rest = self.select(taken, lowest, rest)?;
            }
        }
        Ok((self.concatenate(&values, 1)?, self.concatenate(&indices, 1)?))
    }
}
