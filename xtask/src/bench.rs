//! `cargo xtask bench`: the performance numbers. Set-up first (idempotent: packages, the
//! IREE runtime, the models, a release build of `mlx-iree`), then `mlx-iree bench` once per
//! (model, precision), which prints one row per (context, batch), and one table with decode
//! speed as ratios against f32 (and f16) of the same model, batch and context, measured in
//! one run because the machine is shared and noisy.
//!
//! Models: SmolLM2-135M-Instruct 4-bit (`cargo xtask model`) and a Llama-3.2-1B-shaped
//! model with random weights (xtask/python/make_random_llama.py) saved as f16, MLX 4-bit
//! and MLX 8-bit under target/models/llama-1b-random-{f16,4bit,8bit}.
//!
//! `--peers` adds llama.cpp (f16, Q8_0, Q4_0 of the same weights) and, on SmolLM2,
//! mlx-lm at f32 (`peers.rs`), and prints one table with our decode and prefill speed
//! as ratios against the matching peer row and every row against the memory-bandwidth
//! bound measured in the same run. llama.cpp is measured twice there: through our
//! llama-cpp-python harness (peers.py) and by its own `llama-bench`, side by side, so the
//! harness is checked in every run. With `--batch` or `--context`, llama.cpp's own
//! `llama-batched-bench` gives the peer rows per (context, batch) instead.

use crate::build_iree::{self, Target};
use crate::fixtures::{self, script_digest};
use crate::peers;
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
/// The quantized folders `--formats` picks from for `packed` (make_random_llama.py's
/// variants): MLX affine 3, 4, 6 and 8 bits, mxfp4 and mxfp8.
const PACKED_FORMATS: [&str; 6] = ["4bit", "8bit", "3bit", "6bit", "mxfp4", "mxfp8"];
const QWEN3_MOE_1B: &str = "qwen3-moe-1b-random";
const QWEN3_5_08B: &str = "qwen3.5-0.8b-random";
const GPT_OSS_2L: &str = "gpt-oss-2l-random";
const KV_CACHE: [&str; 3] = ["f32", "f16", "q8"];
/// `--activations` values: how the CPU kernel's packed products quantize their input.
const ACTIVATIONS: [&str; 2] = ["i16", "i8"];

pub const USAGE: &str = "\
usage: cargo xtask bench [--model M]... [--precision P] [--device URI] [--json]
                         [--prompt-len N] [--steps N] [--repeats N] [--batch LIST]
                         [--context LIST] [--max-context N] [--kv-cache LIST] [--formats LIST]
                         [--activations LIST] [--prepare-only] [--peers]
  --model M        smollm2 (SmolLM2-135M-Instruct 4-bit), llama-1b (Llama-3.2-1B shape,
                   random weights: the f16 folder for f32/f16/bf16, the 4-bit and 8-bit
                   folders for packed), qwen3-moe-1b (a random Qwen3-MoE, 8 experts, 2 a
                   token, 1.2 G weights of which 0.36 G run per token; folders as llama-1b;
                   no peers), qwen3.5-0.8b (a random Qwen3.5, gated DeltaNet layers with
                   attention every fourth, 0.75 G weights; folders as llama-1b; no peers),
                   gpt-oss-2l (gpt-oss 20B's widths with 2 of its 24 layers, random:
                   32 experts, 4 a token, 2.8 G weights of which 0.83 G run per token;
                   folders as llama-1b, `--formats mxfp4` for its own format; no peers)
                   or an MLX model folder; repeatable
                   (default: smollm2 and llama-1b)
  --precision P    f32, f16, bf16, packed, a comma list of them (packed,f16) or all
                   (default: all)
  --device URI     local-task (default), local-sync or cuda
  --json           one JSON object per (model, device, precision, context, batch) line on
                   stdout
  --prompt-len N   prompt tokens (default 128)
  --steps N        decode steps after the prompt (default 128; 16 for llama-1b, whose
                   f32 decode step takes seconds on 2 cores)
  --repeats N      repeats of prompt + decode; medians are reported (default 3)
  --batch LIST     sequences decoded together, e.g. 1,4,8: one row each, decode/s is
                   their aggregate (default 1)
  --context LIST   tokens of context before decoding, e.g. 100,2000: one row each
                   (default: --prompt-len)
  --max-context N  positions per sequence the engine is built for (default: mlx-iree's,
                   the model's maximum capped by the KV cache budget)
  --kv-cache LIST  KV cache element types: f32 (mlx-iree's default), f16 or q8; a comma
                   list (f32,q8) runs each case once per type, with its decode speed
                   against the f32 cache's in a `vs f32 KV` column
  --formats LIST   the random shapes' quantized folders `packed` runs on: 4bit, 8bit, 3bit,
                   6bit, mxfp4, mxfp8, comma-separated (default 4bit,8bit)
  --activations LIST  how the CPU kernel's packed products quantize their input: i16
                   (mlx-iree's default) or i8; a comma list (i16,i8) runs each case once per
                   setting, with its prefill speed against i16's in a `prefill vs i16` column
  --prepare-only   only the set-up steps (runtime, models, release build)
  --peers          also llama.cpp's CPU build on the same weights as GGUF f16, Q8_0 and
                   Q4_0 (our f16 vs f16, packed 4-bit vs Q4_0, packed 8-bit vs Q8_0):
                   through llama-cpp-python (compiled once into target/peers-venv: about
                   14 minutes on 2 cores) and through llama.cpp's own llama-bench (built
                   once from the same source into target/peers/llama.cpp-VERSION: about
                   20 minutes), plus mlx-lm at f32 on smollm2; one table with our speed as
                   ratios against them and every row against the memory-bandwidth bound
                   measured in the same run. With --batch or --context: llama.cpp's
                   llama-batched-bench instead (B sequences in one llama_decode per step),
                   in the GGUF type paired with each of our cases, run right after that
                   case: one row per (context, batch) beside ours, with the ratio, and
                   decode at each context against the first
  --serve          measure `mlx-iree serve` instead: per (model, precision) one server on
                   loopback and, per --streams count, that many concurrent streamed greedy
                   requests (4 each, --steps new tokens, default 64) from the pinned openai
                   client: aggregate tok/s, p50/p99 time to first token and latency
                   (--max-context default 256); with --peers also llama.cpp's llama-server
                   (-np STREAMS, the same context per slot, GGUF f16 or Q4_0/Q8_0 as
                   paired above) driven by the same client, with our ratio against it.
                   With --prompt-len N, every request's prompt is about N tokens instead
                   of one line, each its own (long-prompt load; --max-context default
                   2N + --steps), the server's mean count in the table
  --streams LIST   concurrent streams for --serve (default 1,8,16); with --draft, that many
                   concurrent rewrite requests to `mlx-iree serve` without and with
                   `--draft ngram` instead of `generate` (aggregate tok/s, their ratio,
                   verify calls)
  --json-streams K with --serve, also a row per stream count N >= K where K of the N
                   streams are chat requests constrained to a JSON schema
  --turns T        with --serve, also per stream count N: N conversations of T turns behind
                   one ~1,500-token system prompt, each turn resending the conversation, on
                   the server (prefix cache on) and on one started with --no-prefix-cache
                   (--max-context default 2560)
  --draft          measure speculative decoding instead: per (model, precision),
                   `mlx-iree generate --chat` rewriting a ~390-token Python module with one
                   change, greedy, --steps new tokens (default 256), without and with
                   `--draft ngram`, --repeats times each in turn: decode tok/s of both, their
                   ratio, drafts accepted, tokens per model call (--max-context default 1024)
";

/// `--precision`: `all`, or a comma list of PRECISIONS in the order given, each once.
fn precisions(list: &str) -> Result<Vec<&'static str>> {
    if list == "all" {
        return Ok(PRECISIONS.to_vec());
    }
    let mut out = Vec::new();
    for p in list.split(',') {
        match PRECISIONS.iter().find(|x| **x == p) {
            Some(x) if !out.contains(x) => out.push(*x),
            Some(_) => bail!("bench: precision `{p}` is listed twice in `{list}`"),
            None => {
                bail!("bench: unknown precision `{p}` (expected f32, f16, bf16, packed, a comma list of them, or all)")
            }
        }
    }
    Ok(out)
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ModelArg {
    SmolLm2,
    Llama1b,
    /// A random Qwen3-MoE of the 1B class (8 experts, 2 per token): 1.2 G weights, 0.36 G a token.
    Qwen3Moe1b,
    /// A random Qwen3.5 of the 0.8B class (gated DeltaNet layers, attention every fourth).
    Qwen35,
    /// gpt-oss 20B's widths with 2 of its 24 layers (32 experts, 4 a token), random.
    GptOss2l,
    Dir(PathBuf),
}

impl ModelArg {
    /// The random model shapes: (`make_random_llama.py --shape`, folder name before the variant).
    fn random_shape(&self) -> Option<(&'static str, &'static str)> {
        match self {
            ModelArg::Llama1b => Some(("llama-1b", LLAMA_1B)),
            ModelArg::Qwen3Moe1b => Some(("qwen3-moe-1b", QWEN3_MOE_1B)),
            ModelArg::Qwen35 => Some(("qwen3.5-0.8b", QWEN3_5_08B)),
            ModelArg::GptOss2l => Some(("gpt-oss-2l", GPT_OSS_2L)),
            ModelArg::SmolLm2 | ModelArg::Dir(_) => None,
        }
    }
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
    /// Batch sizes; mlx-iree prints one row per (context, batch).
    pub batch: Vec<usize>,
    /// Empty: mlx-iree's default (one context, --prompt-len).
    pub context: Vec<usize>,
    /// None: mlx-iree's default.
    pub max_context: Option<usize>,
    /// KV cache element types, a case each (empty: mlx-iree's default, f32).
    pub kv_cache: Vec<&'static str>,
    /// Packed products' activations (`ACTIVATIONS`), a case each (empty: mlx-iree's default).
    pub activations: Vec<&'static str>,
    /// The random shapes' quantized folders for `packed` (`PACKED_FORMATS`).
    pub formats: Vec<&'static str>,
    pub prepare_only: bool,
    /// Also measure llama.cpp and mlx-lm (`peers.rs`).
    pub peers: bool,
    /// Measure `mlx-iree serve` under load instead (`serve_bench.rs`).
    pub serve: bool,
    /// Concurrent streams per `--serve` row (and per `--draft` row where given).
    pub streams: Vec<usize>,
    /// Whether `--streams` was given (`--draft` measures through the server then).
    pub streams_given: bool,
    /// Streams constrained to a JSON schema in a second `--serve` row per stream count (0:
    /// no such row).
    pub json_streams: usize,
    /// Turns per conversation of the `--serve` multi-turn rows (0: none).
    pub turns: usize,
    /// `--prompt-len` with `--serve`: prompts of about this many tokens, one per request.
    pub serve_prompt_len: Option<usize>,
    /// Measure speculative decoding instead (`draft_bench.rs`).
    pub draft: bool,
}

/// Decode steps per repeat when `--steps` is not given. The 1B model's f32 decode step
/// takes over 2 s on the 2-core machine this was written on; 16 steps keep a full default
/// run near 15 minutes. Per-step time changes only where the attention window doubles
/// (128, 256, ... positions), so a few steps after the prompt measure the rate at that context.
pub fn default_steps(model: &ModelArg) -> usize {
    match model {
        ModelArg::Llama1b | ModelArg::Qwen3Moe1b | ModelArg::Qwen35 | ModelArg::GptOss2l => 16,
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
        batch: vec![1],
        context: Vec::new(),
        max_context: None,
        kv_cache: Vec::new(),
        activations: Vec::new(),
        formats: vec!["4bit", "8bit"],
        prepare_only: false,
        peers: false,
        serve: false,
        streams: vec![1, 8, 16],
        streams_given: false,
        json_streams: 0,
        turns: 0,
        serve_prompt_len: None,
        draft: false,
    };
    let mut it = args.iter();
    while let Some(flag) = it.next() {
        let mut value = || it.next().with_context(|| format!("bench: `{flag}` needs a value\n{USAGE}"));
        match flag.as_str() {
            "--model" => o.models.push(match value()?.as_str() {
                "smollm2" => ModelArg::SmolLm2,
                "llama-1b" => ModelArg::Llama1b,
                "qwen3-moe-1b" => ModelArg::Qwen3Moe1b,
                "qwen3.5-0.8b" => ModelArg::Qwen35,
                "gpt-oss-2l" => ModelArg::GptOss2l,
                dir => ModelArg::Dir(PathBuf::from(dir)),
            }),
            "--precision" => o.precisions = precisions(value()?)?,
            "--device" => o.device = value()?.clone(),
            "--prompt-len" => {
                o.prompt_len = count(flag, value()?)?;
                o.serve_prompt_len = Some(o.prompt_len);
            }
            "--steps" => o.steps = Some(count(flag, value()?)?),
            "--repeats" => o.repeats = count(flag, value()?)?,
            "--batch" => o.batch = list(flag, value()?)?,
            "--context" => o.context = list(flag, value()?)?,
            "--max-context" => o.max_context = Some(count(flag, value()?)?),
            "--kv-cache" => o.kv_cache = one_of(value()?, &KV_CACHE, "KV cache type", "f32, f16 or q8")?,
            "--activations" => o.activations = one_of(value()?, &ACTIVATIONS, "activations", "i16 or i8")?,
            "--formats" => {
                let v = value()?;
                o.formats = v
                    .split(',')
                    .map(|f| PACKED_FORMATS.iter().copied().find(|x| *x == f))
                    .collect::<Option<_>>()
                    .with_context(|| format!("bench: `--formats` takes {} (got `{v}`)", PACKED_FORMATS.join(", ")))?;
            }
            "--json" => o.json = true,
            "--prepare-only" => o.prepare_only = true,
            "--peers" => o.peers = true,
            "--serve" => o.serve = true,
            "--draft" => o.draft = true,
            "--streams" => {
                o.streams = list(flag, value()?)?;
                o.streams_given = true;
            }
            "--turns" => {
                o.turns = value()?.parse().map_err(|_| anyhow::anyhow!("bench: `--turns` needs a whole number"))?
            }
            "--json-streams" => {
                o.json_streams =
                    value()?.parse().map_err(|_| anyhow::anyhow!("bench: `--json-streams` needs a whole number"))?
            }
            other => bail!("bench: unknown argument `{other}`\n{USAGE}"),
        }
    }
    if o.models.is_empty() {
        o.models = vec![ModelArg::SmolLm2, ModelArg::Llama1b];
    }
    if (o.json_streams > 0 || o.turns > 0) && !o.serve {
        bail!("bench: `--json-streams` and `--turns` apply to --serve");
    }
    if o.serve && (o.batch != [1] || !o.context.is_empty()) {
        bail!("bench: `--serve` takes --streams, not --batch or --context");
    }
    if !o.serve {
        o.serve_prompt_len = None;
    } else if o.serve_prompt_len.is_some() && (o.turns > 0 || o.json_streams > 0) {
        bail!("bench: `--prompt-len` with --serve makes its own rows; not with --turns or --json-streams");
    }
    if o.draft {
        crate::draft_bench::check(&o)?;
    }
    Ok(o)
}

impl Options {
    /// `--peers` with `--batch` or `--context`: llama-batched-bench rows per (context, batch)
    /// instead of the single-sequence peers.
    pub fn batched_peers(&self) -> bool {
        self.peers && !self.serve && (self.batch != [1] || !self.context.is_empty())
    }

    /// The contexts our rows are measured at: --context, else --prompt-len.
    pub fn contexts(&self) -> Vec<usize> {
        if self.context.is_empty() { vec![self.prompt_len] } else { self.context.clone() }
    }
}

fn count(flag: &str, v: &str) -> Result<usize> {
    match v.parse::<usize>() {
        Ok(n) if n > 0 => Ok(n),
        _ => bail!("bench: `{flag}` needs a whole number of at least 1 (got `{v}`)"),
    }
}

/// Comma-separated counts, as mlx-iree takes them.
fn list(flag: &str, v: &str) -> Result<Vec<usize>> {
    match v.split(',').map(|x| x.parse::<usize>().ok().filter(|n| *n > 0)).collect() {
        Some(ns) => Ok(ns),
        None => bail!("bench: `{flag}` needs comma-separated whole numbers of at least 1 (got `{v}`)"),
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
    /// `--kv-cache`, None for mlx-iree's default.
    pub kv_cache: Option<&'static str>,
    /// `--activations`, None for mlx-iree's default.
    pub activations: Option<&'static str>,
}

impl Case {
    /// The precision, then the KV cache's type and the activations where they were asked
    /// for (`packed/q8`, `packed/i8`, `packed/q8/i8`).
    pub fn label(&self) -> String {
        [Some(self.precision), self.kv_cache, self.activations].into_iter().flatten().collect::<Vec<_>>().join("/")
    }
}

/// The rows to measure, f32 first in each family (it is the baseline of the ratios), each
/// once per KV cache type and activations setting asked for.
pub fn cases(o: &Options, models_dir: &Path) -> Vec<Case> {
    let each = |v: &[&'static str]| -> Vec<Option<&'static str>> {
        if v.is_empty() { vec![None] } else { v.iter().copied().map(Some).collect() }
    };
    let (kvs, acts) = (each(&o.kv_cache), each(&o.activations));
    let mut out = Vec::new();
    for case in model_cases(o, models_dir) {
        for &kv_cache in &kvs {
            out.extend(acts.iter().map(|&activations| Case { kv_cache, activations, ..case.clone() }));
        }
    }
    out
}

/// A comma list of `allowed` values (`what` names them in the error, `expected` lists them).
fn one_of(list: &str, allowed: &[&'static str], what: &str, expected: &str) -> Result<Vec<&'static str>> {
    list.split(',')
        .map(|t| match allowed.iter().find(|x| **x == t) {
            Some(x) => Ok(*x),
            None => bail!("bench: unknown {what} `{t}` (expected {expected})"),
        })
        .collect()
}

/// [`cases`] before the KV cache types.
fn model_cases(o: &Options, models_dir: &Path) -> Vec<Case> {
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
                    kv_cache: None,
                    activations: None,
                }),
                // Float precisions read the f16 folder; packed keeps MLX's quantized words,
                // so it runs on the quantized folders.
                ModelArg::Llama1b | ModelArg::Qwen3Moe1b | ModelArg::Qwen35 | ModelArg::GptOss2l => {
                    let Some((_, name)) = m.random_shape() else { continue };
                    let variants: &[&str] = if precision == "packed" { &o.formats } else { &["f16"] };
                    for v in variants {
                        out.push(Case {
                            family: name.into(),
                            model: random_dir(models_dir, name, v),
                            precision,
                            steps,
                            kv_cache: None,
                            activations: None,
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
                    kv_cache: None,
                    activations: None,
                }),
            }
        }
    }
    out
}

fn random_dir(models_dir: &Path, name: &str, variant: &str) -> PathBuf {
    models_dir.join(format!("{name}-{variant}"))
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
    if opts.serve {
        return serve(&bin, &cases, &opts, started);
    }
    if opts.draft {
        return drafts(&bin, &cases, &opts, started);
    }
    // Measured first, so that with --json every row can carry its bound as it is printed.
    let bandwidth = if opts.peers && !opts.batched_peers() {
        note("memory read bandwidth (numpy, one thread per CPU)");
        let b = peers::bandwidth(&peers::venv_dir())?;
        note(format!("memory read bandwidth: {:.1} GB/s", b / 1e9));
        Some(b)
    } else {
        None
    };
    // One case gives a row per (context, batch); `row_cases[i]` is the case of `rows[i]`.
    let (mut row_cases, mut rows) = (Vec::new(), Vec::new());
    // The batched peer runs right after the first of our cases it pairs with, not after all
    // of ours: this machine's speed drifts over minutes, and a ratio wants both sides in
    // the same minutes.
    let batched_peers = if opts.batched_peers() {
        Some((peers::tools_bin()?, peer_models(&opts, &crate::model::models_dir())))
    } else {
        None
    };
    let mut theirs: Vec<BatchLine> = Vec::new();
    let mut peered = FirstSeen::default();
    for (i, case) in cases.iter().enumerate() {
        note(format!(
            "{}/{}: {} at {} on {}",
            i + 1,
            cases.len(),
            display_name(&case.model),
            case.label(),
            opts.device
        ));
        for row in measure(&bin, case, &opts)? {
            if opts.json {
                println!("{}", row.json_line(case, &opts.device, bandwidth));
            }
            row_cases.push(case.clone());
            rows.push(row);
        }
        if let Some((tools, models)) = &batched_peers
            && let Some(t) = llama_cpp_pair(case)
            && let Some(m) = models.iter().find(|m| m.family == case.family)
            && peered.first(&m.family, t)
        {
            theirs.extend(measure_batched_peer(&opts, tools, m, t)?);
        }
    }
    let cases = row_cases;
    let mut failed: Vec<String> = cases
        .iter()
        .zip(&rows)
        .filter_map(|(c, r)| match r {
            Row::Failed(e) => Some(format!("{} {}: {e}", display_name(&c.model), c.label())),
            Row::Ok(..) => None,
        })
        .collect();
    match bandwidth {
        None if opts.batched_peers() => {
            let mut lines: Vec<BatchLine> = cases.iter().zip(&rows).map(|(c, r)| BatchLine::ours(c, r)).collect();
            failed.extend(theirs.iter().filter_map(|l| l.result.as_ref().err().map(|e| format!("{}: {e}", l.source))));
            lines.extend(theirs);
            if !opts.json {
                print!("{}", batched_table(&order_batch_lines(lines), &opts.contexts()));
            }
        }
        Some(bandwidth) => {
            let mut lines: Vec<Line> = cases.iter().zip(&rows).map(|(c, r)| Line::ours(c, r)).collect();
            let theirs = measure_peers(&opts, bandwidth)?;
            failed.extend(theirs.iter().filter_map(|l| l.result.as_ref().err().map(|e| format!("{}: {e}", l.source))));
            lines.extend(theirs);
            if !opts.json {
                print!("{}", peers_table(&order_by_family(lines), bandwidth));
            }
        }
        None if !opts.json => print!("{}", table(&cases, &rows)),
        None => {}
    }
    note(format!("{} rows in {:.0} s", rows.len(), started.elapsed().as_secs_f64()));
    if !failed.is_empty() {
        bail!("{} benchmark(s) failed:\n  {}", failed.len(), failed.join("\n  "));
    }
    Ok(())
}

/// `--serve`: every case's server under load and, with --peers, llama-server on the same
/// weights; one table (or JSON lines).
fn serve(bin: &Path, cases: &[Case], opts: &Options, started: Instant) -> Result<()> {
    let mut rows = Vec::new();
    let mut peered = FirstSeen::default();
    for (i, case) in cases.iter().enumerate() {
        note(format!("{}/{}: serving {} at {}", i + 1, cases.len(), display_name(&case.model), case.precision));
        let mut measured = crate::serve_bench::measure(bin, case, opts)?;
        if opts.peers
            && let Some(t) = llama_cpp_pair(case)
            && peered.first(&case.family, t)
        {
            measured.extend(crate::serve_bench::measure_llama_server(case, t, opts));
        }
        for row in measured {
            if opts.json {
                println!("{}", crate::serve_bench::json_line(&row, &opts.device));
            }
            rows.push(row);
        }
    }
    if !opts.json {
        print!("{}", crate::serve_bench::table(&rows));
    }
    let failed = rows.iter().filter_map(|r| {
        r.load.as_ref().err().map(|e| format!("{} {} {} streams: {e}", r.source.engine, r.source.name, r.streams))
    });
    finish(rows.len(), failed, started)
}

/// The closing progress line of a `--serve` or `--draft` run, and its error naming each
/// failed row, if any.
fn finish(rows: usize, failed: impl Iterator<Item = String>, started: Instant) -> Result<()> {
    let failed: Vec<String> = failed.collect();
    note(format!("{rows} rows in {:.0} s", started.elapsed().as_secs_f64()));
    if !failed.is_empty() {
        bail!("{} row(s) failed:\n  {}", failed.len(), failed.join("\n  "));
    }
    Ok(())
}

/// `--draft`: every case without and with drafts; one table (or JSON lines).
fn drafts(bin: &Path, cases: &[Case], opts: &Options, started: Instant) -> Result<()> {
    let (mut rows, mut served) = (Vec::new(), Vec::new());
    for (i, case) in cases.iter().enumerate() {
        let case = Case { steps: opts.steps.unwrap_or(crate::draft_bench::DEFAULT_STEPS), ..case.clone() };
        note(format!("{}/{}: drafts on {} at {}", i + 1, cases.len(), display_name(&case.model), case.precision));
        if opts.streams_given {
            for row in crate::draft_bench::measure_streams(bin, &case, opts)? {
                if opts.json {
                    println!("{}", crate::draft_bench::streams_json_line(&row, &opts.device));
                }
                served.push(row);
            }
            continue;
        }
        let row = crate::draft_bench::measure(bin, &case, opts)?;
        if opts.json {
            println!("{}", crate::draft_bench::json_line(&row, &opts.device));
        }
        rows.push(row);
    }
    if opts.streams_given {
        if !opts.json {
            print!("{}", crate::draft_bench::streams_table(&served));
        }
        let failed = served.iter().filter_map(|r| {
            let what = format!("{} {} {} streams", display_name(&r.case.model), r.case.precision, r.streams);
            r.result.as_ref().err().map(|e| format!("{what}: {e}"))
        });
        return finish(served.len(), failed, started);
    }
    if !opts.json {
        print!("{}", crate::draft_bench::table(&rows));
    }
    let failed = rows.iter().filter_map(|r| {
        r.result.as_ref().err().map(|e| format!("{} {}: {e}", display_name(&r.case.model), r.case.precision))
    });
    finish(rows.len(), failed, started)
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
    // The random shapes borrow SmolLM2's tokenizer (random_models), so they need SmolLM2 too.
    if o.models.iter().any(|m| *m == ModelArg::SmolLm2 || m.random_shape().is_some()) {
        crate::model::run(&[])?;
    }
    for (shape, name) in o.models.iter().filter_map(ModelArg::random_shape) {
        let packed = o.precisions.contains(&"packed");
        // The peers convert the f16 folder.
        let floats = o.peers || o.precisions.iter().any(|p| *p != "packed");
        let variants: Vec<&str> =
            floats.then_some("f16").into_iter().chain(o.formats.iter().copied().filter(|_| packed)).collect();
        random_models(shape, name, &variants)?;
    }
    // The load generators' pinned openai client: `--serve`'s, and `--draft --streams`'.
    if o.serve || (o.draft && o.streams_given) {
        crate::test::client_venv()?;
    }
    if o.peers {
        let venv = peers::venv()?;
        for m in peer_models(o, &crate::model::models_dir()) {
            peers::ggufs(&venv, &m.family, &m.src, m.vocab.as_deref())?;
        }
        peers::tools()?;
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

/// target/models/<name>-<variant> for each variant (`llama-1b-random-4bit`), made by
/// mlx-lm unless its stamp says the same script and packages already made it.
fn random_models(shape: &str, name: &str, variants: &[&str]) -> Result<()> {
    let pins = Pins::load()?;
    let venv = fixtures::mlx_venv(&pins, "bench 1/2")?;
    let base = format!(
        "packages: {}\nmake_random_llama.py: {}\n",
        pins.oracle.python_packages.join(" "),
        script_digest("make_random_llama.py")?
    );
    for v in variants {
        let dest = random_dir(&crate::model::models_dir(), name, v);
        let stamp = format!("{base}shape: {shape}\nvariant: {v}\n");
        crate::model::step("bench 2/2", &dest, &stamp, |partial| {
            util::progress(
                "bench 2/2",
                "random weights with mlx-lm: about a minute a folder for the 1B shapes; gpt-oss-2l 5 (f16) to 20 (mxfp4)",
            );
            util::run(
                fixtures::python(&venv, "make_random_llama.py")
                    .args(["--shape", shape, "--variant", v, "--out"])
                    .arg(partial),
            )
        })?;
        borrow_tokenizer(&crate::model::models_dir().join(SMOLLM2), &dest)?;
    }
    Ok(())
}

/// SmolLM2's tokenizer files, which the random 1B shape takes so that it can be served
/// (`--serve` sends text): its 49,152 ids are all below the 1B shape's 128,256 rows, the
/// server samples only ids the tokenizer has, and the peers' GGUFs carry the same tokenizer
/// padded with unused tokens (peers.py). Copied when missing or different.
fn borrow_tokenizer(smollm2: &Path, dest: &Path) -> Result<()> {
    for name in ["tokenizer.json", "tokenizer_config.json", "chat_template.jinja"] {
        let (from, to) = (smollm2.join(name), dest.join(name));
        let bytes = std::fs::read(&from).with_context(|| format!("reading {}", from.display()))?;
        if std::fs::read(&to).ok().as_deref() != Some(&bytes[..]) {
            std::fs::write(&to, &bytes).with_context(|| format!("writing {}", to.display()))?;
        }
    }
    Ok(())
}

fn display_name(dir: &Path) -> String {
    dir.file_name().map_or_else(|| dir.display().to_string(), |n| n.to_string_lossy().into_owned())
}

/// What `mlx-iree bench --json` prints (the fields the table shows).
#[derive(Debug, Clone, PartialEq, Deserialize)]
pub struct Measured {
    /// Sequences decoded together; `decode_tok_s` is their aggregate.
    pub batch: usize,
    /// Tokens of context before the decode steps.
    pub context: usize,
    pub max_context: usize,
    pub prefill_tok_s: f64,
    pub decode_tok_s: f64,
    pub ttft_ms: f64,
    /// The first token of a 16-token next turn after the context (the prefix cache's case).
    #[serde(default)]
    pub next_turn_ms: Option<f64>,
    pub weight_bytes: u64,
    pub kv_bytes: u64,
    pub peak_rss_bytes: u64,
    pub dispatches_per_decode_step: u64,
    pub compile_cold_s: f64,
    /// null when the engine did not hit the cache the cold compile filled.
    pub compile_cached_s: Option<f64>,
    /// Share of the machine's CPU other work took during the row (null: not measured).
    #[serde(default)]
    pub foreign_cpu_share: Option<f64>,
}

#[derive(Debug, Clone, PartialEq)]
pub enum Row {
    /// The JSON line as printed, and its parsed fields.
    Ok(String, Measured),
    Failed(String),
}

impl Row {
    /// The row as printed with --json: mlx-iree's own line with `engine` in front and,
    /// when the bandwidth was measured (--peers), the bound fields at the end.
    fn json_line(&self, case: &Case, device: &str, bandwidth: Option<f64>) -> String {
        match self {
            Row::Ok(line, m) => tagged_json(line, ENGINE, bandwidth.map(|b| (b, m.weight_bytes))),
            Row::Failed(error) => serde_json::json!({
                "engine": ENGINE,
                "model": case.model.display().to_string(),
                "device": device,
                "precision": case.precision,
                "kv_cache": case.kv_cache,
                "activations": case.activations,
                "error": error,
            })
            .to_string(),
        }
    }
}

const ENGINE: &str = "mlx-iree";

/// One JSON object `line` with `"engine"` as its first field (unless it has one) and, given
/// `(bandwidth, weight_bytes)`, `bandwidth_bytes_s` and `bound_decode_tok_s` (bandwidth /
/// weight bytes) as its last. Text-level, so the other fields keep their order.
pub fn tagged_json(line: &str, engine: &str, bound: Option<(f64, u64)>) -> String {
    let line = line.trim();
    let Some(body) = line.strip_prefix('{').and_then(|b| b.strip_suffix('}')) else {
        return line.to_owned();
    };
    let body = body.trim();
    let mut fields = Vec::new();
    if !body.starts_with("\"engine\"") {
        fields.push(format!("\"engine\":{}", serde_json::Value::from(engine)));
    }
    if !body.is_empty() {
        fields.push(body.to_owned());
    }
    if let Some((bandwidth, weight_bytes)) = bound {
        fields.push(format!("\"bandwidth_bytes_s\":{}", serde_json::Value::from(bandwidth.round())));
        let tok_s = bandwidth / weight_bytes.max(1) as f64;
        fields.push(format!("\"bound_decode_tok_s\":{}", serde_json::Value::from(tok_s)));
    }
    format!("{{{}}}", fields.join(","))
}

/// Runs `mlx-iree bench --json` for one case: one row per (context, batch). Its stderr
/// streams through (compile progress); a failure becomes one row holding its one-line error.
fn measure(bin: &Path, case: &Case, o: &Options) -> Result<Vec<Row>> {
    let mut cmd = bench_command(bin, case, o);
    let shown = util::show(&cmd);
    match run_child(&mut cmd)? {
        Ok(stdout) => {
            let rows = parse_rows(&stdout).with_context(|| format!("`{shown}` printed {stdout:?}"))?;
            // A row missing would silently drop a (context, batch) from the table.
            let want = o.batch.len() * o.context.len().max(1);
            if rows.len() != want {
                bail!("`{shown}` printed {} JSON lines, expected {want}: {stdout:?}", rows.len());
            }
            Ok(rows)
        }
        Err(msg) => Ok(vec![Row::Failed(msg)]),
    }
}

/// The `mlx-iree bench --json` command line of one case; flags left at their default are
/// left to mlx-iree's default.
fn bench_command(bin: &Path, case: &Case, o: &Options) -> Command {
    let join = |ns: &[usize]| ns.iter().map(usize::to_string).collect::<Vec<_>>().join(",");
    let mut cmd = Command::new(bin);
    cmd.arg("bench")
        .arg("--model")
        .arg(&case.model)
        .args(["--precision", case.precision, "--device", &o.device, "--json"])
        .args(["--prompt-len", &o.prompt_len.to_string()])
        .args(["--steps", &case.steps.to_string()])
        .args(["--repeats", &o.repeats.to_string()])
        .args(["--batch", &join(&o.batch)]);
    if !o.context.is_empty() {
        cmd.args(["--context", &join(&o.context)]);
    }
    if let Some(n) = o.max_context {
        cmd.args(["--max-context", &n.to_string()]);
    }
    if let Some(t) = case.kv_cache {
        cmd.args(["--kv-cache", t]);
    }
    if let Some(a) = case.activations {
        cmd.args(["--activations", a]);
    }
    cmd
}

/// [`run_child`], and the share of the machine's CPU time other work took while it ran
/// (`cpu_share`: the child's own time, reaped with it, is ours).
fn run_child_measured(cmd: &mut Command) -> Result<(std::result::Result<String, String>, Option<f64>)> {
    let window = cpu_share::Window::start(&[]);
    let out = run_child(cmd)?;
    Ok((out, window.and_then(|w| w.foreign_share())))
}

/// The "other CPU" column of the tables: the share of the machine's CPU time that other
/// work took while the row ran, `!` when that makes it a row measured under load.
pub fn other_cpu(share: Option<f64>) -> String {
    match share {
        None => "-".to_owned(),
        Some(s) if s >= cpu_share::LOADED => format!("{:.0}%!", s * 100.0),
        Some(s) => format!("{:.0}%", s * 100.0),
    }
}

/// The legend of the "other CPU" column.
pub const OTHER_CPU_NOTE: &str = "other CPU = share of the machine's CPU time that other processes (and, on a \
     virtual machine, its host's other guests: steal) took while the row ran; ! = 5% or more: measured under load, \
     not a number to publish";

/// Runs a measuring command with its stderr streamed through, indented. Returns its
/// stdout, or when it failed, the reason in its last stderr line. The command dies with
/// xtask.
fn run_child(cmd: &mut Command) -> Result<std::result::Result<String, String>> {
    util::dies_with_parent(cmd).stdout(Stdio::piped()).stderr(Stdio::piped());
    let shown = util::show(cmd);
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
        return Ok(Err(if msg.is_empty() { format!("exited with {status}") } else { msg }));
    }
    Ok(Ok(stdout))
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

/// Every JSON line of `mlx-iree bench --json` (one per (context, batch)) as a row, in order.
pub fn parse_rows(stdout: &str) -> Result<Vec<Row>> {
    let rows = stdout
        .lines()
        .map(str::trim)
        .filter(|l| l.starts_with('{'))
        .map(|line| {
            let measured: Measured = serde_json::from_str(line).with_context(|| format!("bad JSON line: {line}"))?;
            Ok(Row::Ok(line.to_owned(), measured))
        })
        .collect::<Result<Vec<_>>>()?;
    if rows.is_empty() {
        bail!("no JSON line");
    }
    Ok(rows)
}

/// The human table: one line per row, decode speed also as a ratio against the f32 row
/// (and the f16 row, when one succeeded) of the same family, batch and context (a
/// different batch or context is different work).
pub fn table(cases: &[Case], rows: &[Row]) -> String {
    // The measurement of the first case `matches` takes, at `of`'s batch and context (a
    // different batch or context is different work).
    let row = |of: &Measured, matches: &dyn Fn(&Case) -> bool| {
        cases.iter().zip(rows).find_map(|(b, r)| match r {
            Row::Ok(_, m) if matches(b) && (m.batch, m.context) == (of.batch, of.context) => Some(m),
            _ => None,
        })
    };
    // The decode speed of `c`'s family at `precision` with the KV cache `kv` and `c`'s
    // activations.
    let row_like = |c: &Case, precision: &str, kv: Option<&str>, of: &Measured| {
        let like = |b: &Case| {
            b.family == c.family && b.precision == precision && b.kv_cache == kv && b.activations == c.activations
        };
        row(of, &like).map(|m| m.decode_tok_s)
    };
    let f16_base = |c: &Case, m: &Measured| row_like(c, "f16", c.kv_cache, m);
    // The same precision with the f32 cache, where KV cache types were asked for.
    let kv_base = |c: &Case, m: &Measured| match c.kv_cache {
        Some(_) => row_like(c, c.precision, Some("f32"), m),
        None => None,
    };
    // Prefill against the same case (the same folder) with i16 activations, where
    // activations were asked for.
    let i16_prefill = |c: &Case, of: &Measured| match c.activations {
        Some(_) => {
            let twin = |b: &Case| {
                b.model == c.model
                    && b.precision == c.precision
                    && b.kv_cache == c.kv_cache
                    && b.activations == Some("i16")
            };
            row(of, &twin).map(|m| m.prefill_tok_s)
        }
        None => None,
    };
    let any = |base: &dyn Fn(&Case, &Measured) -> Option<f64>| {
        cases.iter().zip(rows).any(|(c, r)| match r {
            Row::Ok(_, m) => base(c, m).is_some(),
            Row::Failed(_) => false,
        })
    };
    let (any_f16, any_kv, any_act) = (any(&f16_base), any(&kv_base), any(&i16_prefill));
    // An optional column of `width`, when `on`.
    let optional = |on: bool, width: usize, text: String| if on { format!("  {text:>width$}") } else { String::new() };
    let mib = |b: u64| format!("{:.0}", b as f64 / (1024.0 * 1024.0));
    let ratio = |x: f64, base: Option<f64>| base.map_or_else(|| "-".to_owned(), |b| format!("{:.2}x", x / b));
    let width = cases.iter().map(|c| display_name(&c.model).len()).max().unwrap_or(5).max(5);
    let pw = cases.iter().map(|c| c.label().len()).max().unwrap_or(9).max(9);
    let mut out = format!(
        "{:<width$}  {:<pw$}  {:>5}  {:>7}  {:>5}  {:>9}  {:>9}  {:>7}{}{}{}  {:>9}  {:>8}  {:>7}  {:>8}  {:>13}  {:>10}  {:>9}\n",
        "model",
        "precision",
        "batch",
        "context",
        "steps",
        "prefill/s",
        "decode/s",
        "vs f32",
        if any_f16 { format!("  {:>7}", "vs f16") } else { String::new() },
        optional(any_kv, 9, "vs f32 KV".into()),
        optional(any_act, 14, "prefill vs i16".into()),
        "ttft ms",
        "wts MiB",
        "KV MiB",
        "RSS MiB",
        "compile s",
        "disp/step",
        "other CPU",
    );
    for (c, r) in cases.iter().zip(rows) {
        let name = display_name(&c.model);
        match r {
            Row::Ok(_, m) => {
                out += &format!(
                    "{name:<width$}  {:<pw$}  {:>5}  {:>7}  {:>5}  {:>9.1}  {:>9.2}  {:>7}{}{}{}  {:>9.1}  {:>8}  {:>7}  \
                     {:>8}  {:>13}  {:>10}  {:>9}\n",
                    c.label(),
                    m.batch,
                    m.context,
                    c.steps,
                    m.prefill_tok_s,
                    m.decode_tok_s,
                    ratio(m.decode_tok_s, row_like(c, "f32", c.kv_cache, m)),
                    if any_f16 { format!("  {:>7}", ratio(m.decode_tok_s, f16_base(c, m))) } else { String::new() },
                    optional(any_kv, 9, ratio(m.decode_tok_s, kv_base(c, m))),
                    optional(any_act, 14, ratio(m.prefill_tok_s, i16_prefill(c, m))),
                    m.ttft_ms,
                    mib(m.weight_bytes),
                    mib(m.kv_bytes),
                    mib(m.peak_rss_bytes),
                    format!(
                        "{:.1}/{}",
                        m.compile_cold_s,
                        m.compile_cached_s.map_or_else(|| "?".into(), |s| format!("{s:.2}"))
                    ),
                    m.dispatches_per_decode_step,
                    other_cpu(m.foreign_cpu_share),
                );
            }
            Row::Failed(e) => out += &format!("{name:<width$}  {:<pw$}  error: {e}\n", c.label()),
        }
    }
    // The next turn after each row's context (the prefix cache's case), against the
    // context's own time to first token.
    for (c, r) in cases.iter().zip(rows) {
        if let Row::Ok(_, m) = r
            && let Some(next) = m.next_turn_ms
        {
            out += &format!(
                "{} {} batch {} context {}: next turn (16 tokens) first token {next:.1} ms, {:.3}x the context's {:.1} ms\n",
                display_name(&c.model),
                c.precision,
                m.batch,
                m.context,
                next / m.ttft_ms,
                m.ttft_ms
            );
        }
    }
    out + OTHER_CPU_NOTE + "\n"
}

/// A model the peers run: its family (the name rows are grouped by), the float folder
/// llama.cpp's GGUFs are converted from, whether mlx-lm gets a row, and the GGUF whose
/// tokenizer the converted files carry (SmolLM2's original, so that llama-server can
/// tokenize the text prompts of `--serve`, for SmolLM2 and the 1B shape; a folder given
/// gets none, `peers.py`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PeerModel {
    pub family: String,
    pub src: PathBuf,
    pub steps: usize,
    pub mlx_lm: bool,
    pub vocab: Option<PathBuf>,
}

/// One per model argument: SmolLM2's f16 folder (with an mlx-lm f32 row), the 1B model's
/// f16 folder, or the folder given (which must hold float weights).
pub fn peer_models(o: &Options, models_dir: &Path) -> Vec<PeerModel> {
    let mut out: Vec<PeerModel> = Vec::new();
    for m in &o.models {
        let steps = o.steps.unwrap_or_else(|| default_steps(m));
        let (family, src, mlx_lm, vocab) = match m {
            ModelArg::SmolLm2 => {
                let family = SMOLLM2.trim_end_matches("-4bit");
                let vocab = crate::model::source_gguf(models_dir);
                (family.to_owned(), models_dir.join(format!("{family}-f16")), true, vocab)
            }
            ModelArg::Llama1b => {
                let vocab = crate::model::source_gguf(models_dir);
                (LLAMA_1B.to_owned(), random_dir(models_dir, LLAMA_1B, "f16"), false, vocab)
            }
            // peers.py converts llama-architecture folders only: the MoE, Qwen3.5 and gpt-oss shapes
            // have no peer row.
            ModelArg::Qwen3Moe1b | ModelArg::Qwen35 | ModelArg::GptOss2l => continue,
            ModelArg::Dir(dir) => (display_name(dir), dir.clone(), false, None),
        };
        if !out.iter().any(|p| p.family == family) {
            out.push(PeerModel { family, src, steps, mlx_lm, vocab });
        }
    }
    out
}

/// llama.cpp at f16, Q8_0 and Q4_0 (our harness, then llama-bench) and (SmolLM2) mlx-lm
/// at f32, one process each; with --json each row is printed as it is measured.
fn measure_peers(o: &Options, bandwidth: f64) -> Result<Vec<Line>> {
    let models = peer_models(o, &crate::model::models_dir());
    let total: usize = models.iter().map(|m| 2 * peers::LLAMA_CPP_TYPES.len() + usize::from(m.mlx_lm)).sum();
    let venv = peers::venv_dir();
    let tools = peers::tools_bin()?;
    let mut lines = Vec::new();
    for m in &models {
        let ids = peers::prompt_ids(o.prompt_len, peers::vocab_size(&m.src)?);
        let mut runs: Vec<(&'static str, &'static str, String, usize, Command)> = peers::LLAMA_CPP_TYPES
            .iter()
            .map(|t| {
                let gguf = peers::gguf_path(&m.family, t);
                let cmd = peers::llama_cpp_command(&venv, &gguf, t, &ids, m.steps, o.repeats);
                (LLAMA_CPP, *t, gguf.display().to_string(), m.steps, cmd)
            })
            .collect();
        if m.mlx_lm {
            let cmd = peers::mlx_lm_command(&util::target_dir().join("mlx-venv"), &m.src, &ids, m.steps);
            runs.push(("mlx-lm", "f32", m.src.display().to_string(), m.steps.min(peers::MLX_LM_MAX_STEPS), cmd));
        }
        for (engine, precision, model, steps, mut cmd) in runs {
            note(format!("peers {}/{total}: {engine} {precision} on {}", lines.len() + 1, m.family));
            let (out, foreign) = run_child_measured(&mut cmd)?;
            let result = match out {
                Ok(stdout) => parse_peer(&stdout).map(|(json, speed)| {
                    (with_foreign_share(&json, foreign), Speed { foreign_cpu_share: foreign, ..speed })
                }),
                Err(e) => Err(e),
            };
            if o.json {
                let line = match &result {
                    Ok((json, speed)) => tagged_json(json, engine, Some((bandwidth, speed.weight_bytes))),
                    Err(e) => serde_json::json!({
                        "engine": engine, "model": model, "device": "cpu", "precision": precision, "error": e,
                    })
                    .to_string(),
                };
                println!("{line}");
            }
            lines.push(Line {
                source: Source::peer(engine, &m.family, precision),
                steps,
                dispatches: None,
                result: result.map(|(_, speed)| speed),
            });
        }
        // llama.cpp's own benchmark on the same files, as the check of the harness above.
        for t in peers::LLAMA_CPP_TYPES {
            let gguf = peers::gguf_path(&m.family, t);
            note(format!("peers {}/{total}: llama-bench {t} on {}", lines.len() + 1, m.family));
            let mut cmd = peers::llama_bench_command(&tools, &gguf, o.prompt_len, m.steps, o.repeats);
            let (out, foreign) = run_child_measured(&mut cmd)?;
            let result = match out {
                Ok(stdout) => peers::parse_llama_bench(&stdout).map_err(|e| format!("{e:#}")),
                Err(e) => Err(e),
            };
            if o.json {
                let line = match &result {
                    Ok(b) => tagged_json(
                        &with_foreign_share(&llama_bench_json(&gguf, t, o.repeats, b), foreign),
                        LLAMA_BENCH,
                        Some((bandwidth, b.decode.model_size)),
                    ),
                    Err(e) => serde_json::json!({
                        "engine": LLAMA_BENCH, "model": gguf.display().to_string(), "device": "cpu", "precision": t,
                        "error": e,
                    })
                    .to_string(),
                };
                println!("{line}");
            }
            lines.push(Line {
                source: Source::peer(LLAMA_BENCH, &m.family, t),
                steps: m.steps,
                dispatches: None,
                result: result.map(|b| Speed {
                    prefill_tok_s: b.prefill.avg_ts,
                    decode_tok_s: b.decode.avg_ts,
                    ttft_ms: None,
                    weight_bytes: b.decode.model_size,
                    peak_rss_bytes: None,
                    foreign_cpu_share: foreign,
                }),
            });
        }
    }
    Ok(lines)
}

/// The engine name of llama-bench's rows.
const LLAMA_BENCH: &str = "llama-bench";
/// The engine name of the llama-cpp-python harness's rows (peers.py).
const LLAMA_CPP: &str = "llama.cpp";

/// A llama-bench row as one JSON object (the fields of our rows where they mean the same).
pub fn llama_bench_json(gguf: &Path, precision: &str, repeats: usize, b: &peers::LlamaBench) -> String {
    serde_json::json!({
        "engine": LLAMA_BENCH,
        "model": gguf.display().to_string(),
        "device": "cpu",
        "precision": precision,
        "prefill_tok_s": b.prefill.avg_ts,
        "prefill_stddev_tok_s": b.prefill.stddev_ts,
        "decode_tok_s": b.decode.avg_ts,
        "decode_stddev_tok_s": b.decode.stddev_ts,
        "weight_bytes": b.decode.model_size,
        "prompt_len": b.prefill.n_prompt,
        "decode_steps": b.decode.n_gen,
        "decode_context": b.decode.n_depth,
        "repeats": repeats,
        "threads": b.decode.n_threads,
    })
    .to_string()
}

/// A peer script's JSON line and its speed fields.
pub fn parse_peer(stdout: &str) -> std::result::Result<(String, Speed), String> {
    let line = stdout.lines().rfind(|l| l.trim_start().starts_with('{')).ok_or("printed no JSON line")?.trim();
    let speed = serde_json::from_str(line).map_err(|e| format!("bad JSON line ({e}): {line}"))?;
    Ok((line.to_owned(), speed))
}

/// The fields the --peers table shows (llama-bench reports no time to first token and
/// no peak RSS).
#[derive(Debug, Clone, PartialEq, Deserialize)]
pub struct Speed {
    pub prefill_tok_s: f64,
    pub decode_tok_s: f64,
    pub ttft_ms: Option<f64>,
    pub weight_bytes: u64,
    pub peak_rss_bytes: Option<u64>,
    /// Share of the machine's CPU other work took during the row (xtask measures the peers').
    #[serde(default)]
    pub foreign_cpu_share: Option<f64>,
}

/// A JSON object line with `foreign_cpu_share` set (a peer's line, measured by xtask).
pub fn with_foreign_share(line: &str, share: Option<f64>) -> String {
    match serde_json::from_str::<serde_json::Map<String, serde_json::Value>>(line) {
        Ok(mut v) => {
            v.insert("foreign_cpu_share".into(), share.into());
            serde_json::Value::Object(v).to_string()
        }
        Err(_) => line.to_owned(),
    }
}

/// What a row of the --peers, batched --peers or --serve table measured: which engine,
/// on which model and weights; the tables pair rows through it.
#[derive(Debug, Clone, PartialEq)]
pub struct Source {
    /// The engine's name in the table and the JSON lines (`mlx-iree`, `llama.cpp`, ...).
    pub engine: &'static str,
    /// The model the rows are compared within, whatever checkpoint variant.
    pub family: String,
    /// The model column: our model folder's name, a peer's family.
    pub name: String,
    /// Ours: the precision; a peer's: its weight type (f16, q4_0, ...).
    pub precision: String,
    /// The weight format this row is compared in: a peer row's own precision; for our
    /// rows `pair_key` (f16, q4_0 or q8_0 for packed, f32), None when nothing compares.
    pub pair: Option<&'static str>,
}

impl Source {
    /// One of our rows, on `case`'s model folder at its precision.
    pub fn ours(case: &Case) -> Source {
        Source {
            engine: ENGINE,
            family: case.family.clone(),
            name: display_name(&case.model),
            precision: case.precision.to_owned(),
            pair: pair_key(case),
        }
    }

    /// A peer's row on `family`'s weights as `kind` (a GGUF type, or mlx-lm's f32): the
    /// model column shows the family, and the row pairs with ours of that weight format.
    pub fn peer(engine: &'static str, family: &str, kind: &'static str) -> Source {
        Source {
            engine,
            family: family.to_owned(),
            name: family.to_owned(),
            precision: kind.to_owned(),
            pair: Some(kind),
        }
    }
}

/// How a failed row is named: engine, model and precision.
impl std::fmt::Display for Source {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} {} {}", self.engine, self.name, self.precision)
    }
}

/// One row of the --peers table.
#[derive(Debug, Clone, PartialEq)]
pub struct Line {
    pub source: Source,
    pub steps: usize,
    pub dispatches: Option<u64>,
    pub result: std::result::Result<Speed, String>,
}

impl Line {
    fn ours(case: &Case, row: &Row) -> Line {
        let (result, dispatches) = match row {
            Row::Ok(_, m) => (
                Ok(Speed {
                    prefill_tok_s: m.prefill_tok_s,
                    decode_tok_s: m.decode_tok_s,
                    ttft_ms: Some(m.ttft_ms),
                    weight_bytes: m.weight_bytes,
                    peak_rss_bytes: Some(m.peak_rss_bytes),
                    foreign_cpu_share: m.foreign_cpu_share,
                }),
                Some(m.dispatches_per_decode_step),
            ),
            Row::Failed(e) => (Err(e.clone()), None),
        };
        Line { source: Source::ours(case), steps: case.steps, dispatches, result }
    }
}

/// (family, llama.cpp weight type) pairs a peer has run for: each llama.cpp tool runs once
/// per pair, right after the first of our cases it compares with.
#[derive(Default)]
struct FirstSeen(Vec<(String, &'static str)>);

impl FirstSeen {
    /// Whether `(family, t)` is new (and remember it).
    fn first(&mut self, family: &str, t: &'static str) -> bool {
        let new = !self.0.iter().any(|(f, seen)| f == family && *seen == t);
        if new {
            self.0.push((family.to_owned(), t));
        }
        new
    }
}

/// The llama.cpp weight type (f16, q4_0, q8_0) `case` compares with, None where llama.cpp
/// has none (f32, bf16).
pub fn llama_cpp_pair(case: &Case) -> Option<&'static str> {
    pair_key(case).filter(|t| peers::LLAMA_CPP_TYPES.contains(t))
}

/// Which peer row one of our rows is compared with: f16 with llama.cpp f16, packed on a
/// `-4bit` / `-8bit` folder with Q4_0 / Q8_0, f32 with mlx-lm's f32; bf16 with nothing.
pub fn pair_key(case: &Case) -> Option<&'static str> {
    let name = display_name(&case.model);
    match case.precision {
        "f16" => Some("f16"),
        "f32" => Some("f32"),
        "packed" if name.ends_with("-4bit") => Some("q4_0"),
        "packed" if name.ends_with("-8bit") => Some("q8_0"),
        _ => None,
    }
}

/// Rows grouped by family in order of first appearance, each family's rows in the order
/// given (ours, then the peers).
pub fn order_by_family(lines: Vec<Line>) -> Vec<Line> {
    grouped_by_family(lines, |l| &l.source.family, |_| false)
}

/// `lines` sorted (stably) by the first appearance of their family, then by `after`.
fn grouped_by_family<T>(lines: Vec<T>, family: impl Fn(&T) -> &String, after: impl Fn(&T) -> bool) -> Vec<T> {
    let mut families: Vec<String> = Vec::new();
    for l in &lines {
        if !families.contains(family(l)) {
            families.push(family(l).clone());
        }
    }
    let mut out = lines;
    out.sort_by_key(|l| (families.iter().position(|f| f == family(l)), after(l)));
    out
}

/// The --peers table: every engine's rows, decode speed against the bandwidth bound
/// (`bandwidth` / weight bytes: each decode step reads every weight once), and our
/// decode / prefill speed as ratios against the peer row of the same family and weight
/// format.
pub fn peers_table(lines: &[Line], bandwidth: f64) -> String {
    // Our rows are compared with the harness's llama.cpp rows (peers.py), as before
    // llama-bench rows existed; those are the check of the harness.
    let peer = |l: &Line| {
        let key = l.source.pair?;
        lines.iter().find_map(|p| match &p.result {
            Ok(s)
                if ![ENGINE, LLAMA_BENCH].contains(&p.source.engine)
                    && p.source.family == l.source.family
                    && p.source.pair == Some(key) =>
            {
                Some((p, s))
            }
            _ => None,
        })
    };
    let harness = |l: &Line| {
        lines.iter().find_map(|p| match &p.result {
            Ok(s)
                if p.source.engine == LLAMA_CPP
                    && p.source.family == l.source.family
                    && p.source.pair == l.source.pair =>
            {
                Some(s)
            }
            _ => None,
        })
    };
    let mib = |b: u64| format!("{:.0}", b as f64 / (1024.0 * 1024.0));
    let width = lines.iter().map(|l| l.source.name.len()).max().unwrap_or(5).max(5);
    let ew = lines.iter().map(|l| l.source.engine.len()).max().unwrap_or(6).max(6);
    let mut out = format!(
        "{:<ew$}  {:<width$}  {:<9}  {:>5}  {:>9}  {:>9}  {:>8}  {:>8}  {:>9}  {:>8}  {:>8}  {:>9}  {:>9}  {}\n",
        "engine",
        "model",
        "precision",
        "steps",
        "prefill/s",
        "decode/s",
        "bound/s",
        "of bound",
        "ttft ms",
        "wts MiB",
        "RSS MiB",
        "disp/step",
        "other CPU",
        "decode/prefill vs peer",
    );
    for l in lines {
        let head = format!("{:<ew$}  {:<width$}  {:<9}", l.source.engine, l.source.name, l.source.precision);
        match &l.result {
            Ok(s) => {
                let bound = bandwidth / s.weight_bytes.max(1) as f64;
                let vs = match (l.source.engine, peer(l), harness(l)) {
                    (ENGINE, Some((p, ps)), _) => format!(
                        "{:.2}x / {:.2}x {} {}",
                        s.decode_tok_s / ps.decode_tok_s,
                        s.prefill_tok_s / ps.prefill_tok_s,
                        p.source.engine,
                        p.source.precision
                    ),
                    (LLAMA_BENCH, _, Some(hs)) => format!(
                        "harness {:.2}x / {:.2}x",
                        hs.decode_tok_s / s.decode_tok_s,
                        hs.prefill_tok_s / s.prefill_tok_s
                    ),
                    _ => "-".to_owned(),
                };
                out += &format!(
                    "{head}  {:>5}  {:>9.1}  {:>9.2}  {:>8.1}  {:>7.0}%  {:>9}  {:>8}  {:>8}  {:>9}  {:>9}  {vs}\n",
                    l.steps,
                    s.prefill_tok_s,
                    s.decode_tok_s,
                    bound,
                    100.0 * s.decode_tok_s / bound,
                    s.ttft_ms.map_or_else(|| "-".to_owned(), |t| format!("{t:.1}")),
                    mib(s.weight_bytes),
                    s.peak_rss_bytes.map_or_else(|| "-".to_owned(), mib),
                    l.dispatches.map_or_else(|| "-".to_owned(), |d| d.to_string()),
                    other_cpu(s.foreign_cpu_share),
                );
            }
            Err(e) => out += &format!("{head}  error: {e}\n"),
        }
    }
    out += &format!(
        "bound/s = memory read bandwidth {:.1} GB/s (numpy, measured in this run) / weight bytes; of bound = \
         decode/s / bound/s\n{OTHER_CPU_NOTE}\n",
        bandwidth / 1e9
    );
    if lines.iter().any(|l| l.source.engine == LLAMA_BENCH) {
        out += "harness = decode / prefill of the llama.cpp row (our llama-cpp-python harness) over llama-bench's on \
                the same GGUF; llama-bench decodes from an empty context, the harness after the prompt\n";
    }
    out
}

/// One row of the batched --peers table (`--peers` with `--batch` or `--context`).
#[derive(Debug, Clone, PartialEq)]
pub struct BatchLine {
    pub source: Source,
    pub batch: usize,
    pub context: usize,
    pub steps: usize,
    /// Prefill and aggregate decode tok/s.
    pub result: std::result::Result<(f64, f64), String>,
    /// Share of the machine's CPU other work took during the row (llama-batched-bench's:
    /// during its whole run).
    pub foreign_cpu_share: Option<f64>,
}

impl BatchLine {
    fn ours(case: &Case, row: &Row) -> BatchLine {
        let (batch, context, result, foreign_cpu_share) = match row {
            Row::Ok(_, m) => (m.batch, m.context, Ok((m.prefill_tok_s, m.decode_tok_s)), m.foreign_cpu_share),
            Row::Failed(e) => (0, 0, Err(e.clone()), None),
        };
        BatchLine { source: Source::ours(case), batch, context, steps: case.steps, result, foreign_cpu_share }
    }
}

/// llama-batched-bench on model `m` as GGUF type `t`: every (context, batch) in one run.
/// With --json each row is printed as it is measured.
fn measure_batched_peer(o: &Options, tools: &Path, m: &PeerModel, t: &'static str) -> Result<Vec<BatchLine>> {
    let contexts = o.contexts();
    note(format!("peer: llama-batched-bench {t} on {}", m.family));
    let gguf = peers::gguf_path(&m.family, t);
    let mut cmd = peers::batched_bench_command(tools, &gguf, &contexts, m.steps, &o.batch);
    let (out, foreign) = run_child_measured(&mut cmd)?;
    let rows = match out {
        Ok(stdout) => peers::parse_batched_bench(&stdout, &contexts, &o.batch).map_err(|e| format!("{e:#}")),
        Err(e) => Err(e),
    };
    let line = |batch, context, result| BatchLine {
        source: Source::peer(LLAMA_CPP, &m.family, t),
        batch,
        context,
        steps: m.steps,
        result,
        foreign_cpu_share: foreign,
    };
    let mut lines = Vec::new();
    match rows {
        Ok(rows) => {
            for r in rows {
                if o.json {
                    println!("{}", with_foreign_share(&batched_bench_json(&gguf, t, &r), foreign));
                }
                lines.push(line(r.pl, r.pp, Ok((r.speed_pp, r.speed_tg))));
            }
        }
        Err(e) => {
            if o.json {
                let v = serde_json::json!({
                    "engine": LLAMA_CPP, "tool": "llama-batched-bench", "model": gguf.display().to_string(),
                    "device": "cpu", "precision": t, "error": e,
                });
                println!("{v}");
            }
            lines.push(line(0, 0, Err(e)));
        }
    }
    Ok(lines)
}

/// A llama-batched-bench row as one JSON object, with our rows' names for the same fields.
pub fn batched_bench_json(gguf: &Path, precision: &str, r: &peers::BatchedBenchRow) -> String {
    serde_json::json!({
        "engine": LLAMA_CPP,
        "tool": "llama-batched-bench",
        "model": gguf.display().to_string(),
        "device": "cpu",
        "precision": precision,
        "batch": r.pl,
        "context": r.pp,
        "decode_steps": r.tg,
        "prefill_tok_s": r.speed_pp,
        "decode_tok_s": r.speed_tg,
        "prefill_s": r.t_pp,
        "decode_s": r.t_tg,
        "n_kv_max": r.n_kv_max,
        "flash_attn": r.flash_attn,
        "threads": r.n_threads,
    })
    .to_string()
}

/// Rows grouped by family (first appearance), then engine (ours first), keeping the order
/// within each.
pub fn order_batch_lines(lines: Vec<BatchLine>) -> Vec<BatchLine> {
    grouped_by_family(lines, |l| &l.source.family, |l| l.source.engine != ENGINE)
}

/// The batched --peers table: per row the aggregate decode speed, with (when several
/// contexts were measured) its ratio against the same engine, model, precision and batch
/// at the first context, and for our rows the ratio against llama.cpp's row of the same
/// family, weight format, batch and context.
pub fn batched_table(lines: &[BatchLine], contexts: &[usize]) -> String {
    let first = contexts.first().copied().unwrap_or(0);
    let show_ctx = contexts.len() > 1;
    let decode_at = |l: &BatchLine, engine: &str, context: usize| {
        lines.iter().find_map(|p| match p.result {
            Ok((_, d))
                if p.source.engine == engine
                    && p.source.family == l.source.family
                    && p.source.name == l.source.name
                    && p.source.precision == l.source.precision
                    && (p.batch, p.context) == (l.batch, context) =>
            {
                Some(d)
            }
            _ => None,
        })
    };
    let peer = |l: &BatchLine| {
        let key = l.source.pair?;
        lines.iter().find_map(|p| match p.result {
            Ok((_, d))
                if p.source.engine != ENGINE
                    && p.source.family == l.source.family
                    && p.source.pair == Some(key)
                    && (p.batch, p.context) == (l.batch, l.context) =>
            {
                Some((p, d))
            }
            _ => None,
        })
    };
    let width = lines.iter().map(|l| l.source.name.len()).max().unwrap_or(5).max(5);
    let ctx_head = format!("vs ctx {first}");
    let mut out = format!(
        "{:<9}  {:<width$}  {:<9}  {:>5}  {:>7}  {:>5}  {:>9}  {:>9}{}  {:>9}  {}\n",
        "engine",
        "model",
        "precision",
        "batch",
        "context",
        "steps",
        "prefill/s",
        "decode/s",
        if show_ctx { format!("  {ctx_head:>10}") } else { String::new() },
        "other CPU",
        "vs peer",
    );
    for l in lines {
        let head = format!("{:<9}  {:<width$}  {:<9}", l.source.engine, l.source.name, l.source.precision);
        match l.result {
            Ok((prefill, decode)) => {
                let vs_ctx = decode_at(l, l.source.engine, first)
                    .map_or_else(|| "-".to_owned(), |d| format!("{:.2}x", decode / d));
                let vs = match (l.source.engine, peer(l)) {
                    (ENGINE, Some((p, d))) => format!("{:.2}x {} {}", decode / d, p.source.engine, p.source.precision),
                    _ => "-".to_owned(),
                };
                out += &format!(
                    "{head}  {:>5}  {:>7}  {:>5}  {:>9.1}  {:>9.2}{}  {:>9}  {vs}\n",
                    l.batch,
                    l.context,
                    l.steps,
                    prefill,
                    decode,
                    if show_ctx { format!("  {vs_ctx:>10}") } else { String::new() },
                    other_cpu(l.foreign_cpu_share),
                );
            }
            Err(ref e) => out += &format!("{head}  error: {e}\n"),
        }
    }
    out += "decode/s = aggregate over the batch's sequences; llama.cpp = llama-batched-bench, B sequences with \
            distinct ids in one llama_decode per step";
    if show_ctx {
        out += &format!("; {ctx_head} = decode/s over the same row's at context {first}");
    }
    out + "\n" + OTHER_CPU_NOTE + "\n"
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(a: &[&str]) -> Vec<String> {
        a.iter().map(|s| (*s).to_owned()).collect()
    }

    #[test]
    fn each_peer_runs_once_per_family_and_type() {
        let mut seen = FirstSeen::default();
        assert!(seen.first("llama", "q4_0"));
        assert!(!seen.first("llama", "q4_0"));
        assert!(seen.first("llama", "f16"));
        assert!(seen.first("qwen2", "q4_0"));
        assert!(!seen.first("qwen2", "q4_0"));
    }

    #[test]
    fn serve_takes_stream_counts_and_nothing_it_cannot_measure() {
        let o = parse_args(&args(&["--serve", "--model", "smollm2"])).unwrap();
        assert!(o.serve);
        assert_eq!(o.streams, [1, 8, 16]);
        let o = parse_args(&args(&["--serve", "--streams", "2,4"])).unwrap();
        assert_eq!(o.streams, [2, 4]);
        let err = |a: &[&str]| parse_args(&args(a)).unwrap_err().to_string();
        for bad in [&["--serve", "--batch", "4"][..], &["--serve", "--context", "100"]] {
            assert_eq!(err(bad), "bench: `--serve` takes --streams, not --batch or --context", "{bad:?}");
        }
        // llama-server is the peer of --serve; that is not the batched peers' mode.
        let o = parse_args(&args(&["--serve", "--peers"])).unwrap();
        assert!(o.serve && o.peers && !o.batched_peers());
        assert!(err(&["--streams", "0"]).starts_with("bench: `--streams` needs comma-separated whole numbers"));
        // --prompt-len with --serve: long prompts; without --serve, mlx-iree bench's prompt.
        assert_eq!(o.serve_prompt_len, None);
        let o = parse_args(&args(&["--serve", "--prompt-len", "1000", "--streams", "8"])).unwrap();
        assert_eq!((o.serve_prompt_len, o.prompt_len), (Some(1000), 1000));
        let o = parse_args(&args(&["--prompt-len", "1000"])).unwrap();
        assert_eq!((o.serve_prompt_len, o.prompt_len), (None, 1000));
        for bad in [
            &["--serve", "--prompt-len", "9", "--turns", "2"][..],
            &["--serve", "--prompt-len", "9", "--json-streams", "1"],
        ] {
            assert_eq!(
                err(bad),
                "bench: `--prompt-len` with --serve makes its own rows; not with --turns or --json-streams",
                "{bad:?}"
            );
        }
    }

    #[test]
    fn defaults_measure_both_models_at_every_precision() {
        let o = parse_args(&[]).unwrap();
        assert_eq!(o.models, vec![ModelArg::SmolLm2, ModelArg::Llama1b]);
        assert_eq!(o.precisions, vec!["f32", "f16", "bf16", "packed"]);
        assert_eq!((o.device.as_str(), o.json, o.prompt_len, o.steps, o.repeats), ("local-task", false, 128, None, 3));
        assert_eq!(
            (o.batch.as_slice(), o.context.as_slice(), o.max_context, o.kv_cache.clone()),
            (&[1][..], &[][..], None, Vec::<&str>::new())
        );
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
    fn draft_takes_only_what_it_measures() {
        let o =
            parse_args(&args(&["--draft", "--model", "smollm2", "--precision", "packed", "--steps", "64"])).unwrap();
        assert!(o.draft && !o.serve && !o.streams_given, "generate, one sequence");
        let o = parse_args(&args(&["--draft", "--streams", "1,2,4"])).unwrap();
        assert!(o.draft && o.streams_given && o.streams == [1, 2, 4], "through the server");
        let err = |a: &[&str]| parse_args(&args(a)).unwrap_err().to_string();
        for bad in [&["--draft", "--serve"][..], &["--draft", "--batch", "4"], &["--draft", "--peers"]] {
            assert_eq!(
                err(bad),
                "bench: `--draft` takes --model, --precision, --device, --steps, --repeats, --max-context, --streams and --json only",
                "{bad:?}"
            );
        }
    }

    #[test]
    fn packed_on_the_1b_model_uses_the_quantized_folders() {
        let o = parse_args(&args(&["--model", "llama-1b", "--precision", "packed"])).unwrap();
        let dirs: Vec<PathBuf> = cases(&o, Path::new("/m")).into_iter().map(|c| c.model).collect();
        assert_eq!(dirs, vec![PathBuf::from("/m/llama-1b-random-4bit"), PathBuf::from("/m/llama-1b-random-8bit")]);
    }

    #[test]
    fn formats_pick_the_packed_folders() {
        let o =
            parse_args(&args(&["--model", "llama-1b", "--precision", "packed,f16", "--formats", "mxfp4,4bit,3bit"]))
                .unwrap();
        let dirs: Vec<PathBuf> = cases(&o, Path::new("/m")).into_iter().map(|c| c.model).collect();
        let dir = |v: &str| PathBuf::from(format!("/m/llama-1b-random-{v}"));
        assert_eq!(dirs, vec![dir("mxfp4"), dir("4bit"), dir("3bit"), dir("f16")]);
        let err = parse_args(&args(&["--formats", "4bit,5bit"])).unwrap_err().to_string();
        assert_eq!(err, "bench: `--formats` takes 4bit, 8bit, 3bit, 6bit, mxfp4, mxfp8 (got `4bit,5bit`)");
    }

    #[test]
    fn the_moe_shape_has_its_folders_and_no_peers() {
        let o = parse_args(&args(&["--model", "qwen3-moe-1b", "--precision", "packed,f16", "--peers"])).unwrap();
        let rows: Vec<(String, PathBuf)> =
            cases(&o, Path::new("/m")).into_iter().map(|c| (c.family, c.model)).collect();
        let row = |v: &str| ("qwen3-moe-1b-random".to_owned(), PathBuf::from(format!("/m/qwen3-moe-1b-random-{v}")));
        assert_eq!(rows, vec![row("4bit"), row("8bit"), row("f16")]);
        assert!(peer_models(&o, Path::new("/m")).is_empty());
    }

    #[test]
    fn the_qwen3_5_shape_has_its_folders_and_no_peers() {
        let o = parse_args(&args(&["--model", "qwen3.5-0.8b", "--precision", "f16,packed", "--peers"])).unwrap();
        let rows: Vec<(String, PathBuf)> =
            cases(&o, Path::new("/m")).into_iter().map(|c| (c.family, c.model)).collect();
        let row = |v: &str| ("qwen3.5-0.8b-random".to_owned(), PathBuf::from(format!("/m/qwen3.5-0.8b-random-{v}")));
        assert_eq!(rows, vec![row("f16"), row("4bit"), row("8bit")]);
        assert!(peer_models(&o, Path::new("/m")).is_empty());
    }

    #[test]
    fn the_gpt_oss_shape_has_its_folders_and_no_peers() {
        let o =
            parse_args(&args(&["--model", "gpt-oss-2l", "--precision", "f16,packed", "--formats", "mxfp4", "--peers"]))
                .unwrap();
        let rows: Vec<(String, PathBuf)> =
            cases(&o, Path::new("/m")).into_iter().map(|c| (c.family, c.model)).collect();
        let row = |v: &str| ("gpt-oss-2l-random".to_owned(), PathBuf::from(format!("/m/gpt-oss-2l-random-{v}")));
        assert_eq!(rows, vec![row("f16"), row("mxfp4")]);
        assert!(peer_models(&o, Path::new("/m")).is_empty());
    }

    #[test]
    fn bad_arguments() {
        let err = |a: &[&str]| parse_args(&args(a)).unwrap_err().to_string();
        assert!(err(&["--precision", "f64"]).starts_with("bench: unknown precision `f64`"));
        assert!(err(&["--precision", "packed,f64"]).starts_with("bench: unknown precision `f64`"));
        assert_eq!(err(&["--precision", "f16,f16"]), "bench: precision `f16` is listed twice in `f16,f16`");
        assert_eq!(parse_args(&args(&["--precision", "packed,f16"])).unwrap().precisions, vec!["packed", "f16"]);
        assert!(err(&["--steps", "0"]).starts_with("bench: `--steps` needs a whole number of at least 1 (got `0`)"));
        assert!(err(&["--repeats", "x"]).starts_with("bench: `--repeats` needs a whole number"));
        assert!(err(&["--model"]).starts_with("bench: `--model` needs a value"));
        assert!(err(&["--bogus"]).starts_with("bench: unknown argument `--bogus`"));
    }

    #[test]
    fn batch_context_and_kv_cache_flags_reach_mlx_iree() {
        let o = parse_args(&args(&[
            "--model",
            "smollm2",
            "--precision",
            "f16",
            "--batch",
            "1,4,8",
            "--context",
            "100,2000",
            "--max-context",
            "4096",
            "--kv-cache",
            "f16",
        ]))
        .unwrap();
        assert_eq!((o.batch.as_slice(), o.context.as_slice()), (&[1, 4, 8][..], &[100, 2000][..]));
        assert_eq!((o.max_context, o.kv_cache.clone()), (Some(4096), vec!["f16"]));
        let shown = |o: &Options| {
            let cmd = bench_command(Path::new("/b/mlx-iree"), &cases(o, Path::new("/m"))[0], o);
            cmd.get_args().map(|a| a.to_string_lossy().into_owned()).collect::<Vec<_>>().join(" ")
        };
        assert_eq!(
            shown(&o),
            "bench --model /m/smollm2-135m-instruct-4bit --precision f16 --device local-task --json --prompt-len 128 \
             --steps 128 --repeats 3 --batch 1,4,8 --context 100,2000 --max-context 4096 --kv-cache f16"
        );
        // Unset, they are left to mlx-iree's defaults (batch 1 is its default too).
        let o = parse_args(&args(&["--model", "smollm2", "--precision", "f32", "--steps", "4"])).unwrap();
        assert_eq!(
            shown(&o),
            "bench --model /m/smollm2-135m-instruct-4bit --precision f32 --device local-task --json --prompt-len 128 \
             --steps 4 --repeats 3 --batch 1"
        );
    }

    /// `--kv-cache f32,q8`: each case once per type, in that order, the flag on each command,
    /// and each row's decode speed against the f32 cache's at the same batch and context.
    #[test]
    fn a_kv_cache_list_runs_each_case_per_type_against_the_f32_cache() {
        let o = parse_args(&args(&["--model", "smollm2", "--precision", "packed", "--kv-cache", "f32,q8"])).unwrap();
        let cs = cases(&o, Path::new("/m"));
        assert_eq!(cs.iter().map(Case::label).collect::<Vec<_>>(), ["packed/f32", "packed/q8"]);
        let flag = |c: &Case| {
            let cmd = bench_command(Path::new("/b/mlx-iree"), c, &o);
            cmd.get_args().map(|a| a.to_string_lossy().into_owned()).skip_while(|a| a != "--kv-cache").nth(1)
        };
        assert_eq!((flag(&cs[0]), flag(&cs[1])), (Some("f32".into()), Some("q8".into())));
        let at = |batch, decode| Row::Ok(String::new(), Measured { batch, context: 2000, ..measured(decode) });
        let t = table(
            &[cs[0].clone(), cs[0].clone(), cs[1].clone(), cs[1].clone()],
            &[at(1, 40.0), at(8, 100.0), at(1, 46.0), at(8, 170.0)],
        );
        let lines: Vec<&str> = t.lines().collect();
        assert!(lines[0].contains("vs f32 KV"), "{t}");
        let kv_ratio = |line: &str| line.split_whitespace().nth(8).unwrap().to_owned();
        assert_eq!(
            lines[1..5].iter().map(|l| kv_ratio(l)).collect::<Vec<_>>(),
            ["1.00x", "1.00x", "1.15x", "1.70x"],
            "{t}"
        );
        assert!(lines[3].starts_with("smollm2-135m-instruct-4bit  packed/q8 "), "{t}");
    }

    /// `--activations i16,i8` beside `--kv-cache f32,q8`: each case once per (cache, setting),
    /// the flag on each command, and each row's prefill against the same case with i16.
    #[test]
    fn an_activations_list_runs_each_case_per_setting_against_i16_prefill() {
        let a = ["--model", "smollm2", "--precision", "packed", "--kv-cache", "f32,q8", "--activations", "i16,i8"];
        let o = parse_args(&args(&a)).unwrap();
        let cs = cases(&o, Path::new("/m"));
        let labels: Vec<String> = cs.iter().map(Case::label).collect();
        assert_eq!(labels, ["packed/f32/i16", "packed/f32/i8", "packed/q8/i16", "packed/q8/i8"]);
        let flag = |c: &Case| {
            let cmd = bench_command(Path::new("/b/mlx-iree"), c, &o);
            cmd.get_args().map(|a| a.to_string_lossy().into_owned()).skip_while(|a| a != "--activations").nth(1)
        };
        assert_eq!(cs.iter().map(flag).collect::<Vec<_>>(), ["i16", "i8", "i16", "i8"].map(|s| Some(s.to_owned())));
        let at = |prefill| Row::Ok(String::new(), Measured { prefill_tok_s: prefill, ..measured(40.0) });
        // A second folder of the family (another format) is its own baseline.
        let other = |c: &Case| Case { model: "/m/other-8bit".into(), ..c.clone() };
        let all = [cs.clone(), vec![other(&cs[0]), other(&cs[1])]].concat();
        let t = table(&all, &[at(100.0), at(134.0), at(90.0), at(99.0), at(50.0), at(60.0)]);
        let lines: Vec<&str> = t.lines().collect();
        assert!(lines[0].contains("prefill vs i16") && lines[0].contains("vs f32 KV"), "{t}");
        let act_ratio = |line: &str| line.split_whitespace().nth(9).unwrap().to_owned();
        let ratios: Vec<String> = lines[1..7].iter().map(|l| act_ratio(l)).collect();
        assert_eq!(ratios, ["1.00x", "1.34x", "1.00x", "1.10x", "1.00x", "1.20x"], "{t}");
        assert_eq!(
            parse_args(&args(&["--activations", "i4"])).unwrap_err().to_string(),
            "bench: unknown activations `i4` (expected i16 or i8)"
        );
    }

    #[test]
    fn bad_batch_context_and_kv_cache_values() {
        let err = |a: &[&str]| parse_args(&args(a)).unwrap_err().to_string();
        for (flag, v) in [
            ("--batch", "1,0"),
            ("--batch", ""),
            ("--batch", "1,,4"),
            ("--batch", "-1"),
            ("--batch", "4,"),
            ("--context", "x"),
            ("--context", "100 2000"),
        ] {
            assert_eq!(
                err(&[flag, v]),
                format!("bench: `{flag}` needs comma-separated whole numbers of at least 1 (got `{v}`)")
            );
        }
        assert_eq!(err(&["--max-context", "0"]), "bench: `--max-context` needs a whole number of at least 1 (got `0`)");
        assert_eq!(err(&["--kv-cache", "bf16"]), "bench: unknown KV cache type `bf16` (expected f32, f16 or q8)");
        assert!(err(&["--batch"]).starts_with("bench: `--batch` needs a value"));
        // With --peers, --batch or --context switch the peers to llama-batched-bench.
        let o = parse_args(&args(&["--peers", "--batch", "1,4"])).unwrap();
        assert!(o.batched_peers());
        assert_eq!(o.contexts(), [128]);
        let o = parse_args(&args(&["--context", "100,2000", "--peers"])).unwrap();
        assert!(o.batched_peers());
        assert_eq!(o.contexts(), [100, 2000]);
        assert!(!parse_args(&args(&["--peers", "--batch", "1", "--kv-cache", "f16"])).unwrap().batched_peers());
        assert!(!parse_args(&args(&["--batch", "4"])).unwrap().batched_peers());
    }

    /// One mlx-iree JSON line as `mlx-iree bench --json` prints it now.
    fn report_line(context: usize, batch: usize, decode: f64) -> String {
        format!(
            r#"{{"model":"/m/a","device":"local-task","precision":"f16","batch":{batch},"context":{context},"max_context":2144,"prefill_tok_s":100.0,"decode_tok_s":{decode:?},"ttft_ms":1280.0,"weight_bytes":3145728,"kv_bytes":{kv},"peak_rss_bytes":10485760,"dispatches_per_decode_step":42,"compile_cold_s":12.5,"compile_cached_s":0.03,"weights_load_s":1.0,"prompt_len":{context},"decode_steps":16,"repeats":3}}"#,
            kv = batch << 20,
        )
    }

    #[test]
    fn every_json_line_of_one_run_is_a_row() {
        let want = [(100, 1, 10.0), (100, 4, 36.0), (2000, 1, 8.0), (2000, 4, 28.5)];
        let lines: Vec<String> = want.iter().map(|&(c, b, d)| report_line(c, b, d)).collect();
        let stdout = format!("not json\n{}\n\n", lines.join("\n"));
        let rows = parse_rows(&stdout).unwrap();
        let got: Vec<(usize, usize, f64, u64, usize)> = rows
            .iter()
            .map(|r| match r {
                Row::Ok(_, m) => (m.context, m.batch, m.decode_tok_s, m.kv_bytes, m.max_context),
                Row::Failed(e) => panic!("{e}"),
            })
            .collect();
        assert_eq!(
            got,
            [
                (100, 1, 10.0, 1 << 20, 2144),
                (100, 4, 36.0, 4 << 20, 2144),
                (2000, 1, 8.0, 1 << 20, 2144),
                (2000, 4, 28.5, 4 << 20, 2144)
            ]
        );
        assert!(matches!(&rows[3], Row::Ok(line, _) if *line == lines[3]));
        // One bad line spoils the run rather than silently dropping a row.
        let bad = format!("{}\n{{\"decode_tok_s\": 1}}\n", lines[0]);
        assert!(parse_rows(&bad).unwrap_err().to_string().starts_with("bad JSON line: {\"decode_tok_s\": 1}"));

        // With --json, each row is one line tagged with the engine, carrying its batch,
        // context and KV bytes beside the weight bytes.
        let case = Case {
            family: "a".into(),
            model: "/m/a".into(),
            precision: "f16",
            steps: 16,
            kv_cache: None,
            activations: None,
        };
        let printed: Vec<serde_json::Value> =
            rows.iter().map(|r| serde_json::from_str(&r.json_line(&case, "local-task", None)).unwrap()).collect();
        let fields: Vec<(&str, u64, u64, u64, u64)> = printed
            .iter()
            .map(|v| {
                let n = |k: &str| v[k].as_u64().unwrap();
                (v["engine"].as_str().unwrap(), n("batch"), n("context"), n("kv_bytes"), n("weight_bytes"))
            })
            .collect();
        assert_eq!(
            fields,
            [
                ("mlx-iree", 1, 100, 1 << 20, 3 << 20),
                ("mlx-iree", 4, 100, 4 << 20, 3 << 20),
                ("mlx-iree", 1, 2000, 1 << 20, 3 << 20),
                ("mlx-iree", 4, 2000, 4 << 20, 3 << 20)
            ]
        );
        assert_eq!(
            rows[1].json_line(&case, "local-task", None),
            format!("{{\"engine\":\"mlx-iree\",{}", &lines[1][1..])
        );
    }

    #[test]
    fn error_notes_drop_the_cli_framing() {
        assert_eq!(
            error_note(
                "mlx-iree: error: invalid value 'fp8' for '--precision <PRECISION>': unknown precision `fp8` \
                 (expected f32, f16, bf16 or packed) (see mlx-iree --help)\n"
            ),
            "unknown precision `fp8` (expected f32, f16, bf16 or packed)"
        );
        assert_eq!(error_note("mlx-iree: error: loading /m: out of memory"), "loading /m: out of memory");
    }

    fn measured(decode: f64) -> Measured {
        Measured {
            next_turn_ms: None,
            batch: 1,
            context: 128,
            max_context: 2048,
            prefill_tok_s: 100.0,
            decode_tok_s: decode,
            ttft_ms: 1280.0,
            weight_bytes: 3 << 20,
            kv_bytes: 5 << 20,
            peak_rss_bytes: 10 << 20,
            dispatches_per_decode_step: 42,
            compile_cold_s: 12.5,
            compile_cached_s: Some(0.03),
            foreign_cpu_share: Some(0.01),
        }
    }

    #[test]
    fn json_lines_parse_and_errors_become_rows() {
        let line = r#"{"model":"m","device":"local-task","precision":"f32","batch":1,"context":128,"max_context":2048,"prefill_tok_s":100.0,"decode_tok_s":20.0,"ttft_ms":1280.0,"weight_bytes":3145728,"kv_bytes":5242880,"peak_rss_bytes":10485760,"dispatches_per_decode_step":42,"compile_cold_s":12.5,"compile_cached_s":0.03,"weights_load_s":1.0,"prompt_len":128,"decode_steps":16,"repeats":3,"foreign_cpu_share":0.01}"#;
        let rows = parse_rows(&format!("{line}\n")).unwrap();
        assert_eq!(rows, [Row::Ok(line.to_owned(), measured(20.0))]);
        let row = rows[0].clone();
        assert_eq!(parse_rows("no json here\n").unwrap_err().to_string(), "no JSON line");
        let case = Case {
            family: "f".into(),
            model: "/m/x".into(),
            precision: "packed",
            steps: 1,
            kv_cache: None,
            activations: None,
        };
        let null_cached = line.replace("\"compile_cached_s\":0.03", "\"compile_cached_s\":null");
        match &parse_rows(&null_cached).unwrap()[..] {
            [Row::Ok(_, m)] => assert_eq!(m.compile_cached_s, None),
            other => panic!("{other:?}"),
        }
        let failed = Row::Failed("loading /m/a-4bit: out of memory".into()).json_line(&case, "local-task", None);
        let v: serde_json::Value = serde_json::from_str(&failed).unwrap();
        assert_eq!(v["engine"], "mlx-iree");
        assert_eq!(v["model"], "/m/x");
        assert_eq!(v["precision"], "packed");
        assert_eq!(v["device"], "local-task");
        assert_eq!(v["error"], "loading /m/a-4bit: out of memory");
        // Printed as mlx-iree printed it, with the engine in front.
        assert_eq!(row.json_line(&case, "local-task", None), format!("{{\"engine\":\"mlx-iree\",{}", &line[1..]));
        // With the bandwidth measured (--peers), the bound at the end: 3 MiB per token.
        let bound: serde_json::Value =
            serde_json::from_str(&row.json_line(&case, "local-task", Some(3.0 * 1024.0 * 1024.0 * 50.0))).unwrap();
        assert_eq!(bound["bandwidth_bytes_s"], 157286400.0);
        assert_eq!(bound["bound_decode_tok_s"], 50.0);
        assert_eq!(bound["dispatches_per_decode_step"], 42);
    }

    #[test]
    fn table_shows_ratios_within_a_family() {
        let case = |family: &str, dir: &str, precision| Case {
            family: family.into(),
            model: dir.into(),
            precision,
            steps: 1,
            kv_cache: None,
            activations: None,
        };
        let cases = [
            case("a", "/m/a-4bit", "f32"),
            case("a", "/m/a-4bit", "f16"),
            case("a", "/m/a-4bit", "packed"),
            case("b", "/m/b", "f32"),
        ];
        let rows = [
            Row::Ok(String::new(), measured(20.0)),
            Row::Ok(String::new(), measured(30.0)),
            Row::Failed("loading /m/a-4bit: out of memory".into()),
            Row::Ok(String::new(), measured(5.0)),
        ];
        let t = table(&cases, &rows);
        let lines: Vec<&str> = t.lines().collect();
        assert_eq!(lines.len(), 6, "{t}");
        let cols = |l: &str| l.split_whitespace().map(str::to_owned).collect::<Vec<_>>();
        assert_eq!(
            cols(lines[0]),
            [
                "model",
                "precision",
                "batch",
                "context",
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
                "KV",
                "MiB",
                "RSS",
                "MiB",
                "compile",
                "s",
                "disp/step",
                "other",
                "CPU"
            ]
        );
        assert_eq!(
            cols(lines[1]),
            [
                "a-4bit",
                "f32",
                "1",
                "128",
                "1",
                "100.0",
                "20.00",
                "1.00x",
                "0.67x",
                "1280.0",
                "3",
                "5",
                "10",
                "12.5/0.03",
                "42",
                "1%"
            ]
        );
        assert_eq!(cols(lines[2])[..9], ["a-4bit", "f16", "1", "128", "1", "100.0", "30.00", "1.50x", "1.00x"]);
        assert_eq!(lines[3], "a-4bit  packed     error: loading /m/a-4bit: out of memory");
        // Family b has no f16 row: no ratio against it.
        assert_eq!(cols(lines[4])[..9], ["b", "f32", "1", "128", "1", "100.0", "5.00", "1.00x", "-"]);
        assert_eq!(lines[5], OTHER_CPU_NOTE);
        // A row measured under load says so; one not measured says that.
        let loaded = Row::Ok(String::new(), Measured { foreign_cpu_share: Some(0.05), ..measured(20.0) });
        let unmeasured = Row::Ok(String::new(), Measured { foreign_cpu_share: None, ..measured(20.0) });
        let t = table(&cases[..2], &[loaded, unmeasured]);
        let last: Vec<&str> = t.lines().skip(1).take(2).map(|l| l.split_whitespace().last().unwrap()).collect();
        assert_eq!(last, ["5%!", "-"], "{t}");
    }

    #[test]
    fn table_ratios_pair_rows_of_the_same_family_batch_and_context() {
        let case = |family: &str, precision| Case {
            family: family.into(),
            model: format!("/m/{family}").into(),
            precision,
            steps: 1,
            kv_cache: None,
            activations: None,
        };
        let at = |batch, context, decode| {
            Row::Ok(String::new(), Measured { batch, context, kv_bytes: (batch as u64) << 20, ..measured(decode) })
        };
        // As mlx-iree prints them: contexts outer, batches inner, one case after the other.
        let rows = [
            (case("a", "f32"), at(1, 100, 10.0)),
            (case("a", "f32"), at(4, 100, 32.0)),
            (case("a", "f32"), at(1, 2000, 8.0)),
            (case("a", "f16"), at(1, 100, 20.0)),
            (case("a", "f16"), at(4, 100, 48.0)),
            (case("a", "f16"), at(1, 2000, 4.0)),
            (case("a", "f16"), at(4, 2000, 12.0)),
            (case("b", "f32"), at(4, 100, 1.0)),
        ];
        let (cases, rows): (Vec<Case>, Vec<Row>) = rows.into_iter().unzip();
        let t = table(&cases, &rows);
        let lines: Vec<Vec<&str>> =
            t.lines().skip(1).filter(|l| *l != OTHER_CPU_NOTE).map(|l| l.split_whitespace().collect()).collect();
        // (precision, batch, context, decode/s, vs f32, vs f16, KV MiB)
        let got: Vec<[&str; 7]> = lines.iter().map(|c| [c[1], c[2], c[3], c[6], c[7], c[8], c[11]]).collect();
        assert_eq!(
            got,
            [
                ["f32", "1", "100", "10.00", "1.00x", "0.50x", "1"],
                ["f32", "4", "100", "32.00", "1.00x", "0.67x", "4"],
                ["f32", "1", "2000", "8.00", "1.00x", "2.00x", "1"],
                ["f16", "1", "100", "20.00", "2.00x", "1.00x", "1"],
                ["f16", "4", "100", "48.00", "1.50x", "1.00x", "4"],
                ["f16", "1", "2000", "4.00", "0.50x", "1.00x", "1"],
                // No f32 row at batch 4, context 2000.
                ["f16", "4", "2000", "12.00", "-", "1.00x", "4"],
                // Family b's own f32 row is its baseline, not a's, and it has no f16 row.
                ["f32", "4", "100", "1.00", "1.00x", "-", "4"],
            ]
        );
        assert_eq!(lines[7][0], "b");
    }

    #[test]
    fn peers_flag_and_the_models_they_run() {
        let o =
            parse_args(&args(&["--peers", "--model", "smollm2", "--model", "llama-1b", "--model", "/x/mine"])).unwrap();
        assert!(o.peers && !parse_args(&[]).unwrap().peers);
        let got = peer_models(&o, Path::new("/m"));
        let want = [
            ("smollm2-135m-instruct", "/m/smollm2-135m-instruct-f16", 128, true),
            ("llama-1b-random", "/m/llama-1b-random-f16", 16, false),
            ("mine", "/x/mine", 128, false),
        ];
        // SmolLM2's GGUFs carry the tokenizer of the GGUF it was made from (llama-server needs
        // it), and so do the 1B shape's (padded, peers.py).
        let vocab: Vec<Option<&Path>> = got.iter().map(|p| p.vocab.as_deref()).collect();
        let smollm2 = Path::new("/m/download/SmolLM2-135M-Instruct.Q4_1.gguf");
        assert_eq!(vocab, [Some(smollm2), Some(smollm2), None]);
        let got: Vec<(&str, String, usize, bool)> =
            got.iter().map(|p| (p.family.as_str(), p.src.display().to_string(), p.steps, p.mlx_lm)).collect();
        let want: Vec<(&str, String, usize, bool)> =
            want.iter().map(|(f, s, n, m)| (*f, (*s).to_owned(), *n, *m)).collect();
        assert_eq!(got, want);
        // A model named twice runs its peers once; --steps applies to them too.
        let o = parse_args(&args(&["--peers", "--model", "smollm2", "--model", "smollm2", "--steps", "4"])).unwrap();
        let got = peer_models(&o, Path::new("/m"));
        assert_eq!((got.len(), got[0].steps), (1, 4));
    }

    #[test]
    fn our_rows_pair_with_the_peer_of_the_same_weight_format() {
        let o = parse_args(&args(&["--model", "llama-1b", "--model", "smollm2"])).unwrap();
        let got: Vec<(String, &str, Option<&str>)> =
            cases(&o, Path::new("/m")).iter().map(|c| (display_name(&c.model), c.precision, pair_key(c))).collect();
        let want = [
            ("llama-1b-random-f16", "f32", Some("f32")),
            ("llama-1b-random-f16", "f16", Some("f16")),
            ("llama-1b-random-f16", "bf16", None),
            ("llama-1b-random-4bit", "packed", Some("q4_0")),
            ("llama-1b-random-8bit", "packed", Some("q8_0")),
            ("smollm2-135m-instruct-4bit", "f32", Some("f32")),
            ("smollm2-135m-instruct-4bit", "f16", Some("f16")),
            ("smollm2-135m-instruct-4bit", "bf16", None),
            ("smollm2-135m-instruct-4bit", "packed", Some("q4_0")),
        ];
        let want: Vec<(String, &str, Option<&str>)> = want.iter().map(|(n, p, k)| ((*n).to_owned(), *p, *k)).collect();
        assert_eq!(got, want);
    }

    #[test]
    fn json_lines_get_the_engine_and_the_bound() {
        assert_eq!(tagged_json(r#"{"a":1}"#, "mlx-iree", None), r#"{"engine":"mlx-iree","a":1}"#);
        // A line that names its engine keeps it.
        assert_eq!(
            tagged_json(r#"{"engine": "llama.cpp", "a": 1}"#, "x", Some((2e9, 1_000_000_000))),
            r#"{"engine": "llama.cpp", "a": 1,"bandwidth_bytes_s":2000000000.0,"bound_decode_tok_s":2.0}"#
        );
        assert_eq!(tagged_json("{}", "e", None), r#"{"engine":"e"}"#);
        assert_eq!(tagged_json("not json", "e", None), "not json");
    }

    fn peer_line(engine: &'static str, family: &str, precision: &'static str, decode: f64) -> Line {
        Line {
            source: Source::peer(engine, family, precision),
            steps: 16,
            dispatches: None,
            result: Ok(Speed {
                prefill_tok_s: 200.0,
                decode_tok_s: decode,
                ttft_ms: Some(640.0),
                weight_bytes: 100 << 20,
                peak_rss_bytes: Some(200 << 20),
                foreign_cpu_share: Some(0.31),
            }),
        }
    }

    #[test]
    fn peer_rows_parse() {
        let line = r#"{"engine": "llama.cpp", "model": "/p/a-q4_0.gguf", "device": "cpu", "precision": "q4_0", "prefill_tok_s": 200.0, "decode_tok_s": 40.0, "ttft_ms": 640.0, "weight_bytes": 104857600, "peak_rss_bytes": 209715200, "dispatches_per_decode_step": null, "threads": 2}"#;
        let (json, speed) = parse_peer(&format!("noise\n{line}\n")).unwrap();
        assert_eq!(json, line);
        // xtask, not the peer, measures the foreign share.
        let want = peer_line("llama.cpp", "a", "q4_0", 40.0).result.map(|s| Speed { foreign_cpu_share: None, ..s });
        assert_eq!(Ok(speed), want);
        // As values: the keys' order is serde_json's (sorted, or kept where the workspace
        // builds it with `preserve_order`).
        let value = |s: &str| serde_json::from_str::<serde_json::Value>(s).unwrap();
        assert_eq!(
            value(&with_foreign_share(r#"{"engine":"llama.cpp","decode_tok_s":40.0}"#, Some(0.25))),
            value(r#"{"decode_tok_s":40.0,"engine":"llama.cpp","foreign_cpu_share":0.25}"#)
        );
        assert_eq!(with_foreign_share("{}", None), r#"{"foreign_cpu_share":null}"#);
        assert_eq!(parse_peer("").unwrap_err(), "printed no JSON line");
        assert!(parse_peer("{\"decode_tok_s\": 1}").unwrap_err().starts_with("bad JSON line"));
    }

    #[test]
    fn peers_table_shows_ratios_and_the_bound() {
        let case = |dir: &str, precision| Case {
            family: "a".into(),
            model: dir.into(),
            precision,
            steps: 16,
            kv_cache: None,
            activations: None,
        };
        let ours = [
            (case("/m/a-f16", "f16"), Row::Ok(String::new(), measured(20.0))),
            (case("/m/a-f16", "bf16"), Row::Ok(String::new(), measured(10.0))),
            (case("/m/a-4bit", "packed"), Row::Failed("loading /m/a-4bit: out of memory".into())),
        ];
        let mut lines: Vec<Line> = ours.iter().map(|(c, r)| Line::ours(c, r)).collect();
        lines.push(peer_line("llama.cpp", "b", "f16", 1.0));
        lines.push(peer_line("llama.cpp", "a", "f16", 40.0));
        lines.push(peer_line("llama.cpp", "a", "q4_0", 80.0));
        lines.push(Line {
            result: Err("llama.cpp could not load x".into()),
            ..peer_line("llama.cpp", "a", "q8_0", 0.0)
        });
        let lines = order_by_family(lines);
        let order: Vec<(&str, &str)> =
            lines.iter().map(|l| (l.source.family.as_str(), l.source.precision.as_str())).collect();
        assert_eq!(
            order,
            [("a", "f16"), ("a", "bf16"), ("a", "packed"), ("a", "f16"), ("a", "q4_0"), ("a", "q8_0"), ("b", "f16")]
        );
        // 1 GiB/s over 100 MiB (peers) or 3 MiB (ours) of weights.
        let t = peers_table(&lines, 1024.0 * 1024.0 * 1024.0);
        let rows: Vec<&str> = t.lines().collect();
        assert_eq!(rows.len(), 10, "{t}");
        let cols = |l: &str| l.split_whitespace().map(str::to_owned).collect::<Vec<_>>();
        assert_eq!(
            cols(rows[0]),
            [
                "engine",
                "model",
                "precision",
                "steps",
                "prefill/s",
                "decode/s",
                "bound/s",
                "of",
                "bound",
                "ttft",
                "ms",
                "wts",
                "MiB",
                "RSS",
                "MiB",
                "disp/step",
                "other",
                "CPU",
                "decode/prefill",
                "vs",
                "peer"
            ]
        );
        assert_eq!(
            cols(rows[1]),
            [
                "mlx-iree",
                "a-f16",
                "f16",
                "16",
                "100.0",
                "20.00",
                "341.3",
                "6%",
                "1280.0",
                "3",
                "10",
                "42",
                "1%",
                "0.50x",
                "/",
                "0.50x",
                "llama.cpp",
                "f16"
            ]
        );
        // bf16 has no peer; a failed row says why.
        assert_eq!(cols(rows[2]).last().unwrap(), "-");
        assert_eq!(
            rows[3],
            format!("{:<9}  {:<5}  {:<9}  error: loading /m/a-4bit: out of memory", "mlx-iree", "a-4bit", "packed")
        );
        assert_eq!(
            cols(rows[4])[..13],
            ["llama.cpp", "a", "f16", "16", "200.0", "40.00", "10.2", "391%", "640.0", "100", "200", "-", "31%!"]
        );
        assert_eq!(cols(rows[4]).last().unwrap(), "-");
        assert!(rows[6].ends_with("error: llama.cpp could not load x"), "{}", rows[6]);
        assert!(rows[8].starts_with("bound/s = memory read bandwidth 1.1 GB/s"), "{}", rows[8]);
        assert_eq!(rows[9], OTHER_CPU_NOTE);
    }

    #[test]
    fn batched_table_pairs_batch_and_context_and_compares_contexts() {
        let line = |engine, name: &str, precision: &str, pair, batch, context, decode: f64| BatchLine {
            source: Source { engine, family: "a".into(), name: name.into(), precision: precision.into(), pair },
            batch,
            context,
            steps: 16,
            result: Ok((100.0, decode)),
            foreign_cpu_share: None,
        };
        let lines = vec![
            line(LLAMA_CPP, "a", "q4_0", Some("q4_0"), 1, 100, 40.0),
            line(LLAMA_CPP, "a", "q4_0", Some("q4_0"), 8, 100, 160.0),
            line(LLAMA_CPP, "a", "q4_0", Some("q4_0"), 1, 2000, 30.0),
            line(ENGINE, "a-4bit", "packed", Some("q4_0"), 1, 100, 20.0),
            line(ENGINE, "a-4bit", "packed", Some("q4_0"), 8, 100, 80.0),
            line(ENGINE, "a-4bit", "packed", Some("q4_0"), 1, 2000, 15.0),
            line(ENGINE, "a-4bit", "bf16", None, 1, 100, 10.0),
            BatchLine { result: Err("out of memory".into()), ..line(ENGINE, "a-4bit", "f16", Some("f16"), 0, 0, 0.0) },
        ];
        let lines = order_batch_lines(lines);
        assert_eq!(lines[0].source.engine, ENGINE);
        assert_eq!((lines[4].source.engine, lines[5].source.engine), (ENGINE, LLAMA_CPP));
        let t = batched_table(&lines, &[100, 2000]);
        let rows: Vec<Vec<&str>> = t.lines().map(|l| l.split_whitespace().collect()).collect();
        assert_eq!(
            rows[0],
            [
                "engine",
                "model",
                "precision",
                "batch",
                "context",
                "steps",
                "prefill/s",
                "decode/s",
                "vs",
                "ctx",
                "100",
                "other",
                "CPU",
                "vs",
                "peer"
            ]
        );
        assert_eq!(
            rows[1],
            [
                "mlx-iree",
                "a-4bit",
                "packed",
                "1",
                "100",
                "16",
                "100.0",
                "20.00",
                "1.00x",
                "-",
                "0.50x",
                "llama.cpp",
                "q4_0"
            ]
        );
        assert_eq!(rows[2][7..], ["80.00", "1.00x", "-", "0.50x", "llama.cpp", "q4_0"]);
        assert_eq!(rows[3][3..], ["1", "2000", "16", "100.0", "15.00", "0.75x", "-", "0.50x", "llama.cpp", "q4_0"]);
        // bf16 has no peer; a failed row says why.
        assert_eq!(rows[4][8..], ["1.00x", "-", "-"]);
        assert!(t.lines().nth(5).unwrap().ends_with("error: out of memory"));
        assert_eq!(rows[6][..5], ["llama.cpp", "a", "q4_0", "1", "100"]);
        assert_eq!(rows[8][7..], ["30.00", "0.75x", "-", "-"]);
        let notes: Vec<&str> = t.lines().rev().take(2).collect();
        assert!(notes[1].ends_with("vs ctx 100 = decode/s over the same row's at context 100"), "{t}");
        assert_eq!(notes[0], OTHER_CPU_NOTE);
        // One context: no context ratio column.
        let t = batched_table(&[lines[0].clone(), lines[5].clone()], &[100]);
        assert!(!t.contains("vs ctx"), "{t}");
        assert_eq!(t.lines().nth(1).unwrap().split_whitespace().last(), Some("q4_0"));
        let quiet = BatchLine { foreign_cpu_share: Some(0.049), ..lines[0].clone() };
        let t = batched_table(&[quiet], &[100]);
        assert_eq!(t.lines().nth(1).unwrap().split_whitespace().nth(8), Some("5%"), "{t}");
    }

    #[test]
    fn llama_bench_rows_check_the_harness() {
        let mut bench = peer_line(LLAMA_BENCH, "a", "q4_0", 100.0);
        if let Ok(s) = &mut bench.result {
            (s.prefill_tok_s, s.ttft_ms, s.peak_rss_bytes) = (250.0, None, None);
        }
        let lines = [peer_line(LLAMA_CPP, "a", "q4_0", 80.0), bench];
        let t = peers_table(&lines, 1024.0 * 1024.0 * 1024.0);
        let rows: Vec<&str> = t.lines().collect();
        // The engine column is as wide as its longest name.
        assert!(rows[1].starts_with("llama.cpp    a "), "{t}");
        let cols: Vec<&str> = rows[2].split_whitespace().collect();
        assert_eq!(cols[..7], ["llama-bench", "a", "q4_0", "16", "250.0", "100.00", "10.2"]);
        // No time to first token or RSS from llama-bench; the harness's ratios against it.
        assert_eq!(cols[8..], ["-", "100", "-", "-", "31%!", "harness", "0.80x", "/", "0.80x"]);
        assert!(rows[5].starts_with("harness = decode / prefill of the llama.cpp row"), "{t}");
        // The JSON line carries both speeds with their spread, the tool's context and threads.
        let b = peers::LlamaBench {
            prefill: peers::LlamaBenchTest {
                n_prompt: 128,
                n_gen: 0,
                n_depth: 0,
                n_threads: 2,
                model_size: 7,
                avg_ts: 250.0,
                stddev_ts: 1.0,
            },
            decode: peers::LlamaBenchTest {
                n_prompt: 0,
                n_gen: 16,
                n_depth: 0,
                n_threads: 2,
                model_size: 7,
                avg_ts: 100.0,
                stddev_ts: 2.0,
            },
        };
        let v: serde_json::Value =
            serde_json::from_str(&llama_bench_json(Path::new("/p/a.gguf"), "q4_0", 3, &b)).unwrap();
        assert_eq!(
            (v["engine"].as_str(), v["precision"].as_str(), v["weight_bytes"].as_u64()),
            (Some(LLAMA_BENCH), Some("q4_0"), Some(7))
        );
        assert_eq!(
            (v["prefill_tok_s"].as_f64(), v["decode_tok_s"].as_f64(), v["decode_stddev_tok_s"].as_f64()),
            (Some(250.0), Some(100.0), Some(2.0))
        );
        assert_eq!(
            (v["prompt_len"].as_u64(), v["decode_steps"].as_u64(), v["decode_context"].as_u64(), v["repeats"].as_u64()),
            (Some(128), Some(16), Some(0), Some(3))
        );
    }
}
