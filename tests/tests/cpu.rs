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

#[test]
fn kv_cache_scatter_writes_rows_at_data_positions() {
    let layout = KvLayout::PositionsFirst;
    let shape = [2usize, 3, 5, 4, 6]; // layers, slots, positions, kv heads, head dim
    let (h, d) = (shape[layout.head_dim()], shape[4]);
    let n: usize = shape.iter().product();
    let vmfb = compile_cpu(&kv_scatter(shape.map(|x| x as i64), layout, 2).unwrap());
    let cache = values(8, n);
    let (device, session) = session("local-task", &vmfb);
    // The positions are call data: one compiled graph, two different pairs of rows.
    for (round, idx) in [[[1, 2, 4], [0, 0, 0]], [[0, 1, 3], [1, 1, 3]]].into_iter().enumerate() {
        let updates = values(9 + round as u64, idx.len() * h * d);
        let flat: Vec<i32> = idx.iter().flatten().copied().collect();
        let out = session
            .call(
                "kv_write",
                &[
                    // A fresh upload each call: IREE may write into an argument's buffer.
                    &device.upload(&shape, &cache).unwrap(),
                    &device.upload(&[idx.len(), 3], &flat).unwrap(),
                    &device.upload(&[idx.len(), h, d], &updates).unwrap(),
                ],
            )
            .unwrap();
        assert_eq!(out[0].shape(), shape.to_vec());
        let got: Vec<f32> = out[0].to_vec().unwrap();
        let expected = ref_kv_scatter(&cache, shape, layout, &idx, &updates);
        let written = expected.iter().zip(&cache).filter(|(e, c)| e != c).count();
        assert_eq!(written, idx.len() * h * d, "round {round}: the reference writes every update");
        for (i, (g, e)) in got.iter().zip(&expected).enumerate() {
            assert_eq!(g.to_bits(), e.to_bits(), "round {round}: element {i} (flat index into {shape:?})");
        }
    }
}

/// IREE 3.13 lowers a scatter only when the scattered operand dims lead: with the
/// positions after the heads (`[l, s, h, p, d]`, scattered dims 0, 1, 3) its StableHLO to
/// LinalgExt conversion builds an invalid `iree_linalg_ext.scatter`. When the pinned
/// compiler handles it this test fails: then both layouts can be offered.
#[test]
fn kv_scatter_with_positions_after_heads_is_a_known_gap_of_iree_3_13() {
    let mlir = kv_scatter([2, 3, 4, 5, 6], KvLayout::HeadsFirst, 2).unwrap();
    let err = compiler()
        .compile(&mlir, &iree_compiler::Target::llvm_cpu_host(), &iree_compiler::CompileOptions::default())
        .expect_err("the heads-first KV scatter compiled: update this test and KvLayout's docs");
    assert!(err.to_string().contains("expected indices to be equal to batch rank or batch rank + 1"), "{err}");
}
