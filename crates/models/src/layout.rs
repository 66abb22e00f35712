//! How every parameter sits on the device for one precision and backend: each matrix gets
//! one [`Form`] (dense in the precision's element type, MLX-packed in the graph form, in a
//! hand-written kernel's layout, ...), decided here once from the checkpoint and the
//! [`Backend`]; the graph code matches on it in one place, the graph declares its globals
//! from [`Layout::device_params`] and the loader fills them from the same list, so the
//! three cannot disagree.

use crate::backend::{Backend, EmitOptions, KernelLink};
use crate::config::ModelConfig;
use crate::error::{Error, Result};
use crate::names::{EMBEDDING, GATE_UP, PER_LAYER_EMBEDDING, QKV};
use crate::params::{Kind, ParamSpec, param_specs};
use crate::precision::Precision;
use hlo_emit::ElementType;
use std::borrow::Cow;
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use weights::{Checkpoint, Dtype, Linear};

/// An MLX-quantized matrix kept packed on the device.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Packing {
    /// The width the values are held at: 4 or 8 in the graph and CUDA forms (an exact copy
    /// where the checkpoint's width is another); in the CPU kernel's form
    /// [`cpu_bits`](Self::cpu_bits).
    pub bits: u32,
    /// The width the checkpoint stores the values at (4 for FP4 codes).
    pub stored: u32,
    pub group_size: usize,
    /// The checkpoint's scale dtype (f16, bf16 or f32), kept as is in the graph form; in the
    /// CPU kernel's layout f16 or f32.
    pub scale_elem: ElementType,
    /// Element type of the adjusted biases: f16 beside f16 scales, else f32 (bf16's 8-bit
    /// mantissa would round the folded offset by up to 3% of a quantization step).
    pub bias_elem: ElementType,
    /// Graph-level form of a 4-bit matrix held one value per byte (`i8`): a dimension that is
    /// not a multiple of 64 (IREE 3.13 tiles such shapes with masked `i4` loads it cannot
    /// emulate, "failed to emulate bit width", seen with 176 rows), and every 4-bit matrix on
    /// SPIR-V.
    pub wide: bool,
    /// Whether the graph form stores the values with their top bit flipped (MLX's unsigned
    /// `q` read as `q - 2^(bits-1)`, the offset folded into the biases): for weights the
    /// checkpoint stores at this width. An exact copy from a narrower width or FP4
    /// ([`Layout::pack`]) has values that fit the signed type as they are, and folding the
    /// offset into f16 biases would round them by up to 1/16 of a step.
    pub flipped: bool,
    /// The checkpoint stores E2M1 codes (mxfp4, nvfp4). The graph and CUDA forms hold their
    /// exact 8-bit affine copy (`bits` 8); the CPU kernel's form reads the codes as stored
    /// (`bits` 4) through its FP4 table, scales of `s / 2`, and no biases
    /// (`kernels::cpu::Entry::fp4`).
    pub fp4: bool,
    /// mxfp4: the scales are E8M0 bytes, which the CPU kernel reads as stored (`scale_elem`
    /// `I8` in its form: one byte a group, the file's bytes; `kernels::cpu::Scale::E8m0`).
    pub e8m0: bool,
}

impl Packing {
    /// Element type of the packed weight in the graph-level form: signed, because IREE 3.13 lowers a `ui4` convert
    /// inside a fused contraction as signed (docs/ARCHITECTURE.md, "Toolchain facts"). MLX's unsigned `q` is stored as
    /// `q ^ 2^(bits-1)`, which reads as `q - 2^(bits-1)`; the bias absorbs the offset.
    pub fn weight_elem(&self) -> ElementType {
        if self.bits == 4 && !self.wide { ElementType::I4 } else { ElementType::I8 }
    }

    /// The offset `2^(bits-1)` folded into the biases where the values are flipped, else 0.
    fn offset(&self) -> f32 {
        if self.flipped { (1u32 << (self.bits - 1)) as f32 } else { 0.0 }
    }

    /// The kernel's scale type for this packing.
    pub fn kernel_scale(&self) -> kernels::cpu::Scale {
        match self.scale_elem {
            ElementType::F16 => kernels::cpu::Scale::F16,
            ElementType::I8 => kernels::cpu::Scale::E8m0,
            _ => kernels::cpu::Scale::F32,
        }
    }

    /// The CPU kernel's entry computing `op` for this packing, with x quantized to i16.
    pub fn kernel_entry(&self, op: kernels::cpu::Op) -> kernels::cpu::Entry {
        kernels::cpu::Entry { op, bits: self.bits, scale: self.kernel_scale(), fp4: self.fp4, x8: false }
    }

    /// The bits the CPU kernel reads the values at: as stored where it has tiles of that
    /// width (affine 3, 4, 6 and 8 bits, FP4 codes at 4), else `bits` (affine 2 and 5 bits,
    /// held at 4 and 8).
    pub fn cpu_bits(&self) -> u32 {
        if kernels::cpu::BITS.contains(&self.stored) { self.stored } else { self.bits }
    }

    /// Whether the device holds biases beside the values: all but the CPU kernel's FP4 form.
    pub fn has_biases(&self) -> bool {
        !(self.fp4 && self.bits == 4)
    }
}

/// The one decision of how a matrix (or a layer's stacked experts) is held and multiplied.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Form {
    /// Dense `[out, in]` in the precision's element type, a graph contraction.
    Dense,
    /// Dense bf16 held as its bit patterns (`i16`, the same bytes) and widened to f32 by a
    /// shift in the graph: SPIR-V targets ([`Backend::spirv`]).
    Bf16Bits,
    /// A matrix of few outputs (`ParamSpec::narrow`: a router) rounded to the precision's
    /// type, stored widened to f32 and read by a reduction ([`Role::Widened`]).
    Narrow,
    /// Dense f16 or bf16 in the CPU kernel's 16-row blocks, through its dense product.
    CpuDense,
    /// MLX-packed in the graph form (signed values, the offset folded into the biases).
    GraphPacked(Packing),
    /// MLX-packed in the CPU kernel's blocks (MLX's values and biases as they are).
    CpuPacked(Packing),
    /// MLX-packed in the graph form, multiplied by the CUDA kernel.
    CudaPacked(Packing),
    /// mxfp8 as stored (FP8 E4M3 codes, an E8M0 scale byte per 32 inputs: no affine copy
    /// holds them), widened to f32 in the graph where they are used (stacked experts: those
    /// a step picks).
    GraphMxfp8,
    /// mxfp8 codes and scale bytes in the CPU kernel's 16-row blocks, through its dense
    /// product (`kernels::cpu::DenseElem::Mxfp8`).
    CpuMxfp8,
}

impl Form {
    /// The packing of a packed form.
    pub fn packing(&self) -> Option<&Packing> {
        match self {
            Form::GraphPacked(p) | Form::CpuPacked(p) | Form::CudaPacked(p) => Some(p),
            Form::Dense | Form::Bf16Bits | Form::Narrow | Form::CpuDense | Form::GraphMxfp8 | Form::CpuMxfp8 => None,
        }
    }

    /// Whether the CPU kernel object computes it.
    pub fn in_cpu_kernel(&self) -> bool {
        matches!(self, Form::CpuDense | Form::CpuPacked(_) | Form::CpuMxfp8)
    }
}

/// What a device parameter holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    /// A dense matrix `[out, in]` in the layout's dense element type (`i16` for bf16 held
    /// as bit patterns, [`Form::Bf16Bits`]).
    Dense,
    /// A dense matrix of few outputs ([`Form::Narrow`]) rounded to the layout's dense element
    /// type and stored widened to f32, which the graph reads in a reduction. Read as f16 and
    /// widened in the graph, or by a contraction, IREE 3.13's parameter encoder left it
    /// unbound with stored parameters ("no provider registered that handles scopes like
    /// 'model'" at load, f16 and bf16 MoE models).
    Widened,
    /// A 1-D f32 tensor (norm weights, biases of linear layers).
    Vector,
    /// Packed weight `[out, in]` of `i4`/`i8` (nibble/byte-flipped MLX bits).
    PackedWeight,
    /// Scales `[out, in / group_size]`.
    PackedScales,
    /// Biases plus `2^(bits-1) * scales`, `[out, in / group_size]`.
    PackedBiases,
    /// The packed 4-bit weight's bytes as `i8 [out, in / 2]`, for gathering embedding rows:
    /// IREE 3.13 cannot gather `i4` rows on CUDA ("failed to emulate bit width").
    PackedRows,
    /// Stacked experts `[experts, out, in]` MLX-packed, as the checkpoint stores them: the
    /// words' bytes `i8 [experts, out, in * bits / 8]` (values from the low bits up).
    ExpertWeight,
    /// Their scales `[experts, out, groups]`, as stored.
    ExpertScales,
    /// Their biases `[experts, out, groups]` (MLX's, no offset folded), as stored.
    ExpertBiases,
    /// A dense f16 or bf16 matrix `[out, in]` in the CPU kernel's 16-row blocks
    /// (`kernels::cpu::repack_dense`), held as `[out / 16, in * 16]`.
    DenseBlocks,
    /// mxfp8's codes, one byte each: `[out, in]` as stored ([`Form::GraphMxfp8`]), or in the
    /// CPU kernel's blocks `[out / 16, in * 16]` ([`Form::CpuMxfp8`]).
    Mxfp8Codes,
    /// mxfp8's E8M0 scale bytes: `[out, in / 32]` as stored, or `[out / 16, in / 32 * 16]`
    /// in the CPU kernel's blocks.
    Mxfp8Scales,
}

/// One global of the graph: the parameter key it is bound to, its shape and element type.
#[derive(Debug, Clone, PartialEq)]
pub struct DeviceParam {
    /// The parameter key (several globals may view one parameter's bytes).
    pub key: String,
    /// The graph's name for the global (the key, or `<key>.rows` for a byte view).
    pub global: String,
    pub dims: Vec<usize>,
    pub elem: ElementType,
    pub role: Role,
    /// The checkpoint-level parameter it comes from (the first of `parts`).
    pub spec: ParamSpec,
    /// The checkpoint matrices stacked along the rows into this one (just `spec`, except
    /// for a merged projection; see [`Layout::merged`]).
    pub parts: Vec<ParamSpec>,
}

impl DeviceParam {
    pub fn bytes(&self) -> usize {
        self.dims.iter().product::<usize>() * self.elem.bits() as usize / 8
    }
}

/// The device layout of a model at a precision on a backend.
#[derive(Debug, Clone, PartialEq)]
pub struct Layout {
    precision: Precision,
    /// Every matrix's form by prefix (`model.layers.0.mlp.up_proj`), merged ones included.
    forms: HashMap<String, Form>,
    /// Projections that read the same input, stacked into one matrix so one dispatch
    /// computes them all: part prefix -> (merged prefix, first row, rows).
    merged: HashMap<String, (String, usize, usize)>,
    /// The CPU kernel object linked into the graph, when some matrix is in a CPU form.
    kernel_object: Option<PathBuf>,
    emit: EmitOptions,
}

impl Layout {
    /// The layout of `precision` for this checkpoint on `backend`. Dense precisions do not
    /// look at the checkpoint's quantization (quantized weights are dequantized at load);
    /// `packed` keeps every 4- and 8-bit MLX-quantized matrix packed and stores the
    /// checkpoint's dense matrices as f16. Then each matrix takes the form the backend gives
    /// it: the CPU kernels' where they link and take its shape (not at f32), the CUDA
    /// kernel's for graph-packed matrices it takes, SPIR-V's narrower forms there.
    ///
    /// # Errors
    /// A parameter the checkpoint lacks or holds in another shape than config.json gives it
    /// ([`crate::check_checkpoint`]); `packed` on a checkpoint without quantized matrices, or
    /// with a bit width other than 4 or 8, or a group size that does not divide the input
    /// size.
    pub fn new(cfg: &ModelConfig, precision: Precision, ckpt: &Checkpoint, backend: &Backend) -> Result<Layout> {
        crate::params::check_checkpoint(cfg, ckpt)?;
        let mut layout = Layout::dense_for(cfg, precision, backend);
        if precision == Precision::Packed {
            layout.pack(cfg, ckpt)?;
        }
        layout.apply(cfg, backend);
        Ok(layout)
    }

    /// The layout of a dense precision on `backend` (no checkpoint needed: a dense matrix's
    /// form depends only on its shape). For `Packed` it has no packed matrices; use
    /// [`Layout::new`].
    pub fn dense_on(cfg: &ModelConfig, precision: Precision, backend: &Backend) -> Layout {
        let mut layout = Layout::dense_for(cfg, precision, backend);
        layout.apply(cfg, backend);
        layout
    }

    /// The layout of a dense precision on a backend without kernels and with the default
    /// graph settings.
    pub fn dense(cfg: &ModelConfig, precision: Precision) -> Layout {
        Layout::dense_on(cfg, precision, &Backend::default())
    }

    /// The backend's forms: SPIR-V's narrower packed forms, the kernels' where they link.
    fn apply(&mut self, cfg: &ModelConfig, backend: &Backend) {
        if backend.spirv {
            self.narrow_for_spirv();
        }
        match &backend.kernels {
            KernelLink::Cpu(object) if self.precision != Precision::F32 => self.link_cpu_kernels(cfg, object),
            // Its PTX is in this build (the engine links it only then).
            KernelLink::Cuda if kernels::cuda::ptx().is_some() => self.link_cuda_kernel(cfg),
            KernelLink::Cpu(_) | KernelLink::Cuda | KernelLink::None => {}
        }
    }

    /// Every matrix dense (`Narrow` for routers; bf16 as bits on SPIR-V).
    fn dense_for(cfg: &ModelConfig, precision: Precision, backend: &Backend) -> Layout {
        let bits = backend.spirv && precision.matrix_elem() == ElementType::BF16;
        let forms = matrix_specs(cfg)
            .map(|s| {
                let form = if s.narrow {
                    Form::Narrow
                } else if bits {
                    Form::Bf16Bits
                } else {
                    Form::Dense
                };
                (s.prefix().to_owned(), form)
            })
            .collect();
        Layout { precision, forms, merged: HashMap::new(), kernel_object: None, emit: backend.emit }
    }

    /// Every MLX-quantized matrix of the checkpoint in the graph's packed form (an exact
    /// 4- or 8-bit affine copy where it is stored narrower or in FP4).
    fn pack(&mut self, cfg: &ModelConfig, ckpt: &Checkpoint) -> Result<()> {
        let mut any = false;
        // Per-head matrices stay dense whatever the checkpoint holds (`Kind::Heads`).
        for spec in matrix_specs(cfg).filter(|s| s.kind != Kind::Heads) {
            let prefix = spec.prefix();
            let experts = spec.kind == Kind::Experts;
            // Stacked experts are one tensor quantized alike: expert 0 tells.
            let layer = if experts { spec.expert(ckpt, 0)? } else { spec.linear(ckpt)? };
            let Linear::Quantized(q) = layer else { continue };
            if q.mode() == weights::QuantMode::Mxfp8 {
                self.pack_mxfp8(&spec, ckpt)?;
                any = true;
                continue;
            }
            // Widths and modes the products have no code of their own for are held as an
            // exact affine copy of 4 or 8 bits (`QuantizedLinear::affine_width`); stacked
            // experts are one tensor, but their scales may differ: every expert tells.
            let Some(mut width) = q.affine_width() else {
                return Err(Error::Invalid(format!(
                    "precision `packed` holds MLX affine, mxfp4, nvfp4 and mxfp8 weights; {prefix} in {} is {} (use f16 or bf16)",
                    ckpt.dir().display(),
                    q.mode().name()
                )));
            };
            if experts && width.dtype == Dtype::F16 && q.mode() != weights::QuantMode::Affine {
                for e in 1..spec.shape[0] {
                    if let Linear::Quantized(qe) = spec.expert(ckpt, e)? {
                        width.dtype = qe.affine_width().map_or(width.dtype, |w| w.dtype);
                        if width.dtype != Dtype::F16 {
                            break;
                        }
                    }
                }
            }
            let (bits, gs) = (width.bits, q.group_size());
            let inputs = spec.shape[spec.shape.len() - 1];
            if gs == 0 || inputs % gs != 0 {
                return Err(Error::Invalid(format!(
                    "{prefix}: group size {gs} does not divide the input size {inputs}"
                )));
            }
            let Some(scale_elem) = float_elem(width.dtype) else {
                return Err(Error::Invalid(format!(
                    "{prefix}.scales: dtype {} is not a float (expected f16, bf16 or f32)",
                    width.dtype.name()
                )));
            };
            // Experts keep MLX's biases as they are (the graph dequantizes the experts it picks).
            let bias_elem = if scale_elem == ElementType::F16 || experts { scale_elem } else { ElementType::F32 };
            let wide = !experts && bits == 4 && (spec.shape[0] % 64 != 0 || spec.shape[1] % 64 != 0);
            let flipped = q.mode() == weights::QuantMode::Affine && q.bits() == bits;
            let fp4 = matches!(q.mode(), weights::QuantMode::Mxfp4 | weights::QuantMode::Nvfp4);
            let stored = if fp4 { 4 } else { q.bits() };
            let e8m0 = q.mode() == weights::QuantMode::Mxfp4;
            let packing = Packing { bits, stored, group_size: gs, scale_elem, bias_elem, wide, flipped, fp4, e8m0 };
            self.forms.insert(prefix.to_owned(), Form::GraphPacked(packing));
            any = true;
        }
        if !any {
            return Err(Error::Invalid(format!(
                "precision `packed` needs an MLX-quantized checkpoint; {} has dense weights (use f16, or quantize it with mlx_lm.convert -q)",
                ckpt.dir().display()
            )));
        }
        Ok(())
    }

    /// An mxfp8 matrix (or a layer's stacked experts) held as stored ([`Form::GraphMxfp8`]),
    /// after checking that its codes and scales are ones the products take
    /// (`kernels::cpu::mxfp8_check`: every weight zero or a normal f32, no NaN), which every
    /// real checkpoint's are; stacked experts expert by expert.
    fn pack_mxfp8(&mut self, spec: &ParamSpec, ckpt: &Checkpoint) -> Result<()> {
        let experts = spec.kind == Kind::Experts;
        for e in 0..if experts { spec.shape[0] } else { 1 } {
            let layer = if experts { spec.expert(ckpt, e)? } else { spec.linear(ckpt)? };
            // One quantization for the stacked tensors (the layer's), its scales U8 (checked
            // where `weights` reads the layer).
            let Linear::Quantized(q) = layer else {
                return Err(Error::Invalid(format!("{}: expert {e} is not quantized", spec.prefix())));
            };
            kernels::cpu::mxfp8_check(q.weight().bytes(), q.scales().bytes(), q.in_features()).map_err(|err| {
                let which = if experts { format!(" (expert {e})") } else { String::new() };
                Error::Invalid(format!(
                    "{}{which}: {err}; precision `packed` cannot hold it (use f16 or bf16)",
                    q.weight().name()
                ))
            })?;
        }
        self.forms.insert(spec.prefix().to_owned(), Form::GraphMxfp8);
        Ok(())
    }

    /// SPIR-V's packed forms: 4-bit matrices one value a byte (`Packing::wide`, twice the
    /// bytes) and bf16 scales and biases as f32 (bf16 dense matrices are already bits).
    fn narrow_for_spirv(&mut self) {
        for form in self.forms.values_mut() {
            if let Form::GraphPacked(p) = form {
                p.wide = p.bits == 4;
                if p.scale_elem == ElementType::BF16 {
                    p.scale_elem = ElementType::F32;
                }
                if p.bias_elem == ElementType::BF16 {
                    p.bias_elem = ElementType::F32;
                }
            }
        }
    }

    /// Moves every packed matrix the CPU kernels take (`kernels::cpu::supports`) to
    /// [`Form::CpuPacked`], every dense f16 or bf16 matrix they take
    /// (`kernels::cpu::supports_dense`; routers and stacked experts aside) to
    /// [`Form::CpuDense`] and every mxfp8 one (`kernels::cpu::supports_mxfp8`) to
    /// [`Form::CpuMxfp8`], linking `object`; then stacks q/k/v and gate/up where their parts
    /// share one CPU form (one dispatch each instead of 3 and 2).
    fn link_cpu_kernels(&mut self, cfg: &ModelConfig, object: &Path) {
        let half = matches!(self.precision.matrix_elem(), ElementType::F16 | ElementType::BF16);
        for spec in matrix_specs(cfg) {
            let form = self.forms.get_mut(spec.prefix()).expect("every matrix has a form");
            let [o, i] = [spec.shape[spec.shape.len() - 2], spec.shape[spec.shape.len() - 1]];
            match form {
                // The embedding table too: the kernel looks its rows up (`DenseOp::Rows`), so
                // a tied head reads the same one copy.
                Form::Dense if half && spec.kind == Kind::Matrix && kernels::cpu::supports_dense(o, i) => {
                    *form = Form::CpuDense;
                }
                // A stacked expert layer's shape is its experts' (`qmve` takes them stacked).
                Form::GraphPacked(p) if kernels::cpu::supports(p.cpu_bits(), o, i, p.group_size) => {
                    let (scale_elem, bias_elem) = if p.e8m0 {
                        (ElementType::I8, ElementType::I8)
                    } else if p.scale_elem == ElementType::F16 {
                        (ElementType::F16, ElementType::F16)
                    } else {
                        (ElementType::F32, ElementType::F32)
                    };
                    *form = Form::CpuPacked(Packing { bits: p.cpu_bits(), scale_elem, bias_elem, wide: false, ..*p });
                }
                Form::GraphMxfp8 if spec.kind == Kind::Matrix && !spec.narrow && kernels::cpu::supports_mxfp8(o, i) => {
                    *form = Form::CpuMxfp8;
                }
                _ => continue,
            }
            self.kernel_object = Some(object.to_path_buf());
        }
        self.merge(cfg, &[QKV, GATE_UP], |form, _, _| form.in_cpu_kernel());
    }

    /// Lets the CUDA kernel (`kernels::cuda`) compute the graph-packed matrices it takes, in
    /// the graph-level layout as it is ([`Form::CudaPacked`]); stacked experts stay in the
    /// graph. q/k/v become one matrix where the kernel takes them stacked (gate and up
    /// already share one dispatch, `Op::Glu`): on a GPU a decode step is bound by its
    /// dispatches.
    fn link_cuda_kernel(&mut self, cfg: &ModelConfig) {
        for spec in matrix_specs(cfg).filter(|s| s.kind == Kind::Matrix) {
            let form = self.forms.get_mut(spec.prefix()).expect("every matrix has a form");
            if let Form::GraphPacked(p) = *form
                && kernels::cuda::supports(cuda_bits(&p), spec.shape[0], spec.shape[1], p.group_size)
            {
                *form = Form::CudaPacked(p);
            }
        }
        self.merge(cfg, &[QKV], |form, rows, inp| match form {
            Form::CudaPacked(p) => kernels::cuda::supports(cuda_bits(p), rows, inp, p.group_size),
            _ => false,
        });
    }

    /// True when some matrix is in the CPU kernel's packed integer form ([`Form::CpuPacked`]:
    /// the products `Activations` sets the input of).
    pub fn has_cpu_packed(&self) -> bool {
        self.forms.values().any(|f| matches!(f, Form::CpuPacked(_)))
    }

    /// True when some quantized matrix uses the graph-level form (not the CPU kernels).
    pub fn has_graph_packing(&self) -> bool {
        self.forms.values().any(|f| matches!(f, Form::GraphPacked(_) | Form::CudaPacked(_) | Form::GraphMxfp8))
    }

    /// The merged matrix a projection is part of: (merged prefix, first row, rows).
    pub fn merged(&self, prefix: &str) -> Option<(&str, usize, usize)> {
        self.merged.get(prefix).map(|(m, first, rows)| (m.as_str(), *first, *rows))
    }

    /// The form of the matrix (or stacked experts) `prefix`, merged ones included; `None`
    /// for a name that is no matrix of the model.
    pub fn form(&self, prefix: &str) -> Option<Form> {
        self.forms.get(prefix).copied()
    }

    /// The CPU kernel object the graph links, if any matrix uses it.
    pub fn kernel_object(&self) -> Option<&Path> {
        self.kernel_object.as_deref()
    }

    /// The graph settings of the backend this layout is for.
    pub fn emit_options(&self) -> EmitOptions {
        self.emit
    }

    /// Merges, in every layer, each of `groups` (the merged matrix's name and its parts',
    /// under the layer's prefix) whose parts all have one form that `accept`s (the form,
    /// the merged rows, the input width) into one matrix of that form, the parts stacked by
    /// rows in order ([`Layout::merged`]).
    fn merge(&mut self, cfg: &ModelConfig, groups: &[(&str, &[&str])], accept: impl Fn(&Form, usize, usize) -> bool) {
        let shapes = matrix_shapes(cfg);
        for l in 0..cfg.num_layers() {
            let n = crate::names::LayerNames::new(l);
            for (merged, parts) in groups {
                let merged = n.at(merged);
                let parts: Vec<String> = parts.iter().map(|part| n.at(part)).collect();
                let Some(part_shapes) = parts.iter().map(|n| shapes.get(n)).collect::<Option<Vec<_>>>() else {
                    continue;
                };
                let rows: usize = part_shapes.iter().map(|s| s[0]).sum();
                let Some(form) = self.form(&parts[0]) else { continue };
                if !parts.iter().all(|n| self.form(n) == Some(form)) || !accept(&form, rows, part_shapes[0][1]) {
                    continue;
                }
                let mut row = 0;
                for (part, shape) in parts.iter().zip(&part_shapes) {
                    self.merged.insert(part.clone(), (merged.clone(), row, shape[0]));
                    row += shape[0];
                }
                self.forms.insert(merged, form);
            }
        }
    }

    pub fn precision(&self) -> Precision {
        self.precision
    }

    /// The packing of the matrix at `prefix`, if it stays packed.
    pub fn packing(&self, prefix: &str) -> Option<&Packing> {
        self.forms.get(prefix).and_then(Form::packing)
    }

    /// Every global the graph declares, in a fixed order.
    pub fn device_params(&self, cfg: &ModelConfig) -> Vec<DeviceParam> {
        let specs = param_specs(cfg);
        let mut out = Vec::new();
        for spec in &specs {
            // A merged projection is declared once, where its first part is.
            let (prefix, parts) = match self.merged(spec.prefix()) {
                Some((_, first_row, _)) if first_row > 0 => continue,
                Some((merged, _, _)) => {
                    let parts: Vec<ParamSpec> = specs
                        .iter()
                        .filter(|s| self.merged(s.prefix()).is_some_and(|(m, _, _)| m == merged))
                        .cloned()
                        .collect();
                    (merged.to_owned(), parts)
                }
                None => (spec.prefix().to_owned(), vec![spec.clone()]),
            };
            let param = |key: String, dims: Vec<usize>, elem, role| DeviceParam {
                global: key.clone(),
                key,
                dims,
                elem,
                role,
                spec: spec.clone(),
                parts: parts.clone(),
            };
            if spec.kind == Kind::Vector {
                out.push(param(spec.key.clone(), spec.shape.clone(), ElementType::F32, Role::Vector));
                continue;
            }
            let form = self.form(&prefix).expect("every matrix has a form");
            // Rows of the (merged) matrix and its input width.
            let (o, i): (usize, usize) = (parts.iter().map(|s| s.shape[0]).sum(), spec.shape[1]);
            let rows = kernels::cpu::BLOCK_ROWS;
            match (spec.kind, form) {
                (_, Form::Narrow) => {
                    out.push(param(spec.key.clone(), spec.shape.clone(), ElementType::F32, Role::Widened))
                }
                (_, Form::CpuDense) => {
                    let dims = vec![o / rows, i * rows];
                    out.push(param(format!("{prefix}.weight"), dims, self.precision.matrix_elem(), Role::DenseBlocks))
                }
                (_, Form::Dense) => {
                    out.push(param(spec.key.clone(), spec.shape.clone(), self.precision.matrix_elem(), Role::Dense))
                }
                (_, Form::Bf16Bits) => {
                    out.push(param(spec.key.clone(), spec.shape.clone(), ElementType::I16, Role::Dense))
                }
                (Kind::Experts, Form::GraphMxfp8) => {
                    // The stacked tensors as stored: [E, O, I] codes, [E, O, I / 32] scales.
                    let (e, o, i) = (spec.shape[0], spec.shape[1], spec.shape[2]);
                    let groups = i / kernels::cpu::MXFP8_GROUP;
                    out.push(param(format!("{prefix}.weight"), vec![e, o, i], ElementType::I8, Role::Mxfp8Codes));
                    out.push(param(format!("{prefix}.scales"), vec![e, o, groups], ElementType::I8, Role::Mxfp8Scales));
                }
                (_, Form::GraphMxfp8 | Form::CpuMxfp8) => {
                    let groups = i / kernels::cpu::MXFP8_GROUP;
                    let (codes, scales) = if form == Form::CpuMxfp8 {
                        (vec![o / rows, i * rows], vec![o / rows, groups * rows])
                    } else {
                        (vec![o, i], vec![o, groups])
                    };
                    out.push(param(format!("{prefix}.weight"), codes, ElementType::I8, Role::Mxfp8Codes));
                    out.push(param(format!("{prefix}.scales"), scales, ElementType::I8, Role::Mxfp8Scales));
                }
                (Kind::Experts, Form::CpuPacked(p) | Form::GraphPacked(p) | Form::CudaPacked(p)) => {
                    let (e, o, i) = (spec.shape[0], spec.shape[1], spec.shape[2]);
                    let (weight, groups) = if form.in_cpu_kernel() {
                        // Each expert in the kernel's blocks, stacked: [E, O/16, bytes per block].
                        let blocks = o / rows;
                        (vec![e, blocks, i * p.bits as usize * rows / 8], vec![e, blocks, i / p.group_size * rows])
                    } else {
                        (vec![e, o, i * p.bits as usize / 8], vec![e, o, i / p.group_size])
                    };
                    out.push(param(format!("{prefix}.weight"), weight, ElementType::I8, Role::ExpertWeight));
                    out.push(param(format!("{prefix}.scales"), groups.clone(), p.scale_elem, Role::ExpertScales));
                    if p.has_biases() {
                        out.push(param(format!("{prefix}.biases"), groups, p.bias_elem, Role::ExpertBiases));
                    }
                }
                (_, Form::CpuPacked(p)) => {
                    // [O/16, bytes per 16-row block] and [O/16, G * 16]: the kernel's blocks.
                    let blocks = o / rows;
                    let groups = vec![blocks, i / p.group_size * rows];
                    let weight = vec![blocks, i * p.bits as usize * rows / 8];
                    out.push(param(format!("{prefix}.weight"), weight, ElementType::I8, Role::PackedWeight));
                    out.push(param(format!("{prefix}.scales"), groups.clone(), p.scale_elem, Role::PackedScales));
                    if p.has_biases() {
                        out.push(param(format!("{prefix}.biases"), groups, p.bias_elem, Role::PackedBiases));
                    }
                }
                (_, Form::GraphPacked(p) | Form::CudaPacked(p)) => {
                    let groups = vec![o, i / p.group_size];
                    // A 4-bit table's rows are read as bytes: the embedding's beside its weight
                    // (a tied head reads that), Gemma 4's per-layer table's only so.
                    let table = prefix == EMBEDDING || prefix == PER_LAYER_EMBEDDING;
                    if p.weight_elem() == ElementType::I4 && table {
                        let mut rows =
                            param(format!("{prefix}.weight"), vec![o, i / 2], ElementType::I8, Role::PackedRows);
                        rows.global = format!("{prefix}.weight.rows");
                        out.push(rows);
                    }
                    if !(p.weight_elem() == ElementType::I4 && prefix == PER_LAYER_EMBEDDING) {
                        out.push(param(format!("{prefix}.weight"), vec![o, i], p.weight_elem(), Role::PackedWeight));
                    }
                    out.push(param(format!("{prefix}.scales"), groups.clone(), p.scale_elem, Role::PackedScales));
                    out.push(param(format!("{prefix}.biases"), groups, p.bias_elem, Role::PackedBiases));
                }
            }
        }
        out
    }

    /// The bytes of one device parameter: borrowed from the checkpoint when they are already
    /// in the device form, else converted (dense matrices rounded to nearest even, packed
    /// weights bit-flipped, biases adjusted).
    pub fn load<'a>(&self, ckpt: &'a Checkpoint, param: &DeviceParam) -> Result<Cow<'a, [u8]>> {
        match param.role {
            // bf16 bit patterns are bf16's bytes.
            Role::Dense if param.elem == ElementType::I16 => {
                crate::params::load_param(ckpt, &param.spec, ElementType::BF16)
            }
            Role::Vector | Role::Dense => crate::params::load_param(ckpt, &param.spec, param.elem),
            Role::DenseBlocks => {
                // Each part's blocks in order (whole blocks: stacking them stacks the rows).
                let mut out = Vec::with_capacity(param.bytes());
                for part in &param.parts {
                    let bytes = crate::params::load_param(ckpt, part, param.elem)?;
                    let bits: Vec<u16> = bytes.chunks_exact(2).map(|b| u16::from_le_bytes([b[0], b[1]])).collect();
                    let blocks = kernels::cpu::repack_dense(&bits, part.shape[0], part.shape[1]);
                    out.extend(blocks.iter().flat_map(|b| b.to_le_bytes()));
                }
                Ok(Cow::Owned(out))
            }
            Role::Mxfp8Codes | Role::Mxfp8Scales if param.spec.kind == Kind::Experts => {
                // Stacked experts: the tensors as stored (`pack_mxfp8` read every expert of
                // them at config.json's shape).
                let name = if param.role == Role::Mxfp8Codes { "weight" } else { "scales" };
                let bytes = ckpt.tensor(&format!("{}.{name}", param.spec.prefix()))?.bytes();
                debug_assert_eq!(bytes.len(), param.bytes(), "{}", param.key);
                Ok(Cow::Borrowed(bytes))
            }
            Role::Mxfp8Codes | Role::Mxfp8Scales => {
                // The stored bytes, or each part's in the kernel's blocks (stacked: whole blocks).
                let blocks = self.form(param.spec.prefix()) == Some(Form::CpuMxfp8);
                let mut out = Vec::with_capacity(param.bytes());
                for part in &param.parts {
                    let q = quantized_layer(ckpt, part)?;
                    let (o, i) = (q.out_features(), q.in_features());
                    let (bytes, cols) = if param.role == Role::Mxfp8Codes {
                        (q.weight().bytes(), i)
                    } else {
                        (q.scales().bytes(), i / kernels::cpu::MXFP8_GROUP)
                    };
                    if param.parts.len() == 1 && !blocks {
                        return Ok(Cow::Borrowed(bytes));
                    }
                    if blocks {
                        out.extend(kernels::cpu::repack_dense(bytes, o, cols));
                    } else {
                        out.extend_from_slice(bytes);
                    }
                }
                debug_assert_eq!(out.len(), param.bytes(), "{}", param.key);
                Ok(Cow::Owned(out))
            }
            Role::Widened => {
                // The values the precision's element type holds, as f32 (round to nearest even);
                // at `packed`, a quantized per-head matrix keeps its dequantized values exactly
                // (MLX multiplies by those).
                let exact = self.precision == Precision::Packed
                    && param.spec.kind == Kind::Heads
                    && crate::params::heads_quantized(ckpt, &param.spec)?;
                let round: fn(f32) -> f32 = match self.precision.matrix_elem() {
                    _ if exact => |x| x,
                    ElementType::F16 => |x| half::f16::from_f32(x).to_f32(),
                    ElementType::BF16 => |x| half::bf16::from_f32(x).to_f32(),
                    _ => |x| x,
                };
                let values = crate::params::load_f32(ckpt, &param.spec)?;
                Ok(Cow::Owned(encode_f32(values.into_iter().map(round), ElementType::F32)))
            }
            Role::ExpertWeight | Role::ExpertScales | Role::ExpertBiases => {
                let prefix = param.spec.prefix();
                let form = self.form(prefix);
                let packing = form
                    .as_ref()
                    .and_then(Form::packing)
                    .ok_or_else(|| Error::Invalid(format!("{prefix}: no packing in the layout")))?;
                let (role, name) = match param.role {
                    Role::ExpertWeight => (Role::PackedWeight, "weight"),
                    Role::ExpertScales => (Role::PackedScales, "scales"),
                    _ => (Role::PackedBiases, "biases"),
                };
                let kernel = form.is_some_and(|f| f.in_cpu_kernel());
                if !kernel {
                    // The stacked tensors as stored where the graph form holds them at their own
                    // width; expert 0 checks the quantization.
                    let Linear::Quantized(q) = param.spec.expert(ckpt, 0)? else {
                        return Err(Error::Invalid(format!("{}: expected quantized experts", param.key)));
                    };
                    if Affine::stored_at(&q, packing) {
                        let t = ckpt.tensor(&format!("{prefix}.{name}"))?;
                        let bytes = if name == "weight" { Cow::Borrowed(t.bytes()) } else { as_float(t, param.elem)? };
                        debug_assert_eq!(bytes.len(), param.bytes(), "{} ({q:?})", param.key);
                        return Ok(bytes);
                    }
                }
                // Each expert in the kernel layout, or its exact affine copy (MLX's values and
                // biases as they are) in the graph form, stacked.
                let mut bytes = Vec::with_capacity(param.bytes());
                for e in 0..param.spec.shape[0] {
                    let Linear::Quantized(q) = param.spec.expert(ckpt, e)? else {
                        return Err(Error::Invalid(format!("{}: expert {e} is not quantized", param.key)));
                    };
                    let a = Affine::of(q, packing)?;
                    let part = match role {
                        _ if kernel => kernel_bytes(&a, packing, role)?,
                        Role::PackedWeight => Cow::Borrowed(a.weight()),
                        Role::PackedScales => a.scales_as(param.elem)?,
                        _ => Cow::Owned(encode_f32(a.biases_f32()?.into_iter(), param.elem)),
                    };
                    bytes.extend_from_slice(&part);
                }
                Ok(Cow::Owned(bytes))
            }
            Role::PackedWeight | Role::PackedScales | Role::PackedBiases if param.parts.len() > 1 => {
                // A merged projection: the parts stacked by rows (in the kernel layout whole
                // 16-row blocks, in the graph form whole rows, so stacking the parts' bytes
                // stacks the matrices).
                let mut bytes = Vec::with_capacity(param.bytes());
                for part in &param.parts {
                    let (form, q) = self.packed_layer(ckpt, part)?;
                    bytes.extend_from_slice(&packed_bytes(&q, &form, param.role, param.elem)?);
                }
                Ok(Cow::Owned(bytes))
            }
            Role::PackedWeight | Role::PackedScales | Role::PackedBiases | Role::PackedRows => {
                let (form, q) = self.packed_layer(ckpt, &param.spec)?;
                let bytes = packed_bytes(&q, &form, param.role, param.elem)?;
                debug_assert_eq!(bytes.len(), param.bytes(), "{}", param.key);
                Ok(bytes)
            }
        }
    }

    /// The packed form of the matrix `spec` and its quantized layer in the checkpoint (at the
    /// form's width), which must have the shape config.json gives it.
    fn packed_layer<'a>(&self, ckpt: &'a Checkpoint, spec: &ParamSpec) -> Result<(Form, Affine<'a>)> {
        let prefix = spec.prefix();
        let form = self
            .form(prefix)
            .filter(|f| f.packing().is_some())
            .ok_or_else(|| Error::Invalid(format!("{prefix}: no packing in the layout")))?;
        let q = quantized_layer(ckpt, spec)?;
        let packing = form.packing().ok_or_else(|| Error::Invalid(format!("{prefix}: no packing in the layout")))?;
        Ok((form, Affine::of(q, packing)?))
    }
}

/// The quantized layer `spec` in the checkpoint, which must have the shape config.json gives it.
fn quantized_layer<'a>(ckpt: &'a Checkpoint, spec: &ParamSpec) -> Result<weights::QuantizedLinear<'a>> {
    let prefix = spec.prefix();
    let Linear::Quantized(q) = spec.linear(ckpt)? else {
        return Err(Error::Invalid(format!("{prefix}: expected a quantized layer in {}", ckpt.dir().display())));
    };
    if [q.out_features(), q.in_features()] != spec.shape[..] {
        return Err(Error::Invalid(format!(
            "{prefix}: expected shape {:?} from config.json, got {:?}",
            spec.shape,
            [q.out_features(), q.in_features()]
        )));
    }
    Ok(q)
}

/// The bits the CUDA kernel reads a graph-packed matrix as: a 4-bit one held one value a
/// byte (`Packing::wide`) as 8-bit (its bytes are the signed values, its biases those of 4
/// bits).
pub fn cuda_bits(p: &Packing) -> u32 {
    if p.wide { 8 } else { p.bits }
}

/// The matrices (and stacked experts) among the model's parameters.
fn matrix_specs(cfg: &ModelConfig) -> impl Iterator<Item = ParamSpec> {
    param_specs(cfg).into_iter().filter(|s| s.kind != Kind::Vector)
}

/// Each matrix's `[out, in]` by prefix; a stacked expert layer's are its experts'.
fn matrix_shapes(cfg: &ModelConfig) -> HashMap<String, Vec<usize>> {
    param_specs(cfg)
        .into_iter()
        .filter(|s| s.kind != Kind::Vector)
        .map(|s| (s.prefix().to_owned(), s.shape[s.shape.len() - 2..].to_vec()))
        .collect()
}

/// A packed matrix's values at the layout's width: the checkpoint's own tensors, or the exact
/// affine copy a narrower width or an FP4 mode is held as (`QuantizedLinear::to_affine`).
enum Affine<'a> {
    Stored(Box<weights::QuantizedLinear<'a>>),
    Copy(Box<weights::AffineCopy>),
    /// FP4 codes as stored, with the scales the CPU kernel reads against them (`s / 2`).
    Codes(Box<weights::QuantizedLinear<'a>>, Vec<f32>),
}

impl<'a> Affine<'a> {
    /// Whether the checkpoint stores `q` as `packing` holds it.
    fn stored_at(q: &weights::QuantizedLinear<'_>, packing: &Packing) -> bool {
        q.mode() == weights::QuantMode::Affine && q.bits() == packing.bits
    }

    /// `q` at `packing`'s width.
    fn of(q: weights::QuantizedLinear<'a>, packing: &Packing) -> Result<Affine<'a>> {
        if Self::stored_at(&q, packing) {
            return Ok(Affine::Stored(Box::new(q)));
        }
        if !packing.has_biases() {
            let scales = q.fp4_scales().ok_or_else(|| {
                Error::Invalid(format!("{}: {} held as FP4 codes", q.weight().name(), q.mode().name()))
            })?;
            return Ok(Affine::Codes(Box::new(q), scales));
        }
        match q.to_affine() {
            Some(copy) if copy.bits == packing.bits => Ok(Affine::Copy(Box::new(copy))),
            _ => Err(Error::Invalid(format!(
                "{}: {}-bit {} is not held at {} bits",
                q.weight().name(),
                q.bits(),
                q.mode().name(),
                packing.bits
            ))),
        }
    }

    /// `[out, in]`.
    fn shape(&self) -> (usize, usize) {
        match self {
            Affine::Stored(q) | Affine::Codes(q, _) => (q.out_features(), q.in_features()),
            Affine::Copy(c) => (c.out_features, c.in_features),
        }
    }

    /// MLX's packing of the values (`[out, in * bits / 8]` bytes).
    fn weight(&self) -> &[u8] {
        match self {
            Affine::Stored(q) | Affine::Codes(q, _) => q.weight().bytes(),
            Affine::Copy(c) => &c.weight,
        }
    }

    /// The scales as bytes of `elem`: the checkpoint's own where stored so.
    fn scales_as(&self, elem: ElementType) -> Result<Cow<'a, [u8]>> {
        match self {
            Affine::Stored(q) => as_float(q.scales(), elem),
            Affine::Copy(c) => Ok(Cow::Owned(encode_f32(c.scales.iter().copied(), elem))),
            Affine::Codes(_, scales) => Ok(Cow::Owned(encode_f32(scales.iter().copied(), elem))),
        }
    }

    /// The checkpoint's own scale bytes (`[out, groups]`, one byte each: E8M0 or E4M3).
    fn scale_bytes(&self) -> Result<&[u8]> {
        match self {
            Affine::Stored(q) | Affine::Codes(q, _) if q.scales().dtype() == Dtype::U8 => Ok(q.scales().bytes()),
            _ => Err(Error::Invalid("scale bytes asked of scales that are not bytes".into())),
        }
    }

    fn scales_f32(&self) -> Result<Vec<f32>> {
        match self {
            Affine::Stored(q) => Ok(q.scales().to_f32_vec()?),
            Affine::Copy(c) => Ok(c.scales.clone()),
            Affine::Codes(_, scales) => Ok(scales.clone()),
        }
    }

    fn biases_f32(&self) -> Result<Vec<f32>> {
        match self {
            Affine::Stored(q) => Ok(affine_biases(q)?.to_f32_vec()?),
            Affine::Copy(c) => Ok(c.biases.clone()),
            Affine::Codes(q, _) => Err(Error::Invalid(format!("{}: FP4 codes have no biases", q.weight().name()))),
        }
    }
}

/// A packed matrix's tensor `role` as the device holds it: in the CPU kernel's layout or
/// in the graph form.
fn packed_bytes<'a>(q: &Affine<'a>, form: &Form, role: Role, elem: ElementType) -> Result<Cow<'a, [u8]>> {
    match form {
        Form::CpuPacked(p) => kernel_bytes(q, p, role),
        Form::GraphPacked(p) | Form::CudaPacked(p) => graph_bytes(q, p, role, elem),
        Form::Dense | Form::Bf16Bits | Form::Narrow | Form::CpuDense | Form::GraphMxfp8 | Form::CpuMxfp8 => {
            Err(Error::Invalid(format!("packed bytes asked of a {form:?} matrix")))
        }
    }
}

/// A packed matrix's tensor `role` in the graph form (`Packing::wide` 4-bit one value a
/// byte, values' top bits flipped to signed, the offset folded into the biases), scales as
/// `elem`.
fn graph_bytes<'a>(q: &Affine<'a>, packing: &Packing, role: Role, elem: ElementType) -> Result<Cow<'a, [u8]>> {
    match role {
        Role::PackedWeight if packing.wide => {
            // Each nibble q as its own byte, q - 8 where flipped (element 2j is the low nibble).
            let off = packing.offset() as u8;
            Ok(Cow::Owned(
                q.weight().iter().flat_map(|b| [(b & 0xF).wrapping_sub(off), (b >> 4).wrapping_sub(off)]).collect(),
            ))
        }
        Role::PackedWeight | Role::PackedRows if !packing.flipped => Ok(Cow::Owned(q.weight().to_vec())),
        Role::PackedWeight | Role::PackedRows => {
            // Flip each value's top bit: nibbles with 0x88, bytes with 0x80.
            let flip = if packing.bits == 4 { 0x88u8 } else { 0x80 };
            Ok(Cow::Owned(q.weight().iter().map(|b| b ^ flip).collect()))
        }
        Role::PackedScales => q.scales_as(elem),
        _ => {
            let scales = q.scales_f32()?;
            let biases = q.biases_f32()?;
            let adjusted = biases.iter().zip(&scales).map(|(b, s)| b + packing.offset() * s);
            Ok(Cow::Owned(encode_f32(adjusted, packing.bias_elem)))
        }
    }
}

/// A packed matrix's tensors in the CPU kernel's layout (MLX's unsigned values and biases
/// as they are; only the order changes, plus f32 for non-f16 scales).
fn kernel_bytes(q: &Affine<'_>, p: &Packing, role: Role) -> Result<Cow<'static, [u8]>> {
    let (o, i) = q.shape();
    let groups = i / p.group_size;
    // `link_cpu_kernels` made the scale type f16, f32 or (mxfp4's bytes) I8.
    let values = |v: Vec<f32>| encode_f32(kernels::cpu::repack_groups(&v, o, groups).into_iter(), p.scale_elem);
    Ok(Cow::Owned(match role {
        Role::PackedWeight => kernels::cpu::repack_weight(p.bits, o, i, q.weight()),
        // mxfp4's E8M0 bytes as stored.
        Role::PackedScales if p.scale_elem == ElementType::I8 => {
            kernels::cpu::repack_groups(q.scale_bytes()?, o, groups)
        }
        Role::PackedScales => values(q.scales_f32()?),
        _ => values(q.biases_f32()?),
    }))
}

/// An affine layer's biases ([`Layout::pack`] keeps only affine layers packed).
fn affine_biases<'a>(q: &weights::QuantizedLinear<'a>) -> Result<weights::TensorView<'a>> {
    q.biases().ok_or_else(|| Error::Invalid(format!("{}: a {} layer packed", q.weight().name(), q.mode().name())))
}

/// The element type of a float checkpoint dtype (f16, bf16, f32), else `None`.
fn float_elem(dtype: Dtype) -> Option<ElementType> {
    match dtype {
        Dtype::F16 => Some(ElementType::F16),
        Dtype::BF16 => Some(ElementType::BF16),
        Dtype::F32 => Some(ElementType::F32),
        _ => None,
    }
}

/// A float tensor's values in `elem`: its bytes where it is stored so, else converted
/// (rounded to nearest even).
fn as_float<'a>(t: weights::TensorView<'a>, elem: ElementType) -> Result<Cow<'a, [u8]>> {
    if float_elem(t.dtype()) == Some(elem) {
        return Ok(Cow::Borrowed(t.bytes()));
    }
    Ok(Cow::Owned(encode_f32(t.to_f32_vec()?.into_iter(), elem)))
}

/// f32 values as little-endian bytes of `elem` (f32, f16 or bf16), rounding to nearest even.
pub(crate) fn encode_f32(values: impl Iterator<Item = f32>, elem: ElementType) -> Vec<u8> {
    match elem {
        ElementType::F16 => values.flat_map(|x| half::f16::from_f32(x).to_le_bytes()).collect(),
        ElementType::BF16 => values.flat_map(|x| half::bf16::from_f32(x).to_le_bytes()).collect(),
        _ => values.flat_map(|x| x.to_le_bytes()).collect(),
    }
}
