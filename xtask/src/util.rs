//! Shared helpers for xtask: workspace paths, progress lines, running commands.

use anyhow::{Context, Result, bail};
use std::path::{Path, PathBuf};
use std::process::Command;

/// The workspace root (the parent of `xtask/`).
pub fn root() -> PathBuf {
    let here = Path::new(env!("CARGO_MANIFEST_DIR"));
    here.parent().unwrap_or(here).to_path_buf()
}

/// Where xtask keeps what it installs: always under `target/`, so `cargo clean`
/// removes it and CI caches one folder.
pub fn target_dir() -> PathBuf {
    root().join("target")
}

/// One progress line for a long step, e.g. `[setup 2/3] IREE compiler venv: ...`.
pub fn progress(stage: &str, msg: impl AsRef<str>) {
    println!("[{stage}] {}", msg.as_ref());
}

pub fn no_args(cmd: &str, rest: &[String]) -> Result<()> {
    if let Some(extra) = rest.first() {
        bail!("`{cmd}` takes no arguments (got `{extra}`)");
    }
    Ok(())
}

/// The cargo that runs xtask (so the pinned toolchain builds the workspace too).
pub fn cargo() -> String {
    std::env::var("CARGO").unwrap_or_else(|_| "cargo".into())
}

/// Runs a command to completion, inheriting stdio; fails naming the command.
pub fn run(cmd: &mut Command) -> Result<()> {
    let shown = show(cmd);
    let status = cmd.status().with_context(|| format!("could not start `{shown}`"))?;
    if !status.success() {
        bail!("`{shown}` failed ({status})");
    }
    Ok(())
}

/// Runs a command and returns its stdout, or None if it could not run or failed.
pub fn output(cmd: &mut Command) -> Option<String> {
    let out = cmd.output().ok()?;
    out.status.success().then(|| String::from_utf8_lossy(&out.stdout).into_owned())
}

pub fn show(cmd: &Command) -> String {
    let mut s = cmd.get_program().to_string_lossy().into_owned();
    for a in cmd.get_args() {
        s.push(' ');
        s.push_str(&a.to_string_lossy());
    }
    s
}

/// Hex sha256 of a byte slice.
pub fn sha256_hex(bytes: &[u8]) -> String {
    use sha2::{Digest, Sha256};
    Sha256::digest(bytes).iter().map(|b| format!("{b:02x}")).collect()
}

/// A stamp file records that a step finished with a given configuration;
/// a step is reused only when its stamp holds exactly the same text.
pub fn stamp_matches(path: &Path, content: &str) -> bool {
    std::fs::read_to_string(path).is_ok_and(|s| s == content)
}

pub fn write_stamp(path: &Path, content: &str) -> Result<()> {
    std::fs::write(path, content).with_context(|| format!("writing {}", path.display()))
}

pub fn is_root() -> bool {
    output(Command::new("id").arg("-u")).is_some_and(|s| s.trim() == "0")
}

/// A Python venv at `venv` holding exactly `reqs` (pip requirement strings), made or
/// updated only when its stamp differs; `check` is a command run with the venv's python
/// (e.g. `-c "import x"`) that must succeed before the stamp is written.
pub fn python_venv(venv: &Path, reqs: &[String], stage: &str, what: &str, check: &[&str]) -> Result<()> {
    let stamp = venv.join(".mlx-iree-stamp");
    let stamp_text = format!("{}\n", reqs.join("\n"));
    let python = venv.join("bin/python");
    if stamp_matches(&stamp, &stamp_text) && python.exists() {
        progress(stage, format!("{what}: present at {}", venv.display()));
        return Ok(());
    }
    if !python.exists() {
        progress(stage, format!("creating Python venv at {}", venv.display()));
        run(Command::new("python3").args(["-m", "venv"]).arg(venv))
            .context("python3 -m venv failed (Debian: apt-get install python3-venv)")?;
    }
    progress(stage, format!("{what}: installing {} into the venv", reqs.join(", ")));
    run(Command::new(&python)
        .args(["-m", "pip", "install", "--disable-pip-version-check", "--progress-bar", "off"])
        .args(reqs))?;
    run(Command::new(&python).args(check))
        .with_context(|| format!("the {what} venv at {} is broken", venv.display()))?;
    write_stamp(&stamp, &stamp_text)
}
