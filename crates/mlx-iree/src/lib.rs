//! The text side of `mlx-iree generate`, as a library the CLI binary and tests use:
//! tokenizer, chat template, streaming detokenizer and sampler.

pub mod chat;
pub mod sampler;
pub mod stream;
pub mod tokenizer;

pub mod cache;
pub mod device;
pub mod engine;
