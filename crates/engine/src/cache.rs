//! Where compiled modules are cached, compiling through that cache with progress lines, the
//! parameters stored in final form beside a compiled module (`stored_parameters`), and
//! keeping the folder to a size (`evict`: least recently used modules first).
//!
//! Public: where the cache lives ([`default_dir`], [`DEFAULT_CACHE_MAX_BYTES`]), how a
//! compile went ([`CompileReport`]) and how many modules this process asked of it
//! ([`compiles`]). The steps of a load (compiling, binding stored parameters, evicting)
//! are the engine's own: callers go through [`crate::Engine`] and its
//! [`crate::LoadReport`], never IREE types.

use iree_compiler::{CacheOutcome, CompileCache, CompileOptions, Compiler, Error, Target};
use iree_hal::{Device, Instance, Parameters};
use sha2::{Digest, Sha256};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant, SystemTime};

/// Modules asked of [`compile_module`] (cache hits included) in this process.
static COMPILES: AtomicUsize = AtomicUsize::new(0);

/// How many modules this process has compiled or read from the compile cache: an engine
/// does that only while it loads, never per request (tests hold it to that).
pub fn compiles() -> usize {
    COMPILES.load(Ordering::Relaxed)
}

/// The usual cache folder given the values of `MLX_IREE_CACHE_DIR`, `XDG_CACHE_HOME` and
/// `HOME` (looked up through `var`, so the caller decides where settings come from; the
/// binary passes the process environment): the first, else `$XDG_CACHE_HOME/mlx-iree`, else
/// `~/.cache/mlx-iree`, else `mlx-iree` under the temporary folder.
pub fn default_dir(var: impl Fn(&str) -> Option<std::ffi::OsString>) -> PathBuf {
    if let Some(d) = var("MLX_IREE_CACHE_DIR").filter(|d| !d.is_empty()) {
        return PathBuf::from(d);
    }
    let base = var("XDG_CACHE_HOME")
        .filter(|d| !d.is_empty())
        .map(PathBuf::from)
        .or_else(|| var("HOME").map(|h| PathBuf::from(h).join(".cache")))
        .unwrap_or_else(std::env::temp_dir);
    base.join("mlx-iree")
}

/// How a compile went, for the summary line.
#[derive(Debug, Clone, Copy)]
pub enum CompileReport {
    CacheHit,
    Compiled { seconds: f64 },
}

impl CompileReport {
    /// The report for two compiles in a row: a hit only if both were hits, else the
    /// seconds spent compiling added up.
    pub fn and(self, other: CompileReport) -> CompileReport {
        match (self, other) {
            (CompileReport::CacheHit, CompileReport::CacheHit) => CompileReport::CacheHit,
            (a, b) => CompileReport::Compiled { seconds: a.seconds() + b.seconds() },
        }
    }

    fn seconds(self) -> f64 {
        match self {
            CompileReport::CacheHit => 0.0,
            CompileReport::Compiled { seconds } => seconds,
        }
    }
}

impl std::fmt::Display for CompileReport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            CompileReport::CacheHit => f.write_str("compile cache hit"),
            CompileReport::Compiled { seconds } => write!(f, "compiled in {seconds:.1} s"),
        }
    }
}

/// A module from the compile cache.
#[derive(Debug)]
pub struct CompiledModule {
    pub vmfb: Vec<u8>,
    /// Its parameter encoder, when compiled with [`CompileOptions::parameter_encoder`].
    pub encoder: Option<Vec<u8>>,
    /// The cache file holding `vmfb` (its name is the cache key).
    pub path: PathBuf,
    pub report: CompileReport,
}

/// Compiles `mlir` for `target` through the cache in `cache_dir`, saying what happens as
/// `tracing` info events (a user must never stare at a silent terminal while IREE works;
/// the binary prints them on stderr). The compiler library is loaded only when the module
/// is not in the cache ([`CompileCache::lookup`]), so a warm cache runs on a machine without
/// the compiler, and a warm run does not pay for loading it. `dump_mlir` also writes the
/// input next to the cache entry (see [`crate::EngineConfig::dump_mlir`]).
pub(crate) fn compile_module(
    cache_dir: &Path,
    what: &str,
    mlir: &str,
    target: &Target,
    opts: &CompileOptions,
    dump_mlir: bool,
) -> Result<CompiledModule, Error> {
    COMPILES.fetch_add(1, Ordering::Relaxed);
    let cache = CompileCache::new(cache_dir)?;
    if let Some(hit) = cache.lookup(mlir, target, opts)? {
        if dump_mlir {
            dump(what, &hit.path, mlir, target, opts);
        }
        tracing::info!("{what}: {}", CompileReport::CacheHit);
        touch(&hit.path);
        return Ok(CompiledModule {
            vmfb: hit.vmfb,
            encoder: hit.encoder,
            path: hit.path,
            report: CompileReport::CacheHit,
        });
    }
    let compiler = Compiler::new().map_err(|cause| Error::NotCached {
        what: what.to_owned(),
        target: target.to_string(),
        dir: cache_dir.to_path_buf(),
        cause: Box::new(cause),
    })?;
    let key = cache.key(&compiler, mlir, target, opts);
    if dump_mlir {
        dump(what, &cache.path_for(&key), mlir, target, opts);
    }
    if !cache.path_for(&key).exists() {
        tracing::info!(
            "compiling {what} for {target} (first run; later runs use the cache in {})...",
            cache_dir.display()
        );
    }
    let out = cache.compile(&compiler, mlir, target, opts)?;
    // So that later runs find this module without loading the compiler.
    cache.remember(&compiler)?;
    let report = match out.outcome {
        CacheOutcome::Hit => CompileReport::CacheHit,
        CacheOutcome::Miss => CompileReport::Compiled { seconds: out.elapsed.as_secs_f64() },
    };
    tracing::info!("{what}: {report}");
    Ok(CompiledModule { vmfb: out.vmfb, encoder: out.encoder, path: out.path, report })
}

/// Names what the loader writes into stored parameters; change it when that changes while
/// the graphs (and so the compiled modules' keys) do not.
const STORED_PARAMETERS_VERSION: &str = "mlx-iree stored parameters v1";

/// The file holding the parameters of the module cached at `vmfb`, for the checkpoint in
/// `dir` whose weight files are `files`, in the final form that module reads:
/// `<module key>.<checkpoint>.<state>.irpa` beside it. `<checkpoint>` hashes the folder,
/// `<state>` each weight file's path, size and modification time, so two checkpoints that
/// share one module (every checkpoint of an architecture at a dense precision does) get
/// files of their own, and a changed checkpoint gets a new one (the old one is removed
/// when the new one is written).
pub(crate) fn parameters_path(vmfb: &Path, dir: &Path, files: &[&Path]) -> std::io::Result<PathBuf> {
    let hex = |h: Sha256| -> String { h.finalize().iter().take(8).map(|b| format!("{b:02x}")).collect() };
    let mut folder = Sha256::new();
    folder.update(dir.canonicalize()?.to_string_lossy().as_bytes());
    let mut state = Sha256::new();
    state.update(STORED_PARAMETERS_VERSION.as_bytes());
    for file in files {
        let meta = std::fs::metadata(file)?;
        let mtime = meta.modified()?.duration_since(std::time::UNIX_EPOCH).unwrap_or_default();
        state.update([0]);
        state.update(file.canonicalize()?.to_string_lossy().as_bytes());
        state.update([0]);
        state.update(meta.len().to_le_bytes());
        state.update(mtime.as_nanos().to_le_bytes());
    }
    let key = vmfb.file_stem().unwrap_or_default().to_string_lossy();
    Ok(vmfb.with_file_name(format!("{key}.{}.{}.irpa", hex(folder), hex(state))))
}

/// The parameters of a module compiled with [`CompileOptions::parameter_encoder`], bound
/// from `path` (see [`parameters_path`]) in the final form the module reads, mapped into
/// memory: IREE imports them in place, and nothing of the checkpoint is read.
///
/// On the first load for a module and checkpoint (no file at `path`, or one that cannot be
/// read), `inputs` gives the checkpoint's parameters as the module's source scope (`model`)
/// expects them, the module's `encoder` writes them in final form (IREE's encoded copies,
/// data-tiled, and every other parameter as is) into a temporary file beside `path`, renamed
/// to `path` once complete, so a reader sees a whole file or none; the inputs are dropped
/// before the file is mapped. Where the cache folder cannot be written, the file goes to the
/// system's temporary folder and is removed once mapped (each load then encodes again).
/// Returns the parameters, and whether they are bound from `path`.
pub(crate) fn stored_parameters(
    instance: &Instance,
    device: &Device,
    what: &str,
    path: &Path,
    encoder: &[u8],
    inputs: impl FnOnce() -> crate::Result<Parameters>,
) -> crate::Result<(Parameters, bool)> {
    let scope = iree_compiler::ENCODED_SCOPE;
    if path.is_file() {
        let mut params = Parameters::new(scope)?;
        match params.add_file_mapped(path) {
            Ok(()) => {
                tracing::info!("{what}: parameters mapped from {}", path.display());
                return Ok((params, true));
            }
            Err(e) => tracing::warn!("{what}: stored parameters unreadable ({e}); writing them again"),
        }
    }
    let store = |source| crate::Error::ParameterStore { path: path.to_path_buf(), source };
    let dir = path.parent().unwrap_or(Path::new("."));
    let temp = |dir: &Path| tempfile::Builder::new().prefix(".tmp-").suffix(".irpa").tempfile_in(dir);
    let (file, keep) = match temp(dir) {
        Ok(file) => (file, true),
        Err(e) => {
            tracing::warn!(
                "{what}: cannot write into {} ({e}); encoding the parameters into a temporary file for this load only",
                dir.display()
            );
            (temp(&std::env::temp_dir()).map_err(store)?, false)
        }
    };
    tracing::info!(
        "{what}: writing its parameters in final form to {} (first load of this model and shape; later loads map that file)...",
        path.display()
    );
    let started = Instant::now();
    let inputs = inputs()?;
    let report = iree_hal::encode_parameters(instance, device, encoder, &[&inputs], file.path())?;
    drop(inputs);
    let mut params = Parameters::new(&report.scope)?;
    if keep {
        file.persist(path).map_err(|e| store(e.error))?;
        remove_stale(path);
        params.add_file_mapped(path)?;
    } else {
        // Mapped, the file can go: the mapping keeps its pages.
        params.add_file_mapped(file.path())?;
    }
    tracing::info!(
        "{what}: parameters written in {:.1} s ({:.1} MiB)",
        started.elapsed().as_secs_f64(),
        report.file_bytes as f64 / (1 << 20) as f64
    );
    Ok((params, keep))
}

/// Removes the other stored parameters of the same module and checkpoint folder as `path`
/// (`<key>.<checkpoint>.*.irpa`: earlier states of the checkpoint's files).
fn remove_stale(path: &Path) {
    let Some(name) = path.file_name().and_then(|n| n.to_str()) else { return };
    let Some((prefix, _)) = name.strip_suffix(".irpa").and_then(|n| n.rsplit_once('.')) else { return };
    let Some(Ok(entries)) = path.parent().map(std::fs::read_dir) else { return };
    for entry in entries.filter_map(Result::ok) {
        let other = entry.file_name();
        let other = other.to_string_lossy();
        if other != name && other.starts_with(&format!("{prefix}.")) && other.ends_with(".irpa") {
            match std::fs::remove_file(entry.path()) {
                Ok(()) => tracing::info!("removed stale stored parameters {}", entry.path().display()),
                Err(e) => tracing::warn!("removing stale stored parameters {}: {e}", entry.path().display()),
            }
        }
    }
}

/// Those of `keys` that the compiled module `vmfb` names, in their order. A module compiled
/// with the parameter encoder reads what the encoder wrote from
/// [`iree_compiler::ENCODED_SCOPE`], under the encoder's own names (`parameter0`, ...), and
/// reads whatever the encoder left out from the source scope, by key: IREE 3.13's encoder
/// leaves in the module every repacking that would grow its parameter by more than 1.2x
/// (data tiling pads a matrix of few rows, as Qwen3.5's `in_proj_b`), so that parameter is
/// read as the checkpoint has it at every load. The module holds each key it reads verbatim
/// in its read-only data; a key found elsewhere in its bytes only costs binding one more
/// tensor, a key not found is one the module cannot read.
pub(crate) fn named_keys<'k>(vmfb: &[u8], keys: impl IntoIterator<Item = &'k str>) -> Vec<&'k str> {
    let keys: Vec<&str> = keys.into_iter().collect();
    // Only runs of bytes that occur in some key can hold one: a few short strings of the
    // module's bytes (its code aside), searched per key.
    let mut in_key = [false; 256];
    for &b in keys.iter().flat_map(|k| k.as_bytes()) {
        in_key[usize::from(b)] = true;
    }
    let shortest = keys.iter().map(|k| k.len()).min().unwrap_or(0).max(1);
    let runs: Vec<&[u8]> = vmfb.split(|&b| !in_key[usize::from(b)]).filter(|r| r.len() >= shortest).collect();
    let joined = runs.join(&0u8);
    let text = String::from_utf8_lossy(&joined);
    keys.into_iter().filter(|k| text.contains(k)).collect()
}

/// Default for [`crate::EngineConfig::cache_max_bytes`], 32 GB: a handful of models and shapes (the
/// 1B shape's f16 module and stored weights take 3 GB, SmolLM2's packed ones 0.3 GB).
pub const DEFAULT_CACHE_MAX_BYTES: u64 = 32_000_000_000;

/// Entries used this recently are never evicted: another process may be loading them.
const EVICT_AFTER: Duration = Duration::from_secs(3600);

/// Marks a compiled module used now (its modification time), for [`evict`], which dates an
/// entry by its newest file (stored parameters keep the time they were written, which tells
/// a rewrite). Best effort: a cache on a read-only medium is still read.
fn touch(path: &Path) {
    if let Ok(file) = std::fs::File::open(path) {
        let _ = file.set_modified(SystemTime::now());
    }
}

/// The module key a cache file belongs to: the 64 hex digits its name starts with, before
/// `.vmfb`, `.encoder.vmfb`, `.mlir` or a stored-parameters suffix. Lock and temporary files
/// belong to none (a compile in progress owns them).
fn entry_key(name: &str) -> Option<&str> {
    let (key, rest) = name.split_at_checked(64)?;
    let ours = key.bytes().all(|b| b.is_ascii_hexdigit()) && rest.starts_with('.') && !rest.ends_with(".lock");
    ours.then_some(key)
}

/// Removes whole module entries from the cache folder `dir` (a key's compiled module, its
/// parameter encoder, dumped input and stored parameters), least recently used first (the
/// newest modification time among an entry's files: loads [`touch`] its module), until the entries
/// left take at most `max_bytes`. Never an entry used in the last hour (another process may be
/// loading it) nor one of `keep` (the modules just loaded, by path). Returns the bytes removed.
pub(crate) fn evict(dir: &Path, max_bytes: u64, keep: &[&Path]) -> u64 {
    let Ok(files) = std::fs::read_dir(dir) else { return 0 };
    let mut entries: std::collections::BTreeMap<String, (SystemTime, u64, Vec<PathBuf>)> = Default::default();
    for file in files.filter_map(std::result::Result::ok) {
        let name = file.file_name();
        let Some(key) = name.to_str().and_then(entry_key) else { continue };
        let Ok(meta) = file.metadata() else { continue };
        if !meta.is_file() {
            continue;
        }
        let e = entries.entry(key.to_owned()).or_insert((SystemTime::UNIX_EPOCH, 0, Vec::new()));
        e.0 = e.0.max(meta.modified().unwrap_or(SystemTime::UNIX_EPOCH));
        e.1 += meta.len();
        e.2.push(file.path());
    }
    let mut total: u64 = entries.values().map(|e| e.1).sum();
    let kept: Vec<String> =
        keep.iter().filter_map(|p| p.file_name()?.to_str().and_then(entry_key).map(str::to_owned)).collect();
    let recent = SystemTime::now().checked_sub(EVICT_AFTER).unwrap_or(SystemTime::UNIX_EPOCH);
    let mut oldest: Vec<(SystemTime, String)> = entries
        .iter()
        .filter(|(key, e)| e.0 < recent && !kept.contains(key))
        .map(|(key, e)| (e.0, key.clone()))
        .collect();
    oldest.sort();
    let mut removed = 0;
    for (_, key) in oldest {
        if total <= max_bytes {
            break;
        }
        let (_, bytes, files) = &entries[&key];
        for file in files {
            if let Err(e) = std::fs::remove_file(file) {
                tracing::warn!("evicting {}: {e}", file.display());
            }
        }
        tracing::info!("evicted cache entry {key} ({:.1} MiB, least recently used)", *bytes as f64 / (1 << 20) as f64);
        total -= bytes;
        removed += bytes;
    }
    removed
}

/// For debugging the compiler on our graphs: keeps the input next to the cache entry
/// `vmfb_path`, with the flags used, ready for iree-compile.
fn dump(what: &str, vmfb_path: &Path, mlir: &str, target: &Target, opts: &CompileOptions) {
    let path = vmfb_path.with_extension("mlir");
    let flags = iree_compiler::compile_flags(target, opts).join(" ");
    match std::fs::write(&path, format!("// iree-compile {flags}\n{mlir}")) {
        Ok(()) => tracing::info!("{what}: MLIR written to {}", path.display()),
        Err(e) => tracing::warn!("{what}: writing {}: {e}", path.display()),
    }
}

#[cfg(test)]
mod tests {
    use super::CompileReport::{self, CacheHit, Compiled};
    use super::{evict, named_keys};
    use std::time::{Duration, SystemTime};

    /// Keys as a module holds them: one after another in its data, between other bytes. A
    /// key only the start of which is there (`model.norm`), or one another key's name does
    /// not hold (layer 1 beside layer 10), is not named.
    #[test]
    fn finds_the_keys_a_module_names() {
        let mut vmfb = b"\x00\x7fELF\x02model\x01encoded\x00".to_vec();
        vmfb.extend_from_slice(b"model.layers.0.b.weightmodel.layers.10.a.weight\xff\xfe");
        vmfb.extend_from_slice(b"parameter0\x00model.norm");
        let keys =
            ["model.layers.0.b.weight", "model.layers.1.a.weight", "model.layers.10.a.weight", "model.norm.weight"];
        assert_eq!(named_keys(&vmfb, keys), ["model.layers.0.b.weight", "model.layers.10.a.weight"]);
        assert!(named_keys(&[], keys).is_empty());
        assert!(named_keys(&vmfb, []).is_empty());
    }

    #[test]
    fn reports_add_up() {
        let s = |r: CompileReport| r.to_string();
        assert_eq!(s(CacheHit.and(CacheHit)), "compile cache hit");
        assert_eq!(s(CacheHit.and(Compiled { seconds: 2.0 })), "compiled in 2.0 s");
        assert_eq!(s(Compiled { seconds: 1.5 }.and(Compiled { seconds: 2.0 })), "compiled in 3.5 s");
    }

    /// Least recently used entries go first, whole, until the rest fits; recent ones, kept
    /// ones and files that are no entry's stay.
    #[test]
    fn eviction_removes_least_recently_used_entries_whole() {
        let dir = tempfile::tempdir().unwrap();
        let key = |c: char| c.to_string().repeat(64);
        let write = |name: String, bytes: usize, hours_ago: u64| {
            let path = dir.path().join(name);
            std::fs::write(&path, vec![0u8; bytes]).unwrap();
            let when = SystemTime::now() - Duration::from_secs(hours_ago * 3600 + 60);
            std::fs::File::open(&path).unwrap().set_modified(when).unwrap();
            path
        };
        // a: oldest (its stored parameters touched 5 hours ago, its module 9); b: 3 hours;
        // c: kept although oldest; d: used 10 minutes ago.
        write(format!("{}.vmfb", key('a')), 100, 9);
        write(format!("{}.encoder.vmfb", key('a')), 50, 9);
        write(format!("{}.0123456789abcdef.0123456789abcdef.irpa", key('a')), 1000, 5);
        let b = write(format!("{}.vmfb", key('b')), 300, 3);
        let c = write(format!("{}.vmfb", key('c')), 400, 20);
        std::fs::write(dir.path().join(format!("{}.vmfb", key('d'))), vec![0u8; 500]).unwrap();
        write(format!("{}.lock", key('e')), 10, 30);
        write("compilers".into(), 10, 30);
        std::fs::create_dir(dir.path().join("kernels")).unwrap();
        let left = || {
            let mut names: Vec<String> =
                std::fs::read_dir(dir.path()).unwrap().map(|e| e.unwrap().file_name().into_string().unwrap()).collect();
            names.sort();
            names
        };
        // 2350 bytes of entries; at most 1300: a goes (1150), b stays (1200 left).
        assert_eq!(evict(dir.path(), 1300, &[c.as_path()]), 1150);
        let after = left();
        assert_eq!(after.len(), 6, "{after:?}");
        assert!(after.iter().all(|n| !n.starts_with(&key('a'))), "{after:?}");
        // Nothing more to remove under a larger limit; under a smaller one only b can go.
        assert_eq!(evict(dir.path(), 1300, &[c.as_path()]), 0);
        assert_eq!(evict(dir.path(), 0, &[c.as_path()]), 300);
        assert!(!b.exists() && c.exists());
        assert!(dir.path().join(format!("{}.vmfb", key('d'))).exists(), "used in the last hour");
        assert!(dir.path().join(format!("{}.lock", key('e'))).exists() && dir.path().join("kernels").is_dir());
        assert_eq!(evict(&dir.path().join("missing"), 0, &[]), 0);
    }

    #[test]
    fn default_dir_follows_the_given_settings() {
        use super::default_dir;
        use std::path::PathBuf;
        let vars = |pairs: &'static [(&'static str, &'static str)]| {
            move |k: &str| pairs.iter().find(|(name, _)| *name == k).map(|(_, v)| std::ffi::OsString::from(v))
        };
        const ALL: [(&str, &str); 3] = [("MLX_IREE_CACHE_DIR", "/c"), ("XDG_CACHE_HOME", "/x"), ("HOME", "/h")];
        assert_eq!(default_dir(vars(&ALL)), PathBuf::from("/c"));
        assert_eq!(default_dir(vars(&ALL[1..])), PathBuf::from("/x/mlx-iree"));
        assert_eq!(default_dir(vars(&ALL[2..])), PathBuf::from("/h/.cache/mlx-iree"));
        // Empty values count as unset.
        assert_eq!(
            default_dir(vars(&[("MLX_IREE_CACHE_DIR", ""), ("HOME", "/h")])),
            PathBuf::from("/h/.cache/mlx-iree")
        );
        assert_eq!(default_dir(vars(&[])), std::env::temp_dir().join("mlx-iree"));
    }
}
