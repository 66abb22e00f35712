//! The modules an engine compiles for a plan and target ([`graph_modules`]), the device layout
//! of a checkpoint ([`layout_for`]), and compiling them through the cache.

use crate::cache::{self, CompileReport};
use crate::{CpuKernels, EngineConfig, Error, Plan, Precision, Result};
use iree_compiler::CompileOptions;
use models::{Function, Layout, ModelConfig};
use std::path::Path;
use weights::Checkpoint;

/// One compiled module of a model: which functions it holds and how it is compiled.
#[derive(Debug, Clone)]
pub struct GraphModule {
    /// For progress lines, e.g. "llama f16 decode graph (...)".
    pub what: String,
    pub functions: Vec<Function>,
    pub mlir: String,
    pub options: CompileOptions,
}

/// The modules an engine compiles for `target`. On CPU every function shares one module
/// compiled with data tiling on IREE's global-optimization path and microkernels: the weights
/// are constant globals, so IREE repacks them into the layouts its matrix microkernels read,
/// and prefill, batched and single-row decode all read that one copy (docs/PERFORMANCE.md,
/// "Data tiling"). The repacking is split out into a parameter encoder module, run once per
/// module and checkpoint ([`cache::stored_parameters`]): the module itself reads the
/// repacked weights from a file, so a load neither repacks nor holds the checkpoint's
/// copy beside the repacked one (docs/PERFORMANCE.md, "Peak RSS"). The default data-tiling path
/// (`--iree-opt-data-tiling`, which picks the dispatch-creation path) crashes IREE 3.13's
/// compiler on prefill and several-row decode (a segmentation fault in
/// MaterializeDeviceEncodingPass); the global-optimization path compiles them.
pub fn graph_modules(
    cfg: &ModelConfig,
    layout: &Layout,
    plan: &Plan,
    target: &iree_compiler::Target,
) -> Result<Vec<GraphModule>> {
    let options = match target {
        // The graph-level packed form's i16 weights blow IREE 3.13's vector-size limit when
        // data-tiled ("One or more operations with large vector sizes"): default flags then.
        iree_compiler::Target::LlvmCpu { .. } if !layout.has_graph_packing() => CompileOptions::default()
            .with_flag("--iree-global-opt-data-tiling")
            .with_flag("--iree-llvmcpu-enable-ukernels=all")
            .with_parameter_encoder(),
        _ => CompileOptions::default(),
    };
    let c = plan.cache;
    // A single-row decode on a cache of several slots reads its window with a slice at the
    // slot on CPU (IREE copied a gathered window element by element; the slice offset's trip
    // to the host is free there) and with a gather elsewhere (on a GPU that trip costs a
    // round trip per call, BRIEF 7).
    let cpu = matches!(target, iree_compiler::Target::LlvmCpu { .. });
    let emit = models::graph::EmitOptions {
        slot_read: if cpu { models::graph::SlotRead::Slice } else { models::graph::SlotRead::Gather },
        expert_products: if cpu {
            models::graph::ExpertProducts::Contraction
        } else {
            models::graph::ExpertProducts::Reduction
        },
        packed_products: if target.is_spirv() {
            models::graph::PackedProducts::Dequantized
        } else {
            models::graph::PackedProducts::IntegerGroups
        },
    };
    let functions = plan.functions();
    let mlir = models::graph::emit_functions_with(cfg, layout, c, &functions, None, emit)?;
    let what = format!(
        "{} {} prefill+decode graphs ({} functions; {} slots x {} positions, {} KV cache)",
        cfg.model_type,
        layout.precision(),
        functions.len(),
        c.slots,
        c.positions,
        c.elem
    );
    Ok(vec![GraphModule { what, functions, mlir, options }])
}

/// The device layout of `precision` for this checkpoint and target. Packed matrices, and at
/// `f16`, `bf16` (or `packed`) the dense ones, use the hand-written CPU kernels that `kernels` picks
/// (`kernels::cpu`, the object installed into `cache_dir`) on an `llvm-cpu` target, and the CUDA kernel (`kernels::cuda`, its PTX in
/// the module) on `cuda` unless `kernels` is `Off`; elsewhere, or with none, they use the
/// graph form.
/// SPIR-V targets get the layout's SPIR-V form (`Layout::for_spirv`). Forcing an
/// instruction set the host lacks is `Error::KernelIsa`, whatever the target.
pub fn layout_for(
    cfg: &ModelConfig,
    precision: Precision,
    ckpt: &Checkpoint,
    target: &iree_compiler::Target,
    kernels: CpuKernels,
    cache_dir: &Path,
) -> Result<Layout> {
    let isa = kernels.isa_for(target)?;
    let layout = Layout::new(cfg, precision, ckpt)?;
    if target.is_spirv() {
        return Ok(layout.for_spirv());
    }
    if matches!(target, iree_compiler::Target::Cuda { .. }) && kernels != CpuKernels::Off {
        return Ok(layout.with_cuda_kernel(cfg));
    }
    // The kernels take packed matrices and dense f16 and bf16 ones (not f32).
    let Some(isa) = isa.filter(|_| precision != Precision::F32) else { return Ok(layout) };
    let dir = cache_dir.join("kernels");
    match kernels::cpu::install(&dir, isa) {
        Ok(Some(object)) => Ok(layout.with_cpu_kernels(cfg, &object)),
        Ok(None) => Ok(layout),
        Err(source) => Err(Error::KernelObject { dir, source }),
    }
}

/// Every module of `plan` compiled (or found in the cache), with what each is, and the
/// compile report of them all.
pub(crate) fn compile_modules(
    cfg: &ModelConfig,
    layout: &Layout,
    plan: &Plan,
    target: &iree_compiler::Target,
    config: &EngineConfig,
) -> Result<(Vec<(String, cache::CompiledModule)>, CompileReport)> {
    let mut modules = graph_modules(cfg, layout, plan, target)?;
    let (compiled, report) = compile_graph_modules(&mut modules, target, config)?;
    Ok((modules.into_iter().map(|m| m.what).zip(compiled).collect(), report))
}

/// `modules` (from [`graph_modules`]) compiled for `target` through `config`'s cache, as a
/// load compiles them (the parameter encoder only where `config` stores parameters; it is
/// set off in `modules` otherwise), and the compile report of them all.
pub fn compile_graph_modules(
    modules: &mut [GraphModule],
    target: &iree_compiler::Target,
    config: &EngineConfig,
) -> Result<(Vec<cache::CompiledModule>, CompileReport)> {
    let mut compiled = Vec::new();
    let mut report = CompileReport::CacheHit;
    for module in modules {
        module.options.parameter_encoder &= config.store_parameters;
        let c = cache::compile_module(
            &config.cache_dir,
            &module.what,
            &module.mlir,
            target,
            &module.options,
            config.dump_mlir,
        )?;
        report = report.and(c.report);
        compiled.push(c);
    }
    Ok((compiled, report))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cfg() -> ModelConfig {
        let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures/qwen2/f32");
        ModelConfig::from_file(&dir.join("config.json")).unwrap()
    }

    fn config(max_batch: usize, max_context: Option<usize>) -> EngineConfig {
        EngineConfig { max_batch, max_context, ..EngineConfig::new("local-task", Precision::F32, "/nonexistent") }
    }

    #[test]
    fn single_row_decode_slices_its_slot_on_cpu_only() {
        let (c, layout) = (cfg(), Layout::dense(Precision::F32));
        let plan = Plan::new(&c, &config(4, Some(64))).unwrap();
        let text = |target: &iree_compiler::Target| -> String {
            graph_modules(&c, &layout, &plan, target).unwrap().iter().map(|m| m.mlir.clone()).collect()
        };
        assert!(text(&iree_compiler::Target::llvm_cpu_host()).contains("stablehlo.dynamic_slice"));
        assert!(!text(&iree_compiler::Target::cuda("sm_80")).contains("stablehlo.dynamic_slice"));
    }
}
