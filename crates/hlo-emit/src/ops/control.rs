//! Control flow: `stablehlo.while`.

use crate::error::Error;
use crate::func::{Func, Value};
use crate::ops::reduce::types_text;
use crate::types::{ElementType, TensorType};

impl<'c, 'b> Func<'c, 'b> {
    /// `stablehlo.while`: the loop-carried values start as `init`; while `cond` of them gives
    /// true (a rank-0 `i1`), `body` maps them to their next values (same types, same order).
    /// Returns the values after the last iteration. The regions see only the carried values:
    /// whatever they read from outside travels among them unchanged.
    pub fn while_loop<C, B>(&self, init: &[Value<'c, 'b>], cond: C, body: B) -> Result<Vec<Value<'c, 'b>>, Error>
    where
        C: for<'r> FnOnce(&Func<'c, 'r>, &[Value<'c, 'r>]) -> Result<Value<'c, 'r>, Error>,
        B: for<'r> FnOnce(&Func<'c, 'r>, &[Value<'c, 'r>]) -> Result<Vec<Value<'c, 'r>>, Error>,
    {
        const OP: &str = "stablehlo.while";
        if init.is_empty() {
            return Err(Error::op(OP, "at least one carried value", "none"));
        }
        let types: Vec<TensorType> = init.iter().map(Value::ty).collect();
        let (cond_region, cond_out) = self.region(&types, "stablehlo.return", |f, a| Ok(vec![cond(f, a)?]))?;
        let pred = ElementType::I1.tensor(&[]);
        if cond_out != [pred.clone()] {
            return Err(Error::op(OP, format!("a condition of type {pred}"), types_text(&cond_out)));
        }
        let (body_region, body_out) = self.region(&types, "stablehlo.return", body)?;
        if body_out != types {
            return Err(Error::op(OP, format!("body results {}", types_text(&types)), types_text(&body_out)));
        }
        self.emit(OP, init, Vec::new(), &types, vec![cond_region, body_region])
    }
}
