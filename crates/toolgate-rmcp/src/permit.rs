//! `Permit`: the handler-side proof that the gate decided `allow` for this very call.
//!
//! The gate inserts a `Permit` into the request's extensions just before dispatch. Handlers that
//! take it as `Extension<Permit>` get a structural guarantee: without the gate there is no permit,
//! and rmcp refuses the call before the handler body runs. A permit expires when its call returns,
//! so a handler that keeps a clone cannot use it later. Handlers that need nothing from the gate
//! keep their signatures; exactly-once is the gate's (the policy's `idempotency`), not theirs.

use std::fmt;
use std::sync::{Arc, Mutex, PoisonError};

use toolgate_audit::Outcome;

/// Why a permit could not be used.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum PermitError {
    /// The call this permit was issued for has already returned.
    #[error(
        "the permit for `{tool}` has expired because its call returned; use the permit of the current call"
    )]
    Expired {
        /// The tool the permit was issued for.
        tool: String,
    },
}

#[derive(Default)]
struct PermitState {
    outcome: Option<Outcome>,
    expired: bool,
}

struct PermitInner {
    tool: String,
    request_id: String,
    state: Mutex<PermitState>,
}

/// Proof of an `allow` decision for one tools/call.
///
/// There is no public constructor: only [`crate::Gated`] issues permits.
#[derive(Clone)]
pub struct Permit {
    inner: Arc<PermitInner>,
}

impl fmt::Debug for Permit {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Permit")
            .field("tool", &self.inner.tool)
            .field("request_id", &self.inner.request_id)
            .finish_non_exhaustive()
    }
}

impl Permit {
    pub(crate) fn issue(tool: &str, request_id: &str) -> Self {
        Permit {
            inner: Arc::new(PermitInner {
                tool: tool.to_owned(),
                request_id: request_id.to_owned(),
                state: Mutex::new(PermitState::default()),
            }),
        }
    }

    /// The tool this permit was issued for.
    pub fn tool(&self) -> &str {
        &self.inner.tool
    }

    /// The request id the gate recorded for this call.
    pub fn request_id(&self) -> &str {
        &self.inner.request_id
    }

    fn with_state<T>(&self, f: impl FnOnce(&mut PermitState) -> T) -> T {
        // A poisoned lock only means another holder panicked; the state is two plain fields that
        // are always consistent, so recover it instead of propagating the panic.
        let mut state = self
            .inner
            .state
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        f(&mut state)
    }

    /// Records the outcome the audit line will carry when it is not what the gate would infer
    /// (`committed` for a call that completed, `observed` for a tool the policy classes `read`,
    /// `failed` for an `isError` result): `replay` for a handler that found its effect already
    /// done, `refused` for one that declined the request, `indeterminate` for one that cannot tell
    /// whether its effect happened (a call whose exactly-once record is then left for an operator
    /// to resolve instead of being retried: `docs/commit-store.md`).
    pub fn record_outcome(&self, outcome: Outcome) -> Result<(), PermitError> {
        self.with_state(|s| {
            if s.expired {
                return Err(PermitError::Expired {
                    tool: self.inner.tool.clone(),
                });
            }
            s.outcome = Some(outcome);
            Ok(())
        })
    }

    /// Ends the permit and returns the outcome its handler recorded. Called by the gate when the
    /// handler returns.
    pub(crate) fn close(&self) -> Option<Outcome> {
        self.with_state(|s| {
            s.expired = true;
            s.outcome
        })
    }
}
