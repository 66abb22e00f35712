//! Counting the dispatches of one function in IREE's `flow`-phase IR text: what
//! [`crate::Engine::decode_dispatches`] reports for a decode step.

/// Counts `flow.dispatch @...` ops in function `func` of flow-phase IR text, following
/// `call`s into other functions of the module (each call counts its callee's dispatches).
pub(crate) fn count(ir: &str, func: &str) -> Result<usize, String> {
    fn count(ir: &str, func: &str, stack: &mut Vec<String>) -> Result<usize, String> {
        if stack.iter().any(|f| f == func) {
            return Err(format!("recursive call to @{func}"));
        }
        let body = function_body(ir, func).ok_or_else(|| format!("no function @{func} in the IR"))?;
        stack.push(func.to_owned());
        let mut n = 0;
        for line in body.lines() {
            let line = line.trim_start();
            let op = line.split_once(" = ").map_or(line, |(_, rhs)| rhs).trim_start();
            if op.starts_with("flow.dispatch @") {
                n += 1;
            } else if let Some(callee) = call_target(op) {
                n += count(ir, callee, stack)?;
            }
        }
        stack.pop();
        Ok(n)
    }
    count(ir, func, &mut Vec::new())
}

/// The callee of a `call @f(...)` / `util.call @f(...)` / `func.call @f(...)` op.
fn call_target(op: &str) -> Option<&str> {
    let rest = ["util.call @", "func.call @", "call @"].iter().find_map(|p| op.strip_prefix(p))?;
    let end = rest.find(|c: char| !(c.is_ascii_alphanumeric() || matches!(c, '_' | '$' | '.' | '-')))?;
    Some(&rest[..end])
}

/// The text between the braces of the body of function `@name` (`func.func`, `util.func`,
/// public or private), found by brace depth from its opening line.
fn function_body<'a>(ir: &'a str, name: &str) -> Option<&'a str> {
    let header = format!("@{name}(");
    let mut offset = 0;
    for line in ir.split_inclusive('\n') {
        let t = line.trim_start();
        let is_func = (t.starts_with("func.func ") || t.starts_with("util.func ")) && t.contains(&header);
        if is_func {
            // The body opens at the last `{` of the header line (attribute dictionaries
            // before it are balanced), and ends where the depth returns to zero.
            let open = offset + line.rfind('{')?;
            let mut depth = 0usize;
            for (i, c) in ir[open..].char_indices() {
                match c {
                    '{' => depth += 1,
                    '}' => {
                        depth -= 1;
                        if depth == 0 {
                            return Some(&ir[open + 1..open + i]);
                        }
                    }
                    _ => {}
                }
            }
            return None;
        }
        offset += line.len();
    }
    None
}

#[cfg(test)]
mod tests {
    use super::count;
    use iree_compiler::{CompileOptions, Compiler};
    use models::{ModelConfig, Precision};
    use std::path::Path;

    /// Flow-phase text as IREE 3.13 prints it (trimmed): the ABI wrapper calls the body.
    const FLOW: &str = r#"module {
  flow.executable private @decode_dispatch_0 {
    flow.executable.export public @decode_dispatch_0_x workgroups() -> (index, index, index) {
      flow.return %c1, %c1, %c1 : index, index, index
    }
  }
  util.func public @prefill(%arg0: !hal.buffer_view) -> !hal.buffer_view attributes {iree.abi.stub} {
    %0 = flow.dispatch @prefill_dispatch_0::@prefill_dispatch_0_x(%a) : (tensor<4xf32>) -> tensor<4xf32>
    %1 = flow.dispatch @prefill_dispatch_1::@prefill_dispatch_1_x(%0) : (tensor<4xf32>) -> tensor<4xf32>
    util.return %1 : !hal.buffer_view
  }
  util.func private @helper(%arg0: tensor<4xf32>) -> tensor<4xf32> {
    %0 = flow.dispatch @decode_dispatch_2::@decode_dispatch_2_x(%arg0) : (tensor<4xf32>) -> tensor<4xf32>
    util.return %0 : tensor<4xf32>
  }
  util.func public @decode(%arg0: !hal.buffer_view) -> !hal.buffer_view attributes {iree.abi.stub, iree.reflection = {f = "x"}} {
    %0 = flow.dispatch @decode_dispatch_0::@decode_dispatch_0_x(%a) : (tensor<4xf32>) -> tensor<4xf32>
    %1:2 = flow.dispatch @decode_dispatch_1::@decode_dispatch_1_x(%0) {some = {nested}} : (tensor<4xf32>) -> (tensor<4xf32>, tensor<4xf32>)
    %2 = util.call @helper(%1#0) : (tensor<4xf32>) -> tensor<4xf32>
    flow.dispatch @decode_dispatch_3::@decode_dispatch_3_x(%2) : (tensor<4xf32>) -> ()
    util.return %2 : !hal.buffer_view
  }
}
"#;

    #[test]
    fn counts_dispatches_in_one_function_and_its_callees() {
        assert_eq!(count(FLOW, "decode").unwrap(), 4);
        assert_eq!(count(FLOW, "prefill").unwrap(), 2);
        assert_eq!(count(FLOW, "helper").unwrap(), 1);
        let err = count(FLOW, "missing").unwrap_err();
        assert_eq!(err, "no function @missing in the IR");
    }

    #[test]
    fn recursion_is_an_error() {
        let ir = "util.func private @f() {\n  util.call @f() : () -> ()\n}\n";
        assert_eq!(count(ir, "f").unwrap_err(), "recursive call to @f");
    }

    /// The real thing: a tiny fixture's graph compiled to `flow`. Its decode step is one
    /// token through 2 layers; the count is whatever IREE fuses it into, but every
    /// dispatch in @decode is accounted for exactly once.
    #[test]
    fn counts_dispatches_of_a_fixture_decode_graph() {
        let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures/qwen2/f32");
        let cfg = ModelConfig::from_file(&dir.join("config.json")).unwrap();
        let cache = models::CacheShape { slots: 2, positions: 64, elem: models::KvElem::F32, scratch: false };
        let functions =
            [models::Function::Prefill { tokens: 16, window: 64 }, models::Function::Decode { rows: 2, window: 64 }];
        let mlir = models::emit_functions(&cfg, &models::Layout::dense(&cfg, Precision::F32), cache, &functions, None)
            .unwrap();
        let target = crate::CompileTarget::HostCpu.iree();
        let flow = Compiler::new().unwrap().compile_to_ir(&mlir, &target, &CompileOptions::default(), "flow").unwrap();
        let decode = count(&flow, "decode_b2_w64").unwrap();
        let prefill = count(&flow, "prefill_t16_w64").unwrap();
        let all = flow.lines().filter(|l| l.contains("flow.dispatch @")).count();
        // Every dispatch op belongs to one of the two entry points (nothing else calls).
        assert_eq!(decode + prefill, all, "{flow}");
        assert!(decode > 0, "{flow}");
        // Independently, by indentation: the lines from the decode function's header to its
        // closing brace at the function's indent. (Not by executable name: IREE deduplicates
        // executables, so decode also runs some named `prefill_..._dispatch_N`.)
        let by_indent = flow
            .lines()
            .skip_while(|l| !(l.contains("util.func public @decode_b2_w64(")))
            .take_while(|l| *l != "  }")
            .filter(|l| l.contains("flow.dispatch @"))
            .count();
        assert_eq!(by_indent, decode, "{flow}");
    }
}
