//! Rotary position embedding tables, computed on the host the way mlx-lm's RoPE classes do.

use crate::config::{LayerConfig, RopeScaling};

/// Per-position multipliers: `angle[p][i] = (p * position_scale) * inv_freq[i]`, and the
/// rotated features multiplied by `input_scale` first.
#[derive(Debug, Clone, PartialEq)]
pub struct RopeTable {
    /// `rope_dims / 2` inverse frequencies.
    pub inv_freq: Vec<f32>,
    /// Linear scaling divides positions by its factor.
    pub position_scale: f32,
    /// `longrope`'s and YaRN's `mscale` (1 for the others): the graph folds it into the
    /// cosines and sines, since the rotation is linear.
    pub input_scale: f32,
}

impl RopeTable {
    /// The table of `layer` for RoPE over the first `dims` features of each head.
    pub fn new(layer: &LayerConfig, dims: usize) -> RopeTable {
        let half = dims / 2;
        let base = layer.rope_theta;
        // MLX's default: theta_i = base^(-2i/d).
        let default: Vec<f64> = (0..half).map(|i| base.powf(-(2.0 * i as f64) / dims as f64)).collect();
        let plain = |inv: &[f64]| RopeTable { inv_freq: to_f32(inv), position_scale: 1.0, input_scale: 1.0 };
        match &layer.rope_scaling {
            RopeScaling::None => plain(&default),
            RopeScaling::Linear { factor } => RopeTable { position_scale: (1.0 / factor) as f32, ..plain(&default) },
            RopeScaling::Su { long_factor, max_position_embeddings: max, original_max_position_embeddings: old } => {
                // mlx-lm's SuScaledRoPE: freqs = long_factor * base^(2i/d).
                let inv: Vec<f64> = default.iter().zip(long_factor).map(|(d, f)| d / f).collect();
                let factor = max / old;
                let scale = if factor <= 1.0 { 1.0 } else { (1.0 + factor.ln() / old.ln()).sqrt() };
                RopeTable { input_scale: scale as f32, ..plain(&inv) }
            }
            &RopeScaling::Yarn {
                factor,
                original_max_position_embeddings: old,
                beta_fast,
                beta_slow,
                mscale,
                mscale_all_dim,
            } => {
                // mlx-lm's YarnRoPE, term by term.
                let d = dims as f64;
                let correction =
                    |rotations: f64| d * (old / (rotations * 2.0 * std::f64::consts::PI)).ln() / (2.0 * base.ln());
                let low = correction(beta_fast).floor().max(0.0);
                let high = correction(beta_slow).ceil().min(d - 1.0);
                let high = if low == high { high + 0.001 } else { high };
                let get_mscale = |m: f64| if factor <= 1.0 { 1.0 } else { 0.1 * m * factor.ln() + 1.0 };
                let inv: Vec<f64> = (0..half)
                    .map(|i| {
                        let extra = base.powf(2.0 * i as f64 / d);
                        let inter = factor * extra;
                        let mask = 1.0 - ((i as f64 - low) / (high - low)).clamp(0.0, 1.0);
                        let freq = inter * extra / (inter * mask + extra * (1.0 - mask));
                        1.0 / freq
                    })
                    .collect();
                RopeTable { input_scale: (get_mscale(mscale) / get_mscale(mscale_all_dim)) as f32, ..plain(&inv) }
            }
            &RopeScaling::Proportional { rotated, factor } => {
                // mlx-lm's ProportionalRoPE, in f32 as MLX computes it: `freqs = factor *
                // base^(2i / dims)` for the turning pairs, infinite (no turn) for the others,
                // and MLX turns by `1 / freqs`.
                let (base, factor) = (base as f32, factor as f32);
                let inv_freq =
                    (0..half)
                        .map(|i| {
                            if 2 * i < rotated { 1.0 / (factor * base.powf((2 * i) as f32 / dims as f32)) } else { 0.0 }
                        })
                        .collect();
                RopeTable { inv_freq, position_scale: 1.0, input_scale: 1.0 }
            }
            &RopeScaling::Llama3 {
                factor,
                low_freq_factor,
                high_freq_factor,
                original_max_position_embeddings: old,
            } => {
                // mlx-lm's Llama3RoPE works with wavelengths `freqs = base^(2i/d)`; angle = pos / freqs.
                let low_wavelen = old / low_freq_factor;
                let high_wavelen = old / high_freq_factor;
                let inv = (0..half)
                    .map(|i| {
                        let freq = base.powf(2.0 * i as f64 / dims as f64);
                        let wavelen = 2.0 * std::f64::consts::PI * freq;
                        let scaled = if wavelen > low_wavelen { freq * factor } else { freq };
                        let medium = wavelen > high_wavelen && wavelen < low_wavelen;
                        let freq = if medium {
                            let smooth = (old / wavelen - low_freq_factor) / (high_freq_factor - low_freq_factor);
                            scaled / ((1.0 - smooth) / factor + smooth)
                        } else {
                            scaled
                        };
                        1.0 / freq
                    })
                    .collect::<Vec<f64>>();
                plain(&inv)
            }
        }
    }
}

fn to_f32(v: &[f64]) -> Vec<f32> {
    v.iter().map(|x| *x as f32).collect()
}
