//! The files of one log: the active file, its rotated segments, the lock file and the checkpoint
//! file, all named after the active file; plus [`read_records`] over segments and active file.
//!
//! Names are derived, never configured separately, so a verifier given only the active file's
//! path finds everything the writer produced.

use std::collections::VecDeque;
use std::fs::{self, File};
use std::io::{self, BufRead, BufReader, Read};
use std::path::{Path, PathBuf};

use serde_json::Value;

use crate::AuditError;
use crate::record::MAX_LINE_BYTES;

/// Digits of the first `seq` in a segment name: enough for `u64::MAX`, and zero-padding makes the
/// lexical order of names the numeric order.
const SEQ_DIGITS: usize = 20;

/// The directory holding `path` (`.` for a bare file name).
pub(crate) fn parent_dir(path: &Path) -> PathBuf {
    match path.parent() {
        Some(dir) if !dir.as_os_str().is_empty() => dir.to_path_buf(),
        _ => PathBuf::from("."),
    }
}

/// `(stem, extension)` of the active file: `("audit", Some("jsonl"))` for `audit.jsonl`.
fn stem_ext(log: &Path) -> (String, Option<String>) {
    let stem = log
        .file_stem()
        .map(|s| s.to_string_lossy().into_owned())
        .unwrap_or_else(|| "audit".to_owned());
    let ext = log.extension().map(|e| e.to_string_lossy().into_owned());
    (stem, ext)
}

/// `<dir>/<stem>.lock`: the cross-process lock. It is a separate file because rotation renames the
/// active file, and a lock held on the old inode would no longer exclude writers of the new one.
pub(crate) fn lock_path(log: &Path) -> PathBuf {
    let (stem, _) = stem_ext(log);
    parent_dir(log).join(format!("{stem}.lock"))
}

/// `<dir>/<stem>.checkpoints.jsonl`: where checkpoints are written and looked for by default.
pub(crate) fn checkpoints_path(log: &Path) -> PathBuf {
    let (stem, _) = stem_ext(log);
    parent_dir(log).join(format!("{stem}.checkpoints.jsonl"))
}

/// `<dir>/<stem>.<first seq, 20 digits>.<ext>`: a rotated segment.
pub(crate) fn segment_path(log: &Path, first_seq: u64) -> PathBuf {
    let (stem, ext) = stem_ext(log);
    let name = match ext {
        Some(ext) => format!("{stem}.{first_seq:0SEQ_DIGITS$}.{ext}"),
        None => format!("{stem}.{first_seq:0SEQ_DIGITS$}"),
    };
    parent_dir(log).join(name)
}

/// The first `seq` a segment file name announces, or `None` if `name` is not a segment of `log`.
fn segment_number(log: &Path, name: &str) -> Option<u64> {
    let (stem, ext) = stem_ext(log);
    let rest = name.strip_prefix(&stem)?.strip_prefix('.')?;
    let digits = match &ext {
        Some(ext) => rest.strip_suffix(ext.as_str())?.strip_suffix('.')?,
        None => rest,
    };
    if digits.len() != SEQ_DIGITS || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    digits.parse().ok()
}

/// The rotated segments of `log`, oldest first. A missing directory has none.
pub(crate) fn list_segments(log: &Path) -> Result<Vec<(u64, PathBuf)>, AuditError> {
    let dir = parent_dir(log);
    let entries = match fs::read_dir(&dir) {
        Ok(entries) => entries,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(source) => {
            return Err(AuditError::Io {
                action: "list",
                path: dir,
                source,
            });
        }
    };
    let mut found = Vec::new();
    for entry in entries {
        let entry = entry.map_err(|source| AuditError::Io {
            action: "list",
            path: dir.clone(),
            source,
        })?;
        let name = entry.file_name();
        if let Some(n) = name.to_str().and_then(|n| segment_number(log, n)) {
            found.push((n, entry.path()));
        }
    }
    found.sort();
    Ok(found)
}

/// Every file of the log in chain order: segments by number, then the active file (skipped when
/// it is absent but segments exist, which a crash between a rotation's rename and the creation of
/// the new active file leaves behind).
pub(crate) fn chain_files(log: &Path) -> Result<Vec<PathBuf>, AuditError> {
    let mut files: Vec<PathBuf> = list_segments(log)?.into_iter().map(|(_, p)| p).collect();
    if files.is_empty() || log.exists() {
        files.push(log.to_path_buf());
    }
    Ok(files)
}

/// Every record of the log at `log_path` as parsed JSON, segments first, then the active file, for
/// statistics. It does not verify the chain (use [`crate::verify`]); a line that is not a JSON
/// object yields an [`AuditError::BadRecord`] item and the iteration goes on.
pub fn read_records(
    log_path: &Path,
) -> Result<impl Iterator<Item = Result<Value, AuditError>>, AuditError> {
    let files = chain_files(log_path)?;
    // Open the active file eagerly so a missing log is an error now, not a silent empty iterator.
    if files.len() == 1 {
        open_read(&files[0])?;
    }
    Ok(Records {
        files: files.into(),
        current: None,
        buf: Vec::new(),
    })
}

struct Records {
    files: VecDeque<PathBuf>,
    current: Option<(PathBuf, BufReader<File>, u64)>,
    buf: Vec<u8>,
}

impl Iterator for Records {
    type Item = Result<Value, AuditError>;

    fn next(&mut self) -> Option<Self::Item> {
        loop {
            if self.current.is_none() {
                let path = self.files.pop_front()?;
                match toolgate_storage::open_regular_read(&path, toolgate_storage::Symlinks::Refuse)
                {
                    Ok(file) => self.current = Some((path, BufReader::new(file), 0)),
                    Err(source) => {
                        return Some(Err(AuditError::Io {
                            action: "open",
                            path,
                            source,
                        }));
                    }
                }
            }
            let (path, reader, line_no) = self.current.as_mut()?;
            self.buf.clear();
            let limit = u64::try_from(MAX_LINE_BYTES).unwrap_or(u64::MAX);
            let read = match reader
                .by_ref()
                .take(limit.saturating_add(1))
                .read_until(b'\n', &mut self.buf)
            {
                Ok(n) => n,
                Err(source) => {
                    let path = path.clone();
                    self.current = None;
                    return Some(Err(AuditError::Io {
                        action: "read",
                        path,
                        source,
                    }));
                }
            };
            if read == 0 {
                self.current = None;
                continue;
            }
            *line_no += 1;
            let bad = |detail: String| AuditError::BadRecord {
                path: path.clone(),
                line: *line_no,
                detail,
            };
            if self.buf.pop() != Some(b'\n') {
                let err =
                    bad("not terminated by a newline (a torn tail or an over-long line)".into());
                // The rest of this file cannot be split into lines reliably.
                self.current = None;
                return Some(Err(err));
            }
            return Some(match serde_json::from_slice::<Value>(&self.buf) {
                Ok(value @ Value::Object(_)) => Ok(value),
                Ok(_) => Err(bad("not a JSON object".into())),
                Err(e) => Err(bad(format!("not valid JSON ({e})"))),
            });
        }
    }
}

/// The [`AuditError::Io`] of `action` on `path`.
pub(crate) fn io_err<'a>(
    action: &'static str,
    path: &'a Path,
) -> impl FnOnce(std::io::Error) -> AuditError + 'a {
    move |source| AuditError::Io {
        action,
        path: path.to_path_buf(),
        source,
    }
}

/// Opens a file of the chain (the log, a segment) for reading: a regular file, not a link.
pub(crate) fn open_read(path: &Path) -> Result<std::fs::File, AuditError> {
    toolgate_storage::open_regular_read(path, toolgate_storage::Symlinks::Refuse)
        .map_err(io_err("open", path))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_derived_from_the_active_file() {
        let log = Path::new("/l/audit.jsonl");
        assert_eq!(lock_path(log), Path::new("/l/audit.lock"));
        assert_eq!(
            checkpoints_path(log),
            Path::new("/l/audit.checkpoints.jsonl")
        );
        let seg = segment_path(log, 42);
        assert_eq!(seg, Path::new("/l/audit.00000000000000000042.jsonl"));
        let name = seg.file_name().unwrap().to_str().unwrap();
        assert_eq!(segment_number(log, name), Some(42));
        for other in [
            "audit.jsonl",
            "audit.checkpoints.jsonl",
            "audit.jsonl.torn-17",
            "audit.0000000000000000004.jsonl",
            "audit.0000000000000000004x.jsonl",
            "audit.00000000000000000042.json",
        ] {
            assert_eq!(segment_number(log, other), None, "{other}");
        }
        let bare = Path::new("/l/log");
        assert_eq!(
            segment_path(bare, 1),
            Path::new("/l/log.00000000000000000001")
        );
        assert_eq!(segment_number(bare, "log.00000000000000000001"), Some(1));
    }
}
