//! MLX affine quantization: config parsing, the dense/quantized decision, shape validation,
//! and dequantization checked bit for bit against hand computations.

mod common;

use std::path::Path;

use common::{assert_names, checkpoint, shown};
use serde_json::json;
use weights::write::Writer;
use weights::{
    Checkpoint, Dtype, Error, LayerQuant, Linear, QuantConfig, QuantMode, QuantParams, dequantize_f32, pack,
    quantize_dequantize,
};

const Q: &str = "model.layers.0.self_attn.q_proj";
const DOWN: &str = "model.layers.0.mlp.down_proj";
const GATE: &str = "model.layers.0.mlp.gate";
const EMBED: &str = "model.embed_tokens";

/// Global 4-bit/64; q_proj overrides only the group size, down_proj bits and group size,
/// lm_head is explicitly unquantized.
const QCONFIG: &str = r#"{
    "model_type": "qwen2",
    "quantization": {
        "group_size": 64, "bits": 4, "mode": "affine",
        "model.layers.0.self_attn.q_proj": {"group_size": 32},
        "model.layers.0.mlp.down_proj": {"group_size": 32, "bits": 8},
        "lm_head": false
    }
}"#;

fn bits_of(v: &[f32]) -> Vec<u32> {
    v.iter().map(|x| x.to_bits()).collect()
}

/// q_proj: 4-bit, group 32, in 64, out 2 (8 words per row), f16 scales, f32 bias.
fn add_q_proj(w: &mut Writer) {
    let mut words = vec![0xFFFF_FFFFu32; 8]; // row 0: all-15 nibbles
    words.extend([0x7654_3210, 0xFEDC_BA98].repeat(4)); // row 1: 0..15 repeating
    w.add_u32(&format!("{Q}.weight"), &[2, 8], &words).expect("w");
    w.add_f16(&format!("{Q}.scales"), &[2, 2], &[0.5, 0.25, 1.0, -0.5]).expect("s");
    w.add_f16(&format!("{Q}.biases"), &[2, 2], &[-1.0, 2.0, 0.0, 8.0]).expect("b");
    w.add_f32(&format!("{Q}.bias"), &[2], &[0.125, -0.125]).expect("bias");
}

/// down_proj: 8-bit, group 32, in 32, out 1, bf16 scales.
fn add_down_proj(w: &mut Writer) {
    let words =
        [0xFF80_0100, 0x0403_0201, 0x0807_0605, 0x0C0B_0A09, 0x100F_0E0D, 0x1413_1211, 0x1817_1615, 0x1C1B_1A19];
    w.add_u32(&format!("{DOWN}.weight"), &[1, 8], &words).expect("w");
    w.add_bf16(&format!("{DOWN}.scales"), &[1, 1], &[0.5]).expect("s");
    w.add_bf16(&format!("{DOWN}.biases"), &[1, 1], &[-64.0]).expect("b");
}

/// embed_tokens: 4-bit, group 64 (global), 3 tokens x 64, f32 scales; row t holds q = t + 1
/// in every nibble except the last word, which holds 0xF.
fn add_embed(w: &mut Writer) {
    let mut words = Vec::new();
    for t in 1..=3u32 {
        let nib = t * 0x1111_1111;
        words.extend([nib; 7]);
        words.push(0xFFFF_FFFF);
    }
    w.add_u32(&format!("{EMBED}.weight"), &[3, 8], &words).expect("w");
    w.add_f32(&format!("{EMBED}.scales"), &[3, 1], &[1.0, 2.0, 0.5]).expect("s");
    w.add_f32(&format!("{EMBED}.biases"), &[3, 1], &[0.0, -1.0, 10.0]).expect("b");
}

fn quantized_checkpoint() -> tempfile::TempDir {
    let mut w = Writer::new();
    add_q_proj(&mut w);
    add_down_proj(&mut w);
    add_embed(&mut w);
    // A dense layer despite the quantization block (no scales), and the unquantized lm_head.
    w.add_bf16(&format!("{GATE}.weight"), &[2, 3], &[1.0, 2.0, 3.0, -1.0, -2.0, -3.0]).expect("gate");
    w.add_f16("lm_head.weight", &[3, 2], &[0.5, 1.5, 2.5, 3.5, 4.5, 5.5]).expect("lm_head");
    checkpoint(QCONFIG, &w.to_bytes())
}

#[test]
fn config_parsing() {
    let dir = quantized_checkpoint();
    let ckpt = Checkpoint::open(dir.path()).expect("open");
    let q = ckpt.quantization().expect("quantization block");
    assert_eq!(q.source_key(), "quantization");
    assert_eq!(q.global(), QuantParams::affine(64, 4));
    assert_eq!(q.overrides().len(), 3);
    assert_eq!(q.for_layer(Q), LayerQuant::Quantized(QuantParams::affine(32, 4)));
    assert_eq!(q.for_layer(DOWN), LayerQuant::Quantized(QuantParams::affine(32, 8)));
    assert_eq!(q.for_layer("lm_head"), LayerQuant::Unquantized);
    assert_eq!(q.for_layer(EMBED), LayerQuant::Quantized(QuantParams::affine(64, 4)));
    // The raw JSON stays available to the model definition.
    assert_eq!(ckpt.config()["model_type"], "qwen2");
}

#[test]
fn quantization_config_key_and_absent_blocks() {
    let p = Path::new("config.json");
    let cfg = json!({"quantization_config": {"group_size": 128, "bits": 8}});
    let q = QuantConfig::from_config(&cfg, p).expect("ok").expect("some");
    assert_eq!((q.source_key(), q.global()), ("quantization_config", QuantParams::affine(128, 8)));
    // `quantization` wins when both exist (mlx_lm writes both, identical).
    let cfg =
        json!({"quantization": {"group_size": 32, "bits": 4}, "quantization_config": {"group_size": 128, "bits": 8}});
    let q = QuantConfig::from_config(&cfg, p).expect("ok").expect("some");
    assert_eq!(q.global(), QuantParams::affine(32, 4));
    assert!(QuantConfig::from_config(&json!({"hidden_size": 4}), p).expect("ok").is_none());
    assert!(QuantConfig::from_config(&json!({"quantization": null}), p).expect("ok").is_none());
}

#[test]
fn bad_quantization_blocks() {
    let p = Path::new("/ckpt/config.json");
    let cases = [
        (json!({"quantization": {"group_size": 64, "bits": 7}}), "quantization.bits", "unsupported bits 7"),
        (
            json!({"quantization": {"group_size": 16, "bits": 4}}),
            "quantization.group_size",
            "unsupported group_size 16",
        ),
        (json!({"quantization": {"group_size": 64}}), "quantization.bits", "missing"),
        (json!({"quantization": {"bits": 4}}), "quantization.group_size", "missing"),
        (json!({"quantization": {"group_size": 64, "bits": "4"}}), "quantization.bits", "non-negative integer"),
        (json!({"quantization": {"group_size": 32, "bits": 4, "mode": "mxint4"}}), "quantization.mode", "\"mxint4\""),
        (
            json!({"quantization": {"group_size": 64, "bits": 4, "mode": "mxfp4"}}),
            "quantization.mode",
            "mode mxfp4 takes bits 4 and group_size 32",
        ),
        (json!({"quantization": 4}), "quantization", "expected an object"),
        (
            json!({"quantization": {"group_size": 64, "bits": 4, "model.layers.3.mlp.up_proj": {"bits": 1}}}),
            "quantization.model.layers.3.mlp.up_proj.bits",
            "unsupported bits 1",
        ),
        (
            json!({"quantization": {"group_size": 64, "bits": 4, "x": {"mode": "nvfp4"}}}),
            "quantization.x.mode",
            "nvfp4",
        ),
        (json!({"quantization_config": {"quant_method": "gptq", "bits": 4}}), "quantization_config.group_size", "gptq"),
    ];
    for (cfg, key, reason) in cases {
        let err = QuantConfig::from_config(&cfg, p).expect_err(key);
        assert!(matches!(&err, Error::Config { key: k, .. } if k == key), "{cfg}: {err:?}");
        assert_names(&err.to_string(), &["/ckpt/config.json", key, reason]);
    }
}

#[test]
fn bad_quantization_block_fails_open() {
    let dir =
        checkpoint(r#"{"quantization": {"group_size": 64, "bits": 5, "mode": "mxfp8"}}"#, &Writer::new().to_bytes());
    let err = Checkpoint::open(dir.path()).expect_err("mode");
    assert_names(&err.to_string(), &[&shown(&dir.path().join("config.json")), "quantization.mode", "mxfp8"]);
}

#[test]
fn four_bit_dequantization_is_exact() {
    let dir = quantized_checkpoint();
    let ckpt = Checkpoint::open(dir.path()).expect("open");
    let Linear::Quantized(q) = ckpt.linear(Q).expect("q_proj") else {
        panic!("q_proj should be quantized");
    };
    assert_eq!((q.bits(), q.group_size(), q.out_features(), q.in_features()), (4, 32, 2, 64));
    assert_eq!(q.bias().and_then(|b| b.to_f32_vec().ok()), Some(vec![0.125, -0.125]));
    let w = dequantize_f32(&q);
    assert_eq!(w.len(), 2 * 64);
    // Row 0, all q = 15: group 0 15 * 0.5 - 1, group 1 15 * 0.25 + 2.
    let mut want = vec![6.5f32; 32];
    want.extend([5.75f32; 32]);
    // Row 1, q = c % 16: group 0 q * 1 + 0, group 1 q * -0.5 + 8.
    let g0: [f32; 16] = [0., 1., 2., 3., 4., 5., 6., 7., 8., 9., 10., 11., 12., 13., 14., 15.];
    let g1: [f32; 16] = [8., 7.5, 7., 6.5, 6., 5.5, 5., 4.5, 4., 3.5, 3., 2.5, 2., 1.5, 1., 0.5];
    want.extend(g0.repeat(2));
    want.extend(g1.repeat(2));
    assert_eq!(bits_of(&w), bits_of(&want));
    assert_eq!(bits_of(&q.dequantize_f32()), bits_of(&want));
    // Row gather gives the same rows.
    assert_eq!(bits_of(&q.dequantize_rows(&[1, 0]).expect("rows")), bits_of(&[&want[64..], &want[..64]].concat()));
}

#[test]
fn eight_bit_dequantization_is_exact() {
    let dir = quantized_checkpoint();
    let ckpt = Checkpoint::open(dir.path()).expect("open");
    let Linear::Quantized(q) = ckpt.linear(DOWN).expect("down_proj") else {
        panic!("down_proj should be quantized");
    };
    assert_eq!((q.bits(), q.group_size(), q.out_features(), q.in_features()), (8, 32, 1, 32));
    let w = q.dequantize_f32();
    // Bytes of word 0 (0xFF800100), low first: 0, 1, 128, 255; then 1..=28.
    let mut qs = vec![0u32, 1, 128, 255];
    qs.extend(1..=28);
    let want: Vec<f32> = qs.iter().map(|&v| v as f32 * 0.5 - 64.0).collect();
    assert_eq!(&w[..4], &[-64.0, -63.5, 0.0, 63.5]);
    assert_eq!(bits_of(&w), bits_of(&want));
}

#[test]
fn quantized_embedding_lookup() {
    let dir = quantized_checkpoint();
    let ckpt = Checkpoint::open(dir.path()).expect("open");
    let e = ckpt.embedding(EMBED).expect("embed");
    assert!(e.is_quantized());
    assert_eq!((e.out_features(), e.in_features()), (3, 64));
    let table = e.weight_f32();
    // Token t (0-based) has q = t + 1 in columns 0..56 and 15 in 56..64.
    let row = |q: f32, s: f32, b: f32| -> Vec<f32> {
        let mut r = vec![q * s + b; 56];
        r.extend([15.0 * s + b; 8]);
        r
    };
    let want = [row(1.0, 1.0, 0.0), row(2.0, 2.0, -1.0), row(3.0, 0.5, 10.0)].concat();
    assert_eq!(bits_of(&table), bits_of(&want));
    assert_eq!(&table[..1], &[1.0]);
    assert_eq!(table[64 + 56], 29.0);
    let rows = e.rows_f32(&[2, 2, 0]).expect("lookup");
    assert_eq!(bits_of(&rows), bits_of(&[&want[128..], &want[128..], &want[..64]].concat()));
    let err = e.rows_f32(&[0, 3]).expect_err("row 3");
    assert!(matches!(err, Error::RowOutOfRange { row: 3, rows: 3, .. }), "{err:?}");
    assert_names(&err.to_string(), &[&format!("`{EMBED}.weight`"), "row 3", "3 rows"]);
}

#[test]
fn dense_layers_follow_the_absence_of_scales() {
    let dir = quantized_checkpoint();
    let ckpt = Checkpoint::open(dir.path()).expect("open");
    // Global quantization block, but no `.scales`: dense (mlx_lm skips indivisible layers).
    let gate = ckpt.linear(GATE).expect("gate");
    let Linear::Dense(d) = gate else { panic!("gate should be dense") };
    assert_eq!((d.out_features(), d.in_features()), (2, 3));
    assert!(d.bias().is_none());
    assert_eq!(gate.weight_f32(), [1.0, 2.0, 3.0, -1.0, -2.0, -3.0]);
    assert_eq!(gate.rows_f32(&[1]).expect("row"), [-1.0, -2.0, -3.0]);
    let lm = ckpt.linear("lm_head").expect("lm_head");
    assert!(!lm.is_quantized());
    assert_eq!(lm.weight_f32(), [0.5, 1.5, 2.5, 3.5, 4.5, 5.5]);
    let err = ckpt.linear("model.layers.9.mlp.gate").expect_err("missing");
    assert_names(&err.to_string(), &["`model.layers.9.mlp.gate.weight`", &shown(dir.path())]);
}

#[test]
fn scales_without_quantization_block() {
    let mut w = Writer::new();
    add_q_proj(&mut w);
    let dir = checkpoint(common::PLAIN_CONFIG, &w.to_bytes());
    let ckpt = Checkpoint::open(dir.path()).expect("open");
    let err = ckpt.linear(Q).expect_err("no block");
    assert!(matches!(&err, Error::Layer { layer, .. } if layer == Q), "{err:?}");
    assert_names(&err.to_string(), &[&shown(dir.path()), Q, "no quantization block"]);
}

#[test]
fn scales_on_a_layer_marked_unquantized() {
    let mut w = Writer::new();
    add_q_proj(&mut w);
    let cfg = format!(r#"{{"quantization": {{"group_size": 32, "bits": 4, "{Q}": false}}}}"#);
    let dir = checkpoint(&cfg, &w.to_bytes());
    let err = Checkpoint::open(dir.path()).and_then(|c| c.linear(Q).map(|_| ())).expect_err("false");
    assert_names(&err.to_string(), &[Q, "marks it unquantized"]);
}

#[test]
fn packed_width_mismatch_names_tensor_expected_and_got() {
    let mut w = Writer::new();
    add_q_proj(&mut w);
    // Config claims 8 bits for a 4-bit layer: the packed width must be 16, not 8.
    let cfg = format!(r#"{{"quantization": {{"group_size": 32, "bits": 4, "{Q}": {{"bits": 8}}}}}}"#);
    let dir = checkpoint(&cfg, &w.to_bytes());
    let ckpt = Checkpoint::open(dir.path()).expect("open");
    let err = ckpt.linear(Q).expect_err("width");
    assert!(
        matches!(&err, Error::WrongShape { tensor, got, .. } if *tensor == format!("{Q}.weight") && got == &[2, 8]),
        "{err:?}"
    );
    assert_names(
        &err.to_string(),
        &[
            &shown(&dir.path().join("model.safetensors")),
            &format!("`{Q}.weight`"),
            "expected [2, 16] (bits=8, group_size=32, in=64",
            "got [2, 8]",
        ],
    );
}

#[test]
fn group_size_mismatch() {
    let mut w = Writer::new();
    add_q_proj(&mut w);
    // Global group size 64 applies (no override): scales width 2 means in = 128, width 16 words.
    let dir = checkpoint(r#"{"quantization": {"group_size": 64, "bits": 4}}"#, &w.to_bytes());
    let ckpt = Checkpoint::open(dir.path()).expect("open");
    let err = ckpt.linear(Q).expect_err("group size");
    assert_names(
        &err.to_string(),
        &[&format!("`{Q}.weight`"), "expected [2, 16] (bits=4, group_size=64, in=128", "got [2, 8]"],
    );
}

#[test]
fn scales_and_biases_checks() {
    let cfg = r#"{"quantization": {"group_size": 32, "bits": 4}}"#;
    // biases of a different shape than scales.
    let mut w = Writer::new();
    w.add_u32("l.weight", &[1, 4], &[0; 4]).expect("w");
    w.add_f16("l.scales", &[1, 1], &[1.0]).expect("s");
    w.add_f16("l.biases", &[1, 2], &[0.0, 0.0]).expect("b");
    let dir = checkpoint(cfg, &w.to_bytes());
    let err = Checkpoint::open(dir.path()).and_then(|c| c.linear("l").map(|_| ())).expect_err("biases");
    assert_names(&err.to_string(), &["`l.biases`", "expected [1, 1] like the scales", "got [1, 2]"]);

    // U32 scales.
    let mut w = Writer::new();
    w.add_u32("l.weight", &[1, 4], &[0; 4]).expect("w");
    w.add_u32("l.scales", &[1, 1], &[1]).expect("s");
    w.add_f16("l.biases", &[1, 1], &[0.0]).expect("b");
    let dir = checkpoint(cfg, &w.to_bytes());
    let err = Checkpoint::open(dir.path()).and_then(|c| c.linear("l").map(|_| ())).expect_err("dtype");
    assert!(matches!(err, Error::WrongDtype { .. }), "{err:?}");
    assert_names(&err.to_string(), &["`l.scales`", "expected F32, F16 or BF16, got U32"]);

    // Float packed weight.
    let mut w = Writer::new();
    w.add_f32("l.weight", &[1, 4], &[0.0; 4]).expect("w");
    w.add_f16("l.scales", &[1, 1], &[1.0]).expect("s");
    w.add_f16("l.biases", &[1, 1], &[0.0]).expect("b");
    let dir = checkpoint(cfg, &w.to_bytes());
    let err = Checkpoint::open(dir.path()).and_then(|c| c.linear("l").map(|_| ())).expect_err("dtype");
    assert_names(&err.to_string(), &["`l.weight`", "expected U32, got F32"]);

    // Missing `.biases`.
    let mut w = Writer::new();
    w.add_u32("l.weight", &[1, 4], &[0; 4]).expect("w");
    w.add_f16("l.scales", &[1, 1], &[1.0]).expect("s");
    let dir = checkpoint(cfg, &w.to_bytes());
    let err = Checkpoint::open(dir.path()).and_then(|c| c.linear("l").map(|_| ())).expect_err("biases");
    assert!(matches!(&err, Error::MissingTensor { tensor, .. } if tensor == "l.biases"), "{err:?}");

    // Bias of the wrong length.
    let mut w = Writer::new();
    w.add_bf16("l.weight", &[2, 2], &[0.0; 4]).expect("w");
    w.add_bf16("l.bias", &[3], &[0.0; 3]).expect("bias");
    let dir = checkpoint(cfg, &w.to_bytes());
    let err = Checkpoint::open(dir.path()).and_then(|c| c.linear("l").map(|_| ())).expect_err("bias");
    assert_names(&err.to_string(), &["`l.bias`", "expected [2]", "got [3]"]);

    // A 3-D dense weight.
    let mut w = Writer::new();
    w.add_f32("l.weight", &[1, 1, 2], &[0.0; 2]).expect("w");
    let dir = checkpoint(cfg, &w.to_bytes());
    let err = Checkpoint::open(dir.path()).and_then(|c| c.linear("l").map(|_| ())).expect_err("rank");
    assert_names(&err.to_string(), &["`l.weight`", "2-D [out, in]", "got [1, 1, 2]"]);
}

#[test]
fn three_bit_layout_matches_mlx() {
    // 0..7 at 3 bits each: 0 | 1<<3 | 2<<6 | 3<<9 | 4<<12 | 5<<15 | 6<<18 | 7<<21 = 0xFAC688,
    // bytes 88 C6 FA, repeated four times over 32 values = 12 bytes = 3 words.
    let values: Vec<u32> = (0..32).map(|i| i % 8).collect();
    let words = pack(&values, 32, 3).expect("pack");
    assert_eq!(words, [0x88FA_C688, 0xC688_FAC6, 0xFAC6_88FA]);
    let mut w = Writer::new();
    w.add_u32("l.weight", &[1, 3], &words).expect("w");
    w.add_f32("l.scales", &[1, 1], &[2.0]).expect("s");
    w.add_f32("l.biases", &[1, 1], &[-7.0]).expect("b");
    let dir = checkpoint(r#"{"quantization": {"group_size": 32, "bits": 3}}"#, &w.to_bytes());
    let ckpt = Checkpoint::open(dir.path()).expect("open");
    let l = ckpt.linear("l").expect("linear");
    let want: Vec<f32> = values.iter().map(|&q| q as f32 * 2.0 - 7.0).collect();
    assert_eq!(bits_of(&l.weight_f32()), bits_of(&want));
}

#[test]
fn pack_matches_hand_layouts() {
    // 4-bit: element j of a word at bits 4j..4j+4.
    assert_eq!(pack(&(0..8).collect::<Vec<_>>(), 8, 4), Some(vec![0x7654_3210]));
    // 8-bit: 4 per word, element 0 in the low byte.
    assert_eq!(pack(&[0, 1, 128, 255], 4, 8), Some(vec![0xFF80_0100]));
    // 2-bit: 0 | 1<<2 | 2<<4 | 3<<6 = 0xE4 per byte.
    assert_eq!(pack(&[0, 1, 2, 3].repeat(4), 16, 2), Some(vec![0xE4E4_E4E4]));
    // 6-bit: 63, 0, 63, 0 -> bits 0..6 and 12..18 set = 0x03F03F per 3 bytes.
    assert_eq!(pack(&[63, 0, 63, 0].repeat(4), 16, 6), Some(vec![0x3F03_F03F, 0xF03F_03F0, 0x03F0_3F03]));
    // 5-bit: 0..7 at bit 5j = 0x39_8A41_8820 (5 bytes), four times over 32 values.
    assert_eq!(
        pack(&(0..32).map(|i| i % 8).collect::<Vec<_>>(), 32, 5),
        Some(vec![0x8A41_8820, 0x4188_2039, 0x8820_398A, 0x2039_8A41, 0x398A_4188])
    );
    assert_eq!(pack(&[16], 8, 4), None, "value does not fit in 4 bits");
    assert_eq!(pack(&[0; 12], 12, 4), None, "row is not whole words");
    assert_eq!(pack(&[0; 8], 8, 7), None, "unsupported bits");
    assert_eq!(pack(&[0; 12], 8, 4), None, "not whole rows");
}

#[test]
fn every_supported_width_round_trips_through_a_checkpoint() {
    for bits in weights::SUPPORTED_BITS {
        let (out, inp) = (3usize, 64usize);
        let max = (1u32 << bits) - 1;
        // Covers 0, max and everything between, different per row.
        let mut values: Vec<u32> = (0..out * inp).map(|i| (i as u32 * 7 + i as u32 / 64) % (max + 1)).collect();
        values[5] = max;
        values[100] = max;
        let words = pack(&values, inp, bits).expect("pack");
        let width = inp * bits as usize / 32;
        let mut w = Writer::new();
        w.add_u32("l.weight", &[out, width], &words).expect("w");
        w.add_f16("l.scales", &[out, 2], &[1.0, 0.5, 2.0, 0.25, 1.0, 1.0]).expect("s");
        w.add_f16("l.biases", &[out, 2], &[0.0, -1.0, 3.0, 0.0, -0.5, 0.5]).expect("b");
        let cfg = format!(r#"{{"quantization": {{"group_size": 32, "bits": {bits}}}}}"#);
        let dir = checkpoint(&cfg, &w.to_bytes());
        let ckpt = Checkpoint::open(dir.path()).expect("open");
        let l = ckpt.linear("l").expect("linear");
        let sb = [(1.0, 0.0), (0.5, -1.0), (2.0, 3.0), (0.25, 0.0), (1.0, -0.5), (1.0, 0.5)];
        let want: Vec<f32> = values
            .iter()
            .enumerate()
            .map(|(i, &q)| {
                let (s, b) = sb[(i / 64) * 2 + (i % 64) / 32];
                q as f32 * s + b
            })
            .collect();
        assert_eq!(bits_of(&l.weight_f32()), bits_of(&want), "bits = {bits}");
    }
}

#[test]
fn a_part_of_a_fused_layer_is_its_rows() {
    let dir = quantized_checkpoint();
    let ckpt = Checkpoint::open(dir.path()).expect("open");
    // Quantized: row 1 of q_proj is a layer of its own, with its scales, biases and bias.
    let q = ckpt.linear(Q).expect("q_proj");
    let Linear::Quantized(part) = q.part(1, 1).expect("part") else { panic!("a quantized part") };
    assert_eq!((part.out_features(), part.in_features(), part.bits()), (1, 64, 4));
    assert_eq!(part.weight().shape(), [1, 8]);
    assert_eq!(part.scales().to_f32_vec().expect("scales"), [1.0, -0.5]);
    assert_eq!(part.biases().expect("affine").to_f32_vec().expect("biases"), [0.0, 8.0]);
    assert_eq!(part.bias().and_then(|b| b.to_f32_vec().ok()), Some(vec![-0.125]));
    assert_eq!(bits_of(&part.dequantize_f32()), bits_of(&q.weight_f32()[64..]));
    // Its bytes lie where the file holds them.
    let whole = ckpt.tensor(&format!("{Q}.weight")).expect("weight");
    assert_eq!(part.weight().file_offset(), whole.file_offset() + 32);
    // Dense: rows of the weight.
    let gate = ckpt.linear(GATE).expect("gate").part(1, 1).expect("dense part");
    assert_eq!((gate.out_features(), gate.in_features()), (1, 3));
    assert_eq!(gate.weight_f32(), [-1.0, -2.0, -3.0]);
    // A range past the rows names the tensor and what it needed.
    let err = q.part(1, 2).expect_err("rows 1..3 of 2");
    assert!(matches!(err, Error::WrongShape { .. }), "{err:?}");
    assert_names(&err.to_string(), &[&format!("`{Q}.weight`"), "at least 3 rows", "[2, 8]"]);
}

#[test]
fn one_expert_of_stacked_experts_is_a_layer() {
    const EXPERTS: &str = "model.layers.0.mlp.switch_mlp.up_proj";
    let config = r#"{"model_type": "qwen3_moe", "quantization": {"group_size": 32, "bits": 4}}"#;
    // Expert 0 is q_proj's two rows, expert 1 the same rows swapped, with their scales.
    let mut words = vec![0xFFFF_FFFFu32; 8];
    words.extend([0x7654_3210, 0xFEDC_BA98].repeat(4));
    let swapped = [&words[8..], &words[..8]].concat();
    let mut w = Writer::new();
    add_q_proj(&mut w);
    w.add_u32(&format!("{EXPERTS}.weight"), &[2, 2, 8], &[words.clone(), swapped].concat()).expect("w");
    let scales = [0.5, 0.25, 1.0, -0.5];
    let biases = [-1.0, 2.0, 0.0, 8.0];
    let (s1, b1) = ([1.0, -0.5, 0.5, 0.25], [0.0, 8.0, -1.0, 2.0]);
    w.add_f16(&format!("{EXPERTS}.scales"), &[2, 2, 2], &[&scales[..], &s1].concat()).expect("s");
    w.add_f16(&format!("{EXPERTS}.biases"), &[2, 2, 2], &[&biases[..], &b1].concat()).expect("b");
    let dir = checkpoint(config, &w.to_bytes());
    let ckpt = Checkpoint::open(dir.path()).expect("open");
    let q = ckpt.linear(Q).expect("q_proj").weight_f32();
    let e0 = ckpt.expert(EXPERTS, 0).expect("expert 0");
    let Linear::Quantized(e1) = ckpt.expert(EXPERTS, 1).expect("expert 1") else { panic!("quantized") };
    assert_eq!((e1.out_features(), e1.in_features(), e1.bits(), e1.group_size()), (2, 64, 4, 32));
    assert_eq!(e1.weight().shape(), [2, 8]);
    assert_eq!(bits_of(&e0.weight_f32()), bits_of(&q));
    assert_eq!(bits_of(&e1.dequantize_f32()), bits_of(&[&q[64..], &q[..64]].concat()));
    let err = ckpt.expert(EXPERTS, 2).expect_err("two experts");
    assert_names(&err.to_string(), &[&format!("`{EXPERTS}.weight`"), "at least 3 rows", "[2, 2, 8]"]);
}

/// MLX 0.32.4's `mx.quantize` then `mx.dequantize` (f32 scales and biases widened from the
/// stored type) on one group each, recorded from the oracle venv: a bf16 row at 4 bits (the
/// edge at the minimum) and an f16 row near 5 at 8 bits (the edge at the maximum, biases far
/// from zero).
#[test]
// The literals are the exact decimal expansions of the f32 values MLX printed.
#[allow(clippy::excessive_precision)]
fn quantize_dequantize_is_mlx_affine_quantization() {
    let bf16_in = [
        0.00122833251953125,
        0.298828125,
        -0.2734375,
        -0.890625,
        -0.455078125,
        -0.9921875,
        0.06005859375,
        1.34375,
        -0.4921875,
        -0.62109375,
        0.490234375,
        0.357421875,
        0.10546875,
        -0.9296875,
        -0.029296875,
        0.6953125,
        -1.34375,
        -0.45703125,
        -1.8984375,
        -1.2890625,
        -1.84375,
        -0.2353515625,
        -1.265625,
        0.271484375,
        0.1572265625,
        -0.1865234375,
        -2.515625,
        -0.5390625,
        -0.048583984375,
        0.11328125,
        -1.53125,
        -0.478515625,
    ];
    let bf16_out = [
        0.00390625,
        0.255859375,
        -0.248046875,
        -1.00390625,
        -0.5,
        -1.00390625,
        0.00390625,
        1.263671875,
        -0.5,
        -0.5,
        0.5078125,
        0.255859375,
        0.00390625,
        -1.00390625,
        0.00390625,
        0.759765625,
        -1.255859375,
        -0.5,
        -2.01171875,
        -1.255859375,
        -1.759765625,
        -0.248046875,
        -1.255859375,
        0.255859375,
        0.255859375,
        -0.248046875,
        -2.515625,
        -0.5,
        0.00390625,
        0.00390625,
        -1.5078125,
        -0.5,
    ];
    let four = QuantParams::affine(32, 4);
    assert_eq!(quantize_dequantize(&bf16_in, 32, four, Dtype::BF16).unwrap(), bf16_out);
    let f16_in = [
        4.98828125, 4.9921875, 5.01171875, 4.9921875, 5.0, 5.0078125, 4.99609375, 5.0, 5.0, 5.0, 4.98828125, 5.0,
        5.01171875, 4.984375, 5.0078125, 5.0, 4.9921875, 5.01953125, 5.0078125, 4.98828125, 5.0, 5.00390625, 5.0,
        5.0078125, 5.0, 5.0078125, 5.015625, 4.9921875, 5.00390625, 4.99609375, 5.0, 4.98828125,
    ];
    let f16_out = [
        4.988222122192383,
        4.992221832275391,
        5.011669635772705,
        4.992221832275391,
        4.999945640563965,
        5.007807731628418,
        4.996084213256836,
        4.999945640563965,
        4.999945640563965,
        4.999945640563965,
        4.988222122192383,
        4.999945640563965,
        5.011669635772705,
        4.984360218048096,
        5.007807731628418,
        4.999945640563965,
        4.992221832275391,
        5.01953125,
        5.007807731628418,
        4.988222122192383,
        4.999945640563965,
        5.003945827484131,
        4.999945640563965,
        5.007807731628418,
        4.999945640563965,
        5.007807731628418,
        5.015669345855713,
        4.992221832275391,
        5.003945827484131,
        4.996084213256836,
        4.999945640563965,
        4.988222122192383,
    ];
    let eight = QuantParams::affine(32, 8);
    assert_eq!(quantize_dequantize(&f16_in, 32, eight, Dtype::F16).unwrap(), f16_out);
    // A group of zeros stays zeros; a width the group size does not divide is refused.
    assert_eq!(quantize_dequantize(&[0.0; 32], 32, four, Dtype::BF16).unwrap(), [0.0; 32]);
    assert!(quantize_dequantize(&[0.0; 48], 48, four, Dtype::BF16).is_none());
}

/// `mx.dequantize` with bf16 scales rounds `q * scale` to bf16 before adding the bias: MLX
/// 0.32.4 gives 1.796875 for q = 5, scale = bias = 0.30078125, where one rounding of the
/// exact 1.8046875 would keep it.
#[test]
fn dequantization_in_the_scale_type_rounds_twice_as_mlx() {
    let mut w = Writer::new();
    w.add_u32(&format!("{DOWN}.weight"), &[1, 8], &[0x0505_0505; 8]).expect("w");
    w.add_bf16(&format!("{DOWN}.scales"), &[1, 1], &[0.30078125]).expect("s");
    w.add_bf16(&format!("{DOWN}.biases"), &[1, 1], &[0.30078125]).expect("b");
    let dir = checkpoint(r#"{"quantization": {"group_size": 32, "bits": 8}}"#, &w.to_bytes());
    let ckpt = Checkpoint::open(dir.path()).expect("open");
    let Linear::Quantized(q) = ckpt.linear(DOWN).expect("down_proj") else { panic!("quantized") };
    assert_eq!(q.dequantize_in_scale_type(), [1.796875; 32]);
    assert_eq!(dequantize_f32(&q), [5.0 * 0.30078125 + 0.30078125; 32], "f32: one rounding");
}

/// The floating-point modes as MLX 0.32.4's `mx.dequantize` decodes them (checked against it
/// when written): mxfp4's E2M1 codes times an E8M0 scale `2^(s - 127)` per 32 (no biases),
/// nvfp4's times an FP8 E4M3 scale per 16, mxfp8's E4M3 codes times E8M0; a layer without
/// an override takes the global mode, an override without a mode is affine; a
/// floating-point layer with biases, or scales of a float type, is refused naming the tensor.
#[test]
fn floating_point_modes_dequantize_as_mlx() {
    let config = r#"{"quantization": {"group_size": 32, "bits": 4, "mode": "mxfp4",
        "a": {"group_size": 16, "bits": 4, "mode": "nvfp4"}, "b": {"bits": 8, "mode": "mxfp8"},
        "r": {"group_size": 64, "bits": 8}}}"#;
    let mut w = Writer::new();
    // mxfp4, one row of 32: codes 0..15 twice (low nibble first), scale 2^(126 - 127).
    w.add_u32("c.weight", &[1, 4], &[0x7654_3210, 0xFEDC_BA98, 0x7654_3210, 0xFEDC_BA98]).expect("w");
    w.add("c.scales", Dtype::U8, &[1, 1], vec![126]).expect("s");
    // nvfp4, 32 inputs: two groups of 16 (codes 2 = 1.0 and 15 = -6.0), E4M3 scales 0x38 = 1.0
    // and 0x41 = (1 + 1/8) * 2^1 = 2.25.
    w.add_u32("a.weight", &[1, 4], &[0x2222_2222, 0x2222_2222, 0xFFFF_FFFF, 0xFFFF_FFFF]).expect("w");
    w.add("a.scales", Dtype::U8, &[1, 2], vec![0x38, 0x41]).expect("s");
    // mxfp8, 32 inputs: E4M3 codes 0x38 (1.0), 0xC4 (-(1 + 4/8) * 2^1 = -3), 0x01 (2^-9), 0x7F
    // (NaN) then zeros; scale 2^(129 - 127).
    let mut bytes = vec![0x38u8, 0xC4, 0x01, 0x7F];
    bytes.resize(32, 0);
    let words: Vec<u32> = bytes.chunks(4).map(|c| u32::from_le_bytes([c[0], c[1], c[2], c[3]])).collect();
    w.add_u32("b.weight", &[1, 8], &words).expect("w");
    w.add("b.scales", Dtype::U8, &[1, 1], vec![129]).expect("s");
    let dir = checkpoint(config, &w.to_bytes());
    let ckpt = Checkpoint::open(dir.path()).expect("open");
    let quant = ckpt.quantization().expect("block");
    assert_eq!(
        quant.for_layer("c"),
        LayerQuant::Quantized(QuantParams { group_size: 32, bits: 4, mode: QuantMode::Mxfp4 })
    );
    // An override that names no mode is affine (mlx-lm's `to_quantized` default).
    assert_eq!(quant.for_layer("r"), LayerQuant::Quantized(QuantParams::affine(64, 8)));
    let dequantized = |name: &str| {
        let Linear::Quantized(q) = ckpt.linear(name).expect(name) else { panic!("{name} is quantized") };
        assert!(q.biases().is_none());
        dequantize_f32(&q)
    };
    let e2m1 = [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0];
    let want: Vec<f32> = e2m1.iter().chain(&e2m1).map(|v| v * 0.5).collect();
    assert_eq!(bits_of(&dequantized("c")), bits_of(&want));
    let want: Vec<f32> = [1.0f32; 16].into_iter().chain([-6.0 * 2.25; 16]).collect();
    assert_eq!(dequantized("a"), want);
    let b = dequantized("b");
    assert_eq!(&b[..3], [4.0, -12.0, 2f32.powi(-9) * 4.0]);
    assert!(b[3].is_nan() && b[4..].iter().all(|&v| v == 0.0));

    // Biases beside a floating-point layer, scales of a float type: refused by name.
    let mut w = Writer::new();
    w.add_u32("c.weight", &[1, 4], &[0; 4]).expect("w");
    w.add("c.scales", Dtype::U8, &[1, 1], vec![127]).expect("s");
    w.add_f16("c.biases", &[1, 1], &[0.0]).expect("b");
    w.add_u32("a.weight", &[1, 4], &[0; 4]).expect("w");
    w.add_f16("a.scales", &[1, 2], &[1.0, 1.0]).expect("s");
    let dir = checkpoint(config, &w.to_bytes());
    let ckpt = Checkpoint::open(dir.path()).expect("open");
    let err = ckpt.linear("c").map(|_| ()).expect_err("biases").to_string();
    assert_names(&err, &["c.weight", "mode mxfp4 has no `.biases`"]);
    let err = ckpt.linear("a").map(|_| ()).expect_err("scales").to_string();
    assert_names(&err, &["a.scales"]);
}

/// What the packed products run for widths and modes they have no code of their own for:
/// affine 2 and 3 bits as 4, 5 and 6 as 8 (the same q, scales and biases), FP4 as 8-bit
/// affine (`q = 2 fp4 + 12`, scale s / 2, bias -6 s), each giving the layer's own weights in
/// f32 (a -0 of FP4 becomes +0); f16 scales where they hold those values, f32 where not;
/// mxfp8 has none.
#[test]
fn narrow_widths_and_fp4_have_exact_affine_copies() {
    for bits in weights::SUPPORTED_BITS {
        let (out, inp) = (2usize, 64usize);
        let values: Vec<u32> = (0..out * inp).map(|i| (i as u32 * 5 + 3) % (1 << bits)).collect();
        let mut w = Writer::new();
        w.add_u32("l.weight", &[out, inp * bits as usize / 32], &pack(&values, inp, bits).expect("pack")).expect("w");
        w.add_f16("l.scales", &[out, 2], &[1.0, 0.5, 2.0, 0.25]).expect("s");
        w.add_f16("l.biases", &[out, 2], &[0.0, -1.0, 3.0, -0.5]).expect("b");
        let cfg = format!(r#"{{"quantization": {{"group_size": 32, "bits": {bits}}}}}"#);
        let dir = checkpoint(&cfg, &w.to_bytes());
        let ckpt = Checkpoint::open(dir.path()).expect("open");
        let Linear::Quantized(q) = ckpt.linear("l").expect("linear") else { panic!("quantized") };
        let copy = q.to_affine().expect("affine");
        assert_eq!((copy.bits, copy.dtype), (if bits <= 4 { 4 } else { 8 }, Dtype::F16), "bits = {bits}");
        assert_eq!(copy.weight.len(), out * inp * copy.bits as usize / 8);
        assert_eq!(bits_of(&copy.dequantize_f32()), bits_of(&dequantize_f32(&q)), "bits = {bits}");
    }
    let config = r#"{"quantization": {"group_size": 32, "bits": 4, "mode": "mxfp4",
        "a": {"group_size": 16, "bits": 4, "mode": "nvfp4"}, "b": {"bits": 8, "mode": "mxfp8"},
        "t": {"group_size": 32, "bits": 4, "mode": "mxfp4"}}}"#;
    let mut w = Writer::new();
    // Every E2M1 code, scale 2^(126 - 127); nvfp4 with E4M3 scales 1.0 and 2.25; mxfp8; and
    // an mxfp4 scale of 2^-30, finer than f16 holds.
    let codes = [0x7654_3210u32, 0xFEDC_BA98, 0x7654_3210, 0xFEDC_BA98];
    w.add_u32("c.weight", &[1, 4], &codes).expect("w");
    w.add("c.scales", Dtype::U8, &[1, 1], vec![126]).expect("s");
    w.add_u32("a.weight", &[1, 4], &codes).expect("w");
    w.add("a.scales", Dtype::U8, &[1, 2], vec![0x38, 0x41]).expect("s");
    w.add_u32("b.weight", &[1, 8], &[0x3838_3838; 8]).expect("w");
    w.add("b.scales", Dtype::U8, &[1, 1], vec![129]).expect("s");
    w.add_u32("t.weight", &[1, 4], &codes).expect("w");
    w.add("t.scales", Dtype::U8, &[1, 1], vec![97]).expect("s");
    let dir = checkpoint(config, &w.to_bytes());
    let ckpt = Checkpoint::open(dir.path()).expect("open");
    let layer = |name: &str| {
        let Linear::Quantized(q) = ckpt.linear(name).expect(name) else { panic!("{name} is quantized") };
        q
    };
    let plus_zero = |v: Vec<f32>| bits_of(&v.into_iter().map(|x| x + 0.0).collect::<Vec<_>>());
    for (name, dtype) in [("c", Dtype::F16), ("a", Dtype::F16), ("t", Dtype::F32)] {
        let q = layer(name);
        let copy = q.to_affine().expect(name);
        assert_eq!((copy.bits, copy.dtype), (8, dtype), "{name}");
        assert!(copy.weight.iter().all(|&v| v <= 24), "{name}: q in 0..=24");
        assert_eq!(plus_zero(copy.dequantize_f32()), plus_zero(dequantize_f32(&q)), "{name}");
    }
    assert_eq!(layer("b").to_affine(), None, "mxfp8");
}
