//! The `mlx-iree` command line.

fn main() {}
