//! `stablehlo.scatter` with explicit dimension numbers and an overwriting body: writes
//! `updates` into a copy of `operand` at positions given as data (KV-cache writes).

use crate::error::Error;
use crate::func::{Func, Value, check_dims, check_sorted, ix, list};

/// Dimension numbers of [`Func::scatter`] (StableHLO `#stablehlo.scatter<...>`).
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash)]
pub struct ScatterDims {
    /// Updates dims that hold the window (the written slice's non-inserted dims), ascending.
    pub update_window_dims: Vec<i64>,
    /// Operand dims the window has size 1 in and the updates leave out, ascending.
    pub inserted_window_dims: Vec<i64>,
    /// Operand batch dims (paired with `scatter_indices_batching_dims`), ascending.
    pub input_batching_dims: Vec<i64>,
    /// Index batch dims, paired with `input_batching_dims`.
    pub scatter_indices_batching_dims: Vec<i64>,
    /// Operand dim each component of an index vector addresses.
    pub scatter_dims_to_operand_dims: Vec<i64>,
    /// Index dim that holds the index vectors; `rank(indices)` means an implicit
    /// trailing dim of size 1.
    pub index_vector_dim: i64,
}

impl ScatterDims {
    fn attr_text(&self) -> String {
        let mut fields = Vec::new();
        for (name, v) in [
            ("update_window_dims", &self.update_window_dims),
            ("inserted_window_dims", &self.inserted_window_dims),
            ("input_batching_dims", &self.input_batching_dims),
            ("scatter_indices_batching_dims", &self.scatter_indices_batching_dims),
            ("scatter_dims_to_operand_dims", &self.scatter_dims_to_operand_dims),
        ] {
            // StableHLO's printer omits empty lists; do the same.
            if !v.is_empty() {
                fields.push(format!("{name} = {}", list(v)));
            }
        }
        fields.push(format!("index_vector_dim = {}", self.index_vector_dim));
        format!("#stablehlo.scatter<{}>", fields.join(", "))
    }
}

impl<'c, 'b> Func<'c, 'b> {
    /// General single-operand scatter that OVERWRITES (the body region returns the update value):
    /// writes `updates` into `operand` at the positions in `indices`.
    ///
    /// The result has `operand`'s type. Out-of-range index vectors skip their update
    /// (StableHLO semantics); with repeated positions which update wins is unspecified.
    /// IREE 3.13 compiles it only when the scattered operand dims lead (see the crate docs).
    pub fn scatter(
        &self,
        operand: Value<'c, 'b>,
        indices: Value<'c, 'b>,
        updates: Value<'c, 'b>,
        dims: ScatterDims,
    ) -> Result<Value<'c, 'b>, Error> {
        const OP: &str = "stablehlo.scatter";
        let (t, ti, tu) = (operand.ty(), indices.ty(), updates.ty());
        let (r, ri) = (t.rank(), ti.rank());
        if !ti.elem.is_integer() {
            return Err(Error::op(OP, "integer indices", ti));
        }
        if tu.elem != t.elem {
            return Err(Error::op(OP, format!("updates of element type {} (the operand's)", t.elem), tu));
        }
        if dims.index_vector_dim < 0 || ix(dims.index_vector_dim) > ri {
            return Err(Error::op(OP, format!("index_vector_dim in 0..={ri} for indices {ti}"), dims.index_vector_dim));
        }
        let ivd = ix(dims.index_vector_dim);
        let index_len = if ivd < ri { ti.shape[ivd] } else { 1 };
        check_sorted(OP, "inserted_window_dims", &dims.inserted_window_dims)?;
        check_dims(OP, "inserted_window_dims", &dims.inserted_window_dims, r)?;
        check_sorted(OP, "input_batching_dims", &dims.input_batching_dims)?;
        check_dims(OP, "input_batching_dims", &dims.input_batching_dims, r)?;
        if dims.inserted_window_dims.iter().any(|d| dims.input_batching_dims.contains(d)) {
            return Err(Error::op(
                OP,
                "inserted_window_dims disjoint from input_batching_dims",
                format!("{} and {}", list(&dims.inserted_window_dims), list(&dims.input_batching_dims)),
            ));
        }
        check_dims(OP, "scatter_indices_batching_dims", &dims.scatter_indices_batching_dims, ri)?;
        if dims.scatter_indices_batching_dims.len() != dims.input_batching_dims.len()
            || dims.scatter_indices_batching_dims.contains(&dims.index_vector_dim)
        {
            return Err(Error::op(
                OP,
                "scatter_indices_batching_dims paired with input_batching_dims, excluding index_vector_dim",
                list(&dims.scatter_indices_batching_dims),
            ));
        }
        for (&o, &i) in dims.input_batching_dims.iter().zip(&dims.scatter_indices_batching_dims) {
            if t.shape[ix(o)] != ti.shape[ix(i)] {
                return Err(Error::op(
                    OP,
                    format!("operand batching dim {o} of {t} equal in size to indices dim {i}"),
                    ti,
                ));
            }
        }
        check_dims(OP, "scatter_dims_to_operand_dims", &dims.scatter_dims_to_operand_dims, r)?;
        if dims.scatter_dims_to_operand_dims.len() as i64 != index_len
            || dims.scatter_dims_to_operand_dims.iter().any(|d| dims.input_batching_dims.contains(d))
        {
            return Err(Error::op(
                OP,
                format!(
                    "scatter_dims_to_operand_dims of {index_len} operand dims (the index vector size), none a batching dim"
                ),
                list(&dims.scatter_dims_to_operand_dims),
            ));
        }
        // The operand dims the window spans, in order; update_window_dims name where they sit.
        let window_bounds: Vec<i64> = (0..r)
            .filter(|&i| {
                !dims.inserted_window_dims.contains(&(i as i64)) && !dims.input_batching_dims.contains(&(i as i64))
            })
            .map(|i| t.shape[i])
            .collect();
        check_sorted(OP, "update_window_dims", &dims.update_window_dims)?;
        if dims.update_window_dims.len() != window_bounds.len() {
            return Err(Error::op(
                OP,
                format!("{} update_window_dims (operand rank minus inserted and batching dims)", window_bounds.len()),
                list(&dims.update_window_dims),
            ));
        }
        let scatter_sizes: Vec<i64> = (0..ri).filter(|&i| i != ivd).map(|i| ti.shape[i]).collect();
        let update_rank = scatter_sizes.len() + window_bounds.len();
        check_dims(OP, "update_window_dims", &dims.update_window_dims, update_rank)?;
        // Per updates dim: Ok(size) for a scatter dim (exact), Err(bound) for a window dim (<=).
        let (mut wins, mut scats) = (window_bounds.into_iter(), scatter_sizes.into_iter());
        let want: Vec<Result<i64, i64>> = (0..update_rank as i64)
            .map(|d| {
                if dims.update_window_dims.contains(&d) {
                    Err(wins.next().unwrap_or(0))
                } else {
                    Ok(scats.next().unwrap_or(0))
                }
            })
            .collect();
        let fits = tu.rank() == update_rank
            && want.iter().zip(&tu.shape).all(|(w, &s)| match *w {
                Ok(n) => s == n,
                Err(bound) => 0 <= s && s <= bound,
            });
        if !fits {
            let items: Vec<String> = want
                .iter()
                .map(|w| match *w {
                    Ok(n) => n.to_string(),
                    Err(bound) => format!("<={bound}"),
                })
                .collect();
            return Err(Error::op(OP, format!("updates shaped [{}]", items.join(", ")), tu));
        }
        let s = t.elem.scalar();
        let (region, _) = self.region(&[s.clone(), s], "stablehlo.return", |_, x| Ok(vec![x[1]]))?;
        let dn = self.parse_attr(OP, &dims.attr_text())?;
        let attrs = vec![
            ("scatter_dimension_numbers", dn),
            ("indices_are_sorted", self.bool_attr(false)),
            ("unique_indices", self.bool_attr(false)),
        ];
        let mut out = self.emit(OP, &[operand, indices, updates], attrs, &[t], vec![region])?;
        out.pop().ok_or_else(|| Error::mlir(OP, "no result"))
    }
}
