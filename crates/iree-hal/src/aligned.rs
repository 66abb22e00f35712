//! 64-byte aligned host byte buffers whose ownership can be handed to IREE
//! (vmfb archives, host-memory parameters) and freed by IREE through a callback.
//! Large ones are anonymous memory mappings of their own, so freeing one returns its
//! memory to the system at once (from `malloc`, a freed parameter's memory can stay with
//! the process: after the weights stored in final form were first written, 520 MB of the
//! 1B shape's 4-bit weights did).

use std::alloc::{self, Layout};
use std::ffi::c_void;
use std::ptr::{self, NonNull};

use iree_sys as sys;

/// Alignment of the copies: IREE aligns vmfb rodata segments to 64 bytes
/// relative to the archive start, and CPU kernels may read parameters that
/// are imported in place with vector loads.
pub(crate) const ALIGNMENT: usize = 64;

/// Buffers of at least this many bytes are mappings of their own (on Unix).
const MAP_THRESHOLD: usize = 1 << 20;

/// Whether a buffer of `len` bytes is a mapping (decided by length alone, so a buffer
/// rebuilt from its pointer and length by [`AlignedBytes::from_raw`] is freed the same way).
fn mapped(len: usize) -> bool {
    cfg!(unix) && len >= MAP_THRESHOLD
}

/// An owned, 64-byte aligned, heap-allocated byte buffer.
#[derive(Debug)]
pub(crate) struct AlignedBytes {
    ptr: NonNull<u8>,
    len: usize,
}

impl AlignedBytes {
    fn layout(len: usize) -> Option<Layout> {
        // Zero-sized allocations are not allowed; keep at least one byte.
        Layout::from_size_align(len.max(1), ALIGNMENT).ok()
    }

    /// A zero-filled buffer of `len` bytes, or `None` if it cannot be allocated.
    pub(crate) fn zeroed(len: usize) -> Option<Self> {
        #[cfg(unix)]
        if mapped(len) {
            // SAFETY: a fresh private anonymous mapping (no address hint, no file): page
            // aligned (so 64-byte aligned) and zero-filled; unmapped once in `Drop`.
            let raw = unsafe {
                libc::mmap(
                    ptr::null_mut(),
                    len,
                    libc::PROT_READ | libc::PROT_WRITE,
                    libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                    -1,
                    0,
                )
            };
            if raw == libc::MAP_FAILED {
                return None;
            }
            return NonNull::new(raw.cast::<u8>()).map(|ptr| Self { ptr, len });
        }
        let layout = Self::layout(len)?;
        // SAFETY: the layout has a non-zero size.
        let raw = unsafe { alloc::alloc_zeroed(layout) };
        NonNull::new(raw).map(|ptr| Self { ptr, len })
    }

    /// An aligned copy of `bytes`.
    pub(crate) fn copy_from(bytes: &[u8]) -> Option<Self> {
        let mut out = Self::zeroed(bytes.len())?;
        out.as_mut_slice().copy_from_slice(bytes);
        Some(out)
    }

    pub(crate) fn len(&self) -> usize {
        self.len
    }

    pub(crate) fn as_mut_slice(&mut self) -> &mut [u8] {
        // SAFETY: `ptr` is valid for `len` initialised (zeroed or copied) bytes
        // and uniquely owned by `self`.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.as_ptr(), self.len) }
    }

    /// Gives up ownership; reclaim with [`AlignedBytes::from_raw`].
    pub(crate) fn into_raw(self) -> (*mut u8, usize) {
        let parts = (self.ptr.as_ptr(), self.len);
        std::mem::forget(self);
        parts
    }

    /// Reclaims a buffer released by [`AlignedBytes::into_raw`].
    ///
    /// # Safety
    /// `ptr`/`len` must come from one `into_raw` call and be reclaimed once.
    pub(crate) unsafe fn from_raw(ptr: *mut u8, len: usize) -> Option<Self> {
        NonNull::new(ptr).map(|ptr| Self { ptr, len })
    }

    /// Hands the buffer to IREE as a byte span plus an `iree_allocator_t`
    /// whose FREE command releases it (the form `iree_vm_bytecode_module_create`
    /// takes for archive memory). The length travels in the allocator's `self`.
    pub(crate) fn into_iree_span(self) -> (sys::iree_const_byte_span_t, sys::iree_allocator_t) {
        let (data, len) = self.into_raw();
        let span = sys::iree_const_byte_span_t { data, data_length: len };
        let allocator = sys::iree_allocator_t { self_: ptr::without_provenance_mut(len), ctl: Some(free_only_ctl) };
        (span, allocator)
    }

    /// Hands the buffer to IREE as a host-allocation file handle; IREE calls
    /// the release callback (freeing it) when the last reference goes away.
    pub(crate) fn into_file_handle(
        self,
        host_allocator: sys::iree_allocator_t,
    ) -> Result<*mut sys::iree_io_file_handle_t, crate::error::StatusError> {
        let (data, len) = self.into_raw();
        let span = sys::iree_byte_span_t { data, data_length: len };
        let release = sys::iree_io_file_handle_release_callback_t {
            fn_: Some(release_file_handle),
            user_data: ptr::without_provenance_mut(len),
        };
        let mut handle = ptr::null_mut();
        // SAFETY: `span` is our exclusively owned allocation; on success IREE
        // owns it and frees it through `release`, on failure IREE never calls
        // `release` and we free it below; `handle` is a valid out-pointer.
        let status = unsafe {
            sys::iree_io_file_handle_wrap_host_allocation(
                sys::IREE_IO_FILE_ACCESS_READ as sys::iree_io_file_access_t,
                span,
                release,
                host_allocator,
                &mut handle,
            )
        };
        let result = crate::error::take_status(status);
        if result.is_err() {
            // Wrapping failed before IREE took ownership: free it ourselves.
            // SAFETY: `data`/`len` came from `into_raw` above and were not
            // handed to any live IREE object.
            drop(unsafe { Self::from_raw(data, len) });
        }
        result.map(|()| handle)
    }
}

impl Drop for AlignedBytes {
    fn drop(&mut self) {
        #[cfg(unix)]
        if mapped(self.len) {
            // SAFETY: mapped in `zeroed` with exactly this length (`mapped` depends on the
            // length alone), unmapped once here.
            unsafe { libc::munmap(self.ptr.as_ptr().cast(), self.len) };
            return;
        }
        if let Some(layout) = Self::layout(self.len) {
            // SAFETY: allocated in `zeroed` with exactly this layout.
            unsafe { alloc::dealloc(self.ptr.as_ptr(), layout) };
        }
    }
}

/// `iree_allocator_ctl_fn_t` that only frees an [`AlignedBytes`] whose length
/// is carried in `self_`; every other command fails with UNIMPLEMENTED.
unsafe extern "C" fn free_only_ctl(
    self_: *mut c_void,
    command: sys::iree_allocator_command_t,
    _params: *const c_void,
    inout_ptr: *mut *mut c_void,
) -> sys::iree_status_t {
    if command != sys::IREE_ALLOCATOR_COMMAND_FREE || inout_ptr.is_null() {
        return sys::status_from_code(sys::IREE_STATUS_UNIMPLEMENTED);
    }
    // SAFETY: IREE passes the pointer it got from `into_iree_span` through
    // `inout_ptr` with the allocator's `self_` (our length) and frees once.
    unsafe {
        drop(AlignedBytes::from_raw((*inout_ptr).cast::<u8>(), self_.addr()));
        *inout_ptr = ptr::null_mut();
    }
    sys::status_from_code(sys::IREE_STATUS_OK)
}

/// `iree_io_file_handle_release_fn_t` freeing an [`AlignedBytes`] wrapped by
/// [`AlignedBytes::into_file_handle`]; the length is carried in `user_data`.
unsafe extern "C" fn release_file_handle(user_data: *mut c_void, primitive: sys::iree_io_file_handle_primitive_t) {
    // SAFETY: the handle was created as a host allocation from `into_raw`;
    // IREE calls this once when the last reference is released.
    unsafe {
        let data = primitive.value.host_allocation.data;
        drop(AlignedBytes::from_raw(data, user_data.addr()));
    }
}
