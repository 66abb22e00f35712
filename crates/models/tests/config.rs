//! config.json normalisation: each family's settings, and refusals that name the cause.

#![allow(clippy::unwrap_used)] // a test that cannot unwrap has failed; helpers included

use models::{Activation, Family, ModelConfig, RopeScaling};
use serde_json::{Value, json};
use std::path::Path;

fn fixture_config(name: &str) -> ModelConfig {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures").join(name).join("f32/config.json");
    ModelConfig::from_file(&path).unwrap()
}

fn llama() -> Value {
    json!({
        "model_type": "llama", "hidden_size": 64, "num_hidden_layers": 2, "intermediate_size": 128,
        "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 256, "rms_norm_eps": 1e-5
    })
}

/// Normalises `value` with one key replaced, and returns the error text.
fn check_err(mut value: Value, key: &str, v: Value, expected: &str) {
    if v.is_null() {
        value.as_object_mut().unwrap().remove(key);
    } else {
        value[key] = v;
    }
    let err = ModelConfig::from_json(&value, Path::new("m/config.json")).unwrap_err().to_string();
    assert_eq!(err, expected);
}

#[test]
fn refusals_name_the_cause() {
    check_err(
        llama(),
        "model_type",
        json!("phi3"),
        "m/config.json: unsupported model_type `phi3` (supported: llama, mistral, qwen2, qwen3, gemma, gemma2, gemma3_text)",
    );
    check_err(llama(), "model_type", Value::Null, "m/config.json: model_type: missing");
    check_err(llama(), "hidden_size", Value::Null, "m/config.json: hidden_size: missing");
    check_err(
        llama(),
        "rope_scaling",
        json!({"rope_type": "yarn", "factor": 4.0}),
        "m/config.json: unsupported option rope_scaling.rope_type = \"yarn\" for model_type `llama`",
    );
    check_err(
        llama(),
        "rope_traditional",
        json!(true),
        "m/config.json: unsupported option rope_traditional = true for model_type `llama`",
    );
    check_err(
        llama(),
        "num_key_value_heads",
        json!(3),
        "m/config.json: num_key_value_heads: 3 does not divide num_attention_heads 4",
    );
    check_err(llama(), "num_hidden_layers", json!(0), "m/config.json: num_hidden_layers: must be > 0");
    check_err(
        llama(),
        "hidden_size",
        json!("big"),
        "m/config.json: config: invalid type: string \"big\", expected usize",
    );
}

#[test]
fn llama_defaults() {
    let c = ModelConfig::from_json(&llama(), Path::new("config.json")).unwrap();
    assert_eq!((c.family, c.head_dim, c.tie_embeddings, c.qkv_bias), (Family::Llama, 16, true, false));
    assert_eq!(c.layers[0].rope_theta, 10_000.0);
    assert_eq!(c.activation, Activation::Silu);
    assert_eq!(c.attn_scale, 0.25);
}

#[test]
fn fixtures_normalise_per_family() {
    let c = fixture_config("llama_llama3_tied");
    assert!(matches!(c.layers[0].rope_scaling, RopeScaling::Llama3 { factor, .. } if factor == 8.0));
    assert!(c.tie_embeddings);

    let c = fixture_config("llama_linear_untied");
    assert_eq!(c.layers[1].rope_scaling, RopeScaling::Linear { factor: 2.0 });
    assert!(!c.tie_embeddings);

    let c = fixture_config("qwen2");
    assert!(c.qkv_bias && !c.o_bias && !c.qk_norm);

    let c = fixture_config("qwen3");
    assert!(c.qk_norm && !c.qkv_bias);
    assert_eq!((c.head_dim, c.heads, c.hidden), (32, 4, 64));

    let c = fixture_config("gemma");
    assert_eq!(c.activation, Activation::GeluErf);
    assert!(c.norm_plus_one && !c.sandwich_norms);
    assert_eq!(c.embed_scale, Some(8.0));

    let c = fixture_config("gemma2");
    assert_eq!(c.activation, Activation::GeluTanh);
    assert!(c.sandwich_norms);
    assert_eq!((c.attn_softcap, c.final_softcap), (Some(10.0), Some(15.0)));
    assert_eq!(c.attn_scale, 24f64.powf(-0.5));
    let windows: Vec<_> = c.layers.iter().map(|l| l.sliding_window).collect();
    assert_eq!(windows, vec![Some(128), None, Some(128)], "HF Gemma2: even layers slide");

    let c = fixture_config("gemma3_text");
    let pattern: Vec<_> = c.layers.iter().map(|l| (l.sliding_window, l.rope_theta)).collect();
    assert_eq!(pattern, vec![(Some(8), 1e4), (Some(8), 1e4), (None, 1e6), (Some(8), 1e4)]);
    assert!(c.qk_norm && c.sandwich_norms && c.norm_plus_one);
    assert_eq!(c.attn_scale, 48f64.powf(-0.5));
}

#[test]
fn gemma3_embedding_scale_is_rounded_to_bf16() {
    let mut v = json!({
        "model_type": "gemma3_text", "hidden_size": 1152, "num_hidden_layers": 1, "intermediate_size": 8,
        "num_attention_heads": 4, "num_key_value_heads": 1, "head_dim": 256, "vocab_size": 16
    });
    let c = ModelConfig::from_json(&v, Path::new("config.json")).unwrap();
    // sqrt(1152) = 33.941...; bfloat16 keeps 8 significant bits: 34.0.
    assert_eq!(c.embed_scale, Some(34.0));
    v["model_type"] = json!("gemma2");
    let c = ModelConfig::from_json(&v, Path::new("config.json")).unwrap();
    assert_eq!(c.embed_scale, Some(1152f64.sqrt() as f32));
}
