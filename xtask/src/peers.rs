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
    let _ = std::fs::remove_file(&log);
    run_logged(&mut pip, &log, "compiling llama.cpp")?;
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

/// llama.cpp's own tools, built from the source vendored in the pinned sdist.
pub const TOOLS: [&str; 3] = ["llama-bench", "llama-batched-bench", "llama-server"];

/// CMake flags of the tools build beyond the pins' `cmake-args`: a static Release build of
/// only what the three tools need, and nothing that reaches the network at build time
/// (no libcurl, no OpenSSL, no web UI: llama-server's UI would be fetched or built with npm).
pub const TOOLS_CMAKE_ARGS: [&str; 11] = [
    "-DCMAKE_BUILD_TYPE=Release",
    "-DBUILD_SHARED_LIBS=OFF",
    "-DGGML_CCACHE=OFF",
    "-DLLAMA_CURL=OFF",
    "-DLLAMA_OPENSSL=OFF",
    "-DLLAMA_BUILD_UI=OFF",
    "-DLLAMA_USE_PREBUILT_UI=OFF",
    "-DLLAMA_BUILD_TESTS=OFF",
    "-DLLAMA_BUILD_EXAMPLES=OFF",
    "-DLLAMA_BUILD_APP=OFF",
    "-DCMAKE_POLICY_VERSION_MINIMUM=3.5",
];

impl PeerPins {
    /// The sdist's version (`0.3.36` of `llama-cpp-python==0.3.36`).
    pub fn version(&self) -> Result<&str> {
        let (_, version) = self
            .llama_cpp_python
            .split_once("==")
            .with_context(|| format!("llama-cpp-python pin `{}` is not name==version", self.llama_cpp_python))?;
        Ok(version)
    }

    /// Every CMake argument of the tools build: the pins' flags (split as a shell would),
    /// then `TOOLS_CMAKE_ARGS`.
    pub fn tools_cmake_args(&self) -> Result<Vec<String>> {
        let mut args = split_shell_words(&self.cmake_args())?;
        args.extend(TOOLS_CMAKE_ARGS.iter().map(|a| (*a).to_owned()));
        Ok(args)
    }

    /// What the tools build's stamp holds: a change of the sdist, a flag or a target rebuilds.
    pub fn tools_stamp(&self) -> Result<String> {
        Ok(format!(
            "{} sha256 {}\nsource: vendor/llama.cpp\ncmake: {}\ntargets: {}\n",
            self.llama_cpp_python,
            self.sdist_sha256,
            self.tools_cmake_args()?.join(" "),
            TOOLS.join(" ")
        ))
    }
}

/// `target/peers/llama.cpp-<sdist version>`: the vendored source (`src/`), the build
/// (`build/`, binaries in `build/bin/`) and the stamp.
pub fn tools_dir() -> Result<PathBuf> {
    Ok(peers_dir().join(format!("llama.cpp-{}", PeerPins::load()?.version()?)))
}

/// Where `tools` puts the binaries.
pub fn tools_bin() -> Result<PathBuf> {
    Ok(tools_dir()?.join("build/bin"))
}

/// llama.cpp's `llama-bench`, `llama-batched-bench` and `llama-server`, built once (about
/// 20 minutes on 2 cores) from the llama.cpp vendored in the pinned sdist with the pins' CMake
/// flags, with cmake and ninja from the project venv (`cargo xtask setup`) or else the
/// system; the log is `target/peers/llama.cpp-build.log`. Returns the folder of the binaries.
pub fn tools() -> Result<PathBuf> {
    let pins = PeerPins::load()?;
    let dir = tools_dir()?;
    let bin = dir.join("build/bin");
    let stamp_path = dir.join(".mlx-iree-stamp");
    let stamp = pins.tools_stamp()?;
    if util::stamp_matches(&stamp_path, &stamp) && TOOLS.iter().all(|t| bin.join(t).exists()) {
        progress(STAGE, format!("llama.cpp tools: present at {}", bin.display()));
        return Ok(bin);
    }
    let venv_bin = util::target_dir().join("venv/bin");
    let from_venv = |tool: &str| {
        let p = venv_bin.join(tool);
        if p.exists() { p.into_os_string() } else { tool.into() }
    };
    let python = venv_bin.join("python");
    let python = if python.exists() { python } else { PathBuf::from("python3") };
    let sdist = fetch_sdist(&python, &pins)?;
    let src = dir.join("src");
    unpack_vendored(&sdist, &pins, &src)?;
    let log = peers_dir().join("llama.cpp-build.log");
    std::fs::create_dir_all(&dir)?;
    // A stale stamp must not survive a failed rebuild.
    let _ = std::fs::remove_file(&stamp_path);
    std::fs::File::create(&log).with_context(|| format!("creating {}", log.display()))?;
    let ninja = from_venv("ninja");
    let build = dir.join("build");
    let mut configure = Command::new(from_venv("cmake"));
    configure
        .args(["-G", "Ninja"])
        .arg(format!("-DCMAKE_MAKE_PROGRAM={}", Path::new(&ninja).display()))
        .arg("-S")
        .arg(&src)
        .arg("-B")
        .arg(&build)
        .args(pins.tools_cmake_args()?);
    progress(STAGE, format!("configuring llama.cpp's tools (log {})", log.display()));
    run_logged(&mut configure, &log, "configuring llama.cpp")?;
    let jobs = std::thread::available_parallelism().map_or(2, |n| n.get()).to_string();
    progress(
        STAGE,
        format!("building {} ({jobs} jobs: about 20 minutes on 2 cores; log {})", TOOLS.join(", "), log.display()),
    );
    let started = Instant::now();
    let mut ninja_cmd = Command::new(&ninja);
    ninja_cmd.arg("-C").arg(&build).args(["-j", &jobs]).args(TOOLS);
    run_logged(&mut ninja_cmd, &log, "compiling llama.cpp's tools")?;
    for t in TOOLS {
        util::run(Command::new(bin.join(t)).arg("--help").stdout(Stdio::null()).stderr(Stdio::null()))
            .with_context(|| format!("{} does not run", bin.join(t).display()))?;
    }
    progress(STAGE, format!("llama.cpp tools built in {:.0} s", started.elapsed().as_secs_f64()));
    util::write_stamp(&stamp_path, &stamp)?;
    Ok(bin)
}

/// `vendor/llama.cpp` of the sdist unpacked into `src`, unless a marker there says this
/// sdist already was.
fn unpack_vendored(sdist: &Path, pins: &PeerPins, src: &Path) -> Result<()> {
    let marker = src.join(".mlx-iree-sdist");
    let want = format!("{}\n", pins.sdist_sha256);
    if util::stamp_matches(&marker, &want) {
        return Ok(());
    }
    let top = format!("llama_cpp_python-{}/vendor/llama.cpp", pins.version()?);
    progress(STAGE, format!("unpacking {top} from {}", sdist.display()));
    let partial = src.with_file_name("src.partial");
    for stale in [&partial, &src.to_path_buf()] {
        if stale.exists() {
            std::fs::remove_dir_all(stale).with_context(|| format!("removing {}", stale.display()))?;
        }
    }
    std::fs::create_dir_all(&partial)?;
    util::run(
        Command::new("tar").arg("xzf").arg(sdist).arg("-C").arg(&partial).args(["--strip-components", "3"]).arg(&top),
    )?;
    if !partial.join("CMakeLists.txt").exists() {
        bail!("{} holds no {top}/CMakeLists.txt", sdist.display());
    }
    util::write_stamp(&partial.join(".mlx-iree-sdist"), &want)?;
    std::fs::rename(&partial, src).with_context(|| format!("renaming {} to {}", partial.display(), src.display()))
}

/// Splits a command-line fragment as a POSIX shell would, for the quoting `cmake-args`
/// uses: whitespace separates words, single and double quotes group, backslash escapes.
pub fn split_shell_words(s: &str) -> Result<Vec<String>> {
    let mut words = Vec::new();
    let mut word: Option<String> = None;
    let mut chars = s.chars();
    while let Some(c) = chars.next() {
        match c {
            c if c.is_whitespace() => words.extend(word.take()),
            '\'' => {
                let w = word.get_or_insert_with(String::new);
                loop {
                    match chars.next() {
                        Some('\'') => break,
                        Some(c) => w.push(c),
                        None => bail!("unterminated ' in `{s}`"),
                    }
                }
            }
            '"' => {
                let w = word.get_or_insert_with(String::new);
                loop {
                    match chars.next() {
                        Some('"') => break,
                        Some('\\') => w.push(chars.next().with_context(|| format!("trailing \\ in `{s}`"))?),
                        Some(c) => w.push(c),
                        None => bail!("unterminated \" in `{s}`"),
                    }
                }
            }
            '\\' => word
                .get_or_insert_with(String::new)
                .push(chars.next().with_context(|| format!("trailing \\ in `{s}`"))?),
            c => word.get_or_insert_with(String::new).push(c),
        }
    }
    words.extend(word);
    Ok(words)
}

/// Runs `cmd` with stdout and stderr appended to `log`, printing a progress line (`what:
/// n/N`) whenever the build's ninja counter (`[n/N]`) has moved by a tenth.
fn run_logged(cmd: &mut Command, log: &Path, what: &str) -> Result<()> {
    if let Some(dir) = log.parent() {
        std::fs::create_dir_all(dir)?;
    }
    let out = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(log)
        .with_context(|| format!("opening {}", log.display()))?;
    // Progress is read from what this command adds to the log.
    let mut offset = out.metadata()?.len();
    let shown = util::show(cmd);
    let mut child = cmd
        .stdout(Stdio::from(out.try_clone()?))
        .stderr(Stdio::from(out))
        .spawn()
        .with_context(|| format!("could not start `{shown}`"))?;
    let started = Instant::now();
    let mut reader = std::fs::File::open(log)?;
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
            progress(STAGE, format!("{what}: {n}/{total} ({:.0} s)", started.elapsed().as_secs_f64()));
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
/// `src`, carrying the tokenizer of the GGUF `vocab` when given, made unless their stamp
/// says the same source and scripts made them.
pub fn ggufs(venv: &Path, family: &str, src: &Path, vocab: Option<&Path>) -> Result<()> {
    let pins = PeerPins::load()?;
    let dest = peers_dir().join(family);
    let source_stamp = std::fs::read_to_string(src.join(".xtask-stamp")).unwrap_or_else(|_| listing(src));
    let stamp = format!(
        "source: {}\n{source_stamp}\nvocab: {}\npeers.py: {}\n{}",
        src.display(),
        vocab.map_or_else(|| "none".to_owned(), |v| v.display().to_string()),
        fixtures::script_digest("peers.py")?,
        pins.stamp()
    );
    let file = |dir: &Path, t: &str| dir.join(gguf_name(family, t));
    crate::model::step(STAGE, &dest, &stamp, |partial| {
        std::fs::create_dir_all(partial)?;
        let f16 = file(partial, "f16");
        progress(STAGE, format!("converting {} to GGUF f16", src.display()));
        let mut convert = fixtures::python(venv, "peers.py");
        convert.arg("convert").arg("--src").arg(src).arg("--out").arg(&f16);
        if let Some(v) = vocab {
            convert.arg("--vocab-gguf").arg(v);
        }
        util::run(&mut convert)?;
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
        "--threads",
        &threads().to_string(),
    ]);
    cmd
}

/// Threads every llama.cpp run gets (`-t`, peers.py's `--threads`): the CPUs this process
/// may use, which is also what mlx-iree's `local-task` uses.
pub fn threads() -> usize {
    std::thread::available_parallelism().map_or(1, |n| n.get())
}

/// `llama-bench` on one GGUF: a prompt of `prompt_len` tokens and `steps` generated
/// tokens (llama-bench's `pp` and `tg` tests; its `tg` starts from an empty context),
/// `repeats` times each, one JSON line per test.
pub fn llama_bench_command(bin: &Path, gguf: &Path, prompt_len: usize, steps: usize, repeats: usize) -> Command {
    let mut cmd = Command::new(bin.join("llama-bench"));
    cmd.arg("-m").arg(gguf).args([
        "-p",
        &prompt_len.to_string(),
        "-n",
        &steps.to_string(),
        "-r",
        &repeats.to_string(),
        "-t",
        &threads().to_string(),
        "-o",
        "jsonl",
    ]);
    cmd
}

/// One test line of `llama-bench -o jsonl` (the fields used; it prints many more).
#[derive(Debug, Clone, PartialEq, Deserialize)]
pub struct LlamaBenchTest {
    pub n_prompt: usize,
    pub n_gen: usize,
    #[serde(default)]
    pub n_depth: usize,
    pub n_threads: usize,
    /// Bytes of the model's tensors (llama_model_size, as peers.py reports).
    pub model_size: u64,
    /// Mean and standard deviation of the repeats' tokens per second.
    pub avg_ts: f64,
    pub stddev_ts: f64,
}

/// llama-bench's prompt (`pp`) and generation (`tg`) tests of one run.
#[derive(Debug, Clone, PartialEq)]
pub struct LlamaBench {
    pub prefill: LlamaBenchTest,
    pub decode: LlamaBenchTest,
}

pub fn parse_llama_bench(stdout: &str) -> Result<LlamaBench> {
    let tests = stdout
        .lines()
        .map(str::trim)
        .filter(|l| l.starts_with('{'))
        .map(|l| serde_json::from_str::<LlamaBenchTest>(l).with_context(|| format!("bad llama-bench line: {l}")))
        .collect::<Result<Vec<_>>>()?;
    let find = |what: &str, f: fn(&LlamaBenchTest) -> bool| {
        tests.iter().find(|t| f(t)).cloned().with_context(|| format!("llama-bench printed no {what} test"))
    };
    Ok(LlamaBench {
        prefill: find("prompt (pp)", |t| t.n_prompt > 0 && t.n_gen == 0)?,
        decode: find("generation (tg)", |t| t.n_gen > 0 && t.n_prompt == 0)?,
    })
}

/// `llama-batched-bench` on one GGUF: for every prompt length in `contexts` and batch in
/// `batches`, that many sequences (distinct sequence ids) each prefilled with that many
/// tokens, then `steps` decode steps each taking one token of every sequence in one
/// `llama_decode`. The context holds the largest combination (the tool silently skips a
/// combination that does not fit).
pub fn batched_bench_command(bin: &Path, gguf: &Path, contexts: &[usize], steps: usize, batches: &[usize]) -> Command {
    let join = |ns: &[usize]| ns.iter().map(usize::to_string).collect::<Vec<_>>().join(",");
    let max = |ns: &[usize]| ns.iter().copied().max().unwrap_or(1);
    let n_ctx = max(batches) * (max(contexts) + steps);
    let t = threads().to_string();
    let mut cmd = Command::new(bin.join("llama-batched-bench"));
    cmd.arg("-m").arg(gguf).args([
        "-c",
        &n_ctx.to_string(),
        "-npp",
        &join(contexts),
        "-ntg",
        &steps.to_string(),
        "-npl",
        &join(batches),
        "-t",
        &t,
        "-tb",
        &t,
        "--output-format",
        "jsonl",
    ]);
    cmd
}

/// One line of `llama-batched-bench --output-format jsonl`: `pl` sequences of `pp` prompt
/// tokens, then `tg` steps; `speed_tg` is the aggregate decode tok/s (its S_TG column).
#[derive(Debug, Clone, PartialEq, Deserialize)]
pub struct BatchedBenchRow {
    pub pp: usize,
    pub tg: usize,
    pub pl: usize,
    pub n_kv: usize,
    pub n_kv_max: usize,
    pub n_threads: usize,
    pub flash_attn: i64,
    pub t_pp: f64,
    pub speed_pp: f64,
    pub t_tg: f64,
    pub speed_tg: f64,
}

/// Every JSON line of a batched-bench run, which must cover each (context, batch), in the
/// tool's order (contexts outer, batches inner).
pub fn parse_batched_bench(stdout: &str, contexts: &[usize], batches: &[usize]) -> Result<Vec<BatchedBenchRow>> {
    let rows = stdout
        .lines()
        .map(str::trim)
        .filter(|l| l.starts_with('{'))
        .map(|l| {
            serde_json::from_str::<BatchedBenchRow>(l).with_context(|| format!("bad llama-batched-bench line: {l}"))
        })
        .collect::<Result<Vec<_>>>()?;
    for &pp in contexts {
        for &pl in batches {
            if !rows.iter().any(|r| (r.pp, r.pl) == (pp, pl)) {
                bail!("llama-batched-bench printed no row for {pl} sequences of {pp} tokens");
            }
        }
    }
    Ok(rows)
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
    fn shell_words_split_as_a_shell_would() {
        assert_eq!(
            split_shell_words("-DA=ON  -DCMAKE_C_FLAGS='-mno-x -mno-y' \"-DB=a b\" c\\ d -DE=\"q\\\"\"").unwrap(),
            ["-DA=ON", "-DCMAKE_C_FLAGS=-mno-x -mno-y", "-DB=a b", "c d", "-DE=q\""]
        );
        assert_eq!(split_shell_words(" ").unwrap(), Vec::<String>::new());
        assert_eq!(split_shell_words("''").unwrap(), [""]);
        assert!(split_shell_words("-DX='open").is_err());
        assert!(split_shell_words("x\\").is_err());
    }

    #[test]
    fn tools_build_with_the_pins_flags_and_no_network() {
        let text = std::fs::read_to_string(util::root().join("third_party/pins.toml")).unwrap();
        let p = PeerPins::parse(&text).unwrap();
        assert_eq!(p.version().unwrap(), p.llama_cpp_python.split_once("==").unwrap().1);
        let args = p.tools_cmake_args().unwrap();
        // The pins' flags first, one word each (the x86_64 quoting undone), then ours.
        assert!(args.iter().any(|a| a == "-DGGML_NATIVE=ON"));
        if cfg!(target_arch = "x86_64") {
            assert!(args.contains(&"-DCMAKE_C_FLAGS=-mno-amx-tile -mno-amx-int8 -mno-amx-bf16".to_owned()), "{args:?}");
        }
        assert_eq!(args[args.len() - TOOLS_CMAKE_ARGS.len()..], TOOLS_CMAKE_ARGS);
        for off in ["-DLLAMA_CURL=OFF", "-DLLAMA_OPENSSL=OFF", "-DLLAMA_USE_PREBUILT_UI=OFF", "-DLLAMA_BUILD_UI=OFF"] {
            assert!(args.iter().any(|a| a == off), "{off}");
        }
        let stamp = p.tools_stamp().unwrap();
        assert!(stamp.starts_with(&format!("{} sha256 {}\n", p.llama_cpp_python, p.sdist_sha256)), "{stamp}");
        assert!(
            stamp.contains(&args.join(" "))
                && stamp.ends_with("targets: llama-bench llama-batched-bench llama-server\n")
        );
    }

    #[test]
    fn llama_bench_and_batched_bench_command_lines() {
        let t = threads().to_string();
        let shown = |c: &Command| {
            let args: Vec<String> = c.get_args().map(|a| a.to_string_lossy().into_owned()).collect();
            (c.get_program().to_string_lossy().into_owned(), args)
        };
        let (prog, args) = shown(&llama_bench_command(Path::new("/b"), Path::new("/g.gguf"), 128, 16, 3));
        assert_eq!(prog, "/b/llama-bench");
        assert_eq!(args, ["-m", "/g.gguf", "-p", "128", "-n", "16", "-r", "3", "-t", &t, "-o", "jsonl"]);
        let (prog, args) =
            shown(&batched_bench_command(Path::new("/b"), Path::new("/g.gguf"), &[100, 2000], 16, &[1, 8]));
        assert_eq!(prog, "/b/llama-batched-bench");
        // The context holds the largest combination: 8 sequences of 2000 + 16 positions.
        assert_eq!(
            args,
            [
                "-m",
                "/g.gguf",
                "-c",
                "16128",
                "-npp",
                "100,2000",
                "-ntg",
                "16",
                "-npl",
                "1,8",
                "-t",
                &t,
                "-tb",
                &t,
                "--output-format",
                "jsonl"
            ]
        );
    }

    /// `llama-bench -m smollm2-135m-instruct-q4_0.gguf -p 128 -n 16 -r 2 -t 2 -o jsonl` as
    /// the tools build printed it (stdout; the machine was loaded, the numbers mean nothing).
    const LLAMA_BENCH_OUT: &str = include_str!("../testdata/llama-bench.jsonl");
    /// `llama-batched-bench -m smollm2-135m-instruct-q4_0.gguf -c 80 -npp 16,32 -ntg 4 -npl 1,2
    /// -t 2 -tb 2 --output-format jsonl` (stdout), likewise.
    const BATCHED_BENCH_OUT: &str = include_str!("../testdata/llama-batched-bench.jsonl");

    #[test]
    fn llama_bench_output_parses() {
        let b = parse_llama_bench(LLAMA_BENCH_OUT).unwrap();
        let t = |x: &LlamaBenchTest| (x.n_prompt, x.n_gen, x.n_depth, x.n_threads, x.model_size, x.avg_ts, x.stddev_ts);
        assert_eq!(t(&b.prefill), (128, 0, 0, 2, 89941248, 41.332917, 1.218822));
        assert_eq!(t(&b.decode), (0, 16, 0, 2, 89941248, 3.947086, 0.964667));
        // The test lines in either order, among other output.
        let lines: Vec<&str> = LLAMA_BENCH_OUT.lines().collect();
        assert_eq!(parse_llama_bench(&format!("load\n{}\n{}\n", lines[1], lines[0])).unwrap(), b);
        let only_pp = parse_llama_bench(lines[0]).unwrap_err().to_string();
        assert_eq!(only_pp, "llama-bench printed no generation (tg) test");
        assert!(parse_llama_bench("{\"n_prompt\": 1}").unwrap_err().to_string().starts_with("bad llama-bench line"));
    }

    #[test]
    fn batched_bench_output_parses() {
        let rows = parse_batched_bench(BATCHED_BENCH_OUT, &[16, 32], &[1, 2]).unwrap();
        let got: Vec<(usize, usize, usize, usize, f64, f64)> =
            rows.iter().map(|r| (r.pp, r.pl, r.tg, r.n_kv, r.speed_pp, r.speed_tg)).collect();
        assert_eq!(
            got,
            [
                (16, 1, 4, 20, 51.611073, 27.544985),
                (16, 2, 4, 40, 109.959969, 5.988091),
                (32, 1, 4, 36, 24.319012, 13.156727),
                (32, 2, 4, 72, 41.34586, 3.200277)
            ]
        );
        assert_eq!((rows[0].n_kv_max, rows[0].n_threads, rows[0].flash_attn), (512, 2, -1));
        // A combination the tool skipped (too large for its context) is an error, not a gap.
        let err = parse_batched_bench(BATCHED_BENCH_OUT, &[16, 64], &[1, 2]).unwrap_err().to_string();
        assert_eq!(err, "llama-batched-bench printed no row for 1 sequences of 64 tokens");
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
