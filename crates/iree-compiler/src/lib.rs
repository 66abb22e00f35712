//! In-process IREE compiler.
