//! Loading failures, in a process where no compiler library has been loaded yet.

use std::path::Path;

use iree_compiler::{Compiler, Error};

#[test]
fn missing_or_invalid_library_is_a_clear_error() {
    let err = Compiler::load(Some(Path::new("/nonexistent/libIREECompiler.so"))).unwrap_err();
    assert!(matches!(err, Error::LibraryNotFound { .. }), "{err}");
    let text = err.to_string();
    assert!(text.contains("/nonexistent/libIREECompiler.so"), "{text}");
    assert!(text.contains("run `cargo xtask setup`"), "{text}");

    // A file that is not a shared library: the loader's message, naming the file.
    let dir = tempfile::tempdir().unwrap();
    let fake = dir.path().join("libIREECompiler.so");
    std::fs::write(&fake, b"not an ELF file").unwrap();
    let err = Compiler::load(Some(&fake)).unwrap_err();
    assert!(matches!(err, Error::LibraryLoad { .. }), "{err}");
    assert!(err.to_string().contains(&*fake.to_string_lossy()), "{err}");
}
