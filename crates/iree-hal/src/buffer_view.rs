//! [`BufferView`]: a shaped, typed view of a device buffer, with device→host
//! downloads into `Vec<T>` or raw bytes.

use std::ptr::NonNull;

use iree_sys as sys;

use crate::device::Device;
use crate::element::{Element, ElementType};
use crate::error::{Error, Result, check};

/// A buffer view (`iree_hal_buffer_view_t`): a device buffer plus shape and
/// element type. Keeps the [`Device`] it lives on, used for downloads.
///
/// `Clone` retains, `Drop` releases. Not `Send`/`Sync`: it wraps a raw IREE
/// pointer and this crate makes no thread-safety claims for it.
#[derive(Debug)]
pub struct BufferView {
    ptr: NonNull<sys::iree_hal_buffer_view_t>,
    device: Device,
}

impl BufferView {
    /// Wraps a buffer view reference owned by the caller.
    ///
    /// # Safety
    /// `raw` must be null or a live buffer view whose one reference the caller
    /// transfers to the returned value; its buffer must belong to `device`.
    pub(crate) unsafe fn from_owned(raw: *mut sys::iree_hal_buffer_view_t, device: Device) -> Result<Self> {
        let ptr =
            NonNull::new(raw).ok_or_else(|| Error::InvalidArgument("IREE returned a null buffer view".to_owned()))?;
        Ok(Self { ptr, device })
    }

    /// The dimensions.
    pub fn shape(&self) -> Vec<usize> {
        // SAFETY: the view is live for `&self`.
        let rank = unsafe { sys::iree_hal_buffer_view_shape_rank(self.ptr.as_ptr()) };
        // SAFETY: the view is live; shape_dims points at `rank` dims it owns.
        let dims = unsafe { sys::iree_hal_buffer_view_shape_dims(self.ptr.as_ptr()) };
        if rank == 0 || dims.is_null() {
            return Vec::new();
        }
        // SAFETY: as above; the slice is copied before `self` can change.
        // (`iree_hal_dim_t` is `iree_device_size_t` = `size_t` = `usize`.)
        unsafe { std::slice::from_raw_parts(dims, rank) }.to_vec()
    }

    /// The element type.
    pub fn element_type(&self) -> ElementType {
        // SAFETY: the view is live for `&self`.
        ElementType::from_raw(unsafe { sys::iree_hal_buffer_view_element_type(self.ptr.as_ptr()) })
    }

    /// Number of elements (product of the shape).
    pub fn element_count(&self) -> usize {
        // SAFETY: the view is live for `&self`.
        unsafe { sys::iree_hal_buffer_view_element_count(self.ptr.as_ptr()) }
    }

    /// Size of the viewed contents in bytes (packed for sub-byte types).
    pub fn byte_length(&self) -> usize {
        // SAFETY: the view is live for `&self`.
        unsafe { sys::iree_hal_buffer_view_byte_length(self.ptr.as_ptr()) }
    }

    /// The device the buffer lives on.
    pub fn device(&self) -> &Device {
        &self.device
    }

    /// Downloads the contents as `T`; the view's element type must be `T`'s.
    pub fn to_vec<T: Element>(&self) -> Result<Vec<T>> {
        let element_type = self.element_type();
        if element_type != T::ELEMENT_TYPE {
            return Err(Error::InvalidArgument(format!(
                "buffer view holds {element_type} (shape {:?}), cannot read it as {}",
                self.shape(),
                T::ELEMENT_TYPE
            )));
        }
        self.read_elements()
    }

    /// Downloads the contents reinterpreted as `T`, which must have the same
    /// bit width as the element type (e.g. f16 read as raw `u16` bits).
    pub fn to_vec_as<T: Element>(&self) -> Result<Vec<T>> {
        let element_type = self.element_type();
        if element_type.bit_count() != 8 * std::mem::size_of::<T>() {
            return Err(Error::InvalidArgument(format!(
                "buffer view holds {element_type}, cannot reinterpret it as {}: bit widths differ",
                T::ELEMENT_TYPE
            )));
        }
        self.read_elements()
    }

    /// Downloads the raw contents (packed bytes for sub-byte types).
    pub fn to_bytes(&self) -> Result<Vec<u8>> {
        let length = self.byte_length();
        let mut out = Vec::<u8>::with_capacity(length);
        // SAFETY: `out` has capacity for `length` bytes; `read_into` writes
        // exactly that many before we set the length.
        unsafe {
            self.read_into(out.as_mut_ptr(), length)?;
            out.set_len(length);
        }
        Ok(out)
    }

    fn read_elements<T: Element>(&self) -> Result<Vec<T>> {
        let count = self.element_count();
        let length = self.byte_length();
        if count.checked_mul(std::mem::size_of::<T>()) != Some(length) {
            return Err(Error::InvalidArgument(format!(
                "buffer view of {count} {} elements spans {length} bytes, not {} per element",
                self.element_type(),
                std::mem::size_of::<T>()
            )));
        }
        let mut out = Vec::<T>::with_capacity(count);
        // SAFETY: `out` has room for `count` elements = `length` bytes; every
        // bit pattern is a valid `T` (`Element` is plain old data), so after the
        // transfer fills all bytes the elements are initialised.
        unsafe {
            self.read_into(out.as_mut_ptr().cast::<u8>(), length)?;
            out.set_len(count);
        }
        Ok(out)
    }

    /// Copies `length` bytes of the view's contents to `target`.
    ///
    /// # Safety
    /// `target` must be valid for writes of `length` bytes.
    unsafe fn read_into(&self, target: *mut u8, length: usize) -> Result<()> {
        if length == 0 {
            return Ok(());
        }
        // SAFETY: the view is live; the returned buffer is borrowed from it.
        let buffer = unsafe { sys::iree_hal_buffer_view_buffer(self.ptr.as_ptr()) };
        // SAFETY: device and buffer are live; `target` is writable for
        // `length` bytes per this function's contract; the transfer is
        // synchronous (infinite timeout) so nothing writes after we return.
        let status = unsafe {
            sys::iree_hal_device_transfer_d2h(
                self.device.as_ptr(),
                buffer,
                0,
                target.cast(),
                length,
                sys::IREE_HAL_TRANSFER_BUFFER_FLAG_DEFAULT as sys::iree_hal_transfer_buffer_flags_t,
                sys::infinite_timeout(),
            )
        };
        check(status, || {
            format!(
                "downloading {} tensor with shape {:?} from device `{}`",
                self.element_type(),
                self.shape(),
                self.device.uri()
            )
        })
    }

    /// The raw buffer view pointer, for use with `iree-sys`. Still owned by `self`.
    pub fn as_ptr(&self) -> *mut sys::iree_hal_buffer_view_t {
        self.ptr.as_ptr()
    }
}

impl Clone for BufferView {
    fn clone(&self) -> Self {
        // SAFETY: the view is live; the new handle owns the added reference.
        unsafe { sys::iree_hal_buffer_view_retain(self.ptr.as_ptr()) };
        Self { ptr: self.ptr, device: self.device.clone() }
    }
}

impl Drop for BufferView {
    fn drop(&mut self) {
        // SAFETY: this handle owns exactly one reference, released once here.
        unsafe { sys::iree_hal_buffer_view_release(self.ptr.as_ptr()) };
    }
}
