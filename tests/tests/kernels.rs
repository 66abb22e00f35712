//! The hand-written CPU kernels (`kernels::cpu`) run by IREE on local-task, once per
//! instruction set this host runs: `qmv` equals a plain-Rust model of its arithmetic bit for
//! bit (so every object equals every other) at row counts that take every path of the
//! kernels (one row, partial chunks and panels, several panels), and is close to the f64
//! product with the dequantized matrix; `qrows` gives the dequantized rows, bit for bit. The
//! cases and the model (kernel_cases) are those the aarch64 object is held to under qemu
//! (kernels_aarch64.rs).

#![allow(clippy::unwrap_used)] // a test that cannot unwrap has failed; helpers included

use e2e::compile_cpu;
use half::f16;
use iree_hal::{Instance, Session};
use kernels::cpu::{self, Isa, Op, Scale};

mod kernel_cases;
use kernel_cases::{IDS, K, Matrix, O, ROWS, check_qmv, check_rows, entries, function_name, group_size, input, module};

/// The matrix in the kernel layout on the device: weight, scales, biases.
fn upload(m: &Matrix, device: &iree_hal::Device, scale: Scale) -> [iree_hal::BufferView; 3] {
    let blocks = O / 16;
    let w = m.kernel_weight();
    let w = device.upload_bytes(iree_hal::ElementType::I8, &[blocks, w.len() / blocks], &w).unwrap();
    let per_group = |v: &[f32]| {
        let v = m.kernel_groups(v);
        let shape = [blocks, m.groups() * 16];
        match scale {
            Scale::F16 => device.upload(&shape, &v.iter().map(|x| f16::from_f32(*x)).collect::<Vec<_>>()),
            Scale::F32 => device.upload(&shape, &v),
        }
        .unwrap()
    };
    [w, per_group(&m.scales), per_group(&m.biases)]
}

/// Every entry point's results per instruction set, checked against the model.
fn run(isa: Isa) -> Vec<Vec<f32>> {
    let dir = tempfile::tempdir().unwrap();
    let object = cpu::install(dir.path(), isa).unwrap().unwrap();
    let vmfb = compile_cpu(&module(&cpu::executable_source(&object, &entries())));
    let instance = Instance::new().unwrap();
    let device = instance.device("local-task").unwrap();
    let mut session = Session::new(&instance, &device).unwrap();
    session.load_vmfb(&vmfb).unwrap();
    let mut outputs = Vec::new();
    for (i, e) in entries().into_iter().enumerate() {
        let m = Matrix::random(e.bits, e.scale, O, K, group_size(e.bits, e.scale), 10 * i as u64);
        let [w, s, b] = upload(&m, &device, e.scale);
        let what = format!("{isa} {}", cpu::export(e.op, e.bits, e.scale));
        if e.op == Op::Rows {
            let ids = device.upload(&[IDS.len()], &IDS).unwrap();
            let got: Vec<f32> =
                session.call(&function_name(&e, IDS.len()), &[&ids, &w, &s, &b]).unwrap()[0].to_vec().unwrap();
            check_rows(&what, &m, &IDS, &got);
            outputs.push(got);
            continue;
        }
        for t in ROWS {
            let x = input(t, K, 100 + t as u64);
            let xs = device.upload(&[t, K], &x).unwrap();
            let got: Vec<f32> = session.call(&function_name(&e, t), &[&xs, &w, &s, &b]).unwrap()[0].to_vec().unwrap();
            check_qmv(&what, &m, &x, t, &got);
            outputs.push(got);
        }
    }
    outputs
}

#[test]
fn every_kernel_object_computes_the_same_bits() {
    let runs: Vec<(Isa, Vec<Vec<f32>>)> = cpu::host_isas().map(|isa| (isa, run(isa))).collect();
    // Bit equality with the model already implies it; said once more for the reader.
    for pair in runs.windows(2) {
        let bits = |v: &Vec<Vec<f32>>| v.iter().flatten().map(|x| x.to_bits()).collect::<Vec<_>>();
        assert_eq!(bits(&pair[0].1), bits(&pair[1].1), "{} and {} differ", pair[0].0, pair[1].0);
    }
}
