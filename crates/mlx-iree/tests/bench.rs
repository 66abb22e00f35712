//! `mlx-iree bench` end to end on a tiny fixture: one JSON line with every field the
//! benchmark promises, sane values, and refusals as the one-line CLI contract.

use serde_json::Value;
use std::path::{Path, PathBuf};
use std::process::Command;

const FIELDS: [&str; 16] = [
    "model",
    "device",
    "precision",
    "prefill_tok_s",
    "decode_tok_s",
    "ttft_ms",
    "weight_bytes",
    "peak_rss_bytes",
    "dispatches_per_decode_step",
    "batch",
    "context",
    "max_context",
    "kv_cache",
    "kv_bytes",
    "kv_bytes_per_token",
    "foreign_cpu_share",
];

fn fixture() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures/qwen2/f32")
}

fn bench(args: &[&str]) -> std::process::Output {
    let cache = tempfile::tempdir().expect("a temp dir");
    Command::new(env!("CARGO_BIN_EXE_mlx-iree"))
        .arg("bench")
        .args(args)
        .env("MLX_IREE_CACHE_DIR", cache.path())
        .output()
        .expect("mlx-iree runs")
}

/// Bytes the engine should bind: matrices at `matrix_bytes` per element, vectors f32.
fn expected_weight_bytes(matrix_bytes: u64) -> u64 {
    let cfg = models::ModelConfig::from_file(&fixture().join("config.json")).expect("fixture config");
    models::param_specs(&cfg)
        .iter()
        .map(|s| {
            let n = s.shape.iter().product::<usize>() as u64;
            if s.kind == models::Kind::Matrix { n * matrix_bytes } else { n * 4 }
        })
        .sum()
}

fn json_line(precision: &str) -> Value {
    let model = fixture();
    let model = model.to_str().expect("a UTF-8 path");
    let out = bench(&[
        "--model",
        model,
        "--device",
        "local-sync",
        "--precision",
        precision,
        "--prompt-len",
        "8",
        "--steps",
        "4",
        "--repeats",
        "2",
        "--max-context",
        "64",
        "--batch",
        "2,1",
        "--json",
    ]);
    let (stdout, stderr) = (String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success(), "stdout: {stdout}\nstderr: {stderr}");
    assert_eq!(stdout.lines().count(), 2, "one JSON line per batch size expected:\n{stdout}");
    let lines: Vec<Value> = stdout.lines().map(|l| serde_json::from_str(l).expect("a JSON object")).collect();
    // Two slots of 64 positions, k and v, f32.
    let cfg = models::ModelConfig::from_file(&fixture().join("config.json")).expect("fixture config");
    let kv = 2 * cfg.num_layers() * 2 * 64 * cfg.kv_heads * cfg.head_dim * 4;
    for (v, batch) in lines.iter().zip([2, 1]) {
        assert_eq!(
            (v["batch"].as_u64(), v["context"].as_u64(), v["max_context"].as_u64()),
            (Some(batch), Some(8), Some(64))
        );
        assert_eq!(v["kv_bytes"].as_u64(), Some(kv as u64), "{v}");
        assert_eq!(v["kv_bytes_per_token"].as_u64(), Some(kv as u64 / 128), "{v}");
    }
    let v = lines[1].clone();
    for f in FIELDS {
        assert!(v.get(f).is_some(), "field {f} missing from {v}");
    }
    assert_eq!(v["model"], model);
    assert_eq!(v["device"], "local-sync");
    assert_eq!(v["precision"], precision);
    assert_eq!(v["kv_cache"], "f32");
    let num = |f: &str| v[f].as_f64().unwrap_or_else(|| panic!("{f} is not a number in {v}"));
    for f in ["prefill_tok_s", "decode_tok_s", "ttft_ms", "compile_cold_s", "compile_cached_s"] {
        let x = num(f);
        assert!(x.is_finite() && x > 0.0, "{f} = {x} in {v}");
    }
    // ttft is the prefill time: 8 tokens / prefill tok/s, in ms (both are medians of it).
    let ttft = 8.0 / num("prefill_tok_s") * 1e3;
    assert!((ttft - num("ttft_ms")).abs() < 1e-6 * ttft, "{v}");
    assert!(v["peak_rss_bytes"].as_u64().is_some_and(|b| b > 1 << 20), "{v}");
    assert!(v["dispatches_per_decode_step"].as_u64().is_some_and(|n| n > 0), "{v}");
    assert_eq!(
        (v["prompt_len"].as_u64(), v["decode_steps"].as_u64(), v["repeats"].as_u64()),
        (Some(8), Some(4), Some(2))
    );
    assert!(stderr.contains("dispatches per decode step"), "{stderr}");
    // null only when no clock tick passed during the row's runs (these are milliseconds).
    let share = &v["foreign_cpu_share"];
    assert!(share.is_null() || share.as_f64().is_some_and(|s| (0.0..=1.0).contains(&s)), "{v}");
    v
}

#[test]
fn json_line_has_every_field_f32() {
    let v = json_line("f32");
    assert_eq!(v["weight_bytes"].as_u64().unwrap(), expected_weight_bytes(4), "{v}");
}

#[test]
fn json_line_has_every_field_f16() {
    let v = json_line("f16");
    assert_eq!(v["weight_bytes"].as_u64().unwrap(), expected_weight_bytes(2), "{v}");
}

#[test]
fn refusals_are_one_line() {
    let model = fixture();
    let m = model.to_str().unwrap();
    for (args, msg) in [
        (vec!["--model", m, "--precision", "packed"], "precision `packed` needs an MLX-quantized checkpoint"),
        (vec!["--model", m, "--precision", "f64"], "unknown precision `f64`"),
        (vec!["--model", m, "--steps", "0"], "--steps must be at least 1"),
        (vec!["--model", "/nonexistent/model"], "model folder /nonexistent/model does not exist"),
        (vec!["--model", m, "--device", "tpu"], "unsupported device `tpu`"),
    ] {
        let out = bench(&args);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {stderr}");
        assert!(out.stdout.is_empty(), "{args:?}");
        assert_eq!(stderr.trim_end().lines().count(), 1, "{args:?}: {stderr}");
        assert!(stderr.starts_with("mlx-iree: error: ") && stderr.contains(msg), "{args:?}: {stderr}");
    }
}

/// Dispatches per decode step of `model` at `precision` on `cuda`, which `bench` counts at
/// compile level (the flow phase) before it needs a GPU; `kernels` is
/// `MLX_IREE_KERNELS` (`0`: the graph form).
fn cuda_dispatches(model: &Path, precision: &str, kernels: Option<&str>) -> usize {
    let cache = tempfile::tempdir().expect("a temp dir");
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_mlx-iree"));
    cmd.args([
        "bench",
        "--device",
        "cuda",
        "--precision",
        precision,
        "--max-context",
        "64",
        "--steps",
        "4",
        "--prompt-len",
        "8",
        "--model",
    ])
    .arg(model)
    .env("MLX_IREE_CACHE_DIR", cache.path());
    if let Some(k) = kernels {
        cmd.env("MLX_IREE_KERNELS", k);
    }
    let out = cmd.output().expect("mlx-iree runs");
    let stderr = String::from_utf8_lossy(&out.stderr);
    let count = stderr.lines().find_map(|l| l.strip_prefix("bench: ")?.split_once(" dispatches per decode step"));
    count.and_then(|(n, _)| n.parse().ok()).unwrap_or_else(|| panic!("no dispatch count: {stderr}"))
}

/// Issue 12's count, at compile level: packed 4-bit decode through the CUDA kernel (one
/// dispatch a matrix, the residual add and the gated MLP's product inside) takes no more
/// dispatches a step than f16, where the graph form takes more.
#[test]
fn packed_decode_on_cuda_takes_no_more_dispatches_than_f16() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures/llama_llama3_tied");
    let f16 = cuda_dispatches(&dir.join("f32"), "f16", None);
    let kernel = cuda_dispatches(&dir.join("q4"), "packed", None);
    let graph = cuda_dispatches(&dir.join("q4"), "packed", Some("0"));
    assert!(kernel <= f16, "packed through the CUDA kernel: {kernel} dispatches a step, f16 {f16}");
    assert!(kernel < graph, "the kernel ({kernel}) should take fewer dispatches than the graph form ({graph})");
}

/// `--kv-cache q8`: 16 values and an f32 scale in 20 bytes, so 5/16 of the f32 cache's bytes
/// a token, said in the JSON line.
#[test]
fn an_8_bit_kv_cache_takes_5_16ths_of_the_f32_bytes() {
    let model = fixture();
    let args =
        [
            &[
                "--model",
                model.to_str().expect("a UTF-8 path"),
                "--device",
                "local-sync",
                "--precision",
                "f32",
                "--json",
            ][..],
            &["--prompt-len", "4", "--steps", "2", "--repeats", "1", "--max-context", "32", "--batch", "1"],
        ]
        .concat();
    let (out, out_q8) = (bench(&args), bench(&[&args[..], &["--kv-cache", "q8"]].concat()));
    let line = |out: &std::process::Output| -> Value {
        let (stdout, stderr) = (String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
        assert!(out.status.success(), "stdout: {stdout}\nstderr: {stderr}");
        serde_json::from_str(stdout.lines().last().expect("a JSON line")).expect("a JSON object")
    };
    let (f32, q8) = (line(&out), line(&out_q8));
    assert_eq!((f32["kv_cache"].as_str(), q8["kv_cache"].as_str()), (Some("f32"), Some("q8")));
    let cfg = models::ModelConfig::from_file(&fixture().join("config.json")).expect("fixture config");
    let per_token = |bytes_per_value_x16: usize| {
        (2 * cfg.num_layers() * cfg.kv_heads * cfg.head_dim * bytes_per_value_x16 / 16) as u64
    };
    assert_eq!(f32["kv_bytes_per_token"].as_u64(), Some(per_token(64)), "{f32}");
    assert_eq!(q8["kv_bytes_per_token"].as_u64(), Some(per_token(20)), "{q8}");
    assert_eq!(q8["kv_bytes"].as_u64(), Some(per_token(20) * 32), "{q8}");
}

/// DeepSeek-V3's latent attention caches one latent and one rotated key a position, shared by
/// the heads: the bench reports its bytes a token, at most a quarter of what full keys and
/// values of the same heads would take (here 3 layers x (32 + 16) f32 against 3 x 4 heads x
/// (48 + 32)).
#[test]
fn latent_attention_caches_a_quarter_of_full_keys_and_values_or_less() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures/deepseek_v3/f32");
    let model = dir.to_str().expect("a UTF-8 path");
    let args = ["--model", model, "--device", "local-sync", "--precision", "f32", "--prompt-len", "4", "--steps", "2"];
    let out = bench(&[&args[..], &["--repeats", "1", "--max-context", "32", "--batch", "1", "--json"]].concat());
    let (stdout, stderr) = (String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success(), "stdout: {stdout}\nstderr: {stderr}");
    let v: Value = serde_json::from_str(stdout.trim()).expect("a JSON object");
    let cfg = models::ModelConfig::from_file(&dir.join("config.json")).expect("fixture config");
    let lat = cfg.latent.clone().expect("a latent attention");
    let per_token = (cfg.num_layers() * (lat.kv_rank + lat.rope_dim) * 4) as u64;
    assert_eq!(v["kv_bytes_per_token"].as_u64(), Some(per_token), "{v}");
    assert_eq!(v["kv_bytes"].as_u64(), Some(per_token * 32), "{v}");
    let full = (cfg.num_layers() * cfg.heads * (lat.nope_dim + lat.rope_dim + lat.v_dim) * 4) as u64;
    assert_eq!((per_token, full), (576, 3840));
    assert!(per_token * 4 <= full, "{per_token} bytes a token against {full} for full keys and values");
}
