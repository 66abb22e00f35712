//! The crate's error type: every rejected op names itself, what it expected and what it got.

use std::fmt::Display;

/// Error returned by the builder instead of emitting invalid IR.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum Error {
    /// An op's operands or attributes do not fit together (shape, dtype, dimension numbers).
    #[error("{op}: expected {expected}, got {got}")]
    Op {
        /// The op, as its StableHLO/MLIR name (`stablehlo.add`) or helper name (`argmax`).
        op: &'static str,
        /// What the op needed.
        expected: String,
        /// What it was given.
        got: String,
    },
    /// A function or global with this name already exists in the module.
    #[error("symbol @{0} is already defined in this module")]
    DuplicateSymbol(String),
    /// MLIR itself rejected something (attribute text, verification).
    #[error("MLIR rejected {what}: {detail}")]
    Mlir {
        /// What was being built or checked.
        what: String,
        /// MLIR's diagnostics or error text.
        detail: String,
    },
}

impl Error {
    /// Builds an [`Error::Op`].
    pub(crate) fn op(op: &'static str, expected: impl Display, got: impl Display) -> Self {
        Self::Op { op, expected: expected.to_string(), got: got.to_string() }
    }

    pub(crate) fn mlir(what: impl Display, detail: impl Display) -> Self {
        Self::Mlir { what: what.to_string(), detail: detail.to_string() }
    }
}
