//! Signed checkpoints written by the file log: when they are written, where (file and mirror),
//! and what verification with the key catches that the chain alone cannot.

#![allow(clippy::unwrap_used)]

use std::fs;
use std::path::{Path, PathBuf};

use toolgate_audit::{
    AuditConfig, AuditDecision, AuditEntry, AuditSink, FileAuditLog, HmacKey, Outcome, ProblemKind,
    VerifyOptions, VerifyReport, WarningKind, verify,
};
use toolgate_canon::Sha256Digest;

fn key() -> HmacKey {
    HmacKey::new(b"checkpoint test key, 32+ bytes long!").unwrap()
}

fn entry(i: usize) -> AuditEntry {
    AuditEntry::tool_call(
        format!("req-{i:04}"),
        "write_note",
        AuditDecision::Allow,
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

/// A ledger of 10 records written with checkpoints every 3 records into the checkpoint file and a
/// mirror on another directory: checkpoints of 3, 6, 9 and (at drop) 10 records in both.
struct Mirrored {
    _dir: tempfile::TempDir,
    path: PathBuf,
    cps: PathBuf,
    mirror: PathBuf,
}

fn mirrored() -> Mirrored {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("ledger").join("audit.jsonl");
    let cps = dir.path().join("ledger").join("audit.checkpoints.jsonl");
    let mirror = dir.path().join("other-volume").join("mirror.jsonl");
    {
        let log = FileAuditLog::open_with(
            AuditConfig::new(&path)
                .checkpoint_key(key())
                .checkpoint_every(3)
                .checkpoint_mirror(&mirror),
        )
        .unwrap();
        for i in 0..10 {
            log.append(&entry(i)).unwrap();
        }
    }
    assert_eq!(lines(&cps).len(), 4);
    assert_eq!(lines(&mirror), lines(&cps));
    Mirrored {
        _dir: dir,
        path,
        cps,
        mirror,
    }
}

impl Mirrored {
    fn options(&self) -> VerifyOptions {
        VerifyOptions::new(&self.path).checkpoint_mirror(&self.mirror)
    }

    fn keyed(&self) -> VerifyReport {
        verify(&self.options().checkpoint_key(key())).unwrap()
    }

    fn unkeyed(&self) -> VerifyReport {
        verify(&self.options()).unwrap()
    }
}

fn write_lines(path: &Path, lines: &[String]) {
    fs::write(
        path,
        lines.iter().map(|l| format!("{l}\n")).collect::<String>(),
    )
    .unwrap();
}

/// The kind, line and checkpoint file of a report's problem.
fn problem_of(report: &VerifyReport) -> Option<(ProblemKind, u64, Option<PathBuf>)> {
    report
        .problem
        .as_ref()
        .map(|p| (p.kind, p.line, p.checkpoint_file.clone()))
}

#[test]
fn a_mirror_that_agrees_verifies_with_and_without_the_key() {
    let m = mirrored();
    let report = m.keyed();
    assert!(report.is_intact(), "{report}");
    assert_eq!(report.records, 10);
    assert_eq!(
        report.checkpoints_verified, 4,
        "shared checkpoints count once"
    );
    assert_eq!(report.checkpoint_mismatch, None);
    assert_eq!(report.records_after_checkpoint, Some(0));
    assert!(report.warnings.is_empty(), "{report}");
    assert!(!report.to_string().contains("after the newest"), "{report}");

    let report = m.unkeyed();
    assert!(report.is_intact(), "{report}");
    assert_eq!(report.checkpoints_unchecked, 4);
    assert_eq!(report.records_after_checkpoint, None);
}

#[test]
fn a_checkpoint_missing_from_the_mirror_is_a_problem_naming_both_files_and_the_count() {
    let m = mirrored();
    // The mirror fell behind: its last line (the checkpoint of 10 records) never arrived.
    let all = lines(&m.mirror);
    write_lines(&m.mirror, &all[..3]);
    for report in [m.keyed(), m.unkeyed()] {
        assert_eq!(
            problem_of(&report),
            Some((ProblemKind::CheckpointMissing, 4, Some(m.cps.clone()))),
            "{report}"
        );
        let text = report.to_string();
        assert!(text.contains("checkpoint_missing"), "{text}");
        assert!(
            text.contains("the checkpoint for 10 records is missing from the mirror"),
            "{text}"
        );
        assert!(text.contains(&m.mirror.display().to_string()), "{text}");
        assert!(text.contains("1 of the 4 checkpoints"), "{text}");
        // The log itself verified.
        assert_eq!(report.records, 10);
    }
}

#[test]
fn a_mirror_with_a_checkpoint_the_checkpoint_file_lacks_is_a_problem() {
    let m = mirrored();
    // The checkpoint file was rolled back by one line.
    let all = lines(&m.cps);
    write_lines(&m.cps, &all[..3]);
    let report = m.keyed();
    assert_eq!(
        problem_of(&report),
        Some((ProblemKind::CheckpointMissing, 4, Some(m.mirror.clone()))),
        "{report}"
    );
    let text = report.to_string();
    assert!(
        text.contains("is missing from the checkpoint file")
            && text.contains(&m.cps.display().to_string())
            && text.contains("1 of the 4 checkpoints in the mirror"),
        "{text}"
    );
    assert_eq!(report.checkpoints_verified, 4, "the union of both files");

    // Deleted together with the log's tail: the cut is caught against the mirror's newest
    // checkpoint, and the missing checkpoint file is reported next to it.
    fs::remove_file(&m.cps).unwrap();
    let log = lines(&m.path);
    write_lines(&m.path, &log[..7]);
    assert!(
        verify(&VerifyOptions::new(&m.path).checkpoint_key(key()))
            .unwrap()
            .is_intact(),
        "without the mirror the cut passes (documented)"
    );
    let report = m.keyed();
    let problem = report.problem.clone().unwrap();
    assert_eq!(
        (problem.kind, problem.line),
        (ProblemKind::TruncatedBeforeCheckpoint, 8),
        "{report}"
    );
    assert!(
        problem.detail.contains("counts 10")
            && problem.detail.contains(&m.mirror.display().to_string()),
        "{problem}"
    );
    let mismatch = report.checkpoint_mismatch.clone().unwrap();
    assert_eq!(mismatch.kind, ProblemKind::CheckpointMissing);
    assert!(
        mismatch.detail.contains("which does not exist")
            && mismatch
                .detail
                .contains("4 of the 4 checkpoints in the mirror"),
        "{mismatch}"
    );
    assert!(report.to_string().contains("; also "), "{report}");
}

#[test]
fn a_tampered_mirror_line_is_a_bad_signature_in_the_mirror() {
    let m = mirrored();
    let mut all = lines(&m.mirror);
    assert!(all[1].starts_with("{\"count\":6,"), "{}", all[1]);
    all[1] = all[1].replacen("\"count\":6", "\"count\":5", 1);
    write_lines(&m.mirror, &all);
    let report = m.keyed();
    assert_eq!(
        problem_of(&report),
        Some((
            ProblemKind::BadCheckpointSignature,
            2,
            Some(m.mirror.clone())
        )),
        "{report}"
    );
    // Without the key the forgery cannot be judged, but the files still disagree.
    let report = m.unkeyed();
    assert_eq!(
        report.problem.as_ref().map(|p| p.kind),
        Some(ProblemKind::CheckpointMissing),
        "{report}"
    );

    // A forged mirror line that claims more records than the log has is still not an anchor.
    let m = mirrored();
    let mut all = lines(&m.mirror);
    all.push(all[3].replacen("\"count\":10", "\"count\":11", 1));
    write_lines(&m.mirror, &all);
    let report = m.keyed();
    assert_eq!(
        problem_of(&report),
        Some((
            ProblemKind::BadCheckpointSignature,
            5,
            Some(m.mirror.clone())
        )),
        "{report}"
    );
}

#[test]
fn records_after_the_newest_checkpoint_are_counted_and_reported() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("audit.jsonl");
    {
        let log = FileAuditLog::open_with(
            AuditConfig::new(&path)
                .checkpoint_key(key())
                .checkpoint_every(3),
        )
        .unwrap();
        for i in 0..6 {
            log.append(&entry(i)).unwrap();
        }
    }
    // A writer without the key adds two records: no checkpoint covers them.
    {
        let log = FileAuditLog::open(&path).unwrap();
        for i in 6..8 {
            log.append(&entry(i)).unwrap();
        }
    }
    let report = keyed(&path);
    assert!(report.is_intact(), "{report}");
    assert_eq!(report.records, 8);
    assert_eq!(report.records_after_checkpoint, Some(2));
    assert!(
        report
            .to_string()
            .contains("2 records after the newest checkpoint (not covered by any signature)"),
        "{report}"
    );
    // Without the key nothing is covered anyway, and the line is not printed.
    let unkeyed = verify(&VerifyOptions::new(&path)).unwrap();
    assert_eq!(unkeyed.records_after_checkpoint, None);
    assert!(
        !unkeyed.to_string().contains("after the newest"),
        "{unkeyed}"
    );
}

#[test]
fn a_key_with_no_checkpoints_warns_and_the_log_stays_intact() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("audit.jsonl");
    {
        let log = FileAuditLog::open(&path).unwrap();
        for i in 0..3 {
            log.append(&entry(i)).unwrap();
        }
    }
    let report = keyed(&path);
    assert!(report.is_intact(), "a warning, not a problem: {report}");
    assert_eq!(report.records_after_checkpoint, Some(3));
    assert_eq!(report.warnings.len(), 1, "{report}");
    let warning = &report.warnings[0];
    assert_eq!(warning.kind, WarningKind::NoCheckpoints);
    assert_eq!(warning.kind.as_str(), "no_checkpoints");
    let cps = dir.path().join("audit.checkpoints.jsonl");
    assert!(
        warning.detail.contains(&cps.display().to_string())
            && warning.detail.contains("which does not exist")
            && warning.detail.contains("none of the 3 records"),
        "{warning}"
    );
    let text = report.to_string();
    assert!(
        text.contains("WARNING: a key was given but no checkpoint"),
        "{text}"
    );
    assert!(!text.contains("after the newest"), "{text}");

    // With a mirror that has none either, the warning names both.
    let mirror = dir.path().join("mirror.jsonl");
    let report = verify(
        &VerifyOptions::new(&path)
            .checkpoint_key(key())
            .checkpoint_mirror(&mirror),
    )
    .unwrap();
    assert!(report.is_intact(), "{report}");
    assert!(
        report.warnings[0]
            .detail
            .contains(&format!("nor in the mirror {}", mirror.display())),
        "{report}"
    );

    // Without a key there is nothing to warn about: the report already says nothing is checked.
    assert!(
        verify(&VerifyOptions::new(&path))
            .unwrap()
            .warnings
            .is_empty()
    );
    // With checkpoints present there is no warning.
    assert!(mirrored().keyed().warnings.is_empty());
}
