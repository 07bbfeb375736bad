//! Audit log benchmarks: append latency on a small and a huge log (flat, because the head lives in
//! memory), group-commit throughput with 1 to 64 concurrent appenders next to the machine's raw
//! fsync rate, and verify throughput next to `sha256sum` of the same file.
//!
//! Run with `cargo bench -p toolgate-audit`. The disk dominates every append number, so each
//! table prints the raw fsync rate measured in the same run, and the load average, for context.

// A bench reports to stdout by design.
#![allow(clippy::print_stdout)]
// Set-up failures in a bench should stop it loudly with the cause.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::json;
use toolgate_audit::{
    AuditDecision, AuditEntry, AuditSink, FileAuditLog, Outcome, VerifyOptions, verify, verify_file,
};
use toolgate_canon::{Sha256Digest, canonical_value};

/// Writes a valid chain of `n` records without fsync (set-up only, so it is fast).
fn build_log(path: &Path, n: usize) {
    let mut out = BufWriter::with_capacity(1 << 20, File::create(path).unwrap());
    let mut prev = "0".repeat(64);
    let args_digest = Sha256Digest::of(b"{}").to_hex();
    let policy = Sha256Digest::of(b"policy").to_hex();
    for i in 0..n {
        let mut record = json!({
            "ts": 1_767_225_600_000_000_000u64 + i as u64 * 1_000_000,
            "seq": i as u64 + 1,
            "request_id": format!("bench-{i:08}"),
            "method": "tools/call",
            "name": "write_note",
            "decision": "allow",
            "outcome": "committed",
            "args_digest": args_digest,
            "policy_digest": policy,
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

fn entry(i: usize) -> AuditEntry {
    AuditEntry::tool_call(
        format!("timed-{i:06}"),
        "write_note",
        AuditDecision::Allow,
        Outcome::Committed,
        Sha256Digest::of(b"{}"),
    )
    .with_policy_digest(Sha256Digest::of(b"policy"))
}

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    let index = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[index.min(sorted.len() - 1)]
}

fn load_average() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .map(|s| s.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
        .unwrap_or_else(|_| "unknown".into())
}

/// fsyncs per second of a small write + fdatasync, the ceiling for one-record-per-fsync appends.
fn raw_fsync_rate(n: usize) -> f64 {
    let dir = tempfile::tempdir().unwrap();
    let mut file = File::create(dir.path().join("probe")).unwrap();
    let started = Instant::now();
    for _ in 0..n {
        file.write_all(&[b'x'; 300]).unwrap();
        file.sync_data().unwrap();
    }
    n as f64 / started.elapsed().as_secs_f64()
}

fn append_latency(records: usize, appends: usize) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("audit.jsonl");
    let started = Instant::now();
    build_log(&path, records);
    let built = started.elapsed();
    let size = std::fs::metadata(&path).unwrap().len();

    let started = Instant::now();
    let log = FileAuditLog::open(&path).unwrap();
    let open = started.elapsed();

    let mut samples = Vec::with_capacity(appends);
    for i in 0..appends {
        let started = Instant::now();
        log.append(&entry(i)).unwrap();
        samples.push(started.elapsed());
    }
    samples.sort();
    assert_eq!(log.seq(), (records + appends) as u64);
    println!(
        "append on a log of {records:>8} records ({:>6.1} MiB, built in {built:.1?}): open {:>8.1?}  append median {:>8.1?}  p99 {:>8.1?}  ({appends} appends, fsync each)",
        size as f64 / (1024.0 * 1024.0),
        open,
        percentile(&samples, 0.5),
        percentile(&samples, 0.99),
    );
    if records <= 10_000 {
        let report = verify_file(&path).unwrap();
        assert!(report.is_intact(), "{report}");
    }
}

fn concurrency(threads: usize, total: usize, raw: f64) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("audit.jsonl");
    let log = Arc::new(FileAuditLog::open(&path).unwrap());
    let per_thread = total.div_ceil(threads);
    let started = Instant::now();
    let handles: Vec<_> = (0..threads)
        .map(|t| {
            let log = Arc::clone(&log);
            std::thread::spawn(move || {
                for i in 0..per_thread {
                    log.append(&entry(t * 1_000_000 + i)).unwrap();
                }
            })
        })
        .collect();
    for handle in handles {
        handle.join().unwrap();
    }
    let elapsed = started.elapsed().as_secs_f64();
    let stats = log.stats();
    let records = stats.appends as f64;
    println!(
        "{threads:>3} appenders: {:>8.0} records/s  {:>5.3} fsyncs/record  {:>6.1} records/batch  (raw fsync rate {raw:.0}/s; {} records)",
        records / elapsed,
        stats.fsyncs as f64 / records,
        records / stats.batches as f64,
        stats.appends,
    );
    assert!(verify_file(&path).unwrap().is_intact());
}

fn verify_throughput(target_bytes: u64) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("audit.jsonl");
    // About 470 bytes per record.
    build_log(&path, (target_bytes / 470) as usize);
    let size = std::fs::metadata(&path).unwrap().len() as f64;
    let mib = size / (1024.0 * 1024.0);

    // Warm the page cache for both readers alike.
    let _ = std::fs::read(&path).unwrap();
    let started = Instant::now();
    let report = verify(&VerifyOptions::new(&path)).unwrap();
    let ours = started.elapsed().as_secs_f64();
    assert!(report.is_intact(), "{report}");

    let started = Instant::now();
    let sha = std::process::Command::new("sha256sum").arg(&path).output();
    let theirs = started.elapsed().as_secs_f64();
    match sha {
        Ok(out) if out.status.success() => println!(
            "verify {mib:.1} MiB ({} records): {:.1} MB/s; sha256sum of the same file: {:.1} MB/s (ratio {:.2}x)",
            report.records,
            size / 1e6 / ours,
            size / 1e6 / theirs,
            ours / theirs,
        ),
        _ => println!(
            "verify {mib:.1} MiB ({} records): {:.1} MB/s; sha256sum not available",
            report.records,
            size / 1e6 / ours
        ),
    }
}

fn main() {
    // `cargo bench` passes `--bench`; `cargo test --all-targets` runs this binary without it, and
    // then a short smoke run keeps the suite fast while still exercising the code.
    let full = std::env::args().any(|a| a == "--bench");
    // `cargo bench --bench append -- verify` runs only the verify comparison.
    let only_verify = std::env::args().skip(1).any(|a| a == "verify");
    println!("load average at start: {}", load_average());
    let raw = raw_fsync_rate(if full { 200 } else { 10 });
    println!("raw fsync rate (300-byte write + fdatasync): {raw:.0}/s");
    if full && only_verify {
        verify_throughput(100 * 1000 * 1000);
    } else if full {
        verify_throughput(100 * 1000 * 1000);
        append_latency(1_000, 200);
        append_latency(1_000_000, 200);
        for threads in [1, 4, 16, 64] {
            concurrency(threads, 2_000, raw);
        }
    } else {
        verify_throughput(200_000);
        append_latency(100, 5);
        for threads in [1, 4] {
            concurrency(threads, 40, raw);
        }
    }
    println!("load average at end: {}", load_average());
}
