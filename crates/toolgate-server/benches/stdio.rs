//! Throughput of the reference server over stdio, measured the way a client sees it: a real child
//! process, raw JSON-RPC lines on stdin/stdout, the 2026-07-28 flow (`server/discover`, then
//! `tools/call` with per-request `_meta`), one request in flight at a time.
//!
//! Run with `cargo bench -p toolgate-server --bench stdio`. Every `write_note` appends an audit
//! record and commits a note, each with its fsyncs, so the numbers mostly measure the disk; the
//! replay row shows the cost of a call that finds its note already committed.

// A bench reports to stdout by design.
#![allow(clippy::print_stdout)]
// Set-up failures in a bench should stop it loudly with the cause.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::io::{BufRead, BufReader, Write};
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::{Value, json};

/// Sequential write_note calls (and as many replays).
const NOTES: usize = 2000;
/// Sequential read_ledger calls once all notes are written (each lists every note).
const READS: usize = 50;

struct Server {
    child: Child,
    stdin: ChildStdin,
    stdout: BufReader<ChildStdout>,
    next_id: u64,
}

fn meta() -> Value {
    json!({
        "io.modelcontextprotocol/protocolVersion": "2026-07-28",
        "io.modelcontextprotocol/clientCapabilities": {}
    })
}

impl Server {
    fn spawn(ledger: &std::path::Path) -> Self {
        let policy = concat!(env!("CARGO_MANIFEST_DIR"), "/../../fixtures/policy.json");
        let mut child = Command::new(env!("CARGO_BIN_EXE_toolgate-server"))
            .arg("--policy")
            .arg(policy)
            .arg("--ledger")
            .arg(ledger)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .expect("the server binary starts");
        let stdin = child.stdin.take().unwrap();
        let stdout = BufReader::new(child.stdout.take().unwrap());
        Server {
            child,
            stdin,
            stdout,
            next_id: 0,
        }
    }

    /// Sends one request and waits for the reply with its id.
    fn request(&mut self, method: &str, params: Value) -> Value {
        self.next_id += 1;
        let id = self.next_id;
        let line = json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params});
        let mut text = serde_json::to_string(&line).unwrap();
        text.push('\n');
        self.stdin.write_all(text.as_bytes()).unwrap();
        self.stdin.flush().unwrap();
        let mut reply = String::new();
        loop {
            reply.clear();
            let read = self.stdout.read_line(&mut reply).unwrap();
            assert!(
                read > 0,
                "the server closed stdout while {method} {id} was pending"
            );
            let message: Value =
                serde_json::from_str(&reply).expect("the server writes JSON lines");
            if message.get("id") == Some(&json!(id)) {
                return message;
            }
        }
    }

    fn call(&mut self, tool: &str, arguments: Value) -> Value {
        let reply = self.request(
            "tools/call",
            json!({"name": tool, "arguments": arguments, "_meta": meta()}),
        );
        let result = reply
            .get("result")
            .unwrap_or_else(|| panic!("{tool} failed: {reply}"));
        assert_ne!(result["isError"], json!(true), "{tool} failed: {reply}");
        result.clone()
    }

    /// VmHWM (peak resident set) of the server process, in KiB.
    fn peak_rss_kib(&self) -> u64 {
        let status = std::fs::read_to_string(format!("/proc/{}/status", self.child.id()))
            .expect("/proc is readable (Linux)");
        status
            .lines()
            .find_map(|line| line.strip_prefix("VmHWM:"))
            .and_then(|rest| rest.trim().trim_end_matches("kB").trim().parse().ok())
            .expect("VmHWM is present")
    }

    fn close(mut self) {
        drop(self.stdin);
        let status = self.child.wait().unwrap();
        assert!(status.success(), "the server exited with {status}");
    }
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
    let ledger = tempfile::tempdir().unwrap();
    let mut server = Server::spawn(ledger.path());

    let discover = server.request("server/discover", json!({"_meta": meta()}));
    assert!(
        discover.get("result").is_some(),
        "discover failed: {discover}"
    );

    println!("toolgate-server over stdio, one request in flight, 2026-07-28 flow");
    println!(
        "| {:<24} | {:>6} | {:>10} | {:>10} |",
        "operation", "calls", "calls/s", "mean us"
    );
    println!("|{:-<26}|{:->8}|{:->12}|{:->12}|", "", "", "", "");

    let start = Instant::now();
    for i in 0..NOTES {
        let result = server.call("write_note", args(i));
        assert_eq!(result["structuredContent"]["status"], "committed");
    }
    row("write_note (committed)", NOTES, start.elapsed());

    let start = Instant::now();
    for i in 0..NOTES {
        let result = server.call("write_note", args(i));
        assert_eq!(result["structuredContent"]["status"], "replay");
    }
    row("write_note (replay)", NOTES, start.elapsed());

    let start = Instant::now();
    for _ in 0..READS {
        let result = server.call("read_ledger", json!({}));
        assert_eq!(
            result["structuredContent"]["notes"]
                .as_array()
                .map(Vec::len),
            Some(NOTES)
        );
    }
    row(
        &format!("read_ledger ({NOTES} notes)"),
        READS,
        start.elapsed(),
    );

    let peak = server.peak_rss_kib();
    println!(
        "server peak RSS (VmHWM): {peak} KiB ({:.1} MiB)",
        peak as f64 / 1024.0
    );
    server.close();
}
