//! `cargo xtask bench`: the performance numbers. Set-up first (idempotent: packages, the
//! IREE runtime, the models, a release build of `mlx-iree`), then `mlx-iree bench` once per
//! (model, precision), and one table with decode speed as ratios against f32 (and f16)
//! of the same model, measured in one run because the machine is shared and noisy.
//!
//! Models: SmolLM2-135M-Instruct 4-bit (`cargo xtask model`) and a Llama-3.2-1B-shaped
//! model with random weights (xtask/python/make_random_llama.py) saved as f16, MLX 4-bit
//! and MLX 8-bit under target/models/llama-1b-random-{f16,4bit,8bit}.

use crate::build_iree::{self, Target};
use crate::fixtures::{self, script_digest};
use crate::pins::Pins;
use crate::util;
use anyhow::{Context, Result, bail};
use serde::Deserialize;
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Instant;

const PRECISIONS: [&str; 4] = ["f32", "f16", "bf16", "packed"];
const SMOLLM2: &str = "smollm2-135m-instruct-4bit";
const LLAMA_1B: &str = "llama-1b-random";
const LLAMA_1B_VARIANTS: [&str; 3] = ["f16", "4bit", "8bit"];
/// What a refused precision says (mlx-iree's `Precision` parser); such a row is a note,
/// not a failure, so the command keeps working while precisions land.
const NOT_IMPLEMENTED: &str = "not implemented yet";

pub const USAGE: &str = "\
usage: cargo xtask bench [--model M]... [--precision P] [--device URI] [--json]
                         [--prompt-len N] [--steps N] [--repeats N] [--prepare-only]
  --model M        smollm2 (SmolLM2-135M-Instruct 4-bit), llama-1b (Llama-3.2-1B shape,
                   random weights: the f16 folder for f32/f16/bf16, the 4-bit and 8-bit
                   folders for packed) or an MLX model folder; repeatable
                   (default: smollm2 and llama-1b)
  --precision P    f32, f16, bf16, packed or all (default: all)
  --device URI     local-task (default), local-sync or cuda
  --json           one JSON object per (model, device, precision) line on stdout
  --prompt-len N   prompt tokens (default 128)
  --steps N        decode steps after the prompt (default 128; 16 for llama-1b, whose
                   f32 decode step takes seconds on 2 cores)
  --repeats N      repeats of prompt + decode; medians are reported (default 3)
  --prepare-only   only the set-up steps (runtime, models, release build)
  --peers          llama.cpp on the same models (not implemented yet)
";

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ModelArg {
    SmolLm2,
    Llama1b,
    Dir(PathBuf),
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Options {
    pub models: Vec<ModelArg>,
    pub precisions: Vec<&'static str>,
    pub device: String,
    pub json: bool,
    pub prompt_len: usize,
    /// None: the model's default (`default_steps`).
    pub steps: Option<usize>,
    pub repeats: usize,
    pub prepare_only: bool,
}

/// Decode steps per repeat when `--steps` is not given. The 1B model's f32 decode step
/// takes over 2 s on the 2-core machine this was written on; 16 steps keep a full default
/// run near 15 minutes. Per-step time does not depend on the position (the graph attends
/// over the whole cache capacity, masked), so fewer steps measure the same rate.
pub fn default_steps(model: &ModelArg) -> usize {
    match model {
        ModelArg::Llama1b => 16,
        ModelArg::SmolLm2 | ModelArg::Dir(_) => 128,
    }
}

pub fn parse_args(args: &[String]) -> Result<Options> {
    let mut o = Options {
        models: Vec::new(),
        precisions: PRECISIONS.to_vec(),
        device: "local-task".into(),
        json: false,
        prompt_len: 128,
        steps: None,
        repeats: 3,
        prepare_only: false,
    };
    let mut it = args.iter();
    while let Some(flag) = it.next() {
        let mut value = || it.next().with_context(|| format!("bench: `{flag}` needs a value\n{USAGE}"));
        match flag.as_str() {
            "--model" => o.models.push(match value()?.as_str() {
                "smollm2" => ModelArg::SmolLm2,
                "llama-1b" => ModelArg::Llama1b,
                dir => ModelArg::Dir(PathBuf::from(dir)),
            }),
            "--precision" => {
                let p = value()?;
                o.precisions = match PRECISIONS.iter().find(|x| *x == p) {
                    Some(x) => vec![*x],
                    None if p == "all" => PRECISIONS.to_vec(),
                    None => bail!("bench: unknown precision `{p}` (expected f32, f16, bf16, packed or all)"),
                };
            }
            "--device" => o.device = value()?.clone(),
            "--prompt-len" => o.prompt_len = count(flag, value()?)?,
            "--steps" => o.steps = Some(count(flag, value()?)?),
            "--repeats" => o.repeats = count(flag, value()?)?,
            "--json" => o.json = true,
            "--prepare-only" => o.prepare_only = true,
            "--peers" => {
                bail!("bench: --peers (llama.cpp through llama-cpp-python on the same models) is not implemented yet")
            }
            other => bail!("bench: unknown argument `{other}`\n{USAGE}"),
        }
    }
    if o.models.is_empty() {
        o.models = vec![ModelArg::SmolLm2, ModelArg::Llama1b];
    }
    Ok(o)
}

fn count(flag: &str, v: &str) -> Result<usize> {
    match v.parse::<usize>() {
        Ok(n) if n > 0 => Ok(n),
        _ => bail!("bench: `{flag}` needs a whole number of at least 1 (got `{v}`)"),
    }
}

/// One `mlx-iree bench` run: a model folder at a precision. `family` groups the rows
/// whose decode speeds are compared (one model, whatever checkpoint variant).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Case {
    pub family: String,
    pub model: PathBuf,
    pub precision: &'static str,
    pub steps: usize,
}

/// The rows to measure, f32 first in each family (it is the baseline of the ratios).
pub fn cases(o: &Options, models_dir: &Path) -> Vec<Case> {
    let mut out = Vec::new();
    for m in &o.models {
        let steps = o.steps.unwrap_or_else(|| default_steps(m));
        for &precision in &o.precisions {
            match m {
                ModelArg::SmolLm2 => out.push(Case {
                    family: SMOLLM2.trim_end_matches("-4bit").into(),
                    model: models_dir.join(SMOLLM2),
                    precision,
                    steps,
                }),
                // Float precisions read the f16 folder; packed keeps MLX's quantized words,
                // so it runs on the quantized folders.
                ModelArg::Llama1b => {
                    let variants: &[&str] = if precision == "packed" { &["4bit", "8bit"] } else { &["f16"] };
                    for v in variants {
                        out.push(Case {
                            family: LLAMA_1B.into(),
                            model: llama_1b_dir(models_dir, v),
                            precision,
                            steps,
                        });
                    }
                }
                ModelArg::Dir(dir) => out.push(Case {
                    family: dir
                        .file_name()
                        .map_or_else(|| dir.display().to_string(), |n| n.to_string_lossy().into_owned()),
                    model: dir.clone(),
                    precision,
                    steps,
                }),
            }
        }
    }
    out
}

fn llama_1b_dir(models_dir: &Path, variant: &str) -> PathBuf {
    models_dir.join(format!("{LLAMA_1B}-{variant}"))
}

pub fn run(args: &[String]) -> Result<()> {
    if args.iter().any(|a| a == "-h" || a == "--help") {
        print!("{USAGE}");
        return Ok(());
    }
    let opts = parse_args(args)?;
    if opts.prepare_only {
        return prepare(&opts);
    }
    let started = Instant::now();
    // The set-up steps print progress on stdout; run them as a child whose stdout is our
    // stderr, so stdout carries only the table or the JSON lines.
    let exe = std::env::current_exe().context("locating the xtask binary")?;
    util::run(Command::new(exe).arg("bench").args(args).arg("--prepare-only").stdout(Stdio::from(std::io::stderr())))?;
    let bin = util::target_dir().join("release/mlx-iree");
    let cases = cases(&opts, &crate::model::models_dir());
    let mut rows = Vec::new();
    for (i, case) in cases.iter().enumerate() {
        note(format!(
            "{}/{}: {} at {} on {}",
            i + 1,
            cases.len(),
            display_name(&case.model),
            case.precision,
            opts.device
        ));
        let row = measure(&bin, case, &opts)?;
        if opts.json {
            println!("{}", row.json_line(case, &opts.device));
        }
        rows.push(row);
    }
    if !opts.json {
        print!("{}", table(&cases, &rows));
    }
    let failed: Vec<String> = cases
        .iter()
        .zip(&rows)
        .filter_map(|(c, r)| match r {
            Row::Failed(e) if !e.contains(NOT_IMPLEMENTED) => {
                Some(format!("{} {}: {e}", display_name(&c.model), c.precision))
            }
            _ => None,
        })
        .collect();
    note(format!("{} rows in {:.0} s", rows.len(), started.elapsed().as_secs_f64()));
    if !failed.is_empty() {
        bail!("{} benchmark(s) failed:\n  {}", failed.len(), failed.join("\n  "));
    }
    Ok(())
}

/// A progress line on stderr (stdout is the result).
fn note(msg: impl AsRef<str>) {
    eprintln!("[bench] {}", msg.as_ref());
}

/// Everything the runs need, each step skipped when already done.
fn prepare(o: &Options) -> Result<()> {
    let toolchain = crate::setup::run()?;
    let runtime = if o.device.starts_with("cuda") { Target::Cuda } else { Target::Cpu };
    let runtime_dir = build_iree::build(&toolchain, runtime)?;
    if o.models.contains(&ModelArg::SmolLm2) {
        crate::model::run(&[])?;
    }
    if o.models.contains(&ModelArg::Llama1b) {
        let packed = o.precisions.contains(&"packed");
        let floats = o.precisions.iter().any(|p| *p != "packed");
        let variants: Vec<&str> =
            LLAMA_1B_VARIANTS.iter().copied().filter(|v| if *v == "f16" { floats } else { packed }).collect();
        llama_1b(&variants)?;
    }
    util::progress(
        "bench",
        "cargo build --release -p mlx-iree (the first release build compiles melior, tokenizers and the IREE \
         bindings: several minutes)",
    );
    let mut cargo = Command::new(util::cargo());
    cargo.current_dir(util::root()).args(["build", "--release", "-p", "mlx-iree"]);
    if runtime != Target::Cpu {
        cargo.env("IREE_RUNTIME_DIR", &runtime_dir);
    }
    util::run(&mut cargo)
}

/// target/models/llama-1b-random-<variant> for each variant, made by mlx-lm unless its
/// stamp says the same script and packages already made it.
fn llama_1b(variants: &[&str]) -> Result<()> {
    let pins = Pins::load()?;
    let venv = fixtures::mlx_venv(&pins, "bench 1/2")?;
    let base = format!(
        "packages: {}\nmake_random_llama.py: {}\n",
        pins.oracle.python_packages.join(" "),
        script_digest("make_random_llama.py")?
    );
    for v in variants {
        let dest = llama_1b_dir(&crate::model::models_dir(), v);
        let stamp = format!("{base}variant: {v}\n");
        crate::model::step("bench 2/2", &dest, &stamp, |partial| {
            util::progress("bench 2/2", "random weights with mlx-lm: about a minute");
            util::run(fixtures::python(&venv, "make_random_llama.py").args(["--variant", v, "--out"]).arg(partial))
        })?;
    }
    Ok(())
}

fn display_name(dir: &Path) -> String {
    dir.file_name().map_or_else(|| dir.display().to_string(), |n| n.to_string_lossy().into_owned())
}

/// What `mlx-iree bench --json` prints (the fields the table shows).
#[derive(Debug, Clone, PartialEq, Deserialize)]
pub struct Measured {
    pub prefill_tok_s: f64,
    pub decode_tok_s: f64,
    pub ttft_ms: f64,
    pub weight_bytes: u64,
    pub peak_rss_bytes: u64,
    pub dispatches_per_decode_step: u64,
    pub compile_cold_s: f64,
    /// null when the engine did not hit the cache the cold compile filled.
    pub compile_cached_s: Option<f64>,
}

#[derive(Debug, Clone, PartialEq)]
pub enum Row {
    /// The JSON line as printed, and its parsed fields.
    Ok(String, Measured),
    Failed(String),
}

impl Row {
    fn json_line(&self, case: &Case, device: &str) -> String {
        match self {
            Row::Ok(line, _) => line.clone(),
            Row::Failed(error) => serde_json::json!({
                "model": case.model.display().to_string(),
                "device": device,
                "precision": case.precision,
                "error": error,
            })
            .to_string(),
        }
    }
}

/// Runs `mlx-iree bench --json` for one case. Its stderr streams through (compile
/// progress); a failure becomes a row holding its one-line error.
fn measure(bin: &Path, case: &Case, o: &Options) -> Result<Row> {
    let mut cmd = Command::new(bin);
    cmd.arg("bench")
        .arg("--model")
        .arg(&case.model)
        .args(["--precision", case.precision, "--device", &o.device, "--json"])
        .args(["--prompt-len", &o.prompt_len.to_string()])
        .args(["--steps", &case.steps.to_string()])
        .args(["--repeats", &o.repeats.to_string()])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let shown = util::show(&cmd);
    let mut child = cmd.spawn().with_context(|| format!("could not start `{shown}`"))?;
    let stderr = child.stderr.take().context("no stderr pipe")?;
    let echo = std::thread::spawn(move || {
        let mut last = String::new();
        for line in BufReader::new(stderr).lines().map_while(Result::ok) {
            eprintln!("    {line}");
            if !line.trim().is_empty() {
                last = line;
            }
        }
        last
    });
    let mut stdout = String::new();
    if let Some(mut out) = child.stdout.take() {
        std::io::Read::read_to_string(&mut out, &mut stdout).with_context(|| format!("reading from `{shown}`"))?;
    }
    let status = child.wait()?;
    let last = echo.join().unwrap_or_default();
    if !status.success() {
        let msg = error_note(&last);
        return Ok(Row::Failed(if msg.is_empty() { format!("exited with {status}") } else { msg }));
    }
    parse_row(&stdout).with_context(|| format!("`{shown}` printed {stdout:?}"))
}

/// The reason in `mlx-iree`'s one-line error, without the CLI's framing (prefix, clap's
/// "invalid value ... for '--flag'", the help hint).
pub fn error_note(line: &str) -> String {
    let msg = line.trim().trim_start_matches("mlx-iree: error: ");
    let msg = msg.trim_end_matches(" (see mlx-iree --help)");
    let msg = match msg.strip_prefix("invalid value ").and_then(|rest| rest.split_once("': ")) {
        Some((_, reason)) => reason,
        None => msg,
    };
    msg.to_owned()
}

pub fn parse_row(stdout: &str) -> Result<Row> {
    let line = stdout.lines().rfind(|l| l.trim_start().starts_with('{')).context("no JSON line")?.trim();
    let measured: Measured = serde_json::from_str(line)?;
    Ok(Row::Ok(line.to_owned(), measured))
}

/// The human table: one line per row, decode speed also as a ratio against the f32 row
/// (and the f16 row, when one succeeded) of the same family.
pub fn table(cases: &[Case], rows: &[Row]) -> String {
    let baseline = |family: &str, precision: &str| {
        cases.iter().zip(rows).find_map(|(c, r)| match r {
            Row::Ok(_, m) if c.family == family && c.precision == precision => Some(m.decode_tok_s),
            _ => None,
        })
    };
    let any_f16 = cases.iter().any(|c| baseline(&c.family, "f16").is_some());
    let mib = |b: u64| format!("{:.0}", b as f64 / (1024.0 * 1024.0));
    let ratio = |x: f64, base: Option<f64>| base.map_or_else(|| "-".to_owned(), |b| format!("{:.2}x", x / b));
    let width = cases.iter().map(|c| display_name(&c.model).len()).max().unwrap_or(5).max(5);
    let mut out = format!(
        "{:<width$}  {:<9}  {:>5}  {:>9}  {:>9}  {:>7}{}  {:>9}  {:>8}  {:>8}  {:>13}  {:>10}\n",
        "model",
        "precision",
        "steps",
        "prefill/s",
        "decode/s",
        "vs f32",
        if any_f16 { format!("  {:>7}", "vs f16") } else { String::new() },
        "ttft ms",
        "wts MiB",
        "RSS MiB",
        "compile s",
        "disp/step",
    );
    for (c, r) in cases.iter().zip(rows) {
        let name = display_name(&c.model);
        match r {
            Row::Ok(_, m) => {
                out += &format!(
                    "{name:<width$}  {:<9}  {:>5}  {:>9.1}  {:>9.2}  {:>7}{}  {:>9.1}  {:>8}  {:>8}  {:>13}  {:>10}\n",
                    c.precision,
                    c.steps,
                    m.prefill_tok_s,
                    m.decode_tok_s,
                    ratio(m.decode_tok_s, baseline(&c.family, "f32")),
                    if any_f16 {
                        format!("  {:>7}", ratio(m.decode_tok_s, baseline(&c.family, "f16")))
                    } else {
                        String::new()
                    },
                    m.ttft_ms,
                    mib(m.weight_bytes),
                    mib(m.peak_rss_bytes),
                    format!(
                        "{:.1}/{}",
                        m.compile_cold_s,
                        m.compile_cached_s.map_or_else(|| "?".into(), |s| format!("{s:.2}"))
                    ),
                    m.dispatches_per_decode_step,
                );
            }
            Row::Failed(e) => out += &format!("{name:<width$}  {:<9}  error: {e}\n", c.precision),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(a: &[&str]) -> Vec<String> {
        a.iter().map(|s| (*s).to_owned()).collect()
    }

    #[test]
    fn defaults_measure_both_models_at_every_precision() {
        let o = parse_args(&[]).unwrap();
        assert_eq!(o.models, vec![ModelArg::SmolLm2, ModelArg::Llama1b]);
        assert_eq!(o.precisions, vec!["f32", "f16", "bf16", "packed"]);
        assert_eq!((o.device.as_str(), o.json, o.prompt_len, o.steps, o.repeats), ("local-task", false, 128, None, 3));
        let m = Path::new("/m");
        let got: Vec<(String, &str, usize)> =
            cases(&o, m).iter().map(|c| (c.model.display().to_string(), c.precision, c.steps)).collect();
        let want = [
            ("/m/smollm2-135m-instruct-4bit", "f32", 128),
            ("/m/smollm2-135m-instruct-4bit", "f16", 128),
            ("/m/smollm2-135m-instruct-4bit", "bf16", 128),
            ("/m/smollm2-135m-instruct-4bit", "packed", 128),
            ("/m/llama-1b-random-f16", "f32", 16),
            ("/m/llama-1b-random-f16", "f16", 16),
            ("/m/llama-1b-random-f16", "bf16", 16),
            ("/m/llama-1b-random-4bit", "packed", 16),
            ("/m/llama-1b-random-8bit", "packed", 16),
        ];
        let want: Vec<(String, &str, usize)> = want.iter().map(|(d, p, n)| ((*d).to_owned(), *p, *n)).collect();
        assert_eq!(got, want);
    }

    #[test]
    fn every_flag() {
        let o = parse_args(&args(&[
            "--model",
            "llama-1b",
            "--model",
            "/x/my-model",
            "--precision",
            "f16",
            "--device",
            "cuda",
            "--json",
            "--prompt-len",
            "16",
            "--steps",
            "8",
            "--repeats",
            "1",
        ]))
        .unwrap();
        assert_eq!(o.models, vec![ModelArg::Llama1b, ModelArg::Dir("/x/my-model".into())]);
        assert_eq!(o.precisions, vec!["f16"]);
        assert_eq!((o.device.as_str(), o.json, o.prompt_len, o.steps, o.repeats), ("cuda", true, 16, Some(8), 1));
        let c = cases(&o, Path::new("/m"));
        assert_eq!(c.len(), 2);
        assert!(c.iter().all(|c| c.steps == 8));
        assert_eq!((c[1].family.as_str(), c[1].model.as_path()), ("my-model", Path::new("/x/my-model")));
        assert!(!parse_args(&args(&["--precision", "all"])).unwrap().prepare_only);
        assert!(parse_args(&args(&["--prepare-only"])).unwrap().prepare_only);
    }

    #[test]
    fn packed_on_the_1b_model_uses_the_quantized_folders() {
        let o = parse_args(&args(&["--model", "llama-1b", "--precision", "packed"])).unwrap();
        let dirs: Vec<PathBuf> = cases(&o, Path::new("/m")).into_iter().map(|c| c.model).collect();
        assert_eq!(dirs, vec![PathBuf::from("/m/llama-1b-random-4bit"), PathBuf::from("/m/llama-1b-random-8bit")]);
    }

    #[test]
    fn bad_arguments() {
        let err = |a: &[&str]| parse_args(&args(a)).unwrap_err().to_string();
        assert!(err(&["--precision", "f64"]).starts_with("bench: unknown precision `f64`"));
        assert!(err(&["--steps", "0"]).starts_with("bench: `--steps` needs a whole number of at least 1 (got `0`)"));
        assert!(err(&["--repeats", "x"]).starts_with("bench: `--repeats` needs a whole number"));
        assert!(err(&["--model"]).starts_with("bench: `--model` needs a value"));
        assert!(err(&["--bogus"]).starts_with("bench: unknown argument `--bogus`"));
        assert!(err(&["--peers"]).contains("--peers") && err(&["--peers"]).contains("not implemented yet"));
    }

    #[test]
    fn error_notes_drop_the_cli_framing() {
        assert_eq!(
            error_note(
                "mlx-iree: error: invalid value 'packed' for '--precision <PRECISION>': precision `packed` is not \
                 implemented yet (available: f32, f16, bf16) (see mlx-iree --help)\n"
            ),
            "precision `packed` is not implemented yet (available: f32, f16, bf16)"
        );
        assert_eq!(error_note("mlx-iree: error: loading /m: out of memory"), "loading /m: out of memory");
    }

    fn measured(decode: f64) -> Measured {
        Measured {
            prefill_tok_s: 100.0,
            decode_tok_s: decode,
            ttft_ms: 1280.0,
            weight_bytes: 3 << 20,
            peak_rss_bytes: 10 << 20,
            dispatches_per_decode_step: 42,
            compile_cold_s: 12.5,
            compile_cached_s: Some(0.03),
        }
    }

    #[test]
    fn json_lines_parse_and_errors_become_rows() {
        let line = r#"{"model":"m","device":"local-task","precision":"f32","prefill_tok_s":100.0,"decode_tok_s":20.0,"ttft_ms":1280.0,"weight_bytes":3145728,"peak_rss_bytes":10485760,"dispatches_per_decode_step":42,"compile_cold_s":12.5,"compile_cached_s":0.03,"weights_load_s":1.0}"#;
        let row = parse_row(&format!("{line}\n")).unwrap();
        assert_eq!(row, Row::Ok(line.to_owned(), measured(20.0)));
        assert!(parse_row("no json here\n").is_err());
        let case = Case { family: "f".into(), model: "/m/x".into(), precision: "packed", steps: 1 };
        let null_cached = line.replace("\"compile_cached_s\":0.03", "\"compile_cached_s\":null");
        match parse_row(&null_cached).unwrap() {
            Row::Ok(_, m) => assert_eq!(m.compile_cached_s, None),
            other => panic!("{other:?}"),
        }
        let failed = Row::Failed("precision `packed` is not implemented yet".into()).json_line(&case, "local-task");
        let v: serde_json::Value = serde_json::from_str(&failed).unwrap();
        assert_eq!(v["model"], "/m/x");
        assert_eq!(v["precision"], "packed");
        assert_eq!(v["device"], "local-task");
        assert_eq!(v["error"], "precision `packed` is not implemented yet");
        assert_eq!(row.json_line(&case, "local-task"), line);
    }

    #[test]
    fn table_shows_ratios_within_a_family() {
        let case =
            |family: &str, dir: &str, precision| Case { family: family.into(), model: dir.into(), precision, steps: 1 };
        let cases = [
            case("a", "/m/a-4bit", "f32"),
            case("a", "/m/a-4bit", "f16"),
            case("a", "/m/a-4bit", "packed"),
            case("b", "/m/b", "f32"),
        ];
        let rows = [
            Row::Ok(String::new(), measured(20.0)),
            Row::Ok(String::new(), measured(30.0)),
            Row::Failed("precision `packed` is not implemented yet".into()),
            Row::Ok(String::new(), measured(5.0)),
        ];
        let t = table(&cases, &rows);
        let lines: Vec<&str> = t.lines().collect();
        assert_eq!(lines.len(), 5, "{t}");
        let cols = |l: &str| l.split_whitespace().map(str::to_owned).collect::<Vec<_>>();
        assert_eq!(
            cols(lines[0]),
            [
                "model",
                "precision",
                "steps",
                "prefill/s",
                "decode/s",
                "vs",
                "f32",
                "vs",
                "f16",
                "ttft",
                "ms",
                "wts",
                "MiB",
                "RSS",
                "MiB",
                "compile",
                "s",
                "disp/step"
            ]
        );
        assert_eq!(
            cols(lines[1]),
            ["a-4bit", "f32", "1", "100.0", "20.00", "1.00x", "0.67x", "1280.0", "3", "10", "12.5/0.03", "42"]
        );
        assert_eq!(cols(lines[2])[..7], ["a-4bit", "f16", "1", "100.0", "30.00", "1.50x", "1.00x"]);
        assert_eq!(lines[3], "a-4bit  packed     error: precision `packed` is not implemented yet");
        // Family b has no f16 row: no ratio against it.
        assert_eq!(cols(lines[4])[..7], ["b", "f32", "1", "100.0", "5.00", "1.00x", "-"]);
    }
}
