//! Durable whole-file writes on a [`Storage`]: a temporary file written and fdatasynced, then
//! published by rename (replacing) or by link (write-once), then the directory fsynced.

use std::fmt;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

use crate::Storage;

/// Suffix of temporary files; with the leading dot it marks them as not a store's to read.
const TEMP_SUFFIX: &str = ".tmp";
/// How many fresh temporary names to try before giving up. Names carry the pid and a process-wide
/// counter, so a collision needs an orphan of an earlier process with the same pid; more than a
/// handful in a row means something else is creating files here.
const TEMP_NAME_ATTEMPTS: u32 = 16;

/// Distinguishes temporary files of concurrent writers in one process (the pid distinguishes
/// processes).
static TEMP_COUNTER: AtomicU64 = AtomicU64::new(0);

/// A storage operation that failed, with the path it was applied to.
///
/// Every store wraps this in its own error type (with the same three fields), so messages name the
/// operation and the file; none of them carries file contents.
#[derive(Debug, thiserror::Error)]
#[error(
    "could not {op} {path}: {source}; check that the directory is on a local filesystem, writable \
     by this process and not full, then retry"
)]
#[non_exhaustive]
pub struct StorageError {
    /// The operation that failed, e.g. `"fsync directory"`.
    pub op: &'static str,
    /// The path it was applied to.
    pub path: PathBuf,
    /// The operating system's error.
    #[source]
    pub source: io::Error,
}

impl StorageError {
    /// An error of `op` on `path`.
    pub fn new(op: &'static str, path: impl Into<PathBuf>, source: io::Error) -> Self {
        StorageError {
            op,
            path: path.into(),
            source,
        }
    }
}

/// A fresh temporary name `dir/.<stem>.<pid>.<counter>.tmp` (not created): unique among this
/// process's writers, and recognised by [`remove_orphaned_temps`] once the process is gone.
pub fn temp_path(dir: &Path, stem: &str) -> PathBuf {
    let pid = std::process::id();
    let counter = TEMP_COUNTER.fetch_add(1, Ordering::Relaxed);
    dir.join(format!(".{stem}.{pid}.{counter}{TEMP_SUFFIX}"))
}

/// fsyncs `dir` so that entries created, renamed or removed in it survive a power loss.
pub fn fsync_dir(storage: &dyn Storage, dir: &Path) -> Result<(), StorageError> {
    storage
        .fsync_dir(dir)
        .map_err(|e| StorageError::new("fsync directory", dir, e))
}

/// The directory containing `path`, treating a bare relative name as living in `.`.
pub fn parent_of(path: &Path) -> &Path {
    match path.parent() {
        Some(parent) if !parent.as_os_str().is_empty() => parent,
        _ => Path::new("."),
    }
}

/// Creates `dir` and any missing ancestors, fsyncing each new entry's parent so the directory
/// itself survives a power loss (otherwise a file fsynced into it could vanish with it). An
/// existing directory is accepted as it is; anything else at `dir` is an error.
pub fn create_dir_durably(storage: &dyn Storage, dir: &Path) -> Result<(), StorageError> {
    let mut missing = Vec::new();
    let mut cursor = dir;
    loop {
        match std::fs::metadata(cursor) {
            Ok(_) => break,
            Err(e) if e.kind() == io::ErrorKind::NotFound => {
                missing.push(cursor);
                match cursor.parent() {
                    Some(parent) if !parent.as_os_str().is_empty() => cursor = parent,
                    _ => break,
                }
            }
            Err(e) => return Err(StorageError::new("inspect directory", cursor, e)),
        }
    }
    for path in missing.into_iter().rev() {
        match std::fs::create_dir(path) {
            Ok(()) => fsync_dir(storage, parent_of(path))?,
            // Another process created it concurrently; it is responsible for its durability.
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {}
            Err(e) => return Err(StorageError::new("create directory", path, e)),
        }
    }
    let meta =
        std::fs::metadata(dir).map_err(|e| StorageError::new("inspect directory", dir, e))?;
    if !meta.is_dir() {
        return Err(StorageError::new(
            "use as a directory",
            dir,
            io::Error::from(io::ErrorKind::NotADirectory),
        ));
    }
    Ok(())
}

/// Writes `bytes` to `dir/name` atomically and durably: a temporary file, fdatasynced, renamed
/// over `dir/name`, then `dir` fsynced. On error `dir/name` is untouched or fully replaced (after
/// a failed directory fsync the replacement may not survive a power loss; a retry writes again).
pub fn replace_file(
    storage: &dyn Storage,
    dir: &Path,
    name: &str,
    bytes: &[u8],
) -> Result<(), StorageError> {
    TempFile::write(storage, dir, name, bytes)?.replace(&dir.join(name))?;
    fsync_dir(storage, dir)
}

/// What [`TempFile::publish_new`] found at its target.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Published {
    /// The target did not exist; it now holds the temporary file's bytes.
    Created,
    /// The target already existed and was left as it is (compare its bytes to decide what that
    /// means).
    Exists,
}

/// A temporary file `dir/.<stem>.<pid>.<counter>.tmp`, written and fdatasynced, removed on drop
/// unless it was published.
pub struct TempFile<'s> {
    storage: &'s dyn Storage,
    path: PathBuf,
    armed: bool,
}

impl fmt::Debug for TempFile<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TempFile")
            .field("path", &self.path)
            .finish_non_exhaustive()
    }
}

impl<'s> TempFile<'s> {
    /// Creates a fresh temporary file in `dir` exclusively, writes `bytes` and fdatasyncs it.
    /// `stem` names what it will become (only for people reading the directory).
    pub fn write(
        storage: &'s dyn Storage,
        dir: &Path,
        stem: &str,
        bytes: &[u8],
    ) -> Result<Self, StorageError> {
        let mut last = dir.to_path_buf();
        for _ in 0..TEMP_NAME_ATTEMPTS {
            let path = temp_path(dir, stem);
            match storage.write_new(&path, bytes) {
                Ok(()) => {
                    let temp = TempFile {
                        storage,
                        path,
                        armed: true,
                    };
                    storage
                        .fsync_file(&temp.path)
                        .map_err(|e| StorageError::new("fsync temporary file", &temp.path, e))?;
                    return Ok(temp);
                }
                // An orphan of an earlier process that had our pid: try the next name.
                Err(e) if e.kind() == io::ErrorKind::AlreadyExists => last = path,
                Err(e) => {
                    // A partly written file of ours: remove it (best effort, orphans are
                    // removed at open too).
                    let _ = storage.remove(&path);
                    return Err(StorageError::new("write temporary file", path, e));
                }
            }
        }
        Err(StorageError::new(
            "create a temporary file (every candidate name was taken)",
            last,
            io::Error::from(io::ErrorKind::AlreadyExists),
        ))
    }

    /// Where the temporary file is.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Renames the file over `target` (atomic: readers see the old or the new file). The caller
    /// fsyncs the directory to make the rename durable.
    pub fn replace(mut self, target: &Path) -> Result<(), StorageError> {
        self.storage
            .rename(&self.path, target)
            .map_err(|e| StorageError::new("rename a temporary file into place at", target, e))?;
        self.armed = false;
        Ok(())
    }

    /// Publishes the file as `target` only if nothing is there (a hard link, then the temporary
    /// name is removed): a published file is never replaced, so two writers of one name cannot
    /// overwrite each other. The caller fsyncs the directory to make the new name durable.
    pub fn publish_new(self, target: &Path) -> Result<Published, StorageError> {
        match self.storage.link(&self.path, target) {
            // Dropping `self` removes the temporary name; the target keeps the file.
            Ok(()) => Ok(Published::Created),
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => Ok(Published::Exists),
            Err(e) => Err(StorageError::new("publish a temporary file at", target, e)),
        }
    }
}

impl Drop for TempFile<'_> {
    fn drop(&mut self) {
        if self.armed {
            // Best effort: a leftover is never read (its name starts with a dot and ends with
            // `.tmp`) and `remove_orphaned_temps` removes it once its writer is gone.
            let _ = self.storage.remove(&self.path);
        }
    }
}

/// Removes the temporary files in `dir` left by writers that are gone (their pid is not a live
/// process, or is this process when `include_own` is set, for a directory this process has just
/// opened and has not written to yet). Returns how many were removed. A live pid may be an
/// unrelated process that reused it: its leftover stays, as harmless garbage, until that process
/// ends.
pub fn remove_orphaned_temps(
    storage: &dyn Storage,
    dir: &Path,
    include_own: bool,
) -> Result<usize, StorageError> {
    let own = std::process::id();
    let mut removed = 0;
    let files = storage
        .list(dir)
        .map_err(|e| StorageError::new("list directory", dir, e))?;
    for path in files {
        let Some(pid) = temp_writer_pid(&path) else {
            continue;
        };
        if (pid == own && include_own) || (pid != own && !pid_alive(pid)) {
            match storage.remove(&path) {
                Ok(()) => removed += 1,
                Err(e) if e.kind() == io::ErrorKind::NotFound => {}
                Err(e) => return Err(StorageError::new("remove orphaned temporary file", path, e)),
            }
        }
    }
    if removed > 0 {
        // Not needed for correctness (orphans are ignored), but it keeps a second crash from
        // bringing back files already removed.
        fsync_dir(storage, dir)?;
    }
    Ok(removed)
}

/// The writer pid of a temporary file name `.<stem>.<pid>.<counter>.tmp`.
pub fn temp_writer_pid(path: &Path) -> Option<u32> {
    let name = path.file_name()?.to_str()?;
    let rest = name.strip_prefix('.')?.strip_suffix(TEMP_SUFFIX)?;
    let mut parts = rest.rsplit('.');
    let (counter, pid) = (parts.next()?, parts.next()?);
    let stem_present = parts.next().is_some_and(|stem| !stem.is_empty());
    if !stem_present || counter.parse::<u64>().is_err() {
        return None;
    }
    pid.parse().ok()
}

/// Whether a process with this pid exists (and is not a zombie). Without `/proc` every pid counts
/// as alive, so nothing is removed on a guess.
pub fn pid_alive(pid: u32) -> bool {
    if !Path::new("/proc/self/stat").exists() {
        return true;
    }
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Ok(stat) => {
            // The state is the first field after the command name, which ends at the last `)`.
            let state = stat
                .rfind(')')
                .and_then(|end| stat[end + 1..].split_whitespace().next());
            !matches!(state, Some("Z" | "X"))
        }
        Err(e) => e.kind() != io::ErrorKind::NotFound,
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;
    use crate::{FaultyStorage, FsStorage, Op};
    use std::sync::Arc;

    fn names(dir: &Path) -> Vec<String> {
        let mut names: Vec<String> = std::fs::read_dir(dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        names.sort();
        names
    }

    #[test]
    fn replace_file_replaces_and_leaves_no_temp() {
        let dir = tempfile::tempdir().unwrap();
        replace_file(&FsStorage, dir.path(), "f.json", b"one").unwrap();
        replace_file(&FsStorage, dir.path(), "f.json", b"two").unwrap();
        assert_eq!(std::fs::read(dir.path().join("f.json")).unwrap(), b"two");
        assert_eq!(names(dir.path()), ["f.json"]);
    }

    #[test]
    fn replace_file_costs_two_syncs_and_fails_cleanly_at_each_step() {
        let dir = tempfile::tempdir().unwrap();
        let storage = FaultyStorage::new(Arc::new(FsStorage));
        replace_file(&storage, dir.path(), "f", b"x").unwrap();
        assert_eq!(storage.syncs(), 2);
        for op in [Op::Write, Op::FsyncFile, Op::Rename] {
            storage.fail_nth(op, 1);
            let error = replace_file(&storage, dir.path(), "f", b"new").unwrap_err();
            assert!(error.to_string().contains("injected fault"), "{error}");
            assert_eq!(std::fs::read(dir.path().join("f")).unwrap(), b"x", "{op:?}");
            assert_eq!(names(dir.path()), ["f"], "{op:?}: no temporary file left");
        }
    }

    #[test]
    fn publish_new_never_replaces() {
        let dir = tempfile::tempdir().unwrap();
        let target = dir.path().join("n.json");
        let first = TempFile::write(&FsStorage, dir.path(), "n.json", b"one").unwrap();
        assert_eq!(first.publish_new(&target).unwrap(), Published::Created);
        let second = TempFile::write(&FsStorage, dir.path(), "n.json", b"two").unwrap();
        assert_eq!(second.publish_new(&target).unwrap(), Published::Exists);
        assert_eq!(std::fs::read(&target).unwrap(), b"one");
        assert_eq!(names(dir.path()), ["n.json"]);
    }

    #[test]
    fn orphans_of_dead_writers_are_removed_and_others_kept() {
        let dir = tempfile::tempdir().unwrap();
        // pid 0 is never a user process's pid in /proc; u32::MAX is not a valid pid.
        let dead = dir.path().join(format!(".a.json.{}.1.tmp", u32::MAX));
        let own = dir
            .path()
            .join(format!(".b.json.{}.1.tmp", std::process::id()));
        let not_ours = dir.path().join(".c.json.tmp");
        for path in [&dead, &own, &not_ours] {
            std::fs::write(path, b"x").unwrap();
        }
        assert_eq!(
            remove_orphaned_temps(&FsStorage, dir.path(), false).unwrap(),
            1
        );
        assert_eq!(names(dir.path()).len(), 2);
        assert_eq!(
            remove_orphaned_temps(&FsStorage, dir.path(), true).unwrap(),
            1
        );
        assert_eq!(names(dir.path()), [".c.json.tmp"]);
    }

    #[test]
    fn temp_names() {
        assert_eq!(temp_writer_pid(Path::new("/d/.x.json.12.3.tmp")), Some(12));
        assert_eq!(temp_writer_pid(Path::new("/d/.a.b.12.3.tmp")), Some(12));
        assert_eq!(temp_writer_pid(Path::new("/d/x.12.3.tmp")), None);
        assert_eq!(temp_writer_pid(Path::new("/d/.12.3.tmp")), None);
        assert_eq!(temp_writer_pid(Path::new("/d/.x.12.y.tmp")), None);
        assert_eq!(temp_writer_pid(Path::new("/d/.x.json")), None);
    }

    #[test]
    fn create_dir_durably_creates_parents_and_rejects_files() {
        let dir = tempfile::tempdir().unwrap();
        let deep = dir.path().join("a/b/c");
        create_dir_durably(&FsStorage, &deep).unwrap();
        assert!(deep.is_dir());
        create_dir_durably(&FsStorage, &deep).unwrap();
        let file = dir.path().join("file");
        std::fs::write(&file, b"x").unwrap();
        assert!(create_dir_durably(&FsStorage, &file).is_err());
    }

    #[test]
    fn parent_of_bare_name_is_dot() {
        assert_eq!(parent_of(Path::new("notes")), Path::new("."));
        assert_eq!(parent_of(Path::new("a/notes")), Path::new("a"));
    }
}
