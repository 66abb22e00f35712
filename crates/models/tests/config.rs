//! config.json normalisation: each family's settings, and refusals that name the cause.

#![allow(clippy::unwrap_used)] // a test that cannot unwrap has failed; helpers included

use models::{Activation, Family, ModelConfig, Moe, NormPlacement, RopeScaling, RopeTable, Routing, SharedExpert};
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
        json!("gpt2"),
        "m/config.json: unsupported model_type `gpt2` (supported: llama, mistral, mixtral, phi3, qwen2, qwen2_moe, qwen3, qwen3_moe, gemma, gemma2, gemma3_text, smollm3, qwen3_next, qwen3_5, qwen3_5_moe, lfm2, ministral3, granite, olmo2, olmo3, glm4, glm4_moe, deepseek_v3, kimi_k2, gpt_oss, gemma4_text, gemma3, mistral3, gemma4)",
    );
    check_err(llama(), "model_type", Value::Null, "m/config.json: model_type: missing");
    check_err(llama(), "hidden_size", Value::Null, "m/config.json: hidden_size: missing");
    check_err(
        llama(),
        "rope_scaling",
        json!({"rope_type": "dynamic", "factor": 4.0}),
        "m/config.json: unsupported option rope_scaling.rope_type = \"dynamic\" for model_type `llama`",
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
    let mut mixtral = llama();
    mixtral["model_type"] = json!("mixtral");
    check_err(
        mixtral.clone(),
        "num_experts_per_tok",
        json!(9),
        "m/config.json: num_experts_per_tok: 9 of 8 experts; it must be 1 to the experts",
    );
    let mut qwen3 = llama();
    qwen3["model_type"] = json!("qwen3");
    qwen3["head_dim"] = json!(16);
    check_err(
        qwen3,
        "rope_parameters",
        json!({"rope_type": "default"}),
        "m/config.json: rope_theta: missing (and not in rope_parameters)",
    );
    mixtral["model_type"] = json!("qwen3_moe");
    mixtral["head_dim"] = json!(16);
    check_err(mixtral, "num_experts", json!(8), "m/config.json: norm_topk_prob: missing");
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
    // rope_theta and the scaling nested in rope_parameters (transformers >= 5).
    assert_eq!(c.layers[1].rope_theta, 1e6);
    assert!(matches!(
        c.layers[1].rope_scaling,
        RopeScaling::Yarn { factor, original_max_position_embeddings, .. } if factor == 4.0 && original_max_position_embeddings == 32.0
    ));
    assert_eq!((c.head_dim, c.heads, c.hidden), (32, 4, 64));

    let c = fixture_config("gemma");
    assert_eq!(c.activation, Activation::GeluErf);
    assert!(c.norm_plus_one && c.norm_placement == NormPlacement::Pre);
    assert_eq!(c.embed_scale, Some(8.0));

    let c = fixture_config("gemma2");
    assert_eq!(c.activation, Activation::GeluTanh);
    assert_eq!(c.norm_placement, NormPlacement::Sandwich);
    assert_eq!((c.attn_softcap, c.final_softcap), (Some(10.0), Some(15.0)));
    assert_eq!(c.attn_scale, 24f64.powf(-0.5));
    let windows: Vec<_> = c.layers.iter().map(|l| l.sliding_window).collect();
    assert_eq!(windows, vec![Some(128), None, Some(128)], "HF Gemma2: even layers slide");

    let c = fixture_config("qwen3_moe");
    let moe: Vec<bool> = c.layers.iter().map(|l| l.moe).collect();
    assert_eq!(moe, [true, false, true], "layer 1 is in mlp_only_layers");
    let want = Moe {
        block: "mlp",
        experts: 8,
        top_k: 2,
        intermediate: 64,
        routing: Routing::SoftmaxTopK { normalize: true },
        shared_expert: None,
        beside_mlp: false,
        biased: false,
    };
    assert_eq!(c.moe, Some(want));
    assert!(c.qk_norm && !c.qkv_bias && !c.tie_embeddings);

    let c = fixture_config("qwen2_moe");
    let moe = c.moe.clone().unwrap();
    assert_eq!(
        (moe.routing, moe.shared_expert, moe.experts),
        (Routing::SoftmaxTopK { normalize: false }, Some(SharedExpert { width: 128, gated: true }), 4)
    );
    assert!(c.layers.iter().all(|l| l.moe) && c.qkv_bias);

    let c = fixture_config("mixtral");
    let moe = c.moe.clone().unwrap();
    assert_eq!(
        (moe.block, moe.routing, moe.intermediate, moe.top_k),
        ("block_sparse_moe", Routing::TopKSoftmax, 128, 2)
    );
    assert_eq!((c.layers[0].rope_theta, c.head_dim), (1e6, 16));

    let c = fixture_config("gemma3_text");
    let pattern: Vec<_> = c.layers.iter().map(|l| (l.sliding_window, l.rope_theta)).collect();
    assert_eq!(pattern, vec![(Some(8), 1e4), (Some(8), 1e4), (None, 1e6), (Some(8), 1e4)]);
    assert!(c.qk_norm && c.norm_placement == NormPlacement::Sandwich && c.norm_plus_one);
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

fn phi3() -> Value {
    json!({
        "model_type": "phi3", "hidden_size": 64, "num_hidden_layers": 1, "intermediate_size": 128,
        "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 256, "rms_norm_eps": 1e-5,
        "head_dim": 99, "partial_rotary_factor": 0.75,
        "rope_scaling": {"type": "longrope", "long_factor": [1.0, 1.25, 2.0, 3.5, 6.0, 11.0], "short_factor": [1, 1, 1, 1, 1, 1]},
        "max_position_embeddings": 131072, "original_max_position_embeddings": 4096
    })
}

#[test]
fn phi3_reads_fused_projections_and_partial_rotary() {
    let c = ModelConfig::from_json(&phi3(), Path::new("config.json")).unwrap();
    // mlx-lm's phi3 derives head_dim (config.json's is ignored) and unties by default.
    assert_eq!((c.family, c.head_dim, c.rope_dims, c.tie_embeddings), (Family::Phi3, 16, 12, false));
    assert!(c.fused_qkv && c.fused_gate_up && !c.qkv_bias && !c.qk_norm);
    let specs = models::param_specs(&c);
    let part = |key: &str| specs.iter().find(|s| s.key == key).unwrap().part.clone().map(|p| (p.of, p.first_row));
    let qkv = "model.layers.0.self_attn.qkv_proj".to_string();
    assert_eq!(part("model.layers.0.self_attn.q_proj.weight"), Some((qkv.clone(), 0)));
    assert_eq!(part("model.layers.0.self_attn.k_proj.weight"), Some((qkv.clone(), 64)));
    assert_eq!(part("model.layers.0.self_attn.v_proj.weight"), Some((qkv, 96)));
    assert_eq!(part("model.layers.0.mlp.up_proj.weight"), Some(("model.layers.0.mlp.gate_up_proj".into(), 128)));
    assert_eq!(part("model.layers.0.self_attn.o_proj.weight"), None);

    let mut v = phi3();
    v["rope_scaling"]["long_factor"] = json!([1.0, 2.0]);
    check_err(
        v,
        "partial_rotary_factor",
        json!(0.75),
        "m/config.json: rope_scaling.long_factor: 2 factors; 12 rotated features take 6",
    );
    check_err(
        phi3(),
        "partial_rotary_factor",
        json!(0.1),
        "m/config.json: partial_rotary_factor: rotates 1 of head_dim 16; RoPE needs an even number from 2 to head_dim",
    );
    check_err(
        phi3(),
        "rope_scaling",
        json!({"type": "dynamic", "long_factor": [1.0]}),
        "m/config.json: unsupported option rope_scaling.type = \"dynamic\" for model_type `phi3`",
    );
}

/// RoPE tables against mlx-lm 0.32.2's own (`SuScaledRoPE`, `YarnRoPE` in
/// mlx_lm/models/rope_utils.py, mlx 0.32.4): `1 / _freqs` and the factor on the rotated
/// features (`_scale`, `mscale`), as mlx printed them for these settings.
#[test]
fn rope_tables_match_mlx_lm() {
    let table = |v: Value| {
        let c = ModelConfig::from_json(&v, Path::new("config.json")).unwrap();
        RopeTable::new(&c.layers[0], c.rope_dims)
    };
    let close = |got: &RopeTable, inv: &[f64], scale: f64| {
        assert_eq!(got.inv_freq.len(), inv.len());
        for (g, w) in got.inv_freq.iter().zip(inv) {
            assert!((*g as f64 - w).abs() <= 2e-7 * w, "{:?} vs {inv:?}", got.inv_freq);
        }
        assert!((got.input_scale as f64 - scale).abs() < 1e-6, "{} vs {scale}", got.input_scale);
        assert_eq!(got.position_scale, 1.0);
    };
    close(
        &table(phi3()),
        &[
            1.0,
            0.17235475778579712,
            0.02320794202387333,
            0.0028571428265422583,
            0.0003590723790694028,
            4.2196268623229116e-05,
        ],
        1.1902380714238083,
    );
    let mut qwen = json!({
        "model_type": "qwen3", "hidden_size": 64, "num_hidden_layers": 1, "intermediate_size": 128,
        "num_attention_heads": 2, "num_key_value_heads": 1, "head_dim": 32, "vocab_size": 256,
        "rope_theta": 1e6, "rope_scaling": {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32768}
    });
    close(
        &table(qwen.clone()),
        &[
            1.0,
            0.4216965138912201,
            0.17782793939113617,
            0.0749894231557846,
            0.03162277862429619,
            0.01333521492779255,
            0.00477990135550499,
            0.001659961766563356,
            0.0005499999970197678,
            0.0001686785981291905,
            4.4456985051510856e-05,
            1.8747354260995053e-05,
            7.905693564680405e-06,
            3.3338035336782923e-06,
            1.405853367941745e-06,
            5.928434347879374e-07,
        ],
        1.138629436111989,
    );
    qwen["head_dim"] = json!(16);
    qwen["rope_theta"] = json!(1e4);
    qwen["rope_scaling"] = json!({"type": "yarn", "factor": 8.0, "original_max_position_embeddings": 4096,
        "beta_fast": 16, "beta_slow": 2, "mscale": 0.8, "mscale_all_dim": 0.5});
    close(
        &table(qwen),
        &[
            1.0,
            0.3162277638912201,
            0.10000000149011612,
            0.03162277862429619,
            0.007083332631736994,
            0.001317615737207234,
            0.0001250000059371814,
            3.952846964239143e-05,
        ],
        1.0565079928608092,
    );
}

/// A MoE checkpoint with its experts one by one (Hugging Face's layout, which mlx_lm.convert
/// stacks) is refused with the cause, before anything is compiled.
#[test]
fn unstacked_experts_are_refused_with_the_cause() {
    let dir = tempfile::tempdir().unwrap();
    let fixture = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures/mixtral/f32/config.json");
    std::fs::copy(fixture, dir.path().join("config.json")).unwrap();
    let mut w = weights::write::Writer::new();
    w.add_f32("model.layers.0.block_sparse_moe.experts.0.w1.weight", &[2, 2], &[1.0, 2.0, 3.0, 4.0]).unwrap();
    std::fs::write(dir.path().join("model.safetensors"), w.to_bytes()).unwrap();
    let mut ckpt = weights::Checkpoint::open(dir.path()).unwrap();
    let err = ModelConfig::for_checkpoint(&mut ckpt).unwrap_err().to_string();
    assert_eq!(
        err,
        format!(
            "{}: experts stored one by one (`model.layers.0.block_sparse_moe.experts.0.w1.weight`); mlx-iree reads them stacked as mlx_lm.convert writes them (`model.layers.0.block_sparse_moe.switch_mlp.gate_proj.weight`): convert the checkpoint with mlx_lm.convert",
            dir.path().display()
        )
    );
}

/// SmolLM3 as mlx-lm's smollm3 reads it: llama's settings, and layers without RoPE (NoPE)
/// by `no_rope_layers` (1 to rotate) or every `no_rope_layer_interval`-th layer (default 4).
#[test]
fn smollm3_nope_layers() {
    let base = serde_json::json!({
        "model_type": "smollm3", "hidden_size": 64, "num_hidden_layers": 8, "intermediate_size": 128,
        "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 384,
    });
    let rotates = |extra: serde_json::Value| -> Vec<bool> {
        let mut v = base.clone();
        v.as_object_mut().unwrap().extend(extra.as_object().unwrap().clone());
        let c = ModelConfig::from_json(&v, Path::new("m/config.json")).unwrap();
        c.layers.iter().map(|l| l.rope).collect()
    };
    assert_eq!(rotates(serde_json::json!({})), [true, true, true, false, true, true, true, false]);
    assert_eq!(rotates(serde_json::json!({"no_rope_layer_interval": 2})), [true, false].repeat(4));
    let flags = serde_json::json!({"no_rope_layers": [1, 0, 0, 1, 1, 1, 1, 0]});
    assert_eq!(rotates(flags), [true, false, false, true, true, true, true, false]);
    let mut short = base.clone();
    short["no_rope_layers"] = serde_json::json!([1, 0]);
    let err = ModelConfig::from_json(&short, Path::new("m/config.json")).unwrap_err().to_string();
    assert!(err.contains("no_rope_layers") && err.contains("2 entries for 8 layers"), "{err}");
    // Every other family rotates every layer.
    let mut llama = base.clone();
    llama["model_type"] = serde_json::json!("llama");
    llama["no_rope_layer_interval"] = serde_json::json!(2);
    let c = ModelConfig::from_json(&llama, Path::new("m/config.json")).unwrap();
    assert!(c.layers.iter().all(|l| l.rope));
}

/// Qwen3.5 as the fixture's config.json has it, with one key replaced.
fn qwen3_5() -> Value {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures/qwen3_5/f32/config.json");
    serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap()
}

/// The hybrid families: which layers are linear (every `full_attention_interval`-th attends),
/// the linear-attention sizes, and the refusals of a pattern or head count mlx-lm could not run.
#[test]
fn hybrid_layer_pattern_and_refusals() {
    let c = ModelConfig::from_json(&qwen3_5(), Path::new("m/config.json")).unwrap();
    assert_eq!(c.layers.iter().map(|l| l.recurrent).collect::<Vec<_>>(), [true, false, true]);
    let linear = c.linear.unwrap();
    assert_eq!((linear.k_heads, linear.v_heads, linear.k_dim, linear.v_dim, linear.conv_kernel), (2, 4, 16, 16, 4));
    // conv state: (kernel - 1) x (2 k_heads k_dim + v_heads v_dim); recurrent: v_heads x v_dim x k_dim.
    assert_eq!(linear.conv_dim(), 2 * 2 * 16 + 4 * 16);
    assert_eq!(linear.state_len(), 3 * 128 + 4 * 16 * 16);
    assert!(c.attn_output_gate);
    let mut typed = qwen3_5();
    typed["layer_types"] = json!(["linear_attention", "full_attention", "linear_attention"]);
    assert!(ModelConfig::from_json(&typed, Path::new("m/config.json")).is_ok());

    check_err(
        qwen3_5(),
        "linear_num_value_heads",
        json!(3),
        "m/config.json: linear_num_value_heads: 3 is not a multiple of linear_num_key_heads 2",
    );
    check_err(
        qwen3_5(),
        "layer_types",
        json!(["linear_attention", "mamba", "linear_attention"]),
        "m/config.json: layer_types: layer 1: \"mamba\" is not a layer type of this model",
    );
    check_err(
        qwen3_5(),
        "layer_types",
        json!(["linear_attention", "linear_attention", "linear_attention"]),
        "m/config.json: layer_types: layer 1 is \"linear_attention\", but full_attention_interval 2 makes it the other kind",
    );
    check_err(
        qwen3_5(),
        "layer_types",
        json!(["linear_attention"]),
        "m/config.json: layer_types: 1 entries for 3 layers",
    );
    check_err(
        qwen3_5(),
        "full_attention_interval",
        json!(4),
        "m/config.json: full_attention_interval: 4 leaves no full-attention layer among 3 layers (not supported)",
    );
    check_err(qwen3_5(), "full_attention_interval", json!(0), "m/config.json: full_attention_interval: must be > 0");
    check_err(qwen3_5(), "linear_conv_kernel_dim", json!(1), "m/config.json: linear_conv_kernel_dim: 1 is below 2");
    check_err(qwen3_5(), "linear_key_head_dim", Value::Null, "m/config.json: linear_key_head_dim: missing");
}

/// LFM2 as the fixture's config.json has it.
fn lfm2() -> Value {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures/lfm2/f32/config.json");
    serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap()
}

/// LFM2: the MLP width mlx-lm derives, head_dim from hidden/heads, its names for epsilon and
/// the tie, the layer pattern by `layer_types` or `full_attn_idxs`, and the refusals.
#[test]
fn lfm2_settings_and_refusals() {
    let c = ModelConfig::from_json(&lfm2(), Path::new("m/config.json")).unwrap();
    // block_ff_dim 192, auto-adjusted: int(2 * 192 / 3) = 128, times 1.0, a multiple of 32.
    assert_eq!((c.intermediate, c.head_dim, c.rms_eps, c.tie_embeddings), (128, 16, 1e-5, true));
    assert_eq!(c.layers.iter().map(|l| l.recurrent).collect::<Vec<_>>(), [true, true, false, true]);
    assert_eq!(c.short_conv.as_ref().map(|s| (s.kernel, s.bias)), Some((3, true)));
    assert_eq!((c.kv_layers(), c.state_len()), (1, 3 * 2 * 64));
    let mut v = lfm2();
    v["block_ff_dim"] = json!(200);
    v["block_ffn_dim_multiplier"] = json!(1.5);
    // int(2 * 200 / 3) = 133; int(1.5 * 133) = 199; rounded up to 224.
    assert_eq!(ModelConfig::from_json(&v, Path::new("m/config.json")).unwrap().intermediate, 224);
    let mut v = lfm2();
    v.as_object_mut().unwrap().remove("layer_types");
    v["full_attn_idxs"] = json!([0, 3]);
    let c = ModelConfig::from_json(&v, Path::new("m/config.json")).unwrap();
    assert_eq!(c.layers.iter().map(|l| l.recurrent).collect::<Vec<_>>(), [false, true, true, false]);
    v["rope_parameters"] = json!({"rope_theta": 5e5});
    assert_eq!(ModelConfig::from_json(&v, Path::new("m/config.json")).unwrap().layers[0].rope_theta, 5e5);

    check_err(
        lfm2(),
        "layer_types",
        json!(["conv", "mamba", "full_attention", "conv"]),
        "m/config.json: layer_types: layer 1: \"mamba\" is not a layer type of this model",
    );
    check_err(
        lfm2(),
        "layer_types",
        json!(["conv", "conv", "conv", "conv"]),
        "m/config.json: layer_types: no full_attention layer among 4 layers (not supported)",
    );
    check_err(lfm2(), "layer_types", json!(["conv"]), "m/config.json: layer_types: 1 entries for 4 layers");
    check_err(lfm2(), "layer_types", Value::Null, "m/config.json: layer_types: missing (and no full_attn_idxs)");
    check_err(lfm2(), "full_attn_idxs", json!([4]), "m/config.json: full_attn_idxs: layer 4 of 4 layers");
    check_err(lfm2(), "conv_L_cache", json!(1), "m/config.json: conv_L_cache: 1 is below 2");
    check_err(lfm2(), "block_multiple_of", Value::Null, "m/config.json: block_multiple_of: missing");
    check_err(
        lfm2(),
        "num_key_value_heads",
        json!(3),
        "m/config.json: num_key_value_heads: 3 does not divide num_attention_heads 4",
    );
}

/// mlx-lm's multimodal wrappers: gemma3 runs gemma3_text from `text_config`, with its
/// defaults (8 heads over 4 kv heads where none are named; the top level's `vocab_size`,
/// 262,208 where absent); mistral3 runs its text model as ministral3 or llama (untied unless
/// it says), and refuses a mistral4 one.
#[test]
fn wrapper_checkpoints_read_their_text_model() {
    let gemma3 = fixture_config("gemma3");
    assert_eq!((gemma3.model_type.as_str(), gemma3.family), ("gemma3_text", Family::Gemma3));
    assert_eq!((gemma3.heads, gemma3.kv_heads, gemma3.head_dim, gemma3.vocab), (8, 4, 16, 256));
    assert_eq!(gemma3.layers[2].rope_scaling, RopeScaling::Linear { factor: 8.0 });
    let path = Path::new("m/config.json");
    let mut bare = json!({"model_type": "gemma3", "text_config": {"hidden_size": 64, "num_hidden_layers": 1,
        "intermediate_size": 128, "head_dim": 16, "num_attention_heads": 2, "num_key_value_heads": 1}});
    let c = ModelConfig::from_json(&bare, path).unwrap();
    assert_eq!((c.heads, c.kv_heads, c.vocab), (2, 1, 262_208));
    bare["text_config"] = json!(7);
    let err = ModelConfig::from_json(&bare, path).unwrap_err().to_string();
    assert_eq!(err, "m/config.json: text_config: a `gemma3` checkpoint needs its text model's settings");

    let mistral3 = fixture_config("mistral3");
    assert_eq!(
        (mistral3.model_type.as_str(), mistral3.family, mistral3.tie_embeddings),
        ("llama", Family::Llama, false)
    );
    assert_eq!((mistral3.heads, mistral3.kv_heads, mistral3.layers[0].rope_theta), (4, 2, 1e9));
    let ministral3 = fixture_config("ministral3");
    assert_eq!((ministral3.model_type.as_str(), ministral3.family), ("ministral3", Family::Ministral3));
    assert!(!ministral3.tie_embeddings, "the wrapper's default");
    let mut small4 = json!({"model_type": "mistral3", "text_config": {"model_type": "mistral4"}});
    let err = ModelConfig::from_json(&small4, path).unwrap_err().to_string();
    assert_eq!(err, "m/config.json: unsupported option text_config.model_type = mistral4 for model_type `mistral3`");
    small4["text_config"] = Value::Null;
    let err = ModelConfig::from_json(&small4, path).unwrap_err().to_string();
    assert_eq!(err, "m/config.json: text_config: a `mistral3` checkpoint needs its text model's settings");
}

/// Ministral 3's query scale and rope come from `rope_parameters`, which must name them.
#[test]
fn ministral3_reads_rope_parameters() {
    let c = fixture_config("ministral3");
    assert_eq!(c.query_position_scale, Some(models::QueryPositionScale { beta: 0.1, original: 16.0 }));
    assert!(matches!(c.layers[1].rope_scaling, RopeScaling::Yarn { factor: 16.0, .. }), "{:?}", c.layers[1]);
    assert_eq!(c.layers.iter().map(|l| l.sliding_window).collect::<Vec<_>>(), [Some(8), None, Some(8)]);
    let base = json!({
        "model_type": "ministral3", "hidden_size": 64, "num_hidden_layers": 2, "intermediate_size": 128,
        "num_attention_heads": 4, "vocab_size": 256, "rms_norm_eps": 1e-5,
        "rope_parameters": {"rope_type": "default", "rope_theta": 1e6, "llama_4_scaling_beta": 0.1,
            "original_max_position_embeddings": 4096}
    });
    let c = ModelConfig::from_json(&base, Path::new("m/config.json")).unwrap();
    assert!(c.tie_embeddings && c.layers.iter().all(|l| l.sliding_window.is_none()));
    for (key, expected) in [
        ("llama_4_scaling_beta", "m/config.json: rope_parameters.llama_4_scaling_beta: missing"),
        (
            "original_max_position_embeddings",
            "m/config.json: rope_parameters.original_max_position_embeddings: missing",
        ),
    ] {
        let mut v = base.clone();
        v["rope_parameters"].as_object_mut().unwrap().remove(key);
        assert_eq!(ModelConfig::from_json(&v, Path::new("m/config.json")).unwrap_err().to_string(), expected);
    }
    // Other families have no query scale.
    assert_eq!(fixture_config("mistral").query_position_scale, None);
}

/// Granite's four multipliers, each required (mlx-lm's dataclass has no defaults), the
/// attention multiplier standing in for head_dim^-0.5.
#[test]
fn granite_multipliers() {
    let c = fixture_config("granite");
    assert_eq!((c.family, c.embed_scale, c.attn_scale), (Family::Granite, Some(12.0), 0.125));
    assert_eq!((c.residual_scale, c.logits_divisor), (Some(0.22), Some(8.0)));
    assert!(c.tie_embeddings && c.qkv_bias && c.o_bias && !c.mlp_bias);
    let path = Path::new("tests/fixtures/granite/f32/config.json");
    let base: Value = serde_json::from_str(
        &std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("../..").join(path)).unwrap(),
    )
    .unwrap();
    for key in ["embedding_multiplier", "attention_multiplier", "residual_multiplier", "logits_scaling"] {
        check_err(base.clone(), key, Value::Null, &format!("m/config.json: {key}: missing"));
    }
    check_err(base, "logits_scaling", json!(0.0), "m/config.json: logits_scaling: must not be 0");
    // Other families have none of them.
    let llama = fixture_config("mistral");
    assert_eq!((llama.residual_scale, llama.logits_divisor, llama.embed_scale), (None, None, None));
}

/// OLMo 2: norms only after each block, q/k norms over all heads at once.
#[test]
fn olmo2_norms_after_each_block() {
    let c = fixture_config("olmo2");
    assert_eq!(
        (c.family, c.norm_placement, c.qk_norm, c.qk_norm_full_width),
        (Family::Olmo2, NormPlacement::Post, true, true)
    );
    assert!(!c.tie_embeddings && !c.qkv_bias && !c.norm_plus_one);
    let specs = models::param_specs(&c);
    let shape = |key: &str| specs.iter().find(|p| p.key == key).map(|p| p.shape.clone());
    assert_eq!(shape("model.layers.0.self_attn.q_norm.weight"), Some(vec![64]));
    assert_eq!(shape("model.layers.0.self_attn.k_norm.weight"), Some(vec![32]));
    assert_eq!(shape("model.layers.0.post_feedforward_layernorm.weight"), Some(vec![64]));
    assert_eq!(shape("model.layers.0.input_layernorm.weight"), None, "no norm before attention");
    let q = fixture_config("qwen3");
    assert!(q.qk_norm && !q.qk_norm_full_width && q.norm_placement == NormPlacement::Pre);
}

/// OLMo 3: olmo2's norms; windows on all but every fourth layer unless `layer_types` says,
/// with a plain RoPE there and the scaling on the full layers.
#[test]
fn olmo3_windows_and_rope() {
    let c = fixture_config("olmo3");
    assert_eq!((c.family, c.norm_placement, c.qk_norm_full_width), (Family::Olmo3, NormPlacement::Post, true));
    let windows: Vec<_> = c.layers.iter().map(|l| l.sliding_window).collect();
    assert_eq!(windows, [Some(8), Some(8), Some(8), None]);
    assert_eq!(c.layers[0].rope_scaling, RopeScaling::None);
    assert!(matches!(c.layers[3].rope_scaling, RopeScaling::Yarn { factor: 8.0, .. }), "{:?}", c.layers[3]);
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures/olmo3/f32/config.json");
    let mut v: Value = serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
    v["layer_types"] = json!(["full_attention", "sliding_attention", "full_attention", "full_attention"]);
    v["mlp_bias"] = json!(true);
    let c = ModelConfig::from_json(&v, Path::new("m/config.json")).unwrap();
    assert_eq!(c.layers.iter().map(|l| l.sliding_window).collect::<Vec<_>>(), [None, Some(8), None, None]);
    assert!(!c.mlp_bias, "mlx-lm's olmo3 has no MLP biases");
    v["layer_types"] = json!(["full_attention", "chunked_attention", "full_attention", "full_attention"]);
    let err = ModelConfig::from_json(&v, Path::new("m/config.json")).unwrap_err().to_string();
    assert_eq!(err, "m/config.json: layer_types: layer 1: Some(\"chunked_attention\")");
}

/// GLM-4 (dense): traditional RoPE over `partial_rotary_factor` of each head, plain
/// sandwich norms under its own names, gate/up stored fused, q/k/v biases and none on o.
#[test]
fn glm4_settings() {
    let c = fixture_config("glm4");
    assert_eq!((c.family, c.norm_placement, c.norm_plus_one), (Family::Glm4, NormPlacement::Sandwich, false));
    assert_eq!((c.rope_traditional, c.rope_dims, c.head_dim), (true, 8, 16));
    assert!(c.fused_gate_up && !c.fused_qkv && c.qkv_bias && !c.o_bias && !c.tie_embeddings);
    // mlx-lm's glm4 builds a plain RoPE: a scaling in config.json changes nothing.
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures/glm4/f32/config.json");
    let mut v: Value = serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
    v["rope_scaling"] = json!({"rope_type": "linear", "factor": 4.0});
    let scaled = ModelConfig::from_json(&v, Path::new("m/config.json")).unwrap();
    assert_eq!(scaled.layers[0].rope_scaling, RopeScaling::None);
    v["rope_traditional"] = json!(false);
    assert!(!ModelConfig::from_json(&v, Path::new("m/config.json")).unwrap().rope_traditional);
    // Families that do not read it still refuse it.
    let llama = fixture_config("mistral");
    assert!(!llama.rope_traditional && !llama.fused_gate_up);
}

/// GLM-4.5 MoE: layer 0 dense, then experts with the group-limited sigmoid router and a plain
/// shared expert; q/k norms as `use_qk_norm` says; an lm_head whatever
/// `tie_word_embeddings` says; router modes mlx-lm does not run refused with the key.
#[test]
fn glm4_moe_settings() {
    let c = fixture_config("glm4_moe");
    assert_eq!(c.family, Family::Glm4Moe);
    assert_eq!(c.layers.iter().map(|l| l.moe).collect::<Vec<_>>(), [false, true, true]);
    let moe = c.moe.clone().unwrap();
    assert_eq!(
        (moe.experts, moe.top_k, moe.intermediate, moe.routing, moe.shared_expert),
        (
            8,
            3,
            64,
            Routing::Grouped { groups: 4, top_groups: 2, scale: 2.5, normalize: true },
            Some(SharedExpert { width: 64, gated: false })
        )
    );
    assert!(c.qk_norm && c.qkv_bias && !c.o_bias && !c.tie_embeddings && !c.rope_traditional);
    assert_eq!((c.rope_dims, c.head_dim), (8, 16));
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures/glm4_moe/f32/config.json");
    let v: Value = serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
    let with = |key: &str, value: Value| {
        let mut v = v.clone();
        v[key] = value;
        ModelConfig::from_json(&v, Path::new("m/config.json"))
    };
    assert!(!with("tie_word_embeddings", json!(true)).unwrap().tie_embeddings, "mlx-lm's glm4_moe always has lm_head");
    assert!(!with("use_qk_norm", json!(false)).unwrap().qk_norm);
    assert!(with("n_routed_experts", Value::Null).unwrap().moe.is_none());
    let err = |key: &str, value: Value| with(key, value).unwrap_err().to_string();
    assert_eq!(
        err("scoring_func", json!("softmax")),
        "m/config.json: scoring_func: router mode \"softmax\" is not supported (only \"sigmoid\", as mlx-lm)"
    );
    assert_eq!(
        err("topk_method", json!("greedy")),
        "m/config.json: topk_method: router mode \"greedy\" is not supported (only \"noaux_tc\", as mlx-lm)"
    );
    assert_eq!(err("n_group", json!(3)), "m/config.json: n_group: 3 groups do not divide 8 experts");
    assert_eq!(err("topk_group", json!(5)), "m/config.json: topk_group: 5 of 4 groups; it must be 1 to n_group");
    assert_eq!(err("use_qk_norm", Value::Null), "m/config.json: use_qk_norm: missing");
}

/// DeepSeek-V3: latent attention's sizes with mlx-lm's defaults and a plain `q_proj` for a
/// null `q_lora_rank`; the softmax scale times yarn's `mscale_all_dim` factor squared; kimi_k2
/// read as it; the router's groups and `moe_layer_freq`.
#[test]
fn deepseek_v3_settings() {
    let c = fixture_config("deepseek_v3");
    let lat = c.latent.clone().unwrap();
    assert_eq!((lat.q_rank, lat.kv_rank, lat.nope_dim, lat.rope_dim, lat.v_dim), (Some(32), 32, 32, 16, 32));
    assert_eq!(
        (c.family, c.kv_heads, c.head_dim, c.rope_dims, c.rope_traditional),
        (Family::DeepseekV3, 1, 48, 16, true)
    );
    // 48^-0.5 * (0.1 * 1 * ln 4 + 1)^2.
    let s = 0.1 * 4f64.ln() + 1.0;
    assert!((c.attn_scale - s * s / 48f64.sqrt()).abs() < 1e-12, "{}", c.attn_scale);
    assert!(matches!(c.layers[0].rope_scaling, RopeScaling::Yarn { factor, .. } if factor == 4.0));
    assert_eq!(c.layers.iter().map(|l| l.moe).collect::<Vec<_>>(), [false, true, true]);
    let moe = c.moe.clone().unwrap();
    assert_eq!(moe.routing, Routing::Grouped { groups: 2, top_groups: 1, scale: 1.5, normalize: true });
    assert_eq!(moe.shared_expert, Some(SharedExpert { width: 64, gated: false }));
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures/deepseek_v3/f32/config.json");
    let v: Value = serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
    let with = |changes: &[(&str, Value)]| {
        let mut v = v.clone();
        for (key, value) in changes {
            match value {
                Value::Null if *key != "q_lora_rank" => {
                    v.as_object_mut().unwrap().remove(*key);
                }
                _ => v[*key] = value.clone(),
            }
        }
        ModelConfig::from_json(&v, Path::new("m/config.json"))
    };
    let kimi = with(&[("model_type", json!("kimi_k2"))]).unwrap();
    assert_eq!((kimi.family, kimi.latent), (Family::DeepseekV3, c.latent.clone()));
    let plain = with(&[("q_lora_rank", Value::Null)]).unwrap();
    assert_eq!(plain.latent.unwrap().q_rank, None);
    let defaults =
        with(&[("kv_lora_rank", Value::Null), ("qk_rope_head_dim", Value::Null), ("rope_scaling", Value::Null)])
            .unwrap();
    let lat = defaults.latent.clone().unwrap();
    assert_eq!((lat.kv_rank, lat.rope_dim, defaults.head_dim), (512, 64, 96));
    assert!((defaults.attn_scale - 96f64.powf(-0.5)).abs() < 1e-15, "no yarn, no factor");
    let every_other = with(&[("moe_layer_freq", json!(2))]).unwrap();
    assert_eq!(every_other.layers.iter().map(|l| l.moe).collect::<Vec<_>>(), [false, false, true]);
    let err = with(&[("kv_lora_rank", json!(0))]).unwrap_err().to_string();
    assert_eq!(err, "m/config.json: kv_lora_rank: must be > 0");
}

/// Gemma 4: each layer type's heads and RoPE (full layers `global_head_dim` with
/// proportional RoPE, sliding ones windowed), the KV-shared last layers' sources and
/// double-wide MLPs, per-layer inputs, plain norms, unit attention scale, the final soft
/// cap; the wrapper's defaults and `attention_k_eq_v`; the experts beside the MLP; what is
/// refused.
#[test]
fn gemma4_settings() {
    let c = fixture_config("gemma4_text");
    assert_eq!(
        (c.family, c.norm_plus_one, c.attn_scale, c.final_softcap, c.attn_softcap),
        (Family::Gemma4, false, 1.0, Some(30.0), None)
    );
    assert_eq!((c.value_norm, c.layer_scalar, c.embed_scale), (true, true, Some(8.0)));
    assert_eq!(c.per_layer_input, Some(models::PerLayerInput { width: 32, vocab: 256 }));
    let geometry: Vec<_> =
        c.layers.iter().map(|l| (l.kv_heads, l.head_dim, l.sliding_window, l.kv_source, l.intermediate)).collect();
    assert_eq!(
        geometry,
        [
            (2, 16, Some(8), None, 128),
            (2, 16, Some(8), None, 128),
            (2, 32, None, None, 128),
            (2, 16, Some(8), Some(1), 256),
            (2, 32, None, Some(2), 256),
        ]
    );
    assert_eq!(c.layers[2].rope_scaling, RopeScaling::Proportional { rotated: 8, factor: 1.0 });
    assert_eq!((c.layers[2].rope_theta, c.layers[0].rope_theta), (1e6, 1e4));
    // Three layers cache their own keys, flat: the full layers' 2 x 32 the widest.
    assert!(!c.uniform_heads());
    assert_eq!((c.kv_layers(), c.cache_rows()), (3, [(1, 64), (1, 64)]));
    // The table of the full layers' RoPE: 4 of 16 pairs turn, at base^(-2i/32).
    let table = models::RopeTable::new(&c.layers[2], 32);
    assert_eq!(table.inv_freq.len(), 16);
    assert_eq!(table.inv_freq[1], 1.0 / 1e6f32.powf(2.0 / 32.0));
    assert!(table.inv_freq[4..].iter().all(|&f| f == 0.0));

    let w = fixture_config("gemma4");
    assert_eq!((w.heads, w.kv_heads, w.vocab, w.per_layer_input), (4, 2, 256, None));
    let full: Vec<_> = w.layers.iter().map(|l| (l.sliding_window.is_none(), l.kv_heads, l.values_are_keys)).collect();
    assert_eq!(full, [(false, 2, false), (true, 1, true), (false, 2, false), (true, 1, true)]);
    // rope_parameters absent: mlx-lm's defaults.
    assert_eq!(w.layers[1].rope_scaling, RopeScaling::Proportional { rotated: 8, factor: 1.0 });
    assert_eq!((w.layers[1].rope_theta, w.layers[0].rope_scaling.clone()), (1e6, RopeScaling::None));
    assert_eq!(w.cache_rows(), [(1, 32), (1, 32)]);

    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures/gemma4_text/f32/config.json");
    let v: Value = serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
    let with = |key: &str, value: Value| {
        let mut v = v.clone();
        v[key] = value;
        ModelConfig::from_json(&v, Path::new("m/config.json"))
    };
    assert_eq!(with("final_logit_softcapping", Value::Null).unwrap().final_softcap, None);
    assert_eq!(with("hidden_size_per_layer_input", Value::Null).unwrap().per_layer_input, None);
    let err = |key: &str, value: Value| with(key, value).unwrap_err().to_string();
    assert_eq!(err("enable_moe_block", json!(true)), "m/config.json: num_experts: missing");
    assert_eq!(
        err("num_kv_shared_layers", json!(4)),
        "m/config.json: num_kv_shared_layers: no layer before layer 2 is full_attention"
    );
    assert_eq!(err("layer_types", json!(["full_attention"])), "m/config.json: layer_types: 1 entries for 5 layers");

    let m = fixture_config("gemma4_moe");
    let moe = m.moe.clone().unwrap();
    assert_eq!(
        (moe.experts, moe.top_k, moe.intermediate, moe.routing, moe.beside_mlp, moe.shared_expert),
        (8, 2, 32, Routing::ScaledTopKSoftmax, true, None)
    );
    assert!(m.layers.iter().all(|l| l.moe && l.intermediate == 64));
    assert_eq!((m.per_layer_input, m.kv_layers()), (None, 3));
    let names = models::names::LayerNames::new(1).moe(&moe);
    assert_eq!(
        (names.router(), names.experts("up_proj"), names.per_expert_scale()),
        (
            "model.layers.1.router.proj".to_owned(),
            "model.layers.1.experts.switch_glu.up_proj".to_owned(),
            "model.layers.1.router.per_expert_scale".to_owned()
        )
    );
}

/// gpt-oss: attention sinks, q/k/v/o biases whatever `attention_bias` says, sliding and full
/// layers alternating without `layer_types`, yarn RoPE, experts with biases under their own
/// names routed top k then softmax, the clamped SwiGLU, always an `lm_head`.
#[test]
fn gpt_oss_settings() {
    let c = fixture_config("gpt_oss");
    assert_eq!(
        (c.family, c.attn_sinks, c.qkv_bias, c.o_bias, c.tie_embeddings),
        (Family::GptOss, true, true, true, false)
    );
    assert_eq!(c.activation, Activation::SwigluOai);
    assert_eq!(c.layers.iter().map(|l| l.sliding_window).collect::<Vec<_>>(), [Some(8), None]);
    assert!(matches!(c.layers[1].rope_scaling, RopeScaling::Yarn { factor, .. } if factor == 4.0));
    let moe = c.moe.clone().unwrap();
    assert_eq!(
        (moe.experts, moe.top_k, moe.intermediate, moe.routing, moe.biased),
        (8, 4, 64, Routing::TopKSoftmax, true)
    );
    let names = models::names::LayerNames::new(0).moe(&moe);
    assert_eq!(
        (names.router(), names.experts("down_proj")),
        ("model.layers.0.mlp.router".to_owned(), "model.layers.0.mlp.experts.down_proj".to_owned())
    );
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures/gpt_oss/f32/config.json");
    let mut v: Value = serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
    v["layer_types"] = json!(["full_attention", "sliding_attention"]);
    v["attention_bias"] = json!(false);
    let c = ModelConfig::from_json(&v, Path::new("m/config.json")).unwrap();
    assert_eq!((c.layers[0].sliding_window, c.layers[1].sliding_window, c.qkv_bias), (None, Some(8), true));
}
