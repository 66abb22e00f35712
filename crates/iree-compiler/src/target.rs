//! Compile targets and options, and the exact IREE 3.13 flags each one maps to.
//!
//! Target names are checked here before they reach the compiler, because several bad names
//! do not come back as diagnostics in IREE 3.13: an unknown `--iree-cuda-target` or
//! `--iree-vulkan-target` name crashes the process (segfault in `VerifyDevicesPass` after
//! "Unknown ... target"), and an unknown x86 `--iree-llvmcpu-target-cpu` ends it with an
//! LLVM fatal error. In-process, either would take the caller down with it.

use std::fmt;

use crate::error::Error;

/// Where the compiled module will run. Maps to `--iree-hal-target-device` and the
/// backend's own target flag; see [`Target::flags`].
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Target {
    /// CPU code through LLVM (runtime drivers `local-task` / `local-sync`). `cpu` is an LLVM
    /// CPU name, `"host"` (the compiling machine's CPU) or `"generic"`.
    LlvmCpu { cpu: String },
    /// NVIDIA GPUs via PTX. `sm` is a compute capability written `sm_NN`, e.g. `"sm_80"`.
    /// IREE 3.13 has GPU target details only for some of them: `sm_60`-`sm_89`, `sm_120`,
    /// `sm_121` compile; `sm_90`, `sm_100` and the `a` variants fail with "missing GPU target
    /// in #hal.executable.target".
    Cuda { sm: String },
    /// Apple GPUs through SPIR-V cross-compiled to MSL, for the macOS platform.
    Metal,
    /// Vulkan SPIR-V for a named GPU, architecture or profile, e.g. `"rdna3"`, `"ampere"`,
    /// `"valhall"`, `"vp_android_baseline_2022"`; see [`VULKAN_TARGETS`]. Or
    /// [`VULKAN_GENERIC`], this crate's own profile for any Vulkan 1.3 device.
    Vulkan { target: String },
    /// AMD GPUs through HIP. `target` is an LLVM AMDGPU chip or product, e.g. `"gfx942"`,
    /// `"gfx1100"`, `"mi300x"` (not an architecture family such as `"rdna3"`).
    Rocm { target: String },
}

impl Default for Target {
    fn default() -> Self {
        Target::llvm_cpu_host()
    }
}

impl fmt::Display for Target {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Target::LlvmCpu { cpu } => write!(f, "llvm-cpu (cpu {cpu})"),
            Target::Cuda { sm } => write!(f, "cuda ({sm})"),
            Target::Metal => f.write_str("metal (macos)"),
            Target::Vulkan { target } => write!(f, "vulkan ({target})"),
            Target::Rocm { target } => write!(f, "rocm/hip ({target})"),
        }
    }
}

impl Target {
    /// CPU code tuned for the machine that compiles it.
    pub fn llvm_cpu_host() -> Target {
        Target::LlvmCpu { cpu: "host".to_owned() }
    }

    pub fn cuda(sm: impl Into<String>) -> Target {
        Target::Cuda { sm: sm.into() }
    }

    pub fn vulkan(target: impl Into<String>) -> Target {
        Target::Vulkan { target: target.into() }
    }

    pub fn rocm(target: impl Into<String>) -> Target {
        Target::Rocm { target: target.into() }
    }

    /// The IREE runtime HAL driver that runs modules compiled for this target
    /// (`local-task` for CPU; `local-sync` runs them as well).
    pub fn runtime_driver(&self) -> &'static str {
        match self {
            Target::LlvmCpu { .. } => "local-task",
            Target::Cuda { .. } => "cuda",
            Target::Metal => "metal",
            Target::Vulkan { .. } => "vulkan",
            Target::Rocm { .. } => "hip",
        }
    }

    /// Whether the code is SPIR-V (Vulkan, and Metal through SPIR-V cross-compiled to MSL),
    /// whose types and lowerings in IREE 3.13 are narrower than LLVM's (no bf16 arithmetic,
    /// no `i4` vectors).
    pub fn is_spirv(&self) -> bool {
        matches!(self, Target::Vulkan { .. } | Target::Metal)
    }

    /// Checks the target name against what the pinned compiler handles without crashing.
    pub fn validate(&self) -> Result<(), Error> {
        match self {
            Target::LlvmCpu { cpu } => {
                check_charset("llvm-cpu cpu", cpu)?;
                // On x86-64 an unknown CPU is an LLVM fatal error ("64-bit code requested on a
                // subtarget that doesn't support it"); elsewhere LLVM only warns and ignores it.
                if cfg!(target_arch = "x86_64")
                    && cpu != "host"
                    && cpu != "generic"
                    && !X86_64_CPUS.contains(&cpu.as_str())
                {
                    return Err(Error::InvalidTarget(format!(
                        "unknown x86-64 CPU `{cpu}` for llvm-cpu; use \"host\", \"generic\" or one of: {}",
                        X86_64_CPUS.join(", ")
                    )));
                }
                Ok(())
            }
            Target::Cuda { sm } => {
                let ok = sm
                    .strip_prefix("sm_")
                    .map(|rest| {
                        let digits = rest.trim_end_matches(|c: char| c.is_ascii_lowercase());
                        !digits.is_empty()
                            && digits.bytes().all(|b| b.is_ascii_digit())
                            && rest.len() - digits.len() <= 1
                    })
                    .unwrap_or(false);
                if ok {
                    Ok(())
                } else {
                    Err(Error::InvalidTarget(format!(
                        "CUDA target `{sm}` is not a compute capability of the form sm_NN (e.g. sm_80)"
                    )))
                }
            }
            Target::Metal => Ok(()),
            Target::Vulkan { target } => {
                check_charset("vulkan target", target)?;
                if target == VULKAN_GENERIC || VULKAN_TARGETS.contains(&target.as_str()) || is_adreno_product(target) {
                    Ok(())
                } else {
                    Err(Error::InvalidTarget(format!(
                        "unknown Vulkan target `{target}`; known: {VULKAN_GENERIC}, {}, adreno-NNN",
                        VULKAN_TARGETS.join(", ")
                    )))
                }
            }
            Target::Rocm { target } => check_charset("rocm target", target),
        }
    }

    /// The target flags (device and backend target), in the order they are passed.
    pub fn flags(&self) -> Vec<String> {
        match self {
            // No DWARF in the executables: nothing here reads it, the vmfb is about a quarter
            // smaller and a module compiles 5-20% faster (docs/PERFORMANCE.md); numerics are
            // untouched.
            Target::LlvmCpu { cpu } => vec![
                "--iree-hal-target-device=local".to_owned(),
                "--iree-hal-local-target-device-backends=llvm-cpu".to_owned(),
                format!("--iree-llvmcpu-target-cpu={cpu}"),
                "--iree-llvmcpu-debug-symbols=false".to_owned(),
            ],
            Target::Cuda { sm } => {
                vec!["--iree-hal-target-device=cuda".to_owned(), format!("--iree-cuda-target={sm}")]
            }
            Target::Metal => {
                vec![
                    format!("--iree-hal-target-device={METAL_DEVICE}"),
                    "--iree-metal-target-platform=macos".to_owned(),
                ]
            }
            Target::Vulkan { target } if target == VULKAN_GENERIC => {
                vec![format!("--iree-hal-target-device={VULKAN_GENERIC_DEVICE}")]
            }
            Target::Vulkan { target } => {
                vec!["--iree-hal-target-device=vulkan".to_owned(), format!("--iree-vulkan-target={target}")]
            }
            Target::Rocm { target } => {
                vec!["--iree-hal-target-device=hip".to_owned(), format!("--iree-rocm-target={target}")]
            }
        }
    }
}

/// What dialects the input module is written in (`--iree-input-type`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum InputType {
    /// StableHLO, as `hlo-emit` produces.
    #[default]
    StableHlo,
    /// Let IREE detect the input dialects.
    Auto,
    /// Input already in IREE's own input dialects (linalg, arith, ...).
    None,
}

impl InputType {
    pub fn flag_value(self) -> &'static str {
        match self {
            InputType::StableHlo => "stablehlo",
            InputType::Auto => "auto",
            InputType::None => "none",
        }
    }
}

/// Options beyond the target. `extra_flags` come last, so they override earlier flags
/// (e.g. `--iree-opt-data-tiling`, `--iree-llvmcpu-enable-ukernels=all`).
#[derive(Debug, Clone, PartialEq, Eq, Hash, Default)]
pub struct CompileOptions {
    pub input_type: InputType,
    pub extra_flags: Vec<String>,
    /// Split the module's parameter encoding (the repacking of constant parameters that
    /// data tiling adds, which the module would otherwise run in an initializer at every
    /// load) out into a separate encoder module (`--iree-parameter-encoder-output-file`);
    /// the main module then reads every parameter, already in final form, from scope
    /// [`ENCODED_SCOPE`]. Compile with [`crate::Compiler::compile_split`] or
    /// [`crate::CompileCache::compile`].
    pub parameter_encoder: bool,
}

/// The parameter scope a module compiled with [`CompileOptions::parameter_encoder`] reads
/// (and its encoder writes).
pub const ENCODED_SCOPE: &str = "encoded";

impl CompileOptions {
    /// Adds one compiler flag.
    pub fn with_flag(mut self, flag: impl Into<String>) -> Self {
        self.extra_flags.push(flag.into());
        self
    }

    /// Sets [`CompileOptions::parameter_encoder`].
    pub fn with_parameter_encoder(mut self) -> Self {
        self.parameter_encoder = true;
        self
    }
}

/// The full flag list for a compile: input type, target flags, then the extra flags, then
/// (with [`CompileOptions::parameter_encoder`]) the encoder's output scope, and, in
/// consolidate mode, every parameter in it. This list (plus the compiler version) is what
/// identifies a compile in the cache; the encoder's output file, a temporary path, is
/// added only when compiling.
pub fn compile_flags(target: &Target, opts: &CompileOptions) -> Vec<String> {
    let mut flags = vec![format!("--iree-input-type={}", opts.input_type.flag_value())];
    flags.extend(target.flags());
    flags.extend(opts.extra_flags.iter().cloned());
    if opts.parameter_encoder {
        flags.push(format!("--iree-parameter-encoder-output-scope={ENCODED_SCOPE}"));
        flags.push("--iree-parameter-encoder-mode=consolidate".to_owned());
    }
    flags
}

/// Rejects empty names and characters no target name uses (also keeps `=`/`,`/spaces from
/// smuggling extra flag syntax into a value).
fn check_charset(what: &str, value: &str) -> Result<(), Error> {
    let ok = !value.is_empty()
        && value.len() <= 64
        && value.bytes().all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'-' | b'.' | b'+'));
    if ok {
        Ok(())
    } else {
        Err(Error::InvalidTarget(format!("{what} `{value}` must be 1-64 characters of [A-Za-z0-9_.+-]")))
    }
}

/// `adreno-NNN` or `adreno-NNNl`, the product form IREE's Qualcomm table accepts.
fn is_adreno_product(target: &str) -> bool {
    let Some(rest) = target.strip_prefix("adreno-") else {
        return false;
    };
    let rest = rest.strip_suffix('l').unwrap_or(rest);
    rest.len() == 3 && rest.bytes().all(|b| b.is_ascii_digit())
}

/// The Vulkan target for a device IREE has no name for: any Vulkan 1.3 device (SPIR-V 1.6)
/// with 8- and 16-bit storage buffers and f16/i8/i16 arithmetic, such as Mesa's lavapipe.
/// Its code uses no subgroup operations, so it runs whatever the device's subgroup size:
/// every named target assumes its GPU's (4 to 128), and a reduction compiled for another
/// size than the device's computes wrong sums without an error (lavapipe's is 8: `valhall`'s
/// 16 and `rdna3`'s 64 both gave wrong matvecs there, `vp_android_baseline_2022`, which
/// has no 16-bit storage, read f16 weights wrong). Workgroups stay at 128 threads and 16 KiB
/// of shared memory, what every Vulkan 1.3 device offers.
pub const VULKAN_GENERIC: &str = "generic";

/// [`VULKAN_GENERIC`] as the device target attribute `--iree-hal-target-device` takes in
/// place of a device name.
const VULKAN_GENERIC_DEVICE: &str = concat!(
    r#"#hal.device.target<"vulkan", [#hal.executable.target<"vulkan-spirv", "vulkan-spirv-fb", "#,
    r#"{iree_codegen.target_info = #iree_gpu.target<arch = "", features = "spirv:v1.6,cap:Shader", "#,
    r#"wgp = <compute = fp32|fp16|int32|int16|int8, storage = b32|b16|b8, subgroup = none, "#,
    r#"subgroup_size_choices = [64], max_workgroup_sizes = [128, 128, 64], "#,
    r#"max_thread_count_per_workgroup = 128, max_workgroup_memory_bytes = 16384, "#,
    r#"max_workgroup_counts = [65535, 65535, 65535]>>}>]>"#
);

/// IREE 3.13's own Metal target (`apple`) with subgroup operations off: with them its
/// reductions keep an index in workgroup memory, which the Metal lowering rejects ("failed to
/// legalize operation 'memref.alloc'" of `memref<1xindex, Workgroup>`) on every model graph,
/// from the first RMSNorm's sum on. Otherwise `apple`'s details as IREE 3.13 has them.
const METAL_DEVICE: &str = concat!(
    r#"#hal.device.target<"metal", [#hal.executable.target<"metal-spirv", "metal-msl-fb", "#,
    r#"{iree_codegen.target_info = #iree_gpu.target<arch = "apple", features = "spirv:v1.3,cap:Shader", "#,
    r#"wgp = <compute = fp32|fp16|int64|int32|int16|int8, storage = b64|b32|b16|b8, subgroup = none, "#,
    r#"dot = dp4xi8toi32, subgroup_size_choices = [32], max_workgroup_sizes = [1024, 1024, 1024], "#,
    r#"max_thread_count_per_workgroup = 1024, max_workgroup_memory_bytes = 32768, "#,
    r#"max_workgroup_counts = [65535, 65535, 65535]>>}>]>"#
);

/// `--iree-vulkan-target` names that IREE 3.13 compiles (each checked with iree-compile
/// 3.13.0rc20261016). Names outside its tables crash the compiler instead of failing.
pub const VULKAN_TARGETS: &[&str] = &[
    // AMD architectures, chips and products.
    "rdna1",
    "rdna2",
    "rdna3",
    "rdna4",
    "cdna1",
    "cdna2",
    "cdna3",
    "cdna4",
    "gfx908",
    "gfx90a",
    "gfx942",
    "gfx950",
    "gfx1010",
    "gfx1030",
    "gfx1100",
    "gfx1101",
    "gfx1102",
    "gfx1150",
    "gfx1151",
    "gfx1200",
    "gfx1201",
    "gfx1250",
    "mi100",
    "mi210",
    "mi250",
    "mi250x",
    "mi300x",
    "mi300a",
    "mi308x",
    "mi325x",
    "mi350x",
    "mi355x",
    "rx7900xtx",
    "rx7900xt",
    "rx7800xt",
    "rx7700xt",
    "rx9070xt",
    "rx9070",
    "rx9060xt",
    "r9700",
    "v710",
    "w7900",
    "w7800",
    // ARM Mali.
    "valhall",
    "valhall1",
    "valhall2",
    "valhall3",
    "valhall4",
    "mali-g715",
    "mali-g710",
    "mali-g77",
    // NVIDIA (no entry for sm_90 and later).
    "ampere",
    "turing",
    "volta",
    "pascal",
    "sm_60",
    "sm_70",
    "sm_75",
    "sm_80",
    "sm_86",
    "sm_87",
    "sm_89",
    "a100",
    "rtx3090",
    "rtx4090",
    // Qualcomm and profiles.
    "adreno",
    "vp_android_baseline_2022",
];

/// x86-64 CPU names LLVM (as bundled with IREE 3.13) accepts for `--iree-llvmcpu-target-cpu`,
/// as listed by the compiler's own "List of accepted x86 CPUs" warning.
pub const X86_64_CPUS: &[&str] = &[
    "nocona",
    "core2",
    "penryn",
    "bonnell",
    "atom",
    "silvermont",
    "slm",
    "goldmont",
    "goldmont-plus",
    "tremont",
    "nehalem",
    "corei7",
    "westmere",
    "sandybridge",
    "corei7-avx",
    "ivybridge",
    "core-avx-i",
    "haswell",
    "core-avx2",
    "broadwell",
    "skylake",
    "skylake-avx512",
    "skx",
    "cascadelake",
    "cooperlake",
    "cannonlake",
    "icelake-client",
    "rocketlake",
    "icelake-server",
    "tigerlake",
    "sapphirerapids",
    "alderlake",
    "raptorlake",
    "meteorlake",
    "arrowlake",
    "arrowlake-s",
    "lunarlake",
    "gracemont",
    "pantherlake",
    "wildcatlake",
    "novalake",
    "sierraforest",
    "grandridge",
    "graniterapids",
    "graniterapids-d",
    "emeraldrapids",
    "clearwaterforest",
    "diamondrapids",
    "knl",
    "knm",
    "k8",
    "athlon64",
    "athlon-fx",
    "opteron",
    "k8-sse3",
    "athlon64-sse3",
    "opteron-sse3",
    "amdfam10",
    "barcelona",
    "btver1",
    "btver2",
    "bdver1",
    "bdver2",
    "bdver3",
    "bdver4",
    "znver1",
    "znver2",
    "znver3",
    "znver4",
    "znver5",
    "znver6",
    "c86-4g-m4",
    "c86-4g-m6",
    "c86-4g-m7",
    "c86-4g-m8",
    "x86-64",
    "x86-64-v2",
    "x86-64-v3",
    "x86-64-v4",
];

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn flags_per_target() {
        let opts = CompileOptions::default().with_flag("--iree-opt-data-tiling");
        assert_eq!(
            compile_flags(&Target::llvm_cpu_host(), &opts),
            [
                "--iree-input-type=stablehlo",
                "--iree-hal-target-device=local",
                "--iree-hal-local-target-device-backends=llvm-cpu",
                "--iree-llvmcpu-target-cpu=host",
                "--iree-llvmcpu-debug-symbols=false",
                "--iree-opt-data-tiling",
            ]
        );
        assert_eq!(Target::cuda("sm_80").flags(), ["--iree-hal-target-device=cuda", "--iree-cuda-target=sm_80"]);
        let metal = Target::Metal.flags();
        assert!(metal[0].starts_with("--iree-hal-target-device=#hal.device.target<\"metal\""), "{metal:?}");
        assert!(metal[0].contains("arch = \"apple\"") && metal[0].contains("subgroup = none"), "{metal:?}");
        assert_eq!(metal[1], "--iree-metal-target-platform=macos");
        assert_eq!(Target::vulkan("rdna3").flags(), ["--iree-hal-target-device=vulkan", "--iree-vulkan-target=rdna3"]);
        assert_eq!(Target::rocm("gfx942").flags(), ["--iree-hal-target-device=hip", "--iree-rocm-target=gfx942"]);
    }

    #[test]
    fn validation_rejects_crashing_names() {
        assert!(Target::cuda("sm_80").validate().is_ok());
        assert!(Target::cuda("sm_90a").validate().is_ok());
        let err = Target::cuda("hopper").validate().unwrap_err().to_string();
        assert!(err.contains("`hopper` is not a compute capability"), "{err}");
        assert!(Target::cuda("sm_").validate().is_err());
        assert!(Target::cuda("sm_9ab").validate().is_err());

        assert!(Target::vulkan("rdna3").validate().is_ok());
        assert!(Target::vulkan(VULKAN_GENERIC).validate().is_ok());
        let generic = Target::vulkan(VULKAN_GENERIC).flags();
        assert_eq!(generic.len(), 1);
        assert!(generic[0].starts_with("--iree-hal-target-device=#hal.device.target<\"vulkan\""), "{generic:?}");
        assert!(generic[0].contains("subgroup = none"), "{generic:?}");
        assert!(Target::vulkan("adreno-750").validate().is_ok());
        assert!(Target::vulkan("adreno-740l").validate().is_ok());
        let err = Target::vulkan("sm_90").validate().unwrap_err().to_string();
        assert!(err.contains("unknown Vulkan target `sm_90`"), "{err}");

        assert!(Target::rocm("gfx942").validate().is_ok());
        let err = Target::rocm("gfx942 --x").validate().unwrap_err().to_string();
        assert!(err.contains("must be 1-64 characters"), "{err}");

        assert!(Target::llvm_cpu_host().validate().is_ok());
        assert!(Target::LlvmCpu { cpu: "generic".into() }.validate().is_ok());
        if cfg!(target_arch = "x86_64") {
            assert!(Target::LlvmCpu { cpu: "znver4".into() }.validate().is_ok());
            let err = Target::LlvmCpu { cpu: "foo".into() }.validate().unwrap_err().to_string();
            assert!(err.contains("unknown x86-64 CPU `foo`"), "{err}");
        }
    }
}
