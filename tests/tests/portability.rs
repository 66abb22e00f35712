//! Compile-level portability: every end-to-end graph compiles for the GPU targets
//! without hardware (IREE cross-compiles from this host).

#![allow(clippy::unwrap_used)] // a test that cannot unwrap has failed; helpers included

use e2e::*;
use iree_compiler::{CompileOptions, Target, check_vmfb};

fn check_compiles(target: Target) {
    for (name, mlir) in all_graphs().unwrap() {
        let out = cache()
            .compile(compiler(), &mlir, &target, &CompileOptions::default())
            .unwrap_or_else(|e| panic!("{name} for {target}: {e}"));
        assert!(!out.vmfb.is_empty(), "{name} for {target}: empty vmfb");
        check_vmfb(&out.vmfb).unwrap_or_else(|e| panic!("{name} for {target}: not a vmfb: {e}"));
    }
}

#[test]
fn cuda_sm80() {
    check_compiles(Target::cuda("sm_80"));
}

#[test]
fn cuda_sm89() {
    check_compiles(Target::cuda("sm_89"));
}

/// IREE 3.13's GPU target table has no entry for sm_90 (Hopper): the compile fails
/// with this diagnostic. Hopper runs sm_80/sm_89 PTX (JIT-compiled by the driver).
/// When the pinned compiler learns sm_90 this test fails and the doc must change.
#[test]
fn cuda_sm90_is_a_known_gap_of_iree_3_13() {
    let (name, mlir) = &all_graphs().unwrap()[0];
    let err = compiler()
        .compile(mlir, &Target::cuda("sm_90"), &CompileOptions::default())
        .expect_err("sm_90 compiled: update docs and this test");
    assert!(err.to_string().contains("missing GPU target"), "{name}: {err}");
}

#[test]
fn vulkan_rdna3() {
    check_compiles(Target::vulkan("rdna3"));
}

#[test]
fn metal_macos() {
    check_compiles(Target::Metal);
}

#[test]
fn rocm_gfx942() {
    check_compiles(Target::rocm("gfx942"));
}
