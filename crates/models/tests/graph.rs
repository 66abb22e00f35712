//! What the emitted graphs read the KV cache with (the text IREE gets).

#![allow(clippy::unwrap_used)] // a test that cannot unwrap has failed; helpers included

use models::graph::{EmitOptions, SlotRead, emit_functions};
use models::{Backend, CacheShape, Function, KvElem, Layout, ModelConfig, Precision};
use std::path::Path;

fn emit(slots: usize, rows: usize, slot_read: SlotRead) -> String {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures/llama_llama3_tied/f32/config.json");
    let cfg = ModelConfig::from_file(&path).unwrap();
    let cache = CacheShape { slots, positions: 64, elem: KvElem::F32, scratch: false };
    let functions = [Function::Decode { rows, window: 32 }];
    let options = EmitOptions { slot_read, ..EmitOptions::default() };
    let backend = Backend { emit: options, ..Backend::default() };
    emit_functions(&cfg, &Layout::dense_on(&cfg, Precision::F32, &backend), cache, &functions, None).unwrap()
}

#[test]
fn single_row_decode_slices_its_slot_only_when_asked() {
    assert!(!emit(4, 1, SlotRead::Gather).contains("stablehlo.dynamic_slice"));
    assert!(emit(4, 1, SlotRead::Slice).contains("stablehlo.dynamic_slice"));
    // One slot: nothing to choose, no offset to read back.
    assert!(!emit(1, 1, SlotRead::Slice).contains("stablehlo.dynamic_slice"));
    // Several rows keep the gather (one slice per row would be a copy per row).
    assert!(!emit(4, 2, SlotRead::Slice).contains("stablehlo.dynamic_slice"));
}

#[test]
fn decode_reads_each_layer_by_a_static_slice() {
    // The layer is never a gather index: IREE copied such windows element by element.
    let text = emit(4, 1, SlotRead::Gather);
    assert!(text.contains("stablehlo.slice"));
    assert!(!text.contains("collapsed_slice_dims = [0, 1]"), "a gather at (layer, slot) in decode");
}
