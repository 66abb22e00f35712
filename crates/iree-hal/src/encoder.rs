//! [`encode_parameters`]: runs a parameter encoder module (the module IREE's compiler writes
//! with `--iree-parameter-encoder-output-file`) once, writing the parameters a compiled
//! module reads, already in their final (for example data-tiled) layout, into a new
//! parameter archive (`.irpa`). The main module compiled beside it then loads those
//! parameters as they are, instead of repacking its inputs in an initializer at every load.
//!
//! The calling protocol is that of IREE's `iree-encode-parameters` tool
//! (`tools/iree-encode-parameters-main.c`, IREE 3.13): the encoder's exported functions carry
//! reflection attributes `iree.encode.function` (`indices`, `steps`, `encode`,
//! `detect_target`) and `iree.encode.target`; `indices()` returns, per output scope,
//! `[scope, [entry...]]` with an entry `[1, key, metadata, length, alignment]` (data) or
//! `[0, key, metadata, length, pattern, pattern_length]` (splat); an archive is laid out from
//! those entries and served as the output scope; `steps()` (optional) returns a list that
//! `encode(steps, wait_fence, signal_fence)` takes, which reads the input scopes and scatters
//! its results into the output scope.

use std::path::Path;
use std::ptr;

use iree_sys as sys;

use crate::device::Device;
use crate::error::{Error, Result, check, string_from_view};
use crate::instance::Instance;
use crate::module::Module;
use crate::parameters::Parameters;
use crate::session::Session;

/// What [`encode_parameters`] wrote.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EncodeReport {
    /// The scope the main module reads the encoded parameters from (the compiler's
    /// `--iree-parameter-encoder-output-scope`, `encoded` by default).
    pub scope: String,
    /// Names and byte lengths of the parameters written, in archive order.
    pub entries: Vec<(String, u64)>,
    /// Size of the archive file.
    pub file_bytes: u64,
}

/// Runs the parameter encoder module `encoder` (vmfb bytes) on a device made from `device`'s
/// URI (a new one, so the caller's stays free for one session of its own): it reads the
/// parameters of `inputs` (the scopes the main module was compiled to read, usually
/// `model`) and writes what the main module reads into a new parameter archive at `output`
/// (created or truncated), served to the main module under [`EncodeReport::scope`]. On
/// return the archive is complete and flushed to disk; on error `output` may hold a partial
/// file, so write to a temporary name and rename it once this succeeds.
///
/// The encoder's first target is used (IREE's tool does the same without `--target`); an
/// encoder writing more than one output scope is refused (one archive holds one scope).
pub fn encode_parameters(
    instance: &Instance,
    device: &Device,
    encoder: &[u8],
    inputs: &[&Parameters],
    output: &Path,
) -> Result<EncodeReport> {
    let module = Module::from_bytes(instance, encoder)?;
    let target = EncoderTarget::discover(&module)?;
    let scope = match target.scopes.as_slice() {
        [one] => one.clone(),
        other => {
            return Err(Error::Encoder(format!(
                "encoder target `{}` writes {} output scopes ({}); exactly one is supported",
                target.name,
                other.len(),
                other.join(", ")
            )));
        }
    };
    if let Some(clash) = inputs.iter().find(|p| p.scope() == scope) {
        return Err(Error::Encoder(format!("input scope `{}` is also the encoder's output scope", clash.scope())));
    }

    // The output scope starts empty: the archive's entries are added to it once `indices()`
    // has said what they are, before `encode` runs (providers look entries up per call).
    let out = Parameters::new(&scope)?;
    // A device of its own for the encoder's session: IREE 3.13 leaks the first session's
    // frontier tracker when a second session takes the same device (see [`Session::new`]),
    // and the caller's device usually goes on to serve the main module.
    let device = &instance.device(device.uri())?;
    let mut session = Session::new(instance, device)?;
    let mut scopes: Vec<&Parameters> = inputs.to_vec();
    scopes.push(&out);
    session.append_parameters(&scopes)?;
    session.append_module(&module)?;
    // SAFETY: the session is live; the context pointer is borrowed for its lifetime.
    let context = unsafe { sys::iree_runtime_session_context(session.as_ptr()) };
    let invoke = |function: &sys::iree_vm_function_t, inputs: Option<&VmList>, what: &str| -> Result<VmList> {
        let outputs = VmList::new(1)?;
        // SAFETY: context and function are live (the module is in the context); the lists
        // are live or null; the call is synchronous.
        let status = unsafe {
            sys::iree_vm_invoke(
                context,
                *function,
                sys::IREE_VM_INVOCATION_FLAG_NONE as sys::iree_vm_invocation_flags_t,
                ptr::null(),
                inputs.map_or(ptr::null_mut(), |l| l.ptr),
                outputs.ptr,
                sys::allocator_system(),
            )
        };
        check(status, || format!("calling the encoder's `{what}` function"))?;
        Ok(outputs)
    };

    let indices = invoke(&target.indices, None, "indices")?.list_at(0, "indices() result")?;
    let entries = parse_indices(&indices, &scope)?;
    let mut builder = ArchiveBuilder::new()?;
    for entry in &entries {
        builder.add(entry)?;
    }
    let file_bytes = builder.total_size();
    let archive = builder.create_file(output, &out)?;

    let steps = match &target.steps {
        Some(steps) => Some(invoke(steps, None, "steps")?.list_at(0, "steps() result")?),
        None => None,
    };
    let args = VmList::new(3)?;
    args.push_list(steps.as_ref())?;
    let signal = if target.coarse_fences {
        let fence = Fence::signal_on(device)?;
        args.push_fence(None)?;
        args.push_fence(Some(&fence))?;
        Some(fence)
    } else {
        None
    };
    invoke(&target.encode, Some(&args), "encode")?;
    if let Some(fence) = &signal {
        fence.wait()?;
    }
    drop(session);
    drop(archive);
    drop(out);
    let file = std::fs::File::open(output).map_err(|source| Error::Write { path: output.to_owned(), source })?;
    file.sync_all().map_err(|source| Error::Write { path: output.to_owned(), source })?;
    Ok(EncodeReport { scope, entries: entries.iter().map(|e| (e.key.clone(), e.length)).collect(), file_bytes })
}

/// The functions of one encoder target.
struct EncoderTarget {
    name: String,
    indices: sys::iree_vm_function_t,
    steps: Option<sys::iree_vm_function_t>,
    encode: sys::iree_vm_function_t,
    /// `iree.encode.scopes` of `indices` (comma-separated in the attribute).
    scopes: Vec<String>,
    /// `encode` takes (wait, signal) fences after the steps (`iree.abi.model = coarse-fences`).
    coarse_fences: bool,
}

impl EncoderTarget {
    /// The first target (in export order) the module declares, with its functions.
    fn discover(module: &Module) -> Result<EncoderTarget> {
        // SAFETY: the module is live.
        let signature = unsafe { sys::iree_vm_module_signature(module.as_ptr()) };
        let mut targets: Vec<(String, [Option<sys::iree_vm_function_t>; 3])> = Vec::new();
        for ordinal in 0..signature.export_function_count {
            let mut function = sys::iree_vm_function_t::default();
            // SAFETY: the module is live; `ordinal` is below the export count; `function` is
            // a valid out-pointer.
            let status = unsafe {
                sys::iree_vm_module_lookup_function_by_ordinal(
                    module.as_ptr(),
                    sys::IREE_VM_FUNCTION_LINKAGE_EXPORT as sys::iree_vm_function_linkage_t,
                    ordinal,
                    &mut function,
                )
            };
            check(status, || format!("looking up export {ordinal} of the encoder module"))?;
            let role = match attr(&function, "iree.encode.function").as_str() {
                "indices" => 0,
                "steps" => 1,
                "encode" => 2,
                _ => continue,
            };
            let name = attr(&function, "iree.encode.target");
            if name.is_empty() {
                return Err(Error::Encoder("an encoder function has no iree.encode.target".to_owned()));
            }
            let slot = match targets.iter().position(|(n, _)| *n == name) {
                Some(i) => i,
                None => {
                    targets.push((name, [None; 3]));
                    targets.len() - 1
                }
            };
            targets[slot].1[role] = Some(function);
        }
        let Some((name, [indices, steps, encode])) = targets.into_iter().next() else {
            return Err(Error::Encoder(format!(
                "module `{}` has no encoder functions (is it the module --iree-parameter-encoder-output-file wrote?)",
                module.name()
            )));
        };
        let missing = |what: &str| Error::Encoder(format!("encoder target `{name}` has no `{what}` function"));
        let indices = indices.ok_or_else(|| missing("indices"))?;
        let encode = encode.ok_or_else(|| missing("encode"))?;
        let scopes = attr(&indices, "iree.encode.scopes")
            .split(',')
            .map(str::trim)
            .filter(|s| !s.is_empty())
            .map(str::to_owned)
            .collect();
        let coarse_fences = attr(&encode, "iree.abi.model") == "coarse-fences";
        Ok(EncoderTarget { name, indices, steps, encode, scopes, coarse_fences })
    }
}

/// A reflection attribute of `function` ("" when absent).
fn attr(function: &sys::iree_vm_function_t, key: &str) -> String {
    // SAFETY: `function` was resolved in a live module; the returned view points into module
    // data and is copied at once; the key view borrows `key` for the call.
    unsafe { string_from_view(sys::iree_vm_function_lookup_attr_by_name(function, sys::string_view(key))) }
}

/// One entry of `indices()`.
#[derive(Debug)]
struct Entry {
    key: String,
    metadata: Vec<u8>,
    length: u64,
    kind: EntryKind,
}

#[derive(Debug)]
enum EntryKind {
    Data { alignment: u64 },
    Splat { pattern: u64, pattern_length: u8 },
}

/// The entries of `scope` in the `indices()` result; other scopes are an error (the caller
/// checked the declared scopes already, so this only catches an inconsistent module).
fn parse_indices(indices: &VmList, scope: &str) -> Result<Vec<Entry>> {
    let mut out = Vec::new();
    for s in 0..indices.len() {
        let pair = indices.list_at(s, "indices() scope")?;
        let name = pair.string_at(0, "indices() scope name")?;
        if name != scope {
            return Err(Error::Encoder(format!("indices() lists scope `{name}`, not the declared `{scope}`")));
        }
        let entries = pair.list_at(1, "indices() entries")?;
        for i in 0..entries.len() {
            let e = entries.list_at(i, "indices() entry")?;
            let kind = e.i64_at(0, "entry type")?;
            let key = e.string_at(1, "entry key")?;
            let metadata = e.bytes_at_or_empty(2)?;
            let length = e.i64_at(3, "entry length")? as u64;
            let kind = match kind {
                0 => EntryKind::Splat {
                    pattern: e.i64_at(4, "splat pattern")? as u64,
                    pattern_length: e.i64_at(5, "splat pattern length")? as u8,
                },
                _ => EntryKind::Data { alignment: e.i64_at(4, "entry alignment")? as u64 },
            };
            out.push(Entry { key, metadata, length, kind });
        }
    }
    Ok(out)
}

/// An owned `iree_vm_list_t` of variants (released on drop).
struct VmList {
    ptr: *mut sys::iree_vm_list_t,
}

impl VmList {
    fn new(capacity: usize) -> Result<VmList> {
        let mut ptr = ptr::null_mut();
        // SAFETY: a zeroed type def is IREE's "undefined" element type (a list of variants);
        // `ptr` is a valid out-pointer.
        let status = unsafe {
            sys::iree_vm_list_create(sys::iree_vm_type_def_t::default(), capacity, sys::allocator_system(), &mut ptr)
        };
        check(status, || "creating a VM list".to_owned())?;
        Ok(VmList { ptr })
    }

    fn len(&self) -> usize {
        // SAFETY: the list is live.
        unsafe { sys::iree_vm_list_size(self.ptr) }
    }

    /// The borrowed ref at `i` (valid while the list holds it).
    fn ref_at(&self, i: usize, what: &str) -> Result<sys::iree_vm_ref_t> {
        let mut r = sys::iree_vm_ref_t::default();
        // SAFETY: the list is live; `assign` copies the ref without retaining it.
        let status = unsafe { sys::iree_vm_list_get_ref_assign(self.ptr, i, &mut r) };
        check(status, || format!("reading {what} (element {i})"))?;
        Ok(r)
    }

    /// The list at `i`, retained.
    fn list_at(&self, i: usize, what: &str) -> Result<VmList> {
        let r = self.ref_at(i, what)?;
        let mut list = ptr::null_mut();
        // SAFETY: `r` is a ref borrowed from the live list; the deref checks its type.
        let status = unsafe { sys::iree_vm_list_check_deref(r, &mut list) };
        check(status, || format!("{what} (element {i}) is not a list"))?;
        // SAFETY: `list` is live (held by `self`); the new handle owns the added reference.
        unsafe { sys::iree_vm_list_retain(list) };
        Ok(VmList { ptr: list })
    }

    /// The bytes of the buffer at `i`, or empty for a null ref.
    fn bytes_at_or_empty(&self, i: usize) -> Result<Vec<u8>> {
        let r = self.ref_at(i, "a buffer")?;
        let mut buffer = ptr::null_mut();
        // SAFETY: `r` is a ref borrowed from the live list; the deref checks its type and
        // accepts null.
        let status = unsafe { sys::iree_vm_buffer_check_deref_or_null(r, &mut buffer) };
        check(status, || format!("element {i} is not a buffer"))?;
        if buffer.is_null() {
            return Ok(Vec::new());
        }
        // SAFETY: the buffer is live (held by the list); its contents are copied at once.
        let span = unsafe { sys::iree_vm_buffer_const_contents(buffer) };
        if span.data.is_null() || span.data_length == 0 {
            return Ok(Vec::new());
        }
        // SAFETY: `span` describes the buffer's readable bytes.
        Ok(unsafe { std::slice::from_raw_parts(span.data, span.data_length) }.to_vec())
    }

    fn string_at(&self, i: usize, what: &str) -> Result<String> {
        let bytes = self.bytes_at_or_empty(i)?;
        if bytes.is_empty() {
            return Err(Error::Encoder(format!("{what} (element {i}) is empty or null")));
        }
        String::from_utf8(bytes).map_err(|_| Error::Encoder(format!("{what} (element {i}) is not UTF-8")))
    }

    fn i64_at(&self, i: usize, what: &str) -> Result<i64> {
        let mut value = sys::iree_vm_value_t::default();
        // SAFETY: the list is live; `value` is a valid out-pointer.
        let status = unsafe { sys::iree_vm_list_get_value(self.ptr, i, &mut value) };
        check(status, || format!("reading {what} (element {i})"))?;
        // SAFETY: the union is 8 bytes; list values of the indices are i64 (narrower values
        // are stored sign-extended by IREE's list accessors).
        Ok(unsafe { value.__bindgen_anon_1.i64_ })
    }

    /// Appends `list` (retained), or a null ref.
    fn push_list(&self, list: Option<&VmList>) -> Result<()> {
        let mut r = match list {
            // SAFETY: the pushed list is live; the returned ref owns a new reference.
            Some(l) => unsafe { sys::iree_vm_list_retain_ref(l.ptr) },
            None => sys::iree_vm_ref_t::default(),
        };
        // SAFETY: the list is live; `move` takes the reference in `r` (left null).
        let status = unsafe { sys::iree_vm_list_push_ref_move(self.ptr, &mut r) };
        // SAFETY: releases `r` if the push failed (a no-op on the null it leaves otherwise).
        unsafe { sys::iree_vm_ref_release(&mut r) };
        check(status, || "building the encoder's arguments".to_owned())
    }

    /// Appends `fence` (retained), or a null fence.
    fn push_fence(&self, fence: Option<&Fence>) -> Result<()> {
        // SAFETY: the fence is live or null (IREE makes a null ref of it); the returned ref
        // owns a new reference.
        let mut r = unsafe { sys::iree_hal_fence_retain_ref(fence.map_or(ptr::null_mut(), |f| f.ptr)) };
        // SAFETY: the list is live; `move` takes the reference in `r` (left null).
        let status = unsafe { sys::iree_vm_list_push_ref_move(self.ptr, &mut r) };
        // SAFETY: releases `r` if the push failed (a no-op on the null it leaves otherwise).
        unsafe { sys::iree_vm_ref_release(&mut r) };
        check(status, || "building the encoder's arguments".to_owned())
    }
}

impl Drop for VmList {
    fn drop(&mut self) {
        // SAFETY: this handle owns one reference, released once here.
        unsafe { sys::iree_vm_list_release(self.ptr) };
    }
}

/// A fence that one new semaphore on the device reaching 1 signals.
struct Fence {
    ptr: *mut sys::iree_hal_fence_t,
}

impl Fence {
    fn signal_on(device: &Device) -> Result<Fence> {
        let mut semaphore = ptr::null_mut();
        // SAFETY: the device is live; `semaphore` is a valid out-pointer.
        let status = unsafe {
            sys::iree_hal_semaphore_create(
                device.as_ptr(),
                sys::IREE_HAL_QUEUE_AFFINITY_ANY,
                0,
                sys::IREE_HAL_SEMAPHORE_FLAG_DEFAULT as sys::iree_hal_semaphore_flags_t,
                &mut semaphore,
            )
        };
        check(status, || "creating the encoder's semaphore".to_owned())?;
        let mut ptr = ptr::null_mut();
        // SAFETY: the semaphore is live (the fence retains it); `ptr` is a valid out-pointer.
        let status = unsafe {
            sys::iree_hal_fence_create_at(semaphore, 1, sys::iree_hal_device_host_allocator(device.as_ptr()), &mut ptr)
        };
        // SAFETY: we own the one reference from create; the fence holds its own.
        unsafe { sys::iree_hal_semaphore_release(semaphore) };
        check(status, || "creating the encoder's fence".to_owned())?;
        Ok(Fence { ptr })
    }

    fn wait(&self) -> Result<()> {
        // SAFETY: the fence is live; the wait blocks until it signals or fails.
        let status = unsafe {
            sys::iree_hal_fence_wait(
                self.ptr,
                sys::infinite_timeout(),
                sys::IREE_ASYNC_WAIT_FLAG_NONE as sys::iree_async_wait_flags_t,
            )
        };
        check(status, || "waiting for the encoder".to_owned())
    }
}

impl Drop for Fence {
    fn drop(&mut self) {
        // SAFETY: this handle owns one reference, released once here.
        unsafe { sys::iree_hal_fence_release(self.ptr) };
    }
}

/// An `iree_io_parameter_archive_builder_t` (deinitialised on drop).
struct ArchiveBuilder {
    raw: Box<sys::iree_io_parameter_archive_builder_t>,
}

impl ArchiveBuilder {
    fn new() -> Result<ArchiveBuilder> {
        let mut raw = Box::<sys::iree_io_parameter_archive_builder_t>::default();
        // SAFETY: `raw` is a valid, exclusively owned struct to initialise.
        let status = unsafe { sys::iree_io_parameter_archive_builder_initialize(sys::allocator_system(), &mut *raw) };
        check(status, || "initialising a parameter archive builder".to_owned())?;
        Ok(ArchiveBuilder { raw })
    }

    fn add(&mut self, entry: &Entry) -> Result<()> {
        let metadata = sys::iree_const_byte_span_t { data: entry.metadata.as_ptr(), data_length: entry.metadata.len() };
        let status = match entry.kind {
            // SAFETY: the builder is initialised; name and metadata are borrowed for the call
            // (the builder copies them into its index).
            EntryKind::Data { alignment } => unsafe {
                sys::iree_io_parameter_archive_builder_add_data_entry(
                    &mut *self.raw,
                    sys::string_view(&entry.key),
                    metadata,
                    alignment,
                    entry.length,
                )
            },
            // SAFETY: as above; the pattern is read for `pattern_length` (at most 8) bytes.
            EntryKind::Splat { pattern, pattern_length } => unsafe {
                sys::iree_io_parameter_archive_builder_add_splat_entry(
                    &mut *self.raw,
                    sys::string_view(&entry.key),
                    metadata,
                    (&raw const pattern).cast(),
                    pattern_length,
                    entry.length,
                )
            },
        };
        check(status, || format!("adding parameter `{}` to the archive", entry.key))
    }

    fn total_size(&self) -> u64 {
        // SAFETY: the builder is initialised.
        unsafe { sys::iree_io_parameter_archive_builder_total_size(&*self.raw) }
    }

    /// Creates the archive file at `path` (its full size), writes the header and adds every
    /// entry to `index`, backed by the returned file handle (open for the device's writes).
    fn create_file(&self, path: &Path, index: &Parameters) -> Result<FileHandle> {
        let path_str = path
            .to_str()
            .ok_or_else(|| Error::InvalidArgument(format!("archive path `{}` is not valid UTF-8", path.display())))?;
        let rw = sys::IREE_IO_FILE_MODE_READ
            | sys::IREE_IO_FILE_MODE_WRITE
            | sys::IREE_IO_FILE_MODE_SHARE_READ
            | sys::IREE_IO_FILE_MODE_SHARE_WRITE;
        let mut created = ptr::null_mut();
        // SAFETY: the path view borrows `path_str` for the call; `created` is a valid out-pointer.
        let status = unsafe {
            sys::iree_io_file_handle_create(
                rw as sys::iree_io_file_mode_t,
                sys::string_view(path_str),
                self.total_size(),
                sys::allocator_system(),
                &mut created,
            )
        };
        check(status, || format!("creating parameter archive `{path_str}`"))?;
        let created = FileHandle(created);
        let mut handle = ptr::null_mut();
        // SAFETY: as above; the file exists now.
        let status = unsafe {
            sys::iree_io_file_handle_open(
                (rw | sys::IREE_IO_FILE_MODE_ASYNC) as sys::iree_io_file_mode_t,
                sys::string_view(path_str),
                sys::allocator_system(),
                &mut handle,
            )
        };
        check(status, || format!("opening parameter archive `{path_str}`"))?;
        let handle = FileHandle(handle);
        let mut stream = ptr::null_mut();
        // SAFETY: the created handle is live (the stream retains it); `stream` is a valid
        // out-pointer.
        let status = unsafe {
            sys::iree_io_stream_open(
                sys::IREE_IO_STREAM_MODE_WRITABLE as sys::iree_io_stream_mode_t,
                created.0,
                0,
                sys::allocator_system(),
                &mut stream,
            )
        };
        check(status, || format!("opening a stream on parameter archive `{path_str}`"))?;
        // SAFETY: builder, handle, stream and index are live; the index retains the handle
        // for each entry it adds.
        let status =
            unsafe { sys::iree_io_parameter_archive_builder_write(&*self.raw, handle.0, 0, stream, index.as_ptr()) };
        // SAFETY: we own the one reference from open; the header is written (or failed).
        unsafe { sys::iree_io_stream_release(stream) };
        check(status, || format!("writing the header of parameter archive `{path_str}`"))?;
        Ok(handle)
    }
}

impl Drop for ArchiveBuilder {
    fn drop(&mut self) {
        // SAFETY: initialised in `new`, deinitialised once here.
        unsafe { sys::iree_io_parameter_archive_builder_deinitialize(&mut *self.raw) };
    }
}

/// One owned reference to an `iree_io_file_handle_t`.
struct FileHandle(*mut sys::iree_io_file_handle_t);

impl Drop for FileHandle {
    fn drop(&mut self) {
        // SAFETY: this handle owns one reference, released once here.
        unsafe { sys::iree_io_file_handle_release(self.0) };
    }
}
