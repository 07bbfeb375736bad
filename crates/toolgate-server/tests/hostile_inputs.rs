//! Inputs at and past their limits, through the real binary: idempotency keys at 1023/1024/1025
//! bytes of UTF-8 and with control characters are admitted or refused before dispatch with the
//! argument-refusal shape (never a -32603 from inside the store), and a denied call with a 2 MiB
//! JSON-RPC id is still audited. Every case: the server answers the next request and the chain
//! verifies.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use common::*;
use serde_json::{Value, json};

/// The JSON details on the last line of a refusal's text.
fn details(reply: &Value) -> Value {
    let text = first_text(reply);
    serde_json::from_str(text.lines().last().unwrap()).unwrap_or_else(|_| panic!("{reply}"))
}

#[test]
fn idempotency_keys_at_their_byte_limit_are_admitted_and_past_it_refused_before_dispatch() {
    let env = TestEnv::new();
    let mut server = env.start();
    // 1024 bytes made of two-byte characters: the limit counts bytes, not characters.
    let two_byte = "\u{e9}".repeat(512);
    let admitted = [
        "k".repeat(1023),
        "k".repeat(1024),
        two_byte.clone(),
        format!("{}k", "\u{e9}".repeat(511)),
    ];
    for (i, key) in admitted.iter().enumerate() {
        let reply = server.write_note(key, &format!("note {i}"));
        assert_eq!(
            note_status(&reply),
            "committed",
            "{} bytes: {reply}",
            key.len()
        );
        assert!(env.note_path(key).exists());
        // And a retry replays (the same key reaches the store intact).
        let again = server.write_note(key, &format!("note {i}"));
        assert_eq!(
            note_status(&again),
            "replay",
            "{} bytes: {again}",
            key.len()
        );
    }
    let refused = [
        ("k".repeat(1025), "max_bytes"),
        (format!("{two_byte}k"), "max_bytes"),
        (format!("{}\u{e9}", "k".repeat(1023)), "max_bytes"),
        ("req-with\nnewline".to_owned(), "control_characters"),
        ("req-with\u{0}nul".to_owned(), "control_characters"),
        ("req-with\u{7f}del".to_owned(), "control_characters"),
        ("req-with\u{9b}csi".to_owned(), "control_characters"),
    ];
    for (key, check) in &refused {
        let reply = server.write_note(key, "refused");
        assert!(
            reply.get("error").is_none(),
            "not a protocol error: {reply}"
        );
        let result = result_of(&reply);
        assert_eq!(result["isError"], true, "{reply}");
        let text = first_text(&reply);
        assert!(text.starts_with("Error: "), "{text}");
        assert!(!text.contains(key.as_str()), "the key is never quoted");
        let details = details(&reply);
        assert_eq!(details["error"], "argument_rejected");
        assert_eq!(
            details["rule"],
            format!("idempotency.write_note.key.{check}"),
            "{details}"
        );
        assert_eq!(details["field"], "request_id");
        assert_eq!(details["received"]["bytes"], key.len());
        assert!(!env.note_path(key).exists());
    }
    // The server still answers, and every decision is in a verifying chain.
    assert_eq!(
        note_status(&server.write_note("req-after-limits", "after")),
        "committed"
    );
    assert!(server.close().success());
    assert_verifies(&env.ledger);
    let records = audit_records(&env.audit_path());
    let key_refusals: Vec<&Value> = records
        .iter()
        .filter(|r| {
            r["reason"]
                .as_str()
                .is_some_and(|reason| reason.starts_with("idempotency.write_note.key."))
        })
        .collect();
    assert_eq!(key_refusals.len(), refused.len(), "{records:?}");
    for record in key_refusals {
        assert_eq!(record["decision"], "deny");
        assert_ne!(record["outcome"], "error");
    }
}

#[test]
fn a_denied_call_with_a_two_mib_id_is_audited_as_digest_and_length() {
    let env = TestEnv::new();
    let mut server = env.start();
    let id = "i".repeat(2 << 20);
    let request = json!({
        "jsonrpc": "2.0",
        "id": id,
        "method": "tools/call",
        "params": {"name": "rm_rf", "arguments": {"path": "/"}, "_meta": meta()},
    });
    server.send(&request);
    let reply: Value = serde_json::from_str(&server.recv_line()).unwrap();
    assert_eq!(reply["id"], id.as_str());
    assert_eq!(reply["error"]["code"], INVALID_PARAMS, "denied");
    // The next request is answered.
    assert!(server.list_tool_names().contains(&"write_note".to_owned()));
    assert!(server.close().success());
    assert_verifies(&env.ledger);
    let records = audit_records(&env.audit_path());
    let denied = records
        .iter()
        .find(|r| r["name"] == "rm_rf" && r["decision"] == "deny")
        .unwrap_or_else(|| panic!("the denied call was not audited: {records:?}"));
    let recorded = denied["request_id"].as_str().unwrap();
    assert!(recorded.starts_with("sha256:"), "{recorded}");
    assert!(denied["request_id_bytes"].as_u64().unwrap() >= 2 << 20);
    let line_max = std::fs::read_to_string(env.audit_path())
        .unwrap()
        .lines()
        .map(str::len)
        .max()
        .unwrap();
    assert!(line_max < 4096, "every line stays small: {line_max}");
}
