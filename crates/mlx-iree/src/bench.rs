//! `mlx-iree bench`: speed and memory of one (model, device, precision): prefill and decode
//! tokens per second, time to first token, resident weight bytes, peak RSS, compile time
//! (cold and cached) and dispatches per decode step. `cargo xtask bench` runs it per row.

use anyhow::{Context, Result, bail};
use engine::Engine;
use engine::cache::CompileReport;
use models::ModelConfig;
use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::time::Instant;

#[derive(clap::Args, Debug)]
pub struct Args {
    #[command(flatten)]
    pub(crate) m: crate::run::ModelArgs,
    /// Prompt length in tokens (a fixed, deterministic sequence of ids).
    #[arg(long, default_value_t = 128)]
    prompt_len: usize,
    /// Sequences decoded together, e.g. 1,4,8,16: one measurement each (aggregate tok/s).
    #[arg(long, value_delimiter = ',', default_value = "1")]
    batch: Vec<usize>,
    /// Tokens of context before decoding, e.g. 100,2000: one measurement each (each
    /// sequence's prompt is that long). Default: --prompt-len.
    #[arg(long, value_delimiter = ',')]
    context: Vec<usize>,
    /// Decode steps after the prompt.
    #[arg(long, default_value_t = 128)]
    steps: usize,
    /// Repeats of (prompt, decode steps); the medians are reported.
    #[arg(long, default_value_t = 3)]
    repeats: usize,
    /// Print one JSON object on one line instead of a table.
    #[arg(long)]
    json: bool,
    /// Load through the normal compile cache (`--cache-dir`) and skip the cold
    /// compile and the dispatch count, which need the IREE compiler: for a machine that
    /// carries a filled cache but no compiler. A graph missing from the cache is compiled
    /// if the compiler is there (so this also fills a cache), else it is an error.
    /// Reports compile_cold_s as null and dispatches_per_decode_step as 0.
    #[arg(long)]
    cache_only: bool,
}

/// What one benchmark measured. Field names are the JSON keys.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub struct Report {
    pub model: String,
    pub device: String,
    pub precision: String,
    /// Sequences decoded together; `decode_tok_s` is their aggregate.
    pub batch: usize,
    /// Tokens of context (each sequence's prompt) before the decode steps.
    pub context: usize,
    /// Positions per sequence the engine was started with.
    pub max_context: usize,
    pub prefill_tok_s: f64,
    pub decode_tok_s: f64,
    pub ttft_ms: f64,
    /// The first sequence's next turn: milliseconds to the first token of NEXT_TURN more
    /// tokens after its context and decode steps, which the slot holds (what the prefix
    /// cache makes of a chat's next turn).
    #[serde(default)]
    pub next_turn_ms: f64,
    pub weight_bytes: u64,
    /// The KV cache's element type (`--kv-cache`: f32, f16 or q8).
    #[serde(default)]
    pub kv_cache: String,
    /// How the CPU kernel's packed products quantize their input (`--activations`: i16 or i8).
    #[serde(default)]
    pub activations: String,
    /// Device bytes of the KV cache (k and v, every slot).
    pub kv_bytes: u64,
    /// Bytes the KV cache holds per token of one sequence, every layer: keys and values,
    /// or a latent attention's latent and rotated key (DeepSeek-V3).
    #[serde(default)]
    pub kv_bytes_per_token: u64,
    pub peak_rss_bytes: u64,
    pub dispatches_per_decode_step: usize,
    /// Seconds to a compiled module with an empty compile cache (emit + compile) and with
    /// the warm cache (`Engine::load` less its weight binding: checkpoint header, emit,
    /// cache read). NaN (JSON null) when the engine did not hit the cache just filled.
    #[serde(deserialize_with = "nan_if_null")]
    pub compile_cold_s: f64,
    #[serde(deserialize_with = "nan_if_null")]
    pub compile_cached_s: f64,
    /// Seconds spent binding the weights on the device (the warm load).
    pub weights_load_s: f64,
    pub prompt_len: usize,
    pub decode_steps: usize,
    pub repeats: usize,
    /// Share of the machine's CPU time that other work took while this row's runs ran
    /// (steal included; [`cpu_share`]); null where it cannot be read. At
    /// [`cpu_share::LOADED`] or more the row was measured under load.
    #[serde(default)]
    pub foreign_cpu_share: Option<f64>,
}

/// Tokens of the next turn measured after each row's decode steps (a short user message).
const NEXT_TURN: usize = 16;

pub fn run(args: &Args) -> Result<()> {
    for report in measure(args)? {
        if args.json {
            println!("{}", serde_json::to_string(&report)?);
        } else {
            print!("{}", table(&report));
        }
    }
    Ok(())
}

/// An `f64` that JSON carries as `null` when it is NaN (as serde_json writes NaN).
fn nan_if_null<'de, D: serde::Deserializer<'de>>(d: D) -> std::result::Result<f64, D::Error> {
    Ok(<Option<f64> as serde::Deserialize>::deserialize(d)?.unwrap_or(f64::NAN))
}

/// Checks everything cheap before anything is compiled or loaded.
fn check(args: &Args) -> Result<ModelConfig> {
    if args.prompt_len == 0 {
        bail!("--prompt-len must be at least 1");
    }
    if args.steps == 0 {
        bail!("--steps must be at least 1");
    }
    if args.repeats == 0 {
        bail!("--repeats must be at least 1");
    }
    if args.batch.contains(&0) {
        bail!("--batch sizes must be at least 1");
    }
    if args.context.contains(&0) {
        bail!("--context lengths must be at least 1");
    }
    engine::CompileTarget::for_device(&args.m.device)?;
    if !args.m.model.is_dir() {
        bail!("model folder {} does not exist", args.m.model.display());
    }
    Ok(ModelConfig::from_file(&args.m.model.join("config.json"))?)
}

fn contexts(args: &Args) -> Vec<usize> {
    if args.context.is_empty() { vec![args.prompt_len] } else { args.context.clone() }
}

fn measure(args: &Args) -> Result<Vec<Report>> {
    let cfg = check(args)?;
    let contexts = contexts(args);
    let max_batch = args.batch.iter().copied().max().unwrap_or(1);
    let longest = contexts.iter().copied().max().unwrap_or(1);
    args.m.plan(
        &cfg,
        max_batch,
        longest + args.steps + NEXT_TURN,
        &format!("--context {longest} + --steps {} + a {NEXT_TURN}-token next turn", args.steps),
    )?;
    let loading = || format!("loading {}", args.m.model.display());

    let mut config = args.m.engine_config(max_batch)?;
    if !args.cache_only {
        // Cold: compiled into an empty cache. The runs are then measured by this same
        // command with --cache-only on that cache, in a process of its own: one that never
        // loaded the compiler, whose memory (the 1B shape: about 190 MiB) stays with this one,
        // as it never is in a run on a warm cache.
        let cold_cache = TempDir::new()?;
        config.cache_dir = cold_cache.path().to_path_buf();
        let (compile_cold_s, dispatches) = cold_compile(args, &config)?;
        let mut reports = measure_in_child(cold_cache.path(), &args.m.model)?;
        for r in &mut reports {
            if r.compile_cold_s.is_finite() {
                // The child compiled graphs other than the ones above (their emit or
                // options changed): its compile is the cold one.
                eprintln!("bench: the engine missed the cache just filled; cold compile = its compile");
            } else {
                r.compile_cold_s = compile_cold_s;
            }
            r.dispatches_per_decode_step = dispatches;
        }
        return Ok(reports);
    }
    let mut compile_cold_s = f64::NAN;
    let dispatches_per_decode_step = 0;

    // The first load of a CPU module for a checkpoint writes the weights stored in final
    // form (`EngineConfig::store_parameters`), which every later run maps: load once,
    // unmeasured, so the measured load is such a later one (on a filled cache it takes
    // hundredths of a second). A compile it had to do counts as the measured load's.
    let first = match config.store_parameters {
        true => Some(Engine::load(&args.m.model, &config).with_context(loading)?.load_report().compile),
        false => None,
    };

    // Peak RSS from here on: the warm load and the runs, not the compiles above (a warm
    // `generate` does not compile either). Where the reset is not allowed, the peak covers
    // the whole process, which the stderr line says.
    if let Err(err) = reset_peak_rss() {
        eprintln!("bench: cannot reset the peak RSS ({err}); it includes the compiles");
    }
    let started = Instant::now();
    let mut engine = Engine::load(&args.m.model, &config).with_context(loading)?;
    let load = engine.load_report().clone();
    let mut compile_cached_s = started.elapsed().as_secs_f64() - load.load_seconds;
    let compile = first.map_or(load.compile, |first| first.and(load.compile));
    // A cached load was measured unless the measured load itself compiled.
    let measured_compiled = matches!(load.compile, CompileReport::Compiled { .. });
    if let CompileReport::Compiled { seconds } = compile {
        eprintln!("bench: --cache-only: the cache did not hold the graphs; they were compiled now ({seconds:.1} s)");
        compile_cold_s = seconds;
        if measured_compiled {
            compile_cached_s = f64::NAN;
        }
    }

    let mut reports = Vec::new();
    for &context in &contexts {
        for &batch in &args.batch {
            let window = cpu_share::Window::start(&[]);
            let (prefill, decode, next_turn) = run_batch(args, &mut engine, &cfg, batch, context)?;
            let foreign_cpu_share = window.and_then(|w| w.foreign_share());
            reports.push(Report {
                model: args.m.model.display().to_string(),
                device: args.m.device.clone(),
                precision: args.m.precision().to_string(),
                batch,
                context,
                max_context: engine.max_context(),
                prefill_tok_s: context as f64 / prefill,
                decode_tok_s: (batch * args.steps) as f64 / decode,
                ttft_ms: prefill * 1e3,
                next_turn_ms: next_turn * 1e3,
                weight_bytes: load.weight_bytes as u64,
                kv_cache: engine.plan().cache.elem.to_string(),
                activations: args.m.activations.name().to_owned(),
                kv_bytes: load.kv_bytes as u64,
                kv_bytes_per_token: models::CacheShape::bytes_per_position(engine.config(), engine.plan().cache.elem)
                    as u64,
                peak_rss_bytes: 0,
                dispatches_per_decode_step,
                compile_cold_s,
                compile_cached_s,
                weights_load_s: load.load_seconds,
                prompt_len: context,
                decode_steps: args.steps,
                repeats: args.repeats,
                foreign_cpu_share,
            });
        }
    }
    let peak_rss_bytes = peak_rss()?;
    reports.iter_mut().for_each(|r| r.peak_rss_bytes = peak_rss_bytes);
    Ok(reports)
}

/// The reports of this very command run with `--cache-only --json` on the compile cache
/// `cache` (its `--cache-dir`) and on the model folder `model` (what `--model` resolved to: a
/// hub repo is not asked about again), in a child process; its progress lines pass through
/// on stderr.
fn measure_in_child(cache: &Path, model: &Path) -> Result<Vec<Report>> {
    let exe = std::env::current_exe().context("locating this executable")?;
    let args = child_args(std::env::args_os().skip(1), model);
    let out = std::process::Command::new(&exe)
        .args(&args)
        .args(["--cache-only", "--json"])
        .arg("--cache-dir")
        .arg(cache)
        .stderr(std::process::Stdio::inherit())
        .output()
        .with_context(|| format!("running {} bench --cache-only", exe.display()))?;
    if !out.status.success() {
        bail!("the measured runs ({} bench --cache-only) failed: {}", exe.display(), out.status);
    }
    let text = String::from_utf8(out.stdout).context("the measured runs' output is not UTF-8")?;
    text.lines()
        .filter(|l| !l.trim().is_empty())
        .map(|l| serde_json::from_str(l).with_context(|| format!("reading the measured runs' report `{l}`")))
        .collect()
}

/// This command's arguments for the measuring child: without `--json` and `--cache-dir`
/// (the child is given its own) and with `--model` naming `model`.
fn child_args(args: impl IntoIterator<Item = OsString>, model: &Path) -> Vec<OsString> {
    let mut out = Vec::new();
    let mut args = args.into_iter();
    let is = |arg: &OsString, flag: &str| {
        let joined = arg.to_str().is_some_and(|a| a.strip_prefix(flag).is_some_and(|rest| rest.starts_with('=')));
        (*arg == *flag, joined)
    };
    while let Some(arg) = args.next() {
        let (model_flag, model_joined) = is(&arg, "--model");
        let (cache_flag, cache_joined) = is(&arg, "--cache-dir");
        if model_flag || cache_flag {
            args.next();
        }
        if model_flag || model_joined {
            out.extend([OsString::from("--model"), model.as_os_str().to_owned()]);
        } else if !(cache_flag || cache_joined) && arg != "--json" {
            out.push(arg);
        }
    }
    out
}

/// Median seconds of one sequence's prefill of `context` tokens and of `steps` decode steps
/// of `batch` sequences together, each with that context (prompts differ per sequence).
/// Median seconds of the first sequence's prefill, of the decode steps, and of the first
/// sequence's next turn (NEXT_TURN tokens prefilled after what its slot holds).
fn run_batch(
    args: &Args,
    engine: &mut Engine,
    cfg: &ModelConfig,
    batch: usize,
    context: usize,
) -> Result<(f64, f64, f64)> {
    let mut prefill_s = Vec::with_capacity(args.repeats);
    let mut decode_s = Vec::with_capacity(args.repeats);
    let mut next_s = Vec::with_capacity(args.repeats);
    for r in 0..args.repeats {
        let mut rows = Vec::with_capacity(batch);
        let mut prefilled = 0.0;
        for slot in 0..batch {
            engine.reset(slot);
            let mut prompt = prompt_ids(context, cfg.vocab);
            prompt.rotate_left(slot % context);
            let started = Instant::now();
            let next = engine.prefill(slot, &prompt)?.next;
            if slot == 0 {
                prefilled = started.elapsed().as_secs_f64();
            }
            rows.push((slot, next));
        }
        let started = Instant::now();
        for _ in 0..args.steps {
            let steps = engine.decode(&rows)?;
            rows.iter_mut().zip(steps).for_each(|(row, step)| row.1 = step.next);
        }
        let decoded = started.elapsed().as_secs_f64();
        let started = Instant::now();
        engine.prefill(0, &prompt_ids(NEXT_TURN, cfg.vocab))?;
        let next = started.elapsed().as_secs_f64();
        eprintln!(
            "bench: batch {batch}, context {context}, repeat {}/{}: prefill {prefilled:.3} s, {} decode steps {decoded:.3} s, next turn {next:.3} s",
            r + 1,
            args.repeats,
            args.steps
        );
        prefill_s.push(prefilled);
        decode_s.push(decoded);
        next_s.push(next);
    }
    Ok((median(&mut prefill_s), median(&mut decode_s), median(&mut next_s)))
}

/// Cold: the engine's graphs compiled into the empty cache `config.cache_dir` (no weights
/// needed for that; `Engine::compile_only`); the engine then loads from that cache, which
/// checks that these are its very graphs. Returns the seconds to compiled modules and the
/// dispatches of one decode step of one sequence (`Engine::decode_dispatches`).
fn cold_compile(args: &Args, config: &engine::EngineConfig) -> Result<(f64, usize)> {
    let compiling = || format!("compiling {}", args.m.model.display());
    let started = Instant::now();
    Engine::compile_only(&args.m.model, config).with_context(compiling)?;
    let compile_cold_s = started.elapsed().as_secs_f64();
    let started = Instant::now();
    let dispatches = Engine::decode_dispatches(&args.m.model, config).with_context(compiling)?;
    eprintln!(
        "bench: {dispatches} dispatches per decode step (flow phase in {:.1} s)",
        started.elapsed().as_secs_f64()
    );
    Ok((compile_cold_s, dispatches))
}

/// A fixed prompt: ids cycling with a stride through `[1, min(vocab, 1000))`, so every
/// model sees the same tokens and no id is out of range.
pub fn prompt_ids(len: usize, vocab: usize) -> Vec<u32> {
    let span = vocab.clamp(2, 1000) - 1;
    (0..len).map(|i| (1 + (i * 37) % span) as u32).collect()
}

/// The middle value (the mean of the middle two for an even count); sorts `xs`.
pub fn median(xs: &mut [f64]) -> f64 {
    xs.sort_by(f64::total_cmp);
    let n = xs.len();
    match n {
        0 => f64::NAN,
        _ if n % 2 == 1 => xs[n / 2],
        _ => f64::midpoint(xs[n / 2 - 1], xs[n / 2]),
    }
}

/// Peak resident set size of this process (`VmHWM` in /proc/self/status), in bytes.
pub fn peak_rss() -> Result<u64> {
    let status = std::fs::read_to_string("/proc/self/status").context("reading /proc/self/status")?;
    parse_vm_hwm(&status).context("no VmHWM line in /proc/self/status")
}

fn parse_vm_hwm(status: &str) -> Option<u64> {
    let line = status.lines().find(|l| l.starts_with("VmHWM:"))?;
    let kb: u64 = line.trim_start_matches("VmHWM:").trim().trim_end_matches("kB").trim().parse().ok()?;
    Some(kb * 1024)
}

/// Resets `VmHWM` to the current RSS (Linux >= 4.0: writing 5 to /proc/self/clear_refs).
fn reset_peak_rss() -> std::io::Result<()> {
    std::fs::write("/proc/self/clear_refs", "5")
}

/// A folder under the system temp dir, removed on drop (the cold compile cache).
struct TempDir(PathBuf);

impl TempDir {
    fn new() -> Result<TempDir> {
        let nanos = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.subsec_nanos());
        let path = std::env::temp_dir().join(format!("mlx-iree-bench-{}-{nanos}", std::process::id()));
        std::fs::create_dir_all(&path).with_context(|| format!("creating {}", path.display()))?;
        Ok(TempDir(path))
    }

    fn path(&self) -> &Path {
        &self.0
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        // Best effort: a leftover cache folder in the temp dir harms nothing.
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn table(r: &Report) -> String {
    let mib = |b: u64| b as f64 / (1024.0 * 1024.0);
    format!(
        "model                       {}\n\
         device                      {}\n\
         precision                   {}\n\
         batch / context / max       {} sequences / {} tokens / {} positions\n\
         prompt / decode / repeats   {} tokens / {} steps / {} (medians)\n\
         prefill                     {:.1} tok/s\n\
         time to first token         {:.1} ms\n\
         next turn's first token     {:.1} ms ({} tokens after the context and decode steps)\n\
         decode (all sequences)      {:.1} tok/s\n\
         weights on the device       {:.1} MiB\n\
         KV cache on the device      {:.1} MiB ({} bytes a token)\n\
         peak RSS                    {:.1} MiB\n\
         compile cold / cached       {:.2} s / {:.2} s\n\
         weights load                {:.2} s\n\
         dispatches per decode step  {}\n\
         CPU taken by other work     {}\n",
        r.model,
        r.device,
        r.precision,
        r.batch,
        r.context,
        r.max_context,
        r.prompt_len,
        r.decode_steps,
        r.repeats,
        r.prefill_tok_s,
        r.ttft_ms,
        r.next_turn_ms,
        NEXT_TURN,
        r.decode_tok_s,
        mib(r.weight_bytes),
        mib(r.kv_bytes),
        r.kv_bytes_per_token,
        mib(r.peak_rss_bytes),
        r.compile_cold_s,
        r.compile_cached_s,
        r.weights_load_s,
        r.dispatches_per_decode_step,
        foreign(r.foreign_cpu_share),
    )
}

/// A row's foreign CPU share for people: a percentage, and whether that is load.
fn foreign(share: Option<f64>) -> String {
    match share {
        None => "not measured (no /proc/stat)".to_owned(),
        Some(s) if s >= cpu_share::LOADED => format!("{:.0}% (measured under load)", s * 100.0),
        Some(s) => format!("{:.0}%", s * 100.0),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;
    use engine::Precision;

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        args: Args,
    }

    fn parse(args: &[&str]) -> Result<Args, clap::Error> {
        Cli::try_parse_from(std::iter::once("bench").chain(args.iter().copied())).map(|c| c.args)
    }

    #[test]
    fn defaults() {
        let a = parse(&["--model", "m"]).unwrap();
        assert_eq!(a.m.model, PathBuf::from("m"));
        assert_eq!(a.m.device, "local-task");
        assert_eq!(a.m.precision(), Precision::F16, "the CPU default");
        assert_eq!((a.prompt_len, a.steps, a.repeats, a.json, a.cache_only), (128, 128, 3, false, false));
        assert_eq!((a.batch.as_slice(), a.context.as_slice()), (&[1][..], &[][..]));
    }

    #[test]
    fn the_measuring_child_gets_the_resolved_folder() {
        let os = |args: &[&str]| args.iter().map(OsString::from).collect::<Vec<_>>();
        let folder = Path::new("/hf/models--o--n/snapshots/abc");
        let snapshot = "/hf/models--o--n/snapshots/abc";
        for given in [
            &["bench", "--model", "o/n@v1", "--json", "--steps", "4"][..],
            &["bench", "--model=o/n", "--steps", "4"],
            &["bench", "--cache-dir", "/c", "--model=o/n", "--cache-dir=/d", "--steps", "4"],
        ] {
            assert_eq!(child_args(os(given), folder), os(&["bench", "--model", snapshot, "--steps", "4"]), "{given:?}");
        }
    }

    #[test]
    fn every_flag() {
        let a = parse(&[
            "--model",
            "d",
            "--device",
            "local-sync",
            "--precision",
            "f32",
            "--prompt-len",
            "7",
            "--steps",
            "5",
            "--repeats",
            "2",
            "--json",
            "--cache-only",
            "--batch",
            "1,4,8",
            "--context",
            "100,2000",
        ])
        .unwrap();
        assert_eq!((a.batch.as_slice(), a.context.as_slice()), (&[1, 4, 8][..], &[100, 2000][..]));
        assert_eq!(a.m.device, "local-sync");
        assert_eq!((a.prompt_len, a.steps, a.repeats, a.json, a.cache_only), (7, 5, 2, true, true));
    }

    #[test]
    fn bad_flags_are_refused() {
        assert!(parse(&[]).unwrap_err().to_string().contains("--model"));
        assert!(parse(&["--model", "m", "--steps", "x"]).unwrap_err().to_string().contains("invalid value 'x'"));
        let err = parse(&["--model", "m", "--precision", "f64"]).unwrap_err().to_string();
        assert!(err.contains("unknown precision `f64`"), "{err}");
    }

    #[test]
    fn zero_counts_are_refused_before_loading() {
        for (flag, msg) in [
            ("--prompt-len", "--prompt-len must be at least 1"),
            ("--steps", "--steps must be at least 1"),
            ("--repeats", "--repeats must be at least 1"),
            ("--batch", "--batch sizes must be at least 1"),
            ("--context", "--context lengths must be at least 1"),
        ] {
            let a = parse(&["--model", "/nonexistent", flag, "0"]).unwrap();
            assert_eq!(check(&a).unwrap_err().to_string(), msg);
        }
        let a = parse(&["--model", "/nonexistent"]).unwrap();
        assert_eq!(check(&a).unwrap_err().to_string(), "model folder /nonexistent does not exist");
        let a = parse(&["--model", "/nonexistent", "--device", "tpu"]).unwrap();
        assert!(check(&a).unwrap_err().to_string().contains("unsupported device `tpu`"));
    }

    #[test]
    fn prompt_is_fixed_and_in_range() {
        assert_eq!(prompt_ids(5, 49152), vec![1, 38, 75, 112, 149]);
        let p = prompt_ids(128, 256);
        assert_eq!(p.len(), 128);
        assert!(p.iter().all(|&t| (1..256).contains(&t)), "{p:?}");
        assert_eq!(prompt_ids(3, 1), vec![1, 1, 1]);
    }

    #[test]
    fn medians() {
        assert_eq!(median(&mut [3.0, 1.0, 2.0]), 2.0);
        assert_eq!(median(&mut [4.0, 1.0, 3.0, 2.0]), 2.5);
        assert_eq!(median(&mut [7.5]), 7.5);
        assert!(median(&mut []).is_nan());
    }

    #[test]
    fn vm_hwm() {
        let status = "Name:\tx\nVmPeak:\t  100 kB\nVmHWM:\t    2048 kB\nVmRSS:\t 1000 kB\n";
        assert_eq!(parse_vm_hwm(status), Some(2048 * 1024));
        assert_eq!(parse_vm_hwm("VmRSS: 1 kB\n"), None);
        assert!(peak_rss().unwrap() > 1 << 20);
    }
}
