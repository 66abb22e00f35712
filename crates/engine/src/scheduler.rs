//! The engine on a thread of its own, serving many callers at once: a queue of requests, a
//! KV slot per running sequence, and one loop that prefills up to one chunk of prompt tokens
//! and then decodes every running sequence's next token in one batched step (continuous batching,
//! as llama.cpp's server slots and mistral.rs's engine do). Callers hold plain types only: a
//! [`Request`] goes in, a [`Generation`] of [`Event`]s comes out; IREE handles (not `Send`)
//! never leave the thread. How many requests it holds at once (running plus queued) is its
//! queue limit ([`Scheduler::set_queue_limit`]), enforced by [`Scheduler::submit`]
//! ([`Error::QueueFull`], which a server answers with 429).
//!
//! The prefix cache ([`EngineConfig::prefix_cache`]): a finished sequence's tokens stay in
//! its slot, and a request goes to the free slot holding the longest start of its prompt,
//! prefilling only the rest: a chat's next turn, an agent's repeated system prompt. Where
//! nothing matches, the slot holding nothing or whose sequence ended longest ago is taken
//! (least recently used). The kept keys and values are those the earlier sequence wrote,
//! prompt rows by prefill and answer rows by decode, so a reused prefix may differ from a
//! fresh prefill of it by float rounding only.
//!
//! Speculative decoding ([`EngineConfig::draft`]): a decoding sequence's next row goes to
//! the model with draft tokens, all in one call ([`Engine::verify`]; every sequence's rows in
//! one call where the engine verifies several, [`Engine::verify_many`]): those
//! that followed the latest earlier occurrence of its last few tokens ([`ngram_draft`],
//! prompt lookup), or a draft model's greedy next tokens (`Draft::Model`, an engine of one
//! slot on this thread that keeps the sequence's start between drafts). The request's own chooser then picks from each row's logits in
//! turn, exactly as it would one step at a time, and the run stops at the first pick that
//! differs from the draft: every pick is sent, so the output is that of plain decoding
//! (token for token when greedy, and in distribution when sampled, as a draft that is one
//! token for sure is accepted with the probability the model gives it), and the slot keeps
//! the rows of the accepted drafts only (`Engine::truncate`; a model with recurrent layers
//! gets its state from before the call back and reads the accepted rows again).

use crate::{BoxError, Draft, Engine, EngineConfig, Error, LoadReport, Result, Step};
use models::ModelConfig;
use std::collections::VecDeque;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, mpsc};
use std::thread::JoinHandle;
use std::time::Instant;
use tokio::sync::mpsc as events;

/// A caller's token chooser: given a row's logits (ids at or above the request's
/// `vocab_limit` already `-inf`), the next id.
pub type Chooser = Box<dyn FnMut(&[f32]) -> Result<u32, BoxError> + Send>;

/// How a request's next token is chosen.
pub enum Sampling {
    /// The most likely token: the device's argmax, with no logits downloaded (unless that id
    /// is at or above the request's `vocab_limit`).
    Greedy,
    /// The caller's chooser (temperature, top-k, top-p, ...).
    Custom(Chooser),
}

impl std::fmt::Debug for Sampling {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Sampling::Greedy => "Greedy",
            Sampling::Custom(_) => "Custom(..)",
        })
    }
}

/// One generation asked of the engine.
#[derive(Debug)]
pub struct Request {
    /// Prompt token ids (chat template already applied).
    pub prompt: Vec<u32>,
    /// Most tokens to generate.
    pub max_tokens: usize,
    /// Ids that end the generation (end of sequence); they are not sent as tokens.
    pub stop_tokens: Vec<u32>,
    /// Ids at and above this are never chosen (embedding tables padded past the
    /// tokenizer's vocabulary decode to nothing). `None`: every id of the model.
    pub vocab_limit: Option<usize>,
    pub sampling: Sampling,
}

impl Request {
    /// Greedy generation of up to `max_tokens` after `prompt`, no stop tokens.
    pub fn greedy(prompt: Vec<u32>, max_tokens: usize) -> Request {
        Request { prompt, max_tokens, stop_tokens: Vec::new(), vocab_limit: None, sampling: Sampling::Greedy }
    }
}

/// What a generation sends, in order: tokens, then one `Done` (or an error).
#[derive(Debug, Clone, PartialEq)]
pub enum Event {
    Token(u32),
    Done(Finished),
}

/// Why a generation ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FinishReason {
    /// A stop token was chosen.
    Stop,
    /// `max_tokens` were generated.
    Length,
    /// The sequence filled the engine's maximum context.
    ContextFull,
    /// The caller cancelled it.
    Cancelled,
}

/// The end of a generation, with its counts and timings.
#[derive(Debug, Clone, PartialEq)]
pub struct Finished {
    pub reason: FinishReason,
    pub prompt_tokens: usize,
    /// Of them, tokens the slot held already from an earlier sequence (the prefix cache),
    /// not prefilled again.
    pub cached_tokens: usize,
    /// Tokens sent (stop tokens not counted).
    pub generated: usize,
    /// Seconds waiting for a free slot.
    pub queued_seconds: f64,
    /// Seconds from taking a slot to the first token (prefill, interleaved with the other
    /// sequences' decode steps).
    pub prefill_seconds: f64,
    /// Seconds from the first token to the last.
    pub decode_seconds: f64,
    /// Model calls after the first token (decode rows and verify calls): with speculative
    /// decoding fewer than the tokens after the first.
    pub decode_calls: usize,
    /// Draft tokens checked, and of them those accepted (speculative decoding).
    pub drafted: usize,
    pub accepted: usize,
}

/// What the engine loaded, for callers that must not touch it.
#[derive(Debug, Clone)]
pub struct EngineInfo {
    pub model: ModelConfig,
    pub max_batch: usize,
    pub max_context: usize,
    /// What the load did (compile, load time, device bytes).
    pub load: LoadReport,
}

/// Durations counted per bucket, lock-free: written by one thread, read by others (the
/// scheduler's decode steps, a server's time to first token).
#[derive(Debug)]
pub struct Histogram {
    /// Upper bounds in seconds, ascending.
    bounds: &'static [f64],
    /// Per bucket (not cumulative); the last counts values above the last bound.
    counts: Vec<AtomicU64>,
    sum_micros: AtomicU64,
}

impl Histogram {
    pub fn new(bounds: &'static [f64]) -> Histogram {
        Histogram {
            bounds,
            counts: (0..=bounds.len()).map(|_| AtomicU64::new(0)).collect(),
            sum_micros: AtomicU64::new(0),
        }
    }

    pub fn observe(&self, seconds: f64) {
        let bucket = self.bounds.iter().position(|b| seconds <= *b).unwrap_or(self.bounds.len());
        self.counts[bucket].fetch_add(1, Ordering::Relaxed);
        self.sum_micros.fetch_add((seconds * 1e6) as u64, Ordering::Relaxed);
    }

    pub fn bounds(&self) -> &'static [f64] {
        self.bounds
    }

    /// Counts per bucket of [`Histogram::bounds`] (not cumulative; one more than the bounds,
    /// the last counting values above the last bound).
    pub fn counts(&self) -> Vec<u64> {
        self.counts.iter().map(|c| c.load(Ordering::Relaxed)).collect()
    }

    /// Values observed.
    pub fn count(&self) -> u64 {
        self.counts().iter().sum()
    }

    /// Their total, in seconds.
    pub fn sum_seconds(&self) -> f64 {
        self.sum_micros.load(Ordering::Relaxed) as f64 * 1e-6
    }
}

/// The fewest prompt tokens worth copying from another slot (about one prefill chunk's
/// call; fewer are as soon read again).
const MIN_COPY: usize = 16;

/// Upper bounds, in seconds, of the decode-step duration histogram.
pub const STEP_BUCKETS: [f64; 10] = [0.005, 0.01, 0.02, 0.04, 0.08, 0.16, 0.32, 0.64, 1.28, 2.56];

/// Live counters of a scheduler, shared with its thread (for `/metrics` and admission).
#[derive(Debug)]
pub struct Stats {
    queued: AtomicUsize,
    running: AtomicUsize,
    /// Durations of the batched decode steps.
    steps: Histogram,
    /// Requests that found part of their prompt in a slot (the prefix cache).
    prefix_hits: AtomicU64,
    /// Prompt tokens those requests did not prefill again.
    cached_tokens: AtomicU64,
    /// Verify calls (speculative decoding), the draft tokens they checked and those accepted.
    verify_calls: AtomicU64,
    drafted: AtomicU64,
    accepted: AtomicU64,
}

impl Default for Stats {
    fn default() -> Self {
        Stats {
            queued: AtomicUsize::new(0),
            running: AtomicUsize::new(0),
            steps: Histogram::new(&STEP_BUCKETS),
            prefix_hits: AtomicU64::new(0),
            cached_tokens: AtomicU64::new(0),
            verify_calls: AtomicU64::new(0),
            drafted: AtomicU64::new(0),
            accepted: AtomicU64::new(0),
        }
    }
}

impl Stats {
    /// Requests waiting for a slot.
    pub fn queued(&self) -> usize {
        self.queued.load(Ordering::Relaxed)
    }

    /// Requests holding a slot.
    pub fn running(&self) -> usize {
        self.running.load(Ordering::Relaxed)
    }

    /// Durations of the decode steps run so far.
    pub fn steps(&self) -> &Histogram {
        &self.steps
    }

    /// Requests that found part of their prompt in a slot so far.
    pub fn prefix_hits(&self) -> u64 {
        self.prefix_hits.load(Ordering::Relaxed)
    }

    /// Prompt tokens read from slots instead of prefilled so far.
    pub fn cached_tokens(&self) -> u64 {
        self.cached_tokens.load(Ordering::Relaxed)
    }

    /// Verify calls so far (speculative decoding).
    pub fn verify_calls(&self) -> u64 {
        self.verify_calls.load(Ordering::Relaxed)
    }

    /// Draft tokens checked so far.
    pub fn drafted(&self) -> u64 {
        self.drafted.load(Ordering::Relaxed)
    }

    /// Draft tokens accepted so far.
    pub fn accepted(&self) -> u64 {
        self.accepted.load(Ordering::Relaxed)
    }
}

/// The caller's end of one request. Dropping it cancels the request (its slot is freed
/// at the engine's next step).
#[derive(Debug)]
pub struct Generation {
    events: events::UnboundedReceiver<Result<Event>>,
    cancel: Arc<AtomicBool>,
    ended: bool,
}

impl Generation {
    /// The next event, waiting for it; `None` after the last. From async code use
    /// [`Generation::next`] instead (this one blocks the thread).
    pub fn blocking_next(&mut self) -> Option<Result<Event>> {
        let got = if self.ended { None } else { self.events.blocking_recv() };
        self.after(got)
    }

    /// The next event; `None` after the last.
    pub async fn next(&mut self) -> Option<Result<Event>> {
        let got = if self.ended { None } else { self.events.recv().await };
        self.after(got)
    }

    /// Ends the stream after `Done` or an error; a channel closed before either means the
    /// engine thread is gone.
    fn after(&mut self, got: Option<Result<Event>>) -> Option<Result<Event>> {
        if self.ended {
            return None;
        }
        match got {
            Some(Ok(Event::Token(t))) => Some(Ok(Event::Token(t))),
            Some(end) => {
                self.ended = true;
                Some(end)
            }
            None => {
                self.ended = true;
                Some(Err(Error::Stopped))
            }
        }
    }

    /// Asks the engine to stop this generation: it frees the slot at its next step and
    /// ends the stream with `Done` (reason `Cancelled`).
    pub fn cancel(&self) {
        self.cancel.store(true, Ordering::Relaxed);
    }

    /// Reads every remaining event: the tokens and how it finished.
    pub fn collect_blocking(mut self) -> Result<(Vec<u32>, Finished)> {
        let mut tokens = Vec::new();
        while let Some(event) = self.blocking_next() {
            match event? {
                Event::Token(t) => tokens.push(t),
                Event::Done(done) => return Ok((tokens, done)),
            }
        }
        Err(Error::Stopped)
    }
}

impl Drop for Generation {
    fn drop(&mut self) {
        self.cancel();
    }
}

impl Iterator for Generation {
    type Item = Result<Event>;

    fn next(&mut self) -> Option<Self::Item> {
        self.blocking_next()
    }
}

/// A request on its way to the engine thread.
struct Pending {
    request: Request,
    events: events::UnboundedSender<Result<Event>>,
    cancel: Arc<AtomicBool>,
    submitted: Instant,
    /// Its place among the requests the scheduler holds, given back when it ends.
    place: Place,
}

/// One request's place in a scheduler's count of the requests it holds (running or queued),
/// against its queue limit. Given back once, by [`Place::release`] (before the request's
/// last event is sent, so a caller that reads it and submits again finds the place free)
/// or when dropped.
#[derive(Debug)]
struct Place(Option<Arc<AtomicUsize>>);

impl Place {
    fn release(&mut self) {
        if let Some(held) = self.0.take() {
            held.fetch_sub(1, Ordering::AcqRel);
        }
    }
}

impl Drop for Place {
    fn drop(&mut self) {
        self.release();
    }
}

impl Pending {
    fn cancelled(&self) -> bool {
        self.cancel.load(Ordering::Relaxed) || self.events.is_closed()
    }
}

/// The engine on its own thread; see the module docs. `Send + Sync`: share it (e.g. in an
/// `Arc`) between the threads or tasks that submit requests. Dropping it stops the thread:
/// generations still running end with [`Error::Stopped`].
#[derive(Debug)]
pub struct Scheduler {
    commands: Option<mpsc::Sender<Pending>>,
    stats: Arc<Stats>,
    thread: Option<JoinHandle<()>>,
    info: EngineInfo,
    /// Requests submitted and not yet ended (running or queued).
    held: Arc<AtomicUsize>,
    /// Most requests that may wait for a slot beyond the running ones (`usize::MAX`: no
    /// limit).
    queue_limit: AtomicUsize,
}

impl Scheduler {
    /// Starts the engine thread and loads the model there (compiling every shape, see
    /// [`Engine::load`]); returns once it is ready, or with the load's error.
    pub fn start(dir: impl Into<PathBuf>, config: EngineConfig) -> Result<Scheduler> {
        let dir = dir.into();
        let (commands, inbox) = mpsc::channel();
        let (ready, loaded) = mpsc::channel();
        let stats = Arc::new(Stats::default());
        let shared = Arc::clone(&stats);
        let thread = std::thread::Builder::new()
            .name("mlx-iree-engine".to_owned())
            .spawn(move || {
                let engine = match Engine::load(&dir, &config) {
                    Ok(engine) => engine,
                    Err(e) => {
                        let _ = ready.send(Err(e));
                        return;
                    }
                };
                let info = EngineInfo {
                    model: engine.config().clone(),
                    max_batch: engine.max_batch(),
                    max_context: engine.max_context(),
                    load: engine.load_report().clone(),
                };
                tracing::info!(
                    "engine ready: {} slots x {} positions, weights {} MiB, KV cache {} MiB",
                    info.max_batch,
                    info.max_context,
                    info.load.weight_bytes >> 20,
                    info.load.kv_bytes >> 20
                );
                let drafter = match &config.draft {
                    Draft::Model { dir, precision, .. } => {
                        let draft = EngineConfig {
                            max_batch: 1,
                            max_context: Some(info.max_context),
                            precision: *precision,
                            prefix_cache: false,
                            draft: Draft::Off,
                            // Whatever the draft's precision: its products keep i16.
                            activations: models::Activations::I16,
                            ..config.clone()
                        };
                        match Engine::load(dir, &draft) {
                            Ok(engine) => {
                                tracing::info!(
                                    "draft model ready: weights {} MiB, KV cache {} MiB",
                                    engine.load_report().weight_bytes >> 20,
                                    engine.load_report().kv_bytes >> 20
                                );
                                Some(Drafter { engine, held: Vec::new() })
                            }
                            Err(e) => {
                                let _ = ready.send(Err(e));
                                return;
                            }
                        }
                    }
                    Draft::Off | Draft::Ngram { .. } => None,
                };
                if ready.send(Ok(info)).is_ok() {
                    Loop::new(engine, inbox, shared, config.prefix_cache, config.draft.tokens(), drafter).run();
                }
            })
            .map_err(Error::Spawn)?;
        match loaded.recv() {
            Ok(Ok(info)) => Ok(Scheduler {
                commands: Some(commands),
                stats,
                thread: Some(thread),
                info,
                held: Arc::new(AtomicUsize::new(0)),
                queue_limit: AtomicUsize::new(usize::MAX),
            }),
            Ok(Err(e)) => {
                let _ = thread.join();
                Err(e)
            }
            Err(_) => Err(Error::Panicked(panic_message(thread.join()))),
        }
    }

    pub fn info(&self) -> &EngineInfo {
        &self.info
    }

    /// Queue depth, running requests and decode-step timings, live.
    pub fn stats(&self) -> &Stats {
        &self.stats
    }

    /// Sets how many requests may wait for a slot beyond the running ones (`None`, the
    /// default: no limit): [`Scheduler::submit`] refuses a request while `max_batch` plus
    /// that many are running or queued ([`Error::QueueFull`]). Requests already held stay.
    pub fn set_queue_limit(&self, queue: Option<usize>) {
        self.queue_limit.store(queue.unwrap_or(usize::MAX), Ordering::Relaxed);
    }

    /// The queue limit ([`Scheduler::set_queue_limit`]).
    pub fn queue_limit(&self) -> Option<usize> {
        Some(self.queue_limit.load(Ordering::Relaxed)).filter(|q| *q != usize::MAX)
    }

    /// Queues `request`; its events come through the returned [`Generation`]. Requests the
    /// engine can never run (empty prompt, ids out of range, a prompt longer than the
    /// context, `max_tokens` 0) are refused here, and so is any request while the scheduler
    /// holds as many as its queue limit lets it ([`Error::QueueFull`]).
    pub fn submit(&self, request: Request) -> Result<Generation> {
        self.check(&request)?;
        let commands = self.commands.as_ref().ok_or(Error::Stopped)?;
        let max = self.info.max_batch.saturating_add(self.queue_limit.load(Ordering::Relaxed));
        if self.held.fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| (n < max).then_some(n + 1)).is_err() {
            return Err(Error::QueueFull { max });
        }
        let place = Place(Some(Arc::clone(&self.held)));
        let (sender, events) = events::unbounded_channel();
        let cancel = Arc::new(AtomicBool::new(false));
        let pending =
            Pending { request, events: sender, cancel: Arc::clone(&cancel), submitted: Instant::now(), place };
        self.stats.queued.fetch_add(1, Ordering::Relaxed);
        if commands.send(pending).is_err() {
            self.stats.queued.fetch_sub(1, Ordering::Relaxed);
            return Err(Error::Stopped);
        }
        Ok(Generation { events, cancel, ended: false })
    }

    fn check(&self, request: &Request) -> Result<()> {
        if request.prompt.is_empty() {
            return Err(Error::EmptyPrompt);
        }
        if request.max_tokens == 0 {
            return Err(Error::ZeroMaxTokens);
        }
        crate::check_tokens(&request.prompt, self.info.model.vocab)?;
        // The prompt and the position of its first new token's successor must fit.
        if request.prompt.len() >= self.info.max_context {
            return Err(Error::PromptTooLong { prompt: request.prompt.len(), max: self.info.max_context });
        }
        Ok(())
    }
}

impl Drop for Scheduler {
    fn drop(&mut self) {
        // Closing the queue tells the loop to stop.
        self.commands.take();
        if let Some(thread) = self.thread.take()
            && let Err(panic) = thread.join()
        {
            tracing::error!("the engine thread panicked: {}", panic_message(Err(panic)));
        }
    }
}

fn panic_message(joined: std::thread::Result<()>) -> String {
    match joined {
        Ok(()) => "it stopped before the model was loaded".to_owned(),
        Err(panic) => panic
            .downcast_ref::<&str>()
            .map(|s| (*s).to_owned())
            .or_else(|| panic.downcast_ref::<String>().cloned())
            .unwrap_or_else(|| "(no message)".to_owned()),
    }
}

/// A request holding a slot.
struct Running {
    slot: usize,
    pending: Pending,
    /// Prompt tokens already in the slot.
    prefilled: usize,
    /// Of them, those the slot held from an earlier sequence when it was admitted.
    cached: usize,
    /// The tokens chosen so far (a stop token included): after the prompt, what the slot
    /// holds as the sequence goes on.
    chosen: Vec<u32>,
    /// The token to feed at the next decode step (`None` while prefilling).
    input: Option<u32>,
    generated: usize,
    admitted: Instant,
    first_token: Option<Instant>,
    /// Model calls after the first token, draft tokens checked and accepted.
    decode_calls: usize,
    drafted: usize,
    accepted: usize,
    /// Verify calls in a row that accepted no draft, and the decode steps to take without
    /// drafting before the next try ([`DRAFT_BACKOFF`]).
    draft_misses: u32,
    draft_pause: usize,
}

/// After a verify call that accepts no draft, a sequence decodes 2, 4, 8, then 16 steps
/// without drafts before it tries again (any accepted draft ends the back-off): a rejected
/// call costs more than a plain step (the 1B shape's random weights, whose answers copy
/// nothing from the prompt, decoded at 0.92x with drafts checked at every chance;
/// docs/PERFORMANCE.md).
const DRAFT_BACKOFF: u32 = 4;

impl Running {
    fn finished(&self, reason: FinishReason) -> Finished {
        let now = Instant::now();
        let first = self.first_token.unwrap_or(now);
        Finished {
            reason,
            prompt_tokens: self.pending.request.prompt.len(),
            cached_tokens: self.cached,
            generated: self.generated,
            queued_seconds: (self.admitted - self.pending.submitted).as_secs_f64(),
            prefill_seconds: (first - self.admitted).as_secs_f64(),
            decode_seconds: (now - first).as_secs_f64(),
            decode_calls: self.decode_calls,
            drafted: self.drafted,
            accepted: self.accepted,
        }
    }
}

/// The engine thread's state: the queue, the running sequences and the free slots.
struct Loop {
    engine: Engine,
    inbox: mpsc::Receiver<Pending>,
    queue: VecDeque<Pending>,
    /// In the order they were admitted (`waiting` relies on it).
    running: Vec<Running>,
    /// Free slots, lowest last.
    free: Vec<usize>,
    /// Whether finished sequences stay in their slots for later prompts that start with them.
    prefix_cache: bool,
    /// Per slot, the tokens whose keys and values (and state) it holds from a finished
    /// sequence, in order from position 0 (`None`: nothing reusable).
    held: Vec<Option<Vec<u32>>>,
    /// Per slot, when a sequence last ended in it (a count of ends), to give a request with
    /// nothing to reuse the slot whose tokens are least likely to be asked for again.
    ended: Vec<u64>,
    ends: u64,
    /// Most prompt tokens prefilled per loop turn (see [`prefills`]), so prompts do not stall
    /// the decode steps of the others for long.
    chunk: usize,
    /// Most draft tokens per verify call (0: no speculative decoding).
    draft_tokens: usize,
    /// The draft model, with `Draft::Model` (else drafts come from [`ngram_draft`]).
    drafter: Option<Drafter>,
    stats: Arc<Stats>,
}

/// A draft model on the engine thread: one slot, holding `held` (the start of the last
/// sequence it drafted for), so each draft feeds it only what that sequence added since.
struct Drafter {
    engine: Engine,
    held: Vec<u32>,
}

impl Drafter {
    /// The draft model's `k` greedy tokens after `history` (at least one token; its slot
    /// must have room for `history.len() + k - 1` positions). After a failed call, which may
    /// have written part of the slot, it forgets what the slot holds.
    fn propose(&mut self, history: &[u32], k: usize) -> Result<Vec<u32>> {
        let out = self.feed(history, k);
        if out.is_err() {
            self.engine.reset(0);
            self.held.clear();
        }
        out
    }

    fn feed(&mut self, history: &[u32], k: usize) -> Result<Vec<u32>> {
        // Keep what it holds of `history`, less the last token, fed again for its logits.
        let common = self.held.iter().zip(history).take_while(|(a, b)| a == b).count().min(history.len() - 1);
        self.engine.truncate(0, common)?;
        self.held.truncate(common);
        let mut next = self.engine.prefill(0, &history[common..])?.next;
        self.held.extend(&history[common..]);
        let mut out = vec![next];
        while out.len() < k {
            let step = self.engine.decode_one(0, next)?;
            self.held.push(next);
            next = step.next;
            out.push(next);
        }
        Ok(out)
    }
}

impl Loop {
    fn new(
        engine: Engine,
        inbox: mpsc::Receiver<Pending>,
        stats: Arc<Stats>,
        prefix_cache: bool,
        draft_tokens: usize,
        drafter: Option<Drafter>,
    ) -> Loop {
        let slots = engine.max_batch();
        let free = (0..slots).rev().collect();
        let chunk = engine.plan().chunks.iter().copied().max().unwrap_or(1);
        Loop {
            engine,
            inbox,
            queue: VecDeque::new(),
            running: Vec::new(),
            free,
            prefix_cache,
            held: vec![None; slots],
            ended: vec![0; slots],
            ends: 0,
            chunk,
            draft_tokens,
            drafter,
            stats,
        }
    }

    /// Publishes the queue and slot counts (queued counts from `submit` until admitted).
    fn publish(&self) {
        self.stats.running.store(self.running.len(), Ordering::Relaxed);
    }

    fn run(mut self) {
        loop {
            if self.running.is_empty() && self.queue.is_empty() {
                // Nothing to do: wait for a request (or for the scheduler to go).
                match self.inbox.recv() {
                    Ok(pending) => self.queue.push_back(pending),
                    Err(_) => return,
                }
            }
            loop {
                match self.inbox.try_recv() {
                    Ok(pending) => self.queue.push_back(pending),
                    Err(mpsc::TryRecvError::Empty) => break,
                    Err(mpsc::TryRecvError::Disconnected) => return self.stop(),
                }
            }
            self.reap();
            self.admit();
            self.publish();
            if self.engine.step_rows() == 0 {
                self.prefill();
                self.decode();
            } else {
                self.step();
            }
            self.publish();
        }
    }

    /// The scheduler is gone: everything still open ends with `Stopped`.
    fn stop(mut self) {
        self.stats.running.store(0, Ordering::Relaxed);
        self.stats.queued.store(0, Ordering::Relaxed);
        for mut pending in self.queue.drain(..) {
            pending.place.release();
            let _ = pending.events.send(Err(Error::Stopped));
        }
        for mut running in self.running.drain(..) {
            running.pending.place.release();
            let _ = running.pending.events.send(Err(Error::Stopped));
        }
    }

    /// Drops cancelled requests, queued or running.
    fn reap(&mut self) {
        self.queue.retain_mut(|p| {
            let cancelled = p.cancelled();
            if cancelled {
                p.place.release();
                let _ = p.events.send(Ok(Event::Done(Finished {
                    reason: FinishReason::Cancelled,
                    prompt_tokens: p.request.prompt.len(),
                    cached_tokens: 0,
                    generated: 0,
                    queued_seconds: p.submitted.elapsed().as_secs_f64(),
                    prefill_seconds: 0.0,
                    decode_seconds: 0.0,
                    decode_calls: 0,
                    drafted: 0,
                    accepted: 0,
                })));
            }
            if cancelled {
                self.stats.queued.fetch_sub(1, Ordering::Relaxed);
            }
            !cancelled
        });
        let mut i = 0;
        while i < self.running.len() {
            if self.running[i].pending.cancelled() {
                self.end(i, Ok(FinishReason::Cancelled));
            } else {
                i += 1;
            }
        }
    }

    /// How many of `prompt`'s first tokens a slot holding `held` may keep: their common
    /// prefix, less the prompt's last token (read again for its logits); for a model with
    /// recurrent layers all it holds or nothing (its state is that after the whole).
    fn reusable(&self, held: &[u32], prompt: &[u32]) -> usize {
        if !self.prefix_cache {
            return 0;
        }
        let common = held.iter().zip(prompt).take_while(|(a, b)| a == b).count().min(prompt.len() - 1);
        if self.engine.has_state() && common != held.len() { 0 } else { common }
    }

    /// The tokens every slot holds now, from position 0: a finished sequence's, or a running
    /// one's prompt and chosen tokens as far as they were read.
    fn contents(&self) -> Vec<(usize, Vec<u32>)> {
        let mut out: Vec<(usize, Vec<u32>)> =
            self.free.iter().filter_map(|&slot| Some((slot, self.held[slot].clone()?))).collect();
        for r in &self.running {
            let position = self.engine.position(r.slot);
            let tokens: Vec<u32> = r.pending.request.prompt.iter().chain(&r.chosen).copied().take(position).collect();
            out.push((r.slot, tokens));
        }
        out
    }

    /// Gives queued requests free slots, oldest first: each the free slot holding the most of
    /// its prompt's first tokens, else one holding nothing, else the one whose sequence ended
    /// longest ago, else the lowest. Where another slot (running or not) holds more of the
    /// prompt, by at least [`MIN_COPY`] tokens, that much is copied into the given slot; and
    /// a request whose prompt's start another sequence is still prefilling waits for it (the
    /// `n` answers of one request, conversations behind one system prompt), while later
    /// requests go ahead.
    fn admit(&mut self) {
        // Whether a prompt's start can come from another slot (the copies are compiled).
        let across = self.prefix_cache && self.engine.can_copy();
        let mut i = 0;
        while !self.free.is_empty() && i < self.queue.len() {
            let prompt = &self.queue[i].request.prompt;
            let Some((at, own)) = self
                .free
                .iter()
                .enumerate()
                .map(|(at, &slot)| (at, slot, self.held[slot].as_deref().map_or(0, |h| self.reusable(h, prompt))))
                .max_by_key(|&(_, slot, reuse)| {
                    (reuse, self.held[slot].is_none(), std::cmp::Reverse(self.ended[slot]), std::cmp::Reverse(slot))
                })
                .map(|(at, _, reuse)| (at, reuse))
            else {
                break;
            };
            let contents = if across { self.contents() } else { Vec::new() };
            let (source, shared) = contents
                .iter()
                .map(|(slot, held)| (*slot, self.reusable(held, prompt)))
                .max_by_key(|&(slot, reuse)| (reuse, std::cmp::Reverse(slot)))
                .unwrap_or((0, 0));
            let have = own.max(shared);
            let coming = across
                && !self.engine.has_state()
                && self.running.iter().any(|r| {
                    let common = r.pending.request.prompt.iter().zip(prompt).take_while(|(a, b)| a == b).count();
                    r.input.is_none() && common.min(prompt.len() - 1) >= have + MIN_COPY
                });
            if coming {
                i += 1;
                continue;
            }
            let Some(pending) = self.queue.remove(i) else { break };
            let slot = self.free.remove(at);
            self.stats.queued.fetch_sub(1, Ordering::Relaxed);
            self.held[slot] = None;
            let mut reuse = own;
            if shared >= own + MIN_COPY && source != slot {
                match self.engine.copy(source, slot, shared) {
                    Ok(()) => reuse = shared,
                    Err(e) => tracing::warn!("copying {shared} positions of slot {source} to {slot}: {e}"),
                }
            }
            // A prompt start it cannot keep (a recurrent state: `reusable` keeps all or none)
            // is read again.
            if reuse == own
                && reuse > 0
                && let Err(e) = self.engine.truncate(slot, reuse)
            {
                tracing::warn!("keeping {reuse} positions of slot {slot}: {e}");
                reuse = 0;
            }
            if reuse > 0 {
                self.stats.prefix_hits.fetch_add(1, Ordering::Relaxed);
                self.stats.cached_tokens.fetch_add(reuse as u64, Ordering::Relaxed);
            } else {
                self.engine.reset(slot);
            }
            tracing::debug!("slot {slot}: {} prompt tokens, {reuse} of them held", pending.request.prompt.len());
            self.running.push(Running {
                slot,
                pending,
                prefilled: reuse,
                cached: reuse,
                chosen: Vec::new(),
                input: None,
                generated: 0,
                admitted: Instant::now(),
                first_token: None,
                decode_calls: 0,
                drafted: 0,
                accepted: 0,
                draft_misses: 0,
                draft_pause: 0,
            });
        }
    }

    /// The sequences still reading their prompts, as (slot, prompt tokens left), oldest first.
    fn waiting(&self) -> Vec<(usize, usize)> {
        debug_assert!(
            self.running.windows(2).all(|w| w[0].admitted <= w[1].admitted),
            "running sequences out of the order they were admitted in"
        );
        self.running
            .iter()
            .filter(|r| r.input.is_none())
            .map(|r| (r.slot, r.pending.request.prompt.len() - r.prefilled))
            .collect()
    }

    /// This turn's prompt tokens, oldest prompt first ([`prefills`]).
    fn prefill(&mut self) {
        for (slot, tokens) in prefills(&self.waiting(), self.chunk) {
            // `advance` and `end` may remove sequences: find this one by its slot.
            let Some(i) = self.running.iter().position(|r| r.slot == slot) else { continue };
            let r = &self.running[i];
            let (start, len) = (r.prefilled, r.pending.request.prompt.len());
            match self.engine.prefill(r.slot, &r.pending.request.prompt[start..start + tokens]) {
                Ok(step) => {
                    self.running[i].prefilled = start + tokens;
                    if start + tokens == len {
                        self.advance(i, &step);
                    }
                }
                Err(e) => self.end(i, Err(e)),
            }
        }
    }

    /// One call for every sequence's new tokens, where the engine has mixed calls: each
    /// decoding sequence's row and this turn's prompt tokens ([`prefills`], within what is
    /// left of the call's rows), so prompts that arrive together are read in one call, not
    /// one each, and the decode rows ride along instead of waiting for them.
    fn step(&mut self) {
        let decoding = self.running.iter().filter(|r| r.input.is_some()).count();
        let chunks = prefills(&self.waiting(), self.engine.step_rows().saturating_sub(decoding));
        if chunks.is_empty() {
            return self.decode();
        }
        // (slot, tokens, prompt tokens read by this call: 0 for a decode row).
        let mut rows: Vec<(usize, Vec<u32>, usize)> =
            self.running.iter().filter_map(|r| Some((r.slot, vec![r.input?], 0))).collect();
        for (slot, take) in chunks {
            let Some(r) = self.running.iter().find(|r| r.slot == slot) else { continue };
            let start = r.prefilled;
            rows.push((slot, r.pending.request.prompt[start..start + take].to_vec(), take));
        }
        let batch: Vec<(usize, &[u32])> = rows.iter().map(|(slot, tokens, _)| (*slot, tokens.as_slice())).collect();
        let started = Instant::now();
        let result = self.engine.step(&batch);
        self.stats.steps.observe(started.elapsed().as_secs_f64());
        match result {
            Ok(steps) => {
                // `advance` may remove a sequence, so match steps to sequences by slot.
                for ((slot, _, read), step) in rows.iter().zip(steps) {
                    let Some(i) = self.running.iter().position(|r| r.slot == *slot) else { continue };
                    let r = &mut self.running[i];
                    r.prefilled += read;
                    if *read == 0 {
                        // A decode row riding beside the prompts: one of its decode calls.
                        r.decode_calls += 1;
                    }
                    if *read == 0 || r.prefilled == r.pending.request.prompt.len() {
                        self.advance(i, &step);
                    }
                }
            }
            Err(e) => {
                tracing::error!("step of {} sequences failed: {e}", rows.len());
                let n = rows.iter().map(|(_, t, _)| t.len()).sum();
                self.fail(rows.iter().map(|(slot, _, _)| *slot), n, &e);
            }
        }
    }

    /// One decode step for every sequence past its prompt; a verify call instead where they
    /// have draft tokens: one sequence's where it decodes alone ([`Loop::speculate`]), every
    /// sequence's at once where the engine verifies several in one call
    /// ([`Loop::speculate_many`]; prompt-lookup drafts: a draft model holds one sequence).
    fn decode(&mut self) {
        let rows: Vec<(usize, u32)> = self.running.iter().filter_map(|r| Some((r.slot, r.input?))).collect();
        if rows.is_empty() {
            return;
        }
        if let [(slot, input)] = rows[..]
            && self.speculate(slot, input)
        {
            return;
        }
        if rows.len() > 1 && self.drafter.is_none() && self.speculate_many(&rows) {
            return;
        }
        for r in self.running.iter_mut().filter(|r| r.input.is_some()) {
            r.decode_calls += 1;
        }
        let started = Instant::now();
        let result = self.engine.decode(&rows);
        self.stats.steps.observe(started.elapsed().as_secs_f64());
        match result {
            Ok(steps) => {
                // `advance` may remove a sequence, so match steps to sequences by slot.
                for ((slot, _), step) in rows.iter().zip(steps) {
                    if let Some(i) = self.running.iter().position(|r| r.slot == *slot) {
                        self.advance(i, &step);
                    }
                }
            }
            Err(e) => {
                tracing::error!("decode step of {} rows failed: {e}", rows.len());
                self.fail(rows.iter().map(|(slot, _)| *slot), rows.len(), &e);
            }
        }
    }

    /// At most `most` draft tokens for the sequence in `slot` this step ([`ngram_draft`], or
    /// the draft model's): none while it backs off after rejected drafts, where its slot has
    /// no room for a verify call, or where the request may generate no more after the next
    /// token.
    fn draft_for(&mut self, slot: usize, most: usize) -> Vec<u32> {
        let Some(i) = self.running.iter().position(|r| r.slot == slot) else { return Vec::new() };
        if self.running[i].draft_pause > 0 {
            self.running[i].draft_pause -= 1;
            return Vec::new();
        }
        let room = self.engine.verify_rows(slot);
        let r = &self.running[i];
        // Never draft past what the request may still generate.
        let left = r.pending.request.max_tokens.saturating_sub(r.generated + 1);
        let want = most.min(room.saturating_sub(1)).min(left);
        if want == 0 {
            return Vec::new();
        }
        let history: Vec<u32> = r.pending.request.prompt.iter().chain(&r.chosen).copied().collect();
        match &mut self.drafter {
            None => ngram_draft(&history, want),
            Some(drafter) => drafter.propose(&history, want).unwrap_or_else(|e| {
                tracing::warn!("the draft model failed, decoding without drafts this step: {e}");
                Vec::new()
            }),
        }
    }

    /// One verify call for the sequence in `slot`, whose next row is `input`, with its draft
    /// tokens ([`Loop::draft_for`]); false (nothing done) where it has none.
    fn speculate(&mut self, slot: usize, input: u32) -> bool {
        let draft = self.draft_for(slot, self.draft_tokens);
        if draft.is_empty() {
            return false;
        }
        let start = self.engine.position(slot);
        let fed: Vec<u32> = std::iter::once(input).chain(draft.iter().copied()).collect();
        let started = Instant::now();
        let result = self.engine.verify(slot, &fed);
        self.stats.steps.observe(started.elapsed().as_secs_f64());
        match result {
            Ok(steps) => {
                self.stats.verify_calls.fetch_add(1, Ordering::Relaxed);
                self.accept(slot, start, &draft, &steps);
            }
            Err(e) => {
                tracing::error!("verify call of {} rows failed: {e}", fed.len());
                self.fail([slot], fed.len(), &e);
            }
        }
        true
    }

    /// One call for every decoding sequence (`rows`: slot and next row), each with its draft
    /// tokens where it has some ([`Engine::verify_many`]); false (nothing done) where the
    /// engine has no such call, its rows leave no room for drafts beside every sequence's
    /// row, or no sequence has drafts. The call has a verify call's rows, so it costs what
    /// one sequence's check does; the rows past the sequences' own go to the sequences'
    /// drafts in turn ([`share`]), so a sequence without drafts leaves its share to others.
    fn speculate_many(&mut self, rows: &[(usize, u32)]) -> bool {
        let spare = self.engine.verify_many_rows().saturating_sub(rows.len());
        if spare == 0 {
            return false;
        }
        let most = spare.min(self.draft_tokens);
        let mut drafts: Vec<Vec<u32>> = rows.iter().map(|&(slot, _)| self.draft_for(slot, most)).collect();
        let lens: Vec<usize> = drafts.iter().map(Vec::len).collect();
        for (draft, keep) in drafts.iter_mut().zip(share(&lens, spare)) {
            draft.truncate(keep);
        }
        if drafts.iter().all(Vec::is_empty) {
            return false;
        }
        let starts: Vec<usize> = rows.iter().map(|&(slot, _)| self.engine.position(slot)).collect();
        let fed: Vec<Vec<u32>> = rows
            .iter()
            .zip(&drafts)
            .map(|(&(_, input), draft)| std::iter::once(input).chain(draft.iter().copied()).collect())
            .collect();
        let batch: Vec<(usize, &[u32])> = rows.iter().zip(&fed).map(|(&(slot, _), f)| (slot, f.as_slice())).collect();
        let started = Instant::now();
        let result = self.engine.verify_many(&batch);
        self.stats.steps.observe(started.elapsed().as_secs_f64());
        let all = match result {
            Ok(all) => all,
            Err(e) => {
                let n = fed.iter().map(Vec::len).sum();
                tracing::error!("verify call of {} sequences ({n} rows) failed: {e}", rows.len());
                self.fail(rows.iter().map(|(slot, _)| *slot), n, &e);
                return true;
            }
        };
        self.stats.verify_calls.fetch_add(1, Ordering::Relaxed);
        for (((slot, _), draft), (start, steps)) in rows.iter().zip(&drafts).zip(starts.into_iter().zip(all)) {
            if !draft.is_empty() {
                self.accept(*slot, start, draft, &steps);
            } else if let Some(i) = self.running.iter().position(|r| r.slot == *slot) {
                // No drafts: its one row is a plain decode step.
                self.running[i].decode_calls += 1;
                self.advance(i, &steps[0]);
            }
        }
        true
    }

    /// What a verify call of the sequence in `slot` gives (`steps`: one per row fed at
    /// `start`, its next row then `draft`): the request's pick from each row in turn, up to
    /// the first that is not the draft's next token (or that ends the sequence), emitted; the
    /// slot cut back to the rows those picks keep.
    fn accept(&mut self, slot: usize, start: usize, draft: &[u32], steps: &[Step]) {
        let Some(i) = self.running.iter().position(|r| r.slot == slot) else { return };
        let r = &mut self.running[i];
        let limit = r.pending.request.vocab_limit.unwrap_or(usize::MAX);
        let mut picks = Vec::with_capacity(steps.len());
        for (j, step) in steps.iter().enumerate() {
            let token = match choose(&mut r.pending.request.sampling, limit, step) {
                Ok(token) => token,
                // The sequence ends here, failed: `end` resets its slot.
                Err(e) if picks.is_empty() => {
                    self.end(i, Err(e));
                    return;
                }
                // The picks so far go out; the next step meets the error again.
                Err(_) => break,
            };
            picks.push(token);
            if r.pending.request.stop_tokens.contains(&token) || draft.get(j) != Some(&token) {
                break;
            }
        }
        let accepted = picks.len() - 1;
        if accepted == 0 {
            r.draft_misses += 1;
            r.draft_pause = 1 << r.draft_misses.min(DRAFT_BACKOFF);
        } else {
            r.draft_misses = 0;
        }
        r.decode_calls += 1;
        r.drafted += draft.len();
        r.accepted += accepted;
        self.stats.drafted.fetch_add(draft.len() as u64, Ordering::Relaxed);
        self.stats.accepted.fetch_add(accepted as u64, Ordering::Relaxed);
        // The slot keeps the row fed and the accepted drafts; the last pick is the next row.
        if let Err(e) = self.engine.truncate(slot, start + 1 + accepted) {
            tracing::error!("going back to the {accepted} accepted drafts of slot {slot} failed: {e}");
            self.fail([slot], 1 + draft.len(), &e);
            return;
        }
        for (j, token) in picks.into_iter().enumerate() {
            let Some(i) = self.running.iter().position(|r| r.slot == slot) else { break };
            self.emit(i, token, start + 1 + j);
        }
    }

    /// Ends the sequences in `slots` (those still running) with the failure `e` of a call of
    /// `rows` rows.
    fn fail(&mut self, slots: impl IntoIterator<Item = usize>, rows: usize, e: &Error) {
        for slot in slots {
            if let Some(i) = self.running.iter().position(|r| r.slot == slot) {
                self.end(i, Err(Error::Step { rows, cause: e.to_string() }));
            }
        }
    }

    /// Chooses sequence `i`'s next token from `step`, sends it, and ends the sequence when
    /// it is done.
    fn advance(&mut self, i: usize, step: &Step) {
        let limit = self.running[i].pending.request.vocab_limit.unwrap_or(usize::MAX);
        let token = match choose(&mut self.running[i].pending.request.sampling, limit, step) {
            Ok(token) => token,
            Err(e) => return self.end(i, Err(e)),
        };
        let position = self.engine.position(self.running[i].slot);
        self.emit(i, token, position);
    }

    /// Sends sequence `i`'s next token `token`, chosen when its slot held `position`
    /// positions, and ends the sequence when it is done.
    fn emit(&mut self, i: usize, token: u32, position: usize) {
        let max_context = self.engine.max_context();
        let r = &mut self.running[i];
        let now = Instant::now();
        r.first_token.get_or_insert(now);
        r.chosen.push(token);
        if r.pending.request.stop_tokens.contains(&token) {
            return self.end(i, Ok(FinishReason::Stop));
        }
        r.generated += 1;
        if r.pending.events.send(Ok(Event::Token(token))).is_err() {
            return self.end(i, Ok(FinishReason::Cancelled));
        }
        if r.generated >= r.pending.request.max_tokens {
            self.end(i, Ok(FinishReason::Length))
        } else if position >= max_context {
            self.end(i, Ok(FinishReason::ContextFull))
        } else {
            r.input = Some(token);
        }
    }

    /// Ends sequence `i` with `Done(reason)` or an error, and frees its slot, which keeps the
    /// sequence's tokens for a later prompt that starts with them (with the prefix cache; not
    /// after an error, which may have left the slot half written).
    fn end(&mut self, i: usize, how: Result<FinishReason>) {
        // `remove`, not `swap_remove`: the others keep the order they were admitted in, which
        // `waiting` gives prompts their turn by (swapped, the newest prompt jumped ahead of
        // older ones at every end: with 8 streams of 1,000-token prompts one request waited
        // 54 s for its first token where the median waited 3.5, docs/PERFORMANCE.md).
        let mut r = self.running.remove(i);
        r.pending.place.release();
        let failed = how.is_err();
        let event = how.map(|reason| Event::Done(r.finished(reason)));
        tracing::debug!("slot {}: ended after {} tokens ({:?})", r.slot, r.generated, event.as_ref().err());
        let _ = r.pending.events.send(event);
        // The slot holds the prompt and the chosen tokens fed back so far.
        let position = self.engine.position(r.slot);
        let mut tokens = std::mem::take(&mut r.pending.request.prompt);
        tokens.extend(&r.chosen);
        if self.prefix_cache && !failed && position > 0 && tokens.len() >= position {
            tokens.truncate(position);
            self.held[r.slot] = Some(tokens);
        } else {
            self.engine.reset(r.slot);
            self.held[r.slot] = None;
        }
        self.ends += 1;
        self.ended[r.slot] = self.ends;
        self.free.push(r.slot);
        self.free.sort_unstable_by(|a, b| b.cmp(a));
    }
}

/// The prompt tokens one loop turn prefills, as (slot, tokens), from the prompts still being
/// read as (slot, tokens left), oldest first: up to `budget` (one chunk) tokens in all, so
/// running sequences wait at most about one chunk's time per step, however many prompts
/// arrive. The oldest prompt always gets `budget` tokens or the rest of it; a later one only
/// the whole of its rest, so no prompt is split into pieces that each pay for padding. Prompts
/// that arrive together (short chat turns) are then read in one turn, not one per decode step.
fn prefills(waiting: &[(usize, usize)], budget: usize) -> Vec<(usize, usize)> {
    let mut left = budget;
    let mut out = Vec::new();
    for (i, &(slot, tokens)) in waiting.iter().enumerate() {
        let take = if i == 0 {
            tokens.min(budget)
        } else if tokens <= left {
            tokens
        } else {
            continue;
        };
        if take == 0 {
            continue;
        }
        out.push((slot, take));
        left = left.saturating_sub(take);
        if left == 0 {
            break;
        }
    }
    out
}

/// Shortest and longest suffix of a sequence that [`ngram_draft`] looks up.
const NGRAM: std::ops::RangeInclusive<usize> = 2..=4;

/// How many of each draft (`lens`, in the sequences' order) a shared verify call of `spare`
/// rows past the sequences' own takes: one token a draft in turn, in order, until the rows
/// or the drafts run out.
fn share(lens: &[usize], spare: usize) -> Vec<usize> {
    let mut keep = vec![0; lens.len()];
    let mut left = spare;
    while left > 0 {
        let before = left;
        for (k, &len) in keep.iter_mut().zip(lens) {
            if left > 0 && *k < len {
                *k += 1;
                left -= 1;
            }
        }
        if left == before {
            break;
        }
    }
    keep
}

/// Up to `k` draft tokens for the sequence `history` (prompt lookup, as llama.cpp's and
/// vLLM's n-gram drafting): the tokens that followed the latest earlier occurrence of its
/// last `n` tokens, the longest `n` in [`NGRAM`] that has one; none where no suffix recurs.
pub fn ngram_draft(history: &[u32], k: usize) -> Vec<u32> {
    for n in NGRAM.rev() {
        if history.len() <= n || k == 0 {
            continue;
        }
        let suffix = &history[history.len() - n..];
        // Occurrences ending before the suffix itself, latest first.
        let found = (0..history.len() - n).rev().find(|&at| &history[at..at + n] == suffix);
        if let Some(at) = found {
            let from = at + n;
            return history[from..(from + k).min(history.len())].to_vec();
        }
    }
    Vec::new()
}

/// The next token of a row by `sampling`, never one at or above `limit`.
fn choose(sampling: &mut Sampling, limit: usize, step: &Step) -> Result<u32> {
    if let Sampling::Greedy = sampling
        && (step.next as usize) < limit
    {
        return Ok(step.next);
    }
    let mut logits = step.logits()?;
    if limit < logits.len() {
        logits[limit..].fill(f32::NEG_INFINITY);
    }
    match sampling {
        Sampling::Greedy => {
            let best = logits.iter().enumerate().filter(|(_, l)| !l.is_nan()).fold(
                None,
                |best: Option<(usize, f32)>, (i, &l)| match best {
                    Some((_, b)) if b >= l => best,
                    _ => Some((i, l)),
                },
            );
            // Vocabularies are far below 2^32 entries.
            best.map(|(i, _)| i as u32).ok_or_else(|| Error::Sampling("every logit is NaN".into()))
        }
        Sampling::Custom(pick) => pick(&logits).map_err(Error::Sampling),
    }
}

#[cfg(test)]
mod tests {
    use super::{ngram_draft, prefills, share};

    #[test]
    fn a_shared_verify_call_gives_its_rows_to_the_drafts_in_turn() {
        assert_eq!(share(&[4, 4], 3), [2, 1]);
        assert_eq!(share(&[4, 4, 4, 4], 1), [1, 0, 0, 0]);
        // A sequence without drafts leaves its share to the others.
        assert_eq!(share(&[0, 4, 1], 4), [0, 3, 1]);
        assert_eq!(share(&[1, 0], 3), [1, 0], "rows left over");
        assert_eq!(share(&[], 3), Vec::<usize>::new());
    }

    #[test]
    fn drafts_follow_the_latest_earlier_occurrence_of_the_longest_suffix() {
        // The last 4 tokens (1 2 3 4) occurred before, followed by 9 8.
        assert_eq!(ngram_draft(&[1, 2, 3, 4, 9, 8, 7, 1, 2, 3, 4], 2), [9, 8]);
        // At most what follows the occurrence.
        assert_eq!(ngram_draft(&[5, 6, 7, 5, 6], 4), [7, 5, 6]);
        // The latest occurrence wins: 5 6 was followed by 1, later by 2.
        assert_eq!(ngram_draft(&[5, 6, 1, 5, 6, 2, 0, 5, 6], 1), [2]);
        // A longer suffix wins over a later shorter one: 4 5 6 -> 7, not 6 -> 8.
        assert_eq!(ngram_draft(&[4, 5, 6, 7, 0, 5, 6, 8, 4, 5, 6], 1), [7]);
        // No suffix of two or more tokens recurs: no draft (one token alone is too weak a cue).
        assert_eq!(ngram_draft(&[1, 2, 3, 1], 4), Vec::<u32>::new());
        assert_eq!(ngram_draft(&[1, 2, 3, 4], 4), Vec::<u32>::new());
        assert_eq!(ngram_draft(&[], 4), Vec::<u32>::new());
        assert_eq!(ngram_draft(&[1, 2, 1, 2], 0), Vec::<u32>::new());
    }

    #[test]
    fn one_turn_reads_prompts_up_to_one_chunk() {
        // Eight 32-token prompts arriving together: four a turn, not one.
        let eight: Vec<(usize, usize)> = (0..8).map(|slot| (slot, 32)).collect();
        assert_eq!(prefills(&eight, 128), [(0, 32), (1, 32), (2, 32), (3, 32)]);
        // The oldest gets a chunk of a long prompt; nothing else fits after it.
        assert_eq!(prefills(&[(5, 300), (1, 10)], 128), [(5, 128)]);
        // Its rest, then whole prompts that fit what is left; one that does not waits
        // (not split), a later smaller one still goes.
        assert_eq!(prefills(&[(5, 44), (1, 100), (2, 84)], 128), [(5, 44), (2, 84)]);
        assert_eq!(prefills(&[(3, 7)], 128), [(3, 7)]);
        assert_eq!(prefills(&[], 128), []);
        // Nothing left to read is no call.
        assert_eq!(prefills(&[(0, 0), (1, 5)], 16), [(1, 5)]);
        // Every turn reads something while prompts wait, and never more than the budget.
        for budget in [1, 16, 128] {
            for waiting in [vec![(0, 1000)], vec![(0, 3), (1, 200), (2, 5)], eight.clone()] {
                let got = prefills(&waiting, budget);
                assert!(!got.is_empty(), "{waiting:?} {budget}");
                assert!(got.iter().map(|p| p.1).sum::<usize>() <= budget, "{waiting:?} {budget}");
            }
        }
    }
}
