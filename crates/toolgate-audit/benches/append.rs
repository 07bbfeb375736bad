//! Append latency on a small and a large log: shows that open and append do not grow with the log.
//!
//! Run with `cargo bench -p toolgate-audit`. Each append includes its fsync, so the numbers mostly
//! measure the disk; what matters is that the 1,000- and 100,000-record rows look alike.

// A bench reports to stdout by design.
#![allow(clippy::print_stdout)]
// Set-up failures in a bench should stop it loudly with the cause.
#![allow(clippy::unwrap_used)]

use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::Path;
use std::time::{Duration, Instant};

use serde_json::json;
use toolgate_audit::{AuditEntry, AuditSink, Decision, FileAuditLog, verify_file};
use toolgate_canon::{Sha256Digest, canonical_value};

const TIMED_APPENDS: usize = 200;

/// Writes a valid chain of `n` records without fsync (set-up only, so it is fast).
fn build_log(path: &Path, n: usize) {
    let mut out = BufWriter::new(File::create(path).unwrap());
    let mut prev = "0".repeat(64);
    let args_digest = Sha256Digest::of(b"{}").to_hex();
    for i in 0..n {
        let mut record = json!({
            "ts": 1_767_225_600_000_000_000u64 + i as u64 * 1_000_000,
            "request_id": format!("bench-{i:08}"),
            "method": "tools/call",
            "name": "write_note",
            "decision": "allow",
            "outcome": "committed",
            "args_digest": args_digest,
            "prev_sha256": prev,
        });
        let sha = Sha256Digest::of_parts(&[prev.as_bytes(), &canonical_value(&record)]).to_hex();
        record["sha256"] = sha.clone().into();
        out.write_all(&canonical_value(&record)).unwrap();
        out.write_all(b"\n").unwrap();
        prev = sha;
    }
    out.into_inner().unwrap().sync_all().unwrap();
}

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    let index = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[index.min(sorted.len() - 1)]
}

fn run(records: usize, appends: usize) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("audit.jsonl");
    build_log(&path, records);
    let size = std::fs::metadata(&path).unwrap().len();

    let started = Instant::now();
    let log = FileAuditLog::open(&path).unwrap();
    let open = started.elapsed();

    let mut samples = Vec::with_capacity(appends);
    for i in 0..appends {
        let entry = AuditEntry::tool_call(
            format!("timed-{i:04}"),
            "write_note",
            Decision::Allow,
            "committed",
            Sha256Digest::of(b"{}"),
        );
        let started = Instant::now();
        log.append(&entry).unwrap();
        samples.push(started.elapsed());
    }
    samples.sort();
    let report = verify_file(&path).unwrap();
    assert!(report.is_intact(), "{report}");
    assert_eq!(report.records, (records + appends) as u64);
    println!(
        "log of {records:>7} records ({:>6.1} MiB): open {:>9.1?}  append median {:>9.1?}  p99 {:>9.1?}  ({appends} appends, fsync each)",
        size as f64 / (1024.0 * 1024.0),
        open,
        percentile(&samples, 0.5),
        percentile(&samples, 0.99),
    );
}

fn main() {
    // `cargo bench` passes `--bench`; `cargo test --all-targets` runs this binary without it, and
    // then a short smoke run keeps the suite fast while still exercising the code.
    if std::env::args().any(|a| a == "--bench") {
        run(1_000, TIMED_APPENDS);
        run(100_000, TIMED_APPENDS);
    } else {
        run(100, 5);
    }
}
