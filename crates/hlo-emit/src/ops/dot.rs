//! `stablehlo.dot_general` with batch and contracting dimensions.

use crate::error::Error;
use crate::func::{Func, Value, check_dims, ix, list};
use crate::types::ElementType;

/// Dimension numbers of [`Func::dot_general`]. Batch dims pair up (`lhs_batch[i]` with
/// `rhs_batch[i]`), as do contracting dims.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash)]
pub struct DotDims {
    /// Batch dims of the left operand.
    pub lhs_batch: Vec<i64>,
    /// Batch dims of the right operand.
    pub rhs_batch: Vec<i64>,
    /// Contracting dims of the left operand.
    pub lhs_contract: Vec<i64>,
    /// Contracting dims of the right operand.
    pub rhs_contract: Vec<i64>,
}

impl DotDims {
    /// Contract `lhs` dim 1 with `rhs` dim 0: `W·x` for `W: [out, in]` and `x: [in]` or
    /// `[in, n]`, the projection layout IREE handles best.
    pub fn matmul() -> Self {
        Self::contract(&[1], &[0])
    }

    /// Contract the given dims, no batch dims.
    pub fn contract(lhs: &[i64], rhs: &[i64]) -> Self {
        Self { lhs_contract: lhs.to_vec(), rhs_contract: rhs.to_vec(), ..Self::default() }
    }

    /// Adds batch dims: `DotDims::contract(&[2], &[1]).batch(&[0], &[0])`.
    pub fn batch(mut self, lhs: &[i64], rhs: &[i64]) -> Self {
        self.lhs_batch = lhs.to_vec();
        self.rhs_batch = rhs.to_vec();
        self
    }

    fn attr_text(&self) -> String {
        let mut fields = Vec::new();
        for (name, v) in [
            ("lhs_batching_dimensions", &self.lhs_batch),
            ("rhs_batching_dimensions", &self.rhs_batch),
            ("lhs_contracting_dimensions", &self.lhs_contract),
            ("rhs_contracting_dimensions", &self.rhs_contract),
        ] {
            // StableHLO's printer omits empty lists; do the same.
            if !v.is_empty() {
                fields.push(format!("{name} = {}", list(v)));
            }
        }
        format!("#stablehlo.dot<{}>", fields.join(", "))
    }
}

impl<'c, 'b> Func<'c, 'b> {
    /// General dot product. The result shape is the batch dims, then the remaining lhs
    /// dims, then the remaining rhs dims; operands must share the element type.
    pub fn dot_general(&self, lhs: Value<'c, 'b>, rhs: Value<'c, 'b>, dims: DotDims) -> Result<Value<'c, 'b>, Error> {
        let elem = lhs.elem();
        self.dot_general_to(lhs, rhs, dims, elem)
    }

    /// [`Func::dot_general`] with an explicit result element type: integer operands may
    /// accumulate into a wider integer (`i16 x i16 -> i32`), floats into a wider float.
    pub fn dot_general_to(
        &self,
        lhs: Value<'c, 'b>,
        rhs: Value<'c, 'b>,
        dims: DotDims,
        out: ElementType,
    ) -> Result<Value<'c, 'b>, Error> {
        const OP: &str = "stablehlo.dot_general";
        let (tl, tr) = (lhs.ty(), rhs.ty());
        if tl.elem != tr.elem {
            return Err(Error::op(OP, "operands of one element type", format!("{tl} and {tr}")));
        }
        let same_kind = (out.is_float() && tl.elem.is_float()) || (out.is_integer() && tl.elem.is_integer());
        if !same_kind || out.bits() < tl.elem.bits() {
            return Err(Error::op(
                OP,
                format!("a result type of the operands' kind and at least as wide as {}", tl.elem),
                out,
            ));
        }
        if dims.lhs_batch.len() != dims.rhs_batch.len() || dims.lhs_contract.len() != dims.rhs_contract.len() {
            return Err(Error::op(
                OP,
                "as many lhs as rhs batch dims, and as many lhs as rhs contracting dims",
                format!(
                    "batch {} x {}, contracting {} x {}",
                    list(&dims.lhs_batch),
                    list(&dims.rhs_batch),
                    list(&dims.lhs_contract),
                    list(&dims.rhs_contract)
                ),
            ));
        }
        let lhs_all: Vec<i64> = dims.lhs_batch.iter().chain(&dims.lhs_contract).copied().collect();
        let rhs_all: Vec<i64> = dims.rhs_batch.iter().chain(&dims.rhs_contract).copied().collect();
        check_dims(OP, "lhs batch and contracting dims", &lhs_all, tl.rank())?;
        check_dims(OP, "rhs batch and contracting dims", &rhs_all, tr.rank())?;
        for (kind, l, r) in
            [("batch", &dims.lhs_batch, &dims.rhs_batch), ("contracting", &dims.lhs_contract, &dims.rhs_contract)]
        {
            for (&a, &b) in l.iter().zip(r) {
                let (sa, sb) = (tl.shape[ix(a)], tr.shape[ix(b)]);
                if sa != sb {
                    return Err(Error::op(
                        OP,
                        format!("{kind} dims of equal size (lhs dim {a} of {tl}, rhs dim {b} of {tr})"),
                        format!("{sa} and {sb}"),
                    ));
                }
            }
        }
        let mut shape: Vec<i64> = dims.lhs_batch.iter().map(|&d| tl.shape[ix(d)]).collect();
        shape.extend((0..tl.rank()).filter(|&i| !lhs_all.contains(&(i as i64))).map(|i| tl.shape[i]));
        shape.extend((0..tr.rank()).filter(|&i| !rhs_all.contains(&(i as i64))).map(|i| tr.shape[i]));
        let attr = self.parse_attr(OP, &dims.attr_text())?;
        self.emit1(OP, &[lhs, rhs], vec![("dot_dimension_numbers", attr)], tl.with_shape(&shape).with_elem(out))
    }

    /// `lhs · rhs` contracting the last dim of `lhs` with the first of `rhs` (e.g. `W·x`).
    pub fn dot(&self, lhs: Value<'c, 'b>, rhs: Value<'c, 'b>) -> Result<Value<'c, 'b>, Error> {
        let last = lhs.rank() as i64 - 1;
        self.dot_general(lhs, rhs, DotDims::contract(&[last], &[0]))
    }
}
