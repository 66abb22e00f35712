//! `stablehlo.reduce` with a built body region, the common sum/max/min reductions, and
//! argmax as a variadic (value, index) reduce.

use crate::error::Error;
use crate::func::{Func, Value, check_dims, list};
use crate::ops::elementwise::Cmp;
use crate::types::{ElementType, TensorType};

pub(crate) fn types_text(ts: &[TensorType]) -> String {
    let items: Vec<String> = ts.iter().map(TensorType::to_string).collect();
    format!("({})", items.join(", "))
}

impl<'c, 'b> Func<'c, 'b> {
    /// General (variadic) reduce of `inputs` over `dims`, starting from `inits` (one
    /// rank-0 tensor per input, of its element type). `body` gets a builder and
    /// `2 * inputs.len()` rank-0 arguments — the accumulated values, then the incoming
    /// ones — and returns one rank-0 value per input. Results drop the reduced dims.
    pub fn reduce<F>(
        &self,
        inputs: &[Value<'c, 'b>],
        inits: &[Value<'c, 'b>],
        dims: &[i64],
        body: F,
    ) -> Result<Vec<Value<'c, 'b>>, Error>
    where
        F: for<'r> FnOnce(&Func<'c, 'r>, &[Value<'c, 'r>]) -> Result<Vec<Value<'c, 'r>>, Error>,
    {
        const OP: &str = "stablehlo.reduce";
        let Some(first) = inputs.first() else {
            return Err(Error::op(OP, "at least one input", "none"));
        };
        let shape = first.shape();
        let in_types: Vec<TensorType> = inputs.iter().map(Value::ty).collect();
        if let Some(bad) = in_types.iter().find(|t| t.shape != shape) {
            return Err(Error::op(OP, format!("inputs of one shape {}", list(&shape)), bad));
        }
        let scalars: Vec<TensorType> = in_types.iter().map(|t| t.elem.scalar()).collect();
        let init_types: Vec<TensorType> = inits.iter().map(Value::ty).collect();
        if init_types != scalars {
            return Err(Error::op(OP, format!("init values {}", types_text(&scalars)), types_text(&init_types)));
        }
        check_dims(OP, "dimensions", dims, shape.len())?;
        let body_args: Vec<TensorType> = scalars.iter().chain(&scalars).cloned().collect();
        let (region, outs) = self.region(&body_args, "stablehlo.return", body)?;
        if outs != scalars {
            return Err(Error::op(OP, format!("body results {}", types_text(&scalars)), types_text(&outs)));
        }
        let kept: Vec<i64> = (0..shape.len()).filter(|&i| !dims.contains(&(i as i64))).map(|i| shape[i]).collect();
        let results: Vec<TensorType> = in_types.iter().map(|t| t.with_shape(&kept)).collect();
        let operands: Vec<Value<'c, 'b>> = inputs.iter().chain(inits).copied().collect();
        let attrs = vec![("dimensions", self.i64_array(dims))];
        self.emit(OP, &operands, attrs, &results, vec![region])
    }

    fn reduce_with(
        &self,
        a: Value<'c, 'b>,
        dims: &[i64],
        init: f64,
        combine: for<'r> fn(&Func<'c, 'r>, Value<'c, 'r>, Value<'c, 'r>) -> Result<Value<'c, 'r>, Error>,
    ) -> Result<Value<'c, 'b>, Error> {
        let init = self.scalar(init, a.elem())?;
        let mut out = self.reduce(&[a], &[init], dims, |b, args| Ok(vec![combine(b, args[0], args[1])?]))?;
        out.pop().ok_or_else(|| Error::mlir("stablehlo.reduce", "no result"))
    }

    /// Sum over `dims`.
    pub fn reduce_sum(&self, a: Value<'c, 'b>, dims: &[i64]) -> Result<Value<'c, 'b>, Error> {
        self.reduce_with(a, dims, 0.0, |b, x, y| b.add(x, y))
    }

    /// Maximum over `dims` (starting from -inf, or the type's minimum for integers).
    pub fn reduce_max(&self, a: Value<'c, 'b>, dims: &[i64]) -> Result<Value<'c, 'b>, Error> {
        let (lo, _) = a.elem().range();
        self.reduce_with(a, dims, lo, |b, x, y| b.max(x, y))
    }

    /// Minimum over `dims` (starting from +inf, or the type's maximum for integers).
    pub fn reduce_min(&self, a: Value<'c, 'b>, dims: &[i64]) -> Result<Value<'c, 'b>, Error> {
        let (_, hi) = a.elem().range();
        self.reduce_with(a, dims, hi, |b, x, y| b.min(x, y))
    }

    /// Index (i32) of the maximum along `dim`; ties go to the lowest index. The result
    /// drops `dim`. NaNs never win (they compare false).
    pub fn argmax(&self, a: Value<'c, 'b>, dim: i64) -> Result<Value<'c, 'b>, Error> {
        Ok(self.max_and_argmax(a, dim)?.1)
    }

    /// The maximum along `dim` and its index (i32), as [`Func::argmax`] finds them: one
    /// reduction gives both.
    pub fn max_and_argmax(&self, a: Value<'c, 'b>, dim: i64) -> Result<(Value<'c, 'b>, Value<'c, 'b>), Error> {
        let t = a.ty();
        if t.elem.is_bool() {
            return Err(Error::op("argmax", "a float or integer tensor", t));
        }
        check_dims("argmax", "dim", &[dim], t.rank())?;
        let idx = self.iota(&t.with_elem(ElementType::I32), dim)?;
        let (lo, _) = t.elem.range();
        let init_v = self.scalar(lo, t.elem)?;
        let init_i = self.scalar(0.0, ElementType::I32)?;
        let out = self.reduce(&[a, idx], &[init_v, init_i], &[dim], |b, x| {
            let (av, ai, bv, bi) = (x[0], x[1], x[2], x[3]);
            // Take `a` when it is larger, or equal with a lower index: an associative,
            // commutative combine, so the order IREE reduces in does not matter.
            let gt = b.compare(av, bv, Cmp::Gt)?;
            let eq = b.compare(av, bv, Cmp::Eq)?;
            let lt = b.compare(ai, bi, Cmp::Lt)?;
            let tie = b.and(eq, lt)?;
            let take_a = b.or(gt, tie)?;
            Ok(vec![b.select(take_a, av, bv)?, b.select(take_a, ai, bi)?])
        })?;
        match out[..] {
            [v, i] => Ok((v, i)),
            _ => Err(Error::mlir("stablehlo.reduce", "expected two results")),
        }
    }
}
