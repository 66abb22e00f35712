//! Many sequences in one engine: batched decode gives every row the tokens its prompt gives
//! alone (mlx-lm's own: every fixture family at f32, a trained fixture at each other
//! precision), a row's logits do not depend on the other rows (bit for bit), and nothing is
//! compiled once the engine has started, whatever the mix of requests; and a verify call
//! (speculative decoding) gives every row what decoding the rows one at a time gives.

#![allow(clippy::unwrap_used)] // a test that cannot unwrap has failed; helpers included

use common::{DRAFT, MAX_BATCH, root};
use engine::gate::{self, Reference};
use engine::{Engine, EngineConfig, KvElem, Precision, Step};
use models::Activations;
use std::path::Path;

mod common;

/// One test counts the compiles of the whole process and runs alone (`alone`); the others
/// run side by side (`beside`), as each mostly compiles, on one core each.
static TURNS: std::sync::RwLock<()> = std::sync::RwLock::new(());

fn beside() -> std::sync::RwLockReadGuard<'static, ()> {
    TURNS.read().unwrap_or_else(|poisoned| poisoned.into_inner())
}

fn alone() -> std::sync::RwLockWriteGuard<'static, ()> {
    TURNS.write().unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// Decode steps checked per row.
const STEPS: usize = 16;

/// An engine of MAX_BATCH slots at the host's default CPU kernel (the other objects: see
/// a_rows_logits_do_not_depend_on_the_other_rows), with verify calls of DRAFT draft tokens
/// (a model with recurrent layers keeps a scratch state for its state from before them).
fn engine(dir: &Path, precision: Precision) -> Engine {
    engine_with(dir, precision, KvElem::F32, Activations::I16)
}

/// [`engine`] with a KV cache of element type `kv` and the packed products' `activations`.
fn engine_with(dir: &Path, precision: Precision, kv: KvElem, activations: Activations) -> Engine {
    // Shared with fixtures.rs (f32) and crates/engine/tests/scheduler.rs.
    let config = EngineConfig { kv_elem: kv, activations, ..common::eight_slot_engine(precision) };
    Engine::load(dir, &config).unwrap()
}

/// Eight different prompts on mlx-lm's recorded trajectories (a reference prompt plus the
/// first k tokens mlx-lm generated after it), each with the STEPS tokens mlx-lm generated next.
fn cases(dir: &Path) -> Vec<Reference> {
    let refs = gate::references_from_json(&std::fs::read_to_string(dir.join("expected.json")).unwrap()).unwrap();
    let mut cases = Vec::new();
    for k in [0, 3, 7] {
        for r in &refs {
            let mut prompt = r.prompt_ids.clone();
            prompt.extend(&r.token_ids[..k]);
            cases.push(Reference { prompt_ids: prompt, token_ids: r.token_ids[k..k + STEPS].to_vec() });
        }
    }
    cases.truncate(MAX_BATCH);
    assert_eq!(cases.len(), MAX_BATCH, "{}", dir.display());
    cases
}

/// Prefills every case into its own slot (0, 1, ...), then decodes them all together.
fn batched(engine: &mut Engine, cases: &[Reference]) -> Vec<Vec<u32>> {
    let mut rows: Vec<(usize, u32)> = Vec::new();
    for (slot, c) in cases.iter().enumerate() {
        engine.reset(slot);
        rows.push((slot, engine.prefill(slot, &c.prompt_ids).unwrap().next));
    }
    let mut out: Vec<Vec<u32>> = rows.iter().map(|r| vec![r.1]).collect();
    while out[0].len() < STEPS {
        let steps = engine.decode(&rows).unwrap();
        for ((row, step), got) in rows.iter_mut().zip(steps).zip(&mut out) {
            row.1 = step.next;
            got.push(step.next);
        }
    }
    out
}

/// Each of 8 rows decoded together gives the tokens its prompt gives alone, and both are
/// mlx-lm's, on `dir` at `precision`.
fn eight_rows_give_what_each_prompt_gives_alone(dir: &Path, precision: Precision) {
    eight_rows_with(dir, precision, KvElem::F32, Activations::I16);
}

/// [`eight_rows_give_what_each_prompt_gives_alone`] with a KV cache of element type `kv`
/// and the packed products' `activations`.
fn eight_rows_with(dir: &Path, precision: Precision, kv: KvElem, activations: Activations) {
    let _turn = beside();
    let cases = cases(dir);
    let mut engine = engine_with(dir, precision, kv, activations);
    let what = format!("{} {precision} {kv} KV, {} activations", dir.display(), activations.name());
    for c in &cases {
        let alone = gate::trajectory(&mut engine, &c.prompt_ids, STEPS).unwrap();
        assert_eq!(alone, c.token_ids, "{what}: alone, prompt {:?}", c.prompt_ids);
    }
    let together = batched(&mut engine, &cases);
    for (got, c) in together.iter().zip(&cases) {
        assert_eq!(got, &c.token_ids, "{what}: in a batch of {MAX_BATCH}, prompt {:?}", c.prompt_ids);
    }
    a_kept_prefix_gives_mlx_lms_tokens(&mut engine, dir, &what);
    drafts_give_mlx_lms_tokens(&mut engine, dir, &what);
}

/// Speculative decoding's engine side (crates/engine's scheduler): after mlx-lm's prompt, a
/// verify call of the next row and DRAFT drafts that are mlx-lm's next tokens gives mlx-lm's
/// token at every row; one whose drafts are wrong gives mlx-lm's token at its first row, and
/// with only that row kept (`truncate`) the sequence goes on as mlx-lm's. A model with
/// recurrent layers too: its state goes back to that after the kept row (restored from
/// before the call, the row read again), where a cut anywhere else is refused.
fn drafts_give_mlx_lms_tokens(engine: &mut Engine, dir: &Path, what: &str) {
    let refs = gate::references_from_json(&std::fs::read_to_string(dir.join("expected.json")).unwrap()).unwrap();
    let (prompt, t) = (&refs[0].prompt_ids, &refs[0].token_ids);
    let vocab = engine.config().vocab as u32;
    let slot = 1;
    engine.reset(slot);
    assert_eq!(engine.prefill(slot, prompt).unwrap().next, t[0], "{what}: prefill");
    assert_eq!(engine.verify_rows(slot), DRAFT + 1, "{what}");
    let right: Vec<u32> = t[..=DRAFT].to_vec();
    let got: Vec<u32> = engine.verify(slot, &right).unwrap().iter().map(|s| s.next).collect();
    assert_eq!(got, t[1..=DRAFT + 1], "{what}: a verify call of right drafts");
    let at = engine.position(slot);
    assert_eq!(at, prompt.len() + DRAFT + 1, "{what}");
    // Row t[DRAFT + 1], drafts that are not the next tokens (nor one another).
    let mut wrong = vec![t[DRAFT + 1]];
    wrong.extend(t[DRAFT + 2..2 * DRAFT + 1].iter().map(|&x| (x + 1 + x % 7) % vocab));
    let steps = engine.verify(slot, &wrong).unwrap();
    assert_eq!(steps.len(), DRAFT);
    assert_eq!(steps[0].next, t[DRAFT + 2], "{what}: the first row of a verify call of wrong drafts");
    if engine.has_state() {
        let err = engine.truncate(slot, at - 1).unwrap_err().to_string();
        assert!(err.contains("only into its last verify call's rows"), "{what}: {err}");
    }
    engine.truncate(slot, at + 1).unwrap();
    assert_eq!(engine.position(slot), at + 1, "{what}");
    let mut out = vec![steps[0].next];
    while out.len() < STEPS {
        out.push(engine.decode_one(slot, out[out.len() - 1]).unwrap().next);
    }
    assert_eq!(out, t[DRAFT + 2..DRAFT + 2 + STEPS], "{what}: decoding on after the accepted rows");

    // Several sequences' rows in one call of a verify call's rows, where the engine has mixed
    // calls (attention in the CPU kernel, no recurrent layers): right drafts, wrong drafts
    // and a lone decode row side by side give what each gives alone.
    if engine.step_rows() == 0 || engine.has_state() {
        assert_eq!(engine.verify_many_rows(), 0, "{what}");
        return;
    }
    assert_eq!(engine.verify_many_rows(), DRAFT + 1, "{what}");
    let [a, b, c] = [2, 3, 4];
    for s in [a, b, c] {
        engine.reset(s);
        assert_eq!(engine.prefill(s, prompt).unwrap().next, t[0], "{what}: prefill");
    }
    let wrong = [t[0], (t[1] + 1 + t[1] % 7) % vocab];
    let all = engine.verify_many(&[(a, &right[..2]), (b, &wrong), (c, &[t[0]])]).unwrap();
    let next = |steps: &[engine::Step]| -> Vec<u32> { steps.iter().map(|s| s.next).collect() };
    assert_eq!(next(&all[0]), t[1..3], "{what}: right drafts beside others");
    assert_eq!((all[1].len(), all[1][0].next), (2, t[1]), "{what}: wrong drafts beside others");
    assert_eq!(next(&all[2]), t[1..2], "{what}: a lone decode row beside drafts");
    // The wrong drafts' slot keeps its first row and goes on as mlx-lm's.
    engine.truncate(b, prompt.len() + 1).unwrap();
    let mut out = vec![t[1]];
    while out.len() < STEPS {
        out.push(engine.decode_one(b, out[out.len() - 1]).unwrap().next);
    }
    assert_eq!(out, t[1..=STEPS], "{what}: decoding on after drafts rejected beside others");
}

/// The prefix cache's use of a slot (crates/engine's scheduler): after a sequence of
/// mlx-lm's prompt and STEPS greedy tokens, the slot holds the prompt and the tokens fed
/// back; a prompt that goes on from all of it prefills only its new token, and (a model
/// without recurrent layers) one that stops inside it keeps the slot's first positions and
/// prefills the rest; and the same from a copy of the slot in another slot (a prompt's
/// start shared between sequences). Each gives mlx-lm's next tokens.
fn a_kept_prefix_gives_mlx_lms_tokens(engine: &mut Engine, dir: &Path, what: &str) {
    let refs = gate::references_from_json(&std::fs::read_to_string(dir.join("expected.json")).unwrap()).unwrap();
    let r = &refs[0];
    let (prompt, t) = (&r.prompt_ids, &r.token_ids);
    assert!(t.len() > 2 * STEPS, "{what}: trajectory of {}", t.len());
    let (slot, other) = (MAX_BATCH - 1, 0);
    // `n` tokens decoded in `slot` after `first`.
    let run = |engine: &mut Engine, slot: usize, first: Step, n: usize| {
        let mut out = vec![first.next];
        while out.len() < n {
            out.push(engine.decode_one(slot, out[out.len() - 1]).unwrap().next);
        }
        out
    };
    engine.reset(slot);
    let first = engine.prefill(slot, prompt).unwrap();
    assert_eq!(run(engine, slot, first, STEPS), t[..STEPS], "{what}: the sequence before");
    assert_eq!(engine.position(slot), prompt.len() + STEPS - 1);
    // Goes on from everything held: one new token to read.
    let first = engine.prefill(slot, &t[STEPS - 1..STEPS]).unwrap();
    assert_eq!(run(engine, slot, first, STEPS), t[STEPS..2 * STEPS], "{what}: going on from a kept sequence");
    // All of it copied to another slot, which goes on as the first would.
    let held = engine.position(slot);
    engine.copy(slot, other, held).unwrap();
    let first = engine.prefill(other, &t[2 * STEPS - 1..2 * STEPS]).unwrap();
    let rest = t.len() - 2 * STEPS;
    assert_eq!(run(engine, other, first, rest), t[2 * STEPS..], "{what}: going on from a copy");
    if !engine.has_state() {
        // Stops inside it: the slot's first positions kept, the rest read again; the same
        // from a copy of those positions.
        engine.copy(slot, other, prompt.len() + 2).unwrap();
        engine.truncate(slot, prompt.len() + 2).unwrap();
        for s in [slot, other] {
            let first = engine.prefill(s, &t[2..3]).unwrap();
            assert_eq!(run(engine, s, first, STEPS), t[3..3 + STEPS], "{what}: from a kept prefix in slot {s}");
        }
    }
}

/// Every fixture family at f32 (the random-weight fixtures, where f32 is token-exact with
/// mlx-lm, fixtures.rs, which shares these modules), one test each so they compile side by
/// side (each load compiles ten functions: 1 prefill, 4 decode, 5 cache-write).
macro_rules! eight_rows_at_f32 {
    ($($family:ident),*) => {
        const F32_FAMILIES: &[&str] = &[$(stringify!($family)),*];
        $(
            #[test]
            fn $family() {
                let dir = root().join("tests/fixtures").join(stringify!($family)).join("f32");
                eight_rows_give_what_each_prompt_gives_alone(&dir, Precision::F32);
            }
        )*
    };
}

mod eight_rows_at_f32 {
    use super::*;
    eight_rows_at_f32!(
        deepseek_v3,
        deepseek_v3_kv_b,
        gemma,
        gemma2,
        gemma2_window,
        gemma3,
        gemma3_text,
        gemma4,
        gemma4_moe,
        gemma4_text,
        glm4,
        glm4_moe,
        gpt_oss,
        granite,
        lfm2,
        llama_linear_untied,
        llama_llama3_tied,
        ministral3,
        mistral,
        mistral3,
        mixtral,
        olmo2,
        olmo3,
        phi3,
        qwen2,
        qwen2_moe,
        qwen3,
        qwen3_5,
        qwen3_5_moe,
        qwen3_moe,
        qwen3_next,
        smollm3
    );

    #[test]
    fn every_fixture_family_has_its_test() {
        let set = root().join("tests/fixtures");
        let mut families: Vec<String> = std::fs::read_dir(&set)
            .unwrap()
            .flatten()
            .filter(|e| e.path().is_dir())
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .collect();
        families.sort();
        assert_eq!(families, F32_FAMILIES, "a fixture family without a batched test in batch.rs");
    }
}

/// Each other precision on one trained family (confident, so every precision is mlx-lm's
/// f32 trajectory there).
#[test]
fn eight_rows_at_f16() {
    eight_rows_give_what_each_prompt_gives_alone(
        &root().join("tests/fixtures-trained/llama_llama3_tied/f32"),
        Precision::F16,
    );
}

#[test]
fn eight_rows_at_bf16() {
    eight_rows_give_what_each_prompt_gives_alone(&root().join("tests/fixtures-trained/gemma2/f32"), Precision::BF16);
}

#[test]
fn eight_rows_packed() {
    eight_rows_give_what_each_prompt_gives_alone(&root().join("tests/fixtures-trained/qwen3/q4"), Precision::Packed);
}

/// mxfp8 packed through the CPU kernel's `hmv_mxfp8` (its rows' chains never meet): eight
/// rows, prompts in chunks, a kept prefix and verify calls give mlx-lm's own mxfp8 tokens.
#[test]
fn eight_rows_packed_mxfp8() {
    let dir = root().join("tests/fixtures/llama_llama3_tied/mxfp8");
    eight_rows_give_what_each_prompt_gives_alone(&dir, Precision::Packed);
}

/// An 8-bit KV cache through the CPU kernel's q8 attention (packed weights): prompts in
/// chunks, eight rows, a kept prefix copied between slots and verify calls all give
/// mlx-lm's tokens (the trained fixture is confident; the cache's blocks and their rounding
/// are the kernel's and write_kv's alike, tests/tests/kernels.rs holds the kernel's bits).
#[test]
fn eight_rows_packed_q8_kv_cache() {
    eight_rows_with(&root().join("tests/fixtures-trained/qwen3/q4"), Precision::Packed, KvElem::Q8, Activations::I16);
}

/// 8-bit activations in the CPU kernel's packed products (`vpdpbusd` for a prompt's rows on
/// AVX-512 VNNI): prompts in chunks, eight rows, a kept prefix and verify calls still give
/// mlx-lm's tokens on the confident trained fixture, and rows stay independent (each row's
/// x is quantized on its own; tests/tests/kernels.rs holds every object to the model's bits).
#[test]
fn eight_rows_packed_i8_activations() {
    eight_rows_with(&root().join("tests/fixtures-trained/qwen3/q4"), Precision::Packed, KvElem::F32, Activations::I8);
}

/// A DeltaNet model packed, where its update runs in the CPU kernel on this host: the
/// kernel updates each row's state where it lies, once for a padding row that repeats a
/// real one's slot (the random fixture: mlx-lm's own 4-bit tokens).
#[test]
fn eight_rows_packed_recurrent() {
    eight_rows_give_what_each_prompt_gives_alone(&root().join("tests/fixtures/qwen3_5/q4"), Precision::Packed);
}

/// The logits of row 0 of a decode step, with slot 0 holding `cases[0]` and the other slots
/// (and rows) holding `others`.
fn row0_logits(engine: &mut Engine, first: &Reference, others: &[Reference]) -> Vec<u32> {
    engine.reset(0);
    let mut rows = vec![(0, engine.prefill(0, &first.prompt_ids).unwrap().next)];
    for (i, c) in others.iter().enumerate() {
        engine.reset(i + 1);
        rows.push((i + 1, engine.prefill(i + 1, &c.prompt_ids).unwrap().next));
    }
    let steps = engine.decode(&rows).unwrap();
    steps[0].logits().unwrap().iter().map(|x| x.to_bits()).collect()
}

/// Rows are independent: row 0's logits are bit-identical whatever the other rows of the
/// same step hold (other prompts, other positions, padding rows), at f32 and packed.
#[test]
fn a_rows_logits_do_not_depend_on_the_other_rows() {
    let _turn = beside();
    // Packed through the host's default kernel only: tests/tests/kernels.rs proves every
    // object gives each row the bits the Rust model gives that row alone, at 1, 3, 8 and 13
    // rows, so another object cannot make rows depend on each other.
    for (variant, precision) in [("f32", Precision::F32), ("q4", Precision::Packed)] {
        let dir = root().join("tests/fixtures-trained/qwen3").join(variant);
        let cases = cases(&dir);
        let mut engine = engine(&dir, precision);
        let full = row0_logits(&mut engine, &cases[0], &cases[1..]);
        let mut reversed: Vec<Reference> = cases[1..].to_vec();
        reversed.reverse();
        assert_eq!(full, row0_logits(&mut engine, &cases[0], &reversed), "{precision}: other rows reordered");
        // Five rows run the 8-row function with three padding rows.
        assert_eq!(full, row0_logits(&mut engine, &cases[0], &cases[3..7]), "{precision}: fewer rows, padded");
        assert_ne!(full, row0_logits(&mut engine, &cases[1], &cases[2..]), "{precision}: a different row 0 differs");
    }
}

/// Once loaded, an engine never compiles: a mix of prompt lengths (crossing chunk sizes and
/// the end of the context), batch sizes 1 to 8 and slot reuse runs without one compile.
#[test]
fn nothing_is_compiled_after_the_engine_has_started() {
    let _turn = alone();
    // The module of eight_rows_give_what_each_prompt_gives_alone.
    let dir = root().join("tests/fixtures/qwen3/f32");
    let mut engine = engine(&dir, Precision::F32);
    let compiles = engine::cache::compiles();
    let prompt =
        |len: usize, seed: usize| -> Vec<u32> { (0..len).map(|i| ((i * 7 + seed * 13) % 300 + 1) as u32).collect() };
    for (round, lens) in [[1, 17, 63, 5, 16, 40, 2, 33], [64, 1, 1, 20, 50, 15, 8, 60]].iter().enumerate() {
        let mut rows = Vec::new();
        for (slot, &len) in lens.iter().enumerate() {
            engine.reset(slot);
            rows.push((slot, engine.prefill(slot, &prompt(len, slot + round)).unwrap().next));
        }
        for batch in 1..=MAX_BATCH {
            let live: Vec<(usize, u32)> = rows
                .iter()
                .copied()
                .filter(|(slot, _)| engine.position(*slot) < engine.max_context())
                .take(batch)
                .collect();
            if live.is_empty() {
                break;
            }
            engine.decode(&live).unwrap();
        }
    }
    assert_eq!(engine::cache::compiles(), compiles, "modules compiled or loaded after start");
    // A full slot is an error, not a compile of a bigger shape.
    engine.reset(0);
    engine.prefill(0, &prompt(64, 0)).unwrap();
    let err = engine.decode(&[(0, 1)]).unwrap_err().to_string();
    assert_eq!(err, "context full: slot 0 holds 64 positions, 1 more exceed the maximum context 64");
    engine.reset(1);
    let err = engine.prefill(1, &prompt(65, 0)).unwrap_err().to_string();
    assert_eq!(err, "context full: slot 1 holds 0 positions, 65 more exceed the maximum context 64");
    let err = engine.decode(&[(1, 1), (1, 2)]).unwrap_err().to_string();
    assert_eq!(err, "slot 1 appears twice in one step");
    let err = engine.decode(&[(8, 1)]).unwrap_err().to_string();
    assert_eq!(err, "slot 8 does not exist (the engine has 8)");
    assert_eq!(engine::cache::compiles(), compiles);
}

/// Two engines in one process, each on its own thread, loading while the other runs: both
/// reproduce mlx-lm's trajectories (no process-wide lock orders them; iree-hal makes one
/// IREE instance per process, see crates/iree-hal/tests/threads.rs for the cause).
#[test]
fn two_engines_run_at_the_same_time() {
    let _turn = beside();
    // Modules of eight_rows_give_what_each_prompt_gives_alone.
    let threads: Vec<_> = ["qwen3", "llama_llama3_tied"]
        .into_iter()
        .map(|name| {
            std::thread::spawn(move || {
                let dir = root().join("tests/fixtures").join(name).join("f32");
                let refs =
                    gate::references_from_json(&std::fs::read_to_string(dir.join("expected.json")).unwrap()).unwrap();
                let mut engine = engine(&dir, Precision::F32);
                for _ in 0..3 {
                    for r in &refs {
                        let got = gate::trajectory(&mut engine, &r.prompt_ids, r.token_ids.len()).unwrap();
                        assert_eq!(got, r.token_ids, "{name}: prompt {:?}", r.prompt_ids);
                    }
                }
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
}

/// Each case of `cases` alone in slot 0: the tokens and the logits' bits of its first
/// STEPS steps (prefill, then single-row decode).
fn alone_with_logits(engine: &mut Engine, cases: &[Reference]) -> Vec<Vec<(u32, Vec<u32>)>> {
    let bits = |step: &engine::Step| -> (u32, Vec<u32>) {
        (step.next, step.logits().unwrap().iter().map(|x| x.to_bits()).collect())
    };
    cases
        .iter()
        .map(|c| {
            engine.reset(0);
            let mut step = engine.prefill(0, &c.prompt_ids).unwrap();
            let mut out = vec![bits(&step)];
            while out.len() < STEPS {
                step = engine.decode_one(0, step.next).unwrap();
                out.push(bits(&step));
            }
            out
        })
        .collect()
}

/// Largest difference of a logit from alone where a prompt is read in other pieces, as a
/// share of the largest logit's magnitude.
const LOGIT_TOLERANCE: f32 = 1e-4;

/// Mixed calls (every sequence's new tokens in one call: prompt chunks beside decode rows)
/// give each sequence the tokens and the logits, bit for bit, that it gets alone, with
/// prompts split across calls and sequences joining while others decode; and they compile
/// nothing after start. Packed on the host's kernel, where the engine has mixed calls.
#[test]
fn mixed_steps_give_each_sequence_what_it_gets_alone() {
    let _turn = beside();
    let dir = root().join("tests/fixtures-trained/qwen3/q4");
    let cases = cases(&dir);
    let mut engine = engine(&dir, Precision::Packed);
    if kernels::cpu::host_isa().is_some() {
        assert_eq!(engine.step_rows(), 64, "the plan's largest mixed call");
    }
    let want = alone_with_logits(&mut engine, &cases);
    let compiles = engine::cache::compiles();
    for slot in 0..MAX_BATCH {
        engine.reset(slot);
    }
    // Sequence i joins at turn i / 2 and reads its prompt in pieces of at most 3 tokens
    // (odd i) or all at once (even i), so calls hold several prompts' pieces, first
    // tokens and decode rows together.
    let mut read = [0usize; MAX_BATCH];
    let mut got: Vec<Vec<(u32, Vec<u32>)>> = vec![Vec::new(); MAX_BATCH];
    for turn in 0.. {
        let mut batch: Vec<(usize, Vec<u32>)> = Vec::new();
        for (i, c) in cases.iter().enumerate() {
            let prompt = &c.prompt_ids;
            if turn < i / 2 || got[i].len() == STEPS {
                continue;
            }
            if read[i] < prompt.len() {
                let take = if i % 2 == 1 { 3.min(prompt.len() - read[i]) } else { prompt.len() - read[i] };
                batch.push((i, prompt[read[i]..read[i] + take].to_vec()));
            } else {
                batch.push((i, vec![got[i].last().unwrap().0]));
            }
        }
        if batch.is_empty() {
            break;
        }
        let calls: Vec<(usize, &[u32])> = batch.iter().map(|(slot, t)| (*slot, t.as_slice())).collect();
        let steps = engine.step(&calls).unwrap();
        for ((slot, tokens), step) in batch.iter().zip(steps) {
            let len = cases[*slot].prompt_ids.len();
            if read[*slot] < len {
                read[*slot] += tokens.len();
                if read[*slot] < len {
                    continue; // a piece of the prompt: its step is not one of the STEPS
                }
            }
            let logits = step.logits().unwrap().iter().map(|x| x.to_bits()).collect();
            got[*slot].push((step.next, logits));
        }
        assert!(turn < 4 * STEPS, "the mixed steps did not finish");
    }
    for (i, (got, want)) in got.iter().zip(&want).enumerate() {
        let tokens = |v: &[(u32, Vec<u32>)]| -> Vec<u32> { v.iter().map(|s| s.0).collect() };
        assert_eq!(tokens(got), tokens(want), "sequence {i}: tokens in mixed steps against alone");
        assert_eq!(tokens(got), cases[i].token_ids, "sequence {i}: mlx-lm's tokens");
        for (s, (g, w)) in got.iter().zip(want).enumerate() {
            if i % 2 == 0 {
                assert!(g.1 == w.1, "sequence {i}, step {s}: logits differ from alone");
            } else {
                // A prompt read in pieces: attention's online softmax then takes the earlier
                // pieces' keys from the cache, a block boundary of their own, so the sums
                // round differently (as a prompt longer than one chunk does alone).
                let worst =
                    g.1.iter()
                        .zip(&w.1)
                        .map(|(a, b)| (f32::from_bits(*a) - f32::from_bits(*b)).abs())
                        .fold(0.0, f32::max);
                let scale = w.1.iter().map(|b| f32::from_bits(*b).abs()).fold(0.0, f32::max);
                assert!(worst <= LOGIT_TOLERANCE * scale, "sequence {i}, step {s}: logits {worst:e} from alone");
            }
        }
    }
    assert_eq!(engine::cache::compiles(), compiles, "modules compiled or loaded after start");
    // Refusals, each naming its cause.
    let err = |engine: &mut Engine, batch: &[(usize, &[u32])]| engine.step(batch).unwrap_err().to_string();
    assert_eq!(err(&mut engine, &[(1, &[1]), (1, &[2, 3])]), "slot 1 appears twice in one step");
    assert_eq!(err(&mut engine, &[(2, &[])]), "empty prompt");
    if engine.step_rows() > 0 {
        let nine = [1u32; 9];
        let all: Vec<(usize, &[u32])> = (0..MAX_BATCH).map(|slot| (slot, &nine[..])).collect();
        for slot in 0..MAX_BATCH {
            engine.reset(slot);
        }
        assert_eq!(err(&mut engine, &all), "72 rows exceed the 64 rows one call takes");
    }
    assert_eq!(err(&mut engine, &[]), engine::Error::NoRows.to_string());
}
