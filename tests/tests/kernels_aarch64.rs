//! The aarch64 kernel object (`crates/kernels/cpu/qmv_aarch64.c`, NEON with the dot-product
//! extension) on any host, cross-compiled by clang with the flags build.rs gives it on
//! aarch64 (`kernels::cflags`):
//! - linked by lld with a freestanding driver (`cpu/qmv_qemu_driver.c`) into a static
//!   aarch64 Linux executable, run natively on an aarch64 host, elsewhere under qemu-user as
//!   a Cortex-A76 (ARMv8.2-A with the dot-product extension, so an instruction beyond what
//!   the object is built for would fault): every entry point, at 3, 4, 6 and 8 bits and FP4, f16 and f32
//!   scales, group sizes 16 (3 bits: 32) to 128 and 1, 3, 8 and 13 rows of x (the products with x at 16
//!   bits and, their `_x8` twins, at 8), gives the bits of the Rust
//!   model the x86-64 objects are held to (kernel_cases, kernels.rs), so all objects compute
//!   the same bits; its attention (`attn`) gives `kernels::cpu::attention_model`'s bits on
//!   kernel_cases' attention cases, and its delta rule's step (`delta`) gives
//!   `kernels::cpu::delta_model`'s bits (y and the state it updates) on its delta cases, as
//!   the x86-64 objects do;
//! - linked by IREE into an aarch64 executable from the MLIR `kernels::cpu` writes for it
//!   (the module kernels.rs runs), as on an aarch64 host.

#![allow(clippy::unwrap_used)] // a test that cannot unwrap has failed; helpers included

use half::f16;
use iree_compiler::{CompileOptions, Target};
use kernels::cflags;
use kernels::cpu::{self, Op, Scale};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

mod kernel_cases;
use kernel_cases::{
    ATTN_CASES, DELTA_CASES, DENSE_ROWS, DenseMatrix, IDS, K, Matrix, O, PACKINGS, ROWS, check_delta, check_dense,
    check_dense_rows, check_qmv, check_rows, entries, input, module,
};

/// Every group size the kernels take, each at every (bits, scale).
const GROUP_SIZES: [usize; 4] = [16, 32, 64, 128];

fn sources() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../crates/kernels/cpu")
}

/// `tool --version` runs, or the test fails naming the Debian package `cargo xtask setup`
/// installs.
fn require(tool: &str, package: &str) {
    let ok = Command::new(tool).arg("--version").output().is_ok_and(|o| o.status.success());
    assert!(ok, "{tool} is not installed: run `cargo xtask setup` (it installs Debian's {package})");
}

fn run_ok(cmd: &mut Command) {
    let out = cmd.output().unwrap();
    assert!(out.status.success(), "{cmd:?} failed: {}", String::from_utf8_lossy(&out.stderr));
}

/// The kernel object, built as build.rs builds it on aarch64.
fn object(dir: &Path) -> PathBuf {
    require("clang", "clang");
    let object = dir.join("qmv_aarch64.o");
    run_ok(
        Command::new("clang")
            .arg(cflags::AARCH64_ELF_TARGET)
            .args(cflags::COMMON)
            .args(cflags::NEON_DOT)
            .arg("-c")
            .arg(sources().join("qmv_aarch64.c"))
            .arg("-o")
            .arg(&object),
    );
    // Freestanding: IREE could not resolve an import (build.rs checks its objects the same way).
    let nm = Command::new("nm").arg("--undefined-only").arg(&object).output().unwrap();
    let undefined = String::from_utf8_lossy(&nm.stdout);
    assert!(nm.status.success() && undefined.trim().is_empty(), "qmv_aarch64.c needs symbols it must not: {undefined}");
    object
}

/// The driver linked with the kernel object.
fn executable(dir: &Path, object: &Path) -> PathBuf {
    require("ld.lld", "lld");
    let exe = dir.join("qmv_qemu_driver");
    run_ok(
        Command::new("clang")
            .arg(cflags::AARCH64_ELF_TARGET)
            .args(["-O2", "-ffreestanding", "-fno-stack-protector", "-nostdlib", "-static", "-fuse-ld=lld"])
            .arg(sources().join("qmv_qemu_driver.c"))
            .arg(object)
            .arg("-o")
            .arg(&exe),
    );
    exe
}

/// Runs the executable on `stdin` and returns its stdout.
fn run(exe: &Path, stdin: &[u8]) -> Vec<u8> {
    let mut cmd = if std::env::consts::ARCH == "aarch64" {
        Command::new(exe)
    } else {
        require("qemu-aarch64", "qemu-user");
        let mut qemu = Command::new("qemu-aarch64");
        qemu.args(["-cpu", "cortex-a76"]).arg(exe);
        qemu
    };
    let mut child = cmd.stdin(Stdio::piped()).stdout(Stdio::piped()).stderr(Stdio::piped()).spawn().unwrap();
    // The driver reads all of its input before it writes anything.
    child.stdin.take().unwrap().write_all(stdin).unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(out.status.success(), "{cmd:?} failed ({}): {}", out.status, String::from_utf8_lossy(&out.stderr));
    out.stdout
}

/// Appends `bytes` padded with zeros to a multiple of 64 bytes (the driver's format).
fn push_part(stdin: &mut Vec<u8>, bytes: &[u8]) {
    stdin.extend_from_slice(bytes);
    stdin.resize(stdin.len().next_multiple_of(64), 0);
}

/// One case of the driver's input: header, input, the residual (`qmvr`), then the matrix in
/// the kernel layout.
fn push_case(stdin: &mut Vec<u8>, op: Op, m: &Matrix, scale: Scale, t: usize, input: &[u8], residual: &[f32]) {
    let code = match op {
        Op::Matvec => 0,
        Op::Rows => 1,
        Op::MatvecAdd => 3,
        Op::Experts => 4,
    };
    let f16 = match scale {
        Scale::F32 => 0,
        Scale::F16 => 1,
        Scale::E8m0 => 2,
    };
    let x8 = u32::from(m.x_levels < 32767.0);
    let header = [code, m.bits, f16, t as u32, K as u32, O as u32, m.group_size as u32, u32::from(m.fp4), x8];
    push_part(stdin, &header.into_iter().flat_map(u32::to_le_bytes).collect::<Vec<u8>>());
    push_part(stdin, input);
    if op == Op::MatvecAdd {
        push_part(stdin, &residual.iter().flat_map(|v| v.to_le_bytes()).collect::<Vec<u8>>());
    }
    push_part(stdin, &m.kernel_weight());
    for values in [&m.scales, &m.biases] {
        let v = m.kernel_groups(values);
        let bytes: Vec<u8> = match scale {
            Scale::F16 => v.iter().flat_map(|x| f16::from_f32(*x).to_le_bytes()).collect(),
            Scale::F32 => v.iter().flat_map(|x| x.to_le_bytes()).collect(),
            // The scale bytes; the biases' part (unread: FP4) takes as many.
            Scale::E8m0 => cpu::repack_groups(&m.e8m0, m.out, m.groups()),
        };
        push_part(stdin, &bytes);
    }
}

/// What one case checks: `x` for a matvec of `t` rows (and the residual added after it,
/// `qmvr`), none for the lookup of [`IDS`].
struct Case {
    what: String,
    matrix: usize,
    t: usize,
    x: Option<Vec<f32>>,
    residual: Option<Vec<f32>>,
}

#[test]
fn the_aarch64_object_computes_the_models_bits() {
    let dir = tempfile::tempdir().unwrap();
    let exe = executable(dir.path(), &object(dir.path()));
    let (mut matrices, mut cases, mut stdin) = (Vec::new(), Vec::new(), Vec::new());
    for (bits, fp4) in PACKINGS {
        let scales: &[Scale] = if fp4 { &[Scale::F16, Scale::F32, Scale::E8m0] } else { &[Scale::F16, Scale::F32] };
        for &scale in scales {
            // Every group size the kernels take for these bits (3 bits: 32 and up).
            for gs in GROUP_SIZES.into_iter().filter(|&gs| cpu::supports(bits, O, K, gs)) {
                let entry = |op| cpu::Entry { op, bits, scale, fp4, x8: false };
                let seed = 10 * matrices.len() as u64;
                let m = Matrix::of(&entry(Op::Matvec), O, K, gs, seed);
                for t in ROWS {
                    let x = input(t, K, 100 + t as u64);
                    let bytes: Vec<u8> = x.iter().flat_map(|v| v.to_le_bytes()).collect();
                    // `qmve` with one expert is each row's one-row `qmv`: the model's bits.
                    for op in [Op::Matvec, Op::MatvecAdd, Op::Experts] {
                        let residual = (op == Op::MatvecAdd).then(|| input(t, O, 200 + t as u64));
                        push_case(&mut stdin, op, &m, scale, t, &bytes, residual.as_deref().unwrap_or_default());
                        let what = format!("neondot {} group size {gs}", entry(op).export());
                        cases.push(Case { what, matrix: matrices.len(), t, x: Some(x.clone()), residual });
                    }
                }
                let ids: Vec<u8> = IDS.iter().flat_map(|v| v.to_le_bytes()).collect();
                push_case(&mut stdin, Op::Rows, &m, scale, IDS.len(), &ids, &[]);
                let what = format!("neondot {} group size {gs}", entry(Op::Rows).export());
                cases.push(Case { what, matrix: matrices.len(), t: IDS.len(), x: None, residual: None });
                matrices.push(m);
                // The products' 8-bit-activation twins on the same matrix.
                let x8 = |op| cpu::Entry { x8: true, ..entry(op) };
                let m = Matrix::of(&x8(Op::Matvec), O, K, gs, seed);
                for t in ROWS {
                    let x = input(t, K, 100 + t as u64);
                    let bytes: Vec<u8> = x.iter().flat_map(|v| v.to_le_bytes()).collect();
                    for op in [Op::Matvec, Op::MatvecAdd] {
                        let residual = (op == Op::MatvecAdd).then(|| input(t, O, 200 + t as u64));
                        push_case(&mut stdin, op, &m, scale, t, &bytes, residual.as_deref().unwrap_or_default());
                        let what = format!("neondot {} group size {gs}", x8(op).export());
                        cases.push(Case { what, matrix: matrices.len(), t, x: Some(x.clone()), residual });
                    }
                }
                matrices.push(m);
            }
        }
    }
    let out = run(&exe, &stdin);
    let floats: Vec<f32> = out.chunks_exact(4).map(|b| f32::from_le_bytes(b.try_into().unwrap())).collect();
    let mut at = 0;
    for case in &cases {
        let m = &matrices[case.matrix];
        let len = case.t * if case.x.is_some() { O } else { K };
        assert!(
            floats.len() >= at + len,
            "{}: the driver wrote {} values, fewer than asked for",
            case.what,
            floats.len()
        );
        let got = &floats[at..at + len];
        at += len;
        match &case.x {
            Some(x) => check_qmv(&case.what, m, x, case.t, case.residual.as_deref(), got),
            None => check_rows(&case.what, m, &IDS, got),
        }
    }
    assert_eq!(at, floats.len(), "the driver wrote more than was asked for");
}

/// The attention entry points (cpu/attn.h) of the aarch64 object give kernel_cases' cases
/// the Rust model's bits, as the host's objects do through IREE (kernels.rs): each case with
/// a row's kv heads a workgroup and with whole rows a workgroup (a prompt chunk's tiles).
#[test]
fn the_aarch64_attention_computes_the_models_bits() {
    let dir = tempfile::tempdir().unwrap();
    let exe = executable(dir.path(), &object(dir.path()));
    let mut stdin = Vec::new();
    let mut expected = Vec::new();
    let both = ATTN_CASES.iter().enumerate().flat_map(|(i, c)| [(i, c, c.entry()), (i, c, c.tiled_entry())]);
    for (i, case, entry) in both {
        let inputs = case.inputs(1000 + 10 * i as u64);
        let [q, k_new, v_new, kc, vc] = &inputs;
        let [layer, s, p, kv, g, hd, w, sliding] = case.constants();
        let cache_elem = match case.cache {
            cpu::CacheElem::F32 => 0,
            cpu::CacheElem::F16 => 1,
            cpu::CacheElem::Q8 => 2,
        };
        let n = case.positions.len();
        let header = [2, cache_elem, case.cache_dims[0] as u32, s as u32, p as u32, kv as u32, g as u32, hd as u32]
            .into_iter()
            .chain([w as u32, sliding as u32, case.scale().to_bits(), n as u32, entry.units as u32, layer as u32]);
        push_part(&mut stdin, &header.flat_map(u32::to_le_bytes).collect::<Vec<u8>>());
        let floats = |v: &[f32]| v.iter().flat_map(|x| x.to_le_bytes()).collect::<Vec<u8>>();
        for part in [floats(q), floats(k_new), floats(v_new), case.cache_bytes(kc), case.cache_bytes(vc)] {
            push_part(&mut stdin, &part);
        }
        for ints in [case.positions, case.slots] {
            push_part(&mut stdin, &ints.iter().flat_map(|x| x.to_le_bytes()).collect::<Vec<u8>>());
        }
        expected.push((format!("case {i} ({})", entry.export()), case.model(&inputs)));
    }
    let out = run(&exe, &stdin);
    let got: Vec<u32> = out.chunks_exact(4).map(|b| u32::from_le_bytes(b.try_into().unwrap())).collect();
    let mut at = 0;
    for (what, model) in &expected {
        assert!(got.len() >= at + model.len(), "attention {what}: the driver wrote too few values");
        let bits: Vec<u32> = model.iter().map(|x| x.to_bits()).collect();
        assert_eq!(got[at..at + model.len()], bits[..], "neondot attention {what}: the object differs from the model");
        at += model.len();
    }
    assert_eq!(at, got.len(), "the driver wrote more than was asked for");
}

/// The delta rule's step (cpu/delta.h) of the aarch64 object gives kernel_cases' delta cases
/// the Rust model's bits, y and the state it updates where it lies, as the host's objects do
/// through IREE (kernels.rs; the same checks: `check_delta`).
#[test]
fn the_aarch64_delta_rule_computes_the_models_bits() {
    let dir = tempfile::tempdir().unwrap();
    let exe = executable(dir.path(), &object(dir.path()));
    let (mut stdin, mut all_inputs) = (Vec::new(), Vec::new());
    let floats = |v: &[f32]| v.iter().flat_map(|x| x.to_le_bytes()).collect::<Vec<u8>>();
    let ints = |v: &[i32]| v.iter().flat_map(|x| x.to_le_bytes()).collect::<Vec<u8>>();
    for (i, case) in DELTA_CASES.iter().enumerate() {
        let inputs = case.inputs(2000 + 10 * i as u64);
        let header = [8].into_iter().chain(case.constants().map(|d| d as u32));
        push_part(&mut stdin, &header.flat_map(u32::to_le_bytes).collect::<Vec<u8>>());
        for part in [&inputs.q, &inputs.k, &inputs.v, &inputs.g, &inputs.beta] {
            push_part(&mut stdin, &floats(part));
        }
        for part in [case.positions, case.slots, &[case.last]] {
            push_part(&mut stdin, &ints(part));
        }
        push_part(&mut stdin, &floats(&inputs.state));
        all_inputs.push(inputs);
    }
    let out = run(&exe, &stdin);
    let got: Vec<f32> = out.chunks_exact(4).map(|b| f32::from_le_bytes(b.try_into().unwrap())).collect();
    let mut at = 0;
    for (i, (case, inputs)) in DELTA_CASES.iter().zip(&all_inputs).enumerate() {
        let (y_len, state_len) = (case.rows() * case.heads * case.dv, case.state_len());
        assert!(got.len() >= at + y_len + state_len, "delta case {i}: the driver wrote too few values");
        let (y, state) = got[at..at + y_len + state_len].split_at(y_len);
        check_delta(&format!("neondot delta case {i}"), case, inputs, y, state);
        at += y_len + state_len;
    }
    assert_eq!(at, got.len(), "the driver wrote more than was asked for");
}

/// The dense product and lookup (cpu/hmv.h, f16, bf16 and mxfp8) of the aarch64 object give
/// kernel_cases' cases the Rust model's bits (`kernels::cpu::dense_model`), as the host's
/// objects do through IREE (kernels.rs).
#[test]
fn the_aarch64_dense_product_computes_the_models_bits() {
    let dir = tempfile::tempdir().unwrap();
    let exe = executable(dir.path(), &object(dir.path()));
    let floats = |v: &[f32]| v.iter().flat_map(|x| x.to_le_bytes()).collect::<Vec<u8>>();
    for elem in [cpu::DenseElem::F16, cpu::DenseElem::BF16, cpu::DenseElem::Mxfp8] {
        let m = DenseMatrix::random(elem, 77);
        let mut stdin = Vec::new();
        let mut cases = Vec::new();
        let push = |stdin: &mut Vec<u8>, op: cpu::DenseOp, t: usize, input: &[u8], residual: Option<&[f32]>| {
            let code: u32 = match op {
                cpu::DenseOp::Matvec => 5,
                cpu::DenseOp::MatvecAdd => 6,
                cpu::DenseOp::Rows => 7,
            };
            let kind = match elem {
                cpu::DenseElem::F16 => 0,
                cpu::DenseElem::BF16 => 1,
                cpu::DenseElem::Mxfp8 => 2,
            };
            let header = [code, t as u32, K as u32, O as u32, kind];
            push_part(stdin, &header.into_iter().flat_map(u32::to_le_bytes).collect::<Vec<u8>>());
            push_part(stdin, input);
            if let Some(r) = residual {
                push_part(stdin, &floats(r));
            }
            push_part(stdin, &m.weight);
            if let Some(s) = &m.scales {
                push_part(stdin, s);
            }
        };
        let ids: Vec<u8> = IDS.iter().flat_map(|v| v.to_le_bytes()).collect();
        push(&mut stdin, cpu::DenseOp::Rows, IDS.len(), &ids, None);
        for op in [cpu::DenseOp::Matvec, cpu::DenseOp::MatvecAdd] {
            for t in DENSE_ROWS {
                let x = input(t, K, 300 + t as u64);
                let residual = (op == cpu::DenseOp::MatvecAdd).then(|| input(t, O, 400 + t as u64));
                push(&mut stdin, op, t, &floats(&x), residual.as_deref());
                cases.push((cpu::Dense { op, elem }, t, x, residual));
            }
        }
        let out = run(&exe, &stdin);
        let got: Vec<f32> = out.chunks_exact(4).map(|b| f32::from_le_bytes(b.try_into().unwrap())).collect();
        let rows = IDS.len() * K;
        assert!(got.len() >= rows, "the driver wrote too few values");
        let lookup = cpu::Dense { op: cpu::DenseOp::Rows, elem };
        check_dense_rows(&format!("neondot {}", lookup.export()), &m, &IDS, &got[..rows]);
        let mut at = rows;
        for (entry, t, x, residual) in &cases {
            assert!(got.len() >= at + t * O, "{}: the driver wrote too few values", entry.export());
            let what = format!("neondot {}", entry.export());
            check_dense(&what, &m, x, *t, residual.as_deref(), &got[at..at + t * O]);
            at += t * O;
        }
        assert_eq!(at, got.len(), "the driver wrote more than was asked for");
    }
}

/// How many by-element `sdot`/`udot` instructions (`0 Q U 01111 10 L M Rm 1110 H 0 Rn Rd`)
/// `code` holds, read as 32-bit words from its start.
fn dot_instructions(code: &[u8]) -> usize {
    code.chunks_exact(4).filter(|w| u32::from_le_bytes([w[0], w[1], w[2], w[3]]) & 0x9FC0_F400 == 0x0F80_E000).count()
}

/// IREE links the object into an aarch64 executable from the MLIR `kernels::cpu` writes for
/// it (the module kernels.rs runs, compiled here for a generic aarch64 CPU, as
/// `executable_source` keys it on an aarch64 host): the vmfb holds an ELF for machine 183
/// (EM_AARCH64) with every dot-product instruction of the object.
#[test]
fn iree_links_the_aarch64_object() {
    let dir = tempfile::tempdir().unwrap();
    let object = object(dir.path());
    let mlir = module(&cpu::executable_source_for("aarch64", &object, &entries(), &[], &[], false));
    let target = Target::LlvmCpu { cpu: "generic".into() };
    let options = CompileOptions::default().with_flag("--iree-llvmcpu-target-triple=aarch64-unknown-linux-gnu");
    let vmfb = e2e::compiler().compile(&mlir, &target, &options).unwrap();
    let elf = vmfb.windows(4).position(|w| w == b"\x7fELF").expect("an executable in the vmfb");
    assert_eq!(u16::from_le_bytes([vmfb[elf + 18], vmfb[elf + 19]]), 183, "not an aarch64 ELF");
    let dots = dot_instructions(&std::fs::read(&object).unwrap());
    assert!(dots > 0, "no sdot/udot in the object");
    assert!(dot_instructions(&vmfb[elf..]) >= dots, "the executable lacks the object's code");
}
