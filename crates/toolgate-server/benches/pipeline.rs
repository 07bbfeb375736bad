//! Peak memory of the server while a client pipelines many `tools/call`s over stdio: the bound on
//! requests in flight (`--max-in-flight`) against a limit so large it never applies.
//!
//! Run with `cargo bench -p toolgate-server --bench pipeline` (release build of the server binary).
//! A writer thread writes every call up front while the main thread reads the replies, as a
//! pipelining client does; each call is a `read_ledger` of an empty ledger (cheap, but audited, so
//! the audit log's group commit is in the path). The server's peak RSS (`VmHWM` from
//! `/proc/<pid>/status`) is read once every reply has arrived, before stdin is closed.
//! `PIPELINE_BENCH_CALLS` changes the number of calls (default 100,000).

// A bench reports to stdout by design.
#![allow(clippy::print_stdout)]
// Set-up failures in a bench should stop it loudly with the cause.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::io::{BufRead as _, BufReader, BufWriter, Write as _};
use std::process::{Command, Stdio};
use std::time::Instant;

use serde_json::{Value, json};

const CALLS: usize = 100_000;

/// The default limit, and one no client reaches.
const LIMITS: [usize; 2] = [64, 1_000_000];

fn meta() -> Value {
    json!({
        "io.modelcontextprotocol/protocolVersion": "2026-07-28",
        "io.modelcontextprotocol/clientCapabilities": {}
    })
}

fn status_kib(pid: u32, field: &str) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    status
        .lines()
        .find_map(|line| line.strip_prefix(field)?.strip_prefix(':'))
        .and_then(|rest| rest.trim().strip_suffix("kB"))
        .map(|kib| kib.trim().parse().unwrap())
        .unwrap_or_else(|| panic!("no {field} in /proc/{pid}/status"))
}

/// Runs `calls` pipelined calls against a server with `--max-in-flight limit`; returns the peak
/// RSS in KiB and the seconds the calls took.
fn run(limit: usize, calls: usize) -> (u64, f64) {
    let dir = tempfile::tempdir().unwrap();
    let policy = concat!(env!("CARGO_MANIFEST_DIR"), "/../../fixtures/policy.json");
    let mut child = Command::new(env!("CARGO_BIN_EXE_toolgate-server"))
        .arg("--policy")
        .arg(policy)
        .arg("--ledger")
        .arg(dir.path().join("ledger"))
        .arg("--max-in-flight")
        .arg(limit.to_string())
        .env_remove("RUST_LOG")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("the server binary starts");
    let pid = child.id();
    let mut stdin = child.stdin.take().unwrap();
    let mut stdout = BufReader::new(child.stdout.take().unwrap());
    let mut line = String::new();

    let discover = json!({"jsonrpc": "2.0", "id": 0, "method": "server/discover",
                          "params": {"_meta": meta()}});
    writeln!(stdin, "{discover}").unwrap();
    stdin.flush().unwrap();
    stdout.read_line(&mut line).unwrap();
    assert!(line.contains("\"result\""), "server/discover: {line}");

    let start = Instant::now();
    let writer = std::thread::spawn(move || {
        let mut out = BufWriter::new(stdin);
        for id in 1..=calls {
            let call = json!({"jsonrpc": "2.0", "id": id, "method": "tools/call",
                              "params": {"name": "read_ledger", "arguments": {}, "_meta": meta()}});
            writeln!(out, "{call}").unwrap();
        }
        out.into_inner().ok().unwrap()
    });
    let mut answered = 0;
    while answered < calls {
        line.clear();
        assert!(
            stdout.read_line(&mut line).unwrap() > 0,
            "the server closed stdout"
        );
        assert!(line.contains("\"result\""), "a call failed: {line}");
        answered += 1;
    }
    let elapsed = start.elapsed().as_secs_f64();
    let peak = status_kib(pid, "VmHWM");
    let stdin = writer.join().unwrap();
    drop(stdin);
    assert!(child.wait().unwrap().success());
    (peak, elapsed)
}

fn main() {
    let calls = std::env::var("PIPELINE_BENCH_CALLS")
        .ok()
        .map(|n| n.parse().expect("PIPELINE_BENCH_CALLS is a number"))
        .unwrap_or(CALLS);
    println!("{calls} pipelined tools/call read_ledger over stdio (release build)");
    for limit in LIMITS {
        let (peak, seconds) = run(limit, calls);
        println!(
            "--max-in-flight {limit:>9}: peak RSS (VmHWM) {peak:>9} KiB ({:>7.1} MiB), {seconds:>6.1} s, {:>7.0} calls/s",
            peak as f64 / 1024.0,
            calls as f64 / seconds
        );
    }
}
