//! Where compiled modules are cached, compiling through that cache with progress lines, and
//! the parameters stored in final form beside a compiled module ([`stored_parameters`]).

use iree_compiler::{CacheOutcome, CompileCache, CompileOptions, Compiler, Error, Target};
use iree_hal::{Device, Instance, Parameters};
use sha2::{Digest, Sha256};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Instant;

/// Modules asked of [`compile_in`] (cache hits included) in this process.
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

/// [`compile_module`], for callers that want the module's bytes only.
pub fn compile_in(
    cache_dir: &Path,
    what: &str,
    mlir: &str,
    target: &Target,
    opts: &CompileOptions,
    dump_mlir: bool,
) -> Result<(Vec<u8>, CompileReport), Error> {
    compile_module(cache_dir, what, mlir, target, opts, dump_mlir).map(|m| (m.vmfb, m.report))
}

/// Compiles `mlir` for `target` through the cache in `cache_dir`, saying what happens as
/// `tracing` info events (a user must never stare at a silent terminal while IREE works;
/// the binary prints them on stderr). The compiler library is loaded only when the module
/// is not in the cache ([`CompileCache::lookup`]), so a warm cache runs on a machine without
/// the compiler, and a warm run does not pay for loading it. `dump_mlir` also writes the
/// input next to the cache entry (see [`crate::EngineConfig::dump_mlir`]).
pub fn compile_module(
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
pub fn parameters_path(vmfb: &Path, dir: &Path, files: &[&Path]) -> std::io::Result<PathBuf> {
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
pub fn stored_parameters(
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

    #[test]
    fn reports_add_up() {
        let s = |r: CompileReport| r.to_string();
        assert_eq!(s(CacheHit.and(CacheHit)), "compile cache hit");
        assert_eq!(s(CacheHit.and(Compiled { seconds: 2.0 })), "compiled in 2.0 s");
        assert_eq!(s(Compiled { seconds: 1.5 }.and(Compiled { seconds: 2.0 })), "compiled in 3.5 s");
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
