//! Shape ops: reshape, transpose, broadcasts, concatenate, static and dynamic slices.

use crate::error::Error;
use crate::func::{Func, Value, check_dims, ix, list};
use crate::types::TensorType;

impl<'c, 'b> Func<'c, 'b> {
    /// Reshapes to `shape` (same element count, row-major order kept).
    pub fn reshape(&self, a: Value<'c, 'b>, shape: &[i64]) -> Result<Value<'c, 'b>, Error> {
        const OP: &str = "stablehlo.reshape";
        let t = a.ty();
        let out = t.with_shape(shape);
        out.validate(OP)?;
        if out.num_elements() != t.num_elements() {
            return Err(Error::op(
                OP,
                format!("{} elements like {t}", t.num_elements()),
                format!("{out} with {} elements", out.num_elements()),
            ));
        }
        self.emit1(OP, &[a], Vec::new(), out)
    }

    /// Permutes dimensions: result dim `i` is operand dim `perm[i]`.
    pub fn transpose(&self, a: Value<'c, 'b>, perm: &[i64]) -> Result<Value<'c, 'b>, Error> {
        const OP: &str = "stablehlo.transpose";
        let t = a.ty();
        if perm.len() != t.rank() {
            return Err(Error::op(OP, format!("a permutation of {} dims for {t}", t.rank()), list(perm)));
        }
        check_dims(OP, "permutation", perm, t.rank())?;
        let shape: Vec<i64> = perm.iter().map(|&p| t.shape[ix(p)]).collect();
        let attr = self.i64_array(perm);
        self.emit1(OP, &[a], vec![("permutation", attr)], t.with_shape(&shape))
    }

    /// Reverses the order of elements along `dims` (distinct, each in range).
    pub fn reverse(&self, a: Value<'c, 'b>, dims: &[i64]) -> Result<Value<'c, 'b>, Error> {
        const OP: &str = "stablehlo.reverse";
        let t = a.ty();
        check_dims(OP, "dimensions", dims, t.rank())?;
        let attr = self.i64_array(dims);
        self.emit1(OP, &[a], vec![("dimensions", attr)], t)
    }

    /// Broadcasts to `shape`, mapping operand dim `i` to result dim `dims[i]`; each
    /// operand dim must be 1 or equal to the result dim it maps to.
    pub fn broadcast_in_dim(&self, a: Value<'c, 'b>, shape: &[i64], dims: &[i64]) -> Result<Value<'c, 'b>, Error> {
        const OP: &str = "stablehlo.broadcast_in_dim";
        let t = a.ty();
        let out = t.with_shape(shape);
        out.validate(OP)?;
        if dims.len() != t.rank() {
            return Err(Error::op(OP, format!("{} broadcast_dimensions for {t}", t.rank()), list(dims)));
        }
        check_dims(OP, "broadcast_dimensions", dims, shape.len())?;
        for (i, &d) in dims.iter().enumerate() {
            let (from, to) = (t.shape[i], shape[ix(d)]);
            if from != 1 && from != to {
                return Err(Error::op(
                    OP,
                    format!("operand dim {i} of size 1 or {to} (result dim {d} of {out})"),
                    format!("size {from} in {t}"),
                ));
            }
        }
        let attr = self.i64_array(dims);
        self.emit1(OP, &[a], vec![("broadcast_dimensions", attr)], out)
    }

    /// NumPy-style broadcast to `shape`: operand dims align with the trailing result dims
    /// and must be 1 or equal. Returns `a` itself when the shape already matches.
    pub fn broadcast_to(&self, a: Value<'c, 'b>, shape: &[i64]) -> Result<Value<'c, 'b>, Error> {
        let t = a.ty();
        if t.shape == shape {
            return Ok(a);
        }
        if t.rank() > shape.len() {
            return Err(Error::op(
                "broadcast_to",
                format!("an operand of rank <= {} for shape {}", shape.len(), list(shape)),
                t,
            ));
        }
        let lead = (shape.len() - t.rank()) as i64;
        let dims: Vec<i64> = (0..t.rank() as i64).map(|i| lead + i).collect();
        self.broadcast_in_dim(a, shape, &dims)
    }

    /// Concatenates along `dim`; all other dims and the element type must agree.
    pub fn concatenate(&self, parts: &[Value<'c, 'b>], dim: i64) -> Result<Value<'c, 'b>, Error> {
        const OP: &str = "stablehlo.concatenate";
        let Some(first) = parts.first() else {
            return Err(Error::op(OP, "at least one operand", "none"));
        };
        let t0 = first.ty();
        check_dims(OP, "dimension", &[dim], t0.rank())?;
        let d = ix(dim);
        let mut shape = t0.shape.clone();
        shape[d] = 0;
        for p in parts {
            let t = p.ty();
            let same_rest = t.rank() == t0.rank()
                && t.elem == t0.elem
                && (0..t.rank()).all(|i| i == d || t.shape[i] == t0.shape[i]);
            if !same_rest {
                return Err(Error::op(OP, format!("operands matching {t0} except in dim {dim}"), t));
            }
            shape[d] += t.shape[d];
        }
        let attr = self.i64_attr(dim);
        self.emit1(OP, parts, vec![("dimension", attr)], t0.with_shape(&shape))
    }

    /// Static slice `[start, limit)` with `strides` per dim.
    pub fn slice(
        &self,
        a: Value<'c, 'b>,
        start: &[i64],
        limit: &[i64],
        strides: &[i64],
    ) -> Result<Value<'c, 'b>, Error> {
        const OP: &str = "stablehlo.slice";
        let t = a.ty();
        let r = t.rank();
        if start.len() != r || limit.len() != r || strides.len() != r {
            return Err(Error::op(
                OP,
                format!("start, limit and strides of length {r} for {t}"),
                format!("{}, {}, {}", list(start), list(limit), list(strides)),
            ));
        }
        let mut shape = Vec::with_capacity(r);
        for i in 0..r {
            let (s, l, st) = (start[i], limit[i], strides[i]);
            if !(0 <= s && s <= l && l <= t.shape[i] && st > 0) {
                return Err(Error::op(
                    OP,
                    format!("0 <= start <= limit <= {} and stride > 0 in dim {i} of {t}", t.shape[i]),
                    format!("start {s}, limit {l}, stride {st}"),
                ));
            }
            shape.push((l - s + st - 1) / st);
        }
        let attrs = vec![
            ("start_indices", self.i64_array(start)),
            ("limit_indices", self.i64_array(limit)),
            ("strides", self.i64_array(strides)),
        ];
        self.emit1(OP, &[a], attrs, t.with_shape(&shape))
    }

    /// Slices `[start, limit)` along one dim, keeping the others whole.
    pub fn slice_dim(&self, a: Value<'c, 'b>, dim: i64, start: i64, limit: i64) -> Result<Value<'c, 'b>, Error> {
        let t = a.ty();
        check_dims("stablehlo.slice", "dim", &[dim], t.rank())?;
        let mut starts = vec![0; t.rank()];
        let mut limits = t.shape.clone();
        starts[ix(dim)] = start;
        limits[ix(dim)] = limit;
        self.slice(a, &starts, &limits, &vec![1; t.rank()])
    }

    fn check_starts(op: &'static str, t: &TensorType, starts: &[Value<'c, 'b>]) -> Result<(), Error> {
        if starts.len() != t.rank() {
            return Err(Error::op(op, format!("{} start indices for {t}", t.rank()), format!("{}", starts.len())));
        }
        let types: Vec<TensorType> = starts.iter().map(Value::ty).collect();
        let one_type = types.windows(2).all(|w| w[0].elem == w[1].elem);
        if !one_type || types.iter().any(|t| t.rank() != 0 || !t.elem.is_integer()) {
            let got: Vec<String> = types.iter().map(TensorType::to_string).collect();
            return Err(Error::op(op, "rank-0 integer start indices of one type", format!("({})", got.join(", "))));
        }
        Ok(())
    }

    /// Slice of `sizes` starting at run-time indices `starts` (one rank-0 integer tensor per
    /// dim; out-of-range starts are clamped by StableHLO semantics).
    pub fn dynamic_slice(
        &self,
        a: Value<'c, 'b>,
        starts: &[Value<'c, 'b>],
        sizes: &[i64],
    ) -> Result<Value<'c, 'b>, Error> {
        const OP: &str = "stablehlo.dynamic_slice";
        let t = a.ty();
        Self::check_starts(OP, &t, starts)?;
        let fits = sizes.len() == t.rank() && sizes.iter().zip(&t.shape).all(|(&s, &d)| 0 <= s && s <= d);
        if !fits {
            return Err(Error::op(OP, format!("slice_sizes within {t}"), list(sizes)));
        }
        let mut operands = vec![a];
        operands.extend_from_slice(starts);
        let attr = self.i64_array(sizes);
        self.emit1(OP, &operands, vec![("slice_sizes", attr)], t.with_shape(sizes))
    }

    /// Writes `update` into `a` at run-time indices `starts` (clamped so it fits).
    pub fn dynamic_update_slice(
        &self,
        a: Value<'c, 'b>,
        update: Value<'c, 'b>,
        starts: &[Value<'c, 'b>],
    ) -> Result<Value<'c, 'b>, Error> {
        const OP: &str = "stablehlo.dynamic_update_slice";
        let (t, tu) = (a.ty(), update.ty());
        let fits = tu.elem == t.elem && tu.rank() == t.rank() && tu.shape.iter().zip(&t.shape).all(|(&u, &d)| u <= d);
        if !fits {
            return Err(Error::op(OP, format!("an update with the rank and element type of {t} and no larger"), tu));
        }
        Self::check_starts(OP, &t, starts)?;
        let mut operands = vec![a, update];
        operands.extend_from_slice(starts);
        self.emit1(OP, &operands, Vec::new(), t)
    }
}
