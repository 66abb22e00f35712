//! What the engine's integration tests share: the repository root and the fixture families.

#![allow(clippy::unwrap_used, dead_code)] // test helpers; not every test binary uses each

use engine::{Backend, CompileTarget, EngineConfig, GraphModule, KernelSetting, Plan, Precision};
use models::ModelConfig;
use std::path::{Path, PathBuf};

pub fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// Every fixture family (a folder under tests/fixtures), sorted.
pub fn families() -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(root().join("tests/fixtures"))
        .unwrap()
        .flatten()
        .filter(|e| e.path().is_dir())
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    names
}

/// The compile cache the suite's compile-level tests share (kernel objects installed there).
pub fn compile_cache() -> PathBuf {
    root().join("target/test-compile-cache")
}

/// What the engine plans for fixture `family`'s `variant` at `precision` on `target` with
/// `kernels` and a KV cache of element type `kv`: its backend and the modules of a plan of
/// `slots` slots x 64 positions.
pub fn planned(
    family: &str,
    variant: &str,
    precision: Precision,
    target: &CompileTarget,
    kernels: KernelSetting,
    slots: usize,
    kv: engine::KvElem,
) -> (Backend, Vec<GraphModule>) {
    let dir = root().join("tests/fixtures").join(family).join(variant);
    let mut ckpt = weights::Checkpoint::open(&dir).unwrap();
    let cfg = ModelConfig::for_checkpoint(&mut ckpt).unwrap();
    let backend = Backend::new(target.clone(), kernels, &compile_cache()).unwrap();
    let layout = backend.layout(&cfg, precision, &ckpt).unwrap();
    // The device sets the plan's call cost, which picks among its functions, not them, and
    // whether the copies between slots are planned (the CPU's only): the same for every GPU.
    let device = if target.is_cpu() { "local-task" } else { "cuda" };
    let config = EngineConfig {
        max_batch: slots,
        max_context: Some(64),
        kv_elem: kv,
        ..EngineConfig::new(device, precision, "/nonexistent")
    };
    let plan = Plan::new(&cfg, &config).unwrap().for_layout(&cfg, &layout);
    let modules = backend.graph_modules(&cfg, &layout, &plan).unwrap();
    (backend, modules)
}
