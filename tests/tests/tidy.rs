//! Tidy: fails when the code and the docs drift apart, or when a library breaks the
//! workspace rules of BRIEF section 2 (every file says what it is for; libraries read no
//! environment variable and print nothing; every crate has its paragraph in
//! docs/ARCHITECTURE.md; every environment variable the code reads is in the README).

#![allow(clippy::unwrap_used)] // a test that cannot unwrap has failed

use std::path::{Path, PathBuf};

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// Every `.rs` file below `dir` (build outputs and fixtures skipped), sorted.
fn rust_files(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for entry in std::fs::read_dir(&d).unwrap().flatten() {
            let path = entry.path();
            let name = entry.file_name();
            if path.is_dir() && !matches!(name.to_str(), Some("target" | "fixtures" | "fixtures-trained" | ".git")) {
                stack.push(path);
            } else if path.extension().is_some_and(|e| e == "rs") {
                out.push(path);
            }
        }
    }
    out.sort();
    out
}

fn rel(path: &Path) -> String {
    path.strip_prefix(root()).unwrap_or(path).display().to_string()
}

/// Lines that are code, not comments (doc examples may print).
fn code_lines(text: &str) -> impl Iterator<Item = (usize, &str)> {
    text.lines().enumerate().filter(|(_, l)| !l.trim_start().starts_with("//")).map(|(i, l)| (i + 1, l))
}

#[test]
fn every_rust_file_starts_with_what_it_is_for() {
    let bad: Vec<String> = ["crates", "xtask", "tests"]
        .iter()
        .flat_map(|d| rust_files(&root().join(d)))
        .filter(|f| !std::fs::read_to_string(f).unwrap().starts_with("//!"))
        .map(|f| rel(&f))
        .collect();
    assert!(bad.is_empty(), "files without a leading `//!` line: {bad:?}");
}

#[test]
fn every_crate_has_its_paragraph_in_the_architecture_doc() {
    let doc = std::fs::read_to_string(root().join("docs/ARCHITECTURE.md")).unwrap();
    let mut missing = Vec::new();
    for entry in std::fs::read_dir(root().join("crates")).unwrap().flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        if !doc.contains(&format!("**`crates/{name}`**")) {
            missing.push(name);
        }
    }
    assert!(missing.is_empty(), "crates without a **`crates/NAME`** paragraph in docs/ARCHITECTURE.md: {missing:?}");
}

/// Library code that reads the environment, with why it may.
const ENV_ALLOWED: [(&str, &str); 1] =
    [("crates/iree-compiler/src/locate.rs", "finds libIREECompiler.so before any config exists (IREE_COMPILER_LIB)")];

#[test]
fn libraries_read_no_environment_and_print_nothing() {
    let mut bad = Vec::new();
    for krate in std::fs::read_dir(root().join("crates")).unwrap().flatten() {
        // The binary is the one place that reads the environment and prints.
        if krate.file_name() == "mlx-iree" {
            continue;
        }
        for file in rust_files(&krate.path().join("src")) {
            let name = rel(&file);
            let text = std::fs::read_to_string(&file).unwrap();
            for (n, line) in code_lines(&text) {
                let env = line.contains("env::var");
                let print = ["println!", "eprintln!", "print!(", "eprint!("].iter().any(|p| line.contains(p));
                if (env && !ENV_ALLOWED.iter().any(|(f, _)| *f == name)) || print {
                    bad.push(format!("{name}:{n}: {}", line.trim()));
                }
            }
        }
    }
    assert!(bad.is_empty(), "libraries take settings as values and log through tracing:\n{}", bad.join("\n"));
}

/// Variables our own tooling sets, which users do not: not in the README's table.
const ENV_INTERNAL: &[&str] = &[
    // Set by .cargo/config.toml for every cargo command.
    "MLX_IREE_ROOT",
    // IREE's CMake variable, which `cargo xtask build-iree --target cuda` sets.
    "IREE_CUDA_DEPS_DIR",
    // Set by xtask for the mlx-lm it runs (fixtures, model conversion), never read.
    "HF_HUB_DISABLE_TELEMETRY",
    // Set by iree-compiler's tests/concurrent.rs for the fresh processes it starts (itself).
    "MLX_IREE_TEST_FIRST_COMPILES_CHILD",
    // Set by `cargo xtask compile-matrix` for crates/engine/tests/compile_matrix.rs.
    "MLX_IREE_BLESS_CAPABILITIES",
    // Re-records crates/engine/tests/mlir_golden.txt (the emitted graphs' hashes).
    "MLX_IREE_BLESS_MLIR",
];

#[test]
fn every_environment_variable_the_code_reads_is_documented() {
    let readme = std::fs::read_to_string(root().join("README.md")).unwrap();
    let mut missing = Vec::new();
    for file in ["crates", "xtask"].iter().flat_map(|d| rust_files(&root().join(d))) {
        let text = std::fs::read_to_string(&file).unwrap();
        for (n, line) in code_lines(&text) {
            for quoted in line.split('"').skip(1).step_by(2) {
                let is_var =
                    (quoted.starts_with("MLX_IREE_") || quoted.starts_with("IREE_") || quoted.starts_with("HF_"))
                        && quoted.chars().all(|c| c.is_ascii_uppercase() || c.is_ascii_digit() || c == '_');
                if is_var && !ENV_INTERNAL.contains(&quoted) && !readme.contains(&format!("| `{quoted}` |")) {
                    missing.push(format!("{}:{n}: {quoted}", rel(&file)));
                }
            }
        }
    }
    assert!(missing.is_empty(), "variables missing from the README's environment table:\n{}", missing.join("\n"));
}
