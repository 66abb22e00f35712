//! Compiles the x86-64 kernel sources into freestanding objects, one per instruction set
//! (`cpu/qmv_x86_64.c` for AVX-512 VNNI, `cpu/qmv_x86_64_avx2.c` for AVX2), that IREE links
//! into its embedded-ELF executables. Without a C compiler (or off x86-64) the crate has no
//! objects and `models` uses its graph-level form instead; a warning says so.

use std::env;
use std::path::{Path, PathBuf};
use std::process::Command;

/// (source, object name, instruction-set flags), in the order of `kernels::cpu::Isa::ALL`.
const OBJECTS: [(&str, &str, &[&str]); 2] = [
    ("cpu/qmv_x86_64.c", "qmv_x86_64.o", &["-mavx512f", "-mavx512bw", "-mavx512vnni", "-mfma", "-mf16c"]),
    ("cpu/qmv_x86_64_avx2.c", "qmv_x86_64_avx2.o", &["-mavx2", "-mfma", "-mf16c"]),
];
/// Included by both sources.
const HEADER: &str = "cpu/qrows.h";

fn main() {
    println!("cargo:rerun-if-changed={HEADER}");
    for (source, _, _) in OBJECTS {
        println!("cargo:rerun-if-changed={source}");
    }
    println!("cargo:rerun-if-env-changed=CC");
    println!("cargo::rustc-check-cfg=cfg(kernels_cpu_object)");
    let out_dir = PathBuf::from(env::var_os("OUT_DIR").expect("cargo sets OUT_DIR"));
    for (_, object, _) in OBJECTS {
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
