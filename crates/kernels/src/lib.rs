//! Hand-written kernels that IREE links into the executables it compiles, for the
//! operations its code generation does slowly: the matrix-vector product with MLX-packed
//! 4- and 8-bit weights (docs/PERFORMANCE.md) and, on CPUs, also with f16 or bf16 weights,
//! decode attention over the KV cache, and the gated delta rule's step (Qwen3.5's linear
//! attention), which updates a recurrent state where it lies ([`cpu::delta_model`]). Each
//! kernel has a graph-level fallback in `models`, which every other target (Vulkan, Metal,
//! x86-64 CPUs without AVX2, aarch64 CPUs without the dot-product extension, other
//! architectures) uses.
//!
//! This crate owns the three things that must agree: the C sources (`cpu/qmv_x86_64_amx.c`
//! for AMX, `cpu/qmv_x86_64.c` for AVX-512 VNNI, `cpu/qmv_x86_64_avx2.c` for AVX2,
//! `cpu/qmv_aarch64.c` for aarch64 NEON with the dot-product extension; one layout, one set
//! of entry points, the same bits; compiled with [`cflags`]), the MLIR that declares its
//! entry points to IREE ([`cpu::executable_source`]) and the weight layouts it reads
//! ([`cpu::repack_weight`], [`cpu::repack_groups`]). The same for CUDA ([`cuda`]): the CUDA
//! C source `cuda/qmv.cu` (PTX by clang), its MLIR declaration
//! ([`cuda::executable_source`]), and the graph-level layout it reads as it is.

pub mod cflags;
pub mod cpu;
pub mod cuda;

/// The pipeline layout of a kernel export: `constants` 32-bit push constants and `bindings`
/// storage buffers, the last `written` of them written (the result; for `cpu`'s delta rule
/// also the state it updates where it lies), the others read only. Every binding is
/// `Indirect`: IREE then records a call's buffers (the activations, the results) as slots of
/// the command buffer's binding table and keeps constant buffers (the weights) direct, so a
/// function's command buffer is recorded once and replayed each call. A direct binding of a
/// per-call buffer makes the whole command buffer one-shot, re-recorded by the VM on every
/// call, one VM call per dispatch (IREE 3.13, StreamToHAL; docs/PERFORMANCE.md).
pub(crate) fn pipeline_layout(constants: usize, bindings: usize, written: usize) -> String {
    let read = bindings.saturating_sub(written);
    let mut list = vec![r#"#hal.pipeline.binding<storage_buffer, "ReadOnly|Indirect">"#; read];
    list.extend(vec!["#hal.pipeline.binding<storage_buffer, Indirect>"; bindings - read]);
    format!("#hal.pipeline.layout<constants = {constants}, bindings = [{}]>", list.join(", "))
}
