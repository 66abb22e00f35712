//! [`Parameters`]: named tensors for one parameter scope (an
//! `iree_io_parameter_index_t`), filled from `.safetensors`/`.gguf`/`.irpa`
//! files (read, or mapped and imported in place) or host memory, and served to
//! modules through the `io_parameters` VM module (see
//! [`crate::Session::append_parameters`]).

use std::path::Path;
use std::ptr::{self, NonNull};

use iree_sys as sys;

use crate::aligned::AlignedBytes;
use crate::error::{Error, Result, check, string_from_view, take_status};

/// A parameter index for one scope: the `"model"` in
/// `#stream.parameter.named<"model"::"w">`.
///
/// `Clone` retains the same index (entries added through one clone are seen by
/// all), `Drop` releases. Entries keep their backing file or host memory alive
/// for as long as IREE needs them. Not `Send`/`Sync`: it wraps a raw IREE
/// pointer and this crate makes no thread-safety claims for it.
#[derive(Debug)]
pub struct Parameters {
    ptr: NonNull<sys::iree_io_parameter_index_t>,
    scope: String,
}

impl Parameters {
    /// An empty index for `scope` (may be empty for unscoped parameters).
    pub fn new(scope: &str) -> Result<Self> {
        let mut raw = ptr::null_mut();
        // SAFETY: plain allocator value and a valid out-pointer.
        let status = unsafe { sys::iree_io_parameter_index_create(sys::allocator_system(), &mut raw) };
        check(status, || format!("creating parameter index for scope `{scope}`"))?;
        let ptr = NonNull::new(raw)
            .ok_or_else(|| Error::InvalidArgument("IREE returned a null parameter index".to_owned()))?;
        Ok(Self { ptr, scope: scope.to_owned() })
    }

    /// The scope name.
    pub fn scope(&self) -> &str {
        &self.scope
    }

    /// Adds every tensor of a parameter file, chosen by extension:
    /// `.safetensors`, `.gguf` or `.irpa`. The file is opened (not read into
    /// memory) and read by IREE when a module loads the parameters; it must
    /// stay unchanged while sessions use these parameters.
    pub fn add_file(&mut self, path: impl AsRef<Path>) -> Result<()> {
        let (path_str, handle) = open_read(path.as_ref())?;
        let allocator = sys::allocator_system();
        // SAFETY: index and handle are live; the path view borrows `path_str`;
        // the index retains the handle for every entry it adds.
        let status =
            unsafe { sys::iree_io_parse_file_index(sys::string_view(path_str), handle, self.ptr.as_ptr(), allocator) };
        // SAFETY: we own the one reference from open; entries keep their own.
        unsafe { sys::iree_io_file_handle_release(handle) };
        check(status, || format!("indexing parameter file `{path_str}` for scope `{}`", self.scope))
    }

    /// Adds every tensor of a parameter file (as [`Parameters::add_file`] does) mapped
    /// into memory read-only: each tensor is served as host memory over the mapping, which
    /// IREE imports in place on CPU devices, where [`Parameters::add_file`] makes it
    /// allocate a buffer per tensor and read the file into it. Resident pages are then the
    /// file's own (shared, clean, reclaimable page cache), and a module binding them makes no
    /// copy. The file must stay unchanged (not truncated) while sessions use these
    /// parameters: a shrunk file faults on access.
    pub fn add_file_mapped(&mut self, path: impl AsRef<Path>) -> Result<()> {
        let (path_str, handle) = open_read(path.as_ref())?;
        let allocator = sys::allocator_system();
        let mut mapping = ptr::null_mut();
        // SAFETY: the handle is live (the mapping retains it); the whole file is mapped
        // (offset 0, length IREE_HOST_SIZE_MAX); `mapping` is a valid out-pointer.
        let status = unsafe {
            sys::iree_io_file_map_view(
                handle,
                sys::IREE_IO_FILE_ACCESS_READ as sys::iree_io_file_access_t,
                0,
                usize::MAX,
                sys::IREE_IO_FILE_MAPPING_FLAG_EXCLUDE_FROM_DUMPS as sys::iree_io_file_mapping_flags_t,
                allocator,
                &mut mapping,
            )
        };
        // The file is parsed through the plain handle into a scratch index, whose entries
        // (offsets into the file) are then re-added here over the mapping.
        let scratch = Parameters::new(&self.scope);
        let status = check(status, || format!("mapping parameter file `{path_str}`")).and_then(|()| {
            let scratch = scratch?;
            // SAFETY: index and handle are live; the path view borrows `path_str`.
            let status = unsafe {
                sys::iree_io_parse_file_index(sys::string_view(path_str), handle, scratch.as_ptr(), allocator)
            };
            check(status, || format!("indexing parameter file `{path_str}` for scope `{}`", self.scope))?;
            Ok(scratch)
        });
        // SAFETY: we own the one reference from open; the mapping and the scratch entries
        // hold their own.
        unsafe { sys::iree_io_file_handle_release(handle) };
        let scratch = match status {
            Ok(scratch) => scratch,
            Err(e) => {
                if !mapping.is_null() {
                    // SAFETY: we own the one reference from map_view.
                    unsafe { sys::iree_io_file_mapping_release(mapping) };
                }
                return Err(e);
            }
        };
        let result = self.add_mapped_entries(&scratch, mapping, path_str);
        // SAFETY: we own the one reference from map_view; each entry added holds its own.
        unsafe { sys::iree_io_file_mapping_release(mapping) };
        result
    }

    /// Adds every entry of `scratch` (indexed over the file that `mapping` maps): file
    /// entries as host memory over the mapping (each holding a reference to it), splats as
    /// they are.
    fn add_mapped_entries(
        &mut self,
        scratch: &Parameters,
        mapping: *mut sys::iree_io_file_mapping_t,
        path: &str,
    ) -> Result<()> {
        // SAFETY: the mapping is live; the span stays valid while it is.
        let contents = unsafe { sys::iree_io_file_mapping_contents_ro(mapping) };
        for i in 0..scratch.len() {
            let mut entry = ptr::null();
            // SAFETY: the index is live and `i` is below its count.
            let status = unsafe { sys::iree_io_parameter_index_get(scratch.as_ptr(), i, &mut entry) };
            check(status, || format!("reading entry {i} of parameter file `{path}`"))?;
            // SAFETY: `entry` points at an index-owned entry, alive while `scratch` is.
            let mut entry = unsafe { *entry };
            // SAFETY: the key view points into the entry's own storage.
            let key = unsafe { string_from_view(entry.key) };
            if self.contains(&key) {
                return Err(Error::InvalidArgument(format!(
                    "parameter `{key}` of `{path}` already exists in scope `{}`",
                    self.scope
                )));
            }
            let mut wrapped = ptr::null_mut();
            if entry.type_
                == sys::IREE_IO_PARAMETER_INDEX_ENTRY_STORAGE_TYPE_FILE
                    as sys::iree_io_parameter_index_entry_storage_type_t
            {
                // SAFETY: reading the file variant of the union, which `type_` selects.
                let offset = unsafe { entry.storage.file.offset };
                let end = offset.checked_add(entry.length).filter(|end| *end <= contents.data_length as u64);
                if end.is_none() {
                    return Err(Error::InvalidArgument(format!(
                        "parameter `{key}` of `{path}` ({} bytes at {offset}) lies outside the {}-byte file",
                        entry.length, contents.data_length
                    )));
                }
                let span = sys::iree_byte_span_t {
                    // SAFETY: in bounds of the mapping, checked above. IREE only reads it
                    // (the handle is read-only), so the mutable pointer is never written.
                    data: unsafe { contents.data.add(offset as usize) }.cast_mut(),
                    data_length: entry.length as usize,
                };
                let release = sys::iree_io_file_handle_release_callback_t {
                    fn_: Some(release_mapping),
                    user_data: mapping.cast(),
                };
                // SAFETY: the mapping is live; the reference taken here is dropped by
                // `release_mapping` when the handle goes, or below if wrapping fails.
                unsafe { sys::iree_io_file_mapping_retain(mapping) };
                // SAFETY: `span` lies inside the retained mapping; `wrapped` is a valid
                // out-pointer.
                let status = unsafe {
                    sys::iree_io_file_handle_wrap_host_allocation(
                        sys::IREE_IO_FILE_ACCESS_READ as sys::iree_io_file_access_t,
                        span,
                        release,
                        sys::allocator_system(),
                        &mut wrapped,
                    )
                };
                if let Err(e) = check(status, || format!("wrapping parameter `{key}` of `{path}`")) {
                    // SAFETY: wrapping failed, so IREE never calls `release`: drop our reference.
                    unsafe { sys::iree_io_file_mapping_release(mapping) };
                    return Err(e);
                }
                entry.storage.file.handle = wrapped;
                entry.storage.file.offset = 0;
            }
            // SAFETY: the index is live; `entry` is fully initialised (key and metadata views
            // borrow `scratch`, alive for the call); the index copies them and retains the
            // handle.
            let status = unsafe { sys::iree_io_parameter_index_add(self.ptr.as_ptr(), &entry) };
            if !wrapped.is_null() {
                // SAFETY: we own the one reference from wrapping; the index holds its own.
                unsafe { sys::iree_io_file_handle_release(wrapped) };
            }
            check(status, || format!("adding parameter `{key}` of `{path}` to scope `{}`", self.scope))?;
        }
        Ok(())
    }

    /// Adds one tensor named `name` whose contents are `bytes` (the raw,
    /// row-major element data the module's global expects). The bytes are
    /// copied into 64-byte aligned memory owned by the index.
    pub fn add_tensor(&mut self, name: &str, bytes: &[u8]) -> Result<()> {
        if self.contains(name) {
            return Err(Error::InvalidArgument(format!("parameter `{name}` already exists in scope `{}`", self.scope)));
        }
        let copy = AlignedBytes::copy_from(bytes).ok_or_else(|| {
            Error::InvalidArgument(format!("cannot allocate {} bytes for parameter `{name}`", bytes.len()))
        })?;
        let length = copy.len() as u64;
        let handle = copy
            .into_file_handle(sys::allocator_system())
            .map_err(|e| e.with_context(format!("wrapping host memory for parameter `{name}`")))?;
        let mut entry = sys::iree_io_parameter_index_entry_t {
            key: sys::string_view(name),
            length,
            type_: sys::IREE_IO_PARAMETER_INDEX_ENTRY_STORAGE_TYPE_FILE
                as sys::iree_io_parameter_index_entry_storage_type_t,
            ..Default::default()
        };
        entry.storage.file.handle = handle;
        entry.storage.file.offset = 0;
        // SAFETY: the index is live; `entry` is fully initialised and the
        // index copies the key and retains the handle.
        let status = unsafe { sys::iree_io_parameter_index_add(self.ptr.as_ptr(), &entry) };
        // SAFETY: we own the one reference from wrapping; the index holds its own.
        unsafe { sys::iree_io_file_handle_release(handle) };
        check(status, || format!("adding parameter `{name}` to scope `{}`", self.scope))
    }

    /// Number of entries.
    pub fn len(&self) -> usize {
        // SAFETY: the index is live.
        unsafe { sys::iree_io_parameter_index_count(self.ptr.as_ptr()) }
    }

    /// Whether the index has no entries.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Whether an entry named `name` exists.
    pub fn contains(&self, name: &str) -> bool {
        let mut entry = ptr::null();
        // SAFETY: the index is live; the key view borrows `name` for the call.
        let status =
            unsafe { sys::iree_io_parameter_index_lookup(self.ptr.as_ptr(), sys::string_view(name), &mut entry) };
        take_status(status).is_ok()
    }

    /// Names and byte lengths of all entries, in insertion order.
    pub fn entries(&self) -> Vec<(String, u64)> {
        (0..self.len())
            .filter_map(|i| {
                let mut entry = ptr::null();
                // SAFETY: the index is live and `i` is below its count.
                let status = unsafe { sys::iree_io_parameter_index_get(self.ptr.as_ptr(), i, &mut entry) };
                take_status(status).ok()?;
                // SAFETY: `entry` points at an index-owned entry, alive while
                // the index is and copied at once.
                let entry = unsafe { entry.as_ref()? };
                // SAFETY: the key view points into the entry's own storage.
                Some((unsafe { string_from_view(entry.key) }, entry.length))
            })
            .collect()
    }

    /// A provider serving this index under its scope, for the `io_parameters`
    /// module. The caller owns the returned reference.
    pub(crate) fn create_provider(&self) -> Result<*mut sys::iree_io_parameter_provider_t> {
        let mut provider = ptr::null_mut();
        // SAFETY: the index is live and retained by the provider; the scope
        // view borrows `self.scope` (the provider copies it).
        let status = unsafe {
            sys::iree_io_parameter_index_provider_create(
                sys::string_view(&self.scope),
                self.ptr.as_ptr(),
                sys::IREE_IO_PARAMETER_INDEX_PROVIDER_DEFAULT_MAX_CONCURRENT_OPERATIONS as sys::iree_host_size_t,
                sys::allocator_system(),
                &mut provider,
            )
        };
        check(status, || format!("creating parameter provider for scope `{}`", self.scope))?;
        Ok(provider)
    }

    /// The raw index pointer, for use with `iree-sys`. Still owned by `self`.
    pub fn as_ptr(&self) -> *mut sys::iree_io_parameter_index_t {
        self.ptr.as_ptr()
    }
}

/// `iree_io_file_handle_release_fn_t` for a tensor wrapped over a file mapping: drops the
/// reference to the mapping (`user_data`) that [`Parameters::add_file_mapped`] took for it.
unsafe extern "C" fn release_mapping(
    user_data: *mut std::ffi::c_void,
    _primitive: sys::iree_io_file_handle_primitive_t,
) {
    // SAFETY: `user_data` is the mapping retained once for this handle; IREE calls this once
    // when the handle's last reference goes.
    unsafe { sys::iree_io_file_mapping_release(user_data.cast()) };
}

impl Clone for Parameters {
    fn clone(&self) -> Self {
        // SAFETY: the index is live; the new handle owns the added reference.
        unsafe { sys::iree_io_parameter_index_retain(self.ptr.as_ptr()) };
        Self { ptr: self.ptr, scope: self.scope.clone() }
    }
}

impl Drop for Parameters {
    fn drop(&mut self) {
        // SAFETY: this handle owns exactly one reference, released once here.
        unsafe { sys::iree_io_parameter_index_release(self.ptr.as_ptr()) };
    }
}

/// `path` as UTF-8 and a read-only IREE file handle on it (one reference, the caller's to
/// release).
fn open_read(path: &Path) -> Result<(&str, *mut sys::iree_io_file_handle_t)> {
    let path_str = path.to_str().ok_or_else(|| {
        Error::InvalidArgument(format!("parameter file path `{}` is not valid UTF-8", path.display()))
    })?;
    let mode = sys::IREE_IO_FILE_MODE_READ | sys::IREE_IO_FILE_MODE_SHARE_READ;
    let mut handle = ptr::null_mut();
    // SAFETY: the path view borrows `path_str` for the call only; `handle` is a valid
    // out-pointer.
    let status = unsafe {
        sys::iree_io_file_handle_open(
            mode as sys::iree_io_file_mode_t,
            sys::string_view(path_str),
            sys::allocator_system(),
            &mut handle,
        )
    };
    check(status, || format!("opening parameter file `{path_str}`"))?;
    Ok((path_str, handle))
}
