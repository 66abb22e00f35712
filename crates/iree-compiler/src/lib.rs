//! In-process IREE compiler: MLIR text (StableHLO) to vmfb through `libIREECompiler`'s
//! embedding C API, loaded at run time, plus an on-disk vmfb cache.
//!
//! The library comes from the pinned wheel `iree-base-compiler==3.13.0`. It is found by an
//! explicit path, else `IREE_COMPILER_LIB`, else `<workspace>/target/venv` (made by
//! `cargo xtask setup`); nothing links against it at build time.
//!
//! ```no_run
//! use iree_compiler::{CacheOutcome, CompileCache, CompileOptions, Compiler, Target};
//!
//! # fn main() -> Result<(), iree_compiler::Error> {
//! let compiler = Compiler::new()?;
//! let mlir = "func.func @f(%a: tensor<4xf32>) -> tensor<4xf32> {
//!   %0 = stablehlo.add %a, %a : tensor<4xf32>
//!   return %0 : tensor<4xf32>
//! }";
//! let opts = CompileOptions::default().with_flag("--iree-opt-data-tiling");
//! let vmfb = compiler.compile(mlir, &Target::llvm_cpu_host(), &opts)?;
//!
//! let cache = CompileCache::new("/tmp/mlx-iree-cache")?;
//! let compiled = cache.compile(&compiler, mlir, &Target::cuda("sm_80"), &opts)?;
//! match compiled.outcome {
//!     CacheOutcome::Hit => println!("compile cache hit"),
//!     CacheOutcome::Miss => println!("compiled in {:.1} s", compiled.elapsed.as_secs_f64()),
//! }
//! # let _ = vmfb;
//! # Ok(())
//! # }
//! ```

mod cache;
mod command_buffers;
mod compiler;
mod error;
mod ffi;
mod locate;
mod signals;
mod target;
mod vmfb;

pub use cache::{CacheOutcome, CompileCache, Compiled};
pub use command_buffers::recorded_per_call;
pub use compiler::{ApiVersion, Compiler, CompilerIdentity};
pub use error::{Diagnostic, Diagnostics, Error, Severity};
pub use locate::{LIB_ENV, LIB_FILE_NAME, locate_library, venv_candidates};
pub use target::{
    CompileOptions, ENCODED_SCOPE, InputType, Target, VULKAN_GENERIC, VULKAN_TARGETS, X86_64_CPUS, compile_flags,
};
pub use vmfb::{VMFB_IDENTIFIER, check_vmfb, flatbuffer_offset};
