//! Test helpers: raw safetensors assembly (for deliberately broken files) and checkpoint folders.
#![allow(dead_code)] // Each test binary uses a different subset.

use std::path::{Path, PathBuf};

use tempfile::TempDir;

/// A safetensors file from a header JSON string and data bytes, with the true header length.
pub fn raw(header: &str, data: &[u8]) -> Vec<u8> {
    raw_with_len(header.len() as u64, header.as_bytes(), data)
}

/// A safetensors file with an arbitrary header length field.
pub fn raw_with_len(header_len: u64, header: &[u8], data: &[u8]) -> Vec<u8> {
    let mut out = header_len.to_le_bytes().to_vec();
    out.extend_from_slice(header);
    out.extend_from_slice(data);
    out
}

/// A temp folder holding `files` (name, contents).
pub fn dir_with(files: &[(&str, &[u8])]) -> TempDir {
    let dir = tempfile::tempdir().expect("tempdir");
    for (name, bytes) in files {
        std::fs::write(dir.path().join(name), bytes).expect("write test file");
    }
    dir
}

/// Writes `bytes` as `name` in a fresh temp folder; returns the folder and the file path.
pub fn file_with(name: &str, bytes: &[u8]) -> (TempDir, PathBuf) {
    let dir = dir_with(&[(name, bytes)]);
    let path = dir.path().join(name);
    (dir, path)
}

/// A config.json with no quantization block.
pub const PLAIN_CONFIG: &str = r#"{"model_type": "llama", "hidden_size": 4}"#;

/// A checkpoint folder with `config` and a single `model.safetensors`.
pub fn checkpoint(config: &str, weights: &[u8]) -> TempDir {
    dir_with(&[("config.json", config.as_bytes()), ("model.safetensors", weights)])
}

/// f32 values as little-endian bytes.
pub fn f32_bytes(values: &[f32]) -> Vec<u8> {
    values.iter().flat_map(|v| v.to_le_bytes()).collect()
}

/// Asserts `msg` names every one of `parts`.
pub fn assert_names(msg: &str, parts: &[&str]) {
    for p in parts {
        assert!(msg.contains(p), "error message {msg:?} does not mention {p:?}");
    }
}

/// The display form of a path, as error messages print it.
pub fn shown(p: &Path) -> String {
    p.display().to_string()
}
