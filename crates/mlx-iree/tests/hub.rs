//! `--model owner/name[@revision]` through the binary, against a loopback stand-in for the
//! Hugging Face hub (crates/hub/tests/mockhub) serving a fixture checkpoint: the greedy ids
//! equal the local folder's, a second run downloads nothing, offline mode runs from the
//! cache, every refusal is one line with exit status 2, and `serve` by repo id answers as
//! it does on the local folder.

#![allow(clippy::unwrap_used)] // a test that cannot unwrap has failed; helpers included

mod common;
#[path = "../../hub/tests/mockhub/mod.rs"]
mod mockhub;

use common::root;
use mockhub::{MockHub, MockRepo};
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

const ID: &str = "mlx-test/qwen3-f32";

fn fixture() -> PathBuf {
    root().join("tests/fixtures/qwen3/f32")
}

/// `mlx-iree trajectory` on `model` with the hub at `endpoint` and its cache under `hf_home`
/// (compiled modules shared with the other tests), plus `env`. Returns the output and the
/// token ids written.
fn trajectory(model: &str, endpoint: &str, hf_home: &Path, env: &[(&str, &str)]) -> (Output, Option<Vec<u64>>) {
    let out_dir = tempfile::tempdir().unwrap();
    let file = out_dir.path().join("t.json");
    let mut command = Command::new(env!("CARGO_BIN_EXE_mlx-iree"));
    command
        .args(["trajectory", "--model", model, "--prompt-ids", "1,2,3", "--steps", "4", "--max-context", "64"])
        .args(["--precision", "f32", "--out", file.to_str().unwrap()])
        .env("MLX_IREE_CACHE_DIR", common::compile_cache())
        .env("MLX_IREE_STORE_PARAMETERS", "0")
        .env("HF_ENDPOINT", endpoint)
        .env("HF_HOME", hf_home)
        .env_remove("HF_TOKEN")
        .env_remove("HF_HUB_OFFLINE")
        .env_remove("HF_HUB_CACHE");
    for (k, v) in env {
        command.env(k, v);
    }
    let output = command.output().unwrap();
    let ids = std::fs::read_to_string(&file).ok().map(|text| {
        let json: serde_json::Value = serde_json::from_str(&text).unwrap();
        json["token_ids"].as_array().unwrap().iter().map(|v| v.as_u64().unwrap()).collect()
    });
    (output, ids)
}

fn stderr(output: &Output) -> String {
    String::from_utf8_lossy(&output.stderr).into_owned()
}

#[test]
fn a_repo_id_runs_as_its_local_folder_does() {
    let source = MockRepo::from_dir(ID, &fixture());
    let mock = MockHub::start(vec![source.clone()]);
    let hf_home = tempfile::tempdir().unwrap();

    let (local, local_ids) = trajectory(fixture().to_str().unwrap(), &mock.endpoint, hf_home.path(), &[]);
    assert!(local.status.success(), "{}", stderr(&local));
    let local_ids = local_ids.unwrap();
    assert_eq!(local_ids.len(), 4);
    assert!(mock.log().is_empty(), "a local folder asked the hub: {:?}", mock.log());

    // The first download of the weights breaks off and is resumed by a Range request.
    mock.cut_once("model.safetensors", 200_000);
    let (first, ids) = trajectory(ID, &mock.endpoint, hf_home.path(), &[]);
    let err = stderr(&first);
    assert!(first.status.success(), "{err}");
    assert_eq!(ids.unwrap(), local_ids);
    assert!(err.contains("downloading model.safetensors (684.2 KiB)"), "{err}");
    assert!(err.contains("downloaded model.safetensors: 684.2 KiB in"), "{err}");
    let storage: Vec<_> = mock.log().into_iter().filter(|r| r.path.starts_with("/cdn/")).collect();
    assert_eq!(storage.len(), 2, "{storage:?}");
    assert_eq!(storage[1].range.as_deref(), Some("bytes=200000-"));
    let snapshot = hf_home.path().join("hub/models--mlx-test--qwen3-f32/snapshots").join(&source.commit);
    for file in ["config.json", "model.safetensors", "model.safetensors.index.json"] {
        assert_eq!(std::fs::read(snapshot.join(file)).unwrap(), source.files[file], "{file}");
    }
    // The fixture's trajectories are no model file: never fetched.
    assert!(!mock.log().iter().any(|r| r.path.contains("expected")), "{:?}", mock.log());

    // A second run resolves the revision and downloads nothing.
    mock.clear_log();
    let (second, ids) = trajectory(ID, &mock.endpoint, hf_home.path(), &[]);
    assert!(second.status.success(), "{}", stderr(&second));
    assert_eq!(ids.unwrap(), local_ids);
    assert!(mock.file_requests().is_empty(), "{:?}", mock.file_requests());
    assert!(!stderr(&second).contains("downloading"), "{}", stderr(&second));

    // Offline, from the cache alone, by branch or by commit; the hub is not even up.
    mock.clear_log();
    for model in [ID.to_owned(), format!("{ID}@{}", source.commit)] {
        let (offline, ids) = trajectory(&model, &mockhub::dead_endpoint(), hf_home.path(), &[("HF_HUB_OFFLINE", "1")]);
        assert!(offline.status.success(), "{model}: {}", stderr(&offline));
        assert_eq!(ids.unwrap(), local_ids, "{model}");
    }
    assert!(mock.log().is_empty());
}

/// Exit status 2 and the error as the last line of stderr (the only one when nothing was
/// downloaded first), containing `want`.
fn fails(output: &Output, want: &str, only_line: bool) {
    let err = stderr(output);
    assert_eq!(output.status.code(), Some(2), "{err}");
    let last = err.trim_end().lines().last().unwrap_or("");
    assert!(last.starts_with("mlx-iree: error: ") && last.contains(want), "want {want:?} in the last line:\n{err}");
    if only_line {
        assert_eq!(err.trim_end().lines().count(), 1, "{err}");
    }
    assert!(!err.contains("panicked"), "{err}");
}

#[test]
fn hub_refusals_are_one_line_with_exit_status_2() {
    let mut gated = MockRepo::from_dir("org/gated", &fixture());
    gated.gated = true;
    let mamba = MockRepo::new(
        "org/mamba",
        [
            ("config.json".to_owned(), br#"{"model_type": "mamba"}"#.to_vec()),
            ("model.safetensors".to_owned(), vec![0u8; 64]),
        ],
    );
    let torch = MockRepo::new(
        "org/torch",
        [("config.json".to_owned(), b"{}".to_vec()), ("pytorch_model.bin".to_owned(), vec![0u8; 64])],
    );
    let corrupt = MockRepo::from_dir("org/corrupt", &fixture());
    let mut huge = MockRepo::from_dir("org/huge", &fixture());
    huge.listed_sizes.insert("model.safetensors".into(), 1 << 60);
    let mock = MockHub::start(vec![gated, mamba, torch, corrupt.clone(), huge]);
    let hf_home = tempfile::tempdir().unwrap();
    let hub = |model: &str| trajectory(model, &mock.endpoint, hf_home.path(), &[]).0;
    let e = &mock.endpoint;

    fails(
        &hub("nobody/nothing"),
        &format!(
            "repository nobody/nothing not found on {e} (if it is private, set HF_TOKEN to a token that can read it), and there is no folder `nobody/nothing` here"
        ),
        true,
    );
    fails(&hub("org/gated@v9"), &format!("revision `v9` not found in org/gated on {e}"), true);
    fails(
        &hub("org/gated"),
        "org/gated is gated or private: set HF_TOKEN to a token of an account that has access",
        true,
    );
    fails(
        &hub("org/torch"),
        "org/torch is not an MLX model: it has no model.safetensors or model.safetensors.index.json",
        true,
    );
    mock.clear_log();
    fails(&hub("org/mamba"), "org/mamba is not a model mlx-iree runs:", false);
    // Said before downloading the weights: config.json was the only file fetched.
    let fetched: Vec<String> = mock.file_requests().into_iter().map(|r| r.path).collect();
    assert!(fetched.iter().all(|p| p.ends_with("/config.json")), "{fetched:?}");

    // A wrong sha256 fails the run and leaves no weights in the snapshot.
    mock.corrupt(Some("model.safetensors"));
    fails(&hub("org/corrupt"), "model.safetensors: the download does not match the hub's sha256", false);
    let snapshot = hf_home.path().join("hub/models--org--corrupt/snapshots").join(&corrupt.commit);
    assert!(snapshot.join("config.json").is_file());
    assert!(!snapshot.join("model.safetensors").exists());
    mock.corrupt(None);

    // A full disk (every write to /dev/full fails with ENOSPC) is named as such.
    let blobs = hf_home.path().join("hub/models--org--corrupt/blobs");
    let sha = mockhub::sha256(&corrupt.files["model.safetensors"]);
    std::os::unix::fs::symlink("/dev/full", blobs.join(format!("{sha}.incomplete"))).unwrap();
    fails(
        &hub("org/corrupt"),
        &format!("disk full writing {}", blobs.join(format!("{sha}.incomplete")).display()),
        false,
    );
    assert!(!snapshot.join("model.safetensors").exists());

    let cache = hf_home.path().join("hub");
    fails(
        &hub("org/huge"),
        &format!(
            "not enough disk space for org/huge: its files still to download take {} bytes (1.0 EiB), the file system of the cache {} has ",
            1u64 << 60,
            cache.display()
        ),
        false,
    );
    let offline = trajectory("org/never", &mock.endpoint, hf_home.path(), &[("HF_HUB_OFFLINE", "1")]).0;
    fails(
        &offline,
        &format!(
            "org/never at revision `main` is not in the cache {} (no snapshot of revision `main`); HF_HUB_OFFLINE=1 downloads nothing",
            cache.display()
        ),
        true,
    );
    let dead = mockhub::dead_endpoint();
    let unreachable = trajectory("org/never", &dead, hf_home.path(), &[]).0;
    fails(&unreachable, &format!("cannot reach the hub at {dead}"), true);
    assert!(
        stderr(&unreachable)
            .contains(&format!("with HF_HUB_OFFLINE=1 a model already in the cache {} is used", cache.display()))
    );
    let bad_switch = trajectory(ID, &mock.endpoint, hf_home.path(), &[("HF_HUB_OFFLINE", "maybe")]).0;
    fails(&bad_switch, "HF_HUB_OFFLINE: expected 1 or 0, got `maybe`", true);
}

/// `serve --model owner/name` downloads SmolLM2 through the mock hub and answers a
/// completion with the text the same server gives on the local folder. The shapes are
/// openai.rs's server's (one compiled module), and the hub cache is a fixed folder, so the
/// weights the engine stores in final form for it replace their earlier copy.
#[test]
fn serve_by_repo_id_answers_as_the_local_folder_does() {
    const REPO: &str = "mlx-test/smollm2-4bit";
    let local = root().join("target/models/smollm2-135m-instruct-4bit");
    assert!(
        local.join("config.json").exists(),
        "test model missing at {}: run `cargo xtask model` first",
        local.display()
    );
    let mock = MockHub::start(vec![MockRepo::from_dir(REPO, &local)]);
    let hf_home = root().join("target/test-hf-home/serve");
    match std::fs::remove_dir_all(&hf_home) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => panic!("{}: {e}", hf_home.display()),
        _ => {}
    }
    let complete = |model: &Path, id: &str| {
        let mut command = common::mlx_iree();
        command
            .args(["serve", "--port", "0", "--max-context", "128", "--max-batch", "8", "--model"])
            .arg(model)
            .env("HF_ENDPOINT", &mock.endpoint)
            .env("HF_HOME", &hf_home)
            .env_remove("HF_TOKEN")
            .env_remove("HF_HUB_OFFLINE")
            .env_remove("HF_HUB_CACHE");
        let server = common::start(&mut command);
        let (status, models) = common::request(&server.addr, "GET", "/v1/models", None);
        assert_eq!(status, 200, "{models}");
        let models: serde_json::Value = serde_json::from_str(&models).unwrap();
        assert_eq!(models["data"][0]["id"], id, "the default model id: {models}");
        let body =
            format!(r#"{{"model": "{id}", "prompt": "The capital of France is", "max_tokens": 12, "temperature": 0}}"#);
        let (status, answer) = common::request(&server.addr, "POST", "/v1/completions", Some(&body));
        assert_eq!(status, 200, "{answer}");
        let answer: serde_json::Value = serde_json::from_str(&answer).unwrap();
        answer["choices"][0]["text"].as_str().unwrap().to_owned()
    };
    let by_repo = complete(Path::new(REPO), REPO);
    assert!(mock.file_requests().iter().any(|r| r.path.starts_with("/cdn/")), "nothing was downloaded");
    let by_folder = complete(&local, "smollm2-135m-instruct-4bit");
    assert!(by_folder.contains("Paris"), "{by_folder}");
    assert_eq!(by_repo, by_folder);
}
