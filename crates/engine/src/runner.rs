//! [`Engine`]: the model runner. Loads a checkpoint (plan, compile, bind the weights,
//! allocate the KV cache) and runs prefill, decode and mixed calls for its slots, on the one
//! thread that made it (IREE handles are not `Send`).

use crate::cache::{self, CompileReport};
use crate::modules::compile_modules;
use crate::{EngineConfig, Error, KvElem, Plan, Result, device, layout_for};
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
