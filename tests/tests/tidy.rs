//! Tidy: fails when the code and the docs drift apart, or when a crate breaks the workspace
//! rules of docs/ARCHITECTURE.md (every file says what it is for; libraries read no
//! environment variable and print nothing; every crate has its section in
//! docs/ARCHITECTURE.md; every environment variable the code reads is in the README;
//! workspace dependencies follow the layering; `unsafe` only in the crates that wrap C, each
//! block with its `// SAFETY:` comment).

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
fn every_crate_has_its_section_in_the_architecture_doc() {
    let doc = std::fs::read_to_string(root().join("docs/ARCHITECTURE.md")).unwrap();
    let headings: Vec<&str> = doc.lines().filter_map(|l| l.strip_prefix("### ")).collect();
    let mut missing = Vec::new();
    for entry in std::fs::read_dir(root().join("crates")).unwrap().flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        if !headings.contains(&format!("`crates/{name}`").as_str()) {
            missing.push(name);
        }
    }
    assert!(missing.is_empty(), "crates without a \"### `crates/NAME`\" section in docs/ARCHITECTURE.md: {missing:?}");
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
    // Set by `cargo xtask compile-matrix --family NAME` for crates/engine/tests/compile_matrix.rs.
    "MLX_IREE_MATRIX_FAMILIES",
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

/// What each workspace package may depend on among the others, as docs/ARCHITECTURE.md's
/// "Layering" draws it: `[dependencies]`, `[build-dependencies]` and their `[target.*]`
/// forms (dev-dependencies are free: a test may use anything). A dependency that is not
/// listed fails; so does a listed one that is gone, so the list stays the real graph.
const LAYERING: &[(&str, &[&str])] = &[
    ("iree-sys", &[]),
    ("iree-hal", &["iree-sys"]),
    ("iree-compiler", &[]),
    ("hlo-emit", &[]),
    ("weights", &[]),
    ("kernels", &[]),
    ("models", &["hlo-emit", "weights", "kernels"]),
    ("engine", &["iree-compiler", "iree-hal", "models", "kernels", "weights"]),
    ("text", &[]),
    ("hub", &[]),
    ("cpu-share", &[]),
    ("server", &["engine", "text"]),
    // The binary: the engine and the text side it joins, the server, the hub and bench's
    // `cpu-share`; `demo` builds, compiles and runs a graph itself (hlo-emit, iree-compiler,
    // iree-hal), `download` checks config.json with `models`, and `bench` plans and compiles
    // the engine's modules itself to time the cold compile and count dispatches (`models`,
    // `weights`, `iree-compiler`).
    (
        "mlx-iree",
        &["engine", "text", "server", "hub", "cpu-share", "hlo-emit", "iree-compiler", "iree-hal", "models", "weights"],
    ),
    // Builds before anything of IREE or LLVM exists.
    ("xtask", &["cpu-share"]),
    // tests/: graphs built with hlo-emit, compiled and run.
    ("e2e", &["hlo-emit", "iree-compiler", "iree-hal"]),
];

/// A package's manifest as the layering check reads it: its name and the names of the
/// dependencies of each section that counts.
struct Manifest {
    name: String,
    /// (section header, dependency name), in file order.
    deps: Vec<(String, String)>,
}

/// Reads the package name and the dependency names of a Cargo.toml written as this workspace
/// writes them: `name.workspace = true`, `name = "1"`, `name = { ... }` (`package = "..."`
/// honoured) one a line, or a `[dependencies.name]` table. Anything else inside a dependency
/// section is a parse failure, not a silent skip.
fn manifest(path: &Path) -> Manifest {
    let text = std::fs::read_to_string(path).unwrap();
    let (mut name, mut section, mut deps) = (None, String::new(), Vec::new());
    let counts = |section: &str| {
        let last = section.rsplit('.').next().unwrap_or(section);
        let is_target = section.starts_with("target.") || !section.contains('.');
        is_target && matches!(last, "dependencies" | "build-dependencies")
    };
    for line in text.lines().map(str::trim).filter(|l| !l.is_empty() && !l.starts_with('#')) {
        if let Some(header) = line.strip_prefix('[').and_then(|l| l.strip_suffix(']')) {
            section = header.trim().to_owned();
            // `[dependencies.name]`: a table of its own.
            for kind in ["dependencies.", "build-dependencies."] {
                if let Some(dep) = section.strip_prefix(kind) {
                    deps.push((kind.trim_end_matches('.').to_owned(), dep.to_owned()));
                }
            }
            continue;
        }
        let counted = counts(&section);
        let Some((key, value)) = line.split_once('=') else {
            // A value continued over lines (an array) outside the dependency sections.
            assert!(!counted, "{}: [{section}] cannot read `{line}`", rel(path));
            continue;
        };
        let key = key.trim();
        if section == "package" && key == "name" {
            name = Some(value.trim().trim_matches('"').to_owned());
        } else if counted {
            let dep = key.strip_suffix(".workspace").unwrap_or(key);
            assert!(
                dep.chars().all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_'),
                "{}: [{section}] line `{line}` is not `name = ...` or `name.workspace = true`",
                rel(path)
            );
            let renamed = value.split_once("package").and_then(|(_, p)| p.split('"').nth(1));
            deps.push((section.clone(), renamed.unwrap_or(dep).to_owned()));
        }
    }
    Manifest { name: name.unwrap_or_else(|| panic!("{}: no [package] name", rel(path))), deps }
}

/// Every workspace package's manifest: crates/*, xtask and tests.
fn workspace_manifests() -> Vec<(PathBuf, Manifest)> {
    let mut paths: Vec<PathBuf> = std::fs::read_dir(root().join("crates"))
        .unwrap()
        .flatten()
        .map(|e| e.path().join("Cargo.toml"))
        .filter(|p| p.exists())
        .collect();
    paths.sort();
    paths.extend([root().join("xtask/Cargo.toml"), root().join("tests/Cargo.toml")]);
    paths.into_iter().map(|p| (p.clone(), manifest(&p))).collect()
}

#[test]
fn workspace_dependencies_follow_the_layering() {
    let manifests = workspace_manifests();
    let names: Vec<&str> = manifests.iter().map(|(_, m)| m.name.as_str()).collect();
    let mut bad = Vec::new();
    for name in &names {
        if !LAYERING.iter().any(|(n, _)| n == name) {
            bad.push(format!(
                "{name}: a workspace package missing from LAYERING (add it, and to docs/ARCHITECTURE.md)"
            ));
        }
    }
    for (package, _) in LAYERING {
        if !names.contains(package) {
            bad.push(format!("{package}: in LAYERING but no workspace package"));
        }
    }
    for (path, m) in &manifests {
        let Some((_, allowed)) = LAYERING.iter().find(|(n, _)| *n == m.name) else { continue };
        let used: Vec<&str> = m.deps.iter().map(|(_, d)| d.as_str()).filter(|d| names.contains(d)).collect();
        for (section, dep) in m.deps.iter().filter(|(_, d)| names.contains(&d.as_str())) {
            if !allowed.contains(&dep.as_str()) {
                bad.push(format!("{}: [{section}] {dep}: {} may not depend on {dep}", rel(path), m.name));
            }
        }
        for dep in allowed.iter().filter(|d| !used.contains(d)) {
            bad.push(format!("{}: LAYERING lets {} use {dep}, which it no longer does", rel(path), m.name));
        }
    }
    assert!(bad.is_empty(), "workspace dependencies against docs/ARCHITECTURE.md's layering:\n{}", bad.join("\n"));
}

/// `text` with every comment and every string and character literal blanked (newlines
/// kept, so line numbers hold): what is left is code.
fn blank_comments_and_literals(text: &str) -> String {
    let chars: Vec<char> = text.chars().collect();
    let mut out = String::with_capacity(text.len());
    let ident = |c: char| c.is_alphanumeric() || c == '_';
    // Blanks chars[from..to] into `out`.
    let blank = |out: &mut String, from: usize, to: usize| {
        out.extend(chars[from..to].iter().map(|&c| if c == '\n' { '\n' } else { ' ' }));
    };
    let mut i = 0;
    while i < chars.len() {
        let c = chars[i];
        let next = chars.get(i + 1).copied();
        let prev = if i > 0 { chars[i - 1] } else { ' ' };
        if c == '/' && next == Some('/') {
            let end = chars[i..].iter().position(|&c| c == '\n').map_or(chars.len(), |n| i + n);
            blank(&mut out, i, end);
            i = end;
        } else if c == '/' && next == Some('*') {
            // Block comments nest.
            let (mut depth, mut j) = (0, i);
            while j < chars.len() {
                if chars[j] == '/' && chars.get(j + 1) == Some(&'*') {
                    depth += 1;
                    j += 2;
                } else if chars[j] == '*' && chars.get(j + 1) == Some(&'/') {
                    depth -= 1;
                    j += 2;
                    if depth == 0 {
                        break;
                    }
                } else {
                    j += 1;
                }
            }
            blank(&mut out, i, j);
            i = j;
        } else if c == 'r' && (!ident(prev) || matches!(prev, 'b' | 'c') && (i < 2 || !ident(chars[i - 2]))) {
            // A raw string `r#"..."#` (`br`, `cr` too), else an identifier starting with r.
            let hashes = chars[i + 1..].iter().take_while(|&&c| c == '#').count();
            if chars.get(i + 1 + hashes) == Some(&'"') {
                let close: String = std::iter::once('"').chain(std::iter::repeat_n('#', hashes)).collect();
                let body = i + 2 + hashes;
                let rest: String = chars[body..].iter().collect();
                let end = body + rest.find(&close).map_or(rest.chars().count(), |b| rest[..b].chars().count());
                out.push('r');
                blank(&mut out, i + 1, (end + close.len()).min(chars.len()));
                i = end + close.len();
            } else {
                out.push(c);
                i += 1;
            }
        } else if c == '"' {
            let mut j = i + 1;
            while j < chars.len() && chars[j] != '"' {
                j += if chars[j] == '\\' { 2 } else { 1 };
            }
            blank(&mut out, i, (j + 1).min(chars.len()));
            i = j + 1;
        } else if c == '\'' && (next == Some('\\') || chars.get(i + 2) == Some(&'\'')) {
            // A character or byte literal; `'a` without a closing quote two on is a lifetime or
            // a label.
            let mut j = i + 1;
            while j < chars.len() && chars[j] != '\'' {
                j += if chars[j] == '\\' { 2 } else { 1 };
            }
            blank(&mut out, i, (j + 1).min(chars.len()));
            i = j + 1;
        } else {
            out.push(c);
            i += 1;
        }
    }
    out
}

/// Where `word` stands as a whole word in `line` (not inside a longer identifier).
fn find_word(line: &str, word: &str) -> Option<usize> {
    let ident = |c: char| c.is_alphanumeric() || c == '_';
    line.match_indices(word).map(|(at, _)| at).find(|&at| {
        !line[..at].chars().next_back().is_some_and(ident) && !line[at + word.len()..].chars().next().is_some_and(ident)
    })
}

/// The files that may hold `unsafe` code (a folder: every file below it), with why. The list
/// is exact: an entry whose files no longer hold any fails too.
const UNSAFE_ALLOWED: &[(&str, &str)] = &[
    ("crates/iree-sys/", "the bindgen FFI over the IREE runtime, and its link test"),
    ("crates/iree-hal/", "the safe RAII wrapper over iree-sys, and its leak-check example"),
    ("crates/iree-compiler/", "the dynamically loaded compiler C API, and sigaction around its calls"),
    ("crates/weights/src/file.rs", "the mmap of a checkpoint file"),
    ("crates/kernels/src/cpu.rs", "arch_prctl, asking Linux for the AMX tile state"),
    ("crates/hub/src/disk.rs", "statvfs: the cache's free space"),
    ("crates/mlx-iree/tests/chat.rs", "openpty and a controlling terminal for the child, in a test"),
    ("xtask/src/util.rs", "prctl(PR_SET_PDEATHSIG) in a child before exec"),
];

#[test]
fn unsafe_code_stays_in_the_crates_that_wrap_c() {
    let (mut bad, mut used) = (Vec::new(), vec![false; UNSAFE_ALLOWED.len()]);
    for file in ["crates", "xtask", "tests"].iter().flat_map(|d| rust_files(&root().join(d))) {
        let name = rel(&file);
        let code = blank_comments_and_literals(&std::fs::read_to_string(&file).unwrap());
        for (n, line) in code.lines().enumerate() {
            if find_word(line, "unsafe").is_none() {
                continue;
            }
            match UNSAFE_ALLOWED.iter().position(|(f, _)| name.starts_with(f)) {
                Some(at) => used[at] = true,
                None => bad.push(format!("{name}:{}: `unsafe` outside UNSAFE_ALLOWED", n + 1)),
            }
        }
    }
    for ((place, _), used) in UNSAFE_ALLOWED.iter().zip(used) {
        if !used {
            bad.push(format!(
                "{place}: in UNSAFE_ALLOWED but holds no `unsafe` (remove it, and from docs/ARCHITECTURE.md)"
            ));
        }
    }
    assert!(bad.is_empty(), "unsafe code only where docs/ARCHITECTURE.md says:\n{}", bad.join("\n"));
}

/// Every `unsafe` block and `unsafe impl` carries a `// SAFETY:` comment: on its line, or in
/// the comment lines just above the statement it is in (a statement continued from lines
/// ending in `=` counts as one). Clippy's `undocumented_unsafe_blocks` (a workspace lint,
/// an error under `cargo xtask test`'s `-D warnings`) says the same for the code it compiles on
/// the CI host; this also covers code behind other targets' `cfg`s.
#[test]
fn every_unsafe_block_says_why_it_is_sound() {
    let mut bad = Vec::new();
    for file in ["crates", "xtask", "tests"].iter().flat_map(|d| rust_files(&root().join(d))) {
        let text = std::fs::read_to_string(&file).unwrap();
        let (lines, code): (Vec<&str>, String) = (text.lines().collect(), blank_comments_and_literals(&text));
        let code: Vec<&str> = code.lines().collect();
        for (n, line) in code.iter().enumerate() {
            let Some(at) = find_word(line, "unsafe") else { continue };
            let after = line[at + "unsafe".len()..].trim_start();
            // `unsafe fn`, `unsafe extern`, `unsafe trait` and `unsafe(...)` attributes need none.
            let next_code = after.is_empty().then(|| code.get(n + 1).map_or("", |l| l.trim_start()));
            let after = next_code.unwrap_or(after);
            if !(after.starts_with('{') || after.starts_with("impl")) {
                continue;
            }
            let mut documented = lines[n].contains("SAFETY:");
            let mut k = n;
            while !documented && k > 0 {
                k -= 1;
                let above = lines[k].trim();
                let statement_goes_on = code[k].trim_end().ends_with('=');
                if !(above.starts_with("//") || above.starts_with("#[") || statement_goes_on) {
                    break;
                }
                documented = above.starts_with("//") && above.contains("SAFETY:");
            }
            if !documented {
                bad.push(format!("{}:{}: {}", rel(&file), n + 1, lines[n].trim()));
            }
        }
    }
    assert!(bad.is_empty(), "unsafe without a `// SAFETY:` comment:\n{}", bad.join("\n"));
}

/// The repository stands on its own: no comment or doc cites the design brief that lives
/// outside it (its facts are in docs/ARCHITECTURE.md, "Toolchain facts").
#[test]
fn nothing_cites_a_document_outside_the_repository() {
    let word = ["BR", "IEF"].concat();
    let mut files: Vec<PathBuf> =
        ["crates", "xtask", "tests"].iter().flat_map(|d| rust_files(&root().join(d))).collect();
    files.extend(["README.md", "docs/ARCHITECTURE.md", "docs/PERFORMANCE.md"].map(|f| root().join(f)));
    let mut found = Vec::new();
    for file in files {
        let text = std::fs::read_to_string(&file).unwrap();
        for (n, line) in text.lines().enumerate() {
            if line.contains(&word) {
                found.push(format!("{}:{}: {}", rel(&file), n + 1, line.trim()));
            }
        }
    }
    assert!(found.is_empty(), "cites the outside brief; cite docs/ instead:\n{}", found.join("\n"));
}
