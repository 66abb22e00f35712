//! `cargo xtask`: project automation, one module per subcommand.
//!
//! xtask shells out (apt-get, python, cmake, ninja, cargo) and links no
//! workspace crate, so it builds before anything IREE- or MLIR-related exists.

mod bench;
mod build_iree;
mod draft_bench;
mod fixtures;
mod iree_patches;
mod model;
mod peers;
mod pins;
mod quickstart;
mod serve_bench;
mod setup;
mod test;
mod util;

use anyhow::{Result, bail};

const USAGE: &str = "\
usage: cargo xtask <command> [options]

commands:
  setup                         install what the build needs (Debian packages, the pinned
                                IREE compiler venv, the IREE runtime source); idempotent
  build-iree [--target T]       build the IREE runtime for T = cpu (default; with the Vulkan
                                driver, so vulkan is the same build), cuda, metal into
                                target/iree/<T>/; reuses a finished build
  test [-- CARGO_TEST_ARGS]     cargo fmt --check + setup + build-iree --target cpu + cargo
                                clippy (warnings fail) + model + the workspace's tests (cargo
                                test --no-run, then two test binaries at a time)
  test-vulkan                   setup + build-iree + every fixture family on --device vulkan
                                (Mesa's lavapipe; the suite runs four of them)
  compile-matrix [--family F]   setup + build-iree + every fixture family (or F) x precision x target
                                compiled; writes docs/capabilities.json and README's table
  quickstart                    setup + build-iree --target cpu + model + a chat answer from
                                SmolLM2 (mlx-iree generate --chat)
  fixtures [--force]            regenerate tests/fixtures/ (tiny random MLX checkpoints and
                                mlx-lm's greedy trajectories) and tests/fixtures-trained/
                                (the same trained until confident) in target/mlx-venv
  model                         SmolLM2-135M-Instruct as MLX folders (f16, 4-bit) under
                                target/models/, each with mlx-lm's oracle.json; idempotent
  bench [--model M] [--precision P] [--device URI] [--json]
                                prefill/decode tok/s, time to first token, memory, compile
                                time, dispatches per step of SmolLM2 and a 1B Llama per
                                precision, as one table (`bench --help` for every option)
";

fn main() -> std::process::ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    match run(&args) {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(err) => {
            eprintln!("xtask: error: {err:#}");
            std::process::ExitCode::FAILURE
        }
    }
}

fn run(args: &[String]) -> Result<()> {
    let Some((cmd, rest)) = args.split_first() else {
        print!("{USAGE}");
        return Ok(());
    };
    match cmd.as_str() {
        "setup" => {
            util::no_args("setup", rest)?;
            setup::run().map(|_| ())
        }
        "build-iree" => {
            let target = build_iree::parse_args(rest)?;
            build_iree::preflight(target)?;
            let toolchain = setup::run()?;
            build_iree::build(&toolchain, target).map(|_| ())
        }
        "test" => test::run(rest),
        "test-vulkan" => test::run_vulkan(rest),
        "compile-matrix" => test::run_compile_matrix(rest),
        "quickstart" => quickstart::run(rest),
        "fixtures" => fixtures::run(rest),
        "model" => model::run(rest),
        "bench" => bench::run(rest),
        "-h" | "--help" | "help" => {
            print!("{USAGE}");
            Ok(())
        }
        other => bail!("unknown command `{other}`\n{USAGE}"),
    }
}
