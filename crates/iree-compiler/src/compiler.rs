//! The process-global compiler handle and one compile, with every C object owned by a small
//! RAII wrapper so it is freed on every path.
//!
//! Lifetime rules (from embedding_api.h): the library is initialized once per process and
//! never shut down (a final `ireeCompilerGlobalShutdown` disables it for good), so it is also
//! never unloaded. A source must stay alive until its invocation is done, an invocation and
//! source must go before their session, and the diagnostic callback's user data must outlive
//! the invocation. The wrappers' borrows make the borrow checker enforce that order.
//!
//! Threads: `compile` may be called from any thread, and concurrent calls run at once. Each
//! session is its own MLIR context with its own flags (we never bind sessions to LLVM's
//! global command line, `ireeCompilerSetupGlobalCL`), and the library shares one thread pool
//! among sessions by design. That matters here: a compile of one of our modules keeps about
//! one core busy whatever the pool (docs/PERFORMANCE.md, "Compile time"), so a process that
//! loads several models, or a test binary, compiles them side by side only this way.
//! Except the first compile for each kind of target in the process, which runs alone
//! ([`FirstPerBackend`]): two first CPU compiles at once once failed with
//! "createTargetMachine(x86_64-unknown-unknown-eabi-elf) failed; machine may not be enabled
//! in LLVM" and a segfault (the backend registers its LLVM targets on first use, unlocked).
//! tests/concurrent.rs checks that concurrent compiles give the bytes a lone one does, and
//! first compiles started together in fresh processes.
//! Diagnostics may arrive on any compiler thread, so the collector is a mutex.

use std::ffi::{CStr, CString, c_char, c_int, c_void};
use std::marker::PhantomData;
use std::mem::Discriminant;
use std::path::Path;
use std::ptr::{self, NonNull};
use std::sync::{Mutex, PoisonError, RwLock, RwLockReadGuard, RwLockWriteGuard};

use crate::error::{Diagnostic, Diagnostics, Error, Severity};
use crate::ffi::{self, Api, RawError, RawInvocation, RawOutput, RawSession, RawSource};
use crate::locate::locate_library;
use crate::target::{CompileOptions, Target, compile_flags};
use crate::vmfb::check_vmfb;

/// Embedding API version reported by the loaded library.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct ApiVersion {
    pub major: u32,
    pub minor: u32,
}

impl std::fmt::Display for ApiVersion {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}.{}", self.major, self.minor)
    }
}

/// What a compile cache key records about the compiler: its build revision and embedding
/// API version. Known without the library once [`crate::CompileCache::remember`] stored it.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct CompilerIdentity {
    pub revision: String,
    pub api_version: ApiVersion,
}

/// The loaded, initialized library; leaked so it lives for the rest of the process.
#[derive(Debug)]
struct Loaded {
    api: Api,
    revision: String,
    api_version: ApiVersion,
    first_per_backend: FirstPerBackend,
}

/// Lets the first compile for each kind of target run alone, the others side by side (see the
/// module docs).
#[derive(Debug, Default)]
struct FirstPerBackend {
    done: Mutex<Vec<Discriminant<Target>>>,
    turn: RwLock<()>,
}

/// A compile's turn: shared, or alone as its backend's first.
enum Turn<'a> {
    Shared(#[expect(dead_code, reason = "held for its drop")] RwLockReadGuard<'a, ()>),
    First { gate: &'a FirstPerBackend, backend: Discriminant<Target>, _alone: RwLockWriteGuard<'a, ()> },
}

impl FirstPerBackend {
    fn enter(&self, target: &Target) -> Turn<'_> {
        let backend = std::mem::discriminant(target);
        if self.done.lock().unwrap_or_else(PoisonError::into_inner).contains(&backend) {
            Turn::Shared(self.turn.read().unwrap_or_else(PoisonError::into_inner))
        } else {
            let alone = self.turn.write().unwrap_or_else(PoisonError::into_inner);
            Turn::First { gate: self, backend, _alone: alone }
        }
    }
}

impl Drop for Turn<'_> {
    /// A first compile, whatever its outcome, has set its backend up: later ones may share.
    fn drop(&mut self) {
        if let Turn::First { gate, backend, .. } = self {
            let mut done = gate.done.lock().unwrap_or_else(PoisonError::into_inner);
            if !done.contains(backend) {
                done.push(*backend);
            }
        }
    }
}

/// The one library this process uses. A `Mutex` rather than a `OnceLock` so that a failed
/// load (library not installed yet) can be retried after the user fixes it.
static LOADED: Mutex<Option<&'static Loaded>> = Mutex::new(None);

/// Handle to the in-process IREE compiler. `Copy`: every handle refers to the same
/// process-global library.
#[derive(Debug, Clone, Copy)]
pub struct Compiler {
    loaded: &'static Loaded,
}

impl Compiler {
    /// Loads (first call) or returns the compiler, locating the library by `IREE_COMPILER_LIB`
    /// or the workspace venv (`cargo xtask setup`).
    pub fn new() -> Result<Compiler, Error> {
        Compiler::load(None)
    }

    /// Loads the compiler from `path` (or the located library when `None`). The library is
    /// process-global: once one is loaded, asking for a different file is an error, while
    /// `None` returns the loaded one.
    pub fn load(path: Option<&Path>) -> Result<Compiler, Error> {
        let mut slot = LOADED.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(loaded) = *slot {
            if let Some(requested) = path
                && !same_file(requested, &loaded.api.path)
            {
                return Err(Error::AlreadyLoaded {
                    loaded: loaded.api.path.clone(),
                    requested: requested.to_path_buf(),
                });
            }
            return Ok(Compiler { loaded });
        }
        let path = locate_library(path)?;
        let api = Api::load(&path)?;

        // SAFETY: `ireeCompilerGetAPIVersion` takes no arguments and only returns a constant;
        // it may be called before global initialization.
        let (major, minor) = ffi::split_api_version(unsafe { (api.get_api_version)() });
        if major != ffi::MIN_API_VERSION.0 || minor < ffi::MIN_API_VERSION.1 {
            return Err(Error::UnsupportedApiVersion { path, found: (major, minor), required: ffi::MIN_API_VERSION });
        }
        // LLVM may install its signal handlers here (signals.rs).
        let signals = crate::signals::Guard::enter();
        // SAFETY: called exactly once per process: `LOADED` is locked and still empty, and
        // once filled it is never emptied, so this is never repeated or balanced by a
        // shutdown (which would disable the compiler for the rest of the process).
        unsafe { (api.global_initialize)() };
        drop(signals);
        // SAFETY: the compiler is initialized; the returned string stays valid while it is,
        // i.e. forever, and is copied at once. Null is handled.
        let revision = unsafe { c_str_to_string((api.get_revision)()) };

        let loaded: &'static Loaded = Box::leak(Box::new(Loaded {
            api,
            revision,
            api_version: ApiVersion { major, minor },
            first_per_backend: FirstPerBackend::default(),
        }));
        *slot = Some(loaded);
        Ok(Compiler { loaded })
    }

    /// The compiler this process has already loaded, if any; never loads one.
    pub fn loaded() -> Option<Compiler> {
        let slot = LOADED.lock().unwrap_or_else(PoisonError::into_inner);
        slot.map(|loaded| Compiler { loaded })
    }

    /// What identifies this compiler in cache keys: revision and API version.
    pub fn identity(&self) -> CompilerIdentity {
        CompilerIdentity { revision: self.revision().to_owned(), api_version: self.api_version() }
    }

    /// The library file this process loaded.
    pub fn library_path(&self) -> &'static Path {
        &self.loaded.api.path
    }

    /// Build revision (`ireeCompilerGetRevision`), e.g. `3.13.0rc20261016`.
    pub fn revision(&self) -> &'static str {
        &self.loaded.revision
    }

    /// Embedding API version (`ireeCompilerGetAPIVersion`).
    pub fn api_version(&self) -> ApiVersion {
        self.loaded.api_version
    }

    /// HAL target backends linked into the compiler (e.g. `llvm-cpu`, `cuda`, `metal-spirv`).
    pub fn target_backends(&self) -> Vec<String> {
        unsafe extern "C" fn push(backend: *const c_char, user: *mut c_void) {
            // SAFETY: `user` is the `&mut Vec<String>` passed below, alive and exclusively ours
            // for the synchronous enumeration; `backend` is a NUL-terminated string or null.
            unsafe {
                let out = &mut *user.cast::<Vec<String>>();
                out.push(c_str_to_string(backend));
            }
        }
        let mut out: Vec<String> = Vec::new();
        // SAFETY: the compiler is initialized; the callback matches the declared signature and
        // is only invoked during this call, while `out` is borrowed.
        unsafe { (self.loaded.api.enumerate_backends)(push, (&raw mut out).cast()) };
        out
    }

    /// Compiles MLIR text to a vmfb for `target`. With [`CompileOptions::parameter_encoder`]
    /// the encoder module is dropped: use [`Compiler::compile_split`] to keep it.
    pub fn compile(&self, mlir_text: &str, target: &Target, opts: &CompileOptions) -> Result<Vec<u8>, Error> {
        Ok(self.compile_split(mlir_text, target, opts)?.0)
    }

    /// Compiles MLIR text to a vmfb for `target` and, with
    /// [`CompileOptions::parameter_encoder`], its parameter encoder module too (compiled
    /// for the same target with the same extra flags; `None` when the compiler wrote none).
    /// The encoder follows the protocol of IREE's `iree-encode-parameters`; run it once
    /// (`iree_hal::encode_parameters`) and bind what it writes as scope
    /// [`crate::ENCODED_SCOPE`].
    pub fn compile_split(
        &self,
        mlir_text: &str,
        target: &Target,
        opts: &CompileOptions,
    ) -> Result<(Vec<u8>, Option<Vec<u8>>), Error> {
        if !opts.parameter_encoder {
            let bytes = self.run(mlir_text, target, opts, Emit::Vmfb, None)?;
            check_vmfb(&bytes)?;
            return Ok((bytes, None));
        }
        let dir = tempfile::Builder::new()
            .prefix("mlx-iree-encoder-")
            .tempdir()
            .map_err(|source| Error::CacheIo { path: std::env::temp_dir(), source })?;
        let encoder_path = dir.path().join("encoder.mlir");
        let bytes = self.run(mlir_text, target, opts, Emit::Vmfb, Some(&encoder_path))?;
        check_vmfb(&bytes)?;
        let encoder_mlir = match std::fs::read_to_string(&encoder_path) {
            Ok(text) => text,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok((bytes, None)),
            Err(source) => return Err(Error::CacheIo { path: encoder_path, source }),
        };
        // The encoder is already in IREE's own dialects; it is compiled for the same target.
        let encoder_opts = CompileOptions {
            input_type: crate::InputType::Auto,
            extra_flags: opts.extra_flags.clone(),
            parameter_encoder: false,
        };
        let encoder = self.run(&encoder_mlir, target, &encoder_opts, Emit::Vmfb, None)?;
        check_vmfb(&encoder)?;
        Ok((bytes, Some(encoder)))
    }

    /// Runs the pipeline up to `phase` (e.g. `"input"`, `"global-optimization"`, `"flow"`,
    /// `"stream"`, `"executable-sources"`, `"hal"`, `"vm"`) and returns the IR as text; useful
    /// to count dispatches (`flow.dispatch` ops at phase `"flow"`).
    pub fn compile_to_ir(
        &self,
        mlir_text: &str,
        target: &Target,
        opts: &CompileOptions,
        phase: &str,
    ) -> Result<String, Error> {
        let bytes = self.run(mlir_text, target, opts, Emit::Ir { phase }, None)?;
        String::from_utf8(bytes).map_err(|e| Error::Api {
            call: "ireeCompilerInvocationOutputIR",
            message: format!("IR output is not UTF-8: {e}"),
        })
    }

    /// Runs one compile; `encoder_out`: where the compiler writes the split-out parameter
    /// encoder's MLIR (with [`CompileOptions::parameter_encoder`]).
    fn run(
        &self,
        mlir_text: &str,
        target: &Target,
        opts: &CompileOptions,
        emit: Emit<'_>,
        encoder_out: Option<&Path>,
    ) -> Result<Vec<u8>, Error> {
        target.validate()?;
        let mut flags = compile_flags(target, opts);
        if let Some(path) = encoder_out {
            let path = path
                .to_str()
                .ok_or_else(|| Error::InvalidInput(format!("encoder output path {} is not UTF-8", path.display())))?;
            flags.push(format!("--iree-parameter-encoder-output-file={path}"));
        }
        let phase = match emit {
            Emit::Ir { phase } => Some(c_string("compile phase", phase)?),
            Emit::Vmfb => None,
        };
        let api = &self.loaded.api;
        // Both dropped after everything below (declared first).
        let _turn = self.loaded.first_per_backend.enter(target);
        let _signals = crate::signals::Guard::enter();

        // Declaration order = reverse drop order: output, invocation, source, session go in
        // that order; the sink outlives the invocation that reports into it.
        let session = Session::new(api)?;
        session.set_flags(&flags)?;
        let source = Source::wrap(&session, "input.mlir", mlir_text)?;
        let sink = DiagnosticSink::default();
        let invocation = Invocation::new(&session, &sink)?;
        if let Some(phase) = &phase {
            invocation.set_compile_to_phase(phase);
        }
        if !invocation.parse(&source) {
            return Err(Error::Parse { diagnostics: sink.take() });
        }
        if encoder_out.is_some() {
            // Up to global optimization, where data tiling has hoisted each parameter's
            // repacking into a global of its own per function using it; then one global per
            // distinct repacking, so the encoder split out later writes each once.
            let phase = c_string("compile phase", SHARE_PREPARED_PHASE)?;
            invocation.set_compile_to_phase(&phase);
            if !invocation.pipeline_std() {
                return Err(Error::Compile { flags, diagnostics: sink.take() });
            }
            if !invocation.run_pass_pipeline(&c_string("pass pipeline", SHARE_PREPARED_PIPELINE)?) {
                return Err(Error::Compile { flags, diagnostics: sink.take() });
            }
            invocation.set_compile_from_phase(&phase);
            invocation.set_compile_to_phase(&c_string("compile phase", "end")?);
        }
        if !invocation.pipeline_std() {
            return Err(Error::Compile { flags, diagnostics: sink.take() });
        }
        let output = Output::membuffer(api)?;
        let written = match emit {
            Emit::Vmfb => invocation.output_vm_bytecode(&output),
            Emit::Ir { .. } => invocation.output_ir(&output),
        };
        if let Err(err) = written {
            let diagnostics = sink.take();
            return Err(if diagnostics.0.is_empty() { err } else { Error::Compile { flags, diagnostics } });
        }
        output.to_vec()
    }
}

/// The phase after which [`SHARE_PREPARED_PIPELINE`] runs in a compile with the parameter
/// encoder split out.
const SHARE_PREPARED_PHASE: &str = "global-optimization";

/// Makes every function that uses one parameter in one prepared (repacked) form read one
/// global: data tiling hoists the repacking of a constant parameter into a global per
/// function that uses it (six per weight for a model's six prefill and decode functions);
/// the stream pipeline would fuse them later, but the parameter encoder is split out before
/// that and would write every copy (six times the weights on disk, measured). Combining the
/// initializers and CSE make the copies one value, which fusing and folding the globals then
/// turn into one global. Passes run on the module itself (no `builtin.module(...)` anchor: the
/// embedding API nests an anchored pipeline one module deeper, where it does nothing). Part of
/// the cache key of split compiles.
pub(crate) const SHARE_PREPARED_PIPELINE: &str = "iree-util-combine-initializers,\
    util.initializer(cse,canonicalize),iree-util-fuse-globals,iree-util-fold-globals,iree-util-fuse-globals";

#[derive(Debug, Clone, Copy)]
enum Emit<'a> {
    Vmfb,
    Ir { phase: &'a str },
}

/// Compares paths by identity where possible (symlinks, `..`), else textually.
fn same_file(a: &Path, b: &Path) -> bool {
    match (a.canonicalize(), b.canonicalize()) {
        (Ok(a), Ok(b)) => a == b,
        _ => a == b,
    }
}

fn c_string(what: &str, s: &str) -> Result<CString, Error> {
    CString::new(s).map_err(|_| Error::InvalidInput(format!("{what} contains a NUL byte: {s:?}")))
}

/// Copies a NUL-terminated C string (null gives "").
///
/// # Safety
/// `p` is null or points to a NUL-terminated string valid for the duration of the call.
unsafe fn c_str_to_string(p: *const c_char) -> String {
    if p.is_null() {
        return String::new();
    }
    // SAFETY: non-null and NUL-terminated per this function's contract.
    unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned()
}

/// Converts a returned `iree_compiler_error_t*` into `Err` (destroying it), null into `Ok`.
fn check(api: &Api, call: &'static str, raw: *mut RawError) -> Result<(), Error> {
    if raw.is_null() {
        return Ok(());
    }
    // SAFETY: `raw` is a non-null error just returned by the library and owned by us; its
    // message is valid until it is destroyed, which happens right after copying it.
    let message = unsafe {
        let message = c_str_to_string((api.error_get_message)(raw));
        (api.error_destroy)(raw);
        message
    };
    Err(Error::Api { call, message })
}

/// `iree_compiler_session_t`, destroyed on drop.
struct Session<'a> {
    api: &'a Api,
    raw: NonNull<RawSession>,
}

impl<'a> Session<'a> {
    fn new(api: &'a Api) -> Result<Session<'a>, Error> {
        // SAFETY: the compiler is globally initialized (a `Loaded` exists).
        let raw = unsafe { (api.session_create)() };
        let raw = NonNull::new(raw)
            .ok_or(Error::Api { call: "ireeCompilerSessionCreate", message: "returned null".to_owned() })?;
        Ok(Session { api, raw })
    }

    /// Applies session flags; the compiler's own message for a bad flag comes back as
    /// `Error::InvalidFlags`.
    fn set_flags(&self, flags: &[String]) -> Result<(), Error> {
        let owned = flags.iter().map(|f| c_string("compiler flag", f)).collect::<Result<Vec<CString>, Error>>()?;
        let argv: Vec<*const c_char> = owned.iter().map(|f| f.as_ptr()).collect();
        let argc = c_int::try_from(argv.len())
            .map_err(|_| Error::InvalidInput(format!("{} compiler flags are too many", argv.len())))?;
        // SAFETY: live session; `argv` holds `argc` pointers to NUL-terminated strings that
        // `owned` keeps alive across the call (the library copies what it keeps).
        let raw = unsafe { (self.api.session_set_flags)(self.raw.as_ptr(), argc, argv.as_ptr()) };
        check(self.api, "ireeCompilerSessionSetFlags", raw).map_err(|e| match e {
            Error::Api { message, .. } => Error::InvalidFlags { flags: flags.to_vec(), message },
            other => other,
        })
    }
}

impl Drop for Session<'_> {
    fn drop(&mut self) {
        // SAFETY: we own the session; every object borrowing it (sources, invocations) has
        // already been dropped, as their lifetimes end before ours.
        unsafe { (self.api.session_destroy)(self.raw.as_ptr()) };
    }
}

/// `iree_compiler_source_t` over an owned, NUL-terminated copy of the text.
struct Source<'a> {
    api: &'a Api,
    raw: NonNull<RawSource>,
    /// The wrapped bytes; must outlive `raw`. Fields drop after `Drop::drop` has destroyed it.
    _buffer: Vec<u8>,
    _session: PhantomData<&'a Session<'a>>,
}

impl<'a> Source<'a> {
    fn wrap(session: &'a Session<'a>, name: &str, text: &str) -> Result<Source<'a>, Error> {
        if let Some(at) = text.bytes().position(|b| b == 0) {
            return Err(Error::InvalidInput(format!("MLIR text contains a NUL byte at offset {at}")));
        }
        let name = c_string("buffer name", name)?;
        let mut buffer = Vec::with_capacity(text.len() + 1);
        buffer.extend_from_slice(text.as_bytes());
        buffer.push(0);
        let mut raw: *mut RawSource = ptr::null_mut();
        // SAFETY: live session; `buffer` is NUL-terminated and its length includes the NUL
        // as the API requires for text; it is kept in the returned `Source` (a Vec's heap
        // block does not move when the Vec does) until after the source is destroyed.
        let err = unsafe {
            (session.api.source_wrap_buffer)(
                session.raw.as_ptr(),
                name.as_ptr(),
                buffer.as_ptr().cast(),
                buffer.len(),
                true,
                &raw mut raw,
            )
        };
        check(session.api, "ireeCompilerSourceWrapBuffer", err)?;
        let raw = NonNull::new(raw)
            .ok_or(Error::Api { call: "ireeCompilerSourceWrapBuffer", message: "returned no source".to_owned() })?;
        Ok(Source { api: session.api, raw, _buffer: buffer, _session: PhantomData })
    }
}

impl Drop for Source<'_> {
    fn drop(&mut self) {
        // SAFETY: we own the source; the invocation that parsed it borrowed it and is gone.
        unsafe { (self.api.source_destroy)(self.raw.as_ptr()) };
    }
}

/// Collects diagnostics from the callback (which may run on any compiler thread).
#[derive(Default)]
struct DiagnosticSink {
    diagnostics: Mutex<Vec<Diagnostic>>,
}

impl DiagnosticSink {
    fn take(&self) -> Diagnostics {
        Diagnostics(std::mem::take(&mut *self.diagnostics.lock().unwrap_or_else(PoisonError::into_inner)))
    }
}

/// The diagnostic callback. Makes no compiler calls, as the API requires.
unsafe extern "C" fn on_diagnostic(severity: c_int, message: *const c_char, size: usize, user: *mut c_void) {
    // SAFETY: `user` is the `&DiagnosticSink` registered with the invocation, which outlives
    // it (enforced by `Invocation`'s lifetime); only shared access is taken.
    let sink = unsafe { &*user.cast::<DiagnosticSink>() };
    let bytes: &[u8] = if message.is_null() || size == 0 {
        &[]
    } else {
        // SAFETY: the API passes `size` valid bytes at `message` for the callback's duration.
        unsafe { std::slice::from_raw_parts(message.cast::<u8>(), size) }
    };
    let severity = match severity {
        ffi::SEVERITY_NOTE => Severity::Note,
        ffi::SEVERITY_WARNING => Severity::Warning,
        ffi::SEVERITY_REMARK => Severity::Remark,
        ffi::SEVERITY_ERROR => Severity::Error,
        _ => Severity::Error,
    };
    let message = String::from_utf8_lossy(bytes).into_owned();
    sink.diagnostics.lock().unwrap_or_else(PoisonError::into_inner).push(Diagnostic { severity, message });
}

/// `iree_compiler_invocation_t`, destroyed on drop. `'a` covers the session, the diagnostic
/// sink and the parsed source, which all must outlive it.
struct Invocation<'a> {
    api: &'a Api,
    raw: NonNull<RawInvocation>,
    _borrows: PhantomData<&'a ()>,
}

impl<'a> Invocation<'a> {
    fn new(session: &'a Session<'a>, sink: &'a DiagnosticSink) -> Result<Invocation<'a>, Error> {
        // SAFETY: live session.
        let raw = unsafe { (session.api.invocation_create)(session.raw.as_ptr()) };
        let raw = NonNull::new(raw)
            .ok_or(Error::Api { call: "ireeCompilerInvocationCreate", message: "returned null".to_owned() })?;
        let invocation = Invocation { api: session.api, raw, _borrows: PhantomData };
        // SAFETY: live invocation; flags must be 0; `on_diagnostic` matches the callback type
        // and `sink` outlives the invocation ('a), so the user pointer stays valid for every
        // callback until destruction.
        unsafe {
            (session.api.invocation_enable_callback_diagnostics)(
                invocation.raw.as_ptr(),
                0,
                on_diagnostic,
                ptr::from_ref(sink).cast_mut().cast(),
            );
        }
        Ok(invocation)
    }

    fn set_compile_to_phase(&self, phase: &CStr) {
        // SAFETY: live invocation; `phase` is NUL-terminated (the library copies it).
        unsafe { (self.api.invocation_set_compile_to_phase)(self.raw.as_ptr(), phase.as_ptr()) };
    }

    fn set_compile_from_phase(&self, phase: &CStr) {
        // SAFETY: live invocation; `phase` is NUL-terminated (the library copies it).
        unsafe { (self.api.invocation_set_compile_from_phase)(self.raw.as_ptr(), phase.as_ptr()) };
    }

    fn run_pass_pipeline(&self, pipeline: &CStr) -> bool {
        // SAFETY: live invocation holding a parsed module; `pipeline` is NUL-terminated.
        unsafe { (self.api.invocation_run_pass_pipeline)(self.raw.as_ptr(), pipeline.as_ptr()) }
    }

    fn parse(&self, source: &'a Source<'a>) -> bool {
        // SAFETY: live invocation and source from the same session; `source` outlives the
        // invocation ('a) as the API requires.
        unsafe { (self.api.invocation_parse_source)(self.raw.as_ptr(), source.raw.as_ptr()) }
    }

    fn pipeline_std(&self) -> bool {
        // SAFETY: live invocation holding a parsed module.
        unsafe { (self.api.invocation_pipeline)(self.raw.as_ptr(), ffi::PIPELINE_STD) }
    }

    fn output_vm_bytecode(&self, output: &Output<'_>) -> Result<(), Error> {
        // SAFETY: live invocation after the full pipeline (VM IR); live output.
        let err = unsafe { (self.api.invocation_output_vm_bytecode)(self.raw.as_ptr(), output.raw.as_ptr()) };
        check(self.api, "ireeCompilerInvocationOutputVMBytecode", err)
    }

    fn output_ir(&self, output: &Output<'_>) -> Result<(), Error> {
        // SAFETY: live invocation and output.
        let err = unsafe { (self.api.invocation_output_ir)(self.raw.as_ptr(), output.raw.as_ptr()) };
        check(self.api, "ireeCompilerInvocationOutputIR", err)
    }
}

impl Drop for Invocation<'_> {
    fn drop(&mut self) {
        // SAFETY: we own the invocation; its session, source and sink are still alive ('a).
        unsafe { (self.api.invocation_destroy)(self.raw.as_ptr()) };
    }
}

/// In-memory `iree_compiler_output_t`, destroyed on drop.
struct Output<'a> {
    api: &'a Api,
    raw: NonNull<RawOutput>,
}

impl<'a> Output<'a> {
    fn membuffer(api: &'a Api) -> Result<Output<'a>, Error> {
        let mut raw: *mut RawOutput = ptr::null_mut();
        // SAFETY: out-pointer to a local; the compiler is initialized.
        let err = unsafe { (api.output_open_membuffer)(&raw mut raw) };
        check(api, "ireeCompilerOutputOpenMembuffer", err)?;
        let raw = NonNull::new(raw)
            .ok_or(Error::Api { call: "ireeCompilerOutputOpenMembuffer", message: "returned no output".to_owned() })?;
        Ok(Output { api, raw })
    }

    /// Copies out everything written so far.
    fn to_vec(&self) -> Result<Vec<u8>, Error> {
        let mut contents: *mut c_void = ptr::null_mut();
        let mut size: u64 = 0;
        // SAFETY: live membuffer output; out-pointers to locals.
        let err = unsafe { (self.api.output_map_memory)(self.raw.as_ptr(), &raw mut contents, &raw mut size) };
        check(self.api, "ireeCompilerOutputMapMemory", err)?;
        let len = usize::try_from(size).map_err(|_| Error::Api {
            call: "ireeCompilerOutputMapMemory",
            message: format!("{size} bytes do not fit in memory"),
        })?;
        if len == 0 {
            return Ok(Vec::new());
        }
        if contents.is_null() {
            return Err(Error::Api { call: "ireeCompilerOutputMapMemory", message: "null contents".to_owned() });
        }
        // SAFETY: the mapping holds `len` readable bytes while the output lives (it does for
        // this whole call); they are copied before returning.
        Ok(unsafe { std::slice::from_raw_parts(contents.cast::<u8>(), len) }.to_vec())
    }
}

impl Drop for Output<'_> {
    fn drop(&mut self) {
        // SAFETY: we own the output and no mapping of it escapes `to_vec`.
        unsafe { (self.api.output_destroy)(self.raw.as_ptr()) };
    }
}
