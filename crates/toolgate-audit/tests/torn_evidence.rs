//! The evidence of a torn-tail repair is written through the storage floor: a `.torn-*` file
//! exists only with all of the torn bytes. A failure at any step of saving it (write, fdatasync,
//! link, directory fsync; or a full disk mid-write) leaves no evidence file and no temporary file,
//! keeps the log byte for byte as it was, returns `AuditError::TornTailNotSaved`, and a later open
//! repairs normally.

#![allow(clippy::unwrap_used)]

use std::fs::{self, File};
use std::io::{self, Write as _};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use toolgate_audit::{
    AuditConfig, AuditDecision, AuditEntry, AuditError, AuditSink, FileAuditLog, Outcome,
    verify_file,
};
use toolgate_canon::Sha256Digest;
use toolgate_storage::{FaultyStorage, FsStorage, Op, Storage};

const TORN: &[u8] = br#"{"args_digest":"3b2a","decision":"al"#;

fn entry(i: usize) -> AuditEntry {
    AuditEntry::tool_call(
        format!("req-{i:04}"),
        "write_note",
        AuditDecision::Allow,
        Outcome::Committed,
        Sha256Digest::of(format!("{i}").as_bytes()),
    )
}

/// The names in `dir`, sorted.
fn names(dir: &Path) -> Vec<String> {
    let mut names: Vec<String> = fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    names
}

fn append_torn(path: &Path) {
    fs::OpenOptions::new()
        .append(true)
        .open(path)
        .unwrap()
        .write_all(TORN)
        .unwrap();
}

/// A log of three records followed by a torn line; returns its path and bytes.
fn torn_log(dir: &Path) -> (PathBuf, Vec<u8>) {
    let path = dir.join("audit.jsonl");
    {
        let log = FileAuditLog::open(&path).unwrap();
        for i in 0..3 {
            log.append(&entry(i)).unwrap();
        }
    }
    append_torn(&path);
    (path.clone(), fs::read(&path).unwrap())
}

fn assert_not_saved(error: &AuditError, what: &str) {
    match error {
        AuditError::TornTailNotSaved {
            torn_bytes, log, ..
        } => {
            assert_eq!(*torn_bytes, TORN.len() as u64, "{what}: {error}");
            assert!(log.ends_with("audit.jsonl"), "{what}: {error}");
        }
        other => panic!("{what}: expected TornTailNotSaved, got {other:?}"),
    }
    let text = error.to_string();
    assert!(text.contains("left unchanged"), "{what}: {text}");
}

/// A later open with the real filesystem repairs the tail: one complete evidence file, and the
/// chain verifies with the repair record.
fn assert_repairs_normally(path: &Path, records_before: u64, what: &str) {
    let log = FileAuditLog::open(path).unwrap();
    let recovery = log
        .recovered()
        .unwrap_or_else(|| panic!("{what}: no repair"));
    assert_eq!(fs::read(&recovery.saved_as).unwrap(), TORN, "{what}");
    let report = verify_file(path).unwrap();
    assert!(report.is_intact(), "{what}: {report}");
    assert_eq!(report.records, records_before + 1, "{what}");
    let evidence: Vec<String> = names(path.parent().unwrap())
        .into_iter()
        .filter(|n| n.contains(".torn"))
        .collect();
    assert_eq!(evidence.len(), 1, "{what}: {evidence:?}");
    assert!(evidence[0].starts_with("audit.jsonl.torn-"), "{what}");
}

#[test]
fn a_failure_at_each_step_of_saving_the_evidence_leaves_no_file_and_the_log_unchanged() {
    // The steps of saving the evidence, in order: write the temporary file, fdatasync it, link it
    // to its `.torn-*` name, fsync the directory.
    for op in [Op::Write, Op::FsyncFile, Op::Rename, Op::FsyncDir] {
        let dir = tempfile::tempdir().unwrap();
        let (path, before) = torn_log(dir.path());
        let storage = Arc::new(FaultyStorage::new(Arc::new(FsStorage)));
        storage.fail_nth(op, 1);
        let error =
            FileAuditLog::open_with(AuditConfig::new(&path).storage(storage.clone())).unwrap_err();
        let what = format!("{op:?}");
        assert_eq!(storage.triggered(), 1, "{what}: the fault fired");
        assert_not_saved(&error, &what);
        assert!(error.to_string().contains("injected fault"), "{error}");
        assert_eq!(fs::read(&path).unwrap(), before, "{what}: the log changed");
        assert_eq!(
            names(dir.path()),
            ["audit.jsonl", "audit.lock"],
            "{what}: no evidence or temporary file is left"
        );
        assert_repairs_normally(&path, 3, &what);
    }
}

#[test]
fn a_failed_evidence_save_during_an_append_fails_the_append_and_the_next_one_repairs() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("audit.jsonl");
    let storage = Arc::new(FaultyStorage::new(Arc::new(FsStorage)));
    let log = FileAuditLog::open_with(AuditConfig::new(&path).storage(storage.clone())).unwrap();
    log.append(&entry(0)).unwrap();
    // Another writer crashed in the middle of a record.
    append_torn(&path);
    let before = fs::read(&path).unwrap();
    storage.fail_nth(Op::FsyncFile, 1);
    let error = log.append(&entry(1)).unwrap_err();
    assert_not_saved(&error, "append");
    assert_eq!(fs::read(&path).unwrap(), before, "the log changed");
    assert_eq!(names(dir.path()), ["audit.jsonl", "audit.lock"]);

    // The same handle retries the repair at its next append.
    log.append(&entry(2)).unwrap();
    let recovery = log.recovered().unwrap();
    assert_eq!(fs::read(&recovery.saved_as).unwrap(), TORN);
    let report = verify_file(&path).unwrap();
    assert!(report.is_intact(), "{report}");
    assert_eq!(report.records, 3, "record, repair record, record");
}

#[test]
fn a_failed_removal_of_the_temporary_name_still_leaves_complete_evidence() {
    let dir = tempfile::tempdir().unwrap();
    let (path, _) = torn_log(dir.path());
    let storage = Arc::new(FaultyStorage::new(Arc::new(FsStorage)));
    storage.fail_nth(Op::Remove, 1);
    let log = FileAuditLog::open_with(AuditConfig::new(&path).storage(storage.clone())).unwrap();
    assert_eq!(storage.triggered(), 1);
    let recovery = log.recovered().unwrap();
    assert_eq!(fs::read(&recovery.saved_as).unwrap(), TORN);
    // The temporary name stays behind (a dot file ending in `.tmp`, which no reader takes for
    // evidence), with the same complete bytes.
    let temps: Vec<String> = names(dir.path())
        .into_iter()
        .filter(|n| n.starts_with(".audit.jsonl.torn.") && n.ends_with(".tmp"))
        .collect();
    assert_eq!(temps.len(), 1, "{:?}", names(dir.path()));
    assert_eq!(fs::read(dir.path().join(&temps[0])).unwrap(), TORN);
    assert!(verify_file(&path).unwrap().is_intact());
}

/// Storage on a disk that fills up while a whole file is written: the file is created and only
/// part of the bytes get in, as `write(2)` does on ENOSPC.
#[derive(Debug)]
struct FullDisk;

impl Storage for FullDisk {
    fn read(&self, path: &Path, max_bytes: u64) -> io::Result<Option<Vec<u8>>> {
        FsStorage.read(path, max_bytes)
    }
    fn read_at(&self, file: &File, offset: u64, len: usize) -> io::Result<Vec<u8>> {
        FsStorage.read_at(file, offset, len)
    }
    fn write_at(&self, file: &File, offset: u64, bytes: &[u8]) -> io::Result<()> {
        FsStorage.write_at(file, offset, bytes)
    }
    fn append(&self, file: &File, bytes: &[u8]) -> io::Result<()> {
        FsStorage.append(file, bytes)
    }
    fn sync_data(&self, file: &File) -> io::Result<()> {
        FsStorage.sync_data(file)
    }
    fn write_new(&self, path: &Path, bytes: &[u8]) -> io::Result<()> {
        let mut file = fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .open(path)?;
        file.write_all(&bytes[..bytes.len() / 2])?;
        Err(io::Error::from(io::ErrorKind::StorageFull))
    }
    fn fsync_file(&self, path: &Path) -> io::Result<()> {
        FsStorage.fsync_file(path)
    }
    fn rename(&self, from: &Path, to: &Path) -> io::Result<()> {
        FsStorage.rename(from, to)
    }
    fn link(&self, from: &Path, to: &Path) -> io::Result<()> {
        FsStorage.link(from, to)
    }
    fn fsync_dir(&self, dir: &Path) -> io::Result<()> {
        FsStorage.fsync_dir(dir)
    }
    fn remove(&self, path: &Path) -> io::Result<()> {
        FsStorage.remove(path)
    }
    fn list(&self, dir: &Path) -> io::Result<Vec<PathBuf>> {
        FsStorage.list(dir)
    }
}

#[test]
fn a_full_disk_leaves_no_empty_or_partial_evidence_file() {
    let dir = tempfile::tempdir().unwrap();
    let (path, before) = torn_log(dir.path());
    let error =
        FileAuditLog::open_with(AuditConfig::new(&path).storage(Arc::new(FullDisk))).unwrap_err();
    assert_not_saved(&error, "full disk");
    assert_eq!(fs::read(&path).unwrap(), before);
    assert_eq!(names(dir.path()), ["audit.jsonl", "audit.lock"]);
    assert_repairs_normally(&path, 3, "after the disk was freed");
}
