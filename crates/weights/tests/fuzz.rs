//! Property tests: mutated safetensors files and configs never make the loader panic; it
//! returns Ok or Err, and whatever it accepts can be read through every accessor safely.

mod common;

use common::{checkpoint, raw_with_len};
use proptest::prelude::*;
use weights::write::Writer;
use weights::{Checkpoint, Dtype, SafetensorsFile};

const CONFIG: &str = r#"{"quantization": {"group_size": 32, "bits": 4, "d": {"bits": 8}}}"#;

/// A valid quantized checkpoint file exercising every reader: a 4-bit layer `q` with bias,
/// an 8-bit layer `d` (override), a dense bf16 layer, and assorted dtypes.
fn base_file() -> (String, Vec<u8>) {
    let mut w = Writer::new();
    w.metadata("format", "mlx");
    w.add_u32("q.weight", &[2, 8], &[0xFFFF_FFFF, 0x7654_3210, 0xFEDC_BA98, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13])
        .expect("w");
    w.add_f16("q.scales", &[2, 2], &[0.5, 0.25, 1.0, -0.5]).expect("s");
    w.add_bf16("q.biases", &[2, 2], &[-1.0, 2.0, 0.0, 8.0]).expect("b");
    w.add_f32("q.bias", &[2], &[0.5, -0.5]).expect("bias");
    w.add_u32("d.weight", &[1, 8], &[0xFF80_0100; 8]).expect("w");
    w.add_f32("d.scales", &[1, 1], &[0.5]).expect("s");
    w.add_f32("d.biases", &[1, 1], &[-64.0]).expect("b");
    w.add_bf16("g.weight", &[2, 3], &[1.0, 2.0, 3.0, 4.0, 5.0, 6.0]).expect("g");
    w.add("ids", Dtype::I64, &[2], [3i64, -4].iter().flat_map(|v| v.to_le_bytes()).collect()).expect("ids");
    w.add("mask", Dtype::Bool, &[3], vec![1, 0, 1]).expect("mask");
    w.add("s", Dtype::F16, &[], 0x3C00u16.to_le_bytes().to_vec()).expect("scalar");
    w.header_and_data()
}

fn assemble(header: &str, data: &[u8]) -> Vec<u8> {
    raw_with_len(header.len() as u64, header.as_bytes(), data)
}

/// Opens `bytes` both ways and, if accepted, reads everything that can be read. Panics only
/// if an invariant of an accepted file is broken.
fn exercise(bytes: &[u8], config: &str) {
    let (_dir, path) = common::file_with("model.safetensors", bytes);
    if let Ok(f) = SafetensorsFile::open(&path) {
        for t in f.tensors() {
            // Accepted views lie inside the file and match dtype * shape.
            assert!(t.file_offset() as usize + t.bytes().len() <= bytes.len());
            let numel: usize = t.shape().iter().product();
            assert_eq!(numel * t.dtype().size_bytes(), t.bytes().len());
            assert_eq!(t.numel(), numel);
            let _ = t.to_f32_vec();
            let _ = t.as_f16_bits();
            let _ = t.as_bf16_bits();
            let _ = t.as_u32_words();
            let _ = t.to_i64_vec();
            let _ = t.expect(Dtype::F32, &[2, 2]);
        }
    }
    let dir = checkpoint(config, bytes);
    if let Ok(ckpt) = Checkpoint::open(dir.path()) {
        for prefix in ["q", "d", "g", "ids", "mask", "s", "nope"] {
            if let Ok(l) = ckpt.linear(prefix) {
                let w = l.weight_f32();
                assert_eq!(w.len(), l.out_features() * l.in_features());
                let _ = l.rows_f32(&[0, l.out_features().saturating_sub(1)]);
                let _ = l.rows_f32(&[usize::MAX]);
                let _ = l.bias().map(|b| b.to_f32_vec());
            }
        }
    }
}

/// JSON-significant replacements for header and config edits.
const TOKENS: &[&str] = &[
    "{",
    "}",
    "[",
    "]",
    "\"",
    ":",
    ",",
    "0",
    "1",
    "9",
    "-1",
    "1.5",
    "1e400",
    " ",
    "null",
    "true",
    "false",
    "18446744073709551615",
    "18446744073709551616",
    "4294967296",
    "\"F16\"",
    "\"U32\"",
    "\"F64\"",
    "\"dtype\"",
    "\"shape\"",
    "\"data_offsets\"",
    "\"__metadata__\"",
    "\"q.scales\"",
    "\\u0000",
    "\u{e9}",
];

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    #[test]
    fn header_byte_flips(flips in prop::collection::vec((any::<prop::sample::Index>(), 1u8..=255), 1..8)) {
        let (header, data) = base_file();
        let mut bytes = assemble(&header, &data);
        let header_end = 8 + header.len();
        for (at, x) in flips {
            bytes[at.index(header_end)] ^= x;
        }
        exercise(&bytes, CONFIG);
    }

    #[test]
    fn data_byte_flips(flips in prop::collection::vec((any::<prop::sample::Index>(), 1u8..=255), 1..16)) {
        let (header, data) = base_file();
        let mut bytes = assemble(&header, &data);
        let n = bytes.len();
        for (at, x) in flips {
            bytes[at.index(n)] ^= x;
        }
        exercise(&bytes, CONFIG);
    }

    #[test]
    fn truncation(at in any::<prop::sample::Index>()) {
        let (header, data) = base_file();
        let bytes = assemble(&header, &data);
        let cut = at.index(bytes.len());
        exercise(&bytes[..cut], CONFIG);
    }

    #[test]
    fn header_length_values(len in prop_oneof![any::<u64>(), 0u64..2048, Just(u64::MAX), Just(1 << 63)]) {
        let (header, data) = base_file();
        exercise(&raw_with_len(len, header.as_bytes(), &data), CONFIG);
    }

    #[test]
    fn header_json_edits(
        edits in prop::collection::vec(
            (any::<prop::sample::Index>(), 0usize..4, any::<prop::sample::Index>()), 1..6),
    ) {
        let (header, data) = base_file();
        let mut h: Vec<char> = header.chars().collect();
        for (at, kind, tok) in edits {
            let i = at.index(h.len().max(1)).min(h.len());
            let token: Vec<char> = tok.get(TOKENS).chars().collect();
            match kind {
                0 => { h.splice(i..(i + 1).min(h.len()), token); }      // replace a char
                1 => { h.splice(i..i, token); }                          // insert
                2 => { h.drain(i..(i + 5).min(h.len())); }               // delete a run
                _ => {                                                   // rewrite a number
                    if let Some(start) = h[i..].iter().position(char::is_ascii_digit).map(|p| p + i) {
                        let end = h[start..].iter().position(|c| !c.is_ascii_digit()).map_or(h.len(), |p| p + start);
                        h.splice(start..end, token);
                    }
                }
            }
        }
        let header: String = h.into_iter().collect();
        exercise(&assemble(&header, &data), CONFIG);
    }

    #[test]
    fn offsets_and_shapes(
        dims in prop::collection::vec(0usize..40, 0..4),
        begin in 0u64..400,
        len in 0u64..400,
        dtype in prop::sample::select(vec!["F32", "F16", "BF16", "U32", "I64", "BOOL"]),
    ) {
        // A second tensor with arbitrary shape and offsets next to a valid one.
        let header = format!(
            r#"{{"q.weight":{{"dtype":"U32","shape":[1,4],"data_offsets":[0,16]}},"x":{{"dtype":"{dtype}","shape":{dims:?},"data_offsets":[{begin},{}]}}}}"#,
            begin + len
        );
        exercise(&assemble(&header, &[0xA5; 200]), CONFIG);
    }

    #[test]
    fn config_edits(
        bits in prop_oneof![any::<i64>().prop_map(|v| v.to_string()), Just("4".to_owned()), Just("\"8\"".to_owned()), Just("null".to_owned())],
        group in prop_oneof![any::<i64>().prop_map(|v| v.to_string()), Just("32".to_owned()), Just("1.5".to_owned())],
        over in prop::sample::select(vec!["false", "true", "{}", "{\"bits\": 2}", "{\"group_size\": 0}", "[]", "\"x\"", "{\"mode\": \"mxfp4\"}"]),
    ) {
        let (header, data) = base_file();
        let config = format!(r#"{{"quantization": {{"group_size": {group}, "bits": {bits}, "q": {over}, "d": {over}}}}}"#);
        exercise(&assemble(&header, &data), &config);
    }
}

#[test]
fn base_file_is_valid_and_reads_back() {
    // The mutations above start from a file the loader must accept.
    let (header, data) = base_file();
    let bytes = assemble(&header, &data);
    let dir = checkpoint(CONFIG, &bytes);
    let ckpt = Checkpoint::open(dir.path()).expect("valid base file");
    let q = ckpt.linear("q").expect("q");
    assert!(q.is_quantized());
    assert_eq!(q.weight_f32()[..2], [6.5, 6.5]);
    let d = ckpt.linear("d").expect("d");
    assert_eq!(d.weight_f32()[..4], [-64.0, -63.5, 0.0, 63.5]);
    assert!(!ckpt.linear("g").expect("g").is_quantized());
}
