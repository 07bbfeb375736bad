//! The error type of the guards kept in files or a database (kill switch and rights).
//!
//! Every message names the cause and the fix. Messages carry paths of configuration files (which
//! the operator chose) but never caller input such as tool arguments.

use std::path::PathBuf;

/// Why a kill switch or rights file operation failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum GuardError {
    /// The halt reason given to [`crate::KillSwitch::halt`] is not acceptable; nothing was written.
    #[error(
        "invalid halt reason: {problem}; give a non-empty reason of at most 1000 characters \
         without control characters (nothing was written)"
    )]
    InvalidReason {
        /// What is wrong, without quoting the reason.
        problem: String,
    },

    /// The `by` field given to [`crate::KillSwitch::halt`] is not acceptable; nothing was written.
    #[error(
        "invalid halt author: {problem}; identify who halts with at most 256 characters without \
         control characters (nothing was written)"
    )]
    InvalidBy {
        /// What is wrong, without quoting the value.
        problem: String,
    },

    /// The tenant given to [`crate::KillSwitch::for_tenant`] is not a valid name; nothing was
    /// written.
    #[error(
        "invalid tenant {name:?}: use {grammar} (nothing was written)",
        grammar = toolgate_canon::names::PRINCIPAL_GRAMMAR
    )]
    InvalidTenant {
        /// The name given.
        name: String,
    },

    /// The store behind the kill switch or the rights failed (a database that cannot be
    /// reached, or holds a row this version cannot use); nothing was changed. The cause names the
    /// store and the fix, never a password.
    #[error("{0}; retry once the database is reachable")]
    Backend(#[source] Box<dyn std::error::Error + Send + Sync + 'static>),

    /// An operating system call on the ledger directory failed.
    #[error(
        "could not {op} {path}: {source}; check that the directory is on a local filesystem, \
         writable by this process and not full, then retry"
    )]
    Io {
        /// The operation that failed, e.g. `"fsync directory"`.
        op: &'static str,
        /// The path it was applied to.
        path: PathBuf,
        /// The operating system's error.
        source: std::io::Error,
    },

    /// The Cedar entities file could not be opened or read. Calls that Cedar decides are
    /// refused until it can.
    #[error(
        "the entities file {path} could not be read: {source}; create it or make it readable by \
         this process (format: docs/policy.md, \"Cedar\"); until then calls Cedar decides are refused"
    )]
    EntitiesUnreadable {
        /// The entities file.
        path: PathBuf,
        /// The operating system's error.
        source: std::io::Error,
    },

    /// The Cedar entities file was read but is not valid. Calls that Cedar decides are refused
    /// until it is fixed; the next call reads it again.
    #[error(
        "the entities file {path} is invalid: {problem}; fix the file (format: docs/policy.md, \
         \"Cedar\"); until then calls Cedar decides are refused"
    )]
    EntitiesInvalid {
        /// The entities file.
        path: PathBuf,
        /// What is wrong.
        problem: String,
    },

    /// An entities document given to `EntitiesFile::set` is not a valid entities document;
    /// nothing was changed.
    #[error(
        "the entities document is invalid: {problem}; fix it (format: docs/policy.md, \
         \"Cedar\"); nothing was changed"
    )]
    EntitiesDocumentInvalid {
        /// What is wrong with it.
        problem: String,
    },

    /// The rights file could not be opened or read. The gate refuses every call until it can.
    #[error(
        "the rights file {path} could not be read: {source}; create it or make it readable by \
         this process (format: docs/checks.md); until then every call is refused"
    )]
    RightsUnreadable {
        /// The rights file.
        path: PathBuf,
        /// The operating system's error.
        source: std::io::Error,
    },

    /// The rights file was read but is not a valid rights file. The gate refuses every call until
    /// it is fixed; the next call reads it again.
    #[error(
        "the rights file {path} is invalid: {problem}; fix the file (format: docs/checks.md); \
         until then every call is refused"
    )]
    RightsInvalid {
        /// The rights file.
        path: PathBuf,
        /// What is wrong with it.
        problem: String,
    },

    /// A rights document given to `RightsFile::set` is not a valid rights document; nothing was
    /// changed.
    #[error(
        "the rights document is invalid: {problem}; fix it (format: docs/checks.md); nothing was \
         changed"
    )]
    RightsDocumentInvalid {
        /// What is wrong with it.
        problem: String,
    },
}

impl From<toolgate_storage::StorageError> for GuardError {
    fn from(e: toolgate_storage::StorageError) -> Self {
        GuardError::Io {
            op: e.op,
            path: e.path,
            source: e.source,
        }
    }
}

impl GuardError {
    /// A failure of the store behind the kill switch or the rights, for [`GuardError::Backend`].
    pub fn backend(cause: impl std::error::Error + Send + Sync + 'static) -> Self {
        GuardError::Backend(Box::new(cause))
    }

    /// Shorthand for building [`GuardError::Io`].
    pub fn io(op: &'static str, path: impl Into<PathBuf>, source: std::io::Error) -> Self {
        GuardError::Io {
            op,
            path: path.into(),
            source,
        }
    }
}
