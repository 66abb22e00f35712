//! End-to-end tests on the CPU drivers: modules compiled at test time with
//! `iree-compile`, calls with typed buffer views, sub-byte round trips,
//! parameters from safetensors files and host memory, and error messages.

mod common;

use common::{ADD_F32_MLIR, MATVEC_PARAM_MLIR, compile, f32_bytes, matvec_reference, write_safetensors};
use half::{bf16, f16};
use iree_hal::{ElementType, Error, Instance, Module, Parameters, Session, StatusCode};

fn session_with(uri: &str, mlir: &str) -> (Instance, Session) {
    let instance = Instance::new().expect("instance");
    let device = instance.device(uri).expect("device");
    let mut session = Session::new(&instance, &device).expect("session");
    session.load_vmfb(&compile(mlir)).expect("load vmfb");
    (instance, session)
}

fn add_vectors_on(uri: &str) {
    let (_instance, session) = session_with(uri, ADD_F32_MLIR);
    let device = session.device();
    let a = [1.5f32, -2.0, 3.25, 1.0e6];
    let b = [0.5f32, 2.0, -0.25, 1.0];
    let va = device.upload(&[4], &a).expect("upload a");
    let vb = device.upload(&[4], &b).expect("upload b");
    let out = session.call("module.add", &[&va, &vb]).expect("call add");
    assert_eq!(out.len(), 1);
    assert_eq!(out[0].shape(), vec![4]);
    assert_eq!(out[0].element_type(), ElementType::F32);
    let got: Vec<f32> = out[0].to_vec().expect("download");
    let want: Vec<f32> = a.iter().zip(&b).map(|(x, y)| x + y).collect();
    // Exact: every sum is representable in f32.
    assert_eq!(got, want);
}

#[test]
fn add_f32_on_local_task() {
    add_vectors_on("local-task");
}

#[test]
fn add_f32_on_local_sync() {
    add_vectors_on("local-sync");
}

#[test]
fn drivers_include_cpu() {
    let instance = Instance::new().expect("instance");
    let names = instance.driver_names();
    assert!(names.contains(&"local-sync".to_owned()), "{names:?}");
    assert!(names.contains(&"local-task".to_owned()), "{names:?}");
}

#[test]
fn bare_function_name_resolves_and_functions_are_listed() {
    let (_instance, session) = session_with("local-sync", ADD_F32_MLIR);
    assert_eq!(session.exported_functions(), vec!["module.add".to_owned()]);
    let function = session.function("add").expect("bare name");
    assert_eq!(function.name(), "module.add");
    let device = session.device();
    let a = device.upload(&[4], &[1.0f32, 2.0, 3.0, 4.0]).expect("upload");
    let out = function.call(&[&a, &a]).expect("call");
    assert_eq!(out[0].to_vec::<f32>().expect("download"), vec![2.0, 4.0, 6.0, 8.0]);
}

#[test]
fn i32_round_trip_through_a_call() {
    let mlir = r#"
func.func @double(%a: tensor<2x3xi32>) -> tensor<2x3xi32> {
  %0 = stablehlo.add %a, %a : tensor<2x3xi32>
  return %0 : tensor<2x3xi32>
}
"#;
    let (_instance, session) = session_with("local-sync", mlir);
    let input = [-7i32, 0, 1, 123_456, -1_000_000_000, 1_000_000_000];
    let view = session.device().upload(&[2, 3], &input).expect("upload");
    assert_eq!(view.to_vec::<i32>().expect("plain round trip"), input.to_vec());
    let out = session.call("double", &[&view]).expect("call");
    assert_eq!(out[0].shape(), vec![2, 3]);
    assert_eq!(out[0].element_type(), ElementType::I32);
    let want: Vec<i32> = input.iter().map(|v| v.wrapping_mul(2)).collect();
    assert_eq!(out[0].to_vec::<i32>().expect("download"), want);
}

#[test]
fn f16_round_trip_through_a_call() {
    let mlir = r#"
func.func @double(%a: tensor<5xf16>) -> tensor<5xf16> {
  %0 = stablehlo.add %a, %a : tensor<5xf16>
  return %0 : tensor<5xf16>
}
"#;
    let (_instance, session) = session_with("local-task", mlir);
    let input: Vec<f16> = [0.5f32, -1.25, 3.0, 1000.0, -0.0].into_iter().map(f16::from_f32).collect();
    let view = session.device().upload(&[5], &input).expect("upload");
    let out = session.call("module.double", &[&view]).expect("call");
    assert_eq!(out[0].element_type(), ElementType::F16);
    let got: Vec<f16> = out[0].to_vec().expect("download");
    // Doubling is exact in f16 for these values.
    let want: Vec<f16> = input.iter().map(|v| f16::from_f32(v.to_f32() * 2.0)).collect();
    assert_eq!(
        got.iter().map(|v| v.to_bits()).collect::<Vec<_>>(),
        want.iter().map(|v| v.to_bits()).collect::<Vec<_>>()
    );
    // The same result read as raw bits, and f16 uploaded from raw u16 bits.
    let bits: Vec<u16> = out[0].to_vec_as().expect("raw bits");
    assert_eq!(bits, want.iter().map(|v| v.to_bits()).collect::<Vec<_>>());
    let raw = session
        .device()
        .upload_as(ElementType::F16, &[5], &input.iter().map(|v| v.to_bits()).collect::<Vec<u16>>())
        .expect("upload raw bits");
    assert_eq!(raw.element_type(), ElementType::F16);
    assert_eq!(raw.to_vec::<f16>().expect("download"), input);
}

#[test]
fn byte_sized_types_round_trip() {
    let instance = Instance::new().expect("instance");
    let device = instance.device("local-sync").expect("device");
    let bf: Vec<bf16> = [1.0f32, -3.5, 1.0e30].into_iter().map(bf16::from_f32).collect();
    assert_eq!(device.upload(&[3], &bf).expect("bf16").to_vec::<bf16>().expect("bf16 back"), bf);
    let i8s = [-128i8, -1, 0, 7, 127];
    let view = device.upload(&[5], &i8s).expect("i8");
    assert_eq!(view.element_type(), ElementType::I8);
    assert_eq!(view.to_vec::<i8>().expect("i8 back"), i8s.to_vec());
    let u8s = [0u8, 1, 128, 255];
    let view = device.upload(&[2, 2], &u8s).expect("u8");
    assert_eq!(view.element_type(), ElementType::U8);
    assert_eq!(view.to_vec::<u8>().expect("u8 back"), u8s.to_vec());
    assert_eq!(view.byte_length(), 4);
}

#[test]
fn sub_byte_round_trip_is_byte_exact() {
    let instance = Instance::new().expect("instance");
    let device = instance.device("local-task").expect("device");
    // 9 nibbles -> 5 bytes; every nibble value appears, the last byte's high
    // nibble is padding.
    let packed = [0x10u8, 0x32, 0xF8, 0x7A, 0x0C];
    for element_type in [ElementType::I4, ElementType::U4] {
        let view = device.upload_bytes(element_type, &[3, 3], &packed).expect("upload packed");
        assert_eq!(view.element_type(), element_type);
        assert_eq!(view.shape(), vec![3, 3]);
        assert_eq!(view.element_count(), 9);
        assert_eq!(view.byte_length(), 5);
        assert_eq!(view.to_bytes().expect("download packed"), packed.to_vec());
    }
    let err = device.upload_bytes(ElementType::I4, &[3, 3], &packed[..4]).expect_err("short input");
    assert_eq!(err.to_string(), "upload of i4 tensor with shape [3, 3] needs 5 bytes, got 4");
}

#[test]
fn i4_nibble_order_low_first() {
    // Element 0 lives in the low nibble: checked through a real kernel.
    let mlir = r#"
func.func @widen(%a: tensor<4xi4>) -> tensor<4xi32> {
  %0 = stablehlo.convert %a : (tensor<4xi4>) -> tensor<4xi32>
  return %0 : tensor<4xi32>
}
"#;
    let (_instance, session) = session_with("local-sync", mlir);
    // Elements [1, -2, 7, -8] -> nibbles [0x1, 0xE, 0x7, 0x8] -> bytes [0xE1, 0x87].
    let view = session.device().upload_bytes(ElementType::I4, &[4], &[0xE1, 0x87]).expect("upload");
    let out = session.call("widen", &[&view]).expect("call");
    assert_eq!(out[0].to_vec::<i32>().expect("download"), vec![1, -2, 7, -8]);
}

const W: [f32; 16] = [
    1.0, 2.0, 3.0, 4.0, //
    -1.0, 0.5, 0.25, 8.0, //
    0.0, 0.0, 1.0, 0.0, //
    3.5, -2.5, 1.5, -0.5,
];

fn check_matvec(session: &Session) {
    let x = [0.5f32, -1.0, 2.0, 4.0];
    let view = session.device().upload(&[4], &x).expect("upload x");
    let out = session.call("module.matvec", &[&view]).expect("call matvec");
    let got: Vec<f32> = out[0].to_vec().expect("download");
    let want = matvec_reference(&W, &x);
    for (g, w) in got.iter().zip(&want) {
        assert!((g - w).abs() <= 1e-5 * w.abs().max(1.0), "got {got:?}, want {want:?}");
    }
    assert_eq!(got.len(), 4);
}

#[test]
fn parameters_from_safetensors_file() {
    let dir = tempfile::tempdir().expect("temp dir");
    let path = dir.path().join("weights.safetensors");
    let other = f32_bytes(&[9.0, 9.0]);
    let w = f32_bytes(&W);
    write_safetensors(&path, &[("bias", "F32", &[2], &other), ("w", "F32", &[4, 4], &w)]);

    let instance = Instance::new().expect("instance");
    let device = instance.device("local-task").expect("device");
    let mut params = Parameters::new("model").expect("parameters");
    params.add_file(&path).expect("index safetensors");
    assert_eq!(params.len(), 2);
    assert!(params.contains("w"));
    assert_eq!(params.entries(), vec![("bias".to_owned(), 8), ("w".to_owned(), 64)]);

    let mut session = Session::new(&instance, &device).expect("session");
    session.append_parameters(&[&params]).expect("append parameters");
    session.load_vmfb(&compile(MATVEC_PARAM_MLIR)).expect("load vmfb");
    // The file may go away once indexed: IREE holds it open.
    drop(params);
    check_matvec(&session);
}

#[test]
fn parameters_from_host_memory() {
    let instance = Instance::new().expect("instance");
    let device = instance.device("local-sync").expect("device");
    let mut params = Parameters::new("model").expect("parameters");
    params.add_tensor("w", &f32_bytes(&W)).expect("add tensor");
    let err = params.add_tensor("w", &[0; 4]).expect_err("duplicate");
    assert_eq!(err.to_string(), "parameter `w` already exists in scope `model`");

    let mut session = Session::new(&instance, &device).expect("session");
    session.append_parameters(&[&params]).expect("append parameters");
    let module = Module::from_bytes(&instance, &compile(MATVEC_PARAM_MLIR)).expect("module");
    session.append_module(&module).expect("append module");
    check_matvec(&session);
    // A second call reads the same (already loaded) global.
    check_matvec(&session);
}

#[test]
fn module_from_file_and_load_vmfb_file() {
    let dir = tempfile::tempdir().expect("temp dir");
    let path = dir.path().join("add.vmfb");
    std::fs::write(&path, compile(ADD_F32_MLIR)).expect("write vmfb");
    let instance = Instance::new().expect("instance");
    let module = Module::from_file(&instance, &path).expect("module from file");
    assert_eq!(module.name(), "module");
    assert_eq!(module.exported_functions(), vec!["module.add".to_owned()]);
    let device = instance.device("local-sync").expect("device");
    let mut session = Session::new(&instance, &device).expect("session");
    session.load_vmfb_file(&path).expect("load file");
    let a = device.upload(&[4], &[1.0f32; 4]).expect("upload");
    assert_eq!(session.call("add", &[&a, &a]).expect("call")[0].to_vec::<f32>().expect("dl"), vec![2.0; 4]);

    let missing = dir.path().join("missing.vmfb");
    let err = Module::from_file(&instance, &missing).expect_err("missing file");
    assert!(matches!(err, Error::Io { .. }));
    assert!(err.to_string().starts_with(&format!("cannot read `{}`", missing.display())), "{err}");
}

#[test]
fn unknown_device_uri_names_uri_and_drivers() {
    let instance = Instance::new().expect("instance");
    let err = instance.device("no-such-driver").expect_err("unknown driver");
    let message = err.to_string();
    assert!(message.starts_with("cannot create IREE device `no-such-driver`: "), "{message}");
    assert!(message.contains("available drivers: "), "{message}");
    assert!(message.contains("local-sync") && message.contains("local-task"), "{message}");
    match err {
        Error::Device { uri, available, code, .. } => {
            assert_eq!(uri, "no-such-driver");
            assert!(available.contains(&"local-task".to_owned()));
            assert_eq!(code, StatusCode::NotFound);
        }
        other => panic!("wrong error kind: {other:?}"),
    }
}

#[test]
fn corrupt_vmfb_is_an_error() {
    let instance = Instance::new().expect("instance");
    let garbage: Vec<u8> = (0..4096u32).map(|i| (i.wrapping_mul(2_654_435_761) >> 13) as u8).collect();
    let err = Module::from_bytes(&instance, &garbage).expect_err("garbage");
    assert!(err.to_string().starts_with("loading vmfb module from memory: "), "{err}");
    assert!(err.code().is_some(), "{err:?}");

    let valid = compile(ADD_F32_MLIR);
    let err = Module::from_bytes(&instance, &valid[..valid.len() / 2]).expect_err("truncated");
    assert!(err.to_string().starts_with("loading vmfb module from memory: "), "{err}");

    let err = Module::from_bytes(&instance, &[]).expect_err("empty");
    assert_eq!(err.to_string(), "cannot load a vmfb module from 0 bytes");
}

#[test]
fn missing_function_lists_exports() {
    let (_instance, session) = session_with("local-sync", ADD_F32_MLIR);
    let err = session.call("module.sub", &[]).expect_err("missing function");
    assert_eq!(err.to_string(), "function `module.sub` not found in the session (exported functions: module.add)");
    let err = session.function("sub").expect_err("missing bare name");
    assert!(matches!(err, Error::FunctionNotFound { ref name, .. } if name == "sub"), "{err:?}");
}

#[test]
fn wrong_inputs_are_errors() {
    let (_instance, session) = session_with("local-sync", ADD_F32_MLIR);
    let device = session.device();
    let err = device.upload(&[2, 3], &[1.0f32; 5]).expect_err("length mismatch");
    assert_eq!(err.to_string(), "upload of f32 tensor with shape [2, 3] needs 6 elements, got 5");
    let ints = device.upload(&[4], &[1i32; 4]).expect("upload");
    let err = ints.to_vec::<f32>().expect_err("type mismatch");
    assert_eq!(err.to_string(), "buffer view holds i32 (shape [4]), cannot read it as f32");
    // A call with the wrong element type fails inside IREE with a status, no panic.
    let err = session.call("module.add", &[&ints, &ints]).expect_err("bad call");
    assert!(err.to_string().starts_with("calling `module.add`: "), "{err}");
    // Too few arguments.
    let err = session.call("module.add", &[&ints]).expect_err("arity");
    assert!(err.to_string().starts_with("calling `module.add`: "), "{err}");
}

#[test]
fn parameter_module_needs_parameters_first() {
    let instance = Instance::new().expect("instance");
    let device = instance.device("local-sync").expect("device");
    let mut session = Session::new(&instance, &device).expect("session");
    let err = session.load_vmfb(&compile(MATVEC_PARAM_MLIR)).expect_err("no io_parameters module");
    let message = err.to_string();
    assert!(message.contains("call append_parameters before appending it"), "{message}");
}

#[test]
fn missing_parameter_is_an_error() {
    let instance = Instance::new().expect("instance");
    let device = instance.device("local-sync").expect("device");
    let mut params = Parameters::new("model").expect("parameters");
    params.add_tensor("not_w", &f32_bytes(&W)).expect("add");
    let mut session = Session::new(&instance, &device).expect("session");
    session.append_parameters(&[&params]).expect("append parameters");
    let result = session.load_vmfb(&compile(MATVEC_PARAM_MLIR)).and_then(|_| {
        let x = session.device().upload(&[4], &[1.0f32; 4])?;
        session.call("matvec", &[&x])
    });
    let err = result.expect_err("parameter w is missing");
    let message = err.to_string();
    assert!(message.contains("no parameter found in index with key 'w'"), "{message}");
    assert_eq!(err.code(), Some(StatusCode::NotFound), "{message}");
}

#[test]
fn u4_values_of_eight_and_above_widen_unsigned() {
    // Nibbles >= 8 are where a signed/unsigned mix-up shows (docs/ARCHITECTURE.md, "Toolchain
    // facts": unsigned 4-bit reads as signed).
    let mlir = r#"
func.func @widen(%a: tensor<4xui4>) -> tensor<4xi32> {
  %0 = stablehlo.convert %a : (tensor<4xui4>) -> tensor<4xi32>
  return %0 : tensor<4xi32>
}
"#;
    let (_instance, session) = session_with("local-sync", mlir);
    // Elements [15, 8, 0, 7] -> bytes [0x8F, 0x70].
    let view = session.device().upload_bytes(ElementType::U4, &[4], &[0x8F, 0x70]).expect("upload");
    let out = session.call("widen", &[&view]).expect("call");
    assert_eq!(out[0].to_vec::<i32>().expect("download"), vec![15, 8, 0, 7]);
}
