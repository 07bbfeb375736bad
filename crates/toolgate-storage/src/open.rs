//! The one way toolgate opens a file it reads or writes: regular files only, checked on the open
//! descriptor, opened without blocking, symbolic links refused where the layout has none, and
//! every read capped.
//!
//! Without this, anything able to write to the ledger could freeze a server with one `mkfifo`
//! (`open(2)` of a FIFO blocks until a writer appears), make it read `/dev/zero` until memory runs
//! out, or redirect its audit lines through a symbolic link. Every open therefore:
//!
//! - passes `O_NONBLOCK`, so a FIFO or device never blocks the `open` itself (a regular file
//!   ignores the flag);
//! - checks the type with `fstat` on the descriptor it got (not on the path, which could be
//!   swapped between a check and the open) and refuses anything but a regular file;
//! - passes `O_NOFOLLOW` when [`Symlinks::Refuse`] (every file inside the ledger, whose layout
//!   has no links), so a link in the last component is refused instead of followed;
//! - reads at most the cap of its kind of file plus one byte, so a file over its cap is an
//!   error, never an allocation of its size.
//!
//! A refusal is an [`io::Error`] of kind [`io::ErrorKind::InvalidData`] carrying a
//! [`FileProblem`], so it flows through every store's existing I/O error (which names the file)
//! and can still be recognised with [`FileProblem::of`].

use std::fs::{self, File, FileType, OpenOptions};
use std::io::{self, Read as _};
use std::os::unix::fs::{FileTypeExt as _, OpenOptionsExt as _};
use std::path::Path;

/// Whether the last component of a path may be a symbolic link.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Symlinks {
    /// Follow it: paths an operator chooses (the policy file, key files, a checkpoint mirror on
    /// another volume), which deployments often provide as links.
    Follow,
    /// Refuse it: files inside the ledger, whose layout has no links.
    Refuse,
}

/// Why a path that must name a regular file was refused. Each message says what to do.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum FileProblem {
    /// Something other than a regular file is there.
    #[error(
        "it is {found}, not a regular file; replace it with a regular file (toolgate never reads \
         FIFOs, devices, sockets or directories in its place: they can block a reader or never end)"
    )]
    NotRegular {
        /// What was found, e.g. `"a FIFO"`.
        found: &'static str,
    },
    /// A symbolic link where the layout has none.
    #[error(
        "it is a symbolic link, which toolgate does not follow inside the ledger; replace the link \
         with the file itself"
    )]
    Symlink,
    /// The file is larger than any toolgate writes or accepts for its kind.
    #[error("it is larger than the limit of {limit} bytes for this file; shrink it or replace it")]
    TooLarge {
        /// The cap, in bytes.
        limit: u64,
    },
}

impl FileProblem {
    /// The problem inside an error returned by this module's functions, if that is what it is.
    pub fn of(error: &io::Error) -> Option<&FileProblem> {
        error.get_ref()?.downcast_ref()
    }

    fn into_io(self) -> io::Error {
        io::Error::new(io::ErrorKind::InvalidData, self)
    }
}

/// What a file type is, in words, for [`FileProblem::NotRegular`].
fn describe(file_type: FileType) -> &'static str {
    if file_type.is_dir() {
        "a directory"
    } else if file_type.is_fifo() {
        "a FIFO"
    } else if file_type.is_socket() {
        "a socket"
    } else if file_type.is_char_device() {
        "a character device"
    } else if file_type.is_block_device() {
        "a block device"
    } else if file_type.is_symlink() {
        "a symbolic link"
    } else {
        "not a regular file"
    }
}

/// Opens `path` with `options` (read, write, append, create as the caller set them), never
/// blocking, and returns it only if the descriptor is a regular file.
///
/// Errors: [`FileProblem::NotRegular`], [`FileProblem::Symlink`] (with [`Symlinks::Refuse`]), or
/// the operating system's error (`NotFound` when absent and not created).
pub fn open_regular(path: &Path, options: &OpenOptions, symlinks: Symlinks) -> io::Result<File> {
    let mut options = options.clone();
    let nofollow = match symlinks {
        Symlinks::Follow => 0,
        Symlinks::Refuse => libc::O_NOFOLLOW,
    };
    options.custom_flags(libc::O_NONBLOCK | nofollow);
    let file = match options.open(path) {
        Ok(file) => file,
        Err(e) => return Err(classify_open_error(path, e, symlinks)),
    };
    let file_type = file.metadata()?.file_type();
    if !file_type.is_file() {
        return Err(FileProblem::NotRegular {
            found: describe(file_type),
        }
        .into_io());
    }
    Ok(file)
}

/// Turns the errors `open(2)` gives for links and special files into [`FileProblem`]s.
fn classify_open_error(path: &Path, error: io::Error, symlinks: Symlinks) -> io::Error {
    match error.raw_os_error() {
        // O_NOFOLLOW on a link.
        Some(libc::ELOOP) if symlinks == Symlinks::Refuse => FileProblem::Symlink.into_io(),
        // A FIFO opened for writing with no reader, or a socket; a directory opened for writing.
        Some(libc::ENXIO | libc::EISDIR | libc::EOPNOTSUPP) => match fs::symlink_metadata(path) {
            Ok(meta) if !meta.file_type().is_file() => FileProblem::NotRegular {
                found: describe(meta.file_type()),
            }
            .into_io(),
            _ => error,
        },
        _ => error,
    }
}

/// Opens `path` for reading as [`open_regular`] does.
pub fn open_regular_read(path: &Path, symlinks: Symlinks) -> io::Result<File> {
    open_regular(path, OpenOptions::new().read(true), symlinks)
}

/// The whole contents of the regular file `path`, at most `max_bytes` of them, or `None` if it
/// does not exist.
///
/// Errors: as [`open_regular`], and [`FileProblem::TooLarge`] when the file holds more than
/// `max_bytes` (found without reading more than `max_bytes + 1`).
pub fn read_regular(
    path: &Path,
    max_bytes: u64,
    symlinks: Symlinks,
) -> io::Result<Option<Vec<u8>>> {
    let file = match open_regular_read(path, symlinks) {
        Ok(file) => file,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(e),
    };
    read_capped(file, max_bytes).map(Some)
}

/// [`read_regular`] for a UTF-8 text file; bytes that are not UTF-8 are an `InvalidData` error.
pub fn read_regular_text(
    path: &Path,
    max_bytes: u64,
    symlinks: Symlinks,
) -> io::Result<Option<String>> {
    match read_regular(path, max_bytes, symlinks)? {
        None => Ok(None),
        Some(bytes) => String::from_utf8(bytes)
            .map(Some)
            .map_err(|_| io::Error::new(io::ErrorKind::InvalidData, "it is not UTF-8 text")),
    }
}

/// Reads the rest of `file`, failing with [`FileProblem::TooLarge`] past `max_bytes`.
pub fn read_capped(file: File, max_bytes: u64) -> io::Result<Vec<u8>> {
    let size_hint = file.metadata().map_or(0, |m| m.len());
    if size_hint > max_bytes {
        return Err(FileProblem::TooLarge { limit: max_bytes }.into_io());
    }
    let mut bytes = Vec::with_capacity(usize::try_from(size_hint).unwrap_or(0));
    file.take(max_bytes.saturating_add(1))
        .read_to_end(&mut bytes)?;
    if u64::try_from(bytes.len()).map_or(true, |n| n > max_bytes) {
        return Err(FileProblem::TooLarge { limit: max_bytes }.into_io());
    }
    Ok(bytes)
}

/// Opens the directory `dir` (for an fsync or a listing) without blocking and without following
/// a link in its last component when [`Symlinks::Refuse`]; anything but a directory is refused.
pub fn open_dir(dir: &Path, symlinks: Symlinks) -> io::Result<File> {
    let mut options = OpenOptions::new();
    options.read(true);
    let nofollow = match symlinks {
        Symlinks::Follow => 0,
        Symlinks::Refuse => libc::O_NOFOLLOW,
    };
    options.custom_flags(libc::O_NONBLOCK | libc::O_DIRECTORY | nofollow);
    match options.open(dir) {
        Ok(file) => Ok(file),
        Err(e) => match e.raw_os_error() {
            Some(libc::ELOOP) if symlinks == Symlinks::Refuse => {
                Err(FileProblem::Symlink.into_io())
            }
            Some(libc::ENOTDIR) => match fs::symlink_metadata(dir) {
                Ok(meta) if meta.file_type().is_symlink() => Err(FileProblem::Symlink.into_io()),
                Ok(meta) => Err(FileProblem::NotRegular {
                    found: describe(meta.file_type()),
                }
                .into_io()),
                Err(_) => Err(e),
            },
            _ => Err(e),
        },
    }
}

/// Checks that `dir` is a directory itself, not a link to one (for the directories inside the
/// ledger, such as `notes/` and `effects/`); an absent `dir` is fine (it will be created).
pub fn check_real_dir(dir: &Path) -> io::Result<()> {
    match fs::symlink_metadata(dir) {
        Ok(meta) if meta.file_type().is_symlink() => Err(FileProblem::Symlink.into_io()),
        Ok(meta) if !meta.is_dir() => Err(io::Error::new(
            io::ErrorKind::NotADirectory,
            format!("it is {}, not a directory", describe(meta.file_type())),
        )),
        Ok(_) => Ok(()),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(e),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::process::Command;

    fn mkfifo(path: &Path) {
        let status = Command::new("mkfifo").arg(path).status().unwrap();
        assert!(status.success());
    }

    #[test]
    fn regular_files_are_read_within_their_cap() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("f");
        fs::write(&path, b"12345").unwrap();
        assert_eq!(
            read_regular(&path, 5, Symlinks::Refuse).unwrap().unwrap(),
            b"12345"
        );
        let err = read_regular(&path, 4, Symlinks::Refuse).unwrap_err();
        assert_eq!(
            FileProblem::of(&err),
            Some(&FileProblem::TooLarge { limit: 4 })
        );
        assert!(
            read_regular(&dir.path().join("absent"), 4, Symlinks::Refuse)
                .unwrap()
                .is_none()
        );
    }

    #[test]
    fn fifos_and_devices_are_refused_without_blocking() {
        let dir = tempfile::tempdir().unwrap();
        let fifo = dir.path().join("fifo");
        mkfifo(&fifo);
        for symlinks in [Symlinks::Follow, Symlinks::Refuse] {
            let err = read_regular(&fifo, 10, symlinks).unwrap_err();
            assert_eq!(
                FileProblem::of(&err),
                Some(&FileProblem::NotRegular { found: "a FIFO" })
            );
            let err = open_regular(
                &fifo,
                OpenOptions::new().append(true).create(true),
                symlinks,
            )
            .unwrap_err();
            assert!(matches!(
                FileProblem::of(&err),
                Some(FileProblem::NotRegular { found: "a FIFO" })
            ));
        }
        let err = read_regular(Path::new("/dev/zero"), 10, Symlinks::Follow).unwrap_err();
        assert_eq!(
            FileProblem::of(&err),
            Some(&FileProblem::NotRegular {
                found: "a character device"
            })
        );
        let err = read_regular(dir.path(), 10, Symlinks::Follow).unwrap_err();
        assert_eq!(
            FileProblem::of(&err),
            Some(&FileProblem::NotRegular {
                found: "a directory"
            })
        );
        let err = open_dir(&fifo, Symlinks::Refuse).unwrap_err();
        assert!(FileProblem::of(&err).is_some(), "{err}");
    }

    #[test]
    fn links_are_refused_or_followed_as_asked() {
        let dir = tempfile::tempdir().unwrap();
        let target = dir.path().join("target");
        fs::write(&target, b"x").unwrap();
        let link = dir.path().join("link");
        std::os::unix::fs::symlink(&target, &link).unwrap();
        let err = read_regular(&link, 10, Symlinks::Refuse).unwrap_err();
        assert_eq!(FileProblem::of(&err), Some(&FileProblem::Symlink));
        assert_eq!(
            read_regular(&link, 10, Symlinks::Follow).unwrap().unwrap(),
            b"x"
        );
        // A dangling link is not created through either.
        let dangling = dir.path().join("dangling");
        std::os::unix::fs::symlink(dir.path().join("nowhere"), &dangling).unwrap();
        let err = open_regular(
            &dangling,
            OpenOptions::new().append(true).create(true),
            Symlinks::Refuse,
        )
        .unwrap_err();
        assert_eq!(FileProblem::of(&err), Some(&FileProblem::Symlink));
        assert!(!dir.path().join("nowhere").exists());

        let linked_dir = dir.path().join("linked_dir");
        std::os::unix::fs::symlink(dir.path(), &linked_dir).unwrap();
        assert!(check_real_dir(&linked_dir).is_err());
        assert!(check_real_dir(dir.path()).is_ok());
        assert!(check_real_dir(&dir.path().join("absent")).is_ok());
        assert!(open_dir(&linked_dir, Symlinks::Refuse).is_err());
        assert!(open_dir(&linked_dir, Symlinks::Follow).is_ok());
    }
}
