//! `mlx-iree serve` as a process: it listens only once loaded and says where, a taken port
//! is a one-line error before any compile, and SIGTERM lets a stream in flight finish and
//! exits 0.

#![allow(clippy::unwrap_used)] // a test that cannot unwrap has failed; helpers included

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn serve(args: &[&str]) -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_mlx-iree"));
    let model = root().join("target/models/smollm2-135m-instruct-4bit");
    c.arg("serve").arg("--model").arg(model).args(args);
    c.env("MLX_IREE_CACHE_DIR", root().join("target/test-compile-cache"));
    c
}

#[test]
fn a_taken_port_fails_before_compiling() {
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = taken.local_addr().unwrap().port().to_string();
    let started = Instant::now();
    let out = serve(&["--port", &port, "--max-context", "128"]).output().unwrap();
    assert_eq!(out.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.starts_with(&format!("mlx-iree: error: cannot listen on 127.0.0.1:{port}: ")), "{stderr}");
    assert!(!stderr.contains("compiling"), "{stderr}");
    assert!(started.elapsed() < Duration::from_secs(30));
}

#[test]
fn sigterm_finishes_the_stream_in_flight_and_exits_0() {
    // The shapes of crates/server/tests/http.rs: the same compiled modules.
    let mut child = serve(&["--port", "0", "--max-context", "128", "--max-batch", "8"])
        .stderr(Stdio::piped())
        .stdout(Stdio::null())
        .spawn()
        .unwrap();
    // Its log is read on a thread of its own, so that every wait below has a deadline.
    let stderr = child.stderr.take().unwrap();
    let (tx, lines) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stderr).lines().map_while(Result::ok) {
            let _ = tx.send(line);
        }
    });
    let deadline = Instant::now() + Duration::from_secs(900);
    let mut log = String::new();
    let addr = loop {
        let line = match lines.recv_timeout(deadline.saturating_duration_since(Instant::now())) {
            Ok(line) => line,
            Err(e) => {
                let _ = child.kill();
                let _ = child.wait();
                panic!("serve did not listen ({e:?}) within 900 s:\n{log}");
            }
        };
        log.push_str(&line);
        log.push('\n');
        if let Some(rest) = line.strip_prefix("listening on http://") {
            break rest.split_whitespace().next().unwrap().to_owned();
        }
    };
    assert!(log.contains("8 slots x 128 positions"), "{log}");

    let body = r#"{"prompt": "Once upon a time", "max_tokens": 40, "temperature": 0, "stream": true}"#;
    let mut s = TcpStream::connect(&addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(120))).unwrap();
    write!(
        s,
        "POST /v1/completions HTTP/1.1\r\nHost: t\r\nConnection: close\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    )
    .unwrap();
    let mut reader = BufReader::new(s);
    let mut line = String::new();
    while !line.starts_with("data: ") {
        line.clear();
        assert!(reader.read_line(&mut line).unwrap() > 0);
    }
    // SIGTERM through the `kill` command (no libc binding in tests).
    let status = Command::new("kill").arg("-TERM").arg(child.id().to_string()).status().unwrap();
    assert!(status.success());
    let mut rest = String::new();
    reader.read_to_string(&mut rest).unwrap();
    let events = rest.matches("data: {").count();
    assert!(rest.contains("data: [DONE]"), "stream cut by SIGTERM:\n{rest}");
    assert!(rest.contains("\"finish_reason\":\"length\"") || rest.contains("\"finish_reason\":\"stop\""), "{rest}");
    assert!(events >= 2, "{rest}");

    let deadline = Instant::now() + Duration::from_secs(60);
    let code = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status.code();
        }
        assert!(Instant::now() < deadline, "serve still running 60 s after SIGTERM");
        std::thread::sleep(Duration::from_millis(50));
    };
    // The process has exited: its log ends within moments.
    let mut tail = String::new();
    while let Ok(line) = lines.recv_timeout(Duration::from_secs(10)) {
        tail.push_str(&line);
        tail.push('\n');
    }
    assert_eq!(code, Some(0), "{log}{tail}");
    assert!(tail.contains("shutting down: 1 requests in flight"), "{tail}");
    assert!(tail.contains("server stopped"), "{tail}");
    // Nothing listens any more.
    assert!(TcpStream::connect(&addr).is_err());
}
