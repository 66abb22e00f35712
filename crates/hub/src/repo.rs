//! Repo ids (`owner/name[@revision]`) and the Hugging Face cache layout of one repo:
//! `models--owner--name/{blobs,snapshots,refs}` and `.locks/models--owner--name/`.

use crate::error::{Error, io_error};
use std::ffi::OsString;
use std::fmt;
use std::io::Write;
use std::path::{Path, PathBuf};

/// The revision used when none is named.
pub const DEFAULT_REVISION: &str = "main";

/// A model repository on the hub and, optionally, a branch, tag or commit in it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RepoRef {
    /// `owner/name`.
    pub id: String,
    /// Branch, tag or commit; `None` is `main`.
    pub revision: Option<String>,
}

impl RepoRef {
    /// Parses `owner/name` or `owner/name@revision` with the hub's naming rules (letters,
    /// digits, `-`, `_`, `.`; no `--` or `..`; `-` and `.` neither first nor last; at most
    /// 96 characters per part).
    pub fn parse(text: &str) -> Result<Self, Error> {
        let bad = |reason| Error::BadRepoId { text: text.to_owned(), reason };
        let (id, revision) = match text.split_once('@') {
            Some((id, rev)) => (id, Some(rev)),
            None => (text, None),
        };
        let (owner, name) = id.split_once('/').ok_or_else(|| bad("no `/` between owner and name"))?;
        for part in [owner, name] {
            if part.is_empty() || part.len() > 96 {
                return Err(bad("owner and name must each be 1 to 96 characters"));
            }
            if !part.chars().all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.')) {
                return Err(bad("only letters, digits, `-`, `_` and `.` are allowed"));
            }
            if part.contains("--") || part.contains("..") {
                return Err(bad("`--` and `..` are not allowed"));
            }
            if part.starts_with(['-', '.']) || part.ends_with(['-', '.']) {
                return Err(bad("`-` and `.` may not start or end a name"));
            }
        }
        if let Some(rev) = revision {
            if rev.is_empty() {
                return Err(bad("empty revision after `@`"));
            }
            if rev.chars().any(|c| c.is_whitespace() || c.is_control() || c == '\\')
                || rev.split('/').any(|c| c.is_empty() || c == "." || c == "..")
            {
                return Err(bad("the revision is not a valid branch, tag or commit name"));
            }
        }
        Ok(RepoRef { id: id.to_owned(), revision: revision.map(str::to_owned) })
    }

    /// The revision asked for (`main` when none was named).
    pub fn revision(&self) -> &str {
        self.revision.as_deref().unwrap_or(DEFAULT_REVISION)
    }

    /// The repo's folder name in the cache: `models--owner--name`.
    pub fn folder_name(&self) -> String {
        format!("models--{}", self.id.replace('/', "--"))
    }
}

impl fmt::Display for RepoRef {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.revision {
            Some(rev) => write!(f, "{}@{rev}", self.id),
            None => f.write_str(&self.id),
        }
    }
}

/// Whether `text` is a full commit hash (40 lowercase hex digits).
pub fn is_commit(text: &str) -> bool {
    text.len() == 40 && text.bytes().all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
}

/// The Hugging Face hub cache folder, with huggingface_hub's precedence: `HF_HUB_CACHE`,
/// else `$HF_HOME/hub`, else `$XDG_CACHE_HOME/huggingface/hub`, else
/// `~/.cache/huggingface/hub`. `var` looks a variable up (the binary passes
/// `std::env::var_os`; this crate reads no environment itself).
pub fn default_cache_dir(var: impl Fn(&str) -> Option<OsString>) -> PathBuf {
    let set = |name: &str| var(name).filter(|v| !v.is_empty()).map(PathBuf::from);
    if let Some(dir) = set("HF_HUB_CACHE") {
        return dir;
    }
    huggingface_home(var).join("hub")
}

/// `HF_HOME`, else `$XDG_CACHE_HOME/huggingface`, else `~/.cache/huggingface`: where
/// huggingface_hub keeps its cache and the token `huggingface-cli login` saved.
pub fn huggingface_home(var: impl Fn(&str) -> Option<OsString>) -> PathBuf {
    let set = |name: &str| var(name).filter(|v| !v.is_empty()).map(PathBuf::from);
    if let Some(home) = set("HF_HOME") {
        return home;
    }
    let cache = set("XDG_CACHE_HOME")
        .or_else(|| set("HOME").map(|h| h.join(".cache")))
        .unwrap_or_else(|| PathBuf::from(".cache"));
    cache.join("huggingface")
}

/// Whether a file name from a repo is a plain relative path that stays inside the snapshot.
pub(crate) fn is_safe_file_name(file: &str) -> bool {
    !file.is_empty()
        && !file.starts_with('/')
        && !file.contains('\\')
        && !file.contains('\0')
        && file.split('/').all(|c| !c.is_empty() && c != "." && c != "..")
}

/// One repo's part of the cache.
#[derive(Debug, Clone)]
pub(crate) struct RepoCache {
    /// `<cache>/models--owner--name`.
    pub dir: PathBuf,
    /// `<cache>/.locks/models--owner--name`.
    pub locks: PathBuf,
}

impl RepoCache {
    pub fn new(cache: &Path, repo: &RepoRef) -> Self {
        RepoCache { dir: cache.join(repo.folder_name()), locks: cache.join(".locks").join(repo.folder_name()) }
    }

    pub fn snapshot(&self, commit: &str) -> PathBuf {
        self.dir.join("snapshots").join(commit)
    }

    pub fn blob(&self, etag: &str) -> PathBuf {
        self.dir.join("blobs").join(etag)
    }

    pub fn incomplete(&self, etag: &str) -> PathBuf {
        self.dir.join("blobs").join(format!("{etag}.incomplete"))
    }

    pub fn lock(&self, etag: &str) -> PathBuf {
        self.locks.join(format!("{etag}.lock"))
    }

    /// The commit a branch or tag pointed to when it was last resolved (`refs/<revision>`);
    /// a commit hash is its own answer.
    pub fn commit_of(&self, revision: &str) -> Option<String> {
        if is_commit(revision) {
            return Some(revision.to_owned());
        }
        let text = std::fs::read_to_string(self.dir.join("refs").join(revision)).ok()?;
        let commit = text.trim();
        is_commit(commit).then(|| commit.to_owned())
    }

    /// Records that `revision` is `commit` (nothing for a commit hash), atomically.
    pub fn write_ref(&self, revision: &str, commit: &str) -> Result<(), Error> {
        if is_commit(revision) || self.commit_of(revision).as_deref() == Some(commit) {
            return Ok(());
        }
        let path = self.dir.join("refs").join(revision);
        let parent = path.parent().unwrap_or(&self.dir);
        std::fs::create_dir_all(parent).map_err(|e| io_error(parent, e))?;
        let tmp = parent.join(format!(".{}.tmp", std::process::id()));
        let mut f = std::fs::File::create(&tmp).map_err(|e| io_error(&tmp, e))?;
        f.write_all(commit.as_bytes()).map_err(|e| io_error(&tmp, e))?;
        drop(f);
        std::fs::rename(&tmp, &path).map_err(|e| io_error(&path, e))
    }

    /// The snapshot's file, when it is there and its blob is complete (a symlink whose blob
    /// was deleted does not count).
    pub fn cached_file(&self, commit: &str, file: &str) -> Option<PathBuf> {
        let path = self.snapshot(commit).join(file);
        path.is_file().then_some(path)
    }

    /// Points `snapshots/<commit>/<file>` at `blobs/<etag>` with a relative symlink, as
    /// huggingface_hub does (replacing any older link atomically).
    pub fn link(&self, commit: &str, file: &str, etag: &str) -> Result<PathBuf, Error> {
        let path = self.snapshot(commit).join(file);
        let parent = path.parent().unwrap_or(&self.dir).to_path_buf();
        std::fs::create_dir_all(&parent).map_err(|e| io_error(&parent, e))?;
        let depth = file.split('/').count() + 1; // snapshots/<commit>/[dirs/]file
        let mut target = PathBuf::new();
        for _ in 0..depth {
            target.push("..");
        }
        target.push("blobs");
        target.push(etag);
        let tmp = parent.join(format!(
            ".{}.{}.link",
            path.file_name().map_or_else(|| "f".into(), |n| n.to_string_lossy()),
            std::process::id()
        ));
        let _ = std::fs::remove_file(&tmp);
        make_link(&target, &self.blob(etag), &tmp).map_err(|e| io_error(&tmp, e))?;
        std::fs::rename(&tmp, &path).map_err(|e| io_error(&path, e))?;
        Ok(path)
    }
}

#[cfg(unix)]
fn make_link(relative: &Path, _blob: &Path, at: &Path) -> std::io::Result<()> {
    std::os::unix::fs::symlink(relative, at)
}

/// Where symlinks are not available the blob is copied (as huggingface_hub does on
/// Windows without developer mode).
#[cfg(not(unix))]
fn make_link(_relative: &Path, blob: &Path, at: &Path) -> std::io::Result<()> {
    std::fs::copy(blob, at).map(|_| ())
}

#[cfg(test)]
#[allow(clippy::unwrap_used)] // a test that cannot unwrap has failed
mod tests {
    use super::*;

    #[test]
    fn repo_ids_parse_as_the_hub_names_them() {
        let r = RepoRef::parse("mlx-community/Llama-3.2-1B-Instruct-4bit").unwrap();
        assert_eq!((r.id.as_str(), r.revision()), ("mlx-community/Llama-3.2-1B-Instruct-4bit", "main"));
        assert_eq!(r.folder_name(), "models--mlx-community--Llama-3.2-1B-Instruct-4bit");
        let r = RepoRef::parse("a/b@v1.0").unwrap();
        assert_eq!((r.id.as_str(), r.revision()), ("a/b", "v1.0"));
        assert_eq!(r.to_string(), "a/b@v1.0");
        assert_eq!(RepoRef::parse("a/b@refs/pr/1").unwrap().revision(), "refs/pr/1");
        for bad in ["a", "/a", "a/", "a/b/c", "./a", "a/b@", "a--x/b", "a/.b", "a/b-", "a b/c", "a/b@../x", "/abs/path"]
        {
            assert!(RepoRef::parse(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn cache_dir_follows_huggingface_hub() {
        let env = |pairs: &'static [(&'static str, &'static str)]| {
            move |name: &str| pairs.iter().find(|(k, _)| *k == name).map(|(_, v)| OsString::from(v))
        };
        assert_eq!(default_cache_dir(env(&[("HOME", "/h")])), PathBuf::from("/h/.cache/huggingface/hub"));
        assert_eq!(
            default_cache_dir(env(&[("HOME", "/h"), ("XDG_CACHE_HOME", "/x")])),
            PathBuf::from("/x/huggingface/hub")
        );
        assert_eq!(default_cache_dir(env(&[("HOME", "/h"), ("HF_HOME", "/f")])), PathBuf::from("/f/hub"));
        assert_eq!(default_cache_dir(env(&[("HF_HOME", "/f"), ("HF_HUB_CACHE", "/c")])), PathBuf::from("/c"));
        assert_eq!(
            default_cache_dir(env(&[("HF_HOME", ""), ("HOME", "/h")])),
            PathBuf::from("/h/.cache/huggingface/hub")
        );
    }

    #[test]
    fn file_names_stay_inside() {
        for ok in ["config.json", "sub/model-00001-of-00002.safetensors"] {
            assert!(is_safe_file_name(ok), "{ok}");
        }
        for bad in ["", "/etc/passwd", "../x", "a/../../x", "a//b", "./a", "a\\b"] {
            assert!(!is_safe_file_name(bad), "{bad}");
        }
    }

    #[test]
    fn refs_and_links_use_the_standard_layout() {
        let tmp = tempfile::tempdir().unwrap();
        let repo = RepoRef::parse("o/n").unwrap();
        let cache = RepoCache::new(tmp.path(), &repo);
        let commit = "0123456789abcdef0123456789abcdef01234567";
        assert_eq!(cache.commit_of("main"), None);
        cache.write_ref("main", commit).unwrap();
        assert_eq!(std::fs::read_to_string(tmp.path().join("models--o--n/refs/main")).unwrap(), commit);
        assert_eq!(cache.commit_of("main").as_deref(), Some(commit));
        assert_eq!(cache.commit_of(commit).as_deref(), Some(commit));
        std::fs::create_dir_all(tmp.path().join("models--o--n/blobs")).unwrap();
        std::fs::write(cache.blob("e1"), b"hello").unwrap();
        assert_eq!(cache.cached_file(commit, "d/f.txt"), None);
        let path = cache.link(commit, "d/f.txt", "e1").unwrap();
        assert_eq!(path, tmp.path().join(format!("models--o--n/snapshots/{commit}/d/f.txt")));
        assert_eq!(std::fs::read_link(&path).unwrap(), PathBuf::from("../../../blobs/e1"));
        assert_eq!(std::fs::read(&path).unwrap(), b"hello");
        assert_eq!(cache.cached_file(commit, "d/f.txt"), Some(path));
        // A link whose blob is gone is not a cached file.
        std::fs::remove_file(cache.blob("e1")).unwrap();
        assert_eq!(cache.cached_file(commit, "d/f.txt"), None);
    }
}
