//! Which functions of a compiled module record their command buffer on every call, read
//! from the module's IR at IREE's `vm` phase ([`crate::Compiler::compile_to_ir`]).
//!
//! IREE memoizes a function's command buffer (records it once, when the module loads, and
//! replays it with each call's buffers in a binding table) unless the recording depends on
//! the call: a buffer bound directly rather than through the table, or a dynamic scalar.
//! Then the VM records it again on every call, one VM call per dispatch (docs/PERFORMANCE.md).

/// Names of the functions in `vm_ir` that record a command buffer (`hal.command_buffer.create`)
/// and take arguments: the ones whose recording runs on each call. A memoized command buffer
/// is recorded by a function without arguments (`__<name>_memoize_apply()`), called once at
/// load.
pub fn recorded_per_call(vm_ir: &str) -> Vec<String> {
    let mut found = Vec::new();
    let mut current: Option<(&str, bool)> = None;
    for line in vm_ir.lines() {
        let line = line.trim_start();
        if let Some(rest) = line.strip_prefix("vm.func ") {
            current = rest.split_once('@').and_then(|(_, named)| {
                let (name, args) = named.split_once('(')?;
                Some((name, !args.starts_with(')')))
            });
        } else if line.starts_with('}') {
            current = None;
        } else if line.contains("= vm.call @hal.command_buffer.create(")
            && let Some((name, true)) = current
            && found.last().is_none_or(|f: &String| f != name)
        {
            found.push(name.to_owned());
        }
    }
    found
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_recording_with_arguments_is_per_call() {
        let ir = r#"
  vm.module public @module {
    vm.import private @hal.command_buffer.create(%device : !vm.ref<!hal.device>) -> !vm.ref<!hal.command_buffer>
    vm.func private @__decode_memoize_apply(%arg0: !vm.ref<!hal.buffer>) -> !vm.ref<!hal.command_buffer> {
      %ref = vm.call @hal.command_buffer.create(%__device_0, %zero) : (!vm.ref<!hal.device>, i32) -> !vm.ref<!hal.command_buffer>
      %ref2 = vm.call @hal.command_buffer.create(%__device_0, %zero) : (!vm.ref<!hal.device>, i32) -> !vm.ref<!hal.command_buffer>
      vm.return %ref : !vm.ref<!hal.command_buffer>
    }
    vm.func private @__prefill_memoize_apply() -> !vm.ref<!hal.command_buffer> {
      %ref = vm.call @hal.command_buffer.create(%__device_0, %zero) : (!vm.ref<!hal.device>, i32) -> !vm.ref<!hal.command_buffer>
      vm.return %ref : !vm.ref<!hal.command_buffer>
    }
    vm.func private @step(%arg0: !vm.ref<!hal.buffer_view>) {
      %ref = vm.call @hal.command_buffer.create(%__device_0, %zero) : (!vm.ref<!hal.device>, i32) -> !vm.ref<!hal.command_buffer>
      vm.return
    }
    vm.import private @hal.command_buffer.create(%device : !vm.ref<!hal.device>) -> !vm.ref<!hal.command_buffer>
  }"#;
        assert_eq!(recorded_per_call(ir), ["__decode_memoize_apply", "step"]);
        assert!(recorded_per_call("vm.func private @f() {\n}").is_empty());
    }
}
