//! Behaviour of the file log and the verifier, checked through the public API only.

// clippy.toml permits unwrap in #[test] functions only; the helpers below are test code too, and a
// panic with the failing value is exactly what a test helper should do.
#![allow(clippy::unwrap_used)]

use std::fs;
use std::io::Write;
use std::path::PathBuf;
use std::sync::Arc;

use serde_json::Value;
use toolgate_audit::{
    AuditDecision, AuditEntry, AuditError, AuditSink, FileAuditLog, Outcome, ProblemKind,
    VerifyReport, verify_file, verify_reader,
};
use toolgate_canon::{Sha256Digest, canonical_value};

fn entry(i: usize) -> AuditEntry {
    let args = serde_json::json!({"request_id": format!("req-{i:04}"), "text": "hello"});
    AuditEntry::tool_call(
        format!("req-{i:04}"),
        "write_note",
        AuditDecision::Allow,
        Outcome::Committed,
        Sha256Digest::of_json(&args),
    )
}

fn log_path(dir: &tempfile::TempDir) -> PathBuf {
    dir.path().join("ledger").join("audit.jsonl")
}

/// Writes `n` records through the real writer and returns the file's lines (without newlines).
fn written_lines(n: usize) -> Vec<String> {
    let dir = tempfile::tempdir().unwrap();
    let path = log_path(&dir);
    let log = FileAuditLog::open(&path).unwrap();
    for i in 0..n {
        log.append(&entry(i)).unwrap();
    }
    let text = fs::read_to_string(&path).unwrap();
    text.split_terminator('\n').map(str::to_owned).collect()
}

/// A verifier written from the format description alone: parse each line, drop `sha256`,
/// canonicalize the rest, hash it after the previous line's hex digest. Returns the number of lines.
fn independent_verify(bytes: &[u8]) -> usize {
    let text = std::str::from_utf8(bytes).unwrap();
    assert!(
        text.is_empty() || text.ends_with('\n'),
        "log must end with a newline"
    );
    let mut prev = "0".repeat(64);
    let mut count = 0;
    for (i, line) in text.split_terminator('\n').enumerate() {
        let mut value: Value = serde_json::from_str(line).unwrap();
        assert_eq!(
            canonical_value(&value),
            line.as_bytes(),
            "line {} not canonical",
            i + 1
        );
        let object = value.as_object_mut().unwrap();
        let sha = object
            .remove("sha256")
            .unwrap()
            .as_str()
            .unwrap()
            .to_owned();
        assert_eq!(
            object["prev_sha256"].as_str().unwrap(),
            prev,
            "line {} link",
            i + 1
        );
        for key in [
            "ts",
            "request_id",
            "method",
            "name",
            "decision",
            "outcome",
            "args_digest",
        ] {
            assert!(object.contains_key(key), "line {} lacks {key}", i + 1);
        }
        assert!(object["ts"].is_u64(), "ts is an integer");
        let body = canonical_value(&value);
        let recomputed = Sha256Digest::of_parts(&[prev.as_bytes(), &body]).to_hex();
        assert_eq!(recomputed, sha, "line {} hash", i + 1);
        prev = sha;
        count += 1;
    }
    count
}

fn assert_intact(report: &VerifyReport, records: u64) {
    assert!(report.is_intact(), "expected intact, got {report}");
    assert_eq!(report.records, records, "{report}");
}

#[test]
fn appends_verify_and_match_an_independent_verifier() {
    let dir = tempfile::tempdir().unwrap();
    let path = log_path(&dir);
    let log = FileAuditLog::open(&path).unwrap();
    assert!(log.recovered().is_none());
    assert_eq!(log.head(), Sha256Digest::ZERO);
    let mut last = None;
    for i in 0..20 {
        let mut e = entry(i);
        if i % 3 == 0 {
            e = e.with_reason(toolgate_audit::Reason::Note(
                "policy: allow list".to_owned(),
            ));
        }
        last = Some(log.append(&e).unwrap());
    }
    let report = verify_file(&path).unwrap();
    assert_intact(&report, 20);
    assert_eq!(report.head, log.head());
    assert_eq!(report.head, last.as_ref().unwrap().sha256);

    let bytes = fs::read(&path).unwrap();
    assert_eq!(independent_verify(&bytes), 20);
    let last_line: Value =
        serde_json::from_slice(bytes.split(|&b| b == b'\n').nth(19).unwrap()).unwrap();
    assert_eq!(
        last_line["ts"].as_u64(),
        Some(last.unwrap().ts),
        "receipt ts is the written ts"
    );
    let first: Value =
        serde_json::from_slice(bytes.split(|&b| b == b'\n').next().unwrap()).unwrap();
    assert_eq!(first["reason"], "policy: allow list");
    assert_eq!(first["method"], "tools/call");
    assert_eq!(first["decision"], "allow");
    let second: Value =
        serde_json::from_slice(bytes.split(|&b| b == b'\n').nth(1).unwrap()).unwrap();
    assert!(
        second.get("reason").is_none(),
        "reason is written only when present"
    );
}

#[test]
fn empty_log_is_valid() {
    let report = verify_reader(&b""[..]).unwrap();
    assert_intact(&report, 0);
    assert_eq!(report.head, Sha256Digest::ZERO);
}

#[test]
fn missing_file_is_an_io_error() {
    let dir = tempfile::tempdir().unwrap();
    let err = verify_file(&dir.path().join("nope.jsonl")).unwrap_err();
    assert!(matches!(err, AuditError::Io { .. }), "{err}");
}

#[test]
fn reopen_recovers_the_head() {
    let dir = tempfile::tempdir().unwrap();
    let path = log_path(&dir);
    let head = {
        let log = FileAuditLog::open(&path).unwrap();
        for i in 0..3 {
            log.append(&entry(i)).unwrap();
        }
        log.head()
    };
    let log = FileAuditLog::open(&path).unwrap();
    assert_eq!(log.head(), head);
    assert!(log.recovered().is_none());
    for i in 3..5 {
        log.append(&entry(i)).unwrap();
    }
    let report = verify_file(&path).unwrap();
    assert_intact(&report, 5);
    assert_eq!(report.head, log.head());
}

#[test]
fn torn_tail_is_reported_then_repaired_at_open() {
    let dir = tempfile::tempdir().unwrap();
    let path = log_path(&dir);
    {
        let log = FileAuditLog::open(&path).unwrap();
        for i in 0..4 {
            log.append(&entry(i)).unwrap();
        }
    }
    let good_len = fs::metadata(&path).unwrap().len();
    let torn: &[u8] = br#"{"args_digest":"3b2a","decision":"al"#;
    fs::OpenOptions::new()
        .append(true)
        .open(&path)
        .unwrap()
        .write_all(torn)
        .unwrap();

    let report = verify_file(&path).unwrap();
    let problem = report.problem.clone().unwrap();
    assert_eq!(
        (problem.line, problem.kind),
        (5, ProblemKind::TornTail),
        "{report}"
    );
    assert_eq!(report.records, 4);

    let log = FileAuditLog::open(&path).unwrap();
    let recovery = log.recovered().unwrap().clone();
    assert_eq!(recovery.torn_bytes, torn.len() as u64);
    assert_eq!(
        fs::read(&recovery.saved_as).unwrap(),
        torn,
        "torn bytes saved exactly"
    );
    let saved_name = recovery
        .saved_as
        .file_name()
        .unwrap()
        .to_str()
        .unwrap()
        .to_owned();
    assert!(saved_name.starts_with("audit.jsonl.torn-"), "{saved_name}");
    assert_eq!(recovery.saved_as.parent(), path.parent());
    assert_eq!(recovery.torn_sha256, Sha256Digest::of(torn));

    let bytes = fs::read(&path).unwrap();
    assert!(bytes.len() as u64 > good_len);
    let report = verify_file(&path).unwrap();
    assert_intact(&report, 5);
    assert_eq!(report.head, recovery.record_sha256);
    assert_eq!(independent_verify(&bytes), 5);
    let last: Value = serde_json::from_slice(
        bytes[..bytes.len() - 1]
            .rsplit(|&b| b == b'\n')
            .next()
            .unwrap(),
    )
    .unwrap();
    assert_eq!(last["method"], "audit/recover");
    assert_eq!(last["name"], "audit");
    assert_eq!(last["decision"], "allow");
    assert_eq!(last["outcome"], "recovered");
    assert_eq!(last["request_id"], "recovery");
    assert_eq!(last["reason"], "torn_tail");
    assert_eq!(last["torn_bytes"], torn.len() as u64);
    assert_eq!(last["saved_as"], saved_name.as_str());
    assert_eq!(last["args_digest"], Sha256Digest::of(torn).to_hex());

    // The repaired log chains on normally.
    log.append(&entry(9)).unwrap();
    assert_intact(&verify_file(&path).unwrap(), 6);
}

#[test]
fn torn_tail_left_by_another_writer_is_repaired_during_append() {
    let dir = tempfile::tempdir().unwrap();
    let path = log_path(&dir);
    let log = FileAuditLog::open(&path).unwrap();
    log.append(&entry(0)).unwrap();
    // Another process appends a good record, then crashes in the middle of its next one.
    {
        let other = FileAuditLog::open(&path).unwrap();
        other.append(&entry(1)).unwrap();
    }
    fs::OpenOptions::new()
        .append(true)
        .open(&path)
        .unwrap()
        .write_all(b"{\"ts\":17")
        .unwrap();
    log.append(&entry(2)).unwrap();
    let recovery = log.recovered().unwrap();
    assert_eq!(recovery.torn_bytes, 8);
    let report = verify_file(&path).unwrap();
    assert_intact(&report, 4);
    assert_eq!(report.head, log.head());
    let text = fs::read_to_string(&path).unwrap();
    let methods: Vec<String> = text
        .lines()
        .map(|l| {
            serde_json::from_str::<Value>(l).unwrap()["request_id"]
                .as_str()
                .unwrap()
                .to_owned()
        })
        .collect();
    assert_eq!(methods, ["req-0000", "req-0001", "recovery", "req-0002"]);
}

#[test]
fn torn_file_without_any_complete_line_is_repaired() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("audit.jsonl");
    fs::write(&path, b"{\"ts\":1").unwrap();
    assert_eq!(
        verify_file(&path).unwrap().problem.unwrap().kind,
        ProblemKind::TornTail
    );
    let log = FileAuditLog::open(&path).unwrap();
    assert_eq!(log.recovered().unwrap().torn_bytes, 7);
    assert_intact(&verify_file(&path).unwrap(), 1);
}

#[test]
fn corrupt_last_line_fails_open_with_a_typed_error() {
    let lines = written_lines(3);
    let cases: Vec<(&str, String)> = vec![
        ("garbage", format!("{}\n{}\ngarbage\n", lines[0], lines[1])),
        (
            "edited",
            format!(
                "{}\n{}\n{}\n",
                lines[0],
                lines[1],
                lines[2].replace("committed", "replay")
            ),
        ),
        ("empty line", format!("{}\n\n", lines[0])),
        ("array", "[1,2,3]\n".to_owned()),
        ("corrupt plus torn", format!("{}\nxx\n{{\"a\"", lines[0])),
    ];
    for (name, content) in cases {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("audit.jsonl");
        fs::write(&path, &content).unwrap();
        let err = FileAuditLog::open(&path).unwrap_err();
        assert!(
            matches!(err, AuditError::CorruptTail { .. }),
            "{name}: {err}"
        );
        let message = err.to_string();
        assert!(
            message.contains("`audit verify` command, or `toolgate_audit::verify_file`"),
            "{name}: {message}"
        );
        assert!(message.contains("refusing to append"), "{name}: {message}");
        assert_eq!(
            fs::read_to_string(&path).unwrap(),
            content,
            "{name}: file untouched"
        );
    }
}

#[test]
fn huge_file_without_newlines_fails_open_and_verifies_as_malformed() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("audit.jsonl");
    fs::write(&path, vec![b'z'; toolgate_audit::MAX_LINE_BYTES + 10]).unwrap();
    let err = FileAuditLog::open(&path).unwrap_err();
    assert!(matches!(err, AuditError::CorruptTail { .. }), "{err}");
    let problem = verify_file(&path).unwrap().problem.unwrap();
    assert_eq!((problem.line, problem.kind), (1, ProblemKind::Malformed));
}

#[test]
fn path_without_file_name_is_rejected() {
    let err = FileAuditLog::open("/").unwrap_err();
    assert!(matches!(err, AuditError::InvalidPath { .. }), "{err}");
}

#[test]
fn an_oversized_field_is_recorded_as_its_digest_and_the_log_stays_usable() {
    let dir = tempfile::tempdir().unwrap();
    let path = log_path(&dir);
    let log = FileAuditLog::open(&path).unwrap();
    log.append(&entry(0)).unwrap();
    let reason = "x".repeat(toolgate_audit::MAX_LINE_BYTES);
    log.append(&entry(1).with_reason(toolgate_audit::Reason::Note(reason.clone())))
        .unwrap();
    log.append(&entry(2)).unwrap();
    assert_intact(&verify_file(&path).unwrap(), 3);
    let text = fs::read_to_string(&path).unwrap();
    let second: serde_json::Value = serde_json::from_str(text.lines().nth(1).unwrap()).unwrap();
    assert_eq!(
        second["reason"],
        format!(
            "sha256:{}",
            toolgate_canon::Sha256Digest::of(reason.as_bytes())
        )
    );
    assert_eq!(second["reason_bytes"], reason.len());
}

/// Verifies `lines` joined with newlines plus `trailing`, and checks the first problem.
fn check(
    lines: &[String],
    trailing: &str,
    expect: Option<(u64, ProblemKind)>,
    records: u64,
) -> VerifyReport {
    let mut text = String::new();
    for line in lines {
        text.push_str(line);
        text.push('\n');
    }
    text.push_str(trailing);
    let report = verify_reader(text.as_bytes()).unwrap();
    let got = report.problem.as_ref().map(|p| (p.line, p.kind));
    assert_eq!(got, expect, "{report}");
    assert_eq!(report.records, records, "{report}");
    report
}

#[test]
fn verifier_detects_each_kind_of_damage_at_the_right_line() {
    let good = written_lines(6);
    let intact = check(&good, "", None, 6);
    assert_eq!(
        intact.head.to_hex(),
        serde_json::from_str::<Value>(&good[5]).unwrap()["sha256"]
    );

    let mut edited = good.clone();
    edited[2] = edited[2].replace("\"outcome\":\"committed\"", "\"outcome\":\"replay\"");
    assert_ne!(edited[2], good[2]);
    let report = check(&edited, "", Some((3, ProblemKind::Modified)), 2);
    assert_eq!(
        report.head.to_hex(),
        serde_json::from_str::<Value>(&good[1]).unwrap()["sha256"]
    );

    let mut deleted = good.clone();
    deleted.remove(2);
    let report = check(&deleted, "", Some((3, ProblemKind::SeqGap)), 2);
    assert_eq!(
        report.problem.unwrap().to_string(),
        "line 3: seq_gap: seq 4 follows seq 2: records 3..=3 are missing"
    );

    let mut swapped = good.clone();
    swapped.swap(3, 4);
    check(&swapped, "", Some((4, ProblemKind::Reordered)), 3);

    let mut first_deleted = good.clone();
    first_deleted.remove(0);
    check(&first_deleted, "", Some((1, ProblemKind::SeqGap)), 0);

    let mut duplicated = good.clone();
    duplicated.insert(3, good[2].clone());
    check(&duplicated, "", Some((4, ProblemKind::Reordered)), 3);

    // Line 3 edited and its own sha256 recomputed: the line is self-consistent, so the damage
    // shows where line 4 no longer links to it.
    let mut rehashed = good.clone();
    let mut object: Value = serde_json::from_str(&rehashed[2]).unwrap();
    object["outcome"] = Value::from("replay");
    object.as_object_mut().unwrap().remove("sha256");
    let prev = object["prev_sha256"].as_str().unwrap().to_owned();
    let sha = Sha256Digest::of_parts(&[prev.as_bytes(), &canonical_value(&object)]);
    object["sha256"] = Value::from(sha.to_hex());
    rehashed[2] = String::from_utf8(canonical_value(&object)).unwrap();
    let report = check(&rehashed, "", Some((4, ProblemKind::LinkBroken)), 3);
    assert_eq!(
        report.problem.unwrap().to_string(),
        "line 4: link_broken: prev_sha256 does not match the sha256 of line 3"
    );

    let mut spaced = good.clone();
    spaced[1] = spaced[1].replacen("\",\"", "\", \"", 1);
    check(&spaced, "", Some((2, ProblemKind::NotCanonical)), 1);

    let mut reordered = good.clone();
    let mut object: serde_json::Map<String, Value> = serde_json::from_str(&reordered[1]).unwrap();
    let ts = object.remove("ts").unwrap();
    reordered[1] = format!(
        "{{\"ts\":{ts},{}",
        &serde_json::to_string(&object).unwrap()[1..]
    );
    check(&reordered, "", Some((2, ProblemKind::NotCanonical)), 1);

    let mut float = good.clone();
    float[2] = float[2].replacen("\"ts\":", "\"ts\":1.5,\"ts2\":", 1);
    check(&float, "", Some((3, ProblemKind::NotCanonical)), 2);

    let mut garbage = good.clone();
    garbage[4] = "garbage".to_owned();
    check(&garbage, "", Some((5, ProblemKind::Malformed)), 4);

    let mut no_sha = good.clone();
    let mut object: Value = serde_json::from_str(&no_sha[3]).unwrap();
    object.as_object_mut().unwrap().remove("sha256");
    no_sha[3] = String::from_utf8(canonical_value(&object)).unwrap();
    check(&no_sha, "", Some((4, ProblemKind::Malformed)), 3);

    let mut upper = good.clone();
    let sha = serde_json::from_str::<Value>(&upper[0]).unwrap()["sha256"]
        .as_str()
        .unwrap()
        .to_owned();
    upper[0] = upper[0].replace(&sha, &sha.to_uppercase());
    check(&upper, "", Some((1, ProblemKind::Malformed)), 0);

    let mut extra_field = good.clone();
    extra_field[1] = extra_field[1].replacen("{", "{\"aaa\":1,", 1);
    check(&extra_field, "", Some((2, ProblemKind::Modified)), 1);

    check(&good, &good[0][..40], Some((7, ProblemKind::TornTail)), 6);
    // The first problem wins even when a torn tail follows.
    check(&swapped, "{\"t", Some((4, ProblemKind::Reordered)), 3);
}

#[test]
fn threads_share_one_chain() {
    let dir = tempfile::tempdir().unwrap();
    let path = log_path(&dir);
    let log = Arc::new(FileAuditLog::open(&path).unwrap());
    let handles: Vec<_> = (0..8)
        .map(|t| {
            let log = Arc::clone(&log);
            std::thread::spawn(move || {
                for i in 0..50 {
                    log.append(&entry(t * 1000 + i)).unwrap();
                }
            })
        })
        .collect();
    for handle in handles {
        handle.join().unwrap();
    }
    let report = verify_file(&path).unwrap();
    assert_intact(&report, 400);
    assert_eq!(report.head, FileAuditLog::head(&log));
    assert_eq!(independent_verify(&fs::read(&path).unwrap()), 400);
}

#[test]
fn two_handles_in_one_process_never_fork_the_chain() {
    let dir = tempfile::tempdir().unwrap();
    let path = log_path(&dir);
    let a = FileAuditLog::open(&path).unwrap();
    let b = FileAuditLog::open(&path).unwrap();
    for i in 0..10 {
        a.append(&entry(i)).unwrap();
        b.append(&entry(100 + i)).unwrap();
    }
    assert_intact(&verify_file(&path).unwrap(), 20);
    assert_eq!(b.head(), verify_file(&path).unwrap().head);
}

/// A small deterministic generator, so garbage inputs are reproducible without extra dependencies.
struct XorShift(u64);

impl XorShift {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
}

#[test]
fn garbage_never_panics_and_open_repairs_what_verify_calls_torn() {
    let good = written_lines(4);
    let pieces: Vec<Vec<u8>> = vec![
        good[0].clone().into_bytes(),
        good[1].clone().into_bytes(),
        good[2].clone().into_bytes(),
        b"\n".to_vec(),
        b"{".to_vec(),
        b"}".to_vec(),
        b"\"sha256\":".to_vec(),
        b"\xff\xfe".to_vec(),
        b"[1,2]".to_vec(),
        b"null".to_vec(),
        b"1e999".to_vec(),
        b"{\"prev_sha256\":\"00\"}".to_vec(),
    ];
    let mut rng = XorShift(0x5eed_1234_abcd_ef01);
    let dir = tempfile::tempdir().unwrap();
    let mut repaired = 0;
    for case in 0..300 {
        let mut content = Vec::new();
        for _ in 0..rng.next() % 8 {
            let piece = &pieces[(rng.next() % pieces.len() as u64) as usize];
            if rng.next().is_multiple_of(4) {
                let cut = (rng.next() % (piece.len() as u64 + 1)) as usize;
                content.extend_from_slice(&piece[..cut]);
            } else {
                content.extend_from_slice(piece);
            }
        }
        let before = verify_reader(&content[..]).unwrap();
        let path = dir.path().join(format!("case-{case}.jsonl"));
        fs::write(&path, &content).unwrap();
        let opened = FileAuditLog::open(&path);
        let repairable = before
            .problem
            .as_ref()
            .is_none_or(|p| p.kind == ProblemKind::TornTail);
        if repairable {
            let log = opened.unwrap_or_else(|e| {
                panic!("case {case}: {e}: {:?}", String::from_utf8_lossy(&content))
            });
            log.append(&entry(case)).unwrap();
            let after = verify_file(&path).unwrap();
            assert!(after.is_intact(), "case {case}: {after}");
            assert_eq!(
                after.records,
                before.records + 1 + u64::from(before.problem.is_some())
            );
            repaired += 1;
        }
    }
    // The generator must reach the interesting cases, or this test proves nothing.
    assert!(repaired >= 30, "only {repaired} repairable cases");
}

#[cfg(feature = "fault-injection")]
mod fault_injection {
    use super::*;
    use std::path::Path;
    use std::sync::Mutex;
    use toolgate_audit::AuditConfig;

    fn ends_with_newline(path: &Path) -> bool {
        fs::read(path).unwrap().last() == Some(&b'\n')
    }

    #[test]
    fn hook_runs_mid_record_and_the_line_is_completed() {
        let dir = tempfile::tempdir().unwrap();
        let path = log_path(&dir);
        // (point name, whether the file ended with a newline, file length) at each hook call.
        type Seen = Vec<(&'static str, bool, u64)>;
        let seen: Arc<Mutex<Seen>> = Arc::default();
        let hook_seen = Arc::clone(&seen);
        let hook_path = path.clone();
        let config = AuditConfig::new(&path).fault_hook(Arc::new(move |point| {
            let len = fs::metadata(&hook_path).unwrap().len();
            hook_seen
                .lock()
                .unwrap()
                .push((point, ends_with_newline(&hook_path), len));
        }));
        let log = FileAuditLog::open_with(config).unwrap();
        log.append(&entry(0)).unwrap();
        let one = fs::metadata(&path).unwrap().len();
        log.append(&entry(1)).unwrap();
        let two = fs::metadata(&path).unwrap().len();

        let seen = seen.lock().unwrap().clone();
        assert_eq!(seen.len(), 2);
        assert_eq!(seen[0].0, "audit.mid_record");
        assert!(
            !seen[0].1,
            "half a line is on disk, without its newline, when the hook runs"
        );
        assert_eq!(seen[0].2, one / 2);
        assert_eq!(seen[1].2, one + (two - one) / 2);
        assert!(ends_with_newline(&path));
        let report = verify_file(&path).unwrap();
        assert_intact(&report, 2);
        assert!(log.recovered().is_none());
    }

    #[test]
    fn a_crash_at_the_hook_leaves_a_torn_tail_that_the_next_append_repairs() {
        let dir = tempfile::tempdir().unwrap();
        let path = log_path(&dir);
        let armed = Arc::new(Mutex::new(true));
        let hook_armed = Arc::clone(&armed);
        let config = AuditConfig::new(&path).fault_hook(Arc::new(move |_point| {
            // Stands in for the process dying at the crash point: the rest of the line is never written.
            if std::mem::replace(&mut *hook_armed.lock().unwrap(), false) {
                panic!("simulated crash at audit.mid_record");
            }
        }));
        let log = FileAuditLog::open_with(config).unwrap();
        let crashed =
            std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| log.append(&entry(0))));
        assert!(crashed.is_err());
        let problem = verify_file(&path).unwrap().problem.unwrap();
        assert_eq!((problem.line, problem.kind), (1, ProblemKind::TornTail));

        log.append(&entry(1)).unwrap();
        assert!(log.recovered().is_some());
        let report = verify_file(&path).unwrap();
        assert_intact(&report, 2);
        assert_eq!(report.head, log.head());
    }
}

#[test]
fn a_log_without_seq_is_continued_with_consecutive_numbers() {
    // The lines of a log written before records carried `seq`: the committed fixture's chain
    // rebuilt without the field.
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("audit.jsonl");
    let mut prev = "0".repeat(64);
    let mut text = String::new();
    for i in 0..3u64 {
        let mut record = serde_json::json!({
            "ts": 1_767_225_600_000_000_000u64 + i * 1_000_000_000,
            "request_id": format!("old-{i}"), "method": "tools/call", "name": "write_note",
            "decision": "allow", "outcome": "committed",
            "args_digest": Sha256Digest::of(b"{}").to_hex(), "prev_sha256": prev,
        });
        let sha = Sha256Digest::of_parts(&[prev.as_bytes(), &canonical_value(&record)]).to_hex();
        record["sha256"] = Value::from(sha.as_str());
        text.push_str(&String::from_utf8(canonical_value(&record)).unwrap());
        text.push('\n');
        prev = sha;
    }
    fs::write(&path, &text).unwrap();
    let log = FileAuditLog::open(&path).unwrap();
    assert_eq!(log.seq(), 3, "legacy lines are counted once at open");
    let receipt = log
        .append(
            &entry(3)
                .with_policy_digest(Sha256Digest::of(b"p"))
                .with_contract_digest(Sha256Digest::of(b"c")),
        )
        .unwrap();
    assert_eq!(receipt.seq, 4);
    log.append(&entry(4)).unwrap();
    assert_intact(&verify_file(&path).unwrap(), 5);
    assert_eq!(independent_verify(&fs::read(&path).unwrap()), 5);
    let lines: Vec<Value> = fs::read_to_string(&path)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(lines[3]["seq"], 4);
    assert_eq!(lines[3]["policy_digest"], Sha256Digest::of(b"p").to_hex());
    assert_eq!(lines[3]["contract_digest"], Sha256Digest::of(b"c").to_hex());
    assert!(
        lines[4].get("policy_digest").is_none(),
        "written only when set"
    );

    // Once records are numbered, a record without seq is damage.
    let mut damaged: Vec<String> = fs::read_to_string(&path)
        .unwrap()
        .lines()
        .map(str::to_owned)
        .collect();
    damaged.push(damaged[2].clone());
    let report = verify_reader(format!("{}\n", damaged.join("\n")).as_bytes()).unwrap();
    let problem = report.problem.unwrap();
    assert_eq!((problem.line, problem.kind), (6, ProblemKind::Malformed));
}

/// `export` reads lines bounded by the longest record the log accepts: a longer line inside the
/// chain is reported with its file and line, never read into memory whole.
#[test]
fn export_refuses_an_over_long_line_instead_of_reading_it() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("audit.jsonl");
    {
        let log = FileAuditLog::open(&path).unwrap();
        log.append(&entry(0)).unwrap();
    }
    let record = fs::read(&path).unwrap();
    let mut damaged = record.clone();
    damaged.extend(std::iter::repeat_n(
        b'x',
        toolgate_audit::MAX_LINE_BYTES + 10,
    ));
    damaged.push(b'\n');
    damaged.extend(&record);
    fs::write(&path, &damaged).unwrap();

    let log = FileAuditLog::open(&path).unwrap();
    let mut out = Vec::new();
    let error = log.export(&mut out).unwrap_err();
    assert!(
        matches!(&error, AuditError::BadRecord { line: 2, .. }),
        "{error}"
    );
    assert!(error.to_string().contains("longer than"), "{error}");
    assert_eq!(out, record, "the records before the damage were exported");
}
