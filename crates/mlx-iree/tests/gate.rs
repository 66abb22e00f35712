//! The accuracy gate: its arithmetic, f16/bf16 against f32 on real weights and fixtures, and
//! packed against mlx-lm itself.

#![allow(clippy::unwrap_used)] // a test that cannot unwrap has failed; helpers included

use mlx_iree::engine::{Engine, Precision, plan};
use mlx_iree::gate::{self, PromptResult, Reference, Report};
use std::path::{Path, PathBuf};
use std::process::Command;

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

#[test]
fn pass_rule() {
    let p = |steps, exact, agreeing| PromptResult {
        prompt_len: 1,
        steps,
        exact_steps: exact,
        first_divergence: (exact < steps).then_some(exact),
        agreeing_steps: agreeing,
    };
    assert!(Report { prompts: vec![p(40, 40, 40), p(40, 40, 40)] }.passed());
    // 199 of 200 agree: 99.5% >= 99%.
    let r = Report { prompts: vec![p(100, 10, 99), p(100, 100, 100)] };
    assert!(!r.all_exact() && r.passed());
    // 197 of 200: 98.5%.
    assert!(!Report { prompts: vec![p(100, 10, 97), p(100, 100, 100)] }.passed());
}

#[test]
fn references_from_both_json_forms() {
    let one = r#"{"prompt_ids":[1,2],"token_ids":[3,4,5],"device":"local-task","precision":"f32"}"#;
    assert_eq!(
        gate::references_from_json(one).unwrap(),
        vec![Reference { prompt_ids: vec![1, 2], token_ids: vec![3, 4, 5] }]
    );
    let many = r#"{"trajectories":[{"prompt_ids":[1],"token_ids":[2]},{"prompt_ids":[3],"token_ids":[4]}]}"#;
    assert_eq!(gate::references_from_json(many).unwrap().len(), 2);
    assert_eq!(gate::references_from_json(r#"{"prompt_ids":[1]}"#).unwrap_err(), "missing `token_ids` list");
    assert_eq!(
        gate::references_from_json(r#"{"prompt_ids":[1],"token_ids":[-1]}"#).unwrap_err(),
        "`token_ids` holds a non-id -1"
    );
}

/// Every fixture folder (one per model family and option), sorted.
fn fixtures() -> Vec<PathBuf> {
    let dir = root().join("tests/fixtures");
    let mut names: Vec<_> =
        std::fs::read_dir(&dir).unwrap().flatten().filter(|e| e.path().is_dir()).map(|e| e.path()).collect();
    names.sort();
    assert!(names.len() >= 8);
    names
}

/// f16 weights against the f32 path, teacher-forced along the f32 trajectories of every
/// fixture variant's prompts (40 steps): the gate passes on all of them.
#[test]
fn f16_passes_the_gate_on_every_fixture() {
    let cache = root().join("target/test-compile-cache");
    for fixture in fixtures() {
        for variant in ["f32", "q4", "q8"] {
            let dir = fixture.join(variant);
            let text = std::fs::read_to_string(dir.join("expected.json")).unwrap();
            let prompts: Vec<Vec<u32>> =
                gate::references_from_json(&text).unwrap().into_iter().map(|r| r.prompt_ids).collect();
            let shape = plan(prompts.iter().map(Vec::len).max().unwrap(), 40);
            let mut f32 = Engine::load_cached(&dir, "local-task", Precision::F32, shape, &cache).unwrap();
            let refs: Vec<Reference> = prompts
                .into_iter()
                .map(|p| Reference { token_ids: gate::trajectory(&mut f32, &p, 40).unwrap(), prompt_ids: p })
                .collect();
            drop(f32);
            let mut f16 = Engine::load_cached(&dir, "local-task", Precision::F16, shape, &cache).unwrap();
            let report = gate::check(&mut f16, &refs).unwrap();
            assert!(report.passed(), "{}: f16 agreement {:.3}", dir.display(), report.agreement());
        }
    }
}

/// Packed 4- and 8-bit weights, dequantized inside the contractions, against mlx-lm's own
/// float32 trajectories of every quantized fixture: token-exact for all 40 steps.
#[test]
fn packed_matches_mlx_lm_on_every_quantized_fixture() {
    let cache = root().join("target/test-compile-cache");
    for fixture in fixtures() {
        for variant in ["q4", "q8"] {
            let dir = fixture.join(variant);
            let refs =
                gate::references_from_json(&std::fs::read_to_string(dir.join("expected.json")).unwrap()).unwrap();
            let shape = plan(refs.iter().map(|r| r.prompt_ids.len()).max().unwrap(), 40);
            let mut packed = Engine::load_cached(&dir, "local-task", Precision::Packed, shape, &cache).unwrap();
            let report = gate::check(&mut packed, &refs).unwrap();
            assert!(report.all_exact(), "{}: packed agreement {:.3}", dir.display(), report.agreement());
        }
    }
}

/// The graph-level packed form (what CUDA and CPUs without the kernel run), forced on CPU
/// with `MLX_IREE_PACKED_KERNELS=0`, against mlx-lm on one quantized fixture per family.
#[test]
fn packed_graph_form_matches_mlx_lm() {
    for fixture in ["llama_llama3_tied/q4", "qwen3/q8", "gemma2_window/q4", "gemma3_text/q8"] {
        let dir = root().join("tests/fixtures").join(fixture);
        let reference = dir.join("expected.json");
        let out = Command::new(env!("CARGO_BIN_EXE_mlx-iree"))
            .args(["gate", "--model", dir.to_str().unwrap(), "--precision", "packed", "--steps", "40"])
            .args(["--reference", reference.to_str().unwrap()])
            .env("MLX_IREE_CACHE_DIR", root().join("target/test-compile-cache"))
            .env("MLX_IREE_PACKED_KERNELS", "0")
            .output()
            .unwrap();
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert_eq!(out.status.code(), Some(0), "{fixture}: {stdout}{}", String::from_utf8_lossy(&out.stderr));
        assert!(stdout.contains("token-exact on every prompt: yes"), "{fixture}: {stdout}");
    }
}

fn gate_cli(model: &str, precision: &str) -> (i32, String) {
    let dir = root().join("target/models").join(model);
    assert!(dir.join("config.json").exists(), "test model missing at {}: run `cargo xtask model` first", dir.display());
    let out = Command::new(env!("CARGO_BIN_EXE_mlx-iree"))
        .args(["gate", "--model", dir.to_str().unwrap(), "--precision", precision, "--steps", "32"])
        .env("MLX_IREE_CACHE_DIR", root().join("target/test-compile-cache"))
        .output()
        .unwrap();
    (out.status.code().unwrap_or(-1), String::from_utf8_lossy(&out.stdout).into_owned())
}

#[test]
fn smollm2_f16_and_bf16_pass_the_gate() {
    for precision in ["f16", "bf16"] {
        let (code, stdout) = gate_cli("smollm2-135m-instruct-f16", precision);
        assert_eq!(code, 0, "{stdout}");
        assert!(stdout.contains("-> PASS"), "{stdout}");
        assert_eq!(stdout.matches("prompt ").count(), 4, "{stdout}");
    }
}

/// SmolLM2's 4-bit conversion at the default precision, and packed through the CPU kernels
/// and through the graph-level form, against mlx-lm's float32 oracle: token-exact for all 48
/// steps of both prompts.
#[test]
fn gate_against_the_mlx_oracle_file() {
    let dir = root().join("target/models/smollm2-135m-instruct-4bit");
    let oracle = dir.join("oracle.json");
    // (precision, packed kernels on CPU)
    for (precision, kernels) in [(None, "1"), (Some("packed"), "1"), (Some("packed"), "0")] {
        let mut args = vec!["gate", "--model", dir.to_str().unwrap(), "--reference", oracle.to_str().unwrap()];
        args.extend(["--steps", "48"]);
        args.extend(precision.iter().flat_map(|p| ["--precision", p]));
        let out = Command::new(env!("CARGO_BIN_EXE_mlx-iree"))
            .args(&args)
            .env("MLX_IREE_CACHE_DIR", root().join("target/test-compile-cache"))
            .env("MLX_IREE_PACKED_KERNELS", kernels)
            .output()
            .unwrap();
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert_eq!(out.status.code(), Some(0), "{precision:?}: {stdout}");
        assert!(stdout.contains("token-exact on every prompt: yes") && stdout.contains("-> PASS"), "{stdout}");
    }
}
