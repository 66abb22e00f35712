//! Every malformed-file case the safetensors loader must reject, with the error naming the
//! file, the tensor and what was wrong; plus the well-formed edge cases it must accept.

mod common;

use common::{assert_names, f32_bytes, file_with, raw, raw_with_len, shown};
use weights::{Dtype, Error, MAX_HEADER_LEN, SafetensorsFile};

/// Opens `bytes` as `bad.safetensors`; returns the error and the file's displayed path.
fn open_err(bytes: &[u8]) -> (Error, String) {
    let (_dir, path) = file_with("bad.safetensors", bytes);
    let err = SafetensorsFile::open(&path).expect_err("file should be rejected");
    (err, shown(&path))
}

#[test]
fn valid_file_with_metadata_padding_scalar_and_empty_tensor() {
    let header = r#"{"__metadata__":{"format":"mlx"},"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"s":{"dtype":"F16","shape":[],"data_offsets":[8,10]},"e":{"dtype":"BF16","shape":[0,3],"data_offsets":[10,10]}}    "#;
    let mut data = f32_bytes(&[1.5, -2.0]);
    data.extend_from_slice(&0x3C00u16.to_le_bytes());
    let (_dir, path) = file_with("ok.safetensors", &raw(header, &data));
    let f = SafetensorsFile::open(&path).expect("valid file");
    assert_eq!(f.len(), 3);
    assert_eq!(f.metadata().get("format").map(String::as_str), Some("mlx"));
    assert_eq!(f.names().collect::<Vec<_>>(), ["a", "s", "e"]);
    let a = f.tensor("a").expect("a");
    assert_eq!(a.to_f32_vec().expect("f32"), [1.5, -2.0]);
    assert_eq!(a.file_offset(), 8 + header.len() as u64);
    let s = f.tensor("s").expect("s");
    assert_eq!(s.shape(), &[] as &[usize]);
    assert_eq!(s.numel(), 1);
    assert_eq!(s.to_f32_vec().expect("f16"), [1.0]);
    let e = f.tensor("e").expect("e");
    assert_eq!((e.dtype(), e.numel(), e.bytes().len()), (Dtype::BF16, 0, 0));
}

#[test]
fn too_short() {
    let (err, path) = open_err(&[1, 2, 3, 4, 5]);
    assert!(matches!(err, Error::TooShort { len: 5, .. }), "{err:?}");
    assert_names(&err.to_string(), &[&path, "5 bytes", "truncated"]);
    let (err, _) = open_err(&[]);
    assert!(matches!(err, Error::TooShort { len: 0, .. }), "{err:?}");
}

#[test]
fn header_length_past_end_of_file() {
    let (err, path) = open_err(&raw_with_len(1000, b"{}", &[]));
    assert!(matches!(err, Error::HeaderPastEnd { header_len: 1000, file_len: 10, .. }), "{err:?}");
    assert_names(&err.to_string(), &[&path, "header length 1000", "10 bytes"]);
}

#[test]
fn header_length_absurd() {
    for len in [MAX_HEADER_LEN + 1, u64::MAX, 1 << 40] {
        let (err, path) = open_err(&raw_with_len(len, b"{}", &[]));
        assert!(matches!(err, Error::HeaderTooLarge { header_len, .. } if header_len == len), "{err:?}");
        assert_names(&err.to_string(), &[&path, &len.to_string(), "exceeds the limit"]);
    }
}

#[test]
fn invalid_json() {
    for header in [&br#"{"a": "#[..], b"[1, 2]", b"\xff\xfe{}", b"nul", b""] {
        let (err, path) = open_err(&raw_with_len(header.len() as u64, header, &[]));
        assert!(matches!(err, Error::HeaderJson { .. }), "{err:?}");
        assert_names(&err.to_string(), &[&path, "not a valid JSON object"]);
    }
}

#[test]
fn unknown_dtype() {
    for dtype in ["F64", "Q4_0", "f32", "F8_E4M3"] {
        let header = format!(r#"{{"w":{{"dtype":"{dtype}","shape":[1],"data_offsets":[0,8]}}}}"#);
        let (err, path) = open_err(&raw(&header, &[0; 8]));
        assert!(
            matches!(&err, Error::UnsupportedDtype { tensor, dtype: d, .. } if tensor == "w" && d == dtype),
            "{err:?}"
        );
        assert_names(&err.to_string(), &[&path, "`w`", dtype]);
    }
}

#[test]
fn size_mismatch() {
    let header = r#"{"w":{"dtype":"F32","shape":[2,2],"data_offsets":[0,12]}}"#;
    let (err, path) = open_err(&raw(header, &[0; 12]));
    assert!(matches!(&err, Error::SizeMismatch { tensor, expected: 16, got: 12, .. } if tensor == "w"), "{err:?}");
    assert_names(&err.to_string(), &[&path, "`w`", "F32 [2, 2]", "16 bytes", "span 12"]);
}

#[test]
fn shape_overflow_is_a_size_mismatch() {
    let header = r#"{"w":{"dtype":"F32","shape":[4294967296,4294967296,16],"data_offsets":[0,4]}}"#;
    let (err, _) = open_err(&raw(header, &[0; 4]));
    assert!(matches!(&err, Error::SizeMismatch { tensor, .. } if tensor == "w"), "{err:?}");
}

#[test]
fn offsets_out_of_range() {
    let header = r#"{"w":{"dtype":"F32","shape":[4],"data_offsets":[0,16]}}"#;
    let (err, path) = open_err(&raw(header, &[0; 8]));
    assert!(
        matches!(&err, Error::OutOfRange { tensor, begin: 0, end: 16, data_len: 8, .. } if tensor == "w"),
        "{err:?}"
    );
    assert_names(&err.to_string(), &[&path, "`w`", "[0, 16)", "8 bytes"]);
}

#[test]
fn truncated_data_region() {
    let header = r#"{"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"b":{"dtype":"F32","shape":[2],"data_offsets":[8,16]}}"#;
    let full = raw(header, &f32_bytes(&[1.0, 2.0, 3.0, 4.0]));
    let (err, path) = open_err(&full[..full.len() - 3]);
    assert!(matches!(&err, Error::OutOfRange { tensor, data_len: 13, .. } if tensor == "b"), "{err:?}");
    assert_names(&err.to_string(), &[&path, "`b`", "truncated"]);
}

#[test]
fn overlapping_tensors() {
    let header = r#"{"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"b":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}}"#;
    let (err, path) = open_err(&raw(header, &[0; 12]));
    assert!(
        matches!(&err, Error::Overlap { tensor, other, begin: 4, other_end: 8, .. } if tensor == "b" && other == "a"),
        "{err:?}"
    );
    assert_names(&err.to_string(), &[&path, "`b`", "`a`", "overlaps"]);
    // An identical range twice is an overlap too.
    let header = r#"{"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"b":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}}"#;
    let (err, _) = open_err(&raw(header, &[0; 8]));
    assert!(matches!(err, Error::Overlap { .. }), "{err:?}");
}

#[test]
fn gap_between_tensors() {
    let header = r#"{"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},"b":{"dtype":"F32","shape":[1],"data_offsets":[8,12]}}"#;
    let (err, path) = open_err(&raw(header, &[0; 12]));
    assert!(matches!(&err, Error::Gap { tensor, gap_begin: 4, gap_end: 8, .. } if tensor == "b"), "{err:?}");
    assert_names(&err.to_string(), &[&path, "`b`", "[4, 8)"]);
}

#[test]
fn unordered_offsets_are_fine_when_contiguous() {
    // Header order need not match data order; only coverage matters.
    let header = r#"{"b":{"dtype":"F32","shape":[1],"data_offsets":[4,8]},"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}}"#;
    let (_dir, path) = file_with("ok.safetensors", &raw(header, &f32_bytes(&[1.0, 2.0])));
    let f = SafetensorsFile::open(&path).expect("contiguous file");
    assert_eq!(f.tensor("b").and_then(|t| t.to_f32_vec()).expect("b"), [2.0]);
}

#[test]
fn trailing_bytes() {
    let header = r#"{"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}}"#;
    let (err, path) = open_err(&raw(header, &[0; 6]));
    assert!(matches!(err, Error::TrailingData { covered: 4, data_len: 6, .. }), "{err:?}");
    assert_names(&err.to_string(), &[&path, "first 4", "6 bytes"]);
}

#[test]
fn duplicate_names() {
    let header = r#"{"w":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},"w":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}}"#;
    let (err, path) = open_err(&raw(header, &[0; 8]));
    assert!(matches!(&err, Error::DuplicateTensor { tensor, .. } if tensor == "w"), "{err:?}");
    assert_names(&err.to_string(), &[&path, "`w`", "more than once"]);
}

#[test]
fn malformed_entries() {
    let cases = [
        (r#"{"w":{"shape":[1],"data_offsets":[0,4]}}"#, "no `dtype`"),
        (r#"{"w":{"dtype":7,"shape":[1],"data_offsets":[0,4]}}"#, "`dtype` is not a string"),
        (r#"{"w":{"dtype":"F32","data_offsets":[0,4]}}"#, "no `shape`"),
        (r#"{"w":{"dtype":"F32","shape":[-1],"data_offsets":[0,4]}}"#, "shape dimension `-1`"),
        (r#"{"w":{"dtype":"F32","shape":[1.5],"data_offsets":[0,4]}}"#, "shape dimension `1.5`"),
        (r#"{"w":{"dtype":"F32","shape":"1","data_offsets":[0,4]}}"#, "`shape` is not an array"),
        (r#"{"w":{"dtype":"F32","shape":[1]}}"#, "no `data_offsets`"),
        (r#"{"w":{"dtype":"F32","shape":[1],"data_offsets":[0,4,8]}}"#, "has 3 values"),
        (r#"{"w":{"dtype":"F32","shape":[1],"data_offsets":[4,0]}}"#, "begin 4 is after end 0"),
        (r#"{"w":{"dtype":"F32","shape":[1],"data_offsets":[0,-4]}}"#, "not non-negative integers"),
        (r#"{"w":[1,2]}"#, "expected an object"),
        (
            r#"{"w":{"dtype":"F32","shape":[1,1,1,1,1,1,1,1,1],"data_offsets":[0,4]}}"#,
            "9 dimensions; this reader takes at most 8",
        ),
    ];
    for (header, reason) in cases {
        let (err, path) = open_err(&raw(header, &[0; 4]));
        assert!(matches!(&err, Error::BadEntry { tensor, .. } if tensor == "w"), "{header}: {err:?}");
        assert_names(&err.to_string(), &[&path, "`w`", reason]);
    }
}

#[test]
fn bad_metadata() {
    let header = r#"{"__metadata__":{"format":1}}"#;
    let (err, path) = open_err(&raw(header, &[]));
    assert!(matches!(&err, Error::BadEntry { tensor, .. } if tensor == "__metadata__"), "{err:?}");
    assert_names(&err.to_string(), &[&path, "`format`", "not a string"]);
}

#[test]
fn directory_and_missing_file_are_io_errors() {
    let dir = tempfile::tempdir().expect("tempdir");
    let missing = dir.path().join("nope.safetensors");
    let err = SafetensorsFile::open(&missing).expect_err("missing");
    assert!(matches!(err, Error::Io { .. }), "{err:?}");
    assert_names(&err.to_string(), &[&shown(&missing)]);
    let err = SafetensorsFile::open(dir.path()).expect_err("directory");
    assert!(matches!(err, Error::Io { .. }), "{err:?}");
}

#[test]
fn missing_tensor_in_file() {
    let (_dir, path) = file_with("ok.safetensors", &raw("{}", &[]));
    let f = SafetensorsFile::open(&path).expect("empty file");
    assert!(f.is_empty());
    let err = f.tensor("nope").expect_err("missing");
    assert_names(&err.to_string(), &["`nope`", &shown(&path)]);
}
