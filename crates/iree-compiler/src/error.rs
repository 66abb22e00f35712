//! The crate's error type and the compiler diagnostics carried in it.

use std::fmt;
use std::path::PathBuf;

/// Severity of one compiler diagnostic (`iree_compiler_diagnostic_severity_t`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Severity {
    Note,
    Warning,
    Error,
    Remark,
}

impl fmt::Display for Severity {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Severity::Note => "note",
            Severity::Warning => "warning",
            Severity::Error => "error",
            Severity::Remark => "remark",
        })
    }
}

/// One diagnostic as the compiler formatted it (location, message and attached notes).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Diagnostic {
    pub severity: Severity,
    pub message: String,
}

/// All diagnostics of one failed compile, in emission order.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Diagnostics(pub Vec<Diagnostic>);

/// Characters of one diagnostic shown by `Display`.
const MAX_DISPLAYED_CHARS: usize = 4096;

impl fmt::Display for Diagnostics {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.0.is_empty() {
            return f.write_str("(the compiler reported no diagnostics)");
        }
        for (i, d) in self.0.iter().enumerate() {
            if i > 0 {
                f.write_str("\n")?;
            }
            write!(f, "{}: ", d.severity)?;
            // Notes such as "see current operation" can hold whole dispatch regions; keep the
            // message readable and leave the full text to `Error::diagnostics()`.
            match d.message.char_indices().nth(MAX_DISPLAYED_CHARS) {
                Some((cut, _)) => write!(
                    f,
                    "{}... [{} more bytes, see Error::diagnostics()]",
                    &d.message[..cut],
                    d.message.len() - cut
                )?,
                None => f.write_str(&d.message)?,
            }
        }
        Ok(())
    }
}

/// Everything that can go wrong locating, loading or running the compiler, or using the cache.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error(
        "IREE compiler library not found (looked at: {}); run `cargo xtask setup` to install the pinned \
         iree-base-compiler into target/venv, or set IREE_COMPILER_LIB to the path of libIREECompiler",
        display_paths(searched)
    )]
    LibraryNotFound { searched: Vec<PathBuf> },

    #[error("cannot load IREE compiler library {}: {source}", path.display())]
    LibraryLoad { path: PathBuf, source: libloading::Error },

    #[error("IREE compiler library {} lacks symbol `{symbol}`: {source}", path.display())]
    MissingSymbol { path: PathBuf, symbol: &'static str, source: libloading::Error },

    #[error(
        "IREE compiler library {} has embedding API {}.{}, this crate needs {}.{} or a later 1.x",
        path.display(), found.0, found.1, required.0, required.1
    )]
    UnsupportedApiVersion { path: PathBuf, found: (u32, u32), required: (u32, u32) },

    #[error(
        "the IREE compiler is process-global and already loaded from {}; cannot also load {}",
        loaded.display(), requested.display()
    )]
    AlreadyLoaded { loaded: PathBuf, requested: PathBuf },

    #[error("invalid compile target: {0}")]
    InvalidTarget(String),

    #[error("invalid compile input: {0}")]
    InvalidInput(String),

    #[error("IREE compiler rejected the flags [{}]: {message}", flags.join(" "))]
    InvalidFlags { flags: Vec<String>, message: String },

    #[error("IREE compiler failed to parse the module:\n{diagnostics}")]
    Parse { diagnostics: Diagnostics },

    #[error("IREE compilation failed (flags: {}):\n{diagnostics}", flags.join(" "))]
    Compile { flags: Vec<String>, diagnostics: Diagnostics },

    #[error("IREE compiler API call {call} failed: {message}")]
    Api { call: &'static str, message: String },

    #[error("compiler output is not a vmfb: {0}")]
    NotVmfb(String),

    #[error("compile cache I/O on {}: {source}", path.display())]
    CacheIo { path: PathBuf, source: std::io::Error },

    /// A module was needed that the compile cache does not hold, and the compiler that would
    /// compile it cannot be loaded (`cause` says why; part of the message, not a `source`,
    /// so an error chain prints it once).
    #[error("{what} for {target} is not in the compile cache {} and cannot be compiled here: {cause}", dir.display())]
    NotCached { what: String, target: String, dir: PathBuf, cause: Box<Error> },
}

impl Error {
    /// The compiler diagnostics, if this error carries any.
    pub fn diagnostics(&self) -> Option<&Diagnostics> {
        match self {
            Error::Parse { diagnostics } | Error::Compile { diagnostics, .. } => Some(diagnostics),
            _ => None,
        }
    }
}

fn display_paths(paths: &[PathBuf]) -> String {
    if paths.is_empty() {
        return "no candidate paths".to_owned();
    }
    paths.iter().map(|p| p.display().to_string()).collect::<Vec<_>>().join(", ")
}
