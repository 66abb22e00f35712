//! What the compile target can do, as the model needs to know it: which hand-written
//! kernels the graphs may link, whether the target is SPIR-V (narrower element types), and
//! the graph settings that differ by target. The engine derives one [`Backend`] per load
//! from its device and settings (`engine::Backend`); [`crate::Layout::new`] turns it into
//! one [`crate::Form`] per matrix and the graph code matches on that form. Nothing here
//! knows IREE.

use std::path::PathBuf;

/// The hand-written kernels a target links, if any (`kernels::cpu`, `kernels::cuda`).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub enum KernelLink {
    /// None: every matrix in its graph form.
    #[default]
    None,
    /// An `llvm-cpu` target whose host runs this installed CPU kernel object
    /// (`kernels::cpu::install`): packed 4/8-bit matrices and dense f16/bf16 ones go
    /// through it where its shapes allow, and attention where the heads fit.
    Cpu(PathBuf),
    /// A `cuda` target with the CUDA kernel's PTX in this build: packed matrices of the
    /// graph form go through it.
    Cuda,
}

/// How single-row decode reads its sequence's window out of a cache of several slots.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum SlotRead {
    /// A gather at the slot (the slot stays data on the device). IREE 3.13 copies the window
    /// with per-element index arithmetic: on CPU, with 8 slots, these copies were more than
    /// half of a single-row decode step at 2,048 positions.
    #[default]
    Gather,
    /// A `dynamic_slice` at the slot. IREE folds it into the offset of the dispatch that reads
    /// the window (a contiguous copy at most), but reads the slot back to the host for that:
    /// cheap on CPU, a round trip per call on a GPU (docs/ARCHITECTURE.md, "Toolchain
    /// facts"). For CPU targets.
    Slice,
}

/// How a mixture-of-experts step multiplies each row by its gathered expert in the graph
/// form (the CPU kernel's `qmve` aside).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum ExpertProducts {
    /// Products and a sum over the input. IREE 3.13 compiles it for every target; a batched
    /// contraction of gathered f16 experts failed on CUDA ("failed to distribute").
    #[default]
    Reduction,
    /// A contraction batched over the rows. For CPU targets: with products and a sum the
    /// f16 decode of the 1B-class MoE there fell from 4.84 to 2.63 tok/s.
    Contraction,
}

/// How a packed matrix multiplies its input in the graph form (the kernels aside).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum PackedProducts {
    /// Integer products per group (`x` quantized to i16 per row), scales and biases once per
    /// group: the packed weight is read inside one contraction.
    #[default]
    IntegerGroups,
    /// The weight dequantized to f32 (`s * q + b`), then a float contraction. For SPIR-V
    /// targets: IREE 3.13 computes the grouped integer contraction wrong there once it has
    /// several rows (16 rows of i16 x i8 on lavapipe gave sums off by about 2^28), and the
    /// float form is also closer to MLX's own `qmm`.
    Dequantized,
}

/// How the CPU kernel's packed products (`Matvec`, `MatvecAdd`) quantize each group of a row
/// of their input before the exact integer dots (`kernels::cpu::Entry::x8`). The user's
/// choice (`--activations`), not the target's: it changes the numbers.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum Activations {
    /// To i16 (15 bits of the group's largest magnitude): within about 3e-5 of the exact
    /// product, token-exact with MLX wherever MLX's own products are.
    #[default]
    I16,
    /// To 8 bits (127 levels), llama.cpp's int8 activations: AVX-512 VNNI multiplies twice the
    /// k per instruction for the 4-bit and 8-bit weights of a prompt's rows. Rows stay
    /// independent (a row's result does not depend on the others in its call); the gate
    /// decides whether a model keeps its answers. The expert products (`qmve`) keep i16.
    I8,
}

impl Activations {
    /// The setting's name on the command line.
    pub fn name(self) -> &'static str {
        match self {
            Activations::I16 => "i16",
            Activations::I8 => "i8",
        }
    }
}

impl std::str::FromStr for Activations {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "i16" => Ok(Activations::I16),
            "i8" => Ok(Activations::I8),
            other => Err(format!("unknown activations `{other}` (expected i16 or i8)")),
        }
    }
}

/// Settings of the emitted graphs; the defaults suit every target but SPIR-V ones (see
/// [`PackedProducts`]). All but `activations` follow from the target.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct EmitOptions {
    pub slot_read: SlotRead,
    pub expert_products: ExpertProducts,
    pub packed_products: PackedProducts,
    pub activations: Activations,
}

/// What one target can do, for the layout and the graph. The default is a target with no
/// kernels and the default graph settings.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Backend {
    pub kernels: KernelLink,
    /// Vulkan and Metal: IREE 3.13 gives their code no bf16 arithmetic and no `i4` vectors
    /// ("failed to legalize operation 'vector.bitcast'"), so bf16 matrices are held as their
    /// bit patterns, 4-bit ones one value a byte, bf16 scales as f32.
    pub spirv: bool,
    pub emit: EmitOptions,
}

impl Backend {
    /// A backend with these kernels and the default graph settings.
    pub fn with_kernels(kernels: KernelLink) -> Backend {
        Backend { kernels, ..Backend::default() }
    }
}
