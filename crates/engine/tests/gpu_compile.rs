//! Compile-level checks of model graphs for a GPU target (no GPU needed: IREE cross-compiles
//! from this host): the mixture-of-experts block (router, top-k, gathered experts, shared
//! expert) and Phi-3's partial rotary as the engine plans them for `cuda`, dense and packed
//! (the graph form every target but the CPU runs), and the SPIR-V forms (bf16 as bit
//! patterns, 4-bit one value a byte, dequantized contractions) for Metal. The run-level
//! checks are scripts/cuda-check on a machine with the GPU, and tests/vulkan.rs on lavapipe
//! for SPIR-V; no Mac runs Metal here.

#![allow(clippy::unwrap_used)] // a test that cannot unwrap has failed; helpers included

mod common;

use common::{compile_cache, planned};
use engine::{CompileTarget, KernelSetting, KvElem, Precision};

use iree_compiler::check_vmfb;

/// Every module the engine would compile for `cuda` (sm_80) on fixture `family`'s `variant`
/// at `precision` compiles to a vmfb; returns their MLIR.
fn compiles_for_cuda(family: &str, variant: &str, precision: Precision) -> String {
    compiles_for(family, variant, precision, CompileTarget::Cuda("sm_80".into()))
}

/// The same for `target`, in the layout the engine gives it.
fn compiles_for(family: &str, variant: &str, precision: Precision, target: CompileTarget) -> String {
    compiles_with(family, variant, precision, target, KvElem::F32)
}

/// The same with a KV cache of element type `kv`.
fn compiles_with(family: &str, variant: &str, precision: Precision, target: CompileTarget, kv: KvElem) -> String {
    let (backend, modules) = planned(family, variant, precision, &target, KernelSetting::Auto, 2, kv);
    assert!(!modules.is_empty());
    let text = modules.iter().map(|m| m.mlir.as_str()).collect();
    for m in modules {
        let vmfb = backend
            .compile(&m, &compile_cache())
            .unwrap_or_else(|e| panic!("{family}/{variant} {precision} for {target}: {}: {e}", m.what));
        check_vmfb(&vmfb).unwrap_or_else(|e| panic!("{family}/{variant} {}: not a vmfb: {e}", m.what));
    }
    text
}

/// The CUDA kernel's exports (`kernels::cuda`) a module dispatches, sorted.
fn cuda_exports(mlir: &str) -> Vec<String> {
    let mut names: Vec<String> = mlir
        .match_indices(&format!("@{}::@", kernels::cuda::EXECUTABLE))
        .filter_map(|(i, m)| mlir[i + m.len()..].split(|c: char| !c.is_ascii_alphanumeric() && c != '_').next())
        .map(str::to_owned)
        .collect();
    names.sort();
    names.dedup();
    names
}

#[test]
fn qwen3_moe_f16_compiles_for_cuda() {
    compiles_for_cuda("qwen3_moe", "f32", Precision::F16);
}

/// Packed experts in the graph form (gathered bytes dequantized), an 8-bit router.
#[test]
fn qwen3_moe_packed_compiles_for_cuda() {
    compiles_for_cuda("qwen3_moe", "q4", Precision::Packed);
}

/// Packed dense layers through the CUDA kernel (its PTX linked as an external variant):
/// 4-bit with bf16 scales (matrices of 32 rows held one value a byte, read as 8-bit), the
/// gated MLP in one dispatch, the residual adds inside, the embedding rows; and 8-bit with
/// f16 scales, its q, k and v stacked into one matrix. Prompt chunks too (each group of 4 rows of x reads the matrix again, from
/// the cache: IREE's contraction of the graph form prefilled 5x slower than f16 on the H200).
#[test]
fn llama_packed_compiles_for_cuda_through_the_kernel() {
    let mlir = compiles_for_cuda("llama_llama3_tied", "q4", Precision::Packed);
    // The products that read an RMSNorm's output take its input instead (`n`: the norm in
    // the kernel); a prompt's head reads the gathered last rows, so plain `qmv` stays.
    let want = ["glun4_bf16", "qmv4_bf16", "qmvn4_bf16", "qmvn8_bf16", "qmvr4_bf16", "rows4_bf16"];
    assert_eq!(cuda_exports(&mlir), want.map(|n| format!("mlx_iree_cuda_{n}")), "4-bit");
    // Every function (decode steps and prompt chunks) dispatches the kernel; the graph
    // form's integer contraction is nowhere.
    let functions: Vec<&str> = mlir.split("func.func @").skip(1).collect();
    assert!(functions.iter().any(|f| f.starts_with("prefill_t16_")), "no prompt chunk");
    for f in &functions {
        let name = f.split('(').next().unwrap_or("");
        assert!(f.contains(&format!("@{}::@", kernels::cuda::EXECUTABLE)) || name.starts_with("write_kv"), "{name}");
    }
    assert!(!mlir.contains("xi16>"), "an i16 tensor: the graph form's quantized x");
    let q8 = compiles_for_cuda("llama_llama3_tied", "q8", Precision::Packed);
    let want = ["glun8_f16", "qmv8_f16", "qmvn8_f16", "qmvr8_f16", "rows8_f16"];
    assert_eq!(cuda_exports(&q8), want.map(|n| format!("mlx_iree_cuda_{n}")), "8-bit");
    // q, k and v (alike at 8 bits) stacked into one matrix: one dispatch for the three.
    assert!(q8.contains("model.layers.0.self_attn.qkv_proj.weight"), "q/k/v not stacked");
    assert!(!q8.contains("model.layers.0.self_attn.q_proj.weight"), "q_proj beside the stacked matrix");
}

/// The shared expert and its sigmoid gate.
#[test]
fn qwen2_moe_bf16_compiles_for_cuda() {
    compiles_for_cuda("qwen2_moe", "f32", Precision::BF16);
}

/// Phi-3's fused projections read as parts, partial rotary (a slice and a concatenation),
/// the longrope tables.
#[test]
fn phi3_packed_compiles_for_cuda() {
    compiles_for_cuda("phi3", "q4", Precision::Packed);
}

/// bf16 matrices as 16-bit patterns widened by a shift, on Metal (no bf16 arithmetic there).
#[test]
fn qwen2_bf16_compiles_for_metal() {
    compiles_for("qwen2", "f32", Precision::BF16, CompileTarget::Metal);
}

/// 4-bit weights one value a byte with bf16 scales as f32, dequantized before a float
/// contraction (IREE 3.13 lowers no `i4` vectors to SPIR-V).
#[test]
fn qwen2_packed_compiles_for_metal() {
    compiles_for("qwen2", "q4", Precision::Packed, CompileTarget::Metal);
}

/// Packed experts gathered and dequantized, an 8-bit router, on Metal.
#[test]
fn qwen3_moe_packed_compiles_for_metal() {
    compiles_for("qwen3_moe", "q4", Precision::Packed, CompileTarget::Metal);
}

/// An 8-bit KV cache (`--kv-cache q8`) in the graph form: the blocks' scales taken apart
/// into bytes and put together again with shifts, i8 buffers, for CUDA and SPIR-V (Vulkan).
#[test]
fn q8_kv_cache_compiles_for_cuda_and_vulkan() {
    for target in [CompileTarget::Cuda("sm_80".into()), CompileTarget::Vulkan] {
        let mlir = compiles_with("llama_llama3_tied", "q4", Precision::Packed, target.clone(), KvElem::Q8);
        assert!(mlir.contains("tensor<2x2x64x2x20xi8>"), "{target}: no i8 cache of 16-value rows (20 bytes)");
    }
}

/// mxfp8 held as stored in the graph form (E4M3 codes and E8M0 scale bytes as i8, widened to
/// f32 by integer operations and a bitcast where they are used) on CUDA and SPIR-V.
#[test]
fn mxfp8_packed_compiles_for_cuda_and_vulkan() {
    for target in [CompileTarget::Cuda("sm_80".into()), CompileTarget::Vulkan] {
        let mlir = compiles_for("llama_llama3_tied", "mxfp8", Precision::Packed, target.clone());
        assert!(mlir.contains("tensor<64x128xi8>"), "{target}: down_proj's codes not held as bytes");
        assert!(mlir.contains("tensor<64x4xi8>"), "{target}: down_proj's scales not held as bytes");
    }
}
