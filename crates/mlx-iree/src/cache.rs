//! Where compiled modules are cached, and compiling through that cache with progress lines.

use anyhow::{Context, Result};
use iree_compiler::{CacheOutcome, CompileCache, CompileOptions, Compiler, Target};
use std::path::PathBuf;

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

/// Compiles `mlir` for `target`, printing what happens (a user must never stare at a
/// silent terminal while IREE works) to stderr so stdout stays the program's output.
pub fn compile(what: &str, mlir: &str, target: &Target, opts: &CompileOptions) -> Result<Vec<u8>> {
    let compiler = Compiler::new().context("loading the IREE compiler")?;
    let cache = CompileCache::new(dir()).with_context(|| format!("opening the compile cache {}", dir().display()))?;
    let key = cache.key(&compiler, mlir, target, opts);
    if !cache.path_for(&key).exists() {
        eprintln!("compiling {what} for {target} (first run; later runs use the cache)...");
    }
    let out = cache.compile(&compiler, mlir, target, opts).with_context(|| format!("compiling {what} for {target}"))?;
    match out.outcome {
        CacheOutcome::Hit => eprintln!("{what}: compile cache hit ({})", out.path.display()),
        CacheOutcome::Miss => eprintln!("{what}: compiled in {:.2} s", out.elapsed.as_secs_f64()),
    }
    Ok(out.vmfb)
}
