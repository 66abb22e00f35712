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
    #[error(transparent)]
    Weights(#[from] weights::Error),
    #[error("building the graph: {0}")]
    Graph(#[from] hlo_emit::Error),
    #[error("{0}")]
    Invalid(String),
}

pub type Result<T, E = Error> = std::result::Result<T, E>;
