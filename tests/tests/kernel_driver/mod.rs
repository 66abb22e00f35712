//! What the tests of kernel objects IREE cannot run on this host share: the freestanding
//! driver (`crates/kernels/cpu/qmv_qemu_driver.c`) linked with an object into a static Linux
//! executable, and the cases it runs against the Rust model of kernel_cases, as kernels.rs
//! runs the host's objects through IREE. Used by kernels_aarch64.rs (the aarch64 object,
//! under qemu-user off aarch64) and kernels_amx.rs (the AMX object with its tile
//! instructions emulated in C, natively).

#![allow(dead_code, clippy::unwrap_used)] // each test file uses part of it

use super::kernel_cases::{
    ATTN_CASES, DELTA_CASES, DENSE_ROWS, DenseMatrix, IDS, K, Matrix, O, PACKINGS, check_delta, check_dense,
    check_dense_rows, check_qmv, check_rows, input,
};
use half::f16;
use kernels::cpu::{self, Op, Scale};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

/// Every group size the kernels take, each at every (bits, scale).
const GROUP_SIZES: [usize; 4] = [16, 32, 64, 128];

/// The kernel sources.
pub fn sources() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../crates/kernels/cpu")
}

/// `tool --version` runs, or the test fails naming the Debian package `cargo xtask setup`
/// installs.
pub fn require(tool: &str, package: &str) {
    let ok = Command::new(tool).arg("--version").output().is_ok_and(|o| o.status.success());
    assert!(ok, "{tool} is not installed: run `cargo xtask setup` (it installs Debian's {package})");
}

pub fn run_ok(cmd: &mut Command) {
    let out = cmd.output().unwrap();
    assert!(out.status.success(), "{cmd:?} failed: {}", String::from_utf8_lossy(&out.stderr));
}

/// `source` compiled by clang into `object` with `flags` (after [`kernels::cflags::COMMON`],
/// as build.rs compiles the objects), which must need no symbol: IREE could not resolve one
/// (build.rs checks its objects the same way).
pub fn compile(source: &str, flags: &[&str], object: &Path) {
    require("clang", "clang");
    run_ok(
        Command::new("clang")
            .args(kernels::cflags::COMMON)
            .args(flags)
            .arg("-c")
            .arg(sources().join(source))
            .arg("-o")
            .arg(object),
    );
    let nm = Command::new("nm").arg("--undefined-only").arg(object).output().unwrap();
    let undefined = String::from_utf8_lossy(&nm.stdout);
    assert!(nm.status.success() && undefined.trim().is_empty(), "{source} needs symbols it must not: {undefined}");
}

/// A directory for one object and its driver, under cargo's target/tmp: made anew by each
/// run of the test binary (clang takes 10-20 s over an object, so a binary builds it once
/// for all its tests).
pub fn build_dir(name: &str) -> PathBuf {
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join("kernel_driver").join(name);
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// The driver linked with one kernel object, and how to run it.
pub struct Driver {
    /// The object's name in failure messages (`neondot`, `amx (emulated)`).
    pub name: &'static str,
    /// The kernel object.
    pub object: PathBuf,
    exe: PathBuf,
    /// The emulator to run it under and its arguments; empty: natively.
    runner: Vec<String>,
}

/// What one run of the driver wrote.
pub struct Output {
    pub stdout: Vec<u8>,
    pub stderr: String,
}

impl Driver {
    /// Links the driver with `object` by clang and lld (`target`: clang's `--target`, for
    /// another architecture than the host's), into `dir`.
    pub fn link(name: &'static str, dir: &Path, object: PathBuf, target: Option<&str>, runner: &[&str]) -> Driver {
        require("ld.lld", "lld");
        let exe = dir.join("qmv_qemu_driver");
        run_ok(
            Command::new("clang")
                .args(target)
                .args(["-O2", "-ffreestanding", "-fno-stack-protector", "-nostdlib", "-static", "-fuse-ld=lld"])
                .arg(sources().join("qmv_qemu_driver.c"))
                .arg(&object)
                .arg("-o")
                .arg(&exe),
        );
        Driver { name, object, exe, runner: runner.iter().map(|s| s.to_string()).collect() }
    }

    /// Runs the executable on `stdin`.
    pub fn run(&self, stdin: &[u8]) -> Output {
        let mut cmd = match self.runner.split_first() {
            None => Command::new(&self.exe),
            Some((emulator, args)) => {
                let mut cmd = Command::new(emulator);
                cmd.args(args).arg(&self.exe);
                cmd
            }
        };
        let mut child = cmd.stdin(Stdio::piped()).stdout(Stdio::piped()).stderr(Stdio::piped()).spawn().unwrap();
        // The driver reads all of its input before it writes anything; if it stops reading
        // (it refuses the input), its exit status and stderr say why.
        let written = child.stdin.take().unwrap().write_all(stdin);
        let out = child.wait_with_output().unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
        assert!(out.status.success(), "{cmd:?} failed ({}): {stderr}", out.status);
        written.unwrap();
        Output { stdout: out.stdout, stderr }
    }
}

/// Values as the driver reads them: little-endian.
fn floats(v: &[f32]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}

fn ints(v: &[i32]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}

fn words(v: impl IntoIterator<Item = u32>) -> Vec<u8> {
    v.into_iter().flat_map(u32::to_le_bytes).collect()
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
    push_part(stdin, &words(header));
    push_part(stdin, input);
    if op == Op::MatvecAdd {
        push_part(stdin, &floats(residual));
    }
    push_part(stdin, &m.kernel_weight());
    for values in [&m.scales, &m.biases] {
        let v = m.kernel_groups(values);
        let bytes: Vec<u8> = match scale {
            Scale::F16 => v.iter().flat_map(|x| f16::from_f32(*x).to_le_bytes()).collect(),
            Scale::F32 => floats(&v),
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

/// Every packed entry point (`qmv`, `qmvr`, `qmve` with one expert, `qrows`, and the
/// products' `_x8` twins) at 3, 4, 6 and 8 bits and FP4, every scale type, every group size
/// the kernels take and each count of rows of x in `rows`, against the model's bits. Returns
/// the driver's stderr.
pub fn packed_cases(driver: &Driver, rows: &[usize]) -> String {
    let (mut matrices, mut cases, mut stdin) = (Vec::new(), Vec::new(), Vec::new());
    for (bits, fp4) in PACKINGS {
        let scales: &[Scale] = if fp4 { &[Scale::F16, Scale::F32, Scale::E8m0] } else { &[Scale::F16, Scale::F32] };
        for &scale in scales {
            // Every group size the kernels take for these bits (3 bits: 32 and up).
            for gs in GROUP_SIZES.into_iter().filter(|&gs| cpu::supports(bits, O, K, gs)) {
                let entry = |op| cpu::Entry { op, bits, scale, fp4, x8: false };
                let seed = 10 * matrices.len() as u64;
                let m = Matrix::of(&entry(Op::Matvec), O, K, gs, seed);
                for &t in rows {
                    let x = input(t, K, 100 + t as u64);
                    // `qmve` with one expert is each row's one-row `qmv`: the model's bits.
                    for op in [Op::Matvec, Op::MatvecAdd, Op::Experts] {
                        let residual = (op == Op::MatvecAdd).then(|| input(t, O, 200 + t as u64));
                        push_case(&mut stdin, op, &m, scale, t, &floats(&x), residual.as_deref().unwrap_or_default());
                        let what = format!("{} {} group size {gs}", driver.name, entry(op).export());
                        cases.push(Case { what, matrix: matrices.len(), t, x: Some(x.clone()), residual });
                    }
                }
                push_case(&mut stdin, Op::Rows, &m, scale, IDS.len(), &ints(&IDS), &[]);
                let what = format!("{} {} group size {gs}", driver.name, entry(Op::Rows).export());
                cases.push(Case { what, matrix: matrices.len(), t: IDS.len(), x: None, residual: None });
                matrices.push(m);
                // The products' 8-bit-activation twins on the same matrix.
                let x8 = |op| cpu::Entry { x8: true, ..entry(op) };
                let m = Matrix::of(&x8(Op::Matvec), O, K, gs, seed);
                for &t in rows {
                    let x = input(t, K, 100 + t as u64);
                    for op in [Op::Matvec, Op::MatvecAdd] {
                        let residual = (op == Op::MatvecAdd).then(|| input(t, O, 200 + t as u64));
                        push_case(&mut stdin, op, &m, scale, t, &floats(&x), residual.as_deref().unwrap_or_default());
                        let what = format!("{} {} group size {gs}", driver.name, x8(op).export());
                        cases.push(Case { what, matrix: matrices.len(), t, x: Some(x.clone()), residual });
                    }
                }
                matrices.push(m);
            }
        }
    }
    let out = driver.run(&stdin);
    let floats: Vec<f32> = out.stdout.chunks_exact(4).map(|b| f32::from_le_bytes(b.try_into().unwrap())).collect();
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
    out.stderr
}

/// The attention entry points (cpu/attn.h) on kernel_cases' cases against the Rust model's
/// bits, as the host's objects run them through IREE (kernels.rs): each case with a row's kv
/// heads a workgroup and with whole rows a workgroup (a prompt chunk's tiles).
pub fn attention_cases(driver: &Driver) {
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
        push_part(&mut stdin, &words(header));
        for part in [floats(q), floats(k_new), floats(v_new), case.cache_bytes(kc), case.cache_bytes(vc)] {
            push_part(&mut stdin, &part);
        }
        for part in [case.positions, case.slots] {
            push_part(&mut stdin, &ints(part));
        }
        expected.push((format!("case {i} ({})", entry.export()), case.model(&inputs)));
    }
    let out = driver.run(&stdin).stdout;
    let got: Vec<u32> = out.chunks_exact(4).map(|b| u32::from_le_bytes(b.try_into().unwrap())).collect();
    let mut at = 0;
    for (what, model) in &expected {
        assert!(got.len() >= at + model.len(), "attention {what}: the driver wrote too few values");
        let bits: Vec<u32> = model.iter().map(|x| x.to_bits()).collect();
        assert_eq!(
            got[at..at + model.len()],
            bits[..],
            "{} attention {what}: the object differs from the model",
            driver.name
        );
        at += model.len();
    }
    assert_eq!(at, got.len(), "the driver wrote more than was asked for");
}

/// The delta rule's step (cpu/delta.h) on kernel_cases' delta cases against the Rust model's
/// bits, y and the state it updates where it lies, as the host's objects run it through
/// IREE (kernels.rs; the same checks: `check_delta`).
pub fn delta_cases(driver: &Driver) {
    let (mut stdin, mut all_inputs) = (Vec::new(), Vec::new());
    for (i, case) in DELTA_CASES.iter().enumerate() {
        let inputs = case.inputs(2000 + 10 * i as u64);
        let header = [8].into_iter().chain(case.constants().map(|d| d as u32));
        push_part(&mut stdin, &words(header));
        for part in [&inputs.q, &inputs.k, &inputs.v, &inputs.g, &inputs.beta] {
            push_part(&mut stdin, &floats(part));
        }
        for part in [case.positions, case.slots, &[case.last]] {
            push_part(&mut stdin, &ints(part));
        }
        push_part(&mut stdin, &floats(&inputs.state));
        all_inputs.push(inputs);
    }
    let out = driver.run(&stdin).stdout;
    let got: Vec<f32> = out.chunks_exact(4).map(|b| f32::from_le_bytes(b.try_into().unwrap())).collect();
    let mut at = 0;
    for (i, (case, inputs)) in DELTA_CASES.iter().zip(&all_inputs).enumerate() {
        let (y_len, state_len) = (case.rows() * case.heads * case.dv, case.state_len());
        assert!(got.len() >= at + y_len + state_len, "delta case {i}: the driver wrote too few values");
        let (y, state) = got[at..at + y_len + state_len].split_at(y_len);
        check_delta(&format!("{} delta case {i}", driver.name), case, inputs, y, state);
        at += y_len + state_len;
    }
    assert_eq!(at, got.len(), "the driver wrote more than was asked for");
}

/// The dense product and lookup (cpu/hmv.h, f16, bf16 and mxfp8) on kernel_cases' cases
/// against the Rust model's bits (`kernels::cpu::dense_model`), as the host's objects run
/// them through IREE (kernels.rs).
pub fn dense_cases(driver: &Driver) {
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
            push_part(stdin, &words(header));
            push_part(stdin, input);
            if let Some(r) = residual {
                push_part(stdin, &floats(r));
            }
            push_part(stdin, &m.weight);
            if let Some(s) = &m.scales {
                push_part(stdin, s);
            }
        };
        push(&mut stdin, cpu::DenseOp::Rows, IDS.len(), &ints(&IDS), None);
        for op in [cpu::DenseOp::Matvec, cpu::DenseOp::MatvecAdd] {
            for t in DENSE_ROWS {
                let x = input(t, K, 300 + t as u64);
                let residual = (op == cpu::DenseOp::MatvecAdd).then(|| input(t, O, 400 + t as u64));
                push(&mut stdin, op, t, &floats(&x), residual.as_deref());
                cases.push((cpu::Dense { op, elem }, t, x, residual));
            }
        }
        let out = driver.run(&stdin).stdout;
        let got: Vec<f32> = out.chunks_exact(4).map(|b| f32::from_le_bytes(b.try_into().unwrap())).collect();
        let rows = IDS.len() * K;
        assert!(got.len() >= rows, "the driver wrote too few values");
        let lookup = cpu::Dense { op: cpu::DenseOp::Rows, elem };
        check_dense_rows(&format!("{} {}", driver.name, lookup.export()), &m, &IDS, &got[..rows]);
        let mut at = rows;
        for (entry, t, x, residual) in &cases {
            assert!(got.len() >= at + t * O, "{}: the driver wrote too few values", entry.export());
            let what = format!("{} {}", driver.name, entry.export());
            check_dense(&what, &m, x, *t, residual.as_deref(), &got[at..at + t * O]);
            at += t * O;
        }
        assert_eq!(at, got.len(), "the driver wrote more than was asked for");
    }
}
