//! The CUDA kernel (`crates/kernels/cuda/qmv.cu`) without a GPU: the same source compiled for
//! the host against `cuda/host_sim.h`, which runs each block's threads as host threads and
//! meets a warp's 32 threads at a barrier for each shuffle, so the kernel's own code computes
//! every export (qmv, qmvr, glu, rows, and qmvn and glun after RMSNorm; 4 and 8 bits; f16,
//! bf16 and f32 scales) against a
//! reference in double (`cuda/qmv_host_test.cc`). That the PTX builds and that IREE links it
//! into a module for `cuda` is checked by the kernels crate's tests and
//! crates/engine/tests/gpu_compile.rs; running it on a GPU is scripts/cuda-check's part.

#![allow(clippy::unwrap_used)] // a test that cannot unwrap has failed; helpers included

use std::path::{Path, PathBuf};
use std::process::Command;

fn sources() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../crates/kernels/cuda")
}

#[test]
fn every_cuda_export_computes_its_results_on_the_host() {
    let dir = tempfile::tempdir().unwrap();
    let exe = dir.path().join("qmv_host_test");
    let built = Command::new("c++")
        .args(["-std=c++20", "-O1", "-pthread", "-ffp-contract=off", "-I"])
        .arg(sources())
        .arg(sources().join("qmv_host_test.cc"))
        .arg("-o")
        .arg(&exe)
        .output()
        .unwrap_or_else(|e| panic!("no C++ compiler `c++` ({e}): run `cargo xtask setup`"));
    assert!(built.status.success(), "building the host test failed: {}", String::from_utf8_lossy(&built.stderr));
    let out = Command::new(&exe).output().unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{stdout}");
    // 48 products (3 exports x 2 bit widths x 3 scale types x 2 shapes, the 2 normed ones in
    // one shape), 6 lookups, 9 more.
    assert_eq!(stdout.lines().filter(|l| l.starts_with("ok ")).count(), 63, "{stdout}");
    assert!(stdout.trim_end().ends_with("0 failed"), "{stdout}");
}

/// clang is installed by the setup, so the build has the PTX: without it packed weights on
/// CUDA would quietly fall back to the graph form.
#[test]
fn the_build_has_the_ptx() {
    assert!(kernels::cuda::ptx().is_some(), "no PTX in this build: is clang installed (cargo xtask setup)?");
}
