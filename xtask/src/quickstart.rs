//! `cargo xtask quickstart`: the README's main command.
//!
//! Set-up first (idempotent): packages, the IREE compiler and runtime, and the default
//! model (SmolLM2-135M-Instruct converted to MLX 4-bit); then a chat answer from it.

use crate::build_iree::{self, Target};
use crate::util::{self, progress};
use anyhow::Result;
use std::process::Command;

/// The model `cargo xtask model` converts, and the question the quick start asks it.
const DEFAULT_MODEL: &str = "smollm2-135m-instruct-4bit";
const PROMPT: &str = "What is the capital of France?";
/// The quick start's context: a chat answer needs few positions, and each doubling of the
/// context adds attention windows to compile on the first run (README, "The first run").
const MAX_CONTEXT: &str = "1024";

pub fn run(args: &[String]) -> Result<()> {
    util::no_args("quickstart", args)?;
    let toolchain = crate::setup::run()?;
    build_iree::build(&toolchain, Target::Cpu)?;
    crate::model::run(&[])?;
    let model = crate::model::models_dir().join(DEFAULT_MODEL);
    progress(
        "quickstart",
        format!(
            "building mlx-iree, then: mlx-iree generate --model {} --chat --prompt {PROMPT:?} --max-context {MAX_CONTEXT}",
            model.display()
        ),
    );
    util::run(
        Command::new(util::cargo())
            .current_dir(util::root())
            .args([
                "run",
                "--quiet",
                "--package",
                "mlx-iree",
                "--",
                "generate",
                "--chat",
                "--prompt",
                PROMPT,
                "--max-context",
                MAX_CONTEXT,
                "--model",
            ])
            .arg(&model)
            .env("MLX_IREE_CACHE_DIR", util::target_dir().join("mlx-iree-cache")),
    )
}
