//! Finding `libIREECompiler` on disk: explicit path, then `IREE_COMPILER_LIB`, then the venv
//! that `cargo xtask setup` creates under `<workspace>/target/venv`.

use std::path::{Path, PathBuf};

use crate::error::Error;

/// Environment variable naming the compiler library file.
pub const LIB_ENV: &str = "IREE_COMPILER_LIB";

/// The library's file name on this platform.
pub const LIB_FILE_NAME: &str = if cfg!(target_os = "macos") {
    "libIREECompiler.dylib"
} else if cfg!(windows) {
    "IREECompiler.dll"
} else {
    "libIREECompiler.so"
};

/// Workspace root baked in at build time by `.cargo/config.toml`; absent when this crate is
/// built outside the workspace.
const WORKSPACE_ROOT: Option<&str> = option_env!("MLX_IREE_ROOT");

/// Resolves the library path. An explicit path or `IREE_COMPILER_LIB` is used as given (and
/// must exist: a wrong setting is reported, not silently replaced by another library).
pub fn locate_library(explicit: Option<&Path>) -> Result<PathBuf, Error> {
    if let Some(path) = explicit {
        return existing(path.to_path_buf());
    }
    if let Some(env) = std::env::var_os(LIB_ENV).filter(|v| !v.is_empty()) {
        return existing(PathBuf::from(env));
    }
    let candidates = WORKSPACE_ROOT.map(|root| venv_candidates(&Path::new(root).join("target").join("venv")));
    let candidates = candidates.unwrap_or_default();
    match candidates.iter().find(|p| p.is_file()) {
        Some(found) => Ok(found.clone()),
        None => Err(Error::LibraryNotFound { searched: candidates }),
    }
}

/// Where a pip-installed `iree-base-compiler` keeps the library inside `venv`, newest Python
/// first (`lib/python3.X/site-packages` on Unix, `Lib/site-packages` on Windows).
pub fn venv_candidates(venv: &Path) -> Vec<PathBuf> {
    let tail = Path::new("site-packages").join("iree").join("compiler").join("_mlir_libs").join(LIB_FILE_NAME);
    let mut pythons: Vec<PathBuf> = std::fs::read_dir(venv.join("lib"))
        .map(|entries| {
            entries
                .filter_map(Result::ok)
                .filter(|e| e.file_name().to_string_lossy().starts_with("python3"))
                .map(|e| e.path())
                .collect()
        })
        .unwrap_or_default();
    // Newest first, comparing the minor version numerically (python3.9 < python3.11).
    pythons.sort_by_key(|p| {
        let name = p.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
        std::cmp::Reverse(name.trim_start_matches("python3.").parse::<u32>().unwrap_or(0))
    });
    let mut out: Vec<PathBuf> = pythons.into_iter().map(|p| p.join(&tail)).collect();
    if out.is_empty() {
        // Nothing installed yet: name the path the error should point at.
        out.push(venv.join("lib").join("python3.*").join(&tail));
    }
    out.push(venv.join("Lib").join(&tail));
    out
}

fn existing(path: PathBuf) -> Result<PathBuf, Error> {
    if path.is_file() { Ok(path) } else { Err(Error::LibraryNotFound { searched: vec![path] }) }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn venv_layout_prefers_newest_python() {
        let dir = tempfile::tempdir().unwrap();
        let venv = dir.path();
        for py in ["python3.9", "python3.11"] {
            let libs = venv.join("lib").join(py).join("site-packages/iree/compiler/_mlir_libs");
            std::fs::create_dir_all(&libs).unwrap();
        }
        let c = venv_candidates(venv);
        assert_eq!(c[0], venv.join("lib/python3.11/site-packages/iree/compiler/_mlir_libs").join(LIB_FILE_NAME));
        assert_eq!(c[1], venv.join("lib/python3.9/site-packages/iree/compiler/_mlir_libs").join(LIB_FILE_NAME));
        assert_eq!(c.len(), 3);
    }

    #[test]
    fn explicit_missing_path_is_reported() {
        let err = locate_library(Some(Path::new("/nonexistent/libIREECompiler.so"))).unwrap_err().to_string();
        assert!(err.contains("/nonexistent/libIREECompiler.so"), "{err}");
        assert!(err.contains("cargo xtask setup"), "{err}");
    }
}
