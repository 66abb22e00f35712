//! Op families, each an `impl Func` block: elementwise, constants, control flow, shapes, gather, scatter, reduce, dot,
//! and composites (RMSNorm, softmax) built from them.

pub(crate) mod composite;
pub(crate) mod constant;
pub(crate) mod control;
pub(crate) mod dispatch;
pub(crate) mod dot;
pub(crate) mod elementwise;
pub(crate) mod gather;
pub(crate) mod reduce;
pub(crate) mod scatter;
pub(crate) mod shape;
