//! `flow.dispatch` of an entry point that IREE does not generate: an export of a
//! `hal.executable.source` added with [`crate::Module::append_source`] (a hand-written
//! kernel linked into the executable). Its push constants and workload are emitted here.

use crate::error::Error;
use crate::func::{Func, Value};
use crate::types::TensorType;
use melior::ir::attribute::IntegerAttribute;
use melior::ir::block::BlockLike;
use melior::ir::operation::OperationBuilder;
use melior::ir::r#type::IntegerType;
use melior::ir::{Attribute, Identifier, Location, Type, ValueLike};

fn is_symbol(name: &str) -> bool {
    !name.is_empty() && name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
}

impl<'c, 'b> Func<'c, 'b> {
    /// `flow.dispatch @executable::@export[workload](constants..., args...) -> result`:
    /// `constants` become the export's i32 push constants (in order) and `args` its
    /// bindings, followed by the result's. The export's signature is not visible here; the
    /// compiler checks it.
    pub fn dispatch(
        &self,
        executable: &str,
        export: &str,
        workload: i64,
        constants: &[i32],
        args: &[Value<'c, 'b>],
        result: TensorType,
    ) -> Result<Value<'c, 'b>, Error> {
        let mut out = self.dispatch_tied(executable, export, workload, constants, args, &[], result)?;
        out.pop().ok_or_else(|| Error::op("flow.dispatch", "one result", "none"))
    }

    /// [`Func::dispatch`] that also updates the arguments `in_place` (indices into `args`)
    /// where they lie: `flow.dispatch ... -> (%arg_i, ..., result)`, each tied to its
    /// operand, so IREE gives the export that argument's buffer as a read-write binding
    /// (where the argument binds) instead of a copy, when nothing reads the argument after.
    /// Returns the updated arguments, in the order of `in_place`, then the result.
    #[allow(clippy::too_many_arguments)]
    pub fn dispatch_tied(
        &self,
        executable: &str,
        export: &str,
        workload: i64,
        constants: &[i32],
        args: &[Value<'c, 'b>],
        in_place: &[usize],
        result: TensorType,
    ) -> Result<Vec<Value<'c, 'b>>, Error> {
        const OP: &str = "flow.dispatch";
        if !is_symbol(executable) || !is_symbol(export) {
            return Err(Error::op(
                OP,
                "executable and export names of letters, digits and '_'",
                format!("@{executable}::@{export}"),
            ));
        }
        if workload < 1 {
            return Err(Error::op(OP, "a workload of at least 1", workload));
        }
        if let Some(&bad) = in_place.iter().find(|&&i| i >= args.len()) {
            return Err(Error::op(OP, format!("in-place arguments among the {} given", args.len()), bad));
        }
        result.validate(OP)?;
        let ctx = self.context().raw();
        let loc = Location::unknown(ctx);
        let constant = |ty: Type<'c>, v: i64| -> Result<melior::ir::Value<'c, 'b>, Error> {
            let attr: Attribute<'c> = IntegerAttribute::new(ty, v).into();
            let op = OperationBuilder::new("arith.constant", loc)
                .add_attributes(&[(Identifier::new(ctx, "value"), attr)])
                .add_results(&[ty])
                .build()
                .map_err(|e| Error::mlir("arith.constant", e))?;
            let op = self.block().append_operation(op);
            Ok(op.result(0).map_err(|e| Error::mlir("arith.constant", e))?.into())
        };
        let index = Type::index(ctx);
        let i32_ty: Type<'c> = IntegerType::new(ctx, 32).into();
        let mut operands = vec![constant(index, workload)?];
        for &c in constants {
            operands.push(constant(i32_ty, i64::from(c))?);
        }
        operands.extend(args.iter().map(|a| a.raw()));
        let segments = format!("array<i32: 1, {}, 0, 0>", constants.len() + args.len());
        // A tied result names its operand by its place among the arguments, push constants
        // first.
        let tied: Vec<String> =
            in_place.iter().map(|i| format!("{} : index", constants.len() + i)).chain(["-1 : index".into()]).collect();
        let tied = tied.join(", ");
        let named = [
            ("entry_points", self.parse_attr(OP, &format!("[@{executable}::@{export}]"))?),
            ("operandSegmentSizes", self.parse_attr(OP, &segments)?),
            ("tied_operands", self.parse_attr(OP, &format!("[{tied}]"))?),
        ]
        .map(|(k, v)| (Identifier::new(ctx, k), v));
        let mut types: Vec<Type<'c>> = in_place.iter().map(|&a| args[a].raw().r#type()).collect();
        types.push(result.to_mlir(ctx));
        let op = OperationBuilder::new(OP, loc)
            .add_operands(&operands)
            .add_attributes(&named)
            .add_results(&types)
            .build()
            .map_err(|e| Error::mlir(OP, e))?;
        let op = self.block().append_operation(op);
        let mut out = Vec::with_capacity(types.len());
        for (i, elem) in in_place.iter().map(|&a| args[a].elem()).chain([result.elem]).enumerate() {
            let raw = op.result(i).map_err(|e| Error::mlir(OP, e))?;
            out.push(self.wrap(raw.into(), elem));
        }
        Ok(out)
    }
}
