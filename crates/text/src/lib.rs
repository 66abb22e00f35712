//! The text side of generation, independent of any device: the model folder's tokenizer,
//! its chat template, a UTF-8-safe streaming detokenizer (split by channel where the model
//! marks its reasoning apart, `channels`) and a reproducible sampler.

pub mod channels;
pub mod chat;
pub mod constraint;
pub mod sampler;
pub mod stream;
pub mod tokenizer;
pub mod tools;
