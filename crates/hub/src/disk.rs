//! Free space on the file system that holds the cache (`statvfs`), asked before a model's
//! files are downloaded so a download that cannot fit is refused before it starts.

use std::path::Path;

/// Bytes an unprivileged process may still write on the file system of `dir`, or of its
/// nearest ancestor that exists (the cache folder may not be made yet). `None` where the
/// system cannot tell.
pub(crate) fn available_bytes(dir: &Path) -> Option<u64> {
    let existing = dir.ancestors().find(|d| d.exists())?;
    match statvfs_available(existing) {
        Ok(bytes) => Some(bytes),
        Err(e) => {
            tracing::debug!("cannot ask for the free space of {}: {e}", existing.display());
            None
        }
    }
}

#[cfg(unix)]
fn statvfs_available(path: &Path) -> std::io::Result<u64> {
    use std::os::unix::ffi::OsStrExt;
    let path = std::ffi::CString::new(path.as_os_str().as_bytes())?;
    let mut stat = std::mem::MaybeUninit::<libc::statvfs>::uninit();
    // SAFETY: `path` is a NUL-terminated string that outlives the call, and `stat` points to
    // memory of the struct's size that statvfs fills when it returns 0.
    if unsafe { libc::statvfs(path.as_ptr(), stat.as_mut_ptr()) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: statvfs returned 0, so it initialised the whole struct.
    let stat = unsafe { stat.assume_init() };
    #[allow(clippy::unnecessary_cast)] // the field types differ between platforms
    Ok((stat.f_bavail as u64).saturating_mul(stat.f_frsize as u64))
}

#[cfg(not(unix))]
fn statvfs_available(_path: &Path) -> std::io::Result<u64> {
    Err(std::io::Error::new(std::io::ErrorKind::Unsupported, "no statvfs on this platform"))
}

#[cfg(test)]
#[allow(clippy::unwrap_used)] // a test that cannot unwrap has failed
mod tests {
    use super::*;

    #[test]
    fn a_folder_not_made_yet_is_asked_through_its_parent() {
        let dir = tempfile::tempdir().unwrap();
        let here = available_bytes(dir.path()).unwrap();
        let later = available_bytes(&dir.path().join("a/b/c")).unwrap();
        assert!(here > 0);
        // The same file system, give or take what other processes wrote in between.
        assert!(here.abs_diff(later) < here / 10 + (64 << 20), "{here} vs {later}");
    }
}
