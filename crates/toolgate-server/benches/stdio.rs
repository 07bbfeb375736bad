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

use std::io::{BufRead, BufReader, Write};
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::{Value, json};

/// Sequential write_note calls (and as many replays), unless `STDIO_BENCH_NOTES` says otherwise.
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
        let mut command = match std::env::var("STDIO_BENCH_SERVER") {
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
        let mut child = command
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

    /// A `/proc/<pid>/status` field of the server process in KiB (`VmHWM`: peak resident set).
    fn status_kib(&self, field: &str) -> u64 {
        let status = std::fs::read_to_string(format!("/proc/{}/status", self.child.id()))
            .expect("/proc is readable (Linux)");
        status
            .lines()
            .find_map(|line| line.strip_prefix(field)?.strip_prefix(':'))
            .and_then(|rest| rest.trim().trim_end_matches("kB").trim().parse().ok())
            .unwrap_or_else(|| panic!("{field} is present"))
    }

    /// Resident set now and at its peak, and the thread count: where the memory goes by stage.
    fn memory(&self, stage: &str) -> String {
        let threads = std::fs::read_to_string(format!("/proc/{}/status", self.child.id()))
            .ok()
            .and_then(|s| {
                s.lines()
                    .find_map(|l| l.strip_prefix("Threads:"))
                    .map(|t| t.trim().to_owned())
            })
            .unwrap_or_default();
        format!(
            "memory {stage:<15} VmRSS {:>6} KiB (anon {:>6}, file {:>6})  VmHWM {:>6} KiB  threads {threads}",
            self.status_kib("VmRSS"),
            self.status_kib("RssAnon"),
            self.status_kib("RssFile"),
            self.status_kib("VmHWM"),
        )
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
    let notes = std::env::var("STDIO_BENCH_NOTES")
        .map(|n| n.parse().expect("STDIO_BENCH_NOTES is a number"))
        .unwrap_or(NOTES);
    let ledger = tempfile::tempdir().unwrap();
    let mut server = Server::spawn(ledger.path());

    let discover = server.request("server/discover", json!({"_meta": meta()}));
    assert!(
        discover.get("result").is_some(),
        "discover failed: {discover}"
    );

    let name = std::env::var("STDIO_BENCH_SERVER").unwrap_or_else(|_| "toolgate-server".into());
    println!("{name} over stdio, one request in flight, 2026-07-28 flow");
    let mut memory = vec![server.memory("after discover")];
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
    memory.push(server.memory("after writes"));

    let start = Instant::now();
    for i in 0..notes {
        let result = server.call("write_note", args(i));
        assert_eq!(result["structuredContent"]["status"], "replay");
    }
    row("write_note (replay)", notes, start.elapsed());
    memory.push(server.memory("after replays"));

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

    memory.push(server.memory("after reads"));
    for line in &memory {
        println!("{line}");
    }
    let peak = server.status_kib("VmHWM");
    println!(
        "server peak RSS (VmHWM): {peak} KiB ({:.1} MiB)",
        peak as f64 / 1024.0
    );
    server.close();
}
