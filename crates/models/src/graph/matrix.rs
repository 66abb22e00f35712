//! The matrix products of a step: every place a matrix multiplies its input (or gives an
//! embedding row) matches on the matrix's [`Form`] here, once: the CPU kernel's dispatches,
//! the CUDA kernel's, or the graph form (a contraction of dense weights, the packed
//! integer-group contraction or its dequantized form, a router's reduction).

use super::{R, Step, V};
use crate::backend::{Activations, PackedProducts};
use crate::layout::{Form, Packing, cuda_bits};
use crate::names::EMBEDDING;
use hlo_emit::{DotDims, ElementType, ElementType::*, Global};

/// How the CUDA kernel (`kernels::cuda`) reads a packed matrix: the bits of its stored
/// values, its scales' type and its group size.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct CudaForm {
    bits: u32,
    scale: kernels::cuda::Scale,
    group_size: usize,
}

impl CudaForm {
    fn of(p: &Packing) -> CudaForm {
        let scale = match p.scale_elem {
            ElementType::F16 => kernels::cuda::Scale::F16,
            ElementType::BF16 => kernels::cuda::Scale::BF16,
            _ => kernels::cuda::Scale::F32,
        };
        CudaForm { bits: cuda_bits(p), scale, group_size: p.group_size }
    }
}

impl<'a, 'c, 'b> Step<'a, 'c, 'b> {
    pub(super) fn global(&self, key: &str) -> R<&'a Global> {
        self.globals
            .get(key)
            .ok_or_else(|| hlo_emit::Error::Mlir { what: "parameter".into(), detail: format!("no global for {key}") })
    }

    /// A parameter as f32: reduced-precision matrices are widened where they are used, so
    /// IREE can fold the conversion into the contraction that reads them.
    pub(super) fn param(&self, key: &str) -> R<V<'c, 'b>> {
        self.widen(self.f.load(self.global(key)?)?)
    }

    /// A dense matrix's values as f32: converted, or, for bf16 held as its bit patterns
    /// (`i16`, `Layout::for_spirv`), shifted into the high half of an f32's bits, which is
    /// exactly bf16's widening.
    pub(super) fn widen(&self, v: V<'c, 'b>) -> R<V<'c, 'b>> {
        let f = self.f;
        match v.elem() {
            F32 => Ok(v),
            I16 => {
                let wide = f.convert(v, I32)?;
                let sixteen = f.splat_like(wide, 16.0)?;
                f.bitcast_convert(f.shift_left(wide, sixteen)?, F32)
            }
            _ => f.convert(v, F32),
        }
    }

    /// The form of the matrix `prefix` (every matrix the layer plan names has one).
    fn form(&self, prefix: &str) -> R<Form> {
        self.layout.form(prefix).ok_or_else(|| hlo_emit::Error::Mlir {
            what: "matrix".into(),
            detail: format!("no form in the layout for {prefix}"),
        })
    }

    /// `x [T, in]` through the linear layer `prefix` (`[T, out]`), its bias added when it
    /// has one: where `prefix` is part of a merged matrix, its columns of the merged product.
    pub(super) fn linear(&self, x: V<'c, 'b>, prefix: &str, bias: bool) -> R<V<'c, 'b>> {
        let f = self.f;
        let y = self.merged_or(prefix, |m| self.product(x, m, None))?;
        if bias {
            let b = self.param(&format!("{prefix}.bias"))?;
            return f.add(y, f.broadcast_in_dim(b, &y.shape(), &[1])?);
        }
        Ok(y)
    }

    /// `residual + linear(x)`, the residual connection after a linear layer: the product and
    /// the add in one dispatch where the matrix's form has a residual product (CPU kernels,
    /// CUDA kernel) and the layer is on its own (not merged, no bias); else the layer, then
    /// the add. With the model's residual scale (Granite), `residual + linear(x) * scale`.
    pub(super) fn linear_residual(&self, residual: V<'c, 'b>, x: V<'c, 'b>, prefix: &str, bias: bool) -> R<V<'c, 'b>> {
        if let Some(scale) = self.cfg.residual_scale {
            // Granite: the block's output scaled before it joins (not the product's fused add).
            let out = self.f.mul_scalar(self.linear(x, prefix, bias)?, f64::from(scale))?;
            return self.f.add(residual, out);
        }
        if !bias && self.layout.merged(prefix).is_none() {
            return self.product(x, prefix, Some(residual));
        }
        self.f.add(residual, self.linear(x, prefix, bias)?)
    }

    /// `product(prefix)`, or, where `prefix` is part of a merged matrix, its columns of
    /// `product(merged)`: one dispatch for all parts (they read the same `x`), computed at the
    /// first part's use (q/k/v on CUDA and the CPU, gate/up on the CPU).
    fn merged_or(&self, prefix: &str, product: impl Fn(&str) -> R<V<'c, 'b>>) -> R<V<'c, 'b>> {
        let Some((merged, first, rows)) = self.layout.merged(prefix) else { return product(prefix) };
        let cached = self.merged_out.borrow().get(merged).copied();
        let all = match cached {
            Some(v) => v,
            None => {
                let v = product(merged)?;
                self.merged_out.borrow_mut().insert(merged.to_owned(), v);
                v
            }
        };
        self.f.slice_dim(all, 1, first as i64, (first + rows) as i64)
    }

    /// `x [T, in]` through the whole matrix `prefix` (merged or not) as its form computes
    /// it, plus `residual [T, out]` after the product when given (the same f32 add, inside
    /// the kernel's dispatch where it has a residual product).
    fn product(&self, x: V<'c, 'b>, prefix: &str, residual: Option<V<'c, 'b>>) -> R<V<'c, 'b>> {
        use kernels::cpu::{DenseOp, Op};
        let f = self.f;
        let y = match self.form(prefix)? {
            Form::CpuPacked(p) => {
                let op = if residual.is_some() { Op::MatvecAdd } else { Op::Matvec };
                return self.kernel_dispatch(op, x, prefix, &p, residual);
            }
            Form::CpuDense | Form::CpuMxfp8 => {
                let op = if residual.is_some() { DenseOp::MatvecAdd } else { DenseOp::Matvec };
                return self.dense_dispatch(op, x, prefix, residual);
            }
            Form::GraphMxfp8 => {
                let w = self.mxfp8_values(prefix, None)?;
                f.transpose(f.dot_general(w, x, DotDims::contract(&[1], &[1]))?, &[1, 0])?
            }
            Form::CudaPacked(p) => {
                let op = if residual.is_some() { kernels::cuda::Op::MatvecAdd } else { kernels::cuda::Op::Matvec };
                return self.cuda_dispatch(op, CudaForm::of(&p), x, &[prefix], residual);
            }
            Form::GraphPacked(p) => self.graph_packed(x, prefix, &p)?,
            Form::Dense | Form::Bf16Bits => {
                let w = self.param(&format!("{prefix}.weight"))?;
                f.transpose(f.dot_general(w, x, DotDims::contract(&[1], &[1]))?, &[1, 0])?
            }
            Form::Narrow => self.narrow(x, prefix)?,
        };
        match residual {
            Some(r) => f.add(r, y),
            None => Ok(y),
        }
    }

    /// `x [T, in]` through a packed matrix, with the dequantization inside the contraction:
    /// `y[t,o] = sx[t] Σ_g s[o,g] Σ_k q[o,g,k] xq[t,g,k] + Σ_g b[o,g] Σ_k x[t,g,k]`, where
    /// `q` are the signed packed values, `xq = round(x / sx)` is `x` quantized to i16 per row
    /// (15 bits of the row's largest magnitude) and `b` the biases with the offset folded in.
    /// The integer contraction over each group reads the packed weight directly (one
    /// `batch_matmul ... i16xi4xi32` dispatch); scales and biases apply once per group.
    fn graph_packed(&self, x: V<'c, 'b>, prefix: &str, p: &Packing) -> R<V<'c, 'b>> {
        let f = self.f;
        let w = f.load(self.global(&format!("{prefix}.weight"))?)?;
        let (t, k) = (x.shape()[0], x.shape()[1]);
        let (o, gs) = (w.shape()[0], p.group_size as i64);
        let g = k / gs;
        if self.options.packed_products == PackedProducts::Dequantized {
            // The biases carry the signed storage's offset.
            let load = |name: &str| f.load(self.global(&format!("{prefix}.{name}"))?);
            let w = self.dequantize(w, load("scales")?, load("biases")?, &[o, g, gs])?;
            return f.transpose(f.dot_general(f.reshape(w, &[o, k])?, x, DotDims::contract(&[1], &[1]))?, &[1, 0]);
        }
        let w = f.convert(f.reshape(w, &[o, g, gs])?, I16)?;

        const I16_MAX: f64 = 32767.0;
        let amax = f.max(f.reduce_max(f.abs(x)?, &[1])?, f.splat(1e-30, &F32.tensor(&[t]))?)?;
        let inv = f.div(f.splat(I16_MAX, &F32.tensor(&[t]))?, amax)?;
        let xq = f.round_nearest_even(f.mul(x, f.broadcast_in_dim(inv, &[t, k], &[0])?)?)?;
        let xq = f.transpose(f.reshape(f.convert(xq, I16)?, &[t, g, gs])?, &[1, 0, 2])?;
        // [G, T, O] integer dot products per group.
        let acc = f.convert(f.dot_general_to(xq, w, DotDims::contract(&[2], &[2]).batch(&[0], &[1]), I32)?, F32)?;

        let full = [g, t, o];
        let scales = f.transpose(self.param(&format!("{prefix}.scales"))?, &[1, 0])?;
        let biases = f.transpose(self.param(&format!("{prefix}.biases"))?, &[1, 0])?;
        let sx = f.mul_scalar(amax, 1.0 / I16_MAX)?;
        let xsum = f.transpose(f.reduce_sum(f.reshape(x, &[t, g, gs])?, &[2])?, &[1, 0])?;
        let scaled =
            f.mul(f.mul(acc, f.broadcast_in_dim(scales, &full, &[0, 2])?)?, f.broadcast_in_dim(sx, &full, &[1])?)?;
        let offset = f.mul(f.broadcast_in_dim(biases, &full, &[0, 2])?, f.broadcast_in_dim(xsum, &full, &[0, 1])?)?;
        f.reduce_sum(f.add(scaled, offset)?, &[0])
    }

    /// A linear layer of few outputs (a router `[experts, d]`, Qwen2-MoE's `[1, d]` shared
    /// expert gate), dense: products and a sum over the input (one fused reduction), not a
    /// contraction, of the f32 weight ([`Form::Narrow`]). With stored parameters IREE 3.13
    /// data-tiles such a contraction's weight for some functions and not others, and its
    /// parameter encoder then leaves the weight unbound for the others ("no provider
    /// registered that handles scopes like 'model'" at load). A quantized router in `packed` is
    /// a packed matrix like any other.
    fn narrow(&self, x: V<'c, 'b>, prefix: &str) -> R<V<'c, 'b>> {
        let f = self.f;
        let w = self.param(&format!("{prefix}.weight"))?;
        let (t, (o, d)) = (x.shape()[0], (w.shape()[0], w.shape()[1]));
        let both = [t, o, d];
        let products = f.mul(f.broadcast_in_dim(x, &both, &[0, 2])?, f.broadcast_in_dim(w, &both, &[1, 2])?)?;
        f.reduce_sum(products, &[2])
    }

    /// `activation(gate(x)) * up(x)` of a gated MLP in one dispatch where the forms allow
    /// it: the CUDA kernel's `Glu`, when it takes both matrices alike, the activation is
    /// SiLU and there are no biases. `None` where the two products run apart.
    pub(super) fn glu(&self, x: V<'c, 'b>, gate: &str, up: &str, bias: bool) -> R<Option<V<'c, 'b>>> {
        if self.cfg.activation != crate::config::Activation::Silu || bias {
            return Ok(None);
        }
        match (self.form(gate)?, self.form(up)?) {
            (Form::CudaPacked(g), Form::CudaPacked(u)) if CudaForm::of(&g) == CudaForm::of(&u) => {
                self.cuda_dispatch(kernels::cuda::Op::Glu, CudaForm::of(&g), x, &[gate, up], None).map(Some)
            }
            _ => Ok(None),
        }
    }

    /// One dispatch of the CUDA kernel's `op` on `x [T, in]` and the packed matrices
    /// `prefixes` (one; gate and up for `Glu`), which the kernel reads as `form`
    /// ([`Form::CudaPacked`] each); `residual [T, out]` for `MatvecAdd`.
    ///
    /// A plain or gated product whose `x` is an RMSNorm's output ([`Step::norm_of`]) takes the
    /// norm's input and weight instead (`NormMatvec`, `NormGlu`): the norm in the kernel's
    /// prologue, one dispatch fewer.
    fn cuda_dispatch(
        &self,
        op: kernels::cuda::Op,
        form: CudaForm,
        x: V<'c, 'b>,
        prefixes: &[&str],
        residual: Option<V<'c, 'b>>,
    ) -> R<V<'c, 'b>> {
        use kernels::cuda::Op;
        let normed = match op {
            Op::Matvec | Op::Glu => self.norm_of(x),
            _ => None,
        };
        let (op, mut args) = match (op, normed) {
            (Op::Matvec, Some((x, w))) => (Op::NormMatvec, vec![x, w]),
            (Op::Glu, Some((x, w))) => (Op::NormGlu, vec![x, w]),
            _ => (op, vec![x]),
        };
        for prefix in prefixes {
            let (w, s) = self.packed_globals(prefix)?;
            args.extend([w, s, self.packed_biases(prefix)?]);
        }
        args.extend(residual);
        let first_weight = if op.normed() { 2 } else { 1 };
        let (t, k, o) = (x.shape()[0], x.shape()[1], args[first_weight].shape()[0]);
        self.cuda_call(op, form, o, [t, k, o], &args, &[t, o])
    }

    /// Declares the CUDA kernel's entry for `op` and `form` and dispatches it over `workload`
    /// with the push constants (T, K, O, group size) and an f32 result of `shape`.
    fn cuda_call(
        &self,
        op: kernels::cuda::Op,
        form: CudaForm,
        workload: i64,
        [t, k, o]: [i64; 3],
        args: &[V<'c, 'b>],
        shape: &[i64],
    ) -> R<V<'c, 'b>> {
        let entry = kernels::cuda::Entry { op, bits: form.bits, scale: form.scale };
        self.linked.borrow_mut().cuda.insert(entry);
        let mut dims: Vec<i32> = [t, k, o, form.group_size as i64].map(|d| d as i32).to_vec();
        if op.normed() {
            // RMSNorm's epsilon, as the graph's norm rounds it (to f32), by its bits.
            dims.push((self.cfg.rms_eps as f32).to_bits() as i32);
        }
        self.f.dispatch(kernels::cuda::EXECUTABLE, &entry.export(), workload, &dims, args, F32.tensor(shape))
    }

    /// A packed matrix through the hand-written CPU kernel: the matvec `x [T, in] -> [T, out]`
    /// (plus `residual [T, out]` after it for `MatvecAdd`) or the lookup of rows `x` (i32
    /// ids `[T]`) -> `[T, in]`, both f32 and exact.
    fn kernel_dispatch(
        &self,
        op: kernels::cpu::Op,
        x: V<'c, 'b>,
        prefix: &str,
        p: &Packing,
        residual: Option<V<'c, 'b>>,
    ) -> R<V<'c, 'b>> {
        let f = self.f;
        let (w, s) = self.packed_globals(prefix)?;
        let blocks = w.shape()[0];
        let out = blocks * kernels::cpu::BLOCK_ROWS as i64;
        let inp = s.shape()[1] / kernels::cpu::BLOCK_ROWS as i64 * p.group_size as i64;
        let t = x.shape()[0];
        let (workload, result) = match op {
            kernels::cpu::Op::Matvec | kernels::cpu::Op::MatvecAdd => (blocks, [t, out]),
            kernels::cpu::Op::Rows => (t, [t, inp]),
            kernels::cpu::Op::Experts => {
                return Err(hlo_emit::Error::Mlir {
                    what: "kernel dispatch".into(),
                    detail: "stacked experts dispatch through Step::expert_dispatch".into(),
                });
            }
        };
        let dims = [t, inp, out, p.group_size as i64].map(|d| d as i32);
        // `Rows` reads no x: the activations setting is the products'.
        let x8 = self.options.activations == Activations::I8 && op != kernels::cpu::Op::Rows;
        let entry = kernels::cpu::Entry { x8, ..p.kernel_entry(op) };
        self.linked.borrow_mut().packed.insert(entry);
        let mut args = vec![x, w, s];
        args.extend(self.kernel_biases(prefix, &entry)?);
        args.extend(residual);
        let export = entry.export();
        f.dispatch(kernels::cpu::EXECUTABLE, &export, workload, &dims, &args, F32.tensor(&result))
    }

    /// A dense f16 or bf16 matrix, or an mxfp8 one, in the CPU kernel's blocks through its
    /// product: `x [T, in] -> [T, out]`, plus `residual [T, out]` after it when given (the
    /// graph's f32 add); or, for `DenseOp::Rows`, the rows `x` (i32 ids `[T]`) of the table ->
    /// `[T, in]`. The entry is the form's (mxfp8, with its scales) or the global's element
    /// type's (f16 or bf16).
    fn dense_dispatch(
        &self,
        op: kernels::cpu::DenseOp,
        x: V<'c, 'b>,
        prefix: &str,
        residual: Option<V<'c, 'b>>,
    ) -> R<V<'c, 'b>> {
        let w = self.f.load(self.global(&format!("{prefix}.weight"))?)?;
        let blocks = w.shape()[0];
        let (t, inp, out) =
            (x.shape()[0], w.shape()[1] / kernels::cpu::BLOCK_ROWS as i64, blocks * kernels::cpu::BLOCK_ROWS as i64);
        let mxfp8 = self.form(prefix)? == Form::CpuMxfp8;
        let elem = match w.elem() {
            _ if mxfp8 => kernels::cpu::DenseElem::Mxfp8,
            ElementType::BF16 => kernels::cpu::DenseElem::BF16,
            _ => kernels::cpu::DenseElem::F16,
        };
        let entry = kernels::cpu::Dense { op, elem };
        self.linked.borrow_mut().dense.insert(entry);
        let mut args = vec![x, w];
        if mxfp8 {
            args.push(self.f.load(self.global(&format!("{prefix}.scales"))?)?);
        }
        args.extend(residual);
        let dims = [t, inp, out].map(|d| d as i32);
        let (workload, result) = if op == kernels::cpu::DenseOp::Rows { (t, [t, inp]) } else { (blocks, [t, out]) };
        self.f.dispatch(kernels::cpu::EXECUTABLE, &entry.export(), workload, &dims, &args, F32.tensor(&result))
    }

    /// The weight and scales of the packed matrix (or stacked experts) `prefix`.
    pub(super) fn packed_globals(&self, prefix: &str) -> R<(V<'c, 'b>, V<'c, 'b>)> {
        let load = |name: &str| self.f.load(self.global(&format!("{prefix}.{name}"))?);
        Ok((load("weight")?, load("scales")?))
    }

    /// The biases of the packed matrix (or stacked experts) `prefix`.
    pub(super) fn packed_biases(&self, prefix: &str) -> R<V<'c, 'b>> {
        self.f.load(self.global(&format!("{prefix}.biases"))?)
    }

    /// The biases the CPU kernel's `entry` takes for `prefix`: none for FP4, whose entries
    /// compute them.
    pub(super) fn kernel_biases(&self, prefix: &str, entry: &kernels::cpu::Entry) -> R<Option<V<'c, 'b>>> {
        if entry.fp4 { Ok(None) } else { self.packed_biases(prefix).map(Some) }
    }

    /// Rows `tokens` of the embedding table as f32 `[T, hidden]`: gathered in the table's
    /// own type, then widened (dense) or dequantized (packed) for those rows only; or looked
    /// up by the kernel that holds the table.
    pub(super) fn embed(&self, tokens: V<'c, 'b>) -> R<V<'c, 'b>> {
        self.table_rows(EMBEDDING, tokens, self.cfg.hidden)
    }

    /// Rows `tokens` of the table `prefix` (rows of `width` values) as f32 `[T, width]`:
    /// [`Step::embed`] for any table (Gemma 4's per-layer one).
    pub(super) fn table_rows(&self, prefix: &str, tokens: V<'c, 'b>, width: usize) -> R<V<'c, 'b>> {
        let f = self.f;
        let load = |name: &str| f.load(self.global(&format!("{prefix}.{name}"))?);
        let p = match self.form(prefix)? {
            Form::CpuDense | Form::CpuMxfp8 => {
                return self.dense_dispatch(kernels::cpu::DenseOp::Rows, tokens, prefix, None);
            }
            Form::GraphMxfp8 => return self.mxfp8_values(prefix, Some(tokens)),
            Form::Dense | Form::Bf16Bits | Form::Narrow => return self.widen(f.gather_rows(load("weight")?, tokens)?),
            Form::CpuPacked(p) => return self.kernel_dispatch(kernels::cpu::Op::Rows, tokens, prefix, &p, None),
            Form::CudaPacked(p) => {
                // One dispatch of the CUDA kernel; a 4-bit table's bytes come from its rows
                // copy (the same bytes as the weight, which the head may read instead).
                let (t, d) = (self.rows(), width as i64);
                let bytes = if p.weight_elem() == I4 { "weight.rows" } else { "weight" };
                let args = [tokens, load(bytes)?, load("scales")?, load("biases")?];
                let vocab = args[1].shape()[0];
                let form = CudaForm::of(&p);
                return self.cuda_call(kernels::cuda::Op::Rows, form, t, [t, d, vocab], &args, &[t, d]);
            }
            Form::GraphPacked(p) => p,
        };
        let (t, d) = (self.rows(), width as i64);
        let q = if p.weight_elem() == I4 {
            // Gather the rows' bytes, then split each into its two signed nibbles (element
            // 2j in the low one), interleaved back to [T, d].
            let bytes = f.gather_rows(load("weight.rows")?, tokens)?;
            let four = f.splat(4.0, &I8.tensor(&[t, d / 2]))?;
            let low = f.shift_right_arithmetic(f.shift_left(bytes, four)?, four)?;
            let high = f.shift_right_arithmetic(bytes, four)?;
            let pair = |v| f.reshape(v, &[t, d / 2, 1]);
            f.reshape(f.concatenate(&[pair(low)?, pair(high)?], 2)?, &[t, d])?
        } else {
            f.gather_rows(load("weight")?, tokens)?
        };
        let gs = p.group_size as i64;
        let gather = |name: &str| f.gather_rows(load(name)?, tokens);
        let rows = self.dequantize(q, gather("scales")?, gather("biases")?, &[t, d / gs, gs])?;
        f.reshape(rows, &[t, d])
    }

    /// The mxfp8 matrix `prefix` (or its rows `rows`, i32 ids `[T]`) as f32 `[out or T, in]`
    /// ([`Step::mxfp8_decode`]).
    fn mxfp8_values(&self, prefix: &str, rows: Option<V<'c, 'b>>) -> R<V<'c, 'b>> {
        let load = |name: &str| self.global_rows(&format!("{prefix}.{name}"), rows);
        self.mxfp8_decode(load("weight")?, load("scales")?)
    }

    /// The global `key`, or its rows `rows` (i32 ids) when given.
    pub(super) fn global_rows(&self, key: &str, rows: Option<V<'c, 'b>>) -> R<V<'c, 'b>> {
        let v = self.f.load(self.global(key)?)?;
        match rows {
            Some(ids) => self.f.gather_rows(v, ids),
            None => Ok(v),
        }
    }

    /// mxfp8 codes `[..., in]` (i8, E4M3) and their scale bytes `[..., in / 32]` (i8, E8M0)
    /// as f32 `[..., in]`: MLX's values exactly. Each code's magnitude `m * 2^(x - 10)` (x the
    /// exponent field, m the mantissa with its implicit 8; a subnormal's x counted as 1 and
    /// no implicit bit) times its group's scale 2^(e - 127) is one power of two times an
    /// integer below 16, exactly an f32: the layout takes only scales that keep it normal
    /// (`kernels::cpu::mxfp8_check`), and groups of zeros (any scale) give 0 or -0.
    pub(super) fn mxfp8_decode(&self, codes: V<'c, 'b>, scales: V<'c, 'b>) -> R<V<'c, 'b>> {
        let f = self.f;
        let shape = codes.shape();
        let (lead, k) = (&shape[..shape.len() - 1], shape[shape.len() - 1]);
        let group = kernels::cpu::MXFP8_GROUP as i64;
        let grouped: Vec<i64> = lead.iter().copied().chain([k / group, group]).collect();
        let c = f.reshape(f.convert(codes, I32)?, &grouped)?;
        let int = |v: f64| f.splat(v, &I32.tensor(&grouped));
        let magnitude = f.and(c, int(127.0)?)?;
        let field = f.shift_right_arithmetic(magnitude, int(3.0)?)?;
        let mantissa = f.and(magnitude, int(7.0)?)?;
        let subnormal = f.compare(field, int(0.0)?, hlo_emit::Cmp::Eq)?;
        let m = f.select(subnormal, mantissa, f.add(mantissa, int(8.0)?)?)?;
        let x = f.select(subnormal, int(1.0)?, field)?;
        // The scale byte as unsigned, beside each of its group's codes.
        let e = f.convert(scales, I32)?;
        let e = f.and(e, f.splat_like(e, 255.0)?)?;
        let dims: Vec<i64> = (0..grouped.len() as i64 - 1).collect();
        let e = f.broadcast_in_dim(e, &grouped, &dims)?;
        // 2^(x - 10 + e - 127) as an f32's bits, clamped to the normal range (only groups of
        // zeros reach past it).
        let exponent = f.add(f.add(x, e)?, int(-137.0)?)?;
        let exponent = f.min(f.max(exponent, int(-126.0)?)?, int(127.0)?)?;
        let pow2 = f.bitcast_convert(f.shift_left(f.add(exponent, int(127.0)?)?, int(23.0)?)?, F32)?;
        let v = f.mul(f.convert(m, F32)?, pow2)?;
        let negative = f.compare(c, int(0.0)?, hlo_emit::Cmp::Lt)?;
        let v = f.select(negative, f.neg(v)?, v)?;
        f.reshape(v, &shape)
    }

    /// Packed values `q` (integers, any shape of `grouped`'s elements) as f32 `grouped`
    /// (`[..., G, group size]`), each group's `q * scale + bias` with `scales` and `biases`
    /// of shape `[..., G]`: MLX's affine dequantization.
    pub(super) fn dequantize(
        &self,
        q: V<'c, 'b>,
        scales: V<'c, 'b>,
        biases: V<'c, 'b>,
        grouped: &[i64],
    ) -> R<V<'c, 'b>> {
        let f = self.f;
        let q = f.reshape(f.convert(q, F32)?, grouped)?;
        let lead: Vec<i64> = (0..grouped.len() as i64 - 1).collect();
        let per_group = |v: V<'c, 'b>| f.broadcast_in_dim(self.widen(v)?, grouped, &lead);
        f.add(f.mul(q, per_group(scales)?)?, per_group(biases)?)
    }
}
