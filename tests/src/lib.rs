//! Shared helpers for the end-to-end tests: the graphs under test (built with
//! hlo-emit), their plain-Rust references, and one compile-and-run path on CPU.

use hlo_emit::{Context, DotDims, ElementType::*, Error as HloError, Module, ScatterDims};
use iree_compiler::{CompileCache, CompileOptions, Compiler, Target};
use std::path::PathBuf;
use std::sync::OnceLock;

pub const EPS: f64 = 1e-5;

/// `softmax(W · rmsnorm(x) )` plus its argmax: x `[d]`, gamma `[d]`, W `[o, d]`.
pub fn rms_matmul_softmax(d: i64, o: i64) -> Result<String, HloError> {
    let ctx = Context::new();
    let m = Module::new(&ctx);
    m.func("block", &[F32.tensor(&[d]), F32.tensor(&[d]), F32.tensor(&[o, d])], |f, a| {
        let normed = f.rms_norm(a[0], a[1], EPS)?;
        let logits = f.dot_general(a[2], normed, DotDims::matmul())?;
        let probs = f.softmax(logits)?;
        Ok(vec![probs, f.argmax(probs, 0)?])
    })?;
    Ok(m.to_text())
}

/// Embedding lookup: rows of table `[v, d]` picked by `n` i32 ids.
pub fn embedding(v: i64, d: i64, n: i64) -> Result<String, HloError> {
    let ctx = Context::new();
    let m = Module::new(&ctx);
    m.func("embed", &[F32.tensor(&[v, d]), I32.tensor(&[n])], |f, a| Ok(vec![f.gather_rows(a[0], a[1])?]))?;
    Ok(m.to_text())
}

/// Argmax over the last dim of `[rows, cols]`.
pub fn argmax(rows: i64, cols: i64) -> Result<String, HloError> {
    let ctx = Context::new();
    let m = Module::new(&ctx);
    m.func("argmax", &[F32.tensor(&[rows, cols])], |f, a| Ok(vec![f.argmax(a[0], 1)?]))?;
    Ok(m.to_text())
}

/// `W · x + b` with W `[o, i]` and b `[o]` as globals bound to the parameters
/// `"model"::"proj.weight"` and `"model"::"proj.bias"`.
pub fn param_affine(o: i64, i: i64) -> Result<String, HloError> {
    let ctx = Context::new();
    let m = Module::new(&ctx);
    let w = m.global_param("w", "model", "proj.weight", &F32.tensor(&[o, i]))?;
    let b = m.global_param("b", "model", "proj.bias", &F32.tensor(&[o]))?;
    m.func("affine", &[F32.tensor(&[i])], |f, a| {
        let wx = f.dot_general(f.load(&w)?, a[0], DotDims::matmul())?;
        Ok(vec![f.add(wx, f.load(&b)?)?])
    })?;
    Ok(m.to_text())
}

/// Layouts of the KV cache `[layers, slots, _, _, head_dim]` that [`kv_scatter`] writes:
/// which of dims 2 and 3 holds the positions (the other holds the kv heads).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum KvLayout {
    /// `[l, s, p, h, d]`: the scattered dims (layer, slot, position) lead. IREE 3.13 compiles this.
    PositionsFirst,
    /// `[l, s, h, p, d]`: IREE 3.13 cannot compile this scatter (see the cpu tests).
    HeadsFirst,
}

impl KvLayout {
    /// The cache dim that holds the positions.
    pub fn pos_dim(self) -> usize {
        match self {
            KvLayout::PositionsFirst => 2,
            KvLayout::HeadsFirst => 3,
        }
    }

    /// The cache dim that holds the kv heads.
    pub fn head_dim(self) -> usize {
        5 - self.pos_dim()
    }
}

/// KV-cache write: `cache` of `shape` (in `layout`) gets `updates` `[b, h, d]` at the
/// `(layer, slot, position)` rows of `idx` `[b, 3]`, every head at once.
pub fn kv_scatter(shape: [i64; 5], layout: KvLayout, b: i64) -> Result<String, HloError> {
    let (h, d) = (shape[layout.head_dim()], shape[4]);
    let scattered = vec![0, 1, layout.pos_dim() as i64];
    let ctx = Context::new();
    let m = Module::new(&ctx);
    m.func("kv_write", &[F32.tensor(&shape), I32.tensor(&[b, 3]), F32.tensor(&[b, h, d])], |f, a| {
        let dims = ScatterDims {
            update_window_dims: vec![1, 2],
            inserted_window_dims: scattered.clone(),
            scatter_dims_to_operand_dims: scattered,
            index_vector_dim: 1,
            ..ScatterDims::default()
        };
        Ok(vec![f.scatter(a[0], a[1], a[2], dims)?])
    })?;
    Ok(m.to_text())
}

/// Every graph above, by name, for the portability tests.
pub fn all_graphs() -> Result<Vec<(&'static str, String)>, HloError> {
    Ok(vec![
        ("rms_matmul_softmax", rms_matmul_softmax(64, 32)?),
        ("embedding", embedding(100, 16, 5)?),
        ("argmax", argmax(3, 10)?),
        ("param_affine", param_affine(8, 16)?),
        ("kv_scatter", kv_scatter([2, 3, 5, 4, 6], KvLayout::PositionsFirst, 2)?),
    ])
}

pub fn ref_rms_matmul_softmax(x: &[f32], gamma: &[f32], w: &[f32]) -> Vec<f32> {
    let d = x.len();
    let ms = x.iter().map(|v| (*v as f64).powi(2)).sum::<f64>() / d as f64;
    let inv = 1.0 / (ms + EPS).sqrt();
    let normed: Vec<f64> = x.iter().zip(gamma).map(|(a, g)| *a as f64 * inv * *g as f64).collect();
    let logits: Vec<f64> = w.chunks(d).map(|row| row.iter().zip(&normed).map(|(a, b)| *a as f64 * b).sum()).collect();
    let max = logits.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
    let exps: Vec<f64> = logits.iter().map(|l| (l - max).exp()).collect();
    let sum: f64 = exps.iter().sum();
    exps.iter().map(|e| (e / sum) as f32).collect()
}

/// [`kv_scatter`] in plain Rust: a copy of `cache` with `updates[k]` (`[h, d]`) written
/// at layer, slot, position `idx[k]`, for every head.
pub fn ref_kv_scatter(
    cache: &[f32],
    shape: [usize; 5],
    layout: KvLayout,
    idx: &[[i32; 3]],
    updates: &[f32],
) -> Vec<f32> {
    let (h, d) = (shape[layout.head_dim()], shape[4]);
    let mut out = cache.to_vec();
    for (k, &[l, slot, pos]) in idx.iter().enumerate() {
        for head in 0..h {
            let mut at = [l as usize, slot as usize, 0, 0, 0];
            at[layout.pos_dim()] = pos as usize;
            at[layout.head_dim()] = head;
            let dst = at.iter().zip(&shape).fold(0, |acc, (i, n)| acc * n + i);
            let src = (k * h + head) * d;
            out[dst..dst + d].copy_from_slice(&updates[src..src + d]);
        }
    }
    out
}

/// Index of the first maximum (ties go to the lowest index).
pub fn ref_argmax(row: &[f32]) -> i32 {
    let mut best = 0;
    for (i, v) in row.iter().enumerate() {
        if *v > row[best] {
            best = i;
        }
    }
    best as i32
}

/// Deterministic pseudo-random values in [-1, 1) (a 64-bit LCG), so inputs are
/// reproducible without a dependency.
pub fn values(seed: u64, n: usize) -> Vec<f32> {
    let mut s = seed.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
    (0..n)
        .map(|_| {
            s = s.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            ((s >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
        })
        .collect()
}

/// Largest absolute difference between two slices of equal length.
pub fn max_abs_diff(a: &[f32], b: &[f32]) -> f32 {
    assert_eq!(a.len(), b.len(), "length mismatch");
    a.iter().zip(b).map(|(x, y)| (x - y).abs()).fold(0.0, f32::max)
}

pub fn compiler() -> &'static Compiler {
    static COMPILER: OnceLock<Compiler> = OnceLock::new();
    COMPILER.get_or_init(|| match Compiler::new() {
        Ok(c) => c,
        Err(e) => panic!("IREE compiler unavailable (run `cargo xtask setup`): {e}"),
    })
}

/// A compile cache under `target/`, shared by the test runs so reruns are file reads.
pub fn cache() -> CompileCache {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../target/e2e-compile-cache");
    CompileCache::new(dir).expect("creating the e2e compile cache")
}

/// Compiles for the host CPU through the cache.
pub fn compile_cpu(mlir: &str) -> Vec<u8> {
    cache()
        .compile(compiler(), mlir, &Target::llvm_cpu_host(), &CompileOptions::default())
        .unwrap_or_else(|e| panic!("compiling for llvm-cpu failed: {e}"))
        .vmfb
}
