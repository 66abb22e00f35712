//! Device URIs and the compile target whose code runs on them.

use iree_compiler::Target;

/// The compile target for a device URI (`local-task`, `local-sync`, `cuda`, `cuda://0`, ...),
/// or why that device is not supported. Checked before compiling.
pub fn target_for(device: &str) -> Result<Target, crate::Error> {
    let driver = device.split(':').next().unwrap_or(device);
    match driver {
        "local-task" | "local-sync" => Ok(Target::llvm_cpu_host()),
        // sm_80 PTX runs on newer GPUs too (the driver JIT-compiles it); IREE 3.13's
        // target table has no sm_90 entry.
        "cuda" => Ok(Target::cuda("sm_80")),
        other => Err(crate::Error::UnsupportedDevice(other.to_owned())),
    }
}

/// The precision a device runs when `--precision` is not given, chosen by measurement
/// (`cargo xtask bench`, docs/PERFORMANCE.md). On a CPU with the packed kernels
/// (`kernels::cpu::host_supported`): `packed` for an MLX 4- or 8-bit checkpoint (on the 1B
/// shape 2.81x f16's decode at 4-bit, 1.88x at 8-bit; token-exact with mlx-lm on every
/// quantized fixture and on SmolLM2). Otherwise f16: 1.78x f32 on the 1B shape on CPU; on
/// CUDA (H200) f16 decoded 1.08x f32 and 1.84x packed's graph-level form.
pub fn default_precision(device: &str, model: &std::path::Path) -> models::Precision {
    let kernels = target_for(device).is_ok_and(|t| cpu_kernels_run(&t));
    if kernels && quantized_4_or_8_bit(model) { models::Precision::Packed } else { models::Precision::F16 }
}

/// Whether code for `target` can use the hand-written CPU kernels (`kernels::cpu`): an
/// `llvm-cpu` target, on a host with the kernels' AVX-512 features.
pub fn cpu_kernels_run(target: &Target) -> bool {
    matches!(target, Target::LlvmCpu { .. }) && kernels::cpu::host_supported()
}

/// Whether `model/config.json` declares MLX 4- or 8-bit quantization.
fn quantized_4_or_8_bit(model: &std::path::Path) -> bool {
    let Ok(text) = std::fs::read_to_string(model.join("config.json")) else { return false };
    let Ok(config) = serde_json::from_str::<serde_json::Value>(&text) else { return false };
    matches!(config["quantization"]["bits"].as_u64(), Some(4 | 8))
}

#[cfg(test)]
mod tests {
    use super::*;
    use models::Precision;
    use std::path::Path;

    #[test]
    fn defaults_follow_the_checkpoint_and_the_device() {
        let fixtures = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures/qwen2");
        let packed = if kernels::cpu::host_supported() { Precision::Packed } else { Precision::F16 };
        assert_eq!(default_precision("local-task", &fixtures.join("q4")), packed);
        assert_eq!(default_precision("local-sync", &fixtures.join("q8")), packed);
        assert_eq!(default_precision("local-task", &fixtures.join("f32")), Precision::F16);
        assert_eq!(default_precision("cuda", &fixtures.join("q4")), Precision::F16);
        assert_eq!(default_precision("local-task", Path::new("/nonexistent")), Precision::F16);
    }
}
