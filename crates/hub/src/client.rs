//! The HTTP side: the model-info call that resolves a revision and lists the repo's files,
//! the `HEAD` of each file's `resolve` URL (etag, size, LFS redirect), and resumable,
//! verified downloads into the cache.

use crate::error::{Error, io_error};
use crate::repo::{RepoCache, RepoRef, is_commit, is_safe_file_name};
use crate::{CONFIG_FILE, INDEX_FILE, OPTIONAL_FILES, WEIGHTS_FILE};
use sha2::{Digest, Sha256};
use std::collections::{BTreeMap, BTreeSet};
use std::fs::{File, OpenOptions};
use std::io::{Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};
use std::time::Duration;

/// Told about each file as it downloads (the library prints nothing itself).
pub trait Progress {
    /// A download begins: `total` bytes when the hub said, `resumed_from` already on disk.
    fn start(&mut self, file: &str, total: Option<u64>, resumed_from: u64);
    /// `done` bytes of the current file are on disk.
    fn advance(&mut self, done: u64);
    /// The current file is complete and verified: `bytes` in all.
    fn finish(&mut self, file: &str, bytes: u64);
}

/// Progress that is not shown.
#[derive(Debug, Clone, Copy, Default)]
pub struct NoProgress;

impl Progress for NoProgress {
    fn start(&mut self, _: &str, _: Option<u64>, _: u64) {}
    fn advance(&mut self, _: u64) {}
    fn finish(&mut self, _: &str, _: u64) {}
}

/// Where the hub is, who asks, and how patiently.
#[derive(Debug, Clone)]
pub struct HubConfig {
    /// The hub's base URL (`HF_ENDPOINT`), without a trailing `/`.
    pub endpoint: String,
    /// Sent as `Authorization: Bearer` to the endpoint (never to a redirect elsewhere).
    pub token: Option<String>,
    /// Use the cache only; never touch the network (`HF_HUB_OFFLINE=1`).
    pub offline: bool,
    /// The hub cache folder ([`crate::default_cache_dir`]).
    pub cache_dir: PathBuf,
    /// Longest wait for a connection.
    pub connect_timeout: Duration,
    /// Longest wait for a response, and for each read of a body.
    pub read_timeout: Duration,
    /// Requests per file before a broken-off download is given up (it resumes from where it
    /// stopped on each one, and on the next run).
    pub attempts: u32,
    /// Pause between those attempts.
    pub retry_delay: Duration,
    /// The `User-Agent` header.
    pub user_agent: String,
}

impl HubConfig {
    /// The public hub.
    pub const DEFAULT_ENDPOINT: &str = "https://huggingface.co";

    /// The public hub, no token, online, with patient timeouts.
    pub fn new(cache_dir: impl Into<PathBuf>) -> Self {
        HubConfig {
            endpoint: Self::DEFAULT_ENDPOINT.to_owned(),
            token: None,
            offline: false,
            cache_dir: cache_dir.into(),
            connect_timeout: Duration::from_secs(30),
            read_timeout: Duration::from_secs(60),
            attempts: 5,
            retry_delay: Duration::from_secs(2),
            user_agent: concat!("mlx-iree-hub/", env!("CARGO_PKG_VERSION")).to_owned(),
        }
    }
}

/// A client of one hub with one cache.
pub struct Hub {
    config: HubConfig,
    agent: ureq::Agent,
}

impl std::fmt::Debug for Hub {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // The token stays out of logs.
        f.debug_struct("Hub")
            .field("endpoint", &self.config.endpoint)
            .field("offline", &self.config.offline)
            .field("cache_dir", &self.config.cache_dir)
            .finish_non_exhaustive()
    }
}

type Response = ureq::http::Response<ureq::Body>;

/// The model-info answer, as far as it is used.
#[derive(serde::Deserialize)]
struct ModelInfo {
    sha: Option<String>,
    #[serde(default)]
    siblings: Vec<Sibling>,
}

#[derive(serde::Deserialize)]
struct Sibling {
    rfilename: String,
    /// Bytes, when the listing was asked with `blobs=true`.
    size: Option<u64>,
    /// The git object id (the etag, so the blob's name, of a file not in LFS).
    #[serde(rename = "blobId")]
    blob_id: Option<String>,
    lfs: Option<Lfs>,
}

#[derive(serde::Deserialize)]
struct Lfs {
    /// The content's sha256 (an LFS file's etag, so its blob's name).
    sha256: Option<String>,
    size: Option<u64>,
}

/// What the model-info listing says of one file.
#[derive(Debug, Clone, Default)]
struct Listed {
    size: Option<u64>,
    /// The name its blob has in the cache, where the listing tells.
    blob: Option<String>,
}

impl From<Sibling> for Listed {
    fn from(s: Sibling) -> Self {
        let lfs = s.lfs.unwrap_or(Lfs { sha256: None, size: None });
        let blob = match lfs.sha256 {
            Some(sha) => Some(sha),
            None => s.blob_id,
        };
        Listed { size: lfs.size.or(s.size), blob: blob.filter(|b| is_safe_etag(b)) }
    }
}

#[derive(serde::Deserialize)]
struct Index {
    weight_map: BTreeMap<String, String>,
}

impl Hub {
    pub fn new(mut config: HubConfig) -> Self {
        config.endpoint = config.endpoint.trim_end_matches('/').to_owned();
        let agent = ureq::Agent::config_builder()
            .http_status_as_error(false)
            // Redirects are followed by hand: the headers of the hub's own answer (etag, size,
            // commit) matter, and the token must not follow a redirect to another host.
            .max_redirects(0)
            .timeout_connect(Some(config.connect_timeout))
            .timeout_recv_response(Some(config.read_timeout))
            .timeout_per_read(Some(config.read_timeout))
            .user_agent(config.user_agent.as_str())
            // Sizes, ranges and hashes are of the stored bytes: never a compressed transfer.
            .accept_encoding("identity")
            .build()
            .into();
        Hub { config, agent }
    }

    pub fn config(&self) -> &HubConfig {
        &self.config
    }

    /// Resolves the repo's revision to a commit and lists its files (one model-info call),
    /// or, offline, finds the commit and a complete model in the cache. Refuses a repo that
    /// has no config.json or no safetensors weights before anything is downloaded. When the
    /// hub cannot be reached, a complete cached snapshot of the revision is used (with a
    /// warning), as huggingface_hub does.
    pub fn model(&self, repo: &RepoRef) -> Result<Model<'_>, Error> {
        let cache = RepoCache::new(&self.config.cache_dir, repo);
        if self.config.offline {
            return self.cached_model(repo, cache, None);
        }
        // `blobs=true` adds each file's size and blob id: the free space is checked against them.
        let url = format!(
            "{}/api/models/{}/revision/{}?blobs=true",
            self.config.endpoint,
            repo.id,
            encode(repo.revision(), false)
        );
        let response = match self.request(false, &url, None, false) {
            Ok((response, _)) => response,
            Err(reason) => return self.cached_model(repo, cache, Some(reason)),
        };
        let status = response.status().as_u16();
        if status != 200 {
            return Err(self.status_error(repo, None, status, &response, &url));
        }
        let bad = |reason: String| Error::BadResponse { url: url.clone(), reason };
        let body = response
            .into_body()
            .into_with_config()
            .limit(64 << 20)
            .read_to_string()
            .map_err(|e| bad(format!("reading the body: {e}")))?;
        let info: ModelInfo = serde_json::from_str(&body).map_err(|e| bad(format!("not model info JSON: {e}")))?;
        let commit = info.sha.filter(|s| is_commit(s)).ok_or_else(|| bad("no commit sha".to_owned()))?;
        let siblings: BTreeMap<String, Listed> =
            info.siblings.into_iter().map(|s| (s.rfilename.clone(), Listed::from(s))).collect();
        if !siblings.contains_key(CONFIG_FILE) {
            return Err(Error::NotAModel { repo: repo.id.clone(), missing: "no config.json" });
        }
        if !siblings.contains_key(INDEX_FILE) && !siblings.contains_key(WEIGHTS_FILE) {
            return Err(Error::NotAModel {
                repo: repo.id.clone(),
                missing: "no model.safetensors or model.safetensors.index.json",
            });
        }
        tracing::debug!("{repo}: revision {} is commit {commit}, {} files", repo.revision(), siblings.len());
        cache.write_ref(repo.revision(), &commit)?;
        Ok(Model { hub: self, repo: repo.clone(), commit, cache, siblings: Some(siblings) })
    }

    /// The model from the cache alone: offline, or (`unreachable` says why) the hub is not
    /// answering.
    fn cached_model(&self, repo: &RepoRef, cache: RepoCache, unreachable: Option<String>) -> Result<Model<'_>, Error> {
        let fail = |missing: String| match &unreachable {
            Some(reason) => self.unreachable(reason.clone()),
            None => Error::NotCached {
                repo: repo.id.clone(),
                revision: repo.revision().to_owned(),
                cache: self.config.cache_dir.clone(),
                missing,
            },
        };
        let Some(commit) = cache.commit_of(repo.revision()) else {
            return Err(fail(format!("no snapshot of revision `{}`", repo.revision())));
        };
        let model = Model { hub: self, repo: repo.clone(), commit, cache, siblings: None };
        if let Some(missing) = model.missing_in_cache() {
            return Err(fail(missing));
        }
        if let Some(reason) = unreachable {
            tracing::warn!(
                "the hub at {} is unreachable ({reason}); using {repo} commit {} from the cache",
                self.config.endpoint,
                model.commit
            );
        }
        Ok(model)
    }

    fn unreachable(&self, reason: String) -> Error {
        Error::Unreachable { endpoint: self.config.endpoint.clone(), cache: self.config.cache_dir.clone(), reason }
    }

    /// The error for a refusal: by the hub's `X-Error-Code` where it sends one, else by status.
    fn status_error(&self, repo: &RepoRef, file: Option<&str>, status: u16, response: &Response, url: &str) -> Error {
        let token_given = self.config.token.is_some();
        let not_found =
            || Error::RepoNotFound { repo: repo.id.clone(), endpoint: self.config.endpoint.clone(), token_given };
        let no_file = |file: &str| Error::FileNotFound {
            repo: repo.id.clone(),
            revision: repo.revision().to_owned(),
            file: file.to_owned(),
        };
        match (header(response, "x-error-code"), status, file) {
            (Some("RepoNotFound"), ..) => not_found(),
            (Some("RevisionNotFound"), ..) => Error::RevisionNotFound {
                repo: repo.id.clone(),
                revision: repo.revision().to_owned(),
                endpoint: self.config.endpoint.clone(),
            },
            (Some("EntryNotFound"), _, Some(file)) | (_, 404, Some(file)) => no_file(file),
            (Some("GatedRepo"), ..) | (_, 403, _) | (_, 401, Some(_)) => {
                Error::Unauthorized { repo: repo.id.clone(), token_given }
            }
            // The hub answers 401 for a repo it does not know and for one it will not show.
            (_, 401 | 404, None) => not_found(),
            _ => Error::Status { status, url: url.to_owned() },
        }
    }

    /// One request; relative redirects (a renamed repo) are always followed, absolute ones
    /// (LFS storage) only when `follow_absolute`. The token goes to the endpoint's origin
    /// only. Returns the response and the URL that gave it, or why nothing answered.
    fn request(
        &self,
        head: bool,
        url: &str,
        range_from: Option<u64>,
        follow_absolute: bool,
    ) -> Result<(Response, String), String> {
        let mut url = url.to_owned();
        for _ in 0..8 {
            let mut request = if head { self.agent.head(url.as_str()) } else { self.agent.get(url.as_str()) };
            if let Some(token) = &self.config.token
                && origin(&url) == origin(&self.config.endpoint)
            {
                request = request.header("Authorization", format!("Bearer {token}"));
            }
            if let Some(from) = range_from {
                request = request.header("Range", format!("bytes={from}-"));
            }
            tracing::debug!(
                "{} {url}{}",
                if head { "HEAD" } else { "GET" },
                range_from.map_or(String::new(), |f| format!(" from byte {f}"))
            );
            let response = request.call().map_err(|e| e.to_string())?;
            if response.status().is_redirection()
                && let Some(location) = header(&response, "location")
            {
                if location.starts_with('/') {
                    url = format!("{}{location}", origin(&url));
                    continue;
                }
                if follow_absolute {
                    url = location.to_owned();
                    continue;
                }
            }
            return Ok((response, url));
        }
        Err(format!("too many redirects from {url}"))
    }

    /// Puts `file` of `commit` into the cache: its metadata by `HEAD`, its blob (shared by
    /// every snapshot that has the same content) downloaded unless already there, then the
    /// snapshot's link.
    fn download(
        &self,
        repo: &RepoRef,
        cache: &RepoCache,
        commit: &str,
        file: &str,
        progress: &mut dyn Progress,
    ) -> Result<PathBuf, Error> {
        let url = format!("{}/{}/resolve/{commit}/{}", self.config.endpoint, repo.id, encode(file, true));
        let (head, _) = self.request(true, &url, None, false).map_err(|reason| self.unreachable(reason))?;
        let status = head.status().as_u16();
        if status != 200 && !head.status().is_redirection() {
            return Err(self.status_error(repo, Some(file), status, &head, &url));
        }
        let bad = |reason: &str| Error::BadResponse { url: url.clone(), reason: reason.to_owned() };
        let etag = header(&head, "x-linked-etag")
            .or_else(|| header(&head, "etag"))
            .map(normalize_etag)
            .ok_or_else(|| bad("no ETag header"))?;
        if !is_safe_etag(&etag) {
            return Err(bad("the ETag is not a plain hash"));
        }
        let size = header(&head, "x-linked-size")
            .or_else(|| header(&head, "content-length"))
            .and_then(|s| s.trim().parse::<u64>().ok());
        let source = match header(&head, "location") {
            Some(location) if head.status().is_redirection() => location.to_owned(),
            _ => url.clone(),
        };
        if let Some(other) = header(&head, "x-repo-commit")
            && other != commit
        {
            tracing::warn!("{repo}: {file} was asked at commit {commit} and the hub answered for {other}");
        }
        let blob = cache.blob(&etag);
        if is_complete(&blob, size) {
            tracing::debug!("{repo}: {file} is already in the cache as blob {etag}");
            return cache.link(commit, file, &etag);
        }
        for dir in [blob.parent().unwrap_or(&cache.dir), cache.locks.as_path()] {
            std::fs::create_dir_all(dir).map_err(|e| io_error(dir, e))?;
        }
        // One downloader per blob, across processes (huggingface_hub's lock file).
        let lock_path = cache.lock(&etag);
        let lock = File::create(&lock_path).map_err(|e| io_error(&lock_path, e))?;
        lock.lock().map_err(|e| io_error(&lock_path, e))?;
        if !is_complete(&blob, size) {
            self.fetch_blob(repo, cache, file, &etag, size, &source, progress)?;
        }
        drop(lock);
        cache.link(commit, file, &etag)
    }

    /// Downloads into `<etag>.incomplete`, resuming what is there with a `Range` request
    /// (also after each break in the body), checks size and LFS sha256, and only then
    /// renames it to the blob.
    #[allow(clippy::too_many_arguments)]
    fn fetch_blob(
        &self,
        repo: &RepoRef,
        cache: &RepoCache,
        file: &str,
        etag: &str,
        size: Option<u64>,
        url: &str,
        progress: &mut dyn Progress,
    ) -> Result<(), Error> {
        let part = cache.incomplete(etag);
        let io = |e| io_error(&part, e);
        let mut out = OpenOptions::new().read(true).write(true).create(true).truncate(false).open(&part).map_err(io)?;
        let mut have = out.metadata().map_err(io)?.len();
        // An LFS file's etag is the sha256 of its content.
        let expected_sha = (etag.len() == 64 && etag.bytes().all(|b| b.is_ascii_hexdigit())).then_some(etag);
        if size.is_some_and(|s| have > s) {
            out.set_len(0).map_err(io)?;
            have = 0;
        }
        let mut hasher = expected_sha.map(|_| Sha256::new());
        if let Some(hasher) = &mut hasher
            && have > 0
        {
            out.seek(SeekFrom::Start(0)).map_err(io)?;
            hash_prefix(&mut out, have, hasher).map_err(io)?;
        }
        out.seek(SeekFrom::Start(have)).map_err(io)?;
        if have > 0 {
            tracing::debug!("{file}: resuming the download at byte {have}");
        }
        progress.start(file, size, have);
        let (mut failures, mut unanswered) = (0u32, 0u32);
        let mut reason: String;
        while size != Some(have) {
            let restart = |out: &mut File, have: &mut u64, hasher: &mut Option<Sha256>| -> Result<(), Error> {
                out.set_len(0).map_err(io)?;
                out.seek(SeekFrom::Start(0)).map_err(io)?;
                *have = 0;
                *hasher = expected_sha.map(|_| Sha256::new());
                Ok(())
            };
            match self.request(false, url, (have > 0).then_some(have), true) {
                Err(why) => {
                    unanswered += 1;
                    reason = why;
                }
                Ok((response, final_url)) => {
                    let status = response.status().as_u16();
                    match status {
                        200 | 206 => {
                            let start = if status == 206 { content_range_start(&response) } else { Some(0) };
                            if start != Some(have) {
                                // A whole body, or a range other than the one asked for:
                                // start over (a range elsewhere is not used at all).
                                restart(&mut out, &mut have, &mut hasher)?;
                            }
                            if start == Some(have) {
                                let mut body = response.into_body().into_reader();
                                match copy_body(&mut body, &mut out, hasher.as_mut(), &mut have, progress) {
                                    Ok(()) if size.is_none_or(|s| have >= s) => break,
                                    Ok(()) => reason = format!("the connection closed after {have} bytes"),
                                    Err(CopyError::Read(e)) => reason = e.to_string(),
                                    Err(CopyError::Write(e)) => return Err(io_error(&part, e)),
                                }
                            } else {
                                reason = "the server sent another range than the one asked for".to_owned();
                            }
                            failures += 1;
                        }
                        416 => {
                            restart(&mut out, &mut have, &mut hasher)?;
                            failures += 1;
                            reason = "the server refused the range".to_owned();
                        }
                        500..=599 => {
                            failures += 1;
                            reason = format!("HTTP {status} from {final_url}");
                        }
                        _ => return Err(self.status_error(repo, Some(file), status, &response, &final_url)),
                    }
                }
            }
            if failures + unanswered >= self.config.attempts.max(1) {
                return Err(if failures == 0 {
                    self.unreachable(reason)
                } else {
                    Error::Interrupted { file: file.to_owned(), attempts: failures + unanswered, reason }
                });
            }
            tracing::info!("{file}: the download broke off at byte {have} ({reason}); resuming");
            std::thread::sleep(self.config.retry_delay);
        }
        out.sync_all().map_err(io)?;
        drop(out);
        let discard = || {
            let _ = std::fs::remove_file(&part);
        };
        if let Some(expected) = size
            && have != expected
        {
            discard();
            return Err(Error::SizeMismatch { file: file.to_owned(), expected, actual: have });
        }
        if let (Some(expected), Some(hasher)) = (expected_sha, hasher) {
            let actual = hex(&hasher.finalize());
            if actual != expected {
                discard();
                return Err(Error::Checksum { file: file.to_owned(), expected: expected.to_owned(), actual });
            }
        }
        let blob = cache.blob(etag);
        std::fs::rename(&part, &blob).map_err(|e| io_error(&blob, e))?;
        progress.finish(file, have);
        Ok(())
    }
}

/// A model at one commit: in the cache, or to be fetched from the hub.
#[derive(Debug)]
pub struct Model<'a> {
    hub: &'a Hub,
    repo: RepoRef,
    commit: String,
    cache: RepoCache,
    /// The repo's files at `commit` (from the hub); `None` when working from the cache only.
    siblings: Option<BTreeMap<String, Listed>>,
}

impl Model<'_> {
    pub fn repo(&self) -> &RepoRef {
        &self.repo
    }

    /// The commit the revision resolved to.
    pub fn commit(&self) -> &str {
        &self.commit
    }

    /// The snapshot folder the model's files appear in: `<cache>/models--o--n/snapshots/<commit>`.
    pub fn dir(&self) -> PathBuf {
        self.cache.snapshot(&self.commit)
    }

    /// Whether this model comes from the cache alone (offline, or the hub unreachable).
    pub fn cache_only(&self) -> bool {
        self.siblings.is_none()
    }

    /// One file of the snapshot, downloaded unless the cache has it (then no request is made).
    pub fn fetch(&self, file: &str, progress: &mut dyn Progress) -> Result<PathBuf, Error> {
        if !is_safe_file_name(file) {
            return Err(Error::UnsafeFileName { repo: self.repo.id.clone(), file: file.to_owned() });
        }
        if let Some(path) = self.cache.cached_file(&self.commit, file) {
            return Ok(path);
        }
        let Some(siblings) = &self.siblings else {
            return Err(Error::NotCached {
                repo: self.repo.id.clone(),
                revision: self.repo.revision().to_owned(),
                cache: self.hub.config.cache_dir.clone(),
                missing: format!("no {file}"),
            });
        };
        if !siblings.contains_key(file) {
            return Err(Error::FileNotFound {
                repo: self.repo.id.clone(),
                revision: self.repo.revision().to_owned(),
                file: file.to_owned(),
            });
        }
        self.hub.download(&self.repo, &self.cache, &self.commit, file, progress)
    }

    /// Everything the model needs, config.json first, then the index if the weights are
    /// sharded (to know the shards), then (once the free space is checked against what is
    /// still missing) the tokenizer and generation files the repo has and the weights
    /// (`model.safetensors`, or the shards the index names; nothing else of the repo).
    /// Returns the snapshot folder.
    pub fn fetch_model(&self, progress: &mut dyn Progress) -> Result<PathBuf, Error> {
        self.fetch(CONFIG_FILE, progress)?;
        let weights = if self.has(INDEX_FILE) {
            let index = self.fetch(INDEX_FILE, progress)?;
            shards(&self.repo, &index)?
        } else {
            vec![WEIGHTS_FILE.to_owned()]
        };
        let files: Vec<String> =
            OPTIONAL_FILES.iter().filter(|f| self.has(f)).map(|f| (*f).to_owned()).chain(weights).collect();
        self.check_space(&files)?;
        for file in &files {
            self.fetch(file, progress)?;
        }
        Ok(self.dir())
    }

    /// Refuses (`Error::NoSpace`) when the listed sizes of `files` not yet in the cache (less
    /// what partial downloads of them hold) exceed the free space of the cache's file system.
    /// Sizes the hub did not list count as nothing; from the cache alone nothing is checked.
    fn check_space(&self, files: &[String]) -> Result<(), Error> {
        let Some(siblings) = &self.siblings else { return Ok(()) };
        let mut needed = 0u64;
        for file in files {
            let Some(listed) = siblings.get(file) else { continue };
            if self.cache.cached_file(&self.commit, file).is_some() {
                continue;
            }
            let size = listed.size.unwrap_or(0);
            let on_disk = match &listed.blob {
                Some(blob) if is_complete(&self.cache.blob(blob), Some(size)) => size,
                Some(blob) => std::fs::metadata(self.cache.incomplete(blob)).map_or(0, |m| m.len().min(size)),
                None => 0,
            };
            needed = needed.saturating_add(size - on_disk);
        }
        let cache = &self.hub.config.cache_dir;
        match crate::disk::available_bytes(cache) {
            Some(available) if available < needed => {
                Err(Error::NoSpace { repo: self.repo.id.clone(), needed, available, cache: cache.clone() })
            }
            available => {
                tracing::debug!("{}: {needed} bytes to download, {available:?} free in {}", self.repo, cache.display());
                Ok(())
            }
        }
    }

    /// Whether the repo (or, from the cache alone, the snapshot) has `file`.
    fn has(&self, file: &str) -> bool {
        match &self.siblings {
            Some(siblings) => siblings.contains_key(file),
            None => self.cache.cached_file(&self.commit, file).is_some(),
        }
    }

    /// What a complete model lacks in the cached snapshot, if anything.
    fn missing_in_cache(&self) -> Option<String> {
        let cached = |f: &str| self.cache.cached_file(&self.commit, f);
        if cached(CONFIG_FILE).is_none() {
            return Some(format!("no {CONFIG_FILE}"));
        }
        match cached(INDEX_FILE) {
            Some(index) => match shards(&self.repo, &index) {
                Ok(shards) => shards.into_iter().find(|s| cached(s).is_none()).map(|s| format!("no {s}")),
                Err(e) => Some(e.to_string()),
            },
            None => cached(WEIGHTS_FILE).is_none().then(|| format!("no {WEIGHTS_FILE}")),
        }
    }
}

/// The shard files an index names, each once, in order.
fn shards(repo: &RepoRef, index: &Path) -> Result<Vec<String>, Error> {
    let text = std::fs::read_to_string(index).map_err(|e| io_error(index, e))?;
    let bad = |reason: String| Error::BadIndex { repo: repo.id.clone(), file: INDEX_FILE.to_owned(), reason };
    let index: Index = serde_json::from_str(&text).map_err(|e| bad(e.to_string()))?;
    let files: BTreeSet<String> = index.weight_map.into_values().collect();
    if files.is_empty() {
        return Err(bad("its weight_map is empty".to_owned()));
    }
    if let Some(file) = files.iter().find(|f| !is_safe_file_name(f)) {
        return Err(Error::UnsafeFileName { repo: repo.id.clone(), file: file.clone() });
    }
    Ok(files.into_iter().collect())
}

enum CopyError {
    Read(std::io::Error),
    Write(std::io::Error),
}

/// Appends the body to `out`, hashing and counting as it goes.
fn copy_body(
    body: &mut impl Read,
    out: &mut File,
    mut hasher: Option<&mut Sha256>,
    have: &mut u64,
    progress: &mut dyn Progress,
) -> Result<(), CopyError> {
    let mut buf = vec![0u8; 256 << 10];
    loop {
        let n = match body.read(&mut buf) {
            Ok(0) => return Ok(()),
            Ok(n) => n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(CopyError::Read(e)),
        };
        out.write_all(&buf[..n]).map_err(CopyError::Write)?;
        if let Some(hasher) = hasher.as_deref_mut() {
            hasher.update(&buf[..n]);
        }
        *have += n as u64;
        progress.advance(*have);
    }
}

/// Hashes the first `len` bytes of `file` (a partial download being resumed).
fn hash_prefix(file: &mut File, len: u64, hasher: &mut Sha256) -> std::io::Result<()> {
    let mut buf = vec![0u8; 1 << 20];
    let mut left = len;
    while left > 0 {
        let want = usize::try_from(left.min(buf.len() as u64)).unwrap_or(buf.len());
        file.read_exact(&mut buf[..want])?;
        hasher.update(&buf[..want]);
        left -= want as u64;
    }
    Ok(())
}

/// Whether the blob is there, of the announced size when one was announced.
fn is_complete(blob: &Path, size: Option<u64>) -> bool {
    match std::fs::metadata(blob) {
        Ok(meta) => meta.is_file() && size.is_none_or(|s| meta.len() == s),
        Err(_) => false,
    }
}

fn header<'r>(response: &'r Response, name: &str) -> Option<&'r str> {
    response.headers().get(name).and_then(|v| v.to_str().ok())
}

/// `W/"abc"` -> `abc`, as huggingface_hub normalizes etags.
fn normalize_etag(etag: &str) -> String {
    etag.trim().trim_start_matches("W/").trim_matches('"').to_owned()
}

/// An etag names a blob file: letters, digits, `-`, `_` only.
fn is_safe_etag(etag: &str) -> bool {
    !etag.is_empty() && etag.len() <= 128 && etag.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
}

/// The start of a `Content-Range: bytes START-END/TOTAL` header.
fn content_range_start(response: &Response) -> Option<u64> {
    let value = header(response, "content-range")?;
    value.trim().strip_prefix("bytes ")?.split('-').next()?.trim().parse().ok()
}

/// `scheme://host[:port]` of a URL.
fn origin(url: &str) -> &str {
    let after_scheme = url.find("://").map_or(0, |i| i + 3);
    match url[after_scheme..].find('/') {
        Some(i) => &url[..after_scheme + i],
        None => url,
    }
}

/// Percent-encodes all but unreserved characters (and `/` when `keep_slash`).
fn encode(text: &str, keep_slash: bool) -> String {
    let mut out = String::with_capacity(text.len());
    for b in text.bytes() {
        if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.' | b'~') || (keep_slash && b == b'/') {
            out.push(char::from(b));
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

#[cfg(test)]
#[allow(clippy::unwrap_used)] // a test that cannot unwrap has failed
mod tests {
    use super::*;

    #[test]
    fn url_pieces() {
        assert_eq!(origin("http://127.0.0.1:9/a/b?c"), "http://127.0.0.1:9");
        assert_eq!(origin("https://huggingface.co"), "https://huggingface.co");
        assert_eq!(encode("refs/pr/1", false), "refs%2Fpr%2F1");
        assert_eq!(encode("sub dir/a+b.json", true), "sub%20dir/a%2Bb.json");
        assert_eq!(normalize_etag("W/\"abc123\""), "abc123");
        assert_eq!(normalize_etag("\"d41d8\""), "d41d8");
        assert!(is_safe_etag("0123abcdef") && !is_safe_etag("../x") && !is_safe_etag(""));
    }
}
