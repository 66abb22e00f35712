//! Element types a safetensors tensor may have, as far as this crate reads them.

use std::fmt;

/// Element type of a tensor, named as in the safetensors header.
///
/// `F32`, `F16` and `BF16` are the float weight types; `U32` holds MLX's packed quantized
/// weights. The integer and boolean types are kept readable (raw bytes, [`TensorView::to_i64_vec`])
/// because checkpoints occasionally carry them (position ids, masks). Any other safetensors
/// dtype (`F64`, `F8_E4M3`, ...) is rejected when the file is opened.
///
/// [`TensorView::to_i64_vec`]: crate::TensorView::to_i64_vec
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Dtype {
    /// IEEE 754 binary32.
    F32,
    /// IEEE 754 binary16.
    F16,
    /// bfloat16 (the upper half of a binary32).
    BF16,
    /// Unsigned 32-bit integer; MLX packs quantized weights into these words.
    U32,
    /// Signed 32-bit integer.
    I32,
    /// Signed 64-bit integer.
    I64,
    /// Unsigned byte.
    U8,
    /// Signed byte.
    I8,
    /// One byte per element, 0 or 1.
    Bool,
}

impl Dtype {
    /// Every dtype this crate reads.
    pub const ALL: [Dtype; 9] =
        [Dtype::F32, Dtype::F16, Dtype::BF16, Dtype::U32, Dtype::I32, Dtype::I64, Dtype::U8, Dtype::I8, Dtype::Bool];

    /// The float dtypes a weight, scale or bias may have.
    pub const FLOATS: [Dtype; 3] = [Dtype::F32, Dtype::F16, Dtype::BF16];

    /// Parses the safetensors header spelling (`"F32"`, `"BF16"`, `"BOOL"`, ...).
    pub fn from_safetensors(name: &str) -> Option<Dtype> {
        Dtype::ALL.into_iter().find(|d| d.name() == name)
    }

    /// The safetensors header spelling.
    pub fn name(self) -> &'static str {
        match self {
            Dtype::F32 => "F32",
            Dtype::F16 => "F16",
            Dtype::BF16 => "BF16",
            Dtype::U32 => "U32",
            Dtype::I32 => "I32",
            Dtype::I64 => "I64",
            Dtype::U8 => "U8",
            Dtype::I8 => "I8",
            Dtype::Bool => "BOOL",
        }
    }

    /// Bytes per element.
    pub fn size_bytes(self) -> usize {
        match self {
            Dtype::F32 | Dtype::U32 | Dtype::I32 => 4,
            Dtype::F16 | Dtype::BF16 => 2,
            Dtype::I64 => 8,
            Dtype::U8 | Dtype::I8 | Dtype::Bool => 1,
        }
    }

    /// Whether this is one of [`Dtype::FLOATS`].
    pub fn is_float(self) -> bool {
        Dtype::FLOATS.contains(&self)
    }
}

impl fmt::Display for Dtype {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}
