//! One memory-mapped `.safetensors` file: header parsing with full validation, and tensor views.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::fmt;
use std::fs::File;
use std::path::{Path, PathBuf};

use memmap2::Mmap;
use serde::de::{Deserialize, Deserializer, MapAccess, Visitor};
use serde_json::Value;

use crate::{Dtype, Error, Result, TensorView};

/// Largest header this crate accepts (100 MB, the limit the `safetensors` crate uses too);
/// a larger header length means the file is not a safetensors file.
pub const MAX_HEADER_LEN: u64 = 100_000_000;

/// Where one tensor lives in its file, after validation.
#[derive(Debug, Clone)]
pub(crate) struct TensorInfo {
    pub(crate) name: String,
    pub(crate) dtype: Dtype,
    pub(crate) shape: Vec<usize>,
    /// Absolute byte range in the file (header included).
    pub(crate) start: usize,
    pub(crate) end: usize,
}

/// The validated contents of a safetensors header.
#[derive(Debug)]
pub(crate) struct Header {
    /// Sorted by start offset.
    pub(crate) tensors: Vec<TensorInfo>,
    pub(crate) metadata: BTreeMap<String, String>,
}

/// A memory-mapped `.safetensors` file whose header has been fully validated.
///
/// Every tensor's byte range is known to lie inside the file, to match its dtype and shape,
/// and not to overlap any other; the data region is covered without gaps. Tensor views borrow
/// straight from the mapping.
///
/// The file must not be modified or truncated while this value lives (see the crate docs).
pub struct SafetensorsFile {
    path: PathBuf,
    map: Mmap,
    header: Header,
    by_name: HashMap<String, usize>,
}

impl SafetensorsFile {
    /// Maps `path` and validates its header.
    ///
    /// # Errors
    /// [`Error::Io`] if the file cannot be read or mapped; a header error
    /// ([`Error::TooShort`], [`Error::HeaderPastEnd`], [`Error::HeaderTooLarge`],
    /// [`Error::HeaderJson`], [`Error::BadEntry`], [`Error::UnsupportedDtype`],
    /// [`Error::DuplicateTensor`], [`Error::OutOfRange`], [`Error::SizeMismatch`],
    /// [`Error::Overlap`], [`Error::Gap`], [`Error::TrailingData`]) if the file is not a
    /// well-formed safetensors file.
    pub fn open(path: impl AsRef<Path>) -> Result<Self> {
        let path = path.as_ref().to_path_buf();
        let io = |source| Error::Io { path: path.clone(), source };
        let file = File::open(&path).map_err(io)?;
        let meta = file.metadata().map_err(io)?;
        if !meta.is_file() {
            return Err(io(std::io::Error::new(std::io::ErrorKind::InvalidInput, "not a regular file")));
        }
        // Checked before mapping: an empty file cannot be mapped, and a short one is an error anyway.
        if meta.len() < 8 {
            return Err(Error::TooShort { path, len: meta.len() });
        }
        // SAFETY: the mapping is read-only and only ever read through shared slices. The
        // contract, stated in the crate docs and on this type, is that nobody modifies or
        // truncates the file while it is mapped; if someone does, reads may see torn data or
        // fault, which Rust cannot guard against for any mmap.
        let map = unsafe { Mmap::map(&file) }.map_err(io)?;
        let header = parse_header(&path, &map)?;
        let by_name = header.tensors.iter().enumerate().map(|(i, t)| (t.name.clone(), i)).collect();
        Ok(SafetensorsFile { path, map, header, by_name })
    }

    /// The file's path, as given to [`SafetensorsFile::open`].
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The header's `__metadata__` (MLX writes `{"format": "mlx"}`); empty if absent.
    pub fn metadata(&self) -> &BTreeMap<String, String> {
        &self.header.metadata
    }

    /// Number of tensors in the file.
    pub fn len(&self) -> usize {
        self.header.tensors.len()
    }

    /// Whether the file holds no tensors.
    pub fn is_empty(&self) -> bool {
        self.header.tensors.is_empty()
    }

    /// Tensor names in file order (by data offset).
    pub fn names(&self) -> impl Iterator<Item = &str> + '_ {
        self.header.tensors.iter().map(|t| t.name.as_str())
    }

    /// Whether the file holds `name`.
    pub fn contains(&self, name: &str) -> bool {
        self.by_name.contains_key(name)
    }

    /// A view of tensor `name`, borrowing the mapped bytes.
    ///
    /// # Errors
    /// [`Error::MissingTensor`] naming the tensor and this file.
    pub fn tensor(&self, name: &str) -> Result<TensorView<'_>> {
        self.get(name).ok_or_else(|| Error::MissingTensor { tensor: name.to_owned(), checkpoint: self.path.clone() })
    }

    /// A view of tensor `name`, or `None` if the file does not hold it.
    pub fn get(&self, name: &str) -> Option<TensorView<'_>> {
        let info = self.header.tensors.get(*self.by_name.get(name)?)?;
        // The range was validated against the file length; `get` keeps this panic-free anyway.
        let bytes = self.map.get(info.start..info.end)?;
        Some(TensorView::new(&info.name, info.dtype, &info.shape, bytes, &self.path, info.start as u64))
    }

    /// Views of every tensor, in file order.
    pub fn tensors(&self) -> impl Iterator<Item = TensorView<'_>> + '_ {
        self.names().filter_map(|n| self.get(n))
    }
}

impl fmt::Debug for SafetensorsFile {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SafetensorsFile")
            .field("path", &self.path)
            .field("len", &self.map.len())
            .field("tensors", &self.header.tensors.len())
            .field("metadata", &self.header.metadata)
            .finish()
    }
}

/// The header's top-level object as an ordered list, so duplicate names can be detected
/// (a plain JSON map silently keeps the last one).
struct RawHeader(Vec<(String, Value)>);

impl<'de> Deserialize<'de> for RawHeader {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> std::result::Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = RawHeader;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a JSON object mapping tensor names to entries")
            }
            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> std::result::Result<RawHeader, A::Error> {
                let mut entries = Vec::new();
                while let Some((k, v)) = map.next_entry::<String, Value>()? {
                    entries.push((k, v));
                }
                Ok(RawHeader(entries))
            }
        }
        deserializer.deserialize_map(V)
    }
}

/// Parses and validates the header of the safetensors file `bytes` (the whole file).
pub(crate) fn parse_header(path: &Path, bytes: &[u8]) -> Result<Header> {
    let file_len = bytes.len() as u64;
    let Some((len_bytes, rest)) = bytes.split_first_chunk::<8>() else {
        return Err(Error::TooShort { path: path.to_path_buf(), len: file_len });
    };
    let header_len = u64::from_le_bytes(*len_bytes);
    if header_len > MAX_HEADER_LEN {
        return Err(Error::HeaderTooLarge { path: path.to_path_buf(), header_len, limit: MAX_HEADER_LEN });
    }
    // header_len <= MAX_HEADER_LEN fits in usize on every platform this crate builds for.
    let header_bytes = usize::try_from(header_len)
        .ok()
        .and_then(|n| rest.get(..n))
        .ok_or_else(|| Error::HeaderPastEnd { path: path.to_path_buf(), header_len, file_len })?;
    let data_start = 8 + header_bytes.len();
    let data_len = (bytes.len() - data_start) as u64;

    let RawHeader(entries) = serde_json::from_slice(header_bytes)
        .map_err(|source| Error::HeaderJson { path: path.to_path_buf(), source })?;

    let mut seen = HashSet::new();
    let mut metadata = BTreeMap::new();
    let mut tensors = Vec::with_capacity(entries.len());
    for (name, value) in entries {
        if !seen.insert(name.clone()) {
            return Err(Error::DuplicateTensor { path: path.to_path_buf(), tensor: name });
        }
        if name == "__metadata__" {
            metadata = parse_metadata(path, value)?;
            continue;
        }
        let (dtype, shape, begin, end) = parse_entry(path, &name, &value)?;
        if end > data_len {
            return Err(Error::OutOfRange { path: path.to_path_buf(), tensor: name, begin, end, data_len });
        }
        let expected = shape.iter().try_fold(dtype.size_bytes() as u64, |acc, &d| acc.checked_mul(d as u64));
        let got = end - begin;
        if expected != Some(got) {
            return Err(Error::SizeMismatch {
                path: path.to_path_buf(),
                tensor: name,
                dtype,
                shape,
                expected: expected.unwrap_or(u64::MAX),
                got,
            });
        }
        // end <= data_len, so both fit in usize.
        tensors.push(TensorInfo {
            name,
            dtype,
            shape,
            start: data_start + begin as usize,
            end: data_start + end as usize,
        });
    }

    // The data region must be covered exactly: sorted by start, each tensor begins where the
    // previous one ended. Empty tensors may share an offset.
    tensors.sort_by_key(|t| (t.start, t.end));
    let rel = |abs: usize| (abs - data_start) as u64;
    let mut covered = 0u64;
    let mut last: Option<&TensorInfo> = None;
    for t in &tensors {
        let (begin, end) = (rel(t.start), rel(t.end));
        if begin < covered {
            let other = last.map(|o| o.name.clone()).unwrap_or_default();
            return Err(Error::Overlap {
                path: path.to_path_buf(),
                tensor: t.name.clone(),
                begin,
                end,
                other,
                other_end: covered,
            });
        }
        if begin > covered {
            return Err(Error::Gap {
                path: path.to_path_buf(),
                tensor: t.name.clone(),
                gap_begin: covered,
                gap_end: begin,
            });
        }
        covered = end;
        last = Some(t);
    }
    if covered != data_len {
        return Err(Error::TrailingData { path: path.to_path_buf(), covered, data_len });
    }
    Ok(Header { tensors, metadata })
}

fn parse_metadata(path: &Path, value: Value) -> Result<BTreeMap<String, String>> {
    let bad = |reason: &str| Error::BadEntry {
        path: path.to_path_buf(),
        tensor: "__metadata__".to_owned(),
        reason: reason.to_owned(),
    };
    let Value::Object(map) = value else {
        return Err(bad("expected an object of strings"));
    };
    map.into_iter()
        .map(|(k, v)| match v {
            Value::String(s) => Ok((k, s)),
            _ => Err(bad(&format!("value of `{k}` is not a string"))),
        })
        .collect()
}

/// Reads `dtype`, `shape` and `data_offsets` of one entry (offsets relative to the data region).
fn parse_entry(path: &Path, name: &str, value: &Value) -> Result<(Dtype, Vec<usize>, u64, u64)> {
    let bad = |reason: String| Error::BadEntry { path: path.to_path_buf(), tensor: name.to_owned(), reason };
    let Value::Object(obj) = value else {
        return Err(bad(format!("expected an object, got `{value}`")));
    };
    let dtype_name = match obj.get("dtype") {
        Some(Value::String(s)) => s,
        Some(other) => return Err(bad(format!("`dtype` is not a string: `{other}`"))),
        None => return Err(bad("no `dtype`".to_owned())),
    };
    let dtype = Dtype::from_safetensors(dtype_name).ok_or_else(|| Error::UnsupportedDtype {
        path: path.to_path_buf(),
        tensor: name.to_owned(),
        dtype: dtype_name.clone(),
    })?;
    let shape = match obj.get("shape") {
        Some(Value::Array(dims)) => dims
            .iter()
            .map(|d| {
                d.as_u64()
                    .and_then(|d| usize::try_from(d).ok())
                    .ok_or_else(|| bad(format!("shape dimension `{d}` is not a non-negative integer")))
            })
            .collect::<Result<Vec<usize>>>()?,
        Some(other) => return Err(bad(format!("`shape` is not an array: `{other}`"))),
        None => return Err(bad("no `shape`".to_owned())),
    };
    if shape.len() > crate::view::MAX_RANK {
        return Err(bad(format!("{} dimensions; this reader takes at most {}", shape.len(), crate::view::MAX_RANK)));
    }
    let (begin, end) = match obj.get("data_offsets") {
        Some(Value::Array(offsets)) => match offsets.as_slice() {
            [b, e] => match (b.as_u64(), e.as_u64()) {
                (Some(b), Some(e)) => (b, e),
                _ => {
                    return Err(bad(format!("`data_offsets` [{b}, {e}] are not non-negative integers")));
                }
            },
            _ => {
                return Err(bad(format!("`data_offsets` has {} values, not 2", offsets.len())));
            }
        },
        Some(other) => return Err(bad(format!("`data_offsets` is not an array: `{other}`"))),
        None => return Err(bad("no `data_offsets`".to_owned())),
    };
    if begin > end {
        return Err(bad(format!("`data_offsets` begin {begin} is after end {end}")));
    }
    Ok((dtype, shape, begin, end))
}
