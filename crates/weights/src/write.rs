//! A small safetensors writer, so tests (here and in dependent crates) can build checkpoints
//! without Python.

use std::collections::{BTreeMap, HashSet};
use std::path::{Path, PathBuf};

use serde_json::{Map, Value, json};

use crate::{Dtype, Error, Result};

/// Builds a safetensors file in memory: tensors are laid out contiguously in the order they
/// are added, the header is padded with spaces to a multiple of 8 bytes.
#[derive(Debug, Default, Clone)]
pub struct Writer {
    tensors: Vec<(String, Dtype, Vec<usize>, Vec<u8>)>,
    names: HashSet<String>,
    metadata: BTreeMap<String, String>,
}

/// Stands in for a file path in errors about tensors that exist only in memory.
fn in_memory() -> PathBuf {
    PathBuf::from("<safetensors writer>")
}

impl Writer {
    /// An empty writer.
    pub fn new() -> Self {
        Writer::default()
    }

    /// Sets a `__metadata__` entry (MLX writes `format: mlx`).
    pub fn metadata(&mut self, key: &str, value: &str) -> &mut Self {
        self.metadata.insert(key.to_owned(), value.to_owned());
        self
    }

    /// Adds a tensor from raw little-endian bytes.
    ///
    /// # Errors
    /// [`Error::DuplicateTensor`] or [`Error::SizeMismatch`] (path `<safetensors writer>`).
    pub fn add(&mut self, name: &str, dtype: Dtype, shape: &[usize], bytes: Vec<u8>) -> Result<&mut Self> {
        let expected = shape.iter().try_fold(dtype.size_bytes() as u64, |acc, &d| acc.checked_mul(d as u64));
        if expected != Some(bytes.len() as u64) {
            return Err(Error::SizeMismatch {
                path: in_memory(),
                tensor: name.to_owned(),
                dtype,
                shape: shape.to_vec(),
                expected: expected.unwrap_or(u64::MAX),
                got: bytes.len() as u64,
            });
        }
        if !self.names.insert(name.to_owned()) || name == "__metadata__" {
            return Err(Error::DuplicateTensor { path: in_memory(), tensor: name.to_owned() });
        }
        self.tensors.push((name.to_owned(), dtype, shape.to_vec(), bytes));
        Ok(self)
    }

    /// Adds an F32 tensor.
    ///
    /// # Errors
    /// As [`Writer::add`].
    pub fn add_f32(&mut self, name: &str, shape: &[usize], values: &[f32]) -> Result<&mut Self> {
        let bytes = values.iter().flat_map(|v| v.to_le_bytes()).collect();
        self.add(name, Dtype::F32, shape, bytes)
    }

    /// Adds an F16 tensor, rounding `values` to nearest.
    ///
    /// # Errors
    /// As [`Writer::add`].
    pub fn add_f16(&mut self, name: &str, shape: &[usize], values: &[f32]) -> Result<&mut Self> {
        let bytes = values.iter().flat_map(|&v| half::f16::from_f32(v).to_le_bytes()).collect();
        self.add(name, Dtype::F16, shape, bytes)
    }

    /// Adds a BF16 tensor, rounding `values` to nearest.
    ///
    /// # Errors
    /// As [`Writer::add`].
    pub fn add_bf16(&mut self, name: &str, shape: &[usize], values: &[f32]) -> Result<&mut Self> {
        let bytes = values.iter().flat_map(|&v| half::bf16::from_f32(v).to_le_bytes()).collect();
        self.add(name, Dtype::BF16, shape, bytes)
    }

    /// Adds a U32 tensor (packed quantized words).
    ///
    /// # Errors
    /// As [`Writer::add`].
    pub fn add_u32(&mut self, name: &str, shape: &[usize], values: &[u32]) -> Result<&mut Self> {
        let bytes = values.iter().flat_map(|v| v.to_le_bytes()).collect();
        self.add(name, Dtype::U32, shape, bytes)
    }

    /// The header JSON (unpadded) and the data region.
    pub fn header_and_data(&self) -> (String, Vec<u8>) {
        let mut header = Map::new();
        if !self.metadata.is_empty() {
            header.insert("__metadata__".to_owned(), json!(self.metadata));
        }
        let mut data = Vec::new();
        for (name, dtype, shape, bytes) in &self.tensors {
            let begin = data.len();
            data.extend_from_slice(bytes);
            header.insert(
                name.clone(),
                json!({"dtype": dtype.name(), "shape": shape, "data_offsets": [begin, data.len()]}),
            );
        }
        (Value::Object(header).to_string(), data)
    }

    /// The complete file.
    pub fn to_bytes(&self) -> Vec<u8> {
        let (mut header, data) = self.header_and_data();
        while header.len() % 8 != 0 {
            header.push(' ');
        }
        let mut out = Vec::with_capacity(8 + header.len() + data.len());
        out.extend_from_slice(&(header.len() as u64).to_le_bytes());
        out.extend_from_slice(header.as_bytes());
        out.extend_from_slice(&data);
        out
    }

    /// Writes the file to `path`.
    ///
    /// # Errors
    /// [`Error::Io`] naming `path`.
    pub fn write(&self, path: impl AsRef<Path>) -> Result<()> {
        let path = path.as_ref();
        std::fs::write(path, self.to_bytes()).map_err(|source| Error::Io { path: path.to_path_buf(), source })
    }
}
