//! Exercises every wrapper type once (instance → device → parameters →
//! session → module → call → download, plus the error paths) and drops
//! everything; run under valgrind by the `leak_check` test to prove no
//! definite leaks. Calls run on `local-sync`, on the calling thread (the
//! process's `local-task` driver, made with the instance, only idles). The
//! runtime instance and drivers live until exit by design, so valgrind counts
//! them as still reachable, never as lost.
//!
//! Usage: leakcheck <matvec-with-parameter.vmfb> <weights.safetensors>
//! [<encoder.vmfb> <split-matvec.vmfb> <scratch.irpa>]
//! (the vmfb reads `model::w` 4x4 f32 and exports `matvec`; with the optional
//! three, the same module compiled with its parameter encoder split out: the
//! encoder writes the archive, which is then mapped and bound to the split module,
//! whose result is printed as well).
//!
//! On Linux it first denies `io_uring_setup` (see [`deny_io_uring`]) so that
//! it can run under valgrind at all.

use std::process::ExitCode;

use iree_hal::{Instance, Module, Parameters, Session};

fn run(vmfb: &str, safetensors: &str) -> Result<Vec<f32>, iree_hal::Error> {
    let instance = Instance::new()?;
    let drivers = instance.drivers()?;
    println!("drivers: {}", drivers.iter().map(|d| d.name.as_str()).collect::<Vec<_>>().join(", "));
    let device = instance.device("local-sync")?;

    // Error paths must not leak either.
    assert!(instance.device("no-such-driver").is_err());
    assert!(Module::from_bytes(&instance, &[0xAB; 256]).is_err());

    let mut from_file = Parameters::new("model")?;
    from_file.add_file(safetensors)?;
    let mut from_host = Parameters::new("host")?;
    from_host.add_tensor("unused", &[1, 2, 3, 4])?;

    let mut session = Session::new(&instance, &device)?;
    session.append_parameters(&[&from_file, &from_host])?;
    let module = Module::from_file(&instance, vmfb)?;
    session.append_module(&module)?;
    assert!(session.call("module.missing", &[]).is_err());

    let x = device.upload(&[4], &[1.0f32, 2.0, 3.0, 4.0])?;
    let y = session.call("matvec", &[&x])?;
    let copy = y[0].clone();
    copy.to_vec::<f32>()
}

/// The encoder path: encode `model::w` from the safetensors file into `irpa`, bind the
/// archive mapped, call the split module. Also an encoder error path.
fn run_encoded(safetensors: &str, encoder: &str, split: &str, irpa: &str) -> Result<Vec<f32>, iree_hal::Error> {
    let instance = Instance::new()?;
    let device = instance.device("local-sync")?;
    let mut model = Parameters::new("model")?;
    model.add_file(safetensors)?;
    let encoder = std::fs::read(encoder).map_err(|source| iree_hal::Error::Io { path: encoder.into(), source })?;
    assert!(iree_hal::encode_parameters(&instance, &device, &[0xAB; 256], &[&model], irpa.as_ref()).is_err());
    let report = iree_hal::encode_parameters(&instance, &device, &encoder, &[&model], irpa.as_ref())?;
    drop(model);
    let mut encoded = Parameters::new(&report.scope)?;
    encoded.add_file_mapped(irpa)?;
    let mut session = Session::new(&instance, &device)?;
    session.append_parameters(&[&encoded])?;
    session.load_vmfb_file(split)?;
    let x = device.upload(&[4], &[1.0f32, 2.0, 3.0, 4.0])?;
    session.call("matvec", &[&x])?[0].to_vec::<f32>()
}

/// Makes `io_uring_setup` fail with EPERM for this process (seccomp filter).
///
/// Why: every IREE device owns an async proactor whose runner thread blocks in
/// `io_uring_enter`. Valgrind (3.19) executes that syscall while holding its
/// global lock, so the whole process freezes. With io_uring denied, IREE falls
/// back to its POSIX (poll-based) proactor, exactly as on kernels where
/// io_uring is disabled, and valgrind runs it normally.
#[cfg(target_os = "linux")]
fn deny_io_uring() -> Result<(), String> {
    #[repr(C)]
    struct SockFilter {
        code: u16,
        jt: u8,
        jf: u8,
        k: u32,
    }
    #[repr(C)]
    struct SockFprog {
        len: u16,
        filter: *const SockFilter,
    }
    unsafe extern "C" {
        fn prctl(option: i32, arg2: usize, arg3: usize, arg4: usize, arg5: usize) -> i32;
    }
    const IO_URING_SETUP: u32 = 425; // Same number on x86_64 and aarch64.
    const PR_SET_NO_NEW_PRIVS: i32 = 38;
    const PR_SET_SECCOMP: i32 = 22;
    const SECCOMP_MODE_FILTER: usize = 2;
    const EPERM: u32 = 1;
    let filter = [
        // A = seccomp_data.nr
        SockFilter { code: 0x20, jt: 0, jf: 0, k: 0 },
        // if A == io_uring_setup fall through, else skip one
        SockFilter { code: 0x15, jt: 0, jf: 1, k: IO_URING_SETUP },
        // return SECCOMP_RET_ERRNO | EPERM
        SockFilter { code: 0x06, jt: 0, jf: 0, k: 0x0005_0000 | EPERM },
        // return SECCOMP_RET_ALLOW
        SockFilter { code: 0x06, jt: 0, jf: 0, k: 0x7fff_0000 },
    ];
    let program = SockFprog { len: filter.len() as u16, filter: filter.as_ptr() };
    // SAFETY: PR_SET_NO_NEW_PRIVS takes plain integers and only restricts
    // this process.
    if unsafe { prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) } != 0 {
        return Err("prctl(PR_SET_NO_NEW_PRIVS) failed".to_owned());
    }
    // SAFETY: `program` points at a valid BPF program that outlives the call
    // (the kernel copies it); the filter only turns io_uring_setup into EPERM.
    if unsafe { prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, (&program as *const SockFprog).addr(), 0, 0) } != 0 {
        return Err("prctl(PR_SET_SECCOMP) failed".to_owned());
    }
    Ok(())
}

#[cfg(not(target_os = "linux"))]
fn deny_io_uring() -> Result<(), String> {
    Ok(())
}

fn main() -> ExitCode {
    if let Err(err) = deny_io_uring() {
        eprintln!("error: {err}");
        return ExitCode::FAILURE;
    }
    let args: Vec<String> = std::env::args().collect();
    let (vmfb, safetensors, encoded) = match args.as_slice() {
        [_, vmfb, safetensors] => (vmfb, safetensors, None),
        [_, vmfb, safetensors, encoder, split, irpa] => (vmfb, safetensors, Some((encoder, split, irpa))),
        _ => {
            eprintln!(
                "usage: leakcheck <matvec.vmfb> <weights.safetensors> [<encoder.vmfb> <split-matvec.vmfb> <scratch.irpa>]"
            );
            return ExitCode::from(2);
        }
    };
    let result = run(vmfb, safetensors).and_then(|y| {
        let encoded = match encoded {
            Some((encoder, split, irpa)) => Some(run_encoded(safetensors, encoder, split, irpa)?),
            None => None,
        };
        Ok((y, encoded))
    });
    match result {
        Ok((y, encoded)) => {
            println!("result: {y:?}");
            if let Some(e) = encoded {
                println!("encoded result: {e:?}");
            }
            ExitCode::SUCCESS
        }
        Err(err) => {
            eprintln!("error: {err}");
            ExitCode::FAILURE
        }
    }
}
