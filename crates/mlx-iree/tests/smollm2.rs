//! The default real model: SmolLM2-135M-Instruct converted by `cargo xtask model` (GGUF ->
//! HF -> mlx_lm.convert f16 and 4-bit). On local-task at f32, greedy trajectories equal the
//! float32 mlx-lm oracle's (`oracle.json`, made by the same command) for all 48 steps.

#![allow(clippy::unwrap_used)] // a test that cannot unwrap has failed; helpers included

use engine::{Engine, EngineConfig, Precision};
use serde_json::Value;
use std::path::{Path, PathBuf};
use std::process::Command;

/// |logit difference| allowed against mlx-lm's float32 first-step logits (magnitudes ~20).
const LOGIT_TOL: f32 = 1e-3;

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn model(name: &str) -> PathBuf {
    let dir = root().join("target/models").join(name);
    assert!(dir.join("oracle.json").exists(), "test model missing at {}: run `cargo xtask model` first", dir.display());
    dir
}

/// A compile cache shared by these tests and reruns (the graph is the same for both models).
fn cache_dir() -> PathBuf {
    root().join("target/test-compile-cache")
}

fn ids(v: &Value) -> Vec<u32> {
    v.as_array().unwrap().iter().map(|x| x.as_u64().unwrap() as u32).collect()
}

fn check(name: &str) {
    let dir = model(name);
    let oracle: Value = serde_json::from_str(&std::fs::read_to_string(dir.join("oracle.json")).unwrap()).unwrap();
    let steps = oracle["steps"].as_u64().unwrap() as usize;
    assert!(steps >= 32);
    let trajectories = oracle["trajectories"].as_array().unwrap();
    let longest = trajectories.iter().map(|t| ids(&t["prompt_ids"]).len()).max().unwrap();
    let config = EngineConfig {
        max_context: Some((longest + steps).next_power_of_two()),
        ..EngineConfig::new("local-task", Precision::F32, cache_dir())
    };
    let mut engine = Engine::load(&dir, &config).unwrap();
    for t in trajectories {
        let (prompt, want) = (ids(&t["prompt_ids"]), ids(&t["token_ids"]));
        engine.reset(0);
        let first = engine.prefill(0, &prompt).unwrap();
        let mlx: Vec<f32> = t["first_logits"].as_array().unwrap().iter().map(|x| x.as_f64().unwrap() as f32).collect();
        let diff = first.logits().unwrap().iter().zip(&mlx).map(|(a, b)| (a - b).abs()).fold(0.0f32, f32::max);
        assert!(diff <= LOGIT_TOL, "{name} {}: first logits differ from mlx-lm by {diff}", t["kind"]);
        let mut got = vec![first.next];
        while got.len() < steps {
            got.push(engine.decode_one(0, *got.last().unwrap()).unwrap().next);
        }
        let exact = got.iter().zip(&want).take_while(|(a, b)| a == b).count();
        assert_eq!(got, want, "{name} {}: token-exact for {exact} of {steps} steps", t["kind"]);
    }
}

#[test]
fn f16_checkpoint_matches_mlx_lm() {
    check("smollm2-135m-instruct-f16");
}

#[test]
fn q4_checkpoint_matches_mlx_lm() {
    check("smollm2-135m-instruct-4bit");
}

fn cli(args: &[&str]) -> (i32, String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_mlx-iree"))
        .args(args)
        .env("MLX_IREE_CACHE_DIR", cache_dir())
        .output()
        .unwrap();
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into(),
        String::from_utf8_lossy(&out.stderr).into(),
    )
}

#[test]
fn generate_chat_answers_paris() {
    let dir = model("smollm2-135m-instruct-4bit");
    let (code, stdout, stderr) = cli(&[
        "generate",
        "--model",
        dir.to_str().unwrap(),
        "--chat",
        "--prompt",
        "What is the capital of France?",
        "--max-tokens",
        "24",
        // The context of every SmolLM2 engine in the tests (common::SMOLLM2_CONTEXT), so the
        // module is compiled once for all of them; the default is the model's 8192.
        "--max-context",
        "128",
    ]);
    assert_eq!(code, 0, "{stderr}");
    assert!(stdout.contains("Paris"), "answer: {stdout}");
    assert!(stderr.contains("prompt tokens: 37"), "summary line: {stderr}");
    assert!(stderr.contains("decode:") && stderr.contains("tok/s"), "{stderr}");
    // The CPU default for a 4-bit checkpoint: packed where a kernel measured faster than f16
    // runs, else f16.
    let default = engine::device::default_precision("local-task", &dir);
    assert!(stderr.contains(&format!("(local-task, {default})")), "{default} is the CPU default: {stderr}");
}

/// Speculative decoding from the command line: prompt lookup and the f16 twin as draft
/// model give the answer plain decoding gives, with drafts accepted (the summary line's
/// count), on a prompt whose answer repeats it.
#[test]
fn generate_with_drafts_answers_as_without() {
    let dir = model("smollm2-135m-instruct-4bit");
    let twin = model("smollm2-135m-instruct-f16");
    let (dir, twin) = (dir.to_str().unwrap(), twin.to_str().unwrap());
    let prompt = "Copy this line exactly: the quick brown fox jumps over the lazy dog, and the lazy dog sleeps.";
    let run = |extra: &[&str]| {
        let args =
            [
                &[
                    "generate",
                    "--model",
                    dir,
                    "--chat",
                    "--prompt",
                    prompt,
                    "--max-tokens",
                    "40",
                    "--max-context",
                    "128",
                ][..],
                extra,
            ]
            .concat();
        let (code, stdout, stderr) = cli(&args);
        assert_eq!(code, 0, "{extra:?}: {stderr}");
        (stdout, stderr)
    };
    let (plain, summary) = run(&[]);
    assert!(!summary.contains("draft:"), "{summary}");
    for extra in [&["--draft", "ngram"][..], &["--draft-model", twin, "--draft-tokens", "3"]] {
        let (answer, summary) = run(extra);
        assert_eq!(answer, plain, "{extra:?}");
        let counts = summary.split("draft: ").nth(1).unwrap_or_else(|| panic!("{extra:?}: {summary}"));
        let accepted: usize = counts.split('/').next().unwrap().parse().unwrap();
        assert!(accepted > 0, "{extra:?}: {summary}");
        assert!(counts.contains("accepted") && counts.contains("tokens per call"), "{summary}");
    }
}

/// A draft model whose tokenizer gives an id another token is refused before anything is
/// compiled, in one line naming the id.
#[test]
fn a_draft_model_with_another_tokenizer_is_refused() {
    let twin = model("smollm2-135m-instruct-f16");
    let draft = tempfile::tempdir().unwrap();
    for file in ["config.json", "model.safetensors", "model.safetensors.index.json"] {
        std::os::unix::fs::symlink(twin.join(file), draft.path().join(file)).unwrap();
    }
    let mut tokenizer: Value =
        serde_json::from_str(&std::fs::read_to_string(twin.join("tokenizer.json")).unwrap()).unwrap();
    // Two tokens' ids swapped.
    let vocab = tokenizer["model"]["vocab"].as_object_mut().unwrap();
    assert_eq!(vocab.insert("ĠMama".into(), 49151.into()), Some(Value::from(49150)));
    assert_eq!(vocab.insert("ectable".into(), 49150.into()), Some(Value::from(49151)));
    std::fs::write(draft.path().join("tokenizer.json"), tokenizer.to_string()).unwrap();
    let dir = model("smollm2-135m-instruct-4bit");
    let cache = tempfile::tempdir().unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_mlx-iree"))
        .args(["generate", "--model", dir.to_str().unwrap(), "--prompt", "hi", "--draft-model"])
        .arg(draft.path())
        .env("MLX_IREE_CACHE_DIR", cache.path())
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert_eq!(
        stderr.trim_end(),
        "mlx-iree: error: --draft-model: its tokenizer is not the model's (id 49150 is \"ectable\" there, \"ĠMama\" here)"
    );
    assert_eq!(std::fs::read_dir(cache.path()).map_or(0, |d| d.count()), 0, "compiled before refusing");
}

/// The sampling flags reach the sampler: `--logit-bias ID=100` makes every token ID, greedy
/// or sampled.
#[test]
fn generate_logit_bias_forces_a_token() {
    let dir = model("smollm2-135m-instruct-4bit");
    let tokenizer = text::tokenizer::Tokenizer::from_dir(&dir).unwrap();
    let forced = tokenizer.encode(" banana", false).unwrap()[0];
    let want = tokenizer.decode(&[forced; 3], true).unwrap();
    let bias = format!("{forced}=100");
    for sampling in [&["--temperature", "0"][..], &["--temperature", "1", "--seed", "3", "--frequency-penalty", "1"]] {
        let dir = dir.to_str().unwrap();
        let args = [
            &["generate", "--model", dir, "--prompt", "Hello", "--max-tokens", "3", "--max-context", "128"][..],
            &["--logit-bias", &bias],
            sampling,
        ]
        .concat();
        let (code, stdout, stderr) = cli(&args);
        assert_eq!(code, 0, "{stderr}");
        assert_eq!(stdout.strip_suffix('\n').unwrap_or(&stdout), want, "{sampling:?}");
    }
}

#[test]
fn trajectory_cli_writes_the_oracle_ids() {
    let dir = model("smollm2-135m-instruct-f16");
    let oracle: Value = serde_json::from_str(&std::fs::read_to_string(dir.join("oracle.json")).unwrap()).unwrap();
    let raw = oracle["trajectories"].as_array().unwrap().iter().find(|t| t["kind"] == "raw").unwrap();
    let out = tempfile::tempdir().unwrap();
    let file = out.path().join("t.json");
    let (code, _, stderr) = cli(&[
        "trajectory",
        "--model",
        dir.to_str().unwrap(),
        "--precision",
        "f32",
        "--prompt",
        "The capital of France is",
        "--steps",
        "32",
        "--max-context",
        "128",
        "--out",
        file.to_str().unwrap(),
    ]);
    assert_eq!(code, 0, "{stderr}");
    let got: Value = serde_json::from_str(&std::fs::read_to_string(&file).unwrap()).unwrap();
    assert_eq!(got["prompt_ids"], raw["prompt_ids"]);
    assert_eq!(ids(&got["token_ids"]), ids(&raw["token_ids"])[..32].to_vec());
    assert_eq!(got["device"], "local-task");
    assert_eq!(got["precision"], "f32");
}
