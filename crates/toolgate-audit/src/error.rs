//! The audit crate's error type: every message names the cause and what the operator should do.

use std::io;
use std::path::PathBuf;

/// Why an audit operation failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum AuditError {
    /// A file system call on the log, its directory or a `.torn-*` file failed.
    #[error(
        "audit log I/O failed while trying to {action} {}: {source}; check that the directory exists and is writable by this process and that the disk is not full",
        path.display()
    )]
    Io {
        /// What we were doing, for instance "fsync".
        action: &'static str,
        /// The file or directory involved.
        path: PathBuf,
        /// The operating system's error.
        #[source]
        source: io::Error,
    },

    /// Reading a log from a stream (not a named file) failed.
    #[error("could not read the audit log stream: {source}; check the input and retry")]
    Read {
        /// The underlying error.
        #[source]
        source: io::Error,
    },

    /// The last complete line of the log is not a valid record, so the chain cannot be continued.
    /// The log is left untouched: appending to a broken chain would hide the damage.
    #[error(
        "the audit log {} ends with a record that cannot be chained onto ({detail}); run `toolgate-server audit verify` on it to locate the damage and restore the log from a good copy or move it aside; refusing to append to a broken chain",
        path.display()
    )]
    CorruptTail {
        /// The log file.
        path: PathBuf,
        /// What is wrong with the last line.
        detail: String,
    },

    /// The configured path cannot name a log file.
    #[error(
        "the audit log path {} has no file name; pass a file path such as LEDGER_DIR/audit.jsonl",
        path.display()
    )]
    InvalidPath {
        /// The rejected path.
        path: PathBuf,
    },

    /// One record would exceed the line limit that readers rely on to bound their memory.
    #[error(
        "an audit record of {len} bytes exceeds the limit of {max} bytes; keep audit fields short (names, outcomes and digests, never raw arguments)"
    )]
    RecordTooLarge {
        /// The encoded line length, newline included.
        len: usize,
        /// The limit, [`crate::MAX_LINE_BYTES`].
        max: usize,
    },
}
