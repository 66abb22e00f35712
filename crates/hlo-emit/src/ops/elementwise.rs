//! Elementwise ops: arithmetic, math functions, logic, compare, select, convert, and
//! scalar shorthands.

use crate::error::Error;
use crate::func::{Func, Value};
use crate::types::{ElementType, TensorType};
use std::fmt;

/// Comparison direction of [`Func::compare`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Cmp {
    /// `==`
    Eq,
    /// `!=`
    Ne,
    /// `<`
    Lt,
    /// `<=`
    Le,
    /// `>`
    Gt,
    /// `>=`
    Ge,
}

impl Cmp {
    /// StableHLO spelling (`EQ`, `GT`, ...).
    pub const fn as_str(self) -> &'static str {
        match self {
            Self::Eq => "EQ",
            Self::Ne => "NE",
            Self::Lt => "LT",
            Self::Le => "LE",
            Self::Gt => "GT",
            Self::Ge => "GE",
        }
    }
}

impl fmt::Display for Cmp {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Which element types an elementwise op accepts.
#[derive(Clone, Copy)]
enum Accepts {
    /// Anything.
    Any,
    /// Floats and integers, not `i1`.
    Numeric,
    /// Floats and signed integers.
    Signed,
    /// Floats only.
    Float,
    /// `i1` and integers.
    IntOrBool,
}

impl Accepts {
    fn allows(self, e: ElementType) -> bool {
        match self {
            Self::Any => true,
            Self::Numeric => !e.is_bool(),
            Self::Signed => e.is_float() || e.is_signed_integer(),
            Self::Float => e.is_float(),
            Self::IntOrBool => !e.is_float(),
        }
    }

    fn describe(self) -> &'static str {
        match self {
            Self::Any => "a tensor",
            Self::Numeric => "a float or integer tensor (not i1)",
            Self::Signed => "a float or signed integer tensor",
            Self::Float => "a float tensor",
            Self::IntOrBool => "an integer or i1 tensor",
        }
    }
}

fn check_elem(op: &'static str, accepts: Accepts, t: &TensorType) -> Result<(), Error> {
    if accepts.allows(t.elem) { Ok(()) } else { Err(Error::op(op, accepts.describe(), t)) }
}

impl<'c, 'b> Func<'c, 'b> {
    fn binary(
        &self,
        op: &'static str,
        accepts: Accepts,
        a: Value<'c, 'b>,
        b: Value<'c, 'b>,
    ) -> Result<Value<'c, 'b>, Error> {
        let (ta, tb) = (a.ty(), b.ty());
        if ta != tb {
            return Err(Error::op(op, "operands of the same type", format!("{ta} and {tb}")));
        }
        check_elem(op, accepts, &ta)?;
        self.emit1(op, &[a, b], Vec::new(), ta)
    }

    fn unary(&self, op: &'static str, accepts: Accepts, a: Value<'c, 'b>) -> Result<Value<'c, 'b>, Error> {
        let t = a.ty();
        check_elem(op, accepts, &t)?;
        self.emit1(op, &[a], Vec::new(), t)
    }

    /// `a + b` (same types).
    pub fn add(&self, a: Value<'c, 'b>, b: Value<'c, 'b>) -> Result<Value<'c, 'b>, Error> {
        self.binary("stablehlo.add", Accepts::Any, a, b)
    }

    /// `a - b` (same types, not i1).
    pub fn sub(&self, a: Value<'c, 'b>, b: Value<'c, 'b>) -> Result<Value<'c, 'b>, Error> {
        self.binary("stablehlo.subtract", Accepts::Numeric, a, b)
    }

    /// `a * b` (same types).
    pub fn mul(&self, a: Value<'c, 'b>, b: Value<'c, 'b>) -> Result<Value<'c, 'b>, Error> {
        self.binary("stablehlo.multiply", Accepts::Any, a, b)
    }

    /// `a / b` (same types, not i1; integer division truncates).
    pub fn div(&self, a: Value<'c, 'b>, b: Value<'c, 'b>) -> Result<Value<'c, 'b>, Error> {
        self.binary("stablehlo.divide", Accepts::Numeric, a, b)
    }

    /// Elementwise maximum.
    pub fn max(&self, a: Value<'c, 'b>, b: Value<'c, 'b>) -> Result<Value<'c, 'b>, Error> {
        self.binary("stablehlo.maximum", Accepts::Any, a, b)
    }

    /// Elementwise minimum.
    pub fn min(&self, a: Value<'c, 'b>, b: Value<'c, 'b>) -> Result<Value<'c, 'b>, Error> {
        self.binary("stablehlo.minimum", Accepts::Any, a, b)
    }

    /// `a ^ b` (same types, not i1).
    pub fn pow(&self, a: Value<'c, 'b>, b: Value<'c, 'b>) -> Result<Value<'c, 'b>, Error> {
        self.binary("stablehlo.power", Accepts::Numeric, a, b)
    }

    /// Logical/bitwise and (integers or i1).
    pub fn and(&self, a: Value<'c, 'b>, b: Value<'c, 'b>) -> Result<Value<'c, 'b>, Error> {
        self.binary("stablehlo.and", Accepts::IntOrBool, a, b)
    }

    /// `a << b` (integers; shifts by the bit width or more give 0).
    pub fn shift_left(&self, a: Value<'c, 'b>, b: Value<'c, 'b>) -> Result<Value<'c, 'b>, Error> {
        self.binary("stablehlo.shift_left", Accepts::IntOrBool, a, b)
    }

    /// `a >> b` keeping the sign (integers): the high nibble of a byte, read as signed.
    pub fn shift_right_arithmetic(&self, a: Value<'c, 'b>, b: Value<'c, 'b>) -> Result<Value<'c, 'b>, Error> {
        self.binary("stablehlo.shift_right_arithmetic", Accepts::IntOrBool, a, b)
    }

    /// Logical/bitwise or (integers or i1).
    pub fn or(&self, a: Value<'c, 'b>, b: Value<'c, 'b>) -> Result<Value<'c, 'b>, Error> {
        self.binary("stablehlo.or", Accepts::IntOrBool, a, b)
    }

    /// Logical/bitwise not (integers or i1).
    pub fn not(&self, a: Value<'c, 'b>) -> Result<Value<'c, 'b>, Error> {
        self.unary("stablehlo.not", Accepts::IntOrBool, a)
    }

    /// `-a` (floats, signed integers).
    pub fn neg(&self, a: Value<'c, 'b>) -> Result<Value<'c, 'b>, Error> {
        self.unary("stablehlo.negate", Accepts::Signed, a)
    }

    /// `|a|` (floats, signed integers).
    pub fn abs(&self, a: Value<'c, 'b>) -> Result<Value<'c, 'b>, Error> {
        self.unary("stablehlo.abs", Accepts::Signed, a)
    }

    /// `e^a` (floats).
    pub fn exp(&self, a: Value<'c, 'b>) -> Result<Value<'c, 'b>, Error> {
        self.unary("stablehlo.exponential", Accepts::Float, a)
    }

    /// The largest integer not above `a` (floats).
    pub fn floor(&self, a: Value<'c, 'b>) -> Result<Value<'c, 'b>, Error> {
        self.unary("stablehlo.floor", Accepts::Float, a)
    }

    /// Natural logarithm (floats).
    pub fn log(&self, a: Value<'c, 'b>) -> Result<Value<'c, 'b>, Error> {
        self.unary("stablehlo.log", Accepts::Float, a)
    }

    /// `1/sqrt(a)` (floats).
    pub fn rsqrt(&self, a: Value<'c, 'b>) -> Result<Value<'c, 'b>, Error> {
        self.unary("stablehlo.rsqrt", Accepts::Float, a)
    }

    /// `sqrt(a)` (floats).
    pub fn sqrt(&self, a: Value<'c, 'b>) -> Result<Value<'c, 'b>, Error> {
        self.unary("stablehlo.sqrt", Accepts::Float, a)
    }

    /// `erf(a)` (floats). StableHLO has no erf; CHLO's, which IREE's StableHLO input
    /// legalizes, is the portable spelling (MLX's exact GELU needs it).
    pub fn erf(&self, a: Value<'c, 'b>) -> Result<Value<'c, 'b>, Error> {
        self.unary("chlo.erf", Accepts::Float, a)
    }

    /// `tanh(a)` (floats).
    pub fn tanh(&self, a: Value<'c, 'b>) -> Result<Value<'c, 'b>, Error> {
        self.unary("stablehlo.tanh", Accepts::Float, a)
    }

    /// Sigmoid `1/(1+e^-a)` (floats).
    pub fn logistic(&self, a: Value<'c, 'b>) -> Result<Value<'c, 'b>, Error> {
        self.unary("stablehlo.logistic", Accepts::Float, a)
    }

    /// Rounds to the nearest integer, ties to even (floats); used to quantize activations.
    pub fn round_nearest_even(&self, a: Value<'c, 'b>) -> Result<Value<'c, 'b>, Error> {
        self.unary("stablehlo.round_nearest_even", Accepts::Float, a)
    }

    /// `sin(a)` (floats).
    pub fn sin(&self, a: Value<'c, 'b>) -> Result<Value<'c, 'b>, Error> {
        self.unary("stablehlo.sine", Accepts::Float, a)
    }

    /// `cos(a)` (floats).
    pub fn cos(&self, a: Value<'c, 'b>) -> Result<Value<'c, 'b>, Error> {
        self.unary("stablehlo.cosine", Accepts::Float, a)
    }

    /// Elementwise comparison; the result has `a`'s shape and element type `i1`.
    pub fn compare(&self, a: Value<'c, 'b>, b: Value<'c, 'b>, dir: Cmp) -> Result<Value<'c, 'b>, Error> {
        const OP: &str = "stablehlo.compare";
        let (ta, tb) = (a.ty(), b.ty());
        if ta != tb {
            return Err(Error::op(OP, "operands of the same type", format!("{ta} and {tb}")));
        }
        let dir_attr = self.parse_attr(OP, &format!("#stablehlo<comparison_direction {dir}>"))?;
        self.emit1(OP, &[a, b], vec![("comparison_direction", dir_attr)], ta.with_elem(ElementType::I1))
    }

    /// `pred ? on_true : on_false` elementwise. `pred` is `i1` with the shape of the
    /// branches, or a rank-0 `i1` choosing one branch as a whole.
    pub fn select(
        &self,
        pred: Value<'c, 'b>,
        on_true: Value<'c, 'b>,
        on_false: Value<'c, 'b>,
    ) -> Result<Value<'c, 'b>, Error> {
        const OP: &str = "stablehlo.select";
        let (tp, tt, tf) = (pred.ty(), on_true.ty(), on_false.ty());
        if tt != tf {
            return Err(Error::op(OP, "branches of the same type", format!("{tt} and {tf}")));
        }
        if tp.elem != ElementType::I1 || !(tp.shape == tt.shape || tp.rank() == 0) {
            return Err(Error::op(OP, format!("predicate {} or tensor<i1>", tt.with_elem(ElementType::I1)), tp));
        }
        self.emit1(OP, &[pred, on_true, on_false], Vec::new(), tt)
    }

    /// Converts elements to `elem` (same shape). Float to int truncates toward zero.
    pub fn convert(&self, a: Value<'c, 'b>, elem: ElementType) -> Result<Value<'c, 'b>, Error> {
        let t = a.ty().with_elem(elem);
        self.emit1("stablehlo.convert", &[a], Vec::new(), t)
    }

    /// Reinterprets each element's bits as `elem`, of the same bit width (`i32` <-> `f32`):
    /// how a 16-bit pattern becomes a float where the target has no arithmetic of its type.
    pub fn bitcast_convert(&self, a: Value<'c, 'b>, elem: ElementType) -> Result<Value<'c, 'b>, Error> {
        const OP: &str = "stablehlo.bitcast_convert";
        let from = a.ty();
        if from.elem.bits() != elem.bits() {
            return Err(Error::op(OP, format!("an element type of {} bits like {elem}", elem.bits()), from));
        }
        self.emit1(OP, &[a], Vec::new(), from.with_elem(elem))
    }

    /// A constant of `a`'s type with every element `value` (for scalar arithmetic).
    pub fn splat_like(&self, a: Value<'c, 'b>, value: f64) -> Result<Value<'c, 'b>, Error> {
        self.splat(value, &a.ty())
    }

    /// `a + value` with `value` splatted to `a`'s type.
    pub fn add_scalar(&self, a: Value<'c, 'b>, value: f64) -> Result<Value<'c, 'b>, Error> {
        let s = self.splat_like(a, value)?;
        self.add(a, s)
    }

    /// `a * value` with `value` splatted to `a`'s type.
    pub fn mul_scalar(&self, a: Value<'c, 'b>, value: f64) -> Result<Value<'c, 'b>, Error> {
        let s = self.splat_like(a, value)?;
        self.mul(a, s)
    }
}
