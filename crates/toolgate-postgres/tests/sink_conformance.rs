//! One conformance suite for every audit sink: the same cases against the file log, the
//! in-memory one and the PostgreSQL one (a fresh database of a real
//! PostgreSQL cluster this test process starts).
//!
//! What every sink must do: chain records with consecutive `seq` from 1, report the head it
//! stores, and export the chain as `audit.jsonl` bytes that the verifier (and so any independent
//! verifier) accepts, with concurrent appenders too.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::sync::Arc;
use std::thread;

use serde_json::Value;
use toolgate_audit::{
    AuditDecision, AuditEntry, AuditSink, ChainHead, FileAuditLog, MemoryAuditLog, Outcome,
    Sha256Digest, verify_reader,
};

struct Subject {
    name: &'static str,
    sink: Arc<dyn AuditSink>,
    _dir: Option<tempfile::TempDir>,
}

fn sinks() -> Vec<Subject> {
    let dir = tempfile::tempdir().unwrap();
    let file = FileAuditLog::open(dir.path().join("audit.jsonl")).unwrap();
    vec![
        Subject {
            name: "file",
            sink: Arc::new(file),
            _dir: Some(dir),
        },
        Subject {
            name: "memory",
            sink: Arc::new(MemoryAuditLog::new()),
            _dir: None,
        },
        Subject {
            name: "postgres",
            sink: {
                let url = toolgate_pgtest::PgCluster::shared()
                    .unwrap()
                    .create_database("audit")
                    .unwrap();
                let store = toolgate_postgres::PgStore::connect(&url).unwrap();
                Arc::new(toolgate_postgres::PgAuditLog::open(store).unwrap())
            },
            _dir: None,
        },
    ]
}

fn entry(i: u64) -> AuditEntry {
    AuditEntry::tool_call(
        format!("req-{i}"),
        "write_note",
        if i.is_multiple_of(3) {
            AuditDecision::Deny
        } else {
            AuditDecision::Allow
        },
        if i.is_multiple_of(3) {
            Outcome::NotExecuted
        } else {
            Outcome::Committed
        },
        Sha256Digest::of(&i.to_be_bytes()),
    )
    .with_reason(toolgate_audit::Reason::Note(
        "conformance \u{e9}\u{1F600}".to_owned(),
    ))
}

fn exported(sink: &dyn AuditSink) -> (u64, Vec<u8>) {
    let mut bytes = Vec::new();
    let records = sink.export(&mut bytes).unwrap();
    (records, bytes)
}

#[test]
fn an_empty_sink_has_a_zero_head_and_exports_nothing() {
    for subject in sinks() {
        assert_eq!(
            subject.sink.head().unwrap(),
            ChainHead {
                seq: 0,
                sha256: Sha256Digest::ZERO
            },
            "{}",
            subject.name
        );
        assert_eq!(exported(subject.sink.as_ref()), (0, Vec::new()));
    }
}

#[test]
fn appends_chain_with_consecutive_seq_and_the_export_verifies() {
    for subject in sinks() {
        let (name, sink) = (subject.name, subject.sink.as_ref());
        let mut last = None;
        for i in 1..=25 {
            let receipt = sink.append(&entry(i)).unwrap();
            assert_eq!(receipt.seq, i, "{name}");
            last = Some(receipt);
        }
        let last = last.unwrap();
        assert_eq!(
            sink.head().unwrap(),
            ChainHead {
                seq: 25,
                sha256: last.sha256
            },
            "{name}"
        );
        let (records, bytes) = exported(sink);
        assert_eq!(records, 25, "{name}");
        let report = verify_reader(bytes.as_slice()).unwrap();
        assert!(report.is_intact(), "{name}: {report}");
        assert_eq!(report.records, 25, "{name}");
        // Each line is the canonical record, carrying what was appended.
        for (i, line) in bytes
            .split(|&b| b == b'\n')
            .filter(|l| !l.is_empty())
            .enumerate()
        {
            let record: Value = serde_json::from_slice(line).unwrap();
            let n = i as u64 + 1;
            assert_eq!(record["seq"], n, "{name}");
            assert_eq!(record["request_id"], format!("req-{n}"), "{name}");
            assert_eq!(record["outcome"], entry(n).outcome.as_str(), "{name}");
            assert_eq!(toolgate_canon::canonical_value(&record), line, "{name}");
        }
    }
}

#[test]
fn concurrent_appenders_leave_one_chain_without_gaps() {
    for subject in sinks() {
        let name = subject.name;
        let handles: Vec<_> = (0..8)
            .map(|t| {
                let sink = Arc::clone(&subject.sink);
                thread::spawn(move || {
                    (0..20)
                        .map(|i| sink.append(&entry(t * 100 + i)).unwrap().seq)
                        .collect::<Vec<u64>>()
                })
            })
            .collect();
        let mut seqs: Vec<u64> = handles
            .into_iter()
            .flat_map(|h| h.join().unwrap())
            .collect();
        seqs.sort_unstable();
        assert_eq!(seqs, (1..=160).collect::<Vec<u64>>(), "{name}");
        let (records, bytes) = exported(subject.sink.as_ref());
        assert_eq!(records, 160, "{name}");
        assert!(
            verify_reader(bytes.as_slice()).unwrap().is_intact(),
            "{name}"
        );
    }
}

#[test]
fn a_field_over_its_limit_is_recorded_as_digest_and_length_and_the_chain_goes_on() {
    for subject in sinks() {
        let (name, sink) = (subject.name, subject.sink.as_ref());
        sink.append(&entry(1)).unwrap();
        let huge = entry(2).with_reason(toolgate_audit::Reason::Note(
            "x".repeat(toolgate_audit::MAX_LINE_BYTES),
        ));
        assert_eq!(sink.append(&huge).unwrap().seq, 2, "{name}");
        assert_eq!(sink.append(&entry(3)).unwrap().seq, 3, "{name}");
        let (records, bytes) = exported(sink);
        assert_eq!(records, 3, "{name}");
        let second: serde_json::Value =
            serde_json::from_slice(bytes.split(|&b| b == b'\n').nth(1).unwrap()).unwrap();
        assert_eq!(
            second["reason_bytes"],
            toolgate_audit::MAX_LINE_BYTES,
            "{name}"
        );
        assert!(
            verify_reader(bytes.as_slice()).unwrap().is_intact(),
            "{name}"
        );
    }
}

/// The file log shared by two handles (two processes behave the same): each one's head and
/// export include the other's appends.
#[test]
fn the_file_head_and_export_include_other_writers() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("audit.jsonl");
    let a = FileAuditLog::open(&path).unwrap();
    let b = FileAuditLog::open(&path).unwrap();
    a.append(&entry(1)).unwrap();
    let last = b.append(&entry(2)).unwrap();
    let head = AuditSink::head(&a).unwrap();
    assert_eq!((head.seq, head.sha256), (2, last.sha256));
    let (records, bytes) = exported(&a);
    assert_eq!(records, 2);
    assert!(verify_reader(bytes.as_slice()).unwrap().is_intact());
}

/// The sinks that keep signed checkpoints: the file log with a key, and PostgreSQL with one.
struct Signed {
    name: &'static str,
    sink: Arc<dyn AuditSink>,
    _dir: Option<tempfile::TempDir>,
}

fn signed_sinks(key: &toolgate_canon::HmacKey, every: u64) -> Vec<Signed> {
    let dir = tempfile::tempdir().unwrap();
    let file = Arc::new(
        FileAuditLog::open_with(
            toolgate_audit::AuditConfig::new(dir.path().join("audit.jsonl"))
                .checkpoint_key(key.clone())
                .checkpoint_every(every),
        )
        .unwrap(),
    );
    #[allow(unused_mut)]
    let mut sinks = vec![Signed {
        name: "file",
        sink: file,
        _dir: Some(dir),
    }];
    {
        let url = toolgate_pgtest::PgCluster::shared()
            .unwrap()
            .create_database("audit_signed")
            .unwrap();
        let store = toolgate_postgres::PgStore::connect(&url).unwrap();
        let log = Arc::new(
            toolgate_postgres::PgAuditLog::open(store)
                .unwrap()
                .with_checkpoints(key.clone(), every),
        );
        sinks.push(Signed {
            name: "postgres",
            sink: log,
            _dir: None,
        });
    }
    sinks
}

#[test]
fn signed_checkpoints_are_exported_and_verify_in_place() {
    let key = toolgate_canon::HmacKey::new(&[5; 32]).unwrap();
    let other = toolgate_canon::HmacKey::new(&[6; 32]).unwrap();
    for subject in signed_sinks(&key, 3) {
        let (name, sink) = (subject.name, subject.sink.as_ref());
        for i in 1..=7 {
            sink.append(&entry(i)).unwrap();
        }
        // Every 3 records, then on demand (AuditSink::checkpoint) for the last one, once.
        let sealed = sink.checkpoint().unwrap();
        assert_eq!(sealed.map(|c| c.count), Some(7), "{name}");
        assert!(
            sink.checkpoint().unwrap().is_none(),
            "{name}: nothing new to seal"
        );
        let mut lines = Vec::new();
        assert_eq!(sink.export_checkpoints(&mut lines).unwrap(), 3, "{name}");
        let counts: Vec<u64> = String::from_utf8(lines)
            .unwrap()
            .lines()
            .map(|line| {
                serde_json::from_str::<Value>(line).unwrap()["count"]
                    .as_u64()
                    .unwrap()
            })
            .collect();
        assert_eq!(counts, [3, 6, 7], "{name}");

        let report = toolgate_audit::verify_sink_with(sink, Some(&key)).unwrap();
        assert!(report.is_intact(), "{name}: {report}");
        assert_eq!(report.checkpoints_verified, 3, "{name}");
        assert_eq!(report.records_after_checkpoint, Some(0), "{name}");
        let forged = toolgate_audit::verify_sink_with(sink, Some(&other)).unwrap();
        assert_eq!(
            forged.problem.map(|p| p.kind),
            Some(toolgate_audit::ProblemKind::BadCheckpointSignature),
            "{name}"
        );
        // Another record: the report says it is not covered yet.
        sink.append(&entry(8)).unwrap();
        let report = toolgate_audit::verify_sink_with(sink, Some(&key)).unwrap();
        assert_eq!(report.records_after_checkpoint, Some(1), "{name}");
    }
}

#[test]
fn a_key_without_checkpoints_warns() {
    let key = toolgate_canon::HmacKey::new(&[5; 32]).unwrap();
    for subject in sinks() {
        subject.sink.append(&entry(1)).unwrap();
        // A sink without a key seals nothing.
        assert!(
            subject.sink.checkpoint().unwrap().is_none(),
            "{}",
            subject.name
        );
        let report = toolgate_audit::verify_sink_with(subject.sink.as_ref(), Some(&key)).unwrap();
        assert!(report.problem.is_none(), "{}: {report}", subject.name);
        assert_eq!(report.warnings.len(), 1, "{}: {report}", subject.name);
    }
}

/// Someone who can write the database cuts records off the end and moves the head row back with
/// them: a well-formed shorter chain that only a signed checkpoint exposes.
#[test]
fn a_database_chain_cut_with_its_head_is_caught_by_a_checkpoint() {
    let cluster = toolgate_pgtest::PgCluster::shared().unwrap();
    let url = cluster.create_database("audit_cut").unwrap();
    let db = url.rsplit('/').next().unwrap().to_owned();
    let key = toolgate_canon::HmacKey::new(&[9; 32]).unwrap();
    let store = toolgate_postgres::PgStore::connect(&url).unwrap();
    let log = toolgate_postgres::PgAuditLog::open(store)
        .unwrap()
        .with_checkpoints(key.clone(), 4);
    for i in 1..=5 {
        log.append(&entry(i)).unwrap();
    }
    log.checkpoint().unwrap();
    cluster
        .psql(
            &db,
            "DELETE FROM toolgate_audit WHERE seq > 3;
             UPDATE toolgate_audit_head SET seq = 3,
                 sha256 = (SELECT sha256 FROM toolgate_audit WHERE seq = 3);",
        )
        .unwrap();
    let unsigned = toolgate_audit::verify_sink(&log).unwrap();
    assert!(
        unsigned.is_intact(),
        "without the key the cut is invisible: {unsigned}"
    );
    let report = toolgate_audit::verify_sink_with(&log, Some(&key)).unwrap();
    assert_eq!(
        report.problem.map(|p| p.kind),
        Some(toolgate_audit::ProblemKind::TruncatedBeforeCheckpoint)
    );
    // An edited checkpoint line is a bad signature.
    cluster
        .psql(
            &db,
            "UPDATE toolgate_audit_checkpoints SET line = replace(line, '\"count\":4', '\"count\":3') WHERE count = 4",
        )
        .unwrap();
    let report = toolgate_audit::verify_sink_with(&log, Some(&key)).unwrap();
    assert_eq!(
        report.problem.map(|p| p.kind),
        Some(toolgate_audit::ProblemKind::BadCheckpointSignature)
    );
}

/// Two replicas' logs on one database: each starts sealing on the head it last saw, which the
/// other keeps moving; alternating and concurrent appends still leave one chain without gaps.
#[test]
fn two_database_replicas_append_to_one_chain() {
    let url = toolgate_pgtest::PgCluster::shared()
        .unwrap()
        .create_database("audit_two")
        .unwrap();
    let replica = || {
        let store = toolgate_postgres::PgStore::connect(&url).unwrap();
        Arc::new(toolgate_postgres::PgAuditLog::open(store).unwrap())
    };
    let (a, b) = (replica(), replica());
    for i in 0..10 {
        let receipt = if i % 2 == 0 { &a } else { &b }.append(&entry(i)).unwrap();
        assert_eq!(receipt.seq, i + 1);
    }
    let handles: Vec<_> = [a.clone(), b.clone()]
        .into_iter()
        .enumerate()
        .map(|(n, log)| {
            thread::spawn(move || {
                for i in 0..100 {
                    log.append(&entry(1000 * (n as u64 + 1) + i)).unwrap();
                }
            })
        })
        .collect();
    for handle in handles {
        handle.join().unwrap();
    }
    let (records, bytes) = exported(a.as_ref());
    assert_eq!(records, 210);
    let report = verify_reader(bytes.as_slice()).unwrap();
    assert!(report.is_intact(), "{report}");
    assert_eq!(b.head().unwrap().seq, 210);
    assert!(toolgate_audit::verify_sink(b.as_ref()).unwrap().is_intact());
}
