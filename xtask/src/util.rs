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

/// Makes the child `cmd` starts get SIGKILL when its parent goes, so that no peer or server
/// outlives an xtask that was killed (SIGKILL included). Linux sends it when the thread
/// that spawned the child exits, so spawn from one that outlives the child (e.g. the main
/// thread). Elsewhere it changes nothing.
#[cfg(target_os = "linux")]
pub fn dies_with_parent(cmd: &mut Command) -> &mut Command {
    use std::os::unix::process::CommandExt;
    // Recorded before the fork: a child whose parent changed was reparented.
    let parent = std::process::id();
    // SAFETY: the hook runs in the forked child before exec, where only async-signal-safe
    // calls are sound; it makes two (prctl, getppid), builds its errors without allocating,
    // and touches no lock or shared state.
    unsafe {
        cmd.pre_exec(move || {
            // prctl is variadic and the kernel reads every argument as an unsigned long.
            let (signal, unused): (libc::c_ulong, libc::c_ulong) = (libc::SIGKILL as libc::c_ulong, 0);
            if libc::prctl(libc::PR_SET_PDEATHSIG, signal, unused, unused, unused) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            // xtask died between the fork and the prctl (the spawning thread waits in `spawn`
            // until exec, so only a killed process goes first): no signal will come, so end
            // here (an error ends the child before exec).
            if u32::try_from(libc::getppid()) != Ok(parent) {
                return Err(std::io::Error::from_raw_os_error(libc::ESRCH));
            }
            Ok(())
        })
    }
}

#[cfg(not(target_os = "linux"))]
pub fn dies_with_parent(cmd: &mut Command) -> &mut Command {
    cmd
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

#[cfg(test)]
mod tests {
    use super::*;

    /// The child is started from a thread that then exits: the death signal must end it
    /// (without the prctl it would sleep on, and the test fail after 5 s).
    #[cfg(target_os = "linux")]
    #[test]
    fn a_child_dies_with_the_thread_that_started_it() {
        use std::os::unix::process::ExitStatusExt;
        use std::time::{Duration, Instant};
        let mut child =
            std::thread::spawn(|| dies_with_parent(Command::new("sleep").arg("30")).spawn().unwrap()).join().unwrap();
        let deadline = Instant::now() + Duration::from_secs(5);
        let status = loop {
            if let Some(status) = child.try_wait().unwrap() {
                break Some(status);
            }
            if Instant::now() > deadline {
                break None;
            }
            std::thread::sleep(Duration::from_millis(20));
        };
        if status.is_none() {
            let _ = child.kill();
            let _ = child.wait();
        }
        let status = status.expect("the child outlived the thread that started it");
        assert_eq!(status.signal(), Some(libc::SIGKILL), "{status}");
    }

    #[test]
    fn a_child_runs_as_before() {
        let out = dies_with_parent(Command::new("sh").args(["-c", "echo ok"])).output().unwrap();
        assert!(out.status.success());
        assert_eq!(out.stdout, b"ok\n");
    }
}
