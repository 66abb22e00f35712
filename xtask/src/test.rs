//! `cargo xtask test`: the README's test command, also what `.ci/run` calls.
//!
//! The lint gates first (`cargo fmt --check`, then, once set-up has made melior buildable,
//! `cargo clippy --workspace --all-targets -- -D warnings`), then the whole workspace's
//! tests on CPU: `cargo test
//! --no-run` builds every test binary, then they and the doc tests run [`LANES`] at a time,
//! the longest first (cargo test runs them one after another, and most of this suite's time
//! is IREE compiling modules on one core each: a binary's sequential stretches left the
//! second core idle).

use crate::build_iree::{self, Target};
use crate::util::{self, progress};
use anyhow::{Context, Result, bail};
use serde_json::Value;
use std::collections::{BTreeMap, VecDeque};
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::Mutex;
use std::time::Instant;

/// The venv with the pinned `openai` client that crates/mlx-iree/tests/openai.rs drives
/// (found there as target/client-venv).
pub fn client_venv() -> Result<std::path::PathBuf> {
    let pins = crate::pins::Pins::load()?;
    let venv = util::target_dir().join("client-venv");
    util::python_venv(&venv, &pins.test_clients.python_packages, "test", "openai client", &["-c", "import openai"])?;
    Ok(venv)
}

/// Test binaries running at once. The suite's machine has two cores, and a module compile
/// keeps one busy; binaries share compiled modules through the on-disk cache, whose
/// per-key lock makes a binary wait for a module another one is compiling rather than
/// compile it again (docs/PERFORMANCE.md, "Test suite time (2026-12-02, noon)").
const LANES: usize = 2;

/// The longest test binaries (integration test targets), longest first as measured in the
/// suite (docs/PERFORMANCE.md): they start first, so that the short ones fill in beside
/// them and no long one starts last. Every other binary follows in cargo's order.
const LONGEST_FIRST: &[&str] = &[
    "gate",
    "batch",
    "hub",
    "fixtures",
    "vulkan",
    "chat",
    "stored_parameters",
    "scheduler",
    "http",
    "concurrent",
    "bench",
];

pub fn run(args: &[String]) -> Result<()> {
    let passthrough = match args.split_first() {
        Some((dashdash, rest)) if dashdash == "--" => rest,
        Some((other, _)) => bail!("test: unexpected argument `{other}` (pass cargo test arguments after `--`)"),
        None => &[],
    };
    // Formatting needs nothing built: checked before set-up, so a misformatted change fails
    // in seconds rather than after it.
    check_formatting()?;
    let toolchain = crate::setup::run()?;
    build_iree::build(&toolchain, Target::Cpu)?;
    // Clippy needs LLVM/MLIR (melior) and the runtime (iree-sys's bindings), nothing more, so
    // it fails a change before the model conversion and the tests.
    check_lints()?;
    // The SmolLM2 tests compare against mlx-lm's trajectories on the converted model.
    crate::model::run(&[])?;
    client_venv()?;
    let started = Instant::now();
    // Cargo's own options, then the test binaries' (after a second `--`).
    let (cargo_args, harness_args) = match passthrough.iter().position(|a| a == "--") {
        Some(i) => (&passthrough[..i], &passthrough[i + 1..]),
        None => (passthrough, &[][..]),
    };
    if cargo_args.iter().all(|a| a == "--no-fail-fast") {
        let no_fail_fast = !cargo_args.is_empty();
        side_by_side(no_fail_fast, harness_args)?;
    } else {
        // Any other cargo option (a package, a target, a test name filter, a profile):
        // cargo test as given, one binary after another.
        progress("test", "cargo test --workspace (first run compiles melior and the IREE bindings: several minutes)");
        util::run(cargo_test().args(passthrough))?;
    }
    progress("test", format!("all tests passed in {:.0} s", started.elapsed().as_secs_f64()));
    Ok(())
}

/// `cargo fmt --check` over the workspace; an error naming the fix when a file differs (cargo
/// fmt prints the diff above it).
fn check_formatting() -> Result<()> {
    progress("test", "cargo fmt --check");
    let mut cmd = Command::new(util::cargo());
    cmd.current_dir(util::root()).args(["fmt", "--check"]);
    let status = cmd.status().context("could not start `cargo fmt --check` (rustup component add rustfmt)")?;
    if !status.success() {
        bail!(
            "cargo fmt --check failed ({status}): the diff above is what `cargo fmt` would change; run it and commit"
        );
    }
    Ok(())
}

/// `cargo clippy --workspace --all-targets -- -D warnings`; an error when any lint fires.
///
/// It runs with the test build's environment ([`suite_env`]) and profile, so the
/// dependencies' build scripts (mlir-sys's bindgen run over MLIR) and proc macros (melior's
/// dialect tables) are the ones the test build then reuses, built once (the root Cargo.toml's
/// `profile.dev.build-override` says why that needs stating). What clippy adds: a check of
/// the dependencies (metadata only), the workspace's own build scripts (iree-sys's bindgen, the
/// kernel objects: clippy's compiler wrapper is part of their hash) and a lint pass over the
/// workspace's crates.
fn check_lints() -> Result<()> {
    progress(
        "test",
        "cargo clippy --workspace --all-targets -- -D warnings (first run builds melior: several minutes)",
    );
    let started = Instant::now();
    let mut cmd = Command::new(util::cargo());
    cmd.current_dir(util::root()).args(["clippy", "--workspace", "--all-targets", "--", "-D", "warnings"]);
    suite_env(&mut cmd);
    let status = cmd.status().context("could not start `cargo clippy` (rustup component add clippy)")?;
    if !status.success() {
        bail!(
            "cargo clippy failed ({status}): every warning above fails the suite; fix it (an #[allow] goes on \
             the one item, with a one-line reason)"
        );
    }
    progress("test", format!("clippy clean in {:.0} s", started.elapsed().as_secs_f64()));
    Ok(())
}

/// `cargo xtask test-vulkan`: set-up, then every fixture family on `--device vulkan`
/// (crates/mlx-iree/tests/vulkan.rs with its ignored tests: lavapipe is too slow for all of
/// them in the suite).
pub fn run_vulkan(args: &[String]) -> Result<()> {
    util::no_args("test-vulkan", args)?;
    let what = "every fixture family on --device vulkan (lavapipe: several minutes)";
    one_test_binary("test-vulkan", what, ["mlx-iree", "vulkan"], &["--include-ignored"], &[])?;
    Ok(())
}

/// `cargo xtask compile-matrix [--family NAME]...`: set-up, then every fixture family (or
/// only the named ones) at every precision compiled for every target
/// (crates/engine/tests/compile_matrix.rs's ignored test), the outcome written into
/// docs/capabilities.json (the named families' cells replaced, the others kept as recorded)
/// and the README's capability table. A new family needs only its own row of modules, not
/// the whole matrix again.
pub fn run_compile_matrix(args: &[String]) -> Result<()> {
    let mut families = Vec::new();
    let mut rest = args.iter();
    while let Some(arg) = rest.next() {
        match (arg.as_str(), rest.next()) {
            ("--family", Some(name)) if !name.is_empty() && !name.contains(',') => families.push(name.clone()),
            ("--family", _) => bail!("compile-matrix: --family takes one fixture family's name"),
            (other, _) => bail!("compile-matrix: unexpected argument `{other}` (expected --family NAME)"),
        }
    }
    let what = if families.is_empty() {
        "every family x precision x target (about 300 modules: tens of minutes cold)".to_owned()
    } else {
        format!("{} x every precision x target", families.join(", "))
    };
    let harness = ["--include-ignored", "every_family_compiles_everywhere"];
    let only = families.join(",");
    let mut env = vec![("MLX_IREE_BLESS_CAPABILITIES", "1")];
    if !families.is_empty() {
        env.push(("MLX_IREE_MATRIX_FAMILIES", only.as_str()));
    }
    let secs = one_test_binary("compile-matrix", &what, ["engine", "compile_matrix"], &harness, &env)?;
    progress("compile-matrix", format!("docs/capabilities.json and README.md written in {secs:.0} s"));
    Ok(())
}

/// Set-up, the runtime, then one test binary (`[package, test]`) with the suite's
/// environment (and `env`), its harness given `harness`; the seconds it took.
fn one_test_binary(
    stage: &str,
    what: &str,
    [package, test]: [&str; 2],
    harness: &[&str],
    env: &[(&str, &str)],
) -> Result<f64> {
    let toolchain = crate::setup::run()?;
    build_iree::build(&toolchain, Target::Cpu)?;
    let started = Instant::now();
    progress(stage, what);
    let mut cmd = Command::new(util::cargo());
    cmd.current_dir(util::root()).args(["test", "-p", package, "--test", test, "--"]).args(harness);
    cmd.envs(env.iter().copied());
    suite_env(&mut cmd);
    util::run(&mut cmd)?;
    let secs = started.elapsed().as_secs_f64();
    progress(stage, format!("passed in {secs:.0} s"));
    Ok(secs)
}

/// `cargo test --workspace` with the suite's environment: xtask's own unit tests too (they
/// were left out until 2026-12-07, and one had gone stale unseen).
fn cargo_test() -> Command {
    let mut cmd = Command::new(util::cargo());
    cmd.current_dir(util::root()).args(["test", "--workspace"]);
    suite_env(&mut cmd);
    cmd
}

/// What every test process of the suite gets.
fn suite_env(cmd: &mut Command) {
    // One compile keeps about one core busy, and test threads compile side by side;
    // IREE's shared compiler thread pool then only adds contention (one fixture
    // module: 14.3 s alone against 15.9 s with the pool, two at once in one process
    // 19.4 s against 24.1 s; docs/PERFORMANCE.md, "Compile time").
    cmd.env("IREE_COMPILER_TASK_COUNT", "1");
}

/// One test binary cargo built, and how cargo test would run it.
#[derive(Debug, Clone)]
struct Binary {
    package: String,
    version: String,
    manifest: PathBuf,
    /// `lib`, `bin` or `test`.
    kind: String,
    name: String,
    src: PathBuf,
    exe: PathBuf,
}

impl Binary {
    /// What cargo test prints before running it: `unittests src/lib.rs` or `tests/gate.rs`.
    fn shown(&self) -> String {
        let dir = self.manifest.parent().unwrap_or(Path::new(""));
        let src = self.src.strip_prefix(dir).unwrap_or(&self.src).display().to_string();
        let exe = self.exe.strip_prefix(util::root()).unwrap_or(&self.exe).display().to_string();
        let unit = if self.kind == "test" { src } else { format!("unittests {src}") };
        format!("{unit} ({exe})")
    }

    /// The command cargo test runs: the binary in its package's folder, with cargo's
    /// variables for it.
    fn command(&self, harness_args: &[String]) -> Command {
        let mut cmd = Command::new(&self.exe);
        let dir = self.manifest.parent().unwrap_or(Path::new("."));
        // xtask runs under `cargo run`, which gave it its own package's variables.
        for (key, _) in std::env::vars_os() {
            let key = key.to_string_lossy();
            let package = ["CARGO_PKG_", "CARGO_CRATE_", "CARGO_BIN_", "CARGO_MANIFEST_"];
            if package.iter().any(|p| key.starts_with(p)) || key == "CARGO_PRIMARY_PACKAGE" {
                cmd.env_remove(&*key);
            }
        }
        cmd.args(harness_args)
            .current_dir(dir)
            .env("CARGO", util::cargo())
            .env("CARGO_MANIFEST_DIR", dir)
            .env("CARGO_MANIFEST_PATH", &self.manifest)
            .env("CARGO_PKG_NAME", &self.package)
            .env("CARGO_PKG_VERSION", &self.version);
        suite_env(&mut cmd);
        cmd
    }
}

/// A piece of the suite one lane runs.
#[derive(Debug, Clone)]
enum Unit {
    Binary(Binary),
    /// `cargo test --doc` over the workspace.
    DocTests,
}

impl Unit {
    fn label(&self) -> String {
        match self {
            Unit::Binary(b) if b.kind == "test" => b.name.clone(),
            Unit::Binary(b) => format!("{} {}", b.package, b.kind),
            Unit::DocTests => "doc tests".into(),
        }
    }
}

/// How a unit went.
struct Outcome {
    label: String,
    seconds: f64,
    passed: bool,
}

/// Builds every test binary, runs them and the doc tests [`LANES`] at a time; fails if any
/// failed. Without `no_fail_fast`, nothing new starts after a failure (what runs finishes).
fn side_by_side(no_fail_fast: bool, harness_args: &[String]) -> Result<()> {
    progress("test", "cargo test --no-run (first run compiles melior and the IREE bindings: several minutes)");
    let build_started = Instant::now();
    let binaries = build_test_binaries()?;
    progress(
        "test",
        format!(
            "{} test binaries built in {:.0} s; running them {LANES} at a time, the longest first",
            binaries.len(),
            build_started.elapsed().as_secs_f64()
        ),
    );
    // The doc tests first: they compile as they run (rustdoc), which the longest binary, in
    // the other lane, overlaps.
    let mut queue: VecDeque<Unit> = [Unit::DocTests].into_iter().collect();
    queue.extend(order(binaries)?.into_iter().map(Unit::Binary));
    let logs = util::target_dir().join("test-logs");
    std::fs::create_dir_all(&logs).with_context(|| format!("creating {}", logs.display()))?;

    let cache = util::target_dir().join("test-compile-cache");
    let modules_before = cached_modules(&cache);
    let queue = Mutex::new(queue);
    let outcomes = Mutex::new(Vec::<Outcome>::new());
    let stop = std::sync::atomic::AtomicBool::new(false);
    let started = Instant::now();
    std::thread::scope(|s| {
        for lane in 0..LANES {
            let (queue, outcomes, stop, logs) = (&queue, &outcomes, &stop, &logs);
            s.spawn(move || {
                loop {
                    if stop.load(std::sync::atomic::Ordering::Relaxed) {
                        return;
                    }
                    let Some(unit) = queue.lock().unwrap_or_else(|e| e.into_inner()).pop_front() else { return };
                    let outcome = run_unit(&unit, lane, no_fail_fast, harness_args, logs, started);
                    if !outcome.passed && !no_fail_fast {
                        stop.store(true, std::sync::atomic::Ordering::Relaxed);
                    }
                    outcomes.lock().unwrap_or_else(|e| e.into_inner()).push(outcome);
                }
            });
        }
    });
    let outcomes = outcomes.into_inner().unwrap_or_else(|e| e.into_inner());
    let not_run: Vec<String> = queue.into_inner().unwrap_or_else(|e| e.into_inner()).iter().map(Unit::label).collect();

    let mut by_time: Vec<&Outcome> = outcomes.iter().collect();
    by_time.sort_by(|a, b| b.seconds.total_cmp(&a.seconds));
    let longest: Vec<String> = by_time.iter().take(8).map(|o| format!("{} {:.0} s", o.label, o.seconds)).collect();
    progress(
        "test",
        format!(
            "{} units in {:.0} s ({} lanes); longest: {}",
            outcomes.len(),
            started.elapsed().as_secs_f64(),
            LANES,
            longest.join(", ")
        ),
    );
    // Most of the suite's time is IREE compiling these: the number to watch when tests are
    // added (docs/PERFORMANCE.md, "Test suite time (2026-12-07)").
    let modules_after = cached_modules(&cache);
    progress(
        "test",
        format!(
            "{} modules compiled into {} ({modules_before} were there before)",
            modules_after.saturating_sub(modules_before),
            cache.display()
        ),
    );
    let failed: Vec<&str> = outcomes.iter().filter(|o| !o.passed).map(|o| o.label.as_str()).collect();
    if !failed.is_empty() {
        if !not_run.is_empty() {
            progress("test", format!("not run after the failure: {}", not_run.join(", ")));
        }
        bail!("test failed: {} (logs in {})", failed.join(", "), logs.display());
    }
    Ok(())
}

/// Compiled modules in the tests' compile cache (`<key>.vmfb`, parameter encoders not
/// counted); 0 when there is no such folder.
fn cached_modules(dir: &Path) -> usize {
    let Ok(entries) = std::fs::read_dir(dir) else { return 0 };
    entries
        .flatten()
        .filter(|e| {
            let name = e.file_name();
            let name = name.to_string_lossy();
            name.ends_with(".vmfb") && !name.ends_with(".encoder.vmfb")
        })
        .count()
}

/// `cargo test --no-run` over the workspace: the test binaries it built.
fn build_test_binaries() -> Result<Vec<Binary>> {
    let metadata = util::output(Command::new(util::cargo()).current_dir(util::root()).args([
        "metadata",
        "--no-deps",
        "--format-version",
        "1",
    ]))
    .context("cargo metadata failed")?;
    let metadata: Value = serde_json::from_str(&metadata).context("parsing cargo metadata")?;
    let mut packages = BTreeMap::new();
    for p in metadata["packages"].as_array().context("cargo metadata: no packages")? {
        let (Some(manifest), Some(name), Some(version)) =
            (p["manifest_path"].as_str(), p["name"].as_str(), p["version"].as_str())
        else {
            bail!("cargo metadata: a package without manifest_path, name or version");
        };
        packages.insert(PathBuf::from(manifest), (name.to_owned(), version.to_owned()));
    }

    let mut cmd = cargo_test();
    cmd.args(["--no-run", "--message-format=json-render-diagnostics"]).stdout(Stdio::piped());
    let shown = util::show(&cmd);
    let mut child = cmd.spawn().with_context(|| format!("could not start `{shown}`"))?;
    let stdout = child.stdout.take().context("cargo's stdout")?;
    let mut binaries = Vec::new();
    for line in BufReader::new(stdout).lines() {
        let line = line.context("reading cargo's messages")?;
        let Ok(msg) = serde_json::from_str::<Value>(&line) else { continue };
        if msg["reason"] != "compiler-artifact" || msg["profile"]["test"] != true {
            continue;
        }
        let Some(exe) = msg["executable"].as_str() else { continue };
        let manifest = PathBuf::from(msg["manifest_path"].as_str().context("artifact without manifest_path")?);
        let (package, version) = packages
            .get(&manifest)
            .cloned()
            .with_context(|| format!("{}: not a workspace package of cargo metadata", manifest.display()))?;
        let target = &msg["target"];
        binaries.push(Binary {
            package,
            version,
            manifest,
            kind: target["kind"][0].as_str().unwrap_or("test").to_owned(),
            name: target["name"].as_str().unwrap_or_default().to_owned(),
            src: PathBuf::from(target["src_path"].as_str().unwrap_or_default()),
            exe: PathBuf::from(exe),
        });
    }
    let status = child.wait().with_context(|| format!("waiting for `{shown}`"))?;
    if !status.success() {
        bail!("`{shown}` failed ({status})");
    }
    Ok(binaries)
}

/// [`LONGEST_FIRST`], then the rest as cargo test orders them (by package, then libraries,
/// binaries and tests, each by name). A name of [`LONGEST_FIRST`] no binary has fails, so
/// that the list follows renames.
fn order(mut binaries: Vec<Binary>) -> Result<Vec<Binary>> {
    let kind_rank = |kind: &str| match kind {
        "lib" => 0,
        "bin" => 1,
        _ => 2,
    };
    binaries.sort_by(|a, b| (&a.package, kind_rank(&a.kind), &a.name).cmp(&(&b.package, kind_rank(&b.kind), &b.name)));
    binaries.dedup_by(|a, b| a.exe == b.exe);
    let mut first = Vec::new();
    for name in LONGEST_FIRST {
        let Some(i) = binaries.iter().position(|b| b.kind == "test" && b.name == *name) else {
            bail!("xtask test's LONGEST_FIRST names `{name}`, which is no test binary of the workspace");
        };
        first.push(binaries.remove(i));
    }
    first.extend(binaries);
    Ok(first)
}

/// Runs one unit with its output in `<logs>/<label>.log`, then prints that output whole (so
/// that binaries running side by side do not mix their lines).
fn run_unit(
    unit: &Unit,
    lane: usize,
    no_fail_fast: bool,
    harness_args: &[String],
    logs: &Path,
    suite_started: Instant,
) -> Outcome {
    let label = unit.label();
    let log = logs.join(match unit {
        Unit::Binary(b) => format!("{}-{}-{}.log", b.package, b.kind, b.name),
        Unit::DocTests => "doc-tests.log".to_owned(),
    });
    let (mut cmd, heading) = match unit {
        Unit::Binary(b) => (b.command(harness_args), format!("Running {}", b.shown())),
        Unit::DocTests => {
            let mut cmd = cargo_test();
            if no_fail_fast {
                cmd.arg("--no-fail-fast");
            }
            if harness_args.is_empty() {
                // Every target, as `--no-run` built them, filtered to the doc tests (named
                // `src/x.rs - item (line N)`; no other test's name holds "(line "): the test
                // binaries start and run nothing. `cargo test --doc` would build the
                // libraries again, with the features of a doc-only selection (about a minute
                // of CPU on a clean clone).
                cmd.args(["--", "(line "]);
                (cmd, "Doc-tests (cargo test -- \"(line \")".to_owned())
            } else {
                // The caller's filters would also pick tests of the binaries again.
                cmd.arg("--doc").arg("--").args(harness_args);
                (cmd, "Doc-tests (cargo test --doc)".to_owned())
            }
        }
    };
    let at = suite_started.elapsed().as_secs_f64();
    progress("test", format!("{at:>5.0} s lane {lane}: {label} started"));
    let started = Instant::now();
    let status = std::fs::File::create(&log)
        .and_then(|out| {
            let err = out.try_clone()?;
            util::dies_with_parent(cmd.stdin(Stdio::null()).stdout(out).stderr(err)).status()
        })
        .map_err(|e| format!("could not run {label}: {e}"));
    let seconds = started.elapsed().as_secs_f64();
    let passed = matches!(&status, Ok(s) if s.success());
    let output = std::fs::read_to_string(&log).unwrap_or_default();
    let verdict = match &status {
        Ok(s) if s.success() => "ok".to_owned(),
        Ok(s) => format!("FAILED ({s})"),
        Err(e) => format!("FAILED ({e})"),
    };
    // One print, so that another lane's block cannot land inside this one.
    println!(
        "\n     {heading} [lane {lane}, {seconds:.1} s, {verdict}]\n{}{}",
        output,
        if output.ends_with('\n') || output.is_empty() { "" } else { "\n" }
    );
    Outcome { label, seconds, passed }
}
