//! The modules an engine compiles ([`GraphModule`], from [`crate::Backend::graph_modules`])
//! and compiling them through the cache.

use crate::cache::{self, CompileReport};
use crate::{Backend, EngineConfig, Plan, Result};
use iree_compiler::CompileOptions;
use models::{Function, Layout, ModelConfig};

/// One module of a model: which functions it holds, its MLIR and how it is compiled.
#[derive(Debug, Clone)]
pub struct GraphModule {
    /// For progress lines, e.g. "llama f16 decode graph (...)".
    pub what: String,
    pub functions: Vec<Function>,
    pub mlir: String,
    pub(crate) options: CompileOptions,
}

impl GraphModule {
    /// The compile options as text (their `Debug` form), for logs and for tests that pin
    /// what a module is compiled with.
    pub fn options_text(&self) -> String {
        format!("{:?}", self.options)
    }
}

/// Every module of `plan` compiled (or found in the cache), with what each is, and the
/// compile report of them all.
pub(crate) fn compile_modules(
    cfg: &ModelConfig,
    layout: &Layout,
    plan: &Plan,
    backend: &Backend,
    config: &EngineConfig,
) -> Result<(Vec<(String, cache::CompiledModule)>, CompileReport)> {
    let modules = backend.graph_modules(cfg, layout, plan)?;
    let mut compiled = Vec::new();
    let mut report = CompileReport::CacheHit;
    for mut module in modules {
        // The parameter encoder only where `config` stores parameters.
        module.options.parameter_encoder &= config.store_parameters;
        let c = cache::compile_module(
            &config.cache_dir,
            &module.what,
            &module.mlir,
            backend.iree(),
            &module.options,
            config.dump_mlir,
        )?;
        report = report.and(c.report);
        compiled.push((module.what, c));
    }
    Ok((compiled, report))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::plan::tests::{cfg, config};
    use crate::{CompileTarget, KernelSetting, Precision};
    use std::path::Path;

    #[test]
    fn single_row_decode_slices_its_slot_on_cpu_only() {
        let c = cfg();
        let plan = Plan::new(&c, &config(4, Some(64))).unwrap();
        // Every function but the copies between slots, which slice on every target.
        let text = |target: CompileTarget| -> String {
            let backend = Backend::new(target, KernelSetting::Off, Path::new("/nonexistent")).unwrap();
            let layout = Layout::dense_on(&c, Precision::F32, backend.model());
            let modules = backend.graph_modules(&c, &layout, &plan).unwrap();
            let all: String = modules.iter().map(|m| m.mlir.clone()).collect();
            assert!(all.contains("@copy_kv_p"), "4 slots compile the copy between slots");
            all.split("func.func").filter(|f| !f.lines().next().unwrap_or("").contains("@copy_")).collect()
        };
        assert!(text(CompileTarget::HostCpu).contains("stablehlo.dynamic_slice"));
        assert!(!text(CompileTarget::Cuda("sm_80".into())).contains("stablehlo.dynamic_slice"));
    }
}
