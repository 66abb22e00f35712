//! The one place where the text side meets the engine, for every front end (the HTTP
//! server here, and the binary's `generate` and `chat`): a model folder's tokenizer, chat
//! template and end-of-sequence ids beside the engine's [`Scheduler`] ([`Generator`]), a
//! request built from prompt ids and plain options ([`Options`]: the stop tokens, the
//! vocabulary limit and the sampler closure), and its token events turned back into text
//! ([`TextStream`]: streaming detokenizer, the reasoning parted from the answer where the
//! model's format marks it, tool calls read apart where the request offered tools (between
//! marker tokens, or, in Llama 3's format without markers, an answer that is JSON, held to
//! its end), and stop strings).

use crate::stop::StopMatcher;
use engine::EngineConfig;
use engine::scheduler::{Event, FinishReason, Finished, Generation, Request, Sampling, Scheduler};
use serde_json::Value as Json;
use std::collections::VecDeque;
use std::path::Path;
use std::sync::{Arc, OnceLock, mpsc};
use text::channels::{Channel, ChannelDecoder, Harmony};
use text::chat::{Arg, ChatError, ChatTemplate, Message};
use text::constraint::{Constraint, ConstraintError, Grammars};
use text::sampler::{Sampler, SamplingError, SamplingParams, TokenLogprobs, logprobs};
use text::tokenizer::{Tokenizer, TokenizerError, eos_ids};
use text::tools::{ToolCall, ToolFormat, ToolMarkers};

/// Why a model could not be loaded.
#[derive(Debug, thiserror::Error)]
pub enum LoadError {
    #[error(transparent)]
    Tokenizer(#[from] TokenizerError),
    #[error(transparent)]
    Engine(#[from] engine::Error),
}

/// Why a generation could not be asked for or read.
#[derive(Debug, thiserror::Error)]
pub enum GenerateError {
    /// The sampling settings (refused before anything reaches the engine).
    #[error(transparent)]
    Sampling(#[from] SamplingError),
    #[error(transparent)]
    Engine(#[from] engine::Error),
    /// Detokenizing the generated ids.
    #[error(transparent)]
    Tokenizer(#[from] TokenizerError),
    /// Rendering a chat prompt.
    #[error(transparent)]
    Chat(#[from] ChatError),
    /// A chat prompt for a model folder without a usable chat template (why, as text).
    #[error("{0}")]
    NoChatTemplate(String),
    /// A reasoning effort for a chat template that does not read one.
    #[error("this model's chat template does not read reasoning_effort (got `{}`)", .0.name())]
    EffortUnread(ReasoningEffort),
    /// Tools offered to a model whose tool calls cannot be read (why, as text).
    #[error("{0}")]
    NoToolCalls(String),
    /// A grammar that could not be made for this model (why, as text), or followed.
    #[error(transparent)]
    Constraint(#[from] ConstraintError),
    /// Generating past the end of sequence under a grammar, which ends there.
    #[error("ignore_eos cannot be combined with structured output or a forced tool call (the grammar ends the answer)")]
    EosUnderGrammar,
}

/// How long a reasoning model thinks before it answers: the `reasoning_effort` a chat
/// template reads (gpt-oss's), as the OpenAI API and `--reasoning-effort` name it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReasoningEffort {
    Low,
    Medium,
    High,
}

impl ReasoningEffort {
    pub const ALL: [ReasoningEffort; 3] = [ReasoningEffort::Low, ReasoningEffort::Medium, ReasoningEffort::High];

    pub fn name(self) -> &'static str {
        match self {
            ReasoningEffort::Low => "low",
            ReasoningEffort::Medium => "medium",
            ReasoningEffort::High => "high",
        }
    }

    /// `low`, `medium` or `high`.
    pub fn parse(s: &str) -> Option<ReasoningEffort> {
        ReasoningEffort::ALL.into_iter().find(|e| e.name() == s)
    }
}

/// The variables a chat prompt passes to `chat`'s template besides the messages: the
/// reasoning effort, which only a template that reads it takes.
pub fn template_vars(
    chat: &ChatTemplate,
    effort: Option<ReasoningEffort>,
) -> Result<Vec<(&'static str, Arg)>, GenerateError> {
    match effort {
        None => Ok(Vec::new()),
        Some(e) if !chat.reads("reasoning_effort") => Err(GenerateError::EffortUnread(e)),
        Some(e) => Ok(vec![("reasoning_effort", Arg::str(e.name()))]),
    }
}

/// How a model writes tool calls: its format and, in the plain formats, the marker tokens.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ToolSyntax {
    pub format: ToolFormat,
    pub markers: Option<ToolMarkers>,
}

impl ToolSyntax {
    /// The syntax of a model with this template and tokenizer, decided once at load: the
    /// template must take `tools` and write calls in a format we read, whose markers are
    /// tokens of the vocabulary; else why not.
    fn of(chat: &Result<ChatTemplate, ChatError>, tokenizer: &Tokenizer, harmony: bool) -> Result<ToolSyntax, String> {
        let chat = chat.as_ref().map_err(|e| format!("this model has no chat template ({e})"))?;
        if !chat.reads("tools") {
            return Err("this model's chat template does not take tools".into());
        }
        let format = ToolFormat::detect(chat.source(), harmony)
            .ok_or("this model's chat template writes tool calls in a format mlx-iree does not read")?;
        Ok(ToolSyntax { format, markers: format.markers(tokenizer)? })
    }
}

/// A model folder's text side, read before the engine loads (so a folder without a
/// tokenizer fails before anything is compiled).
#[derive(Debug)]
pub struct ModelText {
    pub tokenizer: Tokenizer,
    /// The chat template, or why the folder has none.
    pub chat: Result<ChatTemplate, ChatError>,
    pub eos: Vec<u32>,
    /// The harmony format's tokens, where the vocabulary has them (gpt-oss): chat answers
    /// then come as reasoning and answer apart ([`Options::split_reasoning`]).
    pub harmony: Option<Harmony>,
    /// How the model writes tool calls, or why they cannot be read.
    pub tool_syntax: Result<ToolSyntax, String>,
    /// The grammar compiler of the vocabulary, made at the first constrained request.
    grammars: OnceLock<Result<Grammars, String>>,
}

impl ModelText {
    pub fn load(dir: &Path) -> Result<ModelText, TokenizerError> {
        let tokenizer = Tokenizer::from_dir(dir)?;
        let eos = eos_ids(dir, &tokenizer)?;
        let chat = ChatTemplate::from_dir(dir);
        let harmony = Harmony::of(&tokenizer);
        let tool_syntax = ToolSyntax::of(&chat, &tokenizer, harmony.is_some());
        Ok(ModelText { tokenizer, chat, eos, harmony, tool_syntax, grammars: OnceLock::new() })
    }

    /// `text` as prompt ids (with the tokenizer's special tokens, as mlx-lm encodes a prompt).
    pub fn encode(&self, text: &str) -> Result<Vec<u32>, TokenizerError> {
        self.tokenizer.encode(text, true)
    }

    /// `messages` rendered with the chat template (and a generation prompt) as prompt ids.
    pub fn encode_chat(
        &self,
        messages: &[Message],
        effort: Option<ReasoningEffort>,
    ) -> Result<Vec<u32>, GenerateError> {
        let chat = self.chat_template()?;
        Ok(chat.encode_with(&self.tokenizer, messages, &template_vars(chat, effort)?)?)
    }

    /// The grammar compiler of this model's vocabulary (a trie of every token's bytes, made at
    /// first use); a grammar's end is the first end-of-sequence id.
    pub fn grammars(&self) -> Result<&Grammars, GenerateError> {
        let made = self.grammars.get_or_init(|| {
            let eos =
                self.eos.first().ok_or("this model declares no end-of-sequence token, which a grammar ends with")?;
            Grammars::new(&self.tokenizer, *eos).map_err(|e| e.to_string())
        });
        made.as_ref().map_err(|why| GenerateError::Constraint(ConstraintError::Follow(why.clone())))
    }

    /// Answers valid against a JSON `schema` ([`Grammars::json_schema`]).
    pub fn json_schema(&self, schema: &Json) -> Result<Constraint, GenerateError> {
        Ok(self.grammars()?.json_schema(schema)?)
    }

    /// The chat template, or why the folder has none.
    pub fn chat_template(&self) -> Result<&ChatTemplate, GenerateError> {
        self.chat.as_ref().map_err(|e| GenerateError::NoChatTemplate(e.to_string()))
    }
}

/// How one answer is generated: plain values a front end fills from its flags or request
/// body.
#[derive(Debug, Clone)]
pub struct Options {
    /// Most tokens to generate.
    pub max_tokens: usize,
    /// Temperature, top-k, top-p, min-p, penalties, logit bias and seed; temperature 0 with
    /// nothing adjusted is greedy (the device's argmax).
    pub sampling: SamplingParams,
    /// Strings that end the answer; the text from the first one on is never given out.
    pub stop: Vec<String>,
    /// Go on past the model's end-of-sequence ids.
    pub ignore_eos: bool,
    /// Each generated token's log-probability and those of this many most likely tokens
    /// ([`TextStream::take_logprobs`]); `None`: none (the logits may stay on the device).
    pub logprobs: Option<usize>,
    /// Give the model's reasoning apart from its answer ([`Piece::Reasoning`]), for an answer
    /// to a chat prompt of a model whose format marks it ([`ModelText::harmony`]); else every
    /// token's text is answer text, special tokens left out.
    pub split_reasoning: bool,
    /// The tool definitions the prompt offered (OpenAI's `tools`): the model's calls then
    /// come apart as [`Piece::ToolCalls`], read by its [`ModelText::tool_syntax`].
    pub tools: Option<Arc<Vec<Json>>>,
    /// A grammar the answer must follow (structured output, a forced tool call): each
    /// step's logits masked to the tokens it allows; each answer follows its own copy.
    pub constraint: Option<Constraint>,
}

impl Options {
    /// Greedy, up to `max_tokens`, ending at end of sequence.
    pub fn greedy(max_tokens: usize) -> Options {
        Options {
            max_tokens,
            sampling: SamplingParams::default(),
            stop: Vec::new(),
            ignore_eos: false,
            logprobs: None,
            split_reasoning: false,
            tools: None,
            constraint: None,
        }
    }
}

/// The engine's token choice for `params`: its argmax when that is all they ask (no logits
/// leave the device), else a [`Sampler`] closure (temperature, top-k, top-p, min-p,
/// penalties, logit bias, seeded).
pub fn sampling(params: SamplingParams) -> Result<Sampling, SamplingError> {
    chooser(params, None, None)
}

/// [`sampling`], and with `logprobs` (how many alternatives, where to send them) or a
/// `constraint` a closure even for greedy requests: it masks the logits to what the grammar
/// allows before choosing (and moves the grammar on past the choice), and sends each chosen
/// token's [`TokenLogprobs`] (from the logits as the engine gave them) before returning it.
fn chooser(
    params: SamplingParams,
    logprobs_to: Option<(usize, mpsc::Sender<TokenLogprobs>)>,
    mut constraint: Option<Constraint>,
) -> Result<Sampling, SamplingError> {
    if params.is_plain_greedy() && logprobs_to.is_none() && constraint.is_none() {
        params.check()?;
        return Ok(Sampling::Greedy);
    }
    let mut sampler = Sampler::new(params)?;
    Ok(Sampling::Custom(Box::new(move |logits: &[f32]| {
        let token = match &mut constraint {
            None => sampler.sample(logits)?,
            Some(grammar) => {
                let mut allowed = logits.to_vec();
                grammar.mask(&mut allowed)?;
                let token = sampler.sample(&allowed)?;
                grammar.accept(token)?;
                token
            }
        };
        if let Some((top, to)) = &logprobs_to {
            // The reader may have gone (a cancelled stream); the token still stands.
            let _ = to.send(logprobs(logits, token, *top)?);
        }
        Ok(token)
    })))
}

/// A loaded model: the engine thread and the text side around it.
#[derive(Debug)]
pub struct Generator {
    pub scheduler: Scheduler,
    /// The text side: tokenizer, chat template (or why the folder has none: then chat
    /// prompts are refused), end-of-sequence ids; its fields and `encode`/`encode_chat` are
    /// the generator's own (`Deref`).
    pub text: ModelText,
}

impl std::ops::Deref for Generator {
    type Target = ModelText;

    fn deref(&self) -> &ModelText {
        &self.text
    }
}

impl Generator {
    /// Reads the text side (so a folder without a tokenizer fails before any compile), then
    /// starts the engine, compiling or loading every graph.
    pub fn load(dir: &Path, config: EngineConfig) -> Result<Generator, LoadError> {
        let text = ModelText::load(dir)?;
        Ok(Generator::start(dir, config, text)?)
    }

    /// Starts the engine for `dir` beside its text side, read already (a caller that needed
    /// the tokenizer before loading, to check a prompt's length).
    pub fn start(dir: &Path, config: EngineConfig, text: ModelText) -> Result<Generator, engine::Error> {
        if let Err(e) = &text.chat {
            tracing::warn!("no chat template ({e}): chat prompts will be refused");
        }
        let scheduler = Scheduler::start(dir, config)?;
        Ok(Generator { scheduler, text })
    }

    /// The engine request for `prompt` under `options`: the model's end-of-sequence ids as
    /// stop tokens (unless ignored), ids past the tokenizer's vocabulary never chosen
    /// (embedding tables padded past it decode to nothing), the sampler closure.
    pub fn request(&self, prompt: Vec<u32>, options: &Options) -> Result<Request, GenerateError> {
        Ok(self.request_with_logprobs(prompt, options)?.0)
    }

    /// [`Generator::request`], and where the chooser sends the logprobs `options` asks for.
    fn request_with_logprobs(
        &self,
        prompt: Vec<u32>,
        options: &Options,
    ) -> Result<(Request, Option<mpsc::Receiver<TokenLogprobs>>), GenerateError> {
        let vocab = self.tokenizer.vocab_size();
        options.sampling.check_vocab(vocab)?;
        if options.ignore_eos && options.constraint.is_some() {
            return Err(GenerateError::EosUnderGrammar);
        }
        let (to, from) = match options.logprobs {
            Some(top) => {
                let (to, from) = mpsc::channel();
                (Some((top, to)), Some(from))
            }
            None => (None, None),
        };
        let request = Request {
            prompt,
            max_tokens: options.max_tokens,
            stop_tokens: if options.ignore_eos { Vec::new() } else { self.eos.clone() },
            vocab_limit: Some(vocab),
            sampling: chooser(options.sampling.clone(), to, options.constraint.clone())?,
        };
        Ok((request, from))
    }

    /// Submits `prompt` and returns its answer as a stream of text pieces.
    pub fn submit(&self, prompt: Vec<u32>, options: &Options) -> Result<TextStream, GenerateError> {
        let tools = match &options.tools {
            None => None,
            Some(tools) => {
                let syntax = self.tool_syntax.clone().map_err(GenerateError::NoToolCalls)?;
                Some((syntax, Arc::clone(tools)))
            }
        };
        let (request, logprobs) = self.request_with_logprobs(prompt, options)?;
        let generation = self.scheduler.submit(request)?;
        let mut decoder = match self.harmony {
            Some(h) if options.split_reasoning || tools.is_some() => ChannelDecoder::harmony(h),
            _ => ChannelDecoder::plain(),
        };
        if let Some((syntax, _)) = &tools {
            decoder = decoder.tool_calls(syntax.markers);
        }
        let mut stream = TextStream::new(generation, options.stop.clone(), decoder);
        stream.logprobs = logprobs;
        if tools.as_ref().is_some_and(|(syntax, _)| syntax.format == ToolFormat::Llama3Json) {
            stream.bare = Bare::Undecided(String::new());
        }
        stream.tools = tools.map(|(syntax, tools)| (syntax.format, tools));
        Ok(stream)
    }
}

/// One piece of an answer.
#[derive(Debug, Clone, PartialEq)]
pub enum Piece {
    /// Text to give out now (possibly empty: bytes held for a character or a stop string).
    Text(String),
    /// Reasoning text to give out now ([`Options::split_reasoning`]): never empty, and not
    /// searched for stop strings (they end the answer).
    Reasoning(String),
    /// Calls the model made to the tools the request offered ([`Options::tools`]), each given
    /// once it is whole; never empty. (A call that does not parse comes as its text.)
    ToolCalls(Vec<ToolCall>),
    /// The end, after the last text; asked again, the same.
    End(FinishReason),
}

/// An answer's text in a tool-call format without markers (Llama 3's, where an answer that
/// is JSON is the call).
#[derive(Debug)]
enum Bare {
    /// Given out as it comes (no such format, or the answer did not start with `{`).
    Passing,
    /// Only whitespace so far, held.
    Undecided(String),
    /// Started with `{`: held to the end, then read as calls.
    Holding(String),
}

/// A generation's token events as text: detokenized as a stream (by channel), the answer
/// cut at the first stop string (which cancels the generation, freeing its slot at once).
/// Dropping it cancels the generation.
#[derive(Debug)]
pub struct TextStream {
    generation: Generation,
    decoder: ChannelDecoder,
    stop: StopMatcher,
    /// Set once the end is known (a stop string, or `Done`); given out after the last text.
    end: Option<FinishReason>,
    /// Pieces to give out before reading on (the last text at the end, after the reasoning
    /// or the calls it held).
    held: VecDeque<Piece>,
    /// The model's tool-call format and the request's tools, where it offered some.
    tools: Option<(ToolFormat, Arc<Vec<Json>>)>,
    /// Whether a tool call was given out.
    called: bool,
    /// Where the answer's text stands in a tool-call format without markers.
    bare: Bare,
    finished: Option<Finished>,
    generated: usize,
    /// Where the chooser sends each token's logprobs, when asked for.
    logprobs: Option<mpsc::Receiver<TokenLogprobs>>,
    /// Logprobs of the tokens read and not yet taken.
    pending: Vec<TokenLogprobs>,
}

impl TextStream {
    pub fn new(generation: Generation, stops: Vec<String>, decoder: ChannelDecoder) -> TextStream {
        TextStream {
            generation,
            decoder,
            stop: StopMatcher::new(stops),
            end: None,
            held: VecDeque::new(),
            tools: None,
            called: false,
            bare: Bare::Passing,
            finished: None,
            generated: 0,
            logprobs: None,
            pending: Vec::new(),
        }
    }

    /// The logprobs of the tokens read since the last call, in order (empty unless
    /// [`Options::logprobs`] asked for them): every generated token's, the one that completed
    /// a stop string included.
    pub fn take_logprobs(&mut self) -> Vec<TokenLogprobs> {
        std::mem::take(&mut self.pending)
    }

    /// The next piece, waiting for the engine (from async code).
    pub async fn next(&mut self, tokenizer: &Tokenizer) -> Result<Piece, GenerateError> {
        if let Some(piece) = self.held.pop_front() {
            return Ok(piece);
        }
        if let Some(end) = self.end {
            return Ok(Piece::End(end));
        }
        let event = self.generation.next().await;
        self.piece(tokenizer, event)
    }

    /// The next piece, blocking this thread until the engine sends it.
    pub fn blocking_next(&mut self, tokenizer: &Tokenizer) -> Result<Piece, GenerateError> {
        if let Some(piece) = self.held.pop_front() {
            return Ok(piece);
        }
        if let Some(end) = self.end {
            return Ok(Piece::End(end));
        }
        let event = self.generation.blocking_next();
        self.piece(tokenizer, event)
    }

    /// Asks the engine to stop: it frees the slot at its next step and the stream ends with
    /// `Cancelled` (tokens already on their way still come first).
    pub fn cancel(&self) {
        self.generation.cancel();
    }

    /// Tokens generated so far (stop tokens not counted).
    pub fn generated(&self) -> usize {
        self.generated
    }

    /// Whether the answer made a tool call ([`Piece::ToolCalls`]) so far.
    pub fn called(&self) -> bool {
        self.called
    }

    /// A tool call's text as calls, where it parses; else (a call cut short or malformed) as
    /// answer text, the format's markers around it, so nothing the model wrote is lost.
    fn calls(&mut self, text: String) -> Piece {
        let Some((format, tools)) = &self.tools else { return Piece::Text(text) };
        match format.parse(&text, tools) {
            Ok(calls) if !calls.is_empty() => {
                self.called = true;
                Piece::ToolCalls(calls)
            }
            Ok(_) => Piece::Text(String::new()),
            Err(why) => {
                tracing::warn!("a tool call that does not parse ({why}), given as text");
                let (start, end) = format.marker_texts().unwrap_or_default();
                Piece::Text(format!("{start}{text}{}", end.unwrap_or_default()))
            }
        }
    }

    /// How the engine ended the generation, once it has said so (`None` before, and when a
    /// stop string ended the answer first).
    pub fn finished(&self) -> Option<&Finished> {
        self.finished.as_ref()
    }

    /// Answer text as it comes: through the stop strings, unless the model's tool calls have
    /// no markers (Llama 3's), where an answer that starts with `{` is held to the end.
    fn content(&mut self, text: String) -> Piece {
        match &mut self.bare {
            Bare::Passing => self.answer_text(&text),
            Bare::Holding(held) => {
                held.push_str(&text);
                Piece::Text(String::new())
            }
            Bare::Undecided(held) => {
                held.push_str(&text);
                match held.trim_start().chars().next() {
                    None => Piece::Text(String::new()),
                    Some('{') => {
                        self.bare = Bare::Holding(std::mem::take(held));
                        Piece::Text(String::new())
                    }
                    Some(_) => {
                        let held = std::mem::take(held);
                        self.bare = Bare::Passing;
                        self.answer_text(&held)
                    }
                }
            }
        }
    }

    /// Answer text through the stop strings: what can be given out now (a stop string
    /// cancels the generation, freeing its slot at once).
    fn answer_text(&mut self, text: &str) -> Piece {
        let (out, stopped) = self.stop.push(text);
        if stopped {
            // Nothing after the stop string is given out.
            self.generation.cancel();
            self.end = Some(FinishReason::Stop);
        }
        Piece::Text(out)
    }

    fn piece(&mut self, tokenizer: &Tokenizer, event: Option<engine::Result<Event>>) -> Result<Piece, GenerateError> {
        match event {
            Some(Ok(Event::Token(token))) => {
                self.generated += 1;
                // The chooser sent this token's logprobs before the engine sent the token.
                if let Some(entry) = self.logprobs.as_ref().and_then(|from| from.try_recv().ok()) {
                    self.pending.push(entry);
                }
                let (channel, text) = self.decoder.push(tokenizer, token)?;
                if channel == Channel::Reasoning && !text.is_empty() {
                    return Ok(Piece::Reasoning(text));
                }
                if channel == Channel::Tool {
                    if text.is_empty() {
                        return Ok(Piece::Text(text));
                    }
                    match self.calls(text) {
                        Piece::Text(text) => return Ok(self.answer_text(&text)),
                        calls => return Ok(calls),
                    }
                }
                Ok(self.content(text))
            }
            Some(Ok(Event::Done(done))) => {
                self.end = Some(done.reason);
                self.finished = Some(done);
                let (channel, text) = self.decoder.finish(tokenizer)?;
                let (last, text) = match channel {
                    Channel::Reasoning if !text.is_empty() => (Some(Piece::Reasoning(text)), String::new()),
                    Channel::Tool if !text.is_empty() => match self.calls(text) {
                        Piece::Text(text) => (None, text),
                        calls => (Some(calls), String::new()),
                    },
                    _ => (None, text),
                };
                // An answer held as a possible call in a format without markers: calls, or
                // its text after all.
                let (last, text) = match std::mem::replace(&mut self.bare, Bare::Passing) {
                    Bare::Holding(held) | Bare::Undecided(held) if last.is_none() => {
                        let held = held + &text;
                        match held.trim_start().starts_with('{') {
                            true => match self.calls(held) {
                                Piece::Text(text) => (None, text),
                                calls => (Some(calls), String::new()),
                            },
                            false => (None, held),
                        }
                    }
                    bare => {
                        self.bare = bare;
                        (last, text)
                    }
                };
                let (mut out, stopped) = self.stop.push(&text);
                if stopped {
                    self.end = Some(FinishReason::Stop);
                } else {
                    out.push_str(&self.stop.finish());
                }
                // The answer text held for a stop string comes after the reasoning or calls,
                // before the end.
                self.held.push_back(Piece::Text(out));
                Ok(last.unwrap_or_else(|| self.held.pop_front().unwrap_or(Piece::Text(String::new()))))
            }
            Some(Err(e)) => Err(e.into()),
            None => Err(engine::Error::Stopped.into()),
        }
    }
}
