//! The accuracy gate: its arithmetic; f16, bf16 and packed against f32 on real weights and
//! on the trained fixtures; f16 on the random fixtures; packed against mlx-lm itself.

#![allow(clippy::unwrap_used)] // a test that cannot unwrap has failed; helpers included

use engine::gate::{self, PromptResult, Reference, Report};
use engine::{Engine, EngineConfig, KernelSetting, KvElem, Precision};
use std::path::{Path, PathBuf};

mod common;
use common::{SMOLLM2_CONTEXT, mlx_iree, root, smollm2};

#[test]
fn pass_rule() {
    let p = |steps, exact, agreeing| PromptResult {
        prompt_len: 1,
        steps,
        exact_steps: exact,
        first_divergence: (exact < steps).then_some(exact),
        agreeing_steps: agreeing,
    };
    assert!(Report { prompts: vec![p(40, 40, 40), p(40, 40, 40)] }.passed());
    // 199 of 200 agree: 99.5% >= 99%.
    let r = Report { prompts: vec![p(100, 10, 99), p(100, 100, 100)] };
    assert!(!r.all_exact() && r.passed());
    // 197 of 200: 98.5%.
    assert!(!Report { prompts: vec![p(100, 10, 97), p(100, 100, 100)] }.passed());
}

#[test]
fn references_from_both_json_forms() {
    let one = r#"{"prompt_ids":[1,2],"token_ids":[3,4,5],"device":"local-task","precision":"f32"}"#;
    assert_eq!(
        gate::references_from_json(one).unwrap(),
        vec![Reference { prompt_ids: vec![1, 2], token_ids: vec![3, 4, 5] }]
    );
    let many = r#"{"trajectories":[{"prompt_ids":[1],"token_ids":[2]},{"prompt_ids":[3],"token_ids":[4]}]}"#;
    assert_eq!(gate::references_from_json(many).unwrap().len(), 2);
    assert_eq!(gate::references_from_json(r#"{"prompt_ids":[1]}"#).unwrap_err(), "missing `token_ids` list");
    assert_eq!(
        gate::references_from_json(r#"{"prompt_ids":[1],"token_ids":[-1]}"#).unwrap_err(),
        "`token_ids` holds a non-id -1"
    );
}

/// Every fixture folder (one per model family and option) under `tests/<set>`, sorted.
fn fixture_set(set: &str, at_least: usize) -> Vec<PathBuf> {
    let dir = root().join("tests").join(set);
    let mut names: Vec<_> =
        std::fs::read_dir(&dir).unwrap().flatten().filter(|e| e.path().is_dir()).map(|e| e.path()).collect();
    names.sort();
    assert!(names.len() >= at_least, "{}: {} fixtures", dir.display(), names.len());
    names
}

/// The random-weight fixtures (tests/fixtures/README.md).
fn fixtures() -> Vec<PathBuf> {
    fixture_set("fixtures", 8)
}

/// mlx-lm's trajectories in `file` of a fixture variant folder.
fn references(dir: &Path, file: &str) -> Vec<Reference> {
    gate::references_from_json(&std::fs::read_to_string(dir.join(file)).unwrap()).unwrap()
}

/// Families whose 8-bit variants also run packed, and (F16_KV_FAMILIES, listed with their
/// tests below) whose engines also run an f16 KV cache: tests/tests/kernels.rs proves every
/// kernel object computes the Rust model's bits at 4 and 8 bits and the cache's element type
/// is the same code in every family, so these cover a tied and an untied output projection,
/// QK norms, both Gemma generations' windows and 8-bit experts (`qmve`); every family more
/// is one more module to compile (about 25 s in CI).
const Q8_PACKED_FAMILIES: [&str; 4] = ["llama_llama3_tied", "llama_linear_untied", "gemma3_text", "qwen3_moe"];
/// The F16_KV_FAMILIES whose engines also run an f16 KV cache with f16 weights.
const F16_KV_F16_WEIGHTS: [&str; 2] = ["llama_llama3_tied", "gemma2"];
/// The F16_KV_FAMILIES whose 4-bit variants also run packed with an f16 KV cache: decode
/// attention in the CPU kernel's f16 form (tests/tests/kernels.rs holds its bits), here
/// with sliding-window layers, and a hybrid model's attention layers beside its f32 state
/// (qwen3_5: the bench's `--kv-cache f16` rows run this).
const F16_KV_PACKED: [&str; 2] = ["gemma3_text", "qwen3_5"];
/// The trained families whose 4-bit variants also run packed with an 8-bit KV cache (the
/// CPU kernel's q8 form): grouped-query heads, sliding-window layers, and a hybrid model's
/// attention layers beside its f32 state.
const Q8_KV_PACKED: [&str; 3] = ["qwen3", "gemma3_text", "qwen3_5"];
/// The family whose 4-bit variant also runs through every other kernel object the host runs.
const OTHER_KERNELS_FAMILY: &str = "llama_llama3_tied";
/// The family whose 4-bit variant also runs in the graph form (no CPU kernel), as on every
/// target but the CPU: a mixture of experts, whose packed experts the graph gathers and
/// dequantizes itself (a one-row decode) or runs all at once (a prompt), beside 8-bit
/// routers and a dense layer.
const GRAPH_FORM_FAMILY: &str = "qwen3_moe";

/// The gate's report for `precision` on `dir` (local-task) against `refs`.
fn check(dir: &Path, precision: Precision, refs: &[Reference]) -> Report {
    check_kv(dir, precision, KvElem::F32, refs)
}

/// [`check`] with the KV cache in `kv`.
fn check_kv(dir: &Path, precision: Precision, kv: KvElem, refs: &[Reference]) -> Report {
    check_with(dir, precision, kv, KernelSetting::Auto, refs)
}

/// [`check`] with the KV cache in `kv` and the kernels `kernels`.
fn check_with(dir: &Path, precision: Precision, kv: KvElem, kernels: KernelSetting, refs: &[Reference]) -> Report {
    let steps = refs.iter().map(|r| r.token_ids.len()).max().unwrap();
    let longest = refs.iter().map(|r| r.prompt_ids.len()).max().unwrap();
    let context = (longest + steps).next_power_of_two().max(64);
    let config = if (precision, kv, kernels) == (Precision::F32, KvElem::F32, KernelSetting::Auto) {
        // The trained fixtures have their random twins' configs, so at f32 this is batch.rs's
        // and fixtures.rs's module of the family: one sequence runs its one-row functions and
        // never asks for drafts. (With one slot it was a module of its own per family: 11
        // compiles more per suite; docs/PERFORMANCE.md, "Test suite time, evening".)
        common::eight_slot_engine_for(precision, context, &dir.display().to_string())
    } else {
        EngineConfig {
            max_context: Some(context),
            kv_elem: kv,
            kernels,
            // Storing the weights in final form is proven by crates/engine/tests/stored_parameters.rs;
            // here it would add an encoder to every module's compile.
            store_parameters: false,
            ..EngineConfig::new("local-task", precision, common::compile_cache())
        }
    };
    let mut engine = Engine::load(dir, &config).unwrap();
    gate::check(&mut engine, refs).unwrap()
}

/// An f16 KV cache, gated like a weight precision: with f32 weights it is token-exact with
/// mlx-lm's f32 trajectories on the trained fixtures of F16_KV_FAMILIES, and with f16
/// weights on F16_KV_F16_WEIGHTS.
fn f16_kv_cache_passes_the_gate_on_the_trained_fixture(family: &str) {
    let dir = root().join("tests/fixtures-trained").join(family).join("f32");
    let refs = references(&dir, "expected.json");
    let report = check_kv(&dir, Precision::F32, KvElem::F16, &refs);
    assert!(report.all_exact(), "{}: f16 KV agreement {:.3}", dir.display(), report.agreement());
    if F16_KV_F16_WEIGHTS.contains(&family) {
        let report = check_kv(&dir, Precision::F16, KvElem::F16, &refs);
        assert!(report.all_exact(), "{}: f16 weights and KV agreement {:.3}", dir.display(), report.agreement());
    }
    if F16_KV_PACKED.contains(&family) {
        let dir = root().join("tests/fixtures-trained").join(family).join("q4");
        let report = check_kv(&dir, Precision::Packed, KvElem::F16, &references(&dir, "expected.json"));
        assert!(report.all_exact(), "{}: packed with f16 KV agreement {:.3}", dir.display(), report.agreement());
    }
}

/// One test per family, so that their compiles run side by side (each on one core).
macro_rules! f16_kv_families {
    ($($family:ident),*) => {
        const F16_KV_FAMILIES: &[&str] = &[$(stringify!($family)),*];
        mod f16_kv_cache {
            $(
                #[test]
                fn $family() {
                    super::f16_kv_cache_passes_the_gate_on_the_trained_fixture(stringify!($family));
                }
            )*
        }
    };
}

f16_kv_families!(llama_llama3_tied, qwen3, gemma2, gemma3_text, qwen3_5);

/// An 8-bit KV cache on the random fixtures, against mlx-lm's float32 trajectories with its
/// own caches rounding every stored row through the same format (expected_q8kv.json, from
/// xtask/python/q8_kv_reference.py): the near ties that flip under 8-bit rounding flip alike
/// on both sides, so f32 weights with `--kv-cache q8` are token-exact for all 40 steps. (Against
/// expected.json they are not, as bf16 weights are not: deepseek_v3 agrees on 82.5% of the
/// teacher-forced steps with a q8 cache, 91.7% with bf16 weights.) All 31 families with a
/// cached decode were measured token-exact (every_fixture_family_is_swept checks each has
/// its file); these run in the suite, one per kind of cache the format has to hold: plain
/// grouped-query rows (llama), a latent
/// attention's latents and rotated keys (deepseek_v3), sinks beside sliding-window layers
/// (gpt_oss), rotating window caches (gemma3), layers reading another layer's cache
/// (gemma4), and attention beside recurrent state (qwen3_5). Each is one more module to
/// compile (all 31 took 298 s on two cores, side by side).
fn q8_kv_cache_matches_mlx_lm_rounding(family: &str) {
    let dir = root().join("tests/fixtures").join(family).join("f32");
    let report = check_kv(&dir, Precision::F32, KvElem::Q8, &references(&dir, "expected_q8kv.json"));
    assert!(report.all_exact(), "{}: q8 KV agreement {:.3}", dir.display(), report.agreement());
}

/// One test per family, so that their compiles run side by side (each on one core).
macro_rules! q8_kv_families {
    ($($family:ident),*) => {
        const Q8_KV_FAMILIES: &[&str] = &[$(stringify!($family)),*];
        mod q8_kv_cache {
            $(
                #[test]
                fn $family() {
                    super::q8_kv_cache_matches_mlx_lm_rounding(stringify!($family));
                }
            )*
        }
    };
}

q8_kv_families!(llama_llama3_tied, deepseek_v3, gpt_oss, gemma3, gemma4, qwen3_5);

/// f16 weights against f32, teacher-forced along the fixture variants' f32 trajectories (40
/// steps; mlx-lm's, which the f32 path reproduces exactly, see fixtures.rs): the gate passes
/// on all of them, near ties included.
fn f16_passes_the_gate(family: &str) {
    for variant in ["f32", "q4", "q8"] {
        let dir = root().join("tests/fixtures").join(family).join(variant);
        let report = check(&dir, Precision::F16, &references(&dir, "expected.json"));
        assert!(report.passed(), "{}: f16 agreement {:.3}", dir.display(), report.agreement());
    }
}

/// Packed 4- and 8-bit weights, dequantized inside the contractions, against mlx-lm's own
/// float32 trajectories of the quantized fixtures (every family at 4 bits, Q8_PACKED_FAMILIES
/// at 8): token-exact for all 40 steps through the host's default CPU kernel, and through
/// each other kernel this host runs (AVX-512 and AVX2 on an AMX host) on one family's 4-bit
/// variant. That is enough for the others: tests/tests/kernels.rs proves every object
/// computes the same bits as the Rust model at 4 and 8 bits, so this only has to show that
/// the object is linked and called; each family or variant more is one more compile.
fn packed_matches_mlx_lm(family: &str) {
    // `host_isas` is fastest first, and the default (`host_isa`) is its first.
    let others: Vec<KernelSetting> = match family {
        OTHER_KERNELS_FAMILY => kernels::cpu::host_isas().skip(1).map(KernelSetting::Force).collect(),
        _ => Vec::new(),
    };
    let q8 = Q8_PACKED_FAMILIES.contains(&family).then_some(("q8", KernelSetting::Auto));
    let graph = (family == GRAPH_FORM_FAMILY).then_some(("q4", KernelSetting::Off));
    let runs =
        [("q4", KernelSetting::Auto)].into_iter().chain(q8).chain(graph).chain(others.into_iter().map(|k| ("q4", k)));
    for (variant, setting) in runs {
        let dir = root().join("tests/fixtures").join(family).join(variant);
        let report = check_with(&dir, Precision::Packed, KvElem::F32, setting, &references(&dir, "expected.json"));
        let agreement = report.agreement();
        assert!(report.all_exact(), "{} ({setting:?}): packed agreement {agreement:.3}", dir.display());
    }
}

/// MLX's other formats, held packed (affine 3 and 6 bits, mxfp4 and nvfp4 as stored; affine 2
/// bits as an exact 4-bit copy, 5 bits as 8; mlx-lm's mixed_3_6 recipe both 3 and 6 in one
/// model), against mlx-lm's own float32 trajectories of llama_llama3_tied's variants in
/// them, through the host's CPU kernel: token-exact for all 40 steps, but for q5 and mxfp4,
/// which pass the gate (measured 119 of 120 teacher-forced steps: the kernel's i16 rounding of
/// x, which MLX does not do, flips a near tie; the graph form agrees to the step). (q2 and q5
/// share the q4 and q8 variants' modules: the same widths, group size and scale type.)
#[test]
fn packed_holds_every_mlx_format() {
    let exact = [("q2", true), ("q3", true), ("q5", false), ("q6", true), ("mixed_3_6", true)];
    for (variant, exact) in exact.into_iter().chain([("mxfp4", false), ("nvfp4", true)]) {
        let dir = root().join("tests/fixtures/llama_llama3_tied").join(variant);
        let refs = references(&dir, "expected.json");
        let report = check_with(&dir, Precision::Packed, KvElem::F32, KernelSetting::Auto, &refs);
        let agreement = report.agreement();
        assert!(report.passed(), "{variant}: packed agreement {agreement:.3}");
        assert!(!exact || report.all_exact(), "{variant}: packed agreement {agreement:.3}, not token-exact");
    }
}

/// mxfp8 held as stored (one byte a weight), in both its forms: the CPU kernel's product
/// (`hmv_mxfp8`) and the graph's (codes widened where they are used, the portable form):
/// MLX's dequantized values multiplied in f32, token-exact with mlx-lm's own trajectories of
/// llama_llama3_tied's mxfp8 variant; and qwen3_moe's, whose stacked experts the graph
/// widens as a step picks them (its routers affine 8-bit, as mlx-lm keeps them).
#[test]
fn packed_mxfp8_matches_mlx_lm_in_both_forms() {
    let runs = [
        ("llama_llama3_tied", KernelSetting::Auto),
        ("llama_llama3_tied", KernelSetting::Off),
        ("qwen3_moe", KernelSetting::Auto),
    ];
    for (family, setting) in runs {
        let dir = root().join("tests/fixtures").join(family).join("mxfp8");
        let report = check_with(&dir, Precision::Packed, KvElem::F32, setting, &references(&dir, "expected.json"));
        assert!(report.all_exact(), "{family} {setting:?}: packed agreement {:.3}", report.agreement());
    }
}

/// gpt-oss as released, in mxfp4 (its experts through `qmve` at 8 bits, its routers affine
/// 8-bit): packed token-exact with mlx-lm's own trajectories.
#[test]
fn packed_gpt_oss_mxfp4_matches_mlx_lm() {
    let dir = root().join("tests/fixtures/gpt_oss/mxfp4");
    let report =
        check_with(&dir, Precision::Packed, KvElem::F32, KernelSetting::Auto, &references(&dir, "expected.json"));
    assert!(report.all_exact(), "packed agreement {:.3}", report.agreement());
}

/// The random-weight fixture sweeps, one test per family and sweep so that they compile side
/// by side (each compile runs on one core).
macro_rules! per_family {
    ($($family:ident),*) => {
        const FAMILIES: &[&str] = &[$(stringify!($family)),*];
        $(
            mod $family {
                #[test]
                fn f16_passes_the_gate() {
                    super::f16_passes_the_gate(stringify!($family));
                }
                #[test]
                fn packed_matches_mlx_lm() {
                    super::packed_matches_mlx_lm(stringify!($family));
                }
            }
        )*
    };
}

per_family!(
    deepseek_v3,
    deepseek_v3_kv_b,
    gemma,
    gemma2,
    gemma2_window,
    gemma3,
    gemma3_text,
    gemma4,
    gemma4_moe,
    gemma4_text,
    glm4,
    glm4_moe,
    gpt_oss,
    granite,
    lfm2,
    llama_linear_untied,
    llama_llama3_tied,
    ministral3,
    mistral,
    mistral3,
    mixtral,
    olmo2,
    olmo3,
    phi3,
    qwen2,
    qwen2_moe,
    qwen3,
    qwen3_5,
    qwen3_5_moe,
    qwen3_moe,
    qwen3_next,
    smollm3
);

#[test]
fn every_fixture_family_is_swept() {
    let names: Vec<String> = fixtures().iter().map(|p| p.file_name().unwrap().to_string_lossy().into_owned()).collect();
    assert_eq!(names, FAMILIES, "a fixture family without its tests in gate.rs's per_family!");
    let named = Q8_PACKED_FAMILIES.iter().chain(F16_KV_FAMILIES).chain(Q8_KV_FAMILIES);
    for family in named.chain([&OTHER_KERNELS_FAMILY, &GRAPH_FORM_FAMILY]) {
        assert!(FAMILIES.contains(family), "{family} is not a fixture family");
    }
    for dir in fixtures().iter().filter(|d| !d.ends_with("gemma2_window")) {
        let file = dir.join("f32/expected_q8kv.json");
        assert!(file.is_file(), "{} is missing: run cargo xtask fixtures --force", file.display());
    }
    for family in F16_KV_F16_WEIGHTS.iter().chain(&F16_KV_PACKED) {
        assert!(F16_KV_FAMILIES.contains(family), "{family} has no f16 KV cache test");
    }
    for family in Q8_KV_PACKED {
        assert!(TRAINED_FAMILIES.contains(&family), "{family} has no trained fixture for the q8 KV cache test");
    }
}

/// The trained fixtures (tests/fixtures-trained/README.md) are confident, as real
/// checkpoints are: there f32 is token-exact with mlx-lm, and bf16, f16 and packed are
/// token-exact with that f32 trajectory (so they pass the gate against f32) on every variant
/// (packed 8-bit on Q8_PACKED_FAMILIES).
///
/// An 8-bit KV cache (`--kv-cache q8`) is gated the same way, as bf16 weights are: both keep
/// about 8 significant bits, and under either the random fixtures' near ties flip (bf16
/// weights and a q8 cache both gave qwen3's 98.3% teacher-forced agreement there; there it is
/// checked against mlx-lm's own rounding instead, `q8_kv_cache_matches_mlx_lm_rounding`):
/// token-exact with f32 weights (the cache in the graph form), and packed on Q8_KV_PACKED (in
/// the CPU kernel's q8 form; tests/tests/kernels.rs holds its bits).
fn every_precision_passes_the_gate_on_the_trained_fixture(family: &str) {
    let fixture = root().join("tests/fixtures-trained").join(family);
    for variant in ["f32", "q4", "q8"] {
        let dir = fixture.join(variant);
        let refs = references(&dir, "expected.json");
        let f32 = check(&dir, Precision::F32, &refs);
        assert!(f32.all_exact(), "{}: f32 agreement with mlx-lm {:.3}", dir.display(), f32.agreement());
        let q8_kv = match variant {
            "f32" => Some(Precision::F32),
            "q4" if Q8_KV_PACKED.contains(&family) => Some(Precision::Packed),
            _ => None,
        };
        if let Some(precision) = q8_kv {
            let report = check_kv(&dir, precision, KvElem::Q8, &refs);
            assert!(
                report.all_exact(),
                "{}: {precision} with q8 KV agreement {:.3}",
                dir.display(),
                report.agreement()
            );
        }
        let q8_packed = Q8_PACKED_FAMILIES.contains(&family);
        let packed = (variant == "q4" || (variant == "q8" && q8_packed)).then_some(Precision::Packed);
        for precision in [Precision::BF16, Precision::F16].into_iter().chain(packed) {
            let report = check(&dir, precision, &refs);
            assert!(report.all_exact(), "{}: {precision} agreement {:.3}", dir.display(), report.agreement());
        }
    }
}

/// One test per trained fixture, so that their compiles run side by side.
macro_rules! per_trained_family {
    ($($family:ident),*) => {
        const TRAINED_FAMILIES: &[&str] = &[$(stringify!($family)),*];
        mod trained {
            $(
                #[test]
                fn $family() {
                    super::every_precision_passes_the_gate_on_the_trained_fixture(stringify!($family));
                }
            )*
        }
    };
}

per_trained_family!(
    gemma,
    gemma2,
    gemma3_text,
    lfm2,
    llama_linear_untied,
    llama_llama3_tied,
    mistral,
    mixtral,
    phi3,
    qwen2,
    qwen2_moe,
    qwen3,
    qwen3_5,
    qwen3_moe
);

#[test]
fn every_trained_fixture_is_gated() {
    let names: Vec<String> = fixture_set("fixtures-trained", 7)
        .iter()
        .map(|p| p.file_name().unwrap().to_string_lossy().into_owned())
        .collect();
    assert_eq!(names, TRAINED_FAMILIES, "a trained fixture without its test in gate.rs's per_trained_family!");
}

/// The graph-level packed form (what CUDA and CPUs without the kernel run), forced on CPU
/// with `MLX_IREE_KERNELS=0`, against mlx-lm on one quantized fixture per family.
#[test]
fn packed_graph_form_matches_mlx_lm() {
    // gpt_oss/mxfp4: stacked experts as each expert's exact 8-bit copy.
    let fixtures = [
        "llama_llama3_tied/q4",
        "qwen3/q8",
        "gemma2_window/q4",
        "gemma3_text/q8",
        "llama_llama3_tied/nvfp4",
        "gpt_oss/mxfp4",
    ];
    for fixture in fixtures {
        let dir = root().join("tests/fixtures").join(fixture);
        let reference = dir.join("expected.json");
        let out = mlx_iree()
            .args(["gate", "--model", dir.to_str().unwrap(), "--precision", "packed", "--steps", "40"])
            .args(["--reference", reference.to_str().unwrap(), "--max-context", "64"])
            .env("MLX_IREE_KERNELS", "0")
            .env("MLX_IREE_STORE_PARAMETERS", FIXTURE_STORE_PARAMETERS)
            .output()
            .unwrap();
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert_eq!(out.status.code(), Some(0), "{fixture}: {stdout}{}", String::from_utf8_lossy(&out.stderr));
        assert!(stdout.contains("token-exact on every prompt: yes"), "{fixture}: {stdout}");
    }
}

/// The context of the trained fixtures' engines in the other gate tests, and their setting
/// of `MLX_IREE_STORE_PARAMETERS` (`store_parameters: false` in [`check_with`]), so the CLI
/// shares their one-slot modules (all but plain f32's, which [`check_with`] takes from
/// batch.rs: the CLI's f32 references of three fixtures are one-slot modules of their own).
const FIXTURE_CONTEXT: &str = "64";
const FIXTURE_STORE_PARAMETERS: &str = "0";

/// `mlx-iree gate --model DIR --precision P --steps N --max-context C [EXTRA]` against f32:
/// exit status and stdout. A fixture's engines (under tests/) share the in-process tests'
/// modules; SmolLM2's run as users run them, weights stored.
fn gate_cli(dir: &Path, precision: &str, steps: usize, context: &str, extra: &[&str]) -> (i32, String) {
    let store = if dir.starts_with(root().join("tests")) { FIXTURE_STORE_PARAMETERS } else { "1" };
    gate_cli_storing(dir, precision, steps, context, extra, store)
}

/// [`gate_cli`] with `MLX_IREE_STORE_PARAMETERS` set to `store`.
fn gate_cli_storing(
    dir: &Path,
    precision: &str,
    steps: usize,
    context: &str,
    extra: &[&str],
    store: &str,
) -> (i32, String) {
    assert!(dir.join("config.json").exists(), "test model missing at {}: run `cargo xtask model` first", dir.display());
    let out = mlx_iree()
        .args(["gate", "--model", dir.to_str().unwrap(), "--precision", precision, "--steps", &steps.to_string()])
        .args(["--max-context", context])
        .args(extra)
        .env("MLX_IREE_STORE_PARAMETERS", store)
        .output()
        .unwrap();
    (out.status.code().unwrap_or(-1), String::from_utf8_lossy(&out.stdout).into_owned())
}

/// `--kv-cache f16` through the CLI gate, against the f32 path with an f32 cache (on a trained
/// fixture: SmolLM2's f16 cache would be two more of its slow compiles for what
/// the f16_kv_cache tests already show).
#[test]
fn f16_kv_cache_gate_cli_passes_on_a_trained_fixture() {
    let dir = root().join("tests/fixtures-trained/qwen3/f32");
    let (code, stdout) = gate_cli(&dir, "f32", 40, FIXTURE_CONTEXT, &["--kv-cache", "f16"]);
    assert_eq!(code, 0, "{stdout}");
    assert!(stdout.contains("token-exact on every prompt: yes") && stdout.contains("-> PASS"), "{stdout}");
}

/// `--kv-cache q8` on SmolLM2 packed (the CPU kernel's q8 attention), through the CLI gate
/// against the f32 path with an f32 cache, as f16 weights are gated on SmolLM2: it passes
/// (measured 99.2%: one near tie flips, at step 12 of the first prompt). Against mlx-lm's
/// float32 oracle it does not (97.9%), and neither would mlx-lm's own 8-bit cache (`kv_bits`
/// 8, group 64: its tokens leave the oracle's at steps 14 and 47 of the two prompts),
/// docs/PERFORMANCE.md.
#[test]
fn checkpoint_smollm2_q8_kv_cache_passes_the_gate() {
    let dir = smollm2();
    let (code, stdout) = gate_cli(&dir, "packed", 32, SMOLLM2_CONTEXT, &["--kv-cache", "q8"]);
    assert_eq!(code, 0, "{stdout}");
    assert!(stdout.contains("-> PASS") && stdout.contains("(4 prompts x 32 steps)"), "{stdout}");
}

/// f16 weights on a real checkpoint, with its near ties, against f32 (bf16 is gated on the
/// trained fixtures, every_precision_passes_the_gate_on_the_trained_fixtures). Named to sort
/// near the front: libtest starts tests in name order, and this is the binary's longest
/// sequential stretch (one process compiling two SmolLM2 modules, about 3 minutes), which
/// started last left the second core idle to the end.
#[test]
fn checkpoint_smollm2_f16_passes_the_gate() {
    let (code, stdout) =
        gate_cli(&root().join("target/models/smollm2-135m-instruct-f16"), "f16", 32, SMOLLM2_CONTEXT, &[]);
    assert_eq!(code, 0, "{stdout}");
    assert!(stdout.contains("-> PASS"), "{stdout}");
    assert_eq!(stdout.matches("prompt ").count(), 4, "{stdout}");
}

/// A mixture of experts as users run it, its weights stored in final form (data-tiled, the
/// parameter encoder's output): both engines load (the routers and Qwen2-MoE's shared
/// expert gate once came out unbound: "no provider registered that handles scopes like
/// 'model'"), and f16 keeps f32's tokens.
#[test]
fn moe_gate_cli_passes_with_stored_parameters() {
    let dir = root().join("tests/fixtures-trained/qwen2_moe/f32");
    let (code, stdout) = gate_cli_storing(&dir, "f16", 40, FIXTURE_CONTEXT, &[], "1");
    assert_eq!(code, 0, "{stdout}");
    assert!(stdout.contains("token-exact on every prompt: yes") && stdout.contains("-> PASS"), "{stdout}");
}

/// The command the issue names, on a trained fixture with no tokenizer (the fixed id prompts).
#[test]
fn bf16_gate_cli_passes_against_f32_on_a_trained_fixture() {
    let (code, stdout) = gate_cli(&root().join("tests/fixtures-trained/gemma2/q4"), "bf16", 40, FIXTURE_CONTEXT, &[]);
    assert_eq!(code, 0, "{stdout}");
    assert!(stdout.contains("against f32 on local-task (3 prompts x 40 steps)"), "{stdout}");
    assert!(stdout.contains("token-exact on every prompt: yes") && stdout.contains("-> PASS"), "{stdout}");
}

/// SmolLM2's 4-bit conversion at the default precision and packed through the host's default
/// CPU kernel, against mlx-lm's float32 oracle: token-exact for all 48 steps of both prompts.
/// (The other kernels an AVX-512 host runs, and the graph-level form, are checked end to end
/// on fixtures, packed_matches_mlx_lm_on_every_quantized_fixture and
/// packed_graph_form_matches_mlx_lm: each SmolLM2 module is about a minute of compile.)
#[test]
fn gate_against_the_mlx_oracle_file() {
    let dir = smollm2();
    let oracle = dir.join("oracle.json");
    // (precision, MLX_IREE_KERNELS)
    let runs = [(None, "auto"), (Some("packed"), "auto")];
    for (precision, kernels) in runs {
        let mut args = vec!["gate", "--model", dir.to_str().unwrap(), "--reference", oracle.to_str().unwrap()];
        args.extend(["--steps", "48", "--max-context", SMOLLM2_CONTEXT]);
        args.extend(precision.iter().flat_map(|p| ["--precision", p]));
        let out = mlx_iree().args(&args).env("MLX_IREE_KERNELS", kernels).output().unwrap();
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert_eq!(out.status.code(), Some(0), "{precision:?} {kernels}: {stdout}");
        assert!(stdout.contains("token-exact on every prompt: yes") && stdout.contains("-> PASS"), "{stdout}");
    }
}
