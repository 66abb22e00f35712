//! Keeps the process's own handling of interrupt signals across calls into the compiler.
//!
//! LLVM, inside the compiler library, installs handlers for SIGHUP, SIGINT, SIGTERM and
//! SIGUSR2 the first time it needs them (removing its temporary files, then raising the
//! signal again with the default action: the process dies), and may take SIGPIPE too, which
//! the Rust runtime ignores; all five are kept. A handler installed later
//! through tokio chains to the one it replaced, so a server that had compiled its graphs at
//! start-up died on SIGTERM instead of finishing its requests. Each call into the compiler
//! therefore restores, when it returns, what the process had before it; LLVM registers
//! its handlers once, so they never come back.

#[cfg(unix)]
const SIGNALS: [libc::c_int; 5] = [libc::SIGHUP, libc::SIGINT, libc::SIGTERM, libc::SIGUSR2, libc::SIGPIPE];

/// The dispositions of the interrupt signals when it was made, put back when dropped.
pub(crate) struct Preserved {
    #[cfg(unix)]
    saved: Vec<(libc::c_int, libc::sigaction)>,
}

impl Preserved {
    pub(crate) fn now() -> Preserved {
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
