//! Weights stored in final form (`EngineConfig::store_parameters`): the first load of a
//! data-tiled CPU module writes them beside the compiled module, a second load binds that
//! file without reading the checkpoint's tensors, and both give the same logits, bit for bit.

#![allow(clippy::unwrap_used)] // a test that cannot unwrap has failed; helpers included

use engine::cache::CompileReport;
use engine::{Engine, EngineConfig, Precision};
use std::path::{Path, PathBuf};

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// The shapes of crates/engine/tests/scheduler.rs and crates/mlx-iree/tests/batch.rs on this
/// fixture, so all three share one compiled module.
fn config() -> EngineConfig {
    EngineConfig {
        max_batch: 8,
        max_context: Some(64),
        ..EngineConfig::new("local-task", Precision::F32, root().join("target/test-compile-cache"))
    }
}

/// The logits after a prompt and after each of a few greedy decode steps, with their tokens.
fn run(engine: &mut Engine) -> (Vec<u32>, Vec<Vec<f32>>) {
    let mut step = engine.prefill(3, &[1, 2, 3, 4, 5]).unwrap();
    let (mut tokens, mut logits) = (vec![step.next], vec![step.logits().unwrap()]);
    for _ in 0..4 {
        step = engine.decode_one(3, step.next).unwrap();
        tokens.push(step.next);
        logits.push(step.logits().unwrap());
    }
    (tokens, logits)
}

fn bits(logits: &[Vec<f32>]) -> Vec<Vec<u32>> {
    logits.iter().map(|row| row.iter().map(|x| x.to_bits()).collect()).collect()
}

#[test]
fn second_load_maps_the_stored_weights_and_gives_the_same_logits() {
    // A copy of the fixture in a folder of its own: its stored weights are this test's alone
    // (the file name hashes the checkpoint's folder), while the module is the shared one.
    let dir = tempfile::tempdir().unwrap();
    let src = root().join("tests/fixtures-trained/qwen3/f32");
    for name in ["config.json", "model.safetensors", "model.safetensors.index.json"] {
        std::fs::copy(src.join(name), dir.path().join(name)).unwrap();
    }
    let config = config();

    let mut first = Engine::load(dir.path(), &config).unwrap();
    let stored = first.load_report().stored_parameters.clone().expect("a data-tiled CPU module stores its weights");
    assert!(stored.starts_with(&config.cache_dir), "{}", stored.display());
    assert_eq!(stored.extension().and_then(|e| e.to_str()), Some("irpa"));
    let written = std::fs::metadata(&stored).unwrap();
    let want = run(&mut first);
    drop(first);

    // Zero the checkpoint's tensors, keeping its size, header and modification time: a load
    // that read them would compute other logits (or, from a changed file, store new weights).
    let weights = dir.path().join("model.safetensors");
    let meta = std::fs::metadata(&weights).unwrap();
    let mut bytes = std::fs::read(&weights).unwrap();
    let header = 8 + u64::from_le_bytes(bytes[..8].try_into().unwrap()) as usize;
    bytes[header..].fill(0);
    std::fs::write(&weights, &bytes).unwrap();
    let file = std::fs::File::options().write(true).open(&weights).unwrap();
    file.set_modified(meta.modified().unwrap()).unwrap();
    drop(file);

    let mut second = Engine::load(dir.path(), &config).unwrap();
    assert!(matches!(second.load_report().compile, CompileReport::CacheHit));
    assert_eq!(second.load_report().stored_parameters.as_ref(), Some(&stored));
    let again = std::fs::metadata(&stored).unwrap();
    assert_eq!(again.modified().unwrap(), written.modified().unwrap(), "the stored weights were written again");
    assert_eq!(
        second.load_report().weight_bytes,
        std::fs::metadata(src.join("model.safetensors")).unwrap().len() as usize - header
    );
    let got = run(&mut second);
    assert_eq!(got.0, want.0);
    assert_eq!(bits(&got.1), bits(&want.1));
    drop(second);

    // A changed checkpoint (new modification time) gets weights stored anew, replacing the
    // old file; here its zeroed tensors give other logits.
    let file = std::fs::File::options().write(true).open(&weights).unwrap();
    file.set_modified(meta.modified().unwrap() + std::time::Duration::from_secs(1)).unwrap();
    drop(file);
    let mut third = Engine::load(dir.path(), &config).unwrap();
    let restored = third.load_report().stored_parameters.clone().unwrap();
    assert_ne!(restored, stored);
    assert!(!stored.exists(), "the stale stored weights were left behind");
    assert_ne!(bits(&run(&mut third).1), bits(&want.1));
    drop(third);
    std::fs::remove_file(restored).unwrap();
}

/// A recurrent family at a dense precision stores its weights, and the first load (writing
/// them) and the second (mapping them) give the tokens a load without stored weights gives.
/// IREE's encoder leaves Qwen3.5's `in_proj_b` and `in_proj_a` (4 rows in the fixture: their
/// data-tiled form would grow past its limit) read from the checkpoint's scope, which a load
/// binds beside the stored weights (`cache::named_keys`); without them the module failed to
/// load (`no parameter found in index with key 'model.layers.0.linear_attn.in_proj_b.weight'`).
#[test]
fn a_recurrent_family_loads_its_stored_weights_and_gives_the_same_tokens() {
    let dir = tempfile::tempdir().unwrap();
    let src = root().join("tests/fixtures/qwen3_5/f32");
    for name in ["config.json", "model.safetensors", "model.safetensors.index.json"] {
        std::fs::copy(src.join(name), dir.path().join(name)).unwrap();
    }
    let stored = EngineConfig {
        max_context: Some(64),
        ..EngineConfig::new("local-task", Precision::F32, root().join("target/test-compile-cache"))
    };
    let unstored = EngineConfig { store_parameters: false, ..stored.clone() };
    let tokens = |config: &EngineConfig| {
        let mut engine = Engine::load(dir.path(), config).unwrap();
        let mut step = engine.prefill(0, &[1, 2, 3, 4, 5]).unwrap();
        let mut tokens = vec![step.next];
        for _ in 0..4 {
            step = engine.decode_one(0, step.next).unwrap();
            tokens.push(step.next);
        }
        (tokens, engine.load_report().stored_parameters.clone())
    };

    let (want, none) = tokens(&unstored);
    assert_eq!(none, None);
    let (first, written) = tokens(&stored);
    let written = written.expect("a data-tiled CPU module stores its weights");
    let modified = || std::fs::metadata(&written).unwrap().modified().unwrap();
    let at = modified();
    let (second, mapped) = tokens(&stored);
    assert_eq!(mapped.as_ref(), Some(&written));
    assert_eq!(modified(), at, "the stored weights were written again");
    assert_eq!(first, want);
    assert_eq!(second, want);
    std::fs::remove_file(written).unwrap();
}
