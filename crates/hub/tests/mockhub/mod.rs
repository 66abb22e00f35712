//! A stand-in for the Hugging Face hub on 127.0.0.1, answering the requests the hub client
//! makes as the hub does: `GET /api/models/{repo}/revision/{rev}` (commit sha and file list;
//! with `?blobs=true` each file's size and blob id, and an LFS file's sha256),
//! `HEAD`/`GET /{repo}/resolve/{rev}/{file}` (`X-Repo-Commit`, `ETag`; for LFS files a 302 to
//! storage with `X-Linked-Etag` = sha256 and `X-Linked-Size`), `Range` requests, and the
//! hub's refusals (`X-Error-Code` RepoNotFound, RevisionNotFound, EntryNotFound, GatedRepo).
//! Faults on demand: a body cut short once, a file served with wrong bytes. Every request is
//! logged for the tests to assert on. Shared by the hub crate's tests and the binary's.

#![allow(dead_code, clippy::unwrap_used)] // each test file uses part of it

use sha2::{Digest, Sha256};
use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{Shutdown, TcpListener, TcpStream};
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// The token the mock accepts for gated and private repos.
pub const TOKEN: &str = "hf_mock_token";

/// The longest a mock hub serves, whatever the test does.
const LIFETIME: Duration = Duration::from_secs(600);

/// One repository: its files at one commit (`main` points there).
#[derive(Debug, Clone)]
pub struct MockRepo {
    pub id: String,
    pub commit: String,
    pub files: BTreeMap<String, Vec<u8>>,
    /// Files need the token (the model info stays public, as on the hub).
    pub gated: bool,
    /// Nothing of the repo is visible without the token.
    pub private: bool,
    /// Sizes the model info lists instead of the true ones (a file larger than any disk,
    /// announced without serving its bytes).
    pub listed_sizes: BTreeMap<String, u64>,
}

impl MockRepo {
    pub fn new(id: &str, files: impl IntoIterator<Item = (String, Vec<u8>)>) -> Self {
        MockRepo {
            id: id.to_owned(),
            commit: hex(&Sha256::digest(id.as_bytes()))[..40].to_owned(),
            files: files.into_iter().collect(),
            gated: false,
            private: false,
            listed_sizes: BTreeMap::new(),
        }
    }

    /// Every file of a folder (not recursive), by name.
    pub fn from_dir(id: &str, dir: &Path) -> Self {
        let mut files = Vec::new();
        for entry in std::fs::read_dir(dir).unwrap().flatten() {
            if entry.file_type().unwrap().is_file() {
                files.push((entry.file_name().to_string_lossy().into_owned(), std::fs::read(entry.path()).unwrap()));
            }
        }
        MockRepo::new(id, files)
    }
}

/// A loopback address nothing listens on: the hub unreachable.
pub fn dead_endpoint() -> String {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let endpoint = format!("http://{}", listener.local_addr().unwrap());
    drop(listener);
    endpoint
}

/// Whether the hub stores a file in LFS (its `.gitattributes` rule for weights).
pub fn is_lfs(file: &str) -> bool {
    file.ends_with(".safetensors") || file.ends_with(".bin")
}

/// The sha256 of bytes, lowercase hex (an LFS file's etag).
pub fn sha256(bytes: &[u8]) -> String {
    hex(&Sha256::digest(bytes))
}

/// A git-style etag for a regular file (40 hex digits; not a sha256).
pub fn git_etag(bytes: &[u8]) -> String {
    let mut h = Sha256::new();
    h.update(b"blob");
    h.update(bytes);
    hex(&h.finalize())[..40].to_owned()
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// A logged request.
#[derive(Debug, Clone)]
pub struct Logged {
    pub method: String,
    pub path: String,
    pub range: Option<String>,
    pub authorization: Option<String>,
}

#[derive(Debug, Default)]
struct Faults {
    /// The next GET of this file's content ends after this many bytes.
    cut_once: Option<(String, usize)>,
    /// This file is served with one byte changed (its etag still the true sha256).
    corrupt: Option<String>,
}

#[derive(Debug)]
struct State {
    repos: Vec<MockRepo>,
    faults: Mutex<Faults>,
    log: Mutex<Vec<Logged>>,
}

/// A running mock hub; stops when dropped.
#[derive(Debug)]
pub struct MockHub {
    pub endpoint: String,
    state: Arc<State>,
    stop: Arc<AtomicBool>,
    threads: Vec<JoinHandle<()>>,
}

impl MockHub {
    /// The hub, and its LFS storage on a second port (another origin, as the hub's storage
    /// is another host: the token must not reach it).
    pub fn start(repos: Vec<MockRepo>) -> Self {
        let hub = TcpListener::bind("127.0.0.1:0").unwrap();
        let storage = TcpListener::bind("127.0.0.1:0").unwrap();
        let endpoint = format!("http://{}", hub.local_addr().unwrap());
        let storage_endpoint = format!("http://{}", storage.local_addr().unwrap());
        let state = Arc::new(State { repos, faults: Mutex::default(), log: Mutex::default() });
        let stop = Arc::new(AtomicBool::new(false));
        let threads = [hub, storage]
            .into_iter()
            .map(|listener| {
                listener.set_nonblocking(true).unwrap();
                let (state, stop, storage) = (Arc::clone(&state), Arc::clone(&stop), storage_endpoint.clone());
                std::thread::spawn(move || {
                    let deadline = Instant::now() + LIFETIME;
                    while !stop.load(Ordering::Relaxed) && Instant::now() < deadline {
                        match listener.accept() {
                            Ok((stream, _)) => {
                                let (state, storage) = (Arc::clone(&state), storage.clone());
                                std::thread::spawn(move || serve(stream, &state, &storage));
                            }
                            Err(_) => std::thread::sleep(Duration::from_millis(2)),
                        }
                    }
                })
            })
            .collect();
        MockHub { endpoint, state, stop, threads }
    }

    /// Every request so far.
    pub fn log(&self) -> Vec<Logged> {
        self.state.log.lock().unwrap().clone()
    }

    /// Requests for file contents or metadata (not the model-info call).
    pub fn file_requests(&self) -> Vec<Logged> {
        self.log().into_iter().filter(|r| !r.path.starts_with("/api/")).collect()
    }

    pub fn clear_log(&self) {
        self.state.log.lock().unwrap().clear();
    }

    /// The next GET of `file`'s content sends only `bytes` bytes, then closes the connection.
    pub fn cut_once(&self, file: &str, bytes: usize) {
        self.state.faults.lock().unwrap().cut_once = Some((file.to_owned(), bytes));
    }

    /// Serve `file` with wrong bytes (or, `None`, correctly again).
    pub fn corrupt(&self, file: Option<&str>) {
        self.state.faults.lock().unwrap().corrupt = file.map(str::to_owned);
    }
}

impl Drop for MockHub {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
    }
}

struct Answer {
    status: u16,
    headers: Vec<(String, String)>,
    body: Vec<u8>,
    /// Send only this many bytes of the body, then close.
    cut: Option<usize>,
}

impl Answer {
    fn new(status: u16) -> Self {
        Answer { status, headers: Vec::new(), body: Vec::new(), cut: None }
    }

    fn header(mut self, name: &str, value: impl Into<String>) -> Self {
        self.headers.push((name.to_owned(), value.into()));
        self
    }

    fn error(status: u16, code: &str, message: &str) -> Self {
        let mut a = Answer::new(status).header("X-Error-Code", code).header("Content-Type", "application/json");
        a.body = serde_json::to_vec(&serde_json::json!({ "error": message })).unwrap();
        a
    }
}

fn serve(mut stream: TcpStream, state: &State, storage: &str) {
    stream.set_nonblocking(false).unwrap();
    stream.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    stream.set_write_timeout(Some(Duration::from_secs(10))).unwrap();
    let mut reader = BufReader::new(stream.try_clone().unwrap());
    let mut request_line = String::new();
    if reader.read_line(&mut request_line).is_err() {
        return;
    }
    let mut headers = BTreeMap::new();
    for _ in 0..100 {
        let mut line = String::new();
        if reader.read_line(&mut line).is_err() || line.trim().is_empty() {
            break;
        }
        if let Some((k, v)) = line.split_once(':') {
            headers.insert(k.trim().to_ascii_lowercase(), v.trim().to_owned());
        }
    }
    let mut parts = request_line.split_whitespace();
    let (method, path) = (parts.next().unwrap_or("").to_owned(), parts.next().unwrap_or("").to_owned());
    let range = headers.get("range").cloned();
    let authorization = headers.get("authorization").cloned();
    state.log.lock().unwrap().push(Logged {
        method: method.clone(),
        path: path.clone(),
        range: range.clone(),
        authorization: authorization.clone(),
    });
    let authorized = authorization.as_deref() == Some(&format!("Bearer {TOKEN}"));
    let answer = route(state, storage, &path, authorized, authorization.is_some(), range.as_deref());
    let mut head = format!("HTTP/1.1 {} X\r\nConnection: close\r\n", answer.status);
    for (k, v) in &answer.headers {
        head += &format!("{k}: {v}\r\n");
    }
    if !answer.headers.iter().any(|(k, _)| k.eq_ignore_ascii_case("content-length")) {
        head += &format!("Content-Length: {}\r\n", answer.body.len());
    }
    head += "\r\n";
    let _ = stream.write_all(head.as_bytes());
    if method != "HEAD" {
        let body = match answer.cut {
            Some(n) => &answer.body[..n.min(answer.body.len())],
            None => &answer.body[..],
        };
        let _ = stream.write_all(body);
    }
    let _ = stream.flush();
    let _ = stream.shutdown(Shutdown::Both);
    // Drain nothing more: the connection is closed after one answer.
    let _ = reader.read(&mut [0u8; 1]);
}

fn route(state: &State, storage: &str, path: &str, authorized: bool, token_sent: bool, range: Option<&str>) -> Answer {
    let (path, query) = path.split_once('?').unwrap_or((path, ""));
    let blobs = query.split('&').any(|q| q == "blobs=true" || q == "blobs=True");
    let segments: Vec<String> = path.trim_start_matches('/').split('/').map(decode).collect();
    let seg: Vec<&str> = segments.iter().map(String::as_str).collect();
    // Storage for LFS files: /cdn/<sha256>.
    if let ["cdn", sha] = seg[..] {
        for repo in &state.repos {
            for (name, bytes) in &repo.files {
                if sha256(bytes) == *sha {
                    return content(state, name, bytes, range);
                }
            }
        }
        return Answer::new(404);
    }
    let not_found = || Answer::error(if token_sent { 404 } else { 401 }, "RepoNotFound", "Repository Not Found");
    let (id, rev, file, api) = match seg[..] {
        ["api", "models", o, n, "revision", rev] => (format!("{o}/{n}"), rev.to_owned(), None, true),
        [o, n, "resolve", rev, ref file @ ..] if !file.is_empty() => {
            (format!("{o}/{n}"), rev.to_owned(), Some(file.join("/")), false)
        }
        _ => return Answer::new(404),
    };
    let Some(repo) = state.repos.iter().find(|r| r.id == id) else { return not_found() };
    if repo.private && !authorized {
        return not_found();
    }
    if rev != "main" && rev != repo.commit {
        return Answer::error(404, "RevisionNotFound", &format!("Invalid rev id: {rev}"));
    }
    if api {
        let siblings: Vec<_> = repo.files.iter().map(|(f, bytes)| sibling(repo, f, bytes, blobs)).collect();
        let mut a = Answer::new(200).header("Content-Type", "application/json");
        a.body = serde_json::to_vec(&serde_json::json!({
            "_id": "0", "id": repo.id, "modelId": repo.id, "sha": repo.commit,
            "private": repo.private, "gated": if repo.gated { serde_json::json!("auto") } else { serde_json::json!(false) },
            "siblings": siblings,
        }))
        .unwrap();
        return a;
    }
    if repo.gated && !authorized {
        return Answer::error(
            401,
            "GatedRepo",
            "Access to this model is restricted. You must have access to it and be authenticated to access it.",
        );
    }
    let file = file.unwrap_or_default();
    let Some(bytes) = repo.files.get(&file) else {
        return Answer::error(404, "EntryNotFound", &format!("{file} does not exist on \"{rev}\""));
    };
    if is_lfs(&file) {
        let sha = sha256(bytes);
        Answer::new(302)
            .header("Location", format!("{storage}/cdn/{sha}?X-Amz-Signature=mock"))
            .header("X-Repo-Commit", &repo.commit)
            .header("X-Linked-Etag", format!("\"{sha}\""))
            .header("X-Linked-Size", bytes.len().to_string())
            .header("ETag", format!("\"{}\"", git_etag(sha.as_bytes())))
    } else {
        content(state, &file, bytes, range)
            .header("X-Repo-Commit", &repo.commit)
            .header("ETag", format!("\"{}\"", git_etag(bytes)))
    }
}

/// A file as the model info lists it: its name, and with `blobs` its size and blob id (an
/// LFS file's also its sha256), as the hub sends them.
fn sibling(repo: &MockRepo, file: &str, bytes: &[u8], blobs: bool) -> serde_json::Value {
    if !blobs {
        return serde_json::json!({ "rfilename": file });
    }
    let size = repo.listed_sizes.get(file).copied().unwrap_or(bytes.len() as u64);
    if is_lfs(file) {
        let sha = sha256(bytes);
        serde_json::json!({
            "rfilename": file, "size": size, "blobId": git_etag(sha.as_bytes()),
            "lfs": { "sha256": sha, "size": size, "pointerSize": 134 },
        })
    } else {
        serde_json::json!({ "rfilename": file, "size": size, "blobId": git_etag(bytes) })
    }
}

/// A file's bytes, whole or from a `bytes=N-` range, with the faults applied.
fn content(state: &State, name: &str, bytes: &[u8], range: Option<&str>) -> Answer {
    let mut faults = state.faults.lock().unwrap();
    let mut bytes = bytes.to_vec();
    if faults.corrupt.as_deref() == Some(name) {
        let mid = bytes.len() / 2;
        bytes[mid] ^= 0xff;
    }
    let len = bytes.len();
    let from = range
        .and_then(|r| r.strip_prefix("bytes="))
        .and_then(|r| r.strip_suffix('-'))
        .and_then(|n| n.parse::<usize>().ok());
    let mut a = match from {
        Some(from) if from >= len => return Answer::new(416).header("Content-Range", format!("bytes */{len}")),
        Some(from) => {
            let mut a = Answer::new(206).header("Content-Range", format!("bytes {from}-{}/{len}", len - 1));
            a.body = bytes[from..].to_vec();
            a
        }
        None => {
            let mut a = Answer::new(200);
            a.body = bytes;
            a
        }
    };
    if let Some((file, n)) = faults.cut_once.clone()
        && file == name
    {
        faults.cut_once = None;
        a.cut = Some(n);
    }
    a.header("Accept-Ranges", "bytes")
}

fn decode(s: &str) -> String {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%'
            && i + 2 < bytes.len()
            && let Ok(b) = u8::from_str_radix(&s[i + 1..i + 3], 16)
        {
            out.push(b);
            i += 3;
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}
