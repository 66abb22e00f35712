//! `mlx-iree serve` driven by the real `openai` Python client (pinned in
//! third_party/pins.toml, venv target/client-venv made by `cargo xtask test`): chat and
//! completion, streamed and not, give `mlx-iree generate`'s greedy text; and two servers
//! behind nginx (Debian's package, run on loopback with its own config) answer the client
//! through the load balancer exactly as one server does alone.

#![allow(clippy::unwrap_used)] // a test that cannot unwrap has failed; helpers included

mod common;

use common::{Served, generate, mlx_iree, root};
use serde_json::Value;
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

#[path = "../../../tests/scripted/smollm2_tools.rs"]
mod smollm2_tools;

/// The server's context: the shapes of crates/server/tests/http.rs (shared compiled modules).
const MAX_CONTEXT: &str = "128";
/// Starts a server (the shapes of crates/server/tests/http.rs, so the compiled modules are
/// shared) and waits until it listens.
fn serve() -> Served {
    let mut command = mlx_iree();
    command.args(["serve", "--port", "0", "--max-context", MAX_CONTEXT, "--max-batch", "8", "--model-id", "smollm2"]);
    common::start(command.arg("--model").arg(common::smollm2()))
}

fn python() -> PathBuf {
    let python = root().join("target/client-venv/bin/python");
    assert!(python.exists(), "{} is missing: run `cargo xtask test` (it installs the openai client)", python.display());
    python
}

fn client(base_url: &str, args: &[&str]) -> Value {
    client_of(base_url, "smollm2", args)
}

fn client_of(base_url: &str, model: &str, args: &[&str]) -> Value {
    let out = Command::new(python())
        .arg(root().join("tests/clients/openai_check.py"))
        .arg(base_url)
        .arg(model)
        .args(args)
        .env("PYTHONDONTWRITEBYTECODE", "1")
        .output()
        .unwrap();
    assert!(out.status.success(), "openai client failed:\n{}", String::from_utf8_lossy(&out.stderr));
    serde_json::from_slice(&out.stdout).unwrap()
}

/// The client reads a model's tool calls (a scripted Hermes model, tests/scripted/hermes,
/// whose greedy answer is a call of `get_weather`) from the message and from streamed deltas
/// as it reads OpenAI's.
#[test]
fn the_openai_client_reads_tool_calls() {
    let model = common::scripted("qwen2", "hermes");
    let mut command = mlx_iree();
    command.args([
        "serve",
        "--port",
        "0",
        "--max-batch",
        "1",
        "--precision",
        "f32",
        "--max-context",
        "32",
        "--kv-cache",
        "f32",
    ]);
    let server = common::start(command.args(["--model-id", "hermes", "--model"]).arg(model.path()));
    let got = client_of(&format!("http://{}/v1", server.addr), "hermes", &["tools"]);
    let call = serde_json::json!({"name": "get_weather", "arguments": {"city": "Paris"}});
    for key in ["plain", "streamed"] {
        assert_eq!(got[key]["calls"], serde_json::json!([call]), "{got}");
        assert_eq!(got[key]["finish"], "tool_calls", "{got}");
        assert_eq!(got[key]["content"], Value::Null, "{got}");
    }
    assert!(got["plain"]["ids"][0].as_str().unwrap().starts_with("call-"), "{got}");
}

/// `tool_choice` through the client on a real checkpoint (SmolLM2 that takes tools,
/// tests/scripted/smollm2_tools.rs; its weights and shapes are [`serve`]'s, so it shares the
/// compiled modules): "required" gives one well-formed call of a given tool for each of 20
/// questions (arguments valid against the tool's schema, finish `tool_calls`, no content),
/// and a named function gives its call, streamed as the same call.
#[test]
fn the_openai_client_gets_forced_tool_calls() {
    let dir = root().join("target/test-smollm2-tools-client");
    smollm2_tools::write(&common::smollm2(), &dir);
    let mut command = mlx_iree();
    command.args(["serve", "--port", "0", "--max-context", MAX_CONTEXT, "--max-batch", "8"]);
    let server = common::start(command.args(["--model-id", "smollm2-tools", "--model"]).arg(&dir));
    let got = client_of(&format!("http://{}/v1", server.addr), "smollm2-tools", &["forced"]);
    let valid = |call: &Value| {
        let args = call["arguments"].as_object().unwrap();
        match call["name"].as_str().unwrap() {
            "get_weather" => {
                args.len() == 2
                    && args["city"].as_str().is_some_and(|c| c.chars().count() <= 12)
                    && args["days"].as_i64().is_some_and(|d| (1..=7).contains(&d))
            }
            "get_time" => args.len() == 1 && ["UTC", "CET", "JST"].iter().any(|z| args["zone"] == *z),
            _ => false,
        }
    };
    let required = got["required"].as_array().unwrap();
    assert_eq!(required.len(), 20, "{got}");
    for answer in required {
        let calls = answer["calls"].as_array().unwrap();
        assert!(calls.len() == 1 && valid(&calls[0]), "{answer}");
        assert_eq!((&answer["finish"], &answer["content"]), (&Value::from("tool_calls"), &Value::Null), "{answer}");
    }
    let named = &got["named"];
    assert!(named["calls"].as_array().unwrap().len() == 1 && named["calls"][0]["name"] == "get_time", "{got}");
    assert!(valid(&named["calls"][0]), "{got}");
    assert_eq!(got["named_streamed"]["calls"], named["calls"], "{got}");
    assert_eq!(got["named_streamed"]["finish"], "tool_calls", "{got}");
}

/// `chat.completions.parse` with a pydantic model (an enum, a nested model, a list, length
/// limits) returns a parsed object for each of 20 prompts, and through `stream` for 3.
#[test]
fn the_openai_client_parses_structured_output() {
    let server = serve();
    let got = client(&format!("http://{}/v1", server.addr), &["structured"]);
    let parsed = got["parsed"].as_array().unwrap();
    assert_eq!(parsed.len(), 20, "{got}");
    for city in parsed.iter().chain(got["streamed"].as_array().unwrap()) {
        assert!(city.is_object() && ["capital", "town", "village"].iter().any(|k| city["kind"] == *k), "{city}");
    }
    assert_eq!(got["streamed"].as_array().unwrap()[..], parsed[..3], "{got}");
}

#[test]
fn the_openai_client_gets_what_generate_prints() {
    let server = serve();
    let got = client(&format!("http://{}/v1", server.addr), &["suite"]);
    let chat = generate("What is the capital of France?", true, "24");
    let completion = generate("The capital of France is", false, "12");
    assert_eq!(got["chat"]["text"], chat.as_str(), "{got}");
    assert_eq!(got["chat_stream"]["text"], chat.as_str(), "{got}");
    assert_eq!(got["chat_stream"]["finish"], got["chat"]["finish"]);
    assert_eq!(got["completion"]["text"], completion.as_str(), "{got}");
    assert_eq!(got["completion_stream"]["text"], completion.as_str(), "{got}");
    assert_eq!(got["models"], serde_json::json!(["smollm2"]));
    assert_eq!(got["errors"]["unknown_model"][0], 404, "{got}");
    assert_eq!(
        got["errors"]["unknown_model"][1],
        "the model `no-such-model` does not exist (this server has `smollm2`)"
    );
    // Logprobs through the client: one entry per token, alternatives most likely first,
    // greedy so the chosen token leads them; streamed the same.
    let plain = got["logprobs"]["plain"].as_array().unwrap();
    assert_eq!(plain.len() as u64, got["logprobs"]["completion_tokens"].as_u64().unwrap(), "{got}");
    for entry in plain {
        let (token, logprob, top) = (&entry[0], entry[1].as_f64().unwrap(), entry[2].as_array().unwrap());
        assert_eq!(top.len(), 3, "{entry}");
        assert_eq!((&top[0][0], top[0][1].as_f64().unwrap()), (token, logprob), "{entry}");
        assert!(top.windows(2).all(|w| w[0][1].as_f64() >= w[1][1].as_f64()), "{entry}");
        assert!(logprob <= 0.0, "{entry}");
    }
    let streamed = got["logprobs"]["streamed"].as_array().unwrap();
    assert_eq!(streamed.len(), plain.len(), "{got}");
    for (s, p) in streamed.iter().zip(plain) {
        assert_eq!(s[0], p[0]);
        assert!((s[1].as_f64().unwrap() - p[1].as_f64().unwrap()).abs() < 1e-4, "{s} vs {p}");
    }
    // n: 3 with a seed: three distinct answers, the same twice.
    let n3 = got["n3"].as_array().unwrap();
    assert_eq!(n3[0], n3[1], "{got}");
    let texts = n3[0].as_array().unwrap();
    assert!(texts.len() == 3 && texts[0] != texts[1] && texts[1] != texts[2] && texts[0] != texts[2], "{got}");
    // Refused fields: the client raises BadRequestError with the field as `param`.
    for (name, message) in [
        ("response_format", "the schema cannot be used: "),
        ("tools", "this model's chat template does not take tools"),
        ("frequency_penalty", "frequency_penalty must be between -2 and 2, got 3"),
        ("foo", "unknown field `foo`"),
    ] {
        let error = &got["errors"][name];
        assert_eq!((&error[0], &error[2]), (&serde_json::json!(400), &serde_json::json!(name)), "{got}");
        assert!(error[1].as_str().unwrap().starts_with(message), "{got}");
    }
    assert_eq!(got["errors"]["too_long"][0], 400, "{got}");
    assert!(
        got["errors"]["too_long"][1]
            .as_str()
            .unwrap()
            .contains("plus max_tokens (100000) exceed the context limit (128 tokens)")
    );
}

fn get(addr: &str, path: &str) -> (u16, String) {
    common::request(addr, "GET", path, None)
}

/// Completion requests a server has answered with 200, from its /metrics.
fn answered(addr: &str) -> u64 {
    let (_, metrics) = get(addr, "/metrics");
    let line = "mlx_iree_requests_total{endpoint=\"/v1/completions\",status=\"200\"} ";
    metrics.lines().find_map(|l| l.strip_prefix(line)).map_or(0, |n| n.parse().unwrap())
}

struct Nginx(Child);

impl Drop for Nginx {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// nginx on a free loopback port in front of `backends` (docs/SCALING.md's configuration).
fn nginx(dir: &Path, backends: &[&str]) -> (Nginx, String) {
    let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let servers: String = backends.iter().map(|b| format!("    server {b} max_fails=1 fail_timeout=5s;\n")).collect();
    let p = dir.display();
    let conf = format!(
        "master_process off;\ndaemon off;\nuser root;\npid {p}/nginx.pid;\nerror_log {p}/error.log;\n\
         events {{ worker_connections 64; }}\n\
         http {{\n  access_log off;\n  client_body_temp_path {p}/body;\n  proxy_temp_path {p}/proxy;\n\
         fastcgi_temp_path {p}/fastcgi;\n  uwsgi_temp_path {p}/uwsgi;\n  scgi_temp_path {p}/scgi;\n\
         upstream mlx_iree {{\n    least_conn;\n{servers}    keepalive 16;\n  }}\n\
         server {{\n    listen 127.0.0.1:{port};\n    location / {{\n      proxy_pass http://mlx_iree;\n\
         proxy_http_version 1.1;\n      proxy_set_header Connection \"\";\n      proxy_buffering off;\n\
         proxy_read_timeout 300s;\n    }}\n  }}\n}}\n"
    );
    std::fs::write(dir.join("nginx.conf"), conf).unwrap();
    let nginx = which("nginx").expect("nginx is missing: run `cargo xtask test` (it installs Debian's nginx-light)");
    // One process (no master and workers), so killing it leaves nothing behind; no
    // inherited pipes either.
    let child = Command::new(nginx)
        .arg("-p")
        .arg(dir)
        .arg("-c")
        .arg(dir.join("nginx.conf"))
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let addr = format!("127.0.0.1:{port}");
    let deadline = Instant::now() + Duration::from_secs(20);
    while TcpStream::connect(&addr).is_err() {
        assert!(
            Instant::now() < deadline,
            "nginx did not listen: {}",
            std::fs::read_to_string(dir.join("error.log")).unwrap_or_default()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    (Nginx(child), addr)
}

fn which(name: &str) -> Option<PathBuf> {
    ["/usr/sbin", "/usr/bin", "/sbin", "/bin"].iter().map(|d| Path::new(d).join(name)).find(|p| p.exists())
}

/// Eight different prompts, one per line (shared by the server tests).
fn prompts() -> Vec<String> {
    let text = std::fs::read_to_string(root().join("tests/clients/prompts.txt")).unwrap();
    let prompts: Vec<String> = text.lines().map(str::to_owned).collect();
    assert_eq!(prompts.len(), 8);
    prompts
}

/// Two servers behind nginx, ready per /health: 8 concurrent client requests through the
/// balancer get exactly what one server alone gives, and both servers took some.
#[test]
fn two_servers_behind_nginx() {
    let (a, b) = (serve(), serve());
    for s in [&a, &b] {
        assert_eq!(get(&s.addr, "/health"), (200, "{\"status\":\"ok\"}".to_owned()));
    }
    let prompts = prompts();
    let fanout: Vec<&str> = std::iter::once("fanout").chain(prompts.iter().map(String::as_str)).collect();
    let alone = client(&format!("http://{}/v1", a.addr), &fanout);
    let dir = tempfile::tempdir().unwrap();
    let (_nginx, lb) = nginx(dir.path(), &[&a.addr, &b.addr]);
    let before = (answered(&a.addr), answered(&b.addr));
    let through = client(&format!("http://{lb}/v1"), &fanout);
    assert_eq!(through, alone);
    let served = (answered(&a.addr) - before.0, answered(&b.addr) - before.1);
    assert_eq!(served.0 + served.1, prompts.len() as u64);
    assert!(served.0 > 0 && served.1 > 0, "one server took every request: {served:?}");
}
