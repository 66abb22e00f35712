//! Element types of buffer views ([`ElementType`]) and the plain-old-data Rust
//! types that can be copied in and out of them ([`Element`]).

use std::fmt;

use iree_sys as sys;

/// The element type of a buffer view, as IREE's `iree_hal_element_type_t`.
///
/// Integer variants are the *signless* IREE types (`IREE_HAL_ELEMENT_TYPE_INT_*`),
/// which is what the compiler uses for MLIR `iN` tensors, except the unsigned
/// ones (`U8`, `U4`, ...) which match MLIR `uiN`. Sub-byte types (`I4`, `U4`)
/// are stored packed, two elements per byte, element 0 in the low nibble.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ElementType {
    /// 32-bit IEEE float.
    F32,
    /// 64-bit IEEE float.
    F64,
    /// 16-bit IEEE half float.
    F16,
    /// bfloat16.
    BF16,
    /// Signless 64-bit integer (MLIR `i64`).
    I64,
    /// Signless 32-bit integer (MLIR `i32`).
    I32,
    /// Signless 16-bit integer (MLIR `i16`).
    I16,
    /// Signless 8-bit integer (MLIR `i8`).
    I8,
    /// Signless 4-bit integer (MLIR `i4`), packed two per byte.
    I4,
    /// Unsigned 32-bit integer (MLIR `ui32`).
    U32,
    /// Unsigned 16-bit integer (MLIR `ui16`).
    U16,
    /// Unsigned 8-bit integer (MLIR `ui8`).
    U8,
    /// Unsigned 4-bit integer (MLIR `ui4`), packed two per byte.
    U4,
    /// 8-bit boolean (MLIR `i1` as stored by IREE).
    Bool,
    /// Any other IREE element type, by raw value.
    Other(u32),
}

impl ElementType {
    /// The raw `iree_hal_element_type_t` value.
    pub fn raw(self) -> sys::iree_hal_element_type_t {
        match self {
            Self::F32 => sys::IREE_HAL_ELEMENT_TYPE_FLOAT_32,
            Self::F64 => sys::IREE_HAL_ELEMENT_TYPE_FLOAT_64,
            Self::F16 => sys::IREE_HAL_ELEMENT_TYPE_FLOAT_16,
            Self::BF16 => sys::IREE_HAL_ELEMENT_TYPE_BFLOAT_16,
            Self::I64 => sys::IREE_HAL_ELEMENT_TYPE_INT_64,
            Self::I32 => sys::IREE_HAL_ELEMENT_TYPE_INT_32,
            Self::I16 => sys::IREE_HAL_ELEMENT_TYPE_INT_16,
            Self::I8 => sys::IREE_HAL_ELEMENT_TYPE_INT_8,
            Self::I4 => sys::IREE_HAL_ELEMENT_TYPE_INT_4,
            Self::U32 => sys::IREE_HAL_ELEMENT_TYPE_UINT_32,
            Self::U16 => sys::IREE_HAL_ELEMENT_TYPE_UINT_16,
            Self::U8 => sys::IREE_HAL_ELEMENT_TYPE_UINT_8,
            Self::U4 => sys::IREE_HAL_ELEMENT_TYPE_UINT_4,
            Self::Bool => sys::IREE_HAL_ELEMENT_TYPE_BOOL_8,
            Self::Other(raw) => raw,
        }
    }

    /// Maps a raw `iree_hal_element_type_t` value.
    pub fn from_raw(raw: sys::iree_hal_element_type_t) -> Self {
        const KNOWN: [ElementType; 14] = [
            ElementType::F32,
            ElementType::F64,
            ElementType::F16,
            ElementType::BF16,
            ElementType::I64,
            ElementType::I32,
            ElementType::I16,
            ElementType::I8,
            ElementType::I4,
            ElementType::U32,
            ElementType::U16,
            ElementType::U8,
            ElementType::U4,
            ElementType::Bool,
        ];
        KNOWN.into_iter().find(|known| known.raw() == raw).unwrap_or(Self::Other(raw))
    }

    /// Bits per element (IREE keeps it in the low byte of the type).
    pub fn bit_count(self) -> usize {
        (self.raw() & 0xFF) as usize
    }

    /// Bytes needed for `element_count` densely packed elements
    /// (`ceil(count * bits / 8)`), or `None` on overflow or for opaque types.
    pub fn packed_byte_count(self, element_count: usize) -> Option<usize> {
        let bits = self.bit_count();
        if bits == 0 {
            return None;
        }
        element_count.checked_mul(bits).map(|total| total.div_ceil(8))
    }
}

impl fmt::Display for ElementType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let name = match self {
            Self::F32 => "f32",
            Self::F64 => "f64",
            Self::F16 => "f16",
            Self::BF16 => "bf16",
            Self::I64 => "i64",
            Self::I32 => "i32",
            Self::I16 => "i16",
            Self::I8 => "i8",
            Self::I4 => "i4",
            Self::U32 => "ui32",
            Self::U16 => "ui16",
            Self::U8 => "ui8",
            Self::U4 => "ui4",
            Self::Bool => "i1",
            Self::Other(raw) => return write!(f, "element type {raw:#010x}"),
        };
        f.write_str(name)
    }
}

mod sealed {
    pub trait Sealed {}
}

/// A plain-old-data Rust type that maps to one [`ElementType`]: every bit
/// pattern is a valid value and the type has no padding, so it can be copied
/// to and from device memory byte for byte. Sealed: implemented for
/// `f32 f64 half::f16 half::bf16 i64 i32 i16 i8 u32 u16 u8`.
pub trait Element: sealed::Sealed + Copy + 'static {
    /// The buffer view element type holding values of this Rust type.
    const ELEMENT_TYPE: ElementType;
}

macro_rules! element {
    ($($ty:ty => $variant:ident),* $(,)?) => {$(
        impl sealed::Sealed for $ty {}
        impl Element for $ty {
            const ELEMENT_TYPE: ElementType = ElementType::$variant;
        }
    )*};
}

element! {
    f32 => F32,
    f64 => F64,
    half::f16 => F16,
    half::bf16 => BF16,
    i64 => I64,
    i32 => I32,
    i16 => I16,
    i8 => I8,
    u32 => U32,
    u16 => U16,
    u8 => U8,
}

/// The bytes of a slice of elements.
pub(crate) fn as_bytes<T: Element>(data: &[T]) -> &[u8] {
    // SAFETY: `Element` types are plain old data without padding (sealed set of
    // primitive numeric types and `half`'s `repr(transparent)` u16 wrappers), so
    // viewing their memory as bytes is sound; the length is the slice's size.
    unsafe { std::slice::from_raw_parts(data.as_ptr().cast::<u8>(), std::mem::size_of_val(data)) }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn raw_values_round_trip_and_sizes() {
        for ty in [
            ElementType::F32,
            ElementType::F16,
            ElementType::BF16,
            ElementType::I32,
            ElementType::I8,
            ElementType::U8,
            ElementType::I4,
            ElementType::U4,
        ] {
            assert_eq!(ElementType::from_raw(ty.raw()), ty);
        }
        assert_eq!(ElementType::F32.bit_count(), 32);
        assert_eq!(ElementType::BF16.bit_count(), 16);
        assert_eq!(ElementType::I4.packed_byte_count(9), Some(5));
        assert_eq!(ElementType::U4.packed_byte_count(8), Some(4));
        assert_eq!(ElementType::F16.packed_byte_count(3), Some(6));
        assert_eq!(ElementType::Other(0).packed_byte_count(3), None);
        assert_eq!(ElementType::I4.packed_byte_count(usize::MAX), None);
        assert_eq!(ElementType::U4.to_string(), "ui4");
        assert_eq!(ElementType::from_raw(0x1234_5678), ElementType::Other(0x1234_5678));
    }
}
