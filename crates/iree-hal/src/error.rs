//! Typed errors: every `iree_status_t` is turned into an owned [`Error`] (code +
//! formatted message) the moment a call returns, and the status is freed.

use std::ffi::c_void;
use std::fmt;
use std::path::PathBuf;

use iree_sys as sys;

/// Result alias for this crate.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// An IREE status code (`iree_status_code_t`), named as in C.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum StatusCode {
    /// `IREE_STATUS_CANCELLED`
    Cancelled,
    /// `IREE_STATUS_UNKNOWN`
    Unknown,
    /// `IREE_STATUS_INVALID_ARGUMENT`
    InvalidArgument,
    /// `IREE_STATUS_DEADLINE_EXCEEDED`
    DeadlineExceeded,
    /// `IREE_STATUS_NOT_FOUND`
    NotFound,
    /// `IREE_STATUS_ALREADY_EXISTS`
    AlreadyExists,
    /// `IREE_STATUS_PERMISSION_DENIED`
    PermissionDenied,
    /// `IREE_STATUS_RESOURCE_EXHAUSTED`
    ResourceExhausted,
    /// `IREE_STATUS_FAILED_PRECONDITION`
    FailedPrecondition,
    /// `IREE_STATUS_ABORTED`
    Aborted,
    /// `IREE_STATUS_OUT_OF_RANGE`
    OutOfRange,
    /// `IREE_STATUS_UNIMPLEMENTED`
    Unimplemented,
    /// `IREE_STATUS_INTERNAL`
    Internal,
    /// `IREE_STATUS_UNAVAILABLE`
    Unavailable,
    /// `IREE_STATUS_DATA_LOSS`
    DataLoss,
    /// `IREE_STATUS_UNAUTHENTICATED`
    Unauthenticated,
    /// `IREE_STATUS_DEFERRED`
    Deferred,
    /// `IREE_STATUS_INCOMPATIBLE`
    Incompatible,
    /// A code this crate does not know by name (raw value kept).
    Other(u32),
}

impl StatusCode {
    /// Maps a raw `iree_status_code_t`.
    pub fn from_raw(code: sys::iree_status_code_t) -> Self {
        match code {
            sys::IREE_STATUS_CANCELLED => Self::Cancelled,
            sys::IREE_STATUS_UNKNOWN => Self::Unknown,
            sys::IREE_STATUS_INVALID_ARGUMENT => Self::InvalidArgument,
            sys::IREE_STATUS_DEADLINE_EXCEEDED => Self::DeadlineExceeded,
            sys::IREE_STATUS_NOT_FOUND => Self::NotFound,
            sys::IREE_STATUS_ALREADY_EXISTS => Self::AlreadyExists,
            sys::IREE_STATUS_PERMISSION_DENIED => Self::PermissionDenied,
            sys::IREE_STATUS_RESOURCE_EXHAUSTED => Self::ResourceExhausted,
            sys::IREE_STATUS_FAILED_PRECONDITION => Self::FailedPrecondition,
            sys::IREE_STATUS_ABORTED => Self::Aborted,
            sys::IREE_STATUS_OUT_OF_RANGE => Self::OutOfRange,
            sys::IREE_STATUS_UNIMPLEMENTED => Self::Unimplemented,
            sys::IREE_STATUS_INTERNAL => Self::Internal,
            sys::IREE_STATUS_UNAVAILABLE => Self::Unavailable,
            sys::IREE_STATUS_DATA_LOSS => Self::DataLoss,
            sys::IREE_STATUS_UNAUTHENTICATED => Self::Unauthenticated,
            sys::IREE_STATUS_DEFERRED => Self::Deferred,
            sys::IREE_STATUS_INCOMPATIBLE => Self::Incompatible,
            other => Self::Other(other),
        }
    }

    /// The C name without prefix, e.g. `NOT_FOUND`.
    pub fn name(self) -> &'static str {
        match self {
            Self::Cancelled => "CANCELLED",
            Self::Unknown => "UNKNOWN",
            Self::InvalidArgument => "INVALID_ARGUMENT",
            Self::DeadlineExceeded => "DEADLINE_EXCEEDED",
            Self::NotFound => "NOT_FOUND",
            Self::AlreadyExists => "ALREADY_EXISTS",
            Self::PermissionDenied => "PERMISSION_DENIED",
            Self::ResourceExhausted => "RESOURCE_EXHAUSTED",
            Self::FailedPrecondition => "FAILED_PRECONDITION",
            Self::Aborted => "ABORTED",
            Self::OutOfRange => "OUT_OF_RANGE",
            Self::Unimplemented => "UNIMPLEMENTED",
            Self::Internal => "INTERNAL",
            Self::Unavailable => "UNAVAILABLE",
            Self::DataLoss => "DATA_LOSS",
            Self::Unauthenticated => "UNAUTHENTICATED",
            Self::Deferred => "DEFERRED",
            Self::Incompatible => "INCOMPATIBLE",
            Self::Other(_) => "OTHER",
        }
    }
}

impl fmt::Display for StatusCode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Other(raw) => write!(f, "status code {raw}"),
            named => f.write_str(named.name()),
        }
    }
}

/// Errors of this crate. IREE failures keep the status code and IREE's full
/// formatted message (which already names the code, e.g. `NOT_FOUND; ...`).
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// An IREE call failed; `context` says what this crate was doing.
    #[error("{context}: {message}")]
    Iree {
        /// What was being done, e.g. "loading vmfb module".
        context: String,
        /// The status code IREE returned.
        code: StatusCode,
        /// IREE's formatted status message.
        message: String,
    },
    /// A device URI names no registered driver, or the driver could not make the device.
    #[error("cannot create IREE device `{uri}`: {message} (available drivers: {})", list_or_none(.available))]
    Device {
        /// The URI asked for.
        uri: String,
        /// Names of the drivers registered in this runtime build.
        available: Vec<String>,
        /// The status code IREE returned.
        code: StatusCode,
        /// IREE's formatted status message.
        message: String,
    },
    /// A function name is not exported by any module of the session.
    #[error("function `{name}` not found in the session (exported functions: {})", list_or_none(.available))]
    FunctionNotFound {
        /// The name asked for.
        name: String,
        /// Fully qualified names of the exported functions (`module.fn`).
        available: Vec<String>,
    },
    /// Bad input caught before calling IREE (shape/length/type mismatches, ...).
    #[error("{0}")]
    InvalidArgument(String),
    /// A host file could not be read.
    #[error("cannot read `{}`: {source}", .path.display())]
    Io {
        /// The file.
        path: PathBuf,
        /// The OS error.
        #[source]
        source: std::io::Error,
    },
    /// A host file could not be written or flushed.
    #[error("cannot write `{}`: {source}", .path.display())]
    Write {
        /// The file.
        path: PathBuf,
        /// The OS error.
        #[source]
        source: std::io::Error,
    },
    /// A parameter encoder module does not follow the protocol of IREE's
    /// `iree-encode-parameters` (see [`crate::encode_parameters`]).
    #[error("parameter encoder: {0}")]
    Encoder(String),
}

impl Error {
    /// The IREE status code, for errors that came from IREE.
    pub fn code(&self) -> Option<StatusCode> {
        match self {
            Self::Iree { code, .. } | Self::Device { code, .. } => Some(*code),
            _ => None,
        }
    }
}

fn list_or_none(items: &[String]) -> String {
    if items.is_empty() { "none".to_owned() } else { items.join(", ") }
}

/// An owned copy of a failed status; the IREE status itself is already freed.
#[derive(Debug)]
pub(crate) struct StatusError {
    pub(crate) code: StatusCode,
    pub(crate) message: String,
}

impl StatusError {
    pub(crate) fn with_context(self, context: impl Into<String>) -> Error {
        Error::Iree { context: context.into(), code: self.code, message: self.message }
    }
}

/// Consumes `status`: `Ok(())` if it is OK, otherwise its code and formatted
/// message, after freeing it.
///
/// Takes ownership of the status (IREE statuses must be freed exactly once);
/// callers pass what an IREE function just returned and never touch it again.
pub(crate) fn take_status(status: sys::iree_status_t) -> Result<(), StatusError> {
    if sys::status_is_ok(status) {
        return Ok(());
    }
    let code = StatusCode::from_raw(sys::status_code(status));
    let mut message = Vec::<u8>::new();
    // SAFETY: `status` is a live, non-OK status owned by us; the callback only
    // appends the chunks IREE hands it to the Vec passed as user data, which
    // outlives the call.
    unsafe {
        sys::iree_status_format_to(status, Some(append_chunk), (&mut message as *mut Vec<u8>).cast::<c_void>());
    }
    // SAFETY: we own `status` and free it exactly once; it is not used afterwards.
    unsafe { sys::iree_status_free(status) };
    let mut message = String::from_utf8_lossy(&message).trim_end().to_owned();
    if message.is_empty() {
        message = code.to_string();
    }
    Err(StatusError { code, message })
}

/// Consumes `status` like [`take_status`] and attaches `context` on failure.
pub(crate) fn check(status: sys::iree_status_t, context: impl FnOnce() -> String) -> Result<()> {
    take_status(status).map_err(|err| err.with_context(context()))
}

/// `iree_status_output_fn_t` collecting the formatted status into a `Vec<u8>`.
unsafe extern "C" fn append_chunk(chunk: sys::iree_string_view_t, user_data: *mut c_void) -> bool {
    if chunk.size == 0 || chunk.data.is_null() {
        return true;
    }
    // SAFETY: `user_data` is the `&mut Vec<u8>` passed by `take_status`, alive
    // for the duration of `iree_status_format_to`; `chunk` is valid for `size`
    // bytes per the IREE callback contract.
    unsafe {
        let out = &mut *user_data.cast::<Vec<u8>>();
        out.extend_from_slice(std::slice::from_raw_parts(chunk.data.cast::<u8>(), chunk.size));
    }
    true
}

/// Copies an IREE string view into an owned `String` (lossy on invalid UTF-8).
///
/// # Safety
/// `view.data` must be valid for `view.size` bytes (or `size` must be 0).
pub(crate) unsafe fn string_from_view(view: sys::iree_string_view_t) -> String {
    if view.size == 0 || view.data.is_null() {
        return String::new();
    }
    // SAFETY: guaranteed by the caller.
    let bytes = unsafe { std::slice::from_raw_parts(view.data.cast::<u8>(), view.size) };
    String::from_utf8_lossy(bytes).into_owned()
}
