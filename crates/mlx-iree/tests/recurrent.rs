//! The layers with a per-sequence state (Qwen3.5's and Qwen3-Next's gated DeltaNet): a long
//! prompt gives the same greedy tokens whether it is fed one token at a time (decode
//! calls), in 16-token or 128-token prefill chunks, or whole (the plan's own cover), so the
//! state is carried across calls; and a slot reused after a finished request, beside other
//! busy slots, gives what a fresh engine gives (the state is reset at position 0).
//! fixtures.rs holds these families to mlx-lm's own tokens; this file holds the engine's
//! bookkeeping of their state, at f32 (the graph's scan) and, for the DeltaNet families,
//! packed 4-bit where this host runs the CPU kernels (the `delta` kernel, which updates the
//! state in place, and its handling of decode's padding rows).

#![allow(clippy::unwrap_used)] // a test that cannot unwrap has failed; helpers included

use engine::{Engine, EngineConfig, Precision};
use std::path::{Path, PathBuf};

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// Longer than the largest prefill chunk (128) and the conv kernel (4), so that every way
/// of feeding it crosses call boundaries inside the convolution window and the scan.
const PROMPT: usize = 150;
const STEPS: usize = 24;

/// `family`'s engine: `variant` "f32" at f32, "q4" packed.
fn engine(family: &str, variant: &str) -> Engine {
    let precision = if variant == "f32" { Precision::F32 } else { Precision::Packed };
    let config = EngineConfig {
        max_batch: 4,
        max_context: Some(256),
        store_parameters: false,
        ..EngineConfig::new("local-task", precision, root().join("target/test-compile-cache"))
    };
    Engine::load(&root().join("tests/fixtures").join(family).join(variant), &config).unwrap()
}

/// A fixed pseudo-random prompt of `len` ids below `vocab` (xorshift, seeded per use).
fn prompt(seed: u64, len: usize, vocab: usize) -> Vec<u32> {
    let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            (x % vocab as u64) as u32
        })
        .collect()
}

/// Feeds `prompt` to `slot` in pieces of `piece` tokens (1: a decode call per token), then
/// decodes greedily; returns the STEPS generated ids.
fn greedy(engine: &mut Engine, slot: usize, prompt: &[u32], piece: usize) -> Vec<u32> {
    engine.reset(slot);
    let mut next = 0;
    for part in prompt.chunks(piece) {
        next = if piece == 1 { engine.decode_one(slot, part[0]) } else { engine.prefill(slot, part) }.unwrap().next;
    }
    let mut out = vec![next];
    while out.len() < STEPS {
        out.push(engine.decode_one(slot, next).unwrap().next);
        next = *out.last().unwrap();
    }
    out
}

fn chunking_does_not_change_the_tokens(family: &str, variant: &str) {
    let mut engine = engine(family, variant);
    let prompt = prompt(7, PROMPT, engine.config().vocab);
    let whole = greedy(&mut engine, 0, &prompt, PROMPT);
    // Not a degenerate run (every continuation the same id) that any state would give.
    assert!(whole.iter().any(|t| *t != whole[0]), "{family}: {whole:?}");
    for piece in [1, 16, 128] {
        assert_eq!(greedy(&mut engine, 1, &prompt, piece), whole, "{family}: prompt in pieces of {piece}");
    }
}

/// Slot 0 runs a long request to the end; slots 1 and 2 keep decoding their own; slot 0
/// then takes a short new request, which must give what a fresh engine gives it.
fn a_reused_slot_starts_from_a_fresh_state(family: &str, variant: &str) {
    let mut engine = engine(family, variant);
    let vocab = engine.config().vocab;
    let (first, second) = (prompt(11, PROMPT, vocab), prompt(12, 9, vocab));
    let others = [prompt(13, 20, vocab), prompt(14, 33, vocab)];
    let mut rows: Vec<(usize, u32)> =
        others.iter().enumerate().map(|(i, p)| (i + 1, engine.prefill(i + 1, p).unwrap().next)).collect();
    let advance = |engine: &mut Engine, rows: &mut Vec<(usize, u32)>| {
        let steps = engine.decode(rows).unwrap();
        for (row, step) in rows.iter_mut().zip(steps) {
            row.1 = step.next;
        }
    };
    greedy(&mut engine, 0, &first, 16);
    advance(&mut engine, &mut rows);
    let reused = greedy(&mut engine, 0, &second, 16);
    advance(&mut engine, &mut rows);
    let fresh = greedy(&mut self::engine(family, variant), 0, &second, 16);
    assert_eq!(reused, fresh, "{family}: slot 0 after a finished request");
    // The same through single-token calls (the decode path's reset) on a reused slot.
    assert_eq!(greedy(&mut engine, 0, &second, 1), fresh, "{family}: slot 0 fed token by token");
}

macro_rules! per_family {
    ($($family:ident),*) => {$(
        mod $family {
            #[test]
            fn chunking_does_not_change_the_tokens() {
                super::chunking_does_not_change_the_tokens(stringify!($family), "f32");
            }
            #[test]
            fn a_reused_slot_starts_from_a_fresh_state() {
                super::a_reused_slot_starts_from_a_fresh_state(stringify!($family), "f32");
            }
        }
    )*};
}

per_family!(qwen3_5, qwen3_next, lfm2);

/// The same at packed 4-bit, where the DeltaNet update runs in the CPU kernel (this host
/// has one; else the graph again, which the f32 tests already hold).
mod delta_kernel {
    #[test]
    fn chunking_does_not_change_the_tokens() {
        super::chunking_does_not_change_the_tokens("qwen3_5", "q4");
    }
    #[test]
    fn a_reused_slot_starts_from_a_fresh_state() {
        super::a_reused_slot_starts_from_a_fresh_state("qwen3_5", "q4");
        super::a_reused_slot_starts_from_a_fresh_state("qwen3_next", "q4");
    }
}
