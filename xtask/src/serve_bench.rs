//! `cargo xtask bench --serve`: the OpenAI-compatible server under load. Per (model,
//! precision) one `mlx-iree serve` (release build, loopback, `--max-batch` = the most
//! streams), then for each stream count the load generator `xtask/python/serve_bench.py`
//! (the pinned `openai` client in target/client-venv, greedy, streamed) sends
//! `REQUESTS_PER_STREAM` requests per stream: aggregate tok/s, p50/p99 time to first token
//! and request latency, in one table (or one JSON line per row).

use crate::bench::{Case, Options};
use crate::{fixtures, util};
use anyhow::{Context, Result, bail};
use serde::Deserialize;
use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Child, Command, Stdio};

/// Requests each stream sends, one after another.
const REQUESTS_PER_STREAM: usize = 4;
/// Context the servers are built for when `--max-context` is not given: the prompts are
/// one line each, so this holds them and up to ~240 new tokens.
const DEFAULT_CONTEXT: usize = 256;

/// What the load generator prints.
#[derive(Debug, Clone, Deserialize)]
pub struct Load {
    pub streams: usize,
    pub requests: usize,
    pub tokens: usize,
    pub wall_s: f64,
    pub tok_s: f64,
    pub ttft_p50_s: f64,
    pub ttft_p99_s: f64,
    pub latency_p50_s: f64,
    pub latency_p99_s: f64,
}

/// A running server, stopped (SIGTERM, then reaped) when dropped.
struct Served(Child);

impl Drop for Served {
    fn drop(&mut self) {
        let _ = Command::new("kill").arg("-TERM").arg(self.0.id().to_string()).status();
        let _ = self.0.wait();
    }
}

fn start(bin: &Path, case: &Case, o: &Options, slots: usize) -> Result<(Served, String)> {
    let context = o.max_context.unwrap_or(DEFAULT_CONTEXT).to_string();
    let mut cmd = Command::new(bin);
    cmd.args(["serve", "--port", "0", "--model-id", "bench", "--device", &o.device])
        .args(["--precision", case.precision, "--max-batch", &slots.to_string(), "--max-context", &context])
        .arg("--model")
        .arg(&case.model)
        .stdout(Stdio::null())
        .stderr(Stdio::piped());
    if let Some(kv) = o.kv_cache {
        cmd.args(["--kv-cache", kv]);
    }
    let mut child = cmd.spawn().with_context(|| format!("starting {}", bin.display()))?;
    let stderr = child.stderr.take().context("no stderr pipe")?;
    let served = Served(child);
    let mut lines = BufReader::new(stderr).lines();
    for line in lines.by_ref() {
        let line = line?;
        // Compile progress passes through: a cold start compiles for minutes.
        eprintln!("[serve] {line}");
        if let Some(rest) = line.strip_prefix("listening on http://") {
            let addr = rest.split_whitespace().next().context("no address")?.to_owned();
            std::thread::spawn(move || lines.for_each(drop));
            return Ok((served, addr));
        }
    }
    bail!("mlx-iree serve exited before listening (its log is above)")
}

/// One row per stream count for `case`.
pub fn measure(bin: &Path, case: &Case, o: &Options) -> Result<Vec<Load>> {
    let slots = o.streams.iter().copied().max().unwrap_or(1);
    let (_server, addr) = start(bin, case, o, slots)?;
    // Made by the set-up step (`prepare`), which runs before.
    let venv = util::target_dir().join("client-venv");
    let steps = o.steps.unwrap_or(64);
    o.streams
        .iter()
        .map(|&streams| {
            let out = fixtures::python(&venv, "serve_bench.py")
                .arg(format!("http://{addr}/v1"))
                .arg("bench")
                .arg(streams.to_string())
                .arg((streams * REQUESTS_PER_STREAM).to_string())
                .arg(steps.to_string())
                .arg(util::root().join("tests/clients/prompts.txt"))
                .stderr(Stdio::inherit())
                .output()?;
            if !out.status.success() {
                bail!("serve_bench.py with {streams} streams failed");
            }
            serde_json::from_slice(&out.stdout)
                .with_context(|| format!("serve_bench.py printed {:?}", String::from_utf8_lossy(&out.stdout)))
        })
        .collect()
}

pub fn json_line(case: &Case, device: &str, load: &Load) -> String {
    serde_json::json!({
        "engine": "mlx-iree serve",
        "model": case.model.file_name().map(|n| n.to_string_lossy().into_owned()),
        "precision": case.precision,
        "device": device,
        "streams": load.streams,
        "requests": load.requests,
        "tokens": load.tokens,
        "wall_s": load.wall_s,
        "tok_s": load.tok_s,
        "ttft_p50_s": load.ttft_p50_s,
        "ttft_p99_s": load.ttft_p99_s,
        "latency_p50_s": load.latency_p50_s,
        "latency_p99_s": load.latency_p99_s,
    })
    .to_string()
}

pub fn table(rows: &[(Case, Load)]) -> String {
    let mut out = format!(
        "{:<34} {:<9} {:>7} {:>8} {:>7} {:>9} {:>9} {:>9} {:>9} {:>9}\n",
        "model", "precision", "streams", "requests", "tokens", "tok/s", "ttft p50", "ttft p99", "lat p50", "lat p99"
    );
    for (case, l) in rows {
        let name = case.model.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
        out.push_str(&format!(
            "{name:<34} {:<9} {:>7} {:>8} {:>7} {:>9.1} {:>8.2}s {:>8.2}s {:>8.2}s {:>8.2}s\n",
            case.precision,
            l.streams,
            l.requests,
            l.tokens,
            l.tok_s,
            l.ttft_p50_s,
            l.ttft_p99_s,
            l.latency_p50_s,
            l.latency_p99_s
        ));
    }
    out
}
