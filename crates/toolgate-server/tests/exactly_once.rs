//! Exactly-once execution configured in the policy (`idempotency`), through the real binary:
//! concurrent retries, byte-identical replays, keys from `_meta` or the arguments, conflicts,
//! unsafe effects left indeterminate after a crash, and audited pruning.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::collections::BTreeMap;

use common::{TestEnv, meta, output_text, run_to_end, scrubbed_command};
use serde_json::{Value, json};

fn outcomes(env: &TestEnv) -> BTreeMap<String, usize> {
    let mut counts = BTreeMap::new();
    for record in env.audit_records() {
        if record["name"] == "write_note" {
            *counts
                .entry(record["outcome"].as_str().unwrap().to_owned())
                .or_default() += 1;
        }
    }
    counts
}

/// A replayed result without its `_meta` replay flag (which it must carry).
fn unmeta(result: &Value) -> Value {
    let mut result = result.clone();
    let object = result.as_object_mut().unwrap();
    let mut meta = object.remove("_meta").unwrap_or_default();
    let flag = meta
        .as_object_mut()
        .and_then(|m| m.remove("io.toolgate/replayed"));
    assert_eq!(
        flag,
        Some(json!(true)),
        "a replay carries the _meta flag: {result}"
    );
    if meta.as_object().is_some_and(|m| !m.is_empty()) {
        object.insert("_meta".into(), meta);
    }
    result
}

#[test]
fn sixty_four_concurrent_calls_with_one_key_execute_once_and_replay_identically() {
    let env = TestEnv::new();
    let mut server = env.start();
    let ids: Vec<u64> = (0..64)
        .map(|_| {
            server.send_call(
                "write_note",
                json!({"request_id": "req-once-0001", "text": "exactly once"}),
            )
        })
        .collect();
    let replies: Vec<Value> = ids.iter().map(|id| server.response(*id)).collect();
    assert!(server.close().success());

    let status = |reply: &Value| {
        assert_ne!(reply["result"]["isError"], true, "{reply}");
        reply["result"]["structuredContent"]["status"]
            .as_str()
            .unwrap_or_default()
            .to_owned()
    };
    let committed: Vec<&Value> = replies
        .iter()
        .filter(|r| status(r) == "committed")
        .collect();
    assert_eq!(committed.len(), 1, "exactly one execution");
    let first = &committed[0]["result"];
    let mut replays = 0;
    for reply in replies.iter().filter(|r| status(r) != "committed") {
        assert_eq!(status(reply), "replay", "{reply}");
        replays += 1;
        // Byte-identical to the first result apart from the replay markers.
        let mut unmarked = unmeta(&reply["result"]);
        unmarked["structuredContent"]["status"] = json!("committed");
        let text = unmarked["structuredContent"].to_string();
        unmarked["content"][0]["text"] = json!(text);
        assert_eq!(
            &unmarked, first,
            "a replay differs from the first result beyond its marker"
        );
    }
    assert_eq!(replays, 63);
    assert_eq!(env.note_files().len(), 1);
    assert_eq!(
        outcomes(&env),
        BTreeMap::from([("committed".into(), 1), ("replay".into(), 63)])
    );
}

/// A policy giving write_note exactly-once settings without a key argument.
fn meta_keyed_policy(env: &TestEnv, effect: &str) {
    let policy = json!({
        "version": 1,
        "allow": ["write_note", "read_ledger"],
        "deny": ["rm_rf"],
        "arg_rules": {"write_note": {"request_id": {"min_len": 8}, "text": {"max_len": 2000}}},
        "idempotency": {"write_note": {"effect": effect}}
    });
    std::fs::write(&env.policy, policy.to_string()).unwrap();
}

fn call_with_key(server: &mut common::Server, key: Option<&str>, args: Value) -> Value {
    let id = server.next_id();
    let mut m = meta();
    if let Some(key) = key {
        m["io.toolgate/idempotencyKey"] = json!(key);
    }
    server.send(&json!({
        "jsonrpc": "2.0", "id": id, "method": "tools/call",
        "params": {"name": "write_note", "arguments": args, "_meta": m}
    }));
    server.response(id)
}

#[test]
fn keys_come_from_meta_or_the_arguments_and_a_reused_key_with_other_arguments_conflicts() {
    let env = TestEnv::new();
    meta_keyed_policy(&env, "idempotent");
    let mut server = env.start();
    let a = json!({"request_id": "req-meta-0001", "text": "a"});
    let b = json!({"request_id": "req-meta-0002", "text": "b"});

    // `_meta` key: the same key and arguments replay (the handler's own store is not asked:
    // without a replay marker the result is byte-identical, status included).
    let first = call_with_key(&mut server, Some("client-key-1"), a.clone());
    let again = call_with_key(&mut server, Some("client-key-1"), a.clone());
    assert_eq!(first["result"], unmeta(&again["result"]));
    // The same `_meta` key with other arguments: a conflict, never executed.
    let conflict = call_with_key(&mut server, Some("client-key-1"), b.clone());
    assert_eq!(conflict["result"]["isError"], true, "{conflict}");
    let text = conflict["result"]["content"][0]["text"].as_str().unwrap();
    assert!(
        text.starts_with("Error:") && text.contains("different arguments"),
        "{text}"
    );
    assert!(
        !env.note_path("req-meta-0002").exists(),
        "a conflict must not execute"
    );

    // No key at all: the arguments are the key.
    let c = json!({"request_id": "req-meta-0003", "text": "c"});
    let first = call_with_key(&mut server, None, c.clone());
    let again = call_with_key(&mut server, None, c);
    assert_eq!(first["result"], unmeta(&again["result"]));
    assert!(server.close().success());

    assert_eq!(
        outcomes(&env),
        BTreeMap::from([
            ("committed".into(), 2),
            ("conflict".into(), 1),
            ("replay".into(), 2)
        ])
    );
    let stats = {
        let mut command = scrubbed_command();
        command
            .arg("--ledger")
            .arg(&env.ledger)
            .args(["audit", "stats", "--format", "json"]);
        run_to_end(command)
    };
    let stats: Value = serde_json::from_slice(&stats.stdout).unwrap();
    assert_eq!(
        stats["idempotency"]["write_note"],
        json!({"committed": 2, "conflict": 1, "replayed": 2})
    );
}

#[cfg(feature = "fault-injection")]
#[test]
fn an_unsafe_effect_interrupted_mid_call_is_indeterminate_not_re_run() {
    let env = TestEnv::new();
    meta_keyed_policy(&env, "unsafe");
    let marker = env.path("marker");
    let mut first = env.spawn_with_env(&[
        (
            "TOOLGATE_CRASH_POINT",
            std::path::Path::new("commit.before_publish"),
        ),
        ("TOOLGATE_CRASH_MARKER", &marker),
    ]);
    first.discover();
    let args = json!({"request_id": "req-unsafe-01", "text": "maybe"});
    let _pending = first.send_call("write_note", args.clone());
    first.wait_for_file(&marker);
    first.kill();

    let mut second = env.start();
    let reply = second.call("write_note", args);
    assert_eq!(reply["result"]["isError"], true, "{reply}");
    let text = reply["result"]["content"][0]["text"].as_str().unwrap();
    assert!(text.contains("may or may not have happened"), "{text}");
    assert!(second.close().success());
    assert!(
        env.note_files().is_empty(),
        "an indeterminate effect is not re-run"
    );
    assert_eq!(outcomes(&env).get("indeterminate"), Some(&1));
}

#[test]
fn pruning_is_explicit_and_audited() {
    let env = TestEnv::new();
    let mut server = env.start();
    server.write_note("req-prune-0001", "kept for 24 h");
    assert!(server.close().success());

    let mut command = scrubbed_command();
    command
        .arg("--policy")
        .arg(&env.policy)
        .arg("--ledger")
        .arg(&env.ledger)
        .args(["effects", "prune"]);
    let out = run_to_end(command);
    assert!(out.status.success(), "{}", output_text(&out));
    assert!(
        String::from_utf8_lossy(&out.stdout).contains("removed 0"),
        "{}",
        output_text(&out)
    );
    let last = env.audit_records().pop().unwrap();
    assert_eq!(last["method"], "effects/prune");
    assert_eq!(last["outcome"], "pruned");
    assert!(env.audit_verify().status.success());
}

/// `effects prune` keeps a record for the policy's window (here 7 days), as the gate does: one
/// finished 2 days ago survives, and a late retry of the `unsafe` effect replays; one finished
/// 8 days ago is removed, and the retry runs again.
#[test]
fn pruning_keeps_records_for_the_policy_window_and_a_late_retry_replays() {
    const DAY: std::time::Duration = std::time::Duration::from_secs(24 * 60 * 60);
    let env = TestEnv::new();
    let mut policy: Value =
        serde_json::from_str(&std::fs::read_to_string(&env.policy).unwrap()).unwrap();
    policy["idempotency"]["write_note"] = json!({
        "key_argument": "request_id", "effect": "unsafe", "window_secs": 7 * 24 * 60 * 60
    });
    std::fs::write(&env.policy, policy.to_string()).unwrap();
    let prune = || {
        let mut command = env.command();
        command.args(["effects", "prune"]);
        let out = run_to_end(command);
        assert!(out.status.success(), "{}", output_text(&out));
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    // Whether the gate answered the call from the exactly-once store (the handler did not run).
    let replayed_by_the_gate = || {
        let mut server = env.start();
        let reply = server.write_note("req-late-0001", "a late retry");
        assert!(server.close().success(), "{}", server.stderr());
        common::result_of(&reply)["_meta"]["io.toolgate/replayed"] == json!(true)
    };
    assert!(!replayed_by_the_gate());

    env.age_effects(2 * DAY);
    let out = prune();
    assert!(out.contains("removed 0 completed records"), "{out}");
    assert!(replayed_by_the_gate());
    assert_eq!(env.audit_records().pop().unwrap()["outcome"], "replay");

    env.age_effects(6 * DAY);
    let out = prune();
    assert!(out.contains("removed 1 completed records"), "{out}");
    assert!(!replayed_by_the_gate());
    assert!(env.audit_verify().status.success());
}
