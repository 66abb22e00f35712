//! The hand-written CPU kernels (`kernels::cpu`) run by IREE on local-task, once per
//! instruction set this host runs: `qmv` equals a plain-Rust model of its arithmetic bit for
//! bit (so every object equals every other) at row counts that take every path of the
//! kernels (one row, partial chunks and panels, several panels), and is close to the f64
//! product with the dequantized matrix; `qrows` gives the dequantized rows.

#![allow(clippy::unwrap_used)] // a test that cannot unwrap has failed; helpers included

use e2e::*;
use half::f16;
use hlo_emit::{Context, ElementType, Module};
use iree_hal::{Instance, Session};
use kernels::cpu::{self, Entry, Isa, Op, Scale};
use std::path::Path;

/// Output rows (6 blocks of 16: a full workgroup of 4 and a partial one) and input width.
const O: usize = 96;
const K: usize = 256;
/// Rows of x: one; 3 (chunks of 2 and 1); 8 (one panel; AMX tiles); 13 (a panel, then 5
/// rows: chunks of 4 and 1, or the AMX object's tiles again).
const ROWS: [usize; 4] = [1, 3, 8, 13];
const IDS: [i32; 5] = [0, 95, 17, 17, 1000]; // 1000 is clamped to the last row

fn entries() -> Vec<Entry> {
    let mut all = Vec::new();
    for op in [Op::Matvec, Op::Rows] {
        for bits in [4, 8] {
            for scale in [Scale::F16, Scale::F32] {
                all.push(Entry { op, bits, scale });
            }
        }
    }
    all
}

/// MLX's usual group sizes (64 and 32) and the extremes the kernels take: 128 (the AMX object
/// splits it in two chunks) and 16 (half of the 32 values its quantization takes at once).
fn group_size(bits: u32, scale: Scale) -> usize {
    match (bits, scale) {
        (4, Scale::F16) => 64,
        (4, Scale::F32) => 128,
        (_, Scale::F16) => 32,
        (_, Scale::F32) => 16,
    }
}

fn function_name(e: &Entry, rows: usize) -> String {
    format!("{}_t{rows}", cpu::export(e.op, e.bits, e.scale))
}

fn scale_elem(scale: Scale) -> ElementType {
    if scale == Scale::F16 { ElementType::F16 } else { ElementType::F32 }
}

/// One function per (entry, row count), each one dispatch of that entry point of `object`.
fn module(object: &Path) -> String {
    let ctx = Context::new();
    let m = Module::new(&ctx);
    for e in entries() {
        let gs = group_size(e.bits, e.scale);
        let (blocks, block_bytes, groups) = (O / 16, K * e.bits as usize * 16 / 8, K / gs);
        let row_counts: &[usize] = if e.op == Op::Matvec { &ROWS } else { &[IDS.len()] };
        for &t in row_counts {
            let (input, workload, result) = match e.op {
                Op::Matvec => (ElementType::F32.tensor(&[t as i64, K as i64]), blocks, [t, O]),
                Op::Rows => (ElementType::I32.tensor(&[t as i64]), t, [t, K]),
            };
            let s = scale_elem(e.scale).tensor(&[blocks as i64, (groups * 16) as i64]);
            let args = [input, ElementType::I8.tensor(&[blocks as i64, block_bytes as i64]), s.clone(), s];
            m.func(&function_name(&e, t), &args, |f, a| {
                let dims = [t, K, O, gs].map(|d| d as i32);
                let export = cpu::export(e.op, e.bits, e.scale);
                let result = ElementType::F32.tensor(&result.map(|d| d as i64));
                Ok(vec![f.dispatch(cpu::EXECUTABLE, &export, workload as i64, &dims, a, result)?])
            })
            .unwrap();
        }
    }
    m.append_source(cpu::EXECUTABLE, &cpu::executable_source(object, &entries())).unwrap();
    m.to_text()
}

/// A random matrix in MLX's form: packed values `q[O][K]` (every value 0..2^bits, so the
/// top bit is exercised), per-group scales and biases `[O][G]` (already rounded to f16 where
/// the kernel reads f16).
struct Matrix {
    bits: u32,
    group_size: usize,
    q: Vec<u8>,
    scales: Vec<f32>,
    biases: Vec<f32>,
}

impl Matrix {
    fn random(bits: u32, scale: Scale, seed: u64) -> Matrix {
        let group_size = group_size(bits, scale);
        let groups = K / group_size;
        let round = |v: f32| if scale == Scale::F16 { f16::from_f32(v).to_f32() } else { v };
        let levels = 1u32 << bits;
        let q = values(seed, O * K).iter().map(|v| (((v + 1.0) * 0.5 * levels as f32) as u32 % levels) as u8).collect();
        let scales = values(seed + 1, O * groups).iter().map(|v| round(0.01 + 0.02 * v.abs())).collect();
        let biases = values(seed + 2, O * groups).iter().map(|v| round(-0.1 * v.abs())).collect();
        Matrix { bits, group_size, q, scales, biases }
    }

    /// MLX's packed words: value k of a row at bits `bits * (k % (32 / bits))` of word
    /// `k / (32 / bits)`, as little-endian bytes.
    fn mlx_bytes(&self) -> Vec<u8> {
        match self.bits {
            8 => self.q.clone(),
            _ => self.q.chunks(2).map(|p| p[0] | (p[1] << 4)).collect(),
        }
    }

    fn upload(&self, device: &iree_hal::Device, scale: Scale) -> [iree_hal::BufferView; 3] {
        let groups = K / self.group_size;
        let blocks = O / 16;
        let w = cpu::repack_weight(self.bits, O, K, &self.mlx_bytes());
        let w = device.upload_bytes(iree_hal::ElementType::I8, &[blocks, w.len() / blocks], &w).unwrap();
        let per_group = |v: &[f32]| {
            let v = cpu::repack_groups(v, O, groups);
            let shape = [blocks, groups * 16];
            match scale {
                Scale::F16 => device.upload(&shape, &v.iter().map(|x| f16::from_f32(*x)).collect::<Vec<_>>()),
                Scale::F32 => device.upload(&shape, &v),
            }
            .unwrap()
        };
        [w, per_group(&self.scales), per_group(&self.biases)]
    }
}

/// The kernels' arithmetic, operation for operation: each group of a row of x quantized to
/// i16 against its largest magnitude (its f32 sum taken in 16 lanes, then halved as
/// `_mm512_reduce_add_ps` does), exact integer dot products, then per group
/// `acc = fma(scale, dot * x_scale, acc); acc = fma(bias, x_sum, acc)`.
fn model_qmv(m: &Matrix, x: &[f32], t: usize) -> Vec<f32> {
    let gs = m.group_size;
    let groups = K / gs;
    let mut y = vec![0f32; t * O];
    for row in 0..t {
        let quantized: Vec<(Vec<i32>, f32, f32)> = (0..groups)
            .map(|g| {
                let xg = &x[row * K + g * gs..][..gs];
                let mut lanes = [0f32; 16];
                for (i, v) in xg.iter().enumerate() {
                    lanes[i % 16] += v;
                }
                let l8: Vec<f32> = (0..8).map(|j| lanes[j + 8] + lanes[j]).collect();
                let l4: Vec<f32> = (0..4).map(|j| l8[j + 4] + l8[j]).collect();
                let sum = (l4[0] + l4[2]) + (l4[1] + l4[3]);
                let amax = xg.iter().fold(0f32, |a, v| a.max(v.abs()));
                let inv = if amax > 0.0 { 32767.0 / amax } else { 0.0 };
                (xg.iter().map(|v| (v * inv).round_ties_even() as i32).collect(), amax / 32767.0, sum)
            })
            .collect();
        for o in 0..O {
            let mut acc = 0f32;
            for (g, (xq, dx, sum)) in quantized.iter().enumerate() {
                let dot: i32 = xq.iter().enumerate().map(|(i, v)| i32::from(m.q[o * K + g * gs + i]) * v).sum();
                acc = m.scales[o * groups + g].mul_add(dot as f32 * dx, acc);
                acc = m.biases[o * groups + g].mul_add(*sum, acc);
            }
            y[row * O + o] = acc;
        }
    }
    y
}

/// `x · Wᵀ` with the dequantized matrix, in f64.
fn exact_qmv(m: &Matrix, x: &[f32], t: usize) -> Vec<f64> {
    let gs = m.group_size;
    let w = |o: usize, k: usize| {
        let g = o * (K / gs) + k / gs;
        f64::from(m.scales[g]) * f64::from(m.q[o * K + k]) + f64::from(m.biases[g])
    };
    (0..t).flat_map(|r| (0..O).map(move |o| (0..K).map(|k| w(o, k) * f64::from(x[r * K + k])).sum::<f64>())).collect()
}

/// Rows of x of several magnitudes, one group of them all zero.
fn input(t: usize, seed: u64) -> Vec<f32> {
    let mut x: Vec<f32> =
        values(seed, t * K).iter().enumerate().map(|(i, v)| v * [1.0, 30.0, 0.01][i / K % 3]).collect();
    x[..32].fill(0.0);
    x
}

/// Every entry point's results per instruction set, checked against the models above.
fn run(isa: Isa) -> Vec<Vec<f32>> {
    let dir = tempfile::tempdir().unwrap();
    let object = cpu::install(dir.path(), isa).unwrap().unwrap();
    let vmfb = compile_cpu(&module(&object));
    let instance = Instance::new().unwrap();
    let device = instance.device("local-task").unwrap();
    let mut session = Session::new(&instance, &device).unwrap();
    session.load_vmfb(&vmfb).unwrap();
    let mut outputs = Vec::new();
    for (i, e) in entries().into_iter().enumerate() {
        let m = Matrix::random(e.bits, e.scale, 10 * i as u64);
        let [w, s, b] = m.upload(&device, e.scale);
        let what = format!("{isa} {}", cpu::export(e.op, e.bits, e.scale));
        if e.op == Op::Rows {
            let ids = device.upload(&[IDS.len()], &IDS).unwrap();
            let got: Vec<f32> =
                session.call(&function_name(&e, IDS.len()), &[&ids, &w, &s, &b]).unwrap()[0].to_vec().unwrap();
            let gs = m.group_size;
            for (t, id) in IDS.iter().enumerate() {
                let o = (*id as usize).min(O - 1);
                for k in 0..K {
                    let g = o * (K / gs) + k / gs;
                    let want = m.scales[g] * f32::from(m.q[o * K + k]) + m.biases[g];
                    let got = got[t * K + k];
                    assert!((got - want).abs() <= 1e-6 * want.abs().max(1.0), "{what}: id {id} k {k}: {got} vs {want}");
                }
            }
            outputs.push(got);
            continue;
        }
        for t in ROWS {
            let x = input(t, 100 + t as u64);
            let xs = device.upload(&[t, K], &x).unwrap();
            let got: Vec<f32> = session.call(&function_name(&e, t), &[&xs, &w, &s, &b]).unwrap()[0].to_vec().unwrap();
            let model = model_qmv(&m, &x, t);
            for (i, (g, want)) in got.iter().zip(&model).enumerate() {
                assert_eq!(
                    g.to_bits(),
                    want.to_bits(),
                    "{what} T={t}: y[{}, {}] = {g}, the model says {want}",
                    i / O,
                    i % O
                );
            }
            // The model itself: i16 quantization of x costs at most a few 1e-5 of the
            // row's scale.
            for (r, row) in exact_qmv(&m, &x, t).chunks(O).enumerate() {
                let scale = row.iter().fold(1e-3f64, |a, v| a.max(v.abs()));
                for (o, want) in row.iter().enumerate() {
                    let err = (f64::from(got[r * O + o]) - want).abs() / scale;
                    assert!(
                        err < 1e-4,
                        "{what} T={t}: y[{r}, {o}] = {}, exactly {want} (error {err:.1e})",
                        got[r * O + o]
                    );
                }
            }
            outputs.push(got);
        }
    }
    outputs
}

#[test]
fn every_kernel_object_computes_the_same_bits() {
    let runs: Vec<(Isa, Vec<Vec<f32>>)> = cpu::host_isas().map(|isa| (isa, run(isa))).collect();
    // Bit equality with the model already implies it; said once more for the reader.
    for pair in runs.windows(2) {
        let bits = |v: &Vec<Vec<f32>>| v.iter().flatten().map(|x| x.to_bits()).collect::<Vec<_>>();
        assert_eq!(bits(&pair[0].1), bits(&pair[1].1), "{} and {} differ", pair[0].0, pair[1].0);
    }
}
