//! The engine: loads an MLX model folder onto an IREE device and runs many sequences
//! through it (prefill, batched decode, KV slots), with the compile cache ([`cache`]), the
//! one decision of what the target can do ([`Backend`]), device settings ([`device`]) and
//! the teacher-forced accuracy gate ([`gate`]).
//!
//! Every graph shape is fixed when the engine loads ([`Plan`]): the KV cache of `max_batch`
//! slots x `max_context` positions, batched decode functions, chunked prefill functions and
//! attention windows, all compiled (or read from the compile cache) then, so no request ever
//! compiles. Weights are bound once as parameters (scope `model`); the KV cache is updated
//! in place by every call; per step only token ids, positions and slots go to the device
//! and next ids (and logits when asked) come back.

mod backend;
pub mod cache;
mod config;
pub mod device;
mod dispatches;
mod error;
pub mod gate;
mod modules;
mod plan;
mod runner;
pub mod scheduler;

pub use crate::backend::{Backend, CompileTarget};
pub use crate::config::{DEFAULT_KV_BUDGET, DecodeBatches, Draft, EngineConfig};
pub use crate::device::KernelSetting;
pub use crate::error::{BoxError, Error, Result};
pub use crate::modules::GraphModule;
pub use crate::plan::Plan;
pub use crate::runner::{Engine, LoadReport, Step, check_tokens};
pub use kernels::cpu::Isa;
pub use models::KvElem;
pub use models::Precision;
