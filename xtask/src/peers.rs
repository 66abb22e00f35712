//! `cargo xtask bench --peers`: the other engines on the same weights and prompt.
//!
//! - llama.cpp's CPU build through PyPI `llama-cpp-python`, compiled once from its pinned
//!   sdist (sha256-checked) into the venv `target/peers-venv` (about 14 minutes on 2 cores;
//!   a stamp makes reruns reuse it; the pip log is `target/peers/llama-cpp-python-build.log`).
//! - Each model's float folder converted to GGUF f16 (xtask/python/peers.py, a torch-free
//!   port of llama.cpp's converter for Llama checkpoints), then quantized to Q8_0 and Q4_0
//!   with llama.cpp's `llama_model_quantize`, cached under `target/peers/<model>/`.
//! - mlx-lm (the accuracy oracle, single-threaded on Linux CPU) at f32 on SmolLM2 only.
//! - The machine's memory read bandwidth, measured in the same run (numpy, one thread per
//!   CPU), which bounds decode: bandwidth / weight bytes read per token.

use crate::fixtures;
use crate::util::{self, progress};
use anyhow::{Context, Result, bail};
use serde::Deserialize;
use std::io::{Read, Seek, SeekFrom};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

const STAGE: &str = "bench peers";
/// The llama.cpp weight formats measured per model, as the row precisions.
pub const LLAMA_CPP_TYPES: [&str; 3] = ["f16", "q8_0", "q4_0"];
/// mlx-lm decodes about one token a second here: its row gets one repeat of at most
/// this many decode steps (the prompt is the same as everyone's).
pub const MLX_LM_MAX_STEPS: usize = 16;

/// `[peers]` of third_party/pins.toml.
#[derive(Debug, Deserialize, PartialEq)]
#[serde(rename_all = "kebab-case")]
pub struct PeerPins {
    /// pip requirement of the one package built from source, `name==version`.
    pub llama_cpp_python: String,
    pub sdist_sha256: String,
    pub cmake_args: String,
    /// Appended to `cmake_args` when building on x86_64.
    #[serde(rename = "cmake-args-x86_64")]
    pub cmake_args_x86_64: String,
    /// Everything else the peers venv holds (pure Python or wheels).
    pub python_packages: Vec<String>,
}

#[derive(Deserialize)]
struct PinsFile {
    peers: PeerPins,
}

impl PeerPins {
    pub fn load() -> Result<PeerPins> {
        let path = util::root().join("third_party/pins.toml");
        let text = std::fs::read_to_string(&path).with_context(|| format!("reading {}", path.display()))?;
        Self::parse(&text).with_context(|| format!("parsing [peers] of {}", path.display()))
    }

    fn parse(text: &str) -> Result<PeerPins> {
        Ok(toml::from_str::<PinsFile>(text)?.peers)
    }

    /// `CMAKE_ARGS` of the build on this machine's architecture.
    pub fn cmake_args(&self) -> String {
        self.cmake_args_for(cfg!(target_arch = "x86_64"))
    }

    fn cmake_args_for(&self, x86_64: bool) -> String {
        match x86_64 {
            true => format!("{} {}", self.cmake_args, self.cmake_args_x86_64),
            false => self.cmake_args.clone(),
        }
    }

    /// What the venv's stamp holds: a change of any pin or flag rebuilds.
    pub fn stamp(&self) -> String {
        format!(
            "{} sha256 {}\nCMAKE_ARGS={}\n{}\n",
            self.llama_cpp_python,
            self.sdist_sha256,
            self.cmake_args(),
            self.python_packages.join("\n")
        )
    }
}

pub fn venv_dir() -> PathBuf {
    util::target_dir().join("peers-venv")
}

fn peers_dir() -> PathBuf {
    util::target_dir().join("peers")
}

/// The peers venv with llama-cpp-python built from source, made once.
pub fn venv() -> Result<PathBuf> {
    let pins = PeerPins::load()?;
    let venv = venv_dir();
    let stamp = venv.join(".mlx-iree-stamp");
    let python = venv.join("bin/python");
    if util::stamp_matches(&stamp, &pins.stamp()) && python.exists() {
        progress(STAGE, format!("llama-cpp-python: present at {}", venv.display()));
        return Ok(venv);
    }
    if !python.exists() {
        progress(STAGE, format!("creating Python venv at {}", venv.display()));
        util::run(Command::new("python3").args(["-m", "venv"]).arg(&venv))
            .context("python3 -m venv failed (Debian: apt-get install python3-venv)")?;
    }
    let sdist = fetch_sdist(&python, &pins)?;
    // A build made with other flags: pip would keep it (same version).
    let _ = Command::new(&python)
        .args(["-m", "pip", "uninstall", "--disable-pip-version-check", "-y", "-q", "llama-cpp-python"])
        .status();
    let log = peers_dir().join("llama-cpp-python-build.log");
    let jobs = std::thread::available_parallelism().map_or(2, |n| n.get()).to_string();
    progress(
        STAGE,
        format!(
            "building {} from source (CPU only, {jobs} jobs: about 14 minutes on 2 cores; log {})",
            pins.llama_cpp_python,
            log.display()
        ),
    );
    let mut pip = Command::new(&python);
    pip.args(["-m", "pip", "install", "--disable-pip-version-check", "--progress-bar", "off", "--no-cache-dir", "-v"])
        .args(["--no-binary", "llama-cpp-python"])
        .arg(&sdist)
        .args(&pins.python_packages)
        .env("CMAKE_ARGS", pins.cmake_args())
        .env("CMAKE_BUILD_PARALLEL_LEVEL", &jobs)
        .env("MAKEFLAGS", format!("-j{jobs}"));
    let started = Instant::now();
    run_logged(&mut pip, &log)?;
    progress(STAGE, format!("llama-cpp-python built in {:.0} s", started.elapsed().as_secs_f64()));
    util::run(Command::new(&python).args(["-c", "import llama_cpp, gguf, numpy; llama_cpp.llama_backend_init()"]))
        .with_context(|| format!("the peers venv at {} is broken", venv.display()))?;
    util::write_stamp(&stamp, &pins.stamp())?;
    Ok(venv)
}

/// The pinned sdist, downloaded once and checked against its sha256.
fn fetch_sdist(python: &Path, pins: &PeerPins) -> Result<PathBuf> {
    let dir = peers_dir().join("sdist");
    let (name, version) = pins
        .llama_cpp_python
        .split_once("==")
        .with_context(|| format!("llama-cpp-python pin `{}` is not name==version", pins.llama_cpp_python))?;
    let file = dir.join(format!("{}-{version}.tar.gz", name.replace('-', "_")));
    if !file.exists() {
        progress(STAGE, format!("downloading the {} sdist from PyPI (77 MB)", pins.llama_cpp_python));
        std::fs::create_dir_all(&dir)?;
        util::run(
            Command::new(python)
                .args(["-m", "pip", "download", "--disable-pip-version-check", "--progress-bar", "off"])
                .args(["--no-deps", "--no-binary", name, "--dest"])
                .arg(&dir)
                .arg(&pins.llama_cpp_python),
        )?;
    }
    let bytes = std::fs::read(&file).with_context(|| format!("reading {} (pip download's result)", file.display()))?;
    let got = util::sha256_hex(&bytes);
    if got != pins.sdist_sha256 {
        bail!("checksum mismatch for {}: expected {}, got {got}", file.display(), pins.sdist_sha256);
    }
    Ok(file)
}

/// Runs `cmd` with stdout and stderr into `log`, printing a progress line whenever the
/// build's ninja counter (`[n/N]`) has moved by a tenth.
fn run_logged(cmd: &mut Command, log: &Path) -> Result<()> {
    if let Some(dir) = log.parent() {
        std::fs::create_dir_all(dir)?;
    }
    let out = std::fs::File::create(log).with_context(|| format!("creating {}", log.display()))?;
    let shown = util::show(cmd);
    let mut child = cmd
        .stdout(Stdio::from(out.try_clone()?))
        .stderr(Stdio::from(out))
        .spawn()
        .with_context(|| format!("could not start `{shown}`"))?;
    let started = Instant::now();
    let mut reader = std::fs::File::open(log)?;
    let mut offset = 0u64;
    let mut carry = String::new();
    let mut reported = 0u32;
    let status = loop {
        let done = child.try_wait()?;
        reader.seek(SeekFrom::Start(offset))?;
        let mut chunk = Vec::new();
        offset += reader.read_to_end(&mut chunk)? as u64;
        carry.push_str(&String::from_utf8_lossy(&chunk));
        let cut = carry.rfind('\n').map_or(0, |i| i + 1);
        if let Some((n, total)) = last_ninja_progress(&carry[..cut])
            && n * 10 / total > reported
        {
            reported = n * 10 / total;
            progress(STAGE, format!("compiling llama.cpp: {n}/{total} ({:.0} s)", started.elapsed().as_secs_f64()));
        }
        carry.drain(..cut);
        if let Some(status) = done {
            break status;
        }
        std::thread::sleep(Duration::from_secs(3));
    };
    if !status.success() {
        let text = std::fs::read_to_string(log).unwrap_or_default();
        let tail: Vec<&str> = text.lines().rev().take(25).collect();
        let tail: Vec<&str> = tail.into_iter().rev().collect();
        bail!("`{shown}` failed ({status}); the end of {}:\n{}", log.display(), tail.join("\n"));
    }
    Ok(())
}

/// The last `[n/N]` ninja progress counter in build output.
pub fn last_ninja_progress(text: &str) -> Option<(u32, u32)> {
    text.lines().rev().find_map(|line| {
        let rest = line.trim_start().strip_prefix('[')?;
        let (counter, _) = rest.split_once(']')?;
        let (n, total) = counter.split_once('/')?;
        let (n, total) = (n.parse().ok()?, total.parse().ok()?);
        (total > 0 && n <= total).then_some((n, total))
    })
}

/// `target/peers/<family>/<family>-{f16,q8_0,q4_0}.gguf` from the float model folder
/// `src`, made unless their stamp says the same source and scripts made them.
pub fn ggufs(venv: &Path, family: &str, src: &Path) -> Result<()> {
    let pins = PeerPins::load()?;
    let dest = peers_dir().join(family);
    let source_stamp = std::fs::read_to_string(src.join(".xtask-stamp")).unwrap_or_else(|_| listing(src));
    let stamp = format!(
        "source: {}\n{source_stamp}\npeers.py: {}\n{}",
        src.display(),
        fixtures::script_digest("peers.py")?,
        pins.stamp()
    );
    let file = |dir: &Path, t: &str| dir.join(gguf_name(family, t));
    crate::model::step(STAGE, &dest, &stamp, |partial| {
        std::fs::create_dir_all(partial)?;
        let f16 = file(partial, "f16");
        progress(STAGE, format!("converting {} to GGUF f16", src.display()));
        util::run(fixtures::python(venv, "peers.py").arg("convert").arg("--src").arg(src).arg("--out").arg(&f16))?;
        for t in &LLAMA_CPP_TYPES[1..] {
            progress(STAGE, format!("quantizing to {t} with llama_model_quantize"));
            util::run(
                fixtures::python(venv, "peers.py")
                    .args(["quantize", "--type", t, "--src"])
                    .arg(&f16)
                    .arg("--out")
                    .arg(file(partial, t)),
            )?;
        }
        Ok(())
    })
}

fn gguf_name(family: &str, t: &str) -> String {
    format!("{family}-{t}.gguf")
}

/// Where `ggufs` put a family's file of llama.cpp type `t`.
pub fn gguf_path(family: &str, t: &str) -> PathBuf {
    peers_dir().join(family).join(gguf_name(family, t))
}

/// Names, sizes and modification times of a folder's files: the stamp of a source folder
/// that xtask did not make.
fn listing(dir: &Path) -> String {
    let mut entries: Vec<String> = std::fs::read_dir(dir)
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| {
            let m = e.metadata().ok()?;
            let modified = m.modified().ok()?.duration_since(std::time::UNIX_EPOCH).ok()?.as_secs();
            Some(format!("{} {} {modified}", e.file_name().to_string_lossy(), m.len()))
        })
        .collect();
    entries.sort();
    entries.join("\n")
}

/// The vocabulary size in a model folder's config.json.
pub fn vocab_size(model: &Path) -> Result<usize> {
    let path = model.join("config.json");
    let text = std::fs::read_to_string(&path).with_context(|| format!("reading {}", path.display()))?;
    let v: serde_json::Value = serde_json::from_str(&text).with_context(|| format!("parsing {}", path.display()))?;
    let n = v["vocab_size"].as_u64().with_context(|| format!("{}: no vocab_size", path.display()))?;
    Ok(n as usize)
}

/// The prompt `mlx-iree bench` feeds (crates/mlx-iree/src/bench.rs `prompt_ids`, copied
/// because xtask links no workspace crate): ids cycling with a stride through
/// `[1, min(vocab, 1000))`.
pub fn prompt_ids(len: usize, vocab: usize) -> Vec<u32> {
    let span = vocab.clamp(2, 1000) - 1;
    (0..len).map(|i| (1 + (i * 37) % span) as u32).collect()
}

pub fn ids_arg(ids: &[u32]) -> String {
    ids.iter().map(u32::to_string).collect::<Vec<_>>().join(",")
}

/// The machine's memory read bandwidth in bytes per second, measured now.
pub fn bandwidth(venv: &Path) -> Result<f64> {
    let mut cmd = fixtures::python(venv, "peers.py");
    cmd.arg("bandwidth");
    let shown = util::show(&cmd);
    let out = util::output(&mut cmd).with_context(|| format!("`{shown}` failed"))?;
    parse_bandwidth(&out).with_context(|| format!("`{shown}` printed {out:?}"))
}

pub fn parse_bandwidth(stdout: &str) -> Result<f64> {
    let line = stdout.lines().rfind(|l| l.trim_start().starts_with('{')).context("no JSON line")?;
    let v: serde_json::Value = serde_json::from_str(line)?;
    let b = v["bandwidth_bytes_s"].as_f64().context("no bandwidth_bytes_s")?;
    if !(b.is_finite() && b > 0.0) {
        bail!("bandwidth {b} is not a positive number");
    }
    Ok(b)
}

/// `peers.py bench` of one GGUF.
pub fn llama_cpp_command(
    venv: &Path,
    gguf: &Path,
    precision: &str,
    ids: &[u32],
    steps: usize,
    repeats: usize,
) -> Command {
    let mut cmd = fixtures::python(venv, "peers.py");
    cmd.args(["bench", "--precision", precision, "--gguf"]).arg(gguf).args(["--prompt-ids", &ids_arg(ids)]).args([
        "--steps",
        &steps.to_string(),
        "--repeats",
        &repeats.to_string(),
    ]);
    cmd
}

/// `mlx_lm_bench.py` of one MLX folder in the mlx venv.
pub fn mlx_lm_command(mlx_venv: &Path, model: &Path, ids: &[u32], steps: usize) -> Command {
    let mut cmd = fixtures::python(mlx_venv, "mlx_lm_bench.py");
    cmd.arg("--model").arg(model).args(["--prompt-ids", &ids_arg(ids)]).args([
        "--steps",
        &steps.min(MLX_LM_MAX_STEPS).to_string(),
        "--repeats",
        "1",
    ]);
    cmd
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_pins_file_has_a_peers_section() {
        let text = std::fs::read_to_string(util::root().join("third_party/pins.toml")).unwrap();
        let p = PeerPins::parse(&text).unwrap();
        assert!(p.llama_cpp_python.starts_with("llama-cpp-python=="), "{p:?}");
        assert_eq!(p.sdist_sha256.len(), 64);
        assert!(p.cmake_args.contains("-DGGML_NATIVE=ON") && !p.cmake_args.contains("CUDA=ON"));
        assert_eq!(p.cmake_args_for(false), p.cmake_args);
        assert!(p.cmake_args_for(true).starts_with(&format!("{} -D", p.cmake_args)));
        assert!(p.cmake_args_for(true).contains("-mno-amx-int8"));
        let stamp = p.stamp();
        assert!(stamp.starts_with(&format!("{} sha256 {}\nCMAKE_ARGS=", p.llama_cpp_python, p.sdist_sha256)));
        assert!(p.python_packages.iter().all(|r| stamp.contains(r.as_str())));
    }

    #[test]
    fn ninja_progress_is_the_last_counter() {
        let log = "Building wheel\n  [1/140] Building C object a.o\nwarning: x [-Wfoo]\n  [37/140] Building CXX \
                   object b.o\nIn file included from [x]\n[ 5%] not ninja\n";
        assert_eq!(last_ninja_progress(log), Some((37, 140)));
        assert_eq!(last_ninja_progress("[140/140] Linking\n"), Some((140, 140)));
        assert_eq!(last_ninja_progress("no counter\n[0/0] odd\n[9/3] odd\n"), None);
    }

    #[test]
    fn prompt_matches_mlx_iree_bench() {
        // The values crates/mlx-iree/src/bench.rs's own test pins.
        assert_eq!(prompt_ids(5, 49152), vec![1, 38, 75, 112, 149]);
        assert_eq!(prompt_ids(3, 1), vec![1, 1, 1]);
        assert!(prompt_ids(128, 256).iter().all(|&i| (1..256).contains(&i)));
        assert_eq!(ids_arg(&prompt_ids(3, 49152)), "1,38,75");
    }

    #[test]
    fn bandwidth_line() {
        let b = parse_bandwidth("{\"bandwidth_bytes_s\": 2.5e10, \"threads\": 2}\n").unwrap();
        assert!((b - 2.5e10).abs() < 1.0);
        assert!(parse_bandwidth("{\"bandwidth_bytes_s\": 0}\n").is_err());
        assert!(parse_bandwidth("nothing\n").is_err());
    }

    #[test]
    fn mlx_lm_runs_one_short_repeat() {
        let cmd = mlx_lm_command(Path::new("/v"), Path::new("/m"), &[1, 38], 128);
        let args: Vec<String> = cmd.get_args().map(|a| a.to_string_lossy().into_owned()).collect();
        assert_eq!(args[1..], ["--model", "/m", "--prompt-ids", "1,38", "--steps", "16", "--repeats", "1"]);
    }
}
