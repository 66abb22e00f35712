//! `cargo xtask bench --serve`: the OpenAI-compatible server under load. Per (model,
//! precision) one `mlx-iree serve` (release build, loopback, `--max-batch` = the most
//! streams), then for each stream count the load generator `xtask/python/serve_bench.py`
//! (the pinned `openai` client in target/client-venv, greedy, streamed) sends
//! `REQUESTS_PER_STREAM` requests per stream: aggregate tok/s, p50/p99 time to first token
//! and request latency, in one table (or one JSON line per row). With `--json-streams K`,
//! each stream count N >= K has two more rows of chat requests (the prompt as the user's
//! message): N plain streams, then N of which K ask for JSON valid against a schema
//! (constrained decoding, a grammar that cannot complete within --steps, so every request
//! generates as many tokens). With `--turns T`, per stream count N two more rows of N
//! conversations of T turns behind one long shared system prompt (`serve_turns.py`): on the
//! server as it is (prefix cache on) and on a second one started with `--no-prefix-cache`,
//! with the median time to first token of first turns and of later turns. With
//! `--prompt-len N`, every request's prompt is about N tokens ([`long_prompts`]) instead of
//! one line: time to first token under a load of long prompts.
//!
//! With `--peers`, llama.cpp's `llama-server` (built by `peers::tools`) on the same weights
//! as GGUF (f16 for our f16 rows, Q4_0 / Q8_0 for packed 4-bit / 8-bit) is driven by the
//! same client: per stream count N one server with `-np N` slots of our context each
//! (continuous batching, no prompt cache, since ours has none), on a free loopback port,
//! waited for through `GET /health` with a deadline and killed at the end of its row.

use crate::bench::{Case, Options, Source};
use crate::{fixtures, peers, util};
use anyhow::{Context, Result, bail};
use serde::Deserialize;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// Requests each stream sends, one after another.
const REQUESTS_PER_STREAM: usize = 4;
/// Context the servers are built for when `--max-context` is not given: the prompts are
/// one line each, so this holds them and up to ~240 new tokens.
const DEFAULT_CONTEXT: usize = 256;
/// How long llama-server may take to load a model and answer `/health` with 200.
const LLAMA_SERVER_START: Duration = Duration::from_secs(180);
pub const OURS: &str = "mlx-iree serve";
pub const LLAMA_SERVER: &str = "llama-server";

/// What the load generator prints.
#[derive(Debug, Clone, PartialEq, Deserialize)]
pub struct Load {
    pub streams: usize,
    /// Of them, streams whose answers are constrained to a JSON schema.
    #[serde(default)]
    pub constrained: usize,
    /// Chat requests (else completions).
    #[serde(default)]
    pub chat: bool,
    /// Turns per conversation (0: single requests).
    #[serde(default)]
    pub turns: usize,
    /// Median time to first token of first turns, and of the later ones.
    #[serde(default)]
    pub ttft_first_p50_s: Option<f64>,
    #[serde(default)]
    pub ttft_later_p50_s: Option<f64>,
    /// The longest first-turn prompt, in tokens.
    #[serde(default)]
    pub prompt_tokens_first: Option<usize>,
    /// Prompt tokens the server read from its prefix cache.
    #[serde(default)]
    pub cached_tokens: Option<u64>,
    /// Mean prompt tokens of the requests, as the server counted them (`usage`).
    #[serde(default)]
    pub prompt_tokens_mean: Option<f64>,
    pub requests: usize,
    pub tokens: usize,
    pub wall_s: f64,
    pub tok_s: f64,
    pub ttft_p50_s: f64,
    pub ttft_p99_s: f64,
    pub latency_p50_s: f64,
    pub latency_p99_s: f64,
    /// Share of the machine's CPU time that work other than the server and the client
    /// took during the row (set by xtask, `cpu_share`).
    #[serde(default)]
    pub foreign_cpu_share: Option<f64>,
}

/// One row of the --serve table: our server or llama-server at one stream count.
#[derive(Debug, Clone, PartialEq)]
pub struct ServeRow {
    pub source: Source,
    pub streams: usize,
    /// Whether the server ran with its prefix cache (off only for the `--turns` comparison).
    pub prefix_cache: bool,
    /// The model file or folder, for the JSON line.
    pub model: String,
    pub load: std::result::Result<Load, String>,
}

/// A running server, stopped (SIGTERM, then reaped) when dropped; started through
/// `util::dies_with_parent`, so it also dies when xtask is killed and drops nothing.
pub(crate) struct Served(Child);

impl Drop for Served {
    fn drop(&mut self) {
        let _ = Command::new("kill").arg("-TERM").arg(self.0.id().to_string()).status();
        let _ = self.0.wait();
    }
}

/// Context for `--turns` when `--max-context` is not given: the ~1,500-token system prompt
/// and six turns of a one-line question and 64 answer tokens.
const TURNS_CONTEXT: usize = 2560;

fn context(o: &Options) -> usize {
    let default = match o.serve_prompt_len {
        // Room for prompts up to twice the asked length (they are cut at whole lines, and a
        // token is about 4 characters of them), and the answer.
        Some(n) => 2 * n + o.steps.unwrap_or(64),
        None if o.turns > 0 => TURNS_CONTEXT,
        None => DEFAULT_CONTEXT,
    };
    o.max_context.unwrap_or(default)
}

/// Characters of prompt text per token [`long_prompts`] counts on (English text, BPE).
const CHARS_PER_TOKEN: usize = 4;

/// `count` prompts of about `tokens` tokens each, one per line, from the lines of
/// `lines` in turn: prompt `i` starts with its own number, so no two share more than a few
/// tokens (the prefix cache has nothing to reuse), then the lines from line `i` on until
/// it holds `tokens` x [`CHARS_PER_TOKEN`] characters.
pub fn long_prompts(lines: &[&str], tokens: usize, count: usize) -> String {
    let mut out = String::new();
    for i in 0..count {
        let mut prompt = format!("{i}.");
        for line in lines.iter().cycle().skip(i % lines.len().max(1)) {
            if prompt.len() >= tokens * CHARS_PER_TOKEN {
                break;
            }
            prompt.push(' ');
            prompt.push_str(line.trim());
        }
        out.push_str(&prompt);
        out.push('\n');
    }
    out
}

/// The prompts file of `drive`'s requests: tests/clients/prompts.txt, or with
/// `--prompt-len` a file of [`long_prompts`] made from it under target/tmp.
fn prompts_file(requests: usize, o: &Options) -> Result<std::path::PathBuf> {
    let lines = util::root().join("tests/clients/prompts.txt");
    let Some(tokens) = o.serve_prompt_len else { return Ok(lines) };
    let text = std::fs::read_to_string(&lines).with_context(|| format!("reading {}", lines.display()))?;
    let lines: Vec<&str> = text.lines().filter(|l| !l.trim().is_empty()).collect();
    let path = util::target_dir().join(format!("tmp/serve-prompts-{tokens}x{requests}.txt"));
    std::fs::create_dir_all(path.parent().context("no parent")?)?;
    std::fs::write(&path, long_prompts(&lines, tokens, requests))
        .with_context(|| format!("writing {}", path.display()))?;
    Ok(path)
}

fn start(bin: &Path, case: &Case, o: &Options, slots: usize, prefix_cache: bool) -> Result<(Served, String)> {
    start_with(bin, case, o, slots, prefix_cache, &[])
}

/// [`start`] with `extra` arguments to `mlx-iree serve` (`--draft ngram`).
pub(crate) fn start_with(
    bin: &Path,
    case: &Case,
    o: &Options,
    slots: usize,
    prefix_cache: bool,
    extra: &[&str],
) -> Result<(Served, String)> {
    let context = context(o).to_string();
    let mut cmd = Command::new(bin);
    cmd.args(["serve", "--port", "0", "--model-id", "bench", "--device", &o.device])
        .args(["--precision", case.precision, "--max-batch", &slots.to_string(), "--max-context", &context])
        .arg("--model")
        .arg(&case.model)
        .stdout(Stdio::null())
        .stderr(Stdio::piped());
    if let Some(kv) = case.kv_cache {
        cmd.args(["--kv-cache", kv]);
    }
    if !prefix_cache {
        cmd.arg("--no-prefix-cache");
    }
    cmd.args(extra);
    let mut child = util::dies_with_parent(&mut cmd).spawn().with_context(|| format!("starting {}", bin.display()))?;
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

/// The load generator against `server` at `addr` with `streams` concurrent streams:
/// completions (`constrained` `None`), or chat requests of which `constrained` streams ask
/// for JSON valid against a schema.
fn drive(server: &Served, addr: &str, streams: usize, constrained: Option<usize>, o: &Options) -> Result<Load> {
    let steps = o.steps.unwrap_or(64);
    let requests = streams * REQUESTS_PER_STREAM;
    let mut args = vec![streams.to_string(), requests.to_string(), steps.to_string()];
    args.push(prompts_file(requests, o)?.display().to_string());
    args.extend(constrained.map(|k| k.to_string()));
    let load = client(server, addr, "serve_bench.py", &args).with_context(|| format!("{streams} streams"))?;
    // The prompts' length is the row's news only where --prompt-len set it.
    Ok(Load { prompt_tokens_mean: load.prompt_tokens_mean.filter(|_| o.serve_prompt_len.is_some()), ..load })
}

/// `conversations` multi-turn chats of `o.turns` turns each (`serve_turns.py`) against
/// `server` at `addr`.
fn drive_turns(server: &Served, addr: &str, conversations: usize, o: &Options) -> Result<Load> {
    let mut args = vec![conversations.to_string(), o.turns.to_string(), o.steps.unwrap_or(64).to_string()];
    args.push(util::root().join("tests/clients/prompts.txt").display().to_string());
    client(server, addr, "serve_turns.py", &args).with_context(|| format!("{conversations} conversations"))
}

/// The load generator `script` (xtask/python, in the client venv the set-up step made)
/// against `server` at `addr` with its model id and `args`: its JSON line, with the share
/// of CPU other work took meanwhile.
fn client(server: &Served, addr: &str, script: &str, args: &[String]) -> Result<Load> {
    let window = cpu_share::Window::start(&[server.0.id()]);
    let venv = util::target_dir().join("client-venv");
    let mut client = fixtures::python(&venv, script);
    let out = util::dies_with_parent(&mut client)
        .arg(format!("http://{addr}/v1"))
        .arg("bench")
        .args(args)
        .stderr(Stdio::inherit())
        .output()?;
    if !out.status.success() {
        bail!("{script} against http://{addr} failed");
    }
    let load: Load = serde_json::from_slice(&out.stdout)
        .with_context(|| format!("{script} printed {:?}", String::from_utf8_lossy(&out.stdout)))?;
    Ok(Load { foreign_cpu_share: window.and_then(|w| w.foreign_share()), ..load })
}

/// One row per stream count for `case` on one `mlx-iree serve` (and the `--json-streams`
/// and `--turns` rows; the latter's cache-off twin on a second server).
pub fn measure(bin: &Path, case: &Case, o: &Options) -> Result<Vec<ServeRow>> {
    let slots = o.streams.iter().copied().max().unwrap_or(1);
    let (server, addr) = start(bin, case, o, slots, true)?;
    let name = case.model.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
    let mut rows = Vec::new();
    for &streams in &o.streams {
        let kinds = if (1..=streams).contains(&o.json_streams) {
            vec![None, Some(0), Some(o.json_streams)]
        } else {
            vec![None]
        };
        for constrained in kinds {
            rows.push(ServeRow {
                // Told from `mlx-iree bench`'s rows by the engine; named as the JSON line's model.
                source: Source { engine: OURS, name: name.clone(), ..Source::ours(case) },
                streams,
                prefix_cache: true,
                model: name.clone(),
                load: Ok(drive(&server, &addr, streams, constrained, o)?),
            });
        }
    }
    if o.turns > 0 {
        let row = |streams, prefix_cache, load| ServeRow {
            source: Source { engine: OURS, name: name.clone(), ..Source::ours(case) },
            streams,
            prefix_cache,
            model: name.clone(),
            load: Ok(load),
        };
        for &streams in &o.streams {
            rows.push(row(streams, true, drive_turns(&server, &addr, streams, o)?));
        }
        drop(server);
        let (server, addr) = start(bin, case, o, slots, false)?;
        for &streams in &o.streams {
            rows.push(row(streams, false, drive_turns(&server, &addr, streams, o)?));
        }
    }
    Ok(rows)
}

/// The `llama-server` command line for `slots` streams of `context` positions each on
/// `port`: continuous batching, no prompt cache, `threads` threads, no web UI.
pub fn llama_server_command(bin: &Path, gguf: &Path, slots: usize, context: usize, port: u16) -> Command {
    let threads = peers::threads().to_string();
    let mut cmd = Command::new(bin.join("llama-server"));
    cmd.arg("-m").arg(gguf).args([
        "--host",
        "127.0.0.1",
        "--port",
        &port.to_string(),
        "-np",
        &slots.to_string(),
        "-c",
        &(slots * context).to_string(),
        "-cb",
        "--no-cache-prompt",
        "-cram",
        "0",
        "-t",
        &threads,
        "-tb",
        &threads,
        "-a",
        "bench",
        "--no-webui",
    ]);
    cmd
}

/// A loopback port nothing listens on now.
fn free_port() -> Result<u16> {
    let l = TcpListener::bind("127.0.0.1:0").context("binding a loopback port")?;
    Ok(l.local_addr()?.port())
}

/// A `GET path` sent to `addr` (loopback: a second to connect, five to answer), its
/// connection to be read; None when nothing answered.
fn send_get(addr: &str, path: &str) -> Option<TcpStream> {
    let mut s = TcpStream::connect_timeout(&addr.parse().ok()?, Duration::from_secs(1)).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(5))).ok()?;
    write!(s, "GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n").ok()?;
    Some(s)
}

/// The body of `GET path` on `addr` (read to the connection's end), or None when nothing
/// answered.
pub(crate) fn http_body(addr: &str, path: &str) -> Option<String> {
    let mut s = send_get(addr, path)?;
    let mut all = String::new();
    s.read_to_string(&mut all).ok()?;
    all.split_once("\r\n\r\n").map(|(_, body)| body.to_owned())
}

/// The status code of `GET path` on `addr`, or None when nothing answered.
fn http_status(addr: &str, path: &str) -> Option<u16> {
    let mut s = send_get(addr, path)?;
    let mut head = [0u8; 64];
    let n = s.read(&mut head).ok()?;
    parse_status(&String::from_utf8_lossy(&head[..n]))
}

/// The code of an HTTP status line (`HTTP/1.1 503 Service Unavailable` -> 503).
pub fn parse_status(response: &str) -> Option<u16> {
    let mut words = response.lines().next()?.split_whitespace();
    words.next().filter(|v| v.starts_with("HTTP/"))?;
    words.next()?.parse().ok()
}

/// The last `n` lines of a file, for an error message.
fn tail(path: &Path, n: usize) -> String {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(n)..].join("\n")
}

/// llama-server on `gguf` with `slots` slots, once `/health` says 200.
fn start_llama_server(gguf: &Path, slots: usize, context: usize) -> Result<(Served, String, std::path::PathBuf)> {
    let port = free_port()?;
    let addr = format!("127.0.0.1:{port}");
    let log = util::target_dir().join("peers/llama-server.log");
    std::fs::create_dir_all(log.parent().context("log folder")?)?;
    let out = std::fs::File::create(&log).with_context(|| format!("creating {}", log.display()))?;
    let mut cmd = llama_server_command(&peers::tools_bin()?, gguf, slots, context, port);
    cmd.stdout(Stdio::from(out.try_clone()?)).stderr(Stdio::from(out));
    let shown = util::show(&cmd);
    let mut served =
        Served(util::dies_with_parent(&mut cmd).spawn().with_context(|| format!("could not start `{shown}`"))?);
    let deadline = Instant::now() + LLAMA_SERVER_START;
    loop {
        if let Some(status) = served.0.try_wait()? {
            bail!("`{shown}` exited ({status}) before it was ready; the end of {}:\n{}", log.display(), tail(&log, 15));
        }
        if http_status(&addr, "/health") == Some(200) {
            return Ok((served, addr, log));
        }
        if Instant::now() > deadline {
            bail!(
                "`{shown}` did not answer GET /health with 200 within {} s; the end of {}:\n{}",
                LLAMA_SERVER_START.as_secs(),
                log.display(),
                tail(&log, 15)
            );
        }
        std::thread::sleep(Duration::from_millis(250));
    }
}

/// llama-server's rows for `case`: per stream count, a server with that many slots on the
/// GGUF of weight type `t` (`bench::llama_cpp_pair`), driven by the same client; the server
/// is killed at the end of its row, failed or not.
pub fn measure_llama_server(case: &Case, t: &'static str, o: &Options) -> Vec<ServeRow> {
    let gguf = peers::gguf_path(&case.family, t);
    o.streams
        .iter()
        .map(|&streams| {
            eprintln!("[bench] llama-server {t} on {} with {streams} slots", case.family);
            let load = start_llama_server(&gguf, streams, context(o))
                .and_then(|(server, addr, _)| drive(&server, &addr, streams, None, o))
                .map_err(|e| format!("{e:#}"));
            ServeRow {
                source: Source::peer(LLAMA_SERVER, &case.family, t),
                streams,
                prefix_cache: false,
                model: gguf.display().to_string(),
                load,
            }
        })
        .collect()
}

pub fn json_line(row: &ServeRow, device: &str) -> String {
    let mut v = serde_json::json!({
        "engine": row.source.engine,
        "model": row.model,
        "precision": row.source.precision,
        "device": if row.source.engine == OURS { device } else { "cpu" },
        "streams": row.streams,
    });
    match &row.load {
        Ok(l) => {
            for (k, x) in [
                ("constrained_streams", serde_json::json!(l.constrained)),
                ("chat", serde_json::json!(l.chat)),
                ("turns", serde_json::json!(l.turns)),
                ("prefix_cache", serde_json::json!(row.prefix_cache)),
                ("ttft_first_p50_s", serde_json::json!(l.ttft_first_p50_s)),
                ("ttft_later_p50_s", serde_json::json!(l.ttft_later_p50_s)),
                ("prompt_tokens_first", serde_json::json!(l.prompt_tokens_first)),
                ("cached_tokens", serde_json::json!(l.cached_tokens)),
                ("prompt_tokens_mean", serde_json::json!(l.prompt_tokens_mean)),
                ("requests", serde_json::json!(l.requests)),
                ("tokens", serde_json::json!(l.tokens)),
                ("wall_s", serde_json::json!(l.wall_s)),
                ("tok_s", serde_json::json!(l.tok_s)),
                ("ttft_p50_s", serde_json::json!(l.ttft_p50_s)),
                ("ttft_p99_s", serde_json::json!(l.ttft_p99_s)),
                ("latency_p50_s", serde_json::json!(l.latency_p50_s)),
                ("latency_p99_s", serde_json::json!(l.latency_p99_s)),
                ("foreign_cpu_share", serde_json::json!(l.foreign_cpu_share)),
            ] {
                v[k] = x;
            }
        }
        Err(e) => v["error"] = serde_json::json!(e),
    }
    v.to_string()
}

/// The --serve table; with llama-server rows, our tok/s as a ratio against llama-server's
/// at the same family, weight format and stream count.
pub fn table(rows: &[ServeRow]) -> String {
    let peers = rows.iter().any(|r| r.source.engine == LLAMA_SERVER);
    let theirs = |r: &ServeRow| {
        rows.iter().find_map(|p| match &p.load {
            Ok(l)
                if p.source.engine == LLAMA_SERVER
                    && p.source.family == r.source.family
                    && p.source.pair == r.source.pair
                    && p.streams == r.streams
                    && r.load.as_ref().is_ok_and(|l| !l.chat && l.turns == 0) =>
            {
                Some(l.tok_s)
            }
            _ => None,
        })
    };
    let engine_col = |e: &str| if peers { format!("{e:<14} ") } else { String::new() };
    let mut out = format!(
        "{}{:<34} {:<9} {:>11} {:>8} {:>7} {:>9} {:>9} {:>9} {:>9} {:>9} {:>9}{}\n",
        engine_col("engine"),
        "model",
        "precision",
        "streams",
        "requests",
        "tokens",
        "tok/s",
        "ttft p50",
        "ttft p99",
        "lat p50",
        "lat p99",
        "other CPU",
        if peers { "  vs llama-server" } else { "" }
    );
    for r in rows {
        // `8 chat`: chat requests; `8 (4 json)`: of which 4 streams constrained to a schema.
        let streams = match &r.load {
            Ok(l) if l.turns > 0 => format!("{}x{}t{}", r.streams, l.turns, if r.prefix_cache { "" } else { " nc" }),
            Ok(l) if l.constrained > 0 => format!("{} ({} json)", r.streams, l.constrained),
            Ok(l) if l.chat => format!("{} chat", r.streams),
            // `8 p1012`: prompts of 1,012 tokens on average.
            Ok(Load { prompt_tokens_mean: Some(p), .. }) => format!("{} p{p:.0}", r.streams),
            _ => r.streams.to_string(),
        };
        let head =
            format!("{}{:<34} {:<9} {:>11}", engine_col(r.source.engine), r.source.name, r.source.precision, streams);
        match &r.load {
            Ok(l) => {
                let vs = match (peers, r.source.engine, theirs(r)) {
                    (false, ..) => String::new(),
                    (true, OURS, Some(t)) => format!("  {:.2}x", l.tok_s / t),
                    (true, ..) => "  -".to_owned(),
                };
                out.push_str(&format!(
                    "{head} {:>8} {:>7} {:>9.1} {:>8.2}s {:>8.2}s {:>8.2}s {:>8.2}s {:>9}{vs}\n",
                    l.requests,
                    l.tokens,
                    l.tok_s,
                    l.ttft_p50_s,
                    l.ttft_p99_s,
                    l.latency_p50_s,
                    l.latency_p99_s,
                    crate::bench::other_cpu(l.foreign_cpu_share),
                ));
            }
            Err(e) => out.push_str(&format!("{head} error: {e}\n")),
        }
    }
    // The multi-turn rows' own numbers, each on a line of its own.
    for r in rows {
        let Ok(l) = &r.load else { continue };
        if let (true, Some(first), Some(later)) = (l.turns > 0, l.ttft_first_p50_s, l.ttft_later_p50_s) {
            out.push_str(&format!(
                "{} {}x{}t {}: ttft p50 first turns {first:.2}s, later turns {later:.2}s ({:.2}x); first prompts {} \
                 tokens; {} prompt tokens from the cache\n",
                r.source.name,
                r.streams,
                l.turns,
                if r.prefix_cache { "prefix cache" } else { "no prefix cache" },
                later / first,
                l.prompt_tokens_first.unwrap_or(0),
                l.cached_tokens.unwrap_or(0),
            ));
        }
    }
    out + crate::bench::OTHER_CPU_NOTE + "\n"
}

#[cfg(test)]
mod tests {
    use super::*;

    fn load(streams: usize, tok_s: f64) -> Load {
        Load {
            streams,
            constrained: 0,
            chat: false,
            turns: 0,
            ttft_first_p50_s: None,
            ttft_later_p50_s: None,
            prompt_tokens_first: None,
            cached_tokens: None,
            prompt_tokens_mean: None,
            requests: streams * 4,
            tokens: streams * 128,
            wall_s: 2.0,
            tok_s,
            ttft_p50_s: 0.1,
            ttft_p99_s: 0.5,
            latency_p50_s: 1.0,
            latency_p99_s: 2.0,
            foreign_cpu_share: Some(0.02),
        }
    }

    fn row(engine: &'static str, precision: &str, pair: &'static str, streams: usize, tok_s: f64) -> ServeRow {
        ServeRow {
            source: Source {
                engine,
                name: if engine == OURS { "m-4bit".into() } else { "m".into() },
                family: "m".into(),
                precision: precision.into(),
                pair: Some(pair),
            },
            streams,
            prefix_cache: true,
            model: "x".into(),
            load: Ok(load(streams, tok_s)),
        }
    }

    #[test]
    fn table_shows_our_ratio_against_llama_server_at_the_same_streams() {
        let rows = [
            row(OURS, "packed", "q4_0", 1, 50.0),
            row(OURS, "packed", "q4_0", 8, 80.0),
            row(LLAMA_SERVER, "q4_0", "q4_0", 1, 100.0),
            ServeRow { load: Err("llama-server did not start".into()), ..row(LLAMA_SERVER, "q4_0", "q4_0", 8, 0.0) },
        ];
        let t = table(&rows);
        let lines: Vec<Vec<&str>> = t.lines().map(|l| l.split_whitespace().collect()).collect();
        assert_eq!(lines[0].first(), Some(&"engine"));
        assert_eq!(lines[0][lines[0].len() - 2..], ["vs", "llama-server"]);
        assert_eq!(lines[1][..4], ["mlx-iree", "serve", "m-4bit", "packed"]);
        assert_eq!(lines[1].last(), Some(&"0.50x"));
        // No llama-server row succeeded at 8 streams: no ratio.
        assert_eq!(lines[2].last(), Some(&"-"));
        assert_eq!(lines[3][..4], ["llama-server", "m", "q4_0", "1"]);
        assert_eq!(lines[3].last(), Some(&"-"));
        assert!(t.lines().nth(4).unwrap().ends_with("8 error: llama-server did not start"), "{t}");
        // A constrained row says how many streams were.
        let mixed = ServeRow {
            load: Ok(Load { constrained: 4, chat: true, ..load(8, 70.0) }),
            ..row(OURS, "packed", "q4_0", 8, 70.0)
        };
        let t = table(&[mixed]);
        assert!(t.lines().nth(1).unwrap().contains("packed     8 (4 json)"), "{t}");
        // Long prompts: the server's mean count beside the streams.
        let long = ServeRow {
            load: Ok(Load { prompt_tokens_mean: Some(1011.6), ..load(8, 70.0) }),
            ..row(OURS, "packed", "q4_0", 8, 70.0)
        };
        let t = table(&[long]);
        assert_eq!(
            t.lines().nth(1).unwrap().split_whitespace().take(4).collect::<Vec<_>>(),
            ["m-4bit", "packed", "8", "p1012"]
        );
        // Without peers, the table is as before: no engine column, no ratio.
        let t = table(&rows[..1]);
        assert!(t.starts_with("model "), "{t}");
        assert!(!t.contains("vs llama-server"));
    }

    #[test]
    fn json_lines_name_the_engine() {
        let v: serde_json::Value =
            serde_json::from_str(&json_line(&row(OURS, "f16", "f16", 8, 80.0), "local-task")).unwrap();
        assert_eq!(
            (v["engine"].as_str(), v["device"].as_str(), v["streams"].as_u64()),
            (Some(OURS), Some("local-task"), Some(8))
        );
        assert_eq!(v["tok_s"], 80.0);
        let failed = ServeRow { load: Err("no".into()), ..row(LLAMA_SERVER, "f16", "f16", 1, 0.0) };
        let v: serde_json::Value = serde_json::from_str(&json_line(&failed, "local-task")).unwrap();
        assert_eq!(
            (v["engine"].as_str(), v["device"].as_str(), v["error"].as_str()),
            (Some(LLAMA_SERVER), Some("cpu"), Some("no"))
        );
        assert!(v.get("tok_s").is_none());
    }

    #[test]
    fn llama_server_gets_slots_of_our_context_on_loopback() {
        let cmd = llama_server_command(Path::new("/b"), Path::new("/p/m-q4_0.gguf"), 8, 256, 4321);
        assert_eq!(cmd.get_program(), "/b/llama-server");
        let args: Vec<String> = cmd.get_args().map(|a| a.to_string_lossy().into_owned()).collect();
        let t = peers::threads().to_string();
        assert_eq!(
            args,
            [
                "-m",
                "/p/m-q4_0.gguf",
                "--host",
                "127.0.0.1",
                "--port",
                "4321",
                "-np",
                "8",
                "-c",
                "2048",
                "-cb",
                "--no-cache-prompt",
                "-cram",
                "0",
                "-t",
                &t,
                "-tb",
                &t,
                "-a",
                "bench",
                "--no-webui"
            ]
        );
    }

    /// Each its own from the first token, one line each, the asked length (whole lines).
    #[test]
    fn long_prompts_are_distinct_lines_of_the_asked_length() {
        let text = long_prompts(&["The capital of France is", "def f(n):", "Once upon a time"], 50, 12);
        let prompts: Vec<&str> = text.lines().collect();
        assert_eq!(prompts.len(), 12);
        for (i, p) in prompts.iter().enumerate() {
            assert!(p.starts_with(&format!("{i}. ")), "{p}");
            assert!((200..200 + 40).contains(&p.len()), "{} chars: {p}", p.len());
        }
        assert!(prompts[1].starts_with("1. def f(n): Once upon a time The capital"), "{}", prompts[1]);
        assert_eq!(long_prompts(&[], 50, 2), "0.\n1.\n");
    }

    #[test]
    fn http_status_lines() {
        assert_eq!(parse_status("HTTP/1.1 200 OK\r\nContent-Type: x\r\n"), Some(200));
        assert_eq!(parse_status("HTTP/1.1 503 Service Unavailable\r\n"), Some(503));
        assert_eq!(parse_status("SSH-2.0-x\r\n"), None);
        assert_eq!(parse_status(""), None);
    }
}
