//! How the kernel objects are compiled: the flags every object gets and each instruction
//! set's own. `build.rs` builds the objects with them (it includes this file as a module),
//! and a test that builds an object itself (the aarch64 one, cross-compiled with clang and
//! run under qemu on x86-64 hosts; the AMX one with its tiles emulated) uses the same.

/// Every object: optimized, position-independent and freestanding (IREE links the object
/// into its executables, which have no libc), so no stack protector and no unwind tables.
/// `build.rs` fails on any undefined symbol. No multiply-add contracted unless the source
/// writes it (GCC's default contracts across statements, differently per target): the
/// objects' float results are the same bits because each rounding is written out (the
/// matvec objects compiled to the same code either way).
pub const COMMON: [&str; 6] =
    ["-O3", "-fPIC", "-ffreestanding", "-fno-stack-protector", "-fno-asynchronous-unwind-tables", "-ffp-contract=off"];

/// What GCC needs besides: no calls to memset or memcpy for loops, which it emits even when
/// freestanding. Clang emits none when freestanding and refuses the flag.
pub const GCC: [&str; 1] = ["-fno-tree-loop-distribute-patterns"];

/// `cpu/qmv_x86_64.c`: AVX-512 F, BW and VNNI (with FMA and F16C).
pub const AVX512: [&str; 5] = ["-mavx512f", "-mavx512bw", "-mavx512vnni", "-mfma", "-mf16c"];

/// `cpu/qmv_x86_64_avx2.c`: AVX2, FMA and F16C.
pub const AVX2: [&str; 3] = ["-mavx2", "-mfma", "-mf16c"];

/// `cpu/qmv_x86_64_amx.c`: what it needs beyond [`AVX512`] (it runs that arithmetic for
/// panels of few rows).
pub const AMX: [&str; 4] = ["-mavx512vbmi", "-mavx512vl", "-mamx-tile", "-mamx-int8"];

/// `cpu/qmv_x86_64_amx.c` for its test on hosts without AMX (tests/tests/kernels_amx.rs):
/// [`AMX`]'s AVX-512 VBMI and VL, and the tile instructions emulated in plain C instead of
/// the AMX flags. Never for IREE's executables: the emulated tiles are one static set.
#[allow(dead_code)] // build.rs, which includes this file, does not build it
pub const AMX_EMULATED: [&str; 3] = ["-mavx512vbmi", "-mavx512vl", "-DMLX_IREE_AMX_EMULATE"];

/// `cpu/qmv_aarch64.c`: ARMv8.2-A with the dot-product extension (`sdot`, `udot`).
pub const NEON_DOT: [&str; 1] = ["-march=armv8.2-a+dotprod"];

/// The aarch64 object as an ELF object whatever the host (IREE's embedded-ELF executables
/// link ELF objects on every OS): clang's target for building it off aarch64 Linux.
pub const AARCH64_ELF_TARGET: &str = "--target=aarch64-unknown-linux-gnu";

/// `cuda/qmv.cu` to PTX by clang, with no CUDA toolkit (`device.h` declares what it uses):
/// device code only, for `sm_80` (what IREE's `cuda` target compiles for here, and what later
/// GPUs JIT-compile), PTX ISA 7.0 (clang 14 picks an older one that lacks the warp shuffles
/// with a mask), and the matvec's own rounding (`-ffp-contract=off`, as [`COMMON`]).
pub const CUDA_PTX: [&str; 13] = [
    "-x",
    "cuda",
    "--cuda-device-only",
    "-nocudainc",
    "-nocudalib",
    "--cuda-gpu-arch=sm_80",
    "-Xclang",
    "-target-feature",
    "-Xclang",
    "+ptx70",
    "-O3",
    "-ffp-contract=off",
    "-S",
];
