//! The CLI contract: exit status 0 on success, 2 with one line on stderr for bad input.

#![allow(clippy::unwrap_used)] // a test that cannot unwrap has failed; helpers included

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

/// A copy of the qwen2 fixture checkpoint with one config.json key changed.
fn fixture_with(key: &str, value: serde_json::Value) -> tempfile::TempDir {
    fixture_of("qwen2", key, value)
}

/// A copy of fixture `family`'s f32 checkpoint with one config.json key changed.
fn fixture_of(family: &str, key: &str, value: serde_json::Value) -> tempfile::TempDir {
    let src = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures").join(family).join("f32");
    let dir = tempfile::tempdir().unwrap();
    for f in ["model.safetensors", "model.safetensors.index.json"] {
        std::fs::copy(src.join(f), dir.path().join(f)).unwrap();
    }
    let mut config: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(src.join("config.json")).unwrap()).unwrap();
    config[key] = value;
    std::fs::write(dir.path().join("config.json"), config.to_string()).unwrap();
    dir
}

#[test]
fn unsupported_model_type_is_refused_before_compiling() {
    let dir = fixture_with("model_type", serde_json::json!("gpt2"));
    let model = dir.path().to_str().unwrap();
    let out = tempfile::tempdir().unwrap();
    let file = out.path().join("t.json");
    let args =
        ["trajectory", "--model", model, "--prompt-ids", "1,2,3", "--steps", "4", "--out", file.to_str().unwrap()];
    check(
        &args,
        2,
        "",
        "unsupported model_type `gpt2` (supported: llama, mistral, mixtral, phi3, qwen2, qwen2_moe, qwen3, qwen3_moe, gemma, gemma2, gemma3_text, smollm3, qwen3_next, qwen3_5, qwen3_5_moe, lfm2, ministral3, granite, olmo2, olmo3, glm4, glm4_moe, deepseek_v3, kimi_k2, gpt_oss, gemma4_text, gemma3, mistral3, gemma4)",
    );
    assert!(!file.exists(), "no partial output file");
}

#[test]
fn unsupported_rope_scaling_is_refused() {
    let dir = fixture_with("rope_scaling", serde_json::json!({"rope_type": "dynamic", "factor": 4.0}));
    let args = [
        "trajectory",
        "--model",
        dir.path().to_str().unwrap(),
        "--prompt-ids",
        "1",
        "--steps",
        "1",
        "--out",
        "/tmp/x.json",
    ];
    check(&args, 2, "", "unsupported option rope_scaling.rope_type = \"dynamic\" for model_type `qwen2`");
}

/// `mlx-iree trajectory` on `model` with `extra` flags must fail with `expect` (one line, status 2).
fn bad_trajectory(model: &str, ids: &str, extra: &[&str], expect: &str) {
    let mut args = vec!["trajectory", "--model", model, "--prompt-ids", ids, "--steps", "2", "--out", "/tmp/x.json"];
    args.extend_from_slice(extra);
    check(&args, 2, "", expect);
}

#[test]
fn bad_requests_are_one_line_errors() {
    let fixture = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures/qwen2/f32");
    let model = fixture.to_str().unwrap();
    bad_trajectory("/nonexistent/m", "1", &[], "model folder /nonexistent/m does not exist");
    bad_trajectory(model, "1", &["--precision", "int3"], "unknown precision `int3`");
    bad_trajectory(model, "1", &["--precision", "packed"], "precision `packed` needs an MLX-quantized checkpoint");
    bad_trajectory(model, "1,99999", &[], "token id 99999 is out of range for vocabulary size 384");
    bad_trajectory(model, "1", &["--device", "metal"], "unsupported device `metal`");
    // Context limits are checked before anything is compiled.
    let long = ["trajectory", "--model", model, "--prompt-ids", "1,2,3", "--steps", "70", "--max-context", "64"];
    check(
        &[&long[..], &["--out", "/tmp/x.json"]].concat(),
        2,
        "",
        "3 prompt tokens + 70 steps needs 72 positions, more than the maximum context 64",
    );
    bad_trajectory(model, "1", &["--max-context", "0"], "max context must be at least 1");
    bad_trajectory(model, "1", &["--kv-cache", "bf16"], "unknown KV cache type `bf16` (expected f32, f16 or q8)");
    bad_trajectory(model, "1", &["--activations", "i4"], "unknown activations `i4` (expected i16 or i8)");
    // 8-bit activations are the CPU kernel's packed products': refused where there are none.
    let no_products = "--activations i8 quantizes the CPU kernel's packed products' input; this load has none";
    bad_trajectory(model, "1", &["--activations", "i8", "--precision", "f32"], no_products);
    let q4 = fixture.parent().unwrap().join("q4");
    let q4 = q4.to_str().unwrap();
    bad_trajectory(q4, "1", &["--activations", "i8", "--precision", "packed", "--kernels", "0"], no_products);
    // mxfp8's products are float ones, which the setting does not touch.
    let mxfp8 = fixture.parent().unwrap().join("../llama_llama3_tied/mxfp8");
    let mxfp8 = mxfp8.to_str().unwrap();
    let none = "this load has none (no MLX integer-quantized matrix in this checkpoint)";
    bad_trajectory(mxfp8, "1", &["--activations", "i8", "--precision", "packed"], none);
    check(&["generate", "--model", model, "--prompt", "hi"], 2, "", "tokenizer.json");
    check(
        &["generate", "--model", model, "--prompt", "hi", "--temperature", "-1"],
        2,
        "",
        "--temperature must be a finite number >= 0",
    );
    let generate = |extra: &[&str], expect: &str| {
        check(&[&["generate", "--model", model, "--prompt", "hi"][..], extra].concat(), 2, "", expect)
    };
    generate(&["--presence-penalty", "3"], "--presence-penalty must be between -2 and 2, got 3");
    generate(&["--frequency-penalty", "-2.5"], "--frequency-penalty must be between -2 and 2, got -2.5");
    generate(&["--repetition-penalty", "0"], "--repetition-penalty must be a finite number > 0, got 0");
    generate(&["--min-p", "2"], "--min-p must be between 0 and 1, got 2");
    generate(&["--logit-bias", "5=-101"], "--logit-bias of token 5 must be between -100 and 100, got -101");
    generate(&["--logit-bias", "5"], "expected ID=BIAS, got `5`");
    // Drafts: a count of at least 1, with --draft, on generate, chat and serve only, and on a
    // model with recurrent layers only on a device that copies between slots (its state is
    // rolled back from a copy), refused before the tokenizer is read.
    generate(&["--draft", "ngram", "--draft-tokens", "0"], "--draft-tokens must be at least 1");
    generate(&["--draft-tokens", "3"], "--draft-tokens needs --draft ngram or --draft-model");
    generate(&["--draft", "medusa"], "invalid value 'medusa' for '--draft <DRAFT>'");
    let recurrent = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures/qwen3_5/f32");
    let recurrent = recurrent.to_str().unwrap();
    for args in [
        &["generate", "--model", recurrent, "--prompt", "hi", "--draft", "ngram", "--device", "cuda"][..],
        &["chat", "--model", recurrent, "--draft", "ngram", "--device", "cuda"],
        &["serve", "--model", recurrent, "--draft", "ngram", "--port", "0", "--device", "cuda"],
    ] {
        let expected = "speculative decoding (--draft) of a model with recurrent layers (qwen3_5) keeps its state from before each check in a spare slot, which cuda (sm_80) does not copy between slots";
        check(args, 2, "", expected);
    }
    bad_trajectory(model, "1", &["--draft", "ngram"], "unexpected argument '--draft' found");
    generate(&["--draft", "ngram", "--draft-model", model], "cannot be used with");
    // An id outside the vocabulary: known once the tokenizer is read, before any compile.
    let smollm2 =
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../target/models/smollm2-135m-instruct-4bit");
    check(
        &["generate", "--model", smollm2.to_str().unwrap(), "--prompt", "hi", "--logit-bias", "1=2,49152=1"],
        2,
        "",
        "--logit-bias names token 49152, outside the vocabulary of 49152 tokens",
    );
    // A reasoning effort: for a chat prompt, and a template that reads it (SmolLM2's does not);
    // known once the template is read, before any compile.
    let smollm2 = smollm2.to_str().unwrap();
    let effort = |command: &str, extra: &[&str], expect: &str| {
        check(&[&[command, "--model", smollm2, "--reasoning-effort", "low"][..], extra].concat(), 2, "", expect)
    };
    effort("generate", &["--prompt", "hi"], "--reasoning-effort applies to a chat prompt: add --chat");
    let unread = "this model's chat template does not read reasoning_effort (got `low`)";
    effort("generate", &["--prompt", "hi", "--chat"], unread);
    effort("chat", &[], unread);
    check(
        &["chat", "--model", smollm2, "--reasoning-effort", "max"],
        2,
        "",
        "invalid value 'max' for '--reasoning-effort",
    );
}

/// A cache size that is not a number of gigabytes is a one-line error before anything is
/// compiled.
#[test]
fn a_bad_cache_limit_is_a_one_line_error() {
    let fixture = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures/qwen2/f32");
    for bad in ["lots", "-1", "inf"] {
        let cache = tempfile::tempdir().unwrap();
        let out = Command::new(env!("CARGO_BIN_EXE_mlx-iree"))
            .args(["trajectory", "--model", fixture.to_str().unwrap(), "--prompt-ids", "1", "--steps", "2"])
            .args(["--out", "/tmp/x.json"])
            .env("MLX_IREE_CACHE_DIR", cache.path())
            .env("MLX_IREE_CACHE_MAX_GB", bad)
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
        assert_eq!(out.status.code(), Some(2), "{bad}: {stderr}");
        assert_eq!(stderr.trim_end().lines().count(), 1, "{bad}: one line: {stderr}");
        let expected = format!("MLX_IREE_CACHE_MAX_GB: expected a number of gigabytes (0 for no limit), got `{bad}`");
        assert!(stderr.contains(&expected), "{stderr}");
        assert!(std::fs::read_dir(cache.path()).map_or(true, |d| d.count() == 0), "{bad}: compiled something");
    }
}

/// A `trajectory` on a fixture with `args` added and `env` set, in an empty compile cache:
/// exit status, stderr, and whether anything was compiled into the cache.
fn settings_run(fixture: &str, args: &[&str], env: &[(&str, &str)]) -> (Option<i32>, String, bool) {
    let fixture = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures").join(fixture);
    let cache = tempfile::tempdir().unwrap();
    let mut command = Command::new(env!("CARGO_BIN_EXE_mlx-iree"));
    command
        .args(["trajectory", "--model", fixture.to_str().unwrap(), "--prompt-ids", "1", "--steps", "2"])
        .args(["--out", "/tmp/x.json"])
        .args(args)
        .env("MLX_IREE_CACHE_DIR", cache.path())
        .env_remove("MLX_IREE_KERNELS")
        .env_remove("MLX_IREE_PACKED_KERNELS")
        .env_remove("MLX_IREE_CACHE_MAX_GB")
        .env_remove("MLX_IREE_STORE_PARAMETERS");
    for (k, v) in env {
        command.env(k, v);
    }
    let out = command.output().unwrap();
    let compiled = std::fs::read_dir(cache.path()).is_ok_and(|d| d.count() > 0);
    (out.status.code(), String::from_utf8_lossy(&out.stderr).into_owned(), compiled)
}

/// An instruction set whose kernels cannot run on this host (neondot on x86-64, amx on
/// aarch64): forcing it fails the load before anything is compiled, with its own message.
fn foreign_isa() -> kernels::cpu::Isa {
    kernels::cpu::Isa::ALL.into_iter().find(|isa| !isa.runs_on_host()).unwrap()
}

/// `--kernels` and `MLX_IREE_KERNELS` name a kernel setting the binary knows, and a forced
/// instruction set must run here: both are checked before anything is compiled, one line
/// and exit status 2.
#[test]
fn bad_kernel_settings_are_one_line_errors() {
    let run = |args: &[&str], env: &[(&str, &str)]| {
        let (code, stderr, compiled) = settings_run("qwen2/q4", &[&["--precision", "packed"], args].concat(), env);
        assert_eq!(code, Some(2), "{args:?} {env:?}: {stderr}");
        assert_eq!(stderr.trim_end().lines().count(), 1, "{args:?} {env:?}: one line: {stderr}");
        assert!(!compiled, "{args:?} {env:?}: compiled something");
        stderr
    };
    let stderr = run(&[], &[("MLX_IREE_KERNELS", "sse2")]);
    assert!(stderr.contains("MLX_IREE_KERNELS=sse2 (expected 0, amx, avx512, avx2, neondot or auto)"), "{stderr}");
    let stderr = run(&["--kernels", "sse2"], &[]);
    assert_eq!(
        stderr.trim_end(),
        "mlx-iree: error: invalid value 'sse2' for '--kernels <SETTING>': expected 0, amx, avx512, avx2, neondot or auto (see mlx-iree --help)"
    );
    for isa in kernels::cpu::Isa::ALL.into_iter().filter(|isa| !isa.runs_on_host()) {
        let stderr = run(&[], &[("MLX_IREE_KERNELS", isa.name())]);
        assert!(stderr.contains(&format!("the {isa} CPU kernels do not run here")), "{stderr}");
        let stderr = run(&["--kernels", isa.name()], &[]);
        assert!(stderr.contains(&format!("the {isa} CPU kernels do not run here")), "{stderr}");
    }
}

/// Bad values of the other settings' flags are one line and exit status 2 too, before
/// anything is compiled.
#[test]
fn bad_setting_flags_are_one_line_errors() {
    for (args, expected) in [
        (
            &["--cache-max-gb", "lots"][..],
            "invalid value 'lots' for '--cache-max-gb <GB>': expected a number of gigabytes (0 for no limit)",
        ),
        (&["--store-parameters", "yes"], "invalid value 'yes' for '--store-parameters <0|1>': expected 0 or 1"),
    ] {
        let (code, stderr, compiled) = settings_run("qwen2/f32", args, &[]);
        assert_eq!(code, Some(2), "{args:?}: {stderr}");
        assert_eq!(stderr.trim_end(), format!("mlx-iree: error: {expected} (see mlx-iree --help)"), "{args:?}");
        assert!(!compiled, "{args:?}: compiled something");
    }
}

/// A flag wins over its variable, which is then not even read: a bad `MLX_IREE_KERNELS`
/// or `MLX_IREE_CACHE_MAX_GB` beside the flag is no error, and the flag's own setting holds
/// (here a foreign instruction set, refused before compiling).
#[test]
fn a_flag_overrides_its_environment_variable() {
    let isa = foreign_isa();
    let env = [("MLX_IREE_KERNELS", "sse2"), ("MLX_IREE_CACHE_MAX_GB", "lots"), ("MLX_IREE_STORE_PARAMETERS", "x")];
    let (code, stderr, compiled) =
        settings_run("qwen2/q4", &["--kernels", isa.name(), "--cache-max-gb", "1", "--store-parameters", "0"], &env);
    assert_eq!(code, Some(2), "{stderr}");
    assert_eq!(stderr.trim_end().lines().count(), 1, "{stderr}");
    assert!(stderr.contains(&format!("the {isa} CPU kernels do not run here")), "{stderr}");
    assert!(!compiled);
    // And the other way round: `--kernels 0` over a foreign instruction set in the variable
    // gets past the kernel check to the next setting read, the variable's bad cache size.
    let (code, stderr, _) = settings_run("qwen2/q4", &["--kernels", "0"], &[("MLX_IREE_KERNELS", isa.name()), env[1]]);
    assert_eq!(code, Some(2), "{stderr}");
    assert_eq!(
        stderr.trim_end(),
        "mlx-iree: error: MLX_IREE_CACHE_MAX_GB: expected a number of gigabytes (0 for no limit), got `lots`"
    );
}

/// `MLX_IREE_PACKED_KERNELS`, the old name of `MLX_IREE_KERNELS`, is still read for one
/// release, with a warning line; a bad value there is still one error line naming it, and
/// the new name wins when both are set.
#[test]
fn the_old_kernel_variable_still_works_with_a_warning() {
    let isa = foreign_isa();
    let (code, stderr, compiled) = settings_run("qwen2/q4", &[], &[("MLX_IREE_PACKED_KERNELS", isa.name())]);
    assert_eq!(code, Some(2), "{stderr}");
    let lines: Vec<&str> = stderr.trim_end().lines().collect();
    assert_eq!(lines.len(), 2, "{stderr}");
    assert_eq!(
        lines[0],
        "mlx-iree: warning: MLX_IREE_PACKED_KERNELS is deprecated and goes in the next release: use --kernels or MLX_IREE_KERNELS (the same values)"
    );
    assert!(lines[1].contains(&format!("the {isa} CPU kernels do not run here")), "{stderr}");
    assert!(!compiled);
    let (code, stderr, _) = settings_run("qwen2/q4", &[], &[("MLX_IREE_PACKED_KERNELS", "sse2")]);
    assert_eq!(code, Some(2), "{stderr}");
    assert_eq!(
        stderr.trim_end(),
        "mlx-iree: error: MLX_IREE_PACKED_KERNELS=sse2 (expected 0, amx, avx512, avx2, neondot or auto)"
    );
    let env = [("MLX_IREE_KERNELS", isa.name()), ("MLX_IREE_PACKED_KERNELS", "sse2")];
    let (code, stderr, _) = settings_run("qwen2/q4", &[], &env);
    assert_eq!(code, Some(2), "{stderr}");
    assert_eq!(stderr.trim_end().lines().count(), 1, "{stderr}");
    assert!(stderr.contains(&format!("the {isa} CPU kernels do not run here")), "{stderr}");
}

/// A warm compile cache needs no compiler: with `IREE_COMPILER_LIB` naming a file that does
/// not exist, a run whose modules are all cached reads them and succeeds (the engine never
/// loads the compiler), while an empty cache is one clear error line.
#[test]
fn warm_cache_runs_without_the_compiler() {
    let fixture = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures/qwen2/f32");
    let model = fixture.to_str().unwrap();
    let out = tempfile::tempdir().unwrap();
    let file = out.path().join("t.json");
    let file = file.to_str().unwrap();
    let args = ["trajectory", "--model", model, "--device", "local-sync", "--prompt-ids", "1,2,3", "--steps", "4"];
    let args = [&args[..], &["--max-context", "64"]].concat();
    let no_compiler = |cache: &std::path::Path, out: &str| {
        Command::new(env!("CARGO_BIN_EXE_mlx-iree"))
            .args(&args)
            .args(["--out", out])
            .env("MLX_IREE_CACHE_DIR", cache)
            .env("IREE_COMPILER_LIB", "/nonexistent/libIREECompiler.so")
            .output()
            .unwrap()
    };

    let cache = tempfile::tempdir().unwrap();
    let first = mlx_iree(&[&args[..], &["--out", file]].concat(), cache.path());
    assert!(first.status.success(), "{}", String::from_utf8_lossy(&first.stderr));
    let expected = std::fs::read_to_string(file).unwrap();

    let warm = out.path().join("warm.json");
    let again = no_compiler(cache.path(), warm.to_str().unwrap());
    let stderr = String::from_utf8_lossy(&again.stderr);
    assert!(again.status.success(), "{stderr}");
    assert!(stderr.contains("compile cache hit") && !stderr.contains("compiling"), "{stderr}");
    assert_eq!(std::fs::read_to_string(&warm).unwrap(), expected, "the same trajectory from the cached modules");

    let empty = tempfile::tempdir().unwrap();
    let cold = no_compiler(empty.path(), out.path().join("cold.json").to_str().unwrap());
    let stderr = String::from_utf8_lossy(&cold.stderr);
    assert_eq!(cold.status.code(), Some(2), "{stderr}");
    assert_eq!(stderr.trim_end().lines().count(), 1, "one line:\n{stderr}");
    assert!(stderr.contains("is not in the compile cache"), "{stderr}");
    assert!(stderr.contains("/nonexistent/libIREECompiler.so"), "{stderr}");
}

/// `compile` fills the cache for a device this machine does not have (no GPU here), and a
/// second run without a compiler at all is served from that cache: what scripts/cuda-check
/// does before carrying the cache to a GPU machine. Bad flags are one line.
#[test]
fn compile_fills_the_cache_without_the_device() {
    let model = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures/llama_llama3_tied/q4");
    let model = model.to_str().unwrap();
    let args = ["compile", "--model", model, "--device", "cuda", "--precision", "packed", "--max-context", "64"];
    let cache = tempfile::tempdir().unwrap();
    let first = mlx_iree(&args, cache.path());
    let stderr = String::from_utf8_lossy(&first.stderr);
    assert!(first.status.success(), "{stderr}");
    assert!(stderr.contains("compiled for cuda into") && stderr.contains("compiled in"), "{stderr}");
    let again = Command::new(env!("CARGO_BIN_EXE_mlx-iree"))
        .args(args)
        .env("MLX_IREE_CACHE_DIR", cache.path())
        .env("IREE_COMPILER_LIB", "/nonexistent/libIREECompiler.so")
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&again.stderr);
    assert!(again.status.success(), "{stderr}");
    assert!(stderr.contains("compiled for cuda into") && stderr.contains("compile cache hit"), "{stderr}");
    check(&["compile", "--model", model, "--max-batch", "0"], 2, "", "--max-batch must be at least 1");
}

/// A checkpoint whose tensors disagree with its config.json (here a qwen3_moe whose
/// `moe_intermediate_size` is not its experts' width) is refused when the layout is
/// planned: one line naming the tensor and both shapes, exit 2, nothing compiled.
#[test]
fn a_checkpoint_that_disagrees_with_its_config_is_refused_before_compiling() {
    let dir = fixture_of("qwen3_moe", "moe_intermediate_size", serde_json::json!(96));
    for precision in ["f32", "f16"] {
        let cache = tempfile::tempdir().unwrap();
        let args = ["trajectory", "--model", dir.path().to_str().unwrap(), "--prompt-ids", "1,2", "--steps", "2"];
        let out = mlx_iree(&[&args[..], &["--precision", precision, "--out", "/tmp/x.json"]].concat(), cache.path());
        let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
        assert_eq!(out.status.code(), Some(2), "{precision}: {stderr}");
        assert_eq!(stderr.trim_end().lines().count(), 1, "{precision}: one line: {stderr}");
        let want = "tensor model.layers.0.mlp.switch_mlp.gate_proj.weight: expected shape [8, 96, 64] from config.json, got [8, 64, 64]";
        assert!(stderr.contains(want), "{precision}: {stderr}");
        let compiled = walk(cache.path()).into_iter().filter(|p| p.extension().is_some_and(|e| e == "vmfb")).count();
        assert_eq!(compiled, 0, "{precision}: compiled before refusing");
    }
}

/// An mxfp8 checkpoint `packed` cannot hold: an E4M3 NaN code, or a scale past the largest
/// the products take (its weights would overflow f32's normal range). One line naming the
/// tensor, what was found where and what to use instead, exit 2, nothing compiled.
#[test]
fn packed_refuses_mxfp8_it_cannot_hold() {
    let run = |dir: &tempfile::TempDir, expected: &str| {
        let stderr = refused_in_one_line(dir.path(), "packed");
        assert!(stderr.contains(expected), "{expected}: {stderr}");
        assert!(stderr.contains("precision `packed` cannot hold it (use f16 or bf16)"), "{stderr}");
    };
    let (weight, scales) = ("model.layers.0.mlp.down_proj.weight", "model.layers.0.mlp.down_proj.scales");
    // Row 0's third code made E4M3's NaN; row 1's second scale made 2^123.
    let nan = quantized_with("mxfp8", |_| {}, None, Some((weight, 2, 0x7F)));
    run(&nan, &format!("{weight}: an E4M3 NaN code (0x7f) at row 0, input 2;"));
    let big = quantized_with("mxfp8", |_| {}, None, Some((scales, 128 / 32 + 1, 250)));
    run(&big, &format!("{weight}: the E8M0 scale byte 250 (2^123) at row 1, inputs 32.. is outside the 10..=246"));
}

/// A one-step trajectory of `model` at `precision` that must be refused: exit 2, one line,
/// nothing compiled. Its stderr.
fn refused_in_one_line(model: &std::path::Path, precision: &str) -> String {
    let cache = tempfile::tempdir().unwrap();
    let args = ["trajectory", "--model", model.to_str().unwrap(), "--prompt-ids", "1", "--steps", "1"];
    let out = mlx_iree(&[&args[..], &["--precision", precision, "--out", "/tmp/x.json"]].concat(), cache.path());
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert_eq!(stderr.trim_end().lines().count(), 1, "one line: {stderr}");
    assert!(walk(cache.path()).iter().all(|p| p.extension().is_none_or(|e| e != "vmfb")), "compiled: {stderr}");
    stderr
}

/// Every file under `dir`.
fn walk(dir: &std::path::Path) -> Vec<std::path::PathBuf> {
    let mut out = Vec::new();
    for entry in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        let path = entry.path();
        if path.is_dir() { out.extend(walk(&path)) } else { out.push(path) }
    }
    out
}

/// A smollm3 checkpoint whose `no_rope_layers` does not give one flag per layer: one line
/// naming the setting, exit 2, nothing compiled.
#[test]
fn a_malformed_smollm3_config_is_one_line() {
    let dir = fixture_of("smollm3", "no_rope_layers", serde_json::json!([1, 0]));
    let args = ["trajectory", "--model", dir.path().to_str().unwrap(), "--prompt-ids", "1", "--steps", "1"];
    check(&[&args[..], &["--out", "/tmp/x.json"]].concat(), 2, "", "no_rope_layers: 2 entries for 3 layers");
}

/// The families of issue 35: a mistral3 around a text model this crate does not run, and a
/// ministral3 without its query scale's setting, are one line naming the setting; a gemma3
/// without one of its language model's tensors names the tensor as stored (under
/// `language_model.`); a granite without a multiplier names it, an olmo2 or a glm4 without a
/// norm after its MLP names the tensor (as the checkpoint spells it); a glm4_moe with a router
/// mode mlx-lm does not run names the key, one without its router's bias names the tensor;
/// a deepseek_v3 whose latent rank disagrees with its weights names the tensor and both
/// shapes, one whose `kv_b_proj` (the older layout of `embed_q` and `unembed_out`) is not a
/// matrix names it; a gemma4_text without its per-layer table names the tensor, one with
/// experts (`enable_moe_block`) but no `num_experts` or with every layer KV-shared names the
/// setting, a gemma4 without a full layer's `k_proj` names it as stored, a gemma4_moe
/// without an expert scale names it, a gpt_oss without its attention sinks names them. Exit 2, nothing compiled.
#[test]
fn malformed_new_family_checkpoints_are_one_line() {
    let run = |dir: &tempfile::TempDir, expected: &str| {
        let args = ["trajectory", "--model", dir.path().to_str().unwrap(), "--prompt-ids", "1", "--steps", "1"];
        check(&[&args[..], &["--out", "/tmp/x.json"]].concat(), 2, "", expected);
    };
    let dir = fixture_of("mistral3", "text_config", serde_json::json!({"model_type": "mistral4"}));
    run(&dir, "unsupported option text_config.model_type = mistral4 for model_type `mistral3`");
    let mut text: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(
            std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures/ministral3/f32/config.json"),
        )
        .unwrap(),
    )
    .unwrap();
    let text = text["text_config"].take();
    let mut no_beta = text.clone();
    no_beta["rope_parameters"].as_object_mut().unwrap().remove("llama_4_scaling_beta");
    let dir = fixture_of("ministral3", "text_config", no_beta);
    run(&dir, "rope_parameters.llama_4_scaling_beta: missing");
    let dir = fixture_with_tensor("gemma3", "language_model.model.layers.1.self_attn.k_norm.weight", None);
    run(&dir, "language_model.model.layers.1.self_attn.k_norm.weight");
    let dir = fixture_of("granite", "residual_multiplier", serde_json::Value::Null);
    run(&dir, "residual_multiplier: missing");
    let dir = fixture_with_tensor("olmo2", "model.layers.1.post_feedforward_layernorm.weight", None);
    run(&dir, "model.layers.1.post_feedforward_layernorm.weight");
    let dir = fixture_with_tensor("glm4", "model.layers.0.post_mlp_layernorm.weight", None);
    run(&dir, "model.layers.0.post_mlp_layernorm.weight");
    let dir = fixture_of("glm4_moe", "scoring_func", serde_json::json!("softmax"));
    run(&dir, "scoring_func: router mode \"softmax\" is not supported");
    let dir = fixture_with_tensor("glm4_moe", "model.layers.2.mlp.gate.e_score_correction_bias", None);
    run(&dir, "model.layers.2.mlp.gate.e_score_correction_bias");
    let dir = fixture_of("deepseek_v3", "kv_lora_rank", serde_json::json!(16));
    run(
        &dir,
        "tensor model.layers.0.self_attn.kv_a_proj_with_mqa.weight: expected shape [32, 64] from config.json, got [48, 64]",
    );
    let dir = fixture_renaming("deepseek_v3", "embed_q.weight", "kv_b_proj.weight");
    run(
        &dir,
        "tensor `model.layers.0.self_attn.kv_b_proj.weight`: wrong shape: expected a 2-D [out, in] weight, got [4, 32, 32]",
    );
    let dir = fixture_of("deepseek_v3", "topk_method", serde_json::json!("group_limited_greedy"));
    run(&dir, "topk_method: router mode \"group_limited_greedy\" is not supported");
    let dir = fixture_with_tensor("gemma4_text", "model.embed_tokens_per_layer.weight", None);
    run(&dir, "model.embed_tokens_per_layer.weight");
    let dir = fixture_of("gemma4_text", "enable_moe_block", serde_json::json!(true));
    run(&dir, "num_experts: missing");
    let dir = fixture_with_tensor("gemma4_moe", "model.layers.1.router.per_expert_scale", None);
    run(&dir, "model.layers.1.router.per_expert_scale");
    let dir = fixture_with_tensor("gpt_oss", "model.layers.1.self_attn.sinks", None);
    run(&dir, "model.layers.1.self_attn.sinks");
    let dir = fixture_of("gemma4_text", "num_kv_shared_layers", serde_json::json!(5));
    run(&dir, "num_kv_shared_layers: 5 leaves none of the 5 layers its own keys");
    let dir = fixture_with_tensor("gemma4", "language_model.model.layers.1.self_attn.k_proj.weight", None);
    run(&dir, "language_model.model.layers.1.self_attn.k_proj.weight");
}

/// A copy of fixture `family`'s f32 checkpoint with each tensor as `edit` gives it back from
/// its (name, shape, bytes): renamed, reshaped, or left out (`None`).
fn fixture_edited(
    family: &str,
    edit: impl Fn(&str, &[usize], &[u8]) -> Option<(String, Vec<usize>, Vec<u8>)>,
) -> tempfile::TempDir {
    let src = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures").join(family).join("f32");
    let dir = tempfile::tempdir().unwrap();
    std::fs::copy(src.join("config.json"), dir.path().join("config.json")).unwrap();
    let ckpt = weights::Checkpoint::open(&src).unwrap();
    let mut out = weights::write::Writer::new();
    for stored in ckpt.tensor_names() {
        let t = ckpt.tensor(stored).unwrap();
        if let Some((name, shape, bytes)) = edit(stored, t.shape(), t.bytes()) {
            out.add(&name, t.dtype(), &shape, bytes).unwrap();
        }
    }
    out.write(dir.path().join("model.safetensors")).unwrap();
    dir
}

/// A copy of fixture `family`'s f32 checkpoint with tensor `name` left out (`taps: None`)
/// or cut to its first `taps` convolution taps (a `[channels, kernel, 1]` weight).
fn fixture_with_tensor(family: &str, name: &str, taps: Option<usize>) -> tempfile::TempDir {
    fixture_edited(family, |stored, shape, bytes| {
        if stored != name {
            return Some((stored.to_string(), shape.to_vec(), bytes.to_vec()));
        }
        let taps = taps?;
        // Each channel's taps are contiguous (`[channels, kernel, 1]`, row-major).
        let tap = bytes.len() / (shape[0] * shape[1]);
        let cut: Vec<u8> = bytes.chunks(shape[1] * tap).flat_map(|channel| channel[..taps * tap].to_vec()).collect();
        Some((stored.to_string(), vec![shape[0], taps, 1], cut))
    })
}

/// A copy of fixture `family`'s f32 checkpoint with every tensor whose name ends in `from`
/// renamed to end in `to`.
fn fixture_renaming(family: &str, from: &str, to: &str) -> tempfile::TempDir {
    fixture_edited(family, |stored, shape, bytes| {
        let name = stored.strip_suffix(from).map_or_else(|| stored.to_string(), |head| format!("{head}{to}"));
        Some((name, shape.to_vec(), bytes.to_vec()))
    })
}

/// A hybrid checkpoint (gated DeltaNet, LFM2's short convolutions) with a state tensor
/// missing or misshapen: one line naming the tensor as stored, exit 2, nothing compiled.
#[test]
fn a_malformed_hybrid_checkpoint_is_one_line() {
    let conv = "model.layers.0.linear_attn.conv1d.weight";
    let a_log = "model.layers.2.linear_attn.A_log";
    let missing = fixture_with_tensor("qwen3_next", a_log, None);
    // The conv kernel one tap short: [channels, 3, 1] where config.json says 4.
    let short = fixture_with_tensor("qwen3_next", conv, Some(3));
    // LFM2: a short convolution one tap short, and an attention projection missing, named
    // as LFM2 spells it (`out_proj` where the others have `o_proj`).
    let lfm2_conv = "model.layers.0.conv.conv.weight";
    let lfm2_short = fixture_with_tensor("lfm2", lfm2_conv, Some(2));
    let out_proj = "model.layers.2.self_attn.out_proj.weight";
    let lfm2_missing = fixture_with_tensor("lfm2", out_proj, None);
    for (dir, want) in [
        (&missing, a_log.to_string()),
        (&short, format!("tensor {conv}: expected shape [128, 4, 1]")),
        (&lfm2_short, format!("tensor {lfm2_conv}: expected shape [64, 3, 1]")),
        (&lfm2_missing, out_proj.to_string()),
    ] {
        let cache = tempfile::tempdir().unwrap();
        let args = ["trajectory", "--model", dir.path().to_str().unwrap(), "--prompt-ids", "1,2", "--steps", "2"];
        let out = mlx_iree(&[&args[..], &["--out", "/tmp/x.json"]].concat(), cache.path());
        let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
        assert_eq!(out.status.code(), Some(2), "{stderr}");
        assert_eq!(stderr.trim_end().lines().count(), 1, "one line: {stderr}");
        assert!(stderr.contains(&want), "{want}: {stderr}");
        assert!(
            walk(cache.path()).iter().all(|p| p.extension().is_none_or(|e| e != "vmfb")),
            "compiled before refusing"
        );
    }
}

/// The llama fixture's mxfp4 variant with `edit` applied to its config and `tensor` (name,
/// then the dtype and shape to store it as, its bytes cut or padded to fit) rewritten.
fn mxfp4_with(
    edit: impl Fn(&mut serde_json::Value),
    tensor: Option<(&str, weights::Dtype, &[usize])>,
) -> tempfile::TempDir {
    quantized_with("mxfp4", edit, tensor, None)
}

/// The llama fixture's `variant` with `edit` applied to its config, `tensor` (name, then the
/// dtype and shape to store it as, its bytes cut or padded to fit) rewritten and `patch`
/// (name, byte offset, value) setting one byte of a tensor.
fn quantized_with(
    variant: &str,
    edit: impl Fn(&mut serde_json::Value),
    tensor: Option<(&str, weights::Dtype, &[usize])>,
    patch: Option<(&str, usize, u8)>,
) -> tempfile::TempDir {
    let src =
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures/llama_llama3_tied").join(variant);
    let dir = tempfile::tempdir().unwrap();
    std::fs::copy(src.join("model.safetensors.index.json"), dir.path().join("model.safetensors.index.json")).unwrap();
    let mut config: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(src.join("config.json")).unwrap()).unwrap();
    edit(&mut config);
    std::fs::write(dir.path().join("config.json"), config.to_string()).unwrap();
    let file = weights::SafetensorsFile::open(src.join("model.safetensors")).unwrap();
    let mut w = weights::write::Writer::new();
    for (k, v) in file.metadata() {
        w.metadata(k, v);
    }
    for t in file.tensors() {
        let mut bytes = t.bytes().to_vec();
        if let Some((name, at, value)) = patch
            && name == t.name()
        {
            bytes[at] = value;
        }
        match tensor {
            Some((name, dtype, shape)) if name == t.name() => {
                bytes.resize(shape.iter().product::<usize>() * dtype.size_bytes(), 0);
                w.add(name, dtype, shape, bytes).unwrap();
            }
            _ => {
                w.add(t.name(), t.dtype(), t.shape(), bytes).unwrap();
            }
        }
    }
    w.write(dir.path().join("model.safetensors")).unwrap();
    dir
}

/// A quantization the checkpoint cannot hold: an unknown `mode`, a group size its mode does
/// not allow, scales of another dtype or shape than the mode's. One line naming the setting
/// or tensor and what was expected, exit 2, nothing compiled.
#[test]
fn malformed_quantization_is_one_line() {
    let run = |dir: &tempfile::TempDir, expected: &[&str]| {
        let stderr = refused_in_one_line(dir.path(), "f32");
        assert!(expected.iter().all(|e| stderr.contains(e)), "{expected:?}: {stderr}");
    };
    let both = |key: &'static str, value: serde_json::Value| {
        move |c: &mut serde_json::Value| {
            c["quantization"][key] = value.clone();
            c["quantization_config"][key] = value.clone();
        }
    };
    run(&mxfp4_with(both("mode", "mxint4".into()), None), &["quantization.mode", "mxint4"]);
    run(&mxfp4_with(both("group_size", 64.into()), None), &["mode mxfp4 takes bits 4 and group_size 32"]);
    let scales = "model.layers.0.mlp.down_proj.scales";
    // [64 rows, 128 inputs / 32] E8M0 bytes, stored as f16 or with a group too few.
    run(&mxfp4_with(|_| {}, Some((scales, weights::Dtype::F16, &[64, 4]))), &[scales, "U8"]);
    // A group too few: the weight disagrees with what the scales say of the input size.
    let weight = "model.layers.0.mlp.down_proj.weight";
    run(&mxfp4_with(|_| {}, Some((scales, weights::Dtype::U8, &[64, 3]))), &[weight, "from the scales", "[64, 16]"]);
}
