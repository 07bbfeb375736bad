//! The storage floor: the one place where toolgate's stores touch files.
//!
//! Every store (the effect journal, the audit log, the kill switch and rights files, the notes of
//! the reference server, the lockfile writer) writes through a [`Storage`], so that one
//! fault-injecting implementation ([`FaultyStorage`]) can count every write and sync of a whole
//! server and fail any one of them. On it sit the durable-write helpers, written once:
//!
//! - [`TempFile`]: a temporary file created exclusively, written and fdatasynced, then published by
//!   rename ([`TempFile::replace`]) or, write-once, by link ([`TempFile::publish_new`]);
//! - [`replace_file`]: temporary file, fdatasync, rename, directory fsync;
//! - [`fsync_dir`], [`create_dir_durably`], [`remove_orphaned_temps`];
//! - [`GroupCommit`]: leader/follower group commit generic over the job and the answer, with an
//!   early hand-off for pipelining, used by the audit log and the effect journal;
//! - [`open_regular`], [`read_regular`], [`open_dir`]: the one way a file is opened: regular
//!   files only (checked on the descriptor), never blocking on a FIFO or device, links refused
//!   inside the ledger, reads capped;
//! - [`LockFile`]: a store's cross-process writer lock (`flock`), released by the kernel when its
//!   holder dies;
//! - [`Journal`]: the append-only journal file of the audit log and the effect journal (plain
//!   JSONL or zero-padded): replacement by another process noticed by file identity, the lines
//!   appended by others read (bounded), the last line found backwards ([`read_tail`]), a torn tail
//!   reported for the store to repair, appends and `fdatasync` through the [`Storage`].
//!
//! The filesystem assumptions (a local POSIX filesystem where `fsync` of a directory makes its
//! entries durable and `rename`/`link` are atomic; not NFS) are stated in `docs/storage.md`.
//! Nothing here knows about MCP, keys or records.

#![forbid(unsafe_code)]

mod backend;
mod durable;
mod group;
mod journal;
mod lock;
mod open;
pub mod paths;

pub use backend::{FaultyStorage, FsStorage, Op, Storage};
pub use durable::{
    Published, StorageError, TempFile, create_dir_durably, fsync_dir, parent_of, pid_alive,
    remove_orphaned_temps, replace_file, temp_path, temp_writer_pid,
};
pub use group::{Caller, GroupCommit, Handoff};
pub use journal::{
    AtPath, FileId, Journal, JournalConfig, JournalError, JournalStep, Layout, Missing,
    Replacement, Scan, SyncHandle, Tail, read_tail,
};
pub use lock::{LockFile, LockGuard};
pub use open::{
    FileProblem, Symlinks, check_real_dir, open_dir, open_regular, open_regular_read, read_capped,
    read_regular, read_regular_text,
};
