//! A `mlx-iree serve` process for the tests that need one: started from a prepared command,
//! waited for (with a deadline) until it says where it listens, killed and reaped when
//! dropped; and plain HTTP/1.1 requests to it.

#![allow(dead_code, clippy::unwrap_used)] // each test file uses part of it

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// The longest a server may take to listen (a cold compile cache compiles first).
const LISTEN_DEADLINE: Duration = Duration::from_secs(900);

/// A running server on a loopback port; killed when dropped.
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
