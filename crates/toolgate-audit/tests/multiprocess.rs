//! Several processes appending to one log file produce one unforked chain.
//!
//! The test binary re-executes itself as the child appenders, so the processes are real and share
//! nothing but the file and its lock.

// clippy.toml permits unwrap in #[test] functions only; the helpers below are test code too, and a
// panic with the failing value is exactly what a test helper should do.
#![allow(clippy::unwrap_used)]

use std::collections::HashMap;
use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Child, Command};
use std::time::{Duration, Instant};

use serde_json::Value;
use toolgate_audit::{AuditDecision, AuditEntry, AuditSink, FileAuditLog, Outcome, verify_file};
use toolgate_canon::Sha256Digest;

const CHILD_LOG: &str = "TOOLGATE_AUDIT_TEST_CHILD_LOG";
const CHILD_ID: &str = "TOOLGATE_AUDIT_TEST_CHILD_ID";
const CHILD_START: &str = "TOOLGATE_AUDIT_TEST_CHILD_START";
const PROCESSES: usize = 4;
const APPENDS: usize = 500;
const TIMEOUT: Duration = Duration::from_secs(180);

/// Polls `condition` until it holds or the generous timeout expires.
fn wait_until(what: &str, mut condition: impl FnMut() -> bool) {
    let deadline = Instant::now() + TIMEOUT;
    while !condition() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(5));
    }
}

fn run_child(log: &Path, id: &str, start: &Path) {
    // All children open the log first, then wait for the start signal so their appends interleave.
    let audit = FileAuditLog::open(log).unwrap();
    wait_until("the start file", || start.exists());
    for i in 0..APPENDS {
        let entry = AuditEntry::tool_call(
            format!("{id}-{i:04}"),
            "write_note",
            AuditDecision::Allow,
            Outcome::Committed,
            Sha256Digest::of(id.as_bytes()),
        );
        audit.append(&entry).unwrap();
    }
}

#[test]
fn many_processes_share_one_chain() {
    if let (Ok(log), Ok(id), Ok(start)) = (
        std::env::var(CHILD_LOG),
        std::env::var(CHILD_ID),
        std::env::var(CHILD_START),
    ) {
        run_child(Path::new(&log), &id, Path::new(&start));
        return;
    }

    let dir = tempfile::tempdir().unwrap();
    let log: PathBuf = dir.path().join("audit.jsonl");
    let start = dir.path().join("start");
    let exe = std::env::current_exe().unwrap();
    let mut children: Vec<(String, Child)> = (0..PROCESSES)
        .map(|k| {
            let id = format!("child{k}");
            let child = Command::new(&exe)
                .args(["--exact", "many_processes_share_one_chain", "--nocapture"])
                .env(CHILD_LOG, &log)
                .env(CHILD_ID, &id)
                .env(CHILD_START, &start)
                .spawn()
                .unwrap();
            (id, child)
        })
        .collect();
    fs::write(&start, b"go").unwrap();

    for (id, child) in &mut children {
        let mut status = None;
        wait_until(&format!("{id} to exit"), || {
            status = child.try_wait().unwrap();
            status.is_some()
        });
        assert!(status.unwrap().success(), "{id} failed: {status:?}");
    }

    let report = verify_file(&log).unwrap();
    assert!(report.is_intact(), "{report}");
    assert_eq!(report.records, (PROCESSES * APPENDS) as u64);

    let text = fs::read_to_string(&log).unwrap();
    let mut per_child: HashMap<String, Vec<String>> = HashMap::new();
    for (i, line) in text.lines().enumerate() {
        let record: Value = serde_json::from_str(line).unwrap();
        assert_eq!(
            record["seq"].as_u64(),
            Some(i as u64 + 1),
            "seq is 1..=2000 in order"
        );
        let request_id = record["request_id"].as_str().unwrap();
        let (id, _) = request_id.split_once('-').unwrap();
        per_child
            .entry(id.to_owned())
            .or_default()
            .push(request_id.to_owned());
    }
    assert_eq!(per_child.len(), PROCESSES);
    for (id, _) in &children {
        let expected: Vec<String> = (0..APPENDS).map(|i| format!("{id}-{i:04}")).collect();
        assert_eq!(
            per_child[id], expected,
            "each child's records appear once, in its order"
        );
    }
}
