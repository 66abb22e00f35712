//! `stablehlo.gather` with explicit dimension numbers, and the embedding-lookup shorthand.

use crate::error::Error;
use crate::func::{Func, Value, check_dims, check_sorted, ix, list};

/// Dimension numbers of [`Func::gather`] (StableHLO `#stablehlo.gather<...>`).
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash)]
pub struct GatherDims {
    /// Result dims that hold the slice's (non-collapsed) dims, ascending.
    pub offset_dims: Vec<i64>,
    /// Operand dims sliced to size 1 and dropped from the result, ascending.
    pub collapsed_slice_dims: Vec<i64>,
    /// Operand batch dims (paired with `start_indices_batching_dims`), ascending.
    pub operand_batching_dims: Vec<i64>,
    /// Index batch dims, paired with `operand_batching_dims`.
    pub start_indices_batching_dims: Vec<i64>,
    /// Operand dim each component of an index vector addresses.
    pub start_index_map: Vec<i64>,
    /// Index dim that holds the index vectors; `rank(indices)` means an implicit
    /// trailing dim of size 1.
    pub index_vector_dim: i64,
}

impl GatherDims {
    fn attr_text(&self) -> String {
        let mut fields = Vec::new();
        for (name, v) in [
            ("offset_dims", &self.offset_dims),
            ("collapsed_slice_dims", &self.collapsed_slice_dims),
            ("operand_batching_dims", &self.operand_batching_dims),
            ("start_indices_batching_dims", &self.start_indices_batching_dims),
            ("start_index_map", &self.start_index_map),
        ] {
            // StableHLO's printer omits empty lists; do the same.
            if !v.is_empty() {
                fields.push(format!("{name} = {}", list(v)));
            }
        }
        fields.push(format!("index_vector_dim = {}", self.index_vector_dim));
        format!("#stablehlo.gather<{}>", fields.join(", "))
    }
}

impl<'c, 'b> Func<'c, 'b> {
    /// General gather: slices of `slice_sizes` from `operand` at the start positions in
    /// `indices` (an integer tensor). The result shape follows the StableHLO rules.
    pub fn gather(
        &self,
        operand: Value<'c, 'b>,
        indices: Value<'c, 'b>,
        dims: GatherDims,
        slice_sizes: &[i64],
    ) -> Result<Value<'c, 'b>, Error> {
        const OP: &str = "stablehlo.gather";
        let (t, ti) = (operand.ty(), indices.ty());
        let (r, ri) = (t.rank(), ti.rank());
        if !ti.elem.is_integer() {
            return Err(Error::op(OP, "integer indices", ti));
        }
        if dims.index_vector_dim < 0 || ix(dims.index_vector_dim) > ri {
            return Err(Error::op(OP, format!("index_vector_dim in 0..={ri} for indices {ti}"), dims.index_vector_dim));
        }
        let ivd = ix(dims.index_vector_dim);
        let index_len = if ivd < ri { ti.shape[ivd] } else { 1 };
        let fits = slice_sizes.len() == r && slice_sizes.iter().zip(&t.shape).all(|(&s, &d)| 0 <= s && s <= d);
        if !fits {
            return Err(Error::op(OP, format!("slice_sizes within {t}"), list(slice_sizes)));
        }
        check_sorted(OP, "collapsed_slice_dims", &dims.collapsed_slice_dims)?;
        check_dims(OP, "collapsed_slice_dims", &dims.collapsed_slice_dims, r)?;
        check_sorted(OP, "operand_batching_dims", &dims.operand_batching_dims)?;
        check_dims(OP, "operand_batching_dims", &dims.operand_batching_dims, r)?;
        for &d in dims.collapsed_slice_dims.iter().chain(&dims.operand_batching_dims) {
            if slice_sizes[ix(d)] > 1 {
                return Err(Error::op(
                    OP,
                    format!("slice size <= 1 in collapsed/batching operand dim {d}"),
                    list(slice_sizes),
                ));
            }
        }
        if dims.collapsed_slice_dims.iter().any(|d| dims.operand_batching_dims.contains(d)) {
            return Err(Error::op(
                OP,
                "collapsed_slice_dims disjoint from operand_batching_dims",
                format!("{} and {}", list(&dims.collapsed_slice_dims), list(&dims.operand_batching_dims)),
            ));
        }
        check_dims(OP, "start_indices_batching_dims", &dims.start_indices_batching_dims, ri)?;
        if dims.start_indices_batching_dims.len() != dims.operand_batching_dims.len()
            || dims.start_indices_batching_dims.contains(&dims.index_vector_dim)
        {
            return Err(Error::op(
                OP,
                "start_indices_batching_dims paired with operand_batching_dims, excluding index_vector_dim",
                list(&dims.start_indices_batching_dims),
            ));
        }
        for (&o, &i) in dims.operand_batching_dims.iter().zip(&dims.start_indices_batching_dims) {
            if t.shape[ix(o)] != ti.shape[ix(i)] {
                return Err(Error::op(
                    OP,
                    format!("operand batching dim {o} of {t} equal in size to indices dim {i}"),
                    ti,
                ));
            }
        }
        check_dims(OP, "start_index_map", &dims.start_index_map, r)?;
        if dims.start_index_map.len() as i64 != index_len
            || dims.start_index_map.iter().any(|d| dims.operand_batching_dims.contains(d))
        {
            return Err(Error::op(
                OP,
                format!("start_index_map of {index_len} operand dims (the index vector size), none a batching dim"),
                list(&dims.start_index_map),
            ));
        }
        let offset_sizes: Vec<i64> = (0..r)
            .filter(|&i| {
                !dims.collapsed_slice_dims.contains(&(i as i64)) && !dims.operand_batching_dims.contains(&(i as i64))
            })
            .map(|i| slice_sizes[i])
            .collect();
        let batch_sizes: Vec<i64> = (0..ri).filter(|&i| i != ivd).map(|i| ti.shape[i]).collect();
        let out_rank = batch_sizes.len() + offset_sizes.len();
        check_sorted(OP, "offset_dims", &dims.offset_dims)?;
        check_dims(OP, "offset_dims", &dims.offset_dims, out_rank)?;
        if dims.offset_dims.len() != offset_sizes.len() {
            return Err(Error::op(
                OP,
                format!("{} offset_dims (operand rank minus collapsed and batching dims)", offset_sizes.len()),
                list(&dims.offset_dims),
            ));
        }
        let (mut offs, mut bats) = (offset_sizes.into_iter(), batch_sizes.into_iter());
        let shape: Vec<i64> = (0..out_rank as i64)
            .map(|d| if dims.offset_dims.contains(&d) { offs.next() } else { bats.next() }.unwrap_or(0))
            .collect();
        let dn = self.parse_attr(OP, &dims.attr_text())?;
        let attrs = vec![
            ("dimension_numbers", dn),
            ("slice_sizes", self.i64_array(slice_sizes)),
            ("indices_are_sorted", self.bool_attr(false)),
        ];
        self.emit1(OP, &[operand, indices], attrs, t.with_shape(&shape))
    }

    /// Embedding lookup: rows of `table` `[V, D...]` picked by integer `ids` of any shape
    /// `[...]`, giving `[..., D...]` (a row may be a matrix: one expert of stacked expert
    /// weights). Out-of-range ids are clamped (StableHLO semantics).
    pub fn gather_rows(&self, table: Value<'c, 'b>, ids: Value<'c, 'b>) -> Result<Value<'c, 'b>, Error> {
        let t = table.ty();
        if t.rank() < 2 {
            return Err(Error::op("gather_rows", "a [V, D...] table of rank >= 2", t));
        }
        let ri = ids.rank() as i64;
        let dims = GatherDims {
            offset_dims: (ri..ri + t.rank() as i64 - 1).collect(),
            collapsed_slice_dims: vec![0],
            start_index_map: vec![0],
            index_vector_dim: ri,
            ..GatherDims::default()
        };
        let mut sizes = t.shape.clone();
        sizes[0] = 1;
        self.gather(table, ids, dims, &sizes)
    }
}
