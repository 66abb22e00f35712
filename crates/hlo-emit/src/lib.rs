//! Typed StableHLO builder over melior.
//!
//! Builds MLIR modules of `func.func` functions whose bodies are StableHLO ops, checking
//! shapes and element types in Rust: an op that does not fit returns [`Error`] naming the
//! op, what it expected and what it got, and emits nothing. The printed text (StableHLO in
//! generic form) is what `iree-compile --iree-input-type=stablehlo` takes. The crate knows
//! nothing about IREE beyond the textual form of parameter-bound globals
//! ([`Module::global_param`], [`Func::load`]).
//!
//! ```
//! use hlo_emit::{Context, DotDims, ElementType::F32, Module};
//!
//! let ctx = Context::new();
//! let m = Module::new(&ctx);
//! // y = W·x + b, with W a weight bound to the parameter "model"::"w".
//! let w = m.global_param("w", "model", "w", &F32.tensor(&[2, 3]))?;
//! m.func("affine", &[F32.tensor(&[3]), F32.tensor(&[2])], |f, args| {
//!     let (x, b) = (args[0], args[1]);
//!     let w = f.load(&w)?;
//!     let wx = f.dot_general(w, x, DotDims::matmul())?;
//!     Ok(vec![f.add(wx, b)?])
//! })?;
//! assert_eq!(
//!     m.to_text(),
//!     r#"module {
//!   "util.global"() {initial_value = #stream.parameter.named<"model"::"w"> : tensor<2x3xf32>, sym_name = "w", sym_visibility = "private", type = tensor<2x3xf32>} : () -> ()
//!   func.func @affine(%arg0: tensor<3xf32>, %arg1: tensor<2xf32>) -> tensor<2xf32> {
//!     %0 = "util.global.load"() {global = @w} : () -> tensor<2x3xf32>
//!     %1 = "stablehlo.dot_general"(%0, %arg0) {dot_dimension_numbers = #stablehlo.dot<lhs_contracting_dimensions = [1], rhs_contracting_dimensions = [0]>} : (tensor<2x3xf32>, tensor<3xf32>) -> tensor<2xf32>
//!     %2 = "stablehlo.add"(%1, %arg1) : (tensor<2xf32>, tensor<2xf32>) -> tensor<2xf32>
//!     return %2 : tensor<2xf32>
//!   }
//! }
//! "#
//! );
//! # Ok::<(), hlo_emit::Error>(())
//! ```
//!
//! Shapes never broadcast implicitly: use [`Func::broadcast_to`] / [`Func::broadcast_in_dim`]
//! (or [`Func::add_scalar`], [`Func::mul_scalar`], [`Func::splat_like`] for scalars).
//! Helper code that builds sub-graphs takes `&Func<'c, 'b>` and `Value<'c, 'b>`.
//!
//! Known IREE limits worth remembering (measured with iree-compile 3.13): a sub-byte
//! tensor (`i4`/`ui4`) crossing the function boundary needs a whole number of bytes (a
//! rank-0 `i4` result fails to compile); sub-byte tensors inside a function are fine.
//! [`Func::scatter`] compiles when the scattered operand dims (`scatter_dims_to_operand_dims`)
//! are the inserted window dims and lead the operand: a KV write at `(layer, slot, position)`
//! into `[L, S, P, H, D]` compiles, into `[L, S, H, P, D]` it fails in IREE's StableHLO
//! conversion ("'iree_linalg_ext.scatter' op expected indices to be equal to batch rank or
//! batch rank + 1").

mod error;
mod func;
mod module;
mod ops;
mod types;

pub use error::Error;
pub use func::{Func, Value};
pub use melior;
pub use module::{Context, Global, Module};
pub use ops::dot::DotDims;
pub use ops::elementwise::Cmp;
pub use ops::gather::GatherDims;
pub use ops::scatter::ScatterDims;
pub use types::{ElementType, TensorType};
