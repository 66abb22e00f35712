//! Weight precision on the device: a setting of the one model definition, never a second
//! model. Norm weights and biases stay f32 in every mode (they are tiny), and all
//! arithmetic (contractions accumulate, norms, softmax, RoPE, logits) is f32.

use hlo_emit::ElementType;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Precision {
    /// Weights f32; quantized checkpoints dequantized at load.
    F32,
    /// Projection and embedding weights resident as f16 (half the bytes of f32).
    F16,
    /// The same with bf16.
    BF16,
    /// MLX 4- and 8-bit quantized matrices stay packed on the device (with their scales and
    /// biases) and are dequantized inside the contraction; the checkpoint's dense matrices
    /// are f16. Needs a quantized checkpoint.
    Packed,
}

impl Precision {
    pub const ALL: [Precision; 4] = [Precision::F32, Precision::F16, Precision::BF16, Precision::Packed];

    pub fn name(self) -> &'static str {
        match self {
            Precision::F32 => "f32",
            Precision::F16 => "f16",
            Precision::BF16 => "bf16",
            Precision::Packed => "packed",
        }
    }

    /// Element type of the dense matrix parameters (projections, embedding, lm_head).
    pub fn matrix_elem(self) -> ElementType {
        match self {
            Precision::F32 => ElementType::F32,
            Precision::F16 | Precision::Packed => ElementType::F16,
            Precision::BF16 => ElementType::BF16,
        }
    }
}

impl std::fmt::Display for Precision {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

impl std::str::FromStr for Precision {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "f32" => Ok(Precision::F32),
            "f16" => Ok(Precision::F16),
            "bf16" => Ok(Precision::BF16),
            "packed" => Ok(Precision::Packed),
            other => Err(format!("unknown precision `{other}` (expected f32, f16, bf16 or packed)")),
        }
    }
}
