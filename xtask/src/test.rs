//! `cargo xtask test`: the README's test command, also what `.ci/run` calls.
//!
//! Set-up first (idempotent), then the whole workspace's tests on CPU.

use crate::build_iree::{self, Target};
use crate::util::{self, progress};
use anyhow::Result;
use std::process::Command;

/// The venv with the pinned `openai` client that crates/mlx-iree/tests/openai.rs drives
/// (found there as target/client-venv).
pub fn client_venv() -> Result<std::path::PathBuf> {
    let pins = crate::pins::Pins::load()?;
    let venv = util::target_dir().join("client-venv");
    util::python_venv(&venv, &pins.test_clients.python_packages, "test", "openai client", &["-c", "import openai"])?;
    Ok(venv)
}

pub fn run(args: &[String]) -> Result<()> {
    let passthrough = match args.split_first() {
        Some((dashdash, rest)) if dashdash == "--" => rest,
        Some((other, _)) => anyhow::bail!("test: unexpected argument `{other}` (pass cargo test arguments after `--`)"),
        None => &[],
    };
    let toolchain = crate::setup::run()?;
    build_iree::build(&toolchain, Target::Cpu)?;
    // The SmolLM2 tests compare against mlx-lm's trajectories on the converted model.
    crate::model::run(&[])?;
    client_venv()?;
    progress("test", "cargo test --workspace (first run compiles melior and the IREE bindings: several minutes)");
    let started = std::time::Instant::now();
    util::run(
        Command::new(util::cargo())
            .current_dir(util::root())
            .args(["test", "--workspace", "--exclude", "xtask"])
            // One compile keeps about one core busy, and test threads compile side by side;
            // IREE's shared compiler thread pool then only adds contention (one fixture
            // module: 14.3 s alone against 15.9 s with the pool, two at once in one process
            // 19.4 s against 24.1 s; docs/PERFORMANCE.md, "Compile time").
            .env("IREE_COMPILER_TASK_COUNT", "1")
            .args(passthrough),
    )?;
    progress("test", format!("all tests passed in {:.0} s", started.elapsed().as_secs_f64()));
    Ok(())
}
