//! What the stores of an operator's document have in common: the rights ([`crate::rights`]) and
//! the Cedar entities ([`crate::entities`]) are each one JSON document, kept in a file re-read
//! when it changes ([`FileDocument`]), in this process's memory ([`MemoryDocument`]) or in a
//! database every replica shares (`toolgate_postgres`, one versioned row per document). The
//! [`Document`] trait says how a kind of document parses, what is in force while none is set and
//! how its errors read; [`DocumentStore`] is a store of one kind, implemented once here for the
//! file and the memory store of every kind. [`crate::RightsStore`] and [`crate::EntitiesStore`]
//! name the stores of the two kinds.

use std::fmt;
use std::io::Read as _;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::SystemTime;

use toolgate_canon::Sha256Digest;
use toolgate_storage::{FsStorage, Storage};

use crate::GuardError;
use crate::watched::{WatchError, WatchedFile};

/// A kind of operator document: how it parses and how its problems are reported.
pub trait Document: fmt::Debug + Send + Sync + Sized + 'static {
    /// What it is, in messages (`rights`, `entities`).
    const NAME: &'static str;
    /// A file of it larger than this is invalid.
    const MAX_BYTES: u64;
    /// Why a file of it cannot be cleared, and what to do instead.
    const CANNOT_CLEAR: &'static str;

    /// Parses the document's `bytes` (`digest` is theirs); the error says what is wrong.
    fn parse_with_digest(bytes: &[u8], digest: Sha256Digest) -> Result<Self, String>;
    /// The document in force while none is set.
    fn unset() -> Self;
    /// The file at `path` could not be read.
    fn unreadable(path: PathBuf, source: std::io::Error) -> GuardError;
    /// The file at `path` was read but is not a valid document.
    fn invalid_file(path: PathBuf, problem: String) -> GuardError;
    /// A document given to be set is not valid; nothing was changed.
    fn invalid(problem: String) -> GuardError;

    /// Parses `bytes`, the error a [`Document::invalid`].
    fn validate(bytes: &[u8]) -> Result<Self, GuardError> {
        Self::parse_with_digest(bytes, Sha256Digest::of(bytes)).map_err(Self::invalid)
    }
}

/// Where a document of kind `D` is kept: a file, this process's memory, or a database.
pub trait DocumentStore<D: Document>: Send + Sync + fmt::Debug {
    /// The document in force, as of `now` (the clock of the file's freshness rule).
    fn load(&self, now: SystemTime) -> Result<Arc<D>, GuardError>;
    /// Replaces the document with `document` (valid) or clears it (`None`).
    fn replace(&self, document: Option<Vec<u8>>) -> Result<(), GuardError>;
    /// The bytes of the document in force, `None` while none is set.
    fn document(&self) -> Result<Option<Vec<u8>>, GuardError>;
}

/// The bytes of the document's file at `path` (a regular file, capped at
/// [`Document::MAX_BYTES`]), validated, for setting them in a store; errors name the file.
pub fn read_valid_file<D: Document>(path: &Path) -> Result<Vec<u8>, GuardError> {
    let bytes = read_file::<D>(path)?;
    D::parse_with_digest(&bytes, Sha256Digest::of(&bytes))
        .map_err(|problem| D::invalid_file(path.to_owned(), problem))?;
    Ok(bytes)
}

/// The bytes of the document's file at `path` (a regular file, capped), unparsed.
fn read_file<D: Document>(path: &Path) -> Result<Vec<u8>, GuardError> {
    let file = toolgate_storage::open_regular_read(path, toolgate_storage::Symlinks::Follow)
        .map_err(|e| match toolgate_storage::FileProblem::of(&e) {
            Some(problem) => D::invalid_file(path.to_owned(), problem.to_string()),
            None => D::unreadable(path.to_owned(), e),
        })?;
    let mut bytes = Vec::new();
    file.take(D::MAX_BYTES + 1)
        .read_to_end(&mut bytes)
        .map_err(|source| D::unreadable(path.to_owned(), source))?;
    if bytes.len() as u64 > D::MAX_BYTES {
        return Err(D::invalid_file(
            path.to_owned(),
            format!("it is larger than {} bytes", D::MAX_BYTES),
        ));
    }
    Ok(bytes)
}

/// A document's file at a path: opened and `fstat`ed on every load, parsed again only when it
/// changed ([`crate::watched`]); replaced atomically and durably.
pub struct FileDocument<D> {
    pub(crate) file: WatchedFile<D>,
    storage: Arc<dyn Storage>,
}

impl<D> fmt::Debug for FileDocument<D> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("FileDocument")
            .field("file", &self.file)
            .finish_non_exhaustive()
    }
}

impl<D: Document> FileDocument<D> {
    /// The file at `path`. Touches nothing on disk; the first load reads it.
    pub fn new(path: impl Into<PathBuf>) -> Self {
        FileDocument {
            file: WatchedFile::new(path.into(), D::MAX_BYTES, D::parse_with_digest),
            storage: Arc::new(FsStorage),
        }
    }

    /// Writes through `storage` (fault injection in tests) instead of the filesystem.
    pub fn with_storage(mut self, storage: Arc<dyn Storage>) -> Self {
        self.storage = storage;
        self
    }

    /// The file's path.
    pub fn path(&self) -> &Path {
        self.file.path()
    }
}

impl<D: Document> DocumentStore<D> for FileDocument<D> {
    /// The file as of `now` (the clock of the freshness rule); a missing, unreadable or invalid
    /// file is an error naming it.
    fn load(&self, now: SystemTime) -> Result<Arc<D>, GuardError> {
        self.file.load(now).map_err(|error| match error {
            WatchError::Unreadable(source) => D::unreadable(self.path().to_owned(), source),
            WatchError::Invalid(problem) => D::invalid_file(self.path().to_owned(), problem),
        })
    }

    /// Replaces the file atomically and durably (a temporary file, fsync, rename, fsync of the
    /// directory). A file cannot hold "none set": clearing is refused, naming the fix.
    fn replace(&self, document: Option<Vec<u8>>) -> Result<(), GuardError> {
        let Some(bytes) = document else {
            return Err(D::invalid_file(
                self.path().to_owned(),
                D::CANNOT_CLEAR.to_owned(),
            ));
        };
        let name = self
            .path()
            .file_name()
            .and_then(|name| name.to_str())
            .ok_or_else(|| {
                D::invalid_file(
                    self.path().to_owned(),
                    "the path does not end in a file name".to_owned(),
                )
            })?;
        let dir = toolgate_storage::parent_of(self.path());
        toolgate_storage::replace_file(&*self.storage, dir, name, &bytes)?;
        Ok(())
    }

    /// The file's bytes.
    fn document(&self) -> Result<Option<Vec<u8>>, GuardError> {
        read_file::<D>(self.path()).map(Some)
    }
}

/// A document in this process's memory: none set until one is.
pub struct MemoryDocument<D> {
    current: Mutex<Option<(Vec<u8>, Arc<D>)>>,
}

impl<D> Default for MemoryDocument<D> {
    fn default() -> Self {
        MemoryDocument {
            current: Mutex::new(None),
        }
    }
}

impl<D> fmt::Debug for MemoryDocument<D> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let set = self
            .current
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .is_some();
        f.debug_struct("MemoryDocument").field("set", &set).finish()
    }
}

impl<D: Document> DocumentStore<D> for MemoryDocument<D> {
    /// The document in force ([`Document::unset`] while none is).
    fn load(&self, _now: SystemTime) -> Result<Arc<D>, GuardError> {
        let current = self.current.lock().unwrap_or_else(PoisonError::into_inner);
        Ok(match &*current {
            Some((_, document)) => Arc::clone(document),
            None => Arc::new(D::unset()),
        })
    }

    /// Replaces the document (validated here too) or clears it.
    fn replace(&self, document: Option<Vec<u8>>) -> Result<(), GuardError> {
        let parsed = match document {
            Some(bytes) => {
                let parsed = D::validate(&bytes)?;
                Some((bytes, Arc::new(parsed)))
            }
            None => None,
        };
        *self.current.lock().unwrap_or_else(PoisonError::into_inner) = parsed;
        Ok(())
    }

    /// The bytes of the document in force, `None` while none is set.
    fn document(&self) -> Result<Option<Vec<u8>>, GuardError> {
        let current = self.current.lock().unwrap_or_else(PoisonError::into_inner);
        Ok(current.as_ref().map(|(bytes, _)| bytes.clone()))
    }
}
