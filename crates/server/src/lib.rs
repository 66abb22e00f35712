//! `mlx-iree serve`: an OpenAI-compatible HTTP server (axum) over the engine's
//! [`engine::scheduler::Scheduler`]. It only translates: a request becomes prompt ids, sampling settings and
//! stop strings, is submitted to the scheduler (which batches every running request into
//! one decode step), and the token events come back as a JSON body or server-sent events.
//! Routes: POST `/v1/completions`, POST `/v1/chat/completions`, GET `/v1/models`,
//! POST `/tokenize`, POST `/detokenize`, GET `/health`, GET `/metrics`. The text-to-engine
//! glue it shares with the binary's `generate` and `chat` is [`generator`].

pub mod api;
mod error;
pub mod generator;
mod metrics;
pub mod stop;

use crate::api::ToolUse;
pub use crate::error::ApiError;
pub use crate::generator::{
    GenerateError, Generator, LoadError, ModelText, Options, Piece, ReasoningEffort, TextStream, template_vars,
};
use crate::metrics::Metrics;
use axum::Router;
use axum::body::{Body, Bytes};
use axum::extract::rejection::BytesRejection;
use axum::extract::{DefaultBodyLimit, State};
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use engine::scheduler::FinishReason;
use serde_json::{Value, json};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};
use text::channels::Channel;
use text::sampler::TokenLogprobs;
use text::tokenizer::Tokenizer;
use text::tools::ToolCall;

/// Settings of the HTTP side.
#[derive(Debug, Clone)]
pub struct ServerConfig {
    /// The id `/v1/models` lists and requests must name (or leave out).
    pub model_id: String,
    /// When set, `/v1/*` needs `Authorization: Bearer KEY`.
    pub api_key: Option<String>,
    /// Requests that may wait for a slot beyond the running ones; more get 429. It is the
    /// scheduler's queue limit ([`Scheduler::set_queue_limit`], set by [`Server::new`]),
    /// which `submit` enforces.
    pub queue_limit: usize,
    pub max_body_bytes: usize,
    /// After SIGTERM or Ctrl-C, how long requests in flight may take to finish.
    pub shutdown_timeout: Duration,
}

impl ServerConfig {
    /// Defaults: no key, 64 queued requests, 1 MiB bodies, 30 s to drain.
    pub fn new(model_id: impl Into<String>) -> ServerConfig {
        ServerConfig {
            model_id: model_id.into(),
            api_key: None,
            queue_limit: 64,
            max_body_bytes: 1 << 20,
            shutdown_timeout: Duration::from_secs(30),
        }
    }
}

/// The server's shared state.
#[derive(Debug)]
struct Inner {
    model: Arc<Generator>,
    config: ServerConfig,
    metrics: Metrics,
    in_flight: AtomicUsize,
    draining: AtomicBool,
    next_id: AtomicU64,
    started: u64,
}

/// One server: its router and its shutdown.
#[derive(Debug, Clone)]
pub struct Server(Arc<Inner>);

/// Which endpoint a generation came through.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Endpoint {
    Completions,
    Chat,
}

impl Endpoint {
    fn path(self) -> &'static str {
        match self {
            Endpoint::Completions => "/v1/completions",
            Endpoint::Chat => "/v1/chat/completions",
        }
    }
}

fn unix_now() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs())
}

impl Server {
    /// A server for `model`, whose scheduler takes `config.queue_limit` as its queue limit.
    pub fn new(model: Arc<Generator>, config: ServerConfig) -> Server {
        model.scheduler.set_queue_limit(Some(config.queue_limit));
        Server(Arc::new(Inner {
            model,
            config,
            metrics: Metrics::default(),
            in_flight: AtomicUsize::new(0),
            draining: AtomicBool::new(false),
            next_id: AtomicU64::new(0),
            started: unix_now(),
        }))
    }

    pub fn router(&self) -> Router {
        Router::new()
            .route("/v1/completions", post(completions))
            .route("/v1/chat/completions", post(chat))
            .route("/v1/models", get(models))
            .route("/tokenize", post(tokenize))
            .route("/detokenize", post(detokenize))
            .route("/health", get(health))
            .route("/metrics", get(metrics))
            .fallback(|| async { ApiError::status(StatusCode::NOT_FOUND, "no such endpoint") })
            .method_not_allowed_fallback(|| async {
                ApiError::status(StatusCode::METHOD_NOT_ALLOWED, "method not allowed on this endpoint")
            })
            .layer(DefaultBodyLimit::max(self.0.config.max_body_bytes))
            .with_state(self.clone())
    }

    /// Serves on `listener` until `shutdown` completes, then stops accepting, lets the
    /// requests in flight finish (at most the configured timeout) and returns.
    pub async fn run(
        &self,
        listener: tokio::net::TcpListener,
        shutdown: impl Future<Output = ()> + Send + 'static,
    ) -> std::io::Result<()> {
        let stopping = Arc::new(tokio::sync::Notify::new());
        let (notify, inner) = (Arc::clone(&stopping), Arc::clone(&self.0));
        let serve = axum::serve(listener, self.router()).with_graceful_shutdown(async move {
            shutdown.await;
            inner.draining.store(true, Ordering::Relaxed);
            tracing::info!("shutting down: {} requests in flight", inner.in_flight.load(Ordering::Relaxed));
            notify.notify_one();
        });
        let timeout = self.0.config.shutdown_timeout;
        tokio::select! {
            served = serve => served,
            () = async { stopping.notified().await; tokio::time::sleep(timeout).await } => {
                tracing::warn!(
                    "shutdown: {} requests still in flight after {} s, abandoned",
                    self.0.in_flight.load(Ordering::Relaxed),
                    timeout.as_secs()
                );
                Ok(())
            }
        }
    }

    fn authorize(&self, headers: &HeaderMap) -> Result<(), ApiError> {
        let Some(key) = &self.0.config.api_key else { return Ok(()) };
        let given =
            headers.get(header::AUTHORIZATION).and_then(|v| v.to_str().ok()).and_then(|v| v.strip_prefix("Bearer "));
        // Compared in time independent of where they differ.
        let same = given.is_some_and(|g| {
            g.len() == key.len() && g.bytes().zip(key.bytes()).fold(0u8, |acc, (a, b)| acc | (a ^ b)) == 0
        });
        if same {
            Ok(())
        } else {
            Err(ApiError::status(StatusCode::UNAUTHORIZED, "missing or wrong API key (send Authorization: Bearer KEY)"))
        }
    }

    /// Counts a submitted request among those being answered (for `/metrics` and the
    /// shutdown line) until its answer is written. The limit is the scheduler's: `submit`
    /// refuses a request beyond it ([`engine::Error::QueueFull`], a 429).
    fn enter(&self) -> InFlight {
        self.0.in_flight.fetch_add(1, Ordering::AcqRel);
        InFlight(Arc::clone(&self.0))
    }

    /// Everything up to the engine: parse, check, tokenize, admit, submit.
    fn start(
        &self,
        endpoint: Endpoint,
        headers: &HeaderMap,
        body: Result<Bytes, BytesRejection>,
        arrived: Instant,
    ) -> Result<Job, ApiError> {
        self.authorize(headers)?;
        if self.0.draining.load(Ordering::Relaxed) {
            return Err(ApiError::status(StatusCode::SERVICE_UNAVAILABLE, "the server is shutting down"));
        }
        let bytes = self.body(body)?;
        let model = &self.0.model;
        let Asked { prompt, common, logprobs, tools, constraint } = self.prompt(endpoint, &bytes)?;
        if let Some(name) = &common.model
            && *name != self.0.config.model_id
        {
            return Err(ApiError {
                status: StatusCode::NOT_FOUND,
                message: format!("the model `{name}` does not exist (this server has `{}`)", self.0.config.model_id),
                param: Some("model".to_owned()),
            });
        }
        common.check_n()?;
        if prompt.is_empty() {
            return Err(ApiError::field("prompt", "the prompt encodes to no tokens"));
        }
        let info = model.scheduler.info();
        let max_tokens = common.max_tokens(prompt.len(), info.max_context)?;
        let seed = self.0.next_id.load(Ordering::Relaxed)
            ^ SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_nanos() as u64);
        let options = Options {
            max_tokens,
            sampling: common.sampling(seed, model.tokenizer.vocab_size())?,
            stop: common.stops()?,
            ignore_eos: common.ignore_eos,
            logprobs,
            // A chat answer's reasoning goes apart (`reasoning`), where the model marks it.
            split_reasoning: endpoint == Endpoint::Chat,
            tools,
            constraint,
        };
        let prompt_tokens = prompt.len();
        // Choice i draws with seed + i: the first is the answer of the same request with n 1.
        let choices = (0..common.n())
            .map(|index| {
                let mut options = options.clone();
                options.sampling.seed = options.sampling.seed.wrapping_add(index as u64);
                Ok(Choice { index, reader: model.submit(prompt.clone(), &options)?, text_offset: 0, calls: 0 })
            })
            .collect::<Result<Vec<_>, ApiError>>()?;
        let in_flight = self.enter();
        let n = self.0.next_id.fetch_add(1, Ordering::Relaxed);
        let id = match endpoint {
            Endpoint::Completions => format!("cmpl-{}-{n}", self.0.started),
            Endpoint::Chat => format!("chatcmpl-{}-{n}", self.0.started),
        };
        let info = JobInfo {
            server: self.clone(),
            endpoint,
            id,
            created: unix_now(),
            prompt_tokens,
            wants_logprobs: logprobs.is_some(),
            arrived,
            first: AtomicBool::new(false),
        };
        Ok(Job {
            info: Arc::new(info),
            stream: common.stream,
            include_usage: common.include_usage(),
            choices,
            _in_flight: in_flight,
        })
    }

    /// The request's prompt ids (its text tokenized, or a chat rendered through the model's
    /// template with its tools), its common fields, its logprobs setting and its tools, each
    /// checked.
    fn prompt(&self, endpoint: Endpoint, bytes: &Bytes) -> Result<Asked, ApiError> {
        let model = &self.0.model;
        Ok(match endpoint {
            Endpoint::Completions => {
                let body = api::parse_completion(bytes)?;
                let logprobs = body.logprobs()?;
                let prompt = match body.prompt.single()? {
                    Ok(text) => {
                        model.tokenizer.encode(&text, true).map_err(|e| ApiError::field("prompt", e.to_string()))?
                    }
                    Err(ids) => ids,
                };
                Asked { prompt, common: body.common, logprobs, tools: None, constraint: None }
            }
            Endpoint::Chat => {
                let body = api::parse_chat(bytes)?;
                let logprobs = body.logprobs()?;
                let chat = model
                    .chat
                    .as_ref()
                    .map_err(|_| ApiError::bad_request("this model has no chat template: use /v1/completions"))?;
                if body.messages.is_empty() {
                    return Err(ApiError::field("messages", "messages must not be empty"));
                }
                let messages = body
                    .messages
                    .iter()
                    .enumerate()
                    .map(|(i, m)| m.message(i))
                    .collect::<Result<Vec<_>, ApiError>>()?;
                // Passed to a template that reads it (gpt-oss's), refused for any other.
                let effort = match body.reasoning_effort.as_deref() {
                    None => None,
                    Some(s) => Some(ReasoningEffort::parse(s).ok_or_else(|| {
                        ApiError::field(
                            "reasoning_effort",
                            format!("reasoning_effort must be low, medium or high (got `{s}`)"),
                        )
                    })?),
                };
                let mut vars = template_vars(chat, effort)?;
                let structure = body.structure()?;
                let (tools, forced) = match body.tool_use()? {
                    ToolUse::None => (None, None),
                    ToolUse::Auto { template, definitions } => {
                        // Refused before rendering where the calls could not be read.
                        model.tool_syntax.as_ref().map_err(|why| ApiError::field("tools", why.clone()))?;
                        vars.push(("tools", template));
                        (Some(Arc::new(definitions)), None)
                    }
                    ToolUse::Forced { template, definitions, name } => {
                        let syntax = model.tool_syntax.as_ref().map_err(|why| ApiError::field("tools", why.clone()))?;
                        let harmony = model.harmony.map(|h| h.call_ids());
                        let grammar = syntax.format.forced_call(syntax.markers, harmony, &definitions, name.as_deref());
                        let grammar = grammar.ok_or_else(|| {
                            ApiError::field(
                                "tool_choice",
                                format!(
                                    "tool_choice `required` or a named function is not supported yet for this \
                                     model's tool-call format ({}); use auto",
                                    syntax.format.name()
                                ),
                            )
                        })?;
                        vars.push(("tools", template));
                        (Some(Arc::new(definitions)), Some(grammar))
                    }
                };
                let constraint = match (structure, forced) {
                    (Some(_), Some(_)) => {
                        return Err(ApiError::field(
                            "response_format",
                            "a response_format schema and a forced tool call cannot both hold: choose one",
                        ));
                    }
                    (Some(schema), None) => Some(model.json_schema(&schema).map_err(|e| match e {
                        GenerateError::Constraint(text::constraint::ConstraintError::Grammar(why)) => {
                            ApiError::field("response_format", format!("the schema cannot be used: {why}"))
                        }
                        e => e.into(),
                    })?),
                    (None, Some(grammar)) => {
                        Some(model.grammars()?.lark(&grammar).map_err(|e| ApiError::field("tools", format!("{e}")))?)
                    }
                    (None, None) => None,
                };
                let prompt = chat
                    .encode_with(&model.tokenizer, &messages, &vars)
                    .map_err(|e| ApiError::field("messages", e.to_string()))?;
                Asked { prompt, common: body.common, logprobs, tools, constraint }
            }
        })
    }

    /// The request's body, or the 413 (or other status) axum's limit gave it.
    fn body(&self, body: Result<Bytes, BytesRejection>) -> Result<Bytes, ApiError> {
        body.map_err(|rejection| match rejection.status() {
            StatusCode::PAYLOAD_TOO_LARGE => ApiError::status(
                StatusCode::PAYLOAD_TOO_LARGE,
                format!("request body over the limit of {} bytes", self.0.config.max_body_bytes),
            ),
            status => ApiError::status(status, rejection.body_text()),
        })
    }

    async fn generate(&self, endpoint: Endpoint, headers: HeaderMap, body: Result<Bytes, BytesRejection>) -> Response {
        let arrived = Instant::now();
        let response = match self.start(endpoint, &headers, body, arrived) {
            Ok(job) if job.stream => job.stream(),
            Ok(job) => job.complete().await.unwrap_or_else(IntoResponse::into_response),
            Err(e) => e.into_response(),
        };
        self.0.metrics.request(endpoint.path(), response.status().as_u16());
        response
    }
}

/// What a request asks, read and checked.
struct Asked {
    prompt: Vec<u32>,
    common: api::Common,
    logprobs: Option<usize>,
    /// The tool definitions offered, where the model's calls are to be read apart.
    tools: Option<Arc<Vec<Value>>>,
    /// The grammar the answer must follow (structured output, a forced tool call).
    constraint: Option<text::constraint::Constraint>,
}

/// A place among the requests being answered; given back when dropped.
#[derive(Debug)]
struct InFlight(Arc<Inner>);

impl Drop for InFlight {
    fn drop(&mut self) {
        self.0.in_flight.fetch_sub(1, Ordering::AcqRel);
    }
}

/// OpenAI's finish reason: `tool_calls` where the answer ended (by itself) after calling a
/// tool.
fn finish_reason(reason: FinishReason, called: bool) -> &'static str {
    match reason {
        FinishReason::Stop if called => "tool_calls",
        FinishReason::Stop => "stop",
        FinishReason::Length | FinishReason::ContextFull | FinishReason::Cancelled => "length",
    }
}

/// What every choice of a request shares.
struct JobInfo {
    server: Server,
    endpoint: Endpoint,
    id: String,
    created: u64,
    prompt_tokens: usize,
    /// Whether the request asked for logprobs.
    wants_logprobs: bool,
    arrived: Instant,
    /// Whether a first token has come (its time noted).
    first: AtomicBool,
}

/// One answer of a request (of `n`).
struct Choice {
    index: usize,
    reader: TextStream,
    /// Characters of the answer's tokens given out with logprobs so far (completions'
    /// `text_offset`).
    text_offset: usize,
    /// Tool calls given out so far (a streamed call's `index`).
    calls: usize,
}

/// A submitted request and how to answer it.
struct Job {
    info: Arc<JobInfo>,
    stream: bool,
    include_usage: bool,
    choices: Vec<Choice>,
    _in_flight: InFlight,
}

/// How a streamed choice ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Streamed {
    /// Its last chunk was sent.
    Done,
    /// It failed; the error was sent in place of the rest.
    Failed,
    /// The client went away.
    Gone,
}

fn frame(v: &Value) -> Result<Bytes, std::convert::Infallible> {
    Ok(Bytes::from(format!("data: {v}\n\n")))
}

impl JobInfo {
    /// OpenAI's usage: `cached` of the prompt tokens were read from a slot that held them
    /// (the prefix cache; the first answer's count).
    fn usage(&self, completion: usize, cached: usize) -> Value {
        json!({
            "prompt_tokens": self.prompt_tokens,
            "completion_tokens": completion,
            "total_tokens": self.prompt_tokens + completion,
            "prompt_tokens_details": {"cached_tokens": cached},
        })
    }

    fn envelope(&self, object: &str, choices: Value) -> Value {
        json!({
            "id": self.id,
            "object": object,
            "created": self.created,
            "model": self.server.0.config.model_id,
            "choices": choices,
        })
    }

    fn chunk_object(&self) -> &'static str {
        match self.endpoint {
            Endpoint::Chat => "chat.completion.chunk",
            Endpoint::Completions => "text_completion",
        }
    }
}

impl Choice {
    /// The next piece, noting the time to the request's first token.
    async fn piece(&mut self, info: &JobInfo) -> Result<Piece, ApiError> {
        let metrics = &info.server.0.metrics;
        let piece = self.reader.next(&info.server.0.model.tokenizer).await.map_err(ApiError::from);
        if self.reader.generated() > 0 && !info.first.swap(true, Ordering::Relaxed) {
            metrics.first_token(info.arrived.elapsed().as_secs_f64());
        }
        if let Ok(Piece::End(_)) | Err(_) = &piece {
            // The prompt was asked for once, whatever `n`.
            let prompt = if self.index == 0 { info.prompt_tokens } else { 0 };
            metrics.tokens(prompt, self.reader.generated());
        }
        piece
    }

    /// The logprobs of the tokens read since the last call, in the endpoint's format
    /// (`null` when not asked for or when there are none).
    fn logprobs(&mut self, info: &JobInfo) -> Value {
        let entries = self.reader.take_logprobs();
        if !info.wants_logprobs || entries.is_empty() {
            return Value::Null;
        }
        let tokenizer = &info.server.0.model.tokenizer;
        match info.endpoint {
            Endpoint::Chat => {
                let one = |token: u32, logprob: f32| {
                    let text = token_text(tokenizer, token);
                    json!({"token": text, "logprob": logprob, "bytes": text.as_bytes()})
                };
                let content: Vec<Value> = entries
                    .iter()
                    .map(|e| {
                        let mut entry = one(e.token, e.logprob);
                        entry["top_logprobs"] = e.top.iter().map(|&(token, logprob)| one(token, logprob)).collect();
                        entry
                    })
                    .collect();
                json!({"content": content, "refusal": null})
            }
            Endpoint::Completions => {
                let (mut tokens, mut logprobs, mut tops, mut offsets) = (vec![], vec![], vec![], vec![]);
                for TokenLogprobs { token, logprob, top } in &entries {
                    let text = token_text(tokenizer, *token);
                    offsets.push(self.text_offset);
                    self.text_offset += text.chars().count();
                    // The N most likely and, as OpenAI's legacy format has it, the chosen one.
                    let mut alternatives = serde_json::Map::new();
                    for &(id, lp) in top.iter().chain([(*token, *logprob)].iter()) {
                        alternatives.entry(token_text(tokenizer, id)).or_insert(json!(lp));
                    }
                    tops.push(Value::Object(alternatives));
                    tokens.push(text);
                    logprobs.push(*logprob);
                }
                json!({"tokens": tokens, "token_logprobs": logprobs, "top_logprobs": tops, "text_offset": offsets})
            }
        }
    }

    /// `calls` in OpenAI's shape (`arguments` as a string of JSON), numbered on from the
    /// calls given before (`index`, for streamed deltas), each with an id: the model's where
    /// it wrote one, else one unique to this server.
    fn tool_calls(&mut self, info: &JobInfo, calls: Vec<ToolCall>, streamed: bool) -> Vec<Value> {
        calls
            .into_iter()
            .map(|call| {
                let id = call.id.unwrap_or_else(|| format!("call-{}-{}-{}", info.id, self.index, self.calls));
                let arguments = Value::Object(call.arguments).to_string();
                let mut out =
                    json!({"id": id, "type": "function", "function": {"name": call.name, "arguments": arguments}});
                if streamed {
                    out["index"] = json!(self.calls);
                }
                self.calls += 1;
                out
            })
            .collect()
    }

    /// The whole answer, as its entry of `choices`.
    async fn complete(&mut self, info: &JobInfo) -> Result<Value, ApiError> {
        let (mut text, mut reasoning, mut calls) = (String::new(), String::new(), Vec::new());
        let reason = loop {
            match self.piece(info).await? {
                Piece::Text(t) => text.push_str(&t),
                Piece::Reasoning(t) => reasoning.push_str(&t),
                Piece::ToolCalls(c) => calls.extend(self.tool_calls(info, c, false)),
                Piece::End(reason) => break finish_reason(reason, self.reader.called()),
            }
        };
        let logprobs = self.logprobs(info);
        Ok(match info.endpoint {
            Endpoint::Completions => {
                json!({"index": self.index, "text": text, "logprobs": logprobs, "finish_reason": reason})
            }
            Endpoint::Chat => {
                let mut message = json!({"role": "assistant", "content": text});
                // Only for a model that gave reasoning apart (vLLM's and mlx-lm's field).
                if !reasoning.is_empty() {
                    message["reasoning"] = json!(reasoning);
                }
                if !calls.is_empty() {
                    // OpenAI's content of a turn that only called tools is null.
                    if text.is_empty() {
                        message["content"] = Value::Null;
                    }
                    message["tool_calls"] = Value::Array(calls);
                }
                json!({"index": self.index, "message": message, "logprobs": logprobs, "finish_reason": reason})
            }
        })
    }

    /// One SSE chunk of this answer, with the logprobs of the tokens read since the last; its
    /// text, of either channel, is a chat delta's `content` or `reasoning`.
    fn chunk(&mut self, info: &JobInfo, text: Option<(Channel, &str)>, reason: Option<&str>, first: bool) -> Value {
        let content = text.map(|(_, t)| t);
        let logprobs = if first { Value::Null } else { self.logprobs(info) };
        let choice = match info.endpoint {
            Endpoint::Completions => json!({
                "index": self.index, "text": content.unwrap_or(""), "logprobs": logprobs, "finish_reason": reason
            }),
            Endpoint::Chat => {
                let delta = match (first, text) {
                    (true, _) => json!({"role": "assistant", "content": ""}),
                    // (Tool calls come whole, through `calls_chunk`.)
                    (false, Some((Channel::Content | Channel::Tool, t))) => json!({"content": t}),
                    (false, Some((Channel::Reasoning, t))) => json!({"reasoning": t}),
                    (false, None) => json!({}),
                };
                json!({"index": self.index, "delta": delta, "logprobs": logprobs, "finish_reason": reason})
            }
        };
        info.envelope(info.chunk_object(), json!([choice]))
    }

    /// One SSE chunk of a chat answer with its tool calls, whole (as mlx-lm's server and
    /// llama.cpp's give them).
    fn calls_chunk(&mut self, info: &JobInfo, calls: Vec<ToolCall>) -> Value {
        let logprobs = self.logprobs(info);
        let delta = json!({"tool_calls": self.tool_calls(info, calls, true)});
        let choice = json!({"index": self.index, "delta": delta, "logprobs": logprobs, "finish_reason": null});
        info.envelope(info.chunk_object(), json!([choice]))
    }

    /// Prompt tokens this answer read from the prefix cache (once the engine said).
    fn cached(&self) -> usize {
        self.reader.finished().map_or(0, |f| f.cached_tokens)
    }

    /// Sends this answer's chunks to `tx`, the last with its finish reason; returns how it
    /// ended, the tokens generated and the prompt tokens read from the prefix cache.
    async fn stream(mut self, info: Arc<JobInfo>, tx: Sender) -> (Streamed, usize, usize) {
        if info.endpoint == Endpoint::Chat && tx.send(frame(&self.chunk(&info, None, None, true))).await.is_err() {
            return (Streamed::Gone, self.reader.generated(), 0);
        }
        let ended = loop {
            let (event, ended) = match self.piece(&info).await {
                Ok(Piece::Text(t)) if t.is_empty() => continue,
                Ok(Piece::Text(t)) => (self.chunk(&info, Some((Channel::Content, &t)), None, false), None),
                Ok(Piece::Reasoning(t)) => (self.chunk(&info, Some((Channel::Reasoning, &t)), None, false), None),
                Ok(Piece::ToolCalls(calls)) => (self.calls_chunk(&info, calls), None),
                Ok(Piece::End(reason)) => {
                    let reason = finish_reason(reason, self.reader.called());
                    (self.chunk(&info, None, Some(reason), false), Some(Streamed::Done))
                }
                Err(e) => {
                    tracing::warn!("stream {} failed: {e}", info.id);
                    (e.body(), Some(Streamed::Failed))
                }
            };
            if tx.send(frame(&event)).await.is_err() {
                tracing::debug!("client of {} went away", info.id);
                break Streamed::Gone;
            }
            if let Some(ended) = ended {
                break ended;
            }
        };
        (ended, self.reader.generated(), self.cached())
    }
}

type Sender = tokio::sync::mpsc::Sender<Result<Bytes, std::convert::Infallible>>;

impl Job {
    /// The whole answer as one JSON body.
    async fn complete(mut self) -> Result<Response, ApiError> {
        let info = &self.info;
        let mut choices = Vec::with_capacity(self.choices.len());
        for choice in &mut self.choices {
            choices.push(choice.complete(info).await?);
        }
        let object = match info.endpoint {
            Endpoint::Completions => "text_completion",
            Endpoint::Chat => "chat.completion",
        };
        let mut body = info.envelope(object, Value::Array(choices));
        let cached = self.choices.first().map_or(0, Choice::cached);
        body["usage"] = info.usage(self.choices.iter().map(|c| c.reader.generated()).sum(), cached);
        Ok(axum::Json(body).into_response())
    }

    /// The answer as server-sent events, ending in `data: [DONE]`: each choice's chunks as
    /// they come, then the usage. A client that goes away stops the writers at their next
    /// send, which drops the generations and frees the slots.
    fn stream(self) -> Response {
        let (tx, rx) = tokio::sync::mpsc::channel(16);
        let Job { info, include_usage, choices, _in_flight: in_flight, .. } = self;
        tokio::spawn(async move {
            // Counted among the requests being answered until the last frame is written.
            let _in_flight = in_flight;
            let writers: Vec<_> =
                choices.into_iter().map(|c| tokio::spawn(c.stream(Arc::clone(&info), tx.clone()))).collect();
            let (mut all_done, mut generated, mut cached) = (true, 0, None);
            for writer in writers {
                match writer.await {
                    Ok((Streamed::Gone, ..)) | Err(_) => return,
                    Ok((ended, n, c)) => {
                        all_done &= ended == Streamed::Done;
                        generated += n;
                        cached.get_or_insert(c);
                    }
                }
            }
            if all_done && include_usage {
                let mut usage = info.envelope(info.chunk_object(), json!([]));
                usage["usage"] = info.usage(generated, cached.unwrap_or(0));
                if tx.send(frame(&usage)).await.is_err() {
                    return;
                }
            }
            let _ = tx.send(Ok(Bytes::from_static(b"data: [DONE]\n\n"))).await;
        });
        let body = Body::from_stream(tokio_stream::wrappers::ReceiverStream::new(rx));
        ([(header::CONTENT_TYPE, "text/event-stream"), (header::CACHE_CONTROL, "no-cache")], body).into_response()
    }
}

async fn completions(
    State(server): State<Server>,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Response {
    server.generate(Endpoint::Completions, headers, body).await
}

async fn chat(State(server): State<Server>, headers: HeaderMap, body: Result<Bytes, BytesRejection>) -> Response {
    server.generate(Endpoint::Chat, headers, body).await
}

/// The model's entry: vLLM's `max_model_len` is the context length, the most positions
/// (prompt and answer) one request may take.
async fn models(State(server): State<Server>, headers: HeaderMap) -> Response {
    let response = match server.authorize(&headers) {
        Ok(()) => axum::Json(json!({
            "object": "list",
            "data": [{
                "id": server.0.config.model_id,
                "object": "model",
                "created": server.0.started,
                "owned_by": "mlx-iree",
                "max_model_len": server.0.model.scheduler.info().max_context,
            }],
        }))
        .into_response(),
        Err(e) => e.into_response(),
    };
    server.0.metrics.request("/v1/models", response.status().as_u16());
    response
}

/// One token's text: its own decoding, special tokens included (a token that is part of a
/// multi-byte character decodes to U+FFFD).
fn token_text(tokenizer: &Tokenizer, token: u32) -> String {
    tokenizer.decode(&[token], false).unwrap_or_default()
}

/// `POST /tokenize` (llama.cpp's shape): `{"content", "add_special"}` to `{"tokens"}`.
async fn tokenize(State(server): State<Server>, headers: HeaderMap, body: Result<Bytes, BytesRejection>) -> Response {
    let answer = || -> Result<Value, ApiError> {
        server.authorize(&headers)?;
        let body = api::parse_tokenize(&server.body(body)?)?;
        let tokens = server
            .0
            .model
            .tokenizer
            .encode(&body.content, body.add_special)
            .map_err(|e| ApiError::field("content", e.to_string()))?;
        Ok(json!({"tokens": tokens}))
    };
    let response = answer().map_or_else(IntoResponse::into_response, |v| axum::Json(v).into_response());
    server.0.metrics.request("/tokenize", response.status().as_u16());
    response
}

/// `POST /detokenize` (llama.cpp's shape): `{"tokens"}` to `{"content"}`, special tokens
/// included.
async fn detokenize(State(server): State<Server>, headers: HeaderMap, body: Result<Bytes, BytesRejection>) -> Response {
    let answer = || -> Result<Value, ApiError> {
        server.authorize(&headers)?;
        let body = api::parse_detokenize(&server.body(body)?)?;
        let tokenizer = &server.0.model.tokenizer;
        let vocab = tokenizer.vocab_size();
        if let Some(bad) = body.tokens.iter().find(|&&t| t as usize >= vocab) {
            return Err(ApiError::field(
                "tokens",
                format!("token id {bad} is outside the vocabulary of {vocab} tokens"),
            ));
        }
        let content = tokenizer.decode(&body.tokens, false).map_err(|e| ApiError::field("tokens", e.to_string()))?;
        Ok(json!({"content": content}))
    };
    let response = answer().map_or_else(IntoResponse::into_response, |v| axum::Json(v).into_response());
    server.0.metrics.request("/detokenize", response.status().as_u16());
    response
}

/// 200 while serving (the graphs are loaded before the server listens), 503 once draining.
async fn health(State(server): State<Server>) -> Response {
    if server.0.draining.load(Ordering::Relaxed) {
        (StatusCode::SERVICE_UNAVAILABLE, axum::Json(json!({"status": "draining"}))).into_response()
    } else {
        axum::Json(json!({"status": "ok"})).into_response()
    }
}

async fn metrics(State(server): State<Server>) -> Response {
    let inner = &server.0;
    let info = inner.model.scheduler.info();
    let text =
        inner.metrics.render(inner.model.scheduler.stats(), info.max_batch, inner.in_flight.load(Ordering::Relaxed));
    ([(header::CONTENT_TYPE, "text/plain; version=0.0.4")], text).into_response()
}
