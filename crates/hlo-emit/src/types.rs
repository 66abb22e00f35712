//! Element and tensor types: the Rust-side type system the builder checks ops against.

use crate::error::Error;
use melior::ir::{
    Type,
    r#type::{IntegerType, RankedTensorType},
};
use std::fmt;

/// Element type of a tensor.
///
/// Integer types follow StableHLO: `I*` are signed (MLIR signless), `UI*` unsigned.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ElementType {
    /// 32-bit IEEE float.
    F32,
    /// 16-bit IEEE float.
    F16,
    /// bfloat16.
    BF16,
    /// 64-bit IEEE float.
    F64,
    /// Boolean (result of `compare`).
    I1,
    /// Signed 4-bit integer.
    I4,
    /// Unsigned 4-bit integer.
    UI4,
    /// Signed 8-bit integer.
    I8,
    /// Unsigned 8-bit integer.
    UI8,
    /// Signed 16-bit integer.
    I16,
    /// Unsigned 16-bit integer.
    UI16,
    /// Signed 32-bit integer.
    I32,
    /// Unsigned 32-bit integer.
    UI32,
    /// Signed 64-bit integer.
    I64,
    /// Unsigned 64-bit integer.
    UI64,
}

impl ElementType {
    /// Every element type, for iteration in tests and lookups.
    pub const ALL: [ElementType; 15] = [
        Self::F32,
        Self::F16,
        Self::BF16,
        Self::F64,
        Self::I1,
        Self::I4,
        Self::UI4,
        Self::I8,
        Self::UI8,
        Self::I16,
        Self::UI16,
        Self::I32,
        Self::UI32,
        Self::I64,
        Self::UI64,
    ];

    /// MLIR spelling (`f32`, `bf16`, `ui4`, ...).
    pub const fn as_str(self) -> &'static str {
        match self {
            Self::F32 => "f32",
            Self::F16 => "f16",
            Self::BF16 => "bf16",
            Self::F64 => "f64",
            Self::I1 => "i1",
            Self::I4 => "i4",
            Self::UI4 => "ui4",
            Self::I8 => "i8",
            Self::UI8 => "ui8",
            Self::I16 => "i16",
            Self::UI16 => "ui16",
            Self::I32 => "i32",
            Self::UI32 => "ui32",
            Self::I64 => "i64",
            Self::UI64 => "ui64",
        }
    }

    /// Parses the MLIR spelling; `None` for anything else.
    pub fn from_name(name: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|e| e.as_str() == name)
    }

    /// Bit width of one element.
    pub const fn bits(self) -> u32 {
        match self {
            Self::I1 => 1,
            Self::I4 | Self::UI4 => 4,
            Self::I8 | Self::UI8 => 8,
            Self::F16 | Self::BF16 | Self::I16 | Self::UI16 => 16,
            Self::F32 | Self::I32 | Self::UI32 => 32,
            Self::F64 | Self::I64 | Self::UI64 => 64,
        }
    }

    /// True for floating-point types.
    pub const fn is_float(self) -> bool {
        matches!(self, Self::F32 | Self::F16 | Self::BF16 | Self::F64)
    }

    /// True for integer types other than `i1`.
    pub const fn is_integer(self) -> bool {
        !self.is_float() && !self.is_bool()
    }

    /// True for `i1`.
    pub const fn is_bool(self) -> bool {
        matches!(self, Self::I1)
    }

    /// True for signed integer types (`i4` .. `i64`, not `i1`).
    pub const fn is_signed_integer(self) -> bool {
        matches!(self, Self::I4 | Self::I8 | Self::I16 | Self::I32 | Self::I64)
    }

    /// True for unsigned integer types.
    pub const fn is_unsigned_integer(self) -> bool {
        matches!(self, Self::UI4 | Self::UI8 | Self::UI16 | Self::UI32 | Self::UI64)
    }

    /// A tensor of this element type: `ElementType::F32.tensor(&[4, 4])`.
    pub fn tensor(self, shape: &[i64]) -> TensorType {
        TensorType::new(shape, self)
    }

    /// A rank-0 tensor of this element type.
    pub fn scalar(self) -> TensorType {
        TensorType::new(&[], self)
    }

    /// Smallest and largest value representable, as f64 (integers only; floats give infinities).
    pub(crate) fn range(self) -> (f64, f64) {
        if self.is_float() {
            return (f64::NEG_INFINITY, f64::INFINITY);
        }
        let bits = self.bits();
        if self.is_bool() || self.is_unsigned_integer() {
            (0.0, 2f64.powi(bits as i32) - 1.0)
        } else {
            let half = 2f64.powi(bits as i32 - 1);
            (-half, half - 1.0)
        }
    }

    pub(crate) fn to_mlir<'c>(self, ctx: &'c melior::Context) -> Type<'c> {
        match self {
            Self::F32 => Type::float32(ctx),
            Self::F16 => Type::float16(ctx),
            Self::BF16 => Type::bfloat16(ctx),
            Self::F64 => Type::float64(ctx),
            Self::I1 => IntegerType::new(ctx, 1).into(),
            // Signless iN is StableHLO's signed integer.
            Self::I4 | Self::I8 | Self::I16 | Self::I32 | Self::I64 => IntegerType::new(ctx, self.bits()).into(),
            Self::UI4 | Self::UI8 | Self::UI16 | Self::UI32 | Self::UI64 => {
                IntegerType::unsigned(ctx, self.bits()).into()
            }
        }
    }
}

impl fmt::Display for ElementType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A statically shaped tensor type: shape plus element type.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct TensorType {
    /// Dimension sizes, outermost first; empty for a scalar (rank-0) tensor.
    pub shape: Vec<i64>,
    /// Element type.
    pub elem: ElementType,
}

impl TensorType {
    /// A tensor type of the given shape and element type.
    pub fn new(shape: &[i64], elem: ElementType) -> Self {
        Self { shape: shape.to_vec(), elem }
    }

    /// Number of dimensions.
    pub fn rank(&self) -> usize {
        self.shape.len()
    }

    /// Number of elements (product of the shape; 1 for a scalar).
    pub fn num_elements(&self) -> i64 {
        self.shape.iter().product()
    }

    /// The same shape with another element type.
    pub fn with_elem(&self, elem: ElementType) -> Self {
        Self::new(&self.shape, elem)
    }

    /// Another shape with the same element type.
    pub fn with_shape(&self, shape: &[i64]) -> Self {
        Self::new(shape, self.elem)
    }

    /// Checks that every dimension is non-negative (static shapes only).
    pub(crate) fn validate(&self, op: &'static str) -> Result<(), Error> {
        if self.shape.iter().any(|&d| d < 0) {
            return Err(Error::op(op, "a static shape with non-negative dimensions", self));
        }
        Ok(())
    }

    pub(crate) fn to_mlir<'c>(&self, ctx: &'c melior::Context) -> Type<'c> {
        // validate() ran wherever a user-given type enters, and inferred shapes are
        // non-negative by construction, so the cast cannot wrap.
        let dims: Vec<u64> = self.shape.iter().map(|&d| d.max(0) as u64).collect();
        RankedTensorType::new(&dims, self.elem.to_mlir(ctx), None).into()
    }
}

impl fmt::Display for TensorType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("tensor<")?;
        for d in &self.shape {
            write!(f, "{d}x")?;
        }
        write!(f, "{}>", self.elem)
    }
}
