//! The OpenAI-compatible server over real loopback HTTP, on SmolLM2 4-bit: answers match
//! the engine's own greedy tokens, streams match bodies, 8 concurrent requests each get what
//! they get alone, 64 requests over 16 connections all complete, and every fault (bad JSON,
//! bad fields, unknown model, over-long prompt, oversized body, bad key, full queue, a
//! client gone mid-stream) gets its status and OpenAI error body.

#![allow(clippy::unwrap_used)] // a test that cannot unwrap has failed; helpers included

use engine::scheduler::Request;
use engine::{EngineConfig, KvElem};
use serde_json::{Value, json};
use server::{Generator, Server, ServerConfig};
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock};
use std::time::{Duration, Instant};

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

/// One engine for every test of this file (loading compiles; the tests take turns).
fn model() -> Arc<Generator> {
    static MODEL: OnceLock<Arc<Generator>> = OnceLock::new();
    Arc::clone(MODEL.get_or_init(|| {
        let dir = model_dir();
        assert!(dir.join("config.json").exists(), "{} is missing: run `cargo xtask model`", dir.display());
        let config = EngineConfig {
            max_batch: MAX_BATCH,
            max_context: Some(MAX_CONTEXT),
            kv_elem: KvElem::F32,
            ..EngineConfig::new(
                "local-task",
                engine::device::default_precision("local-task", &dir),
                root().join("target/test-compile-cache"),
            )
        };
        Arc::new(Generator::load(&dir, config).unwrap())
    }))
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
    let server = Server::new(model(), config);
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
    assert_eq!(
        v["usage"],
        json!({"prompt_tokens": prompt_tokens, "completion_tokens": n, "total_tokens": prompt_tokens + n})
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
    assert_eq!(p(json!({"n": 2})), (400, "n must be 1, got 2: send one request per choice".to_owned(), json!("n")));
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
    assert_eq!(models["data"][0]["max_context"], MAX_CONTEXT);
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
