//! The hub client against a loopback stand-in for the hub (tests/mockhub): the files a
//! model needs land in the standard Hugging Face cache layout, equal to the source bytes;
//! a second run downloads nothing; broken-off downloads resume by Range; a wrong sha256 is
//! caught and nothing of it is used; refusals and offline mode give their errors.

#![allow(clippy::unwrap_used)] // a test that cannot unwrap has failed; helpers included

mod mockhub;

use hub::{Error, Hub, HubConfig, NoProgress, RepoRef};
use mockhub::{MockHub, MockRepo};
use std::path::{Path, PathBuf};
use std::time::Duration;

fn fixture() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures/qwen3/f32")
}

const ID: &str = "mlx-test/qwen3-f32";

/// The fixture as a repo, plus files a model does not need (never to be fetched).
fn model_repo() -> MockRepo {
    let mut repo = MockRepo::from_dir(ID, &fixture());
    repo.files.insert("README.md".into(), b"# a model card\n".to_vec());
    repo.files.insert("tokenizer.json".into(), br#"{"version":"1.0","model":{"type":"BPE"}}"#.to_vec());
    repo.files.insert("consolidated.safetensors".into(), vec![7u8; 4096]);
    repo.files.insert("pytorch_model.bin".into(), vec![9u8; 4096]);
    repo
}

fn config(hub: &MockHub, cache: &Path) -> HubConfig {
    HubConfig {
        endpoint: hub.endpoint.clone(),
        connect_timeout: Duration::from_secs(5),
        read_timeout: Duration::from_secs(10),
        attempts: 3,
        retry_delay: Duration::from_millis(10),
        ..HubConfig::new(cache)
    }
}

fn repo(text: &str) -> RepoRef {
    RepoRef::parse(text).unwrap()
}

/// Counts calls, and checks they describe one file at a time with growing byte counts.
#[derive(Default)]
struct Recorder {
    started: Vec<(String, Option<u64>, u64)>,
    finished: Vec<(String, u64)>,
    last: u64,
}

impl hub::Progress for Recorder {
    fn start(&mut self, file: &str, total: Option<u64>, resumed_from: u64) {
        self.started.push((file.to_owned(), total, resumed_from));
        self.last = resumed_from;
    }
    fn advance(&mut self, done: u64) {
        assert!(done > self.last, "progress went from {} to {done}", self.last);
        self.last = done;
    }
    fn finish(&mut self, file: &str, bytes: u64) {
        assert_eq!(bytes, self.last, "{file}");
        self.finished.push((file.to_owned(), bytes));
    }
}

const MODEL_FILES: [&str; 4] = ["config.json", "model.safetensors", "model.safetensors.index.json", "tokenizer.json"];

#[test]
fn downloads_only_the_model_files_into_the_hugging_face_layout() {
    let source = model_repo();
    let mock = MockHub::start(vec![source.clone()]);
    let cache = tempfile::tempdir().unwrap();
    let hub = Hub::new(config(&mock, cache.path()));
    let model = hub.model(&repo(ID)).unwrap();
    assert_eq!(model.commit(), source.commit);
    let mut progress = Recorder::default();
    let dir = model.fetch_model(&mut progress).unwrap();
    let repo_dir = cache.path().join("models--mlx-test--qwen3-f32");
    assert_eq!(dir, repo_dir.join("snapshots").join(&source.commit));
    assert_eq!(std::fs::read_to_string(repo_dir.join("refs/main")).unwrap(), source.commit);

    let mut listed: Vec<String> =
        std::fs::read_dir(&dir).unwrap().map(|e| e.unwrap().file_name().to_string_lossy().into_owned()).collect();
    listed.sort();
    assert_eq!(listed, MODEL_FILES);
    for file in MODEL_FILES {
        let path = dir.join(file);
        assert_eq!(std::fs::read(&path).unwrap(), source.files[file], "{file}");
        let etag = if mockhub::is_lfs(file) {
            mockhub::sha256(&source.files[file])
        } else {
            mockhub::git_etag(&source.files[file])
        };
        assert_eq!(std::fs::read_link(&path).unwrap(), Path::new("../../blobs").join(&etag), "{file}");
    }
    let mut blobs: Vec<String> = std::fs::read_dir(repo_dir.join("blobs"))
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    blobs.sort();
    assert_eq!(blobs.len(), 4, "{blobs:?}");
    assert!(blobs.iter().all(|b| !b.ends_with(".incomplete")), "{blobs:?}");

    // Nothing else of the repo was asked for; the token went nowhere (none was given).
    let log = mock.log();
    for unwanted in ["README.md", "consolidated.safetensors", "pytorch_model.bin"] {
        assert!(!log.iter().any(|r| r.path.ends_with(unwanted)), "{unwanted} was requested: {log:?}");
    }
    assert!(log.iter().all(|r| r.authorization.is_none()));
    // One HEAD per file, then the content: LFS files from storage after the redirect.
    let heads = log.iter().filter(|r| r.method == "HEAD").count();
    let gets_storage = log.iter().filter(|r| r.method == "GET" && r.path.starts_with("/cdn/")).count();
    assert_eq!((heads, gets_storage), (4, 1), "{log:?}");
    let finished: Vec<&str> = progress.finished.iter().map(|(f, _)| f.as_str()).collect();
    // The index before the rest: it names the shards, whose sizes the free space is checked against.
    assert_eq!(finished, ["config.json", "model.safetensors.index.json", "tokenizer.json", "model.safetensors"]);
    assert_eq!(progress.finished[3].1, source.files["model.safetensors"].len() as u64);
    assert_eq!(progress.started[3].1, Some(source.files["model.safetensors"].len() as u64));

    // A second run asks the hub for the revision only and downloads nothing.
    mock.clear_log();
    let again = Hub::new(config(&mock, cache.path())).model(&repo(ID)).unwrap().fetch_model(&mut NoProgress).unwrap();
    assert_eq!(again, dir);
    let log = mock.log();
    assert_eq!(log.len(), 1, "{log:?}");
    assert_eq!(log[0].path, format!("/api/models/{ID}/revision/main?blobs=true"));
}

#[test]
fn a_download_cut_short_resumes_with_a_range_request() {
    let source = model_repo();
    let weights = source.files["model.safetensors"].clone();
    let mock = MockHub::start(vec![source]);
    mock.cut_once("model.safetensors", 300_000);
    let cache = tempfile::tempdir().unwrap();
    let hub = Hub::new(config(&mock, cache.path()));
    let mut progress = Recorder::default();
    let dir = hub.model(&repo(ID)).unwrap().fetch_model(&mut progress).unwrap();
    assert_eq!(std::fs::read(dir.join("model.safetensors")).unwrap(), weights);
    let gets: Vec<_> = mock.log().into_iter().filter(|r| r.path.starts_with("/cdn/")).collect();
    assert_eq!(gets.len(), 2, "{gets:?}");
    assert_eq!(gets[0].range, None);
    assert_eq!(gets[1].range.as_deref(), Some("bytes=300000-"));
}

#[test]
fn a_partial_file_from_an_earlier_run_is_resumed() {
    let source = model_repo();
    let weights = source.files["model.safetensors"].clone();
    let sha = mockhub::sha256(&weights);
    let mock = MockHub::start(vec![source]);
    let cache = tempfile::tempdir().unwrap();
    let blobs = cache.path().join("models--mlx-test--qwen3-f32/blobs");
    std::fs::create_dir_all(&blobs).unwrap();
    std::fs::write(blobs.join(format!("{sha}.incomplete")), &weights[..123_456]).unwrap();
    let mut progress = Recorder::default();
    let dir = Hub::new(config(&mock, cache.path())).model(&repo(ID)).unwrap().fetch_model(&mut progress).unwrap();
    assert_eq!(std::fs::read(dir.join("model.safetensors")).unwrap(), weights);
    let gets: Vec<_> = mock.log().into_iter().filter(|r| r.path.starts_with("/cdn/")).collect();
    assert_eq!(gets.len(), 1, "{gets:?}");
    assert_eq!(gets[0].range.as_deref(), Some("bytes=123456-"));
    let resumed = progress.started.iter().find(|(f, ..)| f == "model.safetensors").unwrap();
    assert_eq!(resumed.2, 123_456);
    assert!(!blobs.join(format!("{sha}.incomplete")).exists());
}

#[test]
fn a_corrupted_download_is_detected_and_never_used() {
    let source = model_repo();
    let weights = source.files["model.safetensors"].clone();
    let sha = mockhub::sha256(&weights);
    let mock = MockHub::start(vec![source]);
    mock.corrupt(Some("model.safetensors"));
    let cache = tempfile::tempdir().unwrap();
    let hub = Hub::new(config(&mock, cache.path()));
    let model = hub.model(&repo(ID)).unwrap();
    let err = model.fetch_model(&mut NoProgress).unwrap_err();
    match &err {
        Error::Checksum { file, expected, actual } => {
            assert_eq!((file.as_str(), expected.as_str()), ("model.safetensors", sha.as_str()));
            assert_ne!(actual, expected);
        }
        other => panic!("expected a checksum error, got {other:?}"),
    }
    assert!(err.to_string().contains("does not match the hub's sha256"), "{err}");
    let blobs = cache.path().join("models--mlx-test--qwen3-f32/blobs");
    assert!(!model.dir().join("model.safetensors").exists());
    assert!(!blobs.join(&sha).exists() && !blobs.join(format!("{sha}.incomplete")).exists());
    // Offline, the half-fetched snapshot is not taken for a model.
    let offline = Hub::new(HubConfig { offline: true, ..config(&mock, cache.path()) });
    let err = offline.model(&repo(ID)).unwrap_err();
    assert!(matches!(&err, Error::NotCached { missing, .. } if missing == "no model.safetensors"), "{err:?}");
    // Served correctly again, the next run completes.
    mock.corrupt(None);
    let dir = hub.model(&repo(ID)).unwrap().fetch_model(&mut NoProgress).unwrap();
    assert_eq!(std::fs::read(dir.join("model.safetensors")).unwrap(), weights);
}

#[test]
fn refusals_give_their_errors() {
    let mut gated = MockRepo::new("org/gated", [("config.json".to_owned(), b"{}".to_vec())]);
    gated.files.insert("model.safetensors".into(), vec![1u8; 64]);
    gated.gated = true;
    let mut private = gated.clone();
    private.id = "org/private".into();
    private.gated = false;
    private.private = true;
    let mock = MockHub::start(vec![model_repo(), gated, private]);
    let cache = tempfile::tempdir().unwrap();
    let hub = Hub::new(config(&mock, cache.path()));

    let err = hub.model(&repo("nobody/nothing")).unwrap_err();
    assert!(matches!(err, Error::RepoNotFound { token_given: false, .. }), "{err:?}");
    assert_eq!(
        err.to_string(),
        format!(
            "repository nobody/nothing not found on {} (if it is private, set HF_TOKEN to a token that can read it)",
            mock.endpoint
        )
    );
    let err = hub.model(&repo(&format!("{ID}@v9"))).unwrap_err();
    assert_eq!(err.to_string(), format!("revision `v9` not found in {ID} on {}", mock.endpoint));
    let model = hub.model(&repo(ID)).unwrap();
    let err = model.fetch("tokenizer_config.json", &mut NoProgress).unwrap_err();
    assert_eq!(err.to_string(), format!("tokenizer_config.json not found in {ID} at revision `main`"));

    // Gated: the model info is public, the files need the token.
    let model = hub.model(&repo("org/gated")).unwrap();
    let err = model.fetch_model(&mut NoProgress).unwrap_err();
    assert!(matches!(err, Error::Unauthorized { token_given: false, .. }), "{err:?}");
    assert!(err.to_string().starts_with("org/gated is gated or private: set HF_TOKEN"), "{err}");
    let err = hub.model(&repo("org/private")).unwrap_err();
    assert!(matches!(err, Error::RepoNotFound { .. }), "{err:?}");

    // With the token both download, and the token never goes to storage.
    let with_token = Hub::new(HubConfig { token: Some(mockhub::TOKEN.into()), ..config(&mock, cache.path()) });
    for id in ["org/gated", "org/private"] {
        let dir = with_token.model(&repo(id)).unwrap().fetch_model(&mut NoProgress).unwrap();
        assert_eq!(std::fs::read(dir.join("model.safetensors")).unwrap(), vec![1u8; 64]);
    }
    let log = mock.log();
    assert!(log.iter().filter(|r| r.path.starts_with("/cdn/")).all(|r| r.authorization.is_none()), "{log:?}");
    let wrong = Hub::new(HubConfig { token: Some("hf_wrong".into()), ..config(&mock, cache.path()) });
    let err = wrong.model(&repo("org/private")).unwrap_err();
    assert!(matches!(err, Error::RepoNotFound { token_given: true, .. }), "{err:?}");
}

#[test]
fn a_repo_that_is_no_mlx_model_is_refused_before_any_download() {
    let no_config = MockRepo::new("org/no-config", [("model.safetensors".to_owned(), vec![0u8; 16])]);
    let no_weights = MockRepo::new(
        "org/torch",
        [("config.json".to_owned(), b"{}".to_vec()), ("pytorch_model.bin".to_owned(), vec![0u8; 16])],
    );
    let mock = MockHub::start(vec![no_config, no_weights]);
    let cache = tempfile::tempdir().unwrap();
    let hub = Hub::new(config(&mock, cache.path()));
    let err = hub.model(&repo("org/no-config")).unwrap_err();
    assert_eq!(err.to_string(), "org/no-config is not an MLX model: it has no config.json");
    let err = hub.model(&repo("org/torch")).unwrap_err();
    assert_eq!(
        err.to_string(),
        "org/torch is not an MLX model: it has no model.safetensors or model.safetensors.index.json"
    );
    assert!(mock.file_requests().is_empty(), "{:?}", mock.file_requests());
}

/// A full disk is named as such, and the partial download stays to be resumed.
#[test]
fn a_full_disk_is_named() {
    // Every write to /dev/full fails with ENOSPC, as on a full disk.
    let full = Path::new("/dev/full");
    assert!(full.exists(), "this test needs Linux's /dev/full");
    let source = model_repo();
    let sha = mockhub::sha256(&source.files["model.safetensors"]);
    let mock = MockHub::start(vec![source.clone()]);
    let cache = tempfile::tempdir().unwrap();
    let blobs = cache.path().join("models--mlx-test--qwen3-f32/blobs");
    std::fs::create_dir_all(&blobs).unwrap();
    let part = blobs.join(format!("{sha}.incomplete"));
    std::os::unix::fs::symlink(full, &part).unwrap();
    let hub = Hub::new(config(&mock, cache.path()));
    let model = hub.model(&repo(ID)).unwrap();
    let err = model.fetch_model(&mut NoProgress).unwrap_err();
    assert!(matches!(err, Error::DiskFull { .. }), "{err:?}");
    let text = err.to_string();
    assert!(text.starts_with(&format!("disk full writing {} (", part.display())), "{text}");
    assert!(text.ends_with("free space and run again: the download resumes where it stopped"), "{text}");
    assert!(!model.dir().join("model.safetensors").exists());
    assert!(model.dir().join("config.json").is_file());
}

/// Files larger than the free space are refused before any weight is requested, with the
/// bytes needed (the listed size less what the cache already holds) and available.
#[test]
fn a_download_larger_than_the_free_space_is_refused_before_it_starts() {
    const HUGE: u64 = 1 << 60; // an exbibyte: larger than any disk
    let mut source = model_repo();
    source.listed_sizes.insert("model.safetensors".into(), HUGE);
    let mock = MockHub::start(vec![source.clone()]);
    let cache = tempfile::tempdir().unwrap();
    let hub = Hub::new(config(&mock, cache.path()));
    let model = hub.model(&repo(ID)).unwrap();
    // The tokenizer is in the cache already (as a blob another snapshot shares): not counted.
    model.fetch("tokenizer.json", &mut NoProgress).unwrap();
    std::fs::remove_file(model.dir().join("tokenizer.json")).unwrap();
    // Half of the weights are there from a broken-off download: counted as on disk.
    let blobs = cache.path().join("models--mlx-test--qwen3-f32/blobs");
    let sha = mockhub::sha256(&source.files["model.safetensors"]);
    std::fs::write(blobs.join(format!("{sha}.incomplete")), &source.files["model.safetensors"][..1000]).unwrap();
    mock.clear_log();

    let err = model.fetch_model(&mut NoProgress).unwrap_err();
    let Error::NoSpace { repo: named_repo, needed, available, cache: named } = &err else { panic!("{err:?}") };
    assert_eq!((named_repo.as_str(), *needed, named.as_path()), (ID, HUGE - 1000, cache.path()));
    assert!(*available > 0 && available < needed, "{err}");
    let text = err.to_string();
    assert!(
        text.starts_with(&format!(
            "not enough disk space for {ID}: its files still to download take {} bytes (1024.0 PiB), the file system of the cache {} has {available} bytes free (",
            HUGE - 1000,
            cache.path().display()
        )),
        "{text}"
    );
    // Only the small files that say what to fetch were fetched; no weight was asked for.
    let fetched: Vec<String> = mock.file_requests().into_iter().map(|r| r.path).collect();
    assert!(
        fetched.iter().all(|p| p.ends_with("/config.json") || p.ends_with("/model.safetensors.index.json")),
        "{fetched:?}"
    );
    assert!(!model.dir().join("model.safetensors").exists());

    // With the true size listed the same cache downloads the rest, resuming the partial file.
    let mock = MockHub::start(vec![model_repo()]);
    let dir = Hub::new(config(&mock, cache.path())).model(&repo(ID)).unwrap().fetch_model(&mut NoProgress).unwrap();
    assert_eq!(std::fs::read(dir.join("model.safetensors")).unwrap(), source.files["model.safetensors"]);
    let storage: Vec<_> = mock.log().into_iter().filter(|r| r.path.starts_with("/cdn/")).collect();
    assert_eq!(storage.len(), 1, "{storage:?}");
    assert_eq!(storage[0].range.as_deref(), Some("bytes=1000-"));
}

#[test]
fn offline_works_from_the_cache_and_fails_clearly_without_it() {
    let source = model_repo();
    let mock = MockHub::start(vec![source.clone()]);
    let cache = tempfile::tempdir().unwrap();
    let offline = HubConfig { offline: true, endpoint: mockhub::dead_endpoint(), ..config(&mock, cache.path()) };

    let err = Hub::new(offline.clone()).model(&repo(ID)).unwrap_err();
    assert_eq!(
        err.to_string(),
        format!(
            "{ID} at revision `main` is not in the cache {} (no snapshot of revision `main`); HF_HUB_OFFLINE=1 downloads nothing: unset it to download",
            cache.path().display()
        )
    );
    let online_dir =
        Hub::new(config(&mock, cache.path())).model(&repo(ID)).unwrap().fetch_model(&mut NoProgress).unwrap();
    mock.clear_log();
    for text in [ID.to_owned(), format!("{ID}@{}", source.commit)] {
        let hub = Hub::new(offline.clone());
        let model = hub.model(&repo(&text)).unwrap();
        assert!(model.cache_only());
        assert_eq!(model.fetch_model(&mut NoProgress).unwrap(), online_dir, "{text}");
    }
    assert!(mock.log().is_empty());
    // A revision never downloaded is not there offline.
    let err = Hub::new(offline).model(&repo(&format!("{ID}@v2"))).unwrap_err();
    assert!(matches!(err, Error::NotCached { .. }), "{err:?}");
}

#[test]
fn an_unreachable_hub_names_offline_mode_and_the_cache_or_uses_the_cache() {
    let mock = MockHub::start(vec![model_repo()]);
    let cache = tempfile::tempdir().unwrap();
    let unreachable = HubConfig { endpoint: mockhub::dead_endpoint(), ..config(&mock, cache.path()) };
    let err = Hub::new(unreachable.clone()).model(&repo(ID)).unwrap_err();
    assert!(matches!(err, Error::Unreachable { .. }), "{err:?}");
    let text = err.to_string();
    assert!(text.starts_with(&format!("cannot reach the hub at {}", unreachable.endpoint)), "{text}");
    assert!(text.contains("HF_HUB_OFFLINE=1") && text.contains(&cache.path().display().to_string()), "{text}");
    // Once cached, a run without the hub uses the cache.
    let dir = Hub::new(config(&mock, cache.path())).model(&repo(ID)).unwrap().fetch_model(&mut NoProgress).unwrap();
    let hub = Hub::new(unreachable);
    let model = hub.model(&repo(ID)).unwrap();
    assert!(model.cache_only());
    assert_eq!(model.fetch_model(&mut NoProgress).unwrap(), dir);
}

/// A cache written the way huggingface_hub (mlx-lm) writes it is used as it is.
#[test]
fn a_cache_filled_by_huggingface_hub_is_used_offline() {
    let cache = tempfile::tempdir().unwrap();
    let commit = "1111111111111111111111111111111111111111";
    let repo_dir = cache.path().join("models--mlx-community--Some-Model-4bit");
    std::fs::create_dir_all(repo_dir.join("blobs")).unwrap();
    std::fs::create_dir_all(repo_dir.join("refs")).unwrap();
    std::fs::create_dir_all(repo_dir.join("snapshots").join(commit)).unwrap();
    std::fs::write(repo_dir.join("refs/main"), commit).unwrap();
    for (file, etag, bytes) in [("config.json", "aaaa", &b"{}"[..]), ("model.safetensors", "bbbb", &b"weights"[..])] {
        std::fs::write(repo_dir.join("blobs").join(etag), bytes).unwrap();
        std::os::unix::fs::symlink(
            Path::new("../../blobs").join(etag),
            repo_dir.join("snapshots").join(commit).join(file),
        )
        .unwrap();
    }
    let hub = Hub::new(HubConfig { offline: true, endpoint: mockhub::dead_endpoint(), ..HubConfig::new(cache.path()) });
    let model = hub.model(&repo("mlx-community/Some-Model-4bit")).unwrap();
    assert_eq!(model.commit(), commit);
    let dir = model.fetch_model(&mut NoProgress).unwrap();
    assert_eq!(std::fs::read(dir.join("model.safetensors")).unwrap(), b"weights");
}
