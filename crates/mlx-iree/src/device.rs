//! Device URIs and the compile target whose code runs on them.

use iree_compiler::Target;

/// The compile target for a device URI (`local-task`, `local-sync`, `cuda`, `cuda://0`, ...),
/// or a one-line reason why that device is not supported. Checked before compiling.
pub fn target_for(device: &str) -> Result<Target, String> {
    let driver = device.split(':').next().unwrap_or(device);
    match driver {
        "local-task" | "local-sync" => Ok(Target::llvm_cpu_host()),
        // sm_80 PTX runs on newer GPUs too (the driver JIT-compiles it); IREE 3.13's
        // target table has no sm_90 entry.
        "cuda" => Ok(Target::cuda("sm_80")),
        other => Err(format!("unsupported device `{other}` (expected local-task, local-sync or cuda)")),
    }
}

/// The precision a device runs when `--precision` is not given, chosen by measurement
/// (`cargo xtask bench`, docs/PERFORMANCE.md): on CPU, f16 weights with the data-tiled
/// decode module ran 1.92x f32 on the 1B shape and 1.30x on SmolLM2, token-exact with f32
/// on SmolLM2 and passing the gate on every fixture. CUDA has no measurement yet; f16 is
/// the precision GPUs are built for.
pub fn default_precision(_device: &str) -> models::Precision {
    models::Precision::F16
}
