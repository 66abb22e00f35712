//! Compiles the kernel sources into freestanding objects, one per instruction set, that IREE
//! links into its embedded-ELF executables: on x86-64 `cpu/qmv_x86_64_amx.c` (AMX-INT8),
//! `cpu/qmv_x86_64.c` (AVX-512 VNNI) and `cpu/qmv_x86_64_avx2.c` (AVX2), on aarch64
//! `cpu/qmv_aarch64.c` (NEON with the dot-product extension), with the flags of
//! `src/cflags.rs`, by `CC`, else clang where it is installed, else `cc`. Without a C compiler (or on another architecture) the crate has no
//! objects and `models` uses its graph-level form instead; a warning says so. A compiler too
//! old for AMX (GCC < 11, clang < 12) leaves out only the AMX object. On every host,
//! `cuda/qmv.cu` becomes PTX where clang is installed (`cflags::CUDA_PTX`); without it,
//! packed weights on CUDA use the graph-level form.

use std::env;
use std::path::{Path, PathBuf};
use std::process::Command;

#[path = "src/cflags.rs"]
mod cflags;

/// (source, object name, instruction-set flags): AVX-512 and AVX2, built together.
const OBJECTS: [(&str, &str, &[&str]); 2] = [
    ("cpu/qmv_x86_64.c", "qmv_x86_64.o", &cflags::AVX512),
    ("cpu/qmv_x86_64_avx2.c", "qmv_x86_64_avx2.o", &cflags::AVX2),
];
/// The AMX object: the AVX-512 flags and `cflags::AMX`.
const AMX: (&str, &str) = ("cpu/qmv_x86_64_amx.c", "qmv_x86_64_amx.o");
/// The aarch64 object.
const NEON: (&str, &str) = ("cpu/qmv_aarch64.c", "qmv_aarch64.o");
/// The CUDA source, its header and the PTX written from it.
const CUDA: (&str, &str, &str) = ("cuda/qmv.cu", "cuda/device.h", "qmv_cuda.ptx");
/// Included by the sources.
const HEADERS: [&str; 9] = [
    "cpu/qmv.h",
    "cpu/hmv.h",
    "cpu/qmv_avx512.h",
    "cpu/qrows.h",
    "cpu/attn.h",
    "cpu/delta.h",
    "cpu/vf16_avx512.h",
    "cpu/vf16_avx2.h",
    "cpu/vf16_neon.h",
];

fn main() {
    for file in HEADERS.into_iter().chain(OBJECTS.map(|o| o.0)).chain([AMX.0, NEON.0, CUDA.0, CUDA.1, "src/cflags.rs"])
    {
        println!("cargo:rerun-if-changed={file}");
    }
    println!("cargo:rerun-if-env-changed=CC");
    println!("cargo::rustc-check-cfg=cfg(kernels_cpu_object)");
    println!("cargo::rustc-check-cfg=cfg(kernels_cpu_amx_object)");
    println!("cargo::rustc-check-cfg=cfg(kernels_cpu_neon_object)");
    println!("cargo::rustc-check-cfg=cfg(kernels_cuda_ptx)");
    let out_dir = PathBuf::from(env::var_os("OUT_DIR").expect("cargo sets OUT_DIR"));
    for object in OBJECTS.map(|o| o.1).into_iter().chain([AMX.1, NEON.1, CUDA.2]) {
        let _ = std::fs::remove_file(out_dir.join(object));
    }
    // `CC` when set; else clang where it is installed (the setup installs it): its AVX-512
    // object multiplies several rows of x (prefill, batched decode) 1.2-1.4x as fast as GCC
    // 12's, which keeps accumulators in memory (docs/PERFORMANCE.md, "Clang builds the
    // kernels"); else the system's `cc`.
    // Asked once: every object is built by the same compiler.
    let cc = match env::var("CC") {
        Ok(path) => Cc { clang: is_clang(&path), path },
        Err(_) if is_clang("clang") => Cc { clang: true, path: "clang".into() },
        Err(_) => Cc { clang: is_clang("cc"), path: "cc".into() },
    };
    match env::var("CARGO_CFG_TARGET_ARCH").as_deref() {
        Ok("x86_64") => x86_64(&cc, &out_dir),
        Ok("aarch64") => aarch64(&cc, &out_dir),
        _ => {}
    }
    cuda(&cc, &out_dir);
}

/// The PTX, by clang whatever compiles the CPU objects (GCC has no CUDA).
fn cuda(cc: &Cc, out_dir: &Path) {
    let clang = if cc.clang { cc.path.as_str() } else { "clang" };
    let out = out_dir.join(CUDA.2);
    let status = Command::new(clang).args(cflags::CUDA_PTX).arg(CUDA.0).arg("-o").arg(&out).status();
    match status {
        Ok(s) if s.success() => println!("cargo:rustc-cfg=kernels_cuda_ptx"),
        Ok(s) => println!(
            "cargo:warning=kernels: `{clang}` failed on {} ({s}); packed weights on CUDA use the graph-level form",
            CUDA.0
        ),
        Err(e) => println!(
            "cargo:warning=kernels: no clang for {} ({e}); packed weights on CUDA use the graph-level form",
            CUDA.0
        ),
    }
}

/// The C compiler and whether it is clang (which refuses GCC's own flags).
struct Cc {
    path: String,
    clang: bool,
}

fn x86_64(cc: &Cc, out_dir: &Path) {
    // Both objects or none: `kernels::cpu` includes them together.
    for (source, object, isa_flags) in OBJECTS {
        if let Err(why) = compile(cc, source, isa_flags, &out_dir.join(object)) {
            println!("cargo:warning=kernels: {why}; packed weights use the graph-level form");
            return;
        }
    }
    println!("cargo:rustc-cfg=kernels_cpu_object");
    let amx_flags: Vec<&str> = cflags::AVX512.into_iter().chain(cflags::AMX).collect();
    match compile(cc, AMX.0, &amx_flags, &out_dir.join(AMX.1)) {
        Ok(()) => println!("cargo:rustc-cfg=kernels_cpu_amx_object"),
        Err(why) => println!("cargo:warning=kernels: {why}; no AMX kernels (AVX-512 runs instead)"),
    }
}

fn aarch64(cc: &Cc, out_dir: &Path) {
    let mut flags = cflags::NEON_DOT.to_vec();
    // Off Linux the system compiler (clang) is told to write ELF anyway.
    if env::var("CARGO_CFG_TARGET_OS").as_deref() != Ok("linux") {
        flags.push(cflags::AARCH64_ELF_TARGET);
    }
    match compile(cc, NEON.0, &flags, &out_dir.join(NEON.1)) {
        Ok(()) => println!("cargo:rustc-cfg=kernels_cpu_neon_object"),
        Err(why) => println!("cargo:warning=kernels: {why}; packed weights use the graph-level form"),
    }
}

/// Freestanding (`cflags::COMMON`, and `cflags::GCC` unless the compiler is clang): the
/// object is linked into IREE's executables, which have no libc.
fn compile(cc: &Cc, source: &str, isa_flags: &[&str], out: &Path) -> Result<(), String> {
    let gcc: &[&str] = if cc.clang { &[] } else { &cflags::GCC };
    let status = Command::new(&cc.path)
        .args(cflags::COMMON)
        .args(gcc)
        .args(isa_flags)
        .args(["-c", source, "-o"])
        .arg(out)
        .status();
    let cc = &cc.path;
    match status {
        Ok(s) if s.success() => {
            check_self_contained(source, out);
            Ok(())
        }
        Ok(s) => Err(format!("`{cc}` failed on {source} ({s})")),
        Err(e) => Err(format!("no C compiler `{cc}` ({e})")),
    }
}

/// Whether `cc` is clang (`cc --version` says so), which refuses GCC's own flags.
fn is_clang(cc: &str) -> bool {
    Command::new(cc).arg("--version").output().is_ok_and(|o| String::from_utf8_lossy(&o.stdout).contains("clang"))
}

/// An undefined symbol would become a runtime import IREE cannot resolve: fail the build.
fn check_self_contained(source: &str, object: &Path) {
    let Ok(out) = Command::new("nm").args(["--undefined-only"]).arg(object).output() else {
        return; // no binutils: the e2e tests still catch it
    };
    let undefined = String::from_utf8_lossy(&out.stdout);
    assert!(undefined.trim().is_empty(), "{source} needs symbols it must not: {undefined}");
}
