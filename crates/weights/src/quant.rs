//! Linear (and embedding) layers as stored by MLX: dense, or quantized with packed `U32`
//! weights plus per-group scales (and, affine, biases); and dequantization to f32.

use crate::config::{QuantMode, QuantParams, SUPPORTED_BITS};
use crate::view::floats_to_f32;
use crate::{Dtype, Error, Result, TensorView};

/// A linear or embedding layer as stored in the checkpoint.
///
/// For an embedding (`model.embed_tokens`) `out_features` is the vocabulary size and
/// `in_features` the hidden size: one row per token.
// Views hold their shapes inline (`TensorView::rows`), so the quantized variant's four are
// larger than the dense one's two; a layer is looked up and dropped, boxing would allocate.
#[allow(clippy::large_enum_variant)]
#[derive(Debug, Clone, Copy)]
pub enum Linear<'a> {
    /// A float weight `[out, in]`.
    Dense(DenseLinear<'a>),
    /// MLX affine-quantized weight.
    Quantized(QuantizedLinear<'a>),
}

impl<'a> Linear<'a> {
    /// Whether the layer is quantized.
    pub fn is_quantized(&self) -> bool {
        matches!(self, Linear::Quantized(_))
    }

    /// Rows of the weight (outputs; vocabulary for an embedding).
    pub fn out_features(&self) -> usize {
        match self {
            Linear::Dense(d) => d.out_features(),
            Linear::Quantized(q) => q.out_features(),
        }
    }

    /// Columns of the (unpacked) weight (inputs; hidden size for an embedding).
    pub fn in_features(&self) -> usize {
        match self {
            Linear::Dense(d) => d.in_features(),
            Linear::Quantized(q) => q.in_features(),
        }
    }

    /// The optional `<prefix>.bias` (`[out]`).
    pub fn bias(&self) -> Option<TensorView<'a>> {
        match self {
            Linear::Dense(d) => d.bias(),
            Linear::Quantized(q) => q.bias(),
        }
    }

    /// The whole weight as f32 `[out, in]`, row-major: widened if dense, dequantized if not.
    pub fn weight_f32(&self) -> Vec<f32> {
        match self {
            Linear::Dense(d) => d.weight_f32(),
            Linear::Quantized(q) => dequantize_f32(q),
        }
    }

    /// Output rows `[first, first + n)` as a layer of their own (one part of a fused
    /// projection such as Phi-3's `qkv_proj`): weight, scales, biases and bias, no copy.
    ///
    /// # Errors
    /// [`Error::WrongShape`] naming the tensor when the range runs past its rows.
    pub fn part(&self, first: usize, n: usize) -> Result<Linear<'a>> {
        let bias = |b: Option<TensorView<'a>>| b.map(|b| b.rows(first, n)).transpose();
        Ok(match self {
            Linear::Dense(d) => Linear::Dense(DenseLinear { weight: d.weight.rows(first, n)?, bias: bias(d.bias)? }),
            Linear::Quantized(q) => Linear::Quantized(QuantizedLinear {
                weight: q.weight.rows(first, n)?,
                scales: q.scales.rows(first, n)?,
                biases: q.biases.map(|b| b.rows(first, n)).transpose()?,
                bias: bias(q.bias)?,
                out_features: n,
                ..*q
            }),
        })
    }

    /// The given rows of the weight as f32 (`rows.len() * in` values): an embedding lookup
    /// that touches only those rows.
    ///
    /// # Errors
    /// [`Error::RowOutOfRange`] for a row `>= out_features`.
    pub fn rows_f32(&self, rows: &[usize]) -> Result<Vec<f32>> {
        match self {
            Linear::Dense(d) => d.rows_f32(rows),
            Linear::Quantized(q) => q.dequantize_rows(rows),
        }
    }
}

/// A dense layer: float weight `[out, in]` and optional bias `[out]`.
#[derive(Debug, Clone, Copy)]
pub struct DenseLinear<'a> {
    weight: TensorView<'a>,
    bias: Option<TensorView<'a>>,
}

impl<'a> DenseLinear<'a> {
    /// Checks that `weight` is a 2-D float tensor and `bias` (if any) a float `[out]`.
    ///
    /// # Errors
    /// [`Error::WrongDtype`] or [`Error::WrongShape`] naming the tensor.
    pub fn new(weight: TensorView<'a>, bias: Option<TensorView<'a>>) -> Result<Self> {
        weight.expect_dtype(&Dtype::FLOATS)?;
        let &[out, _] = weight.shape() else {
            return Err(weight.wrong_shape("a 2-D [out, in] weight".to_owned()));
        };
        if let Some(b) = &bias {
            check_bias(b, out)?;
        }
        Ok(DenseLinear { weight, bias })
    }

    /// The weight `[out, in]`.
    pub fn weight(&self) -> TensorView<'a> {
        self.weight
    }

    /// The optional bias `[out]`.
    pub fn bias(&self) -> Option<TensorView<'a>> {
        self.bias
    }

    /// Rows of the weight.
    pub fn out_features(&self) -> usize {
        self.weight.shape().first().copied().unwrap_or(0)
    }

    /// Columns of the weight.
    pub fn in_features(&self) -> usize {
        self.weight.shape().get(1).copied().unwrap_or(0)
    }

    /// The weight widened to f32, row-major `[out, in]`.
    pub fn weight_f32(&self) -> Vec<f32> {
        floats_to_f32(self.weight.dtype(), self.weight.bytes())
    }

    /// The given rows widened to f32.
    ///
    /// # Errors
    /// [`Error::RowOutOfRange`] for a row `>= out_features`.
    pub fn rows_f32(&self, rows: &[usize]) -> Result<Vec<f32>> {
        check_rows(&self.weight, rows, self.out_features())?;
        // Saturating: with zero rows the width is unconstrained by the file.
        let row_bytes = self.in_features().saturating_mul(self.weight.dtype().size_bytes());
        let mut out = Vec::with_capacity(rows.len().saturating_mul(self.in_features()));
        for &r in rows {
            let bytes = row_slice(self.weight.bytes(), r, row_bytes)
                .ok_or_else(|| row_error(&self.weight, r, self.out_features()))?;
            out.extend(floats_to_f32(self.weight.dtype(), bytes));
        }
        Ok(out)
    }
}

/// An MLX-quantized layer.
///
/// - `weight`: `U32 [out, in * bits / 32]`; row `r` is a little-endian bit stream in which
///   element `j` occupies bits `j * bits .. (j + 1) * bits` (for 4 bits: 8 values per word,
///   element `j` of a word at bits `4j..4j+4`; for 8 bits: 4 per word).
/// - affine: `scales`, `biases`: `[out, in / group_size]`, F16, BF16 or F32; value `(r, c) =
///   q(r, c) * scales[r, c / group_size] + biases[r, c / group_size]`, `q` unsigned.
/// - `mxfp4`, `nvfp4`, `mxfp8`: `scales` `U8 [out, in / group_size]` (E8M0: `2^(s - 127)`;
///   nvfp4's FP8 E4M3), no biases; value `= fp(q(r, c)) * scale`, `fp` the E2M1 (4 bits) or
///   E4M3 (8 bits) number the code stands for.
///
/// Constructed only through [`QuantizedLinear::new`], so the shapes always agree and
/// dequantization cannot fail.
#[derive(Debug, Clone, Copy)]
pub struct QuantizedLinear<'a> {
    weight: TensorView<'a>,
    scales: TensorView<'a>,
    /// Affine only.
    biases: Option<TensorView<'a>>,
    bias: Option<TensorView<'a>>,
    params: QuantParams,
    out_features: usize,
    in_features: usize,
}

impl<'a> QuantizedLinear<'a> {
    /// Validates the tensors against `params`. `in` is taken from the scales
    /// (`scales width * group_size`); the packed weight must then be `[out, in * bits / 32]`.
    ///
    /// # Errors
    /// [`Error::Quantization`] for unsupported `params`, or biases missing (affine) or present
    /// (the floating-point modes); [`Error::WrongDtype`] (weight not U32, scales or biases not
    /// float, a floating-point mode's scales not U8); [`Error::WrongShape`] naming the
    /// tensor, the expected shape (with `bits`/`group_size`) and the actual one.
    pub fn new(
        weight: TensorView<'a>,
        scales: TensorView<'a>,
        biases: Option<TensorView<'a>>,
        bias: Option<TensorView<'a>>,
        params: QuantParams,
    ) -> Result<Self> {
        let QuantParams { group_size, bits, mode } = params;
        if let Err(reason) = params.validate() {
            return Err(Error::Quantization {
                path: weight.file().to_path_buf(),
                tensor: weight.name().to_owned(),
                reason,
            });
        }
        weight.expect_dtype(&[Dtype::U32])?;
        let affine = mode == QuantMode::Affine;
        if affine != biases.is_some() {
            let reason = if affine {
                "an affine layer needs its `.biases`".to_owned()
            } else {
                format!("mode {} has no `.biases`, but the checkpoint holds them", mode.name())
            };
            return Err(Error::Quantization {
                path: weight.file().to_path_buf(),
                tensor: weight.name().to_owned(),
                reason,
            });
        }
        scales.expect_dtype(if affine { &Dtype::FLOATS } else { &[Dtype::U8] })?;
        if let Some(biases) = &biases {
            biases.expect_dtype(&Dtype::FLOATS)?;
        }
        let &[out, groups] = scales.shape() else {
            return Err(scales.wrong_shape(format!("a 2-D [out, in / {group_size}] tensor")));
        };
        // An absurd width (possible with zero rows, which hold no bytes) must not overflow later.
        let Some((in_features, row_bits)) =
            groups.checked_mul(group_size).and_then(|i| Some((i, i.checked_mul(bits as usize)?)))
        else {
            return Err(
                scales.wrong_shape(format!("[{out}, groups] with groups * {group_size} * {bits} bits representable"))
            );
        };
        // Groups hold 16 or more values of 4 or more bits, so a row is whole words.
        let packed = row_bits / 32;
        let ctx = format!("(bits={bits}, group_size={group_size}, in={in_features} from the scales)");
        if weight.shape() != [out, packed] {
            return Err(weight.wrong_shape(format!("[{out}, {packed}] {ctx}")));
        }
        if let Some(biases) = biases.filter(|b| b.shape() != [out, groups]) {
            return Err(biases.wrong_shape(format!("[{out}, {groups}] like the scales")));
        }
        if let Some(b) = &bias {
            check_bias(b, out)?;
        }
        Ok(QuantizedLinear { weight, scales, biases, bias, params, out_features: out, in_features })
    }

    /// The packed weight `U32 [out, in * bits / 32]`.
    pub fn weight(&self) -> TensorView<'a> {
        self.weight
    }

    /// Per-group scales `[out, in / group_size]`.
    pub fn scales(&self) -> TensorView<'a> {
        self.scales
    }

    /// Per-group biases (zero points times scale) `[out, in / group_size]`; affine only.
    pub fn biases(&self) -> Option<TensorView<'a>> {
        self.biases
    }

    /// The quantization mode.
    pub fn mode(&self) -> QuantMode {
        self.params.mode
    }

    /// Every scale as f32 (a floating-point mode's decoded), row-major.
    fn scales_f32(&self) -> Vec<f32> {
        scales_to_f32(self.params.mode, self.scales.dtype(), self.scales.bytes())
    }

    /// Every bias as f32 (none outside affine).
    fn biases_f32(&self) -> Vec<f32> {
        self.biases.map(|b| floats_to_f32(b.dtype(), b.bytes())).unwrap_or_default()
    }

    /// The layer's own optional additive bias `[out]` (`<prefix>.bias`, not `.biases`).
    pub fn bias(&self) -> Option<TensorView<'a>> {
        self.bias
    }

    /// Bits and group size.
    pub fn params(&self) -> QuantParams {
        self.params
    }

    /// Bits per value.
    pub fn bits(&self) -> u32 {
        self.params.bits
    }

    /// Inputs per scale/bias group.
    pub fn group_size(&self) -> usize {
        self.params.group_size
    }

    /// Rows.
    pub fn out_features(&self) -> usize {
        self.out_features
    }

    /// Unpacked columns.
    pub fn in_features(&self) -> usize {
        self.in_features
    }

    /// The whole weight dequantized, `[out, in]` row-major. See [`dequantize_f32`].
    pub fn dequantize_f32(&self) -> Vec<f32> {
        dequantize_f32(self)
    }

    /// The given rows dequantized (`rows.len() * in` values): an embedding lookup.
    ///
    /// # Errors
    /// [`Error::RowOutOfRange`] for a row `>= out_features`.
    pub fn dequantize_rows(&self, rows: &[usize]) -> Result<Vec<f32>> {
        check_rows(&self.weight, rows, self.out_features)?;
        let mut out = Vec::with_capacity(rows.len().saturating_mul(self.in_features));
        for &r in rows {
            self.dequantize_row_into(r, &mut out).ok_or_else(|| row_error(&self.weight, r, self.out_features))?;
        }
        Ok(out)
    }

    /// Appends row `r`; `None` if it does not exist.
    fn dequantize_row_into(&self, r: usize, out: &mut Vec<f32>) -> Option<()> {
        let groups = self.in_features / self.params.group_size;
        let row_bytes = self.in_features * self.params.bits as usize / 8;
        let wrow = row_slice(self.weight.bytes(), r, row_bytes)?;
        let srow = row_slice(self.scales.bytes(), r, groups * self.scales.dtype().size_bytes())?;
        let scales = scales_to_f32(self.params.mode, self.scales.dtype(), srow);
        let biases = match self.biases {
            Some(b) => floats_to_f32(b.dtype(), row_slice(b.bytes(), r, groups * b.dtype().size_bytes())?),
            None => Vec::new(),
        };
        unpack_row(wrow, self.params, &scales, &biases, out);
        Some(())
    }
}

impl QuantizedLinear<'_> {
    /// The weight as MLX's `mx.dequantize` gives it, in the scales' own type (widened to f32):
    /// for f16 or bf16 scales the product `q * scale` is rounded to that type and then the sum
    /// with the bias (what MLX's half-precision arithmetic does); for f32 scales, as
    /// [`dequantize_f32`]; the floating-point modes' products are exact, as
    /// [`dequantize_f32`].
    pub fn dequantize_in_scale_type(&self) -> Vec<f32> {
        if self.params.mode != QuantMode::Affine {
            return dequantize_f32(self);
        }
        let round = rounding(self.scales.dtype());
        let scales = self.scales_f32();
        let biases = self.biases_f32();
        let (gs, bits) = (self.params.group_size, self.params.bits as usize);
        let groups = self.in_features / gs;
        let row_bytes = self.in_features * bits / 8;
        let mut out = Vec::with_capacity(self.out_features.saturating_mul(self.in_features));
        if row_bytes == 0 || groups == 0 {
            return out;
        }
        for (r, wrow) in self.weight.bytes().chunks_exact(row_bytes).enumerate() {
            for c in 0..self.in_features {
                let g = r * groups + c / gs;
                out.push(round(round(unpack(wrow, c, bits) as f32 * scales[g]) + biases[g]));
            }
        }
        out
    }
}

/// A quantized layer held as MLX affine quantization of another width, exactly: every weight
/// `scale * q + bias` it gives equals (in f32) the one the layer itself gives. What the packed
/// products run for the widths and modes they have no code of their own for
/// ([`QuantizedLinear::affine_width`]).
#[derive(Debug, Clone, PartialEq)]
pub struct AffineCopy {
    /// 4 or 8.
    pub bits: u32,
    pub group_size: usize,
    pub out_features: usize,
    pub in_features: usize,
    /// MLX's packing at `bits`: `[out, in * bits / 8]` bytes, value `j` of a row at bit `j * bits`.
    pub weight: Vec<u8>,
    /// `[out, in / group_size]`, each exactly a value of `dtype`.
    pub scales: Vec<f32>,
    /// `[out, in / group_size]`, each exactly a value of `dtype`.
    pub biases: Vec<f32>,
    /// The float type holding every scale and bias exactly: the checkpoint's own for an
    /// affine layer; f16 for an FP4 layer whose scales allow it, else f32.
    pub dtype: Dtype,
}

impl AffineCopy {
    /// Every weight `q * scale + bias` in f32, `[out, in]` row-major (as [`dequantize_f32`]).
    pub fn dequantize_f32(&self) -> Vec<f32> {
        let (bits, gs, inp) = (self.bits as usize, self.group_size, self.in_features);
        let row_bytes = inp * bits / 8;
        let mut out = Vec::with_capacity(self.out_features.saturating_mul(inp));
        if row_bytes == 0 || gs == 0 {
            return out;
        }
        for (r, row) in self.weight.chunks_exact(row_bytes).enumerate() {
            for c in 0..inp {
                let g = r * (inp / gs) + c / gs;
                out.push(unpack(row, c, bits) as f32 * self.scales[g] + self.biases[g]);
            }
        }
        out
    }
}

/// The shape of an [`AffineCopy`] before it is made: its width and the type of its scales.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AffineWidth {
    pub bits: u32,
    pub dtype: Dtype,
}

impl QuantizedLinear<'_> {
    /// The narrowest affine width of 4 and 8 bits that holds this layer exactly, and the
    /// type its scales and biases need (reads the scales, not the weight): affine 2 and 3
    /// bits in 4, 5 and 6 in 8 (the same `q`, scales and biases); FP4 (`mxfp4`, `nvfp4`) in
    /// 8, as `q = 2 * fp4 + 12` (an integer in 0..=24) with scale `s / 2` and bias `-6 * s`.
    /// `None` for `mxfp8`: E4M3 values are not an affine image of 8-bit integers.
    pub fn affine_width(&self) -> Option<AffineWidth> {
        let bits = self.params.bits;
        match self.params.mode {
            QuantMode::Affine => Some(AffineWidth { bits: if bits <= 4 { 4 } else { 8 }, dtype: self.scales.dtype() }),
            QuantMode::Mxfp4 | QuantMode::Nvfp4 => {
                // f16 holds s / 2, -6 s and what a graph form folds into the bias (up to
                // 128 * s / 2 - 6 s = 58 s) exactly when s / 2 is no finer than f16's
                // smallest step 2^-24 (E4M3 and E8M0 scales have at most 4 significant bits)
                // and 58 s stays below f16's largest finite value.
                let f16_exact =
                    self.scales_f32().iter().all(|&s| s == 0.0 || (s.abs() >= 2f32.powi(-23) && s.abs() <= 1024.0));
                Some(AffineWidth { bits: 8, dtype: if f16_exact { Dtype::F16 } else { Dtype::F32 } })
            }
            QuantMode::Mxfp8 => None,
        }
    }

    /// An FP4 layer's scales against its codes read as `2 * fp4 + 12` (`s / 2`, those of
    /// [`to_affine`](Self::to_affine)'s copy, whose values are exactly that), as a kernel that
    /// reads the codes through a table takes them, with `-12` times each as the bias; `None`
    /// for the other modes.
    pub fn fp4_scales(&self) -> Option<Vec<f32>> {
        matches!(self.params.mode, QuantMode::Mxfp4 | QuantMode::Nvfp4)
            .then(|| self.scales_f32().iter().map(|s| s / 2.0).collect())
    }

    /// This layer as [`affine_width`](Self::affine_width) says, `None` where that is.
    pub fn to_affine(&self) -> Option<AffineCopy> {
        let AffineWidth { bits, dtype } = self.affine_width()?;
        let (gs, from) = (self.params.group_size, self.params.bits as usize);
        let (out, inp) = (self.out_features, self.in_features);
        let row_bytes = inp * from / 8;
        let fp4 = self.params.mode != QuantMode::Affine;
        let mut codes = Vec::with_capacity(out.saturating_mul(inp));
        if row_bytes > 0 {
            for row in self.weight.bytes().chunks_exact(row_bytes) {
                codes.extend((0..inp).map(|c| {
                    let q = unpack(row, c, from);
                    // 2 * e2m1(q) + 12, exact: e2m1 is a multiple of 0.5 within [-6, 6].
                    if fp4 { (2.0 * e2m1(q) + 12.0) as u32 } else { q }
                }));
            }
        }
        let weight = pack(&codes, inp, bits)?.iter().flat_map(|w| w.to_le_bytes()).collect();
        let (scales, biases) = match self.fp4_scales() {
            Some(half) => (half, self.scales_f32().iter().map(|s| -6.0 * s).collect()),
            None => (self.scales_f32(), self.biases_f32()),
        };
        Some(AffineCopy { bits, group_size: gs, out_features: out, in_features: inp, weight, scales, biases, dtype })
    }
}

/// f32 to the nearest value of `dtype` (f16, bf16: round to nearest even), as f32.
fn rounding(dtype: Dtype) -> fn(f32) -> f32 {
    match dtype {
        Dtype::F16 => |x| half::f16::from_f32(x).to_f32(),
        Dtype::BF16 => |x| half::bf16::from_f32(x).to_f32(),
        _ => |x| x,
    }
}

/// `values` (rows of `in_features`, each a value of `dtype`) quantized as MLX's affine
/// `mx.quantize` does, then dequantized in f32 with the scales and biases as stored (rounded
/// to `dtype`): the weights an MLX model computes with after quantizing at load (mlx-lm's
/// deepseek_v3 quantizes the per-head matrices it splits out of `kv_b_proj` again).
///
/// Per group of `group_size`: in f32, `scale = max((max - min) / (2^bits - 1), 1e-7)`, signed
/// toward the end of larger magnitude (`edge`); `q0 = round(edge / scale)`, and where `q0 != 0`
/// the scale becomes `edge / q0` and the bias `edge` (else 0); each value's `q = clip(round((w
/// - bias) / scale), 0, 2^bits - 1)`, rounding half to even. Checked bit for bit against MLX
/// 0.32.4's `mx.quantize` in `crates/weights/tests/quant.rs`, and end to end by the
/// `deepseek_v3_kv_b` fixture.
///
/// `None` when `group_size` does not divide `in_features` or the bits are not MLX's.
pub fn quantize_dequantize(values: &[f32], in_features: usize, params: QuantParams, dtype: Dtype) -> Option<Vec<f32>> {
    let QuantParams { group_size, bits, mode } = params;
    let affine = mode == QuantMode::Affine;
    if !affine || params.validate().is_err() || in_features == 0 || !in_features.is_multiple_of(group_size) {
        return None;
    }
    let round = rounding(dtype);
    let top = ((1u32 << bits) - 1) as f32;
    let mut out = Vec::with_capacity(values.len());
    for group in values.chunks(group_size) {
        let (lo, hi) = group.iter().fold((f32::INFINITY, f32::NEG_INFINITY), |(lo, hi), &w| (lo.min(w), hi.max(w)));
        let toward_min = lo.abs() > hi.abs();
        let mut scale = ((hi - lo) / top).max(1e-7);
        if !toward_min {
            scale = -scale;
        }
        let edge = if toward_min { lo } else { hi };
        let q0 = (edge / scale).round_ties_even();
        let (scale, bias) = if q0 != 0.0 { (edge / q0, edge) } else { (scale, 0.0) };
        let (stored_scale, stored_bias) = (round(scale), round(bias));
        out.extend(group.iter().map(|&w| {
            let q = ((w - bias) / scale).round_ties_even().clamp(0.0, top);
            q * stored_scale + stored_bias
        }));
    }
    Some(out)
}

/// Dequantizes the whole weight to f32 `[out, in]`, row-major: affine `w[r][c] = q * scale +
/// bias` with `q` the unsigned `bits`-bit field of element `c` in row `r`, `scale`/`bias`
/// those of group `c / group_size`, computed in f32 as a multiply then an add (no fused
/// multiply-add, so results are reproducible bit for bit); a floating-point mode's `fp(q) *
/// scale`, exact in f32 (as MLX's `mx.dequantize`).
pub fn dequantize_f32(q: &QuantizedLinear<'_>) -> Vec<f32> {
    // With rows present, out * in values are backed by file bytes, so this cannot overflow.
    let mut out = Vec::with_capacity(q.out_features.saturating_mul(q.in_features));
    let scales = q.scales_f32();
    let biases = q.biases_f32();
    let groups = q.in_features / q.params.group_size;
    let row_bytes = q.in_features * q.params.bits as usize / 8;
    if row_bytes == 0 || groups == 0 {
        return out;
    }
    for (r, wrow) in q.weight.bytes().chunks_exact(row_bytes).enumerate() {
        let (first, last) = (r * groups, (r + 1) * groups);
        let (Some(srow), brow) = (scales.get(first..last), biases.get(first..last).unwrap_or(&[])) else { break };
        unpack_row(wrow, q.params, srow, brow, &mut out);
    }
    out
}

/// Dequantizes one packed row given that row's scales and (affine) biases.
fn unpack_row(row: &[u8], p: QuantParams, scales: &[f32], biases: &[f32], out: &mut Vec<f32>) {
    let bits = p.bits as usize;
    for (g, &s) in scales.iter().enumerate() {
        let first = g * p.group_size;
        let codes = (first..first + p.group_size).map(|c| unpack(row, c, bits));
        match p.mode {
            QuantMode::Affine => {
                let b = biases.get(g).copied().unwrap_or(0.0);
                out.extend(codes.map(|q| q as f32 * s + b));
            }
            QuantMode::Mxfp4 | QuantMode::Nvfp4 => out.extend(codes.map(|q| e2m1(q) * s)),
            QuantMode::Mxfp8 => out.extend(codes.map(|q| e4m3(q) * s)),
        }
    }
}

/// The FP4 (E2M1) number of a 4-bit code: sign bit 3, magnitudes 0, 0.5, 1, 1.5, 2, 3, 4, 6.
fn e2m1(code: u32) -> f32 {
    const MAGNITUDE: [f32; 8] = [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0];
    let m = MAGNITUDE[(code & 7) as usize];
    if code & 8 != 0 { -m } else { m }
}

/// The FP8 E4M3 (`e4m3fn`: bias 7, no infinities, `S.1111.111` NaN) number of an 8-bit code.
fn e4m3(code: u32) -> f32 {
    let (e, m) = ((code >> 3) & 15, code & 7);
    let magnitude = match (e, m) {
        (15, 7) => f32::NAN,
        (0, m) => m as f32 / 8.0 * 2f32.powi(-6),
        (e, m) => (1.0 + m as f32 / 8.0) * 2f32.powi(e as i32 - 7),
    };
    if code & 0x80 != 0 { -magnitude } else { magnitude }
}

/// Scales as f32: affine's floats widened; the E8M0 powers of two `2^(s - 127)` (mxfp4,
/// mxfp8); nvfp4's E4M3 numbers.
fn scales_to_f32(mode: QuantMode, dtype: Dtype, bytes: &[u8]) -> Vec<f32> {
    match mode {
        QuantMode::Affine => floats_to_f32(dtype, bytes),
        QuantMode::Mxfp4 | QuantMode::Mxfp8 => bytes.iter().map(|&s| 2f32.powi(i32::from(s) - 127)).collect(),
        QuantMode::Nvfp4 => bytes.iter().map(|&s| e4m3(u32::from(s))).collect(),
    }
}

/// The unsigned `bits`-bit field of element `j` in a little-endian bit stream.
fn unpack(row: &[u8], j: usize, bits: usize) -> u32 {
    let bit = j * bits;
    let byte = bit / 8;
    // bits <= 8 and the shift <= 7, so two bytes always hold the whole field.
    let lo = u32::from(row.get(byte).copied().unwrap_or(0));
    let hi = u32::from(row.get(byte + 1).copied().unwrap_or(0));
    ((lo | hi << 8) >> (bit % 8)) & ((1u32 << bits) - 1)
}

/// Packs unsigned `bits`-bit values into MLX's layout: each row of `in_features` values
/// becomes `in_features * bits / 32` little-endian words, element `j` at bit `j * bits` of the
/// row. The inverse of what [`dequantize_f32`] reads; used to build test checkpoints.
///
/// Returns `None` if `bits` is unsupported, a row is not a whole number of words, `values`
/// is not a whole number of rows, or a value does not fit in `bits`.
pub fn pack(values: &[u32], in_features: usize, bits: u32) -> Option<Vec<u32>> {
    let b = bits as usize;
    let row_bits = in_features.checked_mul(b)?;
    if !SUPPORTED_BITS.contains(&bits) || in_features == 0 || !row_bits.is_multiple_of(32) {
        return None;
    }
    if !values.len().is_multiple_of(in_features) || values.iter().any(|&v| v >> bits != 0) {
        return None;
    }
    let words_per_row = row_bits / 32;
    let mut words = Vec::with_capacity(values.len() / in_features * words_per_row);
    for row in values.chunks_exact(in_features) {
        let mut bytes = vec![0u8; words_per_row * 4];
        for (j, &v) in row.iter().enumerate() {
            let bit = j * b;
            let field = v << (bit % 8);
            for (k, byte) in bytes.iter_mut().skip(bit / 8).take(2).enumerate() {
                *byte |= (field >> (8 * k)) as u8;
            }
        }
        words.extend(bytes.chunks_exact(4).map(|c| u32::from_le_bytes([c[0], c[1], c[2], c[3]])));
    }
    Some(words)
}

fn check_bias(bias: &TensorView<'_>, out: usize) -> Result<()> {
    bias.expect_dtype(&Dtype::FLOATS)?;
    if bias.shape() != [out] {
        return Err(bias.wrong_shape(format!("[{out}]")));
    }
    Ok(())
}

fn row_slice(bytes: &[u8], r: usize, row_bytes: usize) -> Option<&[u8]> {
    let start = r.checked_mul(row_bytes)?;
    bytes.get(start..start.checked_add(row_bytes)?)
}

fn check_rows(t: &TensorView<'_>, rows: &[usize], out: usize) -> Result<()> {
    match rows.iter().find(|&&r| r >= out) {
        Some(&r) => Err(row_error(t, r, out)),
        None => Ok(()),
    }
}

fn row_error(t: &TensorView<'_>, row: usize, rows: usize) -> Error {
    Error::RowOutOfRange { path: t.file().to_path_buf(), tensor: t.name().to_owned(), row, rows }
}
