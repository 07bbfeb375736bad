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
    /// Storage operations started and not yet finished. If the call ends while one is running
    /// (the handler panicked or its future was dropped), the effect is in doubt.
    in_flight: u32,
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

    /// The store, with one more operation marked in flight; checked and marked under one lock so
    /// that a permit cannot expire between the check and the start of the effect.
    fn begin(&self) -> Result<Arc<dyn CommitStore>, PermitError> {
        let store = self.inner.store.clone();
        self.with_state(|s| {
            if s.expired {
                return Err(PermitError::Expired {
                    tool: self.inner.tool.clone(),
                });
            }
            let store = store.ok_or(PermitError::NoStore)?;
            s.in_flight += 1;
            Ok(store)
        })
    }

    /// Marks one operation finished and records its outcome, unless the call already ended (then
    /// the gate recorded the call as `in_doubt`).
    fn finish(&self, outcome: &'static str) {
        self.with_state(|s| {
            s.in_flight = s.in_flight.saturating_sub(1);
            if !s.expired {
                s.outcome = Some(outcome);
            }
        });
    }

    /// Records the outcome the audit line will carry (`committed`, `replay`, `observed`, ...),
    /// for handlers whose effect is not made through [`Permit::commit`].
    pub fn record_outcome(&self, outcome: &'static str) -> Result<(), PermitError> {
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

    /// Publishes `payload` under `key` exactly once through the gate's commit store, and records
    /// `committed`, `replay` or `conflict` for the audit line. Runs the blocking, fsyncing store
    /// without blocking other tasks: in place on a multi-thread runtime
    /// (`tokio::task::block_in_place`), else on tokio's blocking pool.
    pub async fn commit(
        &self,
        key: &IdempotencyKey,
        payload: Value,
    ) -> Result<CommitOutcome, PermitError> {
        let store = self.begin()?;
        let key = key.clone();
        let joined = crate::blocking::run(move || store.commit(&key, &payload)).await;
        let Ok(result) = joined else {
            self.finish("in_doubt");
            return Err(PermitError::Cancelled);
        };
        self.finish(match &result {
            Ok(outcome) => outcome.as_str(),
            Err(CommitError::Conflict { .. }) => "conflict",
            Err(_) => "failed",
        });
        Ok(result?)
    }

    /// Reads every committed payload (sorted by storage name) and records `observed`.
    ///
    /// The store is read as blocking work ([`CommitStore::list_canonical`]: bytes; on tokio's
    /// blocking pool unless the runtime is multi-thread) and the payloads are parsed here, on the
    /// calling task's thread, where the caller goes on to
    /// use them: their JSON trees are the bulk of a large listing, and built in a pool thread they
    /// would raise that thread's malloc arena (glibc keeps one per thread, with its high-water
    /// mark) on top of the caller's.
    pub async fn observe(&self) -> Result<Vec<Value>, PermitError> {
        let store = self.begin()?;
        let joined = crate::blocking::run(move || store.list_canonical()).await;
        let Ok(result) = joined else {
            self.finish("failed");
            return Err(PermitError::Cancelled);
        };
        let result = result.and_then(parse_listing);
        self.finish(if result.is_ok() { "observed" } else { "failed" });
        Ok(result?)
    }

    /// Ends the permit and returns the outcome its handler recorded. Called by the gate when the
    /// handler returns.
    pub(crate) fn close(&self) -> Option<&'static str> {
        self.with_state(|s| {
            s.expired = true;
            if s.in_flight > 0 {
                // A store operation is still running on the blocking pool: it may or may not
                // publish. A retry with the same key resolves it (committed or replay).
                Some("in_doubt")
            } else {
                s.outcome
            }
        })
    }
}

/// Parses what [`CommitStore::list_canonical`] returned, freeing each payload's bytes once parsed.
fn parse_listing(listing: Vec<Vec<u8>>) -> Result<Vec<Value>, CommitError> {
    let mut payloads = Vec::with_capacity(listing.len());
    for (index, bytes) in listing.into_iter().enumerate() {
        let payload = serde_json::from_slice(&bytes).map_err(|e| CommitError::Corrupt {
            // The trait names no paths; the store's own checks name the file when it has one.
            path: format!("(entry {index} of the listing)").into(),
            // Only the error class: serde_json messages may quote stored content.
            reason: format!(
                "the store listed bytes that are not JSON ({:?} error)",
                e.classify()
            ),
        })?;
        payloads.push(payload);
    }
    Ok(payloads)
}
