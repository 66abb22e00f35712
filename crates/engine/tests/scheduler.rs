//! The engine thread's request API: requests from many callers at once get, each, the
//! tokens mlx-lm gives their prompt alone; stop tokens, cancellation, the context's end and
//! shutdown end a generation with the right event; bad requests are refused at submit;
//! speculative decoding changes no token; and nothing is compiled once the engine has
//! started.

#![allow(clippy::unwrap_used)] // a test that cannot unwrap has failed; helpers included

use engine::gate::{self, Reference};
use engine::scheduler::{Event, FinishReason, Request, Sampling, Scheduler};
use engine::{DecodeBatches, Draft, Engine, EngineConfig, Error, Precision};
use std::path::{Path, PathBuf};
use std::sync::Arc;

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// The shapes of crates/mlx-iree/tests/batch.rs, so both hit the same compiled modules.
const MAX_BATCH: usize = 8;
const MAX_CONTEXT: usize = 64;
const STEPS: usize = 16;
const DRAFT: usize = 4;

fn fixture() -> PathBuf {
    root().join("tests/fixtures-trained/qwen3/f32")
}

/// The packed twin: on a host with a CPU kernel object its engine steps in mixed calls
/// (prompts beside decode rows), where the f32 one calls per prompt.
fn packed_fixture() -> PathBuf {
    root().join("tests/fixtures-trained/qwen3/q4")
}

/// The tests take turns: the first one compiles the fixture's modules, the rest load them.
static SERIAL: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn start() -> (Scheduler, std::sync::MutexGuard<'static, ()>) {
    start_on(&fixture(), Precision::F32)
}

fn start_on(dir: &Path, precision: Precision) -> (Scheduler, std::sync::MutexGuard<'static, ()>) {
    start_with(dir, precision, true)
}

fn start_with(dir: &Path, precision: Precision, prefix_cache: bool) -> (Scheduler, std::sync::MutexGuard<'static, ()>) {
    let turn = SERIAL.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
    // Drafts for every model, recurrent layers included (their state rolled back from a copy).
    let scheduler = Scheduler::start(dir, EngineConfig { prefix_cache, ..config(precision) });
    (scheduler.unwrap(), turn)
}

/// The settings of crates/mlx-iree/tests/batch.rs's engines, so both use the same compiled
/// modules (weights not stored: stored_parameters.rs tests that), drafts included: decode
/// calls of one row or all (steps of 2 to 7 sequences pad to 8 rows).
fn config(precision: Precision) -> EngineConfig {
    EngineConfig {
        max_batch: MAX_BATCH,
        max_context: Some(MAX_CONTEXT),
        store_parameters: false,
        draft: Draft::Ngram { tokens: DRAFT },
        decode_batches: DecodeBatches::OneOrAll,
        ..EngineConfig::new("local-task", precision, root().join("target/test-compile-cache"))
    }
}

/// mlx-lm's trajectories cut into prompts (a reference prompt plus the first k tokens
/// mlx-lm generated after it), each with the STEPS tokens mlx-lm generated next.
fn cases() -> Vec<Reference> {
    cases_of(&fixture())
}

fn cases_of(dir: &Path) -> Vec<Reference> {
    let refs = gate::references_from_json(&std::fs::read_to_string(dir.join("expected.json")).unwrap()).unwrap();
    let mut cases = Vec::new();
    for k in [0, 3, 7, 1, 5] {
        for r in &refs {
            let mut prompt = r.prompt_ids.clone();
            prompt.extend(&r.token_ids[..k]);
            cases.push(Reference { prompt_ids: prompt, token_ids: r.token_ids[k..k + STEPS].to_vec() });
        }
    }
    assert!(cases.len() > MAX_BATCH, "{}", cases.len());
    cases
}

/// More requests than slots, from as many threads at once: each gets mlx-lm's tokens for
/// its prompt (the queue, slot reuse and batched steps change nothing), and the engine
/// compiles nothing after start.
#[test]
fn concurrent_requests_get_what_each_prompt_gives_alone() {
    concurrent_requests(&fixture(), Precision::F32);
}

/// The same through mixed calls (packed, on a host with a kernel object): prompts that
/// arrive together are read in one call beside the decode rows, and still each request gets
/// mlx-lm's tokens.
#[test]
fn concurrent_packed_requests_in_mixed_calls() {
    concurrent_requests(&packed_fixture(), Precision::Packed);
}

/// The same on a model with recurrent layers (Qwen3.5's gated DeltaNet, mlx-lm's random
/// fixture): more requests than slots, so slots are reused while others decode, and each
/// request still gets mlx-lm's tokens (its state starts fresh and stays its own).
#[test]
fn concurrent_requests_on_a_recurrent_model() {
    concurrent_requests(&root().join("tests/fixtures/qwen3_5/f32"), Precision::F32);
}

fn concurrent_requests(dir: &Path, precision: Precision) {
    let (scheduler, _turn) = start_on(dir, precision);
    let scheduler = Arc::new(scheduler);
    let compiles = engine::cache::compiles();
    let threads: Vec<_> = cases_of(dir)
        .into_iter()
        .map(|c| {
            let scheduler = Arc::clone(&scheduler);
            std::thread::spawn(move || {
                let (tokens, done) =
                    scheduler.submit(Request::greedy(c.prompt_ids.clone(), STEPS)).unwrap().collect_blocking().unwrap();
                assert_eq!(tokens, c.token_ids, "prompt {:?}", c.prompt_ids);
                assert_eq!(
                    (done.reason, done.generated, done.prompt_tokens),
                    (FinishReason::Length, STEPS, c.prompt_ids.len())
                );
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
    assert_eq!(engine::cache::compiles(), compiles, "modules compiled or loaded after start");
    // The counters settle at idle once the loop has seen the last request end.
    let stats = scheduler.stats();
    let idle = (0..200).any(|_| {
        std::thread::sleep(std::time::Duration::from_millis(10));
        stats.running() == 0 && stats.queued() == 0
    });
    assert!(idle, "running {} queued {}", stats.running(), stats.queued());
    let (steps, buckets) = (stats.steps().count(), stats.steps().counts());
    assert!(steps >= STEPS as u64, "{steps}");
    assert_eq!(buckets.iter().sum::<u64>(), steps);
    assert_eq!(buckets.len(), stats.steps().bounds().len() + 1);
}

/// The prefix cache: a request whose prompt goes on from a finished sequence reads only its
/// new tokens, one that stops inside it (no recurrent layers) reads from there, each gets
/// mlx-lm's tokens, and the counts say so; with the cache off, the same tokens from a whole
/// prefill.
#[test]
fn the_prefix_cache_reads_only_new_tokens() {
    prefix_cache(&fixture(), true);
}

/// The same on a model with recurrent layers: a sequence is kept whole or not at all.
#[test]
fn the_prefix_cache_on_a_recurrent_model() {
    prefix_cache(&root().join("tests/fixtures/qwen3_5/f32"), false);
}

fn prefix_cache(dir: &Path, cuts: bool) {
    let refs = gate::references_from_json(&std::fs::read_to_string(dir.join("expected.json")).unwrap()).unwrap();
    let (p, t) = (&refs[0].prompt_ids, &refs[0].token_ids);
    let run = |scheduler: &Scheduler, prompt: Vec<u32>| {
        let (tokens, done) = scheduler.submit(Request::greedy(prompt, STEPS)).unwrap().collect_blocking().unwrap();
        (tokens, done.cached_tokens)
    };
    let goes_on: Vec<u32> = p.iter().chain(&t[..STEPS]).copied().collect();
    let stops_inside: Vec<u32> = p.iter().chain(&t[..3]).copied().collect();
    {
        let (scheduler, _turn) = start_on(dir, Precision::F32);
        assert_eq!(run(&scheduler, p.clone()), (t[..STEPS].to_vec(), 0));
        // The slot holds the prompt and the tokens fed back (all but the last chosen).
        assert_eq!(run(&scheduler, goes_on.clone()), (t[STEPS..2 * STEPS].to_vec(), p.len() + STEPS - 1));
        let kept = if cuts { p.len() + 2 } else { 0 };
        assert_eq!(run(&scheduler, stops_inside.clone()), (t[3..3 + STEPS].to_vec(), kept));
        let stats = scheduler.stats();
        assert_eq!(
            (stats.prefix_hits(), stats.cached_tokens()),
            (1 + u64::from(cuts), (p.len() + STEPS - 1 + kept) as u64)
        );
    }
    let (scheduler, _turn) = start_with(dir, Precision::F32, false);
    assert_eq!(run(&scheduler, p.clone()), (t[..STEPS].to_vec(), 0));
    assert_eq!(run(&scheduler, goes_on), (t[STEPS..2 * STEPS].to_vec(), 0));
    assert_eq!(scheduler.stats().prefix_hits(), 0);
}

/// Requests with one prompt at once (the `n` answers of a server request): the first
/// prefills it, the others wait while the rest of it is worth waiting for (16 tokens or
/// more) and copy what the first holds into their own slots; each gets mlx-lm's tokens.
#[test]
fn requests_sharing_a_prompt_prefill_it_once() {
    let refs = gate::references_from_json(&std::fs::read_to_string(fixture().join("expected.json")).unwrap()).unwrap();
    let (p, t) = (&refs[0].prompt_ids, &refs[0].token_ids);
    let prompt: Vec<u32> = p.iter().chain(&t[..20]).copied().collect();
    let (scheduler, _turn) = start();
    let generations: Vec<_> =
        (0..3).map(|_| scheduler.submit(Request::greedy(prompt.clone(), STEPS)).unwrap()).collect();
    let mut cached = Vec::new();
    for g in generations {
        let (tokens, done) = g.collect_blocking().unwrap();
        assert_eq!(tokens, t[20..20 + STEPS]);
        cached.push(done.cached_tokens);
    }
    cached.sort_unstable();
    assert!(cached[0] == 0 && cached[1..].iter().all(|&c| (16..prompt.len()).contains(&c)), "{cached:?}");
    assert_eq!(scheduler.stats().prefix_hits(), 2);
}

/// The token cycle a trained fixture was trained on (what its mlx-lm trajectories follow).
fn cycle_of(dir: &Path) -> Vec<u32> {
    let json: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("expected.json")).unwrap()).unwrap();
    json["training"]["cycle"].as_array().unwrap().iter().map(|v| v.as_u64().unwrap() as u32).collect()
}

/// A seeded sampler at temperature 3 (xorshift, inverse CDF), as a request's chooser.
fn seeded(seed: u64) -> impl FnMut(&[f32]) -> Result<u32, engine::BoxError> + Send {
    let mut state = seed;
    move |logits: &[f32]| {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        let u = (state >> 11) as f64 / (1u64 << 53) as f64;
        let max = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max);
        let weights: Vec<f64> = logits.iter().map(|&l| (f64::from(l - max) / 3.0).exp()).collect();
        let total: f64 = weights.iter().sum();
        let mut sum = 0.0;
        for (i, w) in weights.iter().enumerate() {
            sum += w / total;
            if u < sum {
                return Ok(i as u32);
            }
        }
        Ok((weights.len() - 1) as u32)
    }
}

/// Speculative decoding: a prompt that goes through the trained cycle and starts it again
/// has its next tokens drafted from its own first part (prompt lookup); the model accepts
/// them, so the answer (the cycle's next tokens, as mlx-lm's trajectories follow it) comes
/// in fewer calls than tokens, and the counts say so. A seeded sampler picks, draft run by
/// draft run, the tokens it picks one decode step at a time on the same compiled model.
#[test]
fn drafts_are_checked_in_one_call_and_change_no_token() {
    drafts_change_no_token(&fixture());
}

/// The same on a model with recurrent layers (the trained Qwen3.5): a verify call's state is
/// rolled back to the accepted rows (restored from before the call, the rows read again),
/// so the tokens are still those of one decode step at a time, greedy and sampled.
#[test]
fn drafts_on_recurrent_layers_change_no_token() {
    drafts_change_no_token(&root().join("tests/fixtures-trained/qwen3_5/f32"));
}

fn drafts_change_no_token(dir: &Path) {
    let cycle = cycle_of(dir);
    let refs = gate::references_from_json(&std::fs::read_to_string(dir.join("expected.json")).unwrap()).unwrap();
    assert_eq!(refs[0].token_ids, cycle[1..=refs[0].token_ids.len()], "mlx-lm's first trajectory is the cycle");
    let prompt: Vec<u32> = cycle[..40].iter().chain(&cycle[..6]).copied().collect();
    let (scheduler, _turn) = start_on(dir, Precision::F32);
    let (tokens, done) = scheduler.submit(Request::greedy(prompt.clone(), STEPS)).unwrap().collect_blocking().unwrap();
    assert_eq!(tokens, cycle[6..6 + STEPS]);
    assert!(done.accepted > 0 && done.accepted <= done.drafted, "{done:?}");
    // Every call after the first token gave one token plus its accepted drafts.
    assert_eq!(done.decode_calls + done.accepted, STEPS - 1, "{done:?}");
    let stats = scheduler.stats();
    assert_eq!((stats.drafted(), stats.accepted()), (done.drafted as u64, done.accepted as u64));
    assert!(stats.verify_calls() > 0 && stats.verify_calls() <= done.decode_calls as u64);

    // Sampled: the same tokens as one decode step at a time, seed for seed.
    let mut engine = Engine::load(dir, &config(Precision::F32)).unwrap();
    let mut rejected = 0;
    for seed in 1..=4u64 {
        let mut pick = seeded(seed);
        engine.reset(0);
        let mut want = vec![pick(&engine.prefill(0, &prompt).unwrap().logits().unwrap()).unwrap()];
        while want.len() < STEPS {
            let step = engine.decode_one(0, want[want.len() - 1]).unwrap();
            want.push(pick(&step.logits().unwrap()).unwrap());
        }
        let request =
            Request { sampling: Sampling::Custom(Box::new(seeded(seed))), ..Request::greedy(prompt.clone(), STEPS) };
        let (tokens, done) = scheduler.submit(request).unwrap().collect_blocking().unwrap();
        assert_eq!(tokens, want, "seed {seed}");
        rejected += done.drafted - done.accepted;
    }
    assert!(rejected > 0, "no draft token was rejected at temperature 3");
}

/// Two sequences decoding at once have their drafts checked together, both sequences' rows in
/// one call of a verify call's rows (where the engine has mixed calls: packed, attention in
/// the CPU kernel): a prompt that restarts the trained cycle (drafted and accepted) beside
/// one of mlx-lm's (whose answer repeats little) each get what plain decoding gives them.
/// Submitted together, the two prompts are read in one call; with the second submitted after
/// the first's first token, the first's decode row rides in the call that reads the second's
/// prompt, and counts as one of its decode calls like any other.
#[test]
fn drafts_of_concurrent_sequences_are_checked_together() {
    if kernels::cpu::host_isa().is_none() {
        return;
    }
    let dir = packed_fixture();
    let cycle = cycle_of(&dir);
    let prompt: Vec<u32> = cycle[..40].iter().chain(&cycle[..6]).copied().collect();
    let (scheduler, _turn) = start_on(&dir, Precision::Packed);
    let c = &cases_of(&dir)[0];
    for after_first_token in [false, true] {
        let mut first = scheduler.submit(Request::greedy(prompt.clone(), STEPS)).unwrap();
        let mut head = Vec::new();
        if after_first_token {
            match first.blocking_next() {
                Some(Ok(Event::Token(t))) => head.push(t),
                other => panic!("the first request's first event: {other:?}"),
            }
        }
        let second = scheduler.submit(Request::greedy(c.prompt_ids.clone(), STEPS)).unwrap();
        let runs = [(cycle[6..6 + STEPS].to_vec(), head, first), (c.token_ids.clone(), Vec::new(), second)];
        for (i, (want, head, generation)) in runs.into_iter().enumerate() {
            let (tokens, done) = generation.collect_blocking().unwrap();
            let tokens: Vec<u32> = head.into_iter().chain(tokens).collect();
            let what = format!("request {i}, second submitted after the first token: {after_first_token}");
            assert_eq!(tokens, want, "{what}");
            // Every call after the first token gave one token plus its accepted drafts.
            assert_eq!(done.decode_calls + done.accepted, STEPS - 1, "{what}: {done:?}");
            if i == 0 {
                assert!(done.accepted > 0, "no draft accepted beside the other sequence, {what}: {done:?}");
            }
        }
    }
    assert!(scheduler.stats().verify_calls() > 0);
}

/// A draft model: the trained model's 4-bit twin agrees with it, so most drafts are
/// accepted; a random model of its vocabulary does not, so most are rejected; either way
/// the tokens are mlx-lm's. One of another vocabulary, or with recurrent layers, is refused
/// at start.
#[test]
fn a_draft_model_changes_no_token() {
    let with = |dir: PathBuf| EngineConfig {
        draft: Draft::Model { precision: engine::device::default_precision("local-task", &dir), dir, tokens: DRAFT },
        ..config(Precision::F32)
    };
    let _turn = SERIAL.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
    for (draft, agrees) in [(packed_fixture(), true), (root().join("tests/fixtures/qwen3/f32"), false)] {
        let scheduler = Scheduler::start(fixture(), with(draft.clone())).unwrap();
        let (mut drafted, mut accepted) = (0, 0);
        for c in cases().iter().take(3) {
            let (tokens, done) =
                scheduler.submit(Request::greedy(c.prompt_ids.clone(), STEPS)).unwrap().collect_blocking().unwrap();
            assert_eq!(tokens, c.token_ids, "draft {}, prompt {:?}", draft.display(), c.prompt_ids);
            assert_eq!(done.decode_calls + done.accepted, STEPS - 1, "{done:?}");
            (drafted, accepted) = (drafted + done.drafted, accepted + done.accepted);
        }
        assert!(drafted >= 3 * DRAFT, "{drafted}");
        let calls = scheduler.stats().verify_calls();
        if agrees {
            assert!(accepted * 10 >= drafted * 9, "the 4-bit twin: {accepted} of {drafted} accepted");
        } else {
            assert!(accepted * 4 < drafted, "a random draft: {accepted} of {drafted} accepted");
            // After a call that accepts nothing, 2, 4, then 8 plain steps before the next
            // try: at most 4 verify calls in a prompt's 15 calls after its first token.
            assert!(calls <= 3 * 4, "a random draft checked in {calls} verify calls over 3 prompts");
        }
    }
    for (draft, expected) in [
        (
            "tests/fixtures-trained/llama_llama3_tied/f32",
            "the draft model's vocabulary (256 ids) is not the model's (448 ids)",
        ),
        ("tests/fixtures/qwen3_5/f32", "the draft model has recurrent layers (qwen3_5); use one without"),
    ] {
        let compiles = engine::cache::compiles();
        let err = Scheduler::start(fixture(), with(root().join(draft))).unwrap_err();
        assert_eq!(err.to_string(), expected);
        assert_eq!(engine::cache::compiles(), compiles, "compiled before refusing {draft}");
    }
}

#[test]
fn stop_tokens_end_a_generation_and_are_not_sent() {
    let (scheduler, _turn) = start();
    let c = &cases()[0];
    // The first position whose token has not appeared before it.
    let at = (1..STEPS).find(|&i| !c.token_ids[..i].contains(&c.token_ids[i])).unwrap();
    let request = Request { stop_tokens: vec![c.token_ids[at]], ..Request::greedy(c.prompt_ids.clone(), STEPS) };
    let (tokens, done) = scheduler.submit(request).unwrap().collect_blocking().unwrap();
    assert_eq!(tokens, c.token_ids[..at]);
    assert_eq!((done.reason, done.generated), (FinishReason::Stop, at));
}

#[test]
fn a_generation_ends_at_the_end_of_the_context() {
    let (scheduler, _turn) = start();
    let c = &cases()[0];
    let (tokens, done) =
        scheduler.submit(Request::greedy(c.prompt_ids.clone(), 1000)).unwrap().collect_blocking().unwrap();
    // One token from the prompt, then one per decode step at positions len..MAX_CONTEXT.
    assert_eq!(tokens.len(), MAX_CONTEXT - c.prompt_ids.len() + 1);
    assert_eq!(tokens[..STEPS], c.token_ids[..]);
    assert_eq!(done.reason, FinishReason::ContextFull);
}

/// A cancelled or dropped generation frees its slot: with every slot taken and one request
/// queued, cancelling one running request lets the queued one run to its end.
#[test]
fn cancelling_frees_the_slot_for_the_queue() {
    let (scheduler, _turn) = start();
    let cases = cases();
    let mut running: Vec<_> =
        (0..MAX_BATCH).map(|i| scheduler.submit(Request::greedy(cases[i].prompt_ids.clone(), 1000)).unwrap()).collect();
    let queued = scheduler.submit(Request::greedy(cases[MAX_BATCH].prompt_ids.clone(), STEPS)).unwrap();
    // Every running request has its first token before any is cancelled.
    for g in &mut running {
        assert!(matches!(g.blocking_next(), Some(Ok(Event::Token(_)))));
    }
    let mut first = running.remove(0);
    first.cancel();
    let mut events = 0;
    let done = loop {
        match first.blocking_next().unwrap().unwrap() {
            Event::Token(_) => events += 1,
            Event::Done(done) => break done,
        }
        assert!(events <= MAX_CONTEXT, "cancel not seen");
    };
    assert_eq!(done.reason, FinishReason::Cancelled);
    assert!(first.blocking_next().is_none());
    // Dropping a generation cancels it too.
    running.truncate(3);
    let (tokens, done) = queued.collect_blocking().unwrap();
    assert_eq!(tokens, cases[MAX_BATCH].token_ids);
    assert_eq!(done.reason, FinishReason::Length);
}

/// The queue limit: while every slot runs and `queue` more wait, `submit` refuses the next
/// request with `QueueFull`; a request gives its place back before its last event, so once
/// they have ended requests are taken again; `None` lifts the limit.
#[test]
fn a_full_queue_refuses_at_submit() {
    let (scheduler, _turn) = start();
    assert_eq!(scheduler.queue_limit(), None);
    scheduler.set_queue_limit(Some(1));
    assert_eq!(scheduler.queue_limit(), Some(1));
    // The engine thread waits in the samplers until the gate opens: the requests stay held.
    let gate = Arc::new((std::sync::Mutex::new(false), std::sync::Condvar::new()));
    let cases = cases();
    let gated = |i: usize| {
        let gate = Arc::clone(&gate);
        let sampling = Sampling::Custom(Box::new(move |logits: &[f32]| -> Result<u32, engine::BoxError> {
            let (open, wake) = &*gate;
            let mut open = open.lock().unwrap();
            while !*open {
                open = wake.wait(open).unwrap();
            }
            Ok(logits.iter().enumerate().max_by(|a, b| a.1.total_cmp(b.1)).unwrap().0 as u32)
        }));
        Request { sampling, ..Request::greedy(cases[i].prompt_ids.clone(), STEPS) }
    };
    let held: Vec<_> = (0..=MAX_BATCH).map(|i| scheduler.submit(gated(i)).unwrap()).collect();
    let err = scheduler.submit(Request::greedy(cases[0].prompt_ids.clone(), 1)).unwrap_err();
    assert!(matches!(err, Error::QueueFull { max: 9 }), "{err}");
    assert_eq!(err.to_string(), "the engine is busy: 9 requests running or queued, the most it takes");
    assert!(!err.is_request_error());
    *gate.0.lock().unwrap() = true;
    gate.1.notify_all();
    for generation in held {
        let (tokens, done) = generation.collect_blocking().unwrap();
        assert_eq!((tokens.len(), done.reason), (STEPS, FinishReason::Length));
    }
    let c = &cases[0];
    let (tokens, _) =
        scheduler.submit(Request::greedy(c.prompt_ids.clone(), STEPS)).unwrap().collect_blocking().unwrap();
    assert_eq!(tokens, c.token_ids);
    scheduler.set_queue_limit(None);
    assert_eq!(scheduler.queue_limit(), None);
}

#[test]
fn bad_requests_are_refused_at_submit() {
    let (scheduler, _turn) = start();
    let vocab = scheduler.info().model.vocab;
    let err = |r: Request| scheduler.submit(r).unwrap_err();
    assert!(matches!(err(Request::greedy(vec![], 4)), Error::EmptyPrompt));
    assert!(matches!(err(Request::greedy(vec![1], 0)), Error::ZeroMaxTokens));
    let e = err(Request::greedy(vec![1, vocab as u32], 4));
    assert_eq!(e.to_string(), format!("token id {vocab} is out of range for vocabulary size {vocab}"));
    let e = err(Request::greedy(vec![1; MAX_CONTEXT], 4));
    assert_eq!(e.to_string(), "the prompt (64 tokens) and its first new token exceed the maximum context 64");
    assert!(e.is_request_error());
    // The engine still serves after refusing.
    let c = &cases()[0];
    let (tokens, _) =
        scheduler.submit(Request::greedy(c.prompt_ids.clone(), STEPS)).unwrap().collect_blocking().unwrap();
    assert_eq!(tokens, c.token_ids);
}

/// A caller's chooser sees the row's logits with ids at and above `vocab_limit` masked; its
/// errors end the generation with `Error::Sampling`.
#[test]
fn custom_sampling_and_the_vocab_limit() {
    let (scheduler, _turn) = start();
    let c = &cases()[0];
    let argmax = |l: &[f32]| -> Result<u32, engine::BoxError> {
        let best = (0..l.len()).fold(0, |b, i| if l[i] > l[b] { i } else { b });
        Ok(best as u32)
    };
    let request =
        Request { sampling: Sampling::Custom(Box::new(argmax)), ..Request::greedy(c.prompt_ids.clone(), STEPS) };
    let (tokens, _) = scheduler.submit(request).unwrap().collect_blocking().unwrap();
    assert_eq!(tokens, c.token_ids, "host argmax over downloaded logits = device argmax");
    // Greedy never picks an id at or above the limit: below mlx-lm's first token, it picks another.
    let limit = c.token_ids[0] as usize;
    let request = Request { vocab_limit: Some(limit), ..Request::greedy(c.prompt_ids.clone(), 1) };
    let (tokens, _) = scheduler.submit(request).unwrap().collect_blocking().unwrap();
    assert!(tokens[0] < limit as u32, "{tokens:?} with limit {limit}");
    let failing = |_: &[f32]| -> Result<u32, engine::BoxError> { Err("no luck".into()) };
    let request =
        Request { sampling: Sampling::Custom(Box::new(failing)), ..Request::greedy(c.prompt_ids.clone(), STEPS) };
    let err = scheduler.submit(request).unwrap().collect_blocking().unwrap_err();
    assert_eq!(err.to_string(), "sampling: no luck");
}

/// Dropping the scheduler stops its thread: a generation still running ends with
/// `Error::Stopped` (no hang, no lost error), and a load error comes back from `start`.
#[test]
fn shutdown_and_load_errors() {
    let (scheduler, _turn) = start();
    let c = &cases()[0];
    let mut g = scheduler.submit(Request::greedy(c.prompt_ids.clone(), 1000)).unwrap();
    assert!(matches!(g.blocking_next(), Some(Ok(Event::Token(_)))));
    drop(scheduler);
    let mut tokens = 1;
    let end = loop {
        match g.blocking_next().unwrap() {
            Ok(Event::Token(_)) => tokens += 1,
            other => break other,
        }
    };
    assert!(matches!(end, Err(Error::Stopped)), "{end:?}");
    assert!(tokens < MAX_CONTEXT, "{tokens}");
    assert!(g.blocking_next().is_none());

    let config = EngineConfig::new("hip", Precision::F32, root().join("target/test-compile-cache"));
    let err = Scheduler::start(fixture(), config).unwrap_err();
    assert_eq!(
        err.to_string(),
        "unsupported device `hip` (expected local-task, local-sync, cuda, vulkan, or metal on macOS)"
    );
    let config = EngineConfig::new("local-task", Precision::F32, root().join("target/test-compile-cache"));
    let err = Scheduler::start(root().join("no-such-model"), config).unwrap_err().to_string();
    assert!(err.contains("no-such-model"), "{err}");
}
