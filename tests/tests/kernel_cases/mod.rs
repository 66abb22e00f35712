//! What the CPU kernel tests share: the shapes and entry points they run, the IREE module
//! that dispatches them, the Rust model of the kernels' arithmetic (`kernels::cpu`), which
//! every kernel object equals bit for bit, and the checks that hold an object's results
//! against it. Used by kernels.rs (the host's objects, run by IREE), kernels_aarch64.rs
//! (the aarch64 object, run under qemu and linked by IREE for aarch64) and kernels_amx.rs
//! (the AMX object with its tiles emulated), the last two through kernel_driver.

#![allow(dead_code, clippy::unwrap_used)] // each test file uses part of it

use e2e::values;
use half::f16;
use hlo_emit::{Context, ElementType, Module};
use kernels::cpu::{self, Entry, Op, Scale};

/// Output rows (6 blocks of 16: a full workgroup of 4 and a partial one) and input width.
pub const O: usize = 96;
pub const K: usize = 256;
/// Rows of x: one; 3 (chunks of 2 and 1); 8 (one panel; AMX tiles; the aarch64 object's
/// two passes of 4); 13 (a panel, then 5 rows: chunks of 4 and 1, or the AMX object's tiles
/// again); 27 (three panels, then 3 rows).
pub const ROWS: [usize; 5] = [1, 3, 8, 13, 27];
pub const IDS: [i32; 5] = [0, 95, 17, 17, 1000]; // 1000 is clamped to the last row
/// Stacked experts of the `qmve` cases, and each pair's expert: repeats, every expert, and
/// ids past either end (clamped to the first and last expert).
pub const EXPERTS: usize = 3;
pub const PAIRS: [i32; 7] = [2, 0, 2, 1, 7, -1, 1];

/// The expert an id names, clamped as the kernel clamps it.
pub fn expert_of(id: i32) -> usize {
    usize::try_from(id.max(0)).unwrap_or(0).min(EXPERTS - 1)
}

/// The packings: affine 4 and 8 bits, FP4 (E2M1 codes), and affine 3 and 6 bits (read as
/// stored, widened to the 4-bit and 8-bit tiles a group at a time).
pub const PACKINGS: [(u32, bool); 5] = [(4, false), (8, false), (4, true), (3, false), (6, false)];

pub fn entries() -> Vec<Entry> {
    let mut all = Vec::new();
    for op in Op::ALL {
        for (bits, fp4) in PACKINGS {
            // mxfp4's scale bytes go to the FP4 entries only.
            let scales: &[Scale] = if fp4 { &[Scale::F16, Scale::F32, Scale::E8m0] } else { &[Scale::F16, Scale::F32] };
            for &scale in scales {
                all.push(Entry { op, bits, scale, fp4, x8: false });
                // The products' 8-bit-activation twins.
                if matches!(op, Op::Matvec | Op::MatvecAdd) {
                    all.push(Entry { op, bits, scale, fp4, x8: true });
                }
            }
        }
    }
    all
}

/// MLX's usual group sizes (64 and 32) and the extremes the kernels take: 128 (the AMX object
/// splits it in two chunks) and 16 (half of the 32 values its quantization takes at once;
/// 3 bits take 32, 64 and 128 only: one unit of 32 k a group, and four); FP4 at mxfp4's 32
/// (its E8M0 scale bytes too) and nvfp4's 16.
pub fn group_size(e: &Entry) -> usize {
    match (e.bits, e.fp4, e.scale) {
        (4, true, Scale::F16 | Scale::E8m0) => 32,
        (4, true, Scale::F32) => 16,
        (4, _, Scale::F16) => 64,
        (4, _, Scale::F32) => 128,
        (3, _, Scale::F16) => 32,
        (3, _, Scale::F32) => 128,
        (6, _, Scale::F16) => 128,
        (6, _, Scale::F32) => 32,
        (_, _, Scale::F16) => 32,
        (_, _, Scale::F32) => 16,
        // mxfp4's own group size (E8M0 scales go with FP4 entries only).
        (_, _, Scale::E8m0) => 32,
    }
}

pub fn function_name(e: &Entry, rows: usize) -> String {
    format!("{}_t{rows}", e.export())
}

/// The `qmve` function of an entry with `by_expert` 0 or 1.
pub fn experts_function_name(e: &Entry, by_expert: usize) -> String {
    format!("{}_t{}_m{by_expert}", e.export(), PAIRS.len())
}

fn scale_elem(scale: Scale) -> ElementType {
    match scale {
        Scale::F16 => ElementType::F16,
        Scale::F32 => ElementType::F32,
        Scale::E8m0 => ElementType::I8,
    }
}

/// One function per (entry, row count), each one dispatch of that entry point of the
/// executable `source` declares (`kernels::cpu::executable_source`).
pub fn module(source: &str) -> String {
    let ctx = Context::new();
    let m = Module::new(&ctx);
    for e in entries() {
        let gs = group_size(&e);
        let (blocks, block_bytes, groups) = (O / 16, K * e.bits as usize * 16 / 8, K / gs);
        if e.op == Op::Experts {
            let (n, x) = (PAIRS.len() as i64, EXPERTS as i64);
            let s = scale_elem(e.scale).tensor(&[x, blocks as i64, (groups * 16) as i64]);
            let mut args = vec![
                ElementType::F32.tensor(&[n, K as i64]),
                ElementType::I32.tensor(&[n]),
                ElementType::I8.tensor(&[x, blocks as i64, block_bytes as i64]),
                s.clone(),
            ];
            if !e.fp4 {
                args.push(s);
            }
            for by_expert in [0, 1] {
                m.func(&experts_function_name(&e, by_expert), &args, |f, a| {
                    let dims = [PAIRS.len(), K, O, gs, EXPERTS, by_expert].map(|d| d as i32);
                    let workload = (if by_expert == 1 { EXPERTS } else { PAIRS.len() } * blocks) as i64;
                    let export = e.export();
                    let result = ElementType::F32.tensor(&[n, O as i64]);
                    Ok(vec![f.dispatch(cpu::EXECUTABLE, &export, workload, &dims, a, result)?])
                })
                .unwrap();
            }
            continue;
        }
        let row_counts: &[usize] = if e.op == Op::Rows { &[IDS.len()] } else { &ROWS };
        for &t in row_counts {
            let (input, workload, result) = match e.op {
                Op::Matvec | Op::MatvecAdd | Op::Experts => {
                    (ElementType::F32.tensor(&[t as i64, K as i64]), blocks, [t, O])
                }
                Op::Rows => (ElementType::I32.tensor(&[t as i64]), t, [t, K]),
            };
            let s = scale_elem(e.scale).tensor(&[blocks as i64, (groups * 16) as i64]);
            let mut args = vec![input, ElementType::I8.tensor(&[blocks as i64, block_bytes as i64]), s.clone()];
            if !e.fp4 {
                args.push(s);
            }
            if e.op == Op::MatvecAdd {
                args.push(ElementType::F32.tensor(&[t as i64, O as i64]));
            }
            m.func(&function_name(&e, t), &args, |f, a| {
                let dims = [t, K, O, gs].map(|d| d as i32);
                let export = e.export();
                let result = ElementType::F32.tensor(&result.map(|d| d as i64));
                Ok(vec![f.dispatch(cpu::EXECUTABLE, &export, workload as i64, &dims, a, result)?])
            })
            .unwrap();
        }
    }
    m.append_source(cpu::EXECUTABLE, source).unwrap();
    m.to_text()
}

/// FP4's E2M1 code -> 2v + 12 (`cpu/qmv.h`'s FP4_TABLE), and its bias per unit of scale.
pub const FP4_TABLE: [u8; 16] = [12, 13, 14, 15, 16, 18, 20, 24, 12, 11, 10, 9, 8, 6, 4, 0];
pub const FP4_BIAS: f32 = -12.0;

/// A random matrix in MLX's form: packed values `q[out][inp]` (every value 0..2^bits, so the
/// top bit is exercised), per-group scales and biases `[out][groups]` (already rounded to f16
/// where the kernel reads f16). With `fp4`, `q` holds E2M1 codes, whose values are
/// `FP4_TABLE[q]`, and the biases are `FP4_BIAS` times the scales (the kernel computes them).
#[derive(Debug)]
pub struct Matrix {
    pub bits: u32,
    pub fp4: bool,
    pub out: usize,
    pub inp: usize,
    pub group_size: usize,
    pub q: Vec<u8>,
    pub scales: Vec<f32>,
    pub biases: Vec<f32>,
    /// With E8M0 scales, the bytes the kernel reads (`scales` holds their values).
    pub e8m0: Vec<u8>,
    /// The integer range each group of x is quantized to: 32767, or 127 for an x8 entry.
    pub x_levels: f32,
}

impl Matrix {
    pub fn random(bits: u32, scale: Scale, out: usize, inp: usize, group_size: usize, seed: u64) -> Matrix {
        let groups = inp / group_size;
        let round = |v: f32| if scale == Scale::F16 { f16::from_f32(v).to_f32() } else { v };
        let levels = 1u32 << bits;
        let q =
            values(seed, out * inp).iter().map(|v| (((v + 1.0) * 0.5 * levels as f32) as u32 % levels) as u8).collect();
        let mut scales: Vec<f32> =
            values(seed + 1, out * groups).iter().map(|v| round(0.01 + 0.02 * v.abs())).collect();
        let biases = values(seed + 2, out * groups).iter().map(|v| round(-0.1 * v.abs())).collect();
        let mut e8m0 = Vec::new();
        if scale == Scale::E8m0 {
            // Powers of two from 2^-13 to 2^-3 (s / 2 of E8M0 bytes 115 to 125).
            e8m0 = values(seed + 1, out * groups).iter().map(|v| 115 + ((v.abs() * 11.0) as u8).min(10)).collect();
            scales = e8m0.iter().map(|&e| Scale::e8m0_half(e)).collect();
        }
        Matrix { bits, fp4: false, out, inp, group_size, q, scales, biases, e8m0, x_levels: 32767.0 }
    }

    /// The matrix of an `entry`: FP4 codes with their computed biases for an FP4 entry.
    pub fn of(e: &Entry, out: usize, inp: usize, group_size: usize, seed: u64) -> Matrix {
        let mut m = Matrix::random(e.bits, e.scale, out, inp, group_size, seed);
        if e.x8 {
            m.x_levels = 127.0;
        }
        if e.fp4 {
            m.fp4 = true;
            m.biases = m.scales.iter().map(|s| s * FP4_BIAS).collect();
        }
        m
    }

    /// Value `i` of `q` (row-major) as the kernels multiply it.
    pub fn value(&self, i: usize) -> u8 {
        if self.fp4 { FP4_TABLE[usize::from(self.q[i])] } else { self.q[i] }
    }

    pub fn groups(&self) -> usize {
        self.inp / self.group_size
    }

    /// MLX's packed rows: value k of a row at bit `k * bits` of the row read as one
    /// little-endian number (3 and 6 bits straddle bytes).
    pub fn mlx_bytes(&self) -> Vec<u8> {
        let bits = self.bits as usize;
        let mut out = vec![0u8; self.q.len() * bits / 8];
        for (i, &v) in self.q.iter().enumerate() {
            let (row, k) = (i / self.inp, i % self.inp);
            let bit = row * self.inp * bits + k * bits;
            let v = u16::from(v) << (bit % 8);
            out[bit / 8] |= v as u8;
            if v > 0xFF {
                out[bit / 8 + 1] |= (v >> 8) as u8;
            }
        }
        out
    }

    /// The packed weight in the kernels' layout.
    pub fn kernel_weight(&self) -> Vec<u8> {
        cpu::repack_weight(self.bits, self.out, self.inp, &self.mlx_bytes())
    }

    /// Per-group values (`scales` or `biases`) in the kernels' layout.
    pub fn kernel_groups(&self, v: &[f32]) -> Vec<f32> {
        cpu::repack_groups(v, self.out, self.groups())
    }

    /// `W[o, k]` as `qrows` computes it: `fma(scale, q, bias)`, one rounding.
    pub fn dequantized(&self, o: usize, k: usize) -> f32 {
        let g = o * self.groups() + k / self.group_size;
        self.scales[g].mul_add(f32::from(self.value(o * self.inp + k)), self.biases[g])
    }
}

/// The kernels' arithmetic, operation for operation: each group of a row of x quantized to
/// i16 (x8 entries: 8 bits, `Matrix::x_levels`) against its largest magnitude (its f32 sum taken in 16 lanes, then halved as
/// `_mm512_reduce_add_ps` does), exact integer dot products, then per group
/// `acc = fma(scale, dot * x_scale, acc); acc = fma(bias, x_sum, acc)`.
pub fn model_qmv(m: &Matrix, x: &[f32], t: usize) -> Vec<f32> {
    let (gs, groups, k) = (m.group_size, m.groups(), m.inp);
    let mut y = vec![0f32; t * m.out];
    for row in 0..t {
        let quantized: Vec<(Vec<i32>, f32, f32)> = (0..groups)
            .map(|g| {
                let xg = &x[row * k + g * gs..][..gs];
                let mut lanes = [0f32; 16];
                for (i, v) in xg.iter().enumerate() {
                    lanes[i % 16] += v;
                }
                let l8: Vec<f32> = (0..8).map(|j| lanes[j + 8] + lanes[j]).collect();
                let l4: Vec<f32> = (0..4).map(|j| l8[j + 4] + l8[j]).collect();
                let sum = (l4[0] + l4[2]) + (l4[1] + l4[3]);
                let amax = xg.iter().fold(0f32, |a, v| a.max(v.abs()));
                let levels = m.x_levels;
                let inv = if amax > 0.0 { levels / amax } else { 0.0 };
                (xg.iter().map(|v| (v * inv).round_ties_even() as i32).collect(), amax / levels, sum)
            })
            .collect();
        for o in 0..m.out {
            let mut acc = 0f32;
            for (g, (xq, dx, sum)) in quantized.iter().enumerate() {
                let dot: i32 = xq.iter().enumerate().map(|(i, v)| i32::from(m.value(o * k + g * gs + i)) * v).sum();
                acc = m.scales[o * groups + g].mul_add(dot as f32 * dx, acc);
                acc = m.biases[o * groups + g].mul_add(*sum, acc);
            }
            y[row * m.out + o] = acc;
        }
    }
    y
}

/// `x · Wᵀ` with the dequantized matrix, in f64.
pub fn exact_qmv(m: &Matrix, x: &[f32], t: usize) -> Vec<f64> {
    let (gs, k) = (m.group_size, m.inp);
    let w = |o: usize, i: usize| {
        let g = o * m.groups() + i / gs;
        f64::from(m.scales[g]) * f64::from(m.value(o * k + i)) + f64::from(m.biases[g])
    };
    (0..t)
        .flat_map(|r| (0..m.out).map(move |o| (0..k).map(|i| w(o, i) * f64::from(x[r * k + i])).sum::<f64>()))
        .collect()
}

/// Rows of x (`t` x `k`) of several magnitudes, one group of them all zero.
pub fn input(t: usize, k: usize, seed: u64) -> Vec<f32> {
    let mut x: Vec<f32> =
        values(seed, t * k).iter().enumerate().map(|(i, v)| v * [1.0, 30.0, 0.01][i / k % 3]).collect();
    x[..32].fill(0.0);
    x
}

/// A kernel's `qmv` result (`qmvr`'s: plus the `residual`): the model's bits, and (the
/// model itself) within a few 1e-5 of each row's scale of the f64 product, the cost of
/// quantizing x to i16 (within 3e-2 for x8 entries, quantizing it to 8 bits).
pub fn check_qmv(what: &str, m: &Matrix, x: &[f32], t: usize, residual: Option<&[f32]>, got: &[f32]) {
    let mut model = model_qmv(m, x, t);
    let mut exact = exact_qmv(m, x, t);
    if let Some(r) = residual {
        // The graph's residual add after the product, in f32.
        model.iter_mut().zip(r).for_each(|(y, r)| *y += r);
        exact.iter_mut().zip(r).for_each(|(y, r)| *y += f64::from(*r));
    }
    assert_eq!(got.len(), model.len(), "{what} T={t}: output length");
    for (i, (g, want)) in got.iter().zip(&model).enumerate() {
        let (r, o) = (i / m.out, i % m.out);
        assert_eq!(g.to_bits(), want.to_bits(), "{what} T={t}: y[{r}, {o}] = {g}, the model says {want}");
    }
    for (r, row) in exact.chunks(m.out).enumerate() {
        let scale = row.iter().fold(1e-3f64, |a, v| a.max(v.abs()));
        for (o, want) in row.iter().enumerate() {
            let got = got[r * m.out + o];
            let err = (f64::from(got) - want).abs() / scale;
            let tolerance = if m.x_levels < 32767.0 { 3e-2 } else { 1e-4 };
            assert!(err < tolerance, "{what} T={t}: y[{r}, {o}] = {got}, exactly {want} (error {err:.1e})");
        }
    }
}

/// A kernel's `qrows` result for `ids`: the dequantized rows bit for bit (ids past the end
/// clamped to the last row, as a StableHLO gather clamps).
pub fn check_rows(what: &str, m: &Matrix, ids: &[i32], got: &[f32]) {
    assert_eq!(got.len(), ids.len() * m.inp, "{what}: output length");
    for (t, id) in ids.iter().enumerate() {
        let o = usize::try_from(*id).unwrap().min(m.out - 1);
        for k in 0..m.inp {
            let (got, want) = (got[t * m.inp + k], m.dequantized(o, k));
            assert_eq!(got.to_bits(), want.to_bits(), "{what}: id {id} k {k}: {got} vs {want}");
        }
    }
}

/// Rows of x of the f16 product's cases: one (decode: the blocks side by side); 3; 8; 13;
/// 27 (the AVX-512 objects' tiles of 12 rows twice, then 2 and 1; others' tiles of 2).
pub const DENSE_ROWS: [usize; 5] = [1, 3, 8, 13, 27];

/// A random f16, bf16 or mxfp8 matrix `[O, K]` for the dense product (`kernels::cpu::Dense`):
/// its bytes in the kernel's layout and their values. f16 and bf16 with magnitudes from
/// subnormal (f16) to large, a zero and a negative zero; mxfp8 with every code but E4M3's
/// NaN (subnormals, both zeros) and scale bytes from the smallest the kernels take (values
/// down to 2^-126) to 2^23, its values computed apart from
/// `kernels::cpu::mxfp8_value` (in f64, from E4M3's definition).
pub struct DenseMatrix {
    pub elem: cpu::DenseElem,
    /// The weight in the kernel's blocks.
    pub weight: Vec<u8>,
    /// mxfp8's scale bytes in the kernel's blocks.
    pub scales: Option<Vec<u8>>,
    pub values: Vec<f32>,
}

/// An FP8 E4M3 code's value (E4M3FN: bias 7, subnormals below exponent 1, 0x7F/0xFF NaN).
fn e4m3(code: u8) -> f64 {
    let (sign, exp, mant) = (if code & 0x80 != 0 { -1.0 } else { 1.0 }, (code >> 3) & 0xF, code & 7);
    let v = if exp == 0 {
        f64::from(mant) / 8.0 * 2f64.powi(-6)
    } else {
        (1.0 + f64::from(mant) / 8.0) * 2f64.powi(i32::from(exp) - 7)
    };
    sign * v
}

impl DenseMatrix {
    pub fn random(elem: cpu::DenseElem, seed: u64) -> DenseMatrix {
        if elem == cpu::DenseElem::Mxfp8 {
            return Self::random_mxfp8(seed);
        }
        let scaled = values(seed, O * K).into_iter().enumerate().map(|(i, v)| v * [1.0, 8.0, 1e-5][i % 3]);
        let mut bits: Vec<u16> = match elem {
            cpu::DenseElem::F16 => scaled.map(|v| f16::from_f32(v).to_bits()).collect(),
            _ => scaled.map(|v| half::bf16::from_f32(v).to_bits()).collect(),
        };
        bits[1] = 0;
        bits[2] = 0x8000;
        let values = match elem {
            cpu::DenseElem::F16 => bits.iter().map(|b| f16::from_bits(*b).to_f32()).collect(),
            _ => bits.iter().map(|b| half::bf16::from_bits(*b).to_f32()).collect(),
        };
        let weight = cpu::repack_dense(&bits, O, K).iter().flat_map(|b| b.to_le_bytes()).collect();
        DenseMatrix { elem, weight, scales: None, values }
    }

    fn random_mxfp8(seed: u64) -> DenseMatrix {
        let groups = K / cpu::MXFP8_GROUP;
        // Every code in row 1; row 0's first group zeros (with scale 0, as MLX writes one).
        let codes: Vec<u8> = values(seed, O * K)
            .iter()
            .enumerate()
            .map(|(i, v)| match i {
                0..32 => 0,
                _ if (K..K + 256).contains(&i) => (i - K) as u8,
                _ => ((v.abs() * 1e4) as u32 % 256) as u8,
            })
            .map(|c| if c & 0x7F == 0x7F { c - 1 } else { c })
            .collect();
        // Most scales near MLX's (2^-10 .. 2^3), some far out (small, and large; the largest scale the kernels take would overflow the f64 check's sums).
        let scales: Vec<u8> = values(seed + 1, O * groups)
            .iter()
            .enumerate()
            .map(|(i, v)| match i % 17 {
                _ if i == 0 => 0,
                0 => cpu::MXFP8_MIN_SCALE,
                1 => 150,
                2 => cpu::MXFP8_MIN_SCALE + 1,
                _ => 117 + ((v.abs() * 1e3) as u32 % 13) as u8,
            })
            .collect();
        let values = (0..O * K)
            .map(|i| (e4m3(codes[i]) * 2f64.powi(i32::from(scales[i / cpu::MXFP8_GROUP]) - 127)) as f32)
            .collect();
        DenseMatrix {
            elem: cpu::DenseElem::Mxfp8,
            weight: cpu::repack_dense(&codes, O, K),
            scales: Some(cpu::repack_groups(&scales, O, groups)),
            values,
        }
    }

    /// The kernel's weight and (mxfp8) scales arguments' element type and shape.
    pub fn args(&self) -> Vec<(ElementType, [usize; 2], &[u8])> {
        let blocks = O / 16;
        match &self.scales {
            None => vec![(ElementType::I16, [blocks, K * 16], &self.weight[..])],
            Some(s) => vec![
                (ElementType::I8, [blocks, K * 16], &self.weight[..]),
                (ElementType::I8, [blocks, K / cpu::MXFP8_GROUP * 16], &s[..]),
            ],
        }
    }
}

/// The dense product's function name for `rows` rows (or ids, for the lookup).
pub fn dense_function_name(op: cpu::Dense, rows: usize) -> String {
    format!("{}_t{rows}", op.export())
}

/// One function per (dense entry point, row count), each one dispatch of it: the products at
/// [`DENSE_ROWS`], the lookup of [`IDS`].
pub fn dense_module(source: &str) -> String {
    let ctx = Context::new();
    let m = Module::new(&ctx);
    let (blocks, f32) = ((O / 16) as i64, ElementType::F32);
    for op in cpu::Dense::ALL {
        let weight = match op.elem {
            cpu::DenseElem::Mxfp8 => vec![
                ElementType::I8.tensor(&[blocks, (K * 16) as i64]),
                ElementType::I8.tensor(&[blocks, (K / cpu::MXFP8_GROUP * 16) as i64]),
            ],
            _ => vec![ElementType::I16.tensor(&[blocks, (K * 16) as i64])],
        };
        let rows: &[usize] = if op.op == cpu::DenseOp::Rows { &[IDS.len()] } else { &DENSE_ROWS };
        for &t in rows {
            let t64 = t as i64;
            let (input, workload, result) = match op.op {
                cpu::DenseOp::Rows => (ElementType::I32.tensor(&[t64]), t64, [t64, K as i64]),
                _ => (f32.tensor(&[t64, K as i64]), blocks, [t64, O as i64]),
            };
            let mut args = vec![input];
            args.extend(weight.iter().cloned());
            if op.op == cpu::DenseOp::MatvecAdd {
                args.push(f32.tensor(&[t64, O as i64]));
            }
            m.func(&dense_function_name(op, t), &args, |f, a| {
                let dims = [t, K, O].map(|d| d as i32);
                Ok(vec![f.dispatch(cpu::EXECUTABLE, &op.export(), workload, &dims, a, f32.tensor(&result))?])
            })
            .unwrap();
        }
    }
    m.append_source(cpu::EXECUTABLE, source).unwrap();
    m.to_text()
}

/// A dense product's result (`hmvr`'s: plus the `residual`): `kernels::cpu::dense_model`'s
/// bits, and within 1e-5 of each row's scale of the product in f64.
pub fn check_dense(what: &str, m: &DenseMatrix, x: &[f32], t: usize, residual: Option<&[f32]>, got: &[f32]) {
    let model = cpu::dense_model(x, t, K, O, &m.values, residual);
    assert_eq!(got.len(), model.len(), "{what} T={t}: output length");
    for (i, (g, want)) in got.iter().zip(&model).enumerate() {
        assert_eq!(g.to_bits(), want.to_bits(), "{what} T={t}: y[{}, {}] = {g}, the model says {want}", i / O, i % O);
    }
    for r in 0..t {
        let exact: Vec<f64> = (0..O)
            .map(|o| {
                let dot: f64 = (0..K).map(|k| f64::from(m.values[o * K + k]) * f64::from(x[r * K + k])).sum();
                dot + residual.map_or(0.0, |res| f64::from(res[r * O + o]))
            })
            .collect();
        let scale = exact.iter().fold(1e-3f64, |a, v| a.max(v.abs()));
        for (o, want) in exact.iter().enumerate() {
            let err = (f64::from(got[r * O + o]) - want).abs() / scale;
            assert!(err < 1e-5, "{what} T={t}: y[{r}, {o}] = {}, exactly {want} (error {err:.1e})", got[r * O + o]);
        }
    }
}

/// The dense lookup's result for `ids`: each row's values, exactly (ids past the end
/// clamped to the last row).
pub fn check_dense_rows(what: &str, m: &DenseMatrix, ids: &[i32], got: &[f32]) {
    assert_eq!(got.len(), ids.len() * K, "{what}: output length");
    for (t, id) in ids.iter().enumerate() {
        let o = usize::try_from(*id).unwrap().min(O - 1);
        let want = &m.values[o * K..][..K];
        let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
        assert_eq!(bits(&got[t * K..][..K]), bits(want), "{what}: id {id}");
    }
}

/// One attention case: the model's heads, the cache, the step's rows.
pub struct AttnCase {
    pub heads: usize,
    pub kv: usize,
    pub hd: usize,
    pub cache: cpu::CacheElem,
    /// [layers, slots, positions] of the cache.
    pub cache_dims: [usize; 3],
    pub layer: usize,
    pub window: usize,
    pub sliding: usize,
    pub positions: &'static [i32],
    pub slots: &'static [i32],
}

/// Rows at position 0 (only their own key), mid-block, past the window (read up to it), a
/// slot past the cache (clamped to the last), sliding windows, a block boundary; one query
/// head per kv head up to the kernel's most (16); head dims of one to four 16-lane chunks;
/// several kv heads per workgroup (`attention_units` 4 for 8 kv heads); f32, f16 and 8-bit
/// caches.
pub const ATTN_CASES: [AttnCase; 10] = [
    AttnCase {
        heads: 8,
        kv: 2,
        hd: 32,
        cache: cpu::CacheElem::F32,
        cache_dims: [2, 3, 40],
        layer: 1,
        window: 36,
        sliding: 0,
        positions: &[0, 5, 33, 39],
        slots: &[2, 0, 1, 7],
    },
    AttnCase {
        heads: 6,
        kv: 3,
        hd: 16,
        cache: cpu::CacheElem::F16,
        cache_dims: [3, 2, 48],
        layer: 2,
        window: 48,
        sliding: 6,
        positions: &[3, 16, 47],
        slots: &[1, 0, 1],
    },
    AttnCase {
        heads: 16,
        kv: 8,
        hd: 64,
        cache: cpu::CacheElem::F16,
        cache_dims: [1, 2, 40],
        layer: 0,
        window: 40,
        sliding: 0,
        positions: &[17, 32],
        slots: &[1, 0],
    },
    AttnCase {
        heads: 16,
        kv: 1,
        hd: 16,
        cache: cpu::CacheElem::F32,
        cache_dims: [1, 1, 64],
        layer: 0,
        window: 64,
        sliding: 20,
        positions: &[63, 1],
        slots: &[0, 0],
    },
    // A decode row, a prompt chunk of 20 rows (its later rows attend to its earlier ones,
    // past a block of 16), a padding row repeating the chunk's last, another decode row.
    AttnCase {
        heads: 8,
        kv: 2,
        hd: 32,
        cache: cpu::CacheElem::F16,
        cache_dims: [2, 3, 64],
        layer: 1,
        window: 64,
        sliding: 0,
        positions: &[10, 30, 31, 32, 33, 34, 35, 36, 37, 38, 39, 40, 41, 42, 43, 44, 45, 46, 47, 48, 49, 49, 5],
        slots: &[2, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1],
    },
    // A chunk from position 3 with a sliding window of 8: its last rows see only rows of
    // the chunk, the first ones the cache too.
    AttnCase {
        heads: 4,
        kv: 4,
        hd: 16,
        cache: cpu::CacheElem::F32,
        cache_dims: [1, 2, 16],
        layer: 0,
        window: 16,
        sliding: 8,
        positions: &[3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14],
        slots: &[1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1],
    },
    // 8-bit: a decode row over a block and a part of the cache in its sliding window of 20,
    // a prompt chunk of 8 rows (its last ones see the cache from 8 on and the chunk's
    // earlier rows), a padding row repeating the chunk's last, a decode row at 5.
    AttnCase {
        heads: 8,
        kv: 2,
        hd: 32,
        cache: cpu::CacheElem::Q8,
        cache_dims: [2, 3, 48],
        layer: 1,
        window: 48,
        sliding: 20,
        positions: &[40, 20, 21, 22, 23, 24, 25, 26, 27, 27, 5],
        slots: &[1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 2],
    },
    // 8-bit, 80-byte rows, 4 kv heads per workgroup: past the window (two blocks and a part
    // read), position 0, a slot past the cache.
    AttnCase {
        heads: 16,
        kv: 8,
        hd: 64,
        cache: cpu::CacheElem::Q8,
        cache_dims: [2, 2, 40],
        layer: 1,
        window: 36,
        sliding: 0,
        positions: &[17, 39, 0, 33],
        slots: &[1, 0, 5, 1],
    },
    // 8-bit with a head dim past ATTN_STAGE_MAX_HD (Gemma's 256): the keys read where they
    // lie, not staged; a chunk of 18 rows after cached positions.
    AttnCase {
        heads: 2,
        kv: 1,
        hd: 256,
        cache: cpu::CacheElem::Q8,
        cache_dims: [1, 2, 40],
        layer: 0,
        window: 40,
        sliding: 0,
        positions: &[3, 20, 21, 22, 23, 24, 25, 26, 27, 28, 29, 30, 31, 32, 33, 34, 35, 36, 37],
        slots: &[0, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1],
    },
    // A prompt chunk of 19 rows after 20 cached positions, then a padding row: with whole
    // rows a workgroup (the tiled entry), tiles of 8, 8 and 4 rows share each cache block,
    // one kv head at a time (8 rows x 4 heads x 64 fill the state).
    AttnCase {
        heads: 16,
        kv: 4,
        hd: 64,
        cache: cpu::CacheElem::F32,
        cache_dims: [1, 2, 48],
        layer: 0,
        window: 48,
        sliding: 0,
        positions: &[20, 21, 22, 23, 24, 25, 26, 27, 28, 29, 30, 31, 32, 33, 34, 35, 36, 37, 38, 38],
        slots: &[1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1],
    },
];

impl AttnCase {
    pub fn entry(&self) -> cpu::Attention {
        cpu::Attention { cache: self.cache, units: cpu::attention_units(self.heads, self.kv, self.hd) }
    }

    /// The entry a prompt chunk takes: whole rows a workgroup, in tiles that share their
    /// cache reads (the same bits per row).
    pub fn tiled_entry(&self) -> cpu::Attention {
        cpu::Attention { cache: self.cache, units: cpu::attention_tile_units(self.kv) }
    }

    /// Both entries, the function name of each.
    pub fn entries(&self, i: usize) -> [(String, cpu::Attention); 2] {
        [(format!("attn_{i}"), self.entry()), (format!("attn_{i}_tiled"), self.tiled_entry())]
    }

    pub fn cache_len(&self) -> usize {
        self.cache_dims.iter().product::<usize>() * self.kv * self.hd
    }

    pub fn scale(&self) -> f32 {
        1.0 / (self.hd as f32).sqrt()
    }

    pub fn constants(&self) -> [usize; 8] {
        let [_, s, p] = self.cache_dims;
        let sliding = self.sliding;
        [self.layer, s, p, self.kv, self.heads / self.kv, self.hd, self.window, sliding]
    }

    /// Values rounded through the cache's element type (an 8-bit cache's rows: whole kv
    /// head rows, so whole blocks).
    pub fn as_cached(&self, v: &[f32]) -> Vec<f32> {
        match self.cache {
            cpu::CacheElem::F16 => v.iter().map(|x| f16::from_f32(*x).to_f32()).collect(),
            cpu::CacheElem::F32 => v.to_vec(),
            cpu::CacheElem::Q8 => cpu::q8_round(v),
        }
    }

    /// The cache's shape in its element type: [L, S, P, K, a kv head's row] (an 8-bit row
    /// is its bytes).
    pub fn cache_shape(&self) -> [usize; 5] {
        let [l, s, p] = self.cache_dims;
        let row = if self.cache == cpu::CacheElem::Q8 { cpu::q8_row_bytes(self.hd) } else { self.hd };
        [l, s, p, self.kv, row]
    }

    /// Cache values as the kernel reads them: f32 or f16 bits, or 8-bit rows, little-endian.
    pub fn cache_bytes(&self, v: &[f32]) -> Vec<u8> {
        match self.cache {
            cpu::CacheElem::F32 => v.iter().flat_map(|x| x.to_le_bytes()).collect(),
            cpu::CacheElem::F16 => v.iter().flat_map(|x| f16::from_f32(*x).to_le_bytes()).collect(),
            cpu::CacheElem::Q8 => cpu::q8_encode(v),
        }
    }

    /// q, k_new, v_new, k_cache, v_cache in f32, the caches' values and the new rows before
    /// the cache's type rounds them ([`AttnCase::cache_bytes`] for the upload, the kernel
    /// itself for the new rows, [`AttnCase::model_inputs`] for the models). For an 8-bit
    /// cache, its blocks and the new rows' at several magnitudes, every seventh all zero:
    /// each block its own scale.
    pub fn inputs(&self, seed: u64) -> [Vec<f32>; 5] {
        let n = self.positions.len();
        let blocks = |v: Vec<f32>| -> Vec<f32> {
            if self.cache != cpu::CacheElem::Q8 {
                return v;
            }
            let at = |i: usize| if i / 16 % 7 == 3 { 0.0 } else { [1.0, 0.05, 0.5, 0.3, 0.002][i / 16 % 5] };
            v.iter().enumerate().map(|(i, x)| x * at(i)).collect()
        };
        // Scores of a few units: the softmax's maxima move from block to block.
        let q = values(seed, n * self.heads * self.hd).iter().map(|x| 3.0 * x).collect();
        let k_new = blocks(values(seed + 1, n * self.kv * self.hd).iter().map(|x| 2.0 * x).collect());
        let v_new = blocks(values(seed + 2, n * self.kv * self.hd));
        let k_cache = blocks(values(seed + 3, self.cache_len()).iter().map(|x| 2.0 * x).collect());
        let v_cache = blocks(values(seed + 4, self.cache_len()));
        [q, k_new, v_new, k_cache, v_cache]
    }

    /// [`AttnCase::inputs`] as the model reads them: the caches' values as their type holds
    /// them, the new rows rounded as the kernel rounds them.
    pub fn model_inputs(&self, [q, k_new, v_new, kc, vc]: &[Vec<f32>; 5]) -> [Vec<f32>; 5] {
        [q.clone(), self.as_cached(k_new), self.as_cached(v_new), self.as_cached(kc), self.as_cached(vc)]
    }

    /// What `kernels::cpu::attention_model` says the kernel gives for `inputs`.
    pub fn model(&self, inputs: &[Vec<f32>; 5]) -> Vec<f32> {
        let [q, k_new, v_new, kc, vc] = self.model_inputs(inputs);
        cpu::attention_model(&q, &k_new, &v_new, &kc, &vc, self.positions, self.slots, self.constants(), self.scale())
    }
}

/// Plain attention in f64 over the same positions: each head's softmax over its visible old
/// keys (in the cache before its sequence's first row in the call, then those rows), and its
/// own.
pub fn attention_f64(case: &AttnCase, [q, k_new, v_new, kc, vc]: &[Vec<f32>; 5]) -> Vec<f64> {
    let [layer, s, p, kv, g, hd, w, sliding] = case.constants();
    let mut out = Vec::new();
    for (r, (&pos, &slot)) in case.positions.iter().zip(case.slots).enumerate() {
        // The sequence's earlier rows in this call: the run of rows just before r with its slot.
        let run = (0..r).rev().take_while(|&j| case.slots[j] == slot).last().unwrap_or(r);
        let earlier: Vec<usize> = (run..r).filter(|&j| case.positions[j] < pos).collect();
        let first = earlier.first().map_or(pos, |&j| case.positions[j]) as usize;
        let slot = (slot as usize).min(s - 1);
        let (pos, hi) = (pos as usize, first.min(w).min(p));
        let lo = if sliding > 0 { (pos + 1).saturating_sub(sliding) } else { 0 };
        for head in 0..kv * g {
            let kh = head / g;
            let qh = &q[(r * kv * g + head) * hd..][..hd];
            let row = |j: usize| ((layer * s + slot) * p + j) * kv + kh;
            let new = |j: usize| (&k_new[(j * kv + kh) * hd..][..hd], &v_new[(j * kv + kh) * hd..][..hd]);
            let keys: Vec<(&[f32], &[f32])> = (lo..hi)
                .map(|j| (&kc[row(j) * hd..][..hd], &vc[row(j) * hd..][..hd]))
                .chain(earlier.iter().filter(|&&j| case.positions[j] as usize >= lo).map(|&j| new(j)))
                .chain([new(r)])
                .collect();
            let scores: Vec<f64> = keys
                .iter()
                .map(|(k, _)| qh.iter().zip(*k).map(|(a, b)| f64::from(*a) * f64::from(*b)).sum::<f64>())
                .map(|d| d * f64::from(case.scale()))
                .collect();
            let top = scores.iter().copied().fold(f64::NEG_INFINITY, f64::max);
            let e: Vec<f64> = scores.iter().map(|x| (x - top).exp()).collect();
            let total: f64 = e.iter().sum();
            for d in 0..hd {
                out.push(keys.iter().zip(&e).map(|((_, v), e)| e * f64::from(v[d])).sum::<f64>() / total);
            }
        }
    }
    out
}

/// One case of the gated delta rule's step (`kernels::cpu::delta_model`, `cpu/delta.h`): n
/// sequences of m rows, H heads of dk keys and dv values, a state of S slots.
pub struct DeltaCase {
    pub n: usize,
    pub m: usize,
    /// The index of each sequence's last real row (clamped to [0, m - 1] by the kernel).
    pub last: i32,
    pub heads: usize,
    pub dk: usize,
    pub dv: usize,
    /// Slots of the state.
    pub slots_in_state: usize,
    /// n x m: each row's position (the kernel reads each sequence's first).
    pub positions: &'static [i32],
    pub slots: &'static [i32],
    /// (sequence, the earlier sequence whose rows it repeats exactly): decode's padding.
    pub repeats: &'static [(usize, usize)],
}

/// A prompt chunk with two padding rows; a fresh prompt (position 0) over a slot holding an
/// old state, beside a sequence that is not; decode with a padding sequence repeating a real
/// one and a sequence at position 0; the real model's heads (128 x 128) at decode; the most
/// key dims (256) with a slot past the state (clamped to the last) and `last` past the rows
/// (clamped: all real); a prompt chunk repeated by a padding sequence. Key dims of 1, 2, 3,
/// 8 and 16 chunks, value dims that do not fill the objects' passes of rows.
pub const DELTA_CASES: [DeltaCase; 6] = [
    DeltaCase {
        n: 1,
        m: 7,
        last: 4,
        heads: 2,
        dk: 32,
        dv: 16,
        slots_in_state: 3,
        positions: &[9, 10, 11, 12, 13, 14, 15],
        slots: &[1],
        repeats: &[],
    },
    DeltaCase {
        n: 2,
        m: 4,
        last: 3,
        heads: 2,
        dk: 48,
        dv: 5,
        slots_in_state: 3,
        positions: &[0, 1, 2, 3, 20, 21, 22, 23],
        slots: &[0, 2],
        repeats: &[],
    },
    DeltaCase {
        n: 4,
        m: 1,
        last: 0,
        heads: 3,
        dk: 16,
        dv: 8,
        slots_in_state: 5,
        positions: &[7, 0, 7, 3],
        slots: &[2, 0, 2, 4],
        repeats: &[(2, 0)],
    },
    DeltaCase {
        n: 2,
        m: 1,
        last: 0,
        heads: 2,
        dk: 128,
        dv: 128,
        slots_in_state: 3,
        positions: &[100, 5],
        slots: &[2, 0],
        repeats: &[],
    },
    DeltaCase {
        n: 1,
        m: 3,
        last: 5,
        heads: 1,
        dk: 256,
        dv: 20,
        slots_in_state: 2,
        positions: &[40, 41, 42],
        slots: &[9],
        repeats: &[],
    },
    DeltaCase {
        n: 3,
        m: 3,
        last: 1,
        heads: 1,
        dk: 16,
        dv: 3,
        slots_in_state: 2,
        positions: &[4, 5, 6, 4, 5, 6, 0, 1, 2],
        slots: &[1, 1, 0],
        repeats: &[(1, 0)],
    },
];

/// A delta case's f32 inputs: q, k `[n * m, H, dk]`, v `[n * m, H, dv]`, g, beta
/// `[n * m, H]` and the state before the step `[S, H * dv * dk]`.
#[derive(Debug, Clone)]
pub struct DeltaInputs {
    pub q: Vec<f32>,
    pub k: Vec<f32>,
    pub v: Vec<f32>,
    pub g: Vec<f32>,
    pub beta: Vec<f32>,
    pub state: Vec<f32>,
}

impl DeltaCase {
    pub fn rows(&self) -> usize {
        self.n * self.m
    }

    /// The kernel's push constants: n, m, H, dk, dv, S.
    pub fn constants(&self) -> [usize; 6] {
        [self.n, self.m, self.heads, self.dk, self.dv, self.slots_in_state]
    }

    pub fn state_len(&self) -> usize {
        self.slots_in_state * self.heads * self.dv * self.dk
    }

    /// The slot a sequence's state lies in, clamped as the kernel clamps it.
    pub fn slot(&self, i: usize) -> usize {
        (self.slots[i] as u32 as usize).min(self.slots_in_state - 1)
    }

    /// Random inputs as the model feeds the step: k of unit length and q of length
    /// 1 / sqrt(dk) per row and head (mlx-lm normalises both, and scales q), v in [-1, 1),
    /// g (the decay) in [0.15, 0.95), beta in [0.05, 0.95), every slot's state in [-1, 1);
    /// then each repeating sequence's rows copied from the one it repeats.
    pub fn inputs(&self, seed: u64) -> DeltaInputs {
        let (r, h, dk, dv) = (self.rows(), self.heads, self.dk, self.dv);
        let unit = |v: Vec<f32>, length: f32| -> Vec<f32> {
            v.chunks(dk)
                .flat_map(|c| {
                    let norm = c.iter().map(|x| x * x).sum::<f32>().sqrt();
                    c.iter().map(move |x| x / norm * length).collect::<Vec<_>>()
                })
                .collect()
        };
        let mut inputs = DeltaInputs {
            q: unit(values(seed, r * h * dk), 1.0 / (dk as f32).sqrt()),
            k: unit(values(seed + 1, r * h * dk), 1.0),
            v: values(seed + 2, r * h * dv),
            g: values(seed + 3, r * h).iter().map(|x| 0.55 + 0.4 * x).collect(),
            beta: values(seed + 4, r * h).iter().map(|x| 0.5 + 0.45 * x).collect(),
            state: values(seed + 5, self.state_len()),
        };
        for &(j, i) in self.repeats {
            let rows = |v: &mut Vec<f32>, width: usize| {
                let per = self.m * h * width;
                v.copy_within(i * per..(i + 1) * per, j * per);
            };
            rows(&mut inputs.q, dk);
            rows(&mut inputs.k, dk);
            rows(&mut inputs.v, dv);
            rows(&mut inputs.g, 1);
            rows(&mut inputs.beta, 1);
            assert_eq!(self.positions[i * self.m..][..self.m], self.positions[j * self.m..][..self.m]);
            assert_eq!(self.slots[i], self.slots[j]);
        }
        inputs
    }

    /// What `kernels::cpu::delta_model` says the kernel gives: y `[n * m, H * dv]` and the
    /// state after the step.
    pub fn model(&self, inputs: &DeltaInputs) -> (Vec<f32>, Vec<f32>) {
        let mut state = inputs.state.clone();
        let DeltaInputs { q, k, v, g, beta, .. } = inputs;
        let y = cpu::delta_model(q, k, v, g, beta, self.positions, self.slots, self.last, &mut state, self.constants());
        (y, state)
    }
}

/// The step in f64, written as the rule reads (mlx-lm's `_gated_delta_step_ops`), each
/// sequence from its slot's state before the call (zeros at position 0) over its real rows:
/// `S = S * g; S += outer(beta * (v - S k), k); y = S q` with S `[dv, dk]`. The state after
/// it is the first sequence's with each slot (a repeat computes the same); padding rows' y
/// is 0. Returns y and the state.
pub fn delta_f64(case: &DeltaCase, inputs: &DeltaInputs) -> (Vec<f64>, Vec<f64>) {
    let (h, dk, dv, m) = (case.heads, case.dk, case.dv, case.m);
    let real = (case.last.max(0) as usize).min(m - 1) + 1;
    let mut y = vec![0f64; case.rows() * h * dv];
    let mut state: Vec<f64> = inputs.state.iter().map(|x| f64::from(*x)).collect();
    let mut written = std::collections::BTreeSet::new();
    for i in 0..case.n {
        let slot = case.slot(i);
        for hh in 0..h {
            let at = (slot * h + hh) * dv * dk;
            let mut s: Vec<f64> = if case.positions[i * m] == 0 {
                vec![0.0; dv * dk]
            } else {
                inputs.state[at..at + dv * dk].iter().map(|x| f64::from(*x)).collect()
            };
            for t in 0..real {
                let r = i * m + t;
                let (gr, br) = (f64::from(inputs.g[r * h + hh]), f64::from(inputs.beta[r * h + hh]));
                let kr: Vec<f64> = inputs.k[(r * h + hh) * dk..][..dk].iter().map(|x| f64::from(*x)).collect();
                let qr: Vec<f64> = inputs.q[(r * h + hh) * dk..][..dk].iter().map(|x| f64::from(*x)).collect();
                s.iter_mut().for_each(|x| *x *= gr);
                for a in 0..dv {
                    let row = &mut s[a * dk..][..dk];
                    let kv: f64 = row.iter().zip(&kr).map(|(x, k)| x * k).sum();
                    let delta = br * (f64::from(inputs.v[(r * h + hh) * dv + a]) - kv);
                    row.iter_mut().zip(&kr).for_each(|(x, k)| *x += k * delta);
                    y[r * h * dv + hh * dv + a] = row.iter().zip(&qr).map(|(x, q)| x * q).sum();
                }
            }
            if !written.contains(&(slot, hh)) {
                state[at..at + dv * dk].copy_from_slice(&s);
            }
        }
        for hh in 0..h {
            written.insert((slot, hh));
        }
    }
    (y, state)
}

/// A kernel's delta step (`y`, and `state` after it): the model's bits, within 1e-5 of the
/// case's largest magnitude of the step in f64 (y and state each), the slots no sequence
/// names untouched, padding rows' y exactly 0.
pub fn check_delta(what: &str, case: &DeltaCase, inputs: &DeltaInputs, y: &[f32], state: &[f32]) {
    let (model_y, model_state) = case.model(inputs);
    let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
    assert_eq!(y.len(), model_y.len(), "{what}: y's length");
    assert_eq!(state.len(), model_state.len(), "{what}: the state's length");
    assert_eq!(bits(y), bits(&model_y), "{what}: y differs from the model's");
    assert_eq!(bits(state), bits(&model_state), "{what}: the state differs from the model's");
    let (exact_y, exact_state) = delta_f64(case, inputs);
    for (name, got, exact) in [("y", y, &exact_y), ("state", state, &exact_state)] {
        let scale = exact.iter().fold(1e-3f64, |a, v| a.max(v.abs()));
        for (at, (g, e)) in got.iter().zip(exact.iter()).enumerate() {
            let err = (f64::from(*g) - e).abs() / scale;
            assert!(err < 1e-5, "{what}: {name}[{at}] = {g}, exactly {e} (error {err:.1e} of {scale:.2})");
        }
    }
    let per_slot = case.heads * case.dv * case.dk;
    for slot in (0..case.slots_in_state).filter(|s| (0..case.n).all(|i| case.slot(i) != *s)) {
        let range = slot * per_slot..(slot + 1) * per_slot;
        assert_eq!(bits(&state[range.clone()]), bits(&inputs.state[range]), "{what}: slot {slot} was touched");
    }
    let real = (case.last.max(0) as usize).min(case.m - 1) + 1;
    let width = case.heads * case.dv;
    for r in (0..case.rows()).filter(|r| r % case.m >= real) {
        assert!(y[r * width..][..width].iter().all(|x| x.to_bits() == 0), "{what}: padding row {r}'s y is not 0");
    }
}
