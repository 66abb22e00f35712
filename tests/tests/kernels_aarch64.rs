//! The aarch64 kernel object (`crates/kernels/cpu/qmv_aarch64.c`, NEON with the dot-product
//! extension) on any host, cross-compiled by clang with the flags build.rs gives it on
//! aarch64 (`kernels::cflags`):
//! - linked by lld with a freestanding driver (`cpu/qmv_qemu_driver.c`) into a static
//!   aarch64 Linux executable, run natively on an aarch64 host, elsewhere under qemu-user as
//!   a Cortex-A76 (ARMv8.2-A with the dot-product extension, so an instruction beyond what
//!   the object is built for would fault): every entry point, at 3, 4, 6 and 8 bits and FP4, f16 and f32
//!   scales, group sizes 16 (3 bits: 32) to 128 and 1, 3, 8 and 13 rows of x (the products with x at 16
//!   bits and, their `_x8` twins, at 8), gives the bits of the Rust
//!   model the x86-64 objects are held to (kernel_cases, kernels.rs), so all objects compute
//!   the same bits; its attention (`attn`) gives `kernels::cpu::attention_model`'s bits on
//!   kernel_cases' attention cases, and its delta rule's step (`delta`) gives
//!   `kernels::cpu::delta_model`'s bits (y and the state it updates) on its delta cases, as
//!   the x86-64 objects do;
//! - linked by IREE into an aarch64 executable from the MLIR `kernels::cpu` writes for it
//!   (the module kernels.rs runs), as on an aarch64 host.

#![allow(clippy::unwrap_used)] // a test that cannot unwrap has failed; helpers included

use iree_compiler::{CompileOptions, Target};
use kernels::cflags;
use kernels::cpu;
use std::sync::OnceLock;

mod kernel_cases;
mod kernel_driver;
use kernel_cases::{ROWS, entries, module};
use kernel_driver::Driver;

/// The kernel object, built as build.rs builds it on aarch64, linked with the driver, run
/// natively on an aarch64 host, elsewhere under qemu-user as a Cortex-A76; built once for
/// the binary's tests.
fn driver() -> &'static Driver {
    static DRIVER: OnceLock<Driver> = OnceLock::new();
    DRIVER.get_or_init(|| {
        let dir = kernel_driver::build_dir("aarch64");
        let object = dir.join("qmv_aarch64.o");
        let flags: Vec<&str> = [cflags::AARCH64_ELF_TARGET].into_iter().chain(cflags::NEON_DOT).collect();
        kernel_driver::compile("qmv_aarch64.c", &flags, &object);
        let runner: &[&str] = if std::env::consts::ARCH == "aarch64" {
            &[]
        } else {
            kernel_driver::require("qemu-aarch64", "qemu-user");
            &["qemu-aarch64", "-cpu", "cortex-a76"]
        };
        Driver::link("neondot", &dir, object, Some(cflags::AARCH64_ELF_TARGET), runner)
    })
}

#[test]
fn the_aarch64_object_computes_the_models_bits() {
    kernel_driver::packed_cases(driver(), &ROWS);
}

/// The attention entry points (cpu/attn.h) of the aarch64 object give kernel_cases' cases
/// the Rust model's bits, as the host's objects do through IREE (kernels.rs).
#[test]
fn the_aarch64_attention_computes_the_models_bits() {
    kernel_driver::attention_cases(driver());
}

/// The delta rule's step (cpu/delta.h) of the aarch64 object gives kernel_cases' delta cases
/// the Rust model's bits, y and the state it updates where it lies.
#[test]
fn the_aarch64_delta_rule_computes_the_models_bits() {
    kernel_driver::delta_cases(driver());
}

/// The dense product and lookup (cpu/hmv.h, f16, bf16 and mxfp8) of the aarch64 object give
/// kernel_cases' cases the Rust model's bits.
#[test]
fn the_aarch64_dense_product_computes_the_models_bits() {
    kernel_driver::dense_cases(driver());
}

/// How many by-element `sdot`/`udot` instructions (`0 Q U 01111 10 L M Rm 1110 H 0 Rn Rd`)
/// `code` holds, read as 32-bit words from its start.
fn dot_instructions(code: &[u8]) -> usize {
    code.chunks_exact(4).filter(|w| u32::from_le_bytes([w[0], w[1], w[2], w[3]]) & 0x9FC0_F400 == 0x0F80_E000).count()
}

/// IREE links the object into an aarch64 executable from the MLIR `kernels::cpu` writes for
/// it (the module kernels.rs runs, compiled here for a generic aarch64 CPU, as
/// `executable_source` keys it on an aarch64 host): the vmfb holds an ELF for machine 183
/// (EM_AARCH64) with every dot-product instruction of the object.
#[test]
fn iree_links_the_aarch64_object() {
    let object = &driver().object;
    let mlir = module(&cpu::executable_source_for("aarch64", object, &entries(), &[], &[], false));
    let target = Target::LlvmCpu { cpu: "generic".into() };
    let options = CompileOptions::default().with_flag("--iree-llvmcpu-target-triple=aarch64-unknown-linux-gnu");
    let vmfb = e2e::compiler().compile(&mlir, &target, &options).unwrap();
    let elf = vmfb.windows(4).position(|w| w == b"\x7fELF").expect("an executable in the vmfb");
    assert_eq!(u16::from_le_bytes([vmfb[elf + 18], vmfb[elf + 19]]), 183, "not an aarch64 ELF");
    let dots = dot_instructions(&std::fs::read(object).unwrap());
    assert!(dots > 0, "no sdot/udot in the object");
    assert!(dot_instructions(&vmfb[elf..]) >= dots, "the executable lacks the object's code");
}
