//! The CPU kernels: fused dequant + matvec (`qmv`) and packed-row lookup (`qrows`), for
//! 4- and 8-bit weights with f16 or f32 scales, decode attention over the KV cache (`attn`,
//! `cpu/attn.h`) and the gated delta rule's step over a recurrent state, updated where it
//! lies (`delta`, `cpu/delta.h`), built once per instruction set ([`Isa`]):
//! `cpu/qmv_x86_64_amx.c` (AMX-INT8), `cpu/qmv_x86_64.c` (AVX-512 VNNI),
//! `cpu/qmv_x86_64_avx2.c` (AVX2) and `cpu/qmv_aarch64.c` (aarch64 NEON with the
//! dot-product extension), with the same entry points, layouts and numerics (their results
//! are bit-identical), so only the object differs. A build has the objects of its own
//! architecture.
//!
//! Invariants shared with the C sources: 16-row blocks; 32-byte tiles of 16 rows x 4 k
//! (4-bit; byte `2r + p` holds `k0 + p` low, `k0 + 2 + p` high) or 16 rows x 2 k (8-bit;
//! byte `2r + p` holds `k0 + p`); scales and biases `[O/16][G][16]`; group sizes of 16 to
//! 128; the four push constants are `T, K, O, group_size`; bindings are (input, weight,
//! scales, biases, output); a matvec workgroup computes at most 4 blocks. Attention's
//! bindings, constants and numerics are in `cpu/attn.h`, over an f32, f16 or 8-bit KV cache
//! ([`CacheElem`]; the 8-bit rows' format is [`q8_encode`]'s); [`attention_model`] is its
//! arithmetic in Rust.
//!
//! The delta rule ([`DELTA_EXPORT`], `cpu/delta.h`; Qwen3.5 / Qwen3-Next linear attention,
//! mlx-lm's `_gated_delta_step_ops`): for each of n sequences of m rows (a prompt chunk, or
//! m = 1 for decode) and each of H heads, the state `[dv, dk]` of the sequence's slot goes
//! through its real rows in order, each row `s = s * g; delta = (v - s . k) * beta;
//! s = s + k * delta; y = s . q` per state row, and is written back where it lies. Bindings
//! q, k `[n * m, H, dk]`, v `[n * m, H, dv]`, g, beta `[n * m, H]` (f32), positions
//! `[n * m]`, slots `[n]`, last `[1]` (i32: the index of each sequence's last real row), the
//! state `[S, H * dv * dk]` (read and written: the export's second written binding) and y
//! `[n * m, H * dv]` (f32); push constants n, m, H, dk, dv, S ([`DELTA_CONSTANTS`]); units
//! are (sequence, head) pairs, one a workgroup. A sequence at position 0 starts from zeros;
//! padding rows (past `last`) give 0 and leave the state alone; a sequence repeating an
//! earlier one's slot (decode's padding) computes nothing, the earlier one writes its y.
//! [`delta_model`] is its arithmetic in Rust, with the numerics in `cpu/delta.h`.

use sha2::{Digest, Sha256};
use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

/// Rows computed together (one AVX-512 register of f32, two AVX2 registers, four NEON ones).
pub const BLOCK_ROWS: usize = 16;
/// Row blocks per workgroup of a matvec dispatch.
pub const BLOCKS_PER_WORKGROUP: usize = 4;
/// Name of the `hal.executable.source` holding every entry point.
pub const EXECUTABLE: &str = "mlx_iree_kernels";

/// An instruction set the kernels are built for; one object each.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Isa {
    /// AMX-INT8 tiles (`tdpbuud`) for 4 rows of x or more, the AVX-512 VNNI arithmetic below
    /// that (it also needs AVX-512 VBMI and VL): Intel Xeon since Sapphire Rapids. The process
    /// must be granted the tile state (Linux `arch_prctl`), which [`Isa::host_has`] asks for.
    Amx,
    /// AVX-512 F, BW and VNNI (`vpdpwssd`): Intel since Cascade Lake (Xeon) or Ice Lake, AMD
    /// since Zen 4.
    Avx512Vnni,
    /// AVX2, FMA and F16C (`vpmaddwd` + `vpaddd`): x86-64 CPUs since Haswell and Zen 1.
    Avx2,
    /// aarch64 NEON with the dot-product extension (`sdot` + `udot`, ARMv8.2-A+dotprod):
    /// Apple M1 and later, AWS Graviton 2 and later, Ampere Altra, Arm Cortex-A76 and
    /// Neoverse N1 and later.
    NeonDot,
}

impl Isa {
    /// Every instruction set, fastest first (among those of one architecture).
    pub const ALL: [Isa; 4] = [Isa::Amx, Isa::Avx512Vnni, Isa::Avx2, Isa::NeonDot];

    /// The short name (`amx`, `avx512`, `avx2`, `neondot`), as the binary's
    /// `MLX_IREE_PACKED_KERNELS` spells it and as the installed object's file name carries it.
    pub fn name(self) -> &'static str {
        match self {
            Isa::Amx => "amx",
            Isa::Avx512Vnni => "avx512",
            Isa::Avx2 => "avx2",
            Isa::NeonDot => "neondot",
        }
    }

    /// The architecture the object is for (`x86_64`, `aarch64`), as Rust's
    /// `std::env::consts::ARCH` spells it.
    pub fn arch(self) -> &'static str {
        match self {
            Isa::Amx | Isa::Avx512Vnni | Isa::Avx2 => "x86_64",
            Isa::NeonDot => "aarch64",
        }
    }

    /// Whether this machine's CPU has the instructions the object uses (for AMX: and this
    /// process may use them; the first call asks Linux for the tile state).
    pub fn host_has(self) -> bool {
        #[cfg(target_arch = "x86_64")]
        {
            use std::arch::is_x86_feature_detected as has;
            // F16C and FMA come with every AVX-512 CPU, but the object is built with them.
            let base = has!("avx2") && has!("fma") && has!("f16c");
            let avx512 = base && has!("avx512f") && has!("avx512bw") && has!("avx512vnni");
            match self {
                Isa::Amx => avx512 && has!("avx512vbmi") && has!("avx512vl") && amx_granted(),
                Isa::Avx512Vnni => avx512,
                Isa::Avx2 => base,
                Isa::NeonDot => false,
            }
        }
        #[cfg(target_arch = "aarch64")]
        {
            // NEON and the f16 conversions are part of every aarch64 CPU.
            self == Isa::NeonDot && std::arch::is_aarch64_feature_detected!("dotprod")
        }
        #[cfg(not(any(target_arch = "x86_64", target_arch = "aarch64")))]
        {
            false
        }
    }

    /// Whether the kernels for this instruction set run here: this build has its object and
    /// the CPU has its instructions.
    pub fn runs_on_host(self) -> bool {
        object(self).is_some() && self.host_has()
    }
}

/// Whether the CPU has AMX-INT8 tiles and Linux lets this process use them. Tile data is
/// state the kernel hands out only on request (`arch_prctl(ARCH_REQ_XCOMP_PERM,
/// XFEATURE_XTILEDATA)`, for every thread of the process, before any tile instruction); the
/// kernel object is freestanding, so the host asks, once, and remembers the answer.
#[cfg(target_arch = "x86_64")]
fn amx_granted() -> bool {
    static GRANTED: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *GRANTED.get_or_init(|| {
        // CPUID leaf 7: EDX bit 24 AMX-TILE, bit 25 AMX-INT8.
        let leaf7 = std::arch::x86_64::__cpuid_count(7, 0);
        if ((leaf7.edx >> 24) & 3) != 3 {
            return false;
        }
        request_tile_data()
    })
}

/// Asks Linux for the AMX tile data state; false when refused (an older kernel, a too small
/// signal stack in some thread).
#[cfg(all(target_arch = "x86_64", target_os = "linux"))]
fn request_tile_data() -> bool {
    const ARCH_REQ_XCOMP_PERM: libc::c_long = 0x1023;
    const XFEATURE_XTILEDATA: libc::c_long = 18;
    // SAFETY: arch_prctl(ARCH_REQ_XCOMP_PERM, feature) takes two integers and touches no memory
    // of ours; asking again once granted succeeds and changes nothing.
    unsafe { libc::syscall(libc::SYS_arch_prctl, ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA) == 0 }
}

/// Other systems: not asked for, so not used.
#[cfg(all(target_arch = "x86_64", not(target_os = "linux")))]
fn request_tile_data() -> bool {
    false
}

impl std::fmt::Display for Isa {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// A name that is not an [`Isa`]'s.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown instruction set `{0}` (expected amx, avx512, avx2 or neondot)")]
pub struct UnknownIsa(pub String);

impl std::str::FromStr for Isa {
    type Err = UnknownIsa;

    fn from_str(s: &str) -> Result<Isa, UnknownIsa> {
        Isa::ALL.into_iter().find(|i| i.name() == s).ok_or_else(|| UnknownIsa(s.to_owned()))
    }
}

#[cfg(kernels_cpu_object)]
const OBJECTS: [Option<&[u8]>; 2] = [
    Some(include_bytes!(concat!(env!("OUT_DIR"), "/qmv_x86_64.o"))),
    Some(include_bytes!(concat!(env!("OUT_DIR"), "/qmv_x86_64_avx2.o"))),
];
#[cfg(not(kernels_cpu_object))]
const OBJECTS: [Option<&[u8]>; 2] = [None, None];
// Built only by compilers that know AMX (build.rs).
#[cfg(kernels_cpu_amx_object)]
const AMX_OBJECT: Option<&[u8]> = Some(include_bytes!(concat!(env!("OUT_DIR"), "/qmv_x86_64_amx.o")));
#[cfg(not(kernels_cpu_amx_object))]
const AMX_OBJECT: Option<&[u8]> = None;
// Built on aarch64 (build.rs).
#[cfg(kernels_cpu_neon_object)]
const NEON_OBJECT: Option<&[u8]> = Some(include_bytes!(concat!(env!("OUT_DIR"), "/qmv_aarch64.o")));
#[cfg(not(kernels_cpu_neon_object))]
const NEON_OBJECT: Option<&[u8]> = None;

/// The compiled object for `isa`, when this build has one (its architecture, with a C
/// compiler; for AMX, one that knows it).
pub fn object(isa: Isa) -> Option<&'static [u8]> {
    match isa {
        Isa::Amx => AMX_OBJECT,
        Isa::Avx512Vnni => OBJECTS[0],
        Isa::Avx2 => OBJECTS[1],
        Isa::NeonDot => NEON_OBJECT,
    }
}

/// Every instruction set whose kernels run on this machine, fastest first.
pub fn host_isas() -> impl Iterator<Item = Isa> {
    Isa::ALL.into_iter().filter(|isa| isa.runs_on_host())
}

/// The fastest instruction set whose kernels run on this machine, if any.
pub fn host_isa() -> Option<Isa> {
    host_isas().next()
}

/// Writes the object for `isa` into `dir` under a name carrying the instruction set and its
/// content hash (so compiled modules that name it are keyed by the kernel's version) and
/// returns its canonical path (the module text names it, so two spellings of one cache
/// folder, `a/../cache` and `cache`, must not make two compiles of one module); `None` when
/// this build has no object. Idempotent.
pub fn install(dir: &Path, isa: Isa) -> std::io::Result<Option<PathBuf>> {
    let Some(bytes) = object(isa) else { return Ok(None) };
    let hash: String = Sha256::digest(bytes).iter().take(8).map(|b| format!("{b:02x}")).collect();
    let name = format!("qmv_{}_{isa}-{hash}.o", isa.arch());
    let path = dir.join(&name);
    if !path.exists() {
        // A temporary name of this call's own: two threads of one process installing at
        // once must not rename one file twice (the second rename failed, NotFound).
        static CALLS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
        let call = CALLS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        std::fs::create_dir_all(dir)?;
        let tmp = dir.join(format!(".{name}.{}.{call}", std::process::id()));
        std::fs::write(&tmp, bytes)?;
        std::fs::rename(&tmp, &path)?;
    }
    Ok(Some(std::fs::canonicalize(&path)?))
}

/// What an entry point computes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Op {
    /// `y[T, O] = x[T, K] . W^T` (f32 in, f32 out).
    Matvec,
    /// `y[T, O] = x[T, K] . W^T + r[T, O]`: the matvec with a residual connection after it,
    /// the same f32 add as the graph's (one dispatch fewer).
    MatvecAdd,
    /// `out[T, K] = W[ids[t], :]` dequantized (i32 ids in).
    Rows,
    /// `y[N, O] = x[N, K] . W[ids[n]]^T` over stacked experts `W[E, O, K]` (x and i32 ids
    /// in): a mixture-of-experts step, one row per (row, choice). Its constants are
    /// [`Op::EXPERTS_CONSTANTS`]; units are row blocks of pairs or of experts (`by_expert`).
    Experts,
}

impl Op {
    pub const ALL: [Op; 4] = [Op::Matvec, Op::MatvecAdd, Op::Rows, Op::Experts];
    /// Push constants of [`Op::Experts`]: N, K, O, group size, experts, by_expert (0 or 1).
    pub const EXPERTS_CONSTANTS: usize = 6;
}

/// Element type of the scales and biases in the kernel layout.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Scale {
    F16,
    F32,
    /// mxfp4's own scale bytes (E8M0, a power of two 2^(e - 127)), FP4 entries only: read
    /// as `s / 2` = 2^(e - 128), exactly (`cpu/qmv.h`), one byte a group.
    E8m0,
}

impl Scale {
    fn name(self) -> &'static str {
        match self {
            Scale::F16 => "f16",
            Scale::F32 => "f32",
            Scale::E8m0 => "e8m0",
        }
    }

    /// The memref element the C side reads (f16 travels as its bits, E8M0 as its byte).
    fn memref(self) -> &'static str {
        match self {
            Scale::F16 => "i16",
            Scale::F32 => "f32",
            Scale::E8m0 => "i8",
        }
    }

    /// An E8M0 scale byte as the kernels read it: `s / 2` = 2^(e - 128), computed as they
    /// compute it (the f32 with the bits (e + 64) << 23, times 2^-65).
    pub fn e8m0_half(e: u8) -> f32 {
        f32::from_bits((u32::from(e) + 64) << 23) * 2f32.powi(-65)
    }
}

/// The export name of an affine entry point, e.g. `qmv4_f16` ([`Entry::export`] names
/// every entry).
pub fn export(op: Op, bits: u32, scale: Scale) -> String {
    Entry { op, bits, scale, fp4: false, x8: false }.export()
}

/// Workgroups per unit of the dispatch's workload (row blocks for a matvec, rows for a
/// lookup).
pub fn units_per_workgroup(op: Op) -> usize {
    match op {
        Op::Matvec | Op::MatvecAdd | Op::Experts => BLOCKS_PER_WORKGROUP,
        Op::Rows => 1,
    }
}

/// The widths the kernels read as MLX stores them.
pub const BITS: [u32; 4] = [3, 4, 6, 8];

/// Whether the kernels take a matrix of this shape: whole 16-row blocks, whole tiles and
/// group sizes that are multiples of 16. 3 bits take MLX's affine group sizes, 32, 64 and
/// 128, only: their units hold 32 k, and the AMX object splits a group of 128 into two
/// chunks of 64.
pub fn supports(bits: u32, out: usize, inp: usize, group_size: usize) -> bool {
    BITS.contains(&bits)
        && out.is_multiple_of(BLOCK_ROWS)
        && group_size > 0
        && group_size <= 128
        && group_size.is_multiple_of(16)
        && (bits != 3 || group_size.is_power_of_two() && group_size >= 32)
        && inp.is_multiple_of(group_size)
}

/// MLX's packed weight (each row `in * bits / 8` bytes, value k at bit `k * bits` of the
/// row read as one little-endian number: 3 and 6 bits straddle bytes and words) in the
/// kernel layout (`cpu/qmv.h`): per 16-row block, 4-bit tiles of 16 rows x 4 k, 8-bit tiles
/// of 16 x 2, 3-bit units of 16 x 32 (three planes of 16-bit words, each word lane's 16
/// values one 48-bit stream) and 6-bit units of 16 x 8 split into planes of the 8-bit tiles'
/// low nibbles and their top bits. `bits` is one of [`BITS`] and the shape passes
/// [`supports`]; the result has MLX's byte count.
pub fn repack_weight(bits: u32, out: usize, inp: usize, mlx: &[u8]) -> Vec<u8> {
    let width = bits as usize;
    let row_bytes = inp * width / 8;
    debug_assert_eq!(mlx.len(), out * row_bytes);
    let q = |r: usize, k: usize| -> u8 {
        let (bit, row) = (k * width, &mlx[r * row_bytes..][..row_bytes]);
        let pair = u16::from(row[bit / 8]) | u16::from(row.get(bit / 8 + 1).copied().unwrap_or(0)) << 8;
        ((pair >> (bit % 8)) & ((1 << width) - 1)) as u8
    };
    let mut packed = Vec::with_capacity(mlx.len());
    // k per unit of 32 * bits bytes (a tile, or a 6-bit unit of 96 bytes) or, for 3 bits,
    // of 6 * 32 bytes.
    let unit_k = match bits {
        3 => 32,
        4 => 4,
        8 => 2,
        _ => 8,
    };
    for rb in 0..out / BLOCK_ROWS {
        for k0 in (0..inp).step_by(unit_k) {
            // Lane L = 2r + p of the unit: row r, and the k of the unit it holds, k0 + p + 2s
            // (s in 0..4 for 6 bits, 0..16 for 3), the same as the 4-bit tiles' lanes.
            let value = |lane: usize, s: usize| q(rb * BLOCK_ROWS + lane / 2, k0 + lane % 2 + 2 * s);
            match bits {
                4 => packed.extend((0..32).map(|l| value(l, 0) | value(l, 1) << 4)),
                8 => packed.extend((0..32).map(|l| value(l, 0))),
                3 => {
                    // Lane l's 16 values as one 48-bit stream, value s at bits 3s..3s+3,
                    // stored as three planes of 32 little-endian words (bits 0-15, 16-31, 32-47).
                    let stream = |l: usize| (0..16).fold(0u64, |st, s| st | u64::from(value(l, s)) << (3 * s));
                    for plane in 0..3 {
                        packed.extend((0..32).flat_map(|l| ((stream(l) >> (16 * plane)) as u16).to_le_bytes()));
                    }
                }
                _ => {
                    let low = |l: usize, s: usize| value(l, s) & 0xF;
                    packed.extend((0..32).map(|l| low(l, 0) | low(l, 1) << 4));
                    packed.extend((0..32).map(|l| low(l, 2) | low(l, 3) << 4));
                    packed.extend((0..32).map(|l| (0..4).fold(0, |c, s| c | (value(l, s) >> 4) << (2 * s))));
                }
            }
        }
    }
    debug_assert_eq!(packed.len(), mlx.len());
    packed
}

/// Per-group values `[out, groups]` (scales or biases, any element) as `[out/16][groups][16]`.
pub fn repack_groups<T: Copy>(values: &[T], out: usize, groups: usize) -> Vec<T> {
    blocks_of_columns(values, out, groups)
}

/// A row-major `[out, cols]` matrix as `[out / 16][cols][16]`: each 16-row block's column c
/// contiguous, the layout every kernel reads its per-row values in.
fn blocks_of_columns<T: Copy>(values: &[T], out: usize, cols: usize) -> Vec<T> {
    debug_assert_eq!(values.len(), out * cols);
    let mut packed = Vec::with_capacity(values.len());
    for rb in 0..out / BLOCK_ROWS {
        for c in 0..cols {
            packed.extend((0..BLOCK_ROWS).map(|r| values[(rb * BLOCK_ROWS + r) * cols + c]));
        }
    }
    packed
}

/// An entry point: what it computes, for which packing.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Entry {
    pub op: Op,
    /// One of [`BITS`] (4 with `fp4`).
    pub bits: u32,
    pub scale: Scale,
    /// The 4-bit values are E2M1 codes (MLX's mxfp4 and nvfp4), read through `cpu/qmv.h`'s
    /// table as `2v + 12` against scales of `s / 2`, with no biases binding:
    /// the bias, `-12 * scale`, is computed. The exact 8-bit affine copy's values, at half
    /// its bytes and with its results' bits.
    pub fp4: bool,
    /// Products only ([`Op::Matvec`], [`Op::MatvecAdd`]): each group of x is quantized to 8
    /// bits (127 levels) instead of 16, llama.cpp's int8 activations: AVX-512 VNNI multiplies
    /// 4-bit and 8-bit tiles by x's bytes (`vpdpbusd`, twice the i16 products' k per
    /// instruction). The dots are exact either way, so every object computes the same bits;
    /// what changes is x's rounding (`Activations::I8` in `models`).
    pub x8: bool,
}

impl Entry {
    /// The export name, e.g. `qmv4_f16`, `qmvfp4_f16`, `qmvr8_f32_x8`.
    pub fn export(&self) -> String {
        let op = match self.op {
            Op::Matvec => "qmv",
            Op::MatvecAdd => "qmvr",
            Op::Rows => "qrows",
            Op::Experts => "qmve",
        };
        let values = if self.fp4 { "fp4".to_owned() } else { self.bits.to_string() };
        let x8 = if self.x8 { "_x8" } else { "" };
        format!("{op}{values}_{}{x8}", self.scale.name())
    }
}

/// What an entry point over a dense matrix (f16, bf16, or mxfp8's FP8 codes and scales) in
/// the blocks of [`repack_dense`] computes (`cpu/hmv.h`); x, y and the lookup's rows are f32. Push constants T, K, O; units
/// are row blocks ([`BLOCKS_PER_WORKGROUP`] a workgroup) for the products, rows (one a
/// workgroup) for the lookup.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum DenseOp {
    /// `y[T, O] = x[T, K] . W^T`.
    Matvec,
    /// The same plus a residual `r[T, O]`, the graph's f32 add after the product.
    MatvecAdd,
    /// `out[T, K] = W[ids[t], :]` (i32 ids in): an embedding lookup.
    Rows,
}

/// The element type of a dense matrix the kernels take: f16 and bf16 travel as their 16
/// bits, mxfp8 as its bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum DenseElem {
    F16,
    BF16,
    /// MLX's mxfp8: FP8 E4M3 codes with an E8M0 scale byte `e` (2^(e - 127)) per
    /// [`MXFP8_GROUP`] inputs, the scales in [`repack_groups`]' blocks (`[out / 16][in /
    /// 32][16]`, a binding after the weight's). Each weight is MLX's dequantized value
    /// ([`mxfp8_value`]), so the products' arithmetic is the f16 one's. Scales outside
    /// [`MXFP8_MIN_SCALE`]..=[`MXFP8_MAX_SCALE`] and E4M3's NaN are not taken
    /// ([`mxfp8_check`]).
    Mxfp8,
}

/// Inputs per scale of mxfp8 (MLX allows no other group size for it).
pub const MXFP8_GROUP: usize = 32;
/// The largest E8M0 scale byte the mxfp8 products take: the kernels multiply each code's
/// value times 2^-8 by 2^(e - 119), an f32 only up to e = 246 (2^127); a larger scale
/// (2^120 and up) turns every code of magnitude 2 or more into infinity anyway.
pub const MXFP8_MAX_SCALE: u8 = 246;
/// The smallest E8M0 scale byte the mxfp8 products take for a group with a nonzero code:
/// from it up every weight is zero or a normal f32 (the smallest code, 2^-9, times 2^-117
/// is 2^-126). Below it a weight could be subnormal, which IREE's CPU workers flush to zero
/// (they run with x86's FTZ and DAZ set) where the Rust model and the aarch64 object under
/// test would not. MLX writes such a scale only for a group of zeros, which the products
/// take whatever its scale.
pub const MXFP8_MIN_SCALE: u8 = 10;

/// One mxfp8 weight as the kernels compute it: the FP8 E4M3 `code`'s value times 2^-8 (its
/// bits made an f16's, exact) times 2^(`e` - 119), which is MLX's `e4m3(code) * 2^(e -
/// 127)` exactly (a normal f32 for the scales [`mxfp8_check`] takes). The codes 0x7F and
/// 0xFF (E4M3's NaN) are not taken (they read as 480 and -480).
pub fn mxfp8_value(code: u8, e: u8) -> f32 {
    let bits = ((code as i8 as i16 as u16) << 7) & 0xBF80;
    half::f16::from_bits(bits).to_f32() * f32::from_bits((u32::from(e) + 8) << 23)
}

/// Whether the mxfp8 products take a matrix's codes (row-major `[out, inp]`) and scale bytes
/// (`[out, inp / 32]`): no NaN code (0x7F, 0xFF), no scale above [`MXFP8_MAX_SCALE`], none
/// below [`MXFP8_MIN_SCALE`] but for a group of zeros. `Err` says what was found, and
/// where.
pub fn mxfp8_check(codes: &[u8], scales: &[u8], inp: usize) -> Result<(), String> {
    if let Some(i) = codes.iter().position(|&c| c & 0x7F == 0x7F) {
        return Err(format!("an E4M3 NaN code ({:#04x}) at row {}, input {}", codes[i], i / inp, i % inp));
    }
    let groups = inp / MXFP8_GROUP;
    for (g, &e) in scales.iter().enumerate() {
        let (row, k0) = (g / groups, g % groups * MXFP8_GROUP);
        let zeros = || codes[row * inp + k0..][..MXFP8_GROUP].iter().all(|&c| c & 0x7F == 0);
        if e > MXFP8_MAX_SCALE || (e < MXFP8_MIN_SCALE && !zeros()) {
            return Err(format!(
                "the E8M0 scale byte {e} (2^{}) at row {row}, inputs {k0}.. is outside the {MXFP8_MIN_SCALE}..={MXFP8_MAX_SCALE} the kernels take",
                i32::from(e) - 127
            ));
        }
    }
    Ok(())
}

/// An entry point over a dense matrix: what it computes, for which element type.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Dense {
    pub op: DenseOp,
    pub elem: DenseElem,
}

impl Dense {
    /// Every entry point.
    pub const ALL: [Dense; 9] = {
        const fn d(op: DenseOp, elem: DenseElem) -> Dense {
            Dense { op, elem }
        }
        [
            d(DenseOp::Matvec, DenseElem::F16),
            d(DenseOp::MatvecAdd, DenseElem::F16),
            d(DenseOp::Rows, DenseElem::F16),
            d(DenseOp::Matvec, DenseElem::BF16),
            d(DenseOp::MatvecAdd, DenseElem::BF16),
            d(DenseOp::Rows, DenseElem::BF16),
            d(DenseOp::Matvec, DenseElem::Mxfp8),
            d(DenseOp::MatvecAdd, DenseElem::Mxfp8),
            d(DenseOp::Rows, DenseElem::Mxfp8),
        ]
    };

    /// The export name, e.g. `hmv_f16`, `hmvr_bf16` or `hrows_f16`.
    pub fn export(self) -> String {
        let op = match self.op {
            DenseOp::Matvec => "hmv",
            DenseOp::MatvecAdd => "hmvr",
            DenseOp::Rows => "hrows",
        };
        let elem = match self.elem {
            DenseElem::F16 => "f16",
            DenseElem::BF16 => "bf16",
            DenseElem::Mxfp8 => "mxfp8",
        };
        format!("{op}_{elem}")
    }

    /// Workgroups per unit of the dispatch's workload.
    pub fn units_per_workgroup(self) -> usize {
        if self.op == DenseOp::Rows { 1 } else { BLOCKS_PER_WORKGROUP }
    }

    /// Push constants: T, K, O.
    pub const CONSTANTS: usize = 3;
}

/// Whether the dense product takes a matrix `[out, in]`: whole 16-row blocks.
pub fn supports_dense(out: usize, inp: usize) -> bool {
    out > 0 && out.is_multiple_of(BLOCK_ROWS) && inp > 0
}

/// Whether the mxfp8 product takes a matrix `[out, in]`: whole 16-row blocks and whole
/// groups of [`MXFP8_GROUP`] inputs.
pub fn supports_mxfp8(out: usize, inp: usize) -> bool {
    supports_dense(out, inp) && inp.is_multiple_of(MXFP8_GROUP)
}

/// A row-major `[out, in]` matrix (f16 or bf16 bits, or any element) as the dense product
/// reads it:
/// `[out / 16][in][16]`, block b's 16 values of column k contiguous. `out` passes
/// [`supports_dense`].
pub fn repack_dense<T: Copy>(values: &[T], out: usize, inp: usize) -> Vec<T> {
    blocks_of_columns(values, out, inp)
}

/// `cpu/hmv.h`'s arithmetic in Rust, for tests to hold the objects to, bit for bit: `x [t, k]`
/// times the row-major `w [o, k]` (f16 or bf16 values, which f32 holds exactly) transposed, each
/// output one chain of fused multiply-adds over k in order from 0, plus `r [t, o]` after it
/// when given.
pub fn dense_model(x: &[f32], t: usize, k: usize, o: usize, w: &[f32], r: Option<&[f32]>) -> Vec<f32> {
    let mut y = vec![0.0f32; t * o];
    for i in 0..t {
        for j in 0..o {
            let acc = (0..k).fold(0.0f32, |acc, c| w[j * k + c].mul_add(x[i * k + c], acc));
            y[i * o + j] = r.map_or(acc, |r| acc + r[i * o + j]);
        }
    }
    y
}

/// IREE's llvm-cpu executable target for objects of `arch` (an [`Isa::arch`]): a generic
/// one, so it matches any host CPU of that architecture.
fn executable_target(arch: &str) -> String {
    // IREE names aarch64 `arm_64` in its executable formats.
    let format = if arch == "aarch64" { "arm_64" } else { arch };
    format!(
        r#"#hal.executable.target<"llvm-cpu", "embedded-elf-{format}", {{target_triple = "{arch}-unknown-unknown-eabi-elf"}}>"#
    )
}

/// Decode attention over a KV cache of this element type (`cpu/attn.h`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum CacheElem {
    F32,
    F16,
    /// 8-bit rows in blocks of [`Q8_BLOCK`] values with an f32 scale each ([`q8_encode`]).
    Q8,
}

/// Values per block of an 8-bit cache row: one 16-lane chunk, so the kernel rounds a new
/// row's chunk through the format on its own.
pub const Q8_BLOCK: usize = 16;
/// Bytes of a block: its scale's 4 (f32, little-endian), then its 16 values (i8).
pub const Q8_BLOCK_BYTES: usize = 4 + Q8_BLOCK;

/// Bytes of an 8-bit cache row of `width` values (a multiple of [`Q8_BLOCK`]).
pub fn q8_row_bytes(width: usize) -> usize {
    width / Q8_BLOCK * Q8_BLOCK_BYTES
}

/// One block's scale and values as the 8-bit cache stores them, symmetric: `a` the largest
/// magnitude, `s = a / 127`, `q_i = round_ties_even(x_i * (127 / a))` (0 for an all-zero
/// block), so `|q_i| <= 127` and a value reads back as `q_i as f32 * s`. The graph form
/// (models' `write_kv`) and `cpu/attn.h` compute exactly these operations.
pub fn q8_block(x: &[f32]) -> (f32, [i8; Q8_BLOCK]) {
    assert_eq!(x.len(), Q8_BLOCK, "a q8 block has {Q8_BLOCK} values");
    let a = x.iter().fold(0f32, |m, v| m.max(v.abs()));
    let (inv, s) = if a > 0.0 { (127.0 / a, a / 127.0) } else { (0.0, 0.0) };
    let mut q = [0i8; Q8_BLOCK];
    for (qi, xi) in q.iter_mut().zip(x) {
        *qi = (xi * inv).round_ties_even() as i8;
    }
    (s, q)
}

/// Rows of values (`x.len()` a multiple of [`Q8_BLOCK`]) in the 8-bit cache's bytes: per
/// block, the scale's f32 bits little-endian, then the 16 values.
pub fn q8_encode(x: &[f32]) -> Vec<u8> {
    assert!(x.len().is_multiple_of(Q8_BLOCK), "q8 rows are whole blocks of {Q8_BLOCK}");
    let mut out = Vec::with_capacity(q8_row_bytes(x.len()));
    for block in x.chunks(Q8_BLOCK) {
        let (s, q) = q8_block(block);
        out.extend(s.to_le_bytes());
        out.extend(q.map(|v| v as u8));
    }
    out
}

/// The values an 8-bit cache's bytes hold (exact: each is `q as f32 * s`).
pub fn q8_decode(bytes: &[u8]) -> Vec<f32> {
    assert!(bytes.len().is_multiple_of(Q8_BLOCK_BYTES), "q8 rows are whole blocks of {Q8_BLOCK_BYTES} bytes");
    bytes
        .chunks(Q8_BLOCK_BYTES)
        .flat_map(|b| {
            let s = f32::from_le_bytes([b[0], b[1], b[2], b[3]]);
            b[4..].iter().map(move |&q| f32::from(q as i8) * s)
        })
        .collect()
}

/// `x` rounded through the 8-bit cache: what a later step reads back.
pub fn q8_round(x: &[f32]) -> Vec<f32> {
    q8_decode(&q8_encode(x))
}

/// Heads a query head shares its kv head with at most, and floats of per-head state a
/// workgroup keeps (`ATTN_MAX_G`, `ATTN_MAX_STATE` in `cpu/attn.h`).
const ATTN_MAX_G: usize = 16;
const ATTN_MAX_STATE: usize = 2048;

/// An attention entry point: the cache's element type and the kv heads (units) a workgroup
/// takes, `attention_units(..)` for the model.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Attention {
    pub cache: CacheElem,
    pub units: usize,
}

impl Attention {
    /// The export name, e.g. `attn_f16_u4`.
    pub fn export(&self) -> String {
        format!("attn_{}_u{}", self.cache_name(), self.units)
    }

    fn cache_name(&self) -> &'static str {
        match self.cache {
            CacheElem::F32 => "f32",
            CacheElem::F16 => "f16",
            CacheElem::Q8 => "q8",
        }
    }

    /// Push constants, in order: layer, slots, positions, kv heads, heads per kv head, head
    /// dim, window, sliding window (0: none), the scale's f32 bits, rows.
    pub const CONSTANTS: usize = 10;
}

/// Whether the attention kernel takes a model's heads: kv heads dividing the heads, at most
/// 16 query heads per kv head, a head dim of whole 16-lane chunks, one kv head's state in a
/// workgroup's stack.
pub fn supports_attention(heads: usize, kv_heads: usize, head_dim: usize) -> bool {
    kv_heads > 0
        && heads >= kv_heads
        && heads.is_multiple_of(kv_heads)
        && heads / kv_heads <= ATTN_MAX_G
        && head_dim > 0
        && head_dim.is_multiple_of(16)
        && heads / kv_heads * head_dim <= ATTN_MAX_STATE
}

/// The kv heads of one row an attention workgroup takes: the most that divide the kv heads,
/// fit its state and leave at least two workgroups per row (their rows of a position are
/// contiguous, so a workgroup reads the cache in longer runs; fewer units per row would leave
/// a core idle at one row per step).
pub fn attention_units(heads: usize, kv_heads: usize, head_dim: usize) -> usize {
    let per_head = heads / kv_heads * head_dim;
    (1..=(kv_heads / 2).max(1))
        .rev()
        .find(|d| kv_heads.is_multiple_of(*d) && d * per_head <= ATTN_MAX_STATE)
        .unwrap_or(1)
}

/// Rows of one sequence an attention workgroup takes together where it is given whole rows
/// (`ATTN_TILE_ROWS` in `cpu/attn.h`): a prompt chunk's rows read the same cache positions,
/// so each block of keys and values is read once for up to this many of them.
pub const ATTN_TILE_ROWS: usize = 8;

/// The units (kv heads of rows) an attention workgroup takes for a prompt chunk: whole rows,
/// [`ATTN_TILE_ROWS`] of them, which the kernel takes as tiles that share their cache reads.
/// Each row's result is the same bits as with [`attention_units`] (the same blocks in the
/// same order per row).
pub fn attention_tile_units(kv_heads: usize) -> usize {
    ATTN_TILE_ROWS * kv_heads
}

/// `cpu/attn.h`'s arithmetic in Rust, for tests to hold the objects to, bit for bit: every
/// row's attention output `[n, heads * head_dim]`. Arguments as the kernel's bindings and
/// constants, but in f32: `k_cache`, `v_cache` an f16 cache widened (exact) or an 8-bit one
/// decoded ([`q8_decode`], exact), and `k_new`, `v_new` rounded through the cache's type as
/// the kernel rounds them (an 8-bit cache's: [`q8_round`]).
#[allow(clippy::too_many_arguments)]
pub fn attention_model(
    q: &[f32],
    k_new: &[f32],
    v_new: &[f32],
    k_cache: &[f32],
    v_cache: &[f32],
    positions: &[i32],
    slots: &[i32],
    [layer, s, p, kv, g, hd, w, sliding]: [usize; 8],
    scale: f32,
) -> Vec<f32> {
    const BLOCK: usize = 16;
    let n = positions.len();
    let ghd = g * hd;
    let mut out = vec![0f32; n * kv * ghd];
    let dot = |a: &[f32], b: &[f32]| -> f32 {
        let mut lanes = [0f32; 16];
        for c in 0..hd / 16 {
            for i in 0..16 {
                lanes[i] = a[16 * c + i].mul_add(b[16 * c + i], lanes[i]);
            }
        }
        sum16(&lanes)
    };
    for r in 0..n {
        let slot = (slots[r] as u32 as usize).min(s - 1);
        let pos = i64::from(positions[r]);
        // The rows just before r with its slot (its sequence's earlier rows in this call):
        // the cache holds the positions before the first of them.
        let r0 = (0..r).rev().take_while(|&j| slots[j] == slots[r]).last().unwrap_or(r);
        let first = if r0 < r { i64::from(positions[r0]).min(pos) } else { pos };
        let hi = first.min(w as i64).min(p as i64);
        let lo = if sliding > 0 { (pos - sliding as i64 + 1).max(0) } else { 0 };
        // Of those rows, the ones at positions [lo, pos).
        let (mut ja, mut jb) = (r0, r0);
        for (j, &at) in positions.iter().enumerate().take(r).skip(r0) {
            if i64::from(at) < lo {
                ja = j + 1;
            }
            if i64::from(at) < pos {
                jb = j + 1;
            }
        }
        for kh in 0..kv {
            let kr = &k_new[(r * kv + kh) * hd..][..hd];
            let vr = &v_new[(r * kv + kh) * hd..][..hd];
            // The keys and values in the kernel's order: cache positions [lo, hi) in blocks,
            // then the call's rows [ja, jb) in blocks of their own.
            let cache_at = |j: i64| (((layer * s + slot) * p + j as usize) * kv + kh) * hd;
            let new_at = |j: usize| (j * kv + kh) * hd;
            let cached: Vec<(&[f32], &[f32])> =
                (lo..hi).map(|j| (&k_cache[cache_at(j)..][..hd], &v_cache[cache_at(j)..][..hd])).collect();
            let called: Vec<(&[f32], &[f32])> =
                (ja..jb).map(|j| (&k_new[new_at(j)..][..hd], &v_new[new_at(j)..][..hd])).collect();
            for gi in 0..g {
                let qs: Vec<f32> = q[(r * kv + kh) * ghd + gi * hd..][..hd].iter().map(|x| x * scale).collect();
                let mut m = dot(&qs, kr);
                let mut l = 1f32;
                let mut acc = vr.to_vec();
                for block in cached.chunks(BLOCK).chain(called.chunks(BLOCK)) {
                    let mut e = [f32::NEG_INFINITY; BLOCK];
                    for (ej, (k, _)) in e.iter_mut().zip(block) {
                        *ej = dot(&qs, k);
                    }
                    let block_top = e.iter().copied().fold(f32::NEG_INFINITY, f32::max);
                    let top = if block_top > m { block_top } else { m };
                    let alpha = attn_exp(m - top);
                    for ej in e.iter_mut() {
                        *ej = attn_exp(*ej - top);
                    }
                    l = l.mul_add(alpha, sum16(&e));
                    m = top;
                    if alpha != 1.0 {
                        acc.iter_mut().for_each(|a| *a *= alpha);
                    }
                    for (ej, (_, v)) in e.iter().zip(block) {
                        for (a, vj) in acc.iter_mut().zip(v.iter()) {
                            *a = ej.mul_add(*vj, *a);
                        }
                    }
                }
                let inv = 1.0 / l;
                for (o, a) in out[(r * kv + kh) * ghd + gi * hd..][..hd].iter_mut().zip(&acc) {
                    *o = a * inv;
                }
            }
        }
    }
    out
}

/// The 16 lanes added as the objects add them: lane i + lane i + 8, then i + 4, i + 2, i + 1.
fn sum16(v: &[f32; 16]) -> f32 {
    let mut t = *v;
    for h in [8, 4, 2, 1] {
        for i in 0..h {
            t[i] += t[i + h];
        }
    }
    t[0]
}

/// `attn_exp` of `cpu/attn.h`: e^x for x <= 0, 0 below -87.
#[allow(clippy::excessive_precision)] // the constants as the C source spells them
fn attn_exp(x: f32) -> f32 {
    if x < -87.0 {
        return 0.0;
    }
    let n = x.mul_add(std::f32::consts::LOG2_E, 12582912.0) - 12582912.0;
    let r = n.mul_add(2.12194440e-4, n.mul_add(-0.693359375, x));
    let mut p = 1.9875691500e-4f32;
    for c in [1.3981999507e-3, 8.3334519073e-3, 4.1665795894e-2, 1.6666665459e-1, 5.0000001201e-1] {
        p = p.mul_add(r, c);
    }
    let y = p.mul_add(r * r, r) + 1.0;
    y * f32::from_bits(((n as i32 + 127) as u32) << 23)
}

/// The export of the gated delta rule's step (`cpu/delta.h`, C function `mlx_iree_delta`).
pub const DELTA_EXPORT: &str = "delta";
/// Its push constants, in order: sequences n, rows per sequence m, heads H, key dim dk,
/// value dim dv, state slots S.
pub const DELTA_CONSTANTS: usize = 6;
/// The most key dims the delta rule takes: a state row of 16 16-lane chunks in registers.
const DELTA_MAX_K: usize = 256;

/// Whether the delta rule's kernel takes heads of these dims: a key dim of 1 to 16 whole
/// 16-lane chunks, a value dim of at least 1.
pub fn supports_delta(k_dim: usize, v_dim: usize) -> bool {
    (16..=DELTA_MAX_K).contains(&k_dim) && k_dim.is_multiple_of(16) && v_dim >= 1
}

/// `cpu/delta.h`'s arithmetic in Rust, for tests to hold the objects to, bit for bit: updates
/// `state` (`[s, h, dv, dk]`) as the kernel does where it lies and returns y
/// `[n * m, h * dv]`. Arguments as the kernel's bindings and constants (`last` the one value
/// of its binding), for dims it takes ([`supports_delta`], at least one slot and one row).
#[allow(clippy::too_many_arguments)]
pub fn delta_model(
    q: &[f32],
    k: &[f32],
    v: &[f32],
    g: &[f32],
    beta: &[f32],
    positions: &[i32],
    slots: &[i32],
    last: i32,
    state: &mut [f32],
    [n, m, h, dk, dv, s]: [usize; 6],
) -> Vec<f32> {
    assert!(supports_delta(dk, dv) && s > 0 && m > 0, "dims the kernel does not take: {dk} {dv} {s} {m}");
    let mut y = vec![0f32; n * m * h * dv];
    let dot = |a: &[f32], b: &[f32]| -> f32 {
        let mut lanes = [0f32; 16];
        for (ac, bc) in a.chunks_exact(16).zip(b.chunks_exact(16)) {
            for i in 0..16 {
                lanes[i] = ac[i].mul_add(bc[i], lanes[i]);
            }
        }
        sum16(&lanes)
    };
    let slot_of = |i: usize| (slots[i] as u32 as usize).min(s - 1);
    let count = usize::try_from(last).unwrap_or(0).min(m - 1) + 1;
    for i in 0..n {
        let slot = slot_of(i);
        // A repeat of an earlier sequence's slot: that sequence writes its y.
        if (0..i).any(|j| slot_of(j) == slot) {
            continue;
        }
        let fresh = positions[i * m] == 0;
        for hh in 0..h {
            let at = (slot * h + hh) * dv * dk;
            for a in 0..dv {
                let row = &mut state[at + a * dk..][..dk];
                let mut st: Vec<f32> = if fresh { vec![0.0; dk] } else { row.to_vec() };
                for t in 0..count {
                    let r = i * m + t;
                    let (gr, br) = (g[r * h + hh], beta[r * h + hh]);
                    let kr = &k[(r * h + hh) * dk..][..dk];
                    let qr = &q[(r * h + hh) * dk..][..dk];
                    st.iter_mut().for_each(|x| *x *= gr);
                    let delta = (v[(r * h + hh) * dv + a] - dot(&st, kr)) * br;
                    st.iter_mut().zip(kr).for_each(|(x, kc)| *x = kc.mul_add(delta, *x));
                    y[r * h * dv + hh * dv + a] = dot(&st, qr);
                }
                row.copy_from_slice(&st);
            }
            // The later sequences with this slot repeat this one.
            for j in (i + 1..n).filter(|&j| slot_of(j) == slot) {
                for t in 0..m {
                    let (from, to) = ((i * m + t) * h * dv + hh * dv, (j * m + t) * h * dv + hh * dv);
                    y.copy_within(from..from + dv, to);
                }
            }
        }
    }
    y
}

/// The `hal.executable.source` declaring `entries`, `attention`, `dense` and, when `delta`,
/// the delta rule's [`DELTA_EXPORT`] (IREE keeps only exports a module dispatches, so a
/// module declares exactly those it uses), linking `object` (a path from [`install`], for an
/// instruction set of this host's architecture, which the target says). Each export takes
/// one workload value (see [`units_per_workgroup`]; an attention export's units are rows
/// times kv heads, the delta rule's sequences times heads).
pub fn executable_source(
    object: &Path,
    entries: &[Entry],
    attention: &[Attention],
    dense: &[Dense],
    delta: bool,
) -> String {
    executable_source_for(std::env::consts::ARCH, object, entries, attention, dense, delta)
}

/// [`executable_source`] for an object of another architecture (`arch` as [`Isa::arch`]
/// names it), for a module compiled here to run there.
pub fn executable_source_for(
    arch: &str,
    object: &Path,
    entries: &[Entry],
    attention: &[Attention],
    dense: &[Dense],
    delta: bool,
) -> String {
    let target = executable_target(arch);
    let path = object.display().to_string().replace('\\', "\\\\").replace('"', "\\\"");
    let mut exports: Vec<ExportSpec> = entries.iter().map(|e| ExportSpec::packed(*e)).collect();
    exports.extend(attention.iter().map(|a| ExportSpec::attention(*a)));
    exports.extend(dense.iter().map(|d| ExportSpec::dense(*d)));
    exports.extend(delta.then(ExportSpec::delta));
    // One export op per entry, then one inner module holding every entry's function (IREE
    // reads a single inner module per source), each C function declared once.
    let (mut export_ops, mut funcs, mut declared) = (String::new(), String::new(), BTreeSet::new());
    for (i, spec) in exports.iter().enumerate() {
        let (export, decl, func) = spec.text(i);
        export_ops.push_str(&export);
        if declared.insert(spec.c_name.clone()) {
            funcs.push_str(&decl);
        }
        funcs.push_str(&func);
    }
    let exports = format!("{export_ops}    builtin.module {{\n{funcs}    }}\n");
    format!(
        "  \"hal.executable.source\"() <{{sym_name = \"{EXECUTABLE}\", sym_visibility = \"private\", objects = #hal.executable.objects<{{{target} = [#hal.executable.object<{{path = \"{path}\"}}>]}}>}}> ({{\n{exports}    \"hal.executable.source_end\"() : () -> ()\n  }}) : () -> ()\n"
    )
}

/// What the MLIR of one export says: names, the workload it splits, its bindings' element
/// types (the last `written` of them written, the others read only) and its push constants.
struct ExportSpec {
    name: String,
    c_name: String,
    per_workgroup: usize,
    bindings: Vec<&'static str>,
    written: usize,
    constants: usize,
}

impl ExportSpec {
    fn packed(e: Entry) -> ExportSpec {
        let name = e.export();
        let input = if e.op == Op::Rows { "i32" } else { "f32" };
        let s = e.scale.memref();
        // FP4 entries have no biases.
        let mut bindings = if e.fp4 { vec![input, "i8", s, "f32"] } else { vec![input, "i8", s, s, "f32"] };
        if e.op == Op::MatvecAdd {
            // The residual, before the result.
            bindings.insert(bindings.len() - 1, "f32");
        }
        if e.op == Op::Experts {
            // Each pair's expert, after x.
            bindings.insert(1, "i32");
        }
        let constants = if e.op == Op::Experts { Op::EXPERTS_CONSTANTS } else { 4 };
        ExportSpec {
            c_name: format!("mlx_iree_{name}"),
            name,
            per_workgroup: units_per_workgroup(e.op),
            bindings,
            written: 1,
            constants,
        }
    }

    fn attention(a: Attention) -> ExportSpec {
        // f16 travels as its bits, as the scales do; an 8-bit cache as its bytes.
        let c = match a.cache {
            CacheElem::F32 => "f32",
            CacheElem::F16 => "i16",
            CacheElem::Q8 => "i8",
        };
        ExportSpec {
            name: a.export(),
            c_name: format!("mlx_iree_attn_{}", a.cache_name()),
            per_workgroup: a.units,
            bindings: vec!["f32", "f32", "f32", c, c, "i32", "i32", "f32"],
            written: 1,
            constants: Attention::CONSTANTS,
        }
    }

    /// q, k, v, g, beta, positions, slots, last, then the state (updated where it lies) and y.
    fn delta() -> ExportSpec {
        ExportSpec {
            name: DELTA_EXPORT.to_owned(),
            c_name: "mlx_iree_delta".to_owned(),
            per_workgroup: 1,
            bindings: vec!["f32", "f32", "f32", "f32", "f32", "i32", "i32", "i32", "f32", "f32"],
            written: 2,
            constants: DELTA_CONSTANTS,
        }
    }

    fn dense(d: Dense) -> ExportSpec {
        // f16 and bf16 travel as their bits, mxfp8 as its codes then its scale bytes; the
        // residual before the result.
        let input = if d.op == DenseOp::Rows { "i32" } else { "f32" };
        let mut bindings = match d.elem {
            DenseElem::F16 | DenseElem::BF16 => vec![input, "i16", "f32"],
            DenseElem::Mxfp8 => vec![input, "i8", "i8", "f32"],
        };
        if d.op == DenseOp::MatvecAdd {
            bindings.insert(bindings.len() - 1, "f32");
        }
        ExportSpec {
            name: d.export(),
            c_name: format!("mlx_iree_{}", d.export()),
            per_workgroup: d.units_per_workgroup(),
            bindings,
            written: 1,
            constants: Dense::CONSTANTS,
        }
    }

    /// The export op, the C function's declaration and the export's function.
    fn text(&self, ordinal: usize) -> (String, String, String) {
        let (name, c_name, per) = (&self.name, &self.c_name, self.per_workgroup);
        let layout = crate::pipeline_layout(self.constants, self.bindings.len(), self.written);
        let mut params: Vec<String> = self.bindings.iter().map(|e| format!("memref<{e}>, index")).collect();
        params.extend((0..self.constants + 2).map(|_| "index".to_owned()));
        let params = params.join(", ");
        let mut body = String::new();
        for i in 0..self.constants {
            body.push_str(&format!(
                "        %k{i}_32 = hal.interface.constant.load layout({layout}) ordinal({i}) : i32\n        %k{i} = arith.index_castui %k{i}_32 : i32 to index\n"
            ));
        }
        body.push_str(&format!(
            "        %wg = hal.interface.workgroup.id[0] : index\n        %u0 = affine.apply affine_map<()[s0] -> (s0 * {per})>()[%wg]\n        %u1 = affine.apply affine_map<()[s0] -> (s0 * {per} + {per})>()[%wg]\n"
        ));
        let mut args = Vec::new();
        for (i, elem) in self.bindings.iter().enumerate() {
            body.push_str(&format!(
                "        %b{i} = hal.interface.binding.subspan layout({layout}) binding({i}) alignment(64) offset(%c0) : memref<?x{elem}>{{%n}}\n        %p{i}, %o{i}, %s{i}, %st{i} = memref.extract_strided_metadata %b{i} : memref<?x{elem}> -> memref<{elem}>, index, index, index\n"
            ));
            args.push(format!("%p{i}, %o{i}"));
        }
        args.extend((0..self.constants).map(|i| format!("%k{i}")));
        args.extend(["%u0".to_owned(), "%u1".to_owned()]);
        let args = args.join(", ");
        let export = format!(
            r#"    hal.executable.export public @{name} ordinal({ordinal}) layout({layout}) count(%device: !hal.device, %units: index) -> (index, index, index) {{
      %c1 = arith.constant 1 : index
      %x = affine.apply affine_map<()[s0] -> (s0 ceildiv {per})>()[%units]
      hal.return %x, %c1, %c1 : index, index, index
    }}
"#
        );
        let decl = format!(
            "      func.func private @{c_name}({params}) attributes {{llvm.bareptr = true, hal.import.static}}\n"
        );
        let func = format!(
            "      func.func @{name}() {{\n        %c0 = arith.constant 0 : index\n        %n = arith.constant 0 : index\n{body}        func.call @{c_name}({args}) : ({params}) -> ()\n        return\n      }}\n"
        );
        (export, decl, func)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Each packed value lands where the C kernel reads it.
    #[test]
    fn repacked_weights_follow_the_tile_layout() {
        let (out, inp) = (32, 64);
        for bits in BITS {
            let max = (1u32 << bits) - 1;
            let value = |r: usize, k: usize| ((r * 7 + k * 3) as u32 % (max + 1)) as u8;
            // MLX's rows: value k at bit k * bits, little-endian across bytes.
            let row_bytes = inp * bits as usize / 8;
            let mut mlx = vec![0u8; out * row_bytes];
            for r in 0..out {
                for k in 0..inp {
                    let bit = k * bits as usize;
                    let v = u16::from(value(r, k)) << (bit % 8);
                    mlx[r * row_bytes + bit / 8] |= v as u8;
                    if v > 0xFF {
                        mlx[r * row_bytes + bit / 8 + 1] |= (v >> 8) as u8;
                    }
                }
            }
            let packed = repack_weight(bits, out, inp, &mlx);
            assert_eq!(packed.len(), mlx.len(), "bits {bits}: MLX's bytes");
            let block_bytes = inp * bits as usize * 16 / 8;
            for r in 0..out {
                for k in 0..inp {
                    let (wb, lane) = (&packed[(r / 16) * block_bytes..], r % 16);
                    // Where cpu/qrows.h's `packed_value` reads it.
                    let (l, s) = (2 * lane + k % 2, (k % 8) / 2);
                    // A 3-bit unit's word of lane l in plane m.
                    let word =
                        |u: &[u8], m: usize| u64::from(u16::from_le_bytes([u[64 * m + 2 * l], u[64 * m + 2 * l + 1]]));
                    let got = match bits {
                        4 => {
                            let byte = wb[(k / 4) * 32 + l];
                            if k % 4 < 2 { byte & 0xF } else { byte >> 4 }
                        }
                        8 => wb[(k / 2) * 32 + l],
                        3 => {
                            let u = &wb[(k / 32) * 192..];
                            let stream = word(u, 0) | word(u, 1) << 16 | word(u, 2) << 32;
                            ((stream >> (3 * ((k % 32) / 2))) & 7) as u8
                        }
                        _ => {
                            let u = &wb[(k / 8) * 96..];
                            let nib = u[(s / 2) * 32 + l];
                            (if s % 2 == 1 { nib >> 4 } else { nib & 0xF }) | ((u[64 + l] >> (2 * s)) & 3) << 4
                        }
                    };
                    assert_eq!(got, value(r, k), "bits {bits} row {r} k {k}");
                }
            }
        }
    }

    #[test]
    fn instruction_sets_by_name() {
        for isa in Isa::ALL {
            assert_eq!(isa.name().parse::<Isa>(), Ok(isa));
        }
        assert_eq!("sse2".parse::<Isa>(), Err(UnknownIsa("sse2".into())));
        // AVX2 is a subset of what the AVX-512 object needs, which is a subset of AMX's.
        assert!(!Isa::Avx512Vnni.host_has() || Isa::Avx2.host_has());
        assert!(!Isa::Amx.host_has() || Isa::Avx512Vnni.host_has());
        assert_eq!(host_isa(), Isa::ALL.into_iter().find(|i| i.runs_on_host()));
        assert!(host_isas().all(Isa::runs_on_host));
        assert!(Isa::ALL.into_iter().filter(|i| i.host_has()).all(|i| i.arch() == std::env::consts::ARCH));
    }

    /// One object per instruction set, installed under names that tell them apart, so a
    /// compiled module that links one is never taken for the other's.
    #[test]
    fn each_instruction_set_installs_its_own_object() {
        let dir = std::env::temp_dir().join(format!("kernels-install-{}", std::process::id()));
        let paths: Vec<Option<PathBuf>> = Isa::ALL.into_iter().map(|isa| install(&dir, isa).unwrap()).collect();
        for (isa, path) in Isa::ALL.into_iter().zip(&paths) {
            let Some(path) = path else {
                assert!(object(isa).is_none());
                continue;
            };
            let name = path.file_name().unwrap().to_str().unwrap();
            assert!(name.starts_with(&format!("qmv_{}_{isa}-", isa.arch())), "{name}");
            assert_eq!(std::fs::read(path).unwrap(), object(isa).unwrap());
            assert_eq!(install(&dir, isa).unwrap().as_ref(), Some(path), "idempotent");
            // Another spelling of the same folder names the same file, character for character.
            let roundabout = dir.join("..").join(dir.file_name().unwrap());
            assert_eq!(install(&roundabout, isa).unwrap().as_ref(), Some(path), "{roundabout:?}");
            assert!(path.is_absolute());
        }
        let installed: Vec<&PathBuf> = paths.iter().flatten().collect();
        for (i, a) in installed.iter().enumerate() {
            assert!(installed[i + 1..].iter().all(|b| b != a), "{a:?} twice");
        }
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn heads_the_attention_kernel_takes() {
        assert!(supports_attention(32, 8, 64), "the 1B shape");
        assert!(supports_attention(9, 3, 64), "SmolLM2");
        assert!(supports_attention(16, 1, 16), "16 query heads per kv head");
        assert!(!supports_attention(17, 1, 16), "17 query heads per kv head");
        assert!(!supports_attention(8, 4, 40), "a head dim of 40");
        assert!(!supports_attention(8, 3, 64), "kv heads not dividing the heads");
        assert!(!supports_attention(0, 1, 64) && !supports_attention(4, 0, 64), "no heads");
        assert!(!supports_attention(16, 1, 256), "16 x 256 floats of state");
        assert_eq!(attention_units(32, 8, 64), 4, "half the kv heads: two workgroups a row");
        assert_eq!(attention_units(9, 3, 64), 1);
        assert_eq!(attention_units(16, 8, 256), 4);
        assert_eq!(attention_units(8, 8, 256), 4);
        assert_eq!(attention_units(64, 8, 128), 2, "8 x 128 floats per kv head: two fit");
    }

    #[test]
    fn groups_are_blocked_by_16_rows() {
        let values: Vec<u32> = (0..64).collect(); // [32 rows, 2 groups]
        let packed = repack_groups(&values, 32, 2);
        assert_eq!(&packed[..16], &(0..16).map(|r| r * 2).collect::<Vec<_>>()[..]);
        assert_eq!(&packed[16..32], &(0..16).map(|r| r * 2 + 1).collect::<Vec<_>>()[..]);
        assert_eq!(packed[32], 32);
    }

    #[test]
    fn shapes_the_kernels_take() {
        assert!(supports(4, 2048, 2048, 64));
        assert!(supports(8, 128256, 2048, 32));
        assert!(!supports(4, 100, 64, 32), "rows not a multiple of 16");
        assert!(!supports(4, 64, 96, 64), "groups do not divide the input");
        assert!(supports(3, 64, 64, 64) && supports(6, 64, 64, 16), "3 and 6 bits as stored");
        assert!(supports(3, 64, 64, 32) && supports(3, 64, 128, 128), "3 bits at MLX's group sizes");
        assert!(!supports(3, 64, 64, 16) && !supports(3, 64, 192, 96), "3-bit units hold 32 k, chunks 64");
        assert!(!supports(2, 64, 64, 64) && !supports(5, 64, 64, 64), "2 and 5 bits: held at 4 and 8");
        assert!(!supports(4, 64, 64, 8), "group smaller than 16");
        assert!(!supports(4, 64, 256, 256), "group larger than 128");
    }

    #[test]
    fn the_source_declares_exactly_the_entries_asked_for() {
        let all: Vec<Entry> = Op::ALL
            .into_iter()
            .flat_map(|op| [4, 8].into_iter().map(move |bits| (op, bits)))
            .flat_map(|(op, bits)| {
                [Scale::F16, Scale::F32].into_iter().map(move |scale| Entry { op, bits, scale, fp4: false, x8: false })
            })
            .collect();
        let used = [all[0], all[5], all[9]];
        let text = executable_source(Path::new("/k/qmv.o"), &used, &[], &[], false);
        for (i, e) in all.iter().enumerate() {
            let name = e.export();
            let expected = usize::from(used.contains(e));
            assert_eq!(text.matches(&format!("export public @{name} ")).count(), expected, "{name}");
            assert_eq!(
                text.matches(&format!("@mlx_iree_{name}(")).count(),
                2 * expected,
                "{name}: declared and called"
            );
            if expected == 1 {
                let ordinal = used.iter().position(|u| u == e).unwrap();
                assert!(text.contains(&format!("@{name} ordinal({ordinal})")), "{i}");
            }
        }
        assert!(text.contains(r#"path = "/k/qmv.o""#));
    }

    /// The residual matvec's C function takes the residual between the biases and the result.
    #[test]
    fn the_residual_matvec_takes_one_binding_more() {
        let e = |op| Entry { op, bits: 8, scale: Scale::F32, fp4: false, x8: false };
        let text = executable_source(Path::new("/k/qmv.o"), &[e(Op::Matvec), e(Op::MatvecAdd)], &[], &[], false);
        let decl = |name: &str| text.lines().find(|l| l.contains(&format!("private @mlx_iree_{name}("))).unwrap();
        let plain = "memref<f32>, index, memref<i8>, index, memref<f32>, index, memref<f32>, index, memref<f32>, index";
        assert!(decl("qmv8_f32").contains(&format!("({plain}, index")), "{text}");
        let residual = format!("{plain}, memref<f32>, index, index");
        assert!(decl("qmvr8_f32").contains(&residual), "{text}");
        let ro = r#"#hal.pipeline.binding<storage_buffer, "ReadOnly|Indirect">"#;
        let bindings = format!("bindings = [{}, #hal.pipeline.binding<storage_buffer, Indirect>]", [ro; 5].join(", "));
        assert!(text.contains(&bindings), "{text}");
    }

    /// An 8-bit-activation entry is its exact twin's C function under another name, with the
    /// same bindings.
    #[test]
    fn x8_entries_are_their_exact_twins_renamed() {
        for (bits, fp4) in [(4, false), (8, false), (4, true), (3, false), (6, false)] {
            for op in [Op::Matvec, Op::MatvecAdd] {
                let exact = Entry { op, bits, scale: Scale::F16, fp4, x8: false };
                let x8 = Entry { x8: true, ..exact };
                assert_eq!(x8.export(), format!("{}_x8", exact.export()));
                let text = |e: Entry| {
                    let t = executable_source(Path::new("/k/qmv.o"), &[e], &[], &[], false);
                    t.replace(&format!("{}_x8", exact.export()), &exact.export())
                };
                assert_eq!(text(x8), text(exact), "{}", x8.export());
            }
        }
        let e = Entry { op: Op::MatvecAdd, bits: 8, scale: Scale::F32, fp4: false, x8: true };
        assert_eq!(e.export(), "qmvr8_f32_x8");
    }

    /// An FP4 entry's C function takes no biases: x, weights, scales (then the residual), y.
    #[test]
    fn fp4_entries_take_no_biases() {
        let e = |op| Entry { op, bits: 4, scale: Scale::F16, fp4: true, x8: false };
        assert_eq!(e(Op::Matvec).export(), "qmvfp4_f16");
        assert_eq!(e(Op::Experts).export(), "qmvefp4_f16");
        let text = executable_source(Path::new("/k/qmv.o"), &[e(Op::Matvec), e(Op::MatvecAdd)], &[], &[], false);
        let decl = |name: &str| text.lines().find(|l| l.contains(&format!("private @mlx_iree_{name}("))).unwrap();
        let plain = "memref<f32>, index, memref<i8>, index, memref<i16>, index";
        assert!(decl("qmvfp4_f16").contains(&format!("({plain}, memref<f32>, index, index")), "{text}");
        assert!(decl("qmvrfp4_f16").contains(&format!("({plain}, memref<f32>, index, memref<f32>, index, index")));
        let ro = r#"#hal.pipeline.binding<storage_buffer, "ReadOnly|Indirect">"#;
        let bindings = format!("bindings = [{}, #hal.pipeline.binding<storage_buffer, Indirect>]", [ro; 3].join(", "));
        assert!(text.contains(&bindings), "{text}");
    }

    /// Value (r, k) of a row-major matrix lands at block r / 16, column k, lane r % 16.
    #[test]
    fn dense_matrices_are_blocked_by_16_rows() {
        let (out, inp) = (32, 3);
        let values: Vec<u32> = (0..(out * inp) as u32).collect();
        let packed = repack_dense(&values, out, inp);
        for r in 0..out {
            for k in 0..inp {
                assert_eq!(packed[(r / 16) * inp * 16 + k * 16 + r % 16], values[r * inp + k], "row {r} k {k}");
            }
        }
        assert!(supports_dense(2048, 8192) && supports_dense(128256, 2048));
        assert!(!supports_dense(100, 64), "rows not a multiple of 16");
        assert!(!supports_dense(0, 64) && !supports_dense(16, 0), "empty");
    }

    /// The f16 exports' C functions take x (or ids), the weight's bits, the residual
    /// (`hmvr` only) and the result, then T, K, O and the units.
    #[test]
    fn the_dense_exports_declare_their_bindings() {
        let text = executable_source(Path::new("/k/qmv.o"), &[], &[], &Dense::ALL[..3], false);
        let decl = |name: &str| text.lines().find(|l| l.contains(&format!("private @mlx_iree_{name}("))).unwrap();
        let constants = "index, index, index, index, index) attributes";
        let with = |bindings: &str| format!("({bindings}, {constants}");
        assert!(decl("hmv_f16").contains(&with("memref<f32>, index, memref<i16>, index, memref<f32>, index")));
        assert!(
            decl("hmvr_f16")
                .contains(&with("memref<f32>, index, memref<i16>, index, memref<f32>, index, memref<f32>, index"))
        );
        assert!(decl("hrows_f16").contains(&with("memref<i32>, index, memref<i16>, index, memref<f32>, index")));
        // Row blocks 4 a workgroup for the products, one row for the lookup.
        assert!(text.contains("@hmv_f16 ordinal(0)") && text.contains("@hrows_f16 ordinal(2)"), "{text}");
        assert_eq!(text.matches("ceildiv 4").count(), 2, "{text}");
        assert_eq!(text.matches("ceildiv 1)").count(), 1, "{text}");
        // Their results are the model's: one fused chain per output, then the residual.
        let y = dense_model(&[1.0, 2.0], 1, 2, 1, &[0.5, 0.25], Some(&[10.0]));
        assert_eq!(y, vec![11.0]);
    }

    /// mxfp8's exports take the scale bytes after the codes (and before a residual).
    #[test]
    fn the_mxfp8_exports_take_their_scales() {
        let mxfp8: Vec<Dense> = Dense::ALL.into_iter().filter(|d| d.elem == DenseElem::Mxfp8).collect();
        let text = executable_source(Path::new("/k/qmv.o"), &[], &[], &mxfp8, false);
        let decl = |name: &str| text.lines().find(|l| l.contains(&format!("private @mlx_iree_{name}("))).unwrap();
        let with = |bindings: &str| format!("({bindings}, index, index, index, index, index) attributes");
        let (x, w, s, y) = ("memref<f32>, index", "memref<i8>, index", "memref<i8>, index", "memref<f32>, index");
        assert!(decl("hmv_mxfp8").contains(&with(&format!("{x}, {w}, {s}, {y}"))), "{text}");
        assert!(decl("hmvr_mxfp8").contains(&with(&format!("{x}, {w}, {s}, memref<f32>, index, {y}"))), "{text}");
        assert!(decl("hrows_mxfp8").contains(&with(&format!("memref<i32>, index, {w}, {s}, {y}"))), "{text}");
        assert!(supports_mxfp8(2048, 8192) && !supports_mxfp8(2048, 48) && !supports_mxfp8(40, 64));
    }

    /// An mxfp8 weight as the kernels compute it is MLX's value, E4M3 (bias 7, subnormals,
    /// signed zeros) times 2^(e - 127), for every code and scale byte they take; the codes'
    /// NaN and scales past the largest are refused by name.
    #[test]
    fn mxfp8_values_are_mlxs() {
        let e4m3 = |c: u8| -> f64 {
            let (exp, mant) = (i32::from((c >> 3) & 0xF), f64::from(c & 7));
            let v = if exp == 0 { mant / 8.0 * 2f64.powi(-6) } else { (1.0 + mant / 8.0) * 2f64.powi(exp - 7) };
            if c & 0x80 != 0 { -v } else { v }
        };
        for e in MXFP8_MIN_SCALE..=MXFP8_MAX_SCALE {
            for c in (0..=255u8).filter(|c| c & 0x7F != 0x7F) {
                let want = (e4m3(c) * 2f64.powi(i32::from(e) - 127)) as f32;
                let got = mxfp8_value(c, e);
                assert_eq!(got.to_bits(), want.to_bits(), "code {c:#04x} scale {e}: {got} vs {want}");
            }
        }
        assert_eq!(mxfp8_value(0x38, 127), 1.0);
        assert_eq!(mxfp8_value(0xC4, 127), -3.0);
        // Two rows of 64 inputs: a group of zeros (and negative zeros) takes any scale.
        let mut codes = vec![0x38u8; 128];
        codes[..32].iter_mut().enumerate().for_each(|(i, c)| *c = if i % 2 == 0 { 0 } else { 0x80 });
        assert_eq!(mxfp8_check(&codes, &[0, MXFP8_MIN_SCALE, 127, MXFP8_MAX_SCALE], 64), Ok(()));
        codes[70] = 0xFF;
        let nan = mxfp8_check(&codes, &[0, 127, 127, 127], 64).unwrap_err();
        assert_eq!(nan, "an E4M3 NaN code (0xff) at row 1, input 6");
        codes[70] = 0x38;
        let big = mxfp8_check(&codes, &[0, 127, 127, 247], 64).unwrap_err();
        assert!(
            big.starts_with("the E8M0 scale byte 247 (2^120) at row 1, inputs 32.. is outside the 10..=246"),
            "{big}"
        );
        let small = mxfp8_check(&codes, &[0, 9, 127, 127], 64).unwrap_err();
        assert!(small.contains("byte 9 (2^-118) at row 0, inputs 32.."), "{small}");
    }

    #[test]
    fn heads_the_delta_kernel_takes() {
        assert!(supports_delta(128, 128), "Qwen3.5's heads");
        assert!(supports_delta(16, 1) && supports_delta(256, 8) && supports_delta(48, 5));
        assert!(!supports_delta(272, 128), "17 chunks of key");
        assert!(!supports_delta(40, 128) && !supports_delta(0, 128), "key dims not of whole chunks");
        assert!(!supports_delta(128, 0), "no values");
    }

    /// The delta export's C function takes ten bindings and six constants; the state (binding
    /// 8) is written as y is, the others only read.
    #[test]
    fn the_delta_export_writes_its_state() {
        let text = executable_source(Path::new("/k/qmv.o"), &[], &[], &[], true);
        let decl = text.lines().find(|l| l.contains("private @mlx_iree_delta(")).unwrap();
        let f = "memref<f32>, index";
        let i = "memref<i32>, index";
        let bindings = [f, f, f, f, f, i, i, i, f, f].join(", ");
        let units = "index, index, index, index, index, index, index, index) attributes";
        assert!(decl.contains(&format!("({bindings}, {units}")), "{decl}");
        let ro = r#"#hal.pipeline.binding<storage_buffer, "ReadOnly|Indirect">"#;
        let rw = "#hal.pipeline.binding<storage_buffer, Indirect>";
        let layout = format!("constants = 6, bindings = [{}, {rw}, {rw}]>", [ro; 8].join(", "));
        assert!(text.contains(&layout), "{text}");
        assert!(text.contains("@delta ordinal(0)") && text.contains("ceildiv 1)"), "{text}");
        assert!(!executable_source(Path::new("/k/qmv.o"), &[], &[], &[], false).contains("@delta"));
    }

    /// One head, one state row of 16: a key along lane 0 writes `beta * (v - s . k)` there
    /// (on the decayed state); a fresh sequence reads zeros; a sequence repeating an earlier
    /// one's slot gets its y and leaves the state alone; padding rows give 0.
    #[test]
    fn the_delta_model_follows_the_rule() {
        let e0: Vec<f32> = (0..16).map(|c| if c == 0 { 1.0 } else { 0.0 }).collect();
        let (n, m) = (2, 2);
        let k: Vec<f32> = e0.repeat(n * m);
        let q: Vec<f32> = k.iter().map(|x| x * 0.5).collect();
        let (v, g, beta) = ([3.0, 9.0, 3.0, 9.0], [0.5; 4], [0.25; 4]);
        let mut state = vec![4.0f32; 2 * 16];
        // Sequence 0 in slot 1 at position 7; sequence 1 repeats it; row 1 of each is padding.
        let y = delta_model(&q, &k, &v, &g, &beta, &[7, 8, 7, 8], &[1, 1], 0, &mut state, [n, m, 1, 16, 1, 2]);
        // s = 4 * 0.5 = 2; delta = (3 - 2) * 0.25 = 0.25; s[0] = 2.25; y = 2.25 * 0.5.
        assert_eq!(y, [1.125, 0.0, 1.125, 0.0]);
        assert_eq!(state[16], 2.25);
        assert!(state[17..].iter().all(|x| *x == 2.0) && state[..16].iter().all(|x| *x == 4.0), "{state:?}");
        // At position 0 the old state is not read: s[0] = 3 * 0.25 = 0.75, then
        // 0.75 * 0.5 + (9 - 0.375) * 0.25 = 2.53125 (both rows real now).
        let y = delta_model(&q, &k, &v, &g, &beta, &[0, 1, 5, 6], &[0, 1], 1, &mut state, [n, m, 1, 16, 1, 2]);
        assert_eq!(&y[..2], [0.375, 1.265625]);
        assert_eq!(state[0], 2.53125);
        assert!(state[1..16].iter().all(|x| *x == 0.0), "{state:?}");
    }

    /// The 8-bit cache's blocks: the scale is the largest magnitude / 127, values round to
    /// the nearest step (ties to even) and read back as `q * s`; zeros stay zeros, +0.
    #[test]
    fn q8_blocks_round_to_the_nearest_step() {
        // Largest magnitude 127: s = 1 and q = x rounded, ties to even.
        let mut x = [0f32; Q8_BLOCK];
        x[..8].copy_from_slice(&[0.5, 1.5, 2.5, -0.5, -1.5, -127.0, 126.5, 0.25]);
        let (s, q) = q8_block(&x);
        assert_eq!(s, 1.0);
        assert_eq!(q[..8], [0, 2, 2, 0, -2, -127, 126, 0]);
        assert!(q[8..].iter().all(|v| *v == 0));
        // Largest 254: s = 2, x / 2 rounded (ties to even), read back doubled.
        let mut x = [0f32; Q8_BLOCK];
        x[..5].copy_from_slice(&[254.0, 3.0, 5.0, -7.0, 1.0]);
        let (s, q) = q8_block(&x);
        assert_eq!((s, &q[..5]), (2.0, &[127, 2, 2, -4, 0][..]));
        assert_eq!(q8_round(&x)[..5], [254.0, 4.0, 4.0, -8.0, 0.0]);
        // The largest magnitude is q = +-127 whatever the scale; s is a / 127 divided.
        for a in [2.54f32, 1e-3, 3.0e4, 0.7] {
            let x: Vec<f32> = (0..Q8_BLOCK).map(|i| a * (i as f32 - 8.0) / 8.0).collect();
            let (s, q) = q8_block(&x);
            assert_eq!((s, q[0], q[8]), (a / 127.0, -127, 0), "largest {a}");
        }
        // All zeros, of either sign: s = 0, q = 0, read back as +0.
        let x = [-0.0f32; Q8_BLOCK];
        assert_eq!(q8_block(&x), (0.0, [0; Q8_BLOCK]));
        assert!(q8_round(&x).iter().all(|v| v.to_bits() == 0));
        // The bytes: per block the scale's f32 bits little-endian, then the 16 int8; read
        // back as q * s, one multiply.
        let x: Vec<f32> = (0..3 * Q8_BLOCK).map(|i| ((i * 37 % 23) as f32 - 11.0) * [0.3, 0.0, 41.0][i / 16]).collect();
        let bytes = q8_encode(&x);
        assert_eq!(bytes.len(), q8_row_bytes(x.len()));
        assert_eq!(q8_row_bytes(64), 80);
        let decoded = q8_decode(&bytes);
        for (b, block) in x.chunks(Q8_BLOCK).enumerate() {
            let (s, q) = q8_block(block);
            let at = &bytes[b * Q8_BLOCK_BYTES..][..Q8_BLOCK_BYTES];
            assert_eq!(at[..4], s.to_le_bytes());
            assert_eq!(at[4..], q.map(|v| v as u8));
            for (i, qi) in q.iter().enumerate() {
                assert_eq!(decoded[b * Q8_BLOCK + i].to_bits(), (f32::from(*qi) * s).to_bits());
            }
        }
        assert_eq!(q8_round(&x), decoded);
    }

    /// Objects are keyed by the generic target of their architecture (IREE's format name for
    /// aarch64 is `arm_64`), the host's for the objects this build installs.
    #[test]
    fn the_source_names_the_objects_architecture() {
        let entries = [Entry { op: Op::Matvec, bits: 4, scale: Scale::F16, fp4: false, x8: false }];
        let object = Path::new("/k/qmv.o");
        let x86 = executable_source_for("x86_64", object, &entries, &[], &[], false);
        assert!(x86.contains(r#""embedded-elf-x86_64", {target_triple = "x86_64-unknown-unknown-eabi-elf"}"#), "{x86}");
        let arm = executable_source_for("aarch64", object, &entries, &[], &[], false);
        assert!(
            arm.contains(r#""embedded-elf-arm_64", {target_triple = "aarch64-unknown-unknown-eabi-elf"}"#),
            "{arm}"
        );
        assert_eq!(
            x86.replace("embedded-elf-x86_64", "").replace("x86_64-", ""),
            arm.replace("embedded-elf-arm_64", "").replace("aarch64-", "")
        );
        assert_eq!(
            executable_source(object, &entries, &[], &[], false),
            executable_source_for(std::env::consts::ARCH, object, &entries, &[], &[], false)
        );
    }
}
