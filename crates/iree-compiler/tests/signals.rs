//! A compile leaves the process's signal handling as it found it: LLVM's handlers inside
//! the compiler library re-raise SIGTERM with the default action, which killed a server
//! that had compiled at start-up instead of letting it drain (signals.rs). Its own
//! process, so nothing else here compiles first.

#![cfg(unix)]

mod common;

use common::{MODULE, compiler};
use iree_compiler::{CompileOptions, Target};

/// The handler address (or SIG_DFL / SIG_IGN) of `sig` now.
fn handler(sig: libc::c_int) -> libc::sighandler_t {
    // SAFETY: an all-zero sigaction is a valid value of the C struct, overwritten below.
    let mut now: libc::sigaction = unsafe { std::mem::zeroed() };
    // SAFETY: a query (null new action) into a valid out pointer.
    assert_eq!(unsafe { libc::sigaction(sig, std::ptr::null(), &mut now) }, 0);
    now.sa_sigaction
}

#[test]
fn a_compile_keeps_the_process_signal_handlers() {
    let signals = [libc::SIGHUP, libc::SIGINT, libc::SIGTERM, libc::SIGUSR2, libc::SIGPIPE];
    // The default action for the four LLVM takes (a shell may start us with SIGHUP or SIGINT
    // ignored, as `nohup` and background jobs do); the Rust runtime ignores SIGPIPE.
    for sig in &signals[..4] {
        // SAFETY: installs the default disposition; no handler code is involved.
        assert_ne!(unsafe { libc::signal(*sig, libc::SIG_DFL) }, libc::SIG_ERR);
    }
    let before: Vec<_> = signals.iter().map(|&s| handler(s)).collect();
    assert_eq!(before, [libc::SIG_DFL, libc::SIG_DFL, libc::SIG_DFL, libc::SIG_DFL, libc::SIG_IGN]);
    let compile = || compiler().compile(MODULE, &Target::llvm_cpu_host(), &CompileOptions::default()).unwrap();
    // The first compiles of the process (when LLVM installs its handlers) on three threads
    // at once, then one alone: compiles overlap, and none may restore while another runs.
    let threads: Vec<_> = (0..3).map(|_| std::thread::spawn(compile)).collect();
    for t in threads {
        t.join().expect("a compile thread panicked");
    }
    let after: Vec<_> = signals.iter().map(|&s| handler(s)).collect();
    assert_eq!(after, before, "handlers of SIGHUP, SIGINT, SIGTERM, SIGUSR2, SIGPIPE changed by concurrent compiles");
    compile();
    let after: Vec<_> = signals.iter().map(|&s| handler(s)).collect();
    assert_eq!(after, before, "handlers of SIGHUP, SIGINT, SIGTERM, SIGUSR2, SIGPIPE changed by a compile");
}
