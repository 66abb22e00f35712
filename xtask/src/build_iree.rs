//! `cargo xtask build-iree --target cpu|cuda|vulkan|metal`: the IREE runtime from source.
//!
//! Every build carries the CPU drivers and, off macOS, the Vulkan driver (it loads
//! `libvulkan.so.1` when a Vulkan device is first asked for, so it costs nothing where no
//! Vulkan driver is installed): `--target vulkan` is the `cpu` build.
//!
//! Output layout (what `iree-sys`'s build.rs reads), under `target/iree/<target>/`:
//! `include/` (runtime + flatcc headers), `lib/` (every static library of the build, flat),
//! `build/` (the CMake tree, kept for incremental rebuilds) and `build.log`.

use crate::iree_patches;
use crate::pins::Pins;
use crate::setup::Toolchain;
use crate::util::{self, progress};
use anyhow::{Context, Result, bail};
use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Target {
    /// The CPU drivers and Vulkan (the runtime the README's commands build).
    Cpu,
    Cuda,
    Metal,
}

impl Target {
    fn name(self) -> &'static str {
        match self {
            Target::Cpu => "cpu",
            Target::Cuda => "cuda",
            Target::Metal => "metal",
        }
    }

    /// HAL drivers compiled in: always the CPU ones (so every build can run the CPU tests)
    /// and, off macOS, Vulkan (its headers come with IREE's source; the loader is opened
    /// at run time), plus the target's own.
    fn driver_flags(self) -> Vec<String> {
        let mut flags =
            vec!["-DIREE_HAL_DRIVER_LOCAL_SYNC=ON".to_string(), "-DIREE_HAL_DRIVER_LOCAL_TASK=ON".to_string()];
        if !cfg!(target_os = "macos") {
            flags.push("-DIREE_HAL_DRIVER_VULKAN=ON".into());
        }
        match self {
            Target::Cpu => {}
            Target::Cuda => flags.push("-DIREE_HAL_DRIVER_CUDA=ON".into()),
            Target::Metal => flags.push("-DIREE_HAL_DRIVER_METAL=ON".into()),
        }
        flags
    }
}

/// Libraries linked by `iree-sys`; each is a ninja target of the IREE build.
const NINJA_TARGETS: &[&str] = &[
    "iree_runtime_unified",
    "iree_modules_io_parameters_parameters",
    "iree_io_formats_parser_registry",
    "iree_io_parameter_index_provider",
    "iree_io_scope_map",
];

pub fn parse_args(args: &[String]) -> Result<Target> {
    let mut target = Target::Cpu;
    let mut it = args.iter();
    while let Some(a) = it.next() {
        let value = match a.as_str() {
            "--target" => it.next().context("--target needs a value: cpu, cuda, vulkan or metal")?.as_str(),
            s if s.starts_with("--target=") => &s["--target=".len()..],
            other => bail!("build-iree: unknown argument `{other}` (expected --target cpu|cuda|vulkan|metal)"),
        };
        target = match value {
            // The default runtime carries the Vulkan driver.
            "cpu" | "vulkan" => Target::Cpu,
            "cuda" => Target::Cuda,
            "metal" => Target::Metal,
            other => bail!("build-iree: unknown target `{other}` (expected cpu, cuda, vulkan or metal)"),
        };
    }
    Ok(target)
}

/// Fails before CMake starts when the host cannot build this target.
pub fn preflight(target: Target) -> Result<()> {
    match target {
        Target::Metal if !cfg!(target_os = "macos") => {
            bail!("build-iree --target metal: Metal is only available on macOS (this host is {})", std::env::consts::OS)
        }
        // CUDA needs only headers at build time (the driver loads libcuda at run time): from
        // an installed toolkit, else from pinned wheels (`cuda_headers`), so any host can
        // build it, with or without a GPU.
        Target::Cpu | Target::Metal | Target::Cuda => Ok(()),
    }
}

/// How CMake finds CUDA: extra `-D` flags and environment for configure and build.
struct CudaSetup {
    flags: Vec<String>,
    env: Vec<(String, String)>,
}

/// Headers for the CUDA HAL driver. An installed toolkit is used as is. Otherwise the pinned
/// wheels (`[cuda-headers]` in pins.toml: `cuda.h` from the CUDA runtime wheel, the `crt/`
/// headers and libdevice from the nvcc wheel, `nv/target` from cccl) are fetched with the
/// venv's pip, each checked against its sha256, and unpacked into `target/iree/cuda-deps`,
/// which IREE's CMake reads through `IREE_CUDA_DEPS_DIR` (the layout of IREE's own CI
/// images). IREE would otherwise try to download the CUDA SDK at configure time, which this
/// project never does.
fn cuda_headers(tc: &Toolchain, stage: &str) -> Result<CudaSetup> {
    if let Some(root) = cuda_root() {
        progress(stage, format!("CUDA headers: toolkit at {}", root.display()));
        return Ok(CudaSetup { flags: vec![format!("-DCUDAToolkit_ROOT={}", root.display())], env: vec![] });
    }
    let pin = Pins::load()?.cuda_headers;
    let deps = util::target_dir().join("iree").join("cuda-deps");
    let setup = CudaSetup { flags: vec![], env: vec![("IREE_CUDA_DEPS_DIR".to_string(), deps.display().to_string())] };
    let needed = [deps.join("include/cuda.h"), deps.join("include/crt/host_config.h"), deps.join("include/nv/target")];
    let stamp = deps.join(".complete");
    let mut stamp_text = format!("platform={}\n", pin.platform);
    for w in &pin.wheels {
        stamp_text.push_str(&format!(
            "{}=={} sha256={} extract={}\n",
            w.pypi,
            w.version,
            w.sha256,
            w.extract.join(",")
        ));
    }
    if util::stamp_matches(&stamp, &stamp_text) && needed.iter().all(|p| p.is_file()) {
        progress(stage, format!("CUDA headers (no toolkit found): present at {}", deps.display()));
        return Ok(setup);
    }
    if deps.exists() {
        std::fs::remove_dir_all(&deps)?;
    }
    let python = tc.venv_bin("python");
    for w in &pin.wheels {
        let download = deps.join("download");
        std::fs::create_dir_all(&download)?;
        progress(stage, format!("no CUDA toolkit found: downloading the wheel {}=={} from PyPI", w.pypi, w.version));
        util::run(
            Command::new(&python)
                .args(["-m", "pip", "download", "--disable-pip-version-check", "--progress-bar", "off"])
                .args(["--no-deps", "--only-binary=:all:", "--platform", &pin.platform, "--dest"])
                .arg(&download)
                .arg(format!("{}=={}", w.pypi, w.version)),
        )?;
        let wheel = std::fs::read_dir(&download)?
            .flatten()
            .map(|e| e.path())
            .find(|p| has_ext(p, "whl"))
            .with_context(|| format!("pip download left no wheel in {}", download.display()))?;
        let bytes = std::fs::read(&wheel).with_context(|| format!("reading {}", wheel.display()))?;
        let got = util::sha256_hex(&bytes);
        if got != w.sha256 {
            bail!("checksum mismatch for {}: expected {}, got {got}", wheel.display(), w.sha256);
        }
        progress(stage, format!("unpacking {} (sha256 verified) into {}", w.extract.join(" "), deps.display()));
        util::run(
            Command::new(&python)
                .args([
                    "-c",
                    "import os, shutil, sys, zipfile\n\
                     wheel, root, pairs = sys.argv[1], sys.argv[2], sys.argv[3:]\n\
                     with zipfile.ZipFile(wheel) as z:\n    \
                         names = z.namelist()\n    \
                         for pair in pairs:\n        \
                             src, dest = pair.split(':')\n        \
                             src = src.rstrip('/') + '/'\n        \
                             found = [n for n in names if n.startswith(src) and not n.endswith(('/', '__init__.py'))]\n        \
                             if not found:\n            \
                                 sys.exit(f'{wheel}: nothing under {src}')\n        \
                             for name in found:\n            \
                                 out = os.path.join(root, dest, name[len(src):])\n            \
                                 os.makedirs(os.path.dirname(out), exist_ok=True)\n            \
                                 with z.open(name) as f, open(out, 'wb') as g:\n                \
                                     shutil.copyfileobj(f, g)",
                ])
                .arg(&wheel)
                .arg(&deps)
                .args(&w.extract),
        )?;
        std::fs::remove_dir_all(&download)?;
    }
    if let Some(missing) = needed.iter().find(|p| !p.is_file()) {
        bail!("the pinned CUDA wheels left no {}", missing.display());
    }
    util::write_stamp(&stamp, &stamp_text)?;
    Ok(setup)
}

/// An installed CUDA toolkit: `$CUDA_PATH`, `$CUDA_HOME` or `/usr/local/cuda`, with `cuda.h`.
fn cuda_root() -> Option<PathBuf> {
    let candidates = ["CUDA_PATH", "CUDA_HOME"]
        .iter()
        .filter_map(std::env::var_os)
        .map(PathBuf::from)
        .chain([PathBuf::from("/usr/local/cuda")]);
    candidates.into_iter().find(|p| p.join("include/cuda.h").exists())
}

pub fn build(tc: &Toolchain, target: Target) -> Result<PathBuf> {
    let stage = format!("build-iree {}", target.name());
    preflight(target)?;
    let cuda = if target == Target::Cuda { Some(cuda_headers(tc, &stage)?) } else { None };
    let out = util::target_dir().join("iree").join(target.name());
    let build_dir = out.join("build");
    let mut flags = vec![
        "-G".to_string(),
        "Ninja".into(),
        "-DCMAKE_BUILD_TYPE=Release".into(),
        format!("-DCMAKE_MAKE_PROGRAM={}", tc.venv_bin("ninja").display()),
        "-DIREE_BUILD_COMPILER=OFF".into(),
        "-DIREE_BUILD_TESTS=OFF".into(),
        "-DIREE_BUILD_BENCHMARKS=OFF".into(),
        "-DIREE_BUILD_SAMPLES=OFF".into(),
        "-DIREE_BUILD_PYTHON_BINDINGS=OFF".into(),
        "-DIREE_BUILD_BINDINGS_TFLITE=OFF".into(),
        "-DIREE_BUILD_BINDINGS_TFLITE_JAVA=OFF".into(),
        "-DIREE_ENABLE_LIBBACKTRACE=OFF".into(),
        "-DIREE_HAL_DRIVER_DEFAULTS=OFF".into(),
        // Rust links these archives into position-independent executables.
        "-DCMAKE_POSITION_INDEPENDENT_CODE=ON".into(),
    ];
    flags.extend(target.driver_flags());
    let mut env: Vec<(String, String)> = Vec::new();
    if let Some(cuda) = cuda {
        flags.extend(cuda.flags);
        env.extend(cuda.env);
    }
    if let Some((cc, cxx)) = c_compilers() {
        flags.push(format!("-DCMAKE_C_COMPILER={cc}"));
        flags.push(format!("-DCMAKE_CXX_COMPILER={cxx}"));
    }
    let patches = patch_source(&tc.iree_src, &stage)?;
    let stamp = out.join(".complete");
    let env_lines: String = env.iter().map(|(k, v)| format!("env {k}={v}\n")).collect();
    let stamp_text = format!(
        "layout=2\nsrc={}\npatches={patches}\n{}\n{env_lines}targets={}\n",
        tc.iree_src.display(),
        flags.join("\n"),
        NINJA_TARGETS.join(",")
    );
    if util::stamp_matches(&stamp, &stamp_text) && out.join("lib/libiree_runtime_unified.a").exists() {
        progress(&stage, format!("IREE runtime: present at {}", out.display()));
        return Ok(out);
    }
    std::fs::create_dir_all(&build_dir)?;
    let log_path = out.join("build.log");
    let mut log = std::fs::File::create(&log_path).with_context(|| format!("creating {}", log_path.display()))?;

    progress(&stage, format!("configuring with CMake (log: {})", log_path.display()));
    let mut configure = Command::new(tc.venv_bin("cmake"));
    configure.arg("-S").arg(&tc.iree_src).arg("-B").arg(&build_dir).args(&flags).envs(env.iter().cloned());
    run_logged(&mut configure, &mut log, &log_path, |_| {})?;

    progress(&stage, format!("compiling the runtime ({})", NINJA_TARGETS.join(" ")));
    let mut ninja = Command::new(tc.venv_bin("ninja"));
    // The environment too: ninja re-runs CMake itself when a CMakeLists.txt changed.
    ninja.arg("-C").arg(&build_dir).args(NINJA_TARGETS).envs(env.iter().cloned());
    let mut last_decile = None;
    run_logged(&mut ninja, &mut log, &log_path, |line| {
        // Small totals are ninja re-checking its own files, not the build.
        if let Some((done, total)) = ninja_progress(line).filter(|&(_, total)| total > 20) {
            let decile = done * 10 / total.max(1);
            if last_decile != Some(decile) {
                last_decile = Some(decile);
                progress(&stage, format!("  {done}/{total} build steps"));
            }
        }
    })?;

    progress(&stage, format!("installing headers and libraries into {}", out.display()));
    install(&tc.iree_src, &build_dir, &out)?;
    util::write_stamp(&stamp, &stamp_text)?;
    progress(&stage, "done");
    Ok(out)
}

/// Applies `iree_patches::PATCHES` to the runtime source `setup` unpacked (never to an
/// `IREE_SOURCE_DIR` checkout); returns what the stamp records: the patches' fingerprint, or
/// `none`.
fn patch_source(src: &Path, stage: &str) -> Result<String> {
    if !src.starts_with(util::target_dir().join("iree-src")) {
        progress(
            stage,
            format!("IREE source {} is not ours: left unpatched (xtask/src/iree_patches.rs)", src.display()),
        );
        return Ok("none".into());
    }
    let changed = iree_patches::apply(src, iree_patches::PATCHES)?;
    if !changed.is_empty() {
        progress(stage, format!("patched the IREE source: {}", changed.join(", ")));
    }
    Ok(iree_patches::fingerprint(iree_patches::PATCHES))
}

/// Prefers clang (what IREE is tested with), else the system cc/c++.
fn c_compilers() -> Option<(String, String)> {
    ["clang", "clang-22"]
        .iter()
        .find(|cc| util::output(Command::new(cc).arg("--version")).is_some())
        .map(|cc| (cc.to_string(), cc.replace("clang", "clang++")))
}

/// `[12/369] Building C object ...` -> (12, 369)
fn ninja_progress(line: &str) -> Option<(usize, usize)> {
    let inner = line.strip_prefix('[')?.split(']').next()?;
    let (a, b) = inner.split_once('/')?;
    Some((a.trim().parse().ok()?, b.trim().parse().ok()?))
}

/// Runs a command with stdout+stderr appended to the log; each stdout line also
/// goes to `on_line`. On failure the last log lines are shown.
fn run_logged(
    cmd: &mut Command,
    log: &mut std::fs::File,
    log_path: &Path,
    mut on_line: impl FnMut(&str),
) -> Result<()> {
    let shown = util::show(cmd);
    writeln!(log, "$ {shown}")?;
    let err_log = log.try_clone()?;
    let mut child = cmd
        .stdout(Stdio::piped())
        .stderr(Stdio::from(err_log))
        .spawn()
        .with_context(|| format!("could not start `{shown}`"))?;
    if let Some(stdout) = child.stdout.take() {
        for line in BufReader::new(stdout).lines() {
            let line = line?;
            writeln!(log, "{line}")?;
            on_line(&line);
        }
    }
    let status = child.wait()?;
    if !status.success() {
        let text = std::fs::read_to_string(log_path).unwrap_or_default();
        let tail: Vec<&str> = text.lines().rev().take(25).collect();
        for l in tail.iter().rev() {
            eprintln!("  | {l}");
        }
        bail!("`{shown}` failed ({status}); full log: {}", log_path.display());
    }
    Ok(())
}

fn install(src: &Path, build: &Path, out: &Path) -> Result<()> {
    let include = out.join("include");
    let lib = out.join("lib");
    for dir in [&include, &lib] {
        if dir.exists() {
            std::fs::remove_dir_all(dir)?;
        }
        std::fs::create_dir_all(dir)?;
    }
    // Headers pull in textual includes too (.inc, .inl), not only .h files.
    let is_header = |p: &Path| ["h", "hpp", "inc", "inl"].iter().any(|ext| has_ext(p, ext));
    copy_tree(&src.join("runtime/src"), &include, &is_header)?;
    copy_tree(&build.join("runtime/src"), &include, &is_header)?;
    copy_tree(&src.join("third_party/flatcc/include"), &include, &is_header)?;
    let mut archives = 0;
    for file in walk(build)? {
        if has_ext(&file, "a") {
            let name = file.file_name().context("archive without a name")?;
            std::fs::copy(&file, lib.join(name))?;
            archives += 1;
        }
    }
    if !lib.join("libiree_runtime_unified.a").exists() {
        bail!("the build produced no libiree_runtime_unified.a ({archives} archives found)");
    }
    Ok(())
}

fn has_ext(p: &Path, ext: &str) -> bool {
    p.extension().is_some_and(|e| e == ext)
}

fn copy_tree(from: &Path, to: &Path, keep: &dyn Fn(&Path) -> bool) -> Result<()> {
    for file in walk(from)? {
        if keep(&file) {
            let rel = file.strip_prefix(from)?;
            let dest = to.join(rel);
            if let Some(parent) = dest.parent() {
                std::fs::create_dir_all(parent)?;
            }
            std::fs::copy(&file, &dest).with_context(|| format!("copying {}", file.display()))?;
        }
    }
    Ok(())
}

fn walk(dir: &Path) -> Result<Vec<PathBuf>> {
    let mut files = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for entry in std::fs::read_dir(&d).with_context(|| format!("reading {}", d.display()))? {
            let entry = entry?;
            let ty = entry.file_type()?;
            if ty.is_dir() {
                stack.push(entry.path());
            } else if ty.is_file() {
                files.push(entry.path());
            }
        }
    }
    Ok(files)
}
