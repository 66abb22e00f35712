//! Composite ops a transformer block needs (RMSNorm, softmax), built from the primitive
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
}
