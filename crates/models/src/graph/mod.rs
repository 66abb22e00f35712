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
//! A model with recurrent layers (Qwen3-Next, Qwen3.5, LFM2) also carries a state per slot,
//! in `P` buffers (`ModelConfig::state_parts`: each recurrent layer's convolution inputs
//! and, for a gated DeltaNet, its matrix), `state_i: f32[slots, len_i]`: the step functions
//! take them after `v` and return, after `new_v`, each sequence's rows after its own,
//! `new_state_i: f32[n, len_i]`, or, for a part the step updates in place
//! ([`state_in_place`]: a DeltaNet's matrix in the CPU kernel), the buffer itself,
//! `state_i': f32[slots, len_i]`; `write_state_n{n}(slots: i32[n], new_state_a..,
//! state_a..) -> (state_a'..)` scatters the others' rows back in place (`a` the parts not
//! updated in place, in order). A sequence whose first row is at position 0 starts from
//! zeros, whatever its slot held. One buffer per part, not one `[slots, S]` vector, so no call gathers,
//! concatenates or returns the whole state of its sequences (the 0.8B Qwen3.5 shape's
//! 8-row state is 161 MB, a layer's part 8 MB).
//! Only attention layers have KV cache (`L` counts them: `ModelConfig::kv_layers`).
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
//! docs/ARCHITECTURE.md, "Toolchain facts"). `last` picks the row of the prompt chunk whose
//! logits are returned (and where recurrent layers stop; a verify call of such a model takes
//! it for that alone and returns every row's logits). Callers keep every position below `W` and the cache's capacity, and
//! never put two rows of one call on one slot and position unless the rows are identical
//! (padding): they then write the same bytes.

mod attention;
mod ffn;
mod kvq8;
mod latent;
mod layer;
mod linear;
mod matrix;
mod norm;
mod rope;

pub use crate::backend::{EmitOptions, ExpertProducts, PackedProducts, SlotRead};
use crate::config::ModelConfig;
use crate::error::Result;
use crate::layout::Layout;
use hlo_emit::{Context, ElementType, ElementType::*, Func, Global, Module, ScatterDims, Value};
use layer::LayerPlan;
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
    /// 8 bits a value, in blocks of 16 with an f32 scale each, stored as bytes
    /// (`kernels::cpu::q8_encode`: per block the scale's 4 bytes, then the 16 values).
    Q8,
}

impl KvElem {
    /// The element type of the cache's buffers.
    fn elem(self) -> ElementType {
        match self {
            KvElem::F32 => F32,
            KvElem::F16 => F16,
            KvElem::Q8 => I8,
        }
    }

    /// Elements of the cache's buffers a row of `width` values takes.
    pub fn stored_width(self, width: usize) -> usize {
        match self {
            KvElem::F32 | KvElem::F16 => width,
            KvElem::Q8 => kernels::cpu::q8_row_bytes(width),
        }
    }

    /// Values in a row the cache's buffers store in `stored` elements (the inverse of
    /// [`KvElem::stored_width`]).
    pub fn width(self, stored: usize) -> usize {
        match self {
            KvElem::F32 | KvElem::F16 => stored,
            KvElem::Q8 => stored / kernels::cpu::Q8_BLOCK_BYTES * kernels::cpu::Q8_BLOCK,
        }
    }

    /// Rows of f32 values `[.., width]` as the cache stores them.
    fn store<'c, 'b>(self, f: &Func<'c, 'b>, x: V<'c, 'b>) -> R<V<'c, 'b>> {
        match self {
            KvElem::F32 => Ok(x),
            KvElem::F16 => f.convert(x, F16),
            KvElem::Q8 => kvq8::encode(f, x),
        }
    }

    /// The cache's rows `[.., stored width]` as f32 values `[.., width]`.
    fn load<'c, 'b>(self, f: &Func<'c, 'b>, x: V<'c, 'b>) -> R<V<'c, 'b>> {
        match self {
            KvElem::F32 => Ok(x),
            KvElem::F16 => f.convert(x, F32),
            KvElem::Q8 => kvq8::decode(f, x),
        }
    }

    /// f32 values rounded through the cache's element type: what a later step reads back.
    fn round<'c, 'b>(self, f: &Func<'c, 'b>, x: V<'c, 'b>) -> R<V<'c, 'b>> {
        match self {
            KvElem::F32 => Ok(x),
            KvElem::F16 => f.convert(f.convert(x, F16)?, F32),
            KvElem::Q8 => kvq8::round(f, x),
        }
    }

    /// Bytes of one element of the cache's buffers.
    pub fn elem_bytes(self) -> usize {
        match self {
            KvElem::F32 => 4,
            KvElem::F16 => 2,
            KvElem::Q8 => 1,
        }
    }

    /// Why this cache type cannot hold rows of these widths (`ModelConfig::cache_rows`), if
    /// it cannot: an 8-bit cache's blocks are 16 values of one row.
    pub fn check(self, cfg: &ModelConfig) -> std::result::Result<(), String> {
        let block = kernels::cpu::Q8_BLOCK;
        if self != KvElem::Q8 {
            return Ok(());
        }
        match cfg.cache_rows().iter().find(|(_, width)| !width.is_multiple_of(block)) {
            Some((_, width)) => Err(format!(
                "--kv-cache q8 stores blocks of {block} values of a cache row, and this model's rows have {width}"
            )),
            None => Ok(()),
        }
    }
}

impl std::fmt::Display for KvElem {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            KvElem::F32 => "f32",
            KvElem::F16 => "f16",
            KvElem::Q8 => "q8",
        })
    }
}

impl std::str::FromStr for KvElem {
    type Err = String;
    fn from_str(s: &str) -> std::result::Result<Self, String> {
        match s {
            "f32" => Ok(KvElem::F32),
            "f16" => Ok(KvElem::F16),
            "q8" => Ok(KvElem::Q8),
            other => Err(format!("unknown KV cache type `{other}` (expected f32, f16 or q8)")),
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
    /// One recurrent state more than the slots, past theirs, that no sequence owns: where a
    /// model with recurrent layers keeps a sequence's state from before a verify call
    /// (speculative decoding's rollback). The KV cache has no row for it.
    pub scratch: bool,
}

impl CacheShape {
    /// `[layers, slots, positions, heads, features]` of the two caches (k, then v):
    /// `kv_heads, head_dim` both, or a latent attention's latents and rotated keys
    /// ([`ModelConfig::cache_rows`]); the features as stored ([`KvElem::stored_width`]).
    pub fn dims(&self, cfg: &ModelConfig) -> [[usize; 5]; 2] {
        cfg.cache_rows()
            .map(|(heads, width)| [cfg.kv_layers(), self.slots, self.positions, heads, self.elem.stored_width(width)])
    }

    /// Recurrent states the state buffers hold: the slots', and the scratch one.
    pub fn state_slots(&self) -> usize {
        self.slots + usize::from(self.scratch)
    }

    /// Device bytes of every recurrent state, the scratch one's included (0 without
    /// recurrent layers).
    pub fn state_bytes(&self, cfg: &ModelConfig) -> usize {
        self.state_slots() * cfg.state_len() * 4
    }

    /// Device bytes of the k and v caches together.
    pub fn bytes(&self, cfg: &ModelConfig) -> usize {
        self.dims(cfg).iter().map(|d| d.iter().product::<usize>()).sum::<usize>() * self.elem.elem_bytes()
    }

    /// Device bytes the k and v caches take per position of one slot.
    pub fn bytes_per_position(cfg: &ModelConfig, elem: KvElem) -> usize {
        let row = |&(heads, width): &(usize, usize)| heads * elem.stored_width(width);
        cfg.cache_rows().iter().map(row).sum::<usize>() * cfg.kv_layers() * elem.elem_bytes()
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
    /// `tokens` consecutive tokens of one sequence, as a prefill, with the logits of every
    /// row: a decode row and the draft tokens after it, checked in one call (speculative
    /// decoding). A model with recurrent layers also takes `last` (the last real row: its
    /// recurrent layers stop there, as a prefill's, so padding rows leave the state alone);
    /// its state after the call is that after every real row, accepted or not, which the
    /// engine rolls back from a copy. Attention reads positions `[0, window)`.
    Verify { tokens: usize, window: usize },
    /// Writes `rows` rows of keys and values (a step's `new_k`, `new_v`) into the cache.
    WriteKv { rows: usize },
    /// Writes `rows` sequences' recurrent state (a step's `new_state`) into their slots.
    WriteState { rows: usize },
    /// Copies `positions` positions of keys and values, from a run-time start, from one
    /// slot to another (a prompt's start shared between sequences).
    CopyKv { positions: usize },
    /// Copies one slot's recurrent state to another.
    CopyState,
}

impl Function {
    pub fn name(self) -> String {
        match self {
            Function::Prefill { tokens, window } => format!("prefill_t{tokens}_w{window}"),
            Function::Decode { rows, window } => format!("decode_b{rows}_w{window}"),
            Function::Mixed { rows, outs, window } => format!("mixed_r{rows}_o{outs}_w{window}"),
            Function::Verify { tokens, window } => format!("verify_t{tokens}_w{window}"),
            Function::WriteKv { rows } => format!("write_kv_r{rows}"),
            Function::WriteState { rows } => format!("write_state_n{rows}"),
            Function::CopyKv { positions } => format!("copy_kv_p{positions}"),
            Function::CopyState => "copy_state".to_owned(),
        }
    }

    /// Sequences and rows per sequence (a mixed call's rows each count as one: its
    /// sequences are told apart by slot, in the attention kernel).
    fn split(self) -> (usize, usize) {
        match self {
            Function::Prefill { tokens, .. } | Function::Verify { tokens, .. } => (1, tokens),
            Function::Decode { rows, .. }
            | Function::Mixed { rows, .. }
            | Function::WriteKv { rows }
            | Function::WriteState { rows } => (rows, 1),
            Function::CopyKv { positions } => (1, positions),
            Function::CopyState => (1, 1),
        }
    }

    /// Rows whose logits the function returns: the last of a prompt chunk, every decode row,
    /// a mixed call's chosen rows (none for `WriteKv`).
    pub fn outs(self) -> usize {
        match self {
            Function::Prefill { .. } => 1,
            Function::Decode { rows, .. } => rows,
            Function::Mixed { outs, .. } => outs,
            Function::Verify { tokens, .. } => tokens,
            Function::WriteKv { .. } | Function::WriteState { .. } | Function::CopyKv { .. } | Function::CopyState => 0,
        }
    }

    /// Positions attention reads (none for the writes).
    pub fn window(self) -> usize {
        match self {
            Function::Prefill { window, .. }
            | Function::Decode { window, .. }
            | Function::Mixed { window, .. }
            | Function::Verify { window, .. } => window,
            Function::WriteKv { .. } | Function::WriteState { .. } | Function::CopyKv { .. } | Function::CopyState => 0,
        }
    }

    /// Rows of the token input.
    pub fn rows(self) -> usize {
        let (n, m) = self.split();
        n * m
    }
}

/// Whether attention (decode and prefill) runs in the CPU kernel (`kernels::cpu`, `attn`)
/// for this model and layout: the layout links the kernel object (some matrix in a CPU
/// form: packed, f16 or bf16 weights on an `llvm-cpu` target), the scores are not
/// soft-capped, no sinks join the softmax and the kernel takes the heads (every layer's the
/// same). It then reads only the positions in use,
/// whatever the function's window.
pub fn attention_in_kernel(cfg: &ModelConfig, layout: &Layout) -> bool {
    layout.kernel_object().is_some()
        && cfg.attn_softcap.is_none()
        && cfg.latent.is_none()
        && !cfg.attn_sinks
        && cfg.uniform_heads()
        && kernels::cpu::supports_attention(cfg.heads, cfg.kv_heads, cfg.head_dim)
}

/// Whether a gated DeltaNet layer's update runs in the CPU kernel (`kernels::cpu`, `delta`):
/// the layout links the kernel object and the kernel takes the heads' sizes. It then reads
/// and writes each sequence's matrix once, where it lies in its state buffer, instead of
/// gathering it, updating a copy and scattering it back (docs/PERFORMANCE.md).
pub fn delta_in_kernel(lin: &crate::config::LinearAttention, layout: &Layout) -> bool {
    layout.kernel_object().is_some() && kernels::cpu::supports_delta(lin.k_dim, lin.v_dim)
}

/// Per state buffer (`ModelConfig::state_parts`), whether the step functions update it in
/// place and return it whole (`[slots, len]`) rather than return each sequence's new rows
/// (`[n, len]`) for `write_state`: a DeltaNet's matrix where its update runs in the CPU
/// kernel ([`delta_in_kernel`]).
pub fn state_in_place(cfg: &ModelConfig, layout: &Layout) -> Vec<bool> {
    let per_layer = match (&cfg.linear, &cfg.short_conv) {
        (Some(lin), _) => vec![false, delta_in_kernel(lin, layout)],
        (None, Some(_)) => vec![false],
        (None, None) => Vec::new(),
    };
    cfg.layers.iter().filter(|l| l.recurrent).flat_map(|_| per_layer.iter().copied()).collect()
}

/// Whether the model runs mixed calls (`Function::Mixed`): attention in the CPU kernel, and
/// no recurrent layers (whose scan runs over one sequence's rows at a time).
pub fn mixed_calls(cfg: &ModelConfig, layout: &Layout) -> bool {
    attention_in_kernel(cfg, layout) && cfg.state_len() == 0
}

/// The hand-written kernels' entry points the functions of a module dispatch, declared
/// once after every function is emitted (IREE keeps only exports a module dispatches).
#[derive(Debug, Default)]
struct Linked {
    /// The CPU kernel's packed products and lookups.
    packed: BTreeSet<kernels::cpu::Entry>,
    /// The CPU kernel's attention.
    attention: BTreeSet<kernels::cpu::Attention>,
    /// The CPU kernel's dense (f16, bf16) products and lookups.
    dense: BTreeSet<kernels::cpu::Dense>,
    /// The CPU kernel's delta-rule update.
    delta: bool,
    /// The CUDA kernel's entries.
    cuda: BTreeSet<kernels::cuda::Entry>,
}

/// Emits `functions` over `cache`, in a module named `module_name` when given (modules loaded
/// side by side in one session need distinct names; they share the parameter scope), with
/// the graph settings of the layout's backend.
pub fn emit_functions(
    cfg: &ModelConfig,
    layout: &Layout,
    cache: CacheShape,
    functions: &[Function],
    module_name: Option<&str>,
) -> Result<String> {
    for function in functions {
        check_fits(cfg, layout, cache, *function)?;
    }
    let plan = LayerPlan::all(cfg)?;
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
    let [k_dims, v_dims] = cache.dims(cfg);
    let (kv_k, kv_v) =
        (cache.elem.elem().tensor(&k_dims.map(|d| d as i64)), cache.elem.elem().tensor(&v_dims.map(|d| d as i64)));
    let linked = RefCell::new(Linked::default());
    // A step's new rows travel in f32; `write_kv` converts them to the cache's type.
    let rows_kv = |(heads, width): (usize, usize), r: usize| {
        F32.tensor(&[cfg.kv_layers() as i64, r as i64, heads as i64, width as i64])
    };
    let [k_rows, v_rows] = cfg.cache_rows();
    let parts = cfg.state_parts();
    let states: Vec<_> = parts.iter().map(|&len| F32.tensor(&[cache.state_slots() as i64, len as i64])).collect();
    // The parts `write_state` scatters: those the steps do not update in place.
    let in_place = state_in_place(cfg, layout);
    let scattered: Vec<usize> = (0..parts.len()).filter(|&i| !in_place[i]).collect();
    for &function in functions {
        let (n, rows) = (function.split().0 as i64, function.rows() as i64);
        if let Function::WriteState { .. } = function {
            if scattered.is_empty() {
                return Err(crate::Error::Invalid(format!("{}: the model has no state to scatter", function.name())));
            }
            let mut inputs = vec![I32.tensor(&[n])];
            inputs.extend(scattered.iter().map(|&i| F32.tensor(&[n, parts[i] as i64])));
            inputs.extend(scattered.iter().map(|&i| states[i].clone()));
            m.func(&function.name(), &inputs, |f, a| {
                let (new, old) = a[1..].split_at(scattered.len());
                write_state(f, a[0], new, old)
            })?;
            continue;
        }
        if let Function::CopyKv { positions } = function {
            // source slot, destination slot, first position; k, v
            let inputs = [I32.tensor(&[1]), I32.tensor(&[1]), I32.tensor(&[1]), kv_k.clone(), kv_v.clone()];
            m.func(&function.name(), &inputs, |f, a| copy_kv(f, [a[0], a[1], a[2]], positions as i64, a[3], a[4]))?;
            continue;
        }
        if let Function::CopyState = function {
            if parts.is_empty() {
                return Err(crate::Error::Invalid(format!("{}: the model has no state to copy", function.name())));
            }
            let mut inputs = vec![I32.tensor(&[1]), I32.tensor(&[1])];
            inputs.extend(states.iter().cloned());
            m.func(&function.name(), &inputs, |f, a| copy_state(f, a[0], a[1], &a[2..]))?;
            continue;
        }
        if let Function::WriteKv { .. } = function {
            let inputs = [
                I32.tensor(&[rows]),
                I32.tensor(&[rows]),
                rows_kv(k_rows, rows as usize),
                rows_kv(v_rows, rows as usize),
                kv_k.clone(),
                kv_v.clone(),
            ];
            m.func(&function.name(), &inputs, |f, a| write_kv(f, cache.elem, a[0], a[1], a[2], a[3], a[4], a[5]))?;
            continue;
        }
        let mut inputs = vec![I32.tensor(&[rows]), I32.tensor(&[rows]), I32.tensor(&[n])];
        if let Function::Prefill { .. } | Function::Mixed { .. } = function {
            inputs.push(I32.tensor(&[function.outs() as i64]));
        }
        // A verify call's recurrent layers stop at its last real row.
        if let Function::Verify { .. } = function
            && !parts.is_empty()
        {
            inputs.push(I32.tensor(&[1]));
        }
        inputs.extend([kv_k.clone(), kv_v.clone()]);
        inputs.extend(states.iter().cloned());
        m.func(&function.name(), &inputs, |f, a| {
            let step = Step {
                f,
                cfg,
                layout,
                globals: &globals,
                linked: &linked,
                merged_out: RefCell::new(HashMap::new()),
                normed: RefCell::new(Vec::new()),
                function,
                kv_elem: cache.elem,
                options: layout.emit_options(),
            };
            // tokens, positions, slots[, last], k, v[, state_0..]
            let (cache_args, states) = a.split_at(a.len() - parts.len());
            let last = if cache_args.len() == 6 { Some(cache_args[3]) } else { None };
            let (k, v) = (cache_args[cache_args.len() - 2], cache_args[cache_args.len() - 1]);
            step.emit(&plan, a[0], a[1], a[2], last, k, v, states)
        })?;
    }
    let linked = linked.into_inner();
    if let Some(object) = layout.kernel_object()
        && !(linked.packed.is_empty() && linked.attention.is_empty() && linked.dense.is_empty() && !linked.delta)
    {
        let packed: Vec<_> = linked.packed.into_iter().collect();
        let attention: Vec<_> = linked.attention.into_iter().collect();
        let dense: Vec<_> = linked.dense.into_iter().collect();
        let source = kernels::cpu::executable_source(object, &packed, &attention, &dense, linked.delta);
        m.append_source(kernels::cpu::EXECUTABLE, &source)?;
    }
    let cuda: Vec<_> = linked.cuda.into_iter().collect();
    if let (Some(ptx), false) = (kernels::cuda::ptx(), cuda.is_empty()) {
        m.append_source(kernels::cuda::EXECUTABLE, &kernels::cuda::executable_source(ptx, &cuda))?;
    }
    Ok(m.to_text())
}

/// Refuses a function that does not fit the cache (no rows, no window, a window past the
/// positions, no slots) or, for a mixed call, has no outputs or no attention kernel.
fn check_fits(cfg: &ModelConfig, layout: &Layout, cache: CacheShape, function: Function) -> Result<()> {
    let (rows, window) = (function.rows(), function.window());
    let reads = !matches!(
        function,
        Function::WriteKv { .. } | Function::WriteState { .. } | Function::CopyKv { .. } | Function::CopyState
    );
    if rows == 0 || (reads && window == 0) || window > cache.positions || cache.slots == 0 {
        return Err(crate::Error::Invalid(format!(
            "function {} does not fit a cache of {} slots x {} positions",
            function.name(),
            cache.slots,
            cache.positions
        )));
    }
    if let Function::Mixed { rows, outs, .. } = function
        && (outs == 0 || outs > rows || !mixed_calls(cfg, layout))
    {
        return Err(crate::Error::Invalid(format!(
            "function {} needs 1 to {rows} outputs, attention in the CPU kernel and no recurrent layers",
            function.name()
        )));
    }
    Ok(())
}

/// `copy_kv`: positions `[start, start + positions)` of slot `src` copied to slot `dst`, in
/// both caches, every layer (a start past the last whole block is clamped by StableHLO, so
/// the copy ends at the last position: the same rows again, and rows past the source's
/// sequence, which are written before anything reads them). Each cache is read and written
/// once here, so IREE updates it in place.
fn copy_kv<'c, 'b>(
    f: &Func<'c, 'b>,
    [src, dst, start]: [V<'c, 'b>; 3],
    positions: i64,
    k: V<'c, 'b>,
    v: V<'c, 'b>,
) -> R<Vec<V<'c, 'b>>> {
    let scalar = |x: V<'c, 'b>| f.reshape(x, &[]);
    let (src, dst, start) = (scalar(src)?, scalar(dst)?, scalar(start)?);
    let zero = f.constant_i32(&[0], &[])?;
    [k, v]
        .into_iter()
        .map(|cache| {
            let d = cache.shape();
            let rows =
                f.dynamic_slice(cache, &[zero, src, start, zero, zero], &[d[0], 1, positions.min(d[2]), d[3], d[4]])?;
            f.dynamic_update_slice(cache, rows, &[zero, dst, start, zero, zero])
        })
        .collect()
}

/// `copy_state`: every state buffer's row `src` copied to row `dst`.
fn copy_state<'c, 'b>(f: &Func<'c, 'b>, src: V<'c, 'b>, dst: V<'c, 'b>, states: &[V<'c, 'b>]) -> R<Vec<V<'c, 'b>>> {
    let (src, dst) = (f.reshape(src, &[])?, f.reshape(dst, &[])?);
    let zero = f.constant_i32(&[0], &[])?;
    states
        .iter()
        .map(|&state| {
            let row = f.dynamic_slice(state, &[src, zero], &[1, state.shape()[1]])?;
            f.dynamic_update_slice(state, row, &[dst, zero])
        })
        .collect()
}

/// `write_kv`: every layer's new rows `[L, R, K, hd]` (f32) scattered into the cache at
/// (layer, slot, position) in the cache's type, one scatter per cache; nothing else touches
/// the cache here, so IREE updates it in place.
#[allow(clippy::too_many_arguments)]
fn write_kv<'c, 'b>(
    f: &Func<'c, 'b>,
    elem: KvElem,
    positions: V<'c, 'b>,
    slots: V<'c, 'b>,
    new_k: V<'c, 'b>,
    new_v: V<'c, 'b>,
    k: V<'c, 'b>,
    v: V<'c, 'b>,
) -> R<Vec<V<'c, 'b>>> {
    let (l, r) = (new_k.shape()[0], new_k.shape()[1]);
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
        let x = elem.store(f, x)?;
        let dims = x.shape();
        f.reshape(x, &[l * r, dims[2], dims[3]])
    };
    Ok(vec![
        f.scatter(k, indices, flat(new_k)?, scatter_dims.clone())?,
        f.scatter(v, indices, flat(new_v)?, scatter_dims)?,
    ])
}

/// `write_state`: each sequence's new rows `[n, len]` of every state buffer scattered into
/// its slot's row of that buffer (`[slots, len]`), in place (nothing else touches them here).
fn write_state<'c, 'b>(f: &Func<'c, 'b>, slots: V<'c, 'b>, new: &[V<'c, 'b>], old: &[V<'c, 'b>]) -> R<Vec<V<'c, 'b>>> {
    let n = slots.shape()[0];
    let indices = f.reshape(slots, &[n, 1])?;
    let dims = ScatterDims {
        update_window_dims: vec![1],
        inserted_window_dims: vec![0],
        scatter_dims_to_operand_dims: vec![0],
        index_vector_dim: 1,
        ..ScatterDims::default()
    };
    new.iter().zip(old).map(|(&rows, &buffer)| f.scatter(buffer, indices, rows, dims.clone())).collect()
}

/// One function's emission: the builder, the model, its layout and globals, and what the
/// step has computed so far that later blocks reuse.
struct Step<'a, 'c, 'b> {
    f: &'a Func<'c, 'b>,
    cfg: &'a ModelConfig,
    layout: &'a Layout,
    globals: &'a HashMap<String, Global>,
    /// Kernel entry points the module's functions dispatch.
    linked: &'a RefCell<Linked>,
    /// Outputs of merged projections already computed in this function.
    merged_out: RefCell<HashMap<String, V<'c, 'b>>>,
    /// Each RMSNorm's (output, input, weight): a CUDA kernel product reading a norm's output
    /// takes its input and weight instead and norms in its prologue.
    normed: RefCell<Vec<(V<'c, 'b>, V<'c, 'b>, V<'c, 'b>)>>,
    function: Function,
    kv_elem: KvElem,
    options: EmitOptions,
}

type V<'c, 'b> = Value<'c, 'b>;
type R<T> = std::result::Result<T, hlo_emit::Error>;

impl<'c, 'b> Step<'_, 'c, 'b> {
    fn rows(&self) -> i64 {
        self.function.rows() as i64
    }
}
