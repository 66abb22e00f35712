//! What the tests that run the binary share: the SmolLM2 test model, the compile cache they
//! all use (so one compiled module per shape serves every test), the settings of the engines
//! batch.rs, fixtures.rs and gate.rs share, `generate`'s greedy answer, and a `mlx-iree
//! serve` process (started, waited for with a deadline until it listens, killed and reaped
//! when dropped) with plain HTTP/1.1 requests to it.

#![allow(dead_code, clippy::unwrap_used)] // each test file uses part of it

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// The context of every SmolLM2 engine the binary's tests start with one slot (smollm2.rs's
/// `generate` test's, gate.rs's), so the module is compiled once for all of them.
pub const SMOLLM2_CONTEXT: &str = "128";

pub fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// The compile cache every test of this package uses (under target/, as CI caches).
pub fn compile_cache() -> PathBuf {
    root().join("target/test-compile-cache")
}

/// Slots of batch.rs's engines, and of fixtures.rs's and gate.rs's f32 engines
/// ([`eight_slot_engine`]).
pub const MAX_BATCH: usize = 8;
/// Draft tokens per verify call of those engines.
pub const DRAFT: usize = 4;

/// The settings of batch.rs's engines at `precision`: MAX_BATCH slots of 64 positions,
/// verify calls of DRAFT prompt-lookup drafts, weights not stored (stored_parameters.rs's
/// subject; here only an encoder more to compile), decode calls of one row or all of them
/// (the tests decode one sequence or eight; the server tests compile the 2- and 4-row calls
/// serving runs), the tests' compile cache. fixtures.rs's f32 engines take them too, and
/// gate.rs's on the trained fixtures (their random twins' configs), so each fixture family's
/// f32 module compiles once for the three files: the drafts add verify functions, so the
/// same engine without them is another module: until 2026-12-07 fixtures.rs compiled its own
/// eight-slot module per family (with gate.rs's, 31 compiles of 15-120 s;
/// docs/PERFORMANCE.md, "Test suite time (2026-12-07)").
pub fn eight_slot_engine(precision: engine::Precision) -> engine::EngineConfig {
    engine::EngineConfig {
        max_batch: MAX_BATCH,
        max_context: Some(64),
        store_parameters: false,
        draft: engine::Draft::Ngram { tokens: DRAFT },
        decode_batches: engine::DecodeBatches::OneOrAll,
        ..engine::EngineConfig::new("local-task", precision, compile_cache())
    }
}

/// [`eight_slot_engine`] for one sequence of `what` (a fixture) that needs `context`
/// positions: fixtures.rs's and gate.rs's f32 engines, which share batch.rs's modules only
/// while their fixtures fit its context.
pub fn eight_slot_engine_for(precision: engine::Precision, context: usize, what: &str) -> engine::EngineConfig {
    let config = eight_slot_engine(precision);
    assert_eq!(config.max_context, Some(context), "{what}: longer than batch.rs's engines");
    config
}

/// The SmolLM2-135M-Instruct 4-bit folder `cargo xtask model` makes.
pub fn smollm2() -> PathBuf {
    let dir = root().join("target/models/smollm2-135m-instruct-4bit");
    assert!(dir.join("config.json").exists(), "test model missing at {}: run `cargo xtask model` first", dir.display());
    dir
}

/// A fixture's f32 weights beside a scripted text side (tests/scripted/NAME: a tokenizer
/// and chat template that make the fixture's recorded greedy answer read as the test
/// needs), in a folder of its own.
#[allow(dead_code)] // not every test binary uses it
pub fn scripted(fixture: &str, name: &str) -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    let fixture = root().join("tests/fixtures").join(fixture).join("f32");
    for file in ["config.json", "model.safetensors", "model.safetensors.index.json"] {
        std::fs::copy(fixture.join(file), dir.path().join(file)).unwrap();
    }
    for file in ["tokenizer.json", "tokenizer_config.json"] {
        std::fs::copy(root().join("tests/scripted").join(name).join(file), dir.path().join(file)).unwrap();
    }
    dir
}

/// The binary, with the tests' shared compile cache.
pub fn mlx_iree() -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_mlx-iree"));
    c.env("MLX_IREE_CACHE_DIR", compile_cache());
    c
}

/// What `mlx-iree generate` prints on SmolLM2 for `prompt` (greedy; with `chat` templated as
/// one user message), without its final newline.
pub fn generate(prompt: &str, chat: bool, max_tokens: &str) -> String {
    let mut c = mlx_iree();
    c.args(["generate", "--prompt", prompt, "--max-tokens", max_tokens, "--max-context", SMOLLM2_CONTEXT]);
    c.arg("--model").arg(smollm2());
    if chat {
        c.arg("--chat");
    }
    let out = c.output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let text = String::from_utf8(out.stdout).unwrap();
    text.strip_suffix('\n').unwrap_or(&text).to_owned()
}

/// The longest a server may take to listen (a cold compile cache compiles first).
const LISTEN_DEADLINE: Duration = Duration::from_secs(900);

/// A running `mlx-iree serve` on a loopback port; killed when dropped.
pub struct Served {
    child: Child,
    pub addr: String,
}

impl Drop for Served {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Spawns `command` (a `mlx-iree serve ... --port 0`) and waits until it listens.
pub fn start(command: &mut Command) -> Served {
    let mut child = command.stdout(Stdio::null()).stderr(Stdio::piped()).spawn().unwrap();
    let stderr = child.stderr.take().unwrap();
    // Owned at once, so any failure below kills and reaps it.
    let mut served = Served { child, addr: String::new() };
    // Read on a thread of its own (which keeps draining the log, so the server never blocks
    // on a full pipe), so that waiting for "listening" has a deadline.
    let (tx, lines) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stderr).lines().map_while(Result::ok) {
            let _ = tx.send(line);
        }
    });
    let deadline = Instant::now() + LISTEN_DEADLINE;
    let mut log = String::new();
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        let line = match lines.recv_timeout(left) {
            Ok(line) => line,
            Err(e) => panic!("serve did not listen ({e:?}) within {LISTEN_DEADLINE:?}:\n{log}"),
        };
        log.push_str(&line);
        log.push('\n');
        if let Some(rest) = line.strip_prefix("listening on http://") {
            served.addr = rest.split_whitespace().next().unwrap().to_owned();
            return served;
        }
    }
}

/// One request (`Connection: close`, a JSON body if any): the status and the body.
pub fn request(addr: &str, method: &str, path: &str, body: Option<&str>) -> (u16, String) {
    let mut s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(120))).unwrap();
    let body = body.unwrap_or_default();
    write!(
        s,
        "{method} {path} HTTP/1.1\r\nHost: t\r\nConnection: close\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    )
    .unwrap();
    let mut raw = String::new();
    s.read_to_string(&mut raw).unwrap();
    let status = raw.split(' ').nth(1).unwrap().parse().unwrap();
    (status, raw.split_once("\r\n\r\n").map(|(_, b)| b.to_owned()).unwrap_or_default())
}
