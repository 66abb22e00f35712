//! [`Module`]: a VM bytecode module loaded from vmfb bytes or a vmfb file. The
//! archive bytes are copied into memory the module owns, so the caller's
//! buffer can be dropped right after loading.

use std::fs::File;
use std::io::Read;
use std::path::Path;
use std::ptr::{self, NonNull};

use iree_sys as sys;

use crate::aligned::AlignedBytes;
use crate::error::{Error, Result, check, string_from_view};
use crate::instance::Instance;

/// A VM module (`iree_vm_module_t`), usually compiled user code from a vmfb.
///
/// `Clone` retains, `Drop` releases. Not `Send`/`Sync`: it wraps a raw IREE
/// pointer and this crate makes no thread-safety claims for it.
#[derive(Debug)]
pub struct Module {
    ptr: NonNull<sys::iree_vm_module_t>,
    // Modules reference types registered in the instance's VM instance.
    _instance: Instance,
}

impl Module {
    /// Loads a vmfb from memory. The bytes are copied (64-byte aligned) into
    /// memory owned by the module; `vmfb` may be dropped afterwards. Corrupt
    /// or truncated bytes give an error, never a crash.
    pub fn from_bytes(instance: &Instance, vmfb: &[u8]) -> Result<Self> {
        if vmfb.is_empty() {
            return Err(Error::InvalidArgument("cannot load a vmfb module from 0 bytes".to_owned()));
        }
        let bytes = AlignedBytes::copy_from(vmfb)
            .ok_or_else(|| Error::InvalidArgument(format!("cannot allocate {} bytes for a vmfb module", vmfb.len())))?;
        Self::from_aligned(instance, bytes, || "loading vmfb module from memory".to_owned())
    }

    /// Loads a vmfb file (read into memory owned by the module).
    pub fn from_file(instance: &Instance, path: impl AsRef<Path>) -> Result<Self> {
        let path = path.as_ref();
        let io_error = |source| Error::Io { path: path.to_owned(), source };
        let mut file = File::open(path).map_err(io_error)?;
        let len = file.metadata().map_err(io_error)?.len();
        let len = usize::try_from(len)
            .map_err(|_| Error::InvalidArgument(format!("vmfb file `{}` is too large", path.display())))?;
        if len == 0 {
            return Err(Error::InvalidArgument(format!("vmfb file `{}` is empty", path.display())));
        }
        let mut bytes = AlignedBytes::zeroed(len).ok_or_else(|| {
            Error::InvalidArgument(format!("cannot allocate {len} bytes for vmfb file `{}`", path.display()))
        })?;
        file.read_exact(bytes.as_mut_slice()).map_err(io_error)?;
        Self::from_aligned(instance, bytes, || format!("loading vmfb module `{}`", path.display()))
    }

    fn from_aligned(instance: &Instance, bytes: AlignedBytes, context: impl FnOnce() -> String) -> Result<Self> {
        let (span, deallocator) = bytes.into_iree_span();
        let mut raw = ptr::null_mut();
        // SAFETY: the VM instance is live; `span` is memory we exclusively own,
        // handed over with `deallocator` which frees it when the module is
        // destroyed; `raw` is a valid out-pointer.
        let status = unsafe {
            sys::iree_vm_bytecode_module_create(
                instance.vm_instance(),
                sys::IREE_VM_BYTECODE_MODULE_FLAG_NONE as sys::iree_vm_bytecode_module_flags_t,
                span,
                deallocator,
                instance.host_allocator(),
                &mut raw,
            )
        };
        if !sys::status_is_ok(status) {
            // On failure the module does not take the archive: free it here.
            // SAFETY: `span.data` came from `into_iree_span` and no module owns it.
            unsafe { sys::iree_allocator_free(deallocator, span.data.cast_mut().cast()) };
        }
        check(status, context)?;
        let ptr =
            NonNull::new(raw).ok_or_else(|| Error::InvalidArgument("IREE returned a null VM module".to_owned()))?;
        Ok(Self { ptr, _instance: instance.clone() })
    }

    /// The module name (`module` unless the MLIR module was named).
    pub fn name(&self) -> String {
        // SAFETY: the module is live; the view points into module-owned data
        // and is copied at once.
        unsafe { string_from_view(sys::iree_vm_module_name(self.ptr.as_ptr())) }
    }

    /// Fully qualified names (`module.function`) of the exported functions,
    /// without IREE's internal `__`-prefixed ones.
    pub fn exported_functions(&self) -> Vec<String> {
        let module_name = self.name();
        // SAFETY: the module is live.
        let signature = unsafe { sys::iree_vm_module_signature(self.ptr.as_ptr()) };
        let mut names = Vec::new();
        for ordinal in 0..signature.export_function_count {
            let mut function = sys::iree_vm_function_t::default();
            // SAFETY: the module is live; `ordinal` is within the export count;
            // `function` is a valid out-pointer.
            let status = unsafe {
                sys::iree_vm_module_lookup_function_by_ordinal(
                    self.ptr.as_ptr(),
                    sys::IREE_VM_FUNCTION_LINKAGE_EXPORT as sys::iree_vm_function_linkage_t,
                    ordinal,
                    &mut function,
                )
            };
            if crate::error::take_status(status).is_err() {
                continue;
            }
            // SAFETY: `function` was filled in above; its name view points into
            // module-owned data and is copied at once.
            let name = unsafe { string_from_view(sys::iree_vm_function_name(&function)) };
            if !name.starts_with("__") {
                names.push(format!("{module_name}.{name}"));
            }
        }
        names
    }

    /// The raw module pointer, for use with `iree-sys`. Still owned by `self`.
    pub fn as_ptr(&self) -> *mut sys::iree_vm_module_t {
        self.ptr.as_ptr()
    }
}

impl Clone for Module {
    fn clone(&self) -> Self {
        // SAFETY: the module is live; the new handle owns the added reference.
        unsafe { sys::iree_vm_module_retain(self.ptr.as_ptr()) };
        Self { ptr: self.ptr, _instance: self._instance.clone() }
    }
}

impl Drop for Module {
    fn drop(&mut self) {
        // SAFETY: this handle owns exactly one reference, released once here.
        unsafe { sys::iree_vm_module_release(self.ptr.as_ptr()) };
    }
}
