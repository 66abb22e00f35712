//! [`Engine`]: the model runner. Loads a checkpoint (plan, compile, bind the weights,
//! allocate the KV cache) and runs prefill, decode and mixed calls for its slots, on the one
//! thread that made it (IREE handles are not `Send`).

use crate::cache::{self, CompileReport};
use crate::modules::compile_modules;
use crate::{Backend, CompileTarget, EngineConfig, Error, KvElem, Plan, Result, device};
use iree_hal::{BufferView, Device, Instance, Parameters, Session};
use models::{Function, Layout, ModelConfig, graph::SCOPE};
use std::cell::OnceCell;
use std::path::Path;
use std::rc::Rc;
use std::time::Instant;
use weights::Checkpoint;

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
    /// The steps of a call's first `n` output rows: each row's next id, the call's logits.
    fn rows(next: &[i32], logits: &Rc<Logits>, n: usize) -> Vec<Step> {
        (0..n).map(|row| Step { next: next[row] as u32, logits: Rc::clone(logits), row }).collect()
    }

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
    /// Every slot's recurrent state where the model has recurrent layers: one `[slots, len]`
    /// f32 buffer per entry of `Plan::state_parts`.
    states: Vec<BufferView>,
    /// Positions in use per slot.
    lens: Vec<usize>,
    /// A recurrent model's last verify call, whose slot's state from before it is in the plan's
    /// scratch state, until the slot is truncated, reset or copied into.
    rollback: Option<Rollback>,
    report: LoadReport,
}

/// A verify call of a model with recurrent layers: its slot, the position its rows started
/// at and its tokens, to go back into them (`Engine::truncate`).
#[derive(Debug)]
struct Rollback {
    slot: usize,
    start: usize,
    tokens: Vec<u32>,
}

/// What a load did, in plain values (nothing of IREE): what a caller prints after loading
/// (`generate`'s summary line, the server's start line) and what `mlx-iree bench` reports.
#[derive(Debug, Clone)]
pub struct LoadReport {
    /// Whether every module came from the compile cache, else the seconds compiling took.
    pub compile: CompileReport,
    /// Seconds from the compiled modules to a ready engine: binding the weights (mapping
    /// stored ones, or reading the checkpoint and, on a first load, writing them in final
    /// form) and allocating the KV cache.
    pub load_seconds: f64,
    /// Bytes of all parameters bound on the device.
    pub weight_bytes: usize,
    /// Bytes of the k and v caches on the device.
    pub kv_bytes: usize,
    /// Bytes of the slots' recurrent state on the device (0 without recurrent layers).
    pub state_bytes: usize,
    /// The file the weights are bound from, in the final form the module reads, when they
    /// are stored ([`EngineConfig::store_parameters`] on a data-tiled CPU module).
    pub stored_parameters: Option<std::path::PathBuf>,
}

/// The rows of one step call in the graph ABI's order: per row its token id, its position in
/// its sequence and its sequence's KV slot (the three `i32` vectors the step function and
/// `write_kv` read), pushed a row at a time so the three always have one entry per row.
#[derive(Debug)]
struct Rows {
    tokens: Vec<i32>,
    positions: Vec<i32>,
    slots: Vec<i32>,
}

impl Rows {
    fn with_capacity(rows: usize) -> Rows {
        Rows { tokens: Vec::with_capacity(rows), positions: Vec::with_capacity(rows), slots: Vec::with_capacity(rows) }
    }

    /// Appends a row: `token` at `position` of the sequence in `slot`. Ids, positions and
    /// slots are far below 2^31 (vocabularies, contexts and slot counts are checked at load).
    fn push(&mut self, token: u32, position: usize, slot: usize) {
        self.tokens.push(token as i32);
        self.positions.push(position as i32);
        self.slots.push(slot as i32);
    }

    /// `tokens` of the sequence in `slot` from position `start`, padded to `width` rows with
    /// token 0 at the positions after them (inside the slot, and overwritten before any
    /// query can see them).
    fn sequence(tokens: &[u32], start: usize, slot: usize, width: usize) -> Rows {
        let mut rows = Rows::with_capacity(width);
        for (i, &token) in tokens.iter().chain(std::iter::repeat(&0)).take(width).enumerate() {
            rows.push(token, start + i, slot);
        }
        rows
    }

    fn len(&self) -> usize {
        self.tokens.len()
    }

    /// Pads to `width` rows by repeating row `row` (the same token at the same place: a
    /// repeated row computes and writes the same bytes as the row itself).
    fn pad(&mut self, width: usize, row: usize) {
        let (token, position, slot) = (self.tokens[row], self.positions[row], self.slots[row]);
        self.tokens.resize(width, token);
        self.positions.resize(width, position);
        self.slots.resize(width, slot);
    }
}

/// What a step function reads beside its rows, by kind of call (the graph ABI's `slots` and
/// `last` arguments: `models::graph`).
#[derive(Debug)]
enum Reads {
    /// A decode call: every row is a sequence of its own (its slot is the row's), and each
    /// row's logits come back.
    Decode,
    /// A prefill call: every row belongs to the sequence in `slot`; the logits of row `last`
    /// (the chunk's last real token) come back.
    Prefill { slot: usize, last: usize },
    /// A verify call: every row belongs to the sequence in `slot`, and every row's logits
    /// come back; a model with recurrent layers reads `last` too (its last real row).
    Verify { slot: usize, last: Option<usize> },
    /// A mixed call: rows of several sequences (each row's slot its own); the logits of the
    /// rows `outs` (each sequence's last row, padded to the function's outputs) come back.
    Mixed { outs: Vec<usize> },
}

/// What a load decides before the device and the compiler: the checkpoint opened, its
/// config, layout and plan (every refusal of what the engine cannot run happens here).
struct Planned {
    backend: Backend,
    ckpt: Checkpoint,
    cfg: ModelConfig,
    layout: Layout,
    plan: Plan,
}

impl Planned {
    fn new(dir: &Path, config: &EngineConfig) -> Result<Planned> {
        let target = CompileTarget::for_device(&config.device)?;
        let mut ckpt = Checkpoint::open(dir)?;
        let cfg = ModelConfig::for_checkpoint(&mut ckpt)?;
        let backend = Backend::new(target, config.kernels, &config.cache_dir)?
            .with_activations(config.activations, config.precision)?;
        let layout = backend.layout(&cfg, config.precision, &ckpt)?;
        // 8-bit activations change the integer products only: a checkpoint with none in the
        // CPU kernel (mxfp8's are float products) would ignore the setting.
        if config.activations == models::Activations::I8 && !layout.has_cpu_packed() {
            return Err(Error::Activations { reason: "no MLX integer-quantized matrix in this checkpoint".into() });
        }
        let plan = Plan::new(&cfg, config)?.for_layout(&cfg, &layout);
        Ok(Planned { backend, ckpt, cfg, layout, plan })
    }
}

impl Engine {
    /// Compiles (or finds in the cache) every module [`Engine::load`] loads for this model
    /// and configuration, without opening the device: fills a compile cache for a machine
    /// that has the device but no compiler (scripts/cuda-check). The same refusals as a
    /// load, before anything is compiled.
    pub fn compile_only(dir: &Path, config: &EngineConfig) -> Result<CompileReport> {
        let Planned { backend, cfg, layout, plan, .. } = Planned::new(dir, config)?;
        Ok(compile_modules(&cfg, &layout, &plan, &backend, config)?.1)
    }

    /// The `flow.dispatch` ops one decode step of one sequence runs (the smallest decode
    /// window) for this model and configuration: its module compiled to IREE's `flow` phase
    /// (this needs the compiler, never the device; nothing is cached) and counted inside the
    /// step's function and whatever it calls. For benchmarks: on a GPU a step costs about its
    /// dispatches. The same refusals as a load, before anything is compiled.
    pub fn decode_dispatches(dir: &Path, config: &EngineConfig) -> Result<usize> {
        let Planned { backend, cfg, layout, plan, .. } = Planned::new(dir, config)?;
        let window = plan.decode_windows.first().copied().unwrap_or(plan.cache.positions);
        let one = Function::Decode { rows: 1, window };
        let name = one.name();
        let module = backend
            .graph_modules(&cfg, &layout, &plan)?
            .into_iter()
            .find(|m| m.functions.contains(&one))
            .ok_or_else(|| Error::DispatchCount { function: name.clone(), reason: "no module holds it".into() })?;
        // The options a load compiles with (the parameter encoder only where it stores them).
        let mut options = module.options;
        options.parameter_encoder &= config.store_parameters;
        let flow = iree_compiler::Compiler::new()?.compile_to_ir(&module.mlir, backend.iree(), &options, "flow")?;
        crate::dispatches::count(&flow, &name).map_err(|reason| Error::DispatchCount { function: name, reason })
    }

    /// Opens the checkpoint, refuses what it cannot run (before compiling), compiles every
    /// function of its [`Plan`] (cached), binds the weights and allocates the KV cache.
    pub fn load(dir: &Path, config: &EngineConfig) -> Result<Engine> {
        let Planned { backend, ckpt, cfg, layout, plan } = Planned::new(dir, config)?;
        // The device before the compile: a machine without one (no Vulkan driver) hears so
        // at once, not after minutes of compiling.
        let instance = Instance::new()?;
        let device = instance.device(&device::runtime_uri(&config.device)).map_err(|e| match e {
            iree_hal::Error::Device { message, .. } if *backend.target() == CompileTarget::Vulkan => {
                Error::NoVulkanDevice { message }
            }
            e => e.into(),
        })?;

        let (modules, compile) = compile_modules(&cfg, &layout, &plan, &backend, config)?;

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
        // IREE 3.13's encoder leaves some parameters read from the source scope (any whose
        // repacking would grow it past 1.2x, as Qwen3.5's `in_proj_b`; gpt-oss's sinks), so
        // beside stored parameters those the module names (`cache::named_keys`) are bound
        // from the checkpoint in that scope too.
        let unencoded = if encoded.is_empty() {
            None
        } else {
            let keys = params.iter().map(|p| p.key.as_str());
            let named: std::collections::HashSet<&str> =
                encoded.iter().flat_map(|(_, m)| cache::named_keys(&m.vmfb, keys.clone())).collect();
            let mut unencoded = Parameters::new(SCOPE)?;
            for param in params.iter().filter(|p| named.contains(p.key.as_str())) {
                unencoded.add_tensor(&param.key, &layout.load(&ckpt, param)?)?;
            }
            tracing::debug!("{} parameters bound from the checkpoint beside the stored ones", named.len());
            Some(unencoded)
        };
        let providers: Vec<&Parameters> = std::iter::once(&bound).chain(unencoded.as_ref()).collect();
        session.append_parameters(&providers)?;
        for (_, module) in &modules {
            session.load_vmfb(&module.vmfb)?;
        }
        if let Some(max) = config.cache_max_bytes {
            let keep: Vec<&Path> = modules.iter().map(|(_, m)| m.path.as_path()).collect();
            cache::evict(&config.cache_dir, max, &keep);
        }
        let [k_dims, v_dims] = plan.cache.dims(&cfg);
        let elem = match plan.cache.elem {
            KvElem::F32 => iree_hal::ElementType::F32,
            KvElem::F16 => iree_hal::ElementType::F16,
            KvElem::Q8 => iree_hal::ElementType::I8,
        };
        // Zeros, not garbage: a masked position still multiplies its value by 0 in attention.
        // One buffer for both caches (the same size unless a latent attention's differ).
        let bytes = |dims: &[usize; 5]| dims.iter().product::<usize>() * plan.cache.elem.elem_bytes();
        let zeros = vec![0u8; bytes(&k_dims).max(bytes(&v_dims))];
        let k = device.upload_bytes(elem, &k_dims, &zeros[..bytes(&k_dims)])?;
        let v = device.upload_bytes(elem, &v_dims, &zeros[..bytes(&v_dims)])?;
        drop(zeros);
        // Zeros too, though a sequence's first call never reads its slot's state (the graph
        // starts a sequence at position 0 from zeros).
        let slots = plan.cache.state_slots();
        let states = plan
            .state_parts
            .iter()
            .map(|&len| device.upload(&[slots, len], &vec![0f32; slots * len]))
            .collect::<Result<_, _>>()?;
        let load_seconds = started.elapsed().as_secs_f64();
        let kv_bytes = plan.cache.bytes(&cfg);
        let lens = vec![0; plan.cache.slots];
        let state_bytes = plan.cache.state_bytes(&cfg);
        let report = LoadReport { compile, load_seconds, weight_bytes, kv_bytes, state_bytes, stored_parameters };
        Ok(Engine { cfg, plan, device, session, k, v, states, lens, rollback: None, report })
    }

    /// What the load did: compile, load time, device bytes, the stored-weights file.
    pub fn load_report(&self) -> &LoadReport {
        &self.report
    }

    pub fn config(&self) -> &ModelConfig {
        &self.cfg
    }

    pub fn plan(&self) -> &Plan {
        &self.plan
    }

    /// Sequences that can be decoded together (KV slots).
    pub fn max_batch(&self) -> usize {
        self.plan.slots()
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
        self.forget_rollback(slot);
    }

    /// Drops the last verify call's rollback if it was `slot`'s (whose rows now change).
    fn forget_rollback(&mut self, slot: usize) {
        if self.rollback.as_ref().is_some_and(|r| r.slot == slot) {
            self.rollback = None;
        }
    }

    /// Keeps the first `len` positions of `slot`'s context (at most those it holds) and forgets
    /// the rest: its next call starts at position `len`, reading the keys and values of the
    /// tokens before it as they are. A model with recurrent layers holds the state after its
    /// whole context only ([`Engine::has_state`]): it keeps all of it, goes back to none
    /// ([`Engine::reset`]), or, right after a verify call, to a length within that call's
    /// rows: the state from before the call is copied back from the scratch state and the kept
    /// rows are read again (a prefill), as if only they had been fed.
    ///
    /// # Errors
    /// `Error::BadTruncate` for any other length of a model with recurrent layers; a failed
    /// copy or prefill.
    pub fn truncate(&mut self, slot: usize, len: usize) -> Result<()> {
        self.check_slot(slot)?;
        let held = self.lens[slot];
        let len = len.min(held);
        if len == held {
            return Ok(());
        }
        if !self.has_state() {
            self.lens[slot] = len;
            return Ok(());
        }
        let rollback = self.rollback.take_if(|r| r.slot == slot && r.start <= len && r.start + r.tokens.len() == held);
        let (Some(r), Some(scratch)) = (rollback, self.plan.scratch) else {
            return Err(Error::BadTruncate { slot, len, held });
        };
        self.copy_state(&self.index_view(scratch)?, &self.index_view(slot)?)?;
        self.lens[slot] = r.start;
        if len > r.start {
            self.prefill(slot, &r.tokens[..len - r.start])?;
        }
        Ok(())
    }

    /// Makes `dst`'s context the first `len` positions of `src`'s (which stays as it is): their
    /// keys and values copied in blocks, and for a model with recurrent layers the state,
    /// which is that after all of `src`'s context, so `len` must be all of it there. Needs
    /// several slots on a target that compiles the copies ([`Engine::can_copy`]).
    pub fn copy(&mut self, src: usize, dst: usize, len: usize) -> Result<()> {
        self.check_slot(src)?;
        self.check_slot(dst)?;
        let held = self.lens[src];
        if src == dst || len > held || (self.has_state() && len != held) || !self.can_copy() {
            return Err(Error::BadCopy { src, dst, len, held });
        }
        self.forget_rollback(dst);
        let (from, to) = (self.index_view(src)?, self.index_view(dst)?);
        let block = self.plan.copy_block();
        let name = Function::CopyKv { positions: block }.name();
        for start in (0..len).step_by(block) {
            let at = self.index_view(start)?;
            let out = self.session.call(&name, &[&from, &to, &at, &self.k, &self.v])?;
            let got = out.len();
            let Ok([k, v]) = <[BufferView; 2]>::try_from(out) else {
                return Err(Error::Abi { function: name, got, expected: 2 });
            };
            self.k = k;
            self.v = v;
        }
        if self.has_state() {
            self.copy_state(&from, &to)?;
        }
        self.lens[dst] = len;
        Ok(())
    }

    /// A slot or a position as a call's `[1]` i32 argument.
    fn index_view(&self, slot: usize) -> Result<BufferView> {
        Ok(self.device.upload(&[1], &[slot as i32])?)
    }

    /// The recurrent state of the slot `from` names copied into that of the slot `to` names
    /// (`copy_state`; both from [`Engine::index_view`]).
    fn copy_state(&mut self, from: &BufferView, to: &BufferView) -> Result<()> {
        let name = Function::CopyState.name();
        let mut args = vec![from, to];
        args.extend(&self.states);
        let out = self.session.call(&name, &args)?;
        if out.len() != self.states.len() {
            return Err(Error::Abi { function: name, got: out.len(), expected: self.states.len() });
        }
        self.states = out;
        Ok(())
    }

    /// Whether [`Engine::copy`] is there: the plan compiled the copies between slots (several
    /// slots, not on CUDA: `CompileTarget::copies_between_slots`).
    pub fn can_copy(&self) -> bool {
        self.plan.copies
    }

    /// Whether the model has recurrent layers, whose state is that after a slot's whole
    /// context (so a context can be kept whole, not cut).
    pub fn has_state(&self) -> bool {
        !self.states.is_empty()
    }

    fn check_slot(&self, slot: usize) -> Result<()> {
        if slot >= self.max_batch() {
            return Err(Error::NoSuchSlot { slot, slots: self.max_batch() });
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

    /// Runs step `function` on `rows` with what its kind of call reads beside them
    /// (`reads`), then writes the rows' keys and values into the cache at each row's (slot,
    /// position). Returns every output row's next id and the call's logits.
    fn call(&mut self, function: Function, rows: &Rows, reads: Reads) -> Result<(Vec<i32>, Rc<Logits>)> {
        let upload = |data: &[i32]| self.device.upload(&[data.len()], data);
        let (tokens, positions, row_slots) = (upload(&rows.tokens)?, upload(&rows.positions)?, upload(&rows.slots)?);
        // A decode or mixed call reads its rows' slots: the same view, not a second upload
        // (on a GPU each upload is an allocation and a synchronous copy).
        let (slot, last) = match &reads {
            Reads::Decode => (None, None),
            Reads::Prefill { slot, last } => (Some(upload(&[*slot as i32])?), Some(upload(&[*last as i32])?)),
            Reads::Verify { slot, last } => {
                (Some(upload(&[*slot as i32])?), last.map(|last| upload(&[last as i32])).transpose()?)
            }
            Reads::Mixed { outs } => {
                let outs: Vec<i32> = outs.iter().map(|&row| row as i32).collect();
                (None, Some(upload(&outs)?))
            }
        };
        let seq_slots = slot.as_ref().unwrap_or(&row_slots);
        let mut args = vec![&tokens, &positions, seq_slots];
        args.extend(last.as_ref());
        args.extend([&self.k, &self.v]);
        args.extend(&self.states);
        let name = function.name();
        let mut out = self.session.call(&name, &args)?;
        let got = out.len();
        let expected = 4 + self.states.len();
        if got != expected {
            return Err(Error::Abi { function: name, got, expected });
        }
        let new_states = out.split_off(4);
        let Ok([next, logits, new_k, new_v]) = <[BufferView; 4]>::try_from(out) else {
            return Err(Error::Abi { function: name, got, expected });
        };
        // The buffers the step updated in place come back whole; the others' new rows go
        // into each sequence's slot (a decode call's padding rows repeat a real row: the
        // same bytes to the same place).
        let mut scattered = Vec::new();
        for (i, view) in new_states.into_iter().enumerate() {
            if self.plan.state_in_place[i] {
                self.states[i] = view;
            } else {
                scattered.push((i, view));
            }
        }
        if !scattered.is_empty() {
            let sequences = if let Reads::Prefill { .. } | Reads::Verify { .. } = reads { 1 } else { rows.len() };
            let write = Function::WriteState { rows: sequences }.name();
            let mut args = vec![seq_slots];
            args.extend(scattered.iter().map(|(_, view)| view));
            args.extend(scattered.iter().map(|(i, _)| &self.states[*i]));
            let out = self.session.call(&write, &args)?;
            if out.len() != scattered.len() {
                return Err(Error::Abi { function: write, got: out.len(), expected: scattered.len() });
            }
            for ((i, _), view) in scattered.iter().zip(out) {
                self.states[*i] = view;
            }
        }
        let write = Function::WriteKv { rows: rows.len() }.name();
        let out = self.session.call(&write, &[&positions, &row_slots, &new_k, &new_v, &self.k, &self.v])?;
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
            let rows = Rows::sequence(&rest[..take], start, slot, tokens);
            let (next, logits) = self.call(function, &rows, Reads::Prefill { slot, last: take - 1 })?;
            self.lens[slot] += take;
            last = Some(Step { next: next[0] as u32, logits, row: 0 });
            rest = &rest[take..];
        }
        last.ok_or(Error::EmptyPrompt)
    }

    /// One decode step for every `(slot, token)` row at once; slots must be distinct. Returns
    /// one step per row, in order.
    pub fn decode(&mut self, rows: &[(usize, u32)]) -> Result<Vec<Step>> {
        if rows.is_empty() {
            return Err(Error::NoRows);
        }
        self.check_entries(rows.iter().map(|(slot, token)| (*slot, std::slice::from_ref(token))))?;
        let top = rows.iter().map(|(slot, _)| self.lens[*slot]).max().unwrap_or(0);
        let function =
            self.plan.decode(rows.len(), top).ok_or(Error::TooManyRows { rows: rows.len(), max: self.max_batch() })?;
        // Padding rows repeat the first row: rows are computed independently, so they write
        // the same bytes to the same place.
        let b = function.rows();
        let mut call = Rows::with_capacity(b);
        for &(slot, token) in rows {
            call.push(token, self.lens[slot], slot);
        }
        call.pad(b, 0);
        let (next, logits) = self.call(function, &call, Reads::Decode)?;
        for &(slot, _) in rows {
            self.lens[slot] += 1;
        }
        Ok(Step::rows(&next, &logits, rows.len()))
    }

    /// Most tokens one [`Engine::verify`] call takes for `slot` at its position now (0: the
    /// plan has no verify call, or its rows would pass the end of the slot).
    pub fn verify_rows(&self, slot: usize) -> usize {
        match self.plan.verify(self.position(slot)) {
            Some(function) => function.rows(),
            None => 0,
        }
    }

    /// Feeds `tokens` to `slot` in one call (a decode row and the draft tokens after it,
    /// at most [`Engine::verify_rows`]) and returns the step after each of them, in order:
    /// the results of feeding them one at a time. The slot then holds them all; the caller
    /// keeps those it accepts with [`Engine::truncate`] (for a model with recurrent layers,
    /// whose state before the call is first copied to the scratch state, right after the
    /// call).
    pub fn verify(&mut self, slot: usize, tokens: &[u32]) -> Result<Vec<Step>> {
        self.check_entries([(slot, tokens)])?;
        let start = self.lens[slot];
        let function = self.plan.verify(start).ok_or_else(|| self.context_full(slot, tokens.len()))?;
        let width = function.rows();
        if tokens.len() > width {
            return Err(Error::TooManyRows { rows: tokens.len(), max: width });
        }
        // The plan keeps a scratch state exactly for a model with recurrent layers and drafts.
        let last = match self.plan.scratch {
            Some(scratch) => {
                self.copy_state(&self.index_view(slot)?, &self.index_view(scratch)?)?;
                self.rollback = Some(Rollback { slot, start, tokens: tokens.to_vec() });
                Some(tokens.len() - 1)
            }
            None => None,
        };
        let rows = Rows::sequence(tokens, start, slot, width);
        let (next, logits) = self.call(function, &rows, Reads::Verify { slot, last })?;
        self.lens[slot] += tokens.len();
        Ok(Step::rows(&next, &logits, tokens.len()))
    }

    /// Most rows one [`Engine::verify_many`] call takes in all (0: the plan verifies one
    /// sequence at a time: no drafts, no mixed calls, or recurrent layers).
    pub fn verify_many_rows(&self) -> usize {
        self.plan.verify_mixed.unwrap_or(0)
    }

    /// [`Engine::verify`] for several sequences in one call: each `(slot, tokens)` entry
    /// (slots distinct; a decode row and the draft tokens after it, at most
    /// [`Engine::verify_many_rows`] in all) is appended to its slot, and the result is, per
    /// entry in order, the step after each of its tokens: what [`Engine::verify`] gives the entry alone (each row's attention reads
    /// its own sequence only). The caller keeps what it accepts with [`Engine::truncate`].
    pub fn verify_many(&mut self, batch: &[(usize, &[u32])]) -> Result<Vec<Vec<Step>>> {
        if batch.is_empty() {
            return Err(Error::NoRows);
        }
        self.check_entries(batch.iter().copied())?;
        let total: usize = batch.iter().map(|(_, tokens)| tokens.len()).sum();
        let function =
            self.plan.verify_mixed(total).ok_or(Error::TooManyRows { rows: total, max: self.verify_many_rows() })?;
        let mut steps = self.mixed_call(function, batch, true)?.into_iter();
        Ok(batch.iter().map(|(_, tokens)| steps.by_ref().take(tokens.len()).collect()).collect())
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
        self.mixed_call(function, batch, false)
    }

    /// One mixed call (`function`) of the checked entries `batch`, appended to their slots:
    /// the steps after every row (`every_row`: a verify call's) or after each entry's last.
    fn mixed_call(&mut self, function: Function, batch: &[(usize, &[u32])], every_row: bool) -> Result<Vec<Step>> {
        let (width, outs) = (function.rows(), function.outs());
        let mut rows = Rows::with_capacity(width);
        let mut read = Vec::with_capacity(outs);
        for &(slot, tokens) in batch {
            let start = self.lens[slot];
            for (i, &token) in tokens.iter().enumerate() {
                if every_row || i + 1 == tokens.len() {
                    read.push(rows.len());
                }
                rows.push(token, start + i, slot);
            }
        }
        let real = read.len();
        // Padding rows repeat the last row: the attention kernel gives a repeat of a row the
        // same bits, and it writes the same bytes to the same place. Unused outputs repeat
        // the first.
        rows.pad(width, rows.len() - 1);
        read.resize(outs, read[0]);
        let (next, logits) = self.call(function, &rows, Reads::Mixed { outs: read })?;
        for &(slot, tokens) in batch {
            self.lens[slot] += tokens.len();
        }
        Ok(Step::rows(&next, &logits, real))
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
