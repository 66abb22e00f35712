//! The one place where the text side meets the engine, for every front end (the HTTP
//! server here, and the binary's `generate` and `chat`): a model folder's tokenizer, chat
//! template and end-of-sequence ids beside the engine's [`Scheduler`] ([`Generator`]), a
//! request built from prompt ids and plain options ([`Options`]: the stop tokens, the
//! vocabulary limit and the sampler closure), and its token events turned back into text
//! ([`TextStream`]: streaming detokenizer, the reasoning parted from the answer where the
//! model's format marks it, and stop strings).

use crate::stop::StopMatcher;
use engine::EngineConfig;
use engine::scheduler::{Event, FinishReason, Finished, Generation, Request, Sampling, Scheduler};
use std::path::Path;
use std::sync::mpsc;
use text::channels::{Channel, ChannelDecoder, Harmony};
use text::chat::{ChatError, ChatTemplate, Message};
use text::sampler::{Sampler, SamplingError, SamplingParams, TokenLogprobs, logprobs};
use text::tokenizer::{Tokenizer, TokenizerError, eos_ids};

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
) -> Result<Vec<(&'static str, &'static str)>, GenerateError> {
    match effort {
        None => Ok(Vec::new()),
        Some(e) if !chat.reads("reasoning_effort") => Err(GenerateError::EffortUnread(e)),
        Some(e) => Ok(vec![("reasoning_effort", e.name())]),
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
}

impl ModelText {
    pub fn load(dir: &Path) -> Result<ModelText, TokenizerError> {
        let tokenizer = Tokenizer::from_dir(dir)?;
        let eos = eos_ids(dir, &tokenizer)?;
        let chat = ChatTemplate::from_dir(dir);
        let harmony = Harmony::of(&tokenizer);
        Ok(ModelText { tokenizer, chat, eos, harmony })
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
        }
    }
}

/// The engine's token choice for `params`: its argmax when that is all they ask (no logits
/// leave the device), else a [`Sampler`] closure (temperature, top-k, top-p, min-p,
/// penalties, logit bias, seeded).
pub fn sampling(params: SamplingParams) -> Result<Sampling, SamplingError> {
    chooser(params, None)
}

/// [`sampling`], and with `logprobs` (how many alternatives, where to send them) a closure
/// even for greedy requests, which sends each chosen token's [`TokenLogprobs`] (from the
/// logits as the engine gave them) before returning it.
fn chooser(
    params: SamplingParams,
    logprobs_to: Option<(usize, mpsc::Sender<TokenLogprobs>)>,
) -> Result<Sampling, SamplingError> {
    if params.is_plain_greedy() && logprobs_to.is_none() {
        params.check()?;
        return Ok(Sampling::Greedy);
    }
    let mut sampler = Sampler::new(params)?;
    Ok(Sampling::Custom(Box::new(move |logits: &[f32]| {
        let token = sampler.sample(logits)?;
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
            sampling: chooser(options.sampling.clone(), to)?,
        };
        Ok((request, from))
    }

    /// Submits `prompt` and returns its answer as a stream of text pieces.
    pub fn submit(&self, prompt: Vec<u32>, options: &Options) -> Result<TextStream, GenerateError> {
        let (request, logprobs) = self.request_with_logprobs(prompt, options)?;
        let generation = self.scheduler.submit(request)?;
        let decoder = match self.harmony {
            Some(h) if options.split_reasoning => ChannelDecoder::harmony(h),
            _ => ChannelDecoder::plain(),
        };
        let mut stream = TextStream::new(generation, options.stop.clone(), decoder);
        stream.logprobs = logprobs;
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
    /// The end, after the last text; asked again, the same.
    End(FinishReason),
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
    /// Answer text given out before the end, where the last piece was reasoning.
    held: Option<String>,
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
            held: None,
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
        if let Some(text) = self.held.take() {
            return Ok(Piece::Text(text));
        }
        if let Some(end) = self.end {
            return Ok(Piece::End(end));
        }
        let event = self.generation.next().await;
        self.piece(tokenizer, event)
    }

    /// The next piece, blocking this thread until the engine sends it.
    pub fn blocking_next(&mut self, tokenizer: &Tokenizer) -> Result<Piece, GenerateError> {
        if let Some(text) = self.held.take() {
            return Ok(Piece::Text(text));
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

    /// How the engine ended the generation, once it has said so (`None` before, and when a
    /// stop string ended the answer first).
    pub fn finished(&self) -> Option<&Finished> {
        self.finished.as_ref()
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
                let (out, stopped) = self.stop.push(&text);
                if stopped {
                    // Frees the slot now; nothing after the stop string is given out.
                    self.generation.cancel();
                    self.end = Some(FinishReason::Stop);
                }
                Ok(Piece::Text(out))
            }
            Some(Ok(Event::Done(done))) => {
                self.end = Some(done.reason);
                self.finished = Some(done);
                let (channel, text) = self.decoder.finish(tokenizer)?;
                let (reasoning, text) =
                    if channel == Channel::Reasoning { (text, String::new()) } else { (String::new(), text) };
                let (mut out, stopped) = self.stop.push(&text);
                if stopped {
                    self.end = Some(FinishReason::Stop);
                } else {
                    out.push_str(&self.stop.finish());
                }
                if reasoning.is_empty() {
                    return Ok(Piece::Text(out));
                }
                // The answer text held for a stop string comes at the next call, before the end.
                self.held = Some(out);
                Ok(Piece::Reasoning(reasoning))
            }
            Some(Err(e)) => Err(e.into()),
            None => Err(engine::Error::Stopped.into()),
        }
    }
}
