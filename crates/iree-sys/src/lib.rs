//! Raw FFI bindings to the IREE runtime C API.
