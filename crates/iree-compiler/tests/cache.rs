//! The on-disk vmfb cache: miss then hit, key sensitivity, atomic files, corrupt entries.

mod common;

use common::{MODULE, compiler};
use iree_compiler::{CacheOutcome, CompileCache, CompileOptions, Target, check_vmfb};

#[test]
fn miss_then_hit_with_identical_bytes() {
    let c = compiler();
    let dir = tempfile::tempdir().unwrap();
    let cache = CompileCache::new(dir.path().join("nested/cache")).unwrap();
    let target = Target::vulkan("rdna3");
    let opts = CompileOptions::default();

    let first = cache.compile(&c, MODULE, &target, &opts).unwrap();
    assert_eq!(first.outcome, CacheOutcome::Miss);
    assert_eq!(first.key.len(), 64);
    assert!(first.key.bytes().all(|b| b.is_ascii_hexdigit()));
    assert_eq!(first.path, cache.dir().join(format!("{}.vmfb", first.key)));
    assert_eq!(std::fs::read(&first.path).unwrap(), first.vmfb);
    check_vmfb(&first.vmfb).unwrap();

    let second = cache.compile(&c, MODULE, &target, &opts).unwrap();
    assert_eq!(second.outcome, CacheOutcome::Hit);
    assert_eq!(second.key, first.key);
    assert_eq!(second.vmfb, first.vmfb);
    eprintln!("miss {:.3} s, hit {:.6} s", first.elapsed.as_secs_f64(), second.elapsed.as_secs_f64());

    // Only the module file is left: the temporary file was renamed, not copied.
    let names: Vec<String> = std::fs::read_dir(cache.dir())
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    assert_eq!(names, [format!("{}.vmfb", first.key)]);
}

#[test]
fn key_covers_text_flags_and_target() {
    let c = compiler();
    let dir = tempfile::tempdir().unwrap();
    let cache = CompileCache::new(dir.path()).unwrap();
    let t = Target::llvm_cpu_host();
    let base = CompileOptions::default();
    let k = cache.key(&c, MODULE, &t, &base);
    assert_eq!(k, cache.key(&c, MODULE, &t, &base));
    assert_ne!(k, cache.key(&c, MODULE, &t, &base.clone().with_flag("--iree-opt-data-tiling")));
    assert_ne!(k, cache.key(&c, &format!("{MODULE}\n"), &t, &base));
    assert_ne!(k, cache.key(&c, MODULE, &Target::LlvmCpu { cpu: "generic".into() }, &base));
    assert_ne!(
        cache.key(&c, MODULE, &Target::cuda("sm_80"), &base),
        cache.key(&c, MODULE, &Target::cuda("sm_86"), &base)
    );
}

#[test]
fn different_flag_is_a_separate_entry() {
    let c = compiler();
    let dir = tempfile::tempdir().unwrap();
    let cache = CompileCache::new(dir.path()).unwrap();
    let t = Target::llvm_cpu_host();
    let a = cache.compile(&c, MODULE, &t, &CompileOptions::default()).unwrap();
    let tiled = CompileOptions::default().with_flag("--iree-opt-data-tiling");
    let b = cache.compile(&c, MODULE, &t, &tiled).unwrap();
    assert_eq!(a.outcome, CacheOutcome::Miss);
    assert_eq!(b.outcome, CacheOutcome::Miss);
    assert_ne!(a.key, b.key);
    assert_eq!(cache.compile(&c, MODULE, &t, &tiled).unwrap().outcome, CacheOutcome::Hit);
    assert_eq!(cache.compile(&c, MODULE, &t, &CompileOptions::default()).unwrap().outcome, CacheOutcome::Hit);
}

#[test]
fn corrupt_entry_is_recompiled() {
    let c = compiler();
    let dir = tempfile::tempdir().unwrap();
    let cache = CompileCache::new(dir.path()).unwrap();
    let t = Target::Metal;
    let opts = CompileOptions::default();
    let good = cache.compile(&c, MODULE, &t, &opts).unwrap();
    std::fs::write(&good.path, &good.vmfb[..10]).unwrap();
    let again = cache.compile(&c, MODULE, &t, &opts).unwrap();
    assert_eq!(again.outcome, CacheOutcome::Miss);
    assert_eq!(again.vmfb, good.vmfb);
    assert_eq!(std::fs::read(&again.path).unwrap(), good.vmfb);
}

#[test]
fn failed_compile_stores_nothing() {
    let c = compiler();
    let dir = tempfile::tempdir().unwrap();
    let cache = CompileCache::new(dir.path()).unwrap();
    let err = cache.compile(&c, "func.func @f(", &Target::llvm_cpu_host(), &CompileOptions::default()).unwrap_err();
    assert!(err.diagnostics().is_some(), "{err}");
    assert_eq!(std::fs::read_dir(cache.dir()).unwrap().count(), 0);
}

#[test]
fn lookup_finds_what_a_remembered_compiler_stored() {
    let c = compiler();
    let dir = tempfile::tempdir().unwrap();
    let cache = CompileCache::new(dir.path()).unwrap();
    let t = Target::cuda("sm_80");
    let opts = CompileOptions::default();
    // The key of a compiler known only by its identity is the key of that compiler.
    assert_eq!(cache.key_for(&c.identity(), MODULE, &t, &opts), cache.key(&c, MODULE, &t, &opts));
    assert!(cache.lookup(MODULE, &t, &opts).unwrap().is_none(), "an empty cache has nothing");

    let stored = cache.compile(&c, MODULE, &t, &opts).unwrap();
    cache.remember(&c).unwrap();
    cache.remember(&c).unwrap(); // idempotent
    let records: Vec<_> = std::fs::read_dir(cache.dir().join("compilers")).unwrap().collect();
    assert_eq!(records.len(), 1, "one record per compiler library");
    let found = cache.lookup(MODULE, &t, &opts).unwrap().expect("a hit without compiling");
    assert_eq!(found.outcome, CacheOutcome::Hit);
    assert_eq!((found.key, found.vmfb), (stored.key, stored.vmfb));
    assert!(cache.lookup(MODULE, &Target::cuda("sm_86"), &opts).unwrap().is_none(), "other flags: not found");
}

/// A module whose 64x64 weight is a parameter: data tiling repacks it, so the encoder split
/// out of it has work to do.
const PARAM_MODULE: &str = r#"
util.global private @w = #stream.parameter.named<"model"::"w"> : tensor<64x64xf32>
func.func @mv(%x: tensor<64xf32>) -> tensor<64xf32> {
  %w = util.global.load @w : tensor<64x64xf32>
  %0 = stablehlo.dot_general %w, %x, contracting_dims = [1] x [0] : (tensor<64x64xf32>, tensor<64xf32>) -> tensor<64xf32>
  return %0 : tensor<64xf32>
}
"#;

#[test]
fn parameter_encoder_is_stored_beside_its_module() {
    let c = compiler();
    let dir = tempfile::tempdir().unwrap();
    let cache = CompileCache::new(dir.path()).unwrap();
    let t = Target::llvm_cpu_host();
    let tiled = CompileOptions::default().with_flag("--iree-global-opt-data-tiling");
    let split = tiled.clone().with_parameter_encoder();
    // The split is part of the key, the encoder's temporary output file is not.
    assert_ne!(cache.key(&c, PARAM_MODULE, &t, &tiled), cache.key(&c, PARAM_MODULE, &t, &split));

    let first = cache.compile(&c, PARAM_MODULE, &t, &split).unwrap();
    assert_eq!(first.outcome, CacheOutcome::Miss);
    let encoder = first.encoder.clone().expect("an encoder module");
    check_vmfb(&encoder).unwrap();
    assert_eq!(std::fs::read(cache.encoder_path_for(&first.key)).unwrap(), encoder);
    let hit = cache.lookup(PARAM_MODULE, &t, &split).unwrap().expect("hit");
    assert_eq!((hit.vmfb, hit.encoder), (first.vmfb.clone(), Some(encoder)));
    // Without its encoder an entry is incomplete: compiled again.
    std::fs::remove_file(cache.encoder_path_for(&first.key)).unwrap();
    assert!(cache.lookup(PARAM_MODULE, &t, &split).unwrap().is_none());
    let again = cache.compile(&c, PARAM_MODULE, &t, &split).unwrap();
    assert_eq!(again.outcome, CacheOutcome::Miss);
    assert!(again.encoder.is_some());
    // Options without the split never carry an encoder.
    assert!(cache.compile(&c, PARAM_MODULE, &t, &tiled).unwrap().encoder.is_none());
}

/// A compile that finds its key's lock file locked (another process compiling that key, as
/// when test binaries share a cache side by side) waits for the lock, then reads the module
/// the other process stored instead of compiling it again; the lock file is gone after.
#[test]
fn a_compile_waits_for_another_process_compiling_the_key() {
    let c = compiler();
    let dir = tempfile::tempdir().unwrap();
    let cache = CompileCache::new(dir.path().join("shared")).unwrap();
    let (target, opts) = (Target::llvm_cpu_host(), CompileOptions::default());
    // What the other process will store, compiled beforehand in a folder of its own.
    let theirs = CompileCache::new(dir.path().join("theirs")).unwrap().compile(&c, MODULE, &target, &opts).unwrap();
    let key = cache.key(&c, MODULE, &target, &opts);
    assert_eq!(key, theirs.key);

    // The other process's lock (a lock on a second open file conflicts as one from another
    // process does).
    let lock_path = cache.dir().join(format!("{key}.lock"));
    let lock = std::fs::File::create(&lock_path).unwrap();
    lock.lock().unwrap();
    let waiting = {
        let (cache, target, opts) = (cache.clone(), target.clone(), opts.clone());
        std::thread::spawn(move || cache.compile(&compiler(), MODULE, &target, &opts).unwrap())
    };
    std::thread::sleep(std::time::Duration::from_millis(1500));
    assert!(!waiting.is_finished(), "the compile did not wait for the other process's lock");
    std::fs::write(cache.path_for(&key), &theirs.vmfb).unwrap();
    drop(lock);

    let ours = waiting.join().expect("the waiting compile panicked");
    assert_eq!(ours.outcome, CacheOutcome::Hit);
    assert_eq!(ours.vmfb, theirs.vmfb);
    assert!(!lock_path.exists(), "lock file left behind");
}
