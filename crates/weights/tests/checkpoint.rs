//! Checkpoint folders: config, single file and sharded weights, tensor views and typed readers.

mod common;

use common::{PLAIN_CONFIG, assert_names, checkpoint, dir_with, shown};
use weights::write::Writer;
use weights::{Checkpoint, Dtype, Error};

fn u16_bytes(words: &[u16]) -> Vec<u8> {
    words.iter().flat_map(|b| b.to_le_bytes()).collect()
}

/// A file with one tensor of each float dtype plus integer ones.
fn mixed_file() -> Vec<u8> {
    let mut w = Writer::new();
    w.metadata("format", "mlx");
    w.add_f32("f32", &[2, 2], &[1.0, -2.5, 3.25, 1e-30]).expect("f32");
    // 1.0, -2.0, 1365/4096, 2^-24 (smallest subnormal), 65504 (max), -0.0.
    w.add("f16", Dtype::F16, &[6], u16_bytes(&[0x3C00, 0xC000, 0x3555, 0x0001, 0x7BFF, 0x8000])).expect("f16");
    // 1.0, 3.140625, -2^-126.
    w.add("bf16", Dtype::BF16, &[3], u16_bytes(&[0x3F80, 0x4049, 0x8080])).expect("bf16");
    w.add("i32", Dtype::I32, &[2], [-7i32, 9].iter().flat_map(|v| v.to_le_bytes()).collect()).expect("i32");
    w.add("i64", Dtype::I64, &[1], (-1i64 << 40).to_le_bytes().to_vec()).expect("i64");
    w.add("u8", Dtype::U8, &[2], vec![0, 255]).expect("u8");
    w.add("i8", Dtype::I8, &[2], vec![0x80, 0x7F]).expect("i8");
    w.add("mask", Dtype::Bool, &[2], vec![1, 0]).expect("bool");
    w.add_u32("packed", &[1, 2], &[0xDEAD_BEEF, 7]).expect("u32");
    w.to_bytes()
}

#[test]
fn single_file_checkpoint_reads_config_and_tensors() {
    let dir = checkpoint(PLAIN_CONFIG, &mixed_file());
    let ckpt = Checkpoint::open(dir.path()).expect("open");
    assert_eq!(ckpt.dir(), dir.path());
    assert_eq!(ckpt.config()["model_type"], "llama");
    assert_eq!(ckpt.config()["hidden_size"], 4);
    assert!(ckpt.quantization().is_none());
    assert_eq!(ckpt.shards().len(), 1);
    assert_eq!(ckpt.shards()[0].metadata().get("format").map(String::as_str), Some("mlx"));
    assert_eq!(ckpt.len(), 9);
    assert_eq!(ckpt.tensor_names(), ["bf16", "f16", "f32", "i32", "i64", "i8", "mask", "packed", "u8"]);
}

#[test]
fn float_readers_widen_exactly() {
    let dir = checkpoint(PLAIN_CONFIG, &mixed_file());
    let ckpt = Checkpoint::open(dir.path()).expect("open");

    let f32t = ckpt.tensor("f32").expect("f32");
    assert_eq!((f32t.dtype(), f32t.shape(), f32t.numel()), (Dtype::F32, &[2usize, 2][..], 4));
    assert_eq!(f32t.to_f32_vec().expect("f32"), [1.0, -2.5, 3.25, 1e-30]);

    let f16t = ckpt.tensor("f16").expect("f16");
    let got = f16t.to_f32_vec().expect("f16");
    let want = [1.0, -2.0, 1365.0 / 4096.0, 2f32.powi(-24), 65504.0, -0.0];
    assert_eq!(
        got.iter().map(|v| v.to_bits()).collect::<Vec<_>>(),
        want.iter().map(|v| v.to_bits()).collect::<Vec<_>>()
    );
    assert_eq!(f16t.as_f16_bits().expect("bits"), [0x3C00, 0xC000, 0x3555, 0x0001, 0x7BFF, 0x8000]);

    let bf16t = ckpt.tensor("bf16").expect("bf16");
    assert_eq!(bf16t.to_f32_vec().expect("bf16"), [1.0, 3.140625, -(2f32.powi(-126))]);
    assert_eq!(bf16t.as_bf16_bits().expect("bits"), [0x3F80, 0x4049, 0x8080]);
}

#[test]
fn integer_readers() {
    let dir = checkpoint(PLAIN_CONFIG, &mixed_file());
    let ckpt = Checkpoint::open(dir.path()).expect("open");
    let ints = |n: &str| ckpt.tensor(n).and_then(|t| t.to_i64_vec()).expect(n);
    assert_eq!(ints("i32"), [-7, 9]);
    assert_eq!(ints("i64"), [-(1 << 40)]);
    assert_eq!(ints("u8"), [0, 255]);
    assert_eq!(ints("i8"), [-128, 127]);
    assert_eq!(ints("mask"), [1, 0]);
    assert_eq!(ints("packed"), [0xDEAD_BEEF, 7]);
    assert_eq!(ckpt.tensor("packed").and_then(|t| t.as_u32_words()).expect("u32"), [0xDEAD_BEEF, 7]);
    let err = ckpt.tensor("f32").and_then(|t| t.to_i64_vec()).expect_err("float");
    assert!(matches!(err, Error::WrongDtype { got: Dtype::F32, .. }), "{err:?}");
}

#[test]
fn views_borrow_the_mapping() {
    let bytes = mixed_file();
    let dir = checkpoint(PLAIN_CONFIG, &bytes);
    let ckpt = Checkpoint::open(dir.path()).expect("open");
    let a = ckpt.tensor("f32").expect("f32");
    let b = ckpt.tensor("f32").expect("f32");
    // The same memory both times, and it is the file's bytes at the stated offset.
    assert_eq!(a.bytes().as_ptr(), b.bytes().as_ptr());
    let off = a.file_offset() as usize;
    assert_eq!(a.bytes(), &bytes[off..off + 16]);
    assert_eq!(a.file(), dir.path().join("model.safetensors"));
    let shard = &ckpt.shards()[0];
    assert_eq!(shard.tensor("f32").expect("f32").bytes().as_ptr(), a.bytes().as_ptr());
}

#[test]
fn wrong_dtype_and_shape_errors_name_everything() {
    let dir = checkpoint(PLAIN_CONFIG, &mixed_file());
    let ckpt = Checkpoint::open(dir.path()).expect("open");
    let file = shown(&dir.path().join("model.safetensors"));
    let t = ckpt.tensor("f32").expect("f32");
    t.expect(Dtype::F32, &[2, 2]).expect("matches");

    let err = t.expect(Dtype::F32, &[4]).expect_err("shape");
    assert!(matches!(&err, Error::WrongShape { tensor, got, .. } if tensor == "f32" && got == &[2, 2]), "{err:?}");
    assert_names(&err.to_string(), &[&file, "`f32`", "wrong shape", "expected [4]", "got [2, 2]"]);

    let err = t.expect(Dtype::BF16, &[2, 2]).expect_err("dtype");
    assert!(matches!(err, Error::WrongDtype { got: Dtype::F32, .. }), "{err:?}");
    assert_names(&err.to_string(), &[&file, "`f32`", "wrong dtype", "expected BF16", "got F32"]);

    let err = t.as_f16_bits().expect_err("not f16");
    assert_names(&err.to_string(), &["expected F16, got F32"]);
    let err = ckpt.tensor("packed").and_then(|t| t.to_f32_vec()).expect_err("u32");
    assert_names(&err.to_string(), &["`packed`", "expected F32, F16 or BF16, got U32"]);
}

#[test]
fn missing_tensor_names_tensor_and_dir() {
    let dir = checkpoint(PLAIN_CONFIG, &mixed_file());
    let ckpt = Checkpoint::open(dir.path()).expect("open");
    assert!(!ckpt.contains("model.norm.weight"));
    assert!(ckpt.get("model.norm.weight").is_none());
    let err = ckpt.tensor("model.norm.weight").expect_err("missing");
    assert!(matches!(&err, Error::MissingTensor { tensor, .. } if tensor == "model.norm.weight"), "{err:?}");
    assert_names(&err.to_string(), &["`model.norm.weight`", &shown(dir.path())]);
}

fn shard(tensors: &[(&str, f32)]) -> Vec<u8> {
    let mut w = Writer::new();
    for (name, v) in tensors {
        w.add_f32(name, &[1], &[*v]).expect("add");
    }
    w.to_bytes()
}

const INDEX: &str = r#"{"metadata": {"total_size": 12}, "weight_map": {
    "a": "model-00001-of-00002.safetensors",
    "b": "model-00001-of-00002.safetensors",
    "c": "model-00002-of-00002.safetensors"}}"#;

#[test]
fn sharded_checkpoint() {
    let s1 = shard(&[("a", 1.0), ("b", 2.0)]);
    let s2 = shard(&[("c", 3.0)]);
    let dir = dir_with(&[
        ("config.json", PLAIN_CONFIG.as_bytes()),
        ("model.safetensors.index.json", INDEX.as_bytes()),
        ("model-00001-of-00002.safetensors", &s1),
        ("model-00002-of-00002.safetensors", &s2),
    ]);
    let ckpt = Checkpoint::open(dir.path()).expect("open");
    assert_eq!(ckpt.shards().len(), 2);
    assert_eq!(ckpt.tensor_names(), ["a", "b", "c"]);
    for (name, v, file) in [("a", 1.0, "model-00001-of-00002"), ("c", 3.0, "model-00002-of-00002")] {
        let t = ckpt.tensor(name).expect(name);
        assert_eq!(t.to_f32_vec().expect("f32"), [v]);
        assert_eq!(t.file(), dir.path().join(format!("{file}.safetensors")));
    }
}

#[test]
fn index_wins_over_single_file() {
    // A stale model.safetensors next to an index is ignored.
    let dir = dir_with(&[
        ("config.json", PLAIN_CONFIG.as_bytes()),
        ("model.safetensors", &shard(&[("a", 9.0)])),
        ("model.safetensors.index.json", br#"{"weight_map": {"a": "s.safetensors"}}"#),
        ("s.safetensors", &shard(&[("a", 1.0), ("extra", 5.0)])),
    ]);
    let ckpt = Checkpoint::open(dir.path()).expect("open");
    assert_eq!(ckpt.tensor("a").and_then(|t| t.to_f32_vec()).expect("a"), [1.0]);
    // Tensors the index does not name are not reachable.
    assert!(!ckpt.contains("extra"));
}

#[test]
fn missing_shard() {
    let dir = dir_with(&[
        ("config.json", PLAIN_CONFIG.as_bytes()),
        ("model.safetensors.index.json", INDEX.as_bytes()),
        ("model-00001-of-00002.safetensors", &shard(&[("a", 1.0), ("b", 2.0)])),
    ]);
    let err = Checkpoint::open(dir.path()).expect_err("missing shard");
    assert!(matches!(&err, Error::MissingShard { tensor, .. } if tensor == "c"), "{err:?}");
    assert_names(
        &err.to_string(),
        &[
            &shown(&dir.path().join("model.safetensors.index.json")),
            &shown(&dir.path().join("model-00002-of-00002.safetensors")),
            "`c`",
        ],
    );
}

#[test]
fn shard_without_indexed_tensor() {
    let dir = dir_with(&[
        ("config.json", PLAIN_CONFIG.as_bytes()),
        ("model.safetensors.index.json", INDEX.as_bytes()),
        ("model-00001-of-00002.safetensors", &shard(&[("a", 1.0)])),
        ("model-00002-of-00002.safetensors", &shard(&[("c", 3.0)])),
    ]);
    let err = Checkpoint::open(dir.path()).expect_err("b missing");
    assert!(matches!(&err, Error::ShardMissingTensor { tensor, .. } if tensor == "b"), "{err:?}");
    assert_names(&err.to_string(), &["`b`", &shown(&dir.path().join("model-00001-of-00002.safetensors"))]);
}

#[test]
fn bad_shard_header_names_the_shard() {
    let dir = dir_with(&[
        ("config.json", PLAIN_CONFIG.as_bytes()),
        ("model.safetensors.index.json", INDEX.as_bytes()),
        ("model-00001-of-00002.safetensors", &shard(&[("a", 1.0), ("b", 2.0)])),
        ("model-00002-of-00002.safetensors", b"\x02\0\0\0\0\0\0\0{"),
    ]);
    let err = Checkpoint::open(dir.path()).expect_err("bad shard");
    assert!(matches!(err, Error::HeaderPastEnd { .. }), "{err:?}");
    assert_names(&err.to_string(), &[&shown(&dir.path().join("model-00002-of-00002.safetensors"))]);
}

#[test]
fn malformed_index() {
    let cases: [(&[u8], &str); 5] = [
        (b"{", "invalid JSON"),
        (br#"{"metadata": {}}"#, "no `weight_map` object"),
        (br#"{"weight_map": {"a": 3}}"#, "`a` is not a file name"),
        (br#"{"weight_map": {"a": "../outside.safetensors"}}"#, "not a file inside the checkpoint folder"),
        (br#"{"weight_map": {"a": "/etc/passwd"}}"#, "not a file inside the checkpoint folder"),
    ];
    for (index, reason) in cases {
        let dir = dir_with(&[("config.json", PLAIN_CONFIG.as_bytes()), ("model.safetensors.index.json", index)]);
        let err = Checkpoint::open(dir.path()).expect_err("bad index");
        assert!(matches!(err, Error::Index { .. } | Error::Json { .. }), "{err:?}");
        assert_names(&err.to_string(), &[&shown(&dir.path().join("model.safetensors.index.json")), reason]);
    }
}

#[test]
fn folder_problems() {
    let dir = dir_with(&[("config.json", PLAIN_CONFIG.as_bytes())]);
    let err = Checkpoint::open(dir.path()).expect_err("no weights");
    assert!(matches!(err, Error::NoWeights { .. }), "{err:?}");
    assert_names(&err.to_string(), &[&shown(dir.path()), "model.safetensors"]);

    let dir = dir_with(&[("model.safetensors", &shard(&[("a", 1.0)]))]);
    let err = Checkpoint::open(dir.path()).expect_err("no config");
    assert!(matches!(err, Error::Io { .. }), "{err:?}");
    assert_names(&err.to_string(), &[&shown(&dir.path().join("config.json"))]);

    let dir = checkpoint("{\"a\": ", &shard(&[("a", 1.0)]));
    let err = Checkpoint::open(dir.path()).expect_err("bad config");
    assert!(matches!(err, Error::Json { .. }), "{err:?}");
    assert_names(&err.to_string(), &[&shown(&dir.path().join("config.json")), "invalid JSON"]);

    let dir = checkpoint("[1]", &shard(&[("a", 1.0)]));
    let err = Checkpoint::open(dir.path()).expect_err("config not an object");
    assert!(matches!(err, Error::Config { .. }), "{err:?}");
}

#[test]
fn writer_rejects_bad_tensors() {
    let mut w = Writer::new();
    let err = w.add_f32("x", &[3], &[1.0, 2.0]).expect_err("size");
    assert!(matches!(err, Error::SizeMismatch { expected: 12, got: 8, .. }), "{err:?}");
    w.add_f32("x", &[2], &[1.0, 2.0]).expect("ok");
    let err = w.add_f32("x", &[1], &[1.0]).expect_err("duplicate");
    assert!(matches!(err, Error::DuplicateTensor { .. }), "{err:?}");
    // Header padded to 8 bytes, data contiguous.
    let bytes = w.to_bytes();
    let n = u64::from_le_bytes(bytes[..8].try_into().expect("8 bytes")) as usize;
    assert_eq!(n % 8, 0);
    assert_eq!(bytes.len(), 8 + n + 8);
}

/// A prefix and renamed parts: names are looked up as stored, whole dotted parts only, and
/// a missing tensor is named as it would be stored.
#[test]
fn prefix_and_renames_look_names_up_as_stored() {
    let mut w = Writer::new();
    for name in [
        "lm.model.layers.0.feed_forward.w1.weight",
        "lm.model.embedding_norm.weight",
        "lm.model.layers.0.xmlp.gate_proj.weight",
    ] {
        w.add_f32(name, &[1], &[1.0]).expect("add");
    }
    let dir = checkpoint(PLAIN_CONFIG, &w.to_bytes());
    let mut ckpt = Checkpoint::open(dir.path()).expect("open");
    ckpt.set_prefix("lm.");
    ckpt.set_renames(&[("mlp.gate_proj", "feed_forward.w1"), ("model.norm", "model.embedding_norm")]);
    assert!(ckpt.contains("model.layers.0.mlp.gate_proj.weight"));
    assert!(ckpt.contains("model.norm.weight"));
    // `xmlp.gate_proj` does not hold the part `mlp.gate_proj`: it is looked up as it is.
    assert!(ckpt.contains("model.layers.0.xmlp.gate_proj.weight"));
    let err = ckpt.tensor("model.layers.1.mlp.gate_proj.weight").expect_err("missing");
    assert!(
        matches!(&err, Error::MissingTensor { tensor, .. } if tensor == "lm.model.layers.1.feed_forward.w1.weight"),
        "{err:?}"
    );
    assert_eq!(
        ckpt.tensor_names(),
        [
            "model.embedding_norm.weight",
            "model.layers.0.feed_forward.w1.weight",
            "model.layers.0.xmlp.gate_proj.weight"
        ]
    );
}
