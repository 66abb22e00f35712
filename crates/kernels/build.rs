//! Compiles the x86-64 kernel sources into freestanding objects, one per instruction set
//! (`cpu/qmv_x86_64_amx.c` for AMX-INT8, `cpu/qmv_x86_64.c` for AVX-512 VNNI,
//! `cpu/qmv_x86_64_avx2.c` for AVX2), that IREE links into its embedded-ELF executables.
//! Without a C compiler (or off x86-64) the crate has no objects and `models` uses its
//! graph-level form instead; a warning says so. A compiler too old for AMX (GCC < 11, clang
//! < 12) leaves out only the AMX object.

use std::env;
use std::path::{Path, PathBuf};
use std::process::Command;

const AVX512: [&str; 5] = ["-mavx512f", "-mavx512bw", "-mavx512vnni", "-mfma", "-mf16c"];
/// (source, object name, instruction-set flags): AVX-512 and AVX2, built together.
const OBJECTS: [(&str, &str, &[&str]); 2] = [
    ("cpu/qmv_x86_64.c", "qmv_x86_64.o", &AVX512),
    ("cpu/qmv_x86_64_avx2.c", "qmv_x86_64_avx2.o", &["-mavx2", "-mfma", "-mf16c"]),
];
/// The AMX object: the AVX-512 flags (it runs that arithmetic for panels of few rows) and these.
const AMX: (&str, &str, &[&str]) =
    ("cpu/qmv_x86_64_amx.c", "qmv_x86_64_amx.o", &["-mavx512vbmi", "-mavx512vl", "-mamx-tile", "-mamx-int8"]);
/// Included by the sources.
const HEADERS: [&str; 3] = ["cpu/qmv.h", "cpu/qmv_avx512.h", "cpu/qrows.h"];

fn main() {
    for file in HEADERS.into_iter().chain(OBJECTS.map(|o| o.0)).chain([AMX.0]) {
        println!("cargo:rerun-if-changed={file}");
    }
    println!("cargo:rerun-if-env-changed=CC");
    println!("cargo::rustc-check-cfg=cfg(kernels_cpu_object)");
    println!("cargo::rustc-check-cfg=cfg(kernels_cpu_amx_object)");
    let out_dir = PathBuf::from(env::var_os("OUT_DIR").expect("cargo sets OUT_DIR"));
    for (_, object, _) in OBJECTS.into_iter().chain([AMX]) {
        let _ = std::fs::remove_file(out_dir.join(object));
    }
    if env::var("CARGO_CFG_TARGET_ARCH").as_deref() != Ok("x86_64") {
        return;
    }
    let cc = env::var("CC").unwrap_or_else(|_| "cc".into());
    // Both objects or none: `kernels::cpu` includes them together.
    for (source, object, isa_flags) in OBJECTS {
        if let Err(why) = compile(&cc, source, isa_flags, &out_dir.join(object)) {
            println!("cargo:warning=kernels: {why}; packed weights use the graph-level form");
            return;
        }
    }
    println!("cargo:rustc-cfg=kernels_cpu_object");
    let amx_flags: Vec<&str> = AVX512.into_iter().chain(AMX.2.iter().copied()).collect();
    match compile(&cc, AMX.0, &amx_flags, &out_dir.join(AMX.1)) {
        Ok(()) => println!("cargo:rustc-cfg=kernels_cpu_amx_object"),
        Err(why) => println!("cargo:warning=kernels: {why}; no AMX kernels (AVX-512 runs instead)"),
    }
}

/// Freestanding: the object is linked into IREE's executables, which have no libc, so no
/// stack protector, no unwind tables and no calls to memset/memcpy for loops.
fn compile(cc: &str, source: &str, isa_flags: &[&str], out: &Path) -> Result<(), String> {
    let status = Command::new(cc)
        .args(["-O3", "-fPIC", "-ffreestanding"])
        .args(isa_flags)
        .args(["-fno-stack-protector", "-fno-asynchronous-unwind-tables", "-fno-tree-loop-distribute-patterns"])
        .args(["-c", source, "-o"])
        .arg(out)
        .status();
    match status {
        Ok(s) if s.success() => {
            check_self_contained(source, out);
            Ok(())
        }
        Ok(s) => Err(format!("`{cc}` failed on {source} ({s})")),
        Err(e) => Err(format!("no C compiler `{cc}` ({e})")),
    }
}

/// An undefined symbol would become a runtime import IREE cannot resolve: fail the build.
fn check_self_contained(source: &str, object: &Path) {
    let Ok(out) = Command::new("nm").args(["--undefined-only"]).arg(object).output() else {
        return; // no binutils: the e2e tests still catch it
    };
    let undefined = String::from_utf8_lossy(&out.stdout);
    assert!(undefined.trim().is_empty(), "{source} needs symbols it must not: {undefined}");
}
