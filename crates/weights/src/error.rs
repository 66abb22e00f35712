//! The one error type of the crate: every variant names the file, the tensor (where there is
//! one) and what was wrong.

use std::path::PathBuf;

use crate::Dtype;

/// Result alias for this crate.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Everything that can go wrong opening or reading a checkpoint.
///
/// Messages are meant for the user as they are: each names the file (or checkpoint folder),
/// the tensor or layer where there is one, and what was expected against what was found.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// A file could not be opened, read or mapped.
    #[error("cannot read {}: {source}", path.display())]
    Io {
        /// The file.
        path: PathBuf,
        /// The operating system's error.
        #[source]
        source: std::io::Error,
    },

    /// The file is shorter than the 8-byte header length that starts every safetensors file.
    #[error("{}: file is {len} bytes, too short for the 8-byte safetensors header length (truncated file?)", path.display())]
    TooShort {
        /// The file.
        path: PathBuf,
        /// Its length in bytes.
        len: u64,
    },

    /// The header length runs past the end of the file.
    #[error("{}: header length {header_len} runs past the end of the file ({file_len} bytes, so at most {} header bytes; truncated file?)", path.display(), file_len.saturating_sub(8))]
    HeaderPastEnd {
        /// The file.
        path: PathBuf,
        /// The header length read from the first 8 bytes.
        header_len: u64,
        /// The file length.
        file_len: u64,
    },

    /// The header length exceeds [`MAX_HEADER_LEN`](crate::MAX_HEADER_LEN).
    #[error("{}: header length {header_len} exceeds the limit of {limit} bytes (not a safetensors file?)", path.display())]
    HeaderTooLarge {
        /// The file.
        path: PathBuf,
        /// The header length read from the first 8 bytes.
        header_len: u64,
        /// The limit.
        limit: u64,
    },

    /// The safetensors header is not UTF-8 JSON, or not a JSON object.
    #[error("{}: safetensors header is not a valid JSON object: {source}", path.display())]
    HeaderJson {
        /// The file.
        path: PathBuf,
        /// What the JSON parser said.
        #[source]
        source: serde_json::Error,
    },

    /// A header entry lacks a field or has one of the wrong kind.
    #[error("{}: tensor `{tensor}`: malformed header entry: {reason}", path.display())]
    BadEntry {
        /// The file.
        path: PathBuf,
        /// The tensor (or `__metadata__`).
        tensor: String,
        /// What is wrong with it.
        reason: String,
    },

    /// A tensor's dtype is not one this crate reads (see [`Dtype`]).
    #[error("{}: tensor `{tensor}`: unsupported dtype `{dtype}` (supported: F32, F16, BF16, U32, I32, I64, U8, I8, BOOL)", path.display())]
    UnsupportedDtype {
        /// The file.
        path: PathBuf,
        /// The tensor.
        tensor: String,
        /// The dtype as the header spells it.
        dtype: String,
    },

    /// The same tensor name appears twice in one header.
    #[error("{}: tensor `{tensor}` appears more than once in the header", path.display())]
    DuplicateTensor {
        /// The file.
        path: PathBuf,
        /// The tensor.
        tensor: String,
    },

    /// A tensor's byte range lies (partly) outside the data region.
    #[error("{}: tensor `{tensor}`: data_offsets [{begin}, {end}) run past the end of the data region ({data_len} bytes; truncated file?)", path.display())]
    OutOfRange {
        /// The file.
        path: PathBuf,
        /// The tensor.
        tensor: String,
        /// Start offset, relative to the data region.
        begin: u64,
        /// End offset (exclusive), relative to the data region.
        end: u64,
        /// Length of the data region.
        data_len: u64,
    },

    /// A tensor's byte range does not match `product(shape) * dtype size`.
    #[error("{}: tensor `{tensor}`: {dtype} {shape:?} needs {expected} bytes but data_offsets span {got}", path.display())]
    SizeMismatch {
        /// The file.
        path: PathBuf,
        /// The tensor.
        tensor: String,
        /// Its dtype.
        dtype: Dtype,
        /// Its shape.
        shape: Vec<usize>,
        /// Bytes the dtype and shape need.
        expected: u64,
        /// Bytes the data offsets span.
        got: u64,
    },

    /// Two tensors' byte ranges overlap.
    #[error("{}: tensor `{tensor}` at [{begin}, {end}) overlaps tensor `{other}` which ends at {other_end}", path.display())]
    Overlap {
        /// The file.
        path: PathBuf,
        /// The later tensor (by start offset).
        tensor: String,
        /// Its start offset.
        begin: u64,
        /// Its end offset.
        end: u64,
        /// The tensor it overlaps.
        other: String,
        /// That tensor's end offset.
        other_end: u64,
    },

    /// Bytes of the data region between two tensors belong to no tensor.
    #[error("{}: data bytes [{gap_begin}, {gap_end}) before tensor `{tensor}` belong to no tensor", path.display())]
    Gap {
        /// The file.
        path: PathBuf,
        /// The tensor after the gap.
        tensor: String,
        /// Start of the uncovered bytes.
        gap_begin: u64,
        /// End of the uncovered bytes.
        gap_end: u64,
    },

    /// Bytes after the last tensor belong to no tensor.
    #[error("{}: data region is {data_len} bytes but tensors cover only the first {covered} (trailing bytes belong to no tensor)", path.display())]
    TrailingData {
        /// The file.
        path: PathBuf,
        /// Bytes covered by tensors.
        covered: u64,
        /// Length of the data region.
        data_len: u64,
    },

    /// `config.json` or `model.safetensors.index.json` is not valid JSON.
    #[error("{}: invalid JSON: {source}", path.display())]
    Json {
        /// The file.
        path: PathBuf,
        /// What the JSON parser said.
        #[source]
        source: serde_json::Error,
    },

    /// A value in `config.json` is missing or invalid (for example the quantization block).
    #[error("{}: `{key}`: {reason}", path.display())]
    Config {
        /// The file.
        path: PathBuf,
        /// Dotted path of the offending key, e.g. `quantization.bits`.
        key: String,
        /// What is wrong with it.
        reason: String,
    },

    /// `model.safetensors.index.json` is malformed.
    #[error("{}: {reason}", path.display())]
    Index {
        /// The index file.
        path: PathBuf,
        /// What is wrong with it.
        reason: String,
    },

    /// The index names a shard file that does not exist.
    #[error("{}: shard {} does not exist (it should hold tensor `{tensor}`)", index.display(), shard.display())]
    MissingShard {
        /// The index file.
        index: PathBuf,
        /// The missing shard.
        shard: PathBuf,
        /// One tensor the index places there.
        tensor: String,
    },

    /// The index places a tensor in a shard that does not hold it.
    #[error("{}: tensor `{tensor}` is not in shard {}, although the index says so", index.display(), shard.display())]
    ShardMissingTensor {
        /// The index file.
        index: PathBuf,
        /// The shard.
        shard: PathBuf,
        /// The tensor.
        tensor: String,
    },

    /// The checkpoint folder has neither `model.safetensors` nor `model.safetensors.index.json`.
    #[error("{}: no model.safetensors or model.safetensors.index.json in this folder", dir.display())]
    NoWeights {
        /// The checkpoint folder.
        dir: PathBuf,
    },

    /// A requested tensor does not exist.
    #[error("tensor `{tensor}` not found in checkpoint {}", checkpoint.display())]
    MissingTensor {
        /// The tensor.
        tensor: String,
        /// The checkpoint folder (or the file, for a lone [`SafetensorsFile`](crate::SafetensorsFile)).
        checkpoint: PathBuf,
    },

    /// A tensor has a dtype other than the one(s) expected.
    #[error("{}: tensor `{tensor}`: wrong dtype: expected {}, got {got}", path.display(), dtype_list(expected))]
    WrongDtype {
        /// The file holding the tensor.
        path: PathBuf,
        /// The tensor.
        tensor: String,
        /// The accepted dtypes.
        expected: Vec<Dtype>,
        /// Its dtype.
        got: Dtype,
    },

    /// A tensor has a shape other than the one expected.
    #[error("{}: tensor `{tensor}`: wrong shape: expected {expected}, got {got:?}", path.display())]
    WrongShape {
        /// The file holding the tensor.
        path: PathBuf,
        /// The tensor.
        tensor: String,
        /// The expected shape, in words (e.g. `[4096, 512] (bits=4, group_size=64)`).
        expected: String,
        /// Its shape.
        got: Vec<usize>,
    },

    /// A layer's tensors disagree with `config.json` (e.g. `.scales` without a quantization block).
    #[error("checkpoint {}: layer `{layer}`: {reason}", checkpoint.display())]
    Layer {
        /// The checkpoint folder.
        checkpoint: PathBuf,
        /// The layer prefix.
        layer: String,
        /// What is wrong.
        reason: String,
    },

    /// Quantization parameters this crate cannot unpack were given for a tensor.
    #[error("{}: tensor `{tensor}`: {reason}", path.display())]
    Quantization {
        /// The file holding the packed weight.
        path: PathBuf,
        /// The packed weight.
        tensor: String,
        /// What is unsupported.
        reason: String,
    },

    /// A row index passed to a gather (embedding lookup) is out of range.
    #[error("{}: tensor `{tensor}`: row {row} out of range (it has {rows} rows)", path.display())]
    RowOutOfRange {
        /// The file holding the tensor.
        path: PathBuf,
        /// The tensor.
        tensor: String,
        /// The requested row.
        row: usize,
        /// Rows it has.
        rows: usize,
    },
}

/// `F16`, `F16 or BF16`, `F32, F16 or BF16`.
fn dtype_list(dtypes: &[Dtype]) -> String {
    match dtypes {
        [] => "nothing".to_owned(),
        [one] => one.to_string(),
        [init @ .., last] => {
            let init: Vec<&str> = init.iter().map(|d| d.name()).collect();
            format!("{} or {last}", init.join(", "))
        }
    }
}
