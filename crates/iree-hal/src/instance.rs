//! [`Instance`]: the IREE runtime instance (VM instance + HAL driver registry
//! holding every driver compiled into the linked runtime), one per process,
//! and the process's HAL drivers, each created once.

use std::ptr::{self, NonNull};
use std::sync::{Mutex, MutexGuard, PoisonError};

use iree_sys as sys;

use crate::device::Device;
use crate::error::{Result, StatusError, check, string_from_view, take_status};

/// A HAL driver registered in the runtime (for example `local-task`, `cuda`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DriverInfo {
    /// Canonical name, the scheme of device URIs (`local-task`, `vulkan`, ...).
    pub name: String,
    /// Human-readable name.
    pub full_name: String,
}

/// A handle to the process's IREE runtime instance (`iree_runtime_instance_t`)
/// with all HAL drivers of the linked runtime registered.
///
/// There is one runtime instance per process: [`Instance::new`] creates it on
/// first use and every later call, on any thread, returns another handle to
/// it. Likewise each HAL driver is created once per process and every
/// [`Device`] of that driver comes from it (for `local-task` that means all
/// its devices share one task executor, i.e. one pool of worker threads).
/// Devices, sessions and modules are still separate objects, so independent
/// stacks may run on separate threads at the same time.
///
/// Why: IREE keeps its VM type registrations (`iree_vm_list_registration`,
/// `iree_hal_buffer_view_registration`, ...) in process globals, and every
/// `iree_vm_instance_create` / `iree_hal_module_register_all_types` writes them
/// again; `iree_vm_instance_register_type` first stores 0 into the global and
/// then the type. Creating a runtime instance does that, and so does creating a
/// `local-sync`/`local-task` driver (its VMVX executable loader makes a VM
/// instance of its own). A call on another thread that reads a type in between
/// makes or checks a ref against 0: "ref is null", "ref type mismatch", or a
/// crash. With one runtime instance and one driver per process, made under one
/// lock before any call can run (the local drivers are made together with the
/// instance), no registration is ever written while a call runs. Code that
/// creates IREE instances or drivers through `iree-sys` directly reopens that
/// race.
///
/// `Clone` retains, `Drop` releases (the process keeps its own reference, so
/// the instance lives until exit). Not `Send`/`Sync`: like every handle of this
/// crate it stays on the thread that made it; call [`Instance::new`] on each
/// thread instead.
#[derive(Debug)]
pub struct Instance {
    ptr: NonNull<sys::iree_runtime_instance_t>,
}

impl Instance {
    /// A handle to the process's runtime instance, created on first use with
    /// IREE's system allocator and every HAL driver available in the linked
    /// runtime (which drivers exist depends on how the runtime was built:
    /// `cargo xtask build-iree --target ...`). Safe to call from any thread, at
    /// any time, also while other threads make calls.
    pub fn new() -> Result<Self> {
        let mut runtime = lock_runtime();
        let runtime = match &mut *runtime {
            Some(runtime) => runtime,
            None => runtime.insert(Runtime::create()?),
        };
        // SAFETY: the process reference held by `RUNTIME` keeps the instance
        // alive; retaining adds the reference this handle releases on drop
        // (IREE reference counts are atomic).
        unsafe { sys::iree_runtime_instance_retain(runtime.instance.as_ptr()) };
        Ok(Self { ptr: runtime.instance })
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

/// Drivers created together with the runtime instance, before any call can
/// run: creating them makes an `iree_vm_instance_t` (the VMVX executable
/// loader's), which rewrites the VM type registrations (see [`Instance`]).
const EAGER_DRIVERS: &[&str] = &["local-sync", "local-task"];

/// The process-wide IREE state: the runtime instance and the HAL drivers made
/// so far, each holding one reference that is never released.
struct Runtime {
    instance: NonNull<sys::iree_runtime_instance_t>,
    drivers: Vec<(String, NonNull<sys::iree_hal_driver_t>)>,
}

// SAFETY: IREE documents `iree_runtime_instance_t` (and the `iree_vm_instance_t`
// it owns), the driver registry and HAL drivers as thread-safe: their fields
// are fixed at creation, reference counts are atomic, the type table and the
// registry lock internally, and creating devices from one driver on several
// threads is what IREE's own multi-device tools do. Only the pointers cross
// threads here, always under the `RUNTIME` lock; each thread wraps them in
// its own (non-`Send`) handles.
unsafe impl Send for Runtime {}

/// Created by the first [`Instance::new`]; every IREE instance or driver of
/// this crate is created under this lock, exactly once per process.
static RUNTIME: Mutex<Option<Runtime>> = Mutex::new(None);

/// Locks [`RUNTIME`]. A poisoned lock only means a creation panicked; the
/// state is still consistent (pointers are stored only once fully created).
fn lock_runtime() -> MutexGuard<'static, Option<Runtime>> {
    RUNTIME.lock().unwrap_or_else(PoisonError::into_inner)
}

impl Runtime {
    /// Creates the runtime instance with every available driver registered,
    /// then the drivers of [`EAGER_DRIVERS`] this build has. Called once per
    /// process (see [`Instance`] for why never twice).
    fn create() -> Result<Self> {
        let mut options = sys::iree_runtime_instance_options_t::default();
        // SAFETY: `options` is a valid, exclusively borrowed struct; both calls
        // only write into it (the second points it at the process-wide default
        // registry, which lives for the whole process and locks internally).
        unsafe {
            sys::iree_runtime_instance_options_initialize(&mut options);
            sys::iree_runtime_instance_options_use_all_available_drivers(&mut options);
        }
        let mut raw = ptr::null_mut();
        // SAFETY: `options` is initialised; `raw` is a valid out-pointer.
        let status = unsafe { sys::iree_runtime_instance_create(&options, sys::allocator_system(), &mut raw) };
        check(status, || "creating IREE runtime instance".to_owned())?;
        let instance = NonNull::new(raw)
            .ok_or_else(|| crate::Error::InvalidArgument("IREE returned a null runtime instance".to_owned()))?;
        let mut runtime = Self { instance, drivers: Vec::new() };
        for name in EAGER_DRIVERS {
            // A driver this build lacks, or one that fails now, is left out:
            // creating a device for it later reports the error.
            let _ = runtime.driver(name);
        }
        Ok(runtime)
    }

    /// The driver for `name`, created on first use and kept for the process.
    fn driver(&mut self, name: &str) -> Result<NonNull<sys::iree_hal_driver_t>, StatusError> {
        if let Some((_, driver)) = self.drivers.iter().find(|(n, _)| n == name) {
            return Ok(*driver);
        }
        // SAFETY: the instance is live (held by `self`).
        let registry = unsafe { sys::iree_runtime_instance_driver_registry(self.instance.as_ptr()) };
        let mut raw = ptr::null_mut();
        // SAFETY: `registry` is the process-wide default registry; the name
        // view borrows `name` for the call only; `raw` is a valid out-pointer.
        let status = unsafe {
            sys::iree_hal_driver_registry_try_create(
                registry,
                sys::string_view(name),
                sys::allocator_system(),
                &mut raw,
            )
        };
        take_status(status)?;
        let driver = NonNull::new(raw).ok_or_else(|| StatusError {
            code: crate::StatusCode::Internal,
            message: format!("IREE returned a null driver for `{name}`"),
        })?;
        self.drivers.push((name.to_owned(), driver));
        Ok(driver)
    }
}

/// A retained HAL driver, released on drop.
pub(crate) struct Driver(NonNull<sys::iree_hal_driver_t>);

impl Driver {
    /// The process's driver for `name` (the scheme of a device URI), created
    /// on first use under the process lock.
    pub(crate) fn get(name: &str) -> Result<Self, StatusError> {
        let mut runtime = lock_runtime();
        let runtime = runtime.as_mut().ok_or_else(|| StatusError {
            code: crate::StatusCode::FailedPrecondition,
            message: "no IREE runtime instance exists yet (create an Instance first)".to_owned(),
        })?;
        let driver = runtime.driver(name)?;
        // SAFETY: the process reference in `RUNTIME` keeps the driver alive;
        // this adds the reference `Drop` releases.
        unsafe { sys::iree_hal_driver_retain(driver.as_ptr()) };
        Ok(Self(driver))
    }

    pub(crate) fn as_ptr(&self) -> *mut sys::iree_hal_driver_t {
        self.0.as_ptr()
    }
}

impl Drop for Driver {
    fn drop(&mut self) {
        // SAFETY: this handle owns exactly one reference, released once here.
        unsafe { sys::iree_hal_driver_release(self.0.as_ptr()) };
    }
}
