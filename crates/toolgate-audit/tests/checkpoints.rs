//! Signed checkpoints written by the file log: when they are written, where (file and mirror),
//! and what verification with the key catches that the chain alone cannot.

#![allow(clippy::unwrap_used)]

use std::fs;
use std::path::{Path, PathBuf};

use toolgate_audit::{
    AuditConfig, AuditEntry, AuditSink, Decision, FileAuditLog, HmacKey, Outcome, ProblemKind,
    VerifyOptions, VerifyReport, verify,
};
use toolgate_canon::Sha256Digest;

fn key() -> HmacKey {
    HmacKey::new(b"checkpoint test key, 32+ bytes long!").unwrap()
}

fn entry(i: usize) -> AuditEntry {
    AuditEntry::tool_call(
        format!("req-{i:04}"),
        "write_note",
        Decision::Allow,
        Outcome::Committed,
        Sha256Digest::of(format!("{i}").as_bytes()),
    )
    .with_policy_digest(Sha256Digest::of(b"policy"))
}

fn lines(path: &Path) -> Vec<String> {
    fs::read_to_string(path)
        .unwrap_or_default()
        .lines()
        .map(str::to_owned)
        .collect()
}

fn keyed(path: &Path) -> VerifyReport {
    verify(&VerifyOptions::new(path).checkpoint_key(key())).unwrap()
}

#[test]
fn checkpoints_every_n_on_demand_and_at_drop_in_file_and_mirror() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("ledger").join("audit.jsonl");
    let mirror: PathBuf = dir.path().join("other-volume").join("mirror.jsonl");
    let cps = dir.path().join("ledger").join("audit.checkpoints.jsonl");
    {
        let log = FileAuditLog::open_with(
            AuditConfig::new(&path)
                .checkpoint_key(key())
                .checkpoint_every(5)
                .checkpoint_mirror(&mirror),
        )
        .unwrap();
        for i in 0..12 {
            let receipt = log.append(&entry(i)).unwrap();
            assert_eq!(receipt.seq, i as u64 + 1);
        }
        assert_eq!(lines(&cps).len(), 2, "checkpoints after records 5 and 10");
        let cp = log.checkpoint().unwrap().unwrap();
        assert_eq!(cp.count, 12);
        assert_eq!(cp.head, log.head());
        assert!(log.checkpoint().unwrap().is_none(), "nothing new to sign");
        log.append(&entry(12)).unwrap();
        // Dropped here: a checkpoint of 13 records.
    }
    let written = lines(&cps);
    assert_eq!(written.len(), 4);
    assert_eq!(lines(&mirror), written, "the mirror receives every line");
    assert!(written[3].starts_with("{\"count\":13,"), "{}", written[3]);

    let report = keyed(&path);
    assert!(report.is_intact(), "{report}");
    assert_eq!((report.records, report.checkpoints_verified), (13, 4));
    let from_mirror = verify(
        &VerifyOptions::new(&path)
            .checkpoint_key(key())
            .checkpoints_path(&mirror),
    )
    .unwrap();
    assert!(from_mirror.is_intact(), "{from_mirror}");

    // Without the key the checkpoints are counted, not trusted, and the report says so.
    let unkeyed = verify(&VerifyOptions::new(&path)).unwrap();
    assert_eq!(unkeyed.checkpoints_unchecked, 4);
    assert!(unkeyed.to_string().contains("NOT checked"), "{unkeyed}");

    // A wrong key: every checkpoint is reported, naming the first line of the checkpoint file.
    let other = HmacKey::new(&[9; 32]).unwrap();
    let report = verify(&VerifyOptions::new(&path).checkpoint_key(other)).unwrap();
    let problem = report.problem.unwrap();
    assert_eq!(
        (problem.line, problem.kind),
        (1, ProblemKind::BadCheckpointSignature)
    );
    assert_eq!(problem.checkpoint_file.as_deref(), Some(cps.as_path()));

    // Deleting the ledger's checkpoint file and cutting the log passes against the (now empty)
    // default, but the mirror still catches it.
    fs::remove_file(&cps).unwrap();
    let log_lines = lines(&path);
    fs::write(
        &path,
        log_lines[..8]
            .iter()
            .map(|l| format!("{l}\n"))
            .collect::<String>(),
    )
    .unwrap();
    assert!(keyed(&path).is_intact());
    let report = verify(
        &VerifyOptions::new(&path)
            .checkpoint_key(key())
            .checkpoints_path(&mirror),
    )
    .unwrap();
    assert_eq!(
        report.problem.map(|p| (p.line, p.kind)),
        Some((9, ProblemKind::TruncatedBeforeCheckpoint))
    );
}

#[test]
fn a_torn_checkpoint_line_is_ignored_by_verify_and_cut_by_the_writer() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("audit.jsonl");
    let cps = dir.path().join("audit.checkpoints.jsonl");
    let config = || {
        AuditConfig::new(&path)
            .checkpoint_key(key())
            .checkpoint_every(2)
    };
    {
        let log = FileAuditLog::open_with(config()).unwrap();
        for i in 0..2 {
            log.append(&entry(i)).unwrap();
        }
    }
    let mut bytes = fs::read(&cps).unwrap();
    bytes.extend_from_slice(b"{\"count\":3,\"he");
    fs::write(&cps, &bytes).unwrap();
    assert!(keyed(&path).is_intact());
    {
        let log = FileAuditLog::open_with(config()).unwrap();
        for i in 2..4 {
            log.append(&entry(i)).unwrap();
        }
    }
    let text = fs::read_to_string(&cps).unwrap();
    assert!(!text.contains("\"he{"), "{text}");
    let report = keyed(&path);
    assert!(report.is_intact(), "{report}");
    assert_eq!(report.checkpoints_verified, 2);
}

/// Cuts a 12-record log with checkpoints after records 5 and 10 at every byte offset: each cut
/// is a clean prefix of at least 10 records (intact), a torn line after the last checkpoint
/// (torn_tail), or reported as truncated_before_checkpoint; never a pass for a covered cut.
#[test]
fn truncation_at_every_byte_offset() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("audit.jsonl");
    let log = FileAuditLog::open_with(
        AuditConfig::new(&path)
            .checkpoint_key(key())
            .checkpoint_every(5),
    )
    .unwrap();
    for i in 0..12 {
        log.append(&entry(i)).unwrap();
    }
    let full = fs::read(&path).unwrap();
    let cps = fs::read(dir.path().join("audit.checkpoints.jsonl")).unwrap();
    // Keep the handle open until the bytes are copied, so no Drop checkpoint covers all 12.
    drop(log);

    let cut_dir = tempfile::tempdir().unwrap();
    let cut_path = cut_dir.path().join("audit.jsonl");
    fs::write(cut_dir.path().join("audit.checkpoints.jsonl"), &cps).unwrap();
    let (mut intact, mut torn, mut truncated) = (0, 0, 0);
    fs::write(&cut_path, &full).unwrap();
    let cut_file = fs::OpenOptions::new().write(true).open(&cut_path).unwrap();
    // From the longest cut down, so each step is one ftruncate of the same file.
    for cut in (0..full.len()).rev() {
        let prefix = &full[..cut];
        cut_file.set_len(cut as u64).unwrap();
        let report = keyed(&cut_path);
        let complete = prefix.iter().filter(|&&b| b == b'\n').count() as u64;
        let clean = cut == 0 || prefix.last() == Some(&b'\n');
        let kind = report.problem.as_ref().map(|p| p.kind);
        match kind {
            None => {
                assert!(clean && complete >= 10, "cut {cut} passed: {report}");
                assert_eq!(report.records, complete);
                intact += 1;
            }
            Some(ProblemKind::TornTail) => {
                assert!(!clean && complete >= 10, "cut {cut}: {report}");
                torn += 1;
            }
            Some(ProblemKind::TruncatedBeforeCheckpoint) => {
                assert!(complete < 10, "cut {cut}: {report}");
                truncated += 1;
            }
            Some(other) => panic!("cut {cut}: unexpected {other}: {report}"),
        }
    }
    assert_eq!(intact, 2, "cuts after records 10 and 11");
    assert!(torn > 0 && truncated > 0);
}
