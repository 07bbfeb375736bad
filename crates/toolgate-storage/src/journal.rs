//! The append-only journal file of a store: one line per entry, appended under the store's
//! [`crate::LockFile`], read back by other processes and store instances, torn tails found.
//!
//! Both journals of toolgate sit on [`Journal`]: the audit log ([`Layout::Plain`]: the file is
//! exactly its lines, an external contract, appended with `O_APPEND`) and the effect journal
//! ([`Layout::Padded`]: lines, then zero padding the file grows by in whole chunks, so that an
//! append overwrites bytes the file already has and its `fdatasync` need not commit a new size).
//! What the stores share lives here, once: opening the file through the floor
//! ([`crate::open_regular`]: a regular file, never a link), noticing that another process
//! replaced the file (its `(st_dev, st_ino)` against the path's), the logical end this handle
//! knows, reading the complete lines appended since (each at most `max_line` bytes, so memory
//! stays bounded whatever the file holds), finding the last line ([`read_tail`], backwards, never
//! the whole file), reporting a torn tail, and appending and syncing through the [`Storage`] so
//! that a [`crate::FaultyStorage`] counts and fails those steps.
//!
//! What a store does about a torn tail is its own decision: the audit log saves the bytes as
//! evidence and [`Journal::truncate`]s, the effect journal [`Journal::zero_tail`]s. Locking is the
//! store's too: every method that reads or writes assumes the caller holds its lock.

use std::fs::{File, OpenOptions};
use std::io;
use std::os::unix::fs::{FileExt as _, MetadataExt as _};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use crate::{Storage, StorageError, Symlinks};

/// How much of a journal is read at a time when looking for lines appended by others.
const READ_STEP: usize = 16 * 1024;
/// The first read of [`Journal::read_lines`]: usually nothing was appended and the padding (or
/// the end of the file) starts right there.
const FIRST_READ: usize = 1024;
/// The first read of [`read_tail`] from the end; one block usually holds the whole last line.
const FIRST_TAIL_CHUNK: u64 = 8 * 1024;

/// `(st_dev, st_ino)`: which file a descriptor or a path is.
pub type FileId = (u64, u64);

/// The shape of a journal file.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Layout {
    /// The file is its lines and nothing else; appends go through a descriptor opened with
    /// `O_APPEND`, so each lands at the end of the file.
    Plain,
    /// The lines, then zero bytes up to a multiple of `chunk`: an append writes at the logical
    /// end (the first line that starts with a zero byte) and, when the file is too short, a
    /// zero-filled chunk with it. Lines must not contain a zero byte (canonical JSON never does).
    Padded {
        /// How much the file grows at a time, in bytes (at least 1).
        chunk: u64,
    },
}

/// What [`Journal::open`] and [`Journal::reopen`] do when the file does not exist.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Missing {
    /// Fail with `NotFound`.
    Fail,
    /// Create it; the caller makes the new directory entry durable (an `fsync` of the directory).
    Create,
    /// Create its missing directories and the file, and fsync the directory holding it, so the
    /// new entry survives a crash (otherwise the first lines could vanish with it).
    CreateDurably,
}

/// How to open a [`Journal`].
#[derive(Debug, Clone, Copy)]
pub struct JournalConfig {
    layout: Layout,
    max_line: u64,
    symlinks: Symlinks,
    missing: Missing,
}

impl JournalConfig {
    /// A journal of `layout` whose lines (newline included) are at most `max_line` bytes; a link
    /// at the path is refused and a missing file is an error until [`Self::missing`] says otherwise.
    pub fn new(layout: Layout, max_line: u64) -> Self {
        JournalConfig {
            layout,
            max_line,
            symlinks: Symlinks::Refuse,
            missing: Missing::Fail,
        }
    }

    /// Whether a link at the path is followed (for a file the operator chose, such as a
    /// checkpoint mirror on another volume) or refused (every file inside the ledger; default).
    pub fn symlinks(mut self, symlinks: Symlinks) -> Self {
        self.symlinks = symlinks;
        self
    }

    /// What [`Journal::open`] does when the file does not exist (default [`Missing::Fail`]).
    pub fn missing(mut self, missing: Missing) -> Self {
        self.missing = missing;
        self
    }
}

/// The step of a journal operation that failed, for [`JournalError::Io`]. Stores name it in
/// their own words.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum JournalStep {
    /// Opening the file.
    Open,
    /// Creating the missing file.
    Create,
    /// `stat` of the path or `fstat` of the open file.
    Stat,
    /// Reading lines or the tail.
    Read,
    /// Appending lines.
    Write,
    /// Overwriting a torn tail with zeros.
    Zero,
    /// Cutting off a torn tail.
    Truncate,
    /// `fdatasync`.
    Sync,
}

impl JournalStep {
    fn verb(self) -> &'static str {
        match self {
            JournalStep::Open => "open",
            JournalStep::Create => "create",
            JournalStep::Stat => "stat",
            JournalStep::Read => "read",
            JournalStep::Write => "append to",
            JournalStep::Zero => "zero the torn tail of",
            JournalStep::Truncate => "truncate the torn tail of",
            JournalStep::Sync => "fdatasync",
        }
    }
}

/// Why a journal operation failed. Each message names the file and what to do.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum JournalError {
    /// An operating system call on the journal failed.
    #[error(
        "could not {} journal {path}: {source}; check that the directory is on a local \
         filesystem, writable by this process and not full, then retry",
        step.verb()
    )]
    Io {
        /// Which step.
        step: JournalStep,
        /// The journal's path.
        path: PathBuf,
        /// The operating system's error.
        #[source]
        source: io::Error,
    },
    /// Creating the journal's directory or making its new entry durable failed.
    #[error(transparent)]
    Dir(#[from] StorageError),
    /// No line break where one must be: a line longer than any the store writes.
    #[error(
        "journal {path}: no line break within {limit} bytes from offset {offset}, longer than any \
         line its store writes; the file was damaged or not written by toolgate: restore it from \
         a backup"
    )]
    LineTooLong {
        /// The journal's path.
        path: PathBuf,
        /// Where the line (or the searched window) starts.
        offset: u64,
        /// The longest line allowed, newline included.
        limit: u64,
    },
    /// Bytes without a newline before the padding or the end of the file, and more lines after
    /// them: a damaged line, not one unfinished write, so discarding what follows could lose
    /// durable entries.
    #[error(
        "journal {path}: the line at offset {offset} ends without a newline, yet more lines follow \
         (not a torn last write); inspect the file and restore it from a backup"
    )]
    DamagedLine {
        /// The journal's path.
        path: PathBuf,
        /// Where the damaged line starts.
        offset: u64,
    },
}

impl JournalError {
    /// The file the error is about.
    pub fn path(&self) -> &Path {
        match self {
            JournalError::Io { path, .. }
            | JournalError::LineTooLong { path, .. }
            | JournalError::DamagedLine { path, .. } => path,
            JournalError::Dir(e) => &e.path,
        }
    }

    fn io(step: JournalStep, path: &Path) -> impl FnOnce(io::Error) -> JournalError + '_ {
        move |source| JournalError::Io {
            step,
            path: path.to_path_buf(),
            source,
        }
    }
}

/// Whether the journal's path still names the file a [`Journal`] has open.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AtPath {
    /// The same file.
    Same,
    /// Another file: it was replaced (a compaction renamed a new one over it, a rotation moved it
    /// away and created a new one).
    Other,
    /// Nothing: it was moved away (a rotation that crashed before creating the new file).
    Absent,
}

/// Where [`Journal::read_lines`] stopped.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Scan {
    /// At a line boundary: the end of the file, or (padded) the padding.
    Clean,
    /// At an unfinished line: `bytes` bytes after the logical end and before the end of the file
    /// or (padded) a zero byte, with no newline. A write that never finished, or damage; the
    /// store decides the repair.
    Torn {
        /// How many bytes the unfinished line has.
        bytes: u64,
    },
}

/// The end of a file's first `len` bytes as found by [`read_tail`].
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct Tail {
    /// Offset just past the last `\n`: the length of the complete lines.
    pub complete_len: u64,
    /// The last complete line, without its `\n`; `None` when there is no complete line.
    pub last_line: Option<Vec<u8>>,
    /// Bytes after the last `\n`, left by a write that was interrupted. Empty for a healthy file.
    pub torn: Vec<u8>,
}

/// A journal file opened through the floor, and the logical end this handle knows of it.
///
/// The end is known after this handle read or wrote up to it ([`Journal::read_lines`],
/// [`Journal::read_tail`], [`Journal::append`], or a file it just created), and unknown after a
/// failed append (the file may hold part of it), a reopen, or [`Journal::forget_end`]; a store
/// that finds it unknown reads the file again before it trusts what it believes.
#[derive(Debug)]
pub struct Journal {
    storage: Arc<dyn Storage>,
    path: PathBuf,
    config: JournalConfig,
    file: Arc<File>,
    id: FileId,
    end: Option<u64>,
    /// The file's size as far as this handle knows (zero padding included); another process may
    /// have extended it since, which at worst makes a padded append pad again.
    size: u64,
}

/// A new file for a journal, opened by [`Journal::open_replacement`] before it is renamed over
/// the journal's path (the rename does not change the open file), then [`Journal::adopt`]ed.
#[derive(Debug)]
pub struct Replacement {
    file: File,
    id: FileId,
    size: u64,
}

/// The `fdatasync` of a journal, usable without the journal (for a store that syncs after
/// releasing its lock while the next batch is written). Goes through the journal's [`Storage`].
#[derive(Debug, Clone)]
pub struct SyncHandle {
    storage: Arc<dyn Storage>,
    file: Arc<File>,
    path: Arc<Path>,
}

impl SyncHandle {
    /// Makes everything written to the file durable (`fdatasync`).
    pub fn sync_data(&self) -> Result<(), JournalError> {
        self.storage
            .sync_data(&self.file)
            .map_err(JournalError::io(JournalStep::Sync, &self.path))
    }
}

fn file_id(meta: &std::fs::Metadata) -> FileId {
    (meta.dev(), meta.ino())
}

impl Journal {
    /// Opens the journal at `path` (read and write; `O_APPEND` for [`Layout::Plain`]) through
    /// [`crate::open_regular`], creating it as `config` says. Its end is known (0) only when it
    /// was created here.
    pub fn open(
        storage: Arc<dyn Storage>,
        path: impl Into<PathBuf>,
        config: JournalConfig,
    ) -> Result<Journal, JournalError> {
        let path = path.into();
        let (file, created) = open_file(storage.as_ref(), &path, &config, config.missing)?;
        let meta = file
            .metadata()
            .map_err(JournalError::io(JournalStep::Stat, &path))?;
        Ok(Journal {
            storage,
            path,
            config,
            file: Arc::new(file),
            id: file_id(&meta),
            end: created.then_some(0),
            size: meta.len(),
        })
    }

    /// The journal's path.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The open file (for reads a store makes itself, such as the first line of a log).
    pub fn file(&self) -> &File {
        &self.file
    }

    /// The logical end this handle knows: just past the last complete line it read or wrote.
    pub fn end(&self) -> Option<u64> {
        self.end
    }

    /// Forgets the end (the store's view may be stale, e.g. after a panic in the middle of a
    /// write), so the store reads the file again before relying on it.
    pub fn forget_end(&mut self) {
        self.end = None;
    }

    /// Makes [`Journal::read_lines`] start from the beginning of the file (for a store that
    /// rebuilds its view after the end became unknown).
    pub fn read_from_start(&mut self) {
        self.end = Some(0);
    }

    /// The open file's length (`fstat`), padding included.
    pub fn file_len(&self) -> Result<u64, JournalError> {
        Ok(self
            .file
            .metadata()
            .map_err(JournalError::io(JournalStep::Stat, &self.path))?
            .len())
    }

    /// Whether the path still names the open file (one `stat`); call it under the store's lock.
    pub fn at_path(&self) -> Result<AtPath, JournalError> {
        match std::fs::metadata(&self.path) {
            Ok(meta) if file_id(&meta) == self.id => Ok(AtPath::Same),
            Ok(_) => Ok(AtPath::Other),
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(AtPath::Absent),
            Err(e) => Err(JournalError::io(JournalStep::Stat, &self.path)(e)),
        }
    }

    /// Opens the path again (after [`Journal::at_path`] found another file or none), creating it
    /// as `missing` says. The end is then unknown, or 0 when the file was created here.
    pub fn reopen(&mut self, missing: Missing) -> Result<(), JournalError> {
        let (file, created) = open_file(self.storage.as_ref(), &self.path, &self.config, missing)?;
        let meta = file
            .metadata()
            .map_err(JournalError::io(JournalStep::Stat, &self.path))?;
        self.file = Arc::new(file);
        self.id = file_id(&meta);
        self.size = meta.len();
        self.end = created.then_some(0);
        Ok(())
    }

    /// Opens `path`, a complete new journal file written by the store, before the store renames
    /// it over the journal's path.
    pub fn open_replacement(&self, path: &Path) -> Result<Replacement, JournalError> {
        let (file, _) = open_file(self.storage.as_ref(), path, &self.config, Missing::Fail)?;
        let meta = file
            .metadata()
            .map_err(JournalError::io(JournalStep::Stat, path))?;
        Ok(Replacement {
            id: file_id(&meta),
            size: meta.len(),
            file,
        })
    }

    /// Switches to `replacement` (renamed over the journal's path by now), whose complete lines
    /// end at `end`.
    pub fn adopt(&mut self, replacement: Replacement, end: u64) {
        self.file = Arc::new(replacement.file);
        self.id = replacement.id;
        self.size = replacement.size;
        self.end = Some(end);
    }

    /// The `fdatasync` of the current file, to run after the store's lock is released.
    pub fn sync_handle(&self) -> SyncHandle {
        SyncHandle {
            storage: Arc::clone(&self.storage),
            file: Arc::clone(&self.file),
            path: self.path.as_path().into(),
        }
    }

    /// Makes everything written to the file durable (`fdatasync`, through the [`Storage`]).
    pub fn sync_data(&self) -> Result<(), JournalError> {
        self.storage
            .sync_data(&self.file)
            .map_err(JournalError::io(JournalStep::Sync, &self.path))
    }

    /// Appends `bytes` (complete lines) at the logical end with one write through the
    /// [`Storage`]: with `O_APPEND` for [`Layout::Plain`]; positioned at the known end for
    /// [`Layout::Padded`], with a zero-filled chunk in the same write when the file is too short.
    /// A failed write leaves the end unknown (the file may hold part of the bytes).
    pub fn append(&mut self, bytes: &[u8]) -> Result<(), JournalError> {
        if bytes.is_empty() {
            return Ok(());
        }
        let len = bytes.len() as u64;
        match self.config.layout {
            Layout::Plain => {
                if let Err(e) = self.storage.append(&self.file, bytes) {
                    self.end = None;
                    return Err(JournalError::io(JournalStep::Write, &self.path)(e));
                }
                self.end = self.end.map(|end| end.saturating_add(len));
                self.size = self.size.saturating_add(len);
            }
            Layout::Padded { chunk } => {
                let Some(offset) = self.end else {
                    return Err(JournalError::io(JournalStep::Write, &self.path)(
                        io::Error::new(
                            io::ErrorKind::InvalidInput,
                            "the journal's logical end is not known; read its lines first",
                        ),
                    ));
                };
                let new_end = offset.saturating_add(len);
                let padded;
                let out = if new_end > self.size {
                    let chunk = chunk.max(1);
                    let new_size = (new_end / chunk + 1).saturating_mul(chunk);
                    let mut with_padding = bytes.to_vec();
                    with_padding
                        .resize(usize::try_from(new_size - offset).unwrap_or(bytes.len()), 0);
                    padded = with_padding;
                    &padded[..]
                } else {
                    bytes
                };
                if let Err(e) = self.storage.write_at(&self.file, offset, out) {
                    self.end = None;
                    return Err(JournalError::io(JournalStep::Write, &self.path)(e));
                }
                self.size = self.size.max(offset.saturating_add(out.len() as u64));
                self.end = Some(new_end);
            }
        }
        Ok(())
    }

    /// Reads the complete lines after the known end (an unknown end reads from the start) and
    /// hands each to `visit` with the offset just past its newline; the end advances past every
    /// line `visit` accepts, and stays before the first it refuses (whose error is returned).
    /// Reads at most `max_line` plus one read step at a time: a line longer than `max_line` is
    /// [`JournalError::LineTooLong`], never an allocation of its size.
    pub fn read_lines<E: From<JournalError>>(
        &mut self,
        mut visit: impl FnMut(&[u8], u64) -> Result<(), E>,
    ) -> Result<Scan, E> {
        let padded = matches!(self.config.layout, Layout::Padded { .. });
        let mut end = self.end.unwrap_or(0);
        self.end = Some(end);
        // `buf` holds the file's bytes from `buf_start`; `start` indexes the logical end in it
        // and `scanned` how far past it no line terminator was found.
        let mut buf: Vec<u8> = Vec::new();
        let mut buf_start = end;
        let (mut start, mut scanned) = (0usize, 0usize);
        loop {
            let rest = &buf[start + scanned..];
            match rest.iter().position(|&b| b == b'\n' || (padded && b == 0)) {
                Some(i) if rest[i] == b'\n' => {
                    let line = &buf[start..start + scanned + i];
                    let line_len = line.len() as u64 + 1;
                    if line_len > self.config.max_line {
                        return Err(self.too_long(end).into());
                    }
                    let line_end = end + line_len;
                    visit(line, line_end)?;
                    end = line_end;
                    self.end = Some(end);
                    start += scanned + i + 1;
                    scanned = 0;
                }
                Some(i) => {
                    let bytes = (scanned + i) as u64;
                    return Ok(if bytes == 0 {
                        Scan::Clean
                    } else {
                        Scan::Torn { bytes }
                    });
                }
                None => {
                    scanned = buf.len() - start;
                    if scanned as u64 >= self.config.max_line {
                        return Err(self.too_long(end).into());
                    }
                    if start > READ_STEP {
                        buf.drain(..start);
                        buf_start = end;
                        start = 0;
                    }
                    let read_to = buf_start + buf.len() as u64;
                    let step = if buf.is_empty() {
                        FIRST_READ
                    } else {
                        READ_STEP
                    };
                    let more = self
                        .storage
                        .read_at(&self.file, read_to, step)
                        .map_err(JournalError::io(JournalStep::Read, &self.path))?;
                    if more.is_empty() {
                        return Ok(if scanned == 0 {
                            Scan::Clean
                        } else {
                            Scan::Torn {
                                bytes: scanned as u64,
                            }
                        });
                    }
                    self.size = self.size.max(read_to + more.len() as u64);
                    buf.extend(more);
                }
            }
        }
    }

    fn too_long(&self, offset: u64) -> JournalError {
        JournalError::LineTooLong {
            path: self.path.clone(),
            offset,
            limit: self.config.max_line,
        }
    }

    /// Reads the last complete line and any torn bytes of the file's first `len` bytes
    /// (backwards, see [`read_tail`]); the end is then just past that line.
    pub fn read_tail(&mut self, len: u64) -> Result<Tail, JournalError> {
        let tail = read_tail(&self.file, &self.path, len, self.config.max_line)?;
        self.end = Some(tail.complete_len);
        Ok(tail)
    }

    /// Cuts the file back to `len` (a torn tail's start, found by [`Journal::read_tail`]); the end
    /// is then `len`. `ftruncate` is not a [`Storage`] operation; the caller makes it durable
    /// (with its next `fdatasync`, or an `fsync` of the file).
    pub fn truncate(&mut self, len: u64) -> Result<(), JournalError> {
        self.end = None;
        self.file
            .set_len(len)
            .map_err(JournalError::io(JournalStep::Truncate, &self.path))?;
        self.size = len;
        self.end = Some(len);
        Ok(())
    }

    /// Overwrites every non-zero byte from the known end to the end of the file with zeros (a
    /// torn last line, and whatever a power loss left after it) and fdatasyncs, so the next
    /// padded append starts on clean ground. Returns how many bytes were zeroed (0: nothing was
    /// written or synced). A newline among those bytes means lines follow a damaged one:
    /// [`JournalError::DamagedLine`], and nothing is changed.
    pub fn zero_tail(&mut self) -> Result<u64, JournalError> {
        let Some(end) = self.end else {
            return Err(JournalError::io(JournalStep::Zero, &self.path)(
                io::Error::new(
                    io::ErrorKind::InvalidInput,
                    "the journal's logical end is not known; read its lines first",
                ),
            ));
        };
        let mut last_nonzero = None;
        let mut offset = end;
        loop {
            let chunk = self
                .storage
                .read_at(&self.file, offset, READ_STEP)
                .map_err(JournalError::io(JournalStep::Read, &self.path))?;
            if chunk.is_empty() {
                break;
            }
            if chunk.contains(&b'\n') {
                return Err(JournalError::DamagedLine {
                    path: self.path.clone(),
                    offset: end,
                });
            }
            if let Some(i) = chunk.iter().rposition(|&b| b != 0) {
                last_nonzero = Some(offset + i as u64);
            }
            offset += chunk.len() as u64;
        }
        self.size = self.size.max(offset);
        let Some(last) = last_nonzero else {
            return Ok(0);
        };
        let zeroed = last + 1 - end;
        let zeros = vec![0; usize::try_from(zeroed).unwrap_or(0)];
        self.storage
            .write_at(&self.file, end, &zeros)
            .map_err(JournalError::io(JournalStep::Zero, &self.path))?;
        self.sync_data()?;
        Ok(zeroed)
    }
}

/// Opens `path` for `config`'s layout, creating it as `missing` says; `true` if it was created.
fn open_file(
    storage: &dyn Storage,
    path: &Path,
    config: &JournalConfig,
    missing: Missing,
) -> Result<(File, bool), JournalError> {
    let mut options = OpenOptions::new();
    options.read(true);
    match config.layout {
        Layout::Plain => options.append(true),
        Layout::Padded { .. } => options.write(true),
    };
    let open = |options: &OpenOptions| crate::open_regular(path, options, config.symlinks);
    match open(&options) {
        Ok(file) => return Ok((file, false)),
        Err(e) if e.kind() == io::ErrorKind::NotFound && missing != Missing::Fail => {}
        Err(e) => return Err(JournalError::io(JournalStep::Open, path)(e)),
    }
    let dir = crate::parent_of(path);
    if missing == Missing::CreateDurably {
        crate::create_dir_durably(storage, dir)?;
    }
    // Not exclusive: another process may create it at the same moment, and both use that file.
    let file = open(options.create(true)).map_err(JournalError::io(JournalStep::Create, path))?;
    if missing == Missing::CreateDurably {
        crate::fsync_dir(storage, dir)?;
    }
    Ok((file, true))
}

/// Reads the last complete line and any torn bytes of the first `len` bytes of `file` (at
/// `path`, named in errors), whose lines are at most `max_line` bytes.
///
/// Reads backwards in growing chunks until it has seen the final `\n` and the one before it, so
/// the amount read is about one line in the common case and at most `2 * max_line` in any case;
/// no line boundary within `max_line` bytes is [`JournalError::LineTooLong`].
pub fn read_tail(file: &File, path: &Path, len: u64, max_line: u64) -> Result<Tail, JournalError> {
    let too_long = |offset| JournalError::LineTooLong {
        path: path.to_path_buf(),
        offset,
        limit: max_line,
    };
    let mut start = len;
    // `buf` always holds the bytes `start..len` of the file.
    let mut buf: Vec<u8> = Vec::new();
    loop {
        if let Some(tail) = analyze(&buf, start, max_line).map_err(|()| too_long(start))? {
            return Ok(tail);
        }
        // analyze() returns a tail whenever the whole file is in `buf`, so here start > 0.
        let have = len - start;
        let want = have.max(FIRST_TAIL_CHUNK).min(start);
        let new_start = start - want;
        let mut chunk = vec![0u8; usize::try_from(want).map_err(|_| too_long(new_start))?];
        file.read_exact_at(&mut chunk, new_start)
            .map_err(JournalError::io(JournalStep::Read, path))?;
        chunk.extend_from_slice(&buf);
        buf = chunk;
        start = new_start;
    }
}

/// Finds the tail inside `buf` (the file's bytes from `start` to its end), or `None` if more
/// bytes from before `start` are needed; `Err` when no line boundary lies within `max_line`.
fn analyze(buf: &[u8], start: u64, max_line: u64) -> Result<Option<Tail>, ()> {
    let at_start = start == 0;
    let too_long = |n: usize| u64::try_from(n).map_or(true, |n| n > max_line);
    let Some(last_nl) = buf.iter().rposition(|&b| b == b'\n') else {
        if too_long(buf.len()) {
            return Err(());
        }
        if at_start {
            return Ok(Some(Tail {
                complete_len: 0,
                last_line: None,
                torn: buf.to_vec(),
            }));
        }
        return Ok(None);
    };
    let torn = &buf[last_nl + 1..];
    if too_long(torn.len()) {
        return Err(());
    }
    let line_start = match buf[..last_nl].iter().rposition(|&b| b == b'\n') {
        Some(prev_nl) => prev_nl + 1,
        None if at_start => 0,
        None if too_long(last_nl) => return Err(()),
        None => return Ok(None),
    };
    let line = &buf[line_start..last_nl];
    if too_long(line.len() + 1) {
        return Err(());
    }
    Ok(Some(Tail {
        complete_len: start + (last_nl as u64 + 1),
        last_line: Some(line.to_vec()),
        torn: torn.to_vec(),
    }))
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;
    use crate::{FaultyStorage, FsStorage, Op};

    const PADDED: Layout = Layout::Padded { chunk: 64 };

    fn open(path: &Path, layout: Layout) -> Journal {
        open_on(Arc::new(FsStorage), path, layout)
    }

    fn open_on(storage: Arc<dyn Storage>, path: &Path, layout: Layout) -> Journal {
        let config = JournalConfig::new(layout, 100).missing(Missing::Create);
        Journal::open(storage, path, config).unwrap()
    }

    /// Every complete line after the known end, and where the scan stopped.
    fn lines(journal: &mut Journal) -> (Vec<String>, Scan) {
        let mut seen = Vec::new();
        let scan = journal
            .read_lines(|line, _| {
                seen.push(String::from_utf8_lossy(line).into_owned());
                Ok::<_, JournalError>(())
            })
            .unwrap();
        (seen, scan)
    }

    #[test]
    fn another_writers_lines_are_read_from_the_known_end() {
        let dir = tempfile::tempdir().unwrap();
        for layout in [Layout::Plain, PADDED] {
            let path = dir.path().join(format!("{layout:?}.journal"));
            let mut a = open(&path, layout);
            let mut b = open(&path, layout);
            assert_eq!(a.end(), Some(0), "created here: nothing in it");
            assert_eq!(b.end(), None, "opened: not read yet");
            a.append(b"one\ntwo\n").unwrap();
            assert_eq!(
                lines(&mut b),
                (vec!["one".into(), "two".into()], Scan::Clean)
            );
            assert_eq!(b.end(), Some(8));
            a.append(b"three\n").unwrap();
            b.read_lines(|line, end| {
                assert_eq!((line, end), (&b"three"[..], 14));
                Ok::<_, JournalError>(())
            })
            .unwrap();
            // Nothing new: the scan stops at once.
            assert_eq!(lines(&mut b), (vec![], Scan::Clean));
            // b appends where a's lines end, never over them.
            b.append(b"four\n").unwrap();
            assert_eq!(lines(&mut a), (vec!["four".into()], Scan::Clean));
            let bytes = std::fs::read(&path).unwrap();
            assert!(bytes.starts_with(b"one\ntwo\nthree\nfour\n"), "{layout:?}");
        }
    }

    #[test]
    fn a_refused_line_stops_the_scan_before_it() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("j");
        let mut journal = open(&path, PADDED);
        journal.append(b"good\nbad\nlater\n").unwrap();
        journal.read_from_start();
        let err = journal
            .read_lines(|line, _| {
                if line == b"bad" {
                    Err("refused")
                } else {
                    Ok(())
                }
            })
            .map_err(|e| e.to_string());
        assert!(err.is_err());
        assert_eq!(journal.end(), Some(5), "past `good`, before `bad`");
    }

    impl From<JournalError> for &'static str {
        fn from(_: JournalError) -> Self {
            "journal error"
        }
    }

    #[test]
    fn padding_keeps_the_size_and_a_torn_line_is_found_and_zeroed() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("j");
        let mut journal = open(&path, PADDED);
        journal.append(b"a\n").unwrap();
        assert_eq!(journal.file_len().unwrap(), 64, "one chunk");
        journal.append(&[b'x'; 70]).unwrap();
        assert_eq!(journal.file_len().unwrap(), 128, "grown by whole chunks");

        // A torn last line: bytes up to the padding without a newline.
        let path2 = dir.path().join("torn");
        let mut bytes = b"first\nhalf".to_vec();
        bytes.resize(64, 0);
        std::fs::write(&path2, &bytes).unwrap();
        let mut other = open(&path2, PADDED);
        assert_eq!(
            lines(&mut other),
            (vec!["first".into()], Scan::Torn { bytes: 4 })
        );
        assert_eq!(other.zero_tail().unwrap(), 4);
        let mut expect = b"first\n".to_vec();
        expect.resize(64, 0);
        assert_eq!(std::fs::read(&path2).unwrap(), expect);
        assert_eq!(other.zero_tail().unwrap(), 0, "nothing left to zero");
        other.append(b"second\n").unwrap();
        other.read_from_start();
        assert_eq!(
            lines(&mut other),
            (vec!["first".into(), "second".into()], Scan::Clean)
        );

        // Bytes without a newline, then more lines: damage, left as it is.
        let path3 = dir.path().join("damaged");
        std::fs::write(&path3, b"first\nbro\0ken\nnext\n\0\0").unwrap();
        let mut damaged = open(&path3, PADDED);
        assert_eq!(lines(&mut damaged).1, Scan::Torn { bytes: 3 });
        let err = damaged.zero_tail().unwrap_err();
        assert!(
            matches!(err, JournalError::DamagedLine { offset: 6, .. }),
            "{err}"
        );
        assert_eq!(
            std::fs::read(&path3).unwrap(),
            b"first\nbro\0ken\nnext\n\0\0"
        );
    }

    #[test]
    fn plain_torn_tail_is_found_and_truncated() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("audit.jsonl");
        std::fs::write(&path, b"a\nbb\nccc").unwrap();
        let mut journal = open(&path, Layout::Plain);
        let tail = journal.read_tail(journal.file_len().unwrap()).unwrap();
        assert_eq!(tail.complete_len, 5);
        assert_eq!(tail.last_line.as_deref(), Some(&b"bb"[..]));
        assert_eq!(tail.torn, b"ccc");
        assert_eq!(journal.end(), Some(5));
        journal.read_from_start();
        assert_eq!(
            lines(&mut journal),
            (vec!["a".into(), "bb".into()], Scan::Torn { bytes: 3 })
        );
        journal.truncate(5).unwrap();
        journal.append(b"dd\n").unwrap();
        assert_eq!(std::fs::read(&path).unwrap(), b"a\nbb\ndd\n");
        assert_eq!(journal.end(), Some(8));
    }

    #[test]
    fn lines_are_bounded() {
        let dir = tempfile::tempdir().unwrap();
        for layout in [Layout::Plain, PADDED] {
            let path = dir.path().join(format!("{layout:?}"));
            let mut content = b"ok\n".to_vec();
            content.extend(vec![b'y'; 10_000]);
            std::fs::write(&path, &content).unwrap();
            let mut journal = open(&path, layout);
            let err = journal
                .read_lines(|_, _| Ok::<_, JournalError>(()))
                .unwrap_err();
            assert!(
                matches!(
                    err,
                    JournalError::LineTooLong {
                        offset: 3,
                        limit: 100,
                        ..
                    }
                ),
                "{err}"
            );
            assert_eq!(journal.end(), Some(3));
            // With a newline after it, the line is still too long.
            content.push(b'\n');
            std::fs::write(&path, &content).unwrap();
            journal.read_from_start();
            assert!(
                journal
                    .read_lines(|_, _| Ok::<_, JournalError>(()))
                    .is_err()
            );
            let err = journal.read_tail(content.len() as u64).unwrap_err();
            assert!(matches!(err, JournalError::LineTooLong { .. }), "{err}");
        }
    }

    #[test]
    fn read_tail_finds_the_last_line_of_long_and_empty_files() {
        let dir = tempfile::tempdir().unwrap();
        let tail_of = |content: &[u8], max_line: u64| {
            let path = dir.path().join("t");
            std::fs::write(&path, content).unwrap();
            let file = File::open(&path).unwrap();
            read_tail(&file, &path, content.len() as u64, max_line)
        };
        let t = tail_of(b"a\nbb\n", 100).unwrap();
        assert_eq!((t.complete_len, t.torn.len()), (5, 0));
        assert_eq!(tail_of(b"only\n", 100).unwrap().last_line.unwrap(), b"only");
        let t = tail_of(b"partial", 100).unwrap();
        assert_eq!(
            (t.complete_len, t.last_line, t.torn),
            (0, None, b"partial".to_vec())
        );
        let t = tail_of(b"", 100).unwrap();
        assert_eq!((t.complete_len, t.last_line), (0, None));

        let long = vec![b'x'; 50_000];
        let mut content = b"first\n".to_vec();
        content.extend_from_slice(&long);
        content.push(b'\n');
        content.extend_from_slice(&long[..20_000]);
        let t = tail_of(&content, 100_000).unwrap();
        assert_eq!(t.last_line.as_deref(), Some(&long[..]));
        assert_eq!(t.torn.len(), 20_000);
        assert_eq!(t.complete_len, 6 + 50_001);
        assert!(tail_of(&[b'y'; 10_000], 100).is_err());
    }

    #[test]
    fn a_replacement_is_noticed_by_identity_and_followed() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("j");
        let mut journal = open(&path, PADDED);
        journal.append(b"old\n").unwrap();
        assert_eq!(journal.at_path().unwrap(), AtPath::Same);

        // Another process compacts: a new file renamed over the path.
        let temp = dir.path().join(".j.compact.tmp");
        let mut bytes = b"new\n".to_vec();
        bytes.resize(64, 0);
        std::fs::write(&temp, &bytes).unwrap();
        std::fs::rename(&temp, &path).unwrap();
        assert_eq!(journal.at_path().unwrap(), AtPath::Other);
        journal.reopen(Missing::Fail).unwrap();
        assert_eq!(journal.at_path().unwrap(), AtPath::Same);
        assert_eq!(journal.end(), None, "reopened: nothing read yet");
        assert_eq!(lines(&mut journal), (vec!["new".into()], Scan::Clean));

        // This handle compacts: open the new file, rename it, adopt it.
        std::fs::write(&temp, &bytes).unwrap();
        let replacement = journal.open_replacement(&temp).unwrap();
        std::fs::rename(&temp, &path).unwrap();
        assert_eq!(journal.at_path().unwrap(), AtPath::Other);
        journal.adopt(replacement, 4);
        assert_eq!(journal.at_path().unwrap(), AtPath::Same);
        assert_eq!((journal.end(), journal.file_len().unwrap()), (Some(4), 64));

        // Moved away: absent, and recreated only if asked.
        std::fs::rename(&path, dir.path().join("segment")).unwrap();
        assert_eq!(journal.at_path().unwrap(), AtPath::Absent);
        let err = journal.reopen(Missing::Fail).unwrap_err();
        assert!(
            matches!(
                err,
                JournalError::Io {
                    step: JournalStep::Open,
                    ..
                }
            ),
            "{err}"
        );
        journal.reopen(Missing::CreateDurably).unwrap();
        assert_eq!(journal.end(), Some(0), "created here");
    }

    #[test]
    fn injected_write_and_sync_failures_are_reported_and_counted() {
        let dir = tempfile::tempdir().unwrap();
        for layout in [Layout::Plain, PADDED] {
            let path = dir.path().join(format!("{layout:?}"));
            let storage = Arc::new(FaultyStorage::new(Arc::new(FsStorage)));
            let mut journal = open_on(storage.clone(), &path, layout);
            journal.append(b"one\n").unwrap();
            journal.sync_data().unwrap();
            journal.sync_handle().sync_data().unwrap();
            assert_eq!(
                (storage.calls(Op::Write), storage.calls(Op::FsyncFile)),
                (1, 2),
                "{layout:?}: one write per append, every sync through the storage"
            );

            storage.fail_nth(Op::Write, 1);
            let err = journal.append(b"two\n").unwrap_err();
            assert!(
                matches!(
                    err,
                    JournalError::Io {
                        step: JournalStep::Write,
                        ..
                    }
                ),
                "{err}"
            );
            assert!(err.to_string().contains("injected fault"), "{err}");
            assert_eq!(
                journal.end(),
                None,
                "{layout:?}: the file may hold part of it"
            );

            storage.fail_nth(Op::FsyncFile, 1);
            let err = journal.sync_data().unwrap_err();
            assert!(
                matches!(
                    err,
                    JournalError::Io {
                        step: JournalStep::Sync,
                        ..
                    }
                ),
                "{err}"
            );
            storage.fail_nth(Op::FsyncFile, 1);
            assert!(journal.sync_handle().sync_data().is_err());

            // Nothing was written by the failed append: reading from the start finds one line.
            journal.read_from_start();
            assert_eq!(lines(&mut journal), (vec!["one".into()], Scan::Clean));
        }
    }

    #[test]
    fn creation_is_durable_when_asked() {
        let dir = tempfile::tempdir().unwrap();
        let storage = Arc::new(FaultyStorage::new(Arc::new(FsStorage)));
        let path = dir.path().join("a/b/audit.jsonl");
        let config = JournalConfig::new(Layout::Plain, 100).missing(Missing::CreateDurably);
        let journal = Journal::open(storage.clone(), &path, config).unwrap();
        assert_eq!(journal.end(), Some(0));
        // Two new directories and the file's entry.
        assert_eq!(storage.calls(Op::FsyncDir), 3);
        let again = Journal::open(storage.clone(), &path, config).unwrap();
        assert_eq!((again.end(), storage.calls(Op::FsyncDir)), (None, 3));
        let absent = dir.path().join("absent");
        let config = JournalConfig::new(Layout::Plain, 100);
        assert!(Journal::open(storage, &absent, config).is_err());
        assert!(!absent.exists());
    }
}
