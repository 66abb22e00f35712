//! Loads an MLX model folder onto an IREE device and runs its prefill/decode graphs.
//!
//! Weights are bound once as parameters (scope `model`) and stay resident; the KV cache
//! lives in device buffers that each call consumes and returns, so nothing but token ids
//! (and logits when asked) crosses to the host per step.

use crate::cache::{self, CompileReport};
use iree_compiler::CompileOptions;
use iree_hal::{BufferView, Device, Instance, Parameters, Session};
pub use models::Precision;
use models::{GraphShape, Layout, ModelConfig, graph::SCOPE};
use std::path::Path;
use std::time::Instant;
use weights::Checkpoint;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error(transparent)]
    Weights(#[from] weights::Error),
    #[error(transparent)]
    Model(#[from] models::Error),
    #[error(transparent)]
    Compile(#[from] iree_compiler::Error),
    #[error(transparent)]
    Runtime(#[from] iree_hal::Error),
    #[error("{0}")]
    Invalid(String),
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Several `local-task` devices making calls at the same time in one process have failed
/// intermittently inside IREE ("ref is null" from a call; never with `local-sync`, never
/// one engine at a time). Until that is understood, engines in one process take turns:
/// loading and each call hold this lock. One engine per process (the CLI) never waits.
static IREE_TURN: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn iree_turn() -> std::sync::MutexGuard<'static, ()> {
    IREE_TURN.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// Picks static graph sizes for a request: a power-of-two prompt bucket (long prompts are
/// fed in chunks of it) and a power-of-two cache capacity that holds prompt + new tokens.
pub fn plan(prompt_len: usize, max_new: usize) -> GraphShape {
    let prefill = prompt_len.max(1).next_power_of_two().clamp(16, 128);
    let rounded = prompt_len.div_ceil(prefill) * prefill;
    let capacity = rounded.max(prompt_len + max_new).next_power_of_two().max(64);
    GraphShape { capacity, prefill }
}

/// One step's result: the greedy next token and the logits, still on the device.
#[derive(Debug)]
pub struct Step {
    pub next: u32,
    logits: BufferView,
}

impl Step {
    /// Downloads the `[vocab]` logits of this step.
    pub fn logits(&self) -> Result<Vec<f32>> {
        Ok(self.logits.to_vec()?)
    }
}

#[derive(Debug)]
pub struct Engine {
    cfg: ModelConfig,
    shape: GraphShape,
    device: Device,
    session: Session,
    k: BufferView,
    v: BufferView,
    pos: usize,
    pub compile: CompileReport,
    pub load_seconds: f64,
    /// Bytes of all parameters bound on the device.
    pub weight_bytes: usize,
}

/// One compiled module of a model: which functions it holds and how it is compiled.
#[derive(Debug, Clone)]
pub struct GraphModule {
    /// For progress lines, e.g. "llama f16 decode graph (capacity 128)".
    pub what: String,
    pub functions: Vec<models::Function>,
    pub mlir: String,
    pub options: CompileOptions,
}

/// The modules an engine compiles for `target`. On CPU, `decode` gets a module of its own
/// compiled with data tiling and microkernels: its weights are constant globals, so IREE
/// repacks them once at load, which made decode-only f16 1.76x faster (docs/PERFORMANCE.md).
/// `prefill` stays on default flags, because data tiling crashes IREE 3.13 on it; the two
/// modules share the parameter scope (the repacked copy is the price).
pub fn graph_modules(
    cfg: &ModelConfig,
    layout: &Layout,
    shape: GraphShape,
    target: &iree_compiler::Target,
) -> Result<Vec<GraphModule>> {
    use models::Function::{Decode, Prefill};
    let tiled =
        CompileOptions::default().with_flag("--iree-opt-data-tiling").with_flag("--iree-llvmcpu-enable-ukernels=all");
    // The graph-level packed form's i16 weights blow IREE 3.13's vector-size limit when
    // data-tiled ("One or more operations with large vector sizes"): default flags then.
    let decode_options = if layout.has_graph_packing() { CompileOptions::default() } else { tiled };
    let modules: Vec<(Option<&str>, Vec<models::Function>, CompileOptions)> = match target {
        iree_compiler::Target::LlvmCpu { .. } => vec![
            (Some("prefill_graph"), vec![Prefill], CompileOptions::default()),
            (Some("decode_graph"), vec![Decode], decode_options),
        ],
        _ => vec![(None, vec![Prefill, Decode], CompileOptions::default())],
    };
    modules
        .into_iter()
        .map(|(name, functions, options)| {
            let mlir = models::emit_functions(cfg, layout, shape, &functions, name)?;
            let precision = layout.precision();
            let names: Vec<&str> = functions.iter().map(|f| f.name()).collect();
            let what = format!(
                "{} {precision} {} graph (capacity {}, prompt bucket {})",
                cfg.model_type,
                names.join("+"),
                shape.capacity,
                shape.prefill
            );
            Ok(GraphModule { what, functions, mlir, options })
        })
        .collect()
}

/// The device layout of `precision` for this checkpoint and target. Packed matrices use the
/// hand-written CPU kernels (`kernels::cpu`, installed into `cache_dir`) on an `llvm-cpu`
/// target whose host has AVX-512, unless `MLX_IREE_PACKED_KERNELS=0`; elsewhere they use the
/// graph-level form.
pub fn layout_for(
    cfg: &ModelConfig,
    precision: Precision,
    ckpt: &Checkpoint,
    target: &iree_compiler::Target,
    cache_dir: &Path,
) -> Result<Layout> {
    let layout = Layout::new(cfg, precision, ckpt)?;
    let wanted = std::env::var("MLX_IREE_PACKED_KERNELS").map_or(true, |v| v != "0");
    if precision != Precision::Packed || !wanted || !crate::device::cpu_kernels_run(target) {
        return Ok(layout);
    }
    let dir = cache_dir.join("kernels");
    match kernels::cpu::install(&dir) {
        Ok(Some(object)) => Ok(layout.with_cpu_kernels(cfg, &object)),
        Ok(None) => Ok(layout),
        Err(e) => Err(Error::Invalid(format!("writing the CPU kernel object into {}: {e}", dir.display()))),
    }
}

impl Engine {
    /// Opens the checkpoint, refuses what it cannot run (before compiling), compiles the
    /// graphs for `shape` (cached), and binds the weights on `device_uri`.
    pub fn load(dir: &Path, device_uri: &str, precision: Precision, shape: GraphShape) -> Result<Engine> {
        Self::load_cached(dir, device_uri, precision, shape, &cache::dir())
    }

    /// [`Engine::load`] with an explicit compile-cache folder.
    pub fn load_cached(
        dir: &Path,
        device_uri: &str,
        precision: Precision,
        shape: GraphShape,
        cache_dir: &Path,
    ) -> Result<Engine> {
        let target = crate::device::target_for(device_uri).map_err(Error::Invalid)?;
        let ckpt = Checkpoint::open(dir)?;
        let cfg = ModelConfig::for_checkpoint(&ckpt)?;
        let layout = layout_for(&cfg, precision, &ckpt, &target, cache_dir)?;

        let mut vmfbs = Vec::new();
        let mut compile = CompileReport::CacheHit;
        for module in graph_modules(&cfg, &layout, shape, &target)? {
            let (vmfb, report) = cache::compile_in(cache_dir, &module.what, &module.mlir, &target, &module.options)?;
            compile = compile.and(report);
            vmfbs.push(vmfb);
        }

        let started = Instant::now();
        let _turn = iree_turn();
        let instance = Instance::new()?;
        let device = instance.device(device_uri)?;
        let mut session = Session::new(&instance, &device)?;
        let mut params = Parameters::new(SCOPE)?;
        let mut weight_bytes = 0;
        let mut bound = std::collections::HashSet::new();
        for param in layout.device_params(&cfg) {
            // Globals that view one parameter share its bytes: bind each key once.
            if bound.insert(param.key.clone()) {
                let bytes = layout.load(&ckpt, &param)?;
                weight_bytes += bytes.len();
                params.add_tensor(&param.key, &bytes)?;
            }
        }
        session.append_parameters(&[&params])?;
        for vmfb in &vmfbs {
            session.load_vmfb(vmfb)?;
        }
        let dims = models::kv_cache_shape(&cfg, shape.capacity);
        let zeros = vec![0f32; dims.iter().product()];
        let k = device.upload(&dims, &zeros)?;
        let v = device.upload(&dims, &zeros)?;
        let load_seconds = started.elapsed().as_secs_f64();
        Ok(Engine { cfg, shape, device, session, k, v, pos: 0, compile, load_seconds, weight_bytes })
    }

    pub fn config(&self) -> &ModelConfig {
        &self.cfg
    }

    pub fn shape(&self) -> GraphShape {
        self.shape
    }

    /// Positions used so far.
    pub fn position(&self) -> usize {
        self.pos
    }

    /// Forgets the context; the next call starts at position 0. Stale cache entries are
    /// never read: a position is written before any query can see it.
    pub fn reset(&mut self) {
        self.pos = 0;
    }

    fn check_tokens(&self, tokens: &[u32]) -> Result<()> {
        if let Some(bad) = tokens.iter().find(|t| **t as usize >= self.cfg.vocab) {
            return Err(Error::Invalid(format!(
                "token id {bad} is out of range for vocabulary size {}",
                self.cfg.vocab
            )));
        }
        Ok(())
    }

    fn run(&mut self, func: &str, padded: &[i32], real: usize) -> Result<Step> {
        let t = padded.len();
        if self.pos + t > self.shape.capacity {
            return Err(Error::Invalid(format!(
                "context full: position {} + {t} exceeds the cache capacity {}",
                self.pos, self.shape.capacity
            )));
        }
        let _turn = iree_turn();
        let tokens = self.device.upload(&[t], padded)?;
        let start = self.device.upload::<i32>(&[], &[self.pos as i32])?;
        let last = self.device.upload::<i32>(&[], &[real as i32 - 1])?;
        let mut out = self.session.call(func, &[&tokens, &start, &last, &self.k, &self.v])?.into_iter();
        let (Some(next), Some(logits), Some(k), Some(v)) = (out.next(), out.next(), out.next(), out.next()) else {
            return Err(Error::Invalid(format!("`{func}` returned fewer than 4 results")));
        };
        self.k = k;
        self.v = v;
        self.pos += real;
        let next: Vec<i32> = next.to_vec()?;
        Ok(Step { next: next[0] as u32, logits })
    }

    /// Feeds the prompt (in chunks of the prompt bucket) and returns the step after its
    /// last token.
    pub fn prefill(&mut self, prompt: &[u32]) -> Result<Step> {
        if prompt.is_empty() {
            return Err(Error::Invalid("empty prompt".into()));
        }
        self.check_tokens(prompt)?;
        let bucket = self.shape.prefill;
        let mut last = None;
        for chunk in prompt.chunks(bucket) {
            let mut padded: Vec<i32> = chunk.iter().map(|t| *t as i32).collect();
            padded.resize(bucket, 0);
            last = Some(self.run("prefill", &padded, chunk.len())?);
        }
        last.ok_or_else(|| Error::Invalid("empty prompt".into()))
    }

    /// Feeds one token.
    pub fn decode(&mut self, token: u32) -> Result<Step> {
        self.check_tokens(&[token])?;
        self.run("decode", &[token as i32], 1)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plan_buckets() {
        let p = |prompt, new| {
            let s = plan(prompt, new);
            (s.prefill, s.capacity)
        };
        // Short prompts share the smallest bucket; capacity is at least 64.
        assert_eq!(p(1, 1), (16, 64));
        assert_eq!(p(5, 40), (16, 64));
        // SmolLM2's chat prompt: 37 tokens -> bucket 64; 64 + 40 new > 64 -> 128.
        assert_eq!(p(37, 40), (64, 128));
        // Long prompts are fed in 128-token chunks; the cache holds every chunk's padding.
        assert_eq!(p(300, 10), (128, 512));
        for (prompt, new) in [(1, 1), (17, 100), (129, 1), (1000, 1000)] {
            let s = plan(prompt, new);
            assert!(s.prefill <= s.capacity);
            assert!(prompt.div_ceil(s.prefill) * s.prefill <= s.capacity, "chunks fit");
            assert!(prompt + new <= s.capacity, "prompt and new tokens fit");
        }
    }
}
