//! One config-driven decoder for Llama, Qwen2/3 and Gemma 1/2/3 checkpoints in MLX format,
//! emitted as StableHLO with `hlo-emit`.
//!
//! - [`ModelConfig`] normalises `config.json`; an unsupported `model_type` or option is an
//!   error here, before anything is compiled.
//! - [`param_specs`] lists the parameters (checkpoint names and shapes) the graph binds as
//!   globals in scope [`graph::SCOPE`]; [`load_f32`] reads each as f32 (dequantized at load).
//! - [`Backend`] says what the compile target can do (which hand-written kernels link,
//!   SPIR-V's narrower types, target-dependent graph settings); the engine derives it once.
//! - [`Layout`] gives every matrix one [`Form`] for a precision on a backend (dense in the
//!   precision's type, MLX-packed in the graph form, in a kernel's layout); the graph's
//!   globals and the loader both come from its [`Layout::device_params`].
//! - [`graph::emit_functions`] writes batched `decode` and chunked `prefill` functions over a
//!   KV cache of per-sequence slots ([`CacheShape`]), updated in place by every call.

mod backend;
mod config;
mod error;
pub mod graph;
mod layout;
pub mod names;
mod params;
mod precision;
mod rope;

pub use backend::{Activations, Backend, EmitOptions, ExpertProducts, KernelLink, PackedProducts, SlotRead};
pub use config::{
    Activation, Family, LayerConfig, LayerMixer, LinearAttention, ModelConfig, Moe, NormPlacement, PerLayerInput,
    QueryPositionScale, RopeScaling, Routing, SUPPORTED, SharedExpert, ShortConv,
};
pub use error::{Error, Result};
pub use graph::{CacheShape, Function, KvElem, emit_functions};
pub use layout::{DeviceParam, Form, Layout, Packing, Role, cuda_bits};
pub use names::EMBEDDING;
pub use params::{Kind, ParamSpec, Part, check_checkpoint, load_f32, load_param, param_specs};
pub use precision::Precision;
pub use rope::RopeTable;
