//! The one decision per engine of what its compile target can do ([`Backend`]): the target
//! itself ([`CompileTarget`], named without IREE's types), the hand-written kernels it links
//! (the CPU kernel object of the instruction set [`KernelSetting`] picks, or the CUDA kernel),
//! SPIR-V's narrower forms, the graph settings that differ by target, IREE's compile flags
//! (data tiling on CPU), and what one call costs. Everything downstream asks this value,
//! never the target's name: `models::Layout` turns its [`models::Backend`] into one form per
//! matrix, the graph code matches on that form, and the compile flags come from here.

use crate::device::KernelSetting;
use crate::{Error, GraphModule, Plan, Precision, Result};
use iree_compiler::{CompileOptions, Target};
use models::{ExpertProducts, KernelLink, Layout, ModelConfig, PackedProducts, SlotRead};
use std::path::Path;
use weights::Checkpoint;

/// A compile target, named without IREE's types: what a device compiles for, or a target
/// to compile for on a machine without its device (`mlx-iree compile`, the compile matrix).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CompileTarget {
    /// This host's CPU (`llvm-cpu`): the `local-task` and `local-sync` devices.
    HostCpu,
    /// NVIDIA GPUs of this architecture (`sm_80`).
    Cuda(String),
    /// Any Vulkan 1.3 device (our generic SPIR-V target, `iree_compiler::VULKAN_GENERIC`).
    Vulkan,
    /// Apple GPUs (Metal's SPIR-V).
    Metal,
    /// AMD GPUs of this architecture (`gfx942`).
    Rocm(String),
}

impl CompileTarget {
    /// The target whose code runs on a device URI (`local-task`, `local-sync`, `cuda`,
    /// `cuda://0`, `vulkan`, `metal` on macOS), or why that device is not supported. Checked
    /// before compiling.
    pub fn for_device(device: &str) -> Result<CompileTarget> {
        match crate::device::driver(device) {
            "local-task" | "local-sync" => Ok(CompileTarget::HostCpu),
            // sm_80 PTX runs on newer GPUs too (the driver JIT-compiles it); IREE 3.13's
            // target table has no sm_90 entry.
            "cuda" => Ok(CompileTarget::Cuda("sm_80".into())),
            // Any Vulkan 1.3 device, software (Mesa's lavapipe) or GPU: IREE's named targets
            // each assume their GPU's subgroup size and give wrong sums on another.
            "vulkan" => Ok(CompileTarget::Vulkan),
            // Apple GPUs, through a runtime built with `cargo xtask build-iree --target metal`.
            "metal" if cfg!(target_os = "macos") => Ok(CompileTarget::Metal),
            other => Err(Error::UnsupportedDevice(other.to_owned())),
        }
    }

    pub(crate) fn iree(&self) -> Target {
        match self {
            CompileTarget::HostCpu => Target::llvm_cpu_host(),
            CompileTarget::Cuda(arch) => Target::cuda(arch),
            CompileTarget::Vulkan => Target::vulkan(iree_compiler::VULKAN_GENERIC),
            CompileTarget::Metal => Target::Metal,
            CompileTarget::Rocm(arch) => Target::rocm(arch),
        }
    }

    /// Whether code for it runs on the host's CPU.
    pub fn is_cpu(&self) -> bool {
        matches!(self, CompileTarget::HostCpu)
    }

    /// What one call costs beyond the rows it computes, in rows of work: how a plan weighs a
    /// padded prefill chunk against more, smaller calls. CPU code is compute-bound, so a
    /// padded row costs what a real one does and a call's own overhead is small (about 8
    /// rows: SmolLM2 packed prefilled 16 tokens in 1/5.6 of the time of 128,
    /// docs/PERFORMANCE.md); a GPU call costs its dispatches, its rows nearly nothing.
    pub fn call_overhead_rows(&self) -> usize {
        if self.is_cpu() { 8 } else { 4096 }
    }

    /// Whether the copies between slots (`copy_kv`, `copy_state`: the prefix cache sharing a
    /// prompt's start) are planned for this target: on the CPU, where they run in the
    /// suite. Not on CUDA, where IREE 3.13 turns the copy into a `slow_memcpy` dispatch at a
    /// run-time offset whose translation to LLVM fails ("LLVM Translation failed for
    /// operation: builtin.unrealized_conversion_cast"), nor on the other GPU targets until
    /// they are compiled and run with them; there a slot reuses only what it holds itself.
    pub fn copies_between_slots(&self) -> bool {
        self.is_cpu()
    }
}

impl std::fmt::Display for CompileTarget {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.iree().fmt(f)
    }
}

/// What one compile target can do, decided once (see the module docs).
#[derive(Debug, Clone)]
pub struct Backend {
    target: CompileTarget,
    iree: Target,
    model: models::Backend,
}

impl Backend {
    /// The backend of `target` with the kernels `kernels` picks, the CPU kernel object
    /// installed into `cache_dir/kernels` where one links. A single-row decode on a cache of
    /// several slots reads its window with a slice at the slot on CPU (IREE copied a
    /// gathered window element by element; the slice offset's trip to the host is free
    /// there) and with a gather elsewhere (on a GPU that trip costs a round trip per call).
    ///
    /// # Errors
    /// Forcing an instruction set the host lacks (`Error::KernelIsa`, whatever the target);
    /// a kernel object that cannot be installed.
    pub fn new(target: CompileTarget, kernels: KernelSetting, cache_dir: &Path) -> Result<Backend> {
        let iree = target.iree();
        let isa = kernels.isa_for(&target)?;
        let cpu = target.is_cpu();
        let link = match (&target, isa) {
            (CompileTarget::Cuda(_), _) if kernels != KernelSetting::Off && kernels::cuda::ptx().is_some() => {
                KernelLink::Cuda
            }
            (_, Some(isa)) => {
                let dir = cache_dir.join("kernels");
                match kernels::cpu::install(&dir, isa) {
                    Ok(Some(object)) => KernelLink::Cpu(object),
                    Ok(None) => KernelLink::None,
                    Err(source) => return Err(Error::KernelObject { dir, source }),
                }
            }
            _ => KernelLink::None,
        };
        let emit = models::EmitOptions {
            slot_read: if cpu { SlotRead::Slice } else { SlotRead::Gather },
            expert_products: if cpu { ExpertProducts::Contraction } else { ExpertProducts::Reduction },
            packed_products: if iree.is_spirv() { PackedProducts::Dequantized } else { PackedProducts::IntegerGroups },
            activations: models::Activations::I16,
        };
        let model = models::Backend { kernels: link, spirv: iree.is_spirv(), emit };
        Ok(Backend { target, iree, model })
    }

    /// This backend with the CPU kernel's packed products quantizing their input as
    /// `activations` says (the user's setting, [`models::Activations`]).
    ///
    /// # Errors
    /// `Error::Activations` for i8 where no packed matrix would go through the CPU kernel
    /// (no kernel object linked, or another precision than packed): a setting never passes
    /// silently.
    pub fn with_activations(mut self, activations: models::Activations, precision: Precision) -> Result<Backend> {
        if activations == models::Activations::I8 {
            let reason = if !matches!(self.model.kernels, KernelLink::Cpu(_)) {
                Some(format!("no CPU kernels link for {}", self.target))
            } else if precision != Precision::Packed {
                Some(format!("precision {precision}"))
            } else {
                None
            };
            if let Some(reason) = reason {
                return Err(Error::Activations { reason });
            }
        }
        self.model.emit.activations = activations;
        Ok(self)
    }

    /// The backend of a device URI ([`CompileTarget::for_device`], then [`Backend::new`]).
    pub fn for_device(device: &str, kernels: KernelSetting, cache_dir: &Path) -> Result<Backend> {
        Backend::new(CompileTarget::for_device(device)?, kernels, cache_dir)
    }

    pub fn target(&self) -> &CompileTarget {
        &self.target
    }

    /// What the model's layout and graphs need to know of the target.
    pub fn model(&self) -> &models::Backend {
        &self.model
    }

    /// The device layout of `precision` for this checkpoint on this target
    /// (`models::Layout::new`).
    pub fn layout(&self, cfg: &ModelConfig, precision: Precision, ckpt: &Checkpoint) -> Result<Layout> {
        Ok(Layout::new(cfg, precision, ckpt, &self.model)?)
    }

    /// The modules an engine compiles for `plan` on this target. On CPU every function shares
    /// one module compiled with data tiling on IREE's global-optimization path and
    /// microkernels: the weights are constant globals, so IREE repacks them into the layouts
    /// its matrix microkernels read, and prefill, batched and single-row decode all read that
    /// one copy (docs/PERFORMANCE.md, "Data tiling"). The repacking is split out into a
    /// parameter encoder module, run once per module and checkpoint: the module itself reads
    /// the repacked weights from a file, so a load neither repacks nor holds the
    /// checkpoint's copy beside the repacked one (docs/PERFORMANCE.md, "Peak RSS"). The
    /// default data-tiling path (`--iree-opt-data-tiling`, which picks the dispatch-creation
    /// path) crashes IREE 3.13's compiler on prefill and several-row decode (a segmentation
    /// fault in MaterializeDeviceEncodingPass); the global-optimization path compiles them.
    pub fn graph_modules(&self, cfg: &ModelConfig, layout: &Layout, plan: &Plan) -> Result<Vec<GraphModule>> {
        let c = plan.cache;
        let functions = plan.functions();
        let mlir = models::graph::emit_functions(cfg, layout, c, &functions, None)?;
        let what = format!(
            "{} {} prefill+decode graphs ({} functions; {} slots x {} positions, {} KV cache)",
            cfg.model_type,
            layout.precision(),
            functions.len(),
            c.slots,
            c.positions,
            c.elem
        );
        Ok(vec![GraphModule { what, functions, mlir, options: self.compile_options(layout) }])
    }

    /// IREE's flags for a module of `layout`: data tiling with microkernels and the
    /// parameter encoder on CPU, except where a packed matrix is in the graph form (its i16
    /// weights blow IREE 3.13's vector-size limit when data-tiled, "One or more operations
    /// with large vector sizes"); the defaults elsewhere.
    fn compile_options(&self, layout: &Layout) -> CompileOptions {
        if self.target.is_cpu() && !layout.has_graph_packing() {
            CompileOptions::default()
                .with_flag("--iree-global-opt-data-tiling")
                .with_flag("--iree-llvmcpu-enable-ukernels=all")
                .with_parameter_encoder()
        } else {
            CompileOptions::default()
        }
    }

    /// `module` compiled for this target through the compile cache in `cache_dir` (no device
    /// needed: IREE cross-compiles), as the vmfb's bytes: the path a load compiles through
    /// (`cache::compile_module`), for compile-level checks of targets this machine lacks.
    pub fn compile(&self, module: &GraphModule, cache_dir: &Path) -> Result<Vec<u8>> {
        let out =
            crate::cache::compile_module(cache_dir, &module.what, &module.mlir, &self.iree, &module.options, false)?;
        Ok(out.vmfb)
    }

    /// `module` compiled to IREE's intermediate `phase` (`flow`, `vm`, ...) as text, not
    /// cached: for counting dispatches and reading what a function records.
    pub fn compile_to_ir(&self, module: &GraphModule, phase: &str) -> Result<String> {
        Ok(iree_compiler::Compiler::new()?.compile_to_ir(&module.mlir, &self.iree, &module.options, phase)?)
    }

    pub(crate) fn iree(&self) -> &Target {
        &self.iree
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use models::{EmitOptions, KernelLink};

    fn backend(target: CompileTarget, kernels: KernelSetting) -> Backend {
        let dir = std::env::temp_dir().join(format!("engine-backend-{}", std::process::id()));
        Backend::new(target, kernels, &dir).unwrap()
    }

    /// `--activations i8` is taken only where packed matrices go through the CPU kernel, and
    /// refused by name elsewhere; i16 everywhere.
    #[test]
    fn eight_bit_activations_need_packed_cpu_kernels() {
        use models::Activations::{I8, I16};
        let refused = |b: Backend, precision| match b.with_activations(I8, precision) {
            Err(e @ Error::Activations { .. }) => e.to_string(),
            other => panic!("{other:?}"),
        };
        let off = refused(backend(CompileTarget::HostCpu, KernelSetting::Off), Precision::Packed);
        assert!(
            off.starts_with("--activations i8 quantizes") && off.contains("no CPU kernels link for llvm-cpu"),
            "{off}"
        );
        let cuda = refused(backend(CompileTarget::Cuda("sm_80".into()), KernelSetting::Auto), Precision::Packed);
        assert!(cuda.contains("no CPU kernels link for cuda"), "{cuda}");
        if kernels::cpu::host_isa().is_some() {
            let f16 = refused(backend(CompileTarget::HostCpu, KernelSetting::Auto), Precision::F16);
            assert!(f16.contains("(precision f16)"), "{f16}");
            let i8 = backend(CompileTarget::HostCpu, KernelSetting::Auto).with_activations(I8, Precision::Packed);
            assert_eq!(i8.unwrap().model().emit.activations, I8);
        }
        let i16 = backend(CompileTarget::Vulkan, KernelSetting::Auto).with_activations(I16, Precision::F16);
        assert_eq!(i16.unwrap().model().emit.activations, I16);
    }

    /// Each target's one decision: what links, SPIR-V's forms, the graph settings, the cost
    /// of a call.
    #[test]
    fn each_target_decides_once() {
        let cpu = backend(CompileTarget::HostCpu, KernelSetting::Off);
        let cpu_emit = EmitOptions {
            slot_read: SlotRead::Slice,
            expert_products: ExpertProducts::Contraction,
            packed_products: PackedProducts::IntegerGroups,
            activations: models::Activations::I16,
        };
        assert_eq!(*cpu.model(), models::Backend { kernels: KernelLink::None, spirv: false, emit: cpu_emit });
        assert_eq!(cpu.target().call_overhead_rows(), 8);

        let auto = backend(CompileTarget::HostCpu, KernelSetting::Auto);
        // The host's fastest instruction set's object, installed (its name carries the set).
        if let KernelLink::Cpu(object) = &auto.model().kernels {
            let isa = kernels::cpu::host_isa().unwrap();
            assert!(object.exists() && object.display().to_string().contains(isa.name()), "{}", object.display());
        }

        for target in [CompileTarget::Vulkan, CompileTarget::Metal] {
            let gpu = backend(target.clone(), KernelSetting::Auto);
            assert!(gpu.model().spirv && gpu.model().kernels == KernelLink::None, "{target}");
            assert_eq!(gpu.model().emit.packed_products, PackedProducts::Dequantized, "{target}");
            assert_eq!(gpu.model().emit.slot_read, SlotRead::Gather, "{target}");
            assert_eq!(gpu.target().call_overhead_rows(), 4096);
        }

        let cuda = CompileTarget::Cuda("sm_80".into());
        let linked = if kernels::cuda::ptx().is_some() { KernelLink::Cuda } else { KernelLink::None };
        assert_eq!(backend(cuda.clone(), KernelSetting::Auto).model().kernels, linked);
        assert_eq!(backend(cuda.clone(), KernelSetting::Off).model().kernels, KernelLink::None);
        let rocm = backend(CompileTarget::Rocm("gfx942".into()), KernelSetting::Auto);
        assert_eq!((rocm.model().kernels.clone(), rocm.model().spirv), (KernelLink::None, false));
        assert_eq!(rocm.model().emit.expert_products, ExpertProducts::Reduction);
    }

    #[test]
    fn devices_name_their_targets() {
        assert_eq!(CompileTarget::for_device("local-sync").unwrap(), CompileTarget::HostCpu);
        assert_eq!(CompileTarget::for_device("cuda://0").unwrap(), CompileTarget::Cuda("sm_80".into()));
        assert_eq!(CompileTarget::for_device("vulkan").unwrap(), CompileTarget::Vulkan);
        let err = CompileTarget::for_device("tpu").unwrap_err().to_string();
        assert_eq!(err, "unsupported device `tpu` (expected local-task, local-sync, cuda, vulkan, or metal on macOS)");
    }
}
