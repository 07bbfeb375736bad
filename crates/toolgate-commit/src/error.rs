//! The commit store's error type: each variant names the cause and the fix, never the payload.

use std::path::PathBuf;

use toolgate_canon::Sha256Digest;

/// Why a commit store operation failed.
///
/// Messages carry key digests and paths but never key text or payload bytes, because they end up in
/// logs and tool results that must not leak arguments.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum CommitError {
    /// The key is already committed with a different payload; nothing was written.
    #[error(
        "idempotency key sha256:{key_digest} is already committed with a different payload; \
         nothing was written; retry with the original payload or use a new key for new content"
    )]
    Conflict {
        /// SHA-256 of the key's UTF-8 bytes (the key itself may be sensitive).
        key_digest: Sha256Digest,
    },

    /// The key text is not acceptable (see [`crate::IdempotencyKey::new`]).
    #[error(
        "invalid idempotency key: {reason}; use a non-empty key of at most 1024 bytes of UTF-8 \
         without control characters"
    )]
    InvalidKey {
        /// What is wrong, without quoting the key.
        reason: String,
    },

    /// An operating system call failed. If it failed after the publish step, the payload may be
    /// committed; retrying the same commit reports `Replay` in that case.
    #[error(
        "commit store could not {op} {path}: {source}; check that the store directory is on a \
         local filesystem, writable by this process and not full, then retry the same call \
         (a retry never duplicates a commit)"
    )]
    Io {
        /// The operation that failed, e.g. `"fsync directory"`.
        op: &'static str,
        /// The path it was applied to.
        path: PathBuf,
        /// The operating system's error.
        source: std::io::Error,
    },

    /// A committed record is unreadable. Published records are never rewritten by the store, so
    /// this means outside interference or media damage.
    #[error(
        "committed record {path} is corrupt: {reason}; inspect it and restore it from a backup \
         (the store never rewrites published records, so it will not repair this itself)"
    )]
    Corrupt {
        /// Where the record lives.
        path: PathBuf,
        /// What is wrong with it, without its contents.
        reason: String,
    },
}

impl CommitError {
    /// Shorthand for building [`CommitError::Io`].
    pub(crate) fn io(op: &'static str, path: impl Into<PathBuf>, source: std::io::Error) -> Self {
        CommitError::Io {
            op,
            path: path.into(),
            source,
        }
    }
}
