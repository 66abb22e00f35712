//! A borrowed view of one tensor in a mapped file, with typed readers.

use std::fmt;
use std::path::Path;

use half::{bf16, f16};

use crate::{Dtype, Error, Result};

/// One tensor: name, dtype, shape and its raw bytes, borrowed from the memory mapping.
///
/// Creating or copying a view copies no tensor data; [`TensorView::bytes`] is the mapped file
/// itself. The typed readers (`to_f32_vec`, `as_f16_bits`, ...) decode little-endian elements
/// into a new `Vec`. The bytes carry no alignment guarantee (safetensors does not pad), which
/// is why there is no `&[f32]` accessor.
#[derive(Clone, Copy)]
pub struct TensorView<'a> {
    name: &'a str,
    dtype: Dtype,
    shape: Dims,
    bytes: &'a [u8],
    file: &'a Path,
    file_offset: u64,
}

/// The most dimensions a tensor may have (the header parser refuses more): a view holds its
/// shape inline, so that a view of some rows ([`TensorView::rows`]) has a shape of its own.
pub const MAX_RANK: usize = 8;

/// A shape of at most [`MAX_RANK`] dimensions, stored inline.
#[derive(Clone, Copy, PartialEq, Eq)]
struct Dims {
    len: u8,
    dims: [usize; MAX_RANK],
}

impl Dims {
    /// `shape` inline; the parser checked its rank.
    fn new(shape: &[usize]) -> Dims {
        let mut dims = [0; MAX_RANK];
        let len = shape.len().min(MAX_RANK);
        dims[..len].copy_from_slice(&shape[..len]);
        Dims { len: len as u8, dims }
    }

    fn as_slice(&self) -> &[usize] {
        &self.dims[..self.len as usize]
    }
}

impl<'a> TensorView<'a> {
    pub(crate) fn new(
        name: &'a str,
        dtype: Dtype,
        shape: &[usize],
        bytes: &'a [u8],
        file: &'a Path,
        file_offset: u64,
    ) -> Self {
        TensorView { name, dtype, shape: Dims::new(shape), bytes, file, file_offset }
    }

    /// The tensor's name.
    pub fn name(&self) -> &'a str {
        self.name
    }

    /// Its element type.
    pub fn dtype(&self) -> Dtype {
        self.dtype
    }

    /// Its shape (empty for a scalar).
    pub fn shape(&self) -> &[usize] {
        self.shape.as_slice()
    }

    /// Rows `[first, first + n)` of the outermost dimension, as a view of their own (a
    /// part of a fused projection, one expert of stacked expert weights); no copy.
    ///
    /// # Errors
    /// [`Error::WrongShape`] for a scalar or a range past the tensor's first dimension.
    pub fn rows(&self, first: usize, n: usize) -> Result<TensorView<'a>> {
        let shape = self.shape();
        let Some((&outer, inner)) = shape.split_first() else {
            return Err(
                self.wrong_shape(format!("at least one dimension to take rows {first}..{}", first.saturating_add(n)))
            );
        };
        let end = first.checked_add(n).filter(|&e| e <= outer);
        let Some(end) = end else {
            return Err(self.wrong_shape(format!("at least {} rows", first.saturating_add(n))));
        };
        // Validated at open: the bytes are exactly shape * dtype size, so a row is that / outer.
        let row_bytes = inner.iter().product::<usize>() * self.dtype.size_bytes();
        let mut dims = self.shape;
        dims.dims[0] = n;
        Ok(TensorView {
            shape: dims,
            bytes: &self.bytes[first * row_bytes..end * row_bytes],
            file_offset: self.file_offset + (first * row_bytes) as u64,
            ..*self
        })
    }

    /// Entry `i` of the outermost dimension, that dimension dropped (one expert's matrix of
    /// stacked expert weights `[experts, out, in]`); no copy.
    ///
    /// # Errors
    /// [`Error::WrongShape`] for a scalar or an index past the first dimension.
    pub fn outer(&self, i: usize) -> Result<TensorView<'a>> {
        let mut one = self.rows(i, 1)?;
        let rank = one.shape.len as usize;
        one.shape.dims.copy_within(1..rank, 0);
        one.shape.len -= 1;
        Ok(one)
    }

    /// Number of elements (1 for a scalar).
    pub fn numel(&self) -> usize {
        // Validated at open: shape * dtype size equals the byte length, so this cannot overflow.
        self.bytes.len() / self.dtype.size_bytes()
    }

    /// The raw little-endian bytes, borrowed from the mapping (no copy).
    pub fn bytes(&self) -> &'a [u8] {
        self.bytes
    }

    /// The file that holds the tensor.
    pub fn file(&self) -> &'a Path {
        self.file
    }

    /// Absolute byte offset of the tensor's data in [`TensorView::file`]; with `bytes().len()`
    /// it locates the tensor for readers that open the file themselves (parameter indices).
    pub fn file_offset(&self) -> u64 {
        self.file_offset
    }

    /// Checks dtype, then shape.
    ///
    /// # Errors
    /// [`Error::WrongDtype`] or [`Error::WrongShape`], naming the file, the tensor, what was
    /// expected and what was found.
    pub fn expect(&self, dtype: Dtype, shape: &[usize]) -> Result<()> {
        self.expect_dtype(&[dtype])?;
        if self.shape() != shape {
            return Err(self.wrong_shape(format!("{shape:?}")));
        }
        Ok(())
    }

    /// Checks that the dtype is one of `dtypes`.
    ///
    /// # Errors
    /// [`Error::WrongDtype`] naming the file, the tensor, the accepted dtypes and the actual one.
    pub fn expect_dtype(&self, dtypes: &[Dtype]) -> Result<()> {
        if dtypes.contains(&self.dtype) {
            Ok(())
        } else {
            Err(Error::WrongDtype {
                path: self.file.to_path_buf(),
                tensor: self.name.to_owned(),
                expected: dtypes.to_vec(),
                got: self.dtype,
            })
        }
    }

    /// An [`Error::WrongShape`] for this tensor with `expected` in words.
    pub fn wrong_shape(&self, expected: String) -> Error {
        Error::WrongShape {
            path: self.file.to_path_buf(),
            tensor: self.name.to_owned(),
            expected,
            got: self.shape().to_vec(),
        }
    }

    /// The elements as f32; F16 and BF16 widen exactly.
    ///
    /// # Errors
    /// [`Error::WrongDtype`] unless the dtype is F32, F16 or BF16.
    pub fn to_f32_vec(&self) -> Result<Vec<f32>> {
        self.expect_dtype(&Dtype::FLOATS)?;
        Ok(floats_to_f32(self.dtype, self.bytes))
    }

    /// The F16 elements as their little-endian bit patterns.
    ///
    /// # Errors
    /// [`Error::WrongDtype`] unless the dtype is F16.
    pub fn as_f16_bits(&self) -> Result<Vec<u16>> {
        self.expect_dtype(&[Dtype::F16])?;
        Ok(u16_words(self.bytes))
    }

    /// The BF16 elements as their little-endian bit patterns.
    ///
    /// # Errors
    /// [`Error::WrongDtype`] unless the dtype is BF16.
    pub fn as_bf16_bits(&self) -> Result<Vec<u16>> {
        self.expect_dtype(&[Dtype::BF16])?;
        Ok(u16_words(self.bytes))
    }

    /// The U32 elements (MLX packed quantized words) as little-endian words.
    ///
    /// # Errors
    /// [`Error::WrongDtype`] unless the dtype is U32.
    pub fn as_u32_words(&self) -> Result<Vec<u32>> {
        self.expect_dtype(&[Dtype::U32])?;
        Ok(self.bytes.chunks_exact(4).map(|c| u32::from_le_bytes([c[0], c[1], c[2], c[3]])).collect())
    }

    /// Integer and boolean elements widened to i64.
    ///
    /// # Errors
    /// [`Error::WrongDtype`] for float dtypes.
    pub fn to_i64_vec(&self) -> Result<Vec<i64>> {
        const INTS: [Dtype; 6] = [Dtype::U32, Dtype::I32, Dtype::I64, Dtype::U8, Dtype::I8, Dtype::Bool];
        self.expect_dtype(&INTS)?;
        let b = self.bytes;
        Ok(match self.dtype {
            Dtype::U32 => b.chunks_exact(4).map(|c| i64::from(u32::from_le_bytes([c[0], c[1], c[2], c[3]]))).collect(),
            Dtype::I32 => b.chunks_exact(4).map(|c| i64::from(i32::from_le_bytes([c[0], c[1], c[2], c[3]]))).collect(),
            Dtype::I64 => b
                .chunks_exact(8)
                .map(|c| i64::from_le_bytes([c[0], c[1], c[2], c[3], c[4], c[5], c[6], c[7]]))
                .collect(),
            Dtype::I8 => b.iter().map(|&x| i64::from(x as i8)).collect(),
            _ => b.iter().map(|&x| i64::from(x)).collect(),
        })
    }
}

impl fmt::Debug for TensorView<'_> {
    // The bytes are left out: a weight is megabytes.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TensorView")
            .field("name", &self.name)
            .field("dtype", &self.dtype)
            .field("shape", &self.shape())
            .field("nbytes", &self.bytes.len())
            .field("file", &self.file)
            .field("file_offset", &self.file_offset)
            .finish()
    }
}

fn u16_words(bytes: &[u8]) -> Vec<u16> {
    bytes.chunks_exact(2).map(|c| u16::from_le_bytes([c[0], c[1]])).collect()
}

/// Decodes float bytes of `dtype`; any other dtype gives an empty vector (callers check first).
pub(crate) fn floats_to_f32(dtype: Dtype, bytes: &[u8]) -> Vec<f32> {
    match dtype {
        Dtype::F32 => bytes.chunks_exact(4).map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]])).collect(),
        Dtype::F16 => bytes.chunks_exact(2).map(|c| f16::from_le_bytes([c[0], c[1]]).to_f32()).collect(),
        Dtype::BF16 => bytes.chunks_exact(2).map(|c| bf16::from_le_bytes([c[0], c[1]]).to_f32()).collect(),
        _ => Vec::new(),
    }
}
