//! The AMX kernel object (`crates/kernels/cpu/qmv_x86_64_amx.c`) where the host has no AMX:
//! IREE runs it only on a CPU with AMX-INT8 (kernels.rs, `Isa::Amx`), so elsewhere its tile
//! code (the panels of x split into high and low bytes, the weights unpacked into the tile-B
//! layout, the corrections and the two tile sets in turn) would go untested. Here it is
//! built with its tile instructions emulated in plain C as the Intel SDM defines them
//! (`-DMLX_IREE_AMX_EMULATE`, `kernels::cflags::AMX_EMULATED`; shapes the hardware refuses
//! trap), linked with the freestanding driver (`cpu/qmv_qemu_driver.c`) into a static
//! executable and run natively, one thread, on any host with the AVX-512 the object's other
//! code needs (F, BW, VNNI, VBMI, VL): every packed entry point gives the Rust model's bits
//! at every packing, scale and group size, with rows of x that take the tiles (8, 13 and 27:
//! the driver reports the tile products it ran, which must be some), and so do its
//! attention, delta rule and dense product.

#![allow(clippy::unwrap_used)] // a test that cannot unwrap has failed; helpers included

use kernels::cflags;
use std::sync::OnceLock;

mod kernel_cases;
mod kernel_driver;
use kernel_driver::Driver;

/// kernel_cases' rows of x, and more than one pass of the AMX object's `whole_rows` (64
/// rows): 69 (a pass, then a panel of 5) and 76 (a pass, then panels of 8 and 4).
const AMX_ROWS: [usize; 7] = [1, 3, 8, 13, 27, 69, 76];

/// Whether this host runs the emulated object's instructions; if not, says so on stderr.
fn host_runs_it() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        let features = [
            std::arch::is_x86_feature_detected!("avx512f"),
            std::arch::is_x86_feature_detected!("avx512bw"),
            std::arch::is_x86_feature_detected!("avx512vnni"),
            std::arch::is_x86_feature_detected!("avx512vbmi"),
            std::arch::is_x86_feature_detected!("avx512vl"),
            std::arch::is_x86_feature_detected!("fma"),
            std::arch::is_x86_feature_detected!("f16c"),
        ];
        if features.iter().all(|&f| f) {
            return true;
        }
    }
    eprintln!("kernels_amx: this host lacks AVX-512 F, BW, VNNI, VBMI or VL; the emulated AMX object is not run");
    false
}

/// The AMX object with its tiles emulated, linked with the driver; built once for the
/// binary's tests.
fn driver() -> &'static Driver {
    static DRIVER: OnceLock<Driver> = OnceLock::new();
    DRIVER.get_or_init(|| {
        let dir = kernel_driver::build_dir("amx_emulated");
        let object = dir.join("qmv_x86_64_amx_emulated.o");
        let flags: Vec<&str> = cflags::AVX512.into_iter().chain(cflags::AMX_EMULATED).collect();
        kernel_driver::compile("qmv_x86_64_amx.c", &flags, &object);
        Driver::link("amx (emulated)", &dir, object, None, &[])
    })
}

/// The tile products the driver reported ("tile products: N" on stderr).
fn tile_products(stderr: &str) -> u64 {
    let line = stderr.lines().find_map(|l| l.strip_prefix("tile products: "));
    line.and_then(|n| n.trim().parse().ok()).unwrap_or_else(|| panic!("no tile product count in: {stderr}"))
}

#[test]
fn the_amx_object_computes_the_models_bits() {
    if !host_runs_it() {
        return;
    }
    let stderr = kernel_driver::packed_cases(driver(), &AMX_ROWS);
    assert!(tile_products(&stderr) > 0, "the AMX object's tiles never ran: {stderr}");
}

/// The rest of the object (attention, the delta rule's step, the dense product: the AVX-512
/// object's code, built for AMX hosts) gives the model's bits too.
#[test]
fn the_amx_objects_other_kernels_compute_the_models_bits() {
    if !host_runs_it() {
        return;
    }
    kernel_driver::attention_cases(driver());
    kernel_driver::delta_cases(driver());
    kernel_driver::dense_cases(driver());
}
