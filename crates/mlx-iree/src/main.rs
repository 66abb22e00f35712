//! The `mlx-iree` command line. Bad input is one line on stderr and exit status 2.

mod bench;
mod chat;
mod demo;
mod download;
mod run;
mod serve;
mod settings;

use clap::{Parser, Subcommand};
use std::process::ExitCode;

#[derive(Parser, Debug)]
#[command(name = "mlx-iree", version, about = "Run MLX checkpoints on IREE devices")]
struct Cli {
    #[command(subcommand)]
    command: Command,
    /// Which progress and log lines reach stderr (`tracing` filter syntax: warn, debug,
    /// engine=debug). Default: $MLX_IREE_LOG, else info.
    #[arg(long, global = true, value_name = "FILTER", value_parser = parse_log)]
    log: Option<String>,
}

/// A `--log` filter `tracing` accepts, or why not.
fn parse_log(filter: &str) -> Result<String, String> {
    tracing_subscriber::EnvFilter::try_new(filter).map(|_| filter.to_owned()).map_err(|e| e.to_string())
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Measure prefill and decode speed, time to first token, memory, compile time and
    /// dispatches per decode step of one model on one device at one precision.
    Bench(bench::Args),
    /// Compile every module the engine loads for a model, device and precision into the
    /// compile cache, without opening the device (for a machine with the device but no
    /// compiler).
    Compile(run::CompileArgs),
    /// Chat with the model: multi-turn with its chat template, answers streamed to stdout;
    /// /reset, /system TEXT, /exit; Ctrl-C stops an answer.
    Chat(chat::ChatArgs),
    /// Build a small RMSNorm + matmul + softmax graph, compile it with IREE and run it,
    /// checking the result against a plain Rust computation.
    Demo(demo::Args),
    /// Generate text from a prompt, streamed to stdout as it is produced.
    Generate(run::GenerateArgs),
    /// Serve the model over HTTP with an OpenAI-compatible API (/v1/completions,
    /// /v1/chat/completions, /v1/models, /health, /metrics), batching concurrent requests.
    Serve(serve::ServeArgs),
    /// Record a greedy trajectory (token ids, EOS ignored) as JSON.
    Trajectory(run::TrajectoryArgs),
    /// Check a precision (or device) against a reference trajectory; exit status 1 if it fails.
    Gate(run::GateArgs),
}

impl Command {
    /// The model flags of a subcommand that takes a model.
    fn model_args(&mut self) -> Option<&mut run::ModelArgs> {
        match self {
            Command::Bench(args) => Some(&mut args.m),
            Command::Chat(args) => Some(&mut args.model),
            Command::Compile(args) => Some(&mut args.model),
            Command::Demo(_) => None,
            Command::Generate(args) => Some(&mut args.model),
            Command::Serve(args) => Some(&mut args.model),
            Command::Trajectory(args) => Some(&mut args.model),
            Command::Gate(args) => Some(&mut args.model),
        }
    }
}

/// Progress and log lines from the libraries (`tracing`) go to stderr as plain lines, so
/// stdout stays the output. `--log`, else `MLX_IREE_LOG`, filters them (default `info`; e.g.
/// `debug`, `engine=debug`, `warn`).
fn init_logging(flag: Option<&str>) {
    let filter = match flag {
        Some(filter) => tracing_subscriber::EnvFilter::new(filter),
        None => tracing_subscriber::EnvFilter::try_from_env("MLX_IREE_LOG")
            .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info")),
    };
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .without_time()
        .with_level(false)
        .with_target(false)
        .with_ansi(false)
        .try_init();
}

fn main() -> ExitCode {
    let mut cli = match Cli::try_parse() {
        Ok(cli) => cli,
        // --help and --version print in full; usage errors become the one-line contract.
        Err(e) if !e.use_stderr() => {
            let _ = e.print();
            return ExitCode::SUCCESS;
        }
        Err(e) => {
            let rendered = e.render().to_string();
            let first = rendered.lines().next().unwrap_or("invalid arguments").trim_start_matches("error: ");
            eprintln!("mlx-iree: error: {first} (see mlx-iree --help)");
            return ExitCode::from(2);
        }
    };
    init_logging(cli.log.as_deref());
    // A hub repo id becomes its cached snapshot folder before any subcommand looks at it.
    let resolved = match cli.command.model_args() {
        Some(model) => model.resolve(),
        None => Ok(()),
    };
    // `--draft` and `--draft-model` belong to the commands that decode through the scheduler.
    let resolved = resolved.and_then(|()| {
        let (model, draft) = match &mut cli.command {
            Command::Generate(args) => (&mut args.model, &mut args.draft),
            Command::Chat(args) => (&mut args.model, &mut args.draft),
            Command::Serve(args) => (&mut args.model, &mut args.draft),
            _ => return Ok(()),
        };
        draft.resolve(model.settings.offline)?;
        model.draft = draft.draft(&model.device)?;
        Ok(())
    });
    let result = match cli.command {
        _ if resolved.is_err() => resolved,
        Command::Bench(args) => bench::run(&args),
        Command::Chat(args) => chat::run(&args),
        Command::Compile(args) => run::compile(&args),
        Command::Demo(args) => demo::run(&args),
        Command::Generate(args) => run::generate(&args),
        Command::Serve(args) => serve::run(&args),
        Command::Trajectory(args) => run::trajectory(&args),
        Command::Gate(args) => match run::gate(&args) {
            Ok(true) => Ok(()),
            Ok(false) => return ExitCode::from(1),
            Err(e) => Err(e),
        },
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(err) => {
            // One line: the causes joined, so scripts can grep a single line.
            eprintln!("mlx-iree: error: {}", format!("{err:#}").replace('\n', " "));
            ExitCode::from(2)
        }
    }
}
