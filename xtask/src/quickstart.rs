//! `cargo xtask quickstart`: the README's main command.
//!
//! Set-up first (idempotent), then the `mlx-iree` default job. Until the model
//! work lands that job is `mlx-iree demo`: a small graph built with hlo-emit,
//! compiled by IREE in-process and run on the CPU.

use crate::build_iree::{self, Target};
use crate::util::{self, progress};
use anyhow::Result;
use std::process::Command;

pub fn run(args: &[String]) -> Result<()> {
    util::no_args("quickstart", args)?;
    let toolchain = crate::setup::run()?;
    build_iree::build(&toolchain, Target::Cpu)?;
    progress("quickstart", "building and running `mlx-iree demo`");
    util::run(
        Command::new(crate::test::cargo())
            .current_dir(util::root())
            .args(["run", "--quiet", "--package", "mlx-iree", "--", "demo"])
            .env("MLX_IREE_CACHE_DIR", util::target_dir().join("mlx-iree-cache")),
    )
}
