//! The storage operations every store performs, behind a trait so tests can count them and fail any
//! one of them.

use std::collections::HashMap;
use std::fmt;
use std::fs::{self, File, OpenOptions};
use std::io::{self, Write as _};
use std::os::unix::fs::FileExt as _;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use crate::Symlinks;

/// The file operations of toolgate's stores, so that tests can count every write and sync and fail
/// the Nth one (in the manner of redb's `StorageBackend`). Journal appends are
/// [`Storage::write_at`] (counted as [`Op::Write`]) made durable by [`Storage::sync_data`]
/// (`fdatasync`, [`Op::FsyncFile`]); whole files are written with [`Storage::write_new`] and
/// [`Storage::fsync_file`], then published with [`Storage::rename`] (replacing) or
/// [`Storage::link`] (only if absent), and their directory is fsynced with
/// [`Storage::fsync_dir`]. The helpers of this crate ([`crate::TempFile`], [`crate::replace_file`],
/// [`crate::fsync_dir`], [`crate::create_dir_durably`]) are written on this trait, so a store that
/// uses them is counted and can be failed at every step.
///
/// Writer locks are deliberately not part of the trait: they are kernel `flock`s whose release on
/// process death is what makes recovery sound, and a test double could not honour that.
pub trait Storage: Send + Sync + fmt::Debug {
    /// The bytes of the regular file `path` (at most `max_bytes`), or `None` if it does not exist.
    /// A link, a FIFO, a device or a file over `max_bytes` is an error carrying a
    /// [`crate::FileProblem`] (see [`crate::read_regular`]), never a blocked or unbounded read.
    fn read(&self, path: &Path, max_bytes: u64) -> io::Result<Option<Vec<u8>>>;
    /// Up to `len` bytes of the open `file` from `offset` (fewer only at its end).
    fn read_at(&self, file: &File, offset: u64, len: usize) -> io::Result<Vec<u8>>;
    /// Writes all of `bytes` into the open `file` at `offset` (extending it if needed).
    fn write_at(&self, file: &File, offset: u64, bytes: &[u8]) -> io::Result<()>;
    /// Writes all of `bytes` to the open `file` at its current position (its end, for a file
    /// opened with `O_APPEND`). Counted as [`Op::Write`].
    fn append(&self, file: &File, bytes: &[u8]) -> io::Result<()>;
    /// Makes the contents of the open `file` durable (`fdatasync`; counted as [`Op::FsyncFile`]).
    fn sync_data(&self, file: &File) -> io::Result<()>;
    /// Creates `path` exclusively (`O_CREAT | O_EXCL`) and writes `bytes` to it.
    fn write_new(&self, path: &Path, bytes: &[u8]) -> io::Result<()>;
    /// Makes the contents of `path` durable (`fdatasync`).
    fn fsync_file(&self, path: &Path) -> io::Result<()>;
    /// Atomically renames `from` to `to`, replacing `to`.
    fn rename(&self, from: &Path, to: &Path) -> io::Result<()>;
    /// Creates `to` as a second name of `from` (`link(2)`): atomic, and an error of kind
    /// `AlreadyExists` if `to` exists, so a file published this way never replaces another.
    /// Counted as [`Op::Rename`].
    fn link(&self, from: &Path, to: &Path) -> io::Result<()>;
    /// Makes entries created, renamed or removed in `dir` durable.
    fn fsync_dir(&self, dir: &Path) -> io::Result<()>;
    /// Removes the file `path`.
    fn remove(&self, path: &Path) -> io::Result<()>;
    /// The regular files directly inside `dir` (full paths), in no particular order.
    fn list(&self, dir: &Path) -> io::Result<Vec<PathBuf>>;
}

/// The real storage: `std::fs` on a local POSIX filesystem.
#[derive(Debug, Clone, Copy, Default)]
pub struct FsStorage;

impl Storage for FsStorage {
    fn read(&self, path: &Path, max_bytes: u64) -> io::Result<Option<Vec<u8>>> {
        crate::read_regular(path, max_bytes, Symlinks::Refuse)
    }

    fn read_at(&self, file: &File, offset: u64, len: usize) -> io::Result<Vec<u8>> {
        let mut buf = vec![0; len];
        let mut filled = 0;
        while filled < len {
            let pos = offset.saturating_add(filled as u64);
            match file.read_at(&mut buf[filled..], pos) {
                Ok(0) => break,
                Ok(n) => filled += n,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e),
            }
        }
        buf.truncate(filled);
        Ok(buf)
    }

    fn write_at(&self, file: &File, offset: u64, bytes: &[u8]) -> io::Result<()> {
        file.write_all_at(bytes, offset)
    }

    fn append(&self, mut file: &File, bytes: &[u8]) -> io::Result<()> {
        file.write_all(bytes)
    }

    fn sync_data(&self, file: &File) -> io::Result<()> {
        file.sync_data()
    }

    fn write_new(&self, path: &Path, bytes: &[u8]) -> io::Result<()> {
        let mut file = OpenOptions::new().write(true).create_new(true).open(path)?;
        file.write_all(bytes)
    }

    fn fsync_file(&self, path: &Path) -> io::Result<()> {
        // fdatasync also flushes the size of a newly written file (metadata needed to read it back).
        crate::open_regular(path, OpenOptions::new().write(true), Symlinks::Refuse)?.sync_data()
    }

    fn rename(&self, from: &Path, to: &Path) -> io::Result<()> {
        fs::rename(from, to)
    }

    fn link(&self, from: &Path, to: &Path) -> io::Result<()> {
        fs::hard_link(from, to)
    }

    fn fsync_dir(&self, dir: &Path) -> io::Result<()> {
        crate::open_dir(dir, Symlinks::Follow)?.sync_all()
    }

    fn remove(&self, path: &Path) -> io::Result<()> {
        fs::remove_file(path)
    }

    fn list(&self, dir: &Path) -> io::Result<Vec<PathBuf>> {
        let mut out = Vec::new();
        for entry in fs::read_dir(dir)? {
            let entry = entry?;
            if entry.file_type()?.is_file() {
                out.push(entry.path());
            }
        }
        Ok(out)
    }
}

/// A storage operation that [`FaultyStorage`] can fail.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
#[non_exhaustive]
pub enum Op {
    /// [`Storage::write_new`] (whole files), [`Storage::write_at`] and [`Storage::append`]
    /// (journal appends).
    Write,
    /// [`Storage::fsync_file`] and [`Storage::sync_data`] (the journal's `fdatasync`).
    FsyncFile,
    /// [`Storage::rename`] and [`Storage::link`] (the two ways a file is published).
    Rename,
    /// [`Storage::fsync_dir`].
    FsyncDir,
    /// [`Storage::remove`].
    Remove,
}

impl Op {
    /// Every operation, in declaration order (for tests that fail each one in turn).
    pub const ALL: [Op; 5] = [
        Op::Write,
        Op::FsyncFile,
        Op::Rename,
        Op::FsyncDir,
        Op::Remove,
    ];
}

#[derive(Debug, Default)]
struct FaultState {
    calls: HashMap<Op, u64>,
    armed: HashMap<Op, u64>,
    triggered: u64,
}

/// **Test utility** (public so integration tests and benches can use it): wraps another
/// [`Storage`], counts its operations and fails the Nth call of an operation on command.
///
/// It is not meant for production use; a store on it behaves exactly like one on its inner
/// storage until a fault is armed with [`FaultyStorage::fail_nth`].
#[derive(Debug)]
pub struct FaultyStorage {
    inner: std::sync::Arc<dyn Storage>,
    state: Mutex<FaultState>,
}

impl FaultyStorage {
    /// Wraps `inner` with no fault armed.
    pub fn new(inner: std::sync::Arc<dyn Storage>) -> Self {
        FaultyStorage {
            inner,
            state: Mutex::default(),
        }
    }

    /// Makes the `n`th call (1-based, counted from now) of `op` fail with an injected
    /// `io::Error`; later calls succeed again. `n = 0` disarms `op`.
    pub fn fail_nth(&self, op: Op, n: u64) {
        let mut state = self.lock();
        state.calls.insert(op, 0);
        if n == 0 {
            state.armed.remove(&op);
        } else {
            state.armed.insert(op, n);
        }
    }

    /// How many injected failures have fired so far.
    pub fn triggered(&self) -> u64 {
        self.lock().triggered
    }

    /// How many calls of `op` were made (since the last `fail_nth` for it).
    pub fn calls(&self, op: Op) -> u64 {
        self.lock().calls.get(&op).copied().unwrap_or(0)
    }

    /// How many sync operations were made: [`Op::FsyncFile`] and [`Op::FsyncDir`] together (the
    /// `fsync`/`fdatasync` class whose latency bounds a store's rate).
    pub fn syncs(&self) -> u64 {
        self.calls(Op::FsyncFile) + self.calls(Op::FsyncDir)
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, FaultState> {
        // The state is a few counters that stay consistent even if a holder panicked.
        self.state
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    fn check(&self, op: Op) -> io::Result<()> {
        let mut state = self.lock();
        let calls = state.calls.entry(op).or_insert(0);
        *calls += 1;
        let n = *calls;
        if state.armed.get(&op) == Some(&n) {
            state.armed.remove(&op);
            state.triggered += 1;
            return Err(io::Error::other(format!(
                "injected fault: call {n} of {op:?} failed"
            )));
        }
        Ok(())
    }
}

impl Storage for FaultyStorage {
    fn read(&self, path: &Path, max_bytes: u64) -> io::Result<Option<Vec<u8>>> {
        self.inner.read(path, max_bytes)
    }

    fn read_at(&self, file: &File, offset: u64, len: usize) -> io::Result<Vec<u8>> {
        self.inner.read_at(file, offset, len)
    }

    fn write_at(&self, file: &File, offset: u64, bytes: &[u8]) -> io::Result<()> {
        self.check(Op::Write)?;
        self.inner.write_at(file, offset, bytes)
    }

    fn append(&self, file: &File, bytes: &[u8]) -> io::Result<()> {
        self.check(Op::Write)?;
        self.inner.append(file, bytes)
    }

    fn sync_data(&self, file: &File) -> io::Result<()> {
        self.check(Op::FsyncFile)?;
        self.inner.sync_data(file)
    }

    fn write_new(&self, path: &Path, bytes: &[u8]) -> io::Result<()> {
        self.check(Op::Write)?;
        self.inner.write_new(path, bytes)
    }

    fn fsync_file(&self, path: &Path) -> io::Result<()> {
        self.check(Op::FsyncFile)?;
        self.inner.fsync_file(path)
    }

    fn rename(&self, from: &Path, to: &Path) -> io::Result<()> {
        self.check(Op::Rename)?;
        self.inner.rename(from, to)
    }

    fn link(&self, from: &Path, to: &Path) -> io::Result<()> {
        self.check(Op::Rename)?;
        self.inner.link(from, to)
    }

    fn fsync_dir(&self, dir: &Path) -> io::Result<()> {
        self.check(Op::FsyncDir)?;
        self.inner.fsync_dir(dir)
    }

    fn remove(&self, path: &Path) -> io::Result<()> {
        self.check(Op::Remove)?;
        self.inner.remove(path)
    }

    fn list(&self, dir: &Path) -> io::Result<Vec<PathBuf>> {
        self.inner.list(dir)
    }
}
