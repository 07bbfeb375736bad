//! The committed logs under `fixtures/audit/`: each is derived from `intact.jsonl` by one kind of
//! damage, and the verifier must report it at the expected line.
//!
//! The chain here is built independently of the writer (serde_json plus toolgate-canon only), so the
//! fixtures also pin the record format. Set `UPDATE_EXPECT=1` to rewrite them after a deliberate
//! format change; otherwise any difference fails.

// clippy.toml permits unwrap in #[test] functions only; the helpers below are test code too, and a
// panic with the failing value is exactly what a test helper should do.
#![allow(clippy::unwrap_used)]

use std::fmt::Write as _;
use std::fs;
use std::path::{Path, PathBuf};

use serde_json::{Value, json};
use toolgate_audit::{ProblemKind, verify_file};
use toolgate_canon::{Sha256Digest, canonical_value};

const FIXTURES: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../../fixtures/audit");

/// Six records covering allow and deny, every outcome, with and without `reason`.
fn intact_lines() -> Vec<String> {
    let calls = [
        (
            "req-0001",
            "write_note",
            "allow",
            "committed",
            json!({"request_id": "req-0001", "text": "gate applied"}),
            None,
        ),
        (
            "req-0001",
            "write_note",
            "allow",
            "replay",
            json!({"request_id": "req-0001", "text": "gate applied"}),
            None,
        ),
        (
            "req-0002",
            "rm_rf",
            "deny",
            "not_executed",
            json!({"path": "/"}),
            Some("denied by policy"),
        ),
        (
            "req-0003",
            "read_ledger",
            "allow",
            "observed",
            json!({}),
            None,
        ),
        (
            "short",
            "write_note",
            "deny",
            "not_executed",
            json!({"request_id": "short", "text": "x"}),
            Some("arg_rules: request_id shorter than 8"),
        ),
        (
            "req-0004",
            "read_ledger",
            "allow",
            "observed",
            json!({}),
            None,
        ),
    ];
    let mut prev = "0".repeat(64);
    let mut lines = Vec::new();
    for (i, (request_id, name, decision, outcome, args, reason)) in calls.into_iter().enumerate() {
        let mut record = json!({
            // Multiples of 1e9 are exact doubles, so the timestamps read back unchanged.
            "ts": 1_767_225_600_000_000_000u64 + i as u64 * 1_000_000_000,
            "request_id": request_id,
            "method": "tools/call",
            "name": name,
            "decision": decision,
            "outcome": outcome,
            "args_digest": Sha256Digest::of_json(&args).to_hex(),
            "prev_sha256": prev,
        });
        if let Some(reason) = reason {
            record["reason"] = Value::from(reason);
        }
        let sha = Sha256Digest::of_parts(&[prev.as_bytes(), &canonical_value(&record)]).to_hex();
        record["sha256"] = Value::from(sha.as_str());
        lines.push(String::from_utf8(canonical_value(&record)).unwrap());
        prev = sha;
    }
    lines
}

fn join(lines: &[String]) -> String {
    lines.iter().map(|l| format!("{l}\n")).collect()
}

/// Every fixture: file name, content, and the first problem the verifier must report.
/// A fixture's file name, its content, and the expected first problem as (line, kind).
type Fixture = (&'static str, String, Option<(u64, ProblemKind)>);

fn fixtures() -> Vec<Fixture> {
    let intact = intact_lines();

    let mut edited = intact.clone();
    // Someone turns the recorded denial of rm_rf into an allow.
    edited[2] = edited[2].replace("\"decision\":\"deny\"", "\"decision\":\"allow\"");

    let mut deleted = intact.clone();
    deleted.remove(2);

    let mut swapped = intact.clone();
    swapped.swap(3, 4);

    let mut torn = join(&intact[..5]);
    torn.push_str(&intact[5][..intact[5].len() / 2]);

    let mut not_canonical = intact.clone();
    not_canonical[1] = not_canonical[1].replacen("\":", "\": ", 1);

    let mut malformed = intact.clone();
    malformed[3] = "this is not json".to_owned();

    vec![
        ("intact.jsonl", join(&intact), None),
        (
            "edited.jsonl",
            join(&edited),
            Some((3, ProblemKind::Modified)),
        ),
        (
            "deleted.jsonl",
            join(&deleted),
            Some((3, ProblemKind::LinkBroken)),
        ),
        (
            "swapped.jsonl",
            join(&swapped),
            Some((4, ProblemKind::LinkBroken)),
        ),
        ("torn.jsonl", torn, Some((6, ProblemKind::TornTail))),
        (
            "not_canonical.jsonl",
            join(&not_canonical),
            Some((2, ProblemKind::NotCanonical)),
        ),
        (
            "malformed.jsonl",
            join(&malformed),
            Some((4, ProblemKind::Malformed)),
        ),
    ]
}

fn update_expect() -> bool {
    std::env::var("UPDATE_EXPECT").is_ok_and(|v| v == "1")
}

/// Compares `actual` with the committed file, or rewrites it under `UPDATE_EXPECT=1`.
fn expect_file(path: &Path, actual: &str) {
    if update_expect() {
        fs::create_dir_all(path.parent().unwrap()).unwrap();
        fs::write(path, actual).unwrap();
        return;
    }
    let committed = fs::read_to_string(path).unwrap_or_else(|e| {
        panic!(
            "{}: {e}; run with UPDATE_EXPECT=1 to create it",
            path.display()
        )
    });
    assert!(
        committed == actual,
        "{} differs from what the test generates; if the change is intended, rerun with UPDATE_EXPECT=1\n--- committed\n{committed}\n--- generated\n{actual}",
        path.display()
    );
}

#[test]
fn fixtures_are_current_and_verify_as_expected() {
    let dir = PathBuf::from(FIXTURES);
    let mut reports = String::new();
    for (name, content, expected) in fixtures() {
        let path = dir.join(name);
        expect_file(&path, &content);
        let report = verify_file(&path).unwrap();
        let got = report.problem.as_ref().map(|p| (p.line, p.kind));
        assert_eq!(got, expected, "{name}: {report}");
        let good_lines = expected.map_or(6, |(line, _)| line - 1);
        assert_eq!(report.records, good_lines, "{name}: {report}");
        writeln!(reports, "{name}: {report}").unwrap();
    }
    expect_file(&dir.join("expected.txt"), &reports);
}

#[test]
fn fixture_timestamps_read_back_unchanged() {
    for (i, line) in intact_lines().iter().enumerate() {
        let record: Value = serde_json::from_str(line).unwrap();
        assert_eq!(
            record["ts"].as_u64(),
            Some(1_767_225_600_000_000_000 + i as u64 * 1_000_000_000)
        );
    }
}
