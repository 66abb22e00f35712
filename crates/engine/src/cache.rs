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

/// Compiles `mlir` for `target` through the cache in `cache_dir`, saying what happens as
/// `tracing` info events (a user must never stare at a silent terminal while IREE works;
/// the binary prints them on stderr). The compiler library is loaded only when the module
/// is not in the cache ([`CompileCache::lookup`]), so a warm cache runs on a machine without
/// the compiler, and a warm run does not pay for loading it. `dump_mlir` also writes the
/// input next to the cache entry (see [`crate::EngineConfig::dump_mlir`]).
pub fn compile_in(
    cache_dir: &Path,
    what: &str,
    mlir: &str,
    target: &Target,
    opts: &CompileOptions,
    dump_mlir: bool,
) -> Result<(Vec<u8>, CompileReport), Error> {
    COMPILES.fetch_add(1, Ordering::Relaxed);
    let cache = CompileCache::new(cache_dir)?;
    if let Some(hit) = cache.lookup(mlir, target, opts)? {
        if dump_mlir {
            dump(what, &hit.path, mlir, target, opts);
        }
        tracing::info!("{what}: {}", CompileReport::CacheHit);
        return Ok((hit.vmfb, CompileReport::CacheHit));
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
    Ok((out.vmfb, report))
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
