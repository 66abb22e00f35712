//! Several independent instance/device/session stacks used from several
//! threads at once in one process, on `local-task` and `local-sync`, while
//! other threads keep loading new ones (instances, devices, whole stacks: what
//! engines loading next to running ones do). Every result is checked.
//!
//! This is the regression test for the intermittent "ref is null" failures of
//! concurrent engines. IREE keeps the VM type registrations
//! (`iree_hal_buffer_view_registration`, `iree_vm_list_registration`, ...) in
//! process globals, and `iree_vm_instance_register_type` first stores 0 there
//! before storing the type again. Each new runtime instance did that, and so
//! did each new `local-*` device (its driver's VMVX loader makes a VM
//! instance), so a call on another thread could read a null type: "ref is
//! null", "ref type mismatch", hangs and crashes (SIGSEGV in every run before
//! the fix). Now the process has one runtime instance and one driver per name.

mod common;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Barrier, mpsc};
use std::thread;
use std::time::{Duration, Instant};

use common::{compile, f32_bytes, write_safetensors};
use iree_hal::{Instance, Parameters, Session};

/// `add(a, b) = a + b` and `scaled(a) = w · a` (w a parameter), so every call
/// moves buffer views in and out and reads a parameter-bound global.
const MLIR: &str = r#"
util.global private @w = #stream.parameter.named<"model"::"w"> : tensor<4x4xf32>
func.func @add(%a: tensor<4xf32>, %b: tensor<4xf32>) -> tensor<4xf32> {
  %0 = stablehlo.add %a, %b : tensor<4xf32>
  return %0 : tensor<4xf32>
}
func.func @scaled(%x: tensor<4xf32>) -> (tensor<4xf32>, tensor<4xf32>) {
  %w = util.global.load @w : tensor<4x4xf32>
  %0 = stablehlo.dot_general %w, %x, contracting_dims = [1] x [0] : (tensor<4x4xf32>, tensor<4xf32>) -> tensor<4xf32>
  %1 = stablehlo.negate %x : tensor<4xf32>
  return %0, %1 : tensor<4xf32>, tensor<4xf32>
}
"#;

/// Calls per worker thread, at least; workers go on until [`RUN_FOR`] passed.
const CALLS: usize = 200;

/// How long each scenario keeps its threads busy.
const RUN_FOR: Duration = Duration::from_secs(3);

/// `w` = 2 * identity: `scaled(x)` is `2x`.
fn weights() -> Vec<f32> {
    (0..16).map(|i| if i % 5 == 0 { 2.0 } else { 0.0 }).collect()
}

/// One full stack, as an engine loads it.
fn load(vmfb: &[u8], uri: &str) -> Result<(Instance, Session), iree_hal::Error> {
    let instance = Instance::new()?;
    let device = instance.device(uri)?;
    let mut session = Session::new(&instance, &device)?;
    let mut params = Parameters::new("model")?;
    params.add_tensor("w", &f32_bytes(&weights()))?;
    session.append_parameters(&[&params])?;
    session.load_vmfb(vmfb)?;
    Ok((instance, session))
}

/// Loads a stack and makes `CALLS` calls, checking every result. Returns the
/// first failure as text.
fn worker(vmfb: &[u8], uri: &str, seed: usize, start: &Barrier) -> Result<(), String> {
    let loaded = load(vmfb, uri);
    start.wait();
    let (_instance, session) = loaded.map_err(|e| format!("loading on {uri}: {e}"))?;
    let device = session.device();
    let add = session.function("add").map_err(|e| e.to_string())?;
    let scaled = session.function("scaled").map_err(|e| e.to_string())?;
    let until = Instant::now() + RUN_FOR;
    let mut i = 0;
    while i < CALLS || Instant::now() < until {
        i += 1;
        let base = (seed * 10_000 + i) as f32;
        let a = [base, base + 1.0, base + 2.0, base + 3.0];
        let b = [1.0f32, -1.0, 0.5, 4.0];
        let step = |e: iree_hal::Error| format!("{uri} thread {seed} call {i}: {e}");
        let va = device.upload(&[4], &a).map_err(step)?;
        let vb = device.upload(&[4], &b).map_err(step)?;
        let sum = add.call(&[&va, &vb]).map_err(step)?;
        let got: Vec<f32> = sum[0].to_vec().map_err(step)?;
        let want: Vec<f32> = a.iter().zip(&b).map(|(x, y)| x + y).collect();
        if got != want {
            return Err(format!("{uri} thread {seed} call {i}: add gave {got:?}, want {want:?}"));
        }
        let out = scaled.call(&[&va]).map_err(step)?;
        let twice: Vec<f32> = out[0].to_vec().map_err(step)?;
        let negated: Vec<f32> = out[1].to_vec().map_err(step)?;
        if twice != a.map(|x| 2.0 * x) || negated != a.map(|x| -x) {
            return Err(format!("{uri} thread {seed} call {i}: scaled gave {twice:?}, {negated:?} for {a:?}"));
        }
    }
    Ok(())
}

/// Until `stop`, does what an engine loading next to running ones does, over
/// and over: creates instances, devices, and every eighth round a whole stack
/// with parameters and a checked call. Returns how many rounds it did, or the
/// first failure.
fn loader(vmfb: &[u8], uri: &str, stop: &AtomicBool, start: &Barrier) -> Result<usize, String> {
    start.wait();
    let mut rounds = 0;
    let deadline = Instant::now() + 4 * RUN_FOR + Duration::from_secs(30);
    while !stop.load(Ordering::Relaxed) && Instant::now() < deadline {
        let instance = Instance::new().map_err(|e| format!("loader instance: {e}"))?;
        for _ in 0..8 {
            Instance::new().map_err(|e| format!("loader instance: {e}"))?;
        }
        instance.device(uri).map_err(|e| format!("loader device on {uri}: {e}"))?;
        if rounds % 8 == 7 {
            let (_instance, session) = load(vmfb, uri).map_err(|e| format!("loader on {uri}: {e}"))?;
            let x = session.device().upload(&[4], &[1.0f32, 2.0, 3.0, 4.0]).map_err(|e| e.to_string())?;
            let out = session.call("add", &[&x, &x]).map_err(|e| format!("loader call on {uri}: {e}"))?;
            let got: Vec<f32> = out[0].to_vec().map_err(|e| e.to_string())?;
            if got != [2.0, 4.0, 6.0, 8.0] {
                return Err(format!("loader on {uri}: add gave {got:?}"));
            }
        }
        rounds += 1;
    }
    Ok(rounds)
}

/// `workers` stacks calling on `uri` while `loaders` threads load stacks on
/// `loader_uri`. A thread that hangs (as calls did when the race hit) fails
/// the test after a deadline instead of blocking it.
fn concurrent(vmfb: &Arc<Vec<u8>>, uri: &'static str, workers: usize, loader_uri: &'static str, loaders: usize) {
    let stop = Arc::new(AtomicBool::new(false));
    let start = Arc::new(Barrier::new(workers + loaders));
    let (loader_tx, loader_rx) = mpsc::channel();
    for _ in 0..loaders {
        let (vmfb, stop, start, tx) = (Arc::clone(vmfb), Arc::clone(&stop), Arc::clone(&start), loader_tx.clone());
        thread::spawn(move || tx.send(loader(&vmfb, loader_uri, &stop, &start)).ok());
    }
    let (worker_tx, worker_rx) = mpsc::channel();
    for seed in 0..workers {
        let (vmfb, start, tx) = (Arc::clone(vmfb), Arc::clone(&start), worker_tx.clone());
        thread::spawn(move || tx.send(worker(&vmfb, uri, seed, &start)).ok());
    }
    let deadline = Instant::now() + 4 * RUN_FOR + Duration::from_secs(60);
    fn wait<T>(rx: &mpsc::Receiver<T>, deadline: Instant, what: &str) -> T {
        rx.recv_timeout(deadline.saturating_duration_since(Instant::now()))
            .unwrap_or_else(|e| panic!("a {what} thread hung or panicked: {e}"))
    }
    let mut failures = Vec::new();
    for _ in 0..workers {
        if let Err(e) = wait(&worker_rx, deadline, &format!("worker on {uri}")) {
            failures.push(e);
        }
    }
    stop.store(true, Ordering::Relaxed);
    let mut rounds = 0;
    for _ in 0..loaders {
        match wait(&loader_rx, deadline, &format!("loader on {loader_uri}")) {
            Ok(n) => rounds += n,
            Err(e) => failures.push(e),
        }
    }
    assert!(
        failures.is_empty(),
        "{} of {workers} workers on {uri} and {loaders} loaders on {loader_uri} failed: {failures:#?}",
        failures.len()
    );
    assert!(rounds > 0, "the loaders loaded nothing while the workers ran");
}

fn vmfb() -> Arc<Vec<u8>> {
    Arc::new(compile(MLIR))
}

#[test]
fn two_stacks_on_local_task_while_another_loads() {
    concurrent(&vmfb(), "local-task", 2, "local-task", 1);
}

#[test]
fn four_stacks_on_local_task_while_two_load() {
    concurrent(&vmfb(), "local-task", 4, "local-task", 2);
}

#[test]
fn stacks_on_local_sync_while_another_loads() {
    concurrent(&vmfb(), "local-sync", 3, "local-sync", 1);
}

#[test]
fn stacks_on_local_task_while_local_sync_loads() {
    concurrent(&vmfb(), "local-task", 2, "local-sync", 1);
}

#[test]
fn instances_share_one_runtime_instance() {
    let a = Instance::new().expect("instance");
    let b = thread::spawn(|| Instance::new().expect("instance").as_ptr() as usize).join().expect("thread");
    assert_eq!(a.as_ptr() as usize, b, "every Instance::new in a process returns the same runtime instance");
}

#[test]
fn parameters_file_and_calls_from_threads() {
    // Parameters read from a file by several stacks at once.
    let dir = tempfile::tempdir().expect("temp dir");
    let path = dir.path().join("w.safetensors");
    write_safetensors(&path, &[("w", "F32", &[4, 4], &f32_bytes(&weights()))]);
    let vmfb = vmfb();
    let threads: Vec<_> = (0..3)
        .map(|t| {
            let (vmfb, path) = (Arc::clone(&vmfb), path.clone());
            thread::spawn(move || {
                let instance = Instance::new().expect("instance");
                let device = instance.device("local-task").expect("device");
                let mut session = Session::new(&instance, &device).expect("session");
                let mut params = Parameters::new("model").expect("params");
                params.add_file(&path).expect("add file");
                session.append_parameters(&[&params]).expect("append parameters");
                session.load_vmfb(&vmfb).expect("load");
                for i in 0..50 {
                    let x = [t as f32, i as f32, 1.0, -1.0];
                    let v = device.upload(&[4], &x).expect("upload");
                    let out = session.call("scaled", &[&v]).expect("call");
                    assert_eq!(out[0].to_vec::<f32>().expect("download"), x.map(|v| 2.0 * v).to_vec());
                }
            })
        })
        .collect();
    for t in threads {
        t.join().expect("thread");
    }
}
