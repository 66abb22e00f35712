//! Parameter encoder modules (`encode_parameters`) and mapped parameter archives
//! (`Parameters::add_file_mapped`) on a tiny data-tiled module: the archive the encoder
//! writes serves the split main module alone, with the results of the unsplit module.

mod common;

use common::{DATA_TILING, compile, compile_split, compile_with, f32_bytes};
use iree_hal::{Error, Instance, Parameters, Session};

/// `w · xᵀ + b` with a 64x64 weight: big enough for data tiling to repack `w`.
const MLIR: &str = r#"
util.global private @w = #stream.parameter.named<"model"::"w"> : tensor<64x64xf32>
util.global private @b = #stream.parameter.named<"model"::"b"> : tensor<64xf32>
func.func @mm(%x: tensor<4x64xf32>) -> tensor<64x4xf32> {
  %w = util.global.load @w : tensor<64x64xf32>
  %b = util.global.load @b : tensor<64xf32>
  %0 = stablehlo.dot_general %w, %x, contracting_dims = [1] x [1] : (tensor<64x64xf32>, tensor<4x64xf32>) -> tensor<64x4xf32>
  %bb = stablehlo.broadcast_in_dim %b, dims = [0] : (tensor<64xf32>) -> tensor<64x4xf32>
  %1 = stablehlo.add %0, %bb : tensor<64x4xf32>
  return %1 : tensor<64x4xf32>
}
"#;

fn weights() -> (Vec<f32>, Vec<f32>) {
    let w = (0..64 * 64).map(|i| ((i * 7) % 13) as f32 - 6.0).collect();
    let b = (0..64).map(|i| i as f32 * 0.5).collect();
    (w, b)
}

fn model_params() -> Parameters {
    let (w, b) = weights();
    let mut params = Parameters::new("model").expect("parameters");
    params.add_tensor("w", &f32_bytes(&w)).expect("w");
    params.add_tensor("b", &f32_bytes(&b)).expect("b");
    params
}

/// Calls `mm` of `vmfb` with `params` bound.
fn run(instance: &Instance, vmfb: &[u8], params: &Parameters) -> Vec<f32> {
    let device = instance.device("local-task").expect("device");
    let mut session = Session::new(instance, &device).expect("session");
    session.append_parameters(&[params]).expect("append parameters");
    session.load_vmfb(vmfb).expect("load vmfb");
    let x: Vec<f32> = (0..4 * 64).map(|i| ((i % 5) as f32 - 2.0) * 0.25).collect();
    let x = device.upload(&[4, 64], &x).expect("upload");
    session.call("mm", &[&x]).expect("call")[0].to_vec().expect("download")
}

#[test]
fn encoded_archive_serves_the_split_module() {
    let instance = Instance::new().expect("instance");
    let device = instance.device("local-task").expect("device");
    let (main, encoder) = compile_split(MLIR);
    let want = run(&instance, &compile_with(MLIR, &DATA_TILING), &model_params());

    let dir = tempfile::tempdir().expect("temp dir");
    let irpa = dir.path().join("encoded.irpa");
    let report = iree_hal::encode_parameters(&instance, &device, &encoder, &[&model_params()], &irpa).expect("encode");
    assert_eq!(report.scope, "encoded");
    assert!(!report.entries.is_empty());
    // Everything the module reads is in the archive: the repacked weight and the bias.
    let payload: u64 = report.entries.iter().map(|(_, n)| n).sum();
    assert!(payload >= 64 * 64 * 4 + 64 * 4, "{report:?}");
    assert_eq!(std::fs::metadata(&irpa).expect("archive").len(), report.file_bytes);

    // Mapped (imported in place) and read (copied) bindings of the archive; the split main
    // module needs nothing else, and computes what the unsplit module does, bit for bit.
    let mut mapped = Parameters::new(&report.scope).expect("parameters");
    mapped.add_file_mapped(&irpa).expect("map archive");
    assert_eq!(mapped.entries(), report.entries);
    assert_eq!(run(&instance, &main, &mapped), want);
    let mut read = Parameters::new(&report.scope).expect("parameters");
    read.add_file(&irpa).expect("index archive");
    assert_eq!(run(&instance, &main, &read), want);

    // The mapping outlives the index that made it: tensors keep it alive.
    let device2 = instance.device("local-sync").expect("device");
    let mut session = Session::new(&instance, &device2).expect("session");
    session.append_parameters(&[&mapped]).expect("append");
    drop(mapped);
    session.load_vmfb(&main).expect("load");
    let (w, b) = weights();
    let x = vec![1.0f32; 4 * 64];
    let got: Vec<f32> =
        session.call("mm", &[&device2.upload(&[4, 64], &x).expect("x")]).expect("call")[0].to_vec().expect("y");
    for (row, wrow) in w.chunks(64).enumerate() {
        let sum: f32 = wrow.iter().sum::<f32>() + b[row];
        assert_eq!(got[row * 4..row * 4 + 4], [sum; 4], "row {row}");
    }
}

#[test]
fn encoder_errors_name_the_cause() {
    let instance = Instance::new().expect("instance");
    let device = instance.device("local-sync").expect("device");
    let dir = tempfile::tempdir().expect("temp dir");
    let out = dir.path().join("out.irpa");
    // A module that is no encoder.
    let err = iree_hal::encode_parameters(&instance, &device, &compile(MLIR), &[&model_params()], &out)
        .expect_err("not an encoder");
    assert!(matches!(err, Error::Encoder(_)), "{err}");
    assert!(err.to_string().contains("has no encoder functions"), "{err}");
    // An input scope named like the output scope.
    let (_, encoder) = compile_split(MLIR);
    let clash = Parameters::new("encoded").expect("parameters");
    let err = iree_hal::encode_parameters(&instance, &device, &encoder, &[&clash], &out).expect_err("clash");
    assert!(err.to_string().contains("input scope `encoded` is also the encoder's output scope"), "{err}");
    // Missing inputs fail the encode, not the process.
    let empty = Parameters::new("model").expect("parameters");
    let err = iree_hal::encode_parameters(&instance, &device, &encoder, &[&empty], &out).expect_err("no inputs");
    assert!(err.to_string().contains("encode"), "{err}");
    // Mapping a missing or foreign file.
    let mut params = Parameters::new("encoded").expect("parameters");
    let missing = dir.path().join("missing.irpa");
    let err = params.add_file_mapped(&missing).expect_err("missing");
    assert!(err.to_string().contains("missing.irpa"), "{err}");
    let junk = dir.path().join("junk.irpa");
    std::fs::write(&junk, [7u8; 100]).expect("write");
    let err = params.add_file_mapped(&junk).expect_err("junk");
    assert!(err.to_string().contains("junk.irpa"), "{err}");
    assert!(params.is_empty());
}
