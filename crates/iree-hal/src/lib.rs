//! Safe wrapper over the IREE runtime.
