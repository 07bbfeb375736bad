//! Crash consistency: the server is SIGKILLed at each named crash point during a write_note, and
//! a restarted server (without fault injection) resolves the retry to exactly one note.

#![cfg(feature = "fault-injection")]
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use common::{TestEnv, note_bytes, note_status};

const REQUEST_ID: &str = "req-crash-0001";
const TEXT: &str = "written across a crash";

/// Runs the crash scenario at `point` and returns the status of the retry after the restart.
fn crash_then_retry(env: &TestEnv, point: &str) -> String {
    let marker = env.path("crash.marker");
    let point_value = std::ffi::OsString::from(point);
    let mut server = env.spawn_with_env(&[
        ("TOOLGATE_CRASH_POINT", std::path::Path::new(&point_value)),
        ("TOOLGATE_CRASH_MARKER", &marker),
    ]);
    server.discover();
    server.send_call(
        "write_note",
        serde_json::json!({"request_id": REQUEST_ID, "text": TEXT}),
    );
    // The hook creates the marker, writes the point's name into it, then stalls.
    server.wait_for_file_where(&marker, |bytes| bytes == point.as_bytes());
    // std's Child::kill sends SIGKILL: no destructor, no flush, no unlock runs in the server.
    server.kill();

    let mut server = env.start();
    let reply = server.write_note(REQUEST_ID, TEXT);
    let status = note_status(&reply);
    assert!(status == "committed" || status == "replay", "{reply}");

    let files = env.note_files();
    assert_eq!(
        files,
        vec![env.note_path(REQUEST_ID)],
        "exactly one note file"
    );
    assert_eq!(
        std::fs::read(&files[0]).unwrap(),
        note_bytes(REQUEST_ID, TEXT)
    );
    // No temporary file survives the recovery.
    let leftovers: Vec<_> = std::fs::read_dir(env.notes_dir())
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|name| name.ends_with(".tmp"))
        .collect();
    assert!(leftovers.is_empty(), "{leftovers:?}");

    assert_eq!(
        note_status(&server.write_note("req-crash-0002", "after the crash")),
        "committed"
    );
    assert_eq!(
        std::fs::read(env.note_path("req-crash-0002")).unwrap(),
        note_bytes("req-crash-0002", "after the crash")
    );
    assert_eq!(env.note_files().len(), 2);
    assert!(server.close().success());
    common::assert_verifies(&env.ledger);
    status
}

#[test]
fn crash_at_commit_before_publish() {
    let env = TestEnv::new();
    let status = crash_then_retry(&env, "commit.before_publish");
    // The temporary note was never renamed into place, so the retry publishes it.
    assert_eq!(status, "committed");
    let records = env.audit_records();
    let outcomes: Vec<&str> = records
        .iter()
        .map(|r| r["outcome"].as_str().unwrap())
        .collect();
    assert_eq!(outcomes, ["committed", "committed"], "{records:#?}");
}

#[test]
fn crash_at_commit_after_publish() {
    let env = TestEnv::new();
    let status = crash_then_retry(&env, "commit.after_publish");
    // The note was durable before the crash; its audit line was not: the retry is a replay.
    assert_eq!(status, "replay");
    let records = env.audit_records();
    let outcomes: Vec<&str> = records
        .iter()
        .map(|r| r["outcome"].as_str().unwrap())
        .collect();
    assert_eq!(outcomes, ["replay", "committed"], "{records:#?}");
}

#[test]
fn crash_at_audit_mid_record() {
    let env = TestEnv::new();
    let status = crash_then_retry(&env, "audit.mid_record");
    // The note was committed before its audit line was torn: the retry is a replay.
    assert_eq!(status, "replay");

    let torn: Vec<_> = std::fs::read_dir(&env.ledger)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|name| name.starts_with("audit.jsonl.torn-"))
        .collect();
    assert_eq!(
        torn.len(),
        1,
        "the torn tail is saved beside the log: {torn:?}"
    );
    let saved = std::fs::read(env.ledger.join(&torn[0])).unwrap();
    assert!(!saved.is_empty() && !saved.ends_with(b"\n"), "{saved:?}");

    let records = env.audit_records();
    let recovered: Vec<_> = records
        .iter()
        .filter(|r| r["outcome"] == "recovered")
        .collect();
    assert_eq!(recovered.len(), 1, "{records:#?}");
    assert_eq!(
        recovered[0]["args_digest"],
        common::sha256_hex(&saved),
        "the recovery record names the torn bytes"
    );
    let outcomes: Vec<&str> = records
        .iter()
        .map(|r| r["outcome"].as_str().unwrap())
        .collect();
    assert_eq!(
        outcomes,
        ["recovered", "replay", "committed"],
        "{records:#?}"
    );
}
