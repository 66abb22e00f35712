//! The MLIR context wrapper and the module builder (functions, parameter-bound globals, printing).

use crate::error::Error;
use crate::func::{Func, Value, build_region};
use crate::types::TensorType;
use melior::dialect::DialectHandle;
use melior::ir::attribute::{FlatSymbolRefAttribute, StringAttribute, TypeAttribute};
use melior::ir::block::BlockLike;
use melior::ir::operation::{OperationBuilder, OperationLike, OperationMutLike};
use melior::ir::r#type::FunctionType;
use melior::ir::{Attribute, Identifier, Location, Type};
use std::cell::{Cell, RefCell};
use std::collections::BTreeSet;
use std::fmt;
use std::rc::Rc;
use std::sync::atomic::{AtomicU64, Ordering};

/// An MLIR context set up for StableHLO: unregistered dialects allowed (StableHLO, IREE
/// `util`/`stream` are not upstream), the `func` dialect loaded.
#[derive(Debug)]
pub struct Context {
    inner: melior::Context,
}

impl Context {
    /// Creates a context.
    pub fn new() -> Self {
        let inner = melior::Context::new();
        inner.set_allow_unregistered_dialects(true);
        // Registered so that func.func prints in its custom form and the verifier checks
        // that each func.return matches the function type.
        DialectHandle::func().register_dialect(&inner);
        inner.get_or_load_dialect("func");
        Self { inner }
    }

    /// The underlying melior context (escape hatch for ops this crate does not cover).
    pub fn melior(&self) -> &melior::Context {
        &self.inner
    }
}

impl Default for Context {
    fn default() -> Self {
        Self::new()
    }
}

/// A module-level global bound to a named parameter, returned by [`Module::global_param`].
/// Read it inside a function with [`Func::load`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Global {
    pub(crate) name: String,
    pub(crate) ty: TensorType,
    pub(crate) module_id: u64,
}

impl Global {
    /// Symbol name (without `@`).
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Tensor type of the global.
    pub fn ty(&self) -> &TensorType {
        &self.ty
    }
}

/// Source of unique module ids, so a [`Global`] cannot be loaded in a foreign module.
static NEXT_MODULE_ID: AtomicU64 = AtomicU64::new(1);

/// A module under construction. Functions and globals are added through `&self`, so a
/// module can be shared by helper code; printing gives the textual IR.
pub struct Module<'c> {
    ctx: &'c Context,
    module: melior::ir::Module<'c>,
    symbols: RefCell<BTreeSet<String>>,
    globals: Cell<usize>,
    id: u64,
    /// Top-level ops given as text (see [`Module::append_source`]).
    sources: RefCell<Vec<String>>,
}

impl fmt::Debug for Module<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Module").field("symbols", &self.symbols.borrow()).finish_non_exhaustive()
    }
}

impl<'c> Module<'c> {
    /// An empty module.
    pub fn new(ctx: &'c Context) -> Self {
        Self {
            ctx,
            module: melior::ir::Module::new(Location::unknown(&ctx.inner)),
            symbols: RefCell::new(BTreeSet::new()),
            globals: Cell::new(0),
            id: NEXT_MODULE_ID.fetch_add(1, Ordering::Relaxed),
            sources: RefCell::new(Vec::new()),
        }
    }

    /// An empty module named `name` (`module @name`): the IREE runtime knows a compiled
    /// module by this name, so two modules loaded side by side need different ones.
    pub fn named(ctx: &'c Context, name: &str) -> Result<Self, Error> {
        if name.is_empty() || !name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_') {
            return Err(Error::op("module", "a name of letters, digits and '_'", format!("{name:?}")));
        }
        let mut m = Self::new(ctx);
        let attr = StringAttribute::new(&ctx.inner, name);
        m.module.as_operation_mut().set_attribute("sym_name", attr.into());
        Ok(m)
    }

    /// The context this module lives in.
    pub fn context(&self) -> &'c Context {
        self.ctx
    }

    /// The underlying melior module.
    pub fn melior(&self) -> &melior::ir::Module<'c> {
        &self.module
    }

    fn claim_symbol(&self, name: &str) -> Result<(), Error> {
        if name.is_empty() {
            return Err(Error::op("symbol", "a non-empty name", "\"\""));
        }
        if self.symbols.borrow().contains(name) {
            return Err(Error::DuplicateSymbol(name.to_string()));
        }
        Ok(())
    }

    /// Declares `util.global private @name = #stream.parameter.named<"scope"::"key"> : ty`,
    /// a constant global whose value the runtime reads from a parameter archive (e.g. a
    /// safetensors file) under `scope`/`key`. An empty `scope` emits the scope-less form
    /// `#stream.parameter.named<"key">`.
    pub fn global_param(&self, name: &str, scope: &str, key: &str, ty: &TensorType) -> Result<Global, Error> {
        const OP: &str = "util.global";
        self.claim_symbol(name)?;
        ty.validate(OP)?;
        if key.is_empty() {
            return Err(Error::op(OP, "a non-empty parameter key", "\"\""));
        }
        let ctx = &self.ctx.inner;
        let mlir_ty = ty.to_mlir(ctx);
        let param = if scope.is_empty() {
            format!("#stream.parameter.named<{}> : {ty}", quote(key))
        } else {
            format!("#stream.parameter.named<{}::{}> : {ty}", quote(scope), quote(key))
        };
        let initial = Attribute::parse(ctx, &param).ok_or_else(|| Error::mlir("parameter attribute", &param))?;
        let op = OperationBuilder::new(OP, Location::unknown(ctx))
            .add_attributes(&[
                (Identifier::new(ctx, "sym_name"), StringAttribute::new(ctx, name).into()),
                (Identifier::new(ctx, "sym_visibility"), StringAttribute::new(ctx, "private").into()),
                (Identifier::new(ctx, "type"), TypeAttribute::new(mlir_ty).into()),
                (Identifier::new(ctx, "initial_value"), initial),
            ])
            .build()
            .map_err(|e| Error::mlir(OP, e))?;
        // Globals go before all functions so the text reads top-down.
        let at = self.globals.get();
        self.module.body().insert_operation(at, op);
        self.globals.set(at + 1);
        self.symbols.borrow_mut().insert(name.to_string());
        Ok(Global { name: name.to_string(), ty: ty.clone(), module_id: self.id })
    }

    /// Adds a public `func.func @name` taking `inputs`. `build` receives the function
    /// builder and the arguments and returns the results; their types become the
    /// function's result types, which are also returned here. On error nothing is added.
    ///
    /// ```
    /// # use hlo_emit::{Context, Module, ElementType::F32};
    /// let ctx = Context::new();
    /// let m = Module::new(&ctx);
    /// m.func("double", &[F32.tensor(&[4])], |f, a| Ok(vec![f.add(a[0], a[0])?]))?;
    /// # Ok::<(), hlo_emit::Error>(())
    /// ```
    pub fn func<F>(&self, name: &str, inputs: &[TensorType], build: F) -> Result<Vec<TensorType>, Error>
    where
        F: for<'b> FnOnce(&Func<'c, 'b>, &[Value<'c, 'b>]) -> Result<Vec<Value<'c, 'b>>, Error>,
    {
        const OP: &str = "func.func";
        self.claim_symbol(name)?;
        for t in inputs {
            t.validate(OP)?;
        }
        let ctx = &self.ctx.inner;
        let loc = Location::unknown(ctx);
        let (region, out_types) = build_region(self.ctx, self.id, inputs, "func.return", build)?;
        let in_types: Vec<Type<'c>> = inputs.iter().map(|t| t.to_mlir(ctx)).collect();
        let out_mlir: Vec<Type<'c>> = out_types.iter().map(|t| t.to_mlir(ctx)).collect();
        let op = OperationBuilder::new(OP, loc)
            .add_attributes(&[
                (Identifier::new(ctx, "sym_name"), StringAttribute::new(ctx, name).into()),
                (
                    Identifier::new(ctx, "function_type"),
                    TypeAttribute::new(FunctionType::new(ctx, &in_types, &out_mlir).into()).into(),
                ),
            ])
            .add_regions([region])
            .build()
            .map_err(|e| Error::mlir(OP, e))?;
        self.module.body().append_operation(op);
        self.symbols.borrow_mut().insert(name.to_string());
        Ok(out_types)
    }

    /// Runs the MLIR verifier over the module (StableHLO ops are unregistered, so this
    /// checks structure and `func` types, not StableHLO semantics; those the builder checks).
    pub fn verify(&self) -> Result<(), Error> {
        let diags: Rc<RefCell<Vec<String>>> = Rc::default();
        let sink = Rc::clone(&diags);
        let ctx = &self.ctx.inner;
        let id = ctx.attach_diagnostic_handler(move |d| {
            sink.borrow_mut().push(d.to_string());
            true
        });
        let ok = self.module.as_operation().verify();
        ctx.detach_diagnostic_handler(id);
        if ok { Ok(()) } else { Err(Error::mlir("module", diags.borrow().join("; "))) }
    }

    /// The module as MLIR text (StableHLO and `util` ops in generic form), ready for
    /// `iree-compile --iree-input-type=stablehlo`.
    pub fn to_text(&self) -> String {
        let text = self.module.as_operation().to_string();
        let sources = self.sources.borrow();
        if sources.is_empty() {
            return text;
        }
        // The module prints as `module ... {` ... `}`: the sources go before the last brace.
        let body_end = text.trim_end().len() - 1;
        format!("{}{}}}\n", &text[..body_end], sources.concat())
    }

    /// Appends top-level ops written as MLIR text, for ops of dialects this crate's context
    /// does not load (an IREE `hal.executable.source` that a [`crate::Func::dispatch`]
    /// calls). They are not verified here: the compiler parses them. `symbol` is the symbol
    /// the text defines; it must be new to the module.
    pub fn append_source(&self, symbol: &str, text: &str) -> Result<(), Error> {
        self.claim_symbol(symbol)?;
        self.symbols.borrow_mut().insert(symbol.to_owned());
        self.sources.borrow_mut().push(text.to_owned());
        Ok(())
    }
}

impl fmt::Display for Module<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.to_text())
    }
}

/// Quotes `s` as an MLIR string literal (escaping `"`, `\` and non-printable bytes as `\XX`).
fn quote(s: &str) -> String {
    let mut out = String::with_capacity(s.len() + 2);
    out.push('"');
    for b in s.bytes() {
        match b {
            b'"' | b'\\' => {
                out.push('\\');
                out.push(b as char);
            }
            0x20..=0x7e => out.push(b as char),
            _ => out.push_str(&format!("\\{b:02X}")),
        }
    }
    out.push('"');
    out
}

/// `util.global.load @name`, used by [`Func::load`].
pub(crate) fn global_load_attr<'c>(ctx: &'c Context, g: &Global) -> (Identifier<'c>, Attribute<'c>) {
    (Identifier::new(&ctx.inner, "global"), FlatSymbolRefAttribute::new(&ctx.inner, &g.name).into())
}

impl Context {
    pub(crate) fn raw(&self) -> &melior::Context {
        &self.inner
    }
}

#[cfg(test)]
mod tests {
    use super::quote;

    #[test]
    fn quote_escapes() {
        assert_eq!(quote(r#"a"b\c"#), r#""a\"b\\c""#);
        assert_eq!(quote("x\ny"), r#""x\0Ay""#);
    }
}
