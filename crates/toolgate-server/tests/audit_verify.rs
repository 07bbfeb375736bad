//! `toolgate-server audit verify`: exit 0 on an intact chain, non-zero naming the first bad line
//! and the reason on a tampered one, exit 2 without a ledger.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::path::Path;

use common::{TestEnv, audit_verify, note_status, output_text};
use serde_json::{Value, json};

/// Writes a valid chain of at least six records with a real server session.
fn real_chain(env: &TestEnv) -> Vec<String> {
    let mut server = env.start();
    assert_eq!(
        note_status(&server.write_note("req-chain-0001", "one")),
        "committed"
    );
    assert_eq!(
        note_status(&server.write_note("req-chain-0002", "two")),
        "committed"
    );
    assert_eq!(
        note_status(&server.write_note("req-chain-0001", "one")),
        "replay"
    );
    server.call("rm_rf", json!({"path": "/tmp"}));
    server.call("read_ledger", json!({}));
    assert_eq!(
        note_status(&server.write_note("req-chain-0003", "three")),
        "committed"
    );
    assert!(server.close().success());
    let text = env.audit_text();
    let lines: Vec<String> = text.lines().map(|l| format!("{l}\n")).collect();
    assert_eq!(lines.len(), 6, "{text}");
    lines
}

fn ledger_with(dir: &Path, name: &str, lines: &[String]) -> std::path::PathBuf {
    let ledger = dir.join(name);
    std::fs::create_dir_all(&ledger).unwrap();
    std::fs::write(ledger.join("audit.jsonl"), lines.concat()).unwrap();
    ledger
}

fn assert_broken(ledger: &Path, line: u64, kind: &str) {
    let output = audit_verify(ledger);
    let text = output_text(&output);
    assert!(
        !output.status.success(),
        "verify accepted a tampered log: {text}"
    );
    assert_eq!(output.status.code(), Some(1), "{text}");
    let needle = format!("line {line}: {kind}");
    assert!(text.contains(&needle), "expected {needle:?} in: {text}");
}

#[test]
fn verify_accepts_a_real_chain_and_names_the_first_tampered_line() {
    let env = TestEnv::new();
    let lines = real_chain(&env);

    let output = audit_verify(&env.ledger);
    assert!(output.status.success(), "{}", output_text(&output));
    assert!(
        output_text(&output).contains("6 records"),
        "{}",
        output_text(&output)
    );

    // Edited: line 3's outcome changes, the line stays canonical, so only its hash is wrong.
    let mut edited = lines.clone();
    let mut record: Value = serde_json::from_str(edited[2].trim_end()).unwrap();
    assert_eq!(record["outcome"], "replay");
    record["outcome"] = json!("committed");
    let mut line = toolgate::canon::canonical_value(&record);
    line.push(b'\n');
    edited[2] = String::from_utf8(line).unwrap();
    assert_broken(
        &ledger_with(env.dir.path(), "edited", &edited),
        3,
        "modified",
    );

    // Deleted: line 3 removed, so the new line 3 carries seq 4 after seq 2.
    let mut deleted = lines.clone();
    deleted.remove(2);
    assert_broken(
        &ledger_with(env.dir.path(), "deleted", &deleted),
        3,
        "seq_gap",
    );

    // Swapped: lines 3 and 4 exchanged; seq 4 comes first and seq 3 appears later.
    let mut swapped = lines.clone();
    swapped.swap(2, 3);
    assert_broken(
        &ledger_with(env.dir.path(), "swapped", &swapped),
        3,
        "reordered",
    );

    // Truncated at the end (the last record deleted) is still a valid, shorter chain.
    let truncated = lines[..5].to_vec();
    let output = audit_verify(&ledger_with(env.dir.path(), "truncated", &truncated));
    assert!(output.status.success(), "{}", output_text(&output));
}

/// The `line N: kind` of each fixture as recorded in fixtures/audit/expected.txt.
fn expected_problems() -> Vec<(String, Option<(u64, String)>)> {
    let text = std::fs::read_to_string(Path::new(common::AUDIT_FIXTURES).join("expected.txt"))
        .expect("fixtures/audit/expected.txt");
    text.lines()
        .map(|line| {
            let (file, rest) = line.split_once(": ").expect("file: report");
            let problem = rest.strip_prefix("line ").map(|rest| {
                let (number, rest) = rest.split_once(": ").unwrap();
                let kind = rest.split_once(':').unwrap().0;
                (number.parse().unwrap(), kind.to_owned())
            });
            (file.to_owned(), problem)
        })
        .collect()
}

#[test]
fn verify_judges_the_shipped_fixtures() {
    let dir = tempfile::tempdir().unwrap();
    let expected = expected_problems();
    for name in ["intact", "edited", "deleted", "swapped"] {
        let file = format!("{name}.jsonl");
        let source = Path::new(common::AUDIT_FIXTURES).join(&file);
        let ledger = dir.path().join(name);
        std::fs::create_dir_all(&ledger).unwrap();
        std::fs::copy(&source, ledger.join("audit.jsonl"))
            .unwrap_or_else(|e| panic!("{}: {e}", source.display()));
        let problem = expected
            .iter()
            .find(|(f, _)| *f == file)
            .unwrap_or_else(|| panic!("{file} missing from expected.txt"))
            .1
            .clone();
        match (name, problem) {
            ("intact", None) => {
                let output = audit_verify(&ledger);
                assert!(output.status.success(), "{}", output_text(&output));
            }
            ("edited", Some((line, kind))) => {
                assert_eq!(kind, "modified");
                assert_broken(&ledger, line, &kind);
            }
            ("deleted", Some((line, kind))) => {
                assert_eq!(kind, "seq_gap");
                assert_broken(&ledger, line, &kind);
            }
            ("swapped", Some((line, kind))) => {
                assert_eq!(kind, "reordered");
                assert_broken(&ledger, line, &kind);
            }
            (name, problem) => panic!("unexpected expectation for {name}: {problem:?}"),
        }
    }
}

#[test]
fn verify_without_a_ledger_exits_2() {
    let dir = tempfile::tempdir().unwrap();
    let missing = dir.path().join("no-such-ledger");
    let output = audit_verify(&missing);
    assert_eq!(output.status.code(), Some(2), "{}", output_text(&output));
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains("no-such-ledger"), "{stderr}");
    assert!(!missing.exists(), "verify must not create the ledger");

    // An existing ledger directory without audit.jsonl is the same usage error.
    let empty = dir.path().join("empty-ledger");
    std::fs::create_dir(&empty).unwrap();
    let output = audit_verify(&empty);
    assert_eq!(output.status.code(), Some(2), "{}", output_text(&output));
}
