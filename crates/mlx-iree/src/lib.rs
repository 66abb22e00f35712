//! The `mlx-iree` engine and text side, as a library the CLI binary and tests use: the
//! engine (load, compile, bind weights, prefill/decode), the compile cache, the accuracy
//! gate, and the tokenizer, chat template, streaming detokenizer and sampler.

pub mod chat;
pub mod sampler;
pub mod stream;
pub mod tokenizer;

pub mod cache;
pub mod device;
pub mod engine;
pub mod gate;
