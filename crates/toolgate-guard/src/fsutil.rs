//! Durable file operations shared by the file-backed guards (same protocol as the commit store's,
//! see `docs/commit-store.md`): temporary file created with `create_new`, written, fsynced, renamed
//! into place, directory fsynced.

use std::fs::{self, File, OpenOptions};
use std::io::{self, Write as _};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

use crate::GuardError;

/// Suffix of temporary files; together with a leading dot it marks them as not ours to read.
const TEMP_SUFFIX: &str = ".tmp";
/// How many fresh temporary names to try before giving up. Names carry the pid and a process-wide
/// counter, so a collision needs an orphan from an earlier process with the same pid.
const TEMP_NAME_ATTEMPTS: u32 = 16;

/// Distinguishes temporary files of concurrent calls in one process (the pid distinguishes processes).
static TEMP_COUNTER: AtomicU64 = AtomicU64::new(0);

/// A fresh name `dir/.<stem>.<pid>.<counter>.tmp` (not created).
pub(crate) fn temp_path(dir: &Path, stem: &str) -> PathBuf {
    let pid = std::process::id();
    let counter = TEMP_COUNTER.fetch_add(1, Ordering::Relaxed);
    dir.join(format!(".{stem}.{pid}.{counter}{TEMP_SUFFIX}"))
}

/// Writes `bytes` to `dir/name` atomically and durably: a temporary file in `dir` created with
/// `create_new`, written, fsynced, renamed over `dir/name`, then `dir` fsynced.
///
/// On error the temporary file is removed (best effort) and `dir/name` is either untouched or
/// fully replaced; after an error at the final directory fsync the replacement may not survive a
/// power loss, and a retry writes it again.
pub(crate) fn write_durably(dir: &Path, name: &str, bytes: &[u8]) -> Result<(), GuardError> {
    let target = dir.join(name);
    let (mut file, mut temp) = create_temp(dir, name)?;
    file.write_all(bytes)
        .map_err(|e| GuardError::io("write temporary file", &temp.path, e))?;
    file.sync_all()
        .map_err(|e| GuardError::io("fsync temporary file", &temp.path, e))?;
    drop(file);
    fs::rename(&temp.path, &target)
        .map_err(|e| GuardError::io("rename temporary file into place at", &target, e))?;
    // The temporary name no longer exists; it must not be removed now.
    temp.disarm();
    fsync_dir(dir)
}

/// Creates `dir/.<stem>.<pid>.<counter>.tmp` exclusively.
fn create_temp(dir: &Path, stem: &str) -> Result<(File, TempGuard), GuardError> {
    let mut last_path = dir.to_path_buf();
    for _ in 0..TEMP_NAME_ATTEMPTS {
        let path = temp_path(dir, stem);
        match OpenOptions::new().write(true).create_new(true).open(&path) {
            Ok(file) => return Ok((file, TempGuard { path, armed: true })),
            // An orphan of an earlier process that had our pid; try the next name.
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => last_path = path,
            Err(e) => return Err(GuardError::io("create temporary file", &path, e)),
        }
    }
    Err(GuardError::io(
        "create temporary file (every candidate name was taken)",
        last_path,
        io::Error::from(io::ErrorKind::AlreadyExists),
    ))
}

/// Removes a temporary file on early return.
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
            // Best effort: a leftover `.*.tmp` file is never read by the guards.
            let _ = fs::remove_file(&self.path);
        }
    }
}

/// fsyncs a directory so that entries created, renamed or removed in it survive a power loss.
pub(crate) fn fsync_dir(dir: &Path) -> Result<(), GuardError> {
    File::open(dir)
        .and_then(|d| d.sync_all())
        .map_err(|e| GuardError::io("fsync directory", dir, e))
}

/// The directory containing `path`, treating a bare relative name as living in `.`.
pub(crate) fn parent_of(path: &Path) -> &Path {
    match path.parent() {
        Some(parent) if !parent.as_os_str().is_empty() => parent,
        _ => Path::new("."),
    }
}

/// Creates `dir` and any missing ancestors, fsyncing each new entry's parent so the directory
/// itself survives a power loss (otherwise a file fsynced into it could vanish with it).
pub(crate) fn create_dir_durably(dir: &Path) -> Result<(), GuardError> {
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
            Err(e) => return Err(GuardError::io("inspect directory", cursor, e)),
        }
    }
    for path in missing.into_iter().rev() {
        match fs::create_dir(path) {
            Ok(()) => fsync_dir(parent_of(path))?,
            // Another process created it concurrently; it is responsible for its durability.
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {}
            Err(e) => return Err(GuardError::io("create directory", path, e)),
        }
    }
    let meta = fs::metadata(dir).map_err(|e| GuardError::io("inspect directory", dir, e))?;
    if !meta.is_dir() {
        return Err(GuardError::io(
            "use as a directory",
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
    fn write_durably_replaces_and_leaves_no_temp() {
        let dir = tempfile::tempdir().unwrap();
        write_durably(dir.path(), "f.json", b"one").unwrap();
        write_durably(dir.path(), "f.json", b"two").unwrap();
        assert_eq!(fs::read(dir.path().join("f.json")).unwrap(), b"two");
        let names: Vec<_> = fs::read_dir(dir.path())
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(names, vec![std::ffi::OsString::from("f.json")]);
    }

    #[test]
    fn write_into_missing_dir_is_an_io_error_not_a_panic() {
        let dir = tempfile::tempdir().unwrap();
        let err = write_durably(&dir.path().join("absent"), "f.json", b"x").unwrap_err();
        assert!(matches!(err, GuardError::Io { .. }), "{err}");
    }

    #[test]
    fn create_dir_durably_creates_parents_and_rejects_files() {
        let dir = tempfile::tempdir().unwrap();
        let deep = dir.path().join("a/b/c");
        create_dir_durably(&deep).unwrap();
        assert!(deep.is_dir());
        create_dir_durably(&deep).unwrap();
        let file = dir.path().join("file");
        fs::write(&file, b"x").unwrap();
        assert!(create_dir_durably(&file).is_err());
    }
}
