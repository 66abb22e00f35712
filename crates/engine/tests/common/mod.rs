//! What the engine's integration tests share: the repository root and the fixture families.

#![allow(clippy::unwrap_used, dead_code)] // test helpers; not every test binary uses each

use std::path::{Path, PathBuf};

pub fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// Every fixture family (a folder under tests/fixtures), sorted.
pub fn families() -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(root().join("tests/fixtures"))
        .unwrap()
        .flatten()
        .filter(|e| e.path().is_dir())
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    names
}
