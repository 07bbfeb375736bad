//! The embedded file store: one immutable file per key in one directory, published by atomic rename.
//!
//! The layout and protocol are documented in `docs/commit-store.md`; the reference server's
//! `LEDGER_DIR/notes/<sha256-hex of request_id>.json` layout is this store pointed at `notes/`.

use std::fmt;
use std::fs::{self, File, OpenOptions};
use std::io::{self, Write as _};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

use toolgate_canon::{Sha256Digest, canonical_value};

use crate::{CommitError, CommitOutcome, CommitStore, IdempotencyKey};

/// The lock file every writer locks exclusively; its contents are irrelevant.
const LOCK_FILE_NAME: &str = ".lock";
/// Suffix of published records.
const RECORD_SUFFIX: &str = ".json";
/// Suffix of temporary files; together with the leading dot it keeps them out of `list`.
const TEMP_SUFFIX: &str = ".tmp";
/// Length of a SHA-256 in lowercase hex.
const HEX_LEN: usize = 64;
/// How many fresh temporary names to try before giving up. Names carry the pid and a process-wide
/// counter, so a collision needs an orphan from an earlier process with the same pid; more than a
/// handful in a row means something else is creating files here.
const TEMP_NAME_ATTEMPTS: u32 = 16;

/// Distinguishes temporary files of concurrent calls in one process (the pid distinguishes processes).
static TEMP_COUNTER: AtomicU64 = AtomicU64::new(0);

/// How to open a [`FileCommitStore`].
#[derive(Clone)]
pub struct CommitConfig {
    dir: PathBuf,
    #[cfg(feature = "fault-injection")]
    fault_hook: Option<crate::FaultHook>,
}

impl CommitConfig {
    /// A store in `dir`, created (with its missing parents) if absent.
    pub fn new(dir: impl Into<PathBuf>) -> Self {
        CommitConfig {
            dir: dir.into(),
            #[cfg(feature = "fault-injection")]
            fault_hook: None,
        }
    }

    /// Calls `hook` with `"commit.before_publish"` (temporary file written and fsynced, not yet
    /// renamed) and `"commit.after_publish"` (renamed and directory fsynced) on every commit that
    /// publishes. Replays and conflicts reach neither point.
    #[cfg(feature = "fault-injection")]
    pub fn fault_hook(mut self, hook: crate::FaultHook) -> Self {
        self.fault_hook = Some(hook);
        self
    }
}

impl fmt::Debug for CommitConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut s = f.debug_struct("CommitConfig");
        s.field("dir", &self.dir);
        #[cfg(feature = "fault-injection")]
        s.field("fault_hook", &self.fault_hook.as_ref().map(|_| "<hook>"));
        s.finish()
    }
}

/// A [`CommitStore`] keeping each payload in `dir/<hex SHA-256 of key>.json`.
///
/// Writers serialize on an exclusive lock of `dir/.lock`, which works across threads (each call
/// opens its own file description) and across processes on one machine. Readers take no lock,
/// because a record appears atomically by rename and is never modified afterwards.
pub struct FileCommitStore {
    dir: PathBuf,
    /// Keys whose record this store knows to be durable: published by it (directory fsynced
    /// after the rename) or already confirmed once. A record published by a writer that died
    /// between its rename and its directory fsync is visible but not yet durable, so the first
    /// replay of a key in this process fsyncs the directory before answering `Replay`.
    durable: std::sync::Mutex<std::collections::HashSet<Sha256Digest>>,
    #[cfg(feature = "fault-injection")]
    fault_hook: Option<crate::FaultHook>,
}

impl fmt::Debug for FileCommitStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut s = f.debug_struct("FileCommitStore");
        s.field("dir", &self.dir);
        #[cfg(feature = "fault-injection")]
        s.field("fault_hook", &self.fault_hook.as_ref().map(|_| "<hook>"));
        s.finish()
    }
}

impl FileCommitStore {
    /// Opens (creating if needed) the store in `dir`. See [`FileCommitStore::open_with`].
    pub fn open(dir: impl Into<PathBuf>) -> Result<Self, CommitError> {
        Self::open_with(CommitConfig::new(dir))
    }

    /// Opens the store described by `config`.
    ///
    /// Creates the directory and its missing parents durably (each parent fsynced), then removes
    /// temporary files orphaned by a writer that crashed before publishing. That removal happens
    /// under the writer lock: a temporary file only exists while its writer holds the lock, and the
    /// kernel releases a dead writer's lock, so any temporary file seen under the lock is an orphan.
    pub fn open_with(config: CommitConfig) -> Result<Self, CommitError> {
        create_dir_durably(&config.dir)?;
        let store = FileCommitStore {
            dir: config.dir,
            durable: std::sync::Mutex::default(),
            #[cfg(feature = "fault-injection")]
            fault_hook: config.fault_hook,
        };
        let _lock = store.lock()?;
        store.remove_orphaned_temps()?;
        Ok(store)
    }

    /// Where the record for `key` lives: `dir/<hex SHA-256 of key>.json`.
    pub fn path_for(&self, key: &IdempotencyKey) -> PathBuf {
        self.dir
            .join(format!("{}{RECORD_SUFFIX}", key.digest().to_hex()))
    }

    /// The store directory.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Takes the exclusive writer lock, blocking until it is free.
    fn lock(&self) -> Result<DirLock, CommitError> {
        let path = self.dir.join(LOCK_FILE_NAME);
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(&path)
            .map_err(|e| CommitError::io("open lock file", &path, e))?;
        loop {
            match file.lock() {
                Ok(()) => return Ok(DirLock { file }),
                // A signal may interrupt the blocking wait; waiting again is the only sane response.
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => return Err(CommitError::io("lock", &path, e)),
            }
        }
    }

    /// Deletes `.<64 hex>.*.tmp` files. Callers must hold the writer lock.
    fn remove_orphaned_temps(&self) -> Result<(), CommitError> {
        let mut removed = false;
        for entry in read_dir_names(&self.dir)? {
            let (name, is_file) = entry;
            if !is_file || !is_temp_name(&name) {
                continue;
            }
            let path = self.dir.join(&name);
            match fs::remove_file(&path) {
                Ok(()) => removed = true,
                Err(e) if e.kind() == io::ErrorKind::NotFound => {}
                Err(e) => return Err(CommitError::io("remove orphaned temporary file", &path, e)),
            }
        }
        if removed {
            // Not needed for correctness (orphans are ignored anyway), but it keeps a second crash
            // from resurrecting files we already reported as cleaned.
            fsync_dir(&self.dir)?;
        }
        Ok(())
    }

    /// Writes `bytes` to a fresh temporary file, fsyncs it, renames it to `record`, fsyncs the
    /// directory. Callers must hold the writer lock and have checked that `record` is absent.
    fn publish(&self, key_hex: &str, record: &Path, bytes: &[u8]) -> Result<(), CommitError> {
        let (mut file, mut temp) = self.create_temp(key_hex)?;
        file.write_all(bytes)
            .map_err(|e| CommitError::io("write temporary file", &temp.path, e))?;
        file.sync_all()
            .map_err(|e| CommitError::io("fsync temporary file", &temp.path, e))?;
        drop(file);

        #[cfg(feature = "fault-injection")]
        self.fault("commit.before_publish");

        fs::rename(&temp.path, record)
            .map_err(|e| CommitError::io("rename temporary file into place at", record, e))?;
        // From here on the record exists; the temporary name is gone and must not be removed.
        temp.disarm();
        // Without this fsync the rename may not survive a power loss, so Committed must wait for it.
        // If it fails the record may or may not persist; the error tells the caller to retry, and a
        // retry either replays (it persisted) or commits again (it did not).
        fsync_dir(&self.dir)?;

        #[cfg(feature = "fault-injection")]
        self.fault("commit.after_publish");
        Ok(())
    }

    /// Creates `.<key hex>.<pid>.<counter>.tmp` exclusively.
    fn create_temp(&self, key_hex: &str) -> Result<(File, TempGuard), CommitError> {
        let pid = std::process::id();
        let mut last_path = self.dir.clone();
        for _ in 0..TEMP_NAME_ATTEMPTS {
            let counter = TEMP_COUNTER.fetch_add(1, Ordering::Relaxed);
            let path = self
                .dir
                .join(format!(".{key_hex}.{pid}.{counter}{TEMP_SUFFIX}"));
            match OpenOptions::new().write(true).create_new(true).open(&path) {
                Ok(file) => return Ok((file, TempGuard { path, armed: true })),
                // An orphan of an earlier process that had our pid; leave it for open() to clean
                // and try the next name.
                Err(e) if e.kind() == io::ErrorKind::AlreadyExists => last_path = path,
                Err(e) => return Err(CommitError::io("create temporary file", &path, e)),
            }
        }
        Err(CommitError::io(
            "create temporary file (every candidate name was taken)",
            last_path,
            io::Error::from(io::ErrorKind::AlreadyExists),
        ))
    }

    #[cfg(feature = "fault-injection")]
    fn fault(&self, point: &'static str) {
        if let Some(hook) = &self.fault_hook {
            hook(point);
        }
    }
}

impl FileCommitStore {
    fn mark_durable(&self, key: &IdempotencyKey) {
        // A poisoned set only means another thread panicked while inserting; its content is
        // still a valid set of digests.
        self.durable
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .insert(key.digest());
    }

    /// Compares with the published record and, before answering `Replay` for the first time in
    /// this process, makes sure the record's directory entry is durable (see `durable`).
    fn replay(
        &self,
        key: &IdempotencyKey,
        path: &Path,
        stored: &[u8],
        expected: &[u8],
    ) -> Result<CommitOutcome, CommitError> {
        let outcome = compare(key, path, stored, expected)?;
        let known = self
            .durable
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .contains(&key.digest());
        if !known {
            fsync_dir(&self.dir)?;
            self.mark_durable(key);
        }
        Ok(outcome)
    }
}

impl CommitStore for FileCommitStore {
    fn commit(
        &self,
        key: &IdempotencyKey,
        payload: &serde_json::Value,
    ) -> Result<CommitOutcome, CommitError> {
        let bytes = canonical_value(payload);
        let path = self.path_for(key);

        // Fast path without the lock: records are published by atomic rename and never modified,
        // so if one exists it is complete and final.
        if let Some(stored) = read_record(&path)? {
            return self.replay(key, &path, &stored, &bytes);
        }

        let _lock = self.lock()?;
        // Re-check under the lock. Without this, two callers that both saw "absent" above would
        // both publish and both report Committed (the race in the naive exists-then-replace code).
        if let Some(stored) = read_record(&path)? {
            return self.replay(key, &path, &stored, &bytes);
        }
        self.publish(&key.digest().to_hex(), &path, &bytes)?;
        self.mark_durable(key);
        Ok(CommitOutcome::Committed)
    }

    fn get(&self, key: &IdempotencyKey) -> Result<Option<serde_json::Value>, CommitError> {
        let path = self.path_for(key);
        match read_record(&path)? {
            Some(bytes) => decode(&path, &bytes).map(Some),
            None => Ok(None),
        }
    }

    fn list(&self) -> Result<Vec<serde_json::Value>, CommitError> {
        let mut out = Vec::new();
        self.for_each_record(|path, bytes| {
            out.push(decode(path, &bytes)?);
            Ok(())
        })?;
        Ok(out)
    }

    fn list_canonical(&self) -> Result<Vec<Vec<u8>>, CommitError> {
        let mut out = Vec::new();
        self.for_each_record(|path, bytes| {
            // Checked as `list` checks it (valid JSON, in canonical form); the tree is dropped at
            // once, so only one record's is alive at a time.
            decode(path, &bytes)?;
            out.push(bytes);
            Ok(())
        })?;
        Ok(out)
    }
}

impl FileCommitStore {
    /// Calls `each` with the path and bytes of every record, sorted by file name.
    fn for_each_record(
        &self,
        mut each: impl FnMut(&Path, Vec<u8>) -> Result<(), CommitError>,
    ) -> Result<(), CommitError> {
        let mut names: Vec<String> = read_dir_names(&self.dir)?
            .into_iter()
            .map(|(name, _)| name)
            .filter(|name| is_record_name(name))
            .collect();
        names.sort();
        for name in names {
            let path = self.dir.join(&name);
            // Records are never deleted by the store; if one vanished between the listing and the
            // read, someone else removed it and the listing it belonged to no longer exists.
            if let Some(bytes) = read_record(&path)? {
                each(&path, bytes)?;
            }
        }
        Ok(())
    }
}

/// Holds the exclusive writer lock until dropped.
struct DirLock {
    file: File,
}

impl Drop for DirLock {
    fn drop(&mut self) {
        // Closing the descriptor releases the lock as well; unlocking explicitly makes the release
        // point this drop rather than whenever the file happens to be closed. An error here cannot
        // leave the lock held past the close, so it is safe to ignore.
        let _ = self.file.unlock();
    }
}

/// Removes a temporary file on early return, so that no temporary file outlives its lock holder
/// (the invariant that makes orphan cleanup in `open_with` safe).
struct TempGuard {
    path: PathBuf,
    armed: bool,
}

impl TempGuard {
    fn disarm(&mut self) {
        self.armed = false;
    }
}

impl Drop for TempGuard {
    fn drop(&mut self) {
        if self.armed {
            // Best effort: if removal fails the file is an orphan that list/get ignore and the next
            // open() removes.
            let _ = fs::remove_file(&self.path);
        }
    }
}

/// Whether the already published `stored` bytes match `expected`: Replay, Conflict, or Corrupt.
fn compare(
    key: &IdempotencyKey,
    path: &Path,
    stored: &[u8],
    expected: &[u8],
) -> Result<CommitOutcome, CommitError> {
    if stored == expected {
        return Ok(CommitOutcome::Replay);
    }
    // A mismatch is a conflict only if the stored record is itself sound; otherwise reporting a
    // conflict would hide damage the operator needs to see.
    decode(path, stored)?;
    Err(CommitError::Conflict {
        key_digest: key.digest(),
    })
}

/// Parses a record, requiring exactly the canonical bytes the store writes.
fn decode(path: &Path, bytes: &[u8]) -> Result<serde_json::Value, CommitError> {
    let corrupt = |reason: String| CommitError::Corrupt {
        path: path.to_path_buf(),
        reason,
    };
    if bytes.is_empty() {
        return Err(corrupt("the file is empty".to_owned()));
    }
    let value: serde_json::Value = serde_json::from_slice(bytes).map_err(|e| {
        // Only the error class and position: serde_json messages may quote input fragments.
        corrupt(format!(
            "not valid JSON ({:?} error at line {}, column {})",
            e.classify(),
            e.line(),
            e.column()
        ))
    })?;
    if canonical_value(&value) != bytes {
        return Err(corrupt(
            "valid JSON but not in canonical (RFC 8785) form, so the store did not write it"
                .to_owned(),
        ));
    }
    Ok(value)
}

/// The bytes of a record, or `None` if it does not exist.
fn read_record(path: &Path) -> Result<Option<Vec<u8>>, CommitError> {
    match fs::read(path) {
        Ok(bytes) => Ok(Some(bytes)),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
        Err(e) if e.kind() == io::ErrorKind::IsADirectory => Err(CommitError::Corrupt {
            path: path.to_path_buf(),
            reason: "it is a directory, not a record file".to_owned(),
        }),
        Err(e) => Err(CommitError::io("read committed record", path, e)),
    }
}

/// Names (UTF-8 only; the store writes no others) and whether each is a regular file.
fn read_dir_names(dir: &Path) -> Result<Vec<(String, bool)>, CommitError> {
    let entries = fs::read_dir(dir).map_err(|e| CommitError::io("list directory", dir, e))?;
    let mut out = Vec::new();
    for entry in entries {
        let entry = entry.map_err(|e| CommitError::io("list directory", dir, e))?;
        let Ok(name) = entry.file_name().into_string() else {
            continue;
        };
        let is_file = entry
            .file_type()
            .map_err(|e| CommitError::io("stat directory entry", dir.join(&name), e))?
            .is_file();
        out.push((name, is_file));
    }
    Ok(out)
}

fn is_lower_hex(s: &str) -> bool {
    s.len() == HEX_LEN && s.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'))
}

/// `<64 lowercase hex>.json`: the only names `get` and `list` read.
fn is_record_name(name: &str) -> bool {
    name.strip_suffix(RECORD_SUFFIX).is_some_and(is_lower_hex)
}

/// `.<64 lowercase hex>.<anything>.tmp`: the only names orphan cleanup deletes, so that cleanup
/// never touches files the store did not create.
fn is_temp_name(name: &str) -> bool {
    let Some(rest) = name.strip_prefix('.') else {
        return false;
    };
    let Some((hex, tail)) = rest.split_once('.') else {
        return false;
    };
    is_lower_hex(hex) && tail.ends_with(TEMP_SUFFIX)
}

/// fsyncs a directory so that entries created, renamed or removed in it survive a power loss.
fn fsync_dir(dir: &Path) -> Result<(), CommitError> {
    File::open(dir)
        .and_then(|d| d.sync_all())
        .map_err(|e| CommitError::io("fsync directory", dir, e))
}

/// The directory containing `path`, treating a bare relative name as living in `.`.
fn parent_of(path: &Path) -> &Path {
    match path.parent() {
        Some(parent) if !parent.as_os_str().is_empty() => parent,
        _ => Path::new("."),
    }
}

/// Creates `dir` and any missing ancestors, fsyncing each new entry's parent so the directory
/// itself survives a power loss (otherwise a record fsynced into it could vanish with it).
fn create_dir_durably(dir: &Path) -> Result<(), CommitError> {
    let mut missing = Vec::new();
    let mut cursor = dir;
    loop {
        match fs::metadata(cursor) {
            Ok(_) => break,
            Err(e) if e.kind() == io::ErrorKind::NotFound => {
                missing.push(cursor);
                match cursor.parent() {
                    Some(parent) if !parent.as_os_str().is_empty() => cursor = parent,
                    _ => break,
                }
            }
            Err(e) => return Err(CommitError::io("inspect store directory", cursor, e)),
        }
    }
    for path in missing.into_iter().rev() {
        match fs::create_dir(path) {
            Ok(()) => fsync_dir(parent_of(path))?,
            // Another process created it concurrently; it is responsible for its durability.
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {}
            Err(e) => return Err(CommitError::io("create store directory", path, e)),
        }
    }
    let meta = fs::metadata(dir).map_err(|e| CommitError::io("inspect store directory", dir, e))?;
    if !meta.is_dir() {
        return Err(CommitError::io(
            "use as store directory",
            dir,
            io::Error::from(io::ErrorKind::NotADirectory),
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn record_and_temp_names() {
        let hex = "a".repeat(64);
        assert!(is_record_name(&format!("{hex}.json")));
        assert!(!is_record_name(&format!("{}.json", "A".repeat(64))));
        assert!(!is_record_name(&format!("{}.json", "a".repeat(63))));
        assert!(!is_record_name(&format!(".{hex}.json")));
        assert!(!is_record_name(&format!("{hex}.json.tmp")));
        assert!(!is_record_name(".lock"));
        assert!(!is_record_name("é.json"));

        assert!(is_temp_name(&format!(".{hex}.123.4.tmp")));
        assert!(!is_temp_name(&format!("{hex}.123.4.tmp")));
        assert!(!is_temp_name(".lock"));
        assert!(!is_temp_name(".notes.tmp"));
        assert!(!is_temp_name(&format!(".{hex}.json")));
    }

    #[test]
    fn parent_of_bare_name_is_dot() {
        assert_eq!(parent_of(Path::new("notes")), Path::new("."));
        assert_eq!(parent_of(Path::new("a/notes")), Path::new("a"));
    }
}
