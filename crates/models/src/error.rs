//! The models crate's error type: config problems name the file and key, graph problems the op.

use std::path::PathBuf;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("{path}: unsupported model_type `{model_type}` (supported: {supported})")]
    UnsupportedModelType { path: PathBuf, model_type: String, supported: &'static str },
    #[error("{path}: {key}: {reason}")]
    Config { path: PathBuf, key: String, reason: String },
    #[error("{path}: unsupported option {key} = {value} for model_type `{model_type}`")]
    Unsupported { path: PathBuf, model_type: String, key: String, value: String },
    /// A mixture of experts stored one expert at a time (Hugging Face's layout), where the
    /// model reads them stacked as mlx-lm's converter writes them.
    #[error(
        "{}: experts stored one by one (`{found}`); mlx-iree reads them stacked as mlx_lm.convert writes them (`{wanted}`): convert the checkpoint with mlx_lm.convert",
        dir.display()
    )]
    UnstackedExperts { dir: PathBuf, found: String, wanted: String },
    #[error(transparent)]
    Weights(#[from] weights::Error),
    #[error("building the graph: {0}")]
    Graph(#[from] hlo_emit::Error),
    #[error("{0}")]
    Invalid(String),
}

pub type Result<T, E = Error> = std::result::Result<T, E>;
