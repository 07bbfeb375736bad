//! The issue-15 figures in one run: syncs, locks and rates of `write_note` and its replay, each
//! rate as a ratio to the one-sync-per-call limit measured beside it.
//!
//! Run with `cargo bench -p toolgate-server --bench calls` (release build of the server binary).
//!
//! - **Limit**: one 300-byte append + `fdatasync` of a file in the ledger's filesystem, plus one
//!   round trip of a JSON-RPC-sized line to a do-nothing stdio child (`cat`): what a call costs if
//!   it does nothing but one sync and the transport.
//! - **Rates**: sequential calls over stdio to the release server (2026-07-28 flow), in rounds
//!   alternated with limit measurements, because this VM's fsync rate drifts several-fold within
//!   seconds; each ratio is the median over rounds of (limit time / call time).
//! - **Concurrency**: 16 calls in flight on one connection (the server runs requests
//!   concurrently) against the sequential rate of the same run.
//! - **Counts**: the server under `strace -f` (fsync, fdatasync, flock), for a run of N writes and
//!   one of N writes plus N replays, minus a run with no call: deterministic per call.
//!
//! `CALLS_BENCH_ROUNDS` (default 7) and `CALLS_BENCH_PER_ROUND` (default 100) change the sizes;
//! `CALLS_BENCH_SERVER=/path/to/toolgate-server` measures another build of the server (an older
//! commit's, for a before/after in the same conditions).

// A bench reports to stdout by design.
#![allow(clippy::print_stdout)]
// Set-up failures in a bench should stop it loudly with the cause.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::collections::BTreeMap;
use std::fs::OpenOptions;
use std::os::unix::fs::FileExt as _;
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use common::{Peer, meta};
use serde_json::json;

const POLICY: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../../fixtures/policy.json");
/// The server binary measured: `CALLS_BENCH_SERVER`, else this package's release build.
fn server_binary() -> String {
    std::env::var("CALLS_BENCH_SERVER")
        .unwrap_or_else(|_| env!("CARGO_BIN_EXE_toolgate-server").to_owned())
}
const CONCURRENCY: usize = 16;

fn env_usize(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// A server on `ledger` (under `strace` writing to `wrap` when given), past `server/discover`.
fn server(ledger: &Path, wrap: Option<&Path>) -> Peer {
    let mut command = match wrap {
        Some(trace) => {
            let mut command = Command::new("strace");
            command
                .args(["-f", "-qq", "-e", "trace=fsync,fdatasync,flock", "-o"])
                .arg(trace)
                .arg(server_binary());
            command
        }
        None => Command::new(server_binary()),
    };
    command
        .arg("--policy")
        .arg(POLICY)
        .arg("--ledger")
        .arg(ledger);
    let mut peer = Peer::spawn(command);
    peer.discover();
    peer
}

fn write_note(server: &mut Peer, request_id: &str) -> u64 {
    server.send(
        "tools/call",
        json!({"name": "write_note", "arguments": {"request_id": request_id, "text": "a note of the calls bench"}, "_meta": meta()}),
    )
}

/// One write_note (or replay), waited for; checks its status.
fn call(server: &mut Peer, request_id: &str, status: &str) {
    let id = write_note(server, request_id);
    loop {
        let message = server.read();
        if message.get("id") == Some(&json!(id)) {
            assert_eq!(
                message["result"]["structuredContent"]["status"], status,
                "{message}"
            );
            return;
        }
    }
}

/// The limit of one call: a 300-byte append + fdatasync in `dir`, and one round trip through
/// `echo` (a `cat` child). Returns the mean time of `n` of each, interleaved.
fn limit(dir: &Path, echo: &mut Peer, n: usize) -> Duration {
    let file = OpenOptions::new()
        .create(true)
        .truncate(false)
        .read(true)
        .write(true)
        .open(dir.join("limit.bin"))
        .unwrap();
    let mut offset = file.metadata().unwrap().len();
    let record = [b'x'; 299];
    let line = json!({"jsonrpc": "2.0", "id": 1, "result": {"content": [], "structuredContent": {"request_id": "req-bench-0000", "status": "committed"}}});
    let mut text = serde_json::to_string(&line).unwrap();
    text.push('\n');
    let start = Instant::now();
    for _ in 0..n {
        file.write_all_at(&record, offset).unwrap();
        file.write_all_at(b"\n", offset + 299).unwrap();
        offset += 300;
        file.sync_data().unwrap();
        echo.round_trip(&text);
    }
    start.elapsed() / u32::try_from(n).unwrap()
}

fn median(mut values: Vec<f64>) -> f64 {
    values.sort_by(|a, b| a.total_cmp(b));
    values[values.len() / 2]
}

/// The syscall counts of one traced server run.
fn traced(calls: impl FnOnce(&mut Peer)) -> BTreeMap<String, u64> {
    let dir = tempfile::tempdir().unwrap();
    let trace = dir.path().join("trace");
    let mut server = server(&dir.path().join("ledger"), Some(&trace));
    calls(&mut server);
    server.close();
    let text = std::fs::read_to_string(&trace).expect("strace wrote its trace");
    let mut counts = BTreeMap::new();
    for line in text.lines() {
        // `<pid> <name>(<args>) = <result>`, possibly split as `<unfinished ...>` / `resumed>`.
        if line.contains("resumed>") {
            continue;
        }
        let call = line.split_whitespace().nth(1).unwrap_or("");
        if let Some(name) = call.split('(').next()
            && ["fsync", "fdatasync", "flock"].contains(&name)
        {
            *counts.entry(name.to_owned()).or_default() += 1;
        }
    }
    counts
}

fn per_call(a: &BTreeMap<String, u64>, b: &BTreeMap<String, u64>, name: &str, n: usize) -> f64 {
    let (a, b) = (
        a.get(name).copied().unwrap_or(0),
        b.get(name).copied().unwrap_or(0),
    );
    (a as f64 - b as f64) / n as f64
}

fn main() {
    println!("server: {}", server_binary());
    let rounds = env_usize("CALLS_BENCH_ROUNDS", 7);
    let per_round = env_usize("CALLS_BENCH_PER_ROUND", 100);

    // Counts first: deterministic.
    let n = per_round;
    let none = traced(|_| {});
    let writes =
        traced(|s| (0..n).for_each(|i| call(s, &format!("req-trace-{i:05}"), "committed")));
    let both = traced(|s| {
        (0..n).for_each(|i| call(s, &format!("req-trace-{i:05}"), "committed"));
        (0..n).for_each(|i| call(s, &format!("req-trace-{i:05}"), "replay"));
    });
    let syncs = |a: &BTreeMap<String, u64>, b: &BTreeMap<String, u64>| {
        per_call(a, b, "fsync", n) + per_call(a, b, "fdatasync", n)
    };
    println!("counts over {n} calls (strace -f, minus a run with no call):");
    println!(
        "  write_note: {:.2} fsync + fdatasync, {:.2} flock calls",
        syncs(&writes, &none),
        per_call(&writes, &none, "flock", n)
    );
    println!(
        "  replay:     {:.2} fsync + fdatasync, {:.2} flock calls",
        syncs(&both, &writes),
        per_call(&both, &writes, "flock", n)
    );

    // Rates, alternated with the limit.
    let dir = tempfile::tempdir_in(std::env::current_dir().unwrap()).unwrap();
    let mut echo = Peer::spawn(Command::new("cat"));
    let mut server = server(&dir.path().join("ledger"), None);
    let (mut write_ratio, mut replay_ratio, mut limits) = (Vec::new(), Vec::new(), Vec::new());
    let (mut seq_rates, mut conc_rates) = (Vec::new(), Vec::new());
    let mut next = 0usize;
    for round in 0..rounds {
        let limit_before = limit(dir.path(), &mut echo, per_round);
        let first = next;
        let start = Instant::now();
        for _ in 0..per_round {
            call(&mut server, &format!("req-rate-{next:06}"), "committed");
            next += 1;
        }
        let write = start.elapsed() / u32::try_from(per_round).unwrap();
        let start = Instant::now();
        for i in first..next {
            call(&mut server, &format!("req-rate-{i:06}"), "replay");
        }
        let replay = start.elapsed() / u32::try_from(per_round).unwrap();
        // 16 in flight: send 16, then one more for every reply.
        let start = Instant::now();
        let total = per_round * 2;
        let mut sent = 0;
        let mut done = 0;
        while done < total {
            while sent < total && sent - done < CONCURRENCY {
                write_note(&mut server, &format!("req-conc-{round}-{sent:06}"));
                sent += 1;
            }
            let message = server.read();
            assert_eq!(
                message["result"]["structuredContent"]["status"], "committed",
                "{message}"
            );
            done += 1;
        }
        let concurrent = start.elapsed() / u32::try_from(total).unwrap();
        let limit_after = limit(dir.path(), &mut echo, per_round);
        let limit = (limit_before + limit_after) / 2;
        limits.push(limit.as_secs_f64());
        write_ratio.push(limit.as_secs_f64() / write.as_secs_f64());
        replay_ratio.push(limit.as_secs_f64() / replay.as_secs_f64());
        seq_rates.push(1.0 / write.as_secs_f64());
        conc_rates.push(1.0 / concurrent.as_secs_f64());
        println!(
            "round {round}: limit {:.0} us, write_note {:.0} us, replay {:.0} us, 16 in flight {:.0} us per call",
            limit.as_secs_f64() * 1e6,
            write.as_secs_f64() * 1e6,
            replay.as_secs_f64() * 1e6,
            concurrent.as_secs_f64() * 1e6
        );
    }
    server.close();
    echo.close();
    let speedups: Vec<f64> = conc_rates
        .iter()
        .zip(&seq_rates)
        .map(|(c, s)| c / s)
        .collect();
    println!(
        "medians over {rounds} rounds of {per_round} calls (limit {:.0} us per call):",
        median(limits) * 1e6
    );
    println!(
        "  write_note rate / one-sync-per-call limit: {:.2}",
        median(write_ratio)
    );
    println!(
        "  replay rate / one-sync-per-call limit:     {:.2}",
        median(replay_ratio)
    );
    println!(
        "  16 in flight / sequential write_note rate: {:.2}x",
        median(speedups)
    );
}
