//! `mlx-iree generate` and `mlx-iree trajectory`: the CLI contract of docs/ARCHITECTURE.md
//! (`crates/mlx-iree`) and the README's "The `mlx-iree` command".

use crate::settings::Settings;
use anyhow::{Context, Result, bail};
use engine::scheduler::{FinishReason, Finished};
use engine::{Draft, Engine, EngineConfig, KvElem, Plan, Precision};
use server::{Generator, ModelText, Piece, ReasoningEffort};
use std::io::Write;
use std::path::{Path, PathBuf};
use text::chat::Message;
use text::sampler::{Sampler, SamplingParams};
use text::tokenizer::Tokenizer;

#[derive(clap::Args, Debug, Clone)]
pub struct ModelArgs {
    /// MLX model: a folder (config.json, *.safetensors; tokenizer.json for text prompts) or a
    /// Hugging Face repo id owner/name[@revision], downloaded into the Hugging Face cache.
    #[arg(long)]
    pub model: PathBuf,
    /// The hub repo `--model` named, once [`ModelArgs::resolve`] has put its snapshot folder
    /// in `model`; `None` for a local folder.
    #[arg(skip)]
    pub repo: Option<String>,
    /// IREE device URI: local-task, local-sync, cuda, vulkan, or metal on macOS.
    #[arg(long, default_value = "local-task")]
    pub device: String,
    /// Weight precision on the device: f32, f16, bf16 or packed (MLX 4/8-bit kept packed);
    /// default: packed for a 4/8-bit checkpoint on a CPU with the AVX-512 or AMX kernels,
    /// else f16.
    #[arg(long)]
    pub precision: Option<Precision>,
    /// Most positions (prompt plus generated tokens) of a sequence; default: the model's
    /// max_position_embeddings, capped so the KV cache fits its budget (4 GiB).
    #[arg(long)]
    pub max_context: Option<usize>,
    /// Element type of the KV cache: f32, f16 or q8 (8-bit values in blocks of 16 with an
    /// f32 scale each: 5/16 of f32's bytes).
    #[arg(long, default_value = "f32")]
    pub kv_cache: KvElem,
    /// How the CPU kernel's packed products quantize their input: i16 (15 bits a group,
    /// token-exact with MLX) or i8 (8 bits a group, llama.cpp's int8 activations: faster
    /// prompts on CPUs with AVX-512 VNNI; check a model with `mlx-iree gate`). Precision
    /// packed only.
    #[arg(long, default_value = "i16")]
    pub activations: models::Activations,
    /// Prefill every prompt whole: no reading of a prompt's start from a slot that an earlier
    /// sequence left it in (the prefix cache, on by default).
    #[arg(long)]
    pub no_prefix_cache: bool,
    /// Speculative decoding, for the commands that take `--draft` ([`DraftArgs`]; off for
    /// the others, which time or record plain steps).
    #[arg(skip = Draft::Off)]
    pub draft: Draft,
    #[command(flatten)]
    pub settings: Settings,
}

/// Where `--draft` takes draft tokens from.
#[derive(clap::ValueEnum, Debug, Clone, Copy, PartialEq, Eq)]
pub enum DraftKind {
    /// Prompt lookup: n-grams of the prompt and the answer so far.
    Ngram,
}

/// Speculative decoding's flags (`generate`, `chat`, `serve`).
#[derive(clap::Args, Debug, Clone)]
#[group(skip)]
pub struct DraftArgs {
    /// Speculative decoding: `ngram` drafts tokens from the sequence itself (the tokens that
    /// followed the latest earlier occurrence of its last few), and the model checks them in
    /// one call; the output is that of plain decoding. Models with recurrent layers take it
    /// on CPU devices only.
    #[arg(long, value_enum, group = "drafting")]
    pub draft: Option<DraftKind>,
    /// Speculative decoding with a second, smaller model of the same tokenizer (a folder or
    /// a hub repo id, at its default precision) drafting greedy tokens.
    #[arg(long, value_name = "DIR", group = "drafting")]
    pub draft_model: Option<PathBuf>,
    /// Most draft tokens one call checks (with --draft or --draft-model; default 4).
    #[arg(long)]
    pub draft_tokens: Option<usize>,
}

/// Draft tokens per call when `--draft-tokens` is not given.
const DRAFT_TOKENS: usize = 4;

impl DraftArgs {
    /// The engine setting these flags ask for on `device`.
    pub fn draft(&self, device: &str) -> Result<Draft> {
        let tokens = self.draft_tokens.unwrap_or(DRAFT_TOKENS);
        Ok(match (self.draft, &self.draft_model) {
            (Some(DraftKind::Ngram), _) => Draft::Ngram { tokens },
            (None, Some(dir)) => {
                Draft::Model { dir: dir.clone(), precision: engine::device::default_precision(device, dir), tokens }
            }
            (None, None) if self.draft_tokens.is_some() => bail!("--draft-tokens needs --draft ngram or --draft-model"),
            (None, None) => Draft::Off,
        })
    }

    /// Turns a hub repo id in `--draft-model` into its snapshot folder, as `--model`.
    pub fn resolve(&mut self, offline: bool) -> Result<()> {
        if let Some(model) = &self.draft_model {
            self.draft_model = Some(crate::download::resolve(model, offline)?.0);
        }
        Ok(())
    }
}

impl ModelArgs {
    /// Turns a hub repo id in `--model` into its snapshot folder, downloading what the cache
    /// lacks (crates/hub); a local folder stays as it is.
    pub fn resolve(&mut self) -> Result<()> {
        let (dir, repo) = crate::download::resolve(&self.model, self.settings.offline)?;
        self.model = dir;
        self.repo = repo;
        Ok(())
    }

    /// The precision asked for, else the device's measured default.
    pub fn precision(&self) -> Precision {
        self.precision.unwrap_or_else(|| engine::device::default_precision(&self.device, &self.model))
    }

    /// The engine settings for these flags, with `max_batch` sequences at once: the
    /// [`Settings`] flags (`--kernels`, `--cache-dir`, `--cache-max-gb`,
    /// `--store-parameters`, `--dump-mlir`), each falling back on its environment variable;
    /// the binary reads them, the library takes them as values.
    pub fn engine_config(&self, max_batch: usize) -> Result<EngineConfig> {
        Ok(EngineConfig {
            max_batch,
            max_context: self.max_context,
            kv_elem: self.kv_cache,
            activations: self.activations,
            kernels: self.settings.kernels()?,
            dump_mlir: self.settings.dump_mlir(),
            store_parameters: self.settings.store_parameters()?,
            cache_max_bytes: self.settings.cache_max_bytes()?,
            prefix_cache: !self.no_prefix_cache,
            draft: self.draft.clone(),
            ..EngineConfig::new(&self.device, self.precision(), self.settings.cache_dir())
        })
    }

    /// Refuses drafts the model cannot take (recurrent layers off CPU, a draft model with
    /// them, `--draft-tokens 0`), before
    /// the tokenizer or anything else is read.
    pub fn check_draft(&self, config: &models::ModelConfig) -> Result<()> {
        if self.draft == Draft::Off {
            return Ok(());
        }
        Plan::new(config, &self.engine_config(1)?)?;
        // A draft model's ids must mean the same tokens (where the model has a tokenizer:
        // the commands that need one say so themselves).
        if let Draft::Model { dir, .. } = &self.draft
            && let Ok(ours) = Tokenizer::from_dir(&self.model)
        {
            let theirs = Tokenizer::from_dir(dir).context("--draft-model")?;
            if theirs.vocab_size() != ours.vocab_size() {
                bail!(
                    "--draft-model: its tokenizer has {} tokens, the model's {}",
                    theirs.vocab_size(),
                    ours.vocab_size()
                );
            }
            let size = u32::try_from(ours.vocab_size())?;
            if let Some(id) = (0..size).find(|&id| ours.id_to_token(id) != theirs.id_to_token(id)) {
                bail!(
                    "--draft-model: its tokenizer is not the model's (id {id} is {:?} there, {:?} here)",
                    theirs.id_to_token(id).unwrap_or_default(),
                    ours.id_to_token(id).unwrap_or_default()
                );
            }
        }
        Ok(())
    }

    /// The shapes an engine for these flags compiles, checked before anything is compiled:
    /// `need` positions (prompt and new tokens) must fit one sequence's context.
    pub fn plan(&self, config: &models::ModelConfig, max_batch: usize, need: usize, what: &str) -> Result<Plan> {
        let plan = Plan::new(config, &self.engine_config(max_batch)?)?;
        if need > plan.cache.positions {
            bail!("{what} needs {need} positions, more than the maximum context {}", plan.cache.positions);
        }
        Ok(plan)
    }
}

#[derive(clap::Args, Debug)]
pub struct GenerateArgs {
    #[command(flatten)]
    pub(crate) model: ModelArgs,
    /// The prompt text.
    #[arg(long)]
    prompt: String,
    /// Apply the model's chat template to the prompt (as one user message).
    #[arg(long)]
    chat: bool,
    /// A JSON schema file: the answer is JSON valid against it (constrained decoding).
    #[arg(long, value_name = "FILE")]
    json_schema: Option<PathBuf>,
    #[command(flatten)]
    sampling: SamplingArgs,
    #[command(flatten)]
    pub(crate) draft: DraftArgs,
}

/// How answers are generated: the flags `generate` and `chat` share.
#[derive(clap::Args, Debug, Clone)]
pub struct SamplingArgs {
    /// Most tokens to generate (generation also stops at an end-of-sequence token).
    #[arg(long, default_value_t = 256)]
    pub max_tokens: usize,
    /// Sampling temperature; 0 is greedy.
    #[arg(long, default_value_t = 0.0, allow_negative_numbers = true)]
    temperature: f32,
    /// Nucleus sampling: keep the most likely tokens up to this total probability.
    #[arg(long, allow_negative_numbers = true)]
    top_p: Option<f32>,
    /// Keep only the K most likely tokens.
    #[arg(long)]
    top_k: Option<usize>,
    /// Keep only tokens at least this fraction as likely as the most likely one (0 to 1).
    #[arg(long)]
    min_p: Option<f32>,
    /// Subtracted once from the logit of every token already generated (-2 to 2).
    #[arg(long, default_value_t = 0.0, allow_negative_numbers = true)]
    presence_penalty: f32,
    /// Subtracted from a token's logit once per time it was generated (-2 to 2).
    #[arg(long, default_value_t = 0.0, allow_negative_numbers = true)]
    frequency_penalty: f32,
    /// Divides the positive logits of tokens already generated, multiplies the others (> 0;
    /// 1 is off).
    #[arg(long, default_value_t = 1.0, allow_negative_numbers = true)]
    repetition_penalty: f32,
    /// ID=BIAS added to token ID's logit (-100 to 100); repeat the flag or separate with commas.
    #[arg(long, value_delimiter = ',', value_parser = parse_logit_bias, allow_negative_numbers = true)]
    logit_bias: Vec<(u32, f32)>,
    /// Random seed for sampling (the same seed gives the same text).
    #[arg(long, default_value_t = 0)]
    seed: u64,
    /// How long a reasoning model thinks before it answers (low, medium or high), for a
    /// chat template that reads it (gpt-oss's); with `generate`, needs `--chat`.
    #[arg(long, value_parser = ["low", "medium", "high"])]
    reasoning_effort: Option<String>,
}

/// `--logit-bias ID=BIAS`.
fn parse_logit_bias(arg: &str) -> std::result::Result<(u32, f32), String> {
    let (id, bias) = arg.split_once('=').ok_or_else(|| format!("expected ID=BIAS, got `{arg}`"))?;
    let id = id.trim().parse().map_err(|_| format!("`{id}` is not a token id"))?;
    let bias = bias.trim().parse().map_err(|_| format!("`{bias}` is not a number"))?;
    Ok((id, bias))
}

impl SamplingArgs {
    /// Refuses values no answer can be generated with, before anything is loaded.
    pub fn check(&self) -> Result<()> {
        if self.max_tokens == 0 {
            bail!("--max-tokens must be at least 1");
        }
        Sampler::new(self.params())?;
        Ok(())
    }

    /// The generator's options for one answer (greedy at temperature 0, else seeded with
    /// `--seed`, so each request with the same prompt gives the same text).
    pub fn options(&self) -> server::Options {
        server::Options { max_tokens: self.max_tokens, sampling: self.params(), ..server::Options::greedy(0) }
    }

    /// Refuses `--logit-bias` ids outside the model's vocabulary of `vocab` tokens.
    pub fn check_vocab(&self, vocab: usize) -> Result<()> {
        Ok(self.params().check_vocab(vocab)?)
    }

    /// `--reasoning-effort`, refused (before anything is compiled) where the model's chat
    /// template does not read it.
    pub fn effort(&self, text: &ModelText) -> Result<Option<ReasoningEffort>> {
        let Some(name) = self.reasoning_effort.as_deref() else { return Ok(None) };
        let effort = ReasoningEffort::parse(name).with_context(|| format!("unknown reasoning effort `{name}`"))?;
        server::template_vars(text.chat_template()?, Some(effort))?;
        Ok(Some(effort))
    }

    fn params(&self) -> SamplingParams {
        SamplingParams {
            temperature: self.temperature,
            top_k: self.top_k,
            top_p: self.top_p,
            min_p: self.min_p,
            presence_penalty: self.presence_penalty,
            frequency_penalty: self.frequency_penalty,
            repetition_penalty: self.repetition_penalty,
            logit_bias: self.logit_bias.clone(),
            seed: self.seed,
        }
    }
}

/// Loads the model in `model.model` for one answer at a time (the caller has read its text
/// side, `text`, and checked its plan): the shared generator (`server::Generator`) on a
/// scheduler of one slot.
pub fn start(model: &ModelArgs, text: ModelText) -> Result<Generator> {
    let dir = &model.model;
    Generator::start(dir, model.engine_config(1)?, text).with_context(|| format!("loading {}", dir.display()))
}

/// One answer as it was streamed.
#[derive(Debug)]
pub struct Answer {
    /// The text printed (without the final newline), the reasoning not included.
    pub text: String,
    /// How the generation ended; reason `Cancelled` when `stop` ended it.
    pub done: Finished,
}

/// Generates the answer to `prompt`, writing its text to `out` as it decodes, then a newline.
/// For a chat prompt (`chat`) of a model that gives its reasoning apart (gpt-oss), the
/// reasoning goes to `notes` as it decodes, after `thinking: ` and before the answer, so that
/// `out` holds the answer alone. `stop` is asked after every token: once it says yes the
/// generation is cancelled and the answer ends with what was printed.
pub fn answer(
    generator: &Generator,
    prompt: Vec<u32>,
    sampling: &SamplingArgs,
    chat: bool,
    (out, notes): (&mut impl Write, &mut impl Write),
    stop: &dyn Fn() -> bool,
) -> Result<Answer> {
    answer_with(generator, prompt, server::Options { split_reasoning: chat, ..sampling.options() }, (out, notes), stop)
}

/// [`answer`] with the generator's options as they are (a grammar among them).
pub fn answer_with(
    generator: &Generator,
    prompt: Vec<u32>,
    options: server::Options,
    (out, notes): (&mut impl Write, &mut impl Write),
    stop: &dyn Fn() -> bool,
) -> Result<Answer> {
    let mut stream = generator.submit(prompt, &options)?;
    let mut text = String::new();
    let (mut stopped, mut thinking) = (false, false);
    loop {
        match stream.blocking_next(&generator.tokenizer)? {
            Piece::Text(_) | Piece::Reasoning(_) if stopped => {}
            // Not shown: the answer ends where the user stopped it.
            Piece::Text(_) | Piece::Reasoning(_) if stream.finished().is_none() && stop() => {
                stream.cancel();
                stopped = true;
            }
            Piece::Reasoning(piece) => {
                if !thinking {
                    write!(notes, "thinking: ")?;
                    thinking = true;
                }
                write!(notes, "{piece}")?;
                notes.flush()?;
            }
            Piece::Text(piece) => {
                if thinking && !piece.is_empty() {
                    writeln!(notes)?;
                    notes.flush()?;
                    thinking = false;
                }
                write!(out, "{piece}")?;
                out.flush()?;
                text += &piece;
            }
            // Only a request that offers tools gets calls apart, and the CLI offers none.
            Piece::ToolCalls(_) => {}
            Piece::End(_) => break,
        }
    }
    if thinking {
        writeln!(notes)?;
    }
    let mut done = stream.finished().cloned().context("the engine ended the generation without saying why")?;
    if stopped {
        done.reason = FinishReason::Cancelled;
    }
    writeln!(out)?;
    out.flush()?;
    Ok(Answer { text, done })
}

#[derive(clap::Args, Debug)]
#[command(group = clap::ArgGroup::new("input").required(true).args(["prompt", "prompt_ids"]))]
pub struct TrajectoryArgs {
    #[command(flatten)]
    pub(crate) model: ModelArgs,
    /// Prompt text (encoded with the model's tokenizer, no chat template).
    #[arg(long)]
    prompt: Option<String>,
    /// Prompt as token ids, e.g. 1,2,3.
    #[arg(long, value_delimiter = ',')]
    prompt_ids: Option<Vec<u32>>,
    /// Greedy steps to record (end-of-sequence tokens do not stop it).
    #[arg(long)]
    steps: usize,
    /// Where to write the trajectory JSON.
    #[arg(long)]
    out: PathBuf,
}

/// Reads and normalises the model's config.json, so unsupported models and out-of-range
/// inputs are refused before anything is compiled.
pub fn check_model_dir(dir: &Path) -> Result<models::ModelConfig> {
    if !dir.is_dir() {
        bail!("model folder {} does not exist", dir.display());
    }
    Ok(models::ModelConfig::from_file(&dir.join("config.json"))?)
}

#[derive(clap::Args, Debug)]
pub struct CompileArgs {
    #[command(flatten)]
    pub model: ModelArgs,
    /// Sequences at once the engine is planned for (`bench --batch`'s largest).
    #[arg(long, default_value_t = 1)]
    pub max_batch: usize,
}

/// `mlx-iree compile`: every module an engine with these flags loads, compiled into the
/// cache (or found there), without opening the device, so a cache can be filled for a
/// machine that has the device but no compiler (scripts/cuda-check).
pub fn compile(args: &CompileArgs) -> Result<()> {
    if args.max_batch == 0 {
        bail!("--max-batch must be at least 1");
    }
    let dir = &args.model.model;
    let config = args.model.engine_config(args.max_batch)?;
    let report = Engine::compile_only(dir, &config).with_context(|| format!("compiling {}", dir.display()))?;
    eprintln!("compiled for {} into {}: {report}", args.model.device, config.cache_dir.display());
    Ok(())
}

fn load(model: &ModelArgs) -> Result<Engine> {
    Engine::load(&model.model, &model.engine_config(1)?).with_context(|| format!("loading {}", model.model.display()))
}

pub fn generate(args: &GenerateArgs) -> Result<()> {
    let dir = &args.model.model;
    let config = check_model_dir(dir)?;
    args.model.check_draft(&config)?;
    args.sampling.check()?;
    let text = ModelText::load(dir)?;
    args.sampling.check_vocab(text.tokenizer.vocab_size())?;
    if args.sampling.reasoning_effort.is_some() && !args.chat {
        bail!("--reasoning-effort applies to a chat prompt: add --chat");
    }
    // The schema is read and compiled before the model loads.
    let constraint = match &args.json_schema {
        None => None,
        Some(path) => {
            let text_of = std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
            let schema: serde_json::Value =
                serde_json::from_str(&text_of).with_context(|| format!("{}: not JSON", path.display()))?;
            Some(text.json_schema(&schema).with_context(|| format!("{}: not a usable JSON schema", path.display()))?)
        }
    };
    let prompt = if args.chat {
        text.encode_chat(&[Message::user(&args.prompt)], args.sampling.effort(&text)?)?
    } else {
        text.encode(&args.prompt)?
    };
    if prompt.is_empty() {
        bail!("--prompt encodes to no tokens");
    }
    // Generation stops at the end of the context; the prompt itself (and its first new
    // token) must fit.
    args.model.plan(&config, 1, prompt.len() + 1, &format!("the prompt ({} tokens)", prompt.len()))?;
    let generator = start(&args.model, text)?;
    let out = (&mut std::io::stdout().lock(), &mut std::io::stderr().lock());
    let options = server::Options { split_reasoning: args.chat, constraint, ..args.sampling.options() };
    let done = answer_with(&generator, prompt, options, out, &|| false)?.done;
    // The first generated token came from prefill; the rest from decode steps.
    let decode_steps = done.generated.saturating_sub(1);
    let info = generator.scheduler.info();
    eprintln!(
        "prompt tokens: {}, generated tokens: {}, prefill: {:.1} tok/s, decode: {:.1} tok/s{}, {}, weights loaded in {:.1} s ({}, {})",
        done.prompt_tokens,
        done.generated,
        done.prompt_tokens as f64 / done.prefill_seconds,
        if decode_steps > 0 { decode_steps as f64 / done.decode_seconds } else { 0.0 },
        draft_summary(&done, args.model.draft != Draft::Off),
        info.load.compile,
        info.load.load_seconds,
        args.model.device,
        args.model.precision(),
    );
    Ok(())
}

/// The speculative decoding part of a summary line (empty without `--draft`): draft tokens
/// accepted of those checked, and tokens per model call after the first token.
pub(crate) fn draft_summary(done: &Finished, draft: bool) -> String {
    if !draft {
        return String::new();
    }
    let after_first = done.generated.saturating_sub(1);
    let per_call = if done.decode_calls > 0 { after_first as f64 / done.decode_calls as f64 } else { 0.0 };
    let rate = if done.drafted > 0 { 100.0 * done.accepted as f64 / done.drafted as f64 } else { 0.0 };
    format!(", draft: {}/{} accepted ({rate:.0}%), {per_call:.2} tokens per call", done.accepted, done.drafted)
}

pub fn trajectory(args: &TrajectoryArgs) -> Result<()> {
    let dir = &args.model.model;
    let config = check_model_dir(dir)?;
    if args.steps == 0 {
        bail!("--steps must be at least 1");
    }
    let prompt = match (&args.prompt, &args.prompt_ids) {
        (_, Some(ids)) if ids.is_empty() => bail!("--prompt-ids is empty"),
        (_, Some(ids)) => ids.clone(),
        (Some(text), None) => Tokenizer::from_dir(dir)?.encode(text, true)?,
        (None, None) => bail!("one of --prompt or --prompt-ids is required"),
    };
    engine::check_tokens(&prompt, config.vocab)?;
    args.model.plan(
        &config,
        1,
        prompt.len() + args.steps - 1,
        &format!("{} prompt tokens + {} steps", prompt.len(), args.steps),
    )?;
    let mut engine = load(&args.model)?;
    let tokens = engine::gate::trajectory(&mut engine, &prompt, args.steps)?;
    let json = serde_json::json!({
        "prompt_ids": prompt,
        "token_ids": tokens,
        "device": args.model.device,
        "precision": args.model.precision().to_string(),
    });
    // Written next to the target and renamed, so a failure never leaves a partial file.
    let tmp = args.out.with_extension("json.partial");
    std::fs::write(&tmp, serde_json::to_string(&json)? + "\n").with_context(|| format!("writing {}", tmp.display()))?;
    std::fs::rename(&tmp, &args.out).with_context(|| format!("writing {}", args.out.display()))?;
    eprintln!("wrote {} ({} steps)", args.out.display(), tokens.len());
    Ok(())
}

#[derive(clap::Args, Debug)]
pub struct GateArgs {
    #[command(flatten)]
    pub(crate) model: ModelArgs,
    /// What to compare against: `f32` (the f32 path on the same device, run here) or a
    /// trajectory JSON (`mlx-iree trajectory` output, or a file with a `trajectories` list
    /// such as a fixture's expected.json or a model's oracle.json).
    #[arg(long, default_value = "f32")]
    reference: String,
    /// Steps per prompt.
    #[arg(long, default_value_t = 32)]
    steps: usize,
}

/// Prompts used when the reference is computed here: text when the model has a tokenizer,
/// else fixed id lists (taken modulo the vocabulary).
fn gate_prompts(dir: &Path, vocab: usize) -> Result<Vec<Vec<u32>>> {
    const TEXTS: [&str; 4] = [
        "The capital of France is",
        "Once upon a time, there was a",
        "def fibonacci(n):",
        "The three primary colors are",
    ];
    const IDS: [&[u32]; 3] = [&[17], &[1, 34, 201, 17, 88], &[1, 250, 3, 77, 128, 5, 199, 64, 12, 230, 41, 9]];
    if dir.join("tokenizer.json").exists() {
        let tok = Tokenizer::from_dir(dir)?;
        return TEXTS.iter().map(|t| Ok(tok.encode(t, true)?)).collect();
    }
    Ok(IDS.iter().map(|ids| ids.iter().map(|i| i % vocab as u32).collect()).collect())
}

/// Returns whether the gate passed (the caller turns a failure into exit status 1).
pub fn gate(args: &GateArgs) -> Result<bool> {
    use engine::gate::{self, MIN_AGREEMENT, Reference};
    let dir = &args.model.model;
    let config = check_model_dir(dir)?;
    if args.steps == 0 {
        bail!("--steps must be at least 1");
    }
    let from_file = args.reference != "f32";
    let mut references = if from_file {
        let text = std::fs::read_to_string(&args.reference)
            .with_context(|| format!("reading --reference {}", args.reference))?;
        let refs =
            gate::references_from_json(&text).map_err(|e| anyhow::anyhow!("--reference {}: {e}", args.reference))?;
        if let Some(short) = refs.iter().find(|r| r.token_ids.len() < args.steps) {
            bail!(
                "--reference {} has only {} steps, fewer than --steps {}",
                args.reference,
                short.token_ids.len(),
                args.steps
            );
        }
        refs
    } else {
        gate_prompts(dir, config.vocab)?.into_iter().map(|p| Reference { prompt_ids: p, token_ids: vec![] }).collect()
    };
    for r in &mut references {
        r.token_ids.truncate(args.steps);
        engine::check_tokens(r.prompt_ids.iter().chain(&r.token_ids), config.vocab)?;
    }
    let longest = references.iter().map(|r| r.prompt_ids.len()).max().unwrap_or(1);
    args.model.plan(
        &config,
        1,
        longest + args.steps,
        &format!("the longest prompt ({longest} tokens) + {} steps", args.steps),
    )?;
    if !from_file {
        // The reference is the f32 path with an f32 cache and i16 products, so `--kv-cache`
        // and `--activations` are gated too.
        let f32_args = ModelArgs {
            precision: Some(Precision::F32),
            kv_cache: KvElem::F32,
            activations: models::Activations::I16,
            ..args.model.clone()
        };
        let mut reference = load(&f32_args)?;
        for r in &mut references {
            r.token_ids = gate::trajectory(&mut reference, &r.prompt_ids, args.steps)?;
        }
    }
    let mut candidate = load(&args.model)?;
    let report = gate::check(&mut candidate, &references)?;

    println!(
        "gate: {} at {} on {} against {} ({} prompts x {} steps)",
        dir.display(),
        args.model.precision(),
        args.model.device,
        if from_file { args.reference.clone() } else { format!("f32 on {}", args.model.device) },
        references.len(),
        args.steps
    );
    for (i, p) in report.prompts.iter().enumerate() {
        let divergence = p.first_divergence.map(|d| format!(" (first divergence at step {d})")).unwrap_or_default();
        println!(
            "  prompt {} ({} tokens): token-exact {}/{}{divergence}, teacher-forced top-1 agreement {:.1}%",
            i + 1,
            p.prompt_len,
            p.exact_steps,
            p.steps,
            100.0 * p.agreement()
        );
    }
    let passed = report.passed();
    println!(
        "  overall: token-exact on every prompt: {}; teacher-forced top-1 agreement {:.1}% (threshold {:.0}%) -> {}",
        if report.all_exact() { "yes" } else { "no" },
        100.0 * report.agreement(),
        100.0 * MIN_AGREEMENT,
        if passed { "PASS" } else { "FAIL" }
    );
    Ok(passed)
}
