//! The OpenAI-compatible server over real loopback HTTP, on SmolLM2 4-bit: answers match
//! the engine's own greedy tokens, streams match bodies, 8 concurrent requests each get what
//! they get alone, 64 requests over 16 connections all complete, and every fault (bad JSON,
//! bad fields, unknown model, over-long prompt, oversized body, bad key, full queue, a
//! client gone mid-stream) gets its status and OpenAI error body. A scripted harmony model
//! (gpt-oss's format) gives its reasoning apart from its answer.

#![allow(clippy::unwrap_used)] // a test that cannot unwrap has failed; helpers included

use engine::scheduler::Request;
use engine::{EngineConfig, KvElem, Precision};
use serde_json::{Value, json};
use server::{Generator, Server, ServerConfig};
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock};
use std::time::{Duration, Instant};

#[path = "../../../tests/scripted/smollm2_tools.rs"]
mod smollm2_tools;

const MAX_BATCH: usize = 8;
/// Small, so the test compiles few shapes (one attention window); prompts here are short.
const MAX_CONTEXT: usize = 128;
const MODEL_ID: &str = "smollm2";

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn model_dir() -> PathBuf {
    root().join("target/models/smollm2-135m-instruct-4bit")
}

/// One engine for every test of this file (loading compiles; the tests take turns), with
/// the prefix cache, so requests after the first read their shared prompt starts (the chat
/// template's system prompt) from slots and every greedy answer below checks it too.
fn model() -> Arc<Generator> {
    static MODEL: OnceLock<Arc<Generator>> = OnceLock::new();
    Arc::clone(MODEL.get_or_init(|| smollm2(true)))
}

/// The same engine without the prefix cache: logits compared across requests come from the
/// same computation (a prefix read from a slot was computed by other calls, so its logits
/// differ by rounding).
fn uncached_model() -> Arc<Generator> {
    static MODEL: OnceLock<Arc<Generator>> = OnceLock::new();
    Arc::clone(MODEL.get_or_init(|| smollm2(false)))
}

fn smollm2(prefix_cache: bool) -> Arc<Generator> {
    let dir = model_dir();
    assert!(dir.join("config.json").exists(), "{} is missing: run `cargo xtask model`", dir.display());
    let config = EngineConfig {
        max_batch: MAX_BATCH,
        max_context: Some(MAX_CONTEXT),
        kv_elem: KvElem::F32,
        prefix_cache,
        ..EngineConfig::new(
            "local-task",
            engine::device::default_precision("local-task", &dir),
            root().join("target/test-compile-cache"),
        )
    };
    Arc::new(Generator::load(&dir, config).unwrap())
}

fn turn() -> MutexGuard<'static, ()> {
    static SERIAL: Mutex<()> = Mutex::new(());
    SERIAL.lock().unwrap_or_else(|p| p.into_inner())
}

/// A server on a free loopback port, stopped when dropped.
struct Running {
    addr: SocketAddr,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Drop for Running {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(t) = self.thread.take() {
            t.join().unwrap();
        }
    }
}

fn serve(config: ServerConfig) -> Running {
    serve_model(model(), config)
}

fn serve_model(model: Arc<Generator>, config: ServerConfig) -> Running {
    let server = Server::new(model, config);
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let (ready, addr) = std::sync::mpsc::channel();
    let thread = std::thread::spawn(move || {
        let runtime = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
        runtime.block_on(async move {
            let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
            ready.send(listener.local_addr().unwrap()).unwrap();
            server
                .run(listener, async move {
                    let _ = stopped.await;
                })
                .await
                .unwrap();
        });
    });
    Running { addr: addr.recv().unwrap(), stop: Some(stop), thread: Some(thread) }
}

fn config() -> ServerConfig {
    ServerConfig { shutdown_timeout: Duration::from_secs(5), ..ServerConfig::new(MODEL_ID) }
}

/// An HTTP answer: status, headers (lowercase names), body (de-chunked).
#[derive(Debug)]
struct Reply {
    status: u16,
    headers: Vec<(String, String)>,
    body: String,
}

impl Reply {
    fn json(&self) -> Value {
        serde_json::from_str(&self.body).unwrap_or_else(|e| panic!("{e}: {}", self.body))
    }

    fn header(&self, name: &str) -> Option<&str> {
        self.headers.iter().find(|(n, _)| n == name).map(|(_, v)| v.as_str())
    }

    /// The `data:` payloads of an event stream.
    fn events(&self) -> Vec<String> {
        self.body.split("\n\n").filter_map(|e| e.strip_prefix("data: ")).map(str::to_owned).collect()
    }
}

fn send(addr: SocketAddr, method: &str, path: &str, headers: &[(&str, &str)], body: &[u8]) -> TcpStream {
    let mut s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(120))).unwrap();
    let mut head =
        format!("{method} {path} HTTP/1.1\r\nHost: test\r\nConnection: close\r\nContent-Length: {}\r\n", body.len());
    for (name, value) in headers {
        head.push_str(&format!("{name}: {value}\r\n"));
    }
    head.push_str("\r\n");
    s.write_all(head.as_bytes()).unwrap();
    // A server may answer (413) before reading all of a large body; a reset is then fine.
    let _ = s.write_all(body);
    s
}

fn request(addr: SocketAddr, method: &str, path: &str, headers: &[(&str, &str)], body: &[u8]) -> Reply {
    let mut s = send(addr, method, path, headers, body);
    let mut raw = Vec::new();
    let _ = s.read_to_end(&mut raw);
    let raw = String::from_utf8(raw).unwrap();
    let (head, rest) = raw.split_once("\r\n\r\n").unwrap_or_else(|| panic!("no header end in {raw:?}"));
    let mut lines = head.lines();
    let status = lines.next().unwrap().split(' ').nth(1).unwrap().parse().unwrap();
    let headers: Vec<(String, String)> =
        lines.filter_map(|l| l.split_once(": ")).map(|(n, v)| (n.to_ascii_lowercase(), v.to_owned())).collect();
    let chunked = headers.iter().any(|(n, v)| n == "transfer-encoding" && v == "chunked");
    let body = if chunked { dechunk(rest) } else { rest.to_owned() };
    Reply { status, headers, body }
}

fn dechunk(mut rest: &str) -> String {
    let mut out = String::new();
    while let Some((size, tail)) = rest.split_once("\r\n") {
        let n = usize::from_str_radix(size.trim(), 16).unwrap();
        if n == 0 {
            break;
        }
        out.push_str(&tail[..n]);
        rest = &tail[n + 2..];
    }
    out
}

fn post(addr: SocketAddr, path: &str, body: &Value) -> Reply {
    request(addr, "POST", path, &[("Content-Type", "application/json")], body.to_string().as_bytes())
}

/// The greedy text the engine gives `prompt` (template already applied) alone, with its
/// token count: the reference every HTTP answer must reproduce.
fn alone(prompt: Vec<u32>, max_tokens: usize) -> (String, usize) {
    let model = model();
    let request = Request {
        stop_tokens: model.eos.clone(),
        vocab_limit: Some(model.tokenizer.vocab_size()),
        ..Request::greedy(prompt, max_tokens)
    };
    let (tokens, _) = model.scheduler.submit(request).unwrap().collect_blocking().unwrap();
    (model.tokenizer.decode(&tokens, true).unwrap(), tokens.len())
}

fn encode(text: &str) -> Vec<u32> {
    model().tokenizer.encode(text, true).unwrap()
}

fn chat_ids(text: &str) -> Vec<u32> {
    let model = model();
    model.chat.as_ref().unwrap().encode(&model.tokenizer, &[text::chat::Message::user(text)]).unwrap()
}

/// Eight different prompts, one per line (shared by the server tests).
fn prompts() -> Vec<String> {
    let text = std::fs::read_to_string(root().join("tests/clients/prompts.txt")).unwrap();
    let prompts: Vec<String> = text.lines().map(str::to_owned).collect();
    assert_eq!(prompts.len(), 8);
    prompts
}

#[test]
fn completions_match_the_engine_and_streams_match_bodies() {
    let _turn = turn();
    let server = serve(config());
    let prompt = &prompts()[0];
    let (expected, n) = alone(encode(prompt), 12);
    let body = json!({"model": MODEL_ID, "prompt": prompt, "max_tokens": 12, "temperature": 0});
    let reply = post(server.addr, "/v1/completions", &body);
    assert_eq!(reply.status, 200, "{}", reply.body);
    let v = reply.json();
    assert_eq!(v["object"], "text_completion");
    assert_eq!(v["model"], MODEL_ID);
    assert_eq!(v["choices"][0]["text"], expected.as_str());
    assert_eq!(v["choices"][0]["finish_reason"], if n == 12 { "length" } else { "stop" });
    let prompt_tokens = encode(prompt).len();
    // `alone` ran the prompt just before: all but its last token came from that slot.
    assert_eq!(
        v["usage"],
        json!({"prompt_tokens": prompt_tokens, "completion_tokens": n, "total_tokens": prompt_tokens + n,
               "prompt_tokens_details": {"cached_tokens": prompt_tokens - 1}})
    );

    // The same as a stream: the pieces add up to the body's text, then [DONE].
    let mut body = body;
    body["stream"] = json!(true);
    body["stream_options"] = json!({"include_usage": true});
    let reply = post(server.addr, "/v1/completions", &body);
    assert_eq!((reply.status, reply.header("content-type")), (200, Some("text/event-stream")));
    let events = reply.events();
    assert_eq!(events.last().unwrap(), "[DONE]");
    let chunks: Vec<Value> = events[..events.len() - 1].iter().map(|e| serde_json::from_str(e).unwrap()).collect();
    let text: String = chunks.iter().filter_map(|c| c["choices"][0]["text"].as_str()).collect();
    assert_eq!(text, expected);
    let usage = chunks.last().unwrap();
    assert_eq!(usage["usage"]["completion_tokens"], n);
    assert_eq!(chunks[chunks.len() - 2]["choices"][0]["finish_reason"], v["choices"][0]["finish_reason"]);

    // Token ids as the prompt give the same answer as the text they encode.
    let reply =
        post(server.addr, "/v1/completions", &json!({"prompt": encode(prompt), "max_tokens": 12, "temperature": 0}));
    assert_eq!(reply.json()["choices"][0]["text"], expected.as_str());
}

#[test]
fn chat_applies_the_template_and_streams_deltas() {
    let _turn = turn();
    let server = serve(config());
    let question = "What is the capital of France?";
    let (expected, n) = alone(chat_ids(question), 24);
    let body = json!({"model": MODEL_ID, "messages": [{"role": "user", "content": question}], "max_tokens": 24, "temperature": 0});
    let reply = post(server.addr, "/v1/chat/completions", &body);
    assert_eq!(reply.status, 200, "{}", reply.body);
    let v = reply.json();
    assert_eq!(v["object"], "chat.completion");
    assert_eq!(v["choices"][0]["message"], json!({"role": "assistant", "content": expected}));
    assert_eq!(v["usage"]["completion_tokens"], n);
    assert!(expected.contains("Paris"), "{expected}");

    let mut body = body;
    body["stream"] = json!(true);
    let events = post(server.addr, "/v1/chat/completions", &body).events();
    assert_eq!(events.last().unwrap(), "[DONE]");
    let chunks: Vec<Value> = events[..events.len() - 1].iter().map(|e| serde_json::from_str(e).unwrap()).collect();
    assert_eq!(chunks[0]["choices"][0]["delta"], json!({"role": "assistant", "content": ""}));
    assert!(chunks.iter().all(|c| c["object"] == "chat.completion.chunk"));
    let text: String = chunks.iter().filter_map(|c| c["choices"][0]["delta"]["content"].as_str()).collect();
    assert_eq!(text, expected);
    assert_eq!(chunks.last().unwrap()["choices"][0]["finish_reason"], v["choices"][0]["finish_reason"]);

    // `ignore_eos` (an extension): past the end of the turn, up to max_tokens.
    assert!(n < 24 && v["choices"][0]["finish_reason"] == "stop", "the answer ends its turn: {v}");
    let mut long = body.clone();
    long["stream"] = json!(false);
    long["ignore_eos"] = json!(true);
    let v = post(server.addr, "/v1/chat/completions", &long).json();
    assert_eq!(
        (v["usage"]["completion_tokens"].clone(), v["choices"][0]["finish_reason"].clone()),
        (json!(24), json!("length"))
    );
    assert!(v["choices"][0]["message"]["content"].as_str().unwrap().starts_with(&expected), "{v}");
    long["ignore_eos"] = json!("yes");
    assert_eq!(post(server.addr, "/v1/chat/completions", &long).status, 400);

    // A stop string cuts the answer before it, with finish_reason "stop".
    let cut = expected.find("Paris").unwrap();
    body["stream"] = json!(false);
    body["stop"] = json!(["Paris"]);
    let v = post(server.addr, "/v1/chat/completions", &body).json();
    assert_eq!(v["choices"][0]["message"]["content"], &expected[..cut]);
    assert_eq!(v["choices"][0]["finish_reason"], "stop");
}

/// Eight concurrent greedy requests with different prompts: each gets exactly what it gets
/// alone.
#[test]
fn concurrent_requests_get_what_they_get_alone() {
    let _turn = turn();
    let server = serve(config());
    let prompts = prompts();
    let expected: Vec<String> = prompts.iter().map(|p| alone(encode(p), 16).0).collect();
    let addr = server.addr;
    let threads: Vec<_> = prompts
        .iter()
        .cloned()
        .map(|p| {
            std::thread::spawn(move || {
                post(addr, "/v1/completions", &json!({"prompt": p, "max_tokens": 16, "temperature": 0})).json()
            })
        })
        .collect();
    for ((t, want), p) in threads.into_iter().zip(&expected).zip(&prompts) {
        assert_eq!(t.join().unwrap()["choices"][0]["text"], want.as_str(), "prompt {p:?}");
    }
}

/// 64 requests over 16 connections at once: every one completes with its own answer and
/// token count; latency percentiles and throughput are printed.
#[test]
fn sixty_four_requests_over_sixteen_connections() {
    let _turn = turn();
    let server = serve(config());
    const MAX_TOKENS: usize = 8;
    let prompts = Arc::new(prompts());
    let expected: Arc<Vec<(String, usize)>> = Arc::new(prompts.iter().map(|p| alone(encode(p), MAX_TOKENS)).collect());
    let addr = server.addr;
    let started = Instant::now();
    let threads: Vec<_> = (0..16)
        .map(|c| {
            let (expected, prompts) = (Arc::clone(&expected), Arc::clone(&prompts));
            std::thread::spawn(move || {
                (0..4)
                    .map(|i| {
                        let k = (c * 4 + i) % prompts.len();
                        let t = Instant::now();
                        let body = json!({"prompt": prompts[k], "max_tokens": MAX_TOKENS, "temperature": 0});
                        let reply = post(addr, "/v1/completions", &body);
                        assert_eq!(reply.status, 200, "{}", reply.body);
                        let v = reply.json();
                        assert_eq!(v["choices"][0]["text"], expected[k].0.as_str());
                        assert_eq!(v["usage"]["completion_tokens"], expected[k].1);
                        (t.elapsed().as_secs_f64(), expected[k].1)
                    })
                    .collect::<Vec<_>>()
            })
        })
        .collect();
    let mut results: Vec<(f64, usize)> = threads.into_iter().flat_map(|t| t.join().unwrap()).collect();
    assert_eq!(results.len(), 64);
    let wall = started.elapsed().as_secs_f64();
    results.sort_by(|a, b| a.0.total_cmp(&b.0));
    let tokens: usize = results.iter().map(|r| r.1).sum();
    println!(
        "64 requests / 16 connections: p50 {:.2} s, p99 {:.2} s, {tokens} tokens in {wall:.1} s = {:.1} tok/s",
        results[31].0,
        results[63].0,
        tokens as f64 / wall
    );
}

fn error_of(reply: &Reply) -> (u16, String, Value) {
    let v = reply.json();
    let e = &v["error"];
    assert!(e["message"].is_string() && e["type"].is_string(), "{v}");
    (reply.status, e["message"].as_str().unwrap().to_owned(), e["param"].clone())
}

#[test]
fn bad_requests_get_openai_errors() {
    let _turn = turn();
    let server = ServerConfig { max_body_bytes: 4096, ..config() };
    let server = serve(server);
    let addr = server.addr;
    let raw = |body: &str| request(addr, "POST", "/v1/completions", &[], body.as_bytes());
    let (status, message, _) = error_of(&raw("{not json"));
    assert_eq!(status, 400);
    assert!(message.starts_with("invalid request body: key must be a string"), "{message}");
    let (status, message, _) = error_of(&raw(r#"{"prompt": "hi", "temperature": "hot"}"#));
    assert_eq!(status, 400);
    assert!(message.contains("invalid type: string \"hot\""), "{message}");
    let (status, message, _) = error_of(&raw(r#"{"max_tokens": 3}"#));
    assert_eq!((status, message.as_str()), (400, "invalid request body: missing field `prompt` at line 1 column 17"));

    let p = |extra: Value| {
        let mut body = json!({"prompt": "hi", "max_tokens": 4});
        body.as_object_mut().unwrap().extend(extra.as_object().unwrap().clone());
        error_of(&post(addr, "/v1/completions", &body))
    };
    assert_eq!(
        p(json!({"model": "gpt-4"})),
        (404, "the model `gpt-4` does not exist (this server has `smollm2`)".to_owned(), json!("model"))
    );
    let prompt_len = encode("hi").len();
    assert_eq!(
        p(json!({"max_tokens": MAX_CONTEXT})),
        (
            400,
            format!(
                "the prompt ({prompt_len} tokens) plus max_tokens ({MAX_CONTEXT}) exceed the context limit ({MAX_CONTEXT} tokens)"
            ),
            json!("max_tokens")
        )
    );
    assert_eq!(p(json!({"temperature": -1})).0, 400);
    assert_eq!(p(json!({"temperature": -1})).2, json!("temperature"));
    assert_eq!(
        p(json!({"top_p": 0})),
        (400, "top_p must be greater than 0 and at most 1, got 0".to_owned(), json!("top_p"))
    );
    assert_eq!(p(json!({"top_k": 0})), (400, "top_k must be at least 1, got 0".to_owned(), json!("top_k")));
    assert_eq!(p(json!({"n": 0})), (400, "n must be between 1 and 16, got 0".to_owned(), json!("n")));
    assert_eq!(p(json!({"n": 17})), (400, "n must be between 1 and 16, got 17".to_owned(), json!("n")));
    assert_eq!(p(json!({"max_tokens": 0})), (400, "max_tokens must be at least 1".to_owned(), json!("max_tokens")));
    assert_eq!(p(json!({"prompt": ["a", "b"]})).1, "2 prompts in one request: send one prompt per request");
    let vocab = model().scheduler.info().model.vocab;
    assert_eq!(
        p(json!({"prompt": [1, vocab]})).1,
        format!("token id {vocab} is out of range for vocabulary size {vocab}")
    );
    let (status, message, _) = error_of(&post(addr, "/v1/chat/completions", &json!({"messages": []})));
    assert_eq!((status, message.as_str()), (400, "messages must not be empty"));

    // Over the body limit: 413, still with a JSON body.
    let big = json!({"prompt": "x".repeat(8192)});
    assert_eq!(
        error_of(&post(addr, "/v1/completions", &big)),
        (413, "request body over the limit of 4096 bytes".to_owned(), Value::Null)
    );
    assert_eq!(error_of(&request(addr, "GET", "/v2/nothing", &[], b"")).0, 404);
    assert_eq!(error_of(&request(addr, "GET", "/v1/completions", &[], b"")).0, 405);

    // The server still answers after all of that.
    let reply = post(addr, "/v1/completions", &json!({"prompt": "hi", "max_tokens": 2, "temperature": 0}));
    assert_eq!(reply.status, 200);
}

#[test]
fn api_key_models_health_and_metrics() {
    let _turn = turn();
    let server = serve(ServerConfig { api_key: Some("sesame".into()), ..config() });
    let addr = server.addr;
    let body = json!({"prompt": "hi", "max_tokens": 2, "temperature": 0}).to_string();
    let (status, message, _) = error_of(&request(addr, "POST", "/v1/completions", &[], body.as_bytes()));
    assert_eq!((status, message.as_str()), (401, "missing or wrong API key (send Authorization: Bearer KEY)"));
    let wrong = [("Authorization", "Bearer sesamf")];
    assert_eq!(request(addr, "POST", "/v1/completions", &wrong, body.as_bytes()).status, 401);
    assert_eq!(request(addr, "GET", "/v1/models", &[], b"").status, 401);
    let key = [("Authorization", "Bearer sesame")];
    assert_eq!(request(addr, "POST", "/v1/completions", &key, body.as_bytes()).status, 200);
    let models = request(addr, "GET", "/v1/models", &key, b"").json();
    assert_eq!(models["data"][0]["id"], MODEL_ID);
    assert_eq!(models["data"][0]["max_model_len"], MAX_CONTEXT);
    // Health and metrics need no key (load balancers and scrapers).
    let health = request(addr, "GET", "/health", &[], b"");
    assert_eq!((health.status, health.json()), (200, json!({"status": "ok"})));
    let metrics = request(addr, "GET", "/metrics", &[], b"").body;
    for line in [
        "mlx_iree_requests_total{endpoint=\"/v1/completions\",status=\"401\"} 2",
        "mlx_iree_requests_total{endpoint=\"/v1/completions\",status=\"200\"} 1",
        "mlx_iree_requests_total{endpoint=\"/v1/models\",status=\"200\"} 1",
        "mlx_iree_slots 8",
        "mlx_iree_queue_depth 0",
        "mlx_iree_time_to_first_token_seconds_count 1",
    ] {
        assert!(metrics.lines().any(|l| l == line), "{line} not in\n{metrics}");
    }
    assert!(metrics.contains("mlx_iree_decode_step_seconds_bucket{le=\"+Inf\"}"), "{metrics}");
}

fn metric(addr: SocketAddr, name: &str) -> f64 {
    let text = request(addr, "GET", "/metrics", &[], b"").body;
    text.lines().find_map(|l| l.strip_prefix(&format!("{name} "))).unwrap().parse().unwrap()
}

/// Reads a stream's events until `n` data lines have come.
fn read_events(stream: TcpStream, n: usize) -> BufReader<TcpStream> {
    let mut reader = BufReader::new(stream);
    let mut seen = 0;
    let mut line = String::new();
    while seen < n {
        line.clear();
        assert!(reader.read_line(&mut line).unwrap() > 0, "stream ended after {seen} events");
        if line.starts_with("data: ") {
            seen += 1;
        }
    }
    reader
}

/// A client gone mid-stream frees its slot at the next step; with every place taken the
/// next request gets 429 with Retry-After; afterwards requests succeed again.
#[test]
fn disconnects_free_slots_and_a_full_server_says_429() {
    let _turn = turn();
    let server = serve(ServerConfig { queue_limit: 0, ..config() });
    let addr = server.addr;
    let long =
        json!({"prompt": "Tell me a long story.", "max_tokens": 100, "temperature": 0, "stream": true}).to_string();
    let stream = send(addr, "POST", "/v1/completions", &[], long.as_bytes());
    let reader = read_events(stream, 2);
    assert_eq!(metric(addr, "mlx_iree_active_slots"), 1.0);
    drop(reader);
    let idle = (0..500).any(|_| {
        std::thread::sleep(Duration::from_millis(20));
        metric(addr, "mlx_iree_active_slots") == 0.0
    });
    assert!(idle, "the slot of a client gone mid-stream was not freed within 10 s");

    // Fill every place (8 slots, no queue), each with its first token out.
    let busy: Vec<_> =
        (0..MAX_BATCH).map(|_| read_events(send(addr, "POST", "/v1/completions", &[], long.as_bytes()), 1)).collect();
    let reply = post(addr, "/v1/completions", &json!({"prompt": "hi", "max_tokens": 2}));
    assert_eq!(reply.status, 429, "{}", reply.body);
    assert_eq!(reply.header("retry-after"), Some("1"));
    assert_eq!(error_of(&reply).1, "the server is busy (8 requests running or queued); retry later");
    drop(busy);
    let ok = (0..500).any(|_| {
        std::thread::sleep(Duration::from_millis(20));
        post(addr, "/v1/completions", &json!({"prompt": "hi", "max_tokens": 2, "temperature": 0})).status == 200
    });
    assert!(ok, "still refused 10 s after the clients left");
}

/// Every body field is read, accepted as without effect, or refused with a 400 naming it;
/// so are message fields and content parts. Bad sampling values are 400s naming the field,
/// and the server serves on.
#[test]
fn every_field_is_honoured_or_refused_by_name() {
    let _turn = turn();
    let server = serve(config());
    let addr = server.addr;
    let with = |path: &str, extra: Value| {
        let mut body = if path == "/v1/completions" {
            json!({"prompt": "hi", "max_tokens": 2, "temperature": 0})
        } else {
            json!({"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2, "temperature": 0})
        };
        body.as_object_mut().unwrap().extend(extra.as_object().unwrap().clone());
        post(addr, path, &body)
    };
    let refused = |path: &str, extra: Value| {
        let reply = with(path, extra.clone());
        assert_eq!(reply.status, 400, "{extra}: {}", reply.body);
        let (_, message, param) = error_of(&reply);
        (message, param.as_str().unwrap_or_default().to_owned())
    };
    let chat = "/v1/chat/completions";
    let completions = "/v1/completions";
    for path in [chat, completions] {
        assert_eq!(refused(path, json!({"foo": 1})), ("unknown field `foo`".to_owned(), "foo".to_owned()));
        assert_eq!(
            refused(path, json!({"stream_options": {"include_usage": true, "bar": 1}})),
            ("unknown field `stream_options.bar`".to_owned(), "stream_options.bar".to_owned())
        );
        // Fields without effect on the answer are accepted; so is a refused one set to null.
        let reply = with(
            path,
            json!({"user": "u1", "metadata": {"k": "v"}, "store": false, "service_tier": "auto",
                   "safety_identifier": "s", "prompt_cache_key": "c",
                   "stream_options": {"include_obfuscation": false}}),
        );
        assert_eq!(reply.status, 200, "{}", reply.body);
        // Sampling values out of range, each named.
        for (extra, param, message) in [
            (
                json!({"presence_penalty": -2.5}),
                "presence_penalty",
                "presence_penalty must be between -2 and 2, got -2.5",
            ),
            (json!({"frequency_penalty": 3}), "frequency_penalty", "frequency_penalty must be between -2 and 2, got 3"),
            (
                json!({"repetition_penalty": 0}),
                "repetition_penalty",
                "repetition_penalty must be a finite number > 0, got 0",
            ),
            (json!({"min_p": 1.5}), "min_p", "min_p must be between 0 and 1, got 1.5"),
            (
                json!({"logit_bias": {"7": 101}}),
                "logit_bias",
                "logit_bias of token 7 must be between -100 and 100, got 101",
            ),
            (json!({"logit_bias": {"x": 1}}), "logit_bias", "logit_bias keys must be token ids, got `x`"),
        ] {
            assert_eq!(refused(path, extra), (message.to_owned(), param.to_owned()));
        }
        let vocab = model().tokenizer.vocab_size();
        assert_eq!(
            refused(path, json!({"logit_bias": {vocab.to_string(): 5}})),
            (
                format!("logit_bias names token {vocab}, outside the vocabulary of {vocab} tokens"),
                "logit_bias".to_owned()
            )
        );
    }
    // Chat fields not implemented yet: named, "not supported yet"; their no-op values pass.
    for (extra, param) in [
        (json!({"parallel_tool_calls": false}), "parallel_tool_calls"),
        (json!({"modalities": ["text", "audio"]}), "modalities"),
    ] {
        let (message, got) = refused(chat, extra);
        assert_eq!(got, param);
        assert!(message.starts_with(&format!("`{param}` is not supported yet")), "{message}");
    }
    // SmolLM2's template takes no tools (and writes no calls).
    assert_eq!(
        refused(chat, json!({"tools": [{"type": "function", "function": {"name": "f"}}]})),
        ("this model's chat template does not take tools".to_owned(), "tools".to_owned())
    );
    // SmolLM2's template has no reasoning effort to set.
    assert_eq!(
        refused(chat, json!({"reasoning_effort": "low"})),
        (
            "this model's chat template does not read reasoning_effort (got `low`)".to_owned(),
            "reasoning_effort".to_owned()
        )
    );
    let (expected, _) = alone(chat_ids("hi"), 2);
    let reply = with(
        chat,
        json!({"response_format": {"type": "text"}, "tools": [], "tool_choice": "none", "audio": null,
                          "parallel_tool_calls": true}),
    );
    assert_eq!(reply.json()["choices"][0]["message"]["content"], expected.as_str());
    for (extra, param) in
        [(json!({"echo": true}), "echo"), (json!({"suffix": "!"}), "suffix"), (json!({"best_of": 2}), "best_of")]
    {
        let (message, got) = refused(completions, extra);
        assert_eq!(got, param);
        assert!(message.contains("is not supported yet"), "{message}");
    }
    // Messages: text parts are the text; other parts and fields are refused by name.
    let parts = json!({"messages": [{"role": "user", "content": [{"type": "text", "text": "h"}, {"type": "text", "text": "i"}]}]});
    assert_eq!(with(chat, parts).json()["choices"][0]["message"]["content"], expected.as_str());
    let image = json!({"messages": [{"role": "user", "content": [
        {"type": "text", "text": "what is this?"},
        {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}}]}]});
    assert_eq!(
        refused(chat, image),
        (
            "content parts of type `image_url` are not supported (text only)".to_owned(),
            "messages[0].content".to_owned()
        )
    );
    // A name goes to the template (SmolLM2's does not print it).
    let named = json!({"messages": [{"role": "user", "content": "hi", "name": "ann"}]});
    assert_eq!(with(chat, named).json()["choices"][0]["message"]["content"], expected.as_str());
    let tool = json!({"messages": [{"role": "user", "content": "hi"}, {"role": "tool", "content": "1"}]});
    assert_eq!(
        refused(chat, tool),
        ("a tool message needs the tool_call_id it answers".to_owned(), "messages[1].tool_call_id".to_owned())
    );
    let function = json!({"messages": [{"role": "function", "content": "1", "name": "f"}]});
    assert_eq!(refused(chat, function).1, "messages[0].role");
    let odd = json!({"messages": [{"role": "user", "content": "hi", "colour": "red"}]});
    assert_eq!(refused(chat, odd).1, "messages[0].colour");
    // Logprobs counts.
    assert_eq!(refused(chat, json!({"logprobs": true, "top_logprobs": 21})).1, "top_logprobs");
    assert_eq!(
        refused(chat, json!({"top_logprobs": 2})),
        ("top_logprobs needs logprobs: true".to_owned(), "top_logprobs".to_owned())
    );
    assert_eq!(refused(completions, json!({"logprobs": 21})).1, "logprobs");
    // Still serving.
    assert_eq!(with(completions, json!({})).status, 200);
}

/// A schema with an enum, a nested object, an array and required fields, small enough that
/// a whole answer fits the test context.
fn city_schema() -> Value {
    json!({"type": "object", "properties": {
        "city": {"type": "string", "maxLength": 12},
        "kind": {"enum": ["capital", "town", "village"]},
        "place": {"type": "object", "properties": {"country": {"type": "string", "maxLength": 12},
                  "coastal": {"type": "boolean"}}, "required": ["country", "coastal"], "additionalProperties": false},
        "sights": {"type": "array", "items": {"type": "string", "maxLength": 10}, "maxItems": 2}},
        "required": ["city", "kind", "place", "sights"], "additionalProperties": false})
}

/// Whether `v` is valid against [`city_schema`].
fn is_city(v: &Value) -> bool {
    let short = |v: &Value, n: usize| v.as_str().is_some_and(|s| s.chars().count() <= n);
    let keys = |v: &Value, want: &[&str]| {
        v.as_object().is_some_and(|o| o.len() == want.len() && want.iter().all(|k| o.contains_key(*k)))
    };
    keys(v, &["city", "kind", "place", "sights"])
        && short(&v["city"], 12)
        && ["capital", "town", "village"].iter().any(|k| v["kind"] == *k)
        && keys(&v["place"], &["country", "coastal"])
        && short(&v["place"]["country"], 12)
        && v["place"]["coastal"].is_boolean()
        && v["sights"].as_array().is_some_and(|a| a.len() <= 2 && a.iter().all(|s| short(s, 10)))
}

/// `response_format`: answers to 20 prompts are JSON valid against a schema with enums, a
/// nested object, an array and required fields (greedy, whole and streamed); `json_object`
/// gives a JSON object; the same prompt unconstrained is not JSON; bad formats are refused
/// by name, and the server keeps serving.
#[test]
fn structured_output_follows_the_schema() {
    let _turn = turn();
    let server = serve(config());
    let chat = "/v1/chat/completions";
    let cities = [
        "Paris", "Tokyo", "Lima", "Oslo", "Cairo", "Quito", "Hanoi", "Rome", "Dakar", "Perth", "Bergen", "Nice",
        "Porto", "Kyoto", "Cork", "Split", "Bruges", "Tangier", "Hobart", "Goa",
    ];
    let format =
        json!({"type": "json_schema", "json_schema": {"name": "city", "strict": true, "schema": city_schema()}});
    let ask = |city: &str| {
        json!({"messages": [{"role": "system", "content": "Reply in JSON."},
                            {"role": "user", "content": format!("Describe {city}.")}],
               "temperature": 0, "response_format": format})
    };
    for city in cities {
        let v = post(server.addr, chat, &ask(city)).json();
        let text = v["choices"][0]["message"]["content"].as_str().unwrap().to_owned();
        let answer: Value = serde_json::from_str(&text).unwrap_or_else(|e| panic!("{city}: {text:?}: {e}"));
        assert!(is_city(&answer), "{city}: {answer}");
        assert_eq!(v["choices"][0]["finish_reason"], "stop", "{city}: {text}");
    }
    // Streamed, the same text.
    let mut streamed = ask("Oslo");
    streamed["stream"] = json!(true);
    let events = post(server.addr, chat, &streamed).events();
    let text: String = events[..events.len() - 1]
        .iter()
        .map(|e| serde_json::from_str::<Value>(e).unwrap())
        .filter_map(|c| c["choices"][0]["delta"]["content"].as_str().map(str::to_owned))
        .collect();
    let whole = post(server.addr, chat, &ask("Oslo")).json();
    assert_eq!(whole["choices"][0]["message"]["content"], text.as_str());
    // Any JSON object; and without a format, the same prompt is free text.
    let mut object = ask("Lima");
    object["response_format"] = json!({"type": "json_object"});
    object["max_tokens"] = json!(60);
    let v = post(server.addr, chat, &object).json();
    let text = v["choices"][0]["message"]["content"].as_str().unwrap();
    if v["choices"][0]["finish_reason"] == "stop" {
        assert!(serde_json::from_str::<Value>(text).unwrap().is_object(), "{text}");
    } else {
        assert!(text.starts_with('{'), "{text}");
    }
    let mut free = ask("Lima");
    free.as_object_mut().unwrap().remove("response_format");
    free["max_tokens"] = json!(40);
    let v = post(server.addr, chat, &free).json();
    assert!(serde_json::from_str::<Value>(v["choices"][0]["message"]["content"].as_str().unwrap()).is_err(), "{v}");

    for (format, message, param) in [
        (
            json!({"type": "xml"}),
            "response_format's type must be text, json_object or json_schema",
            "response_format.type",
        ),
        (
            json!({"type": "json_schema", "json_schema": {"schema": {}}}),
            "json_schema needs a `name`",
            "response_format.json_schema.name",
        ),
        (
            json!({"type": "json_schema", "json_schema": {"name": "x", "schema": "object"}}),
            "`response_format.json_schema.schema` must be a JSON schema (an object)",
            "response_format.json_schema.schema",
        ),
        (
            json!({"type": "json_schema", "json_schema": {"name": "x", "schema": {}, "colour": 1}}),
            "unknown field `response_format.json_schema.colour`",
            "response_format.json_schema.colour",
        ),
    ] {
        let mut bad = ask("Rome");
        bad["response_format"] = format;
        let reply = post(server.addr, chat, &bad);
        assert_eq!(error_of(&reply), (400, message.to_owned(), json!(param)));
    }
    let mut bad = ask("Rome");
    bad["response_format"] =
        json!({"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "nonsense"}}});
    let (status, message, param) = error_of(&post(server.addr, chat, &bad));
    assert_eq!((status, param), (400, json!("response_format")));
    assert!(message.starts_with("the schema cannot be used: "), "{message}");
    let mut bad = ask("Rome");
    bad["ignore_eos"] = json!(true);
    assert_eq!(error_of(&post(server.addr, chat, &bad)).2, json!("ignore_eos"));
    assert_eq!(post(server.addr, chat, &ask("Rome")).status, 200);
}

/// A chat's next turn reads the conversation so far from the slot its last turn left: only
/// its new tokens are prefilled (`usage.prompt_tokens_details.cached_tokens`, and the hits
/// in /metrics), and its answer is the one a whole prefill gives (greedy, the engine without
/// the prefix cache).
#[test]
fn a_chats_next_turn_reads_only_its_new_tokens() {
    let _turn = turn();
    let server = serve(config());
    let chat = "/v1/chat/completions";
    let ask = |messages: &Value| {
        post(server.addr, chat, &json!({"messages": messages, "temperature": 0, "max_tokens": 12})).json()
    };
    let messages = |turns: &[(&str, &str)]| {
        let ms: Vec<text::chat::Message> = turns.iter().map(|(r, c)| text::chat::Message::new(*r, *c)).collect();
        let model = model();
        model.chat.as_ref().unwrap().encode(&model.tokenizer, &ms).unwrap()
    };
    let hits = metric(server.addr, "mlx_iree_prefix_cache_hits_total");
    let first = json!([{"role": "user", "content": "Name a colour."}]);
    let v = ask(&first);
    let answer = v["choices"][0]["message"]["content"].as_str().unwrap().to_owned();
    let first_ids = messages(&[("user", "Name a colour.")]);
    let second = json!([{"role": "user", "content": "Name a colour."}, {"role": "assistant", "content": answer},
                        {"role": "user", "content": "And a fruit?"}]);
    let v = ask(&second);
    let second_ids = messages(&[("user", "Name a colour."), ("assistant", &answer), ("user", "And a fruit?")]);
    assert_eq!(v["usage"]["prompt_tokens"], second_ids.len());
    let cached = v["usage"]["prompt_tokens_details"]["cached_tokens"].as_u64().unwrap() as usize;
    assert!(cached >= first_ids.len() && cached < second_ids.len(), "{cached} of {}", second_ids.len());
    let model = uncached_model();
    let request = Request {
        stop_tokens: model.eos.clone(),
        vocab_limit: Some(model.tokenizer.vocab_size()),
        ..Request::greedy(second_ids, 12)
    };
    let (tokens, done) = model.scheduler.submit(request).unwrap().collect_blocking().unwrap();
    assert_eq!(done.cached_tokens, 0);
    assert_eq!(v["choices"][0]["message"]["content"], model.tokenizer.decode(&tokens, true).unwrap().as_str());
    assert!(metric(server.addr, "mlx_iree_prefix_cache_hits_total") > hits);
    assert!(metric(server.addr, "mlx_iree_prefix_cache_tokens_total") >= cached as f64);
}

/// The engine's logits for each greedy step after `prompt` (ids past the vocabulary at
/// -inf), and the tokens chosen.
fn reference_logits(prompt: Vec<u32>, steps: usize) -> (Vec<Vec<f32>>, Vec<u32>) {
    use engine::scheduler::Sampling;
    let model = uncached_model();
    let seen: Arc<Mutex<Vec<Vec<f32>>>> = Arc::default();
    let record = Arc::clone(&seen);
    let request = Request {
        stop_tokens: model.eos.clone(),
        vocab_limit: Some(model.tokenizer.vocab_size()),
        sampling: Sampling::Custom(Box::new(move |logits: &[f32]| {
            record.lock().unwrap().push(logits.to_vec());
            Ok(text::sampler::argmax(logits)?)
        })),
        ..Request::greedy(prompt, steps)
    };
    let (tokens, _) = model.scheduler.submit(request).unwrap().collect_blocking().unwrap();
    let logits = seen.lock().unwrap().clone();
    (logits, tokens)
}

fn log_softmax(logits: &[f32]) -> Vec<f64> {
    let max = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max) as f64;
    let total = max + logits.iter().map(|&l| (l as f64 - max).exp()).sum::<f64>().ln();
    logits.iter().map(|&l| l as f64 - total).collect()
}

fn token_text(id: u32) -> String {
    model().tokenizer.decode(&[id], false).unwrap()
}

/// Logprobs are the log-softmax of the step's logits (within 1e-4), alternatives sorted,
/// the same streamed; completions' legacy format too.
#[test]
fn logprobs_are_the_log_softmax_of_the_steps_logits() {
    let _turn = turn();
    let server = serve_model(uncached_model(), config());
    let question = "What is the capital of France?";
    let (logits, tokens) = reference_logits(chat_ids(question), 8);
    assert_eq!(tokens.len(), 8);
    let body = json!({"messages": [{"role": "user", "content": question}], "max_tokens": 8, "temperature": 0,
                      "logprobs": true, "top_logprobs": 5});
    let v = post(server.addr, "/v1/chat/completions", &body).json();
    let content = v["choices"][0]["logprobs"]["content"].as_array().unwrap().clone();
    assert_eq!(content.len(), 8, "{v}");
    // With logprobs the host chooses; the answer is still the greedy one.
    assert_eq!(v["choices"][0]["message"]["content"], alone(chat_ids(question), 8).0.as_str());
    let check = |content: &[Value]| {
        for (step, entry) in content.iter().enumerate() {
            let want = log_softmax(&logits[step]);
            assert_eq!(entry["token"], token_text(tokens[step]).as_str(), "step {step}");
            assert_eq!(entry["bytes"], json!(token_text(tokens[step]).as_bytes()));
            let got = entry["logprob"].as_f64().unwrap();
            assert!(
                (got - want[tokens[step] as usize]).abs() < 1e-4,
                "step {step}: {got} vs {}",
                want[tokens[step] as usize]
            );
            let top = entry["top_logprobs"].as_array().unwrap();
            assert_eq!(top.len(), 5);
            let mut sorted = want.clone();
            sorted.sort_by(|a, b| b.total_cmp(a));
            for (k, alt) in top.iter().enumerate() {
                let lp = alt["logprob"].as_f64().unwrap();
                assert!((lp - sorted[k]).abs() < 1e-4, "step {step} alternative {k}: {lp} vs {}", sorted[k]);
                if k > 0 {
                    assert!(lp <= top[k - 1]["logprob"].as_f64().unwrap());
                }
            }
            // Greedy: the chosen token is the most likely.
            assert_eq!(top[0]["token"], entry["token"]);
        }
    };
    check(&content);

    // Streamed: the chunks' entries add up to the same.
    let mut streamed = body.clone();
    streamed["stream"] = json!(true);
    let events = post(server.addr, "/v1/chat/completions", &streamed).events();
    let entries: Vec<Value> = events[..events.len() - 1]
        .iter()
        .map(|e| serde_json::from_str::<Value>(e).unwrap())
        .filter_map(|c| c["choices"][0]["logprobs"]["content"].as_array().cloned())
        .flatten()
        .collect();
    check(&entries);

    // Without logprobs: null, as before.
    let mut plain = body.clone();
    plain.as_object_mut().unwrap().remove("logprobs");
    plain.as_object_mut().unwrap().remove("top_logprobs");
    assert_eq!(post(server.addr, "/v1/chat/completions", &plain).json()["choices"][0]["logprobs"], Value::Null);

    // Completions: `logprobs: N`, the legacy format.
    let prompt = &prompts()[0];
    let (logits, tokens) = reference_logits(encode(prompt), 6);
    let body = json!({"prompt": prompt, "max_tokens": 6, "temperature": 0, "logprobs": 3});
    let v = post(server.addr, "/v1/completions", &body).json();
    let lp = &v["choices"][0]["logprobs"];
    let n = tokens.len();
    assert_eq!(lp["tokens"].as_array().unwrap().len(), n, "{v}");
    let mut offset = 0;
    for step in 0..n {
        let text = token_text(tokens[step]);
        assert_eq!(lp["tokens"][step], text.as_str());
        let want = log_softmax(&logits[step])[tokens[step] as usize];
        assert!((lp["token_logprobs"][step].as_f64().unwrap() - want).abs() < 1e-4);
        assert_eq!(lp["text_offset"][step], offset);
        offset += text.chars().count();
        let top = lp["top_logprobs"][step].as_object().unwrap();
        assert!((1..=4).contains(&top.len()) && top.contains_key(&text), "{top:?}");
    }
}

/// Penalties and logit_bias reach the sampler: an answer equals the engine's with the same
/// sampler, a forced token is chosen every step, and a repeating answer changes.
#[test]
fn penalties_and_logit_bias_change_the_answer() {
    use engine::scheduler::Sampling;
    use text::sampler::{Sampler, SamplingParams};
    let _turn = turn();
    let server = serve(config());
    let model = model();
    let prompt = "1, 2, 1, 2, 1, 2, 1, 2,";
    let run = |extra: Value| {
        let mut body = json!({"prompt": prompt, "max_tokens": 16, "temperature": 0, "ignore_eos": true});
        body.as_object_mut().unwrap().extend(extra.as_object().unwrap().clone());
        let reply = post(server.addr, "/v1/completions", &body);
        assert_eq!(reply.status, 200, "{}", reply.body);
        reply.json()["choices"][0]["text"].as_str().unwrap().to_owned()
    };
    let plain = run(json!({}));
    let penalised = run(json!({"frequency_penalty": 2.0, "presence_penalty": 1.0}));
    assert_ne!(plain, penalised, "the penalties changed nothing");
    assert_eq!(run(json!({"frequency_penalty": 2.0, "presence_penalty": 1.0})), penalised);
    // The engine with the sampler itself gives the same.
    let params = SamplingParams { frequency_penalty: 2.0, presence_penalty: 1.0, ..SamplingParams::default() };
    let mut sampler = Sampler::new(params).unwrap();
    let request = Request {
        vocab_limit: Some(model.tokenizer.vocab_size()),
        sampling: Sampling::Custom(Box::new(move |logits: &[f32]| Ok(sampler.sample(logits)?))),
        ..Request::greedy(encode(prompt), 16)
    };
    let (tokens, _) = model.scheduler.submit(request).unwrap().collect_blocking().unwrap();
    assert_eq!(penalised, model.tokenizer.decode(&tokens, true).unwrap());
    // repetition_penalty changes it too.
    assert_ne!(run(json!({"repetition_penalty": 1.5})), plain);
    // A bias of 100 forces a token, sampled or not.
    let forced = model.tokenizer.encode(" banana", false).unwrap()[0];
    let bias = json!({"logit_bias": {forced.to_string(): 100}, "max_tokens": 3});
    let want = model.tokenizer.decode(&[forced; 3], true).unwrap();
    assert_eq!(run(bias.clone()), want);
    let mut sampled = bias;
    sampled["temperature"] = json!(1.0);
    sampled["seed"] = json!(5);
    assert_eq!(run(sampled), want);
}

/// /tokenize and /detokenize (llama.cpp's shapes) round trip; bad input is a 400.
#[test]
fn tokenize_and_detokenize_round_trip() {
    let _turn = turn();
    let server = serve(config());
    let addr = server.addr;
    let text = "The capital of France is Paris.";
    let v = post(addr, "/tokenize", &json!({"content": text})).json();
    let ids = model().tokenizer.encode(text, false).unwrap();
    assert_eq!(v, json!({"tokens": ids}));
    let with_special = post(addr, "/tokenize", &json!({"content": text, "add_special": true})).json();
    assert_eq!(with_special, json!({"tokens": encode(text)}));
    let back = post(addr, "/detokenize", &json!({"tokens": ids})).json();
    assert_eq!(back, json!({"content": text}));
    let vocab = model().tokenizer.vocab_size();
    assert_eq!(
        error_of(&post(addr, "/detokenize", &json!({"tokens": [1, vocab]}))),
        (400, format!("token id {vocab} is outside the vocabulary of {vocab} tokens"), json!("tokens"))
    );
    assert_eq!(
        error_of(&post(addr, "/tokenize", &json!({"content": text, "with_pieces": true}))).2,
        json!("with_pieces")
    );
    assert_eq!(error_of(&post(addr, "/tokenize", &json!({"content": 5}))).0, 400);
    assert_eq!(post(addr, "/tokenize", &json!({"content": "ok"})).status, 200);
}

/// `n: 3` with a seed: three distinct answers, the same on every run, the first the answer
/// with `n: 1`; streamed, each choice's chunks add up to its answer; usage counts them all.
#[test]
fn n_choices_are_distinct_and_reproducible() {
    let _turn = turn();
    let server = serve(config());
    let body = json!({"messages": [{"role": "user", "content": "Write a short poem about the sea."}],
                      "max_tokens": 12, "temperature": 1.0, "seed": 11, "n": 3});
    let answer = |body: &Value| {
        let reply = post(server.addr, "/v1/chat/completions", body);
        assert_eq!(reply.status, 200, "{}", reply.body);
        reply.json()
    };
    let v = answer(&body);
    let texts: Vec<String> = (0..3)
        .map(|i| {
            assert_eq!(v["choices"][i]["index"], i);
            v["choices"][i]["message"]["content"].as_str().unwrap().to_owned()
        })
        .collect();
    assert!(texts[0] != texts[1] && texts[1] != texts[2] && texts[0] != texts[2], "{texts:?}");
    assert_eq!(answer(&body)["choices"], v["choices"]);
    // Choice i is the answer of n 1 with seed 11 + i.
    let mut tokens = 0;
    for (i, text) in texts.iter().enumerate() {
        let mut single = body.clone();
        single["n"] = json!(1);
        single["seed"] = json!(11 + i);
        let alone = answer(&single);
        assert_eq!(alone["choices"][0]["message"]["content"], text.as_str(), "choice {i}");
        tokens += alone["usage"]["completion_tokens"].as_u64().unwrap();
    }
    assert_eq!(v["usage"]["completion_tokens"].as_u64().unwrap(), tokens);
    assert_eq!(v["usage"]["prompt_tokens"], answer(&body)["usage"]["prompt_tokens"]);

    let mut streamed = body.clone();
    streamed["stream"] = json!(true);
    streamed["stream_options"] = json!({"include_usage": true});
    let events = post(server.addr, "/v1/chat/completions", &streamed).events();
    assert_eq!(events.last().unwrap(), "[DONE]");
    let chunks: Vec<Value> = events[..events.len() - 1].iter().map(|e| serde_json::from_str(e).unwrap()).collect();
    for (i, text) in texts.iter().enumerate() {
        let got: String = chunks
            .iter()
            .filter(|c| c["choices"][0]["index"] == i)
            .filter_map(|c| c["choices"][0]["delta"]["content"].as_str())
            .collect();
        assert_eq!(&got, text, "choice {i}");
        let finishes =
            chunks.iter().filter(|c| c["choices"][0]["index"] == i && !c["choices"][0]["finish_reason"].is_null());
        assert_eq!(finishes.count(), 1, "choice {i}");
    }
    assert_eq!(chunks.last().unwrap()["usage"]["completion_tokens"].as_u64().unwrap(), tokens);
}

/// A fixture at f32 with a scripted text side (tests/scripted/NAME: a word-level tokenizer
/// that makes the greedy answer mlx-lm recorded for the prompt `[17]`, which starts with
/// `ids`, read as the test needs, and a chat template that renders a conversation as `t17`).
fn scripted_model(fixture: &str, name: &str, ids: &[u64]) -> Arc<Generator> {
    let fixture = root().join("tests/fixtures").join(fixture).join("f32");
    let expected: Value =
        serde_json::from_str(&std::fs::read_to_string(fixture.join("expected.json")).unwrap()).unwrap();
    let got: Vec<u64> =
        expected["trajectories"][0]["token_ids"].as_array().unwrap().iter().map(|v| v.as_u64().unwrap()).collect();
    assert_eq!(expected["trajectories"][0]["prompt_ids"], json!([17]));
    assert_eq!(got[..ids.len()], *ids, "the fixture's trajectory changed");
    let dir = root().join(format!("target/test-{name}-model"));
    std::fs::create_dir_all(&dir).unwrap();
    for file in ["config.json", "model.safetensors", "model.safetensors.index.json"] {
        std::fs::copy(fixture.join(file), dir.join(file)).unwrap();
    }
    for file in ["tokenizer.json", "tokenizer_config.json"] {
        std::fs::copy(root().join("tests/scripted").join(name).join(file), dir.join(file)).unwrap();
    }
    let config = EngineConfig {
        max_context: Some(32),
        kv_elem: KvElem::F32,
        ..EngineConfig::new("local-task", Precision::F32, root().join("target/test-compile-cache"))
    };
    Arc::new(Generator::load(&dir, config).unwrap())
}

/// The gpt_oss fixture with the scripted harmony text side (tests/scripted/harmony): the
/// greedy answer reads `<|channel|>analysis<|message|>I think<|end|>` then
/// `<|message|>Paris<|return|>`, and the template adds `t1`, `t2` or `t3` for a
/// `reasoning_effort` of low, medium or high.
fn harmony_model() -> Arc<Generator> {
    scripted_model("gpt_oss", "harmony", &[142, 180, 48, 163, 161, 213, 48, 92, 2])
}

/// The qwen2 fixture with the scripted Hermes text side (tests/scripted/hermes): the greedy
/// answer reads `<tool_call> {"name": "get_weather", "arguments": {"city": "Paris"}}
/// </tool_call>` then `<|im_end|>`; the template adds `t1` when no tools are given, and
/// `t<n>` for each call in the history (its arguments' `n`) and `t<id>` for each tool result.
fn hermes_model() -> Arc<Generator> {
    scripted_model("qwen2", "hermes", &[325, 122, 306, 241, 150, 212, 89, 190])
}

/// SmolLM2 (the server tests' model and shapes, so its compiled modules are shared) that takes
/// tools (tests/scripted/smollm2_tools.rs), for the forced calls of `tool_choice`.
fn smollm2_tools_model() -> Arc<Generator> {
    static MODEL: OnceLock<Arc<Generator>> = OnceLock::new();
    Arc::clone(MODEL.get_or_init(|| {
        let dir = root().join("target/test-smollm2-tools-model");
        smollm2_tools::write(&model_dir(), &dir);
        let config = EngineConfig {
            max_batch: MAX_BATCH,
            max_context: Some(MAX_CONTEXT),
            kv_elem: KvElem::F32,
            ..EngineConfig::new(
                "local-task",
                engine::device::default_precision("local-task", &model_dir()),
                root().join("target/test-compile-cache"),
            )
        };
        Arc::new(Generator::load(&dir, config).unwrap())
    }))
}

/// `tool_choice` `required` and a named function: 20 prompts each give one well-formed call
/// of a tool given, its arguments valid against the tool's schema (decoding constrained to
/// the model's call format), whole and streamed, ending with `tool_calls`.
#[test]
fn forced_tool_calls_are_well_formed() {
    let _turn = turn();
    let server = serve_model(smollm2_tools_model(), ServerConfig::new("smollm2-tools"));
    let chat = "/v1/chat/completions";
    let tools = json!([
        {"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object",
            "properties": {"city": {"type": "string", "maxLength": 12}, "days": {"type": "integer", "minimum": 1,
            "maximum": 7}}, "required": ["city", "days"], "additionalProperties": false}}},
        {"type": "function", "function": {"name": "get_time", "parameters": {"type": "object",
            "properties": {"zone": {"enum": ["UTC", "CET", "JST"]}}, "required": ["zone"], "additionalProperties": false}}}]);
    let valid = |call: &Value| {
        let args: Value = serde_json::from_str(call["function"]["arguments"].as_str().unwrap()).unwrap();
        match call["function"]["name"].as_str().unwrap() {
            "get_weather" => {
                args.as_object().unwrap().len() == 2
                    && args["city"].as_str().is_some_and(|c| c.chars().count() <= 12)
                    && args["days"].as_i64().is_some_and(|d| (1..=7).contains(&d))
            }
            "get_time" => {
                args.as_object().unwrap().len() == 1 && ["UTC", "CET", "JST"].iter().any(|z| args["zone"] == *z)
            }
            _ => false,
        }
    };
    let questions = [
        "Weather in Paris?",
        "What time is it in Tokyo?",
        "Will it rain in Oslo tomorrow?",
        "Time in Berlin?",
        "Is it sunny in Rome?",
        "Clock in London?",
        "Forecast for Lima this week?",
        "What hour is it now?",
        "Snow in Quebec?",
        "Temperature in Cairo?",
        "Current time in Osaka?",
        "Wind in Perth?",
        "Hi!",
        "Tell me a joke.",
        "Weather for 3 days in Nice?",
        "Time zone of Madrid?",
        "Humidity in Hanoi?",
        "What is 2+2?",
        "Storms in Miami?",
        "Sunrise in Reykjavik?",
    ];
    for question in questions {
        let body = json!({"messages": [{"role": "user", "content": question}], "tools": tools,
                          "tool_choice": "required", "temperature": 0});
        let v = post(server.addr, chat, &body).json();
        let calls = v["choices"][0]["message"]["tool_calls"].as_array().unwrap_or_else(|| panic!("{question}: {v}"));
        assert!(calls.len() == 1 && valid(&calls[0]), "{question}: {v}");
        assert_eq!(v["choices"][0]["finish_reason"], "tool_calls", "{question}: {v}");
    }
    // A named function: its call; streamed, the same call as one delta.
    let named = json!({"messages": [{"role": "user", "content": "Weather in Paris?"}], "tools": tools,
                       "tool_choice": {"type": "function", "function": {"name": "get_time"}}, "temperature": 0});
    let v = post(server.addr, chat, &named).json();
    let call = &v["choices"][0]["message"]["tool_calls"][0];
    assert!(call["function"]["name"] == "get_time" && valid(call), "{v}");
    let mut streamed = named.clone();
    streamed["stream"] = json!(true);
    let events = post(server.addr, chat, &streamed).events();
    let chunks: Vec<Value> = events[..events.len() - 1].iter().map(|e| serde_json::from_str(e).unwrap()).collect();
    let deltas: Vec<&Value> = chunks.iter().filter_map(|c| c["choices"][0]["delta"].get("tool_calls")).collect();
    assert_eq!(deltas.len(), 1, "{chunks:?}");
    assert_eq!(deltas[0][0]["function"], call["function"]);
    assert_eq!(chunks.last().unwrap()["choices"][0]["finish_reason"], "tool_calls");
    // A schema and a forced call cannot both hold.
    let mut both = named.clone();
    both["response_format"] = json!({"type": "json_object"});
    assert_eq!(error_of(&post(server.addr, chat, &both)).2, json!("response_format"));
}

/// Llama 3's format has no markers: an answer that is JSON is held to its end and comes back
/// as the call (whole and as one streamed delta); without tools the same answer is text (a
/// scripted model, tests/scripted/llama3).
#[test]
fn llama3_calls_are_answers_that_are_json() {
    let _turn = turn();
    let model = scripted_model("llama_llama3_tied", "llama3", &[89, 68, 189, 56, 48, 66]);
    assert_eq!(model.tool_syntax.as_ref().map(|s| s.format), Ok(text::tools::ToolFormat::Llama3Json));
    let server = serve_model(model, ServerConfig::new("llama3-scripted"));
    let chat = "/v1/chat/completions";
    let tools = json!([{"type": "function", "function": {"name": "get_weather"}}]);
    let body = json!({"messages": [{"role": "user", "content": "Weather?"}], "tools": tools, "temperature": 0});
    let mut v = post(server.addr, chat, &body).json();
    v["choices"][0]["message"]["tool_calls"][0]["id"].take();
    let call = json!({"id": null, "type": "function",
                      "function": {"name": "get_weather", "arguments": "{\"city\":\"Paris\"}"}});
    assert_eq!(v["choices"][0]["message"], json!({"role": "assistant", "content": null, "tool_calls": [call]}));
    assert_eq!(v["choices"][0]["finish_reason"], "tool_calls");
    let mut stream = body.clone();
    stream["stream"] = json!(true);
    let events = post(server.addr, chat, &stream).events();
    let mut chunks: Vec<Value> = events[..events.len() - 1].iter().map(|e| serde_json::from_str(e).unwrap()).collect();
    chunks[1]["choices"][0]["delta"]["tool_calls"][0]["id"].take();
    let mut indexed = call.clone();
    indexed["index"] = json!(0);
    let deltas: Vec<&Value> = chunks.iter().map(|c| &c["choices"][0]["delta"]).collect();
    assert_eq!(deltas, [&json!({"role": "assistant", "content": ""}), &json!({"tool_calls": [indexed]}), &json!({})]);
    // No tools: the template adds ` t1`, and whatever the answer is, it is text.
    let plain = json!({"messages": [{"role": "user", "content": "Weather?"}], "temperature": 0, "max_tokens": 3});
    let v = post(server.addr, chat, &plain).json();
    assert!(
        v["choices"][0]["message"].get("tool_calls").is_none() && v["choices"][0]["message"]["content"].is_string()
    );
}

/// A model's tool calls come apart from its answer as OpenAI's `tool_calls`, whole and as a
/// streamed delta, ending with `tool_calls`; tools and the history's calls and results reach
/// the template; without tools (or with `tool_choice: "none"`) the answer is text; bad tool
/// fields are refused by name.
#[test]
fn tool_calls_come_apart_from_the_answer() {
    let _turn = turn();
    let server = serve_model(hermes_model(), ServerConfig::new("hermes-scripted"));
    let chat = "/v1/chat/completions";
    let tools = json!([{"type": "function", "function": {"name": "get_weather", "description": "The weather",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}]);
    let body =
        json!({"messages": [{"role": "user", "content": "Weather in Paris?"}], "tools": tools, "temperature": 0});
    let mut v = post(server.addr, chat, &body).json();
    let id = v["choices"][0]["message"]["tool_calls"][0]["id"].take();
    assert!(id.as_str().unwrap().starts_with("call-chatcmpl-"), "{id}");
    let call = json!({"id": null, "type": "function", "function": {"name": "get_weather", "arguments": "{\"city\":\"Paris\"}"}});
    assert_eq!(v["choices"][0]["message"], json!({"role": "assistant", "content": null, "tool_calls": [call]}));
    assert_eq!(
        (
            v["choices"][0]["finish_reason"].clone(),
            v["usage"]["prompt_tokens"].clone(),
            v["usage"]["completion_tokens"].clone()
        ),
        (json!("tool_calls"), json!(1), json!(7))
    );

    let mut stream = body.clone();
    stream["stream"] = json!(true);
    let events = post(server.addr, chat, &stream).events();
    assert_eq!(events.last().unwrap(), "[DONE]");
    let mut chunks: Vec<Value> = events[..events.len() - 1].iter().map(|e| serde_json::from_str(e).unwrap()).collect();
    let streamed_id = chunks[1]["choices"][0]["delta"]["tool_calls"][0]["id"].take();
    assert!(streamed_id.as_str().unwrap().starts_with("call-chatcmpl-") && streamed_id != id, "{streamed_id}");
    let mut indexed = call.clone();
    indexed["index"] = json!(0);
    let deltas: Vec<&Value> = chunks.iter().map(|c| &c["choices"][0]["delta"]).collect();
    assert_eq!(deltas, [&json!({"role": "assistant", "content": ""}), &json!({"tool_calls": [indexed]}), &json!({})]);
    assert_eq!(chunks.last().unwrap()["choices"][0]["finish_reason"], "tool_calls");

    // Without tools, or with tool_choice none, the template sees none (one prompt token more)
    // and the answer is text.
    for extra in [json!({"tools": null}), json!({"tool_choice": "none"})] {
        let mut plain = body.clone();
        plain["max_tokens"] = json!(3);
        for (k, v) in extra.as_object().unwrap() {
            plain[k] = v.clone();
        }
        let v = post(server.addr, chat, &plain).json();
        assert_eq!(v["usage"]["prompt_tokens"], 2, "{extra}");
        let message = &v["choices"][0]["message"];
        assert!(message["content"].as_str().is_some_and(|c| !c.is_empty()) && message.get("tool_calls").is_none());
    }

    // A history with a call (its arguments a string of JSON, read as an object) and its result.
    let history = json!([
        {"role": "user", "content": "Weather in Paris?"},
        {"role": "assistant", "content": null, "tool_calls": [{"id": "c1", "type": "function",
            "function": {"name": "get_weather", "arguments": "{\"n\": 5}"}}]},
        {"role": "tool", "tool_call_id": "9", "content": "18 C"}]);
    let mut turn = body.clone();
    turn["messages"] = history.clone();
    turn["max_tokens"] = json!(1);
    let reply = post(server.addr, chat, &turn);
    assert_eq!(reply.json()["usage"]["prompt_tokens"], 3, "{}", reply.body);

    // Refused, by name.
    let refused = |extra: Value| {
        let mut bad = body.clone();
        for (k, v) in extra.as_object().unwrap() {
            bad[k] = v.clone();
        }
        let reply = post(server.addr, chat, &bad);
        assert_eq!(reply.status, 400, "{}", reply.body);
        let error = &reply.json()["error"];
        (error["message"].as_str().unwrap().to_owned(), error["param"].as_str().unwrap().to_owned())
    };
    let mut bad_args = history.clone();
    bad_args[1]["tool_calls"][0]["function"]["arguments"] = json!("{\"n\": ");
    for (extra, message, param) in [
        (
            json!({"tools": [{"type": "function", "function": {"description": "no name"}}]}),
            "a tool needs a name of letters, digits, `_` and `-`",
            "tools[0].function.name",
        ),
        (json!({"tools": [{"type": "web_search"}]}), "tools must be of type `function`", "tools[0].type"),
        (
            json!({"tools": [{"type": "function", "function": {"name": "f", "parameters": "x"}}]}),
            "a tool's parameters must be a JSON schema object",
            "tools[0].function.parameters",
        ),
        (
            json!({"tool_choice": {"type": "function", "function": {"name": "nope"}}}),
            "tool_choice names `nope`, not a tool given",
            "tool_choice",
        ),
        (
            json!({"tool_choice": "sometimes"}),
            "tool_choice must be none, auto, required or a function, got `sometimes`",
            "tool_choice",
        ),
        (
            json!({"messages": bad_args}),
            "a tool call's arguments must be a JSON object",
            "messages[1].tool_calls[0].function.arguments",
        ),
    ] {
        assert_eq!(refused(extra), (message.to_owned(), param.to_owned()));
    }
    // Still serving.
    assert_eq!(post(server.addr, chat, &body).status, 200);
}

/// A harmony model's chat answer: its analysis channel as `reasoning`, its answer as
/// `content`, in the body and as streamed deltas; a completion (no chat template, no split)
/// gives every token's text as it is, markers left out. (The model loads with stored
/// parameters, which once failed on gpt-oss's sinks.)
#[test]
fn harmony_reasoning_comes_apart_from_the_answer() {
    let _turn = turn();
    let server = serve_model(harmony_model(), ServerConfig::new("gpt-oss-scripted"));
    let body = json!({"messages": [{"role": "user", "content": "What is the capital of France?"}], "temperature": 0});
    let v = post(server.addr, "/v1/chat/completions", &body).json();
    assert_eq!(v["choices"][0]["message"], json!({"role": "assistant", "content": "Paris", "reasoning": "I think"}));
    assert_eq!(
        (v["choices"][0]["finish_reason"].clone(), v["usage"]["completion_tokens"].clone()),
        (json!("stop"), json!(8))
    );

    let mut stream = body.clone();
    stream["stream"] = json!(true);
    let events = post(server.addr, "/v1/chat/completions", &stream).events();
    let chunks: Vec<Value> = events[..events.len() - 1].iter().map(|e| serde_json::from_str(e).unwrap()).collect();
    let deltas: Vec<&Value> = chunks.iter().map(|c| &c["choices"][0]["delta"]).collect();
    assert_eq!(
        deltas,
        [
            &json!({"role": "assistant", "content": ""}),
            &json!({"reasoning": "I"}),
            &json!({"reasoning": " think"}),
            &json!({"content": "Paris"}),
            &json!({})
        ]
    );

    let v = post(server.addr, "/v1/completions", &json!({"prompt": "t17", "max_tokens": 9, "temperature": 0})).json();
    assert_eq!(v["choices"][0]["text"], "analysis I think Paris");

    // `reasoning_effort` goes to the template that reads it: one prompt token more.
    let mut effort = body.clone();
    effort["reasoning_effort"] = json!("high");
    effort["max_tokens"] = json!(1);
    assert_eq!(post(server.addr, "/v1/chat/completions", &effort).json()["usage"]["prompt_tokens"], 2);
    effort["reasoning_effort"] = json!("extreme");
    let reply = post(server.addr, "/v1/chat/completions", &effort);
    assert_eq!((reply.status, reply.json()["error"]["param"].clone()), (400, json!("reasoning_effort")));
    assert_eq!(reply.json()["error"]["message"], "reasoning_effort must be low, medium or high (got `extreme`)");
}
