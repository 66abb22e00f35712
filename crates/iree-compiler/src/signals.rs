//! Keeps the process's own handling of interrupt signals across calls into the compiler.
//!
//! LLVM, inside the compiler library, installs handlers for SIGHUP, SIGINT, SIGTERM and
//! SIGUSR2 the first time it needs them (removing its temporary files, then raising the
//! signal again with the default action: the process dies), and may take SIGPIPE too, which
//! the Rust runtime ignores; all five are kept. A handler installed later
//! through tokio chains to the one it replaced, so a server that had compiled its graphs at
//! start-up died on SIGTERM instead of finishing its requests. Calls into the compiler
//! therefore hold a [`Guard`]: the first of them to start saves the dispositions, and the
//! last one to finish puts them back (compiles run concurrently, and one finishing must
//! neither save LLVM's handlers as the process's nor restore while another may still be
//! installing them). LLVM registers its handlers once, so they never come back.

use std::sync::{Mutex, PoisonError};

#[cfg(unix)]
const SIGNALS: [libc::c_int; 5] = [libc::SIGHUP, libc::SIGINT, libc::SIGTERM, libc::SIGUSR2, libc::SIGPIPE];

/// Calls into the compiler in flight, and the dispositions saved when the first began.
static IN_FLIGHT: Mutex<(usize, Option<Preserved>)> = Mutex::new((0, None));

/// Held for the length of one call into the compiler (see the module docs).
pub(crate) struct Guard(());

impl Guard {
    pub(crate) fn enter() -> Guard {
        let mut state = IN_FLIGHT.lock().unwrap_or_else(PoisonError::into_inner);
        if state.0 == 0 {
            state.1 = Some(Preserved::now());
        }
        state.0 += 1;
        Guard(())
    }
}

impl Drop for Guard {
    fn drop(&mut self) {
        let mut state = IN_FLIGHT.lock().unwrap_or_else(PoisonError::into_inner);
        state.0 -= 1;
        if state.0 == 0 {
            // Dropping restores.
            state.1 = None;
        }
    }
}

/// The dispositions of the interrupt signals when it was made, put back when dropped.
struct Preserved {
    #[cfg(unix)]
    saved: Vec<(libc::c_int, libc::sigaction)>,
}

impl Preserved {
    fn now() -> Preserved {
        #[cfg(unix)]
        {
            let saved = SIGNALS
                .iter()
                .filter_map(|&sig| {
                    // SAFETY: an all-zero sigaction is a valid value of the C struct (no
                    // handler, empty mask), overwritten below.
                    let mut old: libc::sigaction = unsafe { std::mem::zeroed() };
                    // SAFETY: a query (null new action) into a valid out pointer.
                    let ok = unsafe { libc::sigaction(sig, std::ptr::null(), &mut old) } == 0;
                    ok.then_some((sig, old))
                })
                .collect();
            Preserved { saved }
        }
        #[cfg(not(unix))]
        Preserved {}
    }
}

impl Drop for Preserved {
    fn drop(&mut self) {
        #[cfg(unix)]
        for (sig, old) in &self.saved {
            // SAFETY: puts back a disposition sigaction itself returned for this signal.
            unsafe { libc::sigaction(*sig, old, std::ptr::null_mut()) };
        }
    }
}
