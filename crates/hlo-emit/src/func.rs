//! The function (block) builder, typed value handles, and the plumbing every op uses to emit
//! a generic-form operation once its Rust-side checks passed.

use crate::error::Error;
use crate::module::{Context, Global, global_load_attr};
use crate::types::{ElementType, TensorType};
use melior::ir::attribute::{BoolAttribute, DenseI64ArrayAttribute, IntegerAttribute};
use melior::ir::block::BlockLike;
use melior::ir::operation::OperationBuilder;
use melior::ir::r#type::{DimSize, ShapedTypeLike};
use melior::ir::r#type::{IntegerType, RankedTensorType};
use melior::ir::{Attribute, Block, Identifier, Location, Region, RegionLike, ValueLike};
use std::fmt;

/// A tensor value inside a function (or a reduce body). Cheap to copy; it knows its
/// [`TensorType`]. The lifetime `'b` ties it to the block it was built in, so values
/// cannot leak into another function or region.
#[derive(Clone, Copy, PartialEq)]
pub struct Value<'c, 'b> {
    raw: melior::ir::Value<'c, 'b>,
    elem: ElementType,
}

impl<'c, 'b> Value<'c, 'b> {
    /// Element type.
    pub fn elem(&self) -> ElementType {
        self.elem
    }

    /// Shape (dimension sizes).
    pub fn shape(&self) -> Vec<i64> {
        // Every value this crate creates is a static ranked tensor, so the fallbacks below
        // are unreachable; they keep this infallible without panicking.
        match RankedTensorType::try_from(self.raw.r#type()) {
            Ok(t) => (0..t.rank())
                .map(|i| match t.dim_size(i) {
                    Ok(DimSize::Static(n)) => i64::try_from(n).unwrap_or(-1),
                    _ => -1,
                })
                .collect(),
            Err(_) => Vec::new(),
        }
    }

    /// Number of dimensions.
    pub fn rank(&self) -> usize {
        RankedTensorType::try_from(self.raw.r#type()).map_or(0, |t| t.rank())
    }

    /// Full tensor type.
    pub fn ty(&self) -> TensorType {
        TensorType { shape: self.shape(), elem: self.elem }
    }

    /// The underlying melior value (escape hatch).
    pub fn raw(&self) -> melior::ir::Value<'c, 'b> {
        self.raw
    }
}

impl fmt::Debug for Value<'_, '_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Value({})", self.ty())
    }
}

/// Builds the ops of one block: a function body, or the body of a `reduce`.
///
/// All op methods take `&self` and return a checked [`Value`]; a check failure returns
/// [`Error`] and emits nothing.
pub struct Func<'c, 'b> {
    ctx: &'c Context,
    block: &'b Block<'c>,
    module_id: u64,
}

impl fmt::Debug for Func<'_, '_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Func").field("module_id", &self.module_id).finish_non_exhaustive()
    }
}

/// Builds a one-block region: block arguments of `inputs`, ops from `build`, then the
/// `terminator` op returning `build`'s results. Returns the region and the result types.
pub(crate) fn build_region<'c, F>(
    ctx: &'c Context,
    module_id: u64,
    inputs: &[TensorType],
    terminator: &str,
    build: F,
) -> Result<(Region<'c>, Vec<TensorType>), Error>
where
    F: for<'r> FnOnce(&Func<'c, 'r>, &[Value<'c, 'r>]) -> Result<Vec<Value<'c, 'r>>, Error>,
{
    let loc = Location::unknown(ctx.raw());
    let arg_types: Vec<_> = inputs.iter().map(|t| (t.to_mlir(ctx.raw()), loc)).collect();
    let block = Block::new(&arg_types);
    let out_types = {
        let f = Func { ctx, block: &block, module_id };
        let args = inputs
            .iter()
            .enumerate()
            .map(|(i, t)| {
                let raw = block.argument(i).map_err(|e| Error::mlir("block argument", e))?;
                Ok(Value { raw: raw.into(), elem: t.elem })
            })
            .collect::<Result<Vec<_>, Error>>()?;
        let outs = build(&f, &args)?;
        let raws: Vec<melior::ir::Value<'c, '_>> = outs.iter().map(|v| v.raw).collect();
        let op = OperationBuilder::new(terminator, loc)
            .add_operands(&raws)
            .build()
            .map_err(|e| Error::mlir(terminator, e))?;
        block.append_operation(op);
        outs.iter().map(|v| v.ty()).collect::<Vec<_>>()
    };
    let region = Region::new();
    region.append_block(block);
    Ok((region, out_types))
}

impl<'c, 'b> Func<'c, 'b> {
    /// The context the function is built in.
    pub fn context(&self) -> &'c Context {
        self.ctx
    }

    fn mctx(&self) -> &'c melior::Context {
        self.ctx.raw()
    }

    /// The block ops are appended to (for ops built outside [`Func::emit`]).
    pub(crate) fn block(&self) -> &'b Block<'c> {
        self.block
    }

    /// A typed handle for a tensor result built outside [`Func::emit`].
    pub(crate) fn wrap(&self, raw: melior::ir::Value<'c, 'b>, elem: ElementType) -> Value<'c, 'b> {
        Value { raw, elem }
    }

    /// Emits `op` in generic form with the given operands, attributes, result types and
    /// regions. Callers have checked everything; MLIR only fails here on malformed input
    /// that would be a bug in this crate, which still surfaces as an error, not a panic.
    pub(crate) fn emit(
        &self,
        op: &'static str,
        operands: &[Value<'c, 'b>],
        attrs: Vec<(&str, Attribute<'c>)>,
        results: &[TensorType],
        regions: Vec<Region<'c>>,
    ) -> Result<Vec<Value<'c, 'b>>, Error> {
        let ctx = self.mctx();
        let raws: Vec<melior::ir::Value<'c, 'b>> = operands.iter().map(|v| v.raw).collect();
        let attrs: Vec<(Identifier<'c>, Attribute<'c>)> =
            attrs.into_iter().map(|(k, v)| (Identifier::new(ctx, k), v)).collect();
        let types: Vec<_> = results.iter().map(|t| t.to_mlir(ctx)).collect();
        let built = OperationBuilder::new(op, Location::unknown(ctx))
            .add_operands(&raws)
            .add_attributes(&attrs)
            .add_results(&types)
            .add_regions_vec(regions)
            .build()
            .map_err(|e| Error::mlir(op, e))?;
        let op_ref = self.block.append_operation(built);
        results
            .iter()
            .enumerate()
            .map(|(i, t)| {
                let r = op_ref.result(i).map_err(|e| Error::mlir(op, e))?;
                Ok(Value { raw: r.into(), elem: t.elem })
            })
            .collect()
    }

    /// [`Func::emit`] for single-result ops without regions.
    pub(crate) fn emit1(
        &self,
        op: &'static str,
        operands: &[Value<'c, 'b>],
        attrs: Vec<(&str, Attribute<'c>)>,
        result: TensorType,
    ) -> Result<Value<'c, 'b>, Error> {
        let mut v = self.emit(op, operands, attrs, &[result], Vec::new())?;
        v.pop().ok_or_else(|| Error::mlir(op, "no result"))
    }

    /// Builds a region with this function's context (for ops with bodies).
    pub(crate) fn region<F>(
        &self,
        inputs: &[TensorType],
        terminator: &str,
        build: F,
    ) -> Result<(Region<'c>, Vec<TensorType>), Error>
    where
        F: for<'r> FnOnce(&Func<'c, 'r>, &[Value<'c, 'r>]) -> Result<Vec<Value<'c, 'r>>, Error>,
    {
        build_region(self.ctx, self.module_id, inputs, terminator, build)
    }

    pub(crate) fn i64_array(&self, v: &[i64]) -> Attribute<'c> {
        DenseI64ArrayAttribute::new(self.mctx(), v).into()
    }

    pub(crate) fn i64_attr(&self, v: i64) -> Attribute<'c> {
        IntegerAttribute::new(IntegerType::new(self.mctx(), 64).into(), v).into()
    }

    pub(crate) fn bool_attr(&self, v: bool) -> Attribute<'c> {
        BoolAttribute::new(self.mctx(), v).into()
    }

    /// Parses attribute text (StableHLO attributes parse as opaque attributes).
    pub(crate) fn parse_attr(&self, op: &'static str, text: &str) -> Result<Attribute<'c>, Error> {
        Attribute::parse(self.mctx(), text).ok_or_else(|| Error::mlir(format!("{op} attribute"), text))
    }

    /// Reads a parameter-bound global: `util.global.load @name`.
    pub fn load(&self, global: &Global) -> Result<Value<'c, 'b>, Error> {
        const OP: &str = "util.global.load";
        if global.module_id != self.module_id {
            return Err(Error::op(
                OP,
                "a global declared in this function's module",
                format!("@{} from another module", global.name),
            ));
        }
        let (k, v) = global_load_attr(self.ctx, global);
        let ctx = self.mctx();
        let op = OperationBuilder::new(OP, Location::unknown(ctx))
            .add_attributes(&[(k, v)])
            .add_results(&[global.ty.to_mlir(ctx)])
            .build()
            .map_err(|e| Error::mlir(OP, e))?;
        let op_ref = self.block.append_operation(op);
        let r = op_ref.result(0).map_err(|e| Error::mlir(OP, e))?;
        Ok(Value { raw: r.into(), elem: global.ty.elem })
    }
}

/// `[1, 2, 3]` for error messages and attribute text.
pub(crate) fn list(v: &[i64]) -> String {
    let items: Vec<String> = v.iter().map(i64::to_string).collect();
    format!("[{}]", items.join(", "))
}

/// Checks that `dims` are distinct and each in `0..rank`.
pub(crate) fn check_dims(op: &'static str, what: &str, dims: &[i64], rank: usize) -> Result<(), Error> {
    let mut seen = vec![false; rank];
    for &d in dims {
        let ok = usize::try_from(d).ok().filter(|&u| u < rank);
        match ok {
            Some(u) if !seen[u] => seen[u] = true,
            _ => {
                return Err(Error::op(op, format!("{what} distinct and in 0..{rank}"), list(dims)));
            }
        }
    }
    Ok(())
}

/// Checks that `dims` is strictly increasing.
pub(crate) fn check_sorted(op: &'static str, what: &str, dims: &[i64]) -> Result<(), Error> {
    if dims.windows(2).all(|w| w[0] < w[1]) {
        Ok(())
    } else {
        Err(Error::op(op, format!("{what} sorted ascending"), list(dims)))
    }
}

/// Index `d` (already range-checked) as usize.
pub(crate) fn ix(d: i64) -> usize {
    usize::try_from(d).unwrap_or(usize::MAX)
}
