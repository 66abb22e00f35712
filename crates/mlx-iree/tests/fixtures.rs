//! MLX as the oracle: every fixture checkpoint (made by mlx-lm, see tests/fixtures/README.md)
//! run on local-task at f32 reproduces mlx-lm's greedy token ids for all 40 steps, and the
//! first step's logits agree within LOGIT_TOL, for every prompt. At bf16 it does the same
//! against mlx-lm with the same bfloat16 rounding of the weight matrices (expected_bf16.json):
//! bf16 is exactly that model, whatever the fixtures' near ties do to it against f32.

#![allow(clippy::unwrap_used)] // a test that cannot unwrap has failed; helpers included

use engine::{Engine, EngineConfig, Precision};
use serde_json::Value;
use std::path::PathBuf;

mod common;

/// Largest |logit difference| allowed against mlx-lm's float32 logits (magnitudes 10 to 29;
/// both sides are f32, summing in different orders). Measured maximum: 1.02e-4 (qwen3_5_moe q8,
/// logits up to 24: the delta-rule scan and 8 experts sum in another order than MLX's).
const LOGIT_TOL: f32 = 1.5e-4;
/// The same at bf16, against expected_bf16.json (identical rounded weights, f32 arithmetic on
/// both sides). Measured maximum: 1.3e-4 (gemma f32, logits up to 23).
const LOGIT_TOL_BF16: f32 = 2e-4;

fn fixtures() -> PathBuf {
    common::root().join("tests/fixtures")
}

/// `precision` against mlx-lm's trajectories in `file` of `fixture/variant`.
fn check(fixture: &str, variant: &str, precision: Precision, file: &str) {
    let dir = fixtures().join(fixture).join(variant);
    let expected: Value = serde_json::from_str(&std::fs::read_to_string(dir.join(file)).unwrap()).unwrap();
    let trajectories = expected["trajectories"].as_array().unwrap();
    let steps = expected["steps"].as_u64().unwrap() as usize;
    let ids = |v: &Value| -> Vec<u32> { v.as_array().unwrap().iter().map(|x| x.as_u64().unwrap() as u32).collect() };
    let longest = trajectories.iter().map(|t| ids(&t["prompt_ids"]).len()).max().unwrap();
    let context = (longest + steps).next_power_of_two().max(64);
    let config = if precision == Precision::F32 {
        // batch.rs's engine, so each family's f32 module compiles once for both files; one
        // sequence runs its 1-row functions either way, and drafts are never asked for.
        common::eight_slot_engine_for(precision, context, &format!("{fixture}/{variant}"))
    } else {
        EngineConfig {
            max_context: Some(context),
            // As gate.rs (which shares these modules): storing weights in final form is
            // crates/engine/tests/stored_parameters.rs's, here only one more compile per module.
            store_parameters: false,
            ..EngineConfig::new("local-task", precision, common::compile_cache())
        }
    };
    let mut engine = Engine::load(&dir, &config).unwrap();
    for t in trajectories {
        let prompt = ids(&t["prompt_ids"]);
        let want = ids(&t["token_ids"]);
        engine.reset(0);
        let first = engine.prefill(0, &prompt).unwrap();
        let logits = first.logits().unwrap();
        let mlx_logits: Vec<f32> =
            t["first_logits"].as_array().unwrap().iter().map(|x| x.as_f64().unwrap() as f32).collect();
        let diff = logits.iter().zip(&mlx_logits).map(|(a, b)| (a - b).abs()).fold(0.0f32, f32::max);
        let tol = if precision == Precision::F32 { LOGIT_TOL } else { LOGIT_TOL_BF16 };
        assert!(diff <= tol, "{fixture}/{variant} {precision} {prompt:?}: first logits differ from mlx-lm by {diff}");
        let mut got = vec![first.next];
        while got.len() < steps {
            let tok = *got.last().unwrap();
            got.push(engine.decode_one(0, tok).unwrap().next);
        }
        let exact = got.iter().zip(&want).take_while(|(a, b)| a == b).count();
        assert_eq!(got, want, "{fixture}/{variant} {precision} {prompt:?}: token-exact for {exact} of {steps} steps");
    }
}

macro_rules! fixture_tests {
    ($($name:ident),*) => {$(
        mod $name {
            use engine::Precision::{BF16, F32};
            #[test] fn f32() { super::check(stringify!($name), "f32", F32, "expected.json"); }
            #[test] fn q4() { super::check(stringify!($name), "q4", F32, "expected.json"); }
            #[test] fn q8() { super::check(stringify!($name), "q8", F32, "expected.json"); }
            #[test] fn f32_bf16() { super::check(stringify!($name), "f32", BF16, "expected_bf16.json"); }
            #[test] fn q4_bf16() { super::check(stringify!($name), "q4", BF16, "expected_bf16.json"); }
            #[test] fn q8_bf16() { super::check(stringify!($name), "q8", BF16, "expected_bf16.json"); }
        }
    )*};
}

fixture_tests!(
    llama_llama3_tied,
    llama_linear_untied,
    mistral,
    mixtral,
    phi3,
    qwen2,
    qwen2_moe,
    qwen3,
    qwen3_moe,
    gemma,
    gemma2,
    gemma2_window,
    gemma3_text,
    gemma3,
    gemma4_text,
    gemma4_moe,
    gemma4,
    mistral3,
    ministral3,
    granite,
    olmo2,
    olmo3,
    glm4,
    glm4_moe,
    deepseek_v3,
    deepseek_v3_kv_b,
    gpt_oss,
    smollm3,
    qwen3_next,
    qwen3_5,
    qwen3_5_moe,
    lfm2
);

/// MLX's other formats: the floating-point modes (`mlx_lm.convert --q-mode`),
/// llama_llama3_tied's mxfp4, nvfp4 and mxfp8 variants, qwen3_moe's mxfp8 one and gpt_oss's
/// mxfp4 one (their experts too); affine 2, 3, 5 and 6 bits; mlx-lm's mixed_3_6 recipe (per-layer widths): dequantized
/// exactly at f32, token-exact with mlx-lm.
mod quant_modes {
    use engine::Precision::F32;
    #[test]
    fn mxfp4() {
        super::check("llama_llama3_tied", "mxfp4", F32, "expected.json");
    }
    #[test]
    fn nvfp4() {
        super::check("llama_llama3_tied", "nvfp4", F32, "expected.json");
    }
    #[test]
    fn mxfp8() {
        super::check("llama_llama3_tied", "mxfp8", F32, "expected.json");
        super::check("qwen3_moe", "mxfp8", F32, "expected.json");
    }
    #[test]
    fn affine_2_3_5_6_bit_and_mixed_3_6() {
        for variant in ["q2", "q3", "q5", "q6", "mixed_3_6"] {
            super::check("llama_llama3_tied", variant, F32, "expected.json");
        }
    }
    #[test]
    fn gpt_oss_mxfp4() {
        super::check("gpt_oss", "mxfp4", F32, "expected.json");
    }
}
