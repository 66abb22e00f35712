//! `cargo xtask fixtures`: regenerates tests/fixtures/ (tiny random MLX checkpoints and
//! mlx-lm's greedy trajectories) with xtask/python/make_fixtures.py, then the
//! bfloat16-weights references (`expected_bf16.json`) with xtask/python/rounded_reference.py
//! and the 8-bit-KV-cache references (`expected_q8kv.json`) with
//! xtask/python/q8_kv_reference.py, and tests/fixtures-trained/ (the same architectures
//! trained until confident, for precision gating) with xtask/python/make_trained_fixtures.py.
//!
//! Also home of the mlx-lm venv (`target/mlx-venv`) that `cargo xtask model` shares.
//! The fixtures are committed; a stamp per folder under target/ records the scripts, the pinned
//! packages and a digest of what they produced, so a second run does nothing.

use crate::pins::Pins;
use crate::util::{self, progress};
use anyhow::{Context, Result, bail};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Instant;

pub fn run(args: &[String]) -> Result<()> {
    let force = match args {
        [] => false,
        [flag] if flag == "--force" => true,
        [other, ..] => bail!("`fixtures` takes only `--force` (got `{other}`)"),
    };
    let pins = Pins::load()?;
    let venv = mlx_venv(&pins, "fixtures 1/3")?;
    let random = Set {
        stage: "fixtures 2/3",
        dir: fixtures_dir(),
        stamp: "fixtures.stamp",
        scripts: &["make_fixtures.py", "oracle.py", "rounded_reference.py", "q8_kv_reference.py"],
    };
    random.make(&pins, force, || {
        progress(random.stage, format!("making the random-weight fixtures with mlx-lm into {}", random.dir.display()));
        util::run(python(&venv, "make_fixtures.py").arg("--out").arg(&random.dir))?;
        progress(random.stage, "recording mlx-lm's trajectories with bfloat16-rounded weights (expected_bf16.json)");
        util::run(python(&venv, "rounded_reference.py").arg("--fixtures").arg(&random.dir))?;
        progress(random.stage, "recording mlx-lm's trajectories with an 8-bit KV cache (expected_q8kv.json)");
        util::run(python(&venv, "q8_kv_reference.py").arg("--fixtures").arg(&random.dir))
    })?;
    let trained = Set {
        stage: "fixtures 3/3",
        dir: util::root().join("tests/fixtures-trained"),
        stamp: "fixtures-trained.stamp",
        scripts: &["make_trained_fixtures.py", "make_fixtures.py", "oracle.py"],
    };
    trained.make(&pins, force, || {
        progress(
            trained.stage,
            format!("training the confident fixtures with mlx into {} (about 10 minutes)", trained.dir.display()),
        );
        util::run(python(&venv, "make_trained_fixtures.py").arg("--out").arg(&trained.dir))
    })
}

/// One committed fixture folder and the scripts that make it.
struct Set {
    stage: &'static str,
    dir: PathBuf,
    /// File name of the stamp under target/.
    stamp: &'static str,
    /// Scripts under xtask/python/ whose content the folder depends on.
    scripts: &'static [&'static str],
}

impl Set {
    /// Runs `generate` unless the stamp says the folder is what these scripts and pinned
    /// packages made; then stamps what it made.
    fn make(&self, pins: &Pins, force: bool, generate: impl FnOnce() -> Result<()>) -> Result<()> {
        let started = Instant::now();
        let stamp = util::target_dir().join(self.stamp);
        let mut inputs = format!("packages: {}\n", pins.oracle.python_packages.join(" "));
        for script in self.scripts {
            inputs.push_str(&format!("{script}: {}\n", script_digest(script)?));
        }
        if !force && self.dir.is_dir() {
            let (digest, bytes, files) = tree_digest(&self.dir)?;
            if util::stamp_matches(&stamp, &format!("{inputs}tree: {digest}\n")) {
                let what = format!("present at {} ({files} files, {})", self.dir.display(), human(bytes));
                progress(self.stage, format!("fixtures: {what}"));
                return Ok(());
            }
        }
        generate()?;
        let (digest, bytes, files) = tree_digest(&self.dir)?;
        util::write_stamp(&stamp, &format!("{inputs}tree: {digest}\n"))?;
        let took = started.elapsed().as_secs_f64();
        progress(
            self.stage,
            format!("fixtures: {files} files, {} in {} ({took:.0} s)", human(bytes), self.dir.display()),
        );
        Ok(())
    }
}

pub fn fixtures_dir() -> PathBuf {
    util::root().join("tests/fixtures")
}

/// The venv with the pinned mlx-lm, created once (like setup's IREE venv).
pub fn mlx_venv(pins: &Pins, stage: &str) -> Result<PathBuf> {
    let venv = util::target_dir().join("mlx-venv");
    // mlx-lm's import pulls in mlx and transformers: a broken install fails here, not later.
    util::python_venv(
        &venv,
        &pins.oracle.python_packages,
        stage,
        "mlx-lm",
        &["-c", "import mlx.core, mlx_lm, gguf, tokenizers"],
    )?;
    Ok(venv)
}

/// `python xtask/python/<script>` from the venv, run in the workspace root, offline
/// for Hugging Face and without writing `__pycache__` into the source tree.
pub fn python(venv: &Path, script: &str) -> Command {
    let mut cmd = Command::new(venv.join("bin/python"));
    cmd.arg(util::root().join("xtask/python").join(script))
        .current_dir(util::root())
        .env("PYTHONDONTWRITEBYTECODE", "1")
        .env("HF_HUB_OFFLINE", "1")
        .env("HF_HUB_DISABLE_TELEMETRY", "1");
    cmd
}

/// sha256 of one of the committed scripts, for stamps.
pub fn script_digest(script: &str) -> Result<String> {
    let path = util::root().join("xtask/python").join(script);
    let bytes = std::fs::read(&path).with_context(|| format!("reading {}", path.display()))?;
    Ok(util::sha256_hex(&bytes))
}

/// A digest over every file below `dir` except README.md (path and content, in
/// sorted order), with the total size and file count.
fn tree_digest(dir: &Path) -> Result<(String, u64, usize)> {
    let mut files = Vec::new();
    collect(dir, &mut files)?;
    files.sort();
    let mut listing = String::new();
    let mut bytes = 0u64;
    let mut count = 0usize;
    for path in &files {
        let rel = path.strip_prefix(dir).unwrap_or(path);
        if rel == Path::new("README.md") {
            continue;
        }
        let data = std::fs::read(path).with_context(|| format!("reading {}", path.display()))?;
        bytes += data.len() as u64;
        count += 1;
        listing.push_str(&format!("{} {}\n", util::sha256_hex(&data), rel.display()));
    }
    Ok((util::sha256_hex(listing.as_bytes()), bytes, count))
}

fn collect(dir: &Path, out: &mut Vec<PathBuf>) -> Result<()> {
    for entry in std::fs::read_dir(dir).with_context(|| format!("listing {}", dir.display()))? {
        let path = entry?.path();
        if path.is_dir() {
            collect(&path, out)?;
        } else {
            out.push(path);
        }
    }
    Ok(())
}

pub fn human(bytes: u64) -> String {
    // Display only: the precision loss of u64 -> f64 is irrelevant here.
    #[allow(clippy::cast_precision_loss)]
    let b = bytes as f64;
    if b >= 1e9 {
        format!("{:.2} GB", b / 1e9)
    } else if b >= 1e6 {
        format!("{:.1} MB", b / 1e6)
    } else {
        format!("{:.0} kB", b / 1e3)
    }
}
