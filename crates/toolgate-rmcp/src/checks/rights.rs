//! The rights check: a tool the rights (`toolgate_state::RightsFile`) do not grant to the
//! principal is hidden and refused like a denied one.

use toolgate_audit::Reason;
use toolgate_state::{GuardError, RightsFile};

/// The check: a tool the rights file does not grant to the principal is hidden and refused like
/// a denied one; a file that cannot be read or parsed refuses everything (fail closed). Without
/// a rights file every tool the policy allows is granted.
#[derive(Debug, Default)]
pub(crate) struct RightsCheck {
    pub(crate) file: Option<RightsFile>,
}

impl RightsCheck {
    /// What the rights say of `name` for `principal`: `None` when granted, else the refusal.
    fn refusal<'a>(&self, principal: &str, name: &str) -> Option<super::Verdict<'a>> {
        let rights = self.file.as_ref()?;
        match rights.rights(principal) {
            Ok(granted) if granted.allows(name) => None,
            Ok(_) => Some(super::Verdict::Hide(Reason::Rights)),
            // A database that cannot be read is an outage, not a secret: the caller learns it.
            Err(error @ GuardError::Backend(_)) => {
                tracing::error!(%error, "the rights cannot be read; refusing every call");
                Some(super::Verdict::Fail {
                    reason: Reason::RightsUnavailable,
                    error: rmcp::ErrorData::internal_error(
                        format!("the rights cannot be read ({error}); nothing was executed"),
                        None,
                    ),
                })
            }
            Err(error) => {
                tracing::error!(%error, "the rights file is unusable; refusing every call");
                Some(super::Verdict::Hide(Reason::RightsUnavailable))
            }
        }
    }
}

impl super::Check for RightsCheck {
    fn admit<'a>(&'a self, call: &'a super::Call<'a>) -> super::Verdict<'a> {
        self.refusal(call.principal, call.name)
            .unwrap_or(super::Verdict::Pass)
    }

    fn lists(
        &self,
        _state: &crate::state::GateState,
        caller: &crate::world::Caller,
        tool: &str,
    ) -> bool {
        self.refusal(&caller.principal, tool).is_none()
    }
}
