//! The call gate and the write_note contract, over a real stdio session.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use common::{INVALID_PARAMS, TestEnv, first_text, note_bytes, note_status, result_of, snapshot};
use serde_json::{Value, json};

fn assert_one_new_deny(env: &TestEnv, before: usize, name: &str, reason: &str) -> Value {
    let records = env.audit_records();
    assert_eq!(
        records.len(),
        before + 1,
        "exactly one new audit line expected: {records:#?}"
    );
    let record = records.last().unwrap().clone();
    assert_eq!(record["name"], name, "{record}");
    assert_eq!(record["method"], "tools/call", "{record}");
    assert_eq!(record["decision"], "deny", "{record}");
    assert_eq!(record["outcome"], "not_executed", "{record}");
    assert_eq!(record["reason"], reason, "{record}");
    record
}

#[test]
fn denied_and_unknown_tools_get_the_same_error_and_nothing_runs() {
    let env = TestEnv::new();
    let target = env.path("precious.txt");
    std::fs::write(&target, b"do not delete").unwrap();
    let before = snapshot(&target);
    let mut server = env.start();

    let lines_before = env.audit_records().len();
    let denied = server.call("rm_rf", json!({"path": target.display().to_string()}));
    let error = denied
        .get("error")
        .unwrap_or_else(|| panic!("rm_rf must get a JSON-RPC error: {denied}"));
    assert_eq!(error["code"], INVALID_PARAMS, "{denied}");
    assert!(denied.get("result").is_none(), "{denied}");
    let record = assert_one_new_deny(&env, lines_before, "rm_rf", "deny");
    let args_digest = common::sha256_hex(&toolgate::canon::canonical_value(
        &json!({"path": target.display().to_string()}),
    ));
    assert_eq!(record["args_digest"], args_digest, "{record}");

    let after = snapshot(&target);
    assert_eq!(before, after, "the rm_rf target changed");
    assert!(after.exists);
    assert_eq!(std::fs::read(&target).unwrap(), b"do not delete");

    let lines_before = env.audit_records().len();
    let unknown = server.call("no_such_tool", json!({"path": "x"}));
    assert_eq!(
        unknown.get("error"),
        Some(error),
        "an unknown tool must get the identical error object: {unknown} vs {denied}"
    );
    assert_one_new_deny(&env, lines_before, "no_such_tool", "unknown_tool");

    assert!(server.close().success());
    common::assert_verifies(&env.ledger);
}

#[test]
fn write_note_commits_replays_and_refuses_conflicts() {
    let env = TestEnv::new();
    let mut server = env.start();
    let id = "req-note-0001";
    let text = "a note";

    let reply = server.write_note(id, text);
    let result = result_of(&reply);
    assert_eq!(
        result["structuredContent"],
        json!({"request_id": id, "status": "committed"}),
        "{reply}"
    );
    let as_text: Value = serde_json::from_str(&first_text(&reply)).expect("text is JSON");
    assert_eq!(as_text, result["structuredContent"], "{reply}");

    let note = env.note_path(id);
    let bytes = std::fs::read(&note).unwrap_or_else(|e| panic!("{}: {e}", note.display()));
    assert_eq!(
        bytes,
        note_bytes(id, text),
        "note bytes must be canonical JSON"
    );
    assert_eq!(env.note_files(), vec![note.clone()]);

    let reply = server.write_note(id, text);
    assert_eq!(
        result_of(&reply)["structuredContent"],
        json!({"request_id": id, "status": "replay"}),
        "{reply}"
    );
    let as_text: Value = serde_json::from_str(&first_text(&reply)).expect("text is JSON");
    assert_eq!(as_text["status"], "replay");

    let before = snapshot(&note);
    let reply = server.write_note(id, "a different text");
    assert_eq!(result_of(&reply)["isError"], true, "{reply}");
    assert_eq!(
        snapshot(&note),
        before,
        "a conflict must not touch the note"
    );
    assert_eq!(std::fs::read(&note).unwrap(), note_bytes(id, text));
    assert_eq!(env.note_files().len(), 1);

    let records = env.audit_records();
    let outcomes: Vec<(&str, &str)> = records
        .iter()
        .map(|r| {
            (
                r["decision"].as_str().unwrap(),
                r["outcome"].as_str().unwrap(),
            )
        })
        .collect();
    assert_eq!(
        &outcomes[..2],
        &[("allow", "committed"), ("allow", "replay")],
        "{records:#?}"
    );
    assert_eq!(records.len(), 3, "{records:#?}");
    assert!(
        records
            .iter()
            .all(|r| r["request_id"] == id && r["name"] == "write_note")
    );

    assert!(server.close().success());
    common::assert_verifies(&env.ledger);
}

#[test]
fn read_ledger_returns_every_note_sorted_by_file_name() {
    let env = TestEnv::new();
    let mut server = env.start();
    let notes = [
        ("req-read-0001", "one"),
        ("req-read-0002", "two"),
        ("req-read-0003", "three"),
        ("req-read-0004", "four, with \"quotes\" and ünïcödé"),
    ];
    for (id, text) in notes {
        assert_eq!(note_status(&server.write_note(id, text)), "committed");
    }
    let reply = server.call("read_ledger", json!({}));
    let result = result_of(&reply);
    assert_ne!(result["isError"], true, "{reply}");

    let mut expected: Vec<(String, Value)> = notes
        .iter()
        .map(|(id, text)| {
            (
                common::sha256_hex(id.as_bytes()),
                json!({"request_id": id, "text": text}),
            )
        })
        .collect();
    expected.sort_by(|a, b| a.0.cmp(&b.0));
    let expected: Vec<Value> = expected.into_iter().map(|(_, note)| note).collect();
    assert_eq!(
        result["structuredContent"],
        json!({"notes": expected}),
        "{reply}"
    );
    let as_text: Value = serde_json::from_str(&first_text(&reply)).expect("text is JSON");
    assert_eq!(as_text, result["structuredContent"]);

    for (id, text) in notes {
        assert_eq!(
            std::fs::read(env.note_path(id)).unwrap(),
            note_bytes(id, text)
        );
    }
    let last = env.audit_records().last().cloned().unwrap();
    assert_eq!(last["name"], "read_ledger");
    assert_eq!(last["decision"], "allow");
    assert_eq!(last["outcome"], "observed");
    assert!(server.close().success());
}

#[test]
fn arg_rules_refuse_a_short_request_id_before_anything_is_written() {
    let env = TestEnv::new();
    let mut server = env.start();
    let lines_before = env.audit_records().len();
    let short = "short";
    let reply = server.write_note(short, "text of a refused note");
    let result = result_of(&reply);
    assert_eq!(result["isError"], true, "{reply}");
    let text = first_text(&reply);
    assert!(text.starts_with("Error:"), "{text}");
    assert!(
        text.contains("request_id") && text.contains("min_len"),
        "{text}"
    );
    assert_one_new_deny(
        &env,
        lines_before,
        "write_note",
        "arg_rules.write_note.request_id.min_len",
    );
    assert!(!env.note_path(short).exists());
    assert!(env.note_files().is_empty(), "{:?}", env.note_files());

    // A text over max_len 2000 is refused the same way.
    let lines_before = env.audit_records().len();
    let reply = server.write_note("req-long-0001", &"y".repeat(2001));
    assert_eq!(result_of(&reply)["isError"], true, "{reply}");
    assert_one_new_deny(
        &env,
        lines_before,
        "write_note",
        "arg_rules.write_note.text.max_len",
    );
    assert!(env.note_files().is_empty());
    assert!(server.close().success());
}

#[test]
fn audit_lines_never_contain_raw_arguments() {
    let env = TestEnv::new();
    let mut server = env.start();
    let secret = "zebra-quokka-7f3a9c-distinctive-text";
    assert_eq!(
        note_status(&server.write_note("req-secret-01", secret)),
        "committed"
    );
    assert_eq!(
        note_status(&server.write_note("req-secret-01", secret)),
        "replay"
    );
    server.write_note("req-secret-01", &format!("{secret}-conflict"));
    server.write_note("tiny", secret);
    server.call("rm_rf", json!({"path": secret}));
    server.call("no_such_tool", json!({"text": secret}));
    assert!(server.close().success());

    let audit = env.audit_text();
    assert_eq!(env.audit_records().len(), 6, "{audit}");
    assert!(
        !audit.contains(secret),
        "raw argument in the audit log:\n{audit}"
    );
    assert!(
        !audit.contains("zebra"),
        "raw argument in the audit log:\n{audit}"
    );
    let stderr = server.stderr();
    assert!(
        !stderr.contains(secret),
        "raw argument in the logs:\n{stderr}"
    );
}
