//! The embedded file backend: a JSONL file appended under a cross-process lock, with group commit
//! (one write and one fsync for all appends waiting at the same time), torn-tail recovery, signed
//! checkpoints and optional rotation into segments.
//!
//! Appends cost O(1): the chain head and `seq` live in memory and are refreshed from the file's
//! last line only when another process has written since our own last append (detected by the
//! file's length and identity, checked under the lock). The file is a plain
//! [`toolgate_storage::Journal`] of the storage floor, which opens it, notices a replacement,
//! reads its tail and appends and syncs through the log's `Storage`.

use std::sync::Arc;

use std::io::{self, BufRead, BufReader, Read};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, MutexGuard, OnceLock};
use std::time::{SystemTime, UNIX_EPOCH};
use toolgate_storage::{
    AtPath, FsStorage, Journal, JournalConfig, JournalError, JournalStep, Layout, Missing,
    Published, Storage, StorageError, Symlinks, TempFile, read_tail,
};

use serde_json::Value;
use toolgate_canon::{HmacKey, Sha256Digest};

use crate::ChainHead;
use crate::checkpoint::Checkpoint;
use crate::record::{MAX_LINE_BYTES, SeqField, check_line, representable, seal};
use crate::segments::{
    checkpoints_path, io_err, list_segments, lock_path, open_read, parent_dir, segment_path,
};
use crate::{AppendReceipt, AuditDecision, AuditEntry, AuditError, AuditSink};
use toolgate_storage::{GroupCommit, LockFile};

/// A callback run at a named crash point (`"audit.mid_record"`), for crash-consistency tests.
///
/// The reference server's hook creates a marker file and sleeps so a test can kill the process while
/// half a batch is on disk.
#[cfg(feature = "fault-injection")]
pub type FaultHook = std::sync::Arc<dyn Fn(&'static str) + Send + Sync>;

/// Checkpoint interval used when a key is set and [`AuditConfig::checkpoint_every`] is not.
pub const DEFAULT_CHECKPOINT_EVERY: u64 = 1000;

/// How to open a [`FileAuditLog`].
pub struct AuditConfig {
    path: PathBuf,
    checkpoint_key: Option<HmacKey>,
    checkpoint_every: Option<u64>,
    checkpoint_mirror: Option<PathBuf>,
    segment_bytes: Option<u64>,
    storage: Arc<dyn Storage>,
    #[cfg(feature = "fault-injection")]
    fault_hook: Option<FaultHook>,
}

impl AuditConfig {
    /// A log at `path` (conventionally `LEDGER_DIR/audit.jsonl`), without checkpoints or rotation.
    pub fn new(path: impl Into<PathBuf>) -> Self {
        AuditConfig {
            path: path.into(),
            checkpoint_key: None,
            checkpoint_every: None,
            checkpoint_mirror: None,
            segment_bytes: None,
            storage: Arc::new(FsStorage),
            #[cfg(feature = "fault-injection")]
            fault_hook: None,
        }
    }

    /// The storage the log's appends and syncs go through (default: the real filesystem). Tests
    /// pass a `toolgate_storage::FaultyStorage` to count them or fail one.
    pub fn storage(mut self, storage: Arc<dyn Storage>) -> Self {
        self.storage = storage;
        self
    }

    /// Signs a checkpoint `(count, head, ts)` with `key` into `<stem>.checkpoints.jsonl` beside
    /// the log every [`checkpoint_every`](Self::checkpoint_every) records, at
    /// [`FileAuditLog::checkpoint`] and when the log is dropped. Keep the key outside the ledger:
    /// whoever holds it can forge checkpoints.
    pub fn checkpoint_key(mut self, key: HmacKey) -> Self {
        self.checkpoint_key = Some(key);
        self
    }

    /// Records between automatic checkpoints (default 1000; 0 is treated as 1).
    pub fn checkpoint_every(mut self, records: u64) -> Self {
        self.checkpoint_every = Some(records.max(1));
        self
    }

    /// A second checkpoint file (ideally on another volume) that receives every checkpoint line
    /// too, so that deleting or rewriting the ledger's checkpoint file is detectable.
    pub fn checkpoint_mirror(mut self, path: impl Into<PathBuf>) -> Self {
        self.checkpoint_mirror = Some(path.into());
        self
    }

    /// Rotates the active file into a segment `<stem>.<first seq, 20 digits>.<ext>` before an
    /// append once it holds at least `bytes` bytes. The chain and `seq` continue across segments.
    pub fn segment_bytes(mut self, bytes: u64) -> Self {
        self.segment_bytes = Some(bytes.max(1));
        self
    }

    /// Runs `hook("audit.mid_record")` in every batch write after half of the batch's bytes are
    /// written and fsynced, before the rest.
    #[cfg(feature = "fault-injection")]
    pub fn fault_hook(mut self, hook: FaultHook) -> Self {
        self.fault_hook = Some(hook);
        self
    }
}

impl std::fmt::Debug for AuditConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let mut s = f.debug_struct("AuditConfig");
        s.field("path", &self.path)
            .field("checkpoint_key", &self.checkpoint_key)
            .field("checkpoint_every", &self.checkpoint_every)
            .field("checkpoint_mirror", &self.checkpoint_mirror)
            .field("segment_bytes", &self.segment_bytes);
        #[cfg(feature = "fault-injection")]
        s.field("fault_hook", &self.fault_hook.as_ref().map(|_| "<hook>"));
        s.finish()
    }
}

/// What the log repaired: a torn tail cut off, saved and recorded.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct Recovery {
    /// How many bytes followed the last newline.
    pub torn_bytes: u64,
    /// Where those bytes were saved (`<logname>.torn-<ts_ns>` beside the log).
    pub saved_as: PathBuf,
    /// SHA-256 of the torn bytes (the recovery record's `args_digest`).
    pub torn_sha256: Sha256Digest,
    /// The `sha256` of the `audit/recover` record that documents the repair.
    pub record_sha256: Sha256Digest,
}

/// Counters of one handle since it was opened, for tests and benchmarks of group commit.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct AuditStats {
    /// Records written by this handle (appends and repair records).
    pub appends: u64,
    /// `fsync`s of the log file by this handle (the fault hook's extra one included).
    pub fsyncs: u64,
    /// Group-commit batches written (each is one `write` and one `fsync`).
    pub batches: u64,
    /// Checkpoints written.
    pub checkpoints: u64,
    /// Checkpoints that could not be written (retried at the next append).
    pub checkpoint_failures: u64,
    /// Appends waiting for a leader right now.
    pub queued: u64,
}

#[derive(Debug, Default)]
struct Counters {
    appends: AtomicU64,
    fsyncs: AtomicU64,
    batches: AtomicU64,
    checkpoints: AtomicU64,
    checkpoint_failures: AtomicU64,
}

impl Counters {
    fn add(counter: &AtomicU64, n: u64) {
        counter.fetch_add(n, Ordering::Relaxed);
    }
}

/// Checkpoint settings of an open log.
struct Checkpoints {
    key: HmacKey,
    every: u64,
    path: PathBuf,
    mirror: Option<PathBuf>,
}

/// The append-only audit log file.
pub struct FileAuditLog {
    path: PathBuf,
    storage: Arc<dyn Storage>,
    /// The `<stem>.lock` file whose `flock` serializes writers across processes.
    lock_file: LockFile,
    checkpoints: Option<Checkpoints>,
    segment_bytes: Option<u64>,
    /// The active file and what this handle believes about the chain; held by the batch leader.
    io: Mutex<Io>,
    /// Appends waiting for a leader, and the results leaders hand back.
    group: GroupCommit<AuditEntry, Result<AppendReceipt, AuditError>>,
    recovered: OnceLock<Recovery>,
    counters: Counters,
    #[cfg(feature = "fault-injection")]
    fault_hook: Option<FaultHook>,
}

/// What this handle believes about the files; valid only while it holds the file lock or as a hint.
struct Io {
    /// The active file, opened for read and append (O_APPEND makes every write land at the end);
    /// its identity tells that another process rotated it, and its known end is the length after
    /// our last write, unknown (after a failed write or a panic) when the tail must be re-read at
    /// the next append.
    journal: Journal,
    head: Sha256Digest,
    /// The `seq` of the last record, which is also the number of records in the whole log.
    seq: u64,
    /// The `count` of the newest checkpoint this handle knows of.
    last_checkpoint: u64,
}

impl std::fmt::Debug for FileAuditLog {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FileAuditLog")
            .field("path", &self.path)
            .field("recovered", &self.recovered.get())
            .finish_non_exhaustive()
    }
}

/// Nanoseconds since the UNIX epoch, as RFC 8785 will write them; 0 if the clock is before 1970:
/// every record's `ts`.
pub fn now_ns() -> u64 {
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos());
    representable(u64::try_from(nanos).unwrap_or(u64::MAX))
}

/// Opens (creating, with a durable directory entry) the regular file at `path` as a plain journal
/// for read and append, never blocking on a FIFO and following a link only with
/// [`Symlinks::Follow`] (the operator's mirror); the log and its checkpoint file sit in the
/// ledger, where the layout has no links.
fn open_journal(
    storage: &Arc<dyn Storage>,
    path: &Path,
    symlinks: Symlinks,
) -> Result<Journal, AuditError> {
    let config = JournalConfig::new(Layout::Plain, max_line())
        .symlinks(symlinks)
        .missing(Missing::CreateDurably);
    Journal::open(Arc::clone(storage), path, config).map_err(journal_err)
}

/// A failed step of the floor's journal in the log's words (the actions its errors always named).
fn journal_err(e: JournalError) -> AuditError {
    match e {
        JournalError::Io { step, path, source } => {
            let action = match step {
                JournalStep::Open => "open",
                JournalStep::Create => "create",
                JournalStep::Stat => "stat",
                JournalStep::Read => "read the end of",
                JournalStep::Write => "write",
                JournalStep::Truncate => "truncate the torn tail of",
                JournalStep::Sync => "fsync",
                _ => "use",
            };
            AuditError::Io {
                action,
                path,
                source,
            }
        }
        JournalError::Dir(e) => e.into(),
        JournalError::LineTooLong { path, limit, .. } => AuditError::CorruptTail {
            path,
            detail: format!("no line break within the last {limit} bytes"),
        },
        JournalError::DamagedLine { path, offset } => AuditError::CorruptTail {
            path,
            detail: format!("the line at offset {offset} is unfinished yet more lines follow"),
        },
        other => AuditError::Io {
            action: "use",
            path: other.path().to_path_buf(),
            source: io::Error::other(other.to_string()),
        },
    }
}

fn max_line() -> u64 {
    u64::try_from(MAX_LINE_BYTES).unwrap_or(u64::MAX)
}

/// The number of `\n` in `file`, for a log written before records carried `seq`.
fn count_lines(path: &Path) -> Result<u64, AuditError> {
    let mut reader = BufReader::new(open_read(path)?);
    let mut count = 0u64;
    loop {
        let buf = reader.fill_buf().map_err(io_err("read", path))?;
        if buf.is_empty() {
            return Ok(count);
        }
        count += u64::try_from(buf.iter().filter(|&&b| b == b'\n').count()).unwrap_or(0);
        let n = buf.len();
        reader.consume(n);
    }
}

/// The newest checkpoint's `count` in the checkpoint file at `path`; 0 when there is none or the
/// last line cannot be read (the cost is at most one extra checkpoint).
fn last_checkpoint_count(path: &Path) -> u64 {
    let Ok(file) = toolgate_storage::open_regular_read(path, Symlinks::Refuse) else {
        return 0;
    };
    let Ok(len) = file.metadata().map(|m| m.len()) else {
        return 0;
    };
    read_tail(&file, path, len, max_line())
        .ok()
        .and_then(|tail| tail.last_line)
        .and_then(|line| Checkpoint::parse(&line).ok())
        .map_or(0, |cp| cp.count)
}

/// Appends `line` to the checkpoint file at `path` and fsyncs it. A torn line left by a crash in
/// an earlier checkpoint write is cut off first: it was never acknowledged and carries no
/// signature, and leaving it would make the next line unparseable.
fn append_durably(
    storage: &Arc<dyn Storage>,
    path: &Path,
    line: &[u8],
    symlinks: Symlinks,
) -> Result<(), AuditError> {
    let mut journal = open_journal(storage, path, symlinks)?;
    let len = journal.file_len().map_err(journal_err)?;
    let tail = journal.read_tail(len).map_err(journal_err)?;
    if !tail.torn.is_empty() {
        journal.truncate(tail.complete_len).map_err(journal_err)?;
    }
    journal.append(line).map_err(journal_err)?;
    journal.sync_data().map_err(journal_err)
}

impl FileAuditLog {
    /// Opens (creating if needed) the log at `path`; the same as `open_with(AuditConfig::new(path))`.
    pub fn open(path: impl Into<PathBuf>) -> Result<Self, AuditError> {
        Self::open_with(AuditConfig::new(path))
    }

    /// Opens (creating if needed) the log described by `config`.
    ///
    /// Reads only the end of the file to recover the chain head (and, once, counts the lines of a
    /// log written before records carried `seq`). A torn tail is repaired (see
    /// [`FileAuditLog::recovered`]); a last line that is not a valid record fails with
    /// [`AuditError::CorruptTail`] and leaves the file untouched.
    pub fn open_with(config: AuditConfig) -> Result<Self, AuditError> {
        let path = config.path;
        if path.file_name().is_none() {
            return Err(AuditError::InvalidPath { path });
        }
        let journal = open_journal(&config.storage, &path, Symlinks::Refuse)?;
        let lock_file = LockFile::open(lock_path(&path))?;
        let checkpoints = config.checkpoint_key.map(|key| Checkpoints {
            key,
            every: config.checkpoint_every.unwrap_or(DEFAULT_CHECKPOINT_EVERY),
            path: checkpoints_path(&path),
            mirror: config.checkpoint_mirror,
        });
        let log = FileAuditLog {
            path,
            storage: config.storage,
            lock_file,
            checkpoints,
            segment_bytes: config.segment_bytes,
            io: Mutex::new(Io {
                journal,
                head: Sha256Digest::ZERO,
                seq: 0,
                last_checkpoint: 0,
            }),
            group: GroupCommit::new(|| Err(AuditError::WriterPanicked)),
            recovered: OnceLock::new(),
            counters: Counters::default(),
            #[cfg(feature = "fault-injection")]
            fault_hook: config.fault_hook,
        };
        {
            let mut io = log.lock_io();
            let _lock = log.lock_file.lock()?;
            // Nothing is known of the chain yet (a file created just now may continue segments).
            io.journal.forget_end();
            log.refresh(&mut io)?;
        }
        Ok(log)
    }

    /// The path of the active log file.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The first torn-tail repair this handle made (at open, or during an append after another
    /// process crashed mid-write), if any.
    pub fn recovered(&self) -> Option<&Recovery> {
        self.recovered.get()
    }

    /// The `sha256` of the last record as of this handle's open or last append. Other processes may
    /// have appended since.
    pub fn head(&self) -> Sha256Digest {
        self.lock_io().head
    }

    /// The `seq` of the last record (the number of records in the whole log) as of this handle's
    /// open or last append.
    pub fn seq(&self) -> u64 {
        self.lock_io().seq
    }

    /// This handle's counters: records, fsyncs, batches, checkpoints.
    pub fn stats(&self) -> AuditStats {
        let load = |c: &AtomicU64| c.load(Ordering::Relaxed);
        AuditStats {
            appends: load(&self.counters.appends),
            fsyncs: load(&self.counters.fsyncs),
            batches: load(&self.counters.batches),
            checkpoints: load(&self.counters.checkpoints),
            checkpoint_failures: load(&self.counters.checkpoint_failures),
            queued: u64::try_from(self.group.queued()).unwrap_or(u64::MAX),
        }
    }

    /// Writes a signed checkpoint of the current head now, if records were appended (by any
    /// process) since the newest checkpoint in the checkpoint file. `Ok(None)` when there is
    /// nothing to sign or no key is configured. The server calls it at clean shutdown; `Drop` does
    /// the same on a best-effort basis.
    pub fn checkpoint(&self) -> Result<Option<Checkpoint>, AuditError> {
        let Some(cps) = &self.checkpoints else {
            return Ok(None);
        };
        let mut io = self.lock_io();
        let _lock = self.lock_file.lock()?;
        self.refresh(&mut io)?;
        io.last_checkpoint = last_checkpoint_count(&cps.path);
        if io.seq <= io.last_checkpoint {
            return Ok(None);
        }
        self.write_checkpoint(&mut io, cps).map(Some)
    }

    fn lock_io(&self) -> MutexGuard<'_, Io> {
        match self.io.lock() {
            Ok(guard) => guard,
            Err(poisoned) => {
                // A panic (for instance in a fault hook) interrupted a write, so the file may end
                // with a torn line and our view is stale: forget the length so that the next append
                // re-reads the tail under the file lock and repairs it.
                let mut guard = poisoned.into_inner();
                guard.journal.forget_end();
                self.io.clear_poison();
                guard
            }
        }
    }

    /// Brings `io` up to date with the files. Must be called with the file lock held.
    ///
    /// If the active file was rotated by another process (its path now names another inode, or
    /// nothing), reopens it; if its length differs from our last write, re-reads the tail.
    fn refresh(&self, io: &mut Io) -> Result<(), AuditError> {
        if io.journal.at_path().map_err(journal_err)? != AtPath::Same {
            // A crash between a rotation's rename and the creation of the new active file leaves
            // no active file; creating it here continues the chain from the last segment.
            io.journal
                .reopen(Missing::CreateDurably)
                .map_err(journal_err)?;
            io.journal.forget_end();
        }
        let len = io.journal.file_len().map_err(journal_err)?;
        if io.journal.end() != Some(len) {
            // Another process appended (or crashed mid-append) since our last write: chain onto
            // what is really the last line, never onto our stale head, so the chain cannot fork.
            self.resync(io, len)?;
        }
        Ok(())
    }

    /// Re-reads the head and `seq` from the last line of the first `len` bytes (or, when the
    /// active file has no complete line, from the last segment) and repairs a torn tail. Must be
    /// called with the file lock held.
    fn resync(&self, io: &mut Io, len: u64) -> Result<(), AuditError> {
        let tail = io.journal.read_tail(len).map_err(journal_err)?;
        let link = self.link_of_tail(&tail);
        if link.is_err() {
            // Not chained onto anything: the next append must look again (and fail closed again).
            io.journal.forget_end();
        }
        let (head, seq) = link?;
        io.head = head;
        io.seq = seq;
        if let Some(cps) = &self.checkpoints {
            io.last_checkpoint = last_checkpoint_count(&cps.path);
        }
        if !tail.torn.is_empty() {
            self.repair_torn_tail(io, tail.complete_len, &tail.torn)?;
        }
        Ok(())
    }

    /// The `(sha256, seq)` the chain continues from, given the active file's tail: its last
    /// complete line, or when it has none the last segment's.
    fn link_of_tail(
        &self,
        tail: &toolgate_storage::Tail,
    ) -> Result<(Sha256Digest, u64), AuditError> {
        Ok(match &tail.last_line {
            Some(line) => self.link_of(&self.path, line)?,
            None => match list_segments(&self.path)?.last() {
                None => (Sha256Digest::ZERO, 0),
                Some((_, segment)) => {
                    let file = open_read(segment)?;
                    let seg_len = file.metadata().map_err(io_err("stat", segment))?.len();
                    let seg_tail =
                        read_tail(&file, segment, seg_len, max_line()).map_err(journal_err)?;
                    match &seg_tail.last_line {
                        Some(line) if seg_tail.torn.is_empty() => self.link_of(segment, line)?,
                        _ => {
                            return Err(AuditError::CorruptTail {
                                path: segment.clone(),
                                detail: "the newest segment is empty or ends with a torn line, \
                                         which rotation never produces"
                                    .into(),
                            });
                        }
                    }
                }
            },
        })
    }

    /// The `(sha256, seq)` of a log's last complete line, counting lines once for a log written
    /// before records carried `seq`.
    fn link_of(&self, file: &Path, line: &[u8]) -> Result<(Sha256Digest, u64), AuditError> {
        let link = check_line(line).map_err(|fault| AuditError::CorruptTail {
            path: file.to_path_buf(),
            detail: format!("last complete line is {}: {}", fault.kind, fault.detail),
        })?;
        let seq = match link.seq {
            SeqField::Valid(n) => n,
            SeqField::Absent => {
                let mut count = 0u64;
                for (_, segment) in list_segments(&self.path)? {
                    count += count_lines(&segment)?;
                }
                if file == self.path {
                    count += count_lines(&self.path)?;
                }
                count
            }
            SeqField::Invalid => {
                return Err(AuditError::CorruptTail {
                    path: file.to_path_buf(),
                    detail: "last complete line has a seq that is not a positive integer".into(),
                });
            }
        };
        Ok((link.sha256, seq))
    }

    /// Saves the torn bytes beside the log, truncates them away, and records the repair in the chain.
    /// The order makes a crash at any step safe: the bytes are durable elsewhere before they leave
    /// the log, and a repeated repair only saves a second copy.
    fn repair_torn_tail(
        &self,
        io: &mut Io,
        complete_len: u64,
        torn: &[u8],
    ) -> Result<(), AuditError> {
        let ts = now_ns();
        let saved_as = self.save_torn(torn, ts)?;
        io.journal.truncate(complete_len).map_err(journal_err)?;
        // An fsync of the file (not the floor's fdatasync), as the truncation always had.
        if let Err(e) = io.journal.file().sync_all() {
            io.journal.forget_end();
            return Err(io_err("fsync", &self.path)(e));
        }
        Counters::add(&self.counters.fsyncs, 1);

        let torn_sha256 = Sha256Digest::of(torn);
        let saved_name = saved_as
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        let mut entry = AuditEntry::tool_call(
            "recovery",
            "audit",
            AuditDecision::Allow,
            crate::Outcome::Recovered,
            torn_sha256,
        )
        .with_reason(crate::Reason::TornTail);
        entry.method = "audit/recover".into();
        let torn_bytes = u64::try_from(torn.len()).unwrap_or(u64::MAX);
        let extra = vec![
            ("torn_bytes", Value::from(torn_bytes)),
            ("saved_as", Value::from(saved_name)),
        ];
        let sealed = seal(&entry, extra, ts, io.seq + 1, io.head);
        self.write_lines(io, &sealed.line, false)?;
        io.seq += 1;
        io.head = sealed.sha256;
        // Only the first repair is kept; later ones are visible in the chain itself.
        let _ = self.recovered.set(Recovery {
            torn_bytes,
            saved_as,
            torn_sha256,
            record_sha256: sealed.sha256,
        });
        Ok(())
    }

    /// Writes `torn` durably to a new `<logname>.torn-<ts>` file through the log's storage and
    /// returns its path.
    ///
    /// The bytes go to a temporary file first (written and fdatasynced), which is then linked to
    /// its evidence name (never replacing an earlier repair's file) and the directory fsynced. So a
    /// `.torn-*` file exists only with all of its bytes: a full disk or any other failed step leaves
    /// no empty or partial evidence file, and the caller keeps the log unchanged.
    fn save_torn(&self, torn: &[u8], ts: u64) -> Result<PathBuf, AuditError> {
        let storage = self.storage.as_ref();
        let dir = parent_dir(&self.path);
        let name = self
            .path
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        let not_saved = |source| AuditError::TornTailNotSaved {
            log: self.path.clone(),
            torn_bytes: u64::try_from(torn.len()).unwrap_or(u64::MAX),
            source,
        };
        let temp_stem = format!("{name}.torn");
        // A clash (an earlier repair in the same ns) tries the next number.
        let mut suffix = ts;
        let candidate = loop {
            let candidate = dir.join(format!("{name}.torn-{suffix}"));
            // Dropping `temp` (on error, or once linked) removes the temporary name.
            let temp = TempFile::write(storage, &dir, &temp_stem, torn).map_err(not_saved)?;
            match temp.publish_new(&candidate).map_err(not_saved)? {
                Published::Created => break candidate,
                Published::Exists if suffix < ts.saturating_add(1000) => suffix += 1,
                Published::Exists => {
                    return Err(not_saved(StorageError::new(
                        "find a free evidence name (1000 were taken), last",
                        candidate,
                        io::Error::from(io::ErrorKind::AlreadyExists),
                    )));
                }
            }
        };
        if let Err(e) = toolgate_storage::fsync_dir(storage, &dir) {
            // The new name might not survive a power loss. The log keeps the torn bytes, so the
            // retried repair saves them again; removing this copy keeps one evidence file per
            // repair (best effort: if it stays, it is complete).
            let _ = storage.remove(&candidate);
            return Err(not_saved(e));
        }
        Ok(candidate)
    }

    /// Writes `bytes` (whole lines) to the active file and fsyncs, keeping the journal's known
    /// end honest: until the write and fsync succeed the file may hold part of the lines, and an
    /// unknown end makes the next append re-read and repair the tail. Must be called with the file
    /// lock held.
    fn write_lines(&self, io: &mut Io, bytes: &[u8], injectable: bool) -> Result<(), AuditError> {
        let written = self
            .write_all(&mut io.journal, bytes, injectable)
            .and_then(|()| io.journal.sync_data().map_err(journal_err));
        if written.is_err() {
            io.journal.forget_end();
        }
        written?;
        Counters::add(&self.counters.fsyncs, 1);
        Ok(())
    }

    #[cfg_attr(not(feature = "fault-injection"), allow(unused_variables))]
    fn write_all(
        &self,
        journal: &mut Journal,
        bytes: &[u8],
        injectable: bool,
    ) -> Result<(), AuditError> {
        #[cfg(feature = "fault-injection")]
        if injectable && let Some(hook) = &self.fault_hook {
            let (first, rest) = bytes.split_at(bytes.len() / 2);
            journal.append(first).map_err(journal_err)?;
            // Half a batch is made durable so that a kill at this point leaves a real torn tail.
            journal.sync_data().map_err(journal_err)?;
            Counters::add(&self.counters.fsyncs, 1);
            hook("audit.mid_record");
            return journal.append(rest).map_err(journal_err);
        }
        // One write of the whole batch: with O_APPEND the kernel places it at the end in one
        // piece in the normal case, and the file lock keeps other writers out in every case.
        journal.append(bytes).map_err(journal_err)
    }

    /// Renames the active file into a segment once it has reached `segment_bytes`, and starts a
    /// fresh active file. Must be called with the file lock held, after [`Self::refresh`].
    fn rotate_if_full(&self, io: &mut Io) -> Result<(), AuditError> {
        let (Some(limit), Some(len)) = (self.segment_bytes, io.journal.end()) else {
            return Ok(());
        };
        if len == 0 || len < limit {
            return Ok(());
        }
        let first_seq = self.first_seq_of_active(io)?;
        let target = segment_path(&self.path, first_seq);
        if target.exists() {
            return Err(AuditError::SegmentExists { path: target });
        }
        // Every append already fsynced its data; sync_all also settles the file's metadata before
        // its name changes.
        io.journal
            .file()
            .sync_all()
            .map_err(io_err("fsync", &self.path))?;
        self.storage
            .rename(&self.path, &target)
            .map_err(io_err("rename into a segment", &self.path))?;
        let dir = parent_dir(&self.path);
        toolgate_storage::fsync_dir(self.storage.as_ref(), &dir)?;
        // If we crash here, the next open finds no active file, creates it and continues the chain
        // from this segment's last record.
        // Created here, so its end is known: 0.
        io.journal
            .reopen(Missing::CreateDurably)
            .map_err(journal_err)?;
        Ok(())
    }

    /// The `seq` of the active file's first record (for the segment name).
    fn first_seq_of_active(&self, io: &Io) -> Result<u64, AuditError> {
        let mut reader = BufReader::new(io.journal.file());
        let mut line = Vec::new();
        // Reads through a fresh handle position: File's reads share the offset, and appends ignore
        // it (O_APPEND), so seeking to the start is harmless.
        use std::io::Seek;
        reader
            .seek(io::SeekFrom::Start(0))
            .map_err(io_err("read", &self.path))?;
        reader
            .take(max_line())
            .read_until(b'\n', &mut line)
            .map_err(io_err("read", &self.path))?;
        if line.pop() != Some(b'\n') {
            return Err(AuditError::CorruptTail {
                path: self.path.clone(),
                detail: "the first line of the active file is incomplete".into(),
            });
        }
        let fault = |detail: String| AuditError::CorruptTail {
            path: self.path.clone(),
            detail,
        };
        let link = check_line(&line)
            .map_err(|f| fault(format!("first line is {}: {}", f.kind, f.detail)))?;
        match link.seq {
            SeqField::Valid(n) => Ok(n),
            // A log written before `seq` existed starts right after the segments (if any).
            SeqField::Absent => {
                let mut count = 0;
                for (_, segment) in list_segments(&self.path)? {
                    count += count_lines(&segment)?;
                }
                Ok(count + 1)
            }
            SeqField::Invalid => Err(fault("first line has an invalid seq".into())),
        }
    }

    /// Signs and durably appends a checkpoint of `io`'s head to the checkpoint file and its mirror.
    fn write_checkpoint(&self, io: &mut Io, cps: &Checkpoints) -> Result<Checkpoint, AuditError> {
        let checkpoint = Checkpoint::sign(&cps.key, io.seq, io.head, now_ns());
        let line = checkpoint.line();
        let result =
            append_durably(&self.storage, &cps.path, &line, Symlinks::Refuse).and_then(|()| {
                match &cps.mirror {
                    Some(mirror) => append_durably(&self.storage, mirror, &line, Symlinks::Follow),
                    None => Ok(()),
                }
            });
        match result {
            Ok(()) => {
                io.last_checkpoint = io.seq;
                Counters::add(&self.counters.checkpoints, 1);
                Ok(checkpoint)
            }
            Err(e) => {
                Counters::add(&self.counters.checkpoint_failures, 1);
                Err(e)
            }
        }
    }

    /// Writes one group-commit batch: lock, refresh, rotate, chain every entry, one write, one
    /// fsync, then a checkpoint if one is due. Returns one result per entry, in order.
    fn write_batch(&self, batch: Vec<AuditEntry>) -> Vec<Result<AppendReceipt, AuditError>> {
        let mut io = self.lock_io();
        // `None`: sealed into this batch's write, answered once the write is durable.
        let mut results: Vec<Option<Result<AppendReceipt, AuditError>>> =
            Vec::with_capacity(batch.len());
        let written = (|| {
            let _lock = self.lock_file.lock()?;
            self.refresh(&mut io)?;
            self.rotate_if_full(&mut io)?;
            let mut bytes = Vec::new();
            let mut receipts = Vec::with_capacity(batch.len());
            let (mut seq, mut head) = (io.seq, io.head);
            for entry in &batch {
                let ts = now_ns();
                let sealed = seal(entry, Vec::new(), ts, seq + 1, head);
                if sealed.line.len() > MAX_LINE_BYTES {
                    results.push(Some(Err(AuditError::RecordTooLarge {
                        len: sealed.line.len(),
                        max: MAX_LINE_BYTES,
                    })));
                    continue;
                }
                results.push(None);
                seq += 1;
                head = sealed.sha256;
                bytes.extend_from_slice(&sealed.line);
                receipts.push(AppendReceipt {
                    seq,
                    sha256: sealed.sha256,
                    ts,
                });
            }
            if receipts.is_empty() {
                return Ok(receipts);
            }
            self.write_lines(&mut io, &bytes, true)?;
            io.seq = seq;
            io.head = head;
            let count = u64::try_from(receipts.len()).unwrap_or(u64::MAX);
            Counters::add(&self.counters.appends, count);
            Counters::add(&self.counters.batches, 1);
            if let Some(cps) = &self.checkpoints
                && io.seq.saturating_sub(io.last_checkpoint) >= cps.every
            {
                // The records are durable whatever happens here. A failed checkpoint is counted
                // and retried at the next append (the condition above stays true); failing the
                // appends would report durable records as lost.
                let _ = self.write_checkpoint(&mut io, cps);
            }
            Ok::<_, AuditError>(receipts)
        })();
        // Entries not yet answered (all of them, when the failure came before sealing) get the
        // batch's error, or their receipts in order.
        results.resize_with(batch.len(), || None);
        match written {
            Ok(receipts) => {
                let mut receipts = receipts.into_iter();
                results
                    .into_iter()
                    .map(|r| match r {
                        Some(done) => done,
                        None => receipts.next().ok_or(AuditError::WriterPanicked),
                    })
                    .collect()
            }
            Err(e) => results
                .into_iter()
                .map(|r| match r {
                    Some(done) => done,
                    None => Err(e.duplicate()),
                })
                .collect(),
        }
    }
}

impl AuditSink for FileAuditLog {
    fn checkpoint(&self) -> Result<Option<Checkpoint>, AuditError> {
        FileAuditLog::checkpoint(self)
    }

    /// Group commit: the first appender to find no batch in progress becomes the leader, takes
    /// every queued entry (its own included), writes them with one `write` and one `fsync`, and
    /// hands each follower its own receipt. An append returns only after its own record is durable.
    fn append(&self, entry: &AuditEntry) -> Result<AppendReceipt, AuditError> {
        self.group.submit(entry.clone(), |jobs, _| {
            let (entries, callers): (Vec<AuditEntry>, Vec<_>) = jobs.into_iter().unzip();
            let results = self.write_batch(entries);
            for (caller, result) in callers.into_iter().zip(results) {
                caller.answer(result);
            }
        })
    }

    fn head(&self) -> Result<ChainHead, AuditError> {
        let mut io = self.lock_io();
        let _lock = self.lock_file.lock()?;
        self.refresh(&mut io)?;
        Ok(ChainHead {
            seq: io.seq,
            sha256: io.head,
        })
    }

    fn export_checkpoints(&self, out: &mut dyn std::io::Write) -> Result<u64, AuditError> {
        let Some(cps) = &self.checkpoints else {
            return Ok(0);
        };
        let mut written = Ok(0);
        crate::verify::for_each_checkpoint_line(&cps.path, |_, line| {
            if let Ok(count) = &mut written {
                written = out
                    .write_all(line)
                    .and_then(|()| out.write_all(b"\n"))
                    .map(|()| *count + 1)
                    .map_err(|source| AuditError::Export { source });
            }
        })?;
        written
    }

    fn export(&self, out: &mut dyn std::io::Write) -> Result<u64, AuditError> {
        // Under the lock, so no rotation or append moves the files while they are copied; only
        // complete lines are copied (a torn tail of a crashed writer is not part of the chain).
        let mut io = self.lock_io();
        let _lock = self.lock_file.lock()?;
        self.refresh(&mut io)?;
        let mut records = 0;
        let limit = max_line();
        for path in crate::segments::chain_files(&self.path)? {
            let mut reader = io::BufReader::new(open_read(&path)?);
            let mut line = Vec::new();
            let mut line_no = 0u64;
            loop {
                line.clear();
                // Bounded: a line longer than any record could be (appends refuse those) is
                // damage, reported, never read into memory whole.
                let read = (&mut reader)
                    .take(limit.saturating_add(1))
                    .read_until(b'\n', &mut line)
                    .map_err(io_err("read", &path))?;
                line_no += 1;
                if !line.ends_with(b"\n") {
                    if u64::try_from(read).unwrap_or(u64::MAX) > limit {
                        return Err(AuditError::BadRecord {
                            path,
                            line: line_no,
                            detail: format!(
                                "longer than {limit} bytes, the longest record the log accepts"
                            ),
                        });
                    }
                    break; // the end, or a torn tail
                }
                out.write_all(&line)
                    .map_err(|source| AuditError::Export { source })?;
                records += 1;
            }
        }
        Ok(records)
    }
}

impl Drop for FileAuditLog {
    fn drop(&mut self) {
        // Best effort: a clean shutdown anchors the records written since the last checkpoint.
        // Errors cannot be reported from Drop; `checkpoint()` is the way to see them.
        let _ = self.checkpoint();
    }
}
