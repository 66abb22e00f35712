//! Device URIs, the kernel setting, and the precision a device runs by default.

use crate::backend::CompileTarget;

/// The URI the runtime opens for `device`: as given, except that a Vulkan device gets
/// `cached_bda_replay_instances=0` unless the URI sets it. IREE 3.13's Vulkan driver replays
/// a recorded command buffer for a later call of the same function, and on lavapipe the
/// replays computed other numbers than the first call with the same inputs (a qwen2
/// fixture's second prompt went wrong at its first token; every call right with replays
/// off, docs/ARCHITECTURE.md).
pub fn runtime_uri(device: &str) -> String {
    const REPLAYS_OFF: &str = "cached_bda_replay_instances=0";
    if driver(device) != "vulkan" || device.contains("cached_bda_replay_instances") {
        return device.to_owned();
    }
    let rest = &device["vulkan".len()..];
    let rest = rest.strip_prefix("://").unwrap_or(rest);
    if rest.contains('?') { format!("vulkan://{rest}&{REPLAYS_OFF}") } else { format!("vulkan://{rest}?{REPLAYS_OFF}") }
}

/// The HAL driver a device URI names (IREE's URI schema: what comes before the first `:`).
pub(crate) fn driver(device: &str) -> &str {
    device.split(':').next().unwrap_or(device)
}

/// Which hand-written kernels the graphs link: on an `llvm-cpu` target the CPU kernels
/// (`kernels::cpu`: packed and f16/bf16 matrices, attention) of an instruction set, on `cuda`
/// the CUDA kernel (`kernels::cuda`), or none. The binary maps `--kernels` /
/// `MLX_IREE_KERNELS` (`0`, an instruction set's name, `auto`) onto it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum KernelSetting {
    /// The fastest instruction set the host runs (`kernels::cpu::host_isa`); the graph form
    /// where none does.
    #[default]
    Auto,
    /// The graph form (for comparisons and tests), also on `cuda`, whose packed matrices
    /// otherwise go through the CUDA kernel (`kernels::cuda`).
    Off,
    /// This instruction set's kernels (to compare them on a host that has several);
    /// `Error::KernelIsa` when they cannot run here.
    Force(kernels::cpu::Isa),
}

impl KernelSetting {
    /// The instruction set whose kernels code for `target` links: `None` for the graph form
    /// (kernels off, none running on this host, or not an `llvm-cpu` target). A forced one the
    /// host lacks is an error on every target, so a setting never passes silently.
    pub fn isa_for(self, target: &CompileTarget) -> Result<Option<kernels::cpu::Isa>, crate::Error> {
        let isa = match self {
            KernelSetting::Auto => kernels::cpu::host_isa(),
            KernelSetting::Off => None,
            KernelSetting::Force(isa) if isa.runs_on_host() => Some(isa),
            KernelSetting::Force(isa) => return Err(crate::Error::KernelIsa { isa }),
        };
        Ok(isa.filter(|_| target.is_cpu()))
    }
}

/// Instruction sets whose packed kernel makes `packed` the CPU default for 4- and 8-bit
/// checkpoints: each measured token-exact and faster than f16 (docs/PERFORMANCE.md). AMX
/// computes the AVX-512 object's bits (tests/tests/kernels.rs), faster from 4 rows of x.
pub const PACKED_BY_DEFAULT: &[kernels::cpu::Isa] = &[kernels::cpu::Isa::Amx, kernels::cpu::Isa::Avx512Vnni];

/// The precision a device runs when `--precision` is not given, chosen by measurement
/// (`cargo xtask bench`, docs/PERFORMANCE.md). On a CPU whose fastest packed kernel
/// (`kernels::cpu::host_isa`) is in [`PACKED_BY_DEFAULT`]: `packed` for an MLX-quantized
/// checkpoint of any mode (AVX-512 on the 1B shape: 2.81x f16's decode at 4-bit, 1.88x at
/// 8-bit, mxfp8 in docs/PERFORMANCE.md; token-exact with mlx-lm on every quantized fixture
/// and on SmolLM2). Otherwise f16: 1.78x
/// f32 on the 1B shape on CPU; on CUDA (H200) f16 decoded 1.08x f32 and 1.84x packed's
/// graph-level form.
pub fn default_precision(device: &str, model: &std::path::Path) -> models::Precision {
    let kernels = CompileTarget::for_device(device).is_ok_and(|t| {
        KernelSetting::Auto.isa_for(&t).is_ok_and(|isa| isa.is_some_and(|i| PACKED_BY_DEFAULT.contains(&i)))
    });
    if kernels && quantized_for_packed(model) { models::Precision::Packed } else { models::Precision::F16 }
}

/// Whether `model/config.json` declares MLX quantization (`packed` holds every mode and
/// width).
fn quantized_for_packed(model: &std::path::Path) -> bool {
    let path = model.join("config.json");
    let Ok(text) = std::fs::read_to_string(&path) else { return false };
    let Ok(config) = serde_json::from_str::<serde_json::Value>(&text) else { return false };
    // The block as the loader reads it; a malformed one is the loader's error to report.
    matches!(weights::QuantConfig::from_config(&config, &path), Ok(Some(_)))
}

#[cfg(test)]
mod tests {
    use super::*;
    use models::Precision;
    use std::path::Path;

    #[test]
    fn defaults_follow_the_checkpoint_and_the_device() {
        let fixtures = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures/qwen2");
        let packed = match kernels::cpu::host_isa() {
            Some(isa) if PACKED_BY_DEFAULT.contains(&isa) => Precision::Packed,
            _ => Precision::F16,
        };
        assert_eq!(default_precision("local-task", &fixtures.join("q4")), packed);
        assert_eq!(default_precision("local-sync", &fixtures.join("q8")), packed);
        assert_eq!(default_precision("local-task", &fixtures.join("f32")), Precision::F16);
        // Every MLX format `packed` holds.
        let llama = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures/llama_llama3_tied");
        for variant in ["mxfp4", "nvfp4", "mxfp8", "q3", "q6"] {
            assert_eq!(default_precision("local-task", &llama.join(variant)), packed, "{variant}");
        }
        assert_eq!(default_precision("cuda", &fixtures.join("q4")), Precision::F16);
        assert_eq!(default_precision("local-task", Path::new("/nonexistent")), Precision::F16);
    }

    #[test]
    fn vulkan_uris_turn_command_buffer_replays_off() {
        assert_eq!(runtime_uri("local-task"), "local-task");
        assert_eq!(runtime_uri("cuda://0"), "cuda://0");
        assert_eq!(runtime_uri("vulkan"), "vulkan://?cached_bda_replay_instances=0");
        assert_eq!(runtime_uri("vulkan://0"), "vulkan://0?cached_bda_replay_instances=0");
        assert_eq!(
            runtime_uri("vulkan://0?dispatch_abi=bda"),
            "vulkan://0?dispatch_abi=bda&cached_bda_replay_instances=0"
        );
        assert_eq!(runtime_uri("vulkan://?cached_bda_replay_instances=4"), "vulkan://?cached_bda_replay_instances=4");
    }

    #[test]
    fn kernel_settings_pick_an_instruction_set_or_refuse() {
        let cpu = CompileTarget::for_device("local-task").unwrap();
        let cuda = CompileTarget::for_device("cuda").unwrap();
        assert_eq!(KernelSetting::Auto.isa_for(&cpu).unwrap(), kernels::cpu::host_isa());
        assert_eq!(KernelSetting::Auto.isa_for(&cuda).unwrap(), None);
        assert_eq!(KernelSetting::Off.isa_for(&cpu).unwrap(), None);
        for isa in kernels::cpu::Isa::ALL {
            let forced = KernelSetting::Force(isa);
            if isa.runs_on_host() {
                assert_eq!(forced.isa_for(&cpu).unwrap(), Some(isa));
                assert_eq!(forced.isa_for(&cuda).unwrap(), None);
            } else {
                for target in [&cpu, &cuda] {
                    let err = forced.isa_for(target).unwrap_err();
                    assert!(matches!(err, crate::Error::KernelIsa { isa: i } if i == isa), "{err}");
                }
            }
        }
    }
}
