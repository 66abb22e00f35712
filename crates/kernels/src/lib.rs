//! Hand-written kernels that IREE links into the executables it compiles, for the one
//! operation its code generation does slowly: the matrix-vector product with MLX-packed
//! 4- and 8-bit weights (docs/PERFORMANCE.md). Each kernel has a graph-level fallback in
//! `models`, which every other target (CUDA, Vulkan, Metal, CPUs without AVX-512) uses.
//!
//! This crate owns the three things that must agree: the C source (`cpu/qmv_x86_64.c`), the
//! MLIR that declares its entry points to IREE ([`cpu::executable_source`]) and the weight
//! layouts it reads ([`cpu::repack_weight`], [`cpu::repack_groups`]).

pub mod cpu;
