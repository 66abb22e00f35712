//! Bad input end to end: each case returns a clear error and never panics.

#![allow(clippy::unwrap_used)] // a test that cannot unwrap has failed; helpers included

use e2e::*;
use hlo_emit::{Context, ElementType::*, Module};
use iree_compiler::{CompileOptions, Target};
use iree_hal::{Instance, Session};

#[test]
fn shape_mismatched_op_is_an_hlo_emit_error() {
    let ctx = Context::new();
    let m = Module::new(&ctx);
    let err = m.func("bad", &[F32.tensor(&[4]), F32.tensor(&[5])], |f, a| Ok(vec![f.add(a[0], a[1])?])).unwrap_err();
    assert_eq!(
        err.to_string(),
        "stablehlo.add: expected operands of the same type, got tensor<4xf32> and tensor<5xf32>"
    );
}

#[test]
fn unknown_device_uri() {
    let instance = Instance::new().unwrap();
    let err = instance.device("tpu://0").unwrap_err().to_string();
    assert!(err.contains("tpu"), "{err}");
    assert!(err.contains("local-task"), "should list the available drivers: {err}");
}

#[test]
fn corrupt_vmfb() {
    let instance = Instance::new().unwrap();
    let device = instance.device("local-task").unwrap();
    let mut session = Session::new(&instance, &device).unwrap();
    let mut vmfb = compile_cpu(&argmax(2, 4).unwrap());
    let n = vmfb.len();
    vmfb[n / 3..2 * n / 3].fill(0xA5);
    assert!(session.load_vmfb(&vmfb).is_err(), "a vmfb with its middle overwritten must not load");
    let err = session.load_vmfb(b"definitely not a vmfb").unwrap_err().to_string();
    assert!(!err.is_empty());
}

#[test]
fn missing_function_name() {
    let instance = Instance::new().unwrap();
    let device = instance.device("local-task").unwrap();
    let mut session = Session::new(&instance, &device).unwrap();
    session.load_vmfb(&compile_cpu(&argmax(2, 4).unwrap())).unwrap();
    let x = device.upload(&[2, 4], &[0f32; 8]).unwrap();
    let err = session.call("argmin", &[&x]).unwrap_err().to_string();
    assert!(err.contains("argmin"), "{err}");
    assert!(err.contains("argmax"), "should list the exported functions: {err}");
}

#[test]
fn compiler_error_carries_the_diagnostic() {
    let bad = "func.func @f(%a: tensor<4xf32>) -> tensor<4xf32> {\n  return %b : tensor<4xf32>\n}\n";
    let err = compiler().compile(bad, &Target::llvm_cpu_host(), &CompileOptions::default()).unwrap_err().to_string();
    assert!(err.contains("undeclared SSA value"), "{err}");
}
