//! Compiles cpu/qmv_x86_64.c into a freestanding x86-64 object that IREE links into its
//! embedded-ELF executables. Without a C compiler (or off x86-64) the crate has no object
//! and `models` uses its graph-level form instead; a warning says so.

use std::env;
use std::path::PathBuf;
use std::process::Command;

const SOURCE: &str = "cpu/qmv_x86_64.c";

fn main() {
    println!("cargo:rerun-if-changed={SOURCE}");
    println!("cargo:rerun-if-env-changed=CC");
    println!("cargo::rustc-check-cfg=cfg(kernels_cpu_object)");
    let out = PathBuf::from(env::var_os("OUT_DIR").expect("cargo sets OUT_DIR")).join("qmv_x86_64.o");
    let _ = std::fs::remove_file(&out);
    if env::var("CARGO_CFG_TARGET_ARCH").as_deref() != Ok("x86_64") {
        return;
    }
    let cc = env::var("CC").unwrap_or_else(|_| "cc".into());
    // Freestanding: the object is linked into IREE's executables, which have no libc, so
    // no stack protector, no unwind tables and no calls to memset/memcpy for loops.
    let status = Command::new(&cc)
        .args(["-O3", "-mavx512f", "-mavx512bw", "-mavx512vnni", "-mfma", "-mf16c", "-fPIC", "-ffreestanding"])
        .args(["-fno-stack-protector", "-fno-asynchronous-unwind-tables", "-fno-tree-loop-distribute-patterns"])
        .args(["-c", SOURCE, "-o"])
        .arg(&out)
        .status();
    match status {
        Ok(s) if s.success() => {
            check_self_contained(&out);
            println!("cargo:rustc-cfg=kernels_cpu_object");
        }
        Ok(s) => {
            println!("cargo:warning=kernels: `{cc}` failed on {SOURCE} ({s}); packed weights use the graph-level form")
        }
        Err(e) => {
            println!("cargo:warning=kernels: no C compiler `{cc}` ({e}); packed weights use the graph-level form")
        }
    }
}

/// An undefined symbol would become a runtime import IREE cannot resolve: fail the build.
fn check_self_contained(object: &std::path::Path) {
    let Ok(out) = Command::new("nm").args(["--undefined-only"]).arg(object).output() else {
        return; // no binutils: the e2e tests still catch it
    };
    let undefined = String::from_utf8_lossy(&out.stdout);
    assert!(undefined.trim().is_empty(), "{SOURCE} needs symbols it must not: {undefined}");
}
