//! [`Instance`]: the IREE runtime instance (VM instance + HAL driver registry
//! holding every driver compiled into the linked runtime).

use std::ptr::{self, NonNull};

use iree_sys as sys;

use crate::device::Device;
use crate::error::{Result, check, string_from_view};

/// A HAL driver registered in the runtime (for example `local-task`, `cuda`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DriverInfo {
    /// Canonical name, the scheme of device URIs (`local-task`, `vulkan`, ...).
    pub name: String,
    /// Human-readable name.
    pub full_name: String,
}

/// An IREE runtime instance (`iree_runtime_instance_t`) with all HAL drivers
/// of the linked runtime registered.
///
/// `Clone` retains, `Drop` releases. Not `Send`/`Sync`: it wraps a raw IREE
/// pointer and this crate makes no thread-safety claims for it.
#[derive(Debug)]
pub struct Instance {
    ptr: NonNull<sys::iree_runtime_instance_t>,
}

impl Instance {
    /// Creates an instance using IREE's system allocator and registering every
    /// HAL driver available in the linked runtime (which drivers exist depends
    /// on how the runtime was built: `cargo xtask build-iree --target ...`).
    pub fn new() -> Result<Self> {
        let mut options = sys::iree_runtime_instance_options_t::default();
        // SAFETY: `options` is a valid, exclusively borrowed struct; both calls
        // only write into it (the second points it at the process-wide default
        // registry, which lives for the whole process).
        unsafe {
            sys::iree_runtime_instance_options_initialize(&mut options);
            sys::iree_runtime_instance_options_use_all_available_drivers(&mut options);
        }
        let mut raw = ptr::null_mut();
        // SAFETY: `options` is initialised; `raw` is a valid out-pointer.
        let status = unsafe { sys::iree_runtime_instance_create(&options, sys::allocator_system(), &mut raw) };
        check(status, || "creating IREE runtime instance".to_owned())?;
        let ptr = NonNull::new(raw)
            .ok_or_else(|| crate::Error::InvalidArgument("IREE returned a null runtime instance".to_owned()))?;
        Ok(Self { ptr })
    }

    /// The drivers registered in this runtime build.
    pub fn drivers(&self) -> Result<Vec<DriverInfo>> {
        let registry = self.driver_registry();
        if registry.is_null() {
            return Ok(Vec::new());
        }
        let allocator = self.host_allocator();
        let mut count: sys::iree_host_size_t = 0;
        let mut infos: *mut sys::iree_hal_driver_info_t = ptr::null_mut();
        // SAFETY: `registry` is the live registry of this instance; the out-
        // pointers are valid locals.
        let status = unsafe { sys::iree_hal_driver_registry_enumerate(registry, allocator, &mut count, &mut infos) };
        check(status, || "listing IREE HAL drivers".to_owned())?;
        let mut drivers = Vec::with_capacity(count);
        for i in 0..count {
            // SAFETY: enumerate returned `count` initialised entries at `infos`;
            // their string views point into the same allocation or static data.
            let info = unsafe { &*infos.add(i) };
            // SAFETY: as above, the views are valid until `infos` is freed.
            let (name, full_name) = unsafe { (string_from_view(info.driver_name), string_from_view(info.full_name)) };
            drivers.push(DriverInfo { name, full_name });
        }
        // SAFETY: `infos` was allocated by enumerate with `allocator` and is not
        // used after this point (null is accepted by iree_allocator_free).
        unsafe { sys::iree_allocator_free(allocator, infos.cast()) };
        Ok(drivers)
    }

    /// Names of the registered drivers (empty if listing fails).
    pub fn driver_names(&self) -> Vec<String> {
        self.drivers().map(|drivers| drivers.into_iter().map(|d| d.name).collect()).unwrap_or_default()
    }

    /// Creates a device from a URI such as `local-task`, `local-sync`, `cuda`,
    /// `vulkan`, `metal` (or `cuda://0`). Same as [`Device::new`].
    pub fn device(&self, uri: &str) -> Result<Device> {
        Device::new(self, uri)
    }

    /// The raw instance pointer, for use with `iree-sys`. Still owned by `self`.
    pub fn as_ptr(&self) -> *mut sys::iree_runtime_instance_t {
        self.ptr.as_ptr()
    }

    /// The host allocator the instance was created with.
    pub(crate) fn host_allocator(&self) -> sys::iree_allocator_t {
        // SAFETY: the instance is live for `&self`.
        unsafe { sys::iree_runtime_instance_host_allocator(self.ptr.as_ptr()) }
    }

    /// The VM instance (borrowed, owned by the runtime instance).
    pub(crate) fn vm_instance(&self) -> *mut sys::iree_vm_instance_t {
        // SAFETY: the instance is live for `&self`.
        unsafe { sys::iree_runtime_instance_vm_instance(self.ptr.as_ptr()) }
    }

    /// The HAL driver registry (borrowed; the process-wide default registry).
    pub(crate) fn driver_registry(&self) -> *mut sys::iree_hal_driver_registry_t {
        // SAFETY: the instance is live for `&self`.
        unsafe { sys::iree_runtime_instance_driver_registry(self.ptr.as_ptr()) }
    }
}

impl Clone for Instance {
    fn clone(&self) -> Self {
        // SAFETY: the instance is live; retaining adds the reference the new
        // handle releases on drop.
        unsafe { sys::iree_runtime_instance_retain(self.ptr.as_ptr()) };
        Self { ptr: self.ptr }
    }
}

impl Drop for Instance {
    fn drop(&mut self) {
        // SAFETY: this handle owns exactly one reference, released once here.
        unsafe { sys::iree_runtime_instance_release(self.ptr.as_ptr()) };
    }
}
