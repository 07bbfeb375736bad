//! `Permit`: the handler-side proof that the gate decided `allow` for this very call.
//!
//! The gate inserts a `Permit` into the request's extensions just before dispatch. Handlers take it
//! as `Extension<Permit>`; without the gate there is no permit, rmcp refuses the call before the
//! handler body runs, and the commit store (reachable only through the permit) cannot be touched.
//! A permit expires when its call returns, so a handler that keeps a clone cannot reuse it later.

use std::fmt;
use std::sync::{Arc, Mutex, PoisonError};

use serde_json::Value;
use toolgate_commit::{CommitError, CommitOutcome, CommitStore, IdempotencyKey};

/// Why a permit could not be used.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum PermitError {
    /// The call this permit was issued for has already returned.
    #[error(
        "the permit for `{tool}` has expired because its call returned; effects need the permit of the current call"
    )]
    Expired {
        /// The tool the permit was issued for.
        tool: String,
    },
    /// The gate was built without a commit store.
    #[error("this gate has no commit store; configure one with GatedBuilder::commit_store")]
    NoStore,
    /// The commit store refused or failed.
    #[error(transparent)]
    Commit(#[from] CommitError),
    /// The blocking storage task did not finish (the runtime is shutting down).
    #[error(
        "the storage task was cancelled before it finished; retry the call with the same idempotency key"
    )]
    Cancelled,
}

#[derive(Default)]
struct PermitState {
    outcome: Option<&'static str>,
    expired: bool,
}

struct PermitInner {
    tool: String,
    request_id: String,
    store: Option<Arc<dyn CommitStore>>,
    state: Mutex<PermitState>,
}

/// Proof of an `allow` decision for one tools/call, and the only door to the gate's commit store.
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
    pub(crate) fn issue(tool: &str, request_id: &str, store: Option<Arc<dyn CommitStore>>) -> Self {
        Permit {
            inner: Arc::new(PermitInner {
                tool: tool.to_owned(),
                request_id: request_id.to_owned(),
                store,
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

    fn check_live(&self) -> Result<(), PermitError> {
        if self.with_state(|s| s.expired) {
            return Err(PermitError::Expired {
                tool: self.inner.tool.clone(),
            });
        }
        Ok(())
    }

    fn store(&self) -> Result<Arc<dyn CommitStore>, PermitError> {
        self.check_live()?;
        self.inner.store.clone().ok_or(PermitError::NoStore)
    }

    /// Records the outcome the audit line will carry (`committed`, `replay`, `observed`, ...),
    /// for handlers whose effect is not made through [`Permit::commit`].
    pub fn record_outcome(&self, outcome: &'static str) -> Result<(), PermitError> {
        self.check_live()?;
        self.with_state(|s| s.outcome = Some(outcome));
        Ok(())
    }

    /// Publishes `payload` under `key` exactly once through the gate's commit store, and records
    /// `committed`, `replay` or `conflict` for the audit line. Runs the blocking, fsyncing store
    /// on tokio's blocking pool.
    pub async fn commit(
        &self,
        key: &IdempotencyKey,
        payload: Value,
    ) -> Result<CommitOutcome, PermitError> {
        let store = self.store()?;
        let key = key.clone();
        let result = tokio::task::spawn_blocking(move || store.commit(&key, &payload))
            .await
            .map_err(|_| PermitError::Cancelled)?;
        let outcome = match &result {
            Ok(outcome) => outcome.as_str(),
            Err(CommitError::Conflict { .. }) => "conflict",
            Err(_) => "failed",
        };
        self.record_outcome(outcome)?;
        Ok(result?)
    }

    /// Reads every committed payload (sorted by storage name) and records `observed`.
    pub async fn observe(&self) -> Result<Vec<Value>, PermitError> {
        let store = self.store()?;
        let result = tokio::task::spawn_blocking(move || store.list())
            .await
            .map_err(|_| PermitError::Cancelled)?;
        self.record_outcome(if result.is_ok() { "observed" } else { "failed" })?;
        Ok(result?)
    }

    /// Ends the permit and returns the outcome its handler recorded. Called by the gate when the
    /// handler returns.
    pub(crate) fn close(&self) -> Option<&'static str> {
        self.with_state(|s| {
            s.expired = true;
            s.outcome
        })
    }
}
