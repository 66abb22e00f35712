//! `mlx-iree demo`: the whole stack on one small graph (hlo-emit -> IREE compiler -> IREE
//! runtime), checked against a plain Rust computation of the same math.

use anyhow::{Context, Result, bail};
use hlo_emit::{DotDims, ElementType::F32};
use iree_compiler::{CompileCache, CompileOptions, Compiler, Target};
use iree_hal::{Instance, Session};
use std::time::Instant;

/// Model-like sizes: SmolLM2's hidden size, a slice of a vocabulary.
const HIDDEN: usize = 576;
const VOCAB: usize = 1024;
const EPS: f64 = 1e-5;
/// f32 on the device against f64 in Rust, over a 576-long dot product.
const TOLERANCE: f32 = 1e-5;

#[derive(clap::Args, Debug)]
pub struct Args {
    /// IREE device URI: local-task, local-sync, cuda, vulkan, or metal on macOS.
    #[arg(long, default_value = "local-task")]
    device: String,
    /// The compile cache folder. Default: $MLX_IREE_CACHE_DIR, else
    /// $XDG_CACHE_HOME/mlx-iree or ~/.cache/mlx-iree.
    #[arg(long, value_name = "DIR")]
    cache_dir: Option<std::path::PathBuf>,
}

fn graph() -> Result<String> {
    let ctx = hlo_emit::Context::new();
    let m = hlo_emit::Module::new(&ctx);
    let (h, v) = (HIDDEN as i64, VOCAB as i64);
    m.func("head", &[F32.tensor(&[h]), F32.tensor(&[h]), F32.tensor(&[v, h])], |f, a| {
        let normed = f.rms_norm(a[0], a[1], EPS)?;
        let probs = f.softmax(f.dot_general(a[2], normed, DotDims::matmul())?)?;
        Ok(vec![probs, f.argmax(probs, 0)?])
    })?;
    Ok(m.to_text())
}

/// Deterministic inputs in [-1, 1) without a random-number dependency.
fn inputs(seed: u32, n: usize) -> Vec<f32> {
    (0..n)
        .map(|i| ((i as u32).wrapping_mul(2654435761).wrapping_add(seed) >> 8) as f32 / (1u32 << 23) as f32 - 1.0)
        .collect()
}

fn reference(x: &[f32], gamma: &[f32], w: &[f32]) -> Vec<f32> {
    let inv = 1.0 / (x.iter().map(|v| f64::from(*v).powi(2)).sum::<f64>() / x.len() as f64 + EPS).sqrt();
    let normed: Vec<f64> = x.iter().zip(gamma).map(|(a, g)| f64::from(*a) * inv * f64::from(*g)).collect();
    let logits: Vec<f64> =
        w.chunks(x.len()).map(|row| row.iter().zip(&normed).map(|(a, b)| f64::from(*a) * b).sum()).collect();
    let max = logits.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    let sum: f64 = logits.iter().map(|l| (l - max).exp()).sum();
    logits.iter().map(|l| ((l - max).exp() / sum) as f32).collect()
}

/// The demo graph compiled for `target` through the compile cache in `cache_dir`, loading the
/// compiler only on a miss.
fn compile(mlir: &str, target: &Target, cache_dir: &std::path::Path) -> Result<Vec<u8>> {
    let cache = CompileCache::new(cache_dir)?;
    let options = CompileOptions::default();
    if let Some(hit) = cache.lookup(mlir, target, &options)? {
        eprintln!("demo graph: compile cache hit");
        return Ok(hit.vmfb);
    }
    let compiler = Compiler::new()?;
    let started = Instant::now();
    let out = cache.compile(&compiler, mlir, target, &options)?;
    cache.remember(&compiler)?;
    eprintln!("demo graph: compiled in {:.1} s", started.elapsed().as_secs_f64());
    Ok(out.vmfb)
}

/// IREE's target for the engine's: the demo compiles through `iree-compiler` itself.
fn iree_target(target: &engine::CompileTarget) -> Target {
    match target {
        engine::CompileTarget::HostCpu => Target::llvm_cpu_host(),
        engine::CompileTarget::Cuda(arch) => Target::cuda(arch),
        engine::CompileTarget::Vulkan => Target::vulkan(iree_compiler::VULKAN_GENERIC),
        engine::CompileTarget::Metal => Target::Metal,
        engine::CompileTarget::Rocm(arch) => Target::rocm(arch),
    }
}

pub fn run(args: &Args) -> Result<()> {
    let target = iree_target(&engine::CompileTarget::for_device(&args.device).context("demo")?);
    println!("graph: softmax(W · rmsnorm(x)), x [{HIDDEN}], W [{VOCAB}, {HIDDEN}], built with hlo-emit");
    let vmfb = compile(&graph()?, &target, &crate::settings::cache_dir(args.cache_dir.as_deref()))?;

    let instance = Instance::new()?;
    let device = instance.device(&args.device).with_context(|| format!("opening device `{}`", args.device))?;
    let mut session = Session::new(&instance, &device)?;
    session.load_vmfb(&vmfb)?;
    let (x, gamma, w) = (inputs(1, HIDDEN), inputs(2, HIDDEN), inputs(3, VOCAB * HIDDEN));
    let bufs = [device.upload(&[HIDDEN], &x)?, device.upload(&[HIDDEN], &gamma)?, device.upload(&[VOCAB, HIDDEN], &w)?];
    let started = Instant::now();
    let out = session.call("head", &[&bufs[0], &bufs[1], &bufs[2]])?;
    let elapsed = started.elapsed();
    let probs: Vec<f32> = out[0].to_vec()?;
    let argmax: Vec<i32> = out[1].to_vec()?;

    let expected = reference(&x, &gamma, &w);
    let diff = probs.iter().zip(&expected).map(|(a, b)| (a - b).abs()).fold(0.0f32, f32::max);
    let mut top: Vec<(usize, f32)> = probs.iter().copied().enumerate().collect();
    top.sort_by(|a, b| b.1.total_cmp(&a.1));
    println!("ran on {} in {:.2} ms", args.device, elapsed.as_secs_f64() * 1e3);
    println!("argmax: {}", argmax[0]);
    let shown: Vec<String> = top.iter().take(5).map(|(i, p)| format!("{i}: {p:.5}")).collect();
    println!("top-5 probabilities: {}", shown.join(", "));
    println!("max |device - Rust reference| = {diff:.2e} (tolerance {TOLERANCE:.0e})");
    if diff > TOLERANCE || argmax[0] as usize != top[0].0 {
        bail!("demo: device result differs from the Rust reference by {diff:.2e}");
    }
    println!("ok: the device result matches the Rust reference");
    Ok(())
}
