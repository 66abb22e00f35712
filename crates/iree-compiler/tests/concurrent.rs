//! Compiles from several threads at once: each gives the bytes a lone compile gives, with
//! other targets and flags compiling beside it, and the cache compiles one key once.

mod common;

use std::sync::{Arc, Barrier};
use std::time::Instant;

use common::compiler;
use iree_compiler::{CacheOutcome, CompileCache, CompileOptions, Target};

/// A module big enough that compiles started together overlap: a chain of `n`
/// matrix-vector products by different constant matrices.
fn chain(n: usize) -> String {
    let mut body = String::from("func.func @chain(%x0: tensor<16xf32>) -> tensor<16xf32> {\n");
    for i in 0..n {
        let w = format!("%w{i} = stablehlo.constant dense<{}.0> : tensor<16x16xf32>\n", i + 1);
        body.push_str(&w);
        body.push_str(&format!(
            "%x{} = stablehlo.dot_general %w{i}, %x{i}, contracting_dims = [1] x [0] : (tensor<16x16xf32>, tensor<16xf32>) -> tensor<16xf32>\n",
            i + 1
        ));
    }
    body.push_str(&format!("return %x{n} : tensor<16xf32>\n}}\n"));
    body
}

/// Three targets and flag sets, each compiled alone and then all at once (twice each): the
/// concurrent bytes equal the lone ones.
#[test]
fn concurrent_compiles_give_the_bytes_of_lone_ones() {
    let c = compiler();
    let module = chain(12);
    let jobs: Vec<(Target, CompileOptions)> = vec![
        (Target::llvm_cpu_host(), CompileOptions::default()),
        (Target::LlvmCpu { cpu: "generic".into() }, CompileOptions::default().with_flag("--iree-opt-data-tiling")),
        (Target::cuda("sm_80"), CompileOptions::default()),
    ];
    let started = Instant::now();
    let alone: Vec<Vec<u8>> = jobs.iter().map(|(t, o)| c.compile(&module, t, o).unwrap()).collect();
    let alone_s = started.elapsed().as_secs_f64();

    let threads = 2 * jobs.len();
    let barrier = Arc::new(Barrier::new(threads));
    let started = Instant::now();
    let handles: Vec<_> = (0..threads)
        .map(|i| {
            let (target, opts) = jobs[i % jobs.len()].clone();
            let (module, barrier) = (module.clone(), Arc::clone(&barrier));
            std::thread::spawn(move || {
                barrier.wait();
                compiler().compile(&module, &target, &opts).unwrap()
            })
        })
        .collect();
    for (i, h) in handles.into_iter().enumerate() {
        let vmfb = h.join().expect("a compile thread panicked");
        assert!(vmfb == alone[i % jobs.len()], "job {i}: concurrent bytes differ from the lone compile's");
    }
    eprintln!(
        "{} compiles alone {alone_s:.2} s; {threads} at once {:.2} s",
        jobs.len(),
        started.elapsed().as_secs_f64()
    );
}

/// Threads asking the cache for one key at once: one compiles, the others read its file.
#[test]
fn the_cache_compiles_one_key_once_across_threads() {
    let dir = tempfile::tempdir().unwrap();
    let module = chain(8);
    let threads = 3;
    let barrier = Arc::new(Barrier::new(threads));
    let handles: Vec<_> = (0..threads)
        .map(|_| {
            let (module, barrier, dir) = (module.clone(), Arc::clone(&barrier), dir.path().to_path_buf());
            std::thread::spawn(move || {
                let cache = CompileCache::new(dir).unwrap();
                barrier.wait();
                cache.compile(&compiler(), &module, &Target::llvm_cpu_host(), &CompileOptions::default()).unwrap()
            })
        })
        .collect();
    let results: Vec<_> = handles.into_iter().map(|h| h.join().expect("a cache thread panicked")).collect();
    let misses = results.iter().filter(|r| r.outcome == CacheOutcome::Miss).count();
    assert_eq!(misses, 1, "outcomes {:?}", results.iter().map(|r| r.outcome).collect::<Vec<_>>());
    assert!(results.iter().all(|r| r.vmfb == results[0].vmfb && r.key == results[0].key));
}

/// Set in the child processes of [`first_compiles_started_together_in_fresh_processes`].
const CHILD: &str = "MLX_IREE_TEST_FIRST_COMPILES_CHILD";

/// The first compiles of a process, started together on several threads and four backends:
/// each succeeds. Once, two first CPU compiles at once failed with "createTargetMachine(...)
/// failed; machine may not be enabled in LLVM" and a segfault; a race shows only sometimes,
/// so four fresh processes (this test run again as a child) each try.
#[test]
fn first_compiles_started_together_in_fresh_processes() {
    if std::env::var_os(CHILD).is_some() {
        let module = chain(4);
        let targets = [
            Target::llvm_cpu_host(),
            Target::LlvmCpu { cpu: "generic".into() },
            Target::vulkan("rdna3"),
            Target::Metal,
            Target::cuda("sm_80"),
        ];
        let barrier = Arc::new(Barrier::new(targets.len()));
        let handles: Vec<_> = targets
            .into_iter()
            .map(|target| {
                let (module, barrier) = (module.clone(), Arc::clone(&barrier));
                std::thread::spawn(move || {
                    let c = compiler();
                    barrier.wait();
                    c.compile(&module, &target, &CompileOptions::default()).map(|v| v.len())
                })
            })
            .collect();
        for h in handles {
            let bytes = h.join().expect("a compile thread panicked").unwrap();
            assert!(bytes > 0);
        }
        return;
    }
    let exe = std::env::current_exe().unwrap();
    for run in 0..4 {
        let out = std::process::Command::new(&exe)
            .args(["first_compiles_started_together_in_fresh_processes", "--exact", "--test-threads=1"])
            .env(CHILD, "1")
            .output()
            .unwrap();
        assert!(out.status.success(), "fresh process {run}: {}\n{}", out.status, String::from_utf8_lossy(&out.stderr));
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(stdout.contains("1 passed"), "fresh process {run} ran no test: {stdout}");
    }
}
