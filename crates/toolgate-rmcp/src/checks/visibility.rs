//! The policy's `allow`, `deny` and `principals` sections: a tool the policy does not allow for
//! the calling principal is neither listed nor callable, and a direct call gets the same error as
//! an unknown tool (the audit records which rule hid it).

use toolgate_policy::Decision;

use super::{Call, Check, Verdict};
use crate::state::GateState;

/// Hides what the policy denies.
#[derive(Debug, Default)]
pub(crate) struct Visibility;

impl Check for Visibility {
    fn admit<'a>(&'a self, call: &'a Call<'a>) -> Verdict<'a> {
        match call.decision {
            Decision::DenyTool(denial) => {
                Verdict::Hide(toolgate_audit::Reason::Rule(denial.rule()))
            }
            _ => Verdict::Pass,
        }
    }

    fn lists(&self, state: &GateState, caller: &crate::world::Caller, tool: &str) -> bool {
        state.policy.visible_for(&caller.principal, tool)
    }
}
