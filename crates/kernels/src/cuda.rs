//! The CUDA kernel: fused dequant + matvec for MLX 4- and 8-bit weights (`cuda/qmv.cu`),
//! compiled to PTX by clang at build time and linked into IREE's executables as an external
//! CUDA variant. Where the graph form of a packed matrix takes several dispatches (the
//! grouped contraction, then scales and biases; docs/PERFORMANCE.md, "CUDA"), this is one.
//!
//! Invariants shared with `cuda/qmv.cu`: it reads the graph-level layout (`models::layout`,
//! `Packing` not `kernel`): weight `[O, K]` of signed 4-bit (two a byte, low nibble first)
//! or 8-bit values (a `wide` 4-bit matrix, a value a byte, read as 8-bit), scales `[O, K / group_size]` f16, bf16 or f32, biases the
//! same shape, f16 beside f16 scales and f32 otherwise, the offset folded in; bindings (x,
//! weight, scales, biases, y) and more for the other [`Op`]s, push constants (T, K, O,
//! group_size, and RMSNorm's epsilon for the normed ops); [`ROWS_PER_BLOCK`] output rows a block of [`THREADS`] threads; the workload
//! is O (T for [`Op::Rows`]).

/// Output rows a block computes (its 4 warps split k).
pub const ROWS_PER_BLOCK: usize = 4;
/// Threads a block (4 warps).
pub const THREADS: usize = 128;
/// Name of the `hal.executable.source` holding the kernel's entry points.
pub const EXECUTABLE: &str = "mlx_iree_cuda_kernels";

#[cfg(kernels_cuda_ptx)]
const PTX: Option<&[u8]> = Some(include_bytes!(concat!(env!("OUT_DIR"), "/qmv_cuda.ptx")));
#[cfg(not(kernels_cuda_ptx))]
const PTX: Option<&[u8]> = None;

/// The PTX of every entry point, when this build has it (clang with the NVPTX target).
pub fn ptx() -> Option<&'static [u8]> {
    PTX
}

/// Element type of a packed matrix's scales (its biases are f16 beside f16, else f32).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Scale {
    F16,
    BF16,
    F32,
}

impl Scale {
    fn name(self) -> &'static str {
        match self {
            Scale::F16 => "f16",
            Scale::BF16 => "bf16",
            Scale::F32 => "f32",
        }
    }
}

/// What an entry point computes, with its bindings.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Op {
    /// `y[T, O] = x[T, K] . W^T`: (x, weight, scales, biases, y).
    Matvec,
    /// `y = x . W^T + r`, the residual connection after a linear layer (the same f32 add as
    /// the graph's, after the product): (x, weight, scales, biases, r, y).
    MatvecAdd,
    /// `y = silu(x . Wg^T) * (x . Wu^T)`, a gated MLP's gate and up projections and their
    /// product in one: (x, gate's weight, scales, biases, up's weight, scales, biases, y).
    /// silu(g) is `g * (1 / (1 + exp(-g)))` with the hardware's `exp`.
    Glu,
    /// [`Op::Matvec`] of `x` after RMSNorm with weight `g`: `y = (x * g / rms(x)) . W^T`,
    /// `rms(x) = sqrt(sum(x^2) / K + eps)`, applied once to each row's sums: (x, g f32 `[K]`,
    /// weight, scales, biases, y), `eps`'s bits a fifth push constant.
    NormMatvec,
    /// [`Op::Glu`] of `x` after RMSNorm, as [`Op::NormMatvec`]: (x, g, gate's weight, scales,
    /// biases, up's weight, scales, biases, y), `eps` a fifth constant.
    NormGlu,
    /// `out[T, K] = W[ids[t], :]` dequantized, `s * v + b` in two roundings as the graph
    /// form's (an embedding lookup; ids clamped into the table): (ids i32, weight, scales,
    /// biases, out); the workload is T, one block a row.
    Rows,
}

impl Op {
    fn name(self) -> &'static str {
        match self {
            Op::Matvec => "qmv",
            Op::MatvecAdd => "qmvr",
            Op::Glu => "glu",
            Op::NormMatvec => "qmvn",
            Op::NormGlu => "glun",
            Op::Rows => "rows",
        }
    }

    /// Every op, for tests and listings.
    pub const ALL: [Op; 6] = [Op::Matvec, Op::MatvecAdd, Op::Glu, Op::NormMatvec, Op::NormGlu, Op::Rows];

    /// Whether the op reads RMSNorm's input and weight (and `eps`) rather than its output.
    pub fn normed(self) -> bool {
        matches!(self, Op::NormMatvec | Op::NormGlu)
    }

    /// 32-bit push constants: T, K, O, group size, and `eps`'s bits for the normed ops.
    pub fn constants(self) -> usize {
        if self.normed() { 5 } else { 4 }
    }

    /// Units of the workload a block computes: output rows, or rows of ids for `Rows`.
    pub fn units_per_block(self) -> usize {
        if self == Op::Rows { 1 } else { ROWS_PER_BLOCK }
    }

    /// Bindings of the export, the written one last.
    pub fn bindings(self) -> usize {
        match self {
            Op::Matvec | Op::Rows => 5,
            Op::MatvecAdd | Op::NormMatvec => 6,
            Op::Glu => 8,
            Op::NormGlu => 9,
        }
    }
}

/// One entry point: `op` for weights of `bits` bits with `scale` scales.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Entry {
    pub op: Op,
    pub bits: u32,
    pub scale: Scale,
}

impl Entry {
    /// The export's name, which is the PTX kernel's: e.g. `mlx_iree_cuda_qmv4_f16`.
    pub fn export(self) -> String {
        format!("mlx_iree_cuda_{}{}_{}", self.op.name(), self.bits, self.scale.name())
    }
}

/// Whether the kernel takes a matrix of this shape: 4 or 8 bits, group sizes that are
/// multiples of 8 (a lane reads 8 values of one group) dividing the input size. Any output
/// count: a block's rows past it compute nothing.
pub fn supports(bits: u32, out: usize, inp: usize, group_size: usize) -> bool {
    (bits == 4 || bits == 8)
        && out > 0
        && group_size > 0
        && group_size.is_multiple_of(8)
        && inp.is_multiple_of(group_size)
}

/// The `hal.executable.source` declaring `entries`, with `ptx` (the text [`ptx`] returns)
/// as its one object for every `cuda` executable target, its bytes in the module (so the
/// module's text, which keys the compile cache, does not depend on where a cache folder
/// is): an external variant, whose kernels are the exports by name. IREE keeps only
/// exports a module dispatches, so a module declares exactly those it uses.
pub fn executable_source(ptx: &[u8], entries: &[Entry]) -> String {
    let mut hex = String::with_capacity(2 * ptx.len());
    for b in ptx {
        hex.push(char::from(b"0123456789ABCDEF"[usize::from(b >> 4)]));
        hex.push(char::from(b"0123456789ABCDEF"[usize::from(b & 15)]));
    }
    let object = format!("#hal.executable.object<{{data = dense<\"0x{hex}\"> : vector<{}xi8>}}>", ptx.len());
    let mut exports = String::new();
    for (ordinal, e) in entries.iter().enumerate() {
        let name = e.export();
        let layout = crate::pipeline_layout(e.op.constants(), e.op.bindings(), 1);
        let per = e.op.units_per_block();
        // The generic form: IREE 3.13's custom syntax for the op takes no `workgroup_size`,
        // which CUDA needs ahead of time (the second region, the export's fallback
        // condition, stays empty).
        exports.push_str(&format!(
            r#"    "hal.executable.export"() <{{layout = {layout}, ordinal = {ordinal} : index, sym_name = "{name}", sym_visibility = "public", workgroup_size = [{THREADS} : index, 1 : index, 1 : index]}}> ({{
    ^bb0(%device: !hal.device, %units: index):
      %c1 = arith.constant 1 : index
      %x = affine.apply affine_map<()[s0] -> (s0 ceildiv {per})>()[%units]
      hal.return %x, %c1, %c1 : index, index, index
    }}, {{
    }}) : () -> ()
"#
        ));
    }
    format!(
        "  \"hal.executable.source\"() <{{sym_name = \"{EXECUTABLE}\", sym_visibility = \"private\", objects = #hal.executable.objects<{{#hal.executable.target<\"cuda\", \"cuda-nvptx-fb\"> = [{object}]}}>}}> ({{\n{exports}    \"hal.executable.source_end\"() : () -> ()\n  }}) : () -> ()\n"
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exports_are_the_kernels_names() {
        assert_eq!(Entry { op: Op::Matvec, bits: 4, scale: Scale::F16 }.export(), "mlx_iree_cuda_qmv4_f16");
        assert_eq!(Entry { op: Op::MatvecAdd, bits: 8, scale: Scale::BF16 }.export(), "mlx_iree_cuda_qmvr8_bf16");
        assert_eq!(Entry { op: Op::Glu, bits: 4, scale: Scale::F32 }.export(), "mlx_iree_cuda_glu4_f32");
        assert_eq!(Entry { op: Op::NormMatvec, bits: 4, scale: Scale::F16 }.export(), "mlx_iree_cuda_qmvn4_f16");
        assert_eq!(Entry { op: Op::NormGlu, bits: 8, scale: Scale::BF16 }.export(), "mlx_iree_cuda_glun8_bf16");
    }

    /// The normed ops take RMSNorm's weight after x and its epsilon as a fifth constant.
    #[test]
    fn normed_exports_declare_five_constants() {
        let e = |op| Entry { op, bits: 4, scale: Scale::F16 };
        let text = executable_source(b"PTX", &[e(Op::Matvec), e(Op::NormMatvec), e(Op::NormGlu)]);
        let layouts: Vec<&str> =
            text.match_indices("#hal.pipeline.layout<constants = ").map(|(i, _)| &text[i..]).collect();
        assert_eq!(layouts.len(), 3);
        assert!(layouts[0].starts_with("#hal.pipeline.layout<constants = 4,"));
        assert!(layouts[1].starts_with("#hal.pipeline.layout<constants = 5,"));
        assert!(layouts[2].starts_with("#hal.pipeline.layout<constants = 5,"));
        assert_eq!((Op::NormMatvec.bindings(), Op::NormGlu.bindings()), (6, 9));
    }

    /// Every export the source can declare is a kernel of the PTX (when this build has it).
    #[test]
    fn the_ptx_defines_every_export() {
        let Some(ptx) = ptx() else { return };
        let text = String::from_utf8_lossy(ptx);
        for op in Op::ALL {
            for bits in [4, 8] {
                for scale in [Scale::F16, Scale::BF16, Scale::F32] {
                    let name = Entry { op, bits, scale }.export();
                    let params = text.split(&format!(".visible .entry {name}(")).nth(1);
                    let params = params.unwrap_or_else(|| panic!("{name} missing from the PTX"));
                    // Each binding a pointer, then the constants.
                    let declared = params.split(')').next().unwrap_or("");
                    assert_eq!(declared.matches(".param .u64").count(), op.bindings(), "{name}'s bindings");
                    assert_eq!(declared.matches(".param .u32").count(), op.constants(), "{name}'s constants");
                }
            }
        }
    }

    #[test]
    fn shapes_the_kernel_takes() {
        assert!(supports(4, 176, 2048, 64));
        assert!(supports(8, 1, 576, 32));
        assert!(!supports(3, 64, 2048, 64));
        assert!(!supports(4, 64, 100, 20));
        assert!(!supports(4, 64, 2048, 0));
    }

    #[test]
    fn the_source_declares_the_entries_asked_for() {
        let text = executable_source(
            b"PTX\x01",
            &[Entry { op: Op::Matvec, bits: 4, scale: Scale::F16 }, Entry { op: Op::Glu, bits: 8, scale: Scale::F32 }],
        );
        assert!(text.contains(r#"ordinal = 0 : index, sym_name = "mlx_iree_cuda_qmv4_f16""#));
        assert!(text.contains(r#"ordinal = 1 : index, sym_name = "mlx_iree_cuda_glu8_f32""#));
        // The glu export's eight bindings (its layout comes after the first export's name),
        // the last written.
        let glu = text.split("mlx_iree_cuda_qmv4_f16").nth(1).unwrap();
        assert_eq!(glu.matches(r#"storage_buffer, "ReadOnly|Indirect">"#).count(), 7);
        assert_eq!(glu.matches("storage_buffer, Indirect>").count(), 1);
        assert!(!text.contains("qmv4_bf16"));
        assert!(text.contains(r#"#hal.executable.object<{data = dense<"0x50545801"> : vector<4xi8>}>"#));
        assert!(text.contains("workgroup_size = [128 : index, 1 : index, 1 : index]"));
        assert!(!text.contains("builtin.module"), "an external variant has no code of IREE's");
    }
}
