//! The hub client's errors: one kind per thing a user can act on, each naming the repo,
//! revision, file or path involved and what to do about it.

use std::path::PathBuf;

/// What went wrong resolving or downloading a model.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The text is neither `owner/name` nor `owner/name@revision`.
    #[error("`{text}` is not a Hugging Face repo id (expected owner/name or owner/name@revision): {reason}")]
    BadRepoId { text: String, reason: &'static str },

    /// The hub knows no such repository (or hides a private one from this caller).
    #[error("repository {repo} not found on {endpoint}{}", if *token_given { "" } else { " (if it is private, set HF_TOKEN to a token that can read it)" })]
    RepoNotFound { repo: String, endpoint: String, token_given: bool },

    /// The repository exists but has no such branch, tag or commit.
    #[error("revision `{revision}` not found in {repo} on {endpoint}")]
    RevisionNotFound { repo: String, revision: String, endpoint: String },

    /// A file the model needs is listed nowhere in the repository at that revision.
    #[error("{file} not found in {repo} at revision `{revision}`")]
    FileNotFound { repo: String, revision: String, file: String },

    /// Gated or private, and no token (or one without access) was given.
    #[error("{repo} is gated or private: {}", if *token_given {
        "the token in HF_TOKEN has no access to it (accept its conditions on the hub with that account, or use another token)"
    } else {
        "set HF_TOKEN to a token of an account that has access (for a gated model, accept its conditions on the hub first)"
    })]
    Unauthorized { repo: String, token_given: bool },

    /// No answer from the hub (DNS, connection, TLS, timeout).
    #[error("cannot reach the hub at {endpoint} ({reason}); with HF_HUB_OFFLINE=1 a model already in the cache {} is used without the network", cache.display())]
    Unreachable { endpoint: String, cache: PathBuf, reason: String },

    /// The hub answered with a status this client does not expect.
    #[error("the hub answered HTTP {status} for {url}")]
    Status { status: u16, url: String },

    /// The hub's answer lacks something this client needs (a header, valid JSON).
    #[error("unexpected answer from the hub for {url}: {reason}")]
    BadResponse { url: String, reason: String },

    /// Offline (HF_HUB_OFFLINE=1) and the model is not complete in the cache.
    #[error("{repo} at revision `{revision}` is not in the cache {} ({missing}); HF_HUB_OFFLINE=1 downloads nothing: unset it to download", cache.display())]
    NotCached { repo: String, revision: String, cache: PathBuf, missing: String },

    /// The repository holds no config.json or no safetensors weights: not an MLX model.
    #[error("{repo} is not an MLX model: it has {missing}")]
    NotAModel { repo: String, missing: &'static str },

    /// A file name from the repository (e.g. a shard in the index) would leave the snapshot.
    #[error("{repo}: file name `{file}` would leave the snapshot folder; refusing it")]
    UnsafeFileName { repo: String, file: String },

    /// The index file names no shards or is not valid JSON.
    #[error("{repo}: {file} is not a valid safetensors index: {reason}")]
    BadIndex { repo: String, file: String, reason: String },

    /// The downloaded bytes do not hash to the sha256 the hub gave (LFS files).
    #[error(
        "{file}: the download does not match the hub's sha256 (expected {expected}, got {actual}); it was discarded, run again to download it anew"
    )]
    Checksum { file: String, expected: String, actual: String },

    /// The downloaded file's size is not the size the hub announced.
    #[error("{file}: the hub announced {expected} bytes but sent {actual}; the download was discarded, run again")]
    SizeMismatch { file: String, expected: u64, actual: u64 },

    /// The body broke off more often than the attempts allowed; the partial file stays for
    /// the next run to resume.
    #[error("{file}: the download broke off {attempts} times (last: {reason}); run again to resume it")]
    Interrupted { file: String, attempts: u32, reason: String },

    /// No space left (or quota exceeded) while writing into the cache.
    #[error("disk full writing {} ({source}); free space and run again: the download resumes where it stopped", path.display())]
    DiskFull { path: PathBuf, source: std::io::Error },

    /// The files still to download are larger than the free space of the cache's file system.
    #[error("not enough disk space for {repo}: its files still to download take {needed} bytes ({}), the file system of the cache {} has {available} bytes free ({}); free space, or set HF_HUB_CACHE to a folder on a larger disk", readable(*needed), cache.display(), readable(*available))]
    NoSpace { repo: String, needed: u64, available: u64, cache: PathBuf },

    /// Any other file system error in the cache.
    #[error("{}: {source}", path.display())]
    Io { path: PathBuf, source: std::io::Error },
}

/// Bytes for people: `1.5 GiB`, `84.2 MiB`, `12.0 KiB`.
fn readable(bytes: u64) -> String {
    const UNITS: [&str; 6] = ["KiB", "MiB", "GiB", "TiB", "PiB", "EiB"];
    let mut value = bytes as f64 / 1024.0;
    let mut unit = 0;
    while value >= 1024.0 && unit + 1 < UNITS.len() {
        value /= 1024.0;
        unit += 1;
    }
    format!("{value:.1} {}", UNITS[unit])
}

/// A file system error at `path`, as `DiskFull` when the device or quota is full.
pub(crate) fn io_error(path: impl Into<PathBuf>, source: std::io::Error) -> Error {
    use std::io::ErrorKind;
    let path = path.into();
    match source.kind() {
        ErrorKind::StorageFull | ErrorKind::QuotaExceeded => Error::DiskFull { path, source },
        _ => Error::Io { path, source },
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)] // a test that cannot unwrap has failed
mod tests {
    use super::*;

    #[test]
    fn enospc_and_edquot_are_disk_full() {
        // Linux errno values: ENOSPC 28, EDQUOT 122.
        for errno in [28, 122] {
            let e = io_error("/x", std::io::Error::from_raw_os_error(errno));
            assert!(matches!(e, Error::DiskFull { .. }), "{errno}: {e:?}");
            assert!(e.to_string().starts_with("disk full writing /x"), "{e}");
        }
        assert!(matches!(io_error("/x", std::io::Error::from_raw_os_error(13)), Error::Io { .. }));
    }

    #[test]
    fn messages_name_what_to_do() {
        let e = Error::Unauthorized { repo: "a/b".into(), token_given: false };
        assert!(e.to_string().contains("set HF_TOKEN"), "{e}");
        let e = Error::RepoNotFound { repo: "a/b".into(), endpoint: "http://h".into(), token_given: true };
        assert_eq!(e.to_string(), "repository a/b not found on http://h");
        let e = Error::Unreachable { endpoint: "http://h".into(), cache: "/c".into(), reason: "refused".into() };
        assert!(e.to_string().contains("HF_HUB_OFFLINE=1") && e.to_string().contains("/c"), "{e}");
        let e = Error::NoSpace { repo: "a/b".into(), needed: 3 << 30, available: 1536 << 10, cache: "/c".into() };
        assert_eq!(
            e.to_string(),
            "not enough disk space for a/b: its files still to download take 3221225472 bytes (3.0 GiB), the file system of the cache /c has 1572864 bytes free (1.5 MiB); free space, or set HF_HUB_CACHE to a folder on a larger disk"
        );
    }
}
