//! The hand-written CPU kernels (`kernels::cpu`) run by IREE on local-task, once per
//! instruction set this host runs: `qmv` equals a plain-Rust model of its arithmetic bit for
//! bit (so every object equals every other) at row counts that take every path of the
//! kernels (one row, partial chunks and panels, several panels), and is close to the f64
//! product with the dequantized matrix; `qrows` gives the dequantized rows, bit for bit; so do
//! attention, the f16 product and the gated delta rule's step (its state updated where it
//! lies), each against its own model. The cases and the models (kernel_cases) are those the
//! aarch64 object is held to under qemu (kernels_aarch64.rs) and the AMX object, off AMX
//! hosts, with its tiles emulated (kernels_amx.rs).

#![allow(clippy::unwrap_used)] // a test that cannot unwrap has failed; helpers included

use e2e::compile_cpu;
use half::f16;
use hlo_emit::{Context, ElementType, Module};
use iree_hal::{Instance, Session};
use kernels::cpu::{self, Isa, Op, Scale};

mod kernel_cases;
use kernel_cases::{
    ATTN_CASES, DELTA_CASES, DENSE_ROWS, DenseMatrix, EXPERTS, IDS, K, Matrix, O, PAIRS, ROWS, attention_f64,
    check_delta, check_dense, check_dense_rows, check_qmv, check_rows, dense_function_name, dense_module, entries,
    expert_of, experts_function_name, function_name, group_size, input, module,
};

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
            Scale::F32 | Scale::E8m0 => device.upload(&shape, &v),
        }
        .unwrap()
    };
    let scales = if scale == Scale::E8m0 {
        let bytes = cpu::repack_groups(&m.e8m0, m.out, m.groups());
        device.upload_bytes(iree_hal::ElementType::I8, &[blocks, m.groups() * 16], &bytes).unwrap()
    } else {
        per_group(&m.scales)
    };
    // E8M0 entries take no biases (FP4); uploaded as f32 all the same.
    [w, scales, per_group(&m.biases)]
}

/// Every entry point's results per instruction set, checked against the model.
fn run(isa: Isa) -> Vec<Vec<f32>> {
    let dir = tempfile::tempdir().unwrap();
    let object = cpu::install(dir.path(), isa).unwrap().unwrap();
    let vmfb = compile_cpu(&module(&cpu::executable_source(&object, &entries(), &[], &[], false)));
    let instance = Instance::new().unwrap();
    let device = instance.device("local-task").unwrap();
    let mut session = Session::new(&instance, &device).unwrap();
    session.load_vmfb(&vmfb).unwrap();
    let mut outputs = Vec::new();
    for (i, e) in entries().into_iter().enumerate() {
        let what = format!("{isa} {}", e.export());
        if e.op == Op::Experts {
            outputs.extend(run_experts(&mut session, &device, &e, &what, 10 * i as u64));
            continue;
        }
        let m = Matrix::of(&e, O, K, group_size(&e), 10 * i as u64);
        let [w, s, b] = upload(&m, &device, e.scale);
        // An FP4 entry reads no biases.
        let matrix: Vec<&iree_hal::BufferView> = if e.fp4 { vec![&w, &s] } else { vec![&w, &s, &b] };
        if e.op == Op::Rows {
            let ids = device.upload(&[IDS.len()], &IDS).unwrap();
            let args: Vec<&iree_hal::BufferView> = std::iter::once(&ids).chain(matrix.iter().copied()).collect();
            let got: Vec<f32> = session.call(&function_name(&e, IDS.len()), &args).unwrap()[0].to_vec().unwrap();
            check_rows(&what, &m, &IDS, &got);
            outputs.push(got);
            continue;
        }
        for t in ROWS {
            let x = input(t, K, 100 + t as u64);
            let xs = device.upload(&[t, K], &x).unwrap();
            let residual = (e.op == Op::MatvecAdd).then(|| input(t, O, 200 + t as u64));
            let r = residual.as_ref().map(|r| device.upload(&[t, O], r).unwrap());
            let mut args = vec![&xs];
            args.extend(matrix.iter().copied());
            args.extend(r.as_ref());
            let got: Vec<f32> = session.call(&function_name(&e, t), &args).unwrap()[0].to_vec().unwrap();
            check_qmv(&what, &m, &x, t, residual.as_deref(), &got);
            outputs.push(got);
        }
    }
    outputs
}

/// `qmve` over stacked random experts, with pairs numbered by pair and by expert: each
/// pair's row is the one-row `qmv` of its (clamped) expert, bit for bit.
fn run_experts(
    session: &mut Session,
    device: &iree_hal::Device,
    e: &cpu::Entry,
    what: &str,
    seed: u64,
) -> Vec<Vec<f32>> {
    let gs = group_size(e);
    let experts: Vec<Matrix> = (0..EXPERTS).map(|x| Matrix::of(e, O, K, gs, seed + x as u64)).collect();
    let uploads: Vec<[iree_hal::BufferView; 3]> = experts.iter().map(|m| upload(m, device, e.scale)).collect();
    // Stack the experts' device bytes: [E, blocks, ...] each.
    let stacked = |i: usize, elem: iree_hal::ElementType| {
        let parts: Vec<Vec<u8>> = uploads.iter().map(|u| u[i].to_bytes().unwrap()).collect();
        let dims = uploads[0][i].shape();
        device.upload_bytes(elem, &[EXPERTS, dims[0], dims[1]], &parts.concat()).unwrap()
    };
    let (w, s, b) = (
        stacked(0, uploads[0][0].element_type()),
        stacked(1, uploads[0][1].element_type()),
        stacked(2, uploads[0][2].element_type()),
    );
    let x = input(PAIRS.len(), K, seed + 100);
    let xs = device.upload(&[PAIRS.len(), K], &x).unwrap();
    let ids = device.upload(&[PAIRS.len()], &PAIRS).unwrap();
    let mut outputs = Vec::new();
    for by_expert in [0, 1] {
        let args: Vec<&iree_hal::BufferView> =
            if e.fp4 { vec![&xs, &ids, &w, &s] } else { vec![&xs, &ids, &w, &s, &b] };
        let got: Vec<f32> = session.call(&experts_function_name(e, by_expert), &args).unwrap()[0].to_vec().unwrap();
        for (n, id) in PAIRS.iter().enumerate() {
            let what = format!("{what} by_expert {by_expert} pair {n} (id {id})");
            check_qmv(&what, &experts[expert_of(*id)], &x[n * K..][..K], 1, None, &got[n * O..][..O]);
        }
        outputs.push(got);
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

/// Each case as two functions dispatching its attention export once: a row's kv heads a
/// workgroup, and whole rows a workgroup (the tiled entry of prompt chunks).
fn attention_module(source: &str) -> String {
    let ctx = Context::new();
    let m = Module::new(&ctx);
    for ((name, entry), case) in ATTN_CASES.iter().enumerate().flat_map(|(i, c)| c.entries(i).map(|e| (e, c))) {
        let n = case.positions.len() as i64;
        let (kv, hd, heads) = (case.kv as i64, case.hd as i64, case.heads as i64);
        let cache_elem = match case.cache {
            cpu::CacheElem::F32 => ElementType::F32,
            cpu::CacheElem::F16 => ElementType::F16,
            cpu::CacheElem::Q8 => ElementType::I8,
        };
        let cache = cache_elem.tensor(&case.cache_shape().map(|d| d as i64));
        let f32 = ElementType::F32;
        let args = [
            f32.tensor(&[n, heads * hd]),
            f32.tensor(&[n, kv * hd]),
            f32.tensor(&[n, kv * hd]),
            cache.clone(),
            cache,
            ElementType::I32.tensor(&[n]),
            ElementType::I32.tensor(&[n]),
        ];
        m.func(&name, &args, |f, a| {
            let mut constants = case.constants().map(|c| c as i32).to_vec();
            constants.extend([case.scale().to_bits() as i32, n as i32]);
            let result = f32.tensor(&[n, heads * hd]);
            Ok(vec![f.dispatch(cpu::EXECUTABLE, &entry.export(), n * kv, &constants, a, result)?])
        })
        .unwrap();
    }
    m.append_source(cpu::EXECUTABLE, source).unwrap();
    m.to_text()
}

/// The attention kernel of every object this host runs equals the Rust model
/// (`kernels::cpu::attention_model`) bit for bit, so every object equals every other, and
/// is within 2e-6 of attention in f64 over the values the cache holds (an 8-bit cache's
/// decoded).
#[test]
fn every_attention_object_computes_the_same_bits() {
    let attention: Vec<cpu::Attention> = ATTN_CASES
        .iter()
        .flat_map(|c| [c.entry(), c.tiled_entry()])
        .collect::<std::collections::BTreeSet<_>>()
        .into_iter()
        .collect();
    for isa in cpu::host_isas() {
        let dir = tempfile::tempdir().unwrap();
        let object = cpu::install(dir.path(), isa).unwrap().unwrap();
        let vmfb = compile_cpu(&attention_module(&cpu::executable_source(&object, &[], &attention, &[], false)));
        let instance = Instance::new().unwrap();
        let device = instance.device("local-task").unwrap();
        let mut session = Session::new(&instance, &device).unwrap();
        session.load_vmfb(&vmfb).unwrap();
        for (i, case) in ATTN_CASES.iter().enumerate() {
            let inputs = case.inputs(1000 + 10 * i as u64);
            let [q, k_new, v_new, kc, vc] = &inputs;
            let n = case.positions.len();
            let cache_elem = match case.cache {
                cpu::CacheElem::F32 => iree_hal::ElementType::F32,
                cpu::CacheElem::F16 => iree_hal::ElementType::F16,
                cpu::CacheElem::Q8 => iree_hal::ElementType::I8,
            };
            let upload_cache = |v: &[f32]| device.upload_bytes(cache_elem, &case.cache_shape(), &case.cache_bytes(v));
            let args = [
                device.upload(&[n, case.heads * case.hd], q).unwrap(),
                device.upload(&[n, case.kv * case.hd], k_new).unwrap(),
                device.upload(&[n, case.kv * case.hd], v_new).unwrap(),
                upload_cache(kc).unwrap(),
                upload_cache(vc).unwrap(),
                device.upload(&[n], case.positions).unwrap(),
                device.upload(&[n], case.slots).unwrap(),
            ];
            let refs: Vec<&iree_hal::BufferView> = args.iter().collect();
            let model = case.model(&inputs);
            let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
            // The f64 reference takes the caches' values and the new rows as the kernel reads
            // them (rounded through the cache's type).
            let exact = attention_f64(case, &case.model_inputs(&inputs));
            for (name, entry) in case.entries(i) {
                let what = format!("{isa} attention case {i} ({})", entry.export());
                let got: Vec<f32> = session.call(&name, &refs).unwrap()[0].to_vec().unwrap();
                assert_eq!(bits(&got), bits(&model), "{what}: the object differs from the model");
                let err = got.iter().zip(&exact).map(|(a, b)| (f64::from(*a) - b).abs()).fold(0.0, f64::max);
                assert!(err < 2e-6, "{what}: {err:e} from attention in f64");
            }
        }
    }
}

/// The dense product and lookup (`cpu/hmv.h`, f16, bf16 and mxfp8) of every object this host runs
/// equal the Rust model (`kernels::cpu::dense_model`) bit for bit at row counts that take
/// every path (one row; tiles of each size), so every object equals every other; the lookup
/// gives the rows' values exactly.
#[test]
fn every_dense_object_computes_the_same_bits() {
    for isa in cpu::host_isas() {
        let dir = tempfile::tempdir().unwrap();
        let object = cpu::install(dir.path(), isa).unwrap().unwrap();
        let vmfb = compile_cpu(&dense_module(&cpu::executable_source(&object, &[], &[], &cpu::Dense::ALL, false)));
        let instance = Instance::new().unwrap();
        let device = instance.device("local-task").unwrap();
        let mut session = Session::new(&instance, &device).unwrap();
        session.load_vmfb(&vmfb).unwrap();
        for elem in [cpu::DenseElem::F16, cpu::DenseElem::BF16, cpu::DenseElem::Mxfp8] {
            let m = DenseMatrix::random(elem, 77);
            let weights: Vec<_> = m
                .args()
                .into_iter()
                .map(|(e, dims, bytes)| {
                    let e = if e == ElementType::I8 { iree_hal::ElementType::I8 } else { iree_hal::ElementType::I16 };
                    device.upload_bytes(e, &dims, bytes).unwrap()
                })
                .collect();
            let ids = device.upload(&[IDS.len()], &IDS).unwrap();
            let rows = cpu::Dense { op: cpu::DenseOp::Rows, elem };
            let mut args = vec![&ids];
            args.extend(&weights);
            let got: Vec<f32> =
                session.call(&dense_function_name(rows, IDS.len()), &args).unwrap()[0].to_vec().unwrap();
            check_dense_rows(&format!("{isa} {}", rows.export()), &m, &IDS, &got);
            for op in [cpu::DenseOp::Matvec, cpu::DenseOp::MatvecAdd] {
                let entry = cpu::Dense { op, elem };
                for t in DENSE_ROWS {
                    let x = input(t, K, 300 + t as u64);
                    let xs = device.upload(&[t, K], &x).unwrap();
                    let residual = (op == cpu::DenseOp::MatvecAdd).then(|| input(t, O, 400 + t as u64));
                    let r = residual.as_ref().map(|r| device.upload(&[t, O], r).unwrap());
                    let mut args = vec![&xs];
                    args.extend(&weights);
                    args.extend(r.as_ref());
                    let got: Vec<f32> =
                        session.call(&dense_function_name(entry, t), &args).unwrap()[0].to_vec().unwrap();
                    check_dense(&format!("{isa} {}", entry.export()), &m, &x, t, residual.as_deref(), &got);
                }
            }
        }
    }
}

/// Each delta case as a function dispatching the delta export once, its state argument
/// updated in place (tied: the export's binding 8, written), returning the state and y.
fn delta_module(source: &str) -> String {
    let ctx = Context::new();
    let m = Module::new(&ctx);
    let (f32, i32) = (ElementType::F32, ElementType::I32);
    for (i, case) in DELTA_CASES.iter().enumerate() {
        let [n, _, h, dk, dv, s] = case.constants().map(|d| d as i64);
        let r = case.rows() as i64;
        let args = [
            f32.tensor(&[r, h, dk]),
            f32.tensor(&[r, h, dk]),
            f32.tensor(&[r, h, dv]),
            f32.tensor(&[r, h]),
            f32.tensor(&[r, h]),
            i32.tensor(&[r]),
            i32.tensor(&[n]),
            i32.tensor(&[1]),
            f32.tensor(&[s, h * dv * dk]),
        ];
        m.func(&format!("delta_{i}"), &args, |f, a| {
            let constants = case.constants().map(|c| c as i32);
            let y = f32.tensor(&[r, h * dv]);
            f.dispatch_tied(cpu::EXECUTABLE, cpu::DELTA_EXPORT, n * h, &constants, a, &[8], y)
        })
        .unwrap();
    }
    m.append_source(cpu::EXECUTABLE, source).unwrap();
    m.to_text()
}

/// The delta rule's step (`cpu/delta.h`) of every object this host runs, dispatched by IREE
/// with its state updated in place: y and the state equal the Rust model
/// (`kernels::cpu::delta_model`) bit for bit, so every object equals every other, and are
/// within 1e-5 of the step in f64; slots no sequence names keep their bits and padding rows
/// give 0 (kernel_cases' `check_delta`).
#[test]
fn every_delta_object_computes_the_same_bits() {
    for isa in cpu::host_isas() {
        let dir = tempfile::tempdir().unwrap();
        let object = cpu::install(dir.path(), isa).unwrap().unwrap();
        let vmfb = compile_cpu(&delta_module(&cpu::executable_source(&object, &[], &[], &[], true)));
        let instance = Instance::new().unwrap();
        let device = instance.device("local-task").unwrap();
        let mut session = Session::new(&instance, &device).unwrap();
        session.load_vmfb(&vmfb).unwrap();
        for (i, case) in DELTA_CASES.iter().enumerate() {
            let inputs = case.inputs(2000 + 10 * i as u64);
            let [n, _, h, dk, dv, s] = case.constants();
            let r = case.rows();
            let args = [
                device.upload(&[r, h, dk], &inputs.q).unwrap(),
                device.upload(&[r, h, dk], &inputs.k).unwrap(),
                device.upload(&[r, h, dv], &inputs.v).unwrap(),
                device.upload(&[r, h], &inputs.g).unwrap(),
                device.upload(&[r, h], &inputs.beta).unwrap(),
                device.upload(&[r], case.positions).unwrap(),
                device.upload(&[n], case.slots).unwrap(),
                device.upload(&[1], &[case.last]).unwrap(),
                device.upload(&[s, h * dv * dk], &inputs.state).unwrap(),
            ];
            let refs: Vec<&iree_hal::BufferView> = args.iter().collect();
            let out = session.call(&format!("delta_{i}"), &refs).unwrap();
            assert_eq!(out.len(), 2, "{isa} delta case {i}: the state and y");
            let state: Vec<f32> = out[0].to_vec().unwrap();
            let y: Vec<f32> = out[1].to_vec().unwrap();
            check_delta(&format!("{isa} delta case {i}"), case, &inputs, &y, &state);
        }
    }
}
