//! The decoder as StableHLO: one step body emitted for a chunk of one sequence's prompt
//! (`prefill`) and for one token of each of several sequences (`decode`), over a KV cache of
//! per-sequence slots, plus the function that writes a step's keys and values into it.
//!
//! Function signatures (`R` rows; `n` sequences of `m` rows each: prefill n = 1, m = T;
//! decode n = B, m = 1; `L` layers, `K` kv heads, `hd` head dim):
//! - `prefill_t{T}_w{W}(tokens: i32[T], positions: i32[T], slots: i32[1], last: i32[1], k, v)
//!   -> (next: i32[1], logits: f32[1, V], new_k: [L, T, K, hd], new_v)`
//! - `decode_b{B}_w{W}(tokens: i32[B], positions: i32[B], slots: i32[B], k, v)
//!   -> (next: i32[B], logits: f32[B, V], new_k: [L, B, K, hd], new_v)`
//! - `write_kv_r{R}(positions: i32[R], slots: i32[R], new_k, new_v, k, v) -> (k', v')`
//!
//! `k`, `v` are `[layers, slots, positions, kv_heads, head_dim]` in the cache's element type
//! (positions before heads: IREE 3.13 lowers a scatter only when its inserted dims lead).
//! The step functions only read the cache: attention gathers positions `[0, W)` of each
//! sequence's slot and puts the step's own keys and values into that small copy (a
//! `scatter` at each row's position), masked to `<= positions[r]`. The caller then runs
//! `write_kv` to scatter the new rows into the cache at (slot, position), in place. Reads and
//! writes live in separate calls because a cache that one function both updates and reads
//! back was copied whole by IREE on every call (docs/PERFORMANCE.md); positions and slots
//! are data, never slice offsets (a run-time slice offset costs a host round trip on a GPU,
//! BRIEF 7). `last` picks the row of the prompt chunk whose logits are returned. Callers keep
//! every position below `W` and the cache's capacity, and never put two rows of one call on
//! one slot and position unless the rows are identical (padding): they then write the same
//! bytes.

use crate::config::{Activation, ModelConfig, Moe, Routing};
use crate::error::Result;
use crate::layout::{Layout, Packing};
use crate::params::layer_prefix;
use crate::rope::RopeTable;
use hlo_emit::{
    Cmp, Context, DotDims, ElementType, ElementType::*, Func, GatherDims, Global, Module, ScatterDims, Value,
};
use std::cell::RefCell;
use std::collections::{BTreeSet, HashMap};

/// Parameter scope name the globals are bound to.
pub const SCOPE: &str = "model";

/// Element type of the KV cache on the device.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum KvElem {
    #[default]
    F32,
    F16,
}

impl KvElem {
    pub fn bytes(self) -> usize {
        match self {
            KvElem::F32 => 4,
            KvElem::F16 => 2,
        }
    }

    fn elem(self) -> ElementType {
        match self {
            KvElem::F32 => F32,
            KvElem::F16 => F16,
        }
    }
}

impl std::fmt::Display for KvElem {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            KvElem::F32 => "f32",
            KvElem::F16 => "f16",
        })
    }
}

impl std::str::FromStr for KvElem {
    type Err = String;
    fn from_str(s: &str) -> std::result::Result<Self, String> {
        match s {
            "f32" => Ok(KvElem::F32),
            "f16" => Ok(KvElem::F16),
            other => Err(format!("unknown KV cache type `{other}` (expected f32 or f16)")),
        }
    }
}

/// The KV cache every function of a model reads and writes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct CacheShape {
    /// Sequences the cache holds at once.
    pub slots: usize,
    /// Positions per slot (the most context a sequence can have).
    pub positions: usize,
    pub elem: KvElem,
}

impl CacheShape {
    /// `[layers, slots, positions, kv_heads, head_dim]` of one of the two caches (k or v).
    pub fn dims(&self, cfg: &ModelConfig) -> [usize; 5] {
        [cfg.num_layers(), self.slots, self.positions, cfg.kv_heads, cfg.head_dim]
    }

    /// Device bytes of the k and v caches together.
    pub fn bytes(&self, cfg: &ModelConfig) -> usize {
        2 * self.dims(cfg).iter().product::<usize>() * self.elem.bytes()
    }

    /// Device bytes the k and v caches take per position of one slot.
    pub fn bytes_per_position(cfg: &ModelConfig, elem: KvElem) -> usize {
        2 * cfg.num_layers() * cfg.kv_heads * cfg.head_dim * elem.bytes()
    }
}

/// An entry point of the module. Every function shares the globals and the cache layout.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Function {
    /// `tokens` consecutive tokens of one sequence; attention reads positions `[0, window)`.
    Prefill { tokens: usize, window: usize },
    /// One token for each of `rows` sequences; attention reads positions `[0, window)`.
    Decode { rows: usize, window: usize },
    /// `rows` tokens of several sequences at once (a sequence's rows consecutive and in
    /// position order: prompt chunks and decode rows in one call), with the logits of `outs`
    /// chosen rows (the last of each sequence). Only where attention runs in the CPU kernel
    /// ([`attention_in_kernel`]), which tells a row's own sequence's earlier rows by slot;
    /// attention reads positions `[0, window)`.
    Mixed { rows: usize, outs: usize, window: usize },
    /// Writes `rows` rows of keys and values (a step's `new_k`, `new_v`) into the cache.
    WriteKv { rows: usize },
}

impl Function {
    pub fn name(self) -> String {
        match self {
            Function::Prefill { tokens, window } => format!("prefill_t{tokens}_w{window}"),
            Function::Decode { rows, window } => format!("decode_b{rows}_w{window}"),
            Function::Mixed { rows, outs, window } => format!("mixed_r{rows}_o{outs}_w{window}"),
            Function::WriteKv { rows } => format!("write_kv_r{rows}"),
        }
    }

    /// Sequences and rows per sequence (a mixed call's rows each count as one: its
    /// sequences are told apart by slot, in the attention kernel).
    fn split(self) -> (usize, usize) {
        match self {
            Function::Prefill { tokens, .. } => (1, tokens),
            Function::Decode { rows, .. } | Function::Mixed { rows, .. } | Function::WriteKv { rows } => (rows, 1),
        }
    }

    /// Rows whose logits the function returns: the last of a prompt chunk, every decode row,
    /// a mixed call's chosen rows (none for `WriteKv`).
    pub fn outs(self) -> usize {
        match self {
            Function::Prefill { .. } => 1,
            Function::Decode { rows, .. } => rows,
            Function::Mixed { outs, .. } => outs,
            Function::WriteKv { .. } => 0,
        }
    }

    /// Positions attention reads (none for `WriteKv`).
    pub fn window(self) -> usize {
        match self {
            Function::Prefill { window, .. } | Function::Decode { window, .. } | Function::Mixed { window, .. } => {
                window
            }
            Function::WriteKv { .. } => 0,
        }
    }

    /// Rows of the token input.
    pub fn rows(self) -> usize {
        let (n, m) = self.split();
        n * m
    }
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
    /// cheap on CPU, a round trip per call on a GPU (BRIEF 7). For CPU targets.
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

/// How a packed matrix multiplies its input in the graph form (the CPU kernels aside).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum PackedProducts {
    /// Integer products per group (`x` quantized to i16 per row), scales and biases once per
    /// group: the packed weight is read inside one contraction (BRIEF 4).
    #[default]
    IntegerGroups,
    /// The weight dequantized to f32 (`s * q + b`), then a float contraction. For SPIR-V
    /// targets: IREE 3.13 computes the grouped integer contraction wrong there once it has
    /// several rows (16 rows of i16 x i8 on lavapipe gave sums off by about 2^28), and the
    /// float form is also closer to MLX's own `qmm`.
    Dequantized,
}

/// Settings of the emitted graphs that depend on the target; the defaults suit every target
/// but SPIR-V ones (see [`PackedProducts`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct EmitOptions {
    pub slot_read: SlotRead,
    pub expert_products: ExpertProducts,
    pub packed_products: PackedProducts,
}

/// Whether attention (decode and prefill) runs in the CPU kernel (`kernels::cpu`, `attn`)
/// for this model and layout: the layout links the kernel object (packed, f16 or bf16
/// weights on an `llvm-cpu` target), the scores are not soft-capped and the kernel takes the heads. It then
/// reads only the positions in use, whatever the function's window.
pub fn attention_in_kernel(cfg: &ModelConfig, layout: &Layout) -> bool {
    layout.kernel_object().is_some()
        && cfg.attn_softcap.is_none()
        && kernels::cpu::supports_attention(cfg.heads, cfg.kv_heads, cfg.head_dim)
}

/// Emits `functions` over `cache`, in a module named `module_name` when given (modules loaded
/// side by side in one session need distinct names; they share the parameter scope).
pub fn emit_functions(
    cfg: &ModelConfig,
    layout: &Layout,
    cache: CacheShape,
    functions: &[Function],
    module_name: Option<&str>,
) -> Result<String> {
    emit_functions_with(cfg, layout, cache, functions, module_name, EmitOptions::default())
}

/// [`emit_functions`] with target-dependent [`EmitOptions`].
pub fn emit_functions_with(
    cfg: &ModelConfig,
    layout: &Layout,
    cache: CacheShape,
    functions: &[Function],
    module_name: Option<&str>,
    options: EmitOptions,
) -> Result<String> {
    for function in functions {
        let (rows, window) = (function.rows(), function.window());
        let reads = !matches!(function, Function::WriteKv { .. });
        if rows == 0 || (reads && window == 0) || window > cache.positions || cache.slots == 0 {
            return Err(crate::Error::Invalid(format!(
                "function {} does not fit a cache of {} slots x {} positions",
                function.name(),
                cache.slots,
                cache.positions
            )));
        }
        if let Function::Mixed { rows, outs, .. } = *function
            && (outs == 0 || outs > rows || !attention_in_kernel(cfg, layout))
        {
            return Err(crate::Error::Invalid(format!(
                "function {} needs 1 to {rows} outputs and attention in the CPU kernel",
                function.name()
            )));
        }
    }
    let ctx = Context::new();
    let m = match module_name {
        Some(name) => Module::named(&ctx, name)?,
        None => Module::new(&ctx),
    };
    let mut globals = HashMap::new();
    for (i, p) in layout.device_params(cfg).iter().enumerate() {
        let dims: Vec<i64> = p.dims.iter().map(|d| *d as i64).collect();
        globals.insert(p.global.clone(), m.global_param(&format!("p{i}"), SCOPE, &p.key, &p.elem.tensor(&dims))?);
    }
    let kv = cache.elem.elem().tensor(&cache.dims(cfg).map(|d| d as i64));
    let entries = RefCell::new(BTreeSet::new());
    let cuda_entries = RefCell::new(BTreeSet::new());
    let attention = RefCell::new(BTreeSet::new());
    let dense = RefCell::new(BTreeSet::new());
    let kv_dims = cache.dims(cfg);
    // A step's new rows travel in f32; `write_kv` converts them to the cache's type.
    let rows_kv = |r: usize| F32.tensor(&[kv_dims[0] as i64, r as i64, kv_dims[3] as i64, kv_dims[4] as i64]);
    for &function in functions {
        let (n, rows) = (function.split().0 as i64, function.rows() as i64);
        if let Function::WriteKv { .. } = function {
            let inputs = [
                I32.tensor(&[rows]),
                I32.tensor(&[rows]),
                rows_kv(rows as usize),
                rows_kv(rows as usize),
                kv.clone(),
                kv.clone(),
            ];
            m.func(&function.name(), &inputs, |f, a| write_kv(f, a[0], a[1], a[2], a[3], a[4], a[5]))?;
            continue;
        }
        let mut inputs = vec![I32.tensor(&[rows]), I32.tensor(&[rows]), I32.tensor(&[n])];
        if let Function::Prefill { .. } | Function::Mixed { .. } = function {
            inputs.push(I32.tensor(&[function.outs() as i64]));
        }
        inputs.extend([kv.clone(), kv.clone()]);
        m.func(&function.name(), &inputs, |f, a| {
            let step = Step {
                f,
                cfg,
                layout,
                globals: &globals,
                entries: &entries,
                cuda_entries: &cuda_entries,
                attention: &attention,
                dense: &dense,
                merged_out: RefCell::new(HashMap::new()),
                normed: RefCell::new(Vec::new()),
                function,
                kv_elem: cache.elem.elem(),
                options,
            };
            let last = if a.len() == 6 { Some(a[3]) } else { None };
            let (k, v) = (a[a.len() - 2], a[a.len() - 1]);
            step.emit(a[0], a[1], a[2], last, k, v).map_err(|e| match e {
                crate::Error::Graph(g) => g,
                other => hlo_emit::Error::Mlir { what: "decoder step".into(), detail: other.to_string() },
            })
        })?;
    }
    if let Some(object) = layout.kernel_object() {
        let entries: Vec<_> = entries.into_inner().into_iter().collect();
        let attention: Vec<_> = attention.into_inner().into_iter().collect();
        let dense: Vec<_> = dense.into_inner().into_iter().collect();
        if !entries.is_empty() || !attention.is_empty() || !dense.is_empty() {
            let source = kernels::cpu::executable_source(object, &entries, &attention, &dense);
            m.append_source(kernels::cpu::EXECUTABLE, &source)?;
        }
    }
    let cuda_entries: Vec<_> = cuda_entries.into_inner().into_iter().collect();
    if let (Some(ptx), false) = (kernels::cuda::ptx(), cuda_entries.is_empty()) {
        m.append_source(kernels::cuda::EXECUTABLE, &kernels::cuda::executable_source(ptx, &cuda_entries))?;
    }
    Ok(m.to_text())
}

/// `write_kv`: every layer's new rows `[L, R, K, hd]` (f32) scattered into the cache at
/// (layer, slot, position) in the cache's type, one scatter per cache; nothing else touches
/// the cache here, so IREE updates it in place.
fn write_kv<'c, 'b>(
    f: &Func<'c, 'b>,
    positions: V<'c, 'b>,
    slots: V<'c, 'b>,
    new_k: V<'c, 'b>,
    new_v: V<'c, 'b>,
    k: V<'c, 'b>,
    v: V<'c, 'b>,
) -> R<Vec<V<'c, 'b>>> {
    let dims = new_k.shape();
    let (l, r) = (dims[0], dims[1]);
    let column = |x: V<'c, 'b>| -> R<V<'c, 'b>> { f.reshape(f.broadcast_in_dim(x, &[l, r], &[1])?, &[l * r, 1]) };
    let layer = f.reshape(f.iota(&I32.tensor(&[l, r]), 0)?, &[l * r, 1])?;
    let indices = f.concatenate(&[layer, column(slots)?, column(positions)?], 1)?;
    let scatter_dims = ScatterDims {
        update_window_dims: vec![1, 2],
        inserted_window_dims: vec![0, 1, 2],
        scatter_dims_to_operand_dims: vec![0, 1, 2],
        index_vector_dim: 1,
        ..ScatterDims::default()
    };
    let flat = |x: V<'c, 'b>| -> R<V<'c, 'b>> {
        let x = if x.elem() == k.elem() { x } else { f.convert(x, k.elem())? };
        f.reshape(x, &[l * r, dims[2], dims[3]])
    };
    Ok(vec![
        f.scatter(k, indices, flat(new_k)?, scatter_dims.clone())?,
        f.scatter(v, indices, flat(new_v)?, scatter_dims)?,
    ])
}

/// How the CUDA kernel (`kernels::cuda`) reads a packed matrix: the bits of its stored
/// values, its scales' type and its group size.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct CudaForm {
    bits: u32,
    scale: kernels::cuda::Scale,
    group_size: usize,
}

struct Step<'a, 'c, 'b> {
    f: &'a Func<'c, 'b>,
    cfg: &'a ModelConfig,
    layout: &'a Layout,
    globals: &'a HashMap<String, Global>,
    /// Kernel entry points the functions dispatch (declared once, after emission).
    entries: &'a RefCell<BTreeSet<kernels::cpu::Entry>>,
    /// The CUDA kernel's entry points the step dispatches.
    cuda_entries: &'a RefCell<BTreeSet<kernels::cuda::Entry>>,
    /// Attention entry points the functions dispatch.
    attention: &'a RefCell<BTreeSet<kernels::cpu::Attention>>,
    /// Dense (f16, bf16) product entry points the functions dispatch.
    dense: &'a RefCell<BTreeSet<kernels::cpu::Dense>>,
    /// Outputs of merged projections already computed in this function.
    merged_out: RefCell<HashMap<String, V<'c, 'b>>>,
    /// Each RMSNorm's (output, input, weight), where the CUDA kernel links: a matvec reading
    /// a norm's output takes its input and weight instead and norms in its prologue.
    normed: RefCell<Vec<(V<'c, 'b>, V<'c, 'b>, V<'c, 'b>)>>,
    function: Function,
    kv_elem: ElementType,
    options: EmitOptions,
}

type V<'c, 'b> = Value<'c, 'b>;
type R<T> = std::result::Result<T, hlo_emit::Error>;

impl<'a, 'c, 'b> Step<'a, 'c, 'b> {
    fn global(&self, key: &str) -> R<&'a Global> {
        self.globals
            .get(key)
            .ok_or_else(|| hlo_emit::Error::Mlir { what: "parameter".into(), detail: format!("no global for {key}") })
    }

    /// A parameter as f32: reduced-precision matrices are widened where they are used, so
    /// IREE can fold the conversion into the contraction that reads them.
    fn param(&self, key: &str) -> R<V<'c, 'b>> {
        self.widen(self.f.load(self.global(key)?)?)
    }

    /// A dense matrix's values as f32: converted, or, for bf16 held as its bit patterns
    /// (`i16`, `Layout::for_spirv`), shifted into the high half of an f32's bits, which is
    /// exactly bf16's widening.
    fn widen(&self, v: V<'c, 'b>) -> R<V<'c, 'b>> {
        let f = self.f;
        match v.elem() {
            F32 => Ok(v),
            I16 => {
                let wide = f.convert(v, I32)?;
                let sixteen = f.splat_like(wide, 16.0)?;
                f.bitcast_convert(f.shift_left(wide, sixteen)?, F32)
            }
            _ => f.convert(v, F32),
        }
    }

    /// `x [T, in]` through the linear layer `prefix`: `W · xᵀ` with the weight on the
    /// left (BRIEF 4), then back to `[T, out]`.
    fn linear(&self, x: V<'c, 'b>, prefix: &str, bias: bool) -> R<V<'c, 'b>> {
        let f = self.f;
        let y = match self.layout.packing(prefix) {
            Some(p) => self.packed_linear(x, prefix, p)?,
            None if self.layout.dense_kernel(prefix) => {
                self.merged_or(prefix, |m| self.dense_dispatch(kernels::cpu::DenseOp::Matvec, x, m, None))?
            }
            None => {
                let w = self.param(&format!("{prefix}.weight"))?;
                f.transpose(f.dot_general(w, x, DotDims::contract(&[1], &[1]))?, &[1, 0])?
            }
        };
        if bias {
            let b = self.param(&format!("{prefix}.bias"))?;
            return f.add(y, f.broadcast_in_dim(b, &y.shape(), &[1])?);
        }
        Ok(y)
    }

    /// `x [T, in]` through a packed matrix, with the dequantization inside the contraction:
    /// `y[t,o] = sx[t] Σ_g s[o,g] Σ_k q[o,g,k] xq[t,g,k] + Σ_g b[o,g] Σ_k x[t,g,k]`, where
    /// `q` are the signed packed values, `xq = round(x / sx)` is `x` quantized to i16 per row
    /// (15 bits of the row's largest magnitude) and `b` the biases with the offset folded in.
    /// The integer contraction over each group reads the packed weight directly (one
    /// `batch_matmul ... i16xi4xi32` dispatch); scales and biases apply once per group.
    fn packed_linear(&self, x: V<'c, 'b>, prefix: &str, p: &Packing) -> R<V<'c, 'b>> {
        self.merged_or(prefix, |m| self.packed_matrix(x, m, p))
    }

    /// `product(prefix)`, or, where `prefix` is part of a merged matrix, its columns of
    /// `product(merged)`: one dispatch for all parts (they read the same `x`), computed at the
    /// first part's use (q/k/v on CUDA and the CPU, gate/up on the CPU).
    fn merged_or(&self, prefix: &str, product: impl Fn(&str) -> R<V<'c, 'b>>) -> R<V<'c, 'b>> {
        let Some((merged, first, rows)) = self.layout.merged(prefix) else { return product(prefix) };
        let cached = self.merged_out.borrow().get(merged).copied();
        let all = match cached {
            Some(v) => v,
            None => {
                let v = product(merged)?;
                self.merged_out.borrow_mut().insert(merged.to_owned(), v);
                v
            }
        };
        self.f.slice_dim(all, 1, first as i64, (first + rows) as i64)
    }

    /// [`Step::packed_linear`] through the whole matrix `prefix` (merged or not): the CPU
    /// kernel, the CUDA kernel, or the graph form.
    fn packed_matrix(&self, x: V<'c, 'b>, prefix: &str, p: &Packing) -> R<V<'c, 'b>> {
        if p.kernel {
            return self.kernel_dispatch(kernels::cpu::Op::Matvec, x, prefix, p);
        }
        if let Some(form) = self.cuda_kernel_for(prefix) {
            return self.cuda_dispatch(kernels::cuda::Op::Matvec, form, x, &[prefix], None);
        }
        let f = self.f;
        let w = f.load(self.global(&format!("{prefix}.weight"))?)?;
        let (t, k) = (x.shape()[0], x.shape()[1]);
        let (o, gs) = (w.shape()[0], p.group_size as i64);
        let g = k / gs;
        if self.options.packed_products == PackedProducts::Dequantized {
            // The biases carry the signed storage's offset.
            let load = |name: &str| f.load(self.global(&format!("{prefix}.{name}"))?);
            let w = self.dequantize(w, load("scales")?, load("biases")?, &[o, g, gs])?;
            return f.transpose(f.dot_general(f.reshape(w, &[o, k])?, x, DotDims::contract(&[1], &[1]))?, &[1, 0]);
        }
        let w = f.convert(f.reshape(w, &[o, g, gs])?, I16)?;

        const I16_MAX: f64 = 32767.0;
        let amax = f.max(f.reduce_max(f.abs(x)?, &[1])?, f.splat(1e-30, &F32.tensor(&[t]))?)?;
        let inv = f.div(f.splat(I16_MAX, &F32.tensor(&[t]))?, amax)?;
        let xq = f.round_nearest_even(f.mul(x, f.broadcast_in_dim(inv, &[t, k], &[0])?)?)?;
        let xq = f.transpose(f.reshape(f.convert(xq, I16)?, &[t, g, gs])?, &[1, 0, 2])?;
        // [G, T, O] integer dot products per group.
        let acc = f.convert(f.dot_general_to(xq, w, DotDims::contract(&[2], &[2]).batch(&[0], &[1]), I32)?, F32)?;

        let full = [g, t, o];
        let scales = f.transpose(self.param(&format!("{prefix}.scales"))?, &[1, 0])?;
        let biases = f.transpose(self.param(&format!("{prefix}.biases"))?, &[1, 0])?;
        let sx = f.mul_scalar(amax, 1.0 / I16_MAX)?;
        let xsum = f.transpose(f.reduce_sum(f.reshape(x, &[t, g, gs])?, &[2])?, &[1, 0])?;
        let scaled =
            f.mul(f.mul(acc, f.broadcast_in_dim(scales, &full, &[0, 2])?)?, f.broadcast_in_dim(sx, &full, &[1])?)?;
        let offset = f.mul(f.broadcast_in_dim(biases, &full, &[0, 2])?, f.broadcast_in_dim(xsum, &full, &[0, 1])?)?;
        f.reduce_sum(f.add(scaled, offset)?, &[0])
    }

    /// How the CUDA kernel reads the packed matrix `prefix` of the graph form, when the layout
    /// links the kernel and it takes the matrix (for any number of rows). A 4-bit matrix held
    /// one value a byte (`Packing::wide`) is read as 8-bit: its bytes are the signed values,
    /// its biases those of 4 bits.
    fn cuda_kernel_for(&self, prefix: &str) -> Option<CudaForm> {
        let p = self.layout.packing(prefix).filter(|p| self.layout.cuda_kernel() && !p.kernel)?;
        let shape = &self.global(&format!("{prefix}.weight")).ok()?.ty().shape;
        let bits = if p.wide { 8 } else { p.bits };
        if !kernels::cuda::supports(bits, shape[0] as usize, shape[1] as usize, p.group_size) {
            return None;
        }
        let scale = match p.scale_elem {
            ElementType::F16 => kernels::cuda::Scale::F16,
            ElementType::BF16 => kernels::cuda::Scale::BF16,
            _ => kernels::cuda::Scale::F32,
        };
        Some(CudaForm { bits, scale, group_size: p.group_size })
    }

    /// One dispatch of the CUDA kernel's `op` on `x [T, in]` and the packed matrices
    /// `prefixes` (one; gate and up for `Glu`), which the kernel reads as `form`
    /// ([`Step::cuda_kernel_for`] for each); `residual [T, out]` for `MatvecAdd`.
    ///
    /// A plain or gated product whose `x` is an RMSNorm's output ([`Step::norm_of`]) takes the
    /// norm's input and weight instead (`NormMatvec`, `NormGlu`): the norm in the kernel's
    /// prologue, one dispatch fewer.
    fn cuda_dispatch(
        &self,
        op: kernels::cuda::Op,
        form: CudaForm,
        x: V<'c, 'b>,
        prefixes: &[&str],
        residual: Option<V<'c, 'b>>,
    ) -> R<V<'c, 'b>> {
        use kernels::cuda::Op;
        let normed = match op {
            Op::Matvec | Op::Glu => self.norm_of(x),
            _ => None,
        };
        let (op, mut args) = match (op, normed) {
            (Op::Matvec, Some((x, w))) => (Op::NormMatvec, vec![x, w]),
            (Op::Glu, Some((x, w))) => (Op::NormGlu, vec![x, w]),
            _ => (op, vec![x]),
        };
        for prefix in prefixes {
            let (w, s, b) = self.packed_globals(prefix)?;
            args.extend([w, s, b]);
        }
        args.extend(residual);
        let first_weight = if op.normed() { 2 } else { 1 };
        let (t, k, o) = (x.shape()[0], x.shape()[1], args[first_weight].shape()[0]);
        self.cuda_call(op, form, o, [t, k, o], &args, &[t, o])
    }

    /// Declares the CUDA kernel's entry for `op` and `form` and dispatches it over `workload`
    /// with the push constants (T, K, O, group size) and an f32 result of `shape`.
    fn cuda_call(
        &self,
        op: kernels::cuda::Op,
        form: CudaForm,
        workload: i64,
        [t, k, o]: [i64; 3],
        args: &[V<'c, 'b>],
        shape: &[i64],
    ) -> R<V<'c, 'b>> {
        let entry = kernels::cuda::Entry { op, bits: form.bits, scale: form.scale };
        self.cuda_entries.borrow_mut().insert(entry);
        let mut dims: Vec<i32> = [t, k, o, form.group_size as i64].map(|d| d as i32).to_vec();
        if op.normed() {
            // RMSNorm's epsilon, as the graph's norm rounds it (to f32), by its bits.
            dims.push((self.cfg.rms_eps as f32).to_bits() as i32);
        }
        self.f.dispatch(kernels::cuda::EXECUTABLE, &entry.export(), workload, &dims, args, F32.tensor(shape))
    }

    /// A packed matrix through the hand-written CPU kernel: the matvec `x [T, in] -> [T, out]`
    /// or the lookup of rows `x` (i32 ids `[T]`) -> `[T, in]`, both f32 and exact.
    fn kernel_dispatch(&self, op: kernels::cpu::Op, x: V<'c, 'b>, prefix: &str, p: &Packing) -> R<V<'c, 'b>> {
        self.kernel_dispatch_with(op, x, prefix, p, None)
    }

    /// [`Step::kernel_dispatch`], with the residual `[T, out]` the residual matvec adds.
    fn kernel_dispatch_with(
        &self,
        op: kernels::cpu::Op,
        x: V<'c, 'b>,
        prefix: &str,
        p: &Packing,
        residual: Option<V<'c, 'b>>,
    ) -> R<V<'c, 'b>> {
        let f = self.f;
        let (w, s, b) = self.packed_globals(prefix)?;
        let blocks = w.shape()[0];
        let out = blocks * kernels::cpu::BLOCK_ROWS as i64;
        let inp = s.shape()[1] / kernels::cpu::BLOCK_ROWS as i64 * p.group_size as i64;
        let t = x.shape()[0];
        let (workload, result) = match op {
            kernels::cpu::Op::Matvec | kernels::cpu::Op::MatvecAdd => (blocks, [t, out]),
            kernels::cpu::Op::Rows => (t, [t, inp]),
            kernels::cpu::Op::Experts => {
                return Err(hlo_emit::Error::Mlir {
                    what: "kernel dispatch".into(),
                    detail: "stacked experts dispatch through Step::expert_dispatch".into(),
                });
            }
        };
        let dims = [t, inp, out, p.group_size as i64].map(|d| d as i32);
        let entry = kernels::cpu::Entry { op, bits: p.bits, scale: p.kernel_scale() };
        self.entries.borrow_mut().insert(entry);
        let export = kernels::cpu::export(op, p.bits, p.kernel_scale());
        let mut args = vec![x, w, s, b];
        args.extend(residual);
        f.dispatch(kernels::cpu::EXECUTABLE, &export, workload, &dims, &args, F32.tensor(&result))
    }

    /// A dense f16 or bf16 matrix in the CPU kernel's blocks through its product: `x [T, in] ->
    /// [T, out]`, plus `residual [T, out]` after it when given (the graph's f32 add); or, for
    /// `DenseOp::Rows`, the rows `x` (i32 ids `[T]`) of the table -> `[T, in]`. The entry is
    /// the global's element type's (f16 or bf16).
    fn dense_dispatch(
        &self,
        op: kernels::cpu::DenseOp,
        x: V<'c, 'b>,
        prefix: &str,
        residual: Option<V<'c, 'b>>,
    ) -> R<V<'c, 'b>> {
        let w = self.f.load(self.global(&format!("{prefix}.weight"))?)?;
        let blocks = w.shape()[0];
        let (t, inp, out) =
            (x.shape()[0], w.shape()[1] / kernels::cpu::BLOCK_ROWS as i64, blocks * kernels::cpu::BLOCK_ROWS as i64);
        let elem = if w.elem() == ElementType::BF16 { kernels::cpu::Half::BF16 } else { kernels::cpu::Half::F16 };
        let entry = kernels::cpu::Dense { op, elem };
        self.dense.borrow_mut().insert(entry);
        let mut args = vec![x, w];
        args.extend(residual);
        let dims = [t, inp, out].map(|d| d as i32);
        let (workload, result) = if op == kernels::cpu::DenseOp::Rows { (t, [t, inp]) } else { (blocks, [t, out]) };
        self.f.dispatch(kernels::cpu::EXECUTABLE, &entry.export(), workload, &dims, &args, F32.tensor(&result))
    }

    /// The weight, scales and biases of the packed matrix (or stacked experts) `prefix`.
    fn packed_globals(&self, prefix: &str) -> R<(V<'c, 'b>, V<'c, 'b>, V<'c, 'b>)> {
        let load = |name: &str| self.f.load(self.global(&format!("{prefix}.{name}"))?);
        Ok((load("weight")?, load("scales")?, load("biases")?))
    }

    /// `residual + linear(x)`, the residual connection after a linear layer: one dispatch of
    /// the kernel's residual matvec (the same f32 add, after the product) where the layer runs
    /// in the kernel on its own (not merged, no bias); else the layer, then the add.
    fn linear_residual(&self, residual: V<'c, 'b>, x: V<'c, 'b>, prefix: &str, bias: bool) -> R<V<'c, 'b>> {
        if let Some(p) = self.layout.packing(prefix)
            && p.kernel
            && !bias
            && self.layout.merged(prefix).is_none()
        {
            return self.kernel_dispatch_with(kernels::cpu::Op::MatvecAdd, x, prefix, p, Some(residual));
        }
        if !bias && self.layout.dense_kernel(prefix) && self.layout.merged(prefix).is_none() {
            return self.dense_dispatch(kernels::cpu::DenseOp::MatvecAdd, x, prefix, Some(residual));
        }
        if !bias && let Some(form) = self.cuda_kernel_for(prefix) {
            return self.cuda_dispatch(kernels::cuda::Op::MatvecAdd, form, x, &[prefix], Some(residual));
        }
        self.f.add(residual, self.linear(x, prefix, bias)?)
    }

    /// Rows `tokens` of the embedding table as f32 `[T, hidden]`: gathered in the table's
    /// own type, then widened (dense) or dequantized (packed) for those rows only.
    fn embed(&self, tokens: V<'c, 'b>) -> R<V<'c, 'b>> {
        let f = self.f;
        const PREFIX: &str = crate::layout::EMBEDDING;
        if self.layout.dense_kernel(PREFIX) {
            return self.dense_dispatch(kernels::cpu::DenseOp::Rows, tokens, PREFIX, None);
        }
        let Some(p) = self.layout.packing(PREFIX) else {
            return self.widen(f.gather_rows(f.load(self.global(&format!("{PREFIX}.weight"))?)?, tokens)?);
        };
        if p.kernel {
            return self.kernel_dispatch(kernels::cpu::Op::Rows, tokens, PREFIX, p);
        }
        let (t, d) = (self.rows(), self.cfg.hidden as i64);
        if let Some(form) = self.cuda_kernel_for(PREFIX) {
            // One dispatch of the CUDA kernel; a 4-bit table's bytes come from its rows copy
            // (the same bytes as the weight, which the head may read instead).
            let bytes = if p.weight_elem() == I4 { "weight.rows" } else { "weight" };
            let load = |name: &str| f.load(self.global(&format!("{PREFIX}.{name}"))?);
            let args = [tokens, load(bytes)?, load("scales")?, load("biases")?];
            let vocab = args[1].shape()[0];
            return self.cuda_call(kernels::cuda::Op::Rows, form, t, [t, d, vocab], &args, &[t, d]);
        }
        let q = if p.weight_elem() == I4 {
            // Gather the rows' bytes, then split each into its two signed nibbles (element
            // 2j in the low one), interleaved back to [T, d].
            let bytes = f.gather_rows(f.load(self.global(&format!("{PREFIX}.weight.rows"))?)?, tokens)?;
            let four = f.splat(4.0, &I8.tensor(&[t, d / 2]))?;
            let low = f.shift_right_arithmetic(f.shift_left(bytes, four)?, four)?;
            let high = f.shift_right_arithmetic(bytes, four)?;
            let pair = |v| f.reshape(v, &[t, d / 2, 1]);
            f.reshape(f.concatenate(&[pair(low)?, pair(high)?], 2)?, &[t, d])?
        } else {
            f.gather_rows(f.load(self.global(&format!("{PREFIX}.weight"))?)?, tokens)?
        };
        let gs = p.group_size as i64;
        let gather = |name: &str| f.gather_rows(f.load(self.global(&format!("{PREFIX}.{name}"))?)?, tokens);
        let rows = self.dequantize(q, gather("scales")?, gather("biases")?, &[t, d / gs, gs])?;
        f.reshape(rows, &[t, d])
    }

    /// Packed values `q` (integers, any shape of `grouped`'s elements) as f32 `grouped`
    /// (`[..., G, group size]`), each group's `q * scale + bias` with `scales` and `biases`
    /// of shape `[..., G]`: MLX's affine dequantization.
    fn dequantize(&self, q: V<'c, 'b>, scales: V<'c, 'b>, biases: V<'c, 'b>, grouped: &[i64]) -> R<V<'c, 'b>> {
        let f = self.f;
        let q = f.reshape(f.convert(q, F32)?, grouped)?;
        let lead: Vec<i64> = (0..grouped.len() as i64 - 1).collect();
        let per_group = |v: V<'c, 'b>| f.broadcast_in_dim(self.widen(v)?, grouped, &lead);
        f.add(f.mul(q, per_group(scales)?)?, per_group(biases)?)
    }

    fn norm(&self, x: V<'c, 'b>, key: &str) -> R<V<'c, 'b>> {
        let mut w = self.param(key)?;
        if self.cfg.norm_plus_one {
            w = self.f.add_scalar(w, 1.0)?;
        }
        let y = self.f.rms_norm(x, w, self.cfg.rms_eps)?;
        if self.layout.cuda_kernel() {
            self.normed.borrow_mut().push((y, x, w));
        }
        Ok(y)
    }

    /// The input and weight of the RMSNorm whose output is `y`, if [`Step::norm`] made it.
    fn norm_of(&self, y: V<'c, 'b>) -> Option<(V<'c, 'b>, V<'c, 'b>)> {
        self.normed.borrow().iter().find(|(out, _, _)| *out == y).map(|&(_, x, w)| (x, w))
    }

    /// Rotates `x [T, heads, hd]` by the positions' angles (MLX's non-traditional layout:
    /// the first and second halves of each head form the pairs). Written as one elementwise
    /// expression, `x * cos + [-x2, x1] * sin` with the swap as a `reverse` of the two
    /// halves, so it fuses into one dispatch (a `concatenate` became copies of its own).
    ///
    /// With `rope_dims` below the head size (partial rotary) only the first `rope_dims`
    /// features rotate, paired across their own halves; the rest pass through.
    fn rope(&self, x: V<'c, 'b>, cos: V<'c, 'b>, sin: V<'c, 'b>) -> R<V<'c, 'b>> {
        let f = self.f;
        let (hd, rd) = (x.shape()[2], self.cfg.rope_dims as i64);
        if rd < hd {
            let rotated = self.rope(f.slice_dim(x, 2, 0, rd)?, cos, sin)?;
            return f.concatenate(&[rotated, f.slice_dim(x, 2, rd, hd)?], 2);
        }
        let shape = x.shape();
        let half = shape[2] / 2;
        let split = [shape[0], shape[1], 2, half];
        let x = f.reshape(x, &split)?;
        let swapped = f.reverse(x, &[2])?;
        // [-1, 1] along the halves: the first half of the swapped value is -x2.
        let sign = f.broadcast_in_dim(f.constant_f32(&[-1.0, 1.0], &[2])?, &split, &[2])?;
        let c = f.broadcast_in_dim(cos, &split, &[0, 3])?;
        let s = f.broadcast_in_dim(sin, &split, &[0, 3])?;
        let out = f.add(f.mul(x, c)?, f.mul(f.mul(swapped, sign)?, s)?)?;
        f.reshape(out, &shape)
    }

    fn rope_tables(&self, pos_f: V<'c, 'b>, table: &RopeTable) -> R<(V<'c, 'b>, V<'c, 'b>)> {
        let f = self.f;
        let half = table.inv_freq.len() as i64;
        let inv = f.constant_f32(&table.inv_freq, &[half])?;
        let p = f.mul_scalar(pos_f, table.position_scale as f64)?;
        let ang = f.mul(
            f.broadcast_in_dim(p, &[self.rows(), half], &[0])?,
            f.broadcast_in_dim(inv, &[self.rows(), half], &[1])?,
        )?;
        let (cos, sin) = (f.cos(ang)?, f.sin(ang)?);
        if table.input_scale == 1.0 {
            return Ok((cos, sin));
        }
        // `rope(s * x) = x * (s * cos) + swap(x) * (s * sin)`.
        let s = table.input_scale as f64;
        Ok((f.mul_scalar(cos, s)?, f.mul_scalar(sin, s)?))
    }

    fn rows(&self) -> i64 {
        self.function.rows() as i64
    }

    /// Positions `[0, window)` of layer `l` of each sequence's slot as f32 `[n, W, kv_heads, hd]`,
    /// with this step's rows `x [R, kv_heads, hd]` put in at their (sequence, position).
    fn window_with(
        &self,
        cache: V<'c, 'b>,
        l: usize,
        slots: V<'c, 'b>,
        x: V<'c, 'b>,
        positions: V<'c, 'b>,
    ) -> R<V<'c, 'b>> {
        let f = self.f;
        let (n, m) = self.function.split();
        let r = (n * m) as i64;
        let row_seq = f.reshape(f.iota(&I32.tensor(&[n as i64, m as i64]), 0)?, &[r, 1])?;
        let at = f.concatenate(&[row_seq, f.reshape(positions, &[r, 1])?], 1)?;
        // In the cache's own type, widened after: a conversion between the gather and the
        // scatter made IREE 3.13 fuse them into one dispatch that keeps the whole window on
        // the stack ("exceeded stack allocation limit of 32768 bytes") for an f16 cache.
        let read = self.raw_window(cache, l, slots)?;
        let x = if x.elem() == self.kv_elem { x } else { f.convert(x, self.kv_elem)? };
        let dims = ScatterDims {
            update_window_dims: vec![1, 2],
            inserted_window_dims: vec![0, 1],
            scatter_dims_to_operand_dims: vec![0, 1],
            index_vector_dim: 1,
            ..ScatterDims::default()
        };
        let window = f.scatter(read, at, x, dims)?;
        if window.elem() == F32 { Ok(window) } else { f.convert(window, F32) }
    }

    /// `x` rounded through the cache's element type, so attention sees exactly what later
    /// steps will read back.
    fn as_cached(&self, x: V<'c, 'b>) -> R<V<'c, 'b>> {
        if self.kv_elem == F32 { Ok(x) } else { self.f.convert(self.f.convert(x, self.kv_elem)?, F32) }
    }

    /// Positions `[0, window)` of layer `l` of each sequence's slot, as f32 `[n, W, kv_heads, hd]`,
    /// for reductions that read it where it lies (decode).
    fn window(&self, cache: V<'c, 'b>, l: usize, slots: V<'c, 'b>) -> R<V<'c, 'b>> {
        let f = self.f;
        let n = slots.shape()[0];
        let (k, hd, w) = (self.cfg.kv_heads as i64, self.cfg.head_dim as i64, self.function.window() as i64);
        // The layer is a static slice and only the slot is gathered. With the layer among the
        // gather's indices IREE 3.13 copied each window into a temporary element by element
        // (index arithmetic per element): in a probe of 30 layers' decode attention at 2,048
        // positions, 33 ms a call against 12 ms this way.
        let (s, p) = (cache.shape()[1], cache.shape()[2]);
        let read = if s == 1 {
            // One slot: the window is a contiguous prefix of the layer, read in place.
            let one = f.reshape(
                f.slice(cache, &[l as i64, 0, 0, 0, 0], &[l as i64 + 1, 1, w, k, hd], &[1; 5])?,
                &[1, w, k, hd],
            )?;
            if n == 1 { one } else { f.broadcast_in_dim(one, &[n, w, k, hd], &[0, 1, 2, 3])? }
        } else {
            // The whole layer (every slot and position: one contiguous block, a view). Slicing the
            // window's positions first made IREE copy every slot's window before the slot gather
            // (4x the attention time at 8 slots, window 128 of 2,048 positions).
            let layer = f.reshape(
                f.slice(cache, &[l as i64, 0, 0, 0, 0], &[l as i64 + 1, s, p, k, hd], &[1; 5])?,
                &[s, p, k, hd],
            )?;
            if n == 1 && self.options.slot_read == SlotRead::Slice {
                let slot = f.reshape(slots, &[])?;
                let zero = f.splat(0.0, &I32.tensor(&[]))?;
                f.dynamic_slice(layer, &[slot, zero, zero, zero], &[1, w, k, hd])?
            } else {
                let dims = GatherDims {
                    offset_dims: vec![1, 2, 3],
                    collapsed_slice_dims: vec![0],
                    start_index_map: vec![0],
                    index_vector_dim: 1,
                    ..GatherDims::default()
                };
                f.gather(layer, f.reshape(slots, &[n, 1])?, dims, &[1, w, k, hd])?
            }
        };
        if read.elem() == F32 { Ok(read) } else { f.convert(read, F32) }
    }

    /// Positions `[0, window)` of layer `l` of each sequence's slot in the cache's element type,
    /// gathered at (layer, slot): a copy, which the prefill's scatter of its own rows needs (a
    /// static layer slice there made IREE fuse slice and scatter into one dispatch that keeps
    /// the window on the stack).
    fn raw_window(&self, cache: V<'c, 'b>, l: usize, slots: V<'c, 'b>) -> R<V<'c, 'b>> {
        let f = self.f;
        let n = slots.shape()[0];
        let (k, hd, w) = (self.cfg.kv_heads as i64, self.cfg.head_dim as i64, self.function.window() as i64);
        let layer = f.splat(l as f64, &I32.tensor(&[n, 1]))?;
        let indices = f.concatenate(&[layer, f.reshape(slots, &[n, 1])?], 1)?;
        let dims = GatherDims {
            offset_dims: vec![1, 2, 3],
            collapsed_slice_dims: vec![0, 1],
            start_index_map: vec![0, 1],
            index_vector_dim: 1,
            ..GatherDims::default()
        };
        f.gather(cache, indices, dims, &[1, 1, w, k, hd])
    }

    /// Attention scores `x · key * scale`, soft-capped when the model caps them.
    fn scaled(&self, scores: V<'c, 'b>) -> R<V<'c, 'b>> {
        let f = self.f;
        let scores = f.mul_scalar(scores, self.cfg.attn_scale)?;
        match self.cfg.attn_softcap {
            Some(cap) => f.mul_scalar(f.tanh(f.mul_scalar(scores, 1.0 / cap)?)?, cap),
            None => Ok(scores),
        }
    }

    /// Whether key position `kpos` is visible from query position `p` (same shape): `kpos
    /// cmp p` (`Le`, or `Lt` to leave p itself out), and `p - W' < kpos` under a sliding
    /// window W'.
    fn visible(&self, kpos: V<'c, 'b>, p: V<'c, 'b>, cmp: Cmp, sliding: Option<usize>) -> R<V<'c, 'b>> {
        let f = self.f;
        let causal = f.compare(kpos, p, cmp)?;
        let Some(win) = sliding else { return Ok(causal) };
        let recent = f.compare(f.add(kpos, f.splat(win as f64, &kpos.ty())?)?, p, Cmp::Gt)?;
        f.and(causal, recent)
    }

    /// Chunk attention (prefill: m rows of each of n sequences): queries `q [R, heads, hd]`
    /// against each sequence's window `kl`, `vl` (`[n, W, kv_heads, hd]`, the chunk's own rows
    /// included), key j visible from a row at position p when j <= p (and p - W' < j under a
    /// sliding window W'). Contractions: prefill has enough rows for them. Returns `[R, heads * hd]`.
    fn attend_chunk(
        &self,
        q: V<'c, 'b>,
        kl: V<'c, 'b>,
        vl: V<'c, 'b>,
        positions: V<'c, 'b>,
        sliding: Option<usize>,
    ) -> R<V<'c, 'b>> {
        let f = self.f;
        let (n, m) = self.function.split();
        let (n, m, w) = (n as i64, m as i64, self.function.window() as i64);
        let (k, hd) = (self.cfg.kv_heads as i64, self.cfg.head_dim as i64);
        let g = self.cfg.heads as i64 / k;
        let scores_shape = [n, k, g, m, w];
        let kpos = f.iota(&I32.tensor(&[n, m, w]), 2)?;
        let qpos = f.broadcast_in_dim(f.reshape(positions, &[n, m])?, &[n, m, w], &[0, 1])?;
        let visible = self.visible(kpos, qpos, Cmp::Le, sliding)?;
        let visible = f.broadcast_in_dim(visible, &scores_shape, &[0, 3, 4])?;
        let qh = f.transpose(f.reshape(q, &[n, m, k, g, hd])?, &[0, 2, 3, 1, 4])?;
        let qh = f.reshape(qh, &[n, k, g * m, hd])?;
        // [n, K, G*m, W]: batch over (sequence, kv head), the window as [n, W, K, hd].
        let scores = f.dot_general(qh, kl, DotDims::contract(&[3], &[3]).batch(&[0, 1], &[0, 2]))?;
        let neg = f.splat(f32::MIN as f64, &F32.tensor(&scores_shape))?;
        let scores = f.select(visible, f.reshape(self.scaled(scores)?, &scores_shape)?, neg)?;
        let probs = f.reshape(f.softmax(scores)?, &[n, k, g * m, w])?;
        let o = f.dot_general(probs, vl, DotDims::contract(&[3], &[1]).batch(&[0, 1], &[0, 2]))?;
        let o = f.transpose(f.reshape(o, &[n, k, g, m, hd])?, &[0, 3, 1, 2, 4])?;
        f.reshape(o, &[n * m, k * g * hd])
    }

    /// Attention through the CPU kernel (`kernels::cpu`, `cpu/attn.h`), where the module
    /// links the kernel object and the kernel takes the model's heads: the same attention as
    /// [`Step::attend_one`] (decode) and [`Step::attend_chunk`] (a prompt chunk), read straight
    /// from the cache (`kc`, `vc`, whole) at each row's slot for the positions before the
    /// call's rows of its sequence (below W), and from the call's new rows after them, one
    /// dispatch per layer. `None` where the graph form runs instead (no object: other targets
    /// or dense weights; soft-capped scores; heads the kernel does not take).
    #[allow(clippy::too_many_arguments)]
    fn attend_kernel(
        &self,
        q: V<'c, 'b>,
        kk: V<'c, 'b>,
        vv: V<'c, 'b>,
        (kc, vc): (V<'c, 'b>, V<'c, 'b>),
        l: usize,
        slots: V<'c, 'b>,
        positions: V<'c, 'b>,
        sliding: Option<usize>,
    ) -> R<Option<V<'c, 'b>>> {
        let (f, cfg) = (self.f, self.cfg);
        let (h, k, hd) = (cfg.heads, cfg.kv_heads, cfg.head_dim);
        if !attention_in_kernel(cfg, self.layout) {
            return Ok(None);
        }
        let cache = if self.kv_elem == F16 { kernels::cpu::CacheElem::F16 } else { kernels::cpu::CacheElem::F32 };
        let entry = kernels::cpu::Attention { cache, units: kernels::cpu::attention_units(h, k, hd) };
        self.attention.borrow_mut().insert(entry);
        let n = q.shape()[0];
        let (dims, window) = (kc.shape(), self.function.window());
        // In `kernels::cpu::Attention::CONSTANTS`' order; the scale travels as its f32 bits.
        let scale = (cfg.attn_scale as f32).to_bits() as i32;
        let sizes = [l, dims[1] as usize, dims[2] as usize, k, h / k, hd, window, sliding.unwrap_or(0)];
        let constants: Vec<i32> = sizes.iter().map(|&c| c as i32).chain([scale, n as i32]).collect();
        let flat = |x: V<'c, 'b>, width: usize| f.reshape(x, &[n, width as i64]);
        // The new rows in f32: the kernel rounds them through the cache's type itself (a
        // conversion here was three dispatches a layer for an f16 cache).
        let args = [flat(q, h * hd)?, flat(kk, k * hd)?, flat(vv, k * hd)?, kc, vc, positions, slots];
        let o = f.dispatch(
            kernels::cpu::EXECUTABLE,
            &entry.export(),
            n * k as i64,
            &constants,
            &args,
            F32.tensor(&[n, (h * hd) as i64]),
        )?;
        Ok(Some(o))
    }

    /// Decode attention (one row per sequence): each row's query `q [n, heads, hd]` against
    /// the positions before its own in the old window (`kl`, `vl`: `[n, W, kv_heads, hd]`)
    /// and against its own new key and value (`kk`, `vv`: `[n, kv_heads, hd]`), one softmax
    /// over both. Written as broadcast products and reductions, with the row's own key apart,
    /// so the window is never copied to put the row in. IREE 3.13 still raises the products to
    /// contractions (`matmul_like`), so in the data-tiled decode module each window is relaid
    /// out (`set_encoding`, one copy) before its contraction. Returns `[n, heads * hd]`.
    #[allow(clippy::too_many_arguments)]
    fn attend_one(
        &self,
        q: V<'c, 'b>,
        kk: V<'c, 'b>,
        vv: V<'c, 'b>,
        kl: V<'c, 'b>,
        vl: V<'c, 'b>,
        positions: V<'c, 'b>,
        sliding: Option<usize>,
    ) -> R<V<'c, 'b>> {
        let f = self.f;
        let (n, w) = (kl.shape()[0], kl.shape()[1]);
        let (k, hd) = (self.cfg.kv_heads as i64, self.cfg.head_dim as i64);
        let g = self.cfg.heads as i64 / k;
        // Scores as [n, K, G, W]: the softmax then reduces over the innermost dim (over the
        // outer W of [n, W, K, G] each of its reductions cost about a quarter of the window
        // products).
        let (full, scores) = ([n, k, g, w, hd], [n, k, g, w]);
        let q = f.reshape(q, &[n, k, g, hd])?;
        let (kk, vv) = (self.as_cached(kk)?, self.as_cached(vv)?);

        let old = f.mul(f.broadcast_in_dim(q, &full, &[0, 1, 2, 4])?, f.broadcast_in_dim(kl, &full, &[0, 3, 1, 4])?)?;
        let old = self.scaled(f.reduce_sum(old, &[4])?)?;
        let own = f.mul(q, f.broadcast_in_dim(kk, &[n, k, g, hd], &[0, 1, 3])?)?;
        let own = self.scaled(f.reduce_sum(own, &[3])?)?;

        // Old key j is visible from a row at position p when j < p (p itself is this row's
        // own key).
        let kpos = f.iota(&I32.tensor(&[n, w]), 1)?;
        let p = f.broadcast_in_dim(positions, &[n, w], &[0])?;
        let visible = self.visible(kpos, p, Cmp::Lt, sliding)?;
        let old = f.select(
            f.broadcast_in_dim(visible, &scores, &[0, 3])?,
            old,
            f.splat(f32::MIN as f64, &F32.tensor(&scores))?,
        )?;

        let top = f.max(f.reduce_max(old, &[3])?, own)?;
        let e_old = f.exp(f.sub(old, f.broadcast_in_dim(top, &scores, &[0, 1, 2])?)?)?;
        let e_own = f.exp(f.sub(own, top)?)?;
        let total = f.add(f.reduce_sum(e_old, &[3])?, e_own)?;
        let o =
            f.mul(f.broadcast_in_dim(e_old, &full, &[0, 1, 2, 3])?, f.broadcast_in_dim(vl, &full, &[0, 3, 1, 4])?)?;
        let o = f.reduce_sum(o, &[3])?;
        let head = [n, k, g, hd];
        let o = f.add(
            o,
            f.mul(f.broadcast_in_dim(e_own, &head, &[0, 1, 2])?, f.broadcast_in_dim(vv, &head, &[0, 1, 3])?)?,
        )?;
        let o = f.div(o, f.broadcast_in_dim(total, &head, &[0, 1, 2])?)?;
        f.reshape(o, &[n, k * g * hd])
    }

    fn emit(
        &self,
        tokens: V<'c, 'b>,
        positions: V<'c, 'b>,
        slots: V<'c, 'b>,
        last: Option<V<'c, 'b>>,
        kc: V<'c, 'b>,
        vc: V<'c, 'b>,
    ) -> crate::Result<Vec<V<'c, 'b>>> {
        let (f, cfg) = (self.f, self.cfg);
        let m = self.function.split().1;
        let r = self.rows();
        let (h, k, hd) = (cfg.heads as i64, cfg.kv_heads as i64, cfg.head_dim as i64);

        let mut x = self.embed(tokens)?;
        if let Some(scale) = cfg.embed_scale {
            x = f.mul_scalar(x, scale as f64)?;
        }

        let pos_f = f.convert(positions, F32)?;
        // Each row's slot (a chunk's rows share their sequence's), for the attention kernel;
        // the graph form reads `slots` per sequence.
        let row_slots = if m == 1 || !attention_in_kernel(cfg, self.layout) {
            slots
        } else {
            f.reshape(f.broadcast_in_dim(slots, &[slots.shape()[0], m as i64], &[0])?, &[r])?
        };
        let (mut new_k, mut new_v) = (Vec::new(), Vec::new());
        let mut ropes: HashMap<String, (V<'c, 'b>, V<'c, 'b>)> = HashMap::new();

        for (l, layer) in cfg.layers.iter().enumerate() {
            let p = layer_prefix(l);
            let table = RopeTable::new(layer, cfg.rope_dims);
            let rope_key = format!("{:?}", table);
            let (cos, sin) = match ropes.get(&rope_key) {
                Some(cs) => *cs,
                None => {
                    let cs = self.rope_tables(pos_f, &table)?;
                    ropes.insert(rope_key, cs);
                    cs
                }
            };

            let hn = self.norm(x, &format!("{p}.input_layernorm.weight"))?;
            let q = f.reshape(self.linear(hn, &format!("{p}.self_attn.q_proj"), cfg.qkv_bias)?, &[r, h, hd])?;
            let kk = f.reshape(self.linear(hn, &format!("{p}.self_attn.k_proj"), cfg.qkv_bias)?, &[r, k, hd])?;
            let vv = f.reshape(self.linear(hn, &format!("{p}.self_attn.v_proj"), cfg.qkv_bias)?, &[r, k, hd])?;
            let (q, kk) = if cfg.qk_norm {
                (
                    self.norm(q, &format!("{p}.self_attn.q_norm.weight"))?,
                    self.norm(kk, &format!("{p}.self_attn.k_norm.weight"))?,
                )
            } else {
                (q, kk)
            };
            let q = self.rope(q, cos, sin)?;
            let kk = self.rope(kk, cos, sin)?;

            // The step's keys and values go to the cache in `write_kv`, after this call, which
            // rounds them to the cache's type.
            let as_rows = |x: V<'c, 'b>| f.reshape(x, &[1, r, k, hd]);
            new_k.push(as_rows(kk)?);
            new_v.push(as_rows(vv)?);

            // Grouped-query attention: head j = kv * G + i attends with kv head `kv`.
            let o = match self.attend_kernel(q, kk, vv, (kc, vc), l, row_slots, positions, layer.sliding_window)? {
                Some(o) => o,
                None if m == 1 => {
                    let (kl, vl) = (self.window(kc, l, slots)?, self.window(vc, l, slots)?);
                    self.attend_one(q, kk, vv, kl, vl, positions, layer.sliding_window)?
                }
                None => {
                    let kl = self.window_with(kc, l, slots, kk, positions)?;
                    let vl = self.window_with(vc, l, slots, vv, positions)?;
                    self.attend_chunk(q, kl, vl, positions, layer.sliding_window)?
                }
            };
            let o_proj = format!("{p}.self_attn.o_proj");
            x = if cfg.sandwich_norms {
                let a = self.linear(o, &o_proj, cfg.o_bias)?;
                f.add(x, self.norm(a, &format!("{p}.post_attention_layernorm.weight"))?)?
            } else {
                self.linear_residual(x, o, &o_proj, cfg.o_bias)?
            };

            let pre_mlp = if cfg.sandwich_norms { "pre_feedforward_layernorm" } else { "post_attention_layernorm" };
            let hn = self.norm(x, &format!("{p}.{pre_mlp}.weight"))?;
            if let Some(moe) = cfg.moe.as_ref().filter(|_| layer.moe) {
                x = f.add(x, self.moe(hn, &format!("{p}.{}", moe.block), moe)?)?;
                continue;
            }
            let (down, hidden) = (format!("{p}.mlp.down_proj"), self.gated_mlp(hn, &format!("{p}.mlp"))?);
            x = if cfg.sandwich_norms {
                let mo = self.linear(hidden, &down, cfg.mlp_bias)?;
                f.add(x, self.norm(mo, &format!("{p}.post_feedforward_layernorm.weight"))?)?
            } else {
                self.linear_residual(x, hidden, &down, cfg.mlp_bias)?
            };
        }

        let x = self.norm(x, "model.norm.weight")?;
        // The rows whose logits are returned: the `last` row of a prompt chunk or a mixed
        // call's chosen rows (indices as data, not slice offsets), or every row of a decode
        // step.
        let rows = match last {
            Some(last) => f.gather_rows(x, last)?,
            None => x,
        };
        let head = if cfg.tie_embeddings { "model.embed_tokens" } else { "lm_head" };
        let mut logits = self.linear(rows, head, false)?;
        if let Some(cap) = cfg.final_softcap {
            logits = f.mul_scalar(f.tanh(f.mul_scalar(logits, 1.0 / cap)?)?, cap)?;
        }
        let next = f.argmax(logits, 1)?;
        Ok(vec![next, logits, f.concatenate(&new_k, 0)?, f.concatenate(&new_v, 0)?])
    }

    /// The mixture-of-experts block under `block` (`model.layers.0.mlp`) on `x [T, d]`, as
    /// mlx-lm's sparse MoE blocks compute it: the router's logits, the top `k` experts of each
    /// row with their weights (softmax then top k, or top k then softmax), each chosen
    /// expert's SwiGLU, their weighted sum, plus Qwen2-MoE's gated shared expert.
    ///
    /// A step of few rows (`T * k` below the experts: decode) gathers the chosen experts'
    /// matrices and runs one matrix-vector product per (row, choice), so it reads only those
    /// experts' weights; a prompt chunk runs every expert on every row (each expert's
    /// weights read once) and weighs the unchosen ones by zero.
    fn moe(&self, x: V<'c, 'b>, block: &str, moe: &Moe) -> R<V<'c, 'b>> {
        let f = self.f;
        let (t, d) = (x.shape()[0], x.shape()[1]);
        let (k, e) = (moe.top_k as i64, moe.experts as i64);
        let logits = self.narrow_linear(x, &format!("{block}.gate"))?;
        let (scores, chosen) = match moe.routing {
            Routing::SoftmaxTopK { normalize } => {
                let (v, i) = f.top_k(f.softmax(logits)?, moe.top_k)?;
                if normalize {
                    (f.div(v, f.broadcast_in_dim(f.reduce_sum(v, &[1])?, &[t, k], &[0])?)?, i)
                } else {
                    (v, i)
                }
            }
            Routing::TopKSoftmax => {
                let (v, i) = f.top_k(logits, moe.top_k)?;
                (f.softmax(v)?, i)
            }
        };
        let experts = |name: &str| format!("{block}.switch_mlp.{name}");
        let in_kernel = |name: &str| self.layout.packing(&experts(name)).is_some_and(|p| p.kernel);
        let mut y = if t * k < e || ["gate_proj", "up_proj", "down_proj"].iter().any(|n| in_kernel(n)) {
            // One row per (row, choice), each against its expert: the CPU kernel's `qmve` on
            // its packed blocks (by pair for a few pairs, by expert for many), else the
            // gathered matrices [n, out, in] · [n, in] -> [n, out] (few pairs only).
            let n = t * k;
            let chosen = f.reshape(chosen, &[n])?;
            let rows = f.reshape(f.broadcast_in_dim(x, &[t, k, d], &[0, 2])?, &[n, d])?;
            let apply = |name: &str, h: V<'c, 'b>| match self.layout.packing(&experts(name)) {
                Some(p) if p.kernel => self.expert_dispatch(h, chosen, &experts(name), p, n >= e),
                _ => self.chosen_experts(&experts(name), chosen, h),
            };
            let hidden = f.mul(self.activation(apply("gate_proj", rows)?)?, apply("up_proj", rows)?)?;
            let out = f.reshape(apply("down_proj", hidden)?, &[t, k, d])?;
            f.reduce_sum(f.mul(out, f.broadcast_in_dim(scores, &[t, k, d], &[0, 1])?)?, &[1])?
        } else {
            // [E, I, d] · [T, d] -> [E, I, T]; then [E, d, I] · [E, I, T] -> [E, d, T].
            let up_side = |name: &str| {
                f.dot_general(self.expert_weights(&experts(name), None)?, x, DotDims::contract(&[2], &[1]))
            };
            let hidden = f.mul(self.activation(up_side("gate_proj")?)?, up_side("up_proj")?)?;
            let down = self.expert_weights(&experts("down_proj"), None)?;
            let out = f.dot_general(down, hidden, DotDims::contract(&[2], &[1]).batch(&[0], &[0]))?;
            // Each row's weight of each expert [T, E]: its score where chosen, else 0.
            let column = f.iota(&I32.tensor(&[t, e]), 1)?;
            let mut weights = f.splat(0.0, &F32.tensor(&[t, e]))?;
            for j in 0..k {
                let pick =
                    |v: V<'c, 'b>| f.broadcast_in_dim(f.reshape(f.slice_dim(v, 1, j, j + 1)?, &[t])?, &[t, e], &[0]);
                let here = f.compare(column, pick(chosen)?, Cmp::Eq)?;
                weights = f.add(weights, f.select(here, pick(scores)?, f.splat(0.0, &F32.tensor(&[t, e]))?)?)?;
            }
            // [T, E] · [E, d, T] -> [T, d], batched over the rows.
            f.dot_general(weights, out, DotDims::contract(&[1], &[0]).batch(&[0], &[2]))?
        };
        if moe.shared_expert.is_some() {
            let shared = format!("{block}.shared_expert");
            let gate = self.linear(x, &format!("{shared}.gate_proj"), false)?;
            let hidden = f.mul(self.activation(gate)?, self.linear(x, &format!("{shared}.up_proj"), false)?)?;
            let out = self.linear(hidden, &format!("{shared}.down_proj"), false)?;
            let g = f.logistic(self.narrow_linear(x, &format!("{block}.shared_expert_gate"))?)?;
            y = f.add(y, f.mul(f.broadcast_in_dim(f.reshape(g, &[t])?, &[t, d], &[0])?, out)?)?;
        }
        Ok(y)
    }

    /// A linear layer of few outputs (a router `[experts, d]`, Qwen2-MoE's `[1, d]` shared
    /// expert gate), dense: products and a sum over the input (one fused reduction), not a
    /// contraction, of the f32 weight (`Role::Widened`). With stored parameters IREE 3.13
    /// data-tiles such a contraction's weight for some functions and not others, and its
    /// parameter encoder then leaves the weight unbound for the others ("no provider
    /// registered that handles scopes like 'model'" at load). Packed, as any linear layer.
    fn narrow_linear(&self, x: V<'c, 'b>, prefix: &str) -> R<V<'c, 'b>> {
        if self.layout.packing(prefix).is_some() {
            return self.linear(x, prefix, false);
        }
        let f = self.f;
        let w = self.param(&format!("{prefix}.weight"))?;
        let (t, (o, d)) = (x.shape()[0], (w.shape()[0], w.shape()[1]));
        let both = [t, o, d];
        let products = f.mul(f.broadcast_in_dim(x, &both, &[0, 2])?, f.broadcast_in_dim(w, &both, &[1, 2])?)?;
        f.reduce_sum(products, &[2])
    }

    /// `x [N, in]` through the stacked experts `prefix` in the CPU kernel's layout, row `n`
    /// against expert `chosen[n]` (`qmve`): `[N, out]`. `by_expert` numbers the workgroups by
    /// expert (each expert's blocks read once for all its rows) instead of by row.
    fn expert_dispatch(
        &self,
        x: V<'c, 'b>,
        chosen: V<'c, 'b>,
        prefix: &str,
        p: &Packing,
        by_expert: bool,
    ) -> R<V<'c, 'b>> {
        let f = self.f;
        let (w, s, b) = self.packed_globals(prefix)?;
        let (experts, blocks) = (w.shape()[0], w.shape()[1]);
        let out = blocks * kernels::cpu::BLOCK_ROWS as i64;
        let (n, inp) = (x.shape()[0], x.shape()[1]);
        let dims = [n, inp, out, p.group_size as i64, experts, i64::from(by_expert)].map(|d| d as i32);
        let op = kernels::cpu::Op::Experts;
        self.entries.borrow_mut().insert(kernels::cpu::Entry { op, bits: p.bits, scale: p.kernel_scale() });
        let export = kernels::cpu::export(op, p.bits, p.kernel_scale());
        let workload = if by_expert { experts } else { n } * blocks;
        f.dispatch(kernels::cpu::EXECUTABLE, &export, workload, &dims, &[x, chosen, w, s, b], F32.tensor(&[n, out]))
    }

    /// `h [N, in]` through expert `chosen[n]` of the stacked experts `prefix`, in the graph
    /// form: the chosen matrices gathered, then one matrix-vector product per row as the
    /// target wants it ([`ExpertProducts`]), `[N, out]`.
    fn chosen_experts(&self, prefix: &str, chosen: V<'c, 'b>, h: V<'c, 'b>) -> R<V<'c, 'b>> {
        let f = self.f;
        let w = self.expert_weights(prefix, Some(chosen))?;
        match self.options.expert_products {
            ExpertProducts::Contraction => f.dot_general(w, h, DotDims::contract(&[2], &[1]).batch(&[0], &[0])),
            ExpertProducts::Reduction => {
                let products = f.mul(w, f.broadcast_in_dim(h, &w.shape(), &[0, 2])?)?;
                f.reduce_sum(products, &[2])
            }
        }
    }

    /// Stacked expert weights `prefix` as f32 `[N, out, in]`: the experts `chosen` (i32
    /// `[N]`) gathered first, else all of them; widened (dense) or dequantized (packed:
    /// MLX's values from the low bits of each byte up, `q * scale + bias` per group) after
    /// the gather, so only the gathered experts are converted.
    fn expert_weights(&self, prefix: &str, chosen: Option<V<'c, 'b>>) -> R<V<'c, 'b>> {
        let f = self.f;
        let pick = |name: &str| -> R<V<'c, 'b>> {
            let v = f.load(self.global(&format!("{prefix}.{name}"))?)?;
            match chosen {
                Some(i) => f.gather_rows(v, i),
                None => Ok(v),
            }
        };
        let Some(p) = self.layout.packing(prefix) else {
            return self.widen(pick("weight")?);
        };
        let (w, scales, biases) = (pick("weight")?, pick("scales")?, pick("biases")?);
        let (n, o, bytes) = (w.shape()[0], w.shape()[1], w.shape()[2]);
        let (groups, gs) = (scales.shape()[2], p.group_size as i64);
        let int = |v: f64| f.splat(v, &I32.tensor(&[n, o, bytes]));
        let unsigned = f.and(f.convert(w, I32)?, int(255.0)?)?;
        let q = if p.bits == 4 {
            let low = f.and(unsigned, int(15.0)?)?;
            let high = f.shift_right_arithmetic(unsigned, int(4.0)?)?;
            let pair = |v| f.reshape(v, &[n, o, bytes, 1]);
            f.concatenate(&[pair(low)?, pair(high)?], 3)?
        } else {
            unsigned
        };
        let w = self.dequantize(q, scales, biases, &[n, o, groups, gs])?;
        f.reshape(w, &[n, o, groups * gs])
    }

    /// `activation(gate_proj(x)) * up_proj(x)` of the gated MLP `prefix`: one dispatch of the
    /// CUDA kernel's `Glu` where it takes both matrices alike and the activation is SiLU.
    fn gated_mlp(&self, x: V<'c, 'b>, prefix: &str) -> R<V<'c, 'b>> {
        let (gate, up) = (format!("{prefix}.gate_proj"), format!("{prefix}.up_proj"));
        if self.cfg.activation == Activation::Silu
            && !self.cfg.mlp_bias
            && let Some(form) = self.cuda_kernel_for(&gate)
            && self.cuda_kernel_for(&up) == Some(form)
        {
            return self.cuda_dispatch(kernels::cuda::Op::Glu, form, x, &[&gate, &up], None);
        }
        let g = self.linear(x, &gate, self.cfg.mlp_bias)?;
        let u = self.linear(x, &up, self.cfg.mlp_bias)?;
        self.f.mul(self.activation(g)?, u)
    }

    fn activation(&self, x: V<'c, 'b>) -> R<V<'c, 'b>> {
        let f = self.f;
        match self.cfg.activation {
            Activation::Silu => f.mul(x, f.logistic(x)?),
            Activation::GeluErf => {
                let e = f.erf(f.mul_scalar(x, std::f64::consts::FRAC_1_SQRT_2)?)?;
                f.mul_scalar(f.mul(x, f.add_scalar(e, 1.0)?)?, 0.5)
            }
            Activation::GeluTanh => {
                let x3 = f.mul(f.mul(x, x)?, x)?;
                let inner =
                    f.mul_scalar(f.add(x, f.mul_scalar(x3, 0.044715)?)?, (2.0 / std::f64::consts::PI).sqrt())?;
                f.mul_scalar(f.mul(x, f.add_scalar(f.tanh(inner)?, 1.0)?)?, 0.5)
            }
        }
    }
}
