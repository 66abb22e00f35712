//! Where compiled modules are cached, and compiling through that cache with progress lines.

use iree_compiler::{CacheOutcome, CompileCache, CompileOptions, Compiler, Error, Target};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};

/// Modules asked of [`compile_in`] (cache hits included) in this process.
static COMPILES: AtomicUsize = AtomicUsize::new(0);

/// How many modules this process has compiled or read from the compile cache: an engine
/// does that only while it loads, never per request (tests hold it to that).
pub fn compiles() -> usize {
    COMPILES.load(Ordering::Relaxed)
}

/// `$MLX_IREE_CACHE_DIR`, else `$XDG_CACHE_HOME/mlx-iree`, else `~/.cache/mlx-iree`.
pub fn dir() -> PathBuf {
    if let Some(d) = std::env::var_os("MLX_IREE_CACHE_DIR") {
        return PathBuf::from(d);
    }
    let base = std::env::var_os("XDG_CACHE_HOME")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache")))
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

/// Compiles `mlir` for `target` through the cache, saying on stderr what happens (a user
/// must never stare at a silent terminal while IREE works; stdout stays the output).
pub fn compile(
    what: &str,
    mlir: &str,
    target: &Target,
    opts: &CompileOptions,
) -> Result<(Vec<u8>, CompileReport), Error> {
    compile_in(&dir(), what, mlir, target, opts)
}

/// [`compile`] with an explicit cache folder. The compiler library is loaded only when the
/// module is not in the cache ([`CompileCache::lookup`]), so a warm cache runs on a machine
/// without the compiler, and a warm run does not pay for loading it.
pub fn compile_in(
    cache_dir: &Path,
    what: &str,
    mlir: &str,
    target: &Target,
    opts: &CompileOptions,
) -> Result<(Vec<u8>, CompileReport), Error> {
    COMPILES.fetch_add(1, Ordering::Relaxed);
    let cache = CompileCache::new(cache_dir)?;
    if let Some(hit) = cache.lookup(mlir, target, opts)? {
        dump_mlir(what, &hit.path, mlir, target, opts);
        eprintln!("{what}: {}", CompileReport::CacheHit);
        return Ok((hit.vmfb, CompileReport::CacheHit));
    }
    let compiler = Compiler::new().map_err(|cause| Error::NotCached {
        what: what.to_owned(),
        target: target.to_string(),
        dir: cache_dir.to_path_buf(),
        cause: Box::new(cause),
    })?;
    let key = cache.key(&compiler, mlir, target, opts);
    dump_mlir(what, &cache.path_for(&key), mlir, target, opts);
    if !cache.path_for(&key).exists() {
        eprintln!("compiling {what} for {target} (first run; later runs use the cache in {})...", cache_dir.display());
    }
    let out = cache.compile(&compiler, mlir, target, opts)?;
    // So that later runs find this module without loading the compiler.
    cache.remember(&compiler)?;
    let report = match out.outcome {
        CacheOutcome::Hit => CompileReport::CacheHit,
        CacheOutcome::Miss => CompileReport::Compiled { seconds: out.elapsed.as_secs_f64() },
    };
    eprintln!("{what}: {report}");
    Ok((out.vmfb, report))
}

/// For debugging the compiler on our graphs: MLX_IREE_DUMP_MLIR=1 keeps the input next to
/// the cache entry `vmfb_path`, with the flags used, ready for iree-compile.
fn dump_mlir(what: &str, vmfb_path: &Path, mlir: &str, target: &Target, opts: &CompileOptions) {
    if std::env::var_os("MLX_IREE_DUMP_MLIR").is_some() {
        let path = vmfb_path.with_extension("mlir");
        let flags = iree_compiler::compile_flags(target, opts).join(" ");
        if std::fs::write(&path, format!("// iree-compile {flags}\n{mlir}")).is_ok() {
            eprintln!("{what}: MLIR written to {}", path.display());
        }
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
}
