//! `cargo xtask setup`: Debian packages, the pinned IREE compiler venv, the IREE runtime source.
//!
//! Each step checks first and does nothing when its result is already there,
//! so the test and quickstart commands can call it every time.

use crate::pins::Pins;
use crate::util::{self, progress};
use anyhow::{Context, Result, bail};
use std::path::{Path, PathBuf};
use std::process::Command;

/// What setup provides to later steps.
#[derive(Debug)]
pub struct Toolchain {
    pub venv: PathBuf,
    /// The IREE source root (runtime/, third_party/, compiler/bindings/c/...).
    pub iree_src: PathBuf,
}

impl Toolchain {
    pub fn venv_bin(&self, tool: &str) -> PathBuf {
        self.venv.join("bin").join(tool)
    }
}

pub fn run() -> Result<Toolchain> {
    let pins = Pins::load()?;
    debian_packages(&pins)?;
    let venv = python_venv(&pins)?;
    let iree_src = runtime_source(&pins)?;
    Ok(Toolchain { venv, iree_src })
}

fn debian_packages(pins: &Pins) -> Result<()> {
    let stage = "setup 1/3";
    let wanted: Vec<&str> =
        pins.llvm.debian_packages.iter().chain(&pins.system.debian_packages).map(String::as_str).collect();
    if util::output(Command::new("dpkg-query").arg("--version")).is_none() {
        progress(
            stage,
            "not a Debian system: make sure LLVM/MLIR 22, libclang 22, clang, lld, python3 venv, valgrind, a \
             Vulkan driver and loader (Mesa's lavapipe) and (off aarch64) qemu-aarch64 are installed",
        );
        return Ok(());
    }
    let missing: Vec<&str> = wanted.iter().copied().filter(|p| !dpkg_installed(p)).collect();
    if missing.is_empty() {
        progress(stage, format!("Debian packages: all {} present", wanted.len()));
        return check_llvm(pins);
    }
    let install = format!("apt-get update && apt-get install -y --no-install-recommends {}", missing.join(" "));
    if !util::is_root() {
        bail!("missing Debian packages: {}\nrun as root: {install}", missing.join(" "));
    }
    progress(stage, format!("Debian packages: installing {} missing: {}", missing.len(), missing.join(" ")));
    util::run(Command::new("apt-get").args(["update", "-q"]))?;
    // Packages with a service (nginx) must not start it: the tests run their own instance on
    // loopback. Debian's policy-rc.d hook (exit 101: "action forbidden") is the standard way;
    // it is removed again unless it was there before.
    let policy = Path::new("/usr/sbin/policy-rc.d");
    let ours = !policy.exists() && std::fs::write(policy, "#!/bin/sh\nexit 101\n").is_ok();
    if ours {
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(policy, std::fs::Permissions::from_mode(0o755))?;
    }
    let installed = util::run(
        Command::new("apt-get")
            .env("DEBIAN_FRONTEND", "noninteractive")
            .args(["install", "-y", "-q", "--no-install-recommends"])
            .args(&missing),
    );
    if ours {
        std::fs::remove_file(policy)?;
    }
    installed?;
    let still: Vec<&str> = missing.iter().copied().filter(|p| !dpkg_installed(p)).collect();
    if !still.is_empty() {
        bail!("apt-get did not install: {}", still.join(" "));
    }
    check_llvm(pins)
}

/// melior and bindgen look for LLVM at the prefix that .cargo/config.toml names.
fn check_llvm(pins: &Pins) -> Result<()> {
    let prefix = Path::new(&pins.llvm.prefix);
    for needed in ["bin/mlir-tblgen", "lib/libMLIR.so", "lib/libclang.so"] {
        if !prefix.join(needed).exists() {
            bail!("LLVM/MLIR {} incomplete: {} is missing", pins.llvm.version, prefix.join(needed).display());
        }
    }
    Ok(())
}

fn dpkg_installed(pkg: &str) -> bool {
    util::output(Command::new("dpkg-query").args(["-W", "-f=${db:Status-Status}", pkg]))
        .is_some_and(|s| s.trim() == "installed")
}

fn python_venv(pins: &Pins) -> Result<PathBuf> {
    let venv = util::target_dir().join("venv");
    let reqs = [
        format!("{}=={}", pins.iree_compiler.pypi, pins.iree_compiler.version),
        pins.python_tools.cmake.clone(),
        pins.python_tools.ninja.clone(),
    ];
    let what = format!("IREE compiler {} (about 84 MB), cmake, ninja", pins.iree_compiler.version);
    let check = "import shutil, sys; sys.exit(not all(shutil.which(t) for t in ('iree-compile', 'cmake', 'ninja')))";
    // The venv's bin/ is not on PATH here, so look there explicitly.
    let check = check.replace("shutil.which(t)", "shutil.which(t, path=sys.prefix + '/bin')");
    util::python_venv(&venv, &reqs, "setup 2/3", &what, &["-c", &check])?;
    Ok(venv)
}

fn runtime_source(pins: &Pins) -> Result<PathBuf> {
    let stage = "setup 3/3";
    let rt = &pins.iree_runtime;
    let base = util::target_dir().join("iree-src");
    let unpacked = base.join(format!("{}-{}", rt.krate, rt.version));
    let src = unpacked.join(&rt.subdir);
    let stamp = base.join(format!("{}-{}.verified", rt.krate, rt.version));
    if stamp.exists() && src.join("runtime/src/iree/runtime/api.h").exists() {
        progress(stage, format!("IREE runtime source {}: present at {}", rt.iree_version, src.display()));
        return Ok(src);
    }
    if let Ok(dir) = std::env::var("IREE_SOURCE_DIR") {
        let dir = PathBuf::from(dir);
        if !dir.join("runtime/src/iree/runtime/api.h").exists() {
            bail!("IREE_SOURCE_DIR={} is not an IREE checkout (no runtime/src/iree/runtime/api.h)", dir.display());
        }
        progress(stage, format!("IREE runtime source: using IREE_SOURCE_DIR={}", dir.display()));
        return Ok(dir);
    }
    std::fs::create_dir_all(&base)?;
    let archive = fetch_crate(&base, &rt.krate, &rt.version)?;
    let bytes = std::fs::read(&archive).with_context(|| format!("reading {}", archive.display()))?;
    let got = util::sha256_hex(&bytes);
    if got != rt.sha256 {
        bail!("checksum mismatch for {}: expected {}, got {got}", archive.display(), rt.sha256);
    }
    progress(stage, format!("unpacking {} {} (sha256 verified) into {}", rt.krate, rt.version, base.display()));
    if unpacked.exists() {
        std::fs::remove_dir_all(&unpacked)?;
    }
    util::run(Command::new("tar").arg("xzf").arg(&archive).arg("-C").arg(&base))?;
    if !src.join("runtime/src/iree/runtime/api.h").exists() {
        bail!("{} {} does not hold an IREE tree at {}/", rt.krate, rt.version, rt.subdir);
    }
    util::write_stamp(&stamp, &got)?;
    Ok(src)
}

/// Gets `<name>-<version>.crate` through cargo itself (so registry mirrors and
/// proxies configured for cargo apply): from cargo's download cache, else by
/// `cargo fetch` on a throwaway manifest that depends on exactly that version.
fn fetch_crate(base: &Path, name: &str, version: &str) -> Result<PathBuf> {
    let file = format!("{name}-{version}.crate");
    if let Some(found) = find_in_cargo_cache(&file) {
        return Ok(found);
    }
    progress("setup 3/3", format!("downloading {name} {version} from crates.io (about 8 MB)"));
    let fetch = base.join("fetch");
    std::fs::create_dir_all(fetch.join("src"))?;
    std::fs::write(fetch.join("src/lib.rs"), "")?;
    std::fs::write(
        fetch.join("Cargo.toml"),
        format!(
            "[package]\nname = \"iree-src-fetch\"\nversion = \"0.0.0\"\nedition = \"2021\"\n\n\
             [dependencies]\n{name} = {{ version = \"={version}\", default-features = false }}\n\n[workspace]\n"
        ),
    )?;
    util::run(Command::new(util::cargo()).arg("fetch").arg("--manifest-path").arg(fetch.join("Cargo.toml")))?;
    find_in_cargo_cache(&file).with_context(|| format!("cargo fetch did not leave {file} in the cargo cache"))
}

fn find_in_cargo_cache(file: &str) -> Option<PathBuf> {
    let home = std::env::var_os("CARGO_HOME")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cargo")))?;
    let cache = home.join("registry/cache");
    std::fs::read_dir(cache).ok()?.flatten().map(|e| e.path().join(file)).find(|p| p.exists())
}
