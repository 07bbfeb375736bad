//! Throughput of the reference server over stdio, measured the way a client sees it: a real child
//! process, raw JSON-RPC lines on stdin/stdout, the 2026-07-28 flow (`server/discover`, then
//! `tools/call` with per-request `_meta`), one request in flight at a time.
//!
//! Run with `cargo bench -p toolgate-server --bench stdio`. Every `write_note` appends an audit
//! record and commits a note, each with its fsyncs, so the numbers mostly measure the disk; the
//! replay row shows the cost of a call that finds its note already committed.
//!
//! `STDIO_BENCH_SERVER="/path/to/python /path/to/server.py"` drives another server with the same
//! tools instead (the reference article's Python server, for comparison): the command is split
//! on whitespace, and the ledger directory and policy are passed the article's way, as
//! `LEDGER_DIR` and `POLICY_PATH`, rather than as flags. `STDIO_BENCH_NOTES` changes the number of
//! notes (default 2000).

// A bench reports to stdout by design.
#![allow(clippy::print_stdout)]
// Set-up failures in a bench should stop it loudly with the cause.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::process::Command;
use std::time::{Duration, Instant};

use common::Peer;
use serde_json::{Value, json};

/// Sequential write_note calls (and as many replays), unless `STDIO_BENCH_NOTES` says otherwise.
const NOTES: usize = 2000;
/// Sequential read_ledger calls once all notes are written (each lists every note).
const READS: usize = 50;

/// The server under test on a ledger directory: `STDIO_BENCH_SERVER`, else this package's build.
fn spawn(ledger: &std::path::Path) -> Peer {
    let policy = concat!(env!("CARGO_MANIFEST_DIR"), "/../../fixtures/policy.json");
    let command = match std::env::var("STDIO_BENCH_SERVER") {
        Ok(line) => {
            let mut words = line.split_whitespace();
            let mut command = Command::new(words.next().expect("STDIO_BENCH_SERVER is empty"));
            command
                .args(words)
                .env("LEDGER_DIR", ledger)
                .env("POLICY_PATH", policy);
            command
        }
        Err(_) => {
            let mut command = Command::new(env!("CARGO_BIN_EXE_toolgate-server"));
            command
                .arg("--policy")
                .arg(policy)
                .arg("--ledger")
                .arg(ledger);
            command
        }
    };
    Peer::spawn(command)
}

/// A `/proc/<pid>/status` field of the server process in KiB (`VmHWM`: peak resident set).
fn status_kib(server: &Peer, field: &str) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{}/status", server.pid()))
        .expect("/proc is readable (Linux)");
    status
        .lines()
        .find_map(|line| line.strip_prefix(field)?.strip_prefix(':'))
        .and_then(|rest| rest.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap_or_else(|| panic!("{field} is present"))
}

/// Resident set now and at its peak, and the thread count: where the memory goes by stage.
fn memory_at(server: &Peer, stage: &str) -> String {
    let threads = std::fs::read_to_string(format!("/proc/{}/status", server.pid()))
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("Threads:"))
                .map(|t| t.trim().to_owned())
        })
        .unwrap_or_default();
    format!(
        "memory {stage:<15} VmRSS {:>6} KiB (anon {:>6}, file {:>6})  VmHWM {:>6} KiB  threads {threads}",
        status_kib(server, "VmRSS"),
        status_kib(server, "RssAnon"),
        status_kib(server, "RssFile"),
        status_kib(server, "VmHWM"),
    )
}

fn args(i: usize) -> Value {
    json!({"request_id": format!("bench-{i:08}"), "text": format!("note number {i}")})
}

fn row(name: &str, calls: usize, elapsed: Duration) {
    let per_second = calls as f64 / elapsed.as_secs_f64();
    let mean_us = elapsed.as_secs_f64() * 1e6 / calls as f64;
    println!("| {name:<24} | {calls:>6} | {per_second:>10.0} | {mean_us:>10.0} |");
}

fn main() {
    let notes = std::env::var("STDIO_BENCH_NOTES")
        .map(|n| n.parse().expect("STDIO_BENCH_NOTES is a number"))
        .unwrap_or(NOTES);
    let ledger = tempfile::tempdir().unwrap();
    let mut server = spawn(ledger.path());
    server.discover();

    let name = std::env::var("STDIO_BENCH_SERVER").unwrap_or_else(|_| "toolgate-server".into());
    println!("{name} over stdio, one request in flight, 2026-07-28 flow");
    let mut memory = vec![memory_at(&server, "after discover")];
    println!(
        "| {:<24} | {:>6} | {:>10} | {:>10} |",
        "operation", "calls", "calls/s", "mean us"
    );
    println!("|{:-<26}|{:->8}|{:->12}|{:->12}|", "", "", "", "");

    let start = Instant::now();
    for i in 0..notes {
        let result = server.call("write_note", args(i));
        assert_eq!(result["structuredContent"]["status"], "committed");
    }
    row("write_note (committed)", notes, start.elapsed());
    memory.push(memory_at(&server, "after writes"));

    let start = Instant::now();
    for i in 0..notes {
        let result = server.call("write_note", args(i));
        assert_eq!(result["structuredContent"]["status"], "replay");
    }
    row("write_note (replay)", notes, start.elapsed());
    memory.push(memory_at(&server, "after replays"));

    let start = Instant::now();
    for _ in 0..READS {
        let result = server.call("read_ledger", json!({}));
        assert_eq!(
            result["structuredContent"]["notes"]
                .as_array()
                .map(Vec::len),
            Some(notes)
        );
    }
    row(
        &format!("read_ledger ({notes} notes)"),
        READS,
        start.elapsed(),
    );

    memory.push(memory_at(&server, "after reads"));
    for line in &memory {
        println!("{line}");
    }
    let peak = status_kib(&server, "VmHWM");
    println!(
        "server peak RSS (VmHWM): {peak} KiB ({:.1} MiB)",
        peak as f64 / 1024.0
    );
    server.close();
}
