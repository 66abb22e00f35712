//! Hugging Face hub client: resolves `owner/name[@revision]` to a snapshot folder in the
//! standard Hugging Face cache, downloading only the files an MLX model needs.
//!
//! The cache is huggingface_hub's own layout, so a model mlx-lm downloaded is used as it
//! is and the other way round:
//!
//! ```text
//! <cache>/models--owner--name/refs/<revision>            the commit the revision resolved to
//! <cache>/models--owner--name/blobs/<etag>               file contents (etag: sha256 for LFS files)
//! <cache>/models--owner--name/blobs/<etag>.incomplete    a download in progress (resumed by Range)
//! <cache>/models--owner--name/snapshots/<commit>/<file>  relative symlink to ../../blobs/<etag>
//! <cache>/.locks/models--owner--name/<etag>.lock         one downloader per blob
//! ```
//!
//! Invariants: a file appears under `snapshots/` only once its blob is complete, of the size
//! the hub announced and, for LFS files, of the sha256 the hub gave (its `X-Linked-Etag`); a
//! half-written download lives only as `<etag>.incomplete`, which is never read as a model.
//! The crate reads no environment variable and prints nothing: settings arrive in
//! [`HubConfig`], progress goes to the caller's [`Progress`], logs go through `tracing`.
//!
//! ```no_run
//! # fn main() -> Result<(), hub::Error> {
//! let hub = hub::Hub::new(hub::HubConfig::new("/home/me/.cache/huggingface/hub"));
//! let model = hub.model(&hub::RepoRef::parse("mlx-community/SmolLM2-135M-Instruct-4bit")?)?;
//! let config = model.fetch("config.json", &mut hub::NoProgress)?; // check it before the weights
//! let folder = model.fetch_model(&mut hub::NoProgress)?;
//! # let _ = (config, folder); Ok(()) }
//! ```

mod client;
mod disk;
mod error;
mod repo;

pub use client::{Hub, HubConfig, Model, NoProgress, Progress};
pub use error::Error;
pub use repo::{DEFAULT_REVISION, RepoRef, default_cache_dir, huggingface_home, is_commit};

/// The files of a model besides its weights, fetched when the repo has them.
pub const OPTIONAL_FILES: [&str; 6] = [
    "tokenizer.json",
    "tokenizer_config.json",
    "generation_config.json",
    "special_tokens_map.json",
    "chat_template.jinja",
    "chat_template.json",
];

/// The model's configuration, fetched (and checkable) before anything else.
pub const CONFIG_FILE: &str = "config.json";
/// A single-file checkpoint.
pub const WEIGHTS_FILE: &str = "model.safetensors";
/// A sharded checkpoint's index: its `weight_map` names the shard files.
pub const INDEX_FILE: &str = "model.safetensors.index.json";
