//! The annotation kit (`toolgate-kit`) on the reference server's own tools: every declared
//! readOnly / idempotent / destructive claim must survive the adversarial matrix, observed on the
//! ledger directory and on the directory given to `rm_rf`.
//!
//! Ignored by the observer, and only these, each stated in the report: `audit*.jsonl` (the audit
//! log, its segments and its checkpoint file), `checkpoints/`, and `*.lock` (writer locks). The
//! gate writes them on every call by design: they are the governance layer's record of a call,
//! not the tool's effect. Everything else the server writes, including the exactly-once effect
//! journal, is observed.

mod common;

use std::time::Instant;

use serde_json::json;
use toolgate::canon::Sha256Digest;
use toolgate_kit::{
    CaseKind, ChangeKind, FsObserver, Kit, Launcher, Report, ToolFixtures, ToolStatus,
};

/// Allows all three tools (the shipped policy denies rm_rf), with write_note exactly-once.
const POLICY: &str = r#"{
  "version": 1,
  "allow": ["write_note", "read_ledger", "rm_rf"],
  "idempotency": {
    "write_note": {
      "key_argument": "request_id",
      "effect": "idempotent",
      "replay_marker": {"pointer": "/status", "value": "replay"}
    }
  }
}"#;

fn note_item(request_id: &str) -> String {
    format!(
        "ledger/notes/{}.json",
        Sha256Digest::of(request_id.as_bytes()).to_hex()
    )
}

fn case<'a>(report: &'a Report, tool: &str, kind: CaseKind) -> &'a toolgate_kit::CaseReport {
    report
        .tool(tool)
        .unwrap_or_else(|| panic!("no report for {tool}"))
        .cases
        .iter()
        .find(|c| c.case == kind)
        .unwrap_or_else(|| panic!("no {kind:?} case for {tool}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_reference_tools_survive_the_annotation_matrix() {
    let dir = tempfile::tempdir().unwrap();
    let policy = dir.path().join("policy.json");
    std::fs::write(&policy, POLICY).unwrap();
    let ledger = dir.path().join("ledger");
    let target = dir.path().join("target");
    std::fs::create_dir_all(target.join("sub")).unwrap();
    std::fs::write(target.join("keep.txt"), "keep me\n").unwrap();
    std::fs::write(target.join("sub/keep-too.txt"), "and me\n").unwrap();

    let (policy_arg, ledger_arg) = (policy.clone(), ledger.clone());
    let launcher = Launcher::child(move || {
        let mut command = common::scrubbed_command();
        command
            .arg("--policy")
            .arg(&policy_arg)
            .arg("--ledger")
            .arg(&ledger_arg);
        command
    });
    let observer = FsObserver::new([&ledger, &target])
        .ignore(
            "audit*.jsonl",
            "the gate's audit log, segments and checkpoint file: one record per call by design, the governance layer's record, not the tool's effect",
        )
        .ignore("checkpoints/", "audit checkpoints, written by the governance layer")
        .ignore("*.lock", "writer lock files of the audit log and the stores; their content is irrelevant");

    let missing = dir.path().join("does-not-exist");
    let started = Instant::now();
    let report = Kit::new(launcher)
        .observer(observer)
        .tool(
            ToolFixtures::new(
                "write_note",
                json!({"request_id": "kit-note-0001", "text": "first note"}),
                json!({"request_id": "kit-note-0002", "text": "second note"}),
                json!({"request_id": "kit-note-0003", "text": 7}),
            )
            .with_already_done(json!({"request_id": "kit-note-0001", "text": "first note"}))
            .with_concurrent(json!({"request_id": "kit-note-0004", "text": "raced note"})),
        )
        .tool(ToolFixtures::new(
            "read_ledger",
            json!({}),
            json!({}),
            json!({"unexpected": true}),
        ))
        .tool(
            ToolFixtures::new(
                "rm_rf",
                json!({"path": target}),
                json!({"path": target.join("sub")}),
                json!({"path": 42}),
            )
            .with_missing_resource(json!({"path": missing}))
            .with_already_done(json!({"path": target})),
        )
        .run()
        .await
        .expect("the matrix runs against toolgate-server");
    let elapsed = started.elapsed();
    let text = report.to_text();
    eprintln!("{text}");
    eprintln!(
        "annotation matrix on toolgate-server's 3 tools: {:.2} s wall time",
        elapsed.as_secs_f64()
    );

    report.assert_honest();
    assert!(report.unclassified().is_empty(), "{text}");
    for tool in ["write_note", "read_ledger", "rm_rf"] {
        assert_eq!(
            report.tool(tool).unwrap().status,
            ToolStatus::Consistent,
            "{tool}\n{text}"
        );
    }
    assert_eq!(report.tools.len(), 3, "{text}");

    // The observer is live: the first write_note added its note, the repeat and the retry added
    // nothing, the cut-off call added the second note, the concurrent pair exactly one note.
    let added = |c: &toolgate_kit::CaseReport, step: usize| -> Vec<String> {
        c.observed[step]
            .changes
            .changes
            .iter()
            .filter(|ch| ch.kind == ChangeKind::Added)
            .map(|ch| ch.item.clone())
            .collect()
    };
    assert_eq!(
        added(case(&report, "write_note", CaseKind::Valid), 0),
        [note_item("kit-note-0001")],
        "{text}"
    );
    assert!(
        case(&report, "write_note", CaseKind::Repeat).observed[0]
            .changes
            .is_empty(),
        "{text}"
    );
    assert!(
        case(&report, "write_note", CaseKind::AlreadyDone).observed[0]
            .changes
            .is_empty(),
        "{text}"
    );
    let retry = case(&report, "write_note", CaseKind::RetryAfterCutOff);
    assert_eq!(added(retry, 0), [note_item("kit-note-0002")], "{text}");
    assert!(retry.observed[1].changes.is_empty(), "{text}");
    assert_eq!(
        added(case(&report, "write_note", CaseKind::Concurrent), 0),
        [note_item("kit-note-0004")],
        "{text}"
    );
    assert!(
        retry.first_call.contains("\"status\":\"committed\""),
        "{text}"
    );
    assert!(
        retry
            .second_call
            .as_deref()
            .unwrap_or("")
            .contains("\"status\":\"replay\""),
        "{text}"
    );

    // read_ledger and rm_rf changed nothing that is observed, in any case.
    for tool in ["read_ledger", "rm_rf"] {
        for c in &report.tool(tool).unwrap().cases {
            assert!(
                c.observed.iter().all(|s| s.changes.is_empty()),
                "{tool} {:?}\n{text}",
                c.case
            );
        }
    }
    assert!(target.join("keep.txt").exists() && target.join("sub/keep-too.txt").exists());

    // The report states what it ignored.
    assert!(text.contains("observer: ignored audit*.jsonl: "), "{text}");
    assert!(text.contains("observer: ignored *.lock: "), "{text}");
    assert_eq!(report.to_json()["summary"]["contradictions"], 0);
}
