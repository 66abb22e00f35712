//! Compiles a small StableHLO module in-process for every target family and checks errors,
//! flags, versions and the process-global library rules.

mod common;

use std::time::Instant;

use common::{MODULE, compiler, contains};
use iree_compiler::{CompileOptions, Compiler, Error, Severity, Target, check_vmfb, flatbuffer_offset};

/// Compiles `MODULE` for `target`, checks the vmfb container and the executable format the
/// target must have produced, and reports the time taken.
fn compile_for(target: Target, format_marker: &str) -> Vec<u8> {
    let c = compiler();
    let start = Instant::now();
    let vmfb = match c.compile(MODULE, &target, &CompileOptions::default()) {
        Ok(v) => v,
        Err(e) => panic!("{target}: {e}"),
    };
    eprintln!("{target}: {} bytes in {:.2} s", vmfb.len(), start.elapsed().as_secs_f64());

    // IREE 3.13 wraps the module flatbuffer in a ZIP ("polyglot") container: local header
    // first, then the size-prefixed flatbuffer whose identifier sits at bytes 8..12.
    assert_eq!(&vmfb[..4], b"PK\x03\x04", "{target}");
    let fb = flatbuffer_offset(&vmfb).expect("vmfb flatbuffer offset");
    assert_eq!(&vmfb[fb + 8..fb + 12], b"IREE", "{target}");
    let fb_len = u32::from_le_bytes(vmfb[fb..fb + 4].try_into().expect("4 bytes")) as usize;
    assert!(fb + 4 + fb_len <= vmfb.len(), "{target}: flatbuffer length {fb_len} overruns the file");

    // Both exported functions and the target's executable format are in the module.
    assert!(contains(&vmfb, b"matvec"), "{target}: no `matvec` export");
    assert!(contains(&vmfb, b"add"), "{target}: no `add` export");
    assert!(contains(&vmfb, format_marker.as_bytes()), "{target}: no `{format_marker}` in the vmfb");
    vmfb
}

/// IREE's name of this host's embedded-ELF executable format (it says `arm_64` for aarch64).
fn host_elf_format() -> String {
    let arch = match std::env::consts::ARCH {
        "aarch64" => "arm_64",
        other => other,
    };
    format!("embedded-elf-{arch}")
}

#[test]
fn llvm_cpu_host() {
    compile_for(Target::llvm_cpu_host(), &host_elf_format());
}

#[test]
fn llvm_cpu_generic() {
    compile_for(Target::LlvmCpu { cpu: "generic".into() }, &host_elf_format());
}

#[test]
fn cuda_sm80() {
    let vmfb = compile_for(Target::cuda("sm_80"), "cuda-nvptx-fb");
    // Without ptxas the executable is PTX text for the requested architecture.
    assert!(contains(&vmfb, b".target sm_80"));
}

#[test]
fn cuda_sm90_has_no_gpu_target_in_iree_3_13() {
    // IREE 3.13's known-GPU table has no sm_90 (Hopper) entry, so codegen finds no
    // `iree_codegen.target_info`; it must come back as an error, not a crash.
    let err = compiler().compile(MODULE, &Target::cuda("sm_90"), &CompileOptions::default()).unwrap_err();
    let Error::Compile { flags, diagnostics } = &err else { panic!("expected a compile error, got {err}") };
    assert!(flags.contains(&"--iree-cuda-target=sm_90".to_owned()));
    assert!(
        diagnostics.0.iter().any(
            |d| d.severity == Severity::Error && d.message.contains("missing GPU target in #hal.executable.target")
        ),
        "{err}"
    );
}

#[test]
fn cuda_sm89() {
    let vmfb = compile_for(Target::cuda("sm_89"), "cuda-nvptx-fb");
    assert!(contains(&vmfb, b".target sm_89"));
}

#[test]
fn vulkan_rdna3() {
    let vmfb = compile_for(Target::vulkan("rdna3"), "vulkan-spirv-fb");
    assert!(contains(&vmfb, b"arch = \"rdna3\""));
}

#[test]
fn metal_macos() {
    let vmfb = compile_for(Target::Metal, "metal-msl-fb");
    // The SPIR-V is cross-compiled to Metal Shading Language source.
    assert!(contains(&vmfb, b"kernel void matvec_dispatch_0"));
}

#[test]
fn rocm_gfx942() {
    let vmfb = compile_for(Target::rocm("gfx942"), "rocm-hsaco-fb");
    assert!(contains(&vmfb, b"gfx942"));
}

#[test]
fn extra_flags_change_the_output() {
    let c = compiler();
    let plain = c.compile(MODULE, &Target::llvm_cpu_host(), &CompileOptions::default()).unwrap();
    let bare = c
        .compile(
            MODULE,
            &Target::llvm_cpu_host(),
            &CompileOptions::default().with_flag("--iree-vm-emit-polyglot-zip=false"),
        )
        .unwrap();
    // Without the ZIP wrapper the file is the bare size-prefixed flatbuffer.
    assert_eq!(&bare[8..12], b"IREE");
    assert_eq!(flatbuffer_offset(&bare).unwrap(), 0);
    assert_ne!(&plain[..4], &bare[..4]);
    check_vmfb(&bare).unwrap();
}

#[test]
fn compiles_are_deterministic() {
    let c = compiler();
    let t = Target::vulkan("rdna3");
    let a = c.compile(MODULE, &t, &CompileOptions::default()).unwrap();
    let b = c.compile(MODULE, &t, &CompileOptions::default()).unwrap();
    assert_eq!(a, b);
}

#[test]
fn undefined_value_is_a_parse_error_with_the_mlir_diagnostic() {
    let bad = "func.func @f(%a: tensor<4xf32>) -> tensor<4xf32> {\n  %0 = stablehlo.add %a, %b : tensor<4xf32>\n  return %0 : tensor<4xf32>\n}\n";
    let err = compiler().compile(bad, &Target::llvm_cpu_host(), &CompileOptions::default()).unwrap_err();
    assert!(matches!(err, Error::Parse { .. }), "{err}");
    let text = err.to_string();
    // Location (line 2, column 26 is `%b`) and MLIR's message.
    assert!(text.contains("input.mlir:2:26: use of undeclared SSA value name"), "{text}");
}

#[test]
fn op_verifier_error_is_reported() {
    let bad = "func.func @f(%a: tensor<4xf32>, %b: tensor<3xf32>) -> tensor<4xf32> {\n  %0 = stablehlo.add %a, %b : (tensor<4xf32>, tensor<3xf32>) -> tensor<4xf32>\n  return %0 : tensor<4xf32>\n}\n";
    let err = compiler().compile(bad, &Target::llvm_cpu_host(), &CompileOptions::default()).unwrap_err();
    let text = err.to_string();
    assert!(text.contains("'stablehlo.add' op requires the same shape for all operands and results"), "{text}");
    let diags = err.diagnostics().unwrap();
    assert_eq!(diags.0[0].severity, Severity::Error);
}

#[test]
fn unknown_flag_is_an_error() {
    let opts = CompileOptions::default().with_flag("--iree-no-such-flag=1");
    let err = compiler().compile(MODULE, &Target::llvm_cpu_host(), &opts).unwrap_err();
    let Error::InvalidFlags { flags, message } = &err else { panic!("expected InvalidFlags, got {err}") };
    assert_eq!(flags.last().map(String::as_str), Some("--iree-no-such-flag=1"));
    assert!(message.contains("option not found: iree-no-such-flag"), "{message}");
}

#[test]
fn positional_argument_is_an_error() {
    let opts = CompileOptions::default().with_flag("module.mlir");
    let err = compiler().compile(MODULE, &Target::llvm_cpu_host(), &opts).unwrap_err().to_string();
    assert!(err.contains("pure positional arguments not supported"), "{err}");
}

#[test]
fn global_only_flag_is_rejected_by_the_session() {
    // Plain llvm::cl options are process-global, not session flags; the session refuses them.
    let opts = CompileOptions::default().with_flag("--mlir-print-ir-after-all");
    let err = compiler().compile(MODULE, &Target::llvm_cpu_host(), &opts).unwrap_err().to_string();
    assert!(err.contains("option not found: mlir-print-ir-after-all"), "{err}");
}

#[test]
fn bad_device_in_extra_flags_is_a_diagnostic() {
    let opts = CompileOptions::default().with_flag("--iree-hal-target-device=bogus");
    let err = compiler().compile(MODULE, &Target::llvm_cpu_host(), &opts).unwrap_err().to_string();
    assert!(err.contains("unregistered device alias \"bogus\""), "{err}");
}

#[test]
fn crashing_target_names_are_refused_before_the_compiler_sees_them() {
    let c = compiler();
    for (target, expect) in [
        (Target::cuda("hopper"), "not a compute capability"),
        (Target::vulkan("apple"), "unknown Vulkan target `apple`"),
        (Target::rocm(""), "must be 1-64 characters"),
    ] {
        let err = c.compile(MODULE, &target, &CompileOptions::default()).unwrap_err();
        assert!(matches!(err, Error::InvalidTarget(_)), "{err}");
        assert!(err.to_string().contains(expect), "{err}");
    }
}

#[test]
fn unknown_rocm_chip_is_a_diagnostic() {
    // Unlike CUDA and Vulkan, an unknown HIP target fails cleanly, so any name is passed on.
    let err = compiler().compile(MODULE, &Target::rocm("rdna3"), &CompileOptions::default()).unwrap_err();
    assert!(err.to_string().contains("Unknown ROCM target 'rdna3'"), "{err}");
}

#[test]
fn nul_in_input_is_refused() {
    let err = compiler().compile("func.func\0", &Target::llvm_cpu_host(), &CompileOptions::default()).unwrap_err();
    assert!(err.to_string().contains("NUL byte at offset 9"), "{err}");
}

#[test]
fn compile_to_flow_shows_one_dispatch_per_function() {
    let ir = compiler().compile_to_ir(MODULE, &Target::llvm_cpu_host(), &CompileOptions::default(), "flow").unwrap();
    assert_eq!(ir.matches("flow.dispatch @").count(), 2, "{ir}");
    assert!(ir.contains("matvec_dispatch_0"), "{ir}");
}

#[test]
fn version_and_backends() {
    let c = compiler();
    assert!(c.revision().starts_with("3.13.0"), "revision {}", c.revision());
    let v = c.api_version();
    assert_eq!((v.major, v.minor), (1, 4));
    let backends = c.target_backends();
    for b in ["llvm-cpu", "cuda", "metal-spirv", "vulkan-spirv", "rocm"] {
        assert!(backends.iter().any(|x| x == b), "{b} missing from {backends:?}");
    }
}

#[test]
fn library_is_process_global() {
    let c = compiler();
    // Same file again: the same handle.
    let again = Compiler::load(Some(c.library_path())).unwrap();
    assert_eq!(again.library_path(), c.library_path());
    // Any other file: refused, the loaded library stays.
    let other = std::env::current_exe().unwrap();
    let err = Compiler::load(Some(&other)).unwrap_err();
    assert!(matches!(err, Error::AlreadyLoaded { .. }), "{err}");
    assert!(err.to_string().contains("process-global"), "{err}");
}

#[test]
fn concurrent_compiles_from_threads() {
    let c = compiler();
    let handles: Vec<_> = ["rdna3", "rdna2", "gfx1100"]
        .into_iter()
        .map(|t| std::thread::spawn(move || c.compile(MODULE, &Target::vulkan(t), &CompileOptions::default())))
        .collect();
    for h in handles {
        let vmfb = h.join().unwrap().unwrap();
        check_vmfb(&vmfb).unwrap();
    }
}

#[test]
fn vulkan_targets_from_each_vendor_table() {
    // One name per table IREE 3.13 consults for --iree-vulkan-target (the full
    // VULKAN_TARGETS list was checked once; 67 compiles take too long for every test run).
    let c = compiler();
    let add = "func.func @add(%a: tensor<4xf32>) -> tensor<4xf32> {\n  %0 = stablehlo.add %a, %a : tensor<4xf32>\n  return %0 : tensor<4xf32>\n}\n";
    for name in ["cdna3", "rx7900xtx", "valhall", "ampere", "adreno-750", "vp_android_baseline_2022"] {
        let vmfb = c.compile(add, &Target::vulkan(name), &CompileOptions::default()).unwrap();
        assert!(contains(&vmfb, b"vulkan-spirv-fb"), "{name}");
    }
}
