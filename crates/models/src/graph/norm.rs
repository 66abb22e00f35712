//! RMSNorm, as every family's layers use it (Gemma's `1 + w` scale a setting).

use super::{R, Step, V};

impl<'c, 'b> Step<'_, 'c, 'b> {
    /// `x` RMS-normed by the weight `key` (`1 + w` where the model scales so).
    pub(super) fn norm(&self, x: V<'c, 'b>, key: &str) -> R<V<'c, 'b>> {
        self.norm_eps(x, key, self.cfg.rms_eps)
    }

    /// [`Step::norm`] with its own epsilon (DeepSeek-V3's latent norms).
    pub(super) fn norm_eps(&self, x: V<'c, 'b>, key: &str, eps: f64) -> R<V<'c, 'b>> {
        let mut w = self.param(key)?;
        if self.cfg.norm_plus_one {
            w = self.f.add_scalar(w, 1.0)?;
        }
        let y = self.f.rms_norm(x, w, eps)?;
        // For a CUDA kernel product that reads `y` ([`Step::norm_of`]).
        self.normed.borrow_mut().push((y, x, w));
        Ok(y)
    }

    /// `x` RMS-normed over its last dim without a weight (Gemma 4's `v_norm`).
    pub(super) fn norm_unscaled(&self, x: V<'c, 'b>) -> R<V<'c, 'b>> {
        let last = x.shape().last().copied().unwrap_or(1);
        let ones = self.f.splat(1.0, &hlo_emit::ElementType::F32.tensor(&[last]))?;
        self.f.rms_norm(x, ones, self.cfg.rms_eps)
    }

    /// The input and weight of the RMSNorm whose output is `y`, if [`Step::norm`] made it.
    pub(super) fn norm_of(&self, y: V<'c, 'b>) -> Option<(V<'c, 'b>, V<'c, 'b>)> {
        self.normed.borrow().iter().find(|(out, _, _)| *out == y).map(|&(_, x, w)| (x, w))
    }
}
