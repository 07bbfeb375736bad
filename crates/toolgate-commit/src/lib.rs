//! Idempotent commit store: one durable effect per idempotency key, crash-safe and replayable.
//!
//! A caller that retries a mutation (after a timeout, a crash, or a lost response) must not repeat
//! the effect. [`CommitStore::commit`] publishes a payload under an [`IdempotencyKey`] exactly once:
//! the first call reports [`CommitOutcome::Committed`], every later call with the same canonical
//! payload reports [`CommitOutcome::Replay`], and a later call with a different payload fails with
//! [`CommitError::Conflict`] without writing anything.
//!
//! [`FileCommitStore`] is the embedded default (one directory on a local POSIX filesystem, see
//! `docs/commit-store.md`). The trait deliberately says nothing about files so that a shared
//! database backend can implement it for several server replicas.

#![forbid(unsafe_code)]

pub mod effect;
mod error;
mod file;
mod key;

use std::fmt;

pub use error::CommitError;
pub use file::{CommitConfig, FileCommitStore};
pub use key::IdempotencyKey;

/// A test-only callback invoked with the name of each crash point the store reaches.
///
/// The reference server installs one that creates a marker file and sleeps, so that a test can kill
/// the process at exactly that point. It only exists with the `fault-injection` feature, so that a
/// production build has no code path that can stall a commit.
#[cfg(feature = "fault-injection")]
pub type FaultHook = std::sync::Arc<dyn Fn(&'static str) + Send + Sync>;

/// What a successful [`CommitStore::commit`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum CommitOutcome {
    /// This call published the payload; it is now durable.
    Committed,
    /// The same canonical payload was already published under this key; nothing was written.
    Replay,
}

impl CommitOutcome {
    /// The wire name: `"committed"` or `"replay"` (as used in tool results and audit outcomes).
    pub fn as_str(&self) -> &'static str {
        match self {
            CommitOutcome::Committed => "committed",
            CommitOutcome::Replay => "replay",
        }
    }
}

impl fmt::Display for CommitOutcome {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Exactly-once publication of JSON payloads under idempotency keys.
///
/// Payloads are compared by their RFC 8785 canonical bytes, so key order and number spelling in the
/// caller's `Value` do not matter. Implementations must be safe to call concurrently from several
/// threads and, for shared backends, several processes: of any number of racing `commit` calls for
/// one key, exactly one reports `Committed`.
///
/// The file store is the embedded default; a PostgreSQL store is planned, so nothing here may assume
/// files, paths or directory listings.
pub trait CommitStore: Send + Sync + fmt::Debug {
    /// Publish `payload` under `key` exactly once.
    ///
    /// The same canonical payload again yields `Ok(Replay)`. A different payload yields
    /// `Err(CommitError::Conflict { .. })` and nothing is written. When `Ok(Committed)` is returned
    /// the payload is durable. An error other than `Conflict` or `InvalidKey` leaves the key either
    /// absent or fully committed, never partially; retrying the same call resolves which.
    fn commit(
        &self,
        key: &IdempotencyKey,
        payload: &serde_json::Value,
    ) -> Result<CommitOutcome, CommitError>;

    /// The payload committed under `key`, if any.
    fn get(&self, key: &IdempotencyKey) -> Result<Option<serde_json::Value>, CommitError>;

    /// Every committed payload, sorted by storage name (for the file store: the file name, which is
    /// the hex SHA-256 of the key).
    fn list(&self) -> Result<Vec<serde_json::Value>, CommitError>;

    /// The payloads of [`CommitStore::list`], in its order, as their canonical (RFC 8785) JSON
    /// bytes instead of parsed trees.
    ///
    /// For callers that read the store on one thread and use the payloads on another (an async
    /// caller reads on a blocking pool): they parse where the payloads are used, so the trees,
    /// many times larger than the bytes, are allocated by that thread. With glibc every thread
    /// that allocates gets its own malloc arena, which keeps its high-water mark, so a large
    /// listing parsed in whichever pool thread ran the read would raise every such arena to its
    /// size. The default serializes what `list` returns.
    fn list_canonical(&self) -> Result<Vec<Vec<u8>>, CommitError> {
        Ok(self
            .list()?
            .iter()
            .map(toolgate_canon::canonical_value)
            .collect())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn outcome_wire_names() {
        assert_eq!(CommitOutcome::Committed.as_str(), "committed");
        assert_eq!(CommitOutcome::Replay.as_str(), "replay");
        assert_eq!(CommitOutcome::Replay.to_string(), "replay");
        assert_eq!(
            serde_json::to_value(CommitOutcome::Committed).unwrap(),
            serde_json::json!("committed")
        );
    }
}
