//! The cross-process writer lock of a store: an exclusive `flock` on a file of its own.
//!
//! The kernel releases a dead process's lock when its descriptors close, which is what lets a
//! store recover after a SIGKILL (the next writer takes the lock and repairs what it finds).
//! The lock file holds no data, so its creation needs no fsync: losing it in a crash only means
//! the next open creates it again.

use std::fs::{File, OpenOptions};
use std::io;
use std::path::{Path, PathBuf};

use crate::StorageError;

/// A lock file, opened once and locked for each critical section.
///
/// Each `LockFile` is its own open file description, so two of them in one process exclude each
/// other like two processes do; threads sharing one `LockFile` must serialize themselves (the
/// stores hold a mutex around it).
#[derive(Debug)]
pub struct LockFile {
    file: File,
    path: PathBuf,
}

/// Holds the lock until dropped.
#[derive(Debug)]
pub struct LockGuard<'a> {
    file: &'a File,
}

impl LockFile {
    /// Opens (creating if absent, never truncating) the lock file at `path`: a regular file, not a
    /// link (see [`crate::open_regular`]).
    pub fn open(path: impl Into<PathBuf>) -> Result<Self, StorageError> {
        let path = path.into();
        let file = crate::open_regular(
            &path,
            OpenOptions::new()
                .read(true)
                .write(true)
                .create(true)
                .truncate(false),
            crate::Symlinks::Refuse,
        )
        .map_err(|e| StorageError::new("open lock file", &path, e))?;
        Ok(LockFile { file, path })
    }

    /// Where the lock file is.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Takes the exclusive lock, waiting for it (again after a signal interrupts the wait).
    pub fn lock(&self) -> Result<LockGuard<'_>, StorageError> {
        loop {
            match self.file.lock() {
                Ok(()) => return Ok(LockGuard { file: &self.file }),
                // A signal interrupted the wait; waiting again is the only sane response.
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(StorageError::new("lock", &self.path, e)),
            }
        }
    }
}

impl Drop for LockGuard<'_> {
    fn drop(&mut self) {
        // Closing the descriptor would release it too; unlocking here makes the release point
        // this drop. An error cannot leave the lock held past the file's close.
        let _ = self.file.unlock();
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    #[test]
    fn two_lock_files_exclude_each_other() {
        let dir = tempfile::tempdir().unwrap();
        let a = LockFile::open(dir.path().join(".lock")).unwrap();
        let b = LockFile::open(dir.path().join(".lock")).unwrap();
        let held = a.lock().unwrap();
        assert!(matches!(
            b.file.try_lock(),
            Err(std::fs::TryLockError::WouldBlock)
        ));
        drop(held);
        drop(b.lock().unwrap());
        assert!(LockFile::open(dir.path().join("absent/.lock")).is_err());
    }
}
