//! Test-only helpers: compile StableHLO/MLIR text to a vmfb with `iree-compile`
//! at test time (vmfbs are CPU-specific, so none are checked in), and write
//! `.safetensors` files by hand.

#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::Command;

/// The `iree-compile` binary: `$IREE_COMPILE`, else `<root>/target/venv/bin/iree-compile`
/// (root = `MLX_IREE_ROOT` or the workspace root). Panics with a hint if absent.
pub fn iree_compile() -> PathBuf {
    if let Some(path) = std::env::var_os("IREE_COMPILE").filter(|p| !p.is_empty()) {
        return PathBuf::from(path);
    }
    let root = option_env!("MLX_IREE_ROOT")
        .filter(|r| !r.is_empty())
        .map(PathBuf::from)
        .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("../.."));
    let path = root.join("target/venv/bin/iree-compile");
    assert!(
        path.is_file(),
        "iree-compile not found at {} (run `cargo xtask setup` or set IREE_COMPILE)",
        path.display()
    );
    path
}

/// Compiles `mlir` (StableHLO input) for the local llvm-cpu backend with a
/// generic x86-64/aarch64 CPU (so the code also runs under valgrind) and
/// returns the vmfb bytes.
pub fn compile(mlir: &str) -> Vec<u8> {
    compile_with(mlir, &[])
}

/// The local llvm-cpu target on a generic CPU, as `iree-compile` flags.
const TARGET_FLAGS: [&str; 4] = [
    "--iree-hal-target-device=local",
    "--iree-hal-local-target-device-backends=llvm-cpu",
    "--iree-llvmcpu-target-cpu=generic",
    "--iree-llvmcpu-debug-symbols=false",
];

/// [`compile`] with `extra` flags after the target's.
pub fn compile_with(mlir: &str, extra: &[&str]) -> Vec<u8> {
    let dir = tempfile::tempdir().expect("temp dir");
    run_compile(dir.path(), "--iree-input-type=stablehlo", mlir, extra)
}

/// Compiles `mlir` with data tiling (so its constant weights are repacked) and the
/// parameter encoder split out (`--iree-parameter-encoder-output-file`); returns the main
/// module and the encoder module, both compiled.
pub fn compile_split(mlir: &str) -> (Vec<u8>, Vec<u8>) {
    let dir = tempfile::tempdir().expect("temp dir");
    let encoder_mlir = dir.path().join("encoder.mlir");
    let split = format!("--iree-parameter-encoder-output-file={}", encoder_mlir.display());
    let main = run_compile(dir.path(), "--iree-input-type=stablehlo", mlir, &[DATA_TILING[0], DATA_TILING[1], &split]);
    let encoder = std::fs::read_to_string(&encoder_mlir).expect("the compiler wrote no encoder module");
    (main, run_compile(dir.path(), "--iree-input-type=auto", &encoder, &[]))
}

/// The CPU data-tiling flags the engine compiles with.
pub const DATA_TILING: [&str; 2] = ["--iree-global-opt-data-tiling", "--iree-llvmcpu-enable-ukernels=all"];

fn run_compile(dir: &Path, input_type: &str, mlir: &str, extra: &[&str]) -> Vec<u8> {
    let input = dir.join("input.mlir");
    let output = dir.join("output.vmfb");
    std::fs::write(&input, mlir).expect("write mlir");
    let result = Command::new(iree_compile())
        .arg(input_type)
        .args(TARGET_FLAGS)
        .args(extra)
        .arg(&input)
        .arg("-o")
        .arg(&output)
        .output()
        .expect("run iree-compile");
    assert!(
        result.status.success(),
        "iree-compile failed:\n{}\n--- input ---\n{mlir}",
        String::from_utf8_lossy(&result.stderr)
    );
    std::fs::read(&output).expect("read vmfb")
}

/// Writes a `.safetensors` file: 8-byte little-endian header length, JSON
/// header, then the tensors' bytes back to back. `tensors` = (name, dtype
/// such as "F32", shape, raw bytes).
pub fn write_safetensors(path: &Path, tensors: &[(&str, &str, &[usize], &[u8])]) {
    let mut header = String::from("{");
    let mut offset = 0usize;
    for (i, (name, dtype, shape, bytes)) in tensors.iter().enumerate() {
        if i > 0 {
            header.push(',');
        }
        let dims: Vec<String> = shape.iter().map(ToString::to_string).collect();
        header.push_str(&format!(
            "\"{name}\":{{\"dtype\":\"{dtype}\",\"shape\":[{}],\"data_offsets\":[{offset},{}]}}",
            dims.join(","),
            offset + bytes.len()
        ));
        offset += bytes.len();
    }
    header.push('}');
    // Pad the header with spaces to a multiple of 8 bytes, as writers usually do.
    while header.len() % 8 != 0 {
        header.push(' ');
    }
    let mut file = Vec::new();
    file.extend_from_slice(&(header.len() as u64).to_le_bytes());
    file.extend_from_slice(header.as_bytes());
    for (_, _, _, bytes) in tensors {
        file.extend_from_slice(bytes);
    }
    std::fs::write(path, file).expect("write safetensors");
}

/// f32 values as little-endian bytes.
pub fn f32_bytes(values: &[f32]) -> Vec<u8> {
    values.iter().flat_map(|v| v.to_le_bytes()).collect()
}

/// Module reading a parameter-bound 4x4 f32 weight `model::w` and returning `w · x`.
pub const MATVEC_PARAM_MLIR: &str = r#"
util.global private @w = #stream.parameter.named<"model"::"w"> : tensor<4x4xf32>
func.func @matvec(%x: tensor<4xf32>) -> tensor<4xf32> {
  %w = util.global.load @w : tensor<4x4xf32>
  %0 = stablehlo.dot_general %w, %x, contracting_dims = [1] x [0] : (tensor<4x4xf32>, tensor<4xf32>) -> tensor<4xf32>
  return %0 : tensor<4xf32>
}
"#;

/// Two-input f32 vector add.
pub const ADD_F32_MLIR: &str = r#"
func.func @add(%a: tensor<4xf32>, %b: tensor<4xf32>) -> tensor<4xf32> {
  %0 = stablehlo.add %a, %b : tensor<4xf32>
  return %0 : tensor<4xf32>
}
"#;

/// Rust reference for `w · x` with row-major `w` [rows, cols].
pub fn matvec_reference(w: &[f32], x: &[f32]) -> Vec<f32> {
    w.chunks(x.len()).map(|row| row.iter().zip(x).map(|(a, b)| a * b).sum()).collect()
}
