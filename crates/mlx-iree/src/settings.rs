//! The behaviour settings of every subcommand that takes `--model`: each one a flag, with
//! its environment variable as the fallback when the flag is not given (README, "Settings
//! and environment variables"). A bad value, from either, is one error line (exit status 2).

use anyhow::{Result, bail};
use engine::KernelSetting;
use std::path::{Path, PathBuf};

/// The settings' flags (flattened into [`crate::run::ModelArgs`]).
#[derive(clap::Args, Debug, Clone, Default)]
pub struct Settings {
    /// Which hand-written kernels run (packed and, on a CPU, f16 and bf16 matrices, with
    /// decode attention): 0 (none: the graph form and IREE's own code, on CUDA too), amx,
    /// avx512, avx2 or neondot (that instruction set's; an error where it cannot run), auto
    /// (the fastest this CPU runs). Default: $MLX_IREE_KERNELS, else auto.
    #[arg(long, value_name = "SETTING", value_parser = parse_kernels)]
    pub kernels: Option<KernelSetting>,
    /// The compile cache folder. Default: $MLX_IREE_CACHE_DIR, else
    /// $XDG_CACHE_HOME/mlx-iree or ~/.cache/mlx-iree.
    #[arg(long, value_name = "DIR")]
    pub cache_dir: Option<PathBuf>,
    /// Most gigabytes the compile cache keeps, least recently used modules removed first (0:
    /// no limit). Default: $MLX_IREE_CACHE_MAX_GB, else 32.
    #[arg(long, value_name = "GB", value_parser = parse_cache_max_gb)]
    pub cache_max_gb: Option<CacheLimit>,
    /// 1: store the weights of a CPU module in final form in the cache on its first load and
    /// map them on every later one; 0: bind the checkpoint's weights at every load (IREE
    /// repacks them in memory). Default: $MLX_IREE_STORE_PARAMETERS, else 1.
    #[arg(long, value_name = "0|1", value_parser = parse_store_parameters)]
    pub store_parameters: Option<bool>,
    /// Write each compiled module's input MLIR (first line: the flags) next to its cache
    /// entry. Default: on when $MLX_IREE_DUMP_MLIR is set.
    #[arg(long)]
    pub dump_mlir: bool,
    /// Never touch the network: a hub `--model` must be complete in the Hugging Face cache.
    /// Default: $HF_HUB_OFFLINE.
    #[arg(long)]
    pub offline: bool,
}

/// `--cache-max-gb`: bytes, `None` for no limit.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CacheLimit(pub Option<u64>);

const KERNELS: &str = "MLX_IREE_KERNELS";
/// `MLX_IREE_KERNELS`'s name until it switched more than packed kernels: read, with a
/// warning, for one release.
const KERNELS_OLD: &str = "MLX_IREE_PACKED_KERNELS";
const CACHE_MAX_GB: &str = "MLX_IREE_CACHE_MAX_GB";
const STORE_PARAMETERS: &str = "MLX_IREE_STORE_PARAMETERS";
const DUMP_MLIR: &str = "MLX_IREE_DUMP_MLIR";

impl Settings {
    /// `--kernels`, else `MLX_IREE_KERNELS`, else the deprecated `MLX_IREE_PACKED_KERNELS`
    /// (with a warning line), else auto.
    pub fn kernels(&self) -> Result<KernelSetting> {
        if let Some(kernels) = self.kernels {
            return Ok(kernels);
        }
        for var in [KERNELS, KERNELS_OLD] {
            let Some(value) = env(var)? else { continue };
            let kernels = match kernels_value(&value) {
                Ok(kernels) => kernels,
                Err(expected) => bail!("{var}={value} ({expected})"),
            };
            if var == KERNELS_OLD {
                static WARNED: std::sync::Once = std::sync::Once::new();
                WARNED.call_once(|| {
                    eprintln!(
                        "mlx-iree: warning: {KERNELS_OLD} is deprecated and goes in the next release: use --kernels or {KERNELS} (the same values)"
                    );
                });
            }
            return Ok(kernels);
        }
        Ok(KernelSetting::Auto)
    }

    /// `--cache-dir`, else `MLX_IREE_CACHE_DIR`, else the usual folder.
    pub fn cache_dir(&self) -> PathBuf {
        cache_dir(self.cache_dir.as_deref())
    }

    /// `--cache-max-gb`, else `MLX_IREE_CACHE_MAX_GB`, else the engine's default.
    pub fn cache_max_bytes(&self) -> Result<Option<u64>> {
        if let Some(CacheLimit(bytes)) = self.cache_max_gb {
            return Ok(bytes);
        }
        match env(CACHE_MAX_GB)? {
            None => Ok(Some(engine::cache::DEFAULT_CACHE_MAX_BYTES)),
            Some(v) => match cache_max_gb_value(&v) {
                Ok(bytes) => Ok(bytes),
                Err(expected) => bail!("{CACHE_MAX_GB}: {expected}, got `{v}`"),
            },
        }
    }

    /// `--store-parameters`, else `MLX_IREE_STORE_PARAMETERS`, else on.
    pub fn store_parameters(&self) -> Result<bool> {
        if let Some(store) = self.store_parameters {
            return Ok(store);
        }
        match env(STORE_PARAMETERS)? {
            None => Ok(true),
            Some(v) => match store_parameters_value(&v) {
                Ok(store) => Ok(store),
                Err(expected) => bail!("{STORE_PARAMETERS}: {expected}, got `{v}`"),
            },
        }
    }

    /// `--dump-mlir`, else whether `MLX_IREE_DUMP_MLIR` is set.
    pub fn dump_mlir(&self) -> bool {
        self.dump_mlir || std::env::var_os(DUMP_MLIR).is_some()
    }
}

/// The compile cache folder: `flag`, else `MLX_IREE_CACHE_DIR`, else
/// `$XDG_CACHE_HOME/mlx-iree`, else `~/.cache/mlx-iree` (the libraries take it as a value).
pub fn cache_dir(flag: Option<&Path>) -> PathBuf {
    match flag {
        Some(dir) => dir.to_path_buf(),
        None => engine::cache::default_dir(|name| std::env::var_os(name)),
    }
}

/// A variable's value, `None` when unset; one that is not UTF-8 is an error naming it.
fn env(var: &str) -> Result<Option<String>> {
    match std::env::var(var) {
        Ok(v) => Ok(Some(v)),
        Err(std::env::VarError::NotPresent) => Ok(None),
        Err(e) => bail!("{var}: {e}"),
    }
}

/// A kernel setting, or what was expected.
fn kernels_value(value: &str) -> Result<KernelSetting, String> {
    match value {
        "" | "auto" | "1" => Ok(KernelSetting::Auto),
        "0" => Ok(KernelSetting::Off),
        isa => isa.parse().map(KernelSetting::Force).map_err(|_| {
            let names: Vec<&str> = engine::Isa::ALL.iter().map(|isa| isa.name()).collect();
            format!("expected 0, {} or auto", names.join(", "))
        }),
    }
}

fn parse_kernels(value: &str) -> Result<KernelSetting, String> {
    kernels_value(value)
}

/// Gigabytes (10^9 bytes) as bytes, `None` for 0 (no limit), or what was expected.
fn cache_max_gb_value(value: &str) -> Result<Option<u64>, String> {
    match value.trim().parse::<f64>() {
        Ok(0.0) => Ok(None),
        Ok(gb) if gb.is_finite() && gb > 0.0 => Ok(Some((gb * 1e9) as u64)),
        _ => Err("expected a number of gigabytes (0 for no limit)".to_owned()),
    }
}

fn parse_cache_max_gb(value: &str) -> Result<CacheLimit, String> {
    cache_max_gb_value(value).map(CacheLimit)
}

fn store_parameters_value(value: &str) -> Result<bool, String> {
    match value {
        "1" => Ok(true),
        "0" => Ok(false),
        _ => Err("expected 0 or 1".to_owned()),
    }
}

fn parse_store_parameters(value: &str) -> Result<bool, String> {
    store_parameters_value(value)
}

#[cfg(test)]
#[allow(clippy::unwrap_used)] // a test that cannot unwrap has failed
mod tests {
    use super::*;

    #[test]
    fn values_parse_or_say_what_was_expected() {
        assert_eq!(kernels_value("auto"), Ok(KernelSetting::Auto));
        assert_eq!(kernels_value("0"), Ok(KernelSetting::Off));
        assert_eq!(kernels_value("avx2"), Ok(KernelSetting::Force(engine::Isa::Avx2)));
        assert_eq!(kernels_value("sse2"), Err("expected 0, amx, avx512, avx2, neondot or auto".to_owned()));
        assert_eq!(cache_max_gb_value("0"), Ok(None));
        assert_eq!(cache_max_gb_value("1.5"), Ok(Some(1_500_000_000)));
        assert!(cache_max_gb_value("-1").is_err() && cache_max_gb_value("inf").is_err());
        assert_eq!((store_parameters_value("0"), store_parameters_value("1")), (Ok(false), Ok(true)));
        assert_eq!(store_parameters_value("yes"), Err("expected 0 or 1".to_owned()));
    }

    /// A flag is taken as given, without looking at the environment (whose variables the
    /// binary's tests in tests/cli.rs set).
    #[test]
    fn flags_win() {
        let settings = Settings {
            kernels: Some(KernelSetting::Off),
            cache_dir: Some(PathBuf::from("/c")),
            cache_max_gb: Some(CacheLimit(None)),
            store_parameters: Some(false),
            dump_mlir: true,
            offline: true,
        };
        assert_eq!(settings.kernels().unwrap(), KernelSetting::Off);
        assert_eq!(settings.cache_dir(), PathBuf::from("/c"));
        assert_eq!(settings.cache_max_bytes().unwrap(), None);
        assert!(!settings.store_parameters().unwrap());
        assert!(settings.dump_mlir());
    }
}
