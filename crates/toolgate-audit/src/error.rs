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

    /// The database behind the chain failed (unreachable, a transaction failed, a schema it does
    /// not know); nothing of the failed append was recorded.
    #[error(
        "the audit chain's database failed: {cause}; nothing was appended; retry once the database is reachable"
    )]
    Backend {
        /// What failed, naming the database without credentials.
        cause: String,
    },

    /// Writing an exported chain to its destination failed.
    #[error(
        "could not write the exported audit log: {source}; check the destination (a full disk, a closed pipe) and retry"
    )]
    Export {
        /// The underlying error.
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
        "the audit log {} ends with a record that cannot be chained onto ({detail}); verify it (the server's `audit verify` command, or `toolgate_audit::verify_file`) to locate the damage and restore the log from a good copy or move it aside; refusing to append to a broken chain",
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

    /// A line of the log is not a JSON object, found while reading records for statistics.
    #[error(
        "{} line {line} is not an audit record: {detail}; verify the log (the server's `audit verify` command, or `toolgate_audit::verify_file`) to locate the damage",
        path.display()
    )]
    BadRecord {
        /// The file holding the line (a segment or the active file).
        path: PathBuf,
        /// The 1-based line number in that file.
        line: u64,
        /// What is wrong with it.
        detail: String,
    },

    /// A rotation would overwrite an existing segment file.
    #[error(
        "cannot rotate the audit log: the segment {} already exists; another tool may have renamed files in the ledger, so verify the log (the server's `audit verify` command, or `toolgate_audit::verify_file`) and move the stray file aside",
        path.display()
    )]
    SegmentExists {
        /// The segment path that already exists.
        path: PathBuf,
    },

    /// A torn tail (bytes after the last newline, left by an interrupted write) could not be saved
    /// as evidence, so it was not repaired. The log is unchanged (the torn bytes are cut off only
    /// once they are durable elsewhere) and no `.torn-*` file was left behind; nothing was appended.
    #[error(
        "the audit log {} ends with {torn_bytes} torn bytes that could not be saved as evidence before the repair ({source}); the log was left unchanged and no evidence file was kept; free space on that filesystem or fix its permissions, then open the log again (the repair is retried)",
        log.display()
    )]
    TornTailNotSaved {
        /// The log whose tail is torn.
        log: PathBuf,
        /// How many bytes follow the last newline.
        torn_bytes: u64,
        /// The storage step that failed (writing, syncing or linking the evidence file, or syncing
        /// its directory).
        #[source]
        source: toolgate_storage::StorageError,
    },

    /// The thread that was writing this record's batch panicked (for instance in a fault hook), so
    /// whether the record reached the disk is unknown.
    #[error(
        "the audit append was interrupted by a panic in the writing thread; the record may or may not be in the log; treat it as not recorded and retry (the next append repairs a torn tail)"
    )]
    WriterPanicked,
}

impl AuditError {
    /// A copy of this error for another appender of the same group commit: every record of a
    /// failed batch gets the batch's error. `io::Error` is not `Clone`, so its kind and text are
    /// carried over.
    #[doc(hidden)]
    pub fn duplicate(&self) -> Self {
        let io_copy = |e: &io::Error| io::Error::new(e.kind(), e.to_string());
        match self {
            AuditError::Io {
                action,
                path,
                source,
            } => AuditError::Io {
                action,
                path: path.clone(),
                source: io_copy(source),
            },
            AuditError::Read { source } => AuditError::Read {
                source: io_copy(source),
            },
            AuditError::Export { source } => AuditError::Export {
                source: io_copy(source),
            },
            AuditError::CorruptTail { path, detail } => AuditError::CorruptTail {
                path: path.clone(),
                detail: detail.clone(),
            },
            AuditError::InvalidPath { path } => AuditError::InvalidPath { path: path.clone() },
            AuditError::RecordTooLarge { len, max } => AuditError::RecordTooLarge {
                len: *len,
                max: *max,
            },
            AuditError::BadRecord { path, line, detail } => AuditError::BadRecord {
                path: path.clone(),
                line: *line,
                detail: detail.clone(),
            },
            AuditError::SegmentExists { path } => AuditError::SegmentExists { path: path.clone() },
            AuditError::TornTailNotSaved {
                log,
                torn_bytes,
                source,
            } => AuditError::TornTailNotSaved {
                log: log.clone(),
                torn_bytes: *torn_bytes,
                source: toolgate_storage::StorageError::new(
                    source.op,
                    source.path.clone(),
                    io_copy(&source.source),
                ),
            },
            AuditError::WriterPanicked => AuditError::WriterPanicked,
            AuditError::Backend { cause } => AuditError::Backend {
                cause: cause.clone(),
            },
        }
    }
}

impl From<toolgate_storage::StorageError> for AuditError {
    fn from(e: toolgate_storage::StorageError) -> Self {
        AuditError::Io {
            action: e.op,
            path: e.path,
            source: e.source,
        }
    }
}
