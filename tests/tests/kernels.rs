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
use hlo_emit::{Context, ElementType, Module};
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
    let vmfb = compile_cpu(&module(&cpu::executable_source(&object, &entries(), &[])));
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

/// One attention case: the model's heads, the cache, the step's rows.
struct AttnCase {
    heads: usize,
    kv: usize,
    hd: usize,
    cache: cpu::CacheElem,
    /// [layers, slots, positions] of the cache.
    cache_dims: [usize; 3],
    layer: usize,
    window: usize,
    sliding: usize,
    positions: &'static [i32],
    slots: &'static [i32],
}

/// Rows at position 0 (only their own key), mid-block, past the window (read up to it), a
/// slot past the cache (clamped to the last), sliding windows, a block boundary; one query
/// head per kv head up to the kernel's most (16); head dims of one to four 16-lane chunks;
/// several kv heads per workgroup (`attention_units` 4 for 8 kv heads).
const ATTN_CASES: [AttnCase; 4] = [
    AttnCase {
        heads: 8,
        kv: 2,
        hd: 32,
        cache: cpu::CacheElem::F32,
        cache_dims: [2, 3, 40],
        layer: 1,
        window: 36,
        sliding: 0,
        positions: &[0, 5, 33, 39],
        slots: &[2, 0, 1, 7],
    },
    AttnCase {
        heads: 6,
        kv: 3,
        hd: 16,
        cache: cpu::CacheElem::F16,
        cache_dims: [3, 2, 48],
        layer: 2,
        window: 48,
        sliding: 6,
        positions: &[3, 16, 47],
        slots: &[1, 0, 1],
    },
    AttnCase {
        heads: 16,
        kv: 8,
        hd: 64,
        cache: cpu::CacheElem::F16,
        cache_dims: [1, 2, 40],
        layer: 0,
        window: 40,
        sliding: 0,
        positions: &[17, 32],
        slots: &[1, 0],
    },
    AttnCase {
        heads: 16,
        kv: 1,
        hd: 16,
        cache: cpu::CacheElem::F32,
        cache_dims: [1, 1, 64],
        layer: 0,
        window: 64,
        sliding: 20,
        positions: &[63, 1],
        slots: &[0, 0],
    },
];

impl AttnCase {
    fn entry(&self) -> cpu::Attention {
        cpu::Attention { cache: self.cache, units: cpu::attention_units(self.heads, self.kv, self.hd) }
    }

    fn cache_len(&self) -> usize {
        self.cache_dims.iter().product::<usize>() * self.kv * self.hd
    }

    fn scale(&self) -> f32 {
        1.0 / (self.hd as f32).sqrt()
    }

    fn constants(&self) -> [usize; 8] {
        let [_, s, p] = self.cache_dims;
        let sliding = self.sliding;
        [self.layer, s, p, self.kv, self.heads / self.kv, self.hd, self.window, sliding]
    }

    /// q, k_new, v_new, k_cache, v_cache (cache values rounded to its type).
    fn inputs(&self, seed: u64) -> [Vec<f32>; 5] {
        let n = self.positions.len();
        let round = |v: Vec<f32>| match self.cache {
            cpu::CacheElem::F16 => v.iter().map(|x| f16::from_f32(*x).to_f32()).collect(),
            cpu::CacheElem::F32 => v,
        };
        // Scores of a few units: the softmax's maxima move from block to block.
        let q = e2e::values(seed, n * self.heads * self.hd).iter().map(|x| 3.0 * x).collect();
        let k_new = round(e2e::values(seed + 1, n * self.kv * self.hd).iter().map(|x| 2.0 * x).collect());
        let v_new = round(e2e::values(seed + 2, n * self.kv * self.hd));
        let k_cache = round(e2e::values(seed + 3, self.cache_len()).iter().map(|x| 2.0 * x).collect());
        let v_cache = round(e2e::values(seed + 4, self.cache_len()));
        [q, k_new, v_new, k_cache, v_cache]
    }
}

/// Each case as a function dispatching its attention export once.
fn attention_module(source: &str) -> String {
    let ctx = Context::new();
    let m = Module::new(&ctx);
    for (i, case) in ATTN_CASES.iter().enumerate() {
        let n = case.positions.len() as i64;
        let [l, s, p] = case.cache_dims.map(|d| d as i64);
        let (kv, hd, heads) = (case.kv as i64, case.hd as i64, case.heads as i64);
        let cache_elem = if case.cache == cpu::CacheElem::F16 { ElementType::F16 } else { ElementType::F32 };
        let cache = cache_elem.tensor(&[l, s, p, kv, hd]);
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
        m.func(&format!("attn_{i}"), &args, |f, a| {
            let mut constants = case.constants().map(|c| c as i32).to_vec();
            constants.extend([case.scale().to_bits() as i32, n as i32]);
            let result = f32.tensor(&[n, heads * hd]);
            Ok(vec![f.dispatch(cpu::EXECUTABLE, &case.entry().export(), n * kv, &constants, a, result)?])
        })
        .unwrap();
    }
    m.append_source(cpu::EXECUTABLE, source).unwrap();
    m.to_text()
}

/// Plain attention in f64 over the same positions: each head's softmax over its visible old
/// keys and its own.
fn attention_f64(case: &AttnCase, [q, k_new, v_new, kc, vc]: &[Vec<f32>; 5]) -> Vec<f64> {
    let [layer, s, p, kv, g, hd, w, sliding] = case.constants();
    let mut out = Vec::new();
    for (r, (&pos, &slot)) in case.positions.iter().zip(case.slots).enumerate() {
        let slot = (slot as usize).min(s - 1);
        let (pos, hi) = (pos as usize, (pos as usize).min(w).min(p));
        let lo = if sliding > 0 { (pos + 1).saturating_sub(sliding) } else { 0 };
        for head in 0..kv * g {
            let kh = head / g;
            let qh = &q[(r * kv * g + head) * hd..][..hd];
            let row = |j: usize| ((layer * s + slot) * p + j) * kv + kh;
            let keys: Vec<(&[f32], &[f32])> = (lo..hi)
                .map(|j| (&kc[row(j) * hd..][..hd], &vc[row(j) * hd..][..hd]))
                .chain([(&k_new[(r * kv + kh) * hd..][..hd], &v_new[(r * kv + kh) * hd..][..hd])])
                .collect();
            let scores: Vec<f64> = keys
                .iter()
                .map(|(k, _)| qh.iter().zip(*k).map(|(a, b)| f64::from(*a) * f64::from(*b)).sum::<f64>())
                .map(|d| d * f64::from(case.scale()))
                .collect();
            let top = scores.iter().copied().fold(f64::NEG_INFINITY, f64::max);
            let e: Vec<f64> = scores.iter().map(|x| (x - top).exp()).collect();
            let total: f64 = e.iter().sum();
            for d in 0..hd {
                out.push(keys.iter().zip(&e).map(|((_, v), e)| e * f64::from(v[d])).sum::<f64>() / total);
            }
        }
    }
    out
}

/// The attention kernel of every object this host runs equals the Rust model
/// (`kernels::cpu::attention_model`) bit for bit, so every object equals every other, and
/// is within 2e-6 of attention in f64.
#[test]
fn every_attention_object_computes_the_same_bits() {
    let attention: Vec<cpu::Attention> =
        ATTN_CASES.iter().map(AttnCase::entry).collect::<std::collections::BTreeSet<_>>().into_iter().collect();
    for isa in cpu::host_isas() {
        let dir = tempfile::tempdir().unwrap();
        let object = cpu::install(dir.path(), isa).unwrap().unwrap();
        let vmfb = compile_cpu(&attention_module(&cpu::executable_source(&object, &[], &attention)));
        let instance = Instance::new().unwrap();
        let device = instance.device("local-task").unwrap();
        let mut session = Session::new(&instance, &device).unwrap();
        session.load_vmfb(&vmfb).unwrap();
        for (i, case) in ATTN_CASES.iter().enumerate() {
            let inputs = case.inputs(1000 + 10 * i as u64);
            let [q, k_new, v_new, kc, vc] = &inputs;
            let n = case.positions.len();
            let [l, s, p] = case.cache_dims;
            let cache_shape = [l, s, p, case.kv, case.hd];
            let upload_cache = |v: &[f32]| match case.cache {
                cpu::CacheElem::F16 => {
                    device.upload(&cache_shape, &v.iter().map(|x| f16::from_f32(*x)).collect::<Vec<_>>())
                }
                cpu::CacheElem::F32 => device.upload(&cache_shape, v),
            };
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
            let got: Vec<f32> = session.call(&format!("attn_{i}"), &refs).unwrap()[0].to_vec().unwrap();
            let model = cpu::attention_model(
                q,
                k_new,
                v_new,
                kc,
                vc,
                case.positions,
                case.slots,
                case.constants(),
                case.scale(),
            );
            let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
            assert_eq!(bits(&got), bits(&model), "{isa} attention case {i}: the object differs from the model");
            let exact = attention_f64(case, &inputs);
            let err = got.iter().zip(&exact).map(|(a, b)| (f64::from(*a) - b).abs()).fold(0.0, f64::max);
            assert!(err < 2e-6, "{isa} attention case {i}: {err:e} from attention in f64");
        }
    }
}
