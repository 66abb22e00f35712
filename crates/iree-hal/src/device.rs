//! [`Device`]: a HAL device created from a URI, and host→device uploads that
//! produce [`BufferView`]s.

use std::ptr::{self, NonNull};
use std::rc::Rc;

use iree_sys as sys;

use crate::buffer_view::BufferView;
use crate::element::{Element, ElementType, as_bytes};
use crate::error::{Error, Result, check, take_status};
use crate::instance::Instance;

/// A HAL device (`iree_hal_device_t`), e.g. `local-task` (multi-threaded CPU),
/// `local-sync` (CPU on the calling thread), `cuda`, `vulkan`, `metal`.
///
/// `Clone` retains, `Drop` releases. Not `Send`/`Sync`: it wraps a raw IREE
/// pointer and this crate makes no thread-safety claims for it.
#[derive(Debug)]
pub struct Device {
    ptr: NonNull<sys::iree_hal_device_t>,
    uri: Rc<str>,
}

impl Device {
    /// Creates a device from `uri` (`driver` or `driver://path?params`).
    ///
    /// An unknown or unavailable driver gives [`Error::Device`] naming the URI
    /// and listing the drivers this runtime build has.
    pub fn new(instance: &Instance, uri: &str) -> Result<Self> {
        let registry = instance.driver_registry();
        if registry.is_null() {
            return Err(Error::InvalidArgument("the IREE instance has no HAL driver registry".to_owned()));
        }
        let allocator = instance.host_allocator();
        let device_error =
            |code, message| Error::Device { uri: uri.to_owned(), available: instance.driver_names(), code, message };

        // The process's driver for the URI's scheme (IREE's `iree_uri_schema`:
        // everything before the first `:`), made once per process: creating a
        // driver per device would rewrite IREE's process-global VM type
        // registrations while other threads make calls (see `Instance`).
        let scheme = uri.split(':').next().unwrap_or_default();
        let driver = crate::instance::Driver::get(scheme).map_err(|e| device_error(e.code, e.message))?;

        // Devices need a proactor pool for async I/O; the device retains it, so
        // our reference is released right after creation (as IREE's tools do).
        let mut pool = ptr::null_mut();
        // SAFETY: plain value arguments and a valid out-pointer.
        let status = unsafe {
            sys::iree_async_proactor_pool_create(
                sys::iree_numa_node_count().max(1),
                ptr::null(),
                sys::iree_async_proactor_pool_options_default(),
                allocator,
                &mut pool,
            )
        };
        take_status(status).map_err(|e| device_error(e.code, format!("creating proactor pool: {}", e.message)))?;

        let params = sys::iree_hal_device_create_params_t { proactor_pool: pool, ..Default::default() };
        let mut raw = ptr::null_mut();
        // SAFETY: `driver` is a live, retained driver; the URI view borrows
        // `uri` for the duration of the call only; `params` and `raw` are
        // valid locals.
        let status = unsafe {
            sys::iree_hal_driver_create_device_by_uri(
                driver.as_ptr(),
                sys::string_view(uri),
                &params,
                allocator,
                &mut raw,
            )
        };
        // SAFETY: we own one reference to `pool` (the device holds its own).
        unsafe { sys::iree_async_proactor_pool_release(pool) };
        take_status(status).map_err(|e| device_error(e.code, e.message))?;
        let ptr = NonNull::new(raw)
            .ok_or_else(|| Error::InvalidArgument(format!("IREE returned a null device for `{uri}`")))?;
        Ok(Self { ptr, uri: Rc::from(uri) })
    }

    /// The URI the device was created from.
    pub fn uri(&self) -> &str {
        &self.uri
    }

    /// Uploads `data` as a `shape`-shaped tensor of `T`'s element type.
    /// `data.len()` must equal the product of `shape`.
    pub fn upload<T: Element>(&self, shape: &[usize], data: &[T]) -> Result<BufferView> {
        let count = element_count(shape)?;
        if data.len() != count {
            return Err(Error::InvalidArgument(format!(
                "upload of {} tensor with shape {shape:?} needs {count} elements, got {}",
                T::ELEMENT_TYPE,
                data.len()
            )));
        }
        self.upload_bytes(T::ELEMENT_TYPE, shape, as_bytes(data))
    }

    /// Uploads `data` reinterpreted as `element_type` (same bit width as `T`),
    /// e.g. f16 given as raw `u16` bits.
    pub fn upload_as<T: Element>(&self, element_type: ElementType, shape: &[usize], data: &[T]) -> Result<BufferView> {
        if element_type.bit_count() != 8 * std::mem::size_of::<T>() {
            return Err(Error::InvalidArgument(format!(
                "cannot upload {} values as {element_type}: bit widths differ",
                T::ELEMENT_TYPE
            )));
        }
        let count = element_count(shape)?;
        if data.len() != count {
            return Err(Error::InvalidArgument(format!(
                "upload of {element_type} tensor with shape {shape:?} needs {count} elements, got {}",
                data.len()
            )));
        }
        self.upload_bytes(element_type, shape, as_bytes(data))
    }

    /// Uploads raw bytes as a `shape`-shaped tensor of `element_type`. Sub-byte
    /// types (`I4`, `U4`) are packed two per byte, element 0 in the low nibble;
    /// `bytes.len()` must be exactly `ceil(count * bits / 8)`.
    pub fn upload_bytes(&self, element_type: ElementType, shape: &[usize], bytes: &[u8]) -> Result<BufferView> {
        let count = element_count(shape)?;
        let expected = element_type.packed_byte_count(count).ok_or_else(|| {
            Error::InvalidArgument(format!("cannot size a {element_type} tensor with shape {shape:?}"))
        })?;
        if bytes.len() != expected {
            return Err(Error::InvalidArgument(format!(
                "upload of {element_type} tensor with shape {shape:?} needs {expected} bytes, got {}",
                bytes.len()
            )));
        }
        // `iree_hal_dim_t` is `iree_device_size_t` = `size_t` = `usize`.
        let dims: &[sys::iree_hal_dim_t] = shape;
        let params = sys::iree_hal_buffer_params_t {
            usage: sys::IREE_HAL_BUFFER_USAGE_DEFAULT as sys::iree_hal_buffer_usage_t,
            type_: sys::IREE_HAL_MEMORY_TYPE_DEVICE_LOCAL as sys::iree_hal_memory_type_t,
            ..Default::default()
        };
        let data = sys::iree_const_byte_span_t { data: bytes.as_ptr(), data_length: bytes.len() };
        let mut raw = ptr::null_mut();
        // SAFETY: the device and its allocator are live for `&self`; `dims` and
        // `bytes` outlive the call (IREE copies the data synchronously); `raw`
        // is a valid out-pointer.
        let status = unsafe {
            sys::iree_hal_buffer_view_allocate_buffer_copy(
                self.ptr.as_ptr(),
                sys::iree_hal_device_allocator(self.ptr.as_ptr()),
                dims.len(),
                dims.as_ptr(),
                element_type.raw(),
                sys::IREE_HAL_ENCODING_TYPE_DENSE_ROW_MAJOR as sys::iree_hal_encoding_type_t,
                params,
                data,
                &mut raw,
            )
        };
        check(status, || format!("uploading {element_type} tensor with shape {shape:?} to device `{}`", self.uri))?;
        // SAFETY: allocate_buffer_copy returned a new buffer view whose single
        // reference we now own.
        unsafe { BufferView::from_owned(raw, self.clone()) }
    }

    /// The raw device pointer, for use with `iree-sys`. Still owned by `self`.
    pub fn as_ptr(&self) -> *mut sys::iree_hal_device_t {
        self.ptr.as_ptr()
    }
}

impl Clone for Device {
    fn clone(&self) -> Self {
        // SAFETY: the device is live; the new handle owns the added reference.
        unsafe { sys::iree_hal_device_retain(self.ptr.as_ptr()) };
        Self { ptr: self.ptr, uri: Rc::clone(&self.uri) }
    }
}

impl Drop for Device {
    fn drop(&mut self) {
        // SAFETY: this handle owns exactly one reference, released once here.
        unsafe { sys::iree_hal_device_release(self.ptr.as_ptr()) };
    }
}

/// Product of `shape`, with overflow reported as an error.
pub(crate) fn element_count(shape: &[usize]) -> Result<usize> {
    shape
        .iter()
        .try_fold(1usize, |acc, &dim| acc.checked_mul(dim))
        .ok_or_else(|| Error::InvalidArgument(format!("tensor shape {shape:?} overflows the element count")))
}
