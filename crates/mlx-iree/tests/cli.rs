//! The CLI contract: exit status 0 on success, 2 with one line on stderr for bad input.

use std::process::{Command, Output};

fn mlx_iree(args: &[&str], cache: &std::path::Path) -> Output {
    Command::new(env!("CARGO_BIN_EXE_mlx-iree")).args(args).env("MLX_IREE_CACHE_DIR", cache).output().unwrap()
}

fn check(args: &[&str], code: i32, stdout_has: &str, stderr_has: &str) {
    let cache = tempfile::tempdir().unwrap();
    let out = mlx_iree(args, cache.path());
    let (stdout, stderr) = (String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert_eq!(out.status.code(), Some(code), "{args:?}\nstdout: {stdout}\nstderr: {stderr}");
    assert!(stdout.contains(stdout_has), "{args:?}: stdout lacks {stdout_has:?}:\n{stdout}");
    assert!(stderr.contains(stderr_has), "{args:?}: stderr lacks {stderr_has:?}:\n{stderr}");
    if code == 2 {
        assert_eq!(stderr.trim_end().lines().count(), 1, "{args:?}: error must be one line:\n{stderr}");
        assert!(!stderr.contains("panicked"), "{stderr}");
    }
}

#[test]
fn demo_runs_and_matches_reference() {
    check(&["demo"], 0, "ok: the device result matches the Rust reference", "compiled in");
}

#[test]
fn demo_second_run_is_a_cache_hit() {
    let cache = tempfile::tempdir().unwrap();
    assert!(mlx_iree(&["demo", "--device", "local-sync"], cache.path()).status.success());
    let again = mlx_iree(&["demo", "--device", "local-sync"], cache.path());
    assert!(String::from_utf8_lossy(&again.stderr).contains("compile cache hit"));
}

#[test]
fn unsupported_device_fails_before_compiling() {
    check(&["demo", "--device", "tpu"], 2, "", "mlx-iree: error: demo: unsupported device `tpu`");
}

#[test]
fn unknown_flag_is_one_line() {
    check(&["demo", "--bogus"], 2, "", "unexpected argument '--bogus'");
}

#[test]
fn missing_subcommand_is_one_line() {
    check(&[], 2, "", "mlx-iree: error:");
}
