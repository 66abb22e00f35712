//! [`EngineConfig`]: an engine's settings, passed as a value (nothing below the binary
//! reads the environment for them).

use crate::{KernelSetting, KvElem, Precision};

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
    /// How the CPU kernel's packed products quantize their input rows: i16 (exact to 15 bits)
    /// or i8 (llama.cpp's int8 activations, faster prompts); i8 only where packed matrices go
    /// through the CPU kernel (`Error::Activations` elsewhere).
    pub activations: models::Activations,
    /// Which hand-written kernels the graphs link (else the graph form everywhere); forcing
    /// an instruction set the host lacks fails the load before compiling.
    pub kernels: KernelSetting,
    /// Where compiled modules are cached (see [`crate::cache::default_dir`]).
    pub cache_dir: std::path::PathBuf,
    /// Also write each compiled module's input MLIR next to its cache entry, with the flags
    /// on its first line, for reproducing compiler problems with `iree-compile`.
    pub dump_mlir: bool,
    /// Store the weights of a data-tiled CPU module in their final (repacked) form in a file
    /// beside the module in `cache_dir`, written on the first load and mapped by every later
    /// one (`cache::stored_parameters`; about the weights' size on disk per model, shape
    /// and precision). Off: every load binds the checkpoint's weights and IREE repacks them
    /// in memory, holding both copies at once (peak RSS 2-3x the weights, docs/PERFORMANCE.md).
    pub store_parameters: bool,
    /// Most bytes the modules in `cache_dir` may take: after a load, the least recently used
    /// other entries go until the rest fits (`cache::evict`; `None`: no limit).
    pub cache_max_bytes: Option<u64>,
    /// The scheduler's prefix cache: a finished sequence's tokens stay in its slot, and a
    /// request whose prompt starts with them is given that slot and prefills only the rest
    /// (`scheduler`). Off: every request prefills its whole prompt.
    pub prefix_cache: bool,
    /// Speculative decoding: where draft tokens come from, and how many one call checks.
    pub draft: Draft,
    /// Which numbers of rows get a decode call of their own (`Plan::batches`).
    pub decode_batches: DecodeBatches,
}

/// Which decode calls an engine of several slots compiles: a step of `n` sequences runs the
/// smallest call of at least `n` rows, the rows past them padding.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum DecodeBatches {
    /// Powers of two below `max_batch`, and `max_batch`: a step pads to at most twice its
    /// rows. What serving wants, where any number of sequences may be decoding.
    #[default]
    PowersOfTwo,
    /// One row and `max_batch` rows: a step of 2 to `max_batch - 1` sequences pads to
    /// `max_batch`. Fewer functions to compile (at 8 slots, no decode or cache write of 2 and
    /// 4 rows: about a third of a small model's compile, docs/PERFORMANCE.md), for engines
    /// that decode one sequence or all of them, as the tests' eight-slot engines do.
    OneOrAll,
}

/// Where a sequence's draft tokens come from (speculative decoding: the model checks a
/// decode row and the drafts after it in one call, `Engine::verify`, and keeps the drafts
/// its own choices agree with).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Draft {
    /// No drafts: one token per decode call.
    Off,
    /// Prompt lookup: up to `tokens` tokens that followed the latest earlier occurrence of
    /// the sequence's last few tokens (`scheduler::ngram_draft`).
    Ngram { tokens: usize },
    /// A second, smaller model with the same vocabulary, loaded beside the first (one slot,
    /// the same context, at `precision`): its `tokens` greedy next tokens.
    Model { dir: std::path::PathBuf, precision: Precision, tokens: usize },
}

impl Draft {
    /// Refuses a draft model `model` cannot take: one with recurrent layers (its state cannot
    /// go back to the last accepted token) or another vocabulary size. Reads only the
    /// draft's config and tensor headers.
    pub fn check(&self, model: &models::ModelConfig) -> crate::Result<()> {
        if let Draft::Model { dir, .. } = self {
            let draft = models::ModelConfig::for_checkpoint(&mut weights::Checkpoint::open(dir)?)?;
            if draft.state_len() > 0 {
                return Err(crate::Error::DraftModelWithState { model_type: draft.model_type });
            }
            if draft.vocab != model.vocab {
                return Err(crate::Error::DraftVocab { draft: draft.vocab, model: model.vocab });
            }
        }
        Ok(())
    }

    /// Most draft tokens one call checks (0: off).
    pub fn tokens(&self) -> usize {
        match self {
            Draft::Off => 0,
            Draft::Ngram { tokens } | Draft::Model { tokens, .. } => *tokens,
        }
    }
}

/// Default KV budget: 4 GiB, a sixth of this project's 24 GiB machines, leaving room for the
/// weights (and their repacked decode copy) of a 1B-class model several times over.
pub const DEFAULT_KV_BUDGET: usize = 4 << 30;

/// Context used when the config has no `max_position_embeddings`.
pub(crate) const FALLBACK_CONTEXT: usize = 2048;

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
            activations: models::Activations::I16,
            kernels: KernelSetting::Auto,
            cache_dir: cache_dir.into(),
            dump_mlir: false,
            store_parameters: true,
            cache_max_bytes: Some(crate::cache::DEFAULT_CACHE_MAX_BYTES),
            prefix_cache: true,
            draft: Draft::Off,
            decode_batches: DecodeBatches::PowersOfTwo,
        }
    }
}
