//! On-disk vmfb cache: a compile keyed by what determines its output is done once, then
//! read back from `<dir>/<sha256>.vmfb` (and its parameter encoder, when split out, from
//! `<dir>/<sha256>.encoder.vmfb`).
//!
//! Compiles run concurrently (compiler.rs); two threads of one process asking for the same
//! key compile it once: the second waits for the first and then reads its file. So do two
//! processes sharing a cache folder (test binaries run side by side, two servers starting):
//! the compiling one holds a lock on `<dir>/<key>.lock` (removed once the module is stored).

use std::collections::BTreeMap;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use sha2::{Digest, Sha256};

use crate::compiler::{ApiVersion, Compiler, CompilerIdentity};
use crate::error::Error;
use crate::locate::locate_library;
use crate::target::{CompileOptions, Target, compile_flags};
use crate::vmfb::check_vmfb;

/// Whether [`CompileCache::compile`] found the module on disk.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CacheOutcome {
    /// Read from the cache file.
    Hit,
    /// Compiled now and stored.
    Miss,
}

/// A module from the cache, with how it was obtained.
#[derive(Debug, Clone)]
pub struct Compiled {
    pub vmfb: Vec<u8>,
    /// The parameter encoder module, for options with
    /// [`CompileOptions::parameter_encoder`] (`None` when the compiler made none).
    pub encoder: Option<Vec<u8>>,
    pub outcome: CacheOutcome,
    /// The cache key (64 hex digits).
    pub key: String,
    /// The cache file holding `vmfb`.
    pub path: PathBuf,
    /// Time spent reading (hit) or compiling and storing (miss).
    pub elapsed: Duration,
}

/// A directory of compiled modules.
#[derive(Debug, Clone)]
pub struct CompileCache {
    dir: PathBuf,
}

/// The lock one key's compile holds in this process (one per cache file, never removed:
/// a process compiles few distinct modules).
fn compile_in_progress(path: &Path) -> Arc<Mutex<()>> {
    static LOCKS: Mutex<BTreeMap<PathBuf, Arc<Mutex<()>>>> = Mutex::new(BTreeMap::new());
    let mut locks = LOCKS.lock().unwrap_or_else(PoisonError::into_inner);
    Arc::clone(locks.entry(path.to_path_buf()).or_default())
}

/// An exclusive lock on a key's lock file, held across processes while the key compiles;
/// the file is removed when the lock is released. A process that opened the file before its
/// removal still gets the lock and then finds the stored module; one that comes later makes
/// a new file. Best effort: where the file cannot be made or locked, the compile runs
/// without it (at worst two processes compile the same module, and the stores are atomic).
struct KeyLock {
    path: PathBuf,
    _file: std::fs::File,
}

impl KeyLock {
    fn acquire(path: PathBuf) -> Option<KeyLock> {
        let file = std::fs::OpenOptions::new().create(true).truncate(false).write(true).open(&path).ok()?;
        file.lock().ok()?;
        Some(KeyLock { path, _file: file })
    }
}

impl Drop for KeyLock {
    fn drop(&mut self) {
        // Before the file closes (which releases the lock), so that no process locks a
        // file that is then removed under it while it compiles.
        let _ = std::fs::remove_file(&self.path);
    }
}

/// Bumped when the key layout changes, so old entries are never misread.
const KEY_DOMAIN: &[u8] = b"mlx-iree/iree-compiler vmfb cache v1\0";

impl CompileCache {
    /// Uses (and creates if needed) `dir`.
    pub fn new(dir: impl Into<PathBuf>) -> Result<CompileCache, Error> {
        let dir = dir.into();
        std::fs::create_dir_all(&dir).map_err(|source| Error::CacheIo { path: dir.clone(), source })?;
        Ok(CompileCache { dir })
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The key of a compile: sha256 over the MLIR text, the full flag list, the compiler's
    /// revision and API version, and, for `llvm-cpu` with `cpu = "host"`, a fingerprint of
    /// this machine's CPU features (so a cache copied to another machine is not reused for
    /// code that may use instructions that machine lacks).
    pub fn key(&self, compiler: &Compiler, mlir_text: &str, target: &Target, opts: &CompileOptions) -> String {
        self.key_for(&compiler.identity(), mlir_text, target, opts)
    }

    /// [`CompileCache::key`] for a compiler known by its identity (no library needed).
    pub fn key_for(&self, id: &CompilerIdentity, mlir_text: &str, target: &Target, opts: &CompileOptions) -> String {
        let mut h = Sha256::new();
        h.update(KEY_DOMAIN);
        let mut field = |bytes: &[u8]| {
            h.update((bytes.len() as u64).to_le_bytes());
            h.update(bytes);
        };
        field(id.revision.as_bytes());
        field(id.api_version.to_string().as_bytes());
        let host = match target {
            Target::LlvmCpu { cpu } if cpu == "host" => host_cpu_fingerprint(),
            _ => String::new(),
        };
        field(host.as_bytes());
        let flags = compile_flags(target, opts);
        field(&(flags.len() as u64).to_le_bytes());
        for flag in &flags {
            field(flag.as_bytes());
        }
        if opts.parameter_encoder {
            field(crate::compiler::SHARE_PREPARED_PIPELINE.as_bytes());
        }
        field(mlir_text.as_bytes());
        h.finalize().iter().map(|b| format!("{b:02x}")).collect()
    }

    /// The file a key is stored in.
    pub fn path_for(&self, key: &str) -> PathBuf {
        self.dir.join(format!("{key}.vmfb"))
    }

    /// The file a key's parameter encoder module is stored in.
    pub fn encoder_path_for(&self, key: &str) -> PathBuf {
        self.dir.join(format!("{key}.encoder.vmfb"))
    }

    /// The marker stored for a key compiled with [`CompileOptions::parameter_encoder`] for
    /// which the compiler wrote no encoder (so a hit does not look for one).
    fn no_encoder_path_for(&self, key: &str) -> PathBuf {
        self.dir.join(format!("{key}.no-encoder"))
    }

    /// Returns the cached module, or compiles and stores it. A cache file that is not a valid
    /// vmfb (truncated, foreign) is replaced by a fresh compile.
    pub fn compile(
        &self,
        compiler: &Compiler,
        mlir_text: &str,
        target: &Target,
        opts: &CompileOptions,
    ) -> Result<Compiled, Error> {
        let start = Instant::now();
        let key = self.key(compiler, mlir_text, target, opts);
        let path = self.path_for(&key);
        let in_progress = compile_in_progress(&path);
        let _only_compile = in_progress.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(hit) = self.read_hit(key.clone(), opts, start)? {
            return Ok(hit);
        }
        // Another process may be compiling this key: wait for it, then look again.
        let _other_processes = KeyLock::acquire(self.dir.join(format!("{key}.lock")));
        if let Some(hit) = self.read_hit(key.clone(), opts, start)? {
            return Ok(hit);
        }
        let (vmfb, encoder) = compiler.compile_split(mlir_text, target, opts)?;
        // The encoder (or its absence) first: a stored main module means a complete entry.
        match (&encoder, opts.parameter_encoder) {
            (Some(encoder), _) => self.store(&self.encoder_path_for(&key), encoder)?,
            (None, true) => self.store(&self.no_encoder_path_for(&key), b"")?,
            (None, false) => {}
        }
        self.store(&path, &vmfb)?;
        Ok(Compiled { vmfb, encoder, outcome: CacheOutcome::Miss, key, path, elapsed: start.elapsed() })
    }

    /// Finds the module in the cache without loading the compiler, for machines that carry
    /// a filled cache but no compiler, and so that a warm run never pays for loading it.
    ///
    /// The key holds the compiler's revision, which only the library can tell; so the cache
    /// remembers the compilers that filled it ([`CompileCache::remember`], in
    /// `compilers/`, keyed by the library file's path, size and modification time). If the
    /// compiler that [`Compiler::new`] would load is already loaded, or its file is one the
    /// cache remembers, that compiler's key is looked up. If no compiler library can be
    /// found at all, the key of every remembered compiler is tried. `Ok(None)` means: not
    /// found this way (a compile, or loading the compiler to learn its revision, is needed).
    pub fn lookup(&self, mlir_text: &str, target: &Target, opts: &CompileOptions) -> Result<Option<Compiled>, Error> {
        let start = Instant::now();
        let ids = match Compiler::loaded() {
            Some(compiler) => vec![compiler.identity()],
            None => match locate_library(None) {
                Ok(lib) => self.remembered(&lib).into_iter().collect(),
                Err(_) => self.all_remembered(),
            },
        };
        for id in ids {
            if let Some(hit) = self.read_hit(self.key_for(&id, mlir_text, target, opts), opts, start)? {
                return Ok(Some(hit));
            }
        }
        Ok(None)
    }

    /// The valid module stored under `key` (with its encoder, when `opts` split one out), if
    /// any. A file that is not a valid vmfb (truncated, foreign) counts as absent: a compile
    /// replaces it.
    fn read_hit(&self, key: String, opts: &CompileOptions, start: Instant) -> Result<Option<Compiled>, Error> {
        let path = self.path_for(&key);
        let Some(vmfb) = read_vmfb(&path)? else { return Ok(None) };
        let encoder = if !opts.parameter_encoder {
            None
        } else if let Some(encoder) = read_vmfb(&self.encoder_path_for(&key))? {
            Some(encoder)
        } else if self.no_encoder_path_for(&key).is_file() {
            None
        } else {
            return Ok(None);
        };
        Ok(Some(Compiled { vmfb, encoder, outcome: CacheOutcome::Hit, key, path, elapsed: start.elapsed() }))
    }

    /// Records `compiler`'s identity in the cache (`compilers/<fingerprint>.id`), so that
    /// [`CompileCache::lookup`] can compute its keys without loading it. Cheap when already
    /// recorded (one `stat` of the library).
    pub fn remember(&self, compiler: &Compiler) -> Result<(), Error> {
        let lib = compiler.library_path();
        let Some(record) = self.record_path(lib) else { return Ok(()) };
        let id = compiler.identity();
        if self.remembered(lib).as_ref() == Some(&id) {
            return Ok(());
        }
        let dir = self.dir.join(COMPILERS_DIR);
        std::fs::create_dir_all(&dir).map_err(|source| Error::CacheIo { path: dir.clone(), source })?;
        let text = format!("{}\n{}\n{}\n", id.revision, id.api_version, lib.display());
        self.store(&record, text.as_bytes())
    }

    /// The identity remembered for the library file `lib`, if any.
    fn remembered(&self, lib: &Path) -> Option<CompilerIdentity> {
        parse_identity(&std::fs::read_to_string(self.record_path(lib)?).ok()?)
    }

    /// Every identity the cache remembers (sorted, without duplicates).
    fn all_remembered(&self) -> Vec<CompilerIdentity> {
        let Ok(entries) = std::fs::read_dir(self.dir.join(COMPILERS_DIR)) else { return vec![] };
        let mut ids: Vec<CompilerIdentity> = entries
            .filter_map(Result::ok)
            .filter(|e| e.path().extension().is_some_and(|x| x == "id"))
            .filter_map(|e| parse_identity(&std::fs::read_to_string(e.path()).ok()?))
            .collect();
        ids.sort_by(|a, b| (&a.revision, a.api_version).cmp(&(&b.revision, b.api_version)));
        ids.dedup();
        ids
    }

    /// `compilers/<sha256 of (canonical path, size, mtime)>.id`: a rebuilt or replaced
    /// library gets a new record. `None` when the file cannot be read.
    fn record_path(&self, lib: &Path) -> Option<PathBuf> {
        let lib = lib.canonicalize().ok()?;
        let meta = std::fs::metadata(&lib).ok()?;
        let mtime = meta.modified().ok()?.duration_since(std::time::UNIX_EPOCH).ok()?;
        let mut h = Sha256::new();
        h.update(lib.to_string_lossy().as_bytes());
        h.update([0]);
        h.update(meta.len().to_le_bytes());
        h.update(mtime.as_nanos().to_le_bytes());
        let hex: String = h.finalize().iter().take(16).map(|b| format!("{b:02x}")).collect();
        Some(self.dir.join(COMPILERS_DIR).join(format!("{hex}.id")))
    }

    /// Writes `bytes` to a temporary file in the cache directory, flushes it to disk, then
    /// renames it over `path`, so readers see either no file or the whole module.
    fn store(&self, path: &Path, bytes: &[u8]) -> Result<(), Error> {
        let io = |source| Error::CacheIo { path: path.to_path_buf(), source };
        let mut tmp = tempfile::Builder::new().prefix(".tmp-").suffix(".vmfb").tempfile_in(&self.dir).map_err(io)?;
        tmp.write_all(bytes).map_err(io)?;
        tmp.as_file().sync_all().map_err(io)?;
        tmp.persist(path).map_err(|e| io(e.error))?;
        Ok(())
    }
}

/// The bytes of the vmfb at `path`; `None` when absent or not a valid vmfb.
fn read_vmfb(path: &Path) -> Result<Option<Vec<u8>>, Error> {
    match std::fs::read(path) {
        Ok(vmfb) if check_vmfb(&vmfb).is_ok() => Ok(Some(vmfb)),
        Ok(_) => Ok(None),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(source) => Err(Error::CacheIo { path: path.to_path_buf(), source }),
    }
}

/// Sub-folder of a cache holding the identities of the compilers that filled it.
const COMPILERS_DIR: &str = "compilers";

/// A `compilers/*.id` record: revision, then `major.minor`, then (informational) the path.
fn parse_identity(text: &str) -> Option<CompilerIdentity> {
    let mut lines = text.lines();
    let revision = lines.next()?.to_owned();
    let (major, minor) = lines.next()?.split_once('.')?;
    Some(CompilerIdentity {
        revision,
        api_version: ApiVersion { major: major.parse().ok()?, minor: minor.parse().ok()? },
    })
}

/// Architecture plus the CPU features that decide which instructions `cpu=host` code uses.
fn host_cpu_fingerprint() -> String {
    let mut out = std::env::consts::ARCH.to_owned();
    #[cfg(target_arch = "x86_64")]
    {
        let features = [
            ("sse4.2", std::arch::is_x86_feature_detected!("sse4.2")),
            ("avx", std::arch::is_x86_feature_detected!("avx")),
            ("avx2", std::arch::is_x86_feature_detected!("avx2")),
            ("fma", std::arch::is_x86_feature_detected!("fma")),
            ("f16c", std::arch::is_x86_feature_detected!("f16c")),
            ("bmi2", std::arch::is_x86_feature_detected!("bmi2")),
            ("avx512f", std::arch::is_x86_feature_detected!("avx512f")),
            ("avx512bw", std::arch::is_x86_feature_detected!("avx512bw")),
            ("avx512vl", std::arch::is_x86_feature_detected!("avx512vl")),
            ("avx512dq", std::arch::is_x86_feature_detected!("avx512dq")),
            ("avx512vnni", std::arch::is_x86_feature_detected!("avx512vnni")),
            ("avx512bf16", std::arch::is_x86_feature_detected!("avx512bf16")),
            ("avx512fp16", std::arch::is_x86_feature_detected!("avx512fp16")),
        ];
        for (name, present) in features {
            if present {
                out.push('+');
                out.push_str(name);
            }
        }
    }
    #[cfg(target_arch = "aarch64")]
    {
        let features = [
            ("fp16", std::arch::is_aarch64_feature_detected!("fp16")),
            ("dotprod", std::arch::is_aarch64_feature_detected!("dotprod")),
            ("i8mm", std::arch::is_aarch64_feature_detected!("i8mm")),
            ("bf16", std::arch::is_aarch64_feature_detected!("bf16")),
            ("sve", std::arch::is_aarch64_feature_detected!("sve")),
            ("sve2", std::arch::is_aarch64_feature_detected!("sve2")),
        ];
        for (name, present) in features {
            if present {
                out.push('+');
                out.push_str(name);
            }
        }
    }
    out
}
