//! The engine: loads an MLX model folder onto an IREE device and runs many sequences
//! through it (prefill, batched decode, KV slots), with the compile cache ([`cache`]), the
//! device-to-target mapping ([`device`]) and the teacher-forced accuracy gate ([`gate`]).
//!
//! Every graph shape is fixed when the engine loads ([`Plan`]): the KV cache of `max_batch`
//! slots x `max_context` positions, batched decode functions, chunked prefill functions and
//! attention windows, all compiled (or read from the compile cache) then, so no request ever
//! compiles. Weights are bound once as parameters (scope `model`); the KV cache is updated
//! in place by every call; per step only token ids, positions and slots go to the device
//! and next ids (and logits when asked) come back.

pub mod cache;
pub mod device;
mod error;
pub mod gate;
pub mod scheduler;

use crate::cache::CompileReport;
use iree_compiler::CompileOptions;
use iree_hal::{BufferView, Device, Instance, Parameters, Session};
pub use models::KvElem;
pub use models::Precision;
use models::{CacheShape, Function, Layout, ModelConfig, graph::SCOPE};
use std::cell::OnceCell;
use std::path::Path;
use std::rc::Rc;
use std::time::Instant;
use weights::Checkpoint;

pub use crate::device::CpuKernels;
pub use crate::error::{BoxError, Error, Result};
pub use kernels::cpu::Isa;

/// Settings of an engine, passed as a value: nothing below the binary reads the environment
/// for them.
#[derive(Debug, Clone)]
pub struct EngineConfig {
    /// IREE device URI (`local-task`, `local-sync`, `cuda`).
    pub device: String,
    pub precision: Precision,
    /// Most sequences decoded together in one step; the cache holds one slot for each.
    pub max_batch: usize,
    /// Positions per sequence (prompt plus generated tokens). `None`: the model's
    /// `max_position_embeddings`, capped so the KV cache fits `kv_budget_bytes`.
    pub max_context: Option<usize>,
    /// Device bytes the KV cache may take when `max_context` is not given.
    pub kv_budget_bytes: usize,
    /// Element type of the KV cache.
    pub kv_elem: KvElem,
    /// Which hand-written CPU kernels packed matrices use on a CPU device (else the graph
    /// form); forcing an instruction set the host lacks fails the load before compiling.
    pub cpu_kernels: CpuKernels,
    /// Where compiled modules are cached (see [`cache::default_dir`]).
    pub cache_dir: std::path::PathBuf,
    /// Also write each compiled module's input MLIR next to its cache entry, with the flags
    /// on its first line, for reproducing compiler problems with `iree-compile`.
    pub dump_mlir: bool,
    /// Store the weights of a data-tiled CPU module in their final (repacked) form in a file
    /// beside the module in `cache_dir`, written on the first load and mapped by every later
    /// one ([`cache::stored_parameters`]; about the weights' size on disk per model, shape
    /// and precision). Off: every load binds the checkpoint's weights and IREE repacks them
    /// in memory, holding both copies at once (peak RSS 2-3x the weights, docs/PERFORMANCE.md).
    pub store_parameters: bool,
    /// Most bytes the modules in `cache_dir` may take: after a load, the least recently used
    /// other entries go until the rest fits ([`cache::evict`]; `None`: no limit).
    pub cache_max_bytes: Option<u64>,
}

/// Default KV budget: 4 GiB, a sixth of this project's 24 GiB machines, leaving room for the
/// weights (and their repacked decode copy) of a 1B-class model several times over.
pub const DEFAULT_KV_BUDGET: usize = 4 << 30;

/// Context used when the config has no `max_position_embeddings`.
const FALLBACK_CONTEXT: usize = 2048;

impl EngineConfig {
    /// One sequence at a time on `device` at `precision`, context from the model, the
    /// default KV budget, f32 cache, the best CPU kernels the host runs, modules (and the
    /// weights stored in final form) cached in `cache_dir`.
    pub fn new(device: &str, precision: Precision, cache_dir: impl Into<std::path::PathBuf>) -> EngineConfig {
        EngineConfig {
            device: device.to_owned(),
            precision,
            max_batch: 1,
            max_context: None,
            kv_budget_bytes: DEFAULT_KV_BUDGET,
            kv_elem: KvElem::F32,
            cpu_kernels: CpuKernels::Auto,
            cache_dir: cache_dir.into(),
            dump_mlir: false,
            store_parameters: true,
            cache_max_bytes: Some(cache::DEFAULT_CACHE_MAX_BYTES),
        }
    }
}

/// The static shapes an engine compiles at load, so no request ever compiles: the cache,
/// the decode batch sizes, the prefill chunk sizes and the attention windows.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Plan {
    pub cache: CacheShape,
    /// Rows per decode call: powers of two below `max_batch`, and `max_batch`.
    pub batches: Vec<usize>,
    /// Tokens per prefill call.
    pub chunks: Vec<usize>,
    /// Positions prefill's attention reads: powers of two from 128 below the context, and
    /// the context; or only the context ([`Plan::for_layout`]).
    pub windows: Vec<usize>,
    /// Positions decode's attention reads: the same windows, or only the context where a
    /// step's attention costs what the context holds whatever its window ([`Plan::for_layout`]).
    pub decode_windows: Vec<usize>,
    /// What one call costs beyond its rows, in rows (`device::call_overhead_rows`): how
    /// prefill weighs padding against more calls.
    pub call_rows: usize,
    /// Rows per mixed call (several sequences' prompt chunks and decode rows in one call,
    /// `Function::Mixed`): empty unless the attention kernel runs and there are several
    /// slots ([`Plan::for_layout`]).
    pub mixed: Vec<usize>,
}

/// Prompt chunk sizes: short prompts in 16-token calls, long ones in 128-token calls.
const CHUNKS: [usize; 2] = [16, 128];
/// The smallest attention window.
const MIN_WINDOW: usize = 128;
/// Rows per mixed call: a few new prompts beside the decode rows, and a burst of short
/// prompts at once, in steps of 16 so a burst pads little (with only 16 and 64, SmolLM2's
/// p99 time to first token at 8 streams was 0.20-0.27 s, with these 0.16-0.19 s:
/// docs/PERFORMANCE.md). The largest also takes every slot's decode row plus a 16-token
/// chunk (`Plan::for_layout` adds a size for many slots).
const MIXED_ROWS: [usize; 4] = [16, 32, 48, 64];

impl Plan {
    /// The plan for `cfg` under `config`, or why it cannot run (a context that does not fit
    /// the budget, zero sizes).
    pub fn new(cfg: &ModelConfig, config: &EngineConfig) -> Result<Plan> {
        if config.max_batch == 0 {
            return Err(Error::ZeroBatch);
        }
        let per_position = CacheShape::bytes_per_position(cfg, config.kv_elem);
        let positions = match config.max_context {
            Some(0) => return Err(Error::ZeroContext),
            Some(n) => n,
            None => {
                let model = cfg.max_position_embeddings.unwrap_or(FALLBACK_CONTEXT);
                let fits = config.kv_budget_bytes / (per_position * config.max_batch);
                if fits == 0 {
                    return Err(Error::BudgetTooSmall {
                        budget: config.kv_budget_bytes,
                        slots: config.max_batch,
                        per_position,
                    });
                }
                model.min(fits)
            }
        };
        let cache = CacheShape { slots: config.max_batch, positions, elem: config.kv_elem };
        let mut batches: Vec<usize> = (0..).map(|i| 1 << i).take_while(|b| *b < config.max_batch).collect();
        batches.push(config.max_batch);
        // Only chunks smaller than the context: a chunk the size of the whole context (128 at
        // 128 positions) is one more compiled prefill and cache write (a third of a small
        // model's compile) to save a few 16-token calls on prompts that are the context.
        let mut chunks: Vec<usize> = CHUNKS.iter().copied().filter(|c| *c < positions).collect();
        if chunks.is_empty() {
            chunks.push(positions);
        }
        let mut windows: Vec<usize> = (0..).map(|i| MIN_WINDOW << i).take_while(|w| *w < positions).collect();
        windows.push(positions);
        let call_rows = crate::device::call_overhead_rows(&crate::device::target_for(&config.device)?);
        Ok(Plan { cache, batches, chunks, decode_windows: windows.clone(), windows, call_rows, mixed: Vec::new() })
    }

    /// The plan for graphs of `layout`: where attention runs in the CPU kernel
    /// (`models::graph::attention_in_kernel`), which reads only the positions in use, one
    /// window (the context) per batch size and chunk instead of one per window: the same
    /// speed at every context, and a fraction of the functions to compile.
    ///
    /// With several slots there, also the mixed calls: every sequence's new tokens (prompt
    /// chunks and decode rows) in one call per step, as the kernel tells sequences apart by
    /// slot, where prompts otherwise take a call each (docs/PERFORMANCE.md, "Prompts beside
    /// decode rows").
    pub fn for_layout(mut self, cfg: &ModelConfig, layout: &Layout) -> Plan {
        if models::graph::attention_in_kernel(cfg, layout) {
            self.decode_windows = vec![self.cache.positions];
            self.windows = vec![self.cache.positions];
            if self.cache.slots > 1 {
                self.mixed = MIXED_ROWS.to_vec();
                let most = (self.cache.slots + MIXED_ROWS[0]).next_power_of_two();
                if most > MIXED_ROWS[MIXED_ROWS.len() - 1] {
                    self.mixed.push(most);
                }
            }
        }
        self
    }

    /// Every function the engine can call.
    pub fn functions(&self) -> Vec<Function> {
        let prefill = self.chunks.iter().flat_map(|&tokens| {
            self.windows.iter().filter(move |w| **w >= tokens).map(move |&window| Function::Prefill { tokens, window })
        });
        let decode = self
            .batches
            .iter()
            .flat_map(|&rows| self.decode_windows.iter().map(move |&window| Function::Decode { rows, window }));
        let (outs, window) = (self.cache.slots, self.cache.positions);
        let mixed = self.mixed.iter().map(move |&rows| Function::Mixed { rows, outs, window });
        let mut writes: Vec<usize> = self.batches.iter().chain(&self.chunks).chain(&self.mixed).copied().collect();
        writes.sort_unstable();
        writes.dedup();
        prefill.chain(decode).chain(mixed).chain(writes.into_iter().map(|rows| Function::WriteKv { rows })).collect()
    }

    /// The mixed call for `rows` rows, if the plan has one that large.
    fn mixed(&self, rows: usize) -> Option<Function> {
        let rows = self.mixed.iter().copied().find(|r| *r >= rows)?;
        Some(Function::Mixed { rows, outs: self.cache.slots, window: self.cache.positions })
    }

    /// The smallest window holding positions `[0, end)`.
    fn window(&self, end: usize) -> Option<usize> {
        self.windows.iter().copied().find(|w| *w >= end)
    }

    /// The decode call for `rows` rows whose highest position is `top`.
    fn decode(&self, rows: usize, top: usize) -> Option<Function> {
        let rows = self.batches.iter().copied().find(|b| *b >= rows)?;
        let window = self.decode_windows.iter().copied().find(|w| *w > top)?;
        Some(Function::Decode { rows, window })
    }

    /// The prefill call for the next of `remaining` prompt tokens at `start`: the first call
    /// of the cheapest run of chunks covering them, a call costing its rows (padding
    /// included) plus `call_rows`; ties go to the larger chunk. Never one whose padding would
    /// pass the end of the slot. `None` when no chunk fits there (the caller feeds single
    /// tokens).
    fn prefill(&self, start: usize, remaining: usize) -> Option<Function> {
        let fits: Vec<usize> = self.chunks.iter().copied().filter(|c| start + c <= self.cache.positions).collect();
        let largest = *fits.last()?;
        // A full largest chunk costs the least per token, so it goes first while it fills;
        // under that, best[r] is the cheapest cover of r tokens (a small table: r < largest).
        let tokens = if remaining >= largest {
            largest
        } else {
            let cost = |c: usize| c + self.call_rows;
            let mut best = vec![0usize; remaining + 1];
            for r in 1..=remaining {
                best[r] = fits.iter().map(|&c| cost(c) + best[r.saturating_sub(c)]).min()?;
            }
            *fits.iter().rev().min_by_key(|&&c| cost(c) + best[remaining.saturating_sub(c)])?
        };
        Some(Function::Prefill { tokens, window: self.window(start + tokens)? })
    }
}

/// The logits of one call, `[rows, vocab]`, still on the device; downloaded once, the first
/// time a row asks.
#[derive(Debug)]
struct Logits {
    view: BufferView,
    vocab: usize,
    host: OnceCell<Vec<f32>>,
}

/// One row's result: the greedy next token, and its logits on demand.
#[derive(Debug, Clone)]
pub struct Step {
    pub next: u32,
    logits: Rc<Logits>,
    row: usize,
}

impl Step {
    /// This row's `[vocab]` logits (the call's logits are downloaded on the first ask).
    pub fn logits(&self) -> Result<Vec<f32>> {
        let all = match self.logits.host.get() {
            Some(all) => all,
            None => {
                let all = self.logits.view.to_vec()?;
                self.logits.host.get_or_init(|| all)
            }
        };
        let v = self.logits.vocab;
        Ok(all[self.row * v..(self.row + 1) * v].to_vec())
    }
}

/// One compiled module of a model: which functions it holds and how it is compiled.
#[derive(Debug, Clone)]
pub struct GraphModule {
    /// For progress lines, e.g. "llama f16 decode graph (...)".
    pub what: String,
    pub functions: Vec<Function>,
    pub mlir: String,
    pub options: CompileOptions,
}

/// The modules an engine compiles for `target`. On CPU every function shares one module
/// compiled with data tiling on IREE's global-optimization path and microkernels: the weights
/// are constant globals, so IREE repacks them into the layouts its matrix microkernels read,
/// and prefill, batched and single-row decode all read that one copy (docs/PERFORMANCE.md,
/// "Data tiling"). The repacking is split out into a parameter encoder module, run once per
/// module and checkpoint ([`cache::stored_parameters`]): the module itself reads the
/// repacked weights from a file, so a load neither repacks nor holds the checkpoint's
/// copy beside the repacked one (docs/PERFORMANCE.md, "Peak RSS"). The default data-tiling path
/// (`--iree-opt-data-tiling`, which picks the dispatch-creation path) crashes IREE 3.13's
/// compiler on prefill and several-row decode (a segmentation fault in
/// MaterializeDeviceEncodingPass); the global-optimization path compiles them.
pub fn graph_modules(
    cfg: &ModelConfig,
    layout: &Layout,
    plan: &Plan,
    target: &iree_compiler::Target,
) -> Result<Vec<GraphModule>> {
    let options = match target {
        // The graph-level packed form's i16 weights blow IREE 3.13's vector-size limit when
        // data-tiled ("One or more operations with large vector sizes"): default flags then.
        iree_compiler::Target::LlvmCpu { .. } if !layout.has_graph_packing() => CompileOptions::default()
            .with_flag("--iree-global-opt-data-tiling")
            .with_flag("--iree-llvmcpu-enable-ukernels=all")
            .with_parameter_encoder(),
        _ => CompileOptions::default(),
    };
    let c = plan.cache;
    let functions = plan.functions();
    let mlir = models::graph::emit_functions(cfg, layout, c, &functions, None)?;
    let what = format!(
        "{} {} prefill+decode graphs ({} functions; {} slots x {} positions, {} KV cache)",
        cfg.model_type,
        layout.precision(),
        functions.len(),
        c.slots,
        c.positions,
        c.elem
    );
    Ok(vec![GraphModule { what, functions, mlir, options }])
}

/// The device layout of `precision` for this checkpoint and target. Packed matrices, and at
/// `f16`, `bf16` (or `packed`) the dense ones, use the hand-written CPU kernels that `kernels` picks
/// (`kernels::cpu`, the object installed into `cache_dir`) on an `llvm-cpu` target, and the CUDA kernel (`kernels::cuda`, its PTX in
/// the module) on `cuda` unless `kernels` is `Off`; elsewhere, or with none, they use the
/// graph form.
/// SPIR-V targets get the layout's SPIR-V form (`Layout::for_spirv`). Forcing an
/// instruction set the host lacks is `Error::KernelIsa`, whatever the target.
pub fn layout_for(
    cfg: &ModelConfig,
    precision: Precision,
    ckpt: &Checkpoint,
    target: &iree_compiler::Target,
    kernels: CpuKernels,
    cache_dir: &Path,
) -> Result<Layout> {
    let backend = crate::device::model_backend(target, kernels, cache_dir)?;
    Ok(Layout::new(cfg, precision, ckpt, &backend)?)
}

/// Refuses the first id at or above `vocab` (`Error::TokenOutOfRange`): the one check of token
/// ids, for the engine, the scheduler and the CLI's own inputs.
pub fn check_tokens<'a>(tokens: impl IntoIterator<Item = &'a u32>, vocab: usize) -> Result<()> {
    match tokens.into_iter().find(|t| **t as usize >= vocab) {
        Some(&token) => Err(Error::TokenOutOfRange { token, vocab }),
        None => Ok(()),
    }
}

#[derive(Debug)]
pub struct Engine {
    cfg: ModelConfig,
    plan: Plan,
    device: Device,
    session: Session,
    k: BufferView,
    v: BufferView,
    /// Positions in use per slot.
    lens: Vec<usize>,
    pub compile: CompileReport,
    pub load_seconds: f64,
    /// Bytes of all parameters bound on the device.
    pub weight_bytes: usize,
    /// Bytes of the k and v caches on the device.
    pub kv_bytes: usize,
    /// The file the weights are bound from, in the final form the module reads, when they
    /// are stored ([`EngineConfig::store_parameters`] on a data-tiled CPU module).
    pub stored_parameters: Option<std::path::PathBuf>,
}

/// What a load decides before the device and the compiler: the checkpoint opened, its
/// config, layout and plan (every refusal of what the engine cannot run happens here).
struct Planned {
    target: iree_compiler::Target,
    ckpt: Checkpoint,
    cfg: ModelConfig,
    layout: Layout,
    plan: Plan,
}

impl Planned {
    fn new(dir: &Path, config: &EngineConfig) -> Result<Planned> {
        let target = crate::device::target_for(&config.device)?;
        let ckpt = Checkpoint::open(dir)?;
        let cfg = ModelConfig::for_checkpoint(&ckpt)?;
        let layout = layout_for(&cfg, config.precision, &ckpt, &target, config.cpu_kernels, &config.cache_dir)?;
        let plan = Plan::new(&cfg, config)?.for_layout(&cfg, &layout);
        Ok(Planned { target, ckpt, cfg, layout, plan })
    }
}

/// Every module of `plan` compiled (or found in the cache), with what each is, and the
/// compile report of them all.
fn compile_modules(
    cfg: &ModelConfig,
    layout: &Layout,
    plan: &Plan,
    target: &iree_compiler::Target,
    config: &EngineConfig,
) -> Result<(Vec<(String, cache::CompiledModule)>, CompileReport)> {
    let mut modules = graph_modules(cfg, layout, plan, target)?;
    let (compiled, report) = compile_graph_modules(&mut modules, target, config)?;
    Ok((modules.into_iter().map(|m| m.what).zip(compiled).collect(), report))
}

/// `modules` (from [`graph_modules`]) compiled for `target` through `config`'s cache, as a
/// load compiles them (the parameter encoder only where `config` stores parameters; it is
/// set off in `modules` otherwise), and the compile report of them all.
pub fn compile_graph_modules(
    modules: &mut [GraphModule],
    target: &iree_compiler::Target,
    config: &EngineConfig,
) -> Result<(Vec<cache::CompiledModule>, CompileReport)> {
    let mut compiled = Vec::new();
    let mut report = CompileReport::CacheHit;
    for module in modules {
        module.options.parameter_encoder &= config.store_parameters;
        let c = cache::compile_module(
            &config.cache_dir,
            &module.what,
            &module.mlir,
            target,
            &module.options,
            config.dump_mlir,
        )?;
        report = report.and(c.report);
        compiled.push(c);
    }
    Ok((compiled, report))
}

impl Engine {
    /// Compiles (or finds in the cache) every module [`Engine::load`] loads for this model
    /// and configuration, without opening the device: fills a compile cache for a machine
    /// that has the device but no compiler (scripts/cuda-check). The same refusals as a
    /// load, before anything is compiled.
    pub fn compile_only(dir: &Path, config: &EngineConfig) -> Result<CompileReport> {
        let Planned { target, cfg, layout, plan, .. } = Planned::new(dir, config)?;
        Ok(compile_modules(&cfg, &layout, &plan, &target, config)?.1)
    }

    /// Opens the checkpoint, refuses what it cannot run (before compiling), compiles every
    /// function of its [`Plan`] (cached), binds the weights and allocates the KV cache.
    pub fn load(dir: &Path, config: &EngineConfig) -> Result<Engine> {
        let Planned { target, ckpt, cfg, layout, plan } = Planned::new(dir, config)?;
        // The device before the compile: a machine without one (no Vulkan driver) hears so
        // at once, not after minutes of compiling.
        let instance = Instance::new()?;
        let device = instance.device(&device::runtime_uri(&config.device)).map_err(|e| match e {
            iree_hal::Error::Device { message, .. } if matches!(target, iree_compiler::Target::Vulkan { .. }) => {
                Error::NoVulkanDevice { message }
            }
            e => Error::Runtime(e),
        })?;

        let (modules, compile) = compile_modules(&cfg, &layout, &plan, &target, config)?;

        let started = Instant::now();
        let mut session = Session::new(&instance, &device)?;
        // Globals that view one parameter share its bytes: each key counts (and is bound) once.
        let mut params = layout.device_params(&cfg);
        let mut seen = std::collections::HashSet::new();
        params.retain(|p| seen.insert(p.key.clone()));
        let weight_bytes = params.iter().map(|p| p.bytes()).sum();
        let host_params = || -> Result<Parameters> {
            let mut bound = Parameters::new(SCOPE)?;
            for param in &params {
                let bytes = layout.load(&ckpt, param)?;
                debug_assert_eq!(bytes.len(), param.bytes(), "{}", param.key);
                bound.add_tensor(&param.key, &bytes)?;
            }
            Ok(bound)
        };
        let encoded: Vec<_> = modules.iter().filter(|(_, m)| m.encoder.is_some()).collect();
        let (bound, stored_parameters) = match encoded.as_slice() {
            [] => (host_params()?, None),
            [(what, module)] if modules.len() == 1 => {
                let files: Vec<&Path> = ckpt.shards().iter().map(|f| f.path()).collect();
                let path = cache::parameters_path(&module.path, ckpt.dir(), &files)
                    .map_err(|source| Error::ParameterStore { path: module.path.clone(), source })?;
                let encoder = module.encoder.as_deref().unwrap_or_default();
                let (bound, kept) = cache::stored_parameters(&instance, &device, what, &path, encoder, host_params)?;
                (bound, kept.then_some(path))
            }
            _ => return Err(Error::EncodedModules { modules: encoded.len() }),
        };
        session.append_parameters(&[&bound])?;
        for (_, module) in &modules {
            session.load_vmfb(&module.vmfb)?;
        }
        if let Some(max) = config.cache_max_bytes {
            let keep: Vec<&Path> = modules.iter().map(|(_, m)| m.path.as_path()).collect();
            cache::evict(&config.cache_dir, max, &keep);
        }
        let dims = plan.cache.dims(&cfg);
        // Zeros, not garbage: a masked position still multiplies its value by 0 in attention.
        let zeros = vec![0u8; dims.iter().product::<usize>() * plan.cache.elem.bytes()];
        let elem = match plan.cache.elem {
            KvElem::F32 => iree_hal::ElementType::F32,
            KvElem::F16 => iree_hal::ElementType::F16,
        };
        let k = device.upload_bytes(elem, &dims, &zeros)?;
        let v = device.upload_bytes(elem, &dims, &zeros)?;
        drop(zeros);
        let load_seconds = started.elapsed().as_secs_f64();
        let kv_bytes = plan.cache.bytes(&cfg);
        let lens = vec![0; plan.cache.slots];
        Ok(Engine {
            cfg,
            plan,
            device,
            session,
            k,
            v,
            lens,
            compile,
            load_seconds,
            weight_bytes,
            kv_bytes,
            stored_parameters,
        })
    }

    pub fn config(&self) -> &ModelConfig {
        &self.cfg
    }

    pub fn plan(&self) -> &Plan {
        &self.plan
    }

    /// Sequences that can be decoded together (KV slots).
    pub fn max_batch(&self) -> usize {
        self.plan.cache.slots
    }

    /// Positions per sequence.
    pub fn max_context(&self) -> usize {
        self.plan.cache.positions
    }

    /// Positions used so far by `slot`.
    pub fn position(&self, slot: usize) -> usize {
        self.lens.get(slot).copied().unwrap_or(0)
    }

    /// Forgets `slot`'s context; its next call starts at position 0. Stale cache entries are
    /// never read: a position is written before any query can see it.
    pub fn reset(&mut self, slot: usize) {
        if let Some(len) = self.lens.get_mut(slot) {
            *len = 0;
        }
    }

    fn check_slot(&self, slot: usize) -> Result<()> {
        if slot >= self.lens.len() {
            return Err(Error::NoSuchSlot { slot, slots: self.lens.len() });
        }
        Ok(())
    }

    fn context_full(&self, slot: usize, more: usize) -> Error {
        Error::ContextFull { slot, held: self.lens[slot], more, max: self.max_context() }
    }

    /// The checks of one call's `(slot, tokens)` entries (decode rows or mixed entries):
    /// tokens present and in the vocabulary, slots existing and distinct, and room for the
    /// tokens in each slot's context.
    fn check_entries<'t>(&self, entries: impl IntoIterator<Item = (usize, &'t [u32])>) -> Result<()> {
        let mut seen = vec![false; self.lens.len()];
        for (slot, tokens) in entries {
            if tokens.is_empty() {
                return Err(Error::EmptyPrompt);
            }
            self.check_slot(slot)?;
            check_tokens(tokens, self.cfg.vocab)?;
            if std::mem::replace(&mut seen[slot], true) {
                return Err(Error::DuplicateSlot { slot });
            }
            if self.lens[slot] + tokens.len() > self.max_context() {
                return Err(self.context_full(slot, tokens.len()));
            }
        }
        Ok(())
    }

    /// Runs step `function` on `tokens` at `positions` (one per row) for the sequences in
    /// `slots` (`last`: the rows whose logits are wanted, for prefill and mixed calls), then
    /// writes the rows' keys and values into the cache at (`row_slots`, `positions`).
    fn call(
        &mut self,
        function: Function,
        tokens: &[i32],
        positions: &[i32],
        slots: &[i32],
        last: Option<&[i32]>,
        row_slots: &[i32],
    ) -> Result<(Vec<i32>, Rc<Logits>)> {
        let upload = |data: &[i32]| self.device.upload(&[data.len()], data);
        let slots_given = slots;
        let (tokens, positions, slots) = (upload(tokens)?, upload(positions)?, upload(slots)?);
        let last = last.map(upload).transpose()?;
        let mut args = vec![&tokens, &positions, &slots];
        args.extend(last.as_ref());
        args.extend([&self.k, &self.v]);
        let name = function.name();
        let out = self.session.call(&name, &args)?;
        let got = out.len();
        let Ok([next, logits, new_k, new_v]) = <[BufferView; 4]>::try_from(out) else {
            return Err(Error::Abi { function: name, got, expected: 4 });
        };
        let write = Function::WriteKv { rows: row_slots.len() }.name();
        // A decode or mixed call's rows are its slots: the same view, not a second upload
        // (on a GPU each upload is an allocation and a synchronous copy).
        let own_row_slots = if row_slots == slots_given { None } else { Some(upload(row_slots)?) };
        let row_slots = own_row_slots.as_ref().unwrap_or(&slots);
        let out = self.session.call(&write, &[&positions, row_slots, &new_k, &new_v, &self.k, &self.v])?;
        let got = out.len();
        let Ok([k, v]) = <[BufferView; 2]>::try_from(out) else {
            return Err(Error::Abi { function: write, got, expected: 2 });
        };
        self.k = k;
        self.v = v;
        let logits = Rc::new(Logits { view: logits, vocab: self.cfg.vocab, host: OnceCell::new() });
        Ok((next.to_vec()?, logits))
    }

    /// Appends `prompt` to `slot`'s context (in chunks) and returns the step after its last
    /// token.
    pub fn prefill(&mut self, slot: usize, prompt: &[u32]) -> Result<Step> {
        if prompt.is_empty() {
            return Err(Error::EmptyPrompt);
        }
        self.check_slot(slot)?;
        check_tokens(prompt, self.cfg.vocab)?;
        if self.lens[slot] + prompt.len() > self.max_context() {
            return Err(self.context_full(slot, prompt.len()));
        }
        let mut rest = prompt;
        let mut last = None;
        while !rest.is_empty() {
            let start = self.lens[slot];
            let Some(function @ Function::Prefill { tokens, .. }) = self.plan.prefill(start, rest.len()) else {
                // Too close to the end of the slot for any chunk's padding: one token at a time.
                last = Some(self.decode(&[(slot, rest[0])])?.remove(0));
                rest = &rest[1..];
                continue;
            };
            let take = tokens.min(rest.len());
            let mut ids: Vec<i32> = rest[..take].iter().map(|t| *t as i32).collect();
            ids.resize(tokens, 0);
            let positions: Vec<i32> = (start..start + tokens).map(|p| p as i32).collect();
            let slots = vec![slot as i32; tokens];
            let (next, logits) =
                self.call(function, &ids, &positions, &[slot as i32], Some(&[take as i32 - 1]), &slots)?;
            self.lens[slot] += take;
            last = Some(Step { next: next[0] as u32, logits, row: 0 });
            rest = &rest[take..];
        }
        last.ok_or(Error::EmptyPrompt)
    }

    /// One decode step for every `(slot, token)` row at once; slots must be distinct. Returns
    /// one step per row, in order.
    pub fn decode(&mut self, rows: &[(usize, u32)]) -> Result<Vec<Step>> {
        let Some(&first) = rows.first() else {
            return Err(Error::NoRows);
        };
        self.check_entries(rows.iter().map(|(slot, token)| (*slot, std::slice::from_ref(token))))?;
        let top = rows.iter().map(|(slot, _)| self.lens[*slot]).max().unwrap_or(0);
        let function =
            self.plan.decode(rows.len(), top).ok_or(Error::TooManyRows { rows: rows.len(), max: self.max_batch() })?;
        // Padding rows repeat the first row: rows are computed independently, so they write
        // the same bytes to the same place.
        let b = function.rows();
        let padded = rows.iter().chain(std::iter::repeat_n(&first, b - rows.len()));
        let (mut ids, mut positions, mut slots) = (Vec::with_capacity(b), Vec::with_capacity(b), Vec::with_capacity(b));
        for &(slot, token) in padded {
            ids.push(token as i32);
            positions.push(self.lens[slot] as i32);
            slots.push(slot as i32);
        }
        let (next, logits) = self.call(function, &ids, &positions, &slots, None, &slots)?;
        for &(slot, _) in rows {
            self.lens[slot] += 1;
        }
        Ok((0..rows.len()).map(|row| Step { next: next[row] as u32, logits: Rc::clone(&logits), row }).collect())
    }

    /// Feeds one token to `slot`.
    pub fn decode_one(&mut self, slot: usize, token: u32) -> Result<Step> {
        Ok(self.decode(&[(slot, token)])?.remove(0))
    }

    /// Most rows one [`Engine::step`] takes in a single call (0: the plan has no mixed calls,
    /// so a step calls once per prompt).
    pub fn step_rows(&self) -> usize {
        self.plan.mixed.last().copied().unwrap_or(0)
    }

    /// Appends each `(slot, tokens)` entry's tokens to its slot (prompt chunks, or one token
    /// a decode row; slots distinct) and returns, per entry in order, the step after its last
    /// token: every entry in one mixed call where the plan has them (at most
    /// [`Engine::step_rows`] rows in all), else one decode call for the single tokens and a
    /// prefill per longer entry. The results are those of feeding each entry alone.
    pub fn step(&mut self, batch: &[(usize, &[u32])]) -> Result<Vec<Step>> {
        if batch.is_empty() {
            return Err(Error::NoRows);
        }
        self.check_entries(batch.iter().copied())?;
        let rows: usize = batch.iter().map(|(_, t)| t.len()).sum();
        if rows == batch.len() || self.plan.mixed.is_empty() {
            return self.step_apart(batch);
        }
        let function = self.plan.mixed(rows).ok_or(Error::TooManyRows { rows, max: self.step_rows() })?;
        let (width, outs) = (function.rows(), function.outs());
        let (mut ids, mut positions, mut slots) =
            (Vec::with_capacity(width), Vec::with_capacity(width), Vec::with_capacity(width));
        let mut last = Vec::with_capacity(outs);
        for &(slot, tokens) in batch {
            let start = self.lens[slot];
            for (i, &token) in tokens.iter().enumerate() {
                ids.push(token as i32);
                positions.push((start + i) as i32);
                slots.push(slot as i32);
            }
            last.push(ids.len() as i32 - 1);
        }
        // Padding rows repeat the last row: the attention kernel gives a repeat of a row the
        // same bits, and it writes the same bytes to the same place. Unused outputs repeat
        // the first.
        let end = ids.len() - 1;
        let (id, position, slot) = (ids[end], positions[end], slots[end]);
        ids.resize(width, id);
        positions.resize(width, position);
        slots.resize(width, slot);
        last.resize(outs, last[0]);
        let (next, logits) = self.call(function, &ids, &positions, &slots, Some(&last), &slots)?;
        for &(slot, tokens) in batch {
            self.lens[slot] += tokens.len();
        }
        Ok((0..batch.len()).map(|row| Step { next: next[row] as u32, logits: Rc::clone(&logits), row }).collect())
    }

    /// [`Engine::step`] without a mixed call: the single tokens in one decode call, then each
    /// longer entry's prefill.
    fn step_apart(&mut self, batch: &[(usize, &[u32])]) -> Result<Vec<Step>> {
        let singles: Vec<(usize, u32)> =
            batch.iter().filter(|(_, t)| t.len() == 1).map(|&(slot, t)| (slot, t[0])).collect();
        let mut decoded = if singles.is_empty() { Vec::new() } else { self.decode(&singles)? }.into_iter();
        let mut out = Vec::with_capacity(batch.len());
        for &(slot, tokens) in batch {
            let step = if tokens.len() == 1 { decoded.next() } else { Some(self.prefill(slot, tokens)?) };
            out.push(step.ok_or(Error::NoRows)?);
        }
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cfg() -> ModelConfig {
        let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures/qwen2/f32");
        ModelConfig::from_file(&dir.join("config.json")).unwrap()
    }

    fn config(max_batch: usize, max_context: Option<usize>) -> EngineConfig {
        EngineConfig { max_batch, max_context, ..EngineConfig::new("local-task", Precision::F32, "/nonexistent") }
    }

    #[test]
    fn plan_sizes() {
        let p = Plan::new(&cfg(), &config(8, Some(1000))).unwrap();
        assert_eq!(p.batches, [1, 2, 4, 8]);
        assert_eq!(p.chunks, [16, 128]);
        assert_eq!(p.windows, [128, 256, 512, 1000]);
        assert_eq!(p.cache.slots, 8);
        let p = Plan::new(&cfg(), &config(6, Some(64))).unwrap();
        assert_eq!(
            (p.batches.as_slice(), p.chunks.as_slice(), p.windows.as_slice()),
            (&[1, 2, 4, 6][..], &[16][..], &[64][..])
        );
        let p = Plan::new(&cfg(), &config(1, Some(128))).unwrap();
        assert_eq!((p.chunks.as_slice(), p.windows.as_slice()), (&[16][..], &[128][..]));
        let p = Plan::new(&cfg(), &config(1, Some(129))).unwrap();
        assert_eq!((p.chunks.as_slice(), p.windows.as_slice()), (&[16, 128][..], &[128, 129][..]));
        let p = Plan::new(&cfg(), &config(1, Some(16))).unwrap();
        assert_eq!(p.chunks, [16]);
        let p = Plan::new(&cfg(), &config(1, Some(10))).unwrap();
        assert_eq!((p.batches.as_slice(), p.chunks.as_slice(), p.windows.as_slice()), (&[1][..], &[10][..], &[10][..]));
        // Every prefill function's chunk fits its window.
        for f in Plan::new(&cfg(), &config(3, Some(300))).unwrap().functions() {
            if let Function::Prefill { tokens, window } = f {
                assert!(tokens <= window, "{f:?}");
            }
        }
    }

    #[test]
    fn context_from_the_model_capped_by_the_budget() {
        let c = cfg();
        let per = CacheShape::bytes_per_position(&c, KvElem::F32);
        let model = c.max_position_embeddings.unwrap_or(FALLBACK_CONTEXT);
        let p = Plan::new(&c, &config(2, None)).unwrap();
        assert_eq!(p.cache.positions, model.min(DEFAULT_KV_BUDGET / (2 * per)));
        let tight = EngineConfig { kv_budget_bytes: per * 2 * 100, ..config(2, None) };
        assert_eq!(Plan::new(&c, &tight).unwrap().cache.positions, 100.min(model));
        let none = EngineConfig { kv_budget_bytes: 1, ..config(2, None) };
        let err = Plan::new(&c, &none).unwrap_err().to_string();
        assert!(err.starts_with("a KV budget of 1 bytes holds no position for 2 sequences"), "{err}");
        assert_eq!(Plan::new(&c, &config(0, None)).unwrap_err().to_string(), "max batch must be at least 1");
    }

    /// Where the CPU kernel runs attention (packed weights on llvm-cpu, a host with a kernel
    /// object), decode and prefill are compiled for one window, the context, and their graphs
    /// dispatch the kernel; dense weights keep every window and the graph form.
    #[test]
    fn one_window_where_the_kernel_attends() {
        let c = cfg();
        let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures/qwen2/q4");
        let ckpt = Checkpoint::open(&dir).unwrap();
        let target = iree_compiler::Target::llvm_cpu_host();
        let cache_dir = std::env::temp_dir().join(format!("engine-plan-{}", std::process::id()));
        let packed = layout_for(&c, Precision::Packed, &ckpt, &target, CpuKernels::Auto, &cache_dir).unwrap();
        let dense = Layout::dense(&c, Precision::F32);
        let plan = Plan::new(&c, &config(4, Some(300))).unwrap();
        assert_eq!(plan.decode_windows, plan.windows);
        assert_eq!(plan.clone().for_layout(&c, &dense), plan);
        let decodes = |p: &Plan| -> Vec<Function> {
            p.functions().into_iter().filter(|f| matches!(f, Function::Decode { .. })).collect()
        };
        assert_eq!(decodes(&plan).len(), plan.batches.len() * plan.windows.len());
        let text = |layout: &Layout, plan: &Plan| -> String {
            graph_modules(&c, layout, plan, &target).unwrap().iter().map(|m| m.mlir.clone()).collect()
        };
        assert!(!text(&dense, &plan).contains("@attn_f32_u"));
        if kernels::cpu::host_isa().is_some() {
            let kernel = plan.clone().for_layout(&c, &packed);
            assert_eq!((kernel.decode_windows.as_slice(), kernel.windows.as_slice()), (&[300][..], &[300][..]));
            assert_eq!((&kernel.batches, &kernel.chunks), (&plan.batches, &plan.chunks));
            let prefills: Vec<Function> =
                kernel.functions().into_iter().filter(|f| matches!(f, Function::Prefill { .. })).collect();
            let chunk_each: Vec<Function> =
                plan.chunks.iter().map(|&tokens| Function::Prefill { tokens, window: 300 }).collect();
            assert_eq!(prefills, chunk_each);
            let rows: Vec<usize> = kernel.batches.clone();
            let one_each: Vec<Function> = rows.iter().map(|&rows| Function::Decode { rows, window: 300 }).collect();
            assert_eq!(decodes(&kernel), one_each);
            assert_eq!(kernel.decode(3, 0), Some(Function::Decode { rows: 4, window: 300 }));
            assert_eq!(kernel.decode(1, 299), Some(Function::Decode { rows: 1, window: 300 }));
            assert_eq!(kernel.decode(1, 300), None);
            // Mixed calls (4 slots): 16 to 64 rows in steps of 16, logits for every slot.
            let mixed: Vec<Function> =
                kernel.functions().into_iter().filter(|f| matches!(f, Function::Mixed { .. })).collect();
            let sizes = [16, 32, 48, 64].map(|rows| Function::Mixed { rows, outs: 4, window: 300 });
            assert_eq!(mixed, sizes);
            assert_eq!(kernel.mixed(17), Some(sizes[1]));
            assert_eq!(kernel.mixed(64), Some(sizes[3]));
            assert_eq!(kernel.mixed(65), None);
            assert!(plan.mixed.is_empty(), "no mixed calls without the attention kernel");
            // The largest takes every slot's decode row beside a 16-token chunk; one slot
            // has no use for them.
            let slots = |n: usize| Plan::new(&c, &config(n, Some(300))).unwrap().for_layout(&c, &packed).mixed;
            assert_eq!((slots(48), slots(49), slots(1)), (vec![16, 32, 48, 64], vec![16, 32, 48, 64, 128], vec![]));
            // One attention dispatch per layer per function.
            let mlir = text(&packed, &kernel);
            let per_call = c.num_layers() * (one_each.len() + chunk_each.len() + mixed.len());
            assert_eq!(mlir.matches("entry_points = [@mlx_iree_kernels::@attn_f32_u1]").count(), per_call, "{mlir}");
        }
        let _ = std::fs::remove_dir_all(&cache_dir);
    }

    #[test]
    fn single_row_decode_slices_its_slot_on_cpu_only() {
        let c = cfg();
        let plan = Plan::new(&c, &config(4, Some(64))).unwrap();
        let text = |target: &iree_compiler::Target| -> String {
            let backend = crate::device::model_backend(target, CpuKernels::Off, Path::new("/nonexistent")).unwrap();
            let layout = Layout::dense_on(&c, Precision::F32, &backend);
            graph_modules(&c, &layout, &plan, target).unwrap().iter().map(|m| m.mlir.clone()).collect()
        };
        assert!(text(&iree_compiler::Target::llvm_cpu_host()).contains("stablehlo.dynamic_slice"));
        assert!(!text(&iree_compiler::Target::cuda("sm_80")).contains("stablehlo.dynamic_slice"));
    }

    #[test]
    fn calls_pick_the_smallest_fitting_shape() {
        let p = Plan::new(&cfg(), &config(8, Some(1000))).unwrap();
        assert_eq!(p.decode(1, 0), Some(Function::Decode { rows: 1, window: 128 }));
        assert_eq!(p.decode(3, 128), Some(Function::Decode { rows: 4, window: 256 }));
        assert_eq!(p.decode(8, 999), Some(Function::Decode { rows: 8, window: 1000 }));
        assert_eq!(p.decode(9, 0), None);
        assert_eq!(p.prefill(0, 5), Some(Function::Prefill { tokens: 16, window: 128 }));
        // On a CPU padding costs what real rows do: 37 tokens in three 16-token calls, 100
        // in one of 128 (cheaper than seven of 16 once each call's overhead counts).
        assert_eq!(p.prefill(0, 37), Some(Function::Prefill { tokens: 16, window: 128 }));
        assert_eq!(p.prefill(0, 100), Some(Function::Prefill { tokens: 128, window: 128 }));
        assert_eq!(p.prefill(128, 300), Some(Function::Prefill { tokens: 128, window: 256 }));
        // Near the end of the slot: only chunks whose padding stays inside it.
        assert_eq!(p.prefill(900, 50), Some(Function::Prefill { tokens: 16, window: 1000 }));
        assert_eq!(p.prefill(990, 5), None);
        // On a GPU a call costs its dispatches, whatever its rows: the fewest calls.
        let gpu = Plan::new(&cfg(), &EngineConfig { device: "cuda".into(), ..config(8, Some(1000)) }).unwrap();
        assert_eq!(gpu.prefill(0, 37), Some(Function::Prefill { tokens: 128, window: 128 }));
        assert_eq!(gpu.prefill(0, 5), Some(Function::Prefill { tokens: 16, window: 128 }));
        // Every call the plan picks is one it compiles.
        let all = p.functions();
        for start in (0..1000).step_by(7) {
            for remaining in [1, 15, 16, 17, 200] {
                if let Some(f) = p.prefill(start, remaining) {
                    assert!(all.contains(&f), "{f:?}");
                }
            }
            for rows in 1..=8 {
                assert!(all.contains(&p.decode(rows, start).unwrap()));
            }
        }
    }
}
