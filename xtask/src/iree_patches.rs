//! Source patches to the pinned IREE runtime, applied by `build-iree` before it builds.
//!
//! Each patch is a set of literal replacements with the reason beside it. Applying is
//! idempotent (a file already patched is left alone, untouched, so ninja rebuilds nothing),
//! and a file that holds neither the original nor the patched text stops the build with the
//! file and patch named: the patches are written against `third_party/pins.toml`'s runtime
//! and nothing else. A source given through `IREE_SOURCE_DIR` is somebody's checkout and is
//! never edited. The patched set's fingerprint goes into the build's stamp, so a new or
//! changed patch rebuilds the runtime.

use anyhow::{Context, Result, bail};
use std::path::Path;

pub struct Patch {
    pub name: &'static str,
    /// Relative to the IREE source root.
    pub file: &'static str,
    /// (original, replacement) pairs; each original occurs exactly once in the pinned file.
    pub edits: &'static [(&'static str, &'static str)],
}

pub const PATCHES: &[Patch] = &[
    // iree_async_semaphore_multi_wait, once woken, spins with `pause` until the signalling
    // thread marks its callback done. The signaller wakes the waiter first, and on a machine
    // with no idle core (IREE starts a worker per core, and the caller is one more thread) the
    // woken waiter preempts it and spins out its time slice: 1.9 ms of every SmolLM2 decode
    // step on 2 cores (docs/PERFORMANCE.md). After a short spin the patched loop yields the
    // CPU, so the signaller finishes.
    Patch {
        name: "multi-wait-yield",
        file: "runtime/src/iree/async/semaphore.c",
        edits: &[
            (
                "#include \"iree/base/threading/processor.h\"\n",
                "#include \"iree/base/threading/processor.h\"\n#include \"iree/base/threading/thread.h\"  // mlx-iree patch\n",
            ),
            (
                "        while (!iree_atomic_load(&timepoints[i].completed,
                                 iree_memory_order_acquire)) {
          iree_processor_yield();
        }",
                "        // mlx-iree patch (multi-wait-yield): the callback's thread may be the
        // one this thread's wake-up preempted, so after a short spin give the
        // CPU away rather than pause out the time slice.
        for (int spins = 0; !iree_atomic_load(&timepoints[i].completed,
                                              iree_memory_order_acquire);
             ++spins) {
          if (spins < 64) {
            iree_processor_yield();
          } else {
            iree_thread_yield();
          }
        }",
            ),
        ],
    },
    // The CPU device serves queue allocations (a call's transient arena, results) from
    // slabs of 64 MiB it keeps, and anything larger from fresh memory on every call: the
    // system allocator maps it anew, so every call faults in and zeroes every page of it.
    // A step of several sequences of a recurrent model packs more than that into its
    // arena (the 0.8B Qwen3.5 shape at 8 rows: half its step went to page faults,
    // docs/PERFORMANCE.md). Slabs of 1 GiB keep such arenas too; a slab is address space
    // until its pages are first touched, and touched pages stay for the next call.
    Patch {
        name: "task-device-1gib-slabs",
        file: "runtime/src/iree/hal/drivers/local_task/task_device.c",
        edits: &[(
            "#define IREE_HAL_TASK_DEVICE_DEFAULT_POOL_RANGE_LENGTH_DEFAULT \\\n  (64 * 1024 * 1024)\n",
            "#define IREE_HAL_TASK_DEVICE_DEFAULT_POOL_RANGE_LENGTH_DEFAULT \\\n  (1024 * 1024 * 1024)  // mlx-iree patch (task-device-1gib-slabs)\n",
        )],
    },
];

/// The fingerprint of `patches` (names and texts), for the build stamp.
pub fn fingerprint(patches: &[Patch]) -> String {
    let mut text = String::new();
    for p in patches {
        text.push_str(p.name);
        text.push('\n');
        text.push_str(p.file);
        for (before, after) in p.edits {
            text.push_str(before);
            text.push('\0');
            text.push_str(after);
        }
    }
    crate::util::sha256_hex(text.as_bytes())[..16].to_owned()
}

/// Applies `patches` to the source tree at `src`; returns the names of those it changed
/// a file for (none when all were applied before).
pub fn apply(src: &Path, patches: &[Patch]) -> Result<Vec<&'static str>> {
    let mut changed = Vec::new();
    for p in patches {
        let path = src.join(p.file);
        let text = std::fs::read_to_string(&path)
            .with_context(|| format!("IREE patch `{}`: reading {}", p.name, path.display()))?;
        let mut patched = text.clone();
        for (i, (before, after)) in p.edits.iter().enumerate() {
            if patched.contains(after) {
                continue;
            }
            match patched.matches(before).count() {
                1 => patched = patched.replacen(before, after, 1),
                n => bail!(
                    "IREE patch `{}` does not apply to {} (edit {} of {}: its original text occurs {n} times, \
                     expected once): the source is not the pinned runtime",
                    p.name,
                    path.display(),
                    i + 1,
                    p.edits.len()
                ),
            }
        }
        if patched != text {
            std::fs::write(&path, patched).with_context(|| format!("writing {}", path.display()))?;
            changed.push(p.name);
        }
    }
    Ok(changed)
}

#[cfg(test)]
mod tests {
    use super::*;

    const TEST: &[Patch] =
        &[Patch { name: "t", file: "a/b.c", edits: &[("int x = 1;\n", "int x = 2;\n"), ("f();\n", "g();\n")] }];

    /// A fresh tree holding `a/b.c`, one folder per test.
    fn tree(test: &str, text: &str) -> std::path::PathBuf {
        let dir = std::env::temp_dir().join(format!("xtask-iree-patches-{}-{test}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(dir.join("a")).unwrap();
        std::fs::write(dir.join("a/b.c"), text).unwrap();
        dir
    }

    #[test]
    fn applies_once_then_leaves_the_file_alone() {
        let dir = tree("once", "int x = 1;\nf();\nend\n");
        assert_eq!(apply(&dir, TEST).unwrap(), ["t"]);
        assert_eq!(std::fs::read_to_string(dir.join("a/b.c")).unwrap(), "int x = 2;\ng();\nend\n");
        assert!(apply(&dir, TEST).unwrap().is_empty());
        assert_eq!(std::fs::read_to_string(dir.join("a/b.c")).unwrap(), "int x = 2;\ng();\nend\n");
    }

    #[test]
    fn a_different_source_is_refused_by_name() {
        let dir = tree("refused", "int x = 3;\nf();\n");
        let err = apply(&dir, TEST).unwrap_err().to_string();
        assert!(err.starts_with("IREE patch `t` does not apply to "), "{err}");
        assert!(err.contains("a/b.c (edit 1 of 2: its original text occurs 0 times, expected once)"), "{err}");
        // Nothing half-applied.
        assert_eq!(std::fs::read_to_string(dir.join("a/b.c")).unwrap(), "int x = 3;\nf();\n");
    }

    #[test]
    fn the_fingerprint_follows_the_text() {
        const OTHER: &[Patch] = &[Patch { name: "t", file: "a/b.c", edits: &[("int x = 1;\n", "int x = 4;\n")] }];
        assert_eq!(fingerprint(TEST), fingerprint(TEST));
        assert_ne!(fingerprint(TEST), fingerprint(OTHER));
        assert_eq!(fingerprint(TEST).len(), 16);
    }
}
