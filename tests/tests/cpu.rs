//! End to end on CPU: hlo-emit graphs compiled for llvm-cpu and run through iree-hal,
//! each compared with a plain-Rust reference.

#![allow(clippy::unwrap_used)] // a test that cannot unwrap has failed; helpers included

use e2e::*;
use iree_hal::{Instance, Parameters, Session};
use safetensors::tensor::{Dtype, TensorView};

/// f32 results of a few dozen operations agree with the f64 reference to this much.
const TOL: f32 = 1e-5;

fn session(device_uri: &str, vmfb: &[u8]) -> (iree_hal::Device, Session) {
    let instance = Instance::new().unwrap();
    let device = instance.device(device_uri).unwrap();
    let mut session = Session::new(&instance, &device).unwrap();
    session.load_vmfb(vmfb).unwrap();
    (device, session)
}

#[test]
fn rms_norm_matmul_softmax_block() {
    let (d, o) = (64usize, 32usize);
    let vmfb = compile_cpu(&rms_matmul_softmax(d as i64, o as i64).unwrap());
    let (x, gamma, w) = (values(1, d), values(2, d), values(3, o * d));
    let expected = ref_rms_matmul_softmax(&x, &gamma, &w);
    for uri in ["local-task", "local-sync"] {
        let (device, session) = session(uri, &vmfb);
        let out = session
            .call(
                "block",
                &[
                    &device.upload(&[d], &x).unwrap(),
                    &device.upload(&[d], &gamma).unwrap(),
                    &device.upload(&[o, d], &w).unwrap(),
                ],
            )
            .unwrap();
        let probs: Vec<f32> = out[0].to_vec().unwrap();
        let diff = max_abs_diff(&probs, &expected);
        assert!(diff <= TOL, "{uri}: softmax differs from the reference by {diff}");
        assert!((probs.iter().sum::<f32>() - 1.0).abs() < 1e-5);
        let arg: Vec<i32> = out[1].to_vec().unwrap();
        assert_eq!(arg, vec![ref_argmax(&expected)], "{uri}: argmax");
    }
}

#[test]
fn embedding_gather_picks_rows() {
    let (v, d) = (100usize, 16usize);
    let ids: Vec<i32> = vec![0, 99, 42, 42, 7];
    let vmfb = compile_cpu(&embedding(v as i64, d as i64, ids.len() as i64).unwrap());
    let table = values(4, v * d);
    let (device, session) = session("local-task", &vmfb);
    let out = session
        .call("embed", &[&device.upload(&[v, d], &table).unwrap(), &device.upload(&[ids.len()], &ids).unwrap()])
        .unwrap();
    assert_eq!(out[0].shape(), vec![ids.len(), d]);
    let rows: Vec<f32> = out[0].to_vec().unwrap();
    let expected: Vec<f32> = ids.iter().flat_map(|&i| table[i as usize * d..(i as usize + 1) * d].to_vec()).collect();
    assert_eq!(rows, expected, "a gather copies rows bit for bit");
}

#[test]
fn argmax_ties_go_to_lowest_index() {
    #[rustfmt::skip]
    let rows: Vec<f32> = vec![
        0.0, 3.0, 1.0, 3.0, 2.0, 3.0, 0.0, 0.0, 0.0, 0.0, // tie at 1, 3, 5
        -1.0, -1.0, -1.0, -1.0, -1.0, -1.0, -1.0, -1.0, -1.0, -1.0, // all equal
        0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 9.5, // last
    ];
    let vmfb = compile_cpu(&argmax(3, 10).unwrap());
    let (device, session) = session("local-task", &vmfb);
    let out = session.call("argmax", &[&device.upload(&[3, 10], &rows).unwrap()]).unwrap();
    let got: Vec<i32> = out[0].to_vec().unwrap();
    let expected: Vec<i32> = rows.chunks(10).map(ref_argmax).collect();
    assert_eq!(expected, vec![1, 0, 9]);
    assert_eq!(got, expected);
}

#[test]
fn parameter_bound_globals_from_safetensors() {
    let (o, i) = (8usize, 16usize);
    let (w, b, x) = (values(5, o * i), values(6, o), values(7, i));
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("weights.safetensors");
    let bytes = |v: &[f32]| v.iter().flat_map(|f| f.to_le_bytes()).collect::<Vec<u8>>();
    let (wb, bb) = (bytes(&w), bytes(&b));
    safetensors::tensor::serialize_to_file(
        [
            ("proj.weight", TensorView::new(Dtype::F32, vec![o, i], &wb).unwrap()),
            ("proj.bias", TensorView::new(Dtype::F32, vec![o], &bb).unwrap()),
        ],
        None,
        &path,
    )
    .unwrap();

    let vmfb = compile_cpu(&param_affine(o as i64, i as i64).unwrap());
    let instance = Instance::new().unwrap();
    let device = instance.device("local-task").unwrap();
    let mut session = Session::new(&instance, &device).unwrap();
    let mut params = Parameters::new("model").unwrap();
    params.add_file(&path).unwrap();
    session.append_parameters(&[&params]).unwrap();
    session.load_vmfb(&vmfb).unwrap();
    let xin = device.upload(&[i], &x).unwrap();
    let expected: Vec<f32> =
        w.chunks(i).zip(&b).map(|(row, bias)| row.iter().zip(&x).map(|(a, c)| a * c).sum::<f32>() + bias).collect();
    // Two calls: the globals stay bound, nothing is re-uploaded.
    for _ in 0..2 {
        let y: Vec<f32> = session.call("affine", &[&xin]).unwrap()[0].to_vec().unwrap();
        let diff = max_abs_diff(&y, &expected);
        assert!(diff <= TOL, "W·x + b differs from the reference by {diff}");
    }
}
