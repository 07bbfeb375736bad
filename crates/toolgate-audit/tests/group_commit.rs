//! Group commit: concurrent appenders share writes and fsyncs, a lone appender pays exactly one
//! fsync per record, and every receipt names its own durable record.

#![allow(clippy::unwrap_used)]

use std::collections::BTreeSet;
use std::sync::Arc;

use toolgate_audit::{
    AuditDecision, AuditEntry, AuditSink, FileAuditLog, Outcome, read_records, verify_file,
};
use toolgate_canon::Sha256Digest;

fn entry(i: usize) -> AuditEntry {
    AuditEntry::tool_call(
        format!("req-{i:05}"),
        "write_note",
        AuditDecision::Allow,
        Outcome::Committed,
        Sha256Digest::of(b"{}"),
    )
}

#[test]
fn sequential_appends_fsync_once_per_record() {
    let dir = tempfile::tempdir().unwrap();
    let log = FileAuditLog::open(dir.path().join("audit.jsonl")).unwrap();
    for i in 0..25 {
        assert_eq!(log.append(&entry(i)).unwrap().seq, i as u64 + 1);
    }
    let stats = log.stats();
    assert_eq!(
        (stats.appends, stats.fsyncs, stats.batches),
        (25, 25, 25),
        "{stats:?}"
    );
}

#[test]
fn concurrent_appenders_get_their_own_receipts_and_one_chain() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("audit.jsonl");
    let log = Arc::new(FileAuditLog::open(&path).unwrap());
    let threads: Vec<_> = (0..16)
        .map(|t| {
            let log = Arc::clone(&log);
            std::thread::spawn(move || {
                (0..40)
                    .map(|i| {
                        let receipt = log.append(&entry(t * 1000 + i)).unwrap();
                        (receipt.seq, receipt.sha256, t * 1000 + i)
                    })
                    .collect::<Vec<_>>()
            })
        })
        .collect();
    let receipts: Vec<_> = threads
        .into_iter()
        .flat_map(|h| h.join().unwrap())
        .collect();
    let report = verify_file(&path).unwrap();
    assert!(report.is_intact(), "{report}");
    assert_eq!(report.records, 640);
    let seqs: BTreeSet<u64> = receipts.iter().map(|r| r.0).collect();
    assert_eq!(seqs, (1..=640).collect(), "every seq handed out once");
    let records: Vec<_> = read_records(&path).unwrap().map(Result::unwrap).collect();
    for (seq, sha, i) in &receipts {
        let record = &records[*seq as usize - 1];
        assert_eq!(record["seq"], *seq);
        assert_eq!(record["sha256"], sha.to_hex(), "receipt names its record");
        assert_eq!(record["request_id"], format!("req-{i:05}"));
    }
    let stats = log.stats();
    assert_eq!(stats.appends, 640);
    assert!(stats.fsyncs <= stats.appends, "{stats:?}");
}

/// Deterministic batching: the first leader is held at the mid-batch hook until the 15 other
/// appenders are queued, so the second batch carries all of them with one write and one fsync.
#[cfg(feature = "fault-injection")]
#[test]
fn waiting_appenders_share_one_fsync() {
    use std::sync::OnceLock;
    use std::sync::atomic::{AtomicBool, Ordering};
    use toolgate_audit::AuditConfig;

    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("audit.jsonl");
    let log_cell: Arc<OnceLock<Arc<FileAuditLog>>> = Arc::new(OnceLock::new());
    let first = Arc::new(AtomicBool::new(true));
    let hook_log = Arc::clone(&log_cell);
    let hook_first = Arc::clone(&first);
    let config = AuditConfig::new(&path).fault_hook(Arc::new(move |_| {
        if hook_first.swap(false, Ordering::SeqCst) {
            let log = hook_log.get().unwrap();
            // Wait (yielding) until every other appender is queued behind this batch.
            while log.stats().queued < 15 {
                std::thread::yield_now();
            }
        }
    }));
    let log = Arc::new(FileAuditLog::open_with(config).unwrap());
    log_cell.set(Arc::clone(&log)).unwrap();
    let leader = {
        let log = Arc::clone(&log);
        std::thread::spawn(move || log.append(&entry(0)).unwrap())
    };
    // Start the others only once the leader is inside its batch (the hook has begun waiting).
    while first.load(Ordering::SeqCst) {
        std::thread::yield_now();
    }
    let followers: Vec<_> = (1..16)
        .map(|i| {
            let log = Arc::clone(&log);
            std::thread::spawn(move || log.append(&entry(i)).unwrap())
        })
        .collect();
    let mut seqs = vec![leader.join().unwrap().seq];
    seqs.extend(followers.into_iter().map(|h| h.join().unwrap().seq));
    seqs.sort_unstable();
    assert_eq!(seqs, (1..=16).collect::<Vec<_>>());
    let stats = log.stats();
    // Two batches; with the hook each batch fsyncs twice (half, then all).
    assert_eq!(
        (stats.appends, stats.batches, stats.fsyncs),
        (16, 2, 4),
        "{stats:?}"
    );
    assert!(stats.fsyncs < stats.appends);
    assert!(verify_file(&path).unwrap().is_intact());
}
