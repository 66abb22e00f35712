//! One config-driven decoder for Llama, Qwen2/3 and Gemma 1/2/3 checkpoints in MLX format,
//! emitted as StableHLO with `hlo-emit`.
//!
//! - [`ModelConfig`] normalises `config.json`; an unsupported `model_type` or option is an
//!   error here, before anything is compiled.
//! - [`param_specs`] lists the parameters (checkpoint names and shapes) the graph binds as
//!   globals in scope [`graph::SCOPE`]; [`load_f32`] reads each as f32 (dequantized at load).
//! - [`Layout`] says how each parameter sits on the device at a precision (dense in the
//!   precision's type, or MLX-packed for `packed`); the graph's globals and the loader both
//!   come from its [`Layout::device_params`].
//! - [`graph::emit_functions`] writes batched `decode` and chunked `prefill` functions over a
//!   KV cache of per-sequence slots ([`CacheShape`]), updated in place by every call.

mod config;
mod error;
pub mod graph;
mod layout;
mod params;
mod precision;
mod rope;

pub use config::{Activation, Family, LayerConfig, ModelConfig, Moe, RopeScaling, Routing, SUPPORTED};
pub use error::{Error, Result};
pub use graph::{CacheShape, Function, KvElem, emit_functions};
pub use layout::{DeviceParam, Layout, Packing, Role};
pub use params::{Kind, ParamSpec, Part, load_f32, load_param, param_specs};
pub use precision::Precision;
pub use rope::RopeTable;
