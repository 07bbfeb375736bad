//! Two server processes on one ledger: exactly one note per id, one chain, every record present.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::collections::HashMap;

use common::{TestEnv, note_bytes, note_status, outcome_counts};

const PER_SERVER: usize = 100;
const SHARED: usize = 50;

fn shared_note(i: usize) -> (String, String) {
    (format!("req-shared-{i:04}"), format!("shared note {i}"))
}

fn own_note(server: char, i: usize) -> (String, String) {
    (
        format!("req-{server}-only-{i:04}"),
        format!("note {i} of server {server}"),
    )
}

/// The 100 notes of one server: the 50 shared ones and 50 of its own, interleaved.
fn workload(server: char) -> Vec<(String, String)> {
    (0..SHARED)
        .flat_map(|i| [shared_note(i), own_note(server, i)])
        .collect()
}

#[test]
fn two_servers_on_one_ledger_write_each_note_once_and_keep_one_chain() {
    let env = TestEnv::new();
    let mut a = env.start();
    let mut b = env.start();
    let work_a = workload('a');
    let work_b = workload('b');
    assert_eq!(work_a.len(), PER_SERVER);

    // Pipeline everything, alternating between the two processes, then collect the replies.
    let mut pending_a = Vec::new();
    let mut pending_b = Vec::new();
    for (note_a, note_b) in work_a.iter().zip(&work_b) {
        let id = a.send_call(
            "write_note",
            serde_json::json!({"request_id": note_a.0, "text": note_a.1}),
        );
        pending_a.push((id, note_a.0.clone()));
        let id = b.send_call(
            "write_note",
            serde_json::json!({"request_id": note_b.0, "text": note_b.1}),
        );
        pending_b.push((id, note_b.0.clone()));
    }
    let mut statuses: HashMap<String, Vec<String>> = HashMap::new();
    for (server, pending) in [(&mut a, pending_a), (&mut b, pending_b)] {
        for (rpc_id, request_id) in pending {
            let reply = server.response(rpc_id);
            let result = common::result_of(&reply);
            assert_eq!(
                result["structuredContent"]["request_id"],
                request_id.as_str()
            );
            statuses
                .entry(request_id)
                .or_default()
                .push(note_status(&reply));
        }
    }
    assert!(a.close().success());
    assert!(b.close().success());

    // Replies: one committed per distinct id, the second writer of a shared id got a replay.
    assert_eq!(statuses.len(), 150);
    for (request_id, mut got) in statuses {
        got.sort();
        if request_id.starts_with("req-shared-") {
            assert_eq!(got, ["committed", "replay"], "{request_id}");
        } else {
            assert_eq!(got, ["committed"], "{request_id}");
        }
    }

    // Notes: one file per distinct id, with the exact canonical bytes.
    let files = env.note_files();
    assert_eq!(files.len(), 150, "{files:?}");
    let mut all: Vec<(String, String)> = work_a.clone();
    all.extend(
        work_b
            .iter()
            .filter(|(id, _)| !id.starts_with("req-shared-"))
            .cloned(),
    );
    assert_eq!(all.len(), 150);
    for (id, text) in &all {
        let path = env.note_path(id);
        let bytes = std::fs::read(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        assert_eq!(bytes, note_bytes(id, text), "{id}");
    }

    // Audit: one intact chain holding every record.
    common::assert_verifies(&env.ledger);
    let records = env.audit_records();
    assert_eq!(records.len(), 200, "every call has exactly one record");
    let counts = outcome_counts(&records, "write_note", "allow");
    assert_eq!(counts.get("committed"), Some(&150), "{counts:?}");
    assert_eq!(counts.get("replay"), Some(&50), "{counts:?}");
    assert_eq!(counts.values().sum::<usize>(), 200, "{counts:?}");
    let mut per_id: HashMap<&str, Vec<&str>> = HashMap::new();
    for record in &records {
        per_id
            .entry(record["request_id"].as_str().unwrap())
            .or_default()
            .push(record["outcome"].as_str().unwrap());
    }
    assert_eq!(per_id.len(), 150);
    for (id, mut outcomes) in per_id {
        outcomes.sort_unstable();
        let expected: &[&str] = if id.starts_with("req-shared-") {
            &["committed", "replay"]
        } else {
            &["committed"]
        };
        assert_eq!(outcomes, expected, "{id}");
    }
}

#[test]
fn concurrent_retries_in_one_process_commit_once() {
    let env = TestEnv::new();
    let mut server = env.start();
    let args = serde_json::json!({"request_id": "req-retry-storm", "text": "once"});
    let ids: Vec<u64> = (0..20)
        .map(|_| server.send_call("write_note", args.clone()))
        .collect();
    let mut statuses: Vec<String> = ids
        .into_iter()
        .map(|id| note_status(&server.response(id)))
        .collect();
    statuses.sort();
    let committed = statuses.iter().filter(|s| *s == "committed").count();
    assert_eq!(committed, 1, "{statuses:?}");
    assert!(statuses.iter().all(|s| s == "committed" || s == "replay"));
    assert!(server.close().success());
    assert_eq!(env.note_files(), vec![env.note_path("req-retry-storm")]);
    assert_eq!(
        std::fs::read(env.note_path("req-retry-storm")).unwrap(),
        note_bytes("req-retry-storm", "once")
    );
    let counts = outcome_counts(&env.audit_records(), "write_note", "allow");
    assert_eq!(counts.get("committed"), Some(&1), "{counts:?}");
    assert_eq!(counts.get("replay"), Some(&19), "{counts:?}");
    common::assert_verifies(&env.ledger);
}
