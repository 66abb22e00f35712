//! Memory-mapped MLX safetensors checkpoints: dtypes, quantization metadata, per-dtype views.
//!
//! This crate reads what `mlx_lm.convert` writes (Hugging Face layout) and nothing more: it
//! never touches a device and knows nothing about IREE or MLIR.
//!
//! # Layout conventions
//!
//! - A checkpoint folder holds `config.json` and either `model.safetensors` or
//!   `model.safetensors.index.json` whose `weight_map` maps each tensor name to its shard file.
//!   [`Checkpoint::open`] reads the config (kept as a [`serde_json::Value`] for the model
//!   definition, plus the typed [`QuantConfig`]) and maps every shard.
//! - A safetensors file is an 8-byte little-endian header length `n`, `n` bytes of JSON
//!   (`{"name": {"dtype", "shape", "data_offsets": [begin, end]}, "__metadata__": {..}}`), then
//!   the data region; offsets are relative to the data region. All values are little-endian.
//! - MLX affine quantization: a layer is quantized exactly when `<prefix>.scales` exists. Then
//!   `<prefix>.weight` is `U32 [out, in * bits / 32]`, each row a little-endian bit stream with
//!   element `j` at bits `j * bits .. (j + 1) * bits` (4-bit: 8 values per word, element `j` of
//!   a word in bits `4j..4j+4`); `.scales` and `.biases` are `[out, in / group_size]` and
//!   `w = q * scale + bias` with `q` **unsigned**. `bits` and `group_size` come from the
//!   layer's override in `config.json`'s `quantization` block (keyed by module path), else
//!   the global values. See [`Checkpoint::linear`], [`QuantizedLinear`], [`dequantize_f32`].
//!   Embedding tables use the same layout, one row per token ([`Checkpoint::embedding`]).
//!
//! # Invariants
//!
//! - **No copy for views.** [`TensorView::bytes`] borrows the memory mapping; only the typed
//!   readers (`to_f32_vec`, `as_f16_bits`, dequantization) allocate.
//! - **Validated at open.** Every header is checked completely before any view exists: header
//!   length within the file and at most [`MAX_HEADER_LEN`], valid JSON object, known dtypes,
//!   no duplicate names, `product(shape) * dtype size == end - begin`, offsets inside the data
//!   region, and the data region covered exactly once (no overlap, no gap, no trailing bytes).
//!   Views can therefore never read outside their tensor.
//! - **The loader never panics** on any file content: every problem is an [`Error`] naming the
//!   file, the tensor (where there is one) and what was wrong. A property test mutates valid
//!   files (byte flips, truncation, header lengths, JSON edits) to hold this.
//! - **Mapped files must not change.** The mapping is made with `unsafe` (the only unsafe code
//!   in the crate): if another process modifies or truncates a shard while a [`Checkpoint`] or
//!   [`SafetensorsFile`] is open, reads may see changed data or fault (SIGBUS). Do not rewrite
//!   checkpoint files in place while they are open.
//!
//! # Errors
//!
//! One enum, [`Error`]: I/O ([`Error::Io`]); header problems ([`Error::TooShort`],
//! [`Error::HeaderPastEnd`], [`Error::HeaderTooLarge`], [`Error::HeaderJson`],
//! [`Error::BadEntry`], [`Error::UnsupportedDtype`], [`Error::DuplicateTensor`],
//! [`Error::OutOfRange`], [`Error::SizeMismatch`], [`Error::Overlap`], [`Error::Gap`],
//! [`Error::TrailingData`]); folder problems ([`Error::Json`], [`Error::Config`],
//! [`Error::Index`], [`Error::MissingShard`], [`Error::ShardMissingTensor`],
//! [`Error::NoWeights`]); access problems ([`Error::MissingTensor`], [`Error::WrongDtype`],
//! [`Error::WrongShape`], [`Error::Layer`], [`Error::Quantization`], [`Error::RowOutOfRange`]).
//!
//! # Example
//!
//! ```no_run
//! use weights::{Checkpoint, Dtype, Linear};
//!
//! let ckpt = Checkpoint::open("models/Qwen3-0.6B-4bit")?;
//! let hidden = ckpt.config()["hidden_size"].as_u64().unwrap_or(0) as usize;
//! ckpt.tensor("model.norm.weight")?.expect(Dtype::BF16, &[hidden])?;
//! match ckpt.linear("model.layers.0.self_attn.q_proj")? {
//!     Linear::Dense(d) => println!("dense {:?}", d.weight().shape()),
//!     Linear::Quantized(q) => {
//!         let w: Vec<f32> = weights::dequantize_f32(&q); // [out, in]
//!         println!("{}-bit, {} values", q.bits(), w.len());
//!     }
//! }
//! # Ok::<(), weights::Error>(())
//! ```

mod checkpoint;
mod config;
mod dtype;
mod error;
mod file;
mod quant;
mod view;
pub mod write;

pub use checkpoint::{CONFIG_FILE, Checkpoint, INDEX_FILE, WEIGHTS_FILE};
pub use config::{LayerQuant, QuantConfig, QuantMode, QuantParams, SUPPORTED_BITS, SUPPORTED_GROUP_SIZES};
pub use dtype::Dtype;
pub use error::{Error, Result};
pub use file::{MAX_HEADER_LEN, SafetensorsFile};
pub use quant::{
    AffineCopy, AffineWidth, DenseLinear, Linear, QuantizedLinear, dequantize_f32, pack, quantize_dequantize,
};
pub use view::{MAX_RANK, TensorView};
