//! Runs `examples/leakcheck.rs` under valgrind and asserts no memory is
//! definitely lost across every wrapper type (the parameter encoder and mapped
//! archives included), including error paths.

mod common;

use std::path::PathBuf;
use std::process::Command;

use common::{MATVEC_PARAM_MLIR, compile, compile_split, f32_bytes, matvec_reference, write_safetensors};

/// Builds the example with the same cargo, profile and target dir as this
/// test binary and returns its path.
fn build_example() -> PathBuf {
    let exe = std::env::current_exe().expect("current exe");
    // <target>/<profile>/deps/leak_check-HASH
    let profile_dir = exe.parent().and_then(|deps| deps.parent()).expect("profile dir");
    let target_dir = profile_dir.parent().expect("target dir");
    let profile = profile_dir.file_name().and_then(|n| n.to_str()).expect("profile name");
    let mut cargo = Command::new(env!("CARGO"));
    cargo.args(["build", "--quiet", "--package", "iree-hal", "--example", "leakcheck", "--target-dir"]).arg(target_dir);
    match profile {
        "debug" => {}
        "release" => {
            cargo.arg("--release");
        }
        other => {
            cargo.args(["--profile", other]);
        }
    }
    let status = cargo.status().expect("run cargo build --example leakcheck");
    assert!(status.success(), "cargo build --example leakcheck failed");
    let example = profile_dir.join("examples").join("leakcheck");
    assert!(example.is_file(), "example not found at {}", example.display());
    example
}

#[test]
fn no_definite_leaks_under_valgrind() {
    let valgrind = PathBuf::from("/usr/bin/valgrind");
    let valgrind = if valgrind.is_file() { valgrind } else { PathBuf::from("valgrind") };
    let probe = Command::new(&valgrind).arg("--version").output();
    assert!(
        probe.as_ref().is_ok_and(|o| o.status.success()),
        "valgrind is not installed: run `cargo xtask setup` (it installs valgrind)"
    );

    let example = build_example();
    let dir = tempfile::tempdir().expect("temp dir");
    let vmfb = dir.path().join("matvec.vmfb");
    std::fs::write(&vmfb, compile(MATVEC_PARAM_MLIR)).expect("write vmfb");
    let w: Vec<f32> = (0..16).map(|i| i as f32 * 0.5 - 3.0).collect();
    let weights = dir.path().join("weights.safetensors");
    write_safetensors(&weights, &[("w", "F32", &[4, 4], &f32_bytes(&w))]);
    let (split, encoder) = compile_split(MATVEC_PARAM_MLIR);
    let (split_vmfb, encoder_vmfb) = (dir.path().join("split.vmfb"), dir.path().join("encoder.vmfb"));
    std::fs::write(&split_vmfb, split).expect("write vmfb");
    std::fs::write(&encoder_vmfb, encoder).expect("write vmfb");

    let output = Command::new(&valgrind)
        .args(["--leak-check=full", "--errors-for-leak-kinds=definite", "--error-exitcode=99"])
        .arg(&example)
        .arg(&vmfb)
        .arg(&weights)
        .arg(&encoder_vmfb)
        .arg(&split_vmfb)
        .arg(dir.path().join("encoded.irpa"))
        .output()
        .expect("run valgrind");
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "leakcheck failed ({}):\n{stdout}\n{stderr}", output.status);
    let want = matvec_reference(&w, &[1.0, 2.0, 3.0, 4.0]);
    assert!(stdout.contains(&format!("result: {want:?}")), "stdout: {stdout}\nwant {want:?}");
    assert!(stdout.contains(&format!("encoded result: {want:?}")), "stdout: {stdout}\nwant {want:?}");
    assert!(stdout.contains("local-sync"), "stdout: {stdout}");
    // Either the explicit zero line or valgrind's "no leaks are possible".
    assert!(
        stderr.contains("definitely lost: 0 bytes") || stderr.contains("All heap blocks were freed"),
        "valgrind reported leaks:\n{stderr}"
    );
    assert!(stderr.contains("ERROR SUMMARY: 0 errors"), "valgrind reported errors:\n{stderr}");
}
