//! Durability under SIGKILL: a child appends from 16 threads and prints the `seq` of every
//! acknowledged append; the parent kills it at a random acknowledgement, 20 times on the same
//! log. Every acknowledged record must be in the log after reopening, and the chain must verify.

#![allow(clippy::unwrap_used)]

use std::io::{BufRead, BufReader, Write};
use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::Arc;

use toolgate_audit::{
    AuditConfig, AuditDecision, AuditEntry, AuditSink, FileAuditLog, HmacKey, Outcome,
    VerifyOptions, read_records, verify,
};
use toolgate_canon::Sha256Digest;

const CHILD_LOG: &str = "TOOLGATE_AUDIT_TEST_SIGKILL_LOG";
const ROUNDS: usize = 20;
const THREADS: usize = 16;

fn key() -> HmacKey {
    HmacKey::new(b"sigkill test checkpoint key (test only)").unwrap()
}

fn config(log: &Path) -> AuditConfig {
    AuditConfig::new(log)
        .checkpoint_key(key())
        .checkpoint_every(50)
}

/// The child: append forever from 16 threads, printing each acknowledged seq on its own line.
fn run_child(log: &Path) {
    let audit = Arc::new(FileAuditLog::open_with(config(log)).unwrap());
    let threads: Vec<_> = (0..THREADS)
        .map(|t| {
            let audit = Arc::clone(&audit);
            std::thread::spawn(move || {
                for i in 0.. {
                    let entry = AuditEntry::tool_call(
                        format!("t{t}-{i}"),
                        "write_note",
                        AuditDecision::Allow,
                        Outcome::Committed,
                        Sha256Digest::of(b"{}"),
                    );
                    let receipt = audit.append(&entry).unwrap();
                    // One write per line under the stdout lock, flushed: the parent may read it
                    // only after the record is durable.
                    let mut out = std::io::stdout().lock();
                    writeln!(out, "{}", receipt.seq).unwrap();
                    out.flush().unwrap();
                }
            })
        })
        .collect();
    for thread in threads {
        thread.join().unwrap();
    }
}

/// A small deterministic generator, so the kill points are reproducible.
struct XorShift(u64);

impl XorShift {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
}

#[test]
fn acknowledged_appends_survive_sigkill() {
    if let Ok(log) = std::env::var(CHILD_LOG) {
        run_child(Path::new(&log));
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("audit.jsonl");
    let exe = std::env::current_exe().unwrap();
    let mut rng = XorShift(0x0bad_5eed_0000_0001);
    let mut acked_total = 0usize;
    for round in 0..ROUNDS {
        let kill_after = 1 + (rng.next() % 120) as usize;
        let mut child = Command::new(&exe)
            .args([
                "--exact",
                "acknowledged_appends_survive_sigkill",
                "--nocapture",
            ])
            .env(CHILD_LOG, &log)
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
        let mut acked = Vec::new();
        // Read acknowledgements until the chosen one, then SIGKILL (Child::kill on Unix).
        while acked.len() < kill_after {
            let line = lines.next().expect("child exited early").unwrap();
            // The test harness may print its own lines; only numbers are acknowledgements.
            if let Ok(seq) = line.trim().parse::<u64>() {
                acked.push(seq);
            }
        }
        child.kill().unwrap();
        // Acknowledgements already in the pipe count too: they were printed after durability.
        for line in lines.map_while(Result::ok) {
            if let Ok(seq) = line.trim().parse::<u64>() {
                acked.push(seq);
            }
        }
        child.wait().unwrap();
        acked_total += acked.len();

        // Reopen (repairing a torn tail if the kill cut a batch), then check.
        let reopened = FileAuditLog::open_with(config(&log)).unwrap();
        let report = verify(&VerifyOptions::new(&log).checkpoint_key(key())).unwrap();
        assert!(report.is_intact(), "round {round}: {report}");
        let present: std::collections::HashSet<u64> = read_records(&log)
            .unwrap()
            .map(|r| r.unwrap()["seq"].as_u64().unwrap())
            .collect();
        for seq in &acked {
            assert!(
                present.contains(seq),
                "round {round}: acknowledged seq {seq} lost"
            );
        }
        assert_eq!(reopened.seq(), report.records, "round {round}");
        drop(reopened);
    }
    assert!(acked_total >= ROUNDS, "{acked_total}");
}
