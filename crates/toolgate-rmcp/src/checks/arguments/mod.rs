//! The arguments of a call, in this order: the input schema's top-level shape (required and
//! unknown arguments, `shape.rs`), the policy's `arg_rules` (decided by toolgate-policy), then the
//! full JSON Schema (`schema.rs`). Each refusal is an `isError` result naming the field, the rule
//! and the fix, without quoting values.

mod schema;
mod shape;

pub use schema::SchemaCache;
pub(crate) use shape::InputShape;

use toolgate_policy::Decision;

use super::{Call, Check, Verdict};
use crate::refusal::Refusal;

/// The argument checks, with the compiled input schemas.
#[derive(Debug, Default)]
pub(crate) struct Arguments {
    pub(crate) schemas: SchemaCache,
}

impl Arguments {
    /// The first refusal of `call`'s arguments, if any.
    pub(crate) fn refusal(&self, call: &Call<'_>) -> Option<Refusal> {
        call.input
            .problem(call.name, call.arguments)
            .or_else(|| match call.decision {
                Decision::DenyArgs(violation) => Some(policy_refusal(violation)),
                _ => None,
            })
            .or_else(|| {
                self.schemas
                    .check(call.name, &call.tool.input_schema, call.arguments)
                    .err()
            })
    }
}

impl Check for Arguments {
    fn admit<'a>(&'a self, call: &'a Call<'a>) -> Verdict<'a> {
        match self.refusal(call) {
            Some(refusal) => Verdict::Refuse(refusal),
            None => Verdict::Pass,
        }
    }
}

/// The refusal of a call whose arguments break a policy rule.
fn policy_refusal(violation: &toolgate_policy::ArgViolation) -> Refusal {
    Refusal {
        rule: violation.rule(),
        message: violation.message(),
        details: violation.details(),
    }
}
