//! Shared fixtures for the integration tests: a small StableHLO module and the compiler.

#![allow(dead_code)]

use iree_compiler::Compiler;

/// Elementwise add plus a matrix-vector product written as `W·x` (`dot_general` contracting
/// lhs dim 1 with rhs dim 0), the shape every projection in the models takes.
pub const MODULE: &str = r#"
func.func @add(%a: tensor<4xf32>, %b: tensor<4xf32>) -> tensor<4xf32> {
  %0 = stablehlo.add %a, %b : tensor<4xf32>
  return %0 : tensor<4xf32>
}
func.func @matvec(%w: tensor<8x4xf32>, %x: tensor<4xf32>) -> tensor<8xf32> {
  %0 = stablehlo.dot_general %w, %x, contracting_dims = [1] x [0] : (tensor<8x4xf32>, tensor<4xf32>) -> tensor<8xf32>
  return %0 : tensor<8xf32>
}
"#;

/// The compiler, located the normal way (`IREE_COMPILER_LIB`, else `target/venv` from
/// `cargo xtask setup`).
pub fn compiler() -> Compiler {
    match Compiler::new() {
        Ok(c) => c,
        Err(e) => panic!("{e}"),
    }
}

/// Whether `haystack` contains `needle` as a byte substring.
pub fn contains(haystack: &[u8], needle: &[u8]) -> bool {
    haystack.windows(needle.len()).any(|w| w == needle)
}
