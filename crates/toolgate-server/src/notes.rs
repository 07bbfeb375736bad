//! The reference server's notes: `LEDGER_DIR/notes/<sha256 hex of request_id>.json`, each the
//! canonical JSON `{"request_id":…,"text":…}`, written once through the storage floor.
//!
//! This is a durable payload writer, not a second exactly-once store: the gate's effect store
//! decides whether `write_note` runs at all (policy `idempotency`), and this module only publishes
//! the file. It publishes write-once (a hard link, never a replacing rename), so the one case in
//! which the handler runs for a key whose note exists, a takeover after a crash between the
//! note's publication and the effect store's completion line, finds the note and reports it as
//! already there instead of writing it again.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use toolgate::canon::Sha256Digest;
use toolgate::storage::{Published, Storage, StorageError, TempFile};

/// Suffix of published notes.
const NOTE_SUFFIX: &str = ".json";
/// The largest note file read back (a note is one request's text, bounded by the transport's
/// line limit, so a larger file was not written by this server).
const MAX_NOTE_BYTES: u64 = 16 << 20;
/// Length of a SHA-256 in lowercase hex.
const HEX_LEN: usize = 64;

/// A crash-point callback (feature `fault-injection` only): `commit.before_publish` once the
/// note's temporary file is written and fsynced, `commit.after_publish` once the note is in place
/// and its directory fsynced.
#[cfg(feature = "fault-injection")]
pub type NotesHook = Arc<dyn Fn(&'static str) + Send + Sync>;

/// What [`Notes::write`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Written {
    /// The note was published by this call and is durable.
    Created,
    /// The same note was already published (and is durable): nothing was written.
    AlreadyThere,
}

/// Why a note could not be written or read.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum NoteError {
    /// A different note is stored under this request_id; nothing was written.
    #[error(
        "a different note is already stored under this request_id; nothing was written. Retry with the original text, or use a new request_id for a new note"
    )]
    Differs,
    /// A storage operation failed.
    #[error(transparent)]
    Storage(#[from] StorageError),
    /// A stored note is not what this server writes.
    #[error(
        "the note file {path} is corrupt ({reason}); inspect it and restore it from a backup (the server never rewrites a published note)"
    )]
    Corrupt {
        /// The file.
        path: PathBuf,
        /// What is wrong, without its contents.
        reason: String,
    },
}

/// The notes directory.
pub struct Notes {
    dir: PathBuf,
    storage: Arc<dyn Storage>,
    #[cfg(feature = "fault-injection")]
    hook: Option<NotesHook>,
}

impl std::fmt::Debug for Notes {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Notes")
            .field("dir", &self.dir)
            .finish_non_exhaustive()
    }
}

impl Notes {
    /// Opens (creating durably if needed) the notes directory `dir` on `storage`, and removes the
    /// temporary files of writers that are gone.
    pub fn open(dir: impl Into<PathBuf>, storage: Arc<dyn Storage>) -> Result<Self, NoteError> {
        let dir = dir.into();
        toolgate::storage::create_dir_durably(storage.as_ref(), &dir)?;
        toolgate::storage::remove_orphaned_temps(storage.as_ref(), &dir, false)?;
        Ok(Notes {
            dir,
            storage,
            #[cfg(feature = "fault-injection")]
            hook: None,
        })
    }

    /// Calls `hook` at the crash points of every publication.
    #[cfg(feature = "fault-injection")]
    pub fn with_hook(mut self, hook: NotesHook) -> Self {
        self.hook = Some(hook);
        self
    }

    /// The directory.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Where the note of `request_id` lives.
    pub fn path_for(&self, request_id: &str) -> PathBuf {
        self.dir.join(format!(
            "{}{NOTE_SUFFIX}",
            Sha256Digest::of(request_id.as_bytes()).to_hex()
        ))
    }

    /// Publishes the note durably: a temporary file written and fdatasynced, linked into place
    /// (never replacing a note), the directory fsynced. Two syncs for a new note.
    pub fn write(&self, request_id: &str, text: &str) -> Result<Written, NoteError> {
        let bytes = toolgate::canon::canonical_value(
            &serde_json::json!({"request_id": request_id, "text": text}),
        );
        let path = self.path_for(request_id);
        let storage = self.storage.as_ref();
        if let Some(stored) = storage
            .read(&path, MAX_NOTE_BYTES)
            .map_err(|e| StorageError::new("read note", &path, e))?
        {
            return self.already_there(&path, &stored, &bytes);
        }
        let stem = path.file_name().and_then(|n| n.to_str()).unwrap_or("note");
        let temp = TempFile::write(storage, &self.dir, stem, &bytes)?;
        self.fault("commit.before_publish");
        match temp.publish_new(&path)? {
            Published::Created => {
                toolgate::storage::fsync_dir(storage, &self.dir)?;
                self.fault("commit.after_publish");
                Ok(Written::Created)
            }
            Published::Exists => {
                let stored = self.read(&path)?;
                self.already_there(&path, &stored, &bytes)
            }
        }
    }

    /// The answer for a note found in place: the same bytes, or a different note (or damage).
    fn already_there(
        &self,
        path: &Path,
        stored: &[u8],
        bytes: &[u8],
    ) -> Result<Written, NoteError> {
        if stored != bytes {
            check(path, stored)?;
            return Err(NoteError::Differs);
        }
        // A writer that died between its link and its directory fsync leaves a note that is
        // visible but maybe not durable: make it durable before reporting it.
        toolgate::storage::fsync_dir(self.storage.as_ref(), &self.dir)?;
        Ok(Written::AlreadyThere)
    }

    /// Every note's canonical bytes, sorted by file name, each checked (canonical JSON, an
    /// object of the two strings).
    pub fn list(&self) -> Result<Vec<serde_json::Value>, NoteError> {
        let files = self
            .storage
            .list(&self.dir)
            .map_err(|e| StorageError::new("list directory", &self.dir, e))?;
        let mut names: Vec<PathBuf> = files
            .into_iter()
            .filter(|path| is_note_name(path))
            .collect();
        names.sort();
        let mut notes = Vec::with_capacity(names.len());
        for path in names {
            let bytes = self.read(&path)?;
            notes.push(check(&path, &bytes)?);
        }
        Ok(notes)
    }

    fn read(&self, path: &Path) -> Result<Vec<u8>, NoteError> {
        match self.storage.read(path, MAX_NOTE_BYTES) {
            Ok(Some(bytes)) => Ok(bytes),
            Ok(None) => Err(NoteError::Corrupt {
                path: path.to_owned(),
                reason: "it disappeared while being read".to_owned(),
            }),
            Err(e) => Err(StorageError::new("read note", path, e).into()),
        }
    }

    #[cfg(feature = "fault-injection")]
    fn fault(&self, point: &'static str) {
        if let Some(hook) = &self.hook {
            hook(point);
        }
    }

    #[cfg(not(feature = "fault-injection"))]
    fn fault(&self, _point: &'static str) {}
}

/// A note's bytes must be the canonical JSON of `{"request_id": string, "text": string}`.
fn check(path: &Path, bytes: &[u8]) -> Result<serde_json::Value, NoteError> {
    let corrupt = |reason: String| NoteError::Corrupt {
        path: path.to_owned(),
        reason,
    };
    let value: serde_json::Value = serde_json::from_slice(bytes)
        // Only the error class: serde_json messages may quote the stored text.
        .map_err(|e| corrupt(format!("not JSON ({:?} error)", e.classify())))?;
    let is_note = value.as_object().is_some_and(|note| {
        note.len() == 2
            && note
                .get("request_id")
                .is_some_and(serde_json::Value::is_string)
            && note.get("text").is_some_and(serde_json::Value::is_string)
    });
    if !is_note {
        return Err(corrupt(
            "not an object of a request_id and a text".to_owned(),
        ));
    }
    if toolgate::canon::canonical_value(&value) != bytes {
        return Err(corrupt(
            "not in canonical (RFC 8785) form, so this server did not write it".to_owned(),
        ));
    }
    Ok(value)
}

/// `<64 lowercase hex>.json`: the only names [`Notes::list`] reads.
fn is_note_name(path: &Path) -> bool {
    path.file_name()
        .and_then(|n| n.to_str())
        .and_then(|n| n.strip_suffix(NOTE_SUFFIX))
        .is_some_and(|hex| {
            hex.len() == HEX_LEN && hex.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'))
        })
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;
    use toolgate::storage::{FaultyStorage, FsStorage};

    #[test]
    fn a_note_costs_two_syncs_and_is_written_once() {
        let dir = tempfile::tempdir().unwrap();
        let storage = Arc::new(FaultyStorage::new(Arc::new(FsStorage)));
        let notes = Notes::open(dir.path().join("notes"), storage.clone()).unwrap();
        let before = storage.syncs();
        assert_eq!(notes.write("req-1", "one").unwrap(), Written::Created);
        assert_eq!(storage.syncs() - before, 2);
        assert_eq!(notes.write("req-1", "one").unwrap(), Written::AlreadyThere);
        assert!(matches!(
            notes.write("req-1", "two"),
            Err(NoteError::Differs)
        ));
        assert_eq!(
            std::fs::read(notes.path_for("req-1")).unwrap(),
            br#"{"request_id":"req-1","text":"one"}"#
        );
        let listed = notes.list().unwrap();
        assert_eq!(
            listed,
            [serde_json::json!({"request_id": "req-1", "text": "one"})]
        );
    }

    #[test]
    fn foreign_files_are_ignored_and_damaged_notes_reported() {
        let dir = tempfile::tempdir().unwrap();
        let notes = Notes::open(dir.path(), Arc::new(FsStorage)).unwrap();
        std::fs::write(dir.path().join("README"), b"x").unwrap();
        assert!(notes.list().unwrap().is_empty());
        std::fs::write(notes.path_for("a"), br#"{"text":"t","request_id":"a"}"#).unwrap();
        assert!(matches!(notes.list(), Err(NoteError::Corrupt { .. })));
        assert!(matches!(
            notes.write("a", "t"),
            Err(NoteError::Corrupt { .. })
        ));
    }
}
