//! Build script for `iree-sys`: locates the IREE runtime that `cargo xtask build-iree`
//! installed (headers + flat static libraries), links it and runs bindgen over the
//! runtime and parameter headers. No cmake, no network: a missing runtime is one clear
//! error line telling the user what to run.

use std::env;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

/// Static libraries linked, in link order: every archive comes before the archives it
/// depends on (GNU ld resolves left to right). `libiree_runtime_unified.a` already holds
/// `iree/io/file_handle` and `iree/base/internal/path`, so their separate archives are
/// deliberately absent (they would only duplicate symbols). The others hold the parameter
/// path (io_parameters VM module, parser registry with safetensors/gguf/irpa, index
/// provider) and their dependencies outside the unified archive.
const STATIC_LIBS: &[&str] = &[
    "iree_modules_io_parameters_parameters",
    "iree_io_formats_parser_registry",
    "iree_io_formats_safetensors_safetensors",
    "iree_io_formats_gguf_gguf",
    "iree_io_formats_irpa_irpa",
    "iree_io_parameter_index_provider",
    "iree_hal_utils_file_cache",
    "iree_io_parameter_index",
    "iree_io_parameter_provider",
    "iree_io_scope_map",
    "iree_io_stream",
    "iree_base_internal_json",
    "iree_base_internal_unicode",
    "iree_runtime_unified",
    "flatcc_parsing",
];

/// Headers bound: the runtime API plus what building parameter providers needs, and what
/// running a parameter encoder module needs (parameter archive builder, streams, HAL VM
/// types such as fences).
const HEADERS: &[&str] = &[
    "iree/runtime/api.h",
    "iree/vm/bytecode/module.h",
    "iree/async/util/proactor_pool.h",
    "iree/io/file_contents.h",
    "iree/io/file_handle.h",
    "iree/io/parameter_index.h",
    "iree/io/parameter_index_provider.h",
    "iree/io/formats/parser_registry.h",
    "iree/io/formats/irpa/irpa_builder.h",
    "iree/io/stream.h",
    "iree/modules/hal/types.h",
    "iree/modules/io/parameters/module.h",
];

/// The allocator control function the runtime was built with (IREE's CMake default,
/// `IREE_ALLOCATOR_SYSTEM=libc`). Passed to bindgen so the headers declare it.
const SYSTEM_ALLOCATOR_CTL: &str = "iree_allocator_libc_ctl";

fn main() -> ExitCode {
    match run() {
        Ok(()) => ExitCode::SUCCESS,
        Err(message) => {
            // cargo shows a build script's stderr on failure; keep it to one line.
            eprintln!("error: {message}");
            ExitCode::FAILURE
        }
    }
}

fn run() -> Result<(), String> {
    println!("cargo:rerun-if-env-changed=IREE_RUNTIME_DIR");
    println!("cargo:rerun-if-changed=build.rs");

    let manifest_dir = env::var_os("CARGO_MANIFEST_DIR")
        .map(PathBuf::from)
        .ok_or("CARGO_MANIFEST_DIR is not set (run through cargo)")?;
    let runtime_dir = match env::var_os("IREE_RUNTIME_DIR") {
        Some(dir) if !dir.is_empty() => PathBuf::from(dir),
        _ => manifest_dir.join("../../target/iree/cpu"),
    };
    let runtime_dir = runtime_dir.canonicalize().unwrap_or(runtime_dir);
    let include_dir = runtime_dir.join("include");
    let lib_dir = runtime_dir.join("lib");

    let hint = "run `cargo xtask build-iree --target cpu` (or set IREE_RUNTIME_DIR)";
    if !include_dir.join("iree/runtime/api.h").is_file() {
        // A missing path counts as changed, so the next build looks again.
        println!("cargo:rerun-if-changed={}", runtime_dir.display());
        return Err(format!("IREE runtime not found at {}: {hint}", runtime_dir.display()));
    }
    // Directories are scanned recursively by cargo: a reinstall re-runs this
    // script. (Not the whole runtime dir: it may hold the CMake build tree.)
    println!("cargo:rerun-if-changed={}", include_dir.display());
    println!("cargo:rerun-if-changed={}", lib_dir.display());
    if let Some(lib) = STATIC_LIBS.iter().find(|lib| !lib_dir.join(format!("lib{lib}.a")).is_file()) {
        return Err(format!("IREE runtime at {} is incomplete (no lib/lib{lib}.a): {hint}", runtime_dir.display()));
    }
    link(&lib_dir);
    generate_bindings(&include_dir)?;

    // Downstream crates (through `links = "iree"`) can read where the runtime lives.
    println!("cargo:root={}", runtime_dir.display());
    println!("cargo:include={}", include_dir.display());
    Ok(())
}

fn link(lib_dir: &Path) {
    println!("cargo:rustc-link-search=native={}", lib_dir.display());
    for lib in STATIC_LIBS {
        println!("cargo:rustc-link-lib=static={lib}");
    }
    let target_os = env::var("CARGO_CFG_TARGET_OS").unwrap_or_default();
    match target_os.as_str() {
        "linux" | "android" => {
            for lib in ["pthread", "dl", "m"] {
                println!("cargo:rustc-link-lib=dylib={lib}");
            }
        }
        "macos" | "ios" => {
            // The Metal driver (when the runtime was built with it) needs these.
            for framework in ["Foundation", "Metal"] {
                println!("cargo:rustc-link-lib=framework={framework}");
            }
        }
        _ => {}
    }
}

fn generate_bindings(include_dir: &Path) -> Result<(), String> {
    let wrapper: String = HEADERS.iter().map(|header| format!("#include \"{header}\"\n")).collect();

    let bindings = bindgen::Builder::default()
        .header_contents("iree_sys_wrapper.h", &wrapper)
        .clang_arg(format!("-I{}", include_dir.display()))
        .clang_arg(format!("-DIREE_ALLOCATOR_SYSTEM_CTL={SYSTEM_ALLOCATOR_CTL}"))
        .allowlist_type("iree_.*")
        .allowlist_function("iree_.*")
        .allowlist_var("iree_.*")
        .allowlist_var("IREE_.*")
        // Enum members become plain constants named as in C (IREE_HAL_ELEMENT_TYPE_FLOAT_32).
        .default_enum_style(bindgen::EnumVariation::Consts)
        .prepend_enum_name(false)
        .derive_default(true)
        .derive_debug(true)
        .layout_tests(true)
        .generate_comments(false)
        .parse_callbacks(Box::new(bindgen::CargoCallbacks::new()))
        .generate()
        .map_err(|err| format!("bindgen failed on the IREE runtime headers in {}: {err}", include_dir.display()))?;

    let out_dir = env::var_os("OUT_DIR").map(PathBuf::from).ok_or("OUT_DIR is not set (run through cargo)")?;
    let out_file = out_dir.join("bindings.rs");
    bindings.write_to_file(&out_file).map_err(|err| format!("cannot write {}: {err}", out_file.display()))
}
