//! [`Session`]: a VM context bound to one device, holding the HAL module, an
//! optional `io_parameters` module and user modules; calls by function name
//! with buffer views in and out.

use std::ptr::{self, NonNull};

use iree_sys as sys;

use crate::buffer_view::BufferView;
use crate::device::Device;
use crate::error::{Error, Result, check, take_status};
use crate::instance::Instance;
use crate::module::Module;
use crate::parameters::Parameters;

/// A runtime session (`iree_runtime_session_t`) on one device.
///
/// Order of appending matters: IREE resolves a module's imports when it is
/// appended, so [`Session::append_parameters`] must come *before* any module
/// whose globals are bound to parameters.
///
/// `Clone` retains the same session, `Drop` releases; append modules before
/// cloning (each clone keeps its own list of appended modules, used for
/// function-name lookup and error messages). Not `Send`/`Sync`: it
/// wraps a raw IREE pointer and this crate makes no thread-safety claims for it.
#[derive(Debug)]
pub struct Session {
    ptr: NonNull<sys::iree_runtime_session_t>,
    device: Device,
    _instance: Instance,
    modules: Vec<Module>,
    has_parameters: bool,
}

impl Session {
    /// Creates a session on `device` with IREE's builtin modules (HAL).
    ///
    /// Give each session a device of its own ([`Instance::device`] again; cheap on
    /// `local-*`): IREE 3.13's CPU devices keep a reference to the frontier tracker of the
    /// session that took them and drop it, without releasing it, when a second session
    /// takes the same device (about 20 KB lost per extra session).
    pub fn new(instance: &Instance, device: &Device) -> Result<Self> {
        let mut options = sys::iree_runtime_session_options_t::default();
        // SAFETY: `options` is a valid, exclusively borrowed struct.
        unsafe { sys::iree_runtime_session_options_initialize(&mut options) };
        let mut raw = ptr::null_mut();
        // SAFETY: instance and device are live (the session retains both);
        // `options` is initialised; `raw` is a valid out-pointer.
        let status = unsafe {
            sys::iree_runtime_session_create_with_device(
                instance.as_ptr(),
                &options,
                device.as_ptr(),
                instance.host_allocator(),
                &mut raw,
            )
        };
        check(status, || format!("creating session on device `{}`", device.uri()))?;
        let ptr = NonNull::new(raw).ok_or_else(|| Error::InvalidArgument("IREE returned a null session".to_owned()))?;
        Ok(Self {
            ptr,
            device: device.clone(),
            _instance: instance.clone(),
            modules: Vec::new(),
            has_parameters: false,
        })
    }

    /// The session's device.
    pub fn device(&self) -> &Device {
        &self.device
    }

    /// Appends a module; its imports must already be satisfied by modules
    /// appended before it.
    pub fn append_module(&mut self, module: &Module) -> Result<()> {
        // SAFETY: session and module are live; the context retains the module.
        let status = unsafe { sys::iree_runtime_session_append_module(self.ptr.as_ptr(), module.as_ptr()) };
        take_status(status).map_err(|e| {
            let hint = if self.has_parameters {
                ""
            } else {
                " (if the module reads parameters, call append_parameters before appending it)"
            };
            e.with_context(format!("appending module `{}` to the session{hint}", module.name()))
        })?;
        self.modules.push(module.clone());
        Ok(())
    }

    /// Loads vmfb bytes ([`Module::from_bytes`]) and appends the module.
    pub fn load_vmfb(&mut self, vmfb: &[u8]) -> Result<Module> {
        let module = Module::from_bytes(&self._instance, vmfb)?;
        self.append_module(&module)?;
        Ok(module)
    }

    /// Loads a vmfb file ([`Module::from_file`]) and appends the module.
    pub fn load_vmfb_file(&mut self, path: impl AsRef<std::path::Path>) -> Result<Module> {
        let module = Module::from_file(&self._instance, path)?;
        self.append_module(&module)?;
        Ok(module)
    }

    /// Appends the `io_parameters` VM module serving `parameters` (one
    /// provider per scope). Call once, before appending modules that use them.
    /// The session keeps the indices alive.
    pub fn append_parameters(&mut self, parameters: &[&Parameters]) -> Result<()> {
        if self.has_parameters {
            return Err(Error::InvalidArgument(
                "the session already has an io_parameters module; pass all scopes in one append_parameters call"
                    .to_owned(),
            ));
        }
        for (i, p) in parameters.iter().enumerate() {
            if parameters[..i].iter().any(|q| q.scope() == p.scope()) {
                return Err(Error::InvalidArgument(format!("parameter scope `{}` given twice", p.scope())));
            }
        }
        let mut providers = Vec::with_capacity(parameters.len());
        let result = (|| {
            for p in parameters {
                providers.push(p.create_provider()?);
            }
            let mut module = ptr::null_mut();
            // SAFETY: the VM instance is live; `providers` holds live
            // providers (the module retains them); `module` is a valid
            // out-pointer.
            let status = unsafe {
                sys::iree_io_parameters_module_create(
                    self._instance.vm_instance(),
                    providers.len(),
                    providers.as_ptr(),
                    self._instance.host_allocator(),
                    &mut module,
                )
            };
            check(status, || "creating the io_parameters module".to_owned())?;
            // SAFETY: session and module are live; the context retains it.
            let status = unsafe { sys::iree_runtime_session_append_module(self.ptr.as_ptr(), module) };
            // SAFETY: we own the one reference from create; the context holds its own.
            unsafe { sys::iree_vm_module_release(module) };
            check(status, || "appending the io_parameters module to the session".to_owned())
        })();
        for provider in providers {
            // SAFETY: each provider reference was created above and is released once.
            unsafe { sys::iree_io_parameter_provider_release(provider) };
        }
        result?;
        self.has_parameters = true;
        Ok(())
    }

    /// Fully qualified names of the functions exported by the user modules.
    pub fn exported_functions(&self) -> Vec<String> {
        self.modules.iter().flat_map(Module::exported_functions).collect()
    }

    /// Looks up a function: a fully qualified `module.name`, or a bare `name`
    /// exported by exactly one appended module. Unknown names give
    /// [`Error::FunctionNotFound`] listing the exported functions.
    pub fn function(&self, name: &str) -> Result<Function<'_>> {
        let exported = self.exported_functions();
        let full_name = if name.contains('.') {
            name.to_owned()
        } else {
            let suffix = format!(".{name}");
            let mut matches = exported.iter().filter(|f| f.ends_with(&suffix));
            match (matches.next(), matches.next()) {
                (Some(only), None) => only.clone(),
                (Some(_), Some(_)) => {
                    return Err(Error::InvalidArgument(format!(
                        "function name `{name}` is ambiguous; use one of: {}",
                        exported.iter().filter(|f| f.ends_with(&suffix)).cloned().collect::<Vec<_>>().join(", ")
                    )));
                }
                (None, _) => {
                    return Err(Error::FunctionNotFound { name: name.to_owned(), available: exported });
                }
            }
        };
        let mut function = sys::iree_vm_function_t::default();
        // SAFETY: the session is live; the name view borrows `full_name` for
        // the call; `function` is a valid out-pointer.
        let status = unsafe {
            sys::iree_runtime_session_lookup_function(self.ptr.as_ptr(), sys::string_view(&full_name), &mut function)
        };
        match take_status(status) {
            Ok(()) => Ok(Function { session: self, function, name: full_name }),
            Err(e) if e.code == crate::StatusCode::NotFound => {
                Err(Error::FunctionNotFound { name: name.to_owned(), available: exported })
            }
            Err(e) => Err(e.with_context(format!("looking up function `{name}`"))),
        }
    }

    /// Calls function `name` (see [`Session::function`]) with `inputs` and
    /// returns its results. Synchronous: the results are ready on return.
    pub fn call(&self, name: &str, inputs: &[&BufferView]) -> Result<Vec<BufferView>> {
        self.function(name)?.call(inputs)
    }

    /// The raw session pointer, for use with `iree-sys`. Still owned by `self`.
    pub fn as_ptr(&self) -> *mut sys::iree_runtime_session_t {
        self.ptr.as_ptr()
    }
}

impl Clone for Session {
    fn clone(&self) -> Self {
        // SAFETY: the session is live; the new handle owns the added reference.
        unsafe { sys::iree_runtime_session_retain(self.ptr.as_ptr()) };
        Self {
            ptr: self.ptr,
            device: self.device.clone(),
            _instance: self._instance.clone(),
            modules: self.modules.clone(),
            has_parameters: self.has_parameters,
        }
    }
}

impl Drop for Session {
    fn drop(&mut self) {
        // SAFETY: this handle owns exactly one reference, released once here.
        unsafe { sys::iree_runtime_session_release(self.ptr.as_ptr()) };
    }
}

/// A function resolved in a session, for repeated calls without name lookup.
/// Borrows the session it came from.
#[derive(Debug)]
pub struct Function<'s> {
    session: &'s Session,
    function: sys::iree_vm_function_t,
    name: String,
}

impl Function<'_> {
    /// The fully qualified name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Calls the function with `inputs` (buffer views on the session's device)
    /// and returns its results. Synchronous.
    pub fn call(&self, inputs: &[&BufferView]) -> Result<Vec<BufferView>> {
        let mut call = CallGuard::new(self.session, self.function, &self.name)?;
        for (i, input) in inputs.iter().enumerate() {
            // SAFETY: the call is initialised; the list retains the view.
            let status = unsafe { sys::iree_runtime_call_inputs_push_back_buffer_view(&mut call.call, input.as_ptr()) };
            check(status, || format!("passing input {i} to `{}`", self.name))?;
        }
        // SAFETY: the call is initialised with its inputs; flags 0 = default.
        let status = unsafe { sys::iree_runtime_call_invoke(&mut call.call, 0) };
        check(status, || format!("calling `{}`", self.name))?;
        // SAFETY: the outputs list is owned by the live call.
        let count = unsafe { sys::iree_vm_list_size(sys::iree_runtime_call_outputs(&call.call)) };
        let mut outputs = Vec::with_capacity(count);
        for i in 0..count {
            let mut view = ptr::null_mut();
            // SAFETY: the call is live; ownership of the popped view moves to us.
            let status = unsafe { sys::iree_runtime_call_outputs_pop_front_buffer_view(&mut call.call, &mut view) };
            check(status, || format!("reading result {i} of `{}` (only tensor results are supported)", self.name))?;
            // SAFETY: pop_front transferred one reference to us; results live
            // on the session's device.
            outputs.push(unsafe { BufferView::from_owned(view, self.session.device.clone()) }?);
        }
        Ok(outputs)
    }
}

/// An initialised `iree_runtime_call_t`, deinitialised on drop (every path).
struct CallGuard {
    call: sys::iree_runtime_call_t,
}

impl CallGuard {
    fn new(session: &Session, function: sys::iree_vm_function_t, name: &str) -> Result<Self> {
        let mut call = sys::iree_runtime_call_t::default();
        // SAFETY: the session is live and `function` was resolved in it;
        // `call` is a valid out-pointer.
        let status = unsafe { sys::iree_runtime_call_initialize(session.as_ptr(), function, &mut call) };
        check(status, || format!("preparing call to `{name}`"))?;
        Ok(Self { call })
    }
}

impl Drop for CallGuard {
    fn drop(&mut self) {
        // SAFETY: the call was initialised in `new` and is deinitialised once.
        unsafe { sys::iree_runtime_call_deinitialize(&mut self.call) };
    }
}
