//! Hand-written function-pointer types for the IREE compiler embedding C API and the table
//! of them resolved from `libIREECompiler.so` at run time.
//!
//! The declarations mirror `iree/compiler/embedding_api.h` of IREE 3.13.0 (embedding API
//! version 1.4, as `ireeCompilerGetAPIVersion` of the pinned wheel `iree-base-compiler==3.13.0`
//! reports; `Compiler::load` accepts 1.x with x >= 4). Only the functions this crate calls are
//! declared, checked one by one against that header. C enums are passed as
//! `c_int`: every enum in that header has small non-negative values and is passed by value,
//! which the C ABIs we target pass exactly like an `int`.

use std::ffi::{c_char, c_int, c_void};
use std::path::{Path, PathBuf};

use libloading::Library;

use crate::error::Error;

/// `iree_compiler_error_t` (opaque).
#[repr(C)]
pub(crate) struct RawError {
    _opaque: [u8; 0],
}
/// `iree_compiler_session_t` (opaque).
#[repr(C)]
pub(crate) struct RawSession {
    _opaque: [u8; 0],
}
/// `iree_compiler_invocation_t` (opaque).
#[repr(C)]
pub(crate) struct RawInvocation {
    _opaque: [u8; 0],
}
/// `iree_compiler_source_t` (opaque).
#[repr(C)]
pub(crate) struct RawSource {
    _opaque: [u8; 0],
}
/// `iree_compiler_output_t` (opaque).
#[repr(C)]
pub(crate) struct RawOutput {
    _opaque: [u8; 0],
}

/// `enum iree_compiler_pipeline_t`: `IREE_COMPILER_PIPELINE_STD`.
pub(crate) const PIPELINE_STD: c_int = 0;

/// `enum iree_compiler_diagnostic_severity_t` values.
pub(crate) const SEVERITY_NOTE: c_int = 0;
pub(crate) const SEVERITY_WARNING: c_int = 1;
pub(crate) const SEVERITY_ERROR: c_int = 2;
pub(crate) const SEVERITY_REMARK: c_int = 3;

/// Diagnostic callback of `ireeCompilerInvocationEnableCallbackDiagnostics`:
/// `(severity, message, messageSize, userData)`; `message` is not NUL-terminated.
pub(crate) type DiagnosticCallback =
    unsafe extern "C" fn(severity: c_int, message: *const c_char, size: usize, user: *mut c_void);

/// Callback of `ireeCompilerEnumerateRegisteredHALTargetBackends`: `(backend, userData)`.
pub(crate) type BackendCallback = unsafe extern "C" fn(backend: *const c_char, user: *mut c_void);

// One type per function, named after the C function without the `ireeCompiler` prefix.
pub(crate) type GetApiVersionFn = unsafe extern "C" fn() -> c_int;
pub(crate) type GlobalInitializeFn = unsafe extern "C" fn();
pub(crate) type GetRevisionFn = unsafe extern "C" fn() -> *const c_char;
pub(crate) type EnumerateBackendsFn = unsafe extern "C" fn(callback: BackendCallback, user: *mut c_void);
pub(crate) type ErrorDestroyFn = unsafe extern "C" fn(error: *mut RawError);
pub(crate) type ErrorGetMessageFn = unsafe extern "C" fn(error: *mut RawError) -> *const c_char;
pub(crate) type SessionCreateFn = unsafe extern "C" fn() -> *mut RawSession;
pub(crate) type SessionDestroyFn = unsafe extern "C" fn(session: *mut RawSession);
pub(crate) type SessionSetFlagsFn =
    unsafe extern "C" fn(session: *mut RawSession, argc: c_int, argv: *const *const c_char) -> *mut RawError;
pub(crate) type InvocationCreateFn = unsafe extern "C" fn(session: *mut RawSession) -> *mut RawInvocation;
pub(crate) type InvocationDestroyFn = unsafe extern "C" fn(inv: *mut RawInvocation);
pub(crate) type InvocationEnableCallbackDiagnosticsFn =
    unsafe extern "C" fn(inv: *mut RawInvocation, flags: c_int, callback: DiagnosticCallback, user: *mut c_void);
pub(crate) type InvocationParseSourceFn = unsafe extern "C" fn(inv: *mut RawInvocation, source: *mut RawSource) -> bool;
pub(crate) type InvocationSetCompileToPhaseFn = unsafe extern "C" fn(inv: *mut RawInvocation, phase: *const c_char);
pub(crate) type InvocationSetCompileFromPhaseFn = unsafe extern "C" fn(inv: *mut RawInvocation, phase: *const c_char);
pub(crate) type InvocationRunPassPipelineFn =
    unsafe extern "C" fn(inv: *mut RawInvocation, text_pass_pipeline: *const c_char) -> bool;
pub(crate) type InvocationPipelineFn = unsafe extern "C" fn(inv: *mut RawInvocation, pipeline: c_int) -> bool;
pub(crate) type InvocationOutputFn =
    unsafe extern "C" fn(inv: *mut RawInvocation, output: *mut RawOutput) -> *mut RawError;
pub(crate) type SourceDestroyFn = unsafe extern "C" fn(source: *mut RawSource);
pub(crate) type SourceWrapBufferFn = unsafe extern "C" fn(
    session: *mut RawSession,
    buffer_name: *const c_char,
    buffer: *const c_char,
    length: usize,
    is_null_terminated: bool,
    out_source: *mut *mut RawSource,
) -> *mut RawError;
pub(crate) type OutputDestroyFn = unsafe extern "C" fn(output: *mut RawOutput);
pub(crate) type OutputOpenMembufferFn = unsafe extern "C" fn(out_output: *mut *mut RawOutput) -> *mut RawError;
pub(crate) type OutputMapMemoryFn =
    unsafe extern "C" fn(output: *mut RawOutput, contents: *mut *mut c_void, size: *mut u64) -> *mut RawError;

/// Oldest embedding API we accept: 1.4 has everything declared above
/// (`ireeCompilerGetRevision` is 1.1, `ireeCompilerInvocationRunPassPipeline` 1.4).
pub(crate) const MIN_API_VERSION: (u32, u32) = (1, 4);

/// The resolved function table. Lives for the rest of the process (leaked on purpose: the
/// compiler is never shut down or unloaded, see `crate::compiler`).
pub(crate) struct Api {
    /// Kept so the function pointers below stay valid; never dropped.
    _library: Library,
    pub(crate) path: PathBuf,
    pub(crate) get_api_version: GetApiVersionFn,
    pub(crate) global_initialize: GlobalInitializeFn,
    pub(crate) get_revision: GetRevisionFn,
    pub(crate) enumerate_backends: EnumerateBackendsFn,
    pub(crate) error_destroy: ErrorDestroyFn,
    pub(crate) error_get_message: ErrorGetMessageFn,
    pub(crate) session_create: SessionCreateFn,
    pub(crate) session_destroy: SessionDestroyFn,
    pub(crate) session_set_flags: SessionSetFlagsFn,
    pub(crate) invocation_create: InvocationCreateFn,
    pub(crate) invocation_destroy: InvocationDestroyFn,
    pub(crate) invocation_enable_callback_diagnostics: InvocationEnableCallbackDiagnosticsFn,
    pub(crate) invocation_parse_source: InvocationParseSourceFn,
    pub(crate) invocation_set_compile_to_phase: InvocationSetCompileToPhaseFn,
    pub(crate) invocation_set_compile_from_phase: InvocationSetCompileFromPhaseFn,
    pub(crate) invocation_run_pass_pipeline: InvocationRunPassPipelineFn,
    pub(crate) invocation_pipeline: InvocationPipelineFn,
    pub(crate) invocation_output_vm_bytecode: InvocationOutputFn,
    pub(crate) invocation_output_ir: InvocationOutputFn,
    pub(crate) source_destroy: SourceDestroyFn,
    pub(crate) source_wrap_buffer: SourceWrapBufferFn,
    pub(crate) output_destroy: OutputDestroyFn,
    pub(crate) output_open_membuffer: OutputOpenMembufferFn,
    pub(crate) output_map_memory: OutputMapMemoryFn,
}

impl std::fmt::Debug for Api {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Api").field("path", &self.path).finish_non_exhaustive()
    }
}

impl Api {
    /// Opens the library and resolves every symbol. Does not initialize the compiler.
    pub(crate) fn load(path: &Path) -> Result<Api, Error> {
        // SAFETY: loading runs the library's static initializers. libIREECompiler's are
        // LLVM/MLIR registrations with no preconditions on the host process; the file is the
        // one the caller (or the locate rules) named as the IREE compiler library.
        let library =
            unsafe { Library::new(path) }.map_err(|source| Error::LibraryLoad { path: path.to_path_buf(), source })?;

        /// Resolves one symbol as the function-pointer type `T` declared above.
        fn sym<T: Copy>(library: &Library, path: &Path, name: &'static str) -> Result<T, Error> {
            // SAFETY: each call site names `T` as the function-pointer type matching the C
            // declaration of `name` in embedding_api.h (see the type aliases above); the
            // pointer is used only while `library` is alive, which is forever (`Api` is leaked).
            let symbol = unsafe { library.get::<T>(name.as_bytes()) }.map_err(|source| Error::MissingSymbol {
                path: path.to_path_buf(),
                symbol: name,
                source,
            })?;
            Ok(*symbol)
        }

        let api = Api {
            get_api_version: sym(&library, path, "ireeCompilerGetAPIVersion")?,
            global_initialize: sym(&library, path, "ireeCompilerGlobalInitialize")?,
            get_revision: sym(&library, path, "ireeCompilerGetRevision")?,
            enumerate_backends: sym(&library, path, "ireeCompilerEnumerateRegisteredHALTargetBackends")?,
            error_destroy: sym(&library, path, "ireeCompilerErrorDestroy")?,
            error_get_message: sym(&library, path, "ireeCompilerErrorGetMessage")?,
            session_create: sym(&library, path, "ireeCompilerSessionCreate")?,
            session_destroy: sym(&library, path, "ireeCompilerSessionDestroy")?,
            session_set_flags: sym(&library, path, "ireeCompilerSessionSetFlags")?,
            invocation_create: sym(&library, path, "ireeCompilerInvocationCreate")?,
            invocation_destroy: sym(&library, path, "ireeCompilerInvocationDestroy")?,
            invocation_enable_callback_diagnostics: sym(
                &library,
                path,
                "ireeCompilerInvocationEnableCallbackDiagnostics",
            )?,
            invocation_parse_source: sym(&library, path, "ireeCompilerInvocationParseSource")?,
            invocation_set_compile_to_phase: sym(&library, path, "ireeCompilerInvocationSetCompileToPhase")?,
            invocation_set_compile_from_phase: sym(&library, path, "ireeCompilerInvocationSetCompileFromPhase")?,
            invocation_run_pass_pipeline: sym(&library, path, "ireeCompilerInvocationRunPassPipeline")?,
            invocation_pipeline: sym(&library, path, "ireeCompilerInvocationPipeline")?,
            invocation_output_vm_bytecode: sym(&library, path, "ireeCompilerInvocationOutputVMBytecode")?,
            invocation_output_ir: sym(&library, path, "ireeCompilerInvocationOutputIR")?,
            source_destroy: sym(&library, path, "ireeCompilerSourceDestroy")?,
            source_wrap_buffer: sym(&library, path, "ireeCompilerSourceWrapBuffer")?,
            output_destroy: sym(&library, path, "ireeCompilerOutputDestroy")?,
            output_open_membuffer: sym(&library, path, "ireeCompilerOutputOpenMembuffer")?,
            output_map_memory: sym(&library, path, "ireeCompilerOutputMapMemory")?,
            path: path.to_path_buf(),
            _library: library,
        };
        Ok(api)
    }
}

/// Splits the packed `ireeCompilerGetAPIVersion` value: major in the upper bits, minor in the
/// lower 16.
pub(crate) fn split_api_version(packed: c_int) -> (u32, u32) {
    let packed = packed as u32;
    (packed >> 16, packed & 0xffff)
}
