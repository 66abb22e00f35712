//! Every function the engine compiles records its command buffer once, when the module
//! loads, and replays it each call: on the CPU and on CUDA, through the hand-written
//! kernels and without them (one known exception, below). A kernel export whose bindings are not `Indirect` made IREE
//! record the whole step again on every call (`kernels::pipeline_layout`).

#![allow(clippy::unwrap_used)] // a test that cannot unwrap has failed; helpers included

mod common;

use common::planned;
use engine::{CompileTarget, KernelSetting, KvElem, Precision};

use iree_compiler::recorded_per_call;

/// The functions of the modules the engine compiles for fixture `variant` of the llama
/// family at `precision` for `target` that record a command buffer on each call, but for
/// the copy between slots (planned on the CPU only): it copies from a run-time offset, so
/// it records on each call, which is once per 128 positions of a prompt start the prefix
/// cache copies, not once per step.
fn recorded_per_call_for(variant: &str, precision: Precision, target: CompileTarget) -> Vec<String> {
    let (backend, modules) =
        planned("llama_llama3_tied", variant, precision, &target, KernelSetting::Auto, 2, KvElem::F32);
    let mut found = Vec::new();
    let mut copies = 0;
    for m in modules {
        let vm = backend.compile_to_ir(&m, "vm").unwrap();
        assert!(vm.contains("@hal.command_buffer.create("), "{}: no command buffer at all", m.what);
        for f in recorded_per_call(&vm) {
            if f == "copy_kv_p64" {
                copies += 1;
            } else {
                found.push(format!("{}: {f}", m.what));
            }
        }
    }
    assert_eq!(copies, usize::from(target.is_cpu()), "the copy between slots: on the CPU only");
    found
}

/// Packed through the CPU kernel (matvecs and decode attention as external calls).
#[test]
fn cpu_packed_steps_are_recorded_once() {
    assert_eq!(recorded_per_call_for("q4", Precision::Packed, CompileTarget::HostCpu), Vec::<String>::new());
}

/// f16 through the CPU kernels (the f16 product, decode attention as external calls).
#[test]
fn cpu_f16_steps_are_recorded_once() {
    assert_eq!(recorded_per_call_for("f32", Precision::F16, CompileTarget::HostCpu), Vec::<String>::new());
}

/// All but one without a kernel (f32): on the CPU a single-row decode on a cache of several
/// slots slices its slot's window at an offset the host reads each call (`SlotRead::Slice`,
/// chosen over a gather that IREE copies element by element), so that one function is
/// recorded per call.
#[test]
fn cpu_f32_steps_are_recorded_once_but_the_sliced_decode() {
    let found = recorded_per_call_for("f32", Precision::F32, CompileTarget::HostCpu);
    assert_eq!(found.len(), 1, "{found:?}");
    assert!(found[0].ends_with(": decode_b1_w64"), "{found:?}");
}

/// Packed through the CUDA kernel: before its bindings were `Indirect`, the VM recorded a
/// 1B-shape decode step's 261 dispatches on every call.
#[test]
fn cuda_packed_steps_are_recorded_once() {
    assert_eq!(
        recorded_per_call_for("q4", Precision::Packed, CompileTarget::Cuda("sm_80".into())),
        Vec::<String>::new()
    );
}

#[test]
fn cuda_f16_steps_are_recorded_once() {
    assert_eq!(recorded_per_call_for("f32", Precision::F16, CompileTarget::Cuda("sm_80".into())), Vec::<String>::new());
}
