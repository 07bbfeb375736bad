//! The embedded file backend: one JSONL file, appended under an exclusive file lock and fsynced per
//! record, with torn-tail recovery.
//!
//! Appends cost O(1): the chain head lives in memory and is refreshed from the file's last line only
//! when another process has written since our own last append (detected by the file length).

use std::fs::{self, File, OpenOptions};
use std::io::{self, Write};
use std::path::{Path, PathBuf};
use std::sync::{Mutex, MutexGuard, OnceLock};
use std::time::{SystemTime, UNIX_EPOCH};

use serde_json::Value;
use toolgate_canon::Sha256Digest;

use crate::record::{MAX_LINE_BYTES, check_line, representable, seal};
use crate::tail::{TailError, read_tail};
use crate::{AppendReceipt, AuditEntry, AuditError, AuditSink, Decision};

/// A callback run at a named crash point (`"audit.mid_record"`), for crash-consistency tests.
///
/// The reference server's hook creates a marker file and sleeps so a test can kill the process while
/// half a record is on disk.
#[cfg(feature = "fault-injection")]
pub type FaultHook = std::sync::Arc<dyn Fn(&'static str) + Send + Sync>;

/// How to open a [`FileAuditLog`].
pub struct AuditConfig {
    path: PathBuf,
    #[cfg(feature = "fault-injection")]
    fault_hook: Option<FaultHook>,
}

impl AuditConfig {
    /// A log at `path` (conventionally `LEDGER_DIR/audit.jsonl`).
    pub fn new(path: impl Into<PathBuf>) -> Self {
        AuditConfig {
            path: path.into(),
            #[cfg(feature = "fault-injection")]
            fault_hook: None,
        }
    }

    /// Runs `hook("audit.mid_record")` in every append after half of the line is written and
    /// fsynced, before the rest.
    #[cfg(feature = "fault-injection")]
    pub fn fault_hook(mut self, hook: FaultHook) -> Self {
        self.fault_hook = Some(hook);
        self
    }
}

impl std::fmt::Debug for AuditConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let mut s = f.debug_struct("AuditConfig");
        s.field("path", &self.path);
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

/// The append-only audit log file.
pub struct FileAuditLog {
    path: PathBuf,
    /// Opened for read and append: O_APPEND makes every write land at the end even when another
    /// process has grown the file, and reads serve the tail look-ups.
    file: File,
    state: Mutex<State>,
    recovered: OnceLock<Recovery>,
    #[cfg(feature = "fault-injection")]
    fault_hook: Option<FaultHook>,
}

/// What this handle believes about the file; valid only while it holds the file lock or as a hint.
#[derive(Debug)]
struct State {
    head: Sha256Digest,
    /// The file length after our last write; `None` when unknown (after a failed write or a panic),
    /// which forces a tail re-read at the next append.
    known_len: Option<u64>,
}

impl std::fmt::Debug for FileAuditLog {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FileAuditLog")
            .field("path", &self.path)
            .field("recovered", &self.recovered.get())
            .finish_non_exhaustive()
    }
}

/// Holds the exclusive advisory lock on the log file; released when dropped, including when a
/// panic unwinds through an append, so a failing thread cannot block other processes.
struct FileLock<'a>(&'a File);

impl<'a> FileLock<'a> {
    fn acquire(file: &'a File, path: &Path) -> Result<Self, AuditError> {
        file.lock().map_err(io_err("lock", path))?;
        Ok(FileLock(file))
    }
}

impl Drop for FileLock<'_> {
    fn drop(&mut self) {
        // Closing the descriptor would release the lock too; an unlock error leaves nothing to do.
        let _ = self.0.unlock();
    }
}

fn io_err<'a>(action: &'static str, path: &'a Path) -> impl FnOnce(io::Error) -> AuditError + 'a {
    move |source| AuditError::Io {
        action,
        path: path.to_path_buf(),
        source,
    }
}

/// Nanoseconds since the UNIX epoch, as RFC 8785 will write them; 0 if the clock is before 1970.
fn now_ns() -> u64 {
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos());
    representable(u64::try_from(nanos).unwrap_or(u64::MAX))
}

/// The directory holding `path` (`.` for a bare file name).
fn parent_dir(path: &Path) -> PathBuf {
    match path.parent() {
        Some(dir) if !dir.as_os_str().is_empty() => dir.to_path_buf(),
        _ => PathBuf::from("."),
    }
}

/// Makes a new directory entry in `dir` durable.
#[cfg(unix)]
fn sync_dir(dir: &Path) -> Result<(), AuditError> {
    File::open(dir)
        .and_then(|d| d.sync_all())
        .map_err(io_err("fsync directory", dir))
}

/// Directories cannot be opened for fsync on this platform; see the durability assumptions in
/// docs/audit-format.md.
#[cfg(not(unix))]
fn sync_dir(_dir: &Path) -> Result<(), AuditError> {
    Ok(())
}

impl FileAuditLog {
    /// Opens (creating if needed) the log at `path`; the same as `open_with(AuditConfig::new(path))`.
    pub fn open(path: impl Into<PathBuf>) -> Result<Self, AuditError> {
        Self::open_with(AuditConfig::new(path))
    }

    /// Opens (creating if needed) the log described by `config`.
    ///
    /// Reads only the end of the file to recover the chain head. A torn tail is repaired (see
    /// [`FileAuditLog::recovered`]); a last line that is not a valid record fails with
    /// [`AuditError::CorruptTail`] and leaves the file untouched.
    pub fn open_with(config: AuditConfig) -> Result<Self, AuditError> {
        let path = config.path;
        if path.file_name().is_none() {
            return Err(AuditError::InvalidPath { path });
        }
        let dir = parent_dir(&path);
        if !dir.is_dir() {
            fs::create_dir_all(&dir).map_err(io_err("create directory", &dir))?;
            sync_dir(&parent_dir(&dir))?;
        }
        let mut options = OpenOptions::new();
        options.read(true).append(true);
        let file = match options.open(&path) {
            Ok(file) => file,
            Err(e) if e.kind() == io::ErrorKind::NotFound => {
                let file = options
                    .create(true)
                    .open(&path)
                    .map_err(io_err("create", &path))?;
                // The new directory entry must survive a crash, or the first records could vanish
                // with it.
                sync_dir(&dir)?;
                file
            }
            Err(e) => return Err(io_err("open", &path)(e)),
        };
        let log = FileAuditLog {
            path,
            file,
            state: Mutex::new(State {
                head: Sha256Digest::ZERO,
                known_len: None,
            }),
            recovered: OnceLock::new(),
            #[cfg(feature = "fault-injection")]
            fault_hook: config.fault_hook,
        };
        {
            let mut state = log.lock_state();
            let _lock = FileLock::acquire(&log.file, &log.path)?;
            let len = log.len()?;
            log.resync(&mut state, len)?;
        }
        Ok(log)
    }

    /// The path of the log file.
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
        self.lock_state().head
    }

    fn lock_state(&self) -> MutexGuard<'_, State> {
        match self.state.lock() {
            Ok(guard) => guard,
            Err(poisoned) => {
                // A panic (for instance in a fault hook) interrupted an append, so the file may end
                // with a torn line and our view is stale: forget the length so that the next append
                // re-reads the tail under the file lock and repairs it.
                let mut guard = poisoned.into_inner();
                guard.known_len = None;
                self.state.clear_poison();
                guard
            }
        }
    }

    fn len(&self) -> Result<u64, AuditError> {
        Ok(self
            .file
            .metadata()
            .map_err(io_err("stat", &self.path))?
            .len())
    }

    /// Re-reads the head from the last line of the first `len` bytes and repairs a torn tail.
    /// Must be called with the file lock held.
    fn resync(&self, state: &mut State, len: u64) -> Result<(), AuditError> {
        let max = u64::try_from(MAX_LINE_BYTES).unwrap_or(u64::MAX);
        let tail = read_tail(&self.file, len, max).map_err(|e| match e {
            TailError::Io(source) => AuditError::Io {
                action: "read the end of",
                path: self.path.clone(),
                source,
            },
            TailError::NoBoundary { limit } => AuditError::CorruptTail {
                path: self.path.clone(),
                detail: format!("no line break within the last {limit} bytes"),
            },
        })?;
        state.head = match &tail.last_line {
            None => Sha256Digest::ZERO,
            Some(line) => {
                check_line(line)
                    .map_err(|fault| AuditError::CorruptTail {
                        path: self.path.clone(),
                        detail: format!("last complete line is {}: {}", fault.kind, fault.detail),
                    })?
                    .sha256
            }
        };
        state.known_len = Some(tail.complete_len);
        if !tail.torn.is_empty() {
            self.repair_torn_tail(state, tail.complete_len, &tail.torn)?;
        }
        Ok(())
    }

    /// Saves the torn bytes beside the log, truncates them away, and records the repair in the chain.
    /// The order makes a crash at any step safe: the bytes are durable elsewhere before they leave
    /// the log, and a repeated repair only saves a second copy.
    fn repair_torn_tail(
        &self,
        state: &mut State,
        complete_len: u64,
        torn: &[u8],
    ) -> Result<(), AuditError> {
        let ts = now_ns();
        let saved_as = self.save_torn(torn, ts)?;
        state.known_len = None;
        self.file
            .set_len(complete_len)
            .map_err(io_err("truncate the torn tail of", &self.path))?;
        self.file.sync_all().map_err(io_err("fsync", &self.path))?;
        state.known_len = Some(complete_len);

        let torn_sha256 = Sha256Digest::of(torn);
        let saved_name = saved_as
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        let entry = AuditEntry {
            request_id: "recovery".into(),
            method: "audit/recover".into(),
            name: "audit".into(),
            decision: Decision::Allow,
            outcome: "recovered".into(),
            args_digest: torn_sha256,
            reason: Some("torn_tail".into()),
        };
        let torn_bytes = u64::try_from(torn.len()).unwrap_or(u64::MAX);
        let extra = vec![
            ("torn_bytes", Value::from(torn_bytes)),
            ("saved_as", Value::from(saved_name)),
        ];
        let receipt = self.write_record(state, &entry, extra, ts, false)?;
        // Only the first repair is kept; later ones are visible in the chain itself.
        let _ = self.recovered.set(Recovery {
            torn_bytes,
            saved_as,
            torn_sha256,
            record_sha256: receipt.sha256,
        });
        Ok(())
    }

    /// Writes `torn` durably to a new `<logname>.torn-<ts>` file and returns its path.
    fn save_torn(&self, torn: &[u8], ts: u64) -> Result<PathBuf, AuditError> {
        let dir = parent_dir(&self.path);
        let name = self
            .path
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        // create_new never overwrites an earlier repair's evidence; a clash (same ns) tries the next
        // number.
        let mut suffix = ts;
        loop {
            let candidate = dir.join(format!("{name}.torn-{suffix}"));
            match OpenOptions::new()
                .write(true)
                .create_new(true)
                .open(&candidate)
            {
                Ok(mut file) => {
                    file.write_all(torn).map_err(io_err("write", &candidate))?;
                    file.sync_all().map_err(io_err("fsync", &candidate))?;
                    sync_dir(&dir)?;
                    return Ok(candidate);
                }
                Err(e)
                    if e.kind() == io::ErrorKind::AlreadyExists
                        && suffix < ts.saturating_add(1000) =>
                {
                    suffix += 1;
                }
                Err(e) => return Err(io_err("create", &candidate)(e)),
            }
        }
    }

    /// Seals `entry` onto `state.head`, writes it and fsyncs. Must be called with the file lock held.
    fn write_record(
        &self,
        state: &mut State,
        entry: &AuditEntry,
        extra: Vec<(&'static str, Value)>,
        ts: u64,
        injectable: bool,
    ) -> Result<AppendReceipt, AuditError> {
        let sealed = seal(entry, extra, ts, state.head);
        if sealed.line.len() > MAX_LINE_BYTES {
            return Err(AuditError::RecordTooLarge {
                len: sealed.line.len(),
                max: MAX_LINE_BYTES,
            });
        }
        let before = state.known_len;
        // Until the write and fsync succeed the file may hold part of the line; an unknown length makes
        // the next append re-read and repair the tail.
        state.known_len = None;
        self.write_line(&sealed.line, injectable)?;
        self.file.sync_data().map_err(io_err("fsync", &self.path))?;
        let written = u64::try_from(sealed.line.len()).unwrap_or(u64::MAX);
        // `before` is always known here (append and open resync first); if it were not, the length
        // stays unknown and the next append re-reads the tail, which is the safe direction.
        state.known_len = before.map(|len| len.saturating_add(written));
        state.head = sealed.sha256;
        Ok(AppendReceipt {
            sha256: sealed.sha256,
            ts,
        })
    }

    #[cfg_attr(not(feature = "fault-injection"), allow(unused_variables))]
    fn write_line(&self, line: &[u8], injectable: bool) -> Result<(), AuditError> {
        let mut file = &self.file;
        #[cfg(feature = "fault-injection")]
        if injectable && let Some(hook) = &self.fault_hook {
            let (first, rest) = line.split_at(line.len() / 2);
            file.write_all(first).map_err(io_err("write", &self.path))?;
            // Half a record is made durable so that a kill at this point leaves a real torn tail.
            file.sync_data().map_err(io_err("fsync", &self.path))?;
            hook("audit.mid_record");
            return file.write_all(rest).map_err(io_err("write", &self.path));
        }
        // One write_all of the whole line: with O_APPEND the kernel places it at the end in one piece
        // in the normal case, and the file lock keeps other writers out in every case.
        file.write_all(line).map_err(io_err("write", &self.path))
    }
}

impl AuditSink for FileAuditLog {
    fn append(&self, entry: &AuditEntry) -> Result<AppendReceipt, AuditError> {
        let mut state = self.lock_state();
        let _lock = FileLock::acquire(&self.file, &self.path)?;
        let len = self.len()?;
        if state.known_len != Some(len) {
            // Another process appended (or crashed mid-append) since our last write: chain onto what
            // is really the last line, never onto our stale head, so the chain cannot fork.
            self.resync(&mut state, len)?;
        }
        self.write_record(&mut state, entry, Vec::new(), now_ns(), true)
        // `_lock` is released here, after the fsync in write_record.
    }
}
