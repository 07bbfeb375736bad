//! Rotation into segments: the chain and `seq` continue across files, the verifier walks them in
//! order, and a missing segment is reported.

#![allow(clippy::unwrap_used)]

use std::fs;
use std::path::{Path, PathBuf};

use toolgate_audit::{
    AuditConfig, AuditDecision, AuditEntry, AuditSink, FileAuditLog, HmacKey, Outcome, ProblemKind,
    VerifyOptions, read_records, verify,
};
use toolgate_canon::Sha256Digest;

fn entry(i: usize) -> AuditEntry {
    AuditEntry::tool_call(
        format!("req-{i:04}"),
        "write_note",
        AuditDecision::Allow,
        Outcome::Committed,
        Sha256Digest::of(b"{}"),
    )
}

fn segments(dir: &Path) -> Vec<PathBuf> {
    let mut found: Vec<PathBuf> = fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| {
            let name = p.file_name().unwrap().to_str().unwrap();
            name.starts_with("audit.0") && name.ends_with(".jsonl")
        })
        .collect();
    found.sort();
    found
}

#[test]
fn rotation_keeps_one_chain_across_segments_and_reopen() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("audit.jsonl");
    let key = HmacKey::new(&[3; 32]).unwrap();
    let config = || {
        AuditConfig::new(&path)
            .segment_bytes(1000)
            .checkpoint_key(key.clone())
            .checkpoint_every(7)
    };
    {
        let log = FileAuditLog::open_with(config()).unwrap();
        for i in 0..20 {
            log.append(&entry(i)).unwrap();
        }
    }
    {
        // Another handle continues the same chain after reopening.
        let log = FileAuditLog::open_with(config()).unwrap();
        assert_eq!(log.seq(), 20);
        for i in 20..30 {
            assert_eq!(log.append(&entry(i)).unwrap().seq, i as u64 + 1);
        }
    }
    let segs = segments(dir.path());
    assert!(segs.len() >= 3, "{segs:?}");
    assert_eq!(
        segs[0].file_name().unwrap(),
        "audit.00000000000000000001.jsonl"
    );
    for seg in &segs {
        // Each segment is named after the seq of its first record.
        let first: serde_json::Value =
            serde_json::from_str(fs::read_to_string(seg).unwrap().lines().next().unwrap()).unwrap();
        let name = seg.file_name().unwrap().to_str().unwrap();
        assert_eq!(
            name[6..26].parse::<u64>().unwrap(),
            first["seq"].as_u64().unwrap()
        );
    }
    let options = VerifyOptions::new(&path).checkpoint_key(key.clone());
    let report = verify(&options).unwrap();
    assert!(report.is_intact(), "{report}");
    assert_eq!(report.records, 30);
    assert!(report.checkpoints_verified >= 4, "{report}");
    let seqs: Vec<u64> = read_records(&path)
        .unwrap()
        .map(|r| r.unwrap()["seq"].as_u64().unwrap())
        .collect();
    assert_eq!(seqs, (1..=30).collect::<Vec<_>>());

    // A middle segment deleted: the next file's first record jumps.
    let removed = segs[1].clone();
    let saved = fs::read(&removed).unwrap();
    fs::remove_file(&removed).unwrap();
    let report = verify(&options).unwrap();
    let problem = report.problem.clone().unwrap();
    assert_eq!(
        (problem.line, problem.kind),
        (1, ProblemKind::SeqGap),
        "{report}"
    );
    assert_eq!(problem.segment.as_deref(), Some(segs[2].as_path()));
    fs::write(&removed, saved).unwrap();
    assert!(verify(&options).unwrap().is_intact());

    // The newest segment deleted: the active file's first record jumps.
    fs::remove_file(segs.last().unwrap()).unwrap();
    let report = verify(&options).unwrap();
    let problem = report.problem.clone().unwrap();
    assert_eq!(
        (problem.line, problem.kind),
        (1, ProblemKind::SeqGap),
        "{report}"
    );
    assert_eq!(problem.segment, None, "{report}");
}

#[test]
fn a_crash_between_rename_and_create_continues_from_the_last_segment() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("audit.jsonl");
    {
        let log = FileAuditLog::open_with(AuditConfig::new(&path).segment_bytes(500)).unwrap();
        for i in 0..6 {
            log.append(&entry(i)).unwrap();
        }
    }
    // Simulate the crash: the active file was renamed into a segment, the new one never created.
    let first_active: serde_json::Value =
        serde_json::from_str(fs::read_to_string(&path).unwrap().lines().next().unwrap()).unwrap();
    let seq = first_active["seq"].as_u64().unwrap();
    fs::rename(&path, dir.path().join(format!("audit.{seq:020}.jsonl"))).unwrap();
    let report = verify(&VerifyOptions::new(&path)).unwrap();
    assert!(report.is_intact(), "{report}");
    assert_eq!(report.records, 6);
    let log = FileAuditLog::open(&path).unwrap();
    assert_eq!(log.seq(), 6);
    assert_eq!(log.append(&entry(6)).unwrap().seq, 7);
    let report = verify(&VerifyOptions::new(&path)).unwrap();
    assert!(report.is_intact(), "{report}");
    assert_eq!(report.records, 7);
}
