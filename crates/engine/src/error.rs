//! The engine's errors, one variant per cause a caller can act on (a server maps the
//! request-shaped ones to 400s and the rest to 500s).

use std::path::PathBuf;

/// A caller's sampling error, passed through unchanged.
pub type BoxError = Box<dyn std::error::Error + Send + Sync>;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error(transparent)]
    Weights(#[from] weights::Error),
    #[error(transparent)]
    Model(#[from] models::Error),
    /// IREE's compiler failed (its diagnostics in the message). Boxed so that no IREE type
    /// is part of the engine's API.
    #[error(transparent)]
    Compile(BoxError),
    /// IREE's runtime failed.
    #[error(transparent)]
    Runtime(BoxError),
    #[error("unsupported device `{0}` (expected local-task, local-sync, cuda, vulkan, or metal on macOS)")]
    UnsupportedDevice(String),
    /// `vulkan` was asked for where no Vulkan driver or device answers.
    #[error(
        "no Vulkan device: {message} (install a Vulkan driver, e.g. Debian's mesa-vulkan-drivers for the CPU's lavapipe, or pick another --device)"
    )]
    NoVulkanDevice { message: String },
    #[error("max batch must be at least 1")]
    ZeroBatch,
    #[error("max context must be at least 1")]
    ZeroContext,
    #[error("--draft-tokens must be at least 1")]
    ZeroDraftTokens,
    /// Speculative decoding on a model with recurrent layers where its state cannot be
    /// rolled back to the last accepted draft token: a target without copies between slots.
    #[error(
        "speculative decoding (--draft) of a model with recurrent layers ({model_type}) keeps its state from before each check in a spare slot, which {target} does not copy between slots; use a CPU device"
    )]
    DraftWithState { model_type: String, target: String },
    /// A draft model with recurrent layers, whose own state cannot go back to the last
    /// accepted token.
    #[error("the draft model has recurrent layers ({model_type}); use one without")]
    DraftModelWithState { model_type: String },
    /// `Engine::truncate` of a model with recurrent layers to a length it cannot go back to:
    /// only into the rows of its last verify call.
    #[error(
        "slot {slot} holds {held} positions of a model with recurrent layers; it can go back to {len} only into its last verify call's rows"
    )]
    BadTruncate { slot: usize, len: usize, held: usize },
    /// A KV cache type that cannot hold this model's rows (an 8-bit cache's blocks of 16).
    #[error("{0}")]
    KvCache(String),
    /// 8-bit activations asked for where no packed matrix goes through the CPU kernel.
    #[error(
        "--activations i8 quantizes the CPU kernel's packed products' input; this load has none ({reason}): use precision packed on a CPU with the kernels"
    )]
    Activations { reason: String },
    /// A draft model whose token ids are not the model's.
    #[error("the draft model's vocabulary ({draft} ids) is not the model's ({model} ids)")]
    DraftVocab { draft: usize, model: usize },
    #[error(
        "a KV budget of {budget} bytes holds no position for {slots} sequences ({per_position} bytes per position)"
    )]
    BudgetTooSmall { budget: usize, slots: usize, per_position: usize },
    /// The CPU kernels of an instruction set were forced where they cannot run.
    #[error(
        "the {isa} CPU kernels do not run here: {}",
        if kernels::cpu::object(*isa).is_none() { "this build has no kernel objects (no C compiler, or not x86-64)" } else { "this CPU lacks their instructions" }
    )]
    KernelIsa { isa: kernels::cpu::Isa },
    #[error("writing the CPU kernel object into {}: {source}", dir.display())]
    KernelObject { dir: PathBuf, source: std::io::Error },
    /// The parameters stored in final form beside a compiled module could not be written.
    #[error("storing the encoded parameters at {}: {source}", path.display())]
    ParameterStore { path: PathBuf, source: std::io::Error },
    /// More than one compiled module reads encoded parameters, which share one scope: a bug.
    #[error("{modules} compiled modules read encoded parameters; the engine binds one")]
    EncodedModules { modules: usize },
    /// A compiled function returned other results than the graph ABI says: a bug.
    #[error("`{function}` returned {got} results, expected {expected}")]
    Abi { function: String, got: usize, expected: usize },
    /// The decode step's dispatches could not be counted in its `flow`-phase IR.
    #[error("counting the dispatches of `{function}`: {reason}")]
    DispatchCount { function: String, reason: String },
    #[error("empty prompt")]
    EmptyPrompt,
    #[error("a step needs at least one row")]
    NoRows,
    #[error("token id {token} is out of range for vocabulary size {vocab}")]
    TokenOutOfRange { token: u32, vocab: usize },
    #[error("slot {slot} does not exist (the engine has {slots})")]
    NoSuchSlot { slot: usize, slots: usize },
    #[error("slot {slot} appears twice in one step")]
    DuplicateSlot { slot: usize },
    #[error("{rows} rows exceed the {max} rows one call takes")]
    TooManyRows { rows: usize, max: usize },
    #[error("context full: slot {slot} holds {held} positions, {more} more exceed the maximum context {max}")]
    ContextFull { slot: usize, held: usize, more: usize, max: usize },
    /// A request whose prompt (and its first new token) does not fit one sequence.
    #[error("the prompt ({prompt} tokens) and its first new token exceed the maximum context {max}")]
    PromptTooLong { prompt: usize, max: usize },
    #[error("max_tokens must be at least 1")]
    ZeroMaxTokens,
    /// A copy between slots the engine cannot make (the caller's bug: the scheduler asks
    /// only for what a slot holds).
    #[error("cannot copy {len} positions of slot {src} (holding {held}) to slot {dst}")]
    BadCopy { src: usize, dst: usize, len: usize, held: usize },
    /// The request's sampler failed (e.g. logits that are not finite).
    #[error("sampling: {0}")]
    Sampling(BoxError),
    /// A batched decode step failed on the device; every sequence in it gets this error
    /// (the cause, as text, since one error cannot be given to many callers).
    #[error("a decode step of {rows} rows failed: {cause}")]
    Step { rows: usize, cause: String },
    /// The scheduler holds as many requests (running or waiting for a slot) as its queue
    /// limit lets it (`Scheduler::set_queue_limit`): ask again later.
    #[error("the engine is busy: {max} requests running or queued, the most it takes")]
    QueueFull { max: usize },
    #[error("starting the engine thread: {0}")]
    Spawn(std::io::Error),
    /// The engine thread is gone (shut down, or it failed on an earlier error).
    #[error("the engine has stopped")]
    Stopped,
    #[error("the engine thread panicked: {0}")]
    Panicked(String),
}

impl Error {
    /// Whether the request itself was at fault (bad ids, too long, bad settings), as opposed
    /// to the engine or the device.
    pub fn is_request_error(&self) -> bool {
        matches!(
            self,
            Error::EmptyPrompt
                | Error::TokenOutOfRange { .. }
                | Error::PromptTooLong { .. }
                | Error::ZeroMaxTokens
                | Error::ContextFull { .. }
        )
    }
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

impl From<iree_compiler::Error> for Error {
    fn from(e: iree_compiler::Error) -> Error {
        Error::Compile(Box::new(e))
    }
}

impl From<iree_hal::Error> for Error {
    fn from(e: iree_hal::Error) -> Error {
        Error::Runtime(Box::new(e))
    }
}
