//! Constants (splat and dense) and iota.

use crate::error::Error;
use crate::func::{Func, Value, check_dims};
use crate::types::{ElementType, TensorType};
use melior::ir::Attribute;
use melior::ir::attribute::{DenseElementsAttribute, FloatAttribute, IntegerAttribute};

const CONSTANT: &str = "stablehlo.constant";

impl<'c, 'b> Func<'c, 'b> {
    fn constant(&self, value: Attribute<'c>, ty: TensorType) -> Result<Value<'c, 'b>, Error> {
        self.emit1(CONSTANT, &[], vec![("value", value)], ty)
    }

    /// A constant of type `ty` with every element `value`. For integer types `value` must
    /// be a whole number in the type's range (`i1`: 0 or 1); float types round to nearest.
    pub fn splat(&self, value: f64, ty: &TensorType) -> Result<Value<'c, 'b>, Error> {
        ty.validate(CONSTANT)?;
        let ctx = self.context().raw();
        let elem_ty = ty.elem.to_mlir(ctx);
        let elem_attr: Attribute<'c> = if ty.elem.is_float() {
            FloatAttribute::new(ctx, elem_ty, value).into()
        } else {
            let (lo, hi) = ty.elem.range();
            if !(value.fract() == 0.0 && value >= lo && value <= hi) {
                return Err(Error::op(CONSTANT, format!("a whole number in {lo}..={hi} for {}", ty.elem), value));
            }
            // Values above i64::MAX only occur for ui64; pass their bit pattern.
            let bits = if value >= 9_223_372_036_854_775_808.0 { value as u64 as i64 } else { value as i64 };
            IntegerAttribute::new(elem_ty, bits).into()
        };
        let dense = DenseElementsAttribute::splat(ty.to_mlir(ctx), elem_attr);
        self.constant(dense.into(), ty.clone())
    }

    /// A rank-0 constant `value` of element type `elem` (see [`Func::splat`]).
    pub fn scalar(&self, value: f64, elem: ElementType) -> Result<Value<'c, 'b>, Error> {
        self.splat(value, &elem.scalar())
    }

    fn check_count(shape: &[i64], n: usize) -> Result<TensorType, Error> {
        let ty = TensorType::new(shape, ElementType::F32);
        ty.validate(CONSTANT)?;
        if usize::try_from(ty.num_elements()).ok() != Some(n) {
            return Err(Error::op(
                CONSTANT,
                format!("{} values for shape {:?}", ty.num_elements(), shape),
                format!("{n} values"),
            ));
        }
        Ok(ty)
    }

    /// A dense f32 constant of `shape` from `values` in row-major order.
    pub fn constant_f32(&self, values: &[f32], shape: &[i64]) -> Result<Value<'c, 'b>, Error> {
        let ty = Self::check_count(shape, values.len())?;
        let dense = DenseElementsAttribute::f32_values(ty.to_mlir(self.context().raw()), values);
        self.constant(dense.into(), ty)
    }

    /// A dense i32 constant of `shape` from `values` in row-major order.
    pub fn constant_i32(&self, values: &[i32], shape: &[i64]) -> Result<Value<'c, 'b>, Error> {
        let ty = Self::check_count(shape, values.len())?.with_elem(ElementType::I32);
        let dense = DenseElementsAttribute::i32_values(ty.to_mlir(self.context().raw()), values);
        self.constant(dense.into(), ty)
    }

    /// A tensor of type `ty` counting 0, 1, 2, ... along `dim` (constant along the others).
    pub fn iota(&self, ty: &TensorType, dim: i64) -> Result<Value<'c, 'b>, Error> {
        const OP: &str = "stablehlo.iota";
        ty.validate(OP)?;
        if ty.elem.is_bool() {
            return Err(Error::op(OP, "a float or integer element type", ty));
        }
        check_dims(OP, "iota_dimension", &[dim], ty.rank())?;
        let attr = self.i64_attr(dim);
        self.emit1(OP, &[], vec![("iota_dimension", attr)], ty.clone())
    }
}
