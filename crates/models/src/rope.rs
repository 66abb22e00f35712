//! Rotary position embedding tables, computed on the host the way mlx-lm's RoPE classes do.

use crate::config::{LayerConfig, RopeScaling};

/// Per-position multipliers: `angle[p][i] = (p * position_scale) * inv_freq[i]`.
#[derive(Debug, Clone, PartialEq)]
pub struct RopeTable {
    /// `head_dim / 2` inverse frequencies.
    pub inv_freq: Vec<f32>,
    /// Linear scaling divides positions by its factor.
    pub position_scale: f32,
}

impl RopeTable {
    pub fn new(layer: &LayerConfig, head_dim: usize) -> RopeTable {
        let half = head_dim / 2;
        let base = layer.rope_theta;
        // MLX's default: theta_i = base^(-2i/d).
        let default: Vec<f64> = (0..half).map(|i| base.powf(-(2.0 * i as f64) / head_dim as f64)).collect();
        match layer.rope_scaling {
            RopeScaling::None => RopeTable { inv_freq: to_f32(&default), position_scale: 1.0 },
            RopeScaling::Linear { factor } => {
                RopeTable { inv_freq: to_f32(&default), position_scale: (1.0 / factor) as f32 }
            }
            RopeScaling::Llama3 {
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
                        let freq = base.powf(2.0 * i as f64 / head_dim as f64);
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
                RopeTable { inv_freq: to_f32(&inv), position_scale: 1.0 }
            }
        }
    }
}

fn to_f32(v: &[f64]) -> Vec<f32> {
    v.iter().map(|x| *x as f32).collect()
}
