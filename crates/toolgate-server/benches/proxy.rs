//! Per-call overhead of `toolgate-server proxy` (issue 21): the latency of a read tool called
//! through the proxy against the same tool called on the upstream directly, in the same run.
//!
//! Run with `cargo bench -p toolgate-server --bench proxy`. The upstream is the reference server
//! itself (`toolgate-server --policy fixtures/policy.json --ledger <dir>`, an empty ledger), the
//! tool is its `read_ledger` (no arguments; with no notes its own cost is small and constant).
//! Three configurations, each a long-lived process (tree) driven with raw JSON-RPC lines, the
//! 2026-07-28 flow (`server/discover`, then `tools/call` with per-request `_meta`), one call in
//! flight:
//!
//! - **direct**: host -> upstream;
//! - **proxy, audit on tmpfs**: host -> `toolgate-server proxy` (its ledger, hence its fsynced audit
//!   log, in `/dev/shm`, where a sync costs next to nothing) -> upstream: the overhead without the
//!   audit's fsync;
//! - **proxy, audit on disk**: the same with the proxy's ledger on the disk: the overhead with it.
//!
//! Every upstream's ledger is on tmpfs, so the upstream's own cost (it audits each call too) is the
//! same in all three. Each proxy is pinned first (`proxy lock`) and allows only `read_ledger`. After
//! a warm-up the calls run in rounds, one block per configuration per round in a rotating order, so
//! machine noise lands on all three alike. Each round also times two references: a few raw 300-byte
//! `write` + `fdatasync`s of a file on the disk and on tmpfs (the audit's sync), and round trips of
//! the same request line through `cat` (one more process hop on pipes, which is what a proxy adds
//! at the least: the host's line is read and written once more each way).
//! The CPU time per call of each process comes from `/proc/<pid>/task/*/schedstat` (threads that
//! exit within a block are not counted).
//!
//! Knobs: `PROXY_BENCH_CALLS` (calls per configuration, default 5000), `PROXY_BENCH_ROUNDS`
//! (default 10), `PROXY_BENCH_WARMUP` (calls per configuration before measuring, default 500),
//! `PROXY_BENCH_SYNCS` (raw syncs per round and filesystem, default 20), `PROXY_BENCH_SHM_DIR`
//! (default `/dev/shm`) and `PROXY_BENCH_DISK_DIR` (default this target directory's `tmp`).
//! Nothing is asserted about the timings: the bench reports.

// A bench reports to stdout by design.
#![allow(clippy::print_stdout)]
// Set-up failures in a bench should stop it loudly with the cause.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Instant;

use common::Peer;
use serde_json::{Value, json};

const BIN: &str = env!("CARGO_BIN_EXE_toolgate-server");
const UPSTREAM_POLICY: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../../fixtures/policy.json");
/// The proxy's policy: the read tool and nothing else.
const PROXY_POLICY: &str = r#"{
  "version": 1,
  "allow": ["read_ledger"],
  "effects": {"read_ledger": "read"}
}"#;

fn env_usize(name: &str, default: usize) -> usize {
    std::env::var(name)
        .map(|v| v.parse().unwrap_or_else(|_| panic!("{name} is a number")))
        .unwrap_or(default)
}

/// The type of the filesystem holding `path` (the longest mount point above it in
/// `/proc/self/mountinfo`).
fn fs_type(path: &Path) -> String {
    let path = path.canonicalize().unwrap();
    let mountinfo = std::fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
    let mut best: Option<(usize, String)> = None;
    for line in mountinfo.lines() {
        let fields: Vec<&str> = line.split(' ').collect();
        let (Some(mount), Some(dash)) = (fields.get(4), fields.iter().position(|f| *f == "-"))
        else {
            continue;
        };
        let mount = mount.replace("\\040", " ");
        if path.starts_with(&mount) && best.as_ref().is_none_or(|(len, _)| mount.len() > *len) {
            let kind = fields.get(dash + 1).copied().unwrap_or("?");
            best = Some((mount.len(), format!("{kind} at {mount}")));
        }
    }
    best.map_or_else(|| "unknown".to_owned(), |(_, kind)| kind)
}

/// The upstream's command line on the ledger `ledger`.
fn upstream(ledger: &Path) -> Vec<String> {
    vec![
        BIN.to_owned(),
        "--policy".to_owned(),
        UPSTREAM_POLICY.to_owned(),
        "--ledger".to_owned(),
        ledger.display().to_string(),
    ]
}

/// One proxy's files: its policy, ledger and pin, and its upstream's ledger.
struct ProxyFiles {
    policy: PathBuf,
    ledger: PathBuf,
    pin: PathBuf,
    upstream_ledger: PathBuf,
}

impl ProxyFiles {
    fn new(dir: &Path, upstream_ledger: PathBuf) -> Self {
        let policy = dir.join("proxy-policy.json");
        std::fs::write(&policy, PROXY_POLICY).unwrap();
        ProxyFiles {
            policy,
            ledger: dir.join("proxy-ledger"),
            pin: dir.join("toolgate-proxy.lock"),
            upstream_ledger,
        }
    }

    fn command(&self) -> Command {
        let mut command = Command::new(BIN);
        command
            .arg("--policy")
            .arg(&self.policy)
            .arg("--ledger")
            .arg(&self.ledger)
            .arg("proxy");
        command
    }

    /// `proxy lock`: pins the upstream's tools (the proxy refuses to start without the pin).
    fn lock(&self) -> String {
        let output = self
            .command()
            .arg("lock")
            .arg("--lock")
            .arg(&self.pin)
            .arg("--")
            .args(upstream(&self.upstream_ledger))
            .output()
            .unwrap();
        assert!(
            output.status.success(),
            "proxy lock failed: {}",
            String::from_utf8_lossy(&output.stderr)
        );
        String::from_utf8_lossy(&output.stdout).trim().to_owned()
    }

    fn spawn(&self) -> Peer {
        let mut command = self.command();
        command
            .arg("--lock")
            .arg(&self.pin)
            .arg("--")
            .args(upstream(&self.upstream_ledger));
        Peer::spawn(command)
    }
}

/// Nanoseconds on CPU of the live threads of `pid` (`/proc/<pid>/task/*/schedstat`), if readable.
fn cpu_ns(pid: u32) -> Option<u64> {
    let mut total = 0;
    for task in std::fs::read_dir(format!("/proc/{pid}/task")).ok()? {
        let stat = std::fs::read_to_string(task.ok()?.path().join("schedstat")).ok()?;
        total += stat.split_whitespace().next()?.parse::<u64>().ok()?;
    }
    Some(total)
}

/// The child process of `parent` (the proxy's upstream), from `/proc/*/stat`.
fn child_of(parent: u32) -> Option<u32> {
    std::fs::read_dir("/proc").ok()?.find_map(|entry| {
        let entry = entry.ok()?;
        let pid: u32 = entry.file_name().to_str()?.parse().ok()?;
        let stat = std::fs::read_to_string(entry.path().join("stat")).ok()?;
        // `pid (comm) state ppid ...`; comm may hold spaces and parentheses.
        let after = &stat[stat.rfind(')')? + 1..];
        let ppid: u32 = after.split_whitespace().nth(1)?.parse().ok()?;
        (ppid == parent).then_some(pid)
    })
}

/// One configuration under measurement.
struct Config {
    name: &'static str,
    peer: Peer,
    /// The proxy's upstream (`None` for the direct run, whose peer is the upstream).
    upstream_pid: Option<u32>,
    /// Per-call latencies in microseconds, over all rounds.
    samples: Vec<f64>,
    /// The p50 of each round's block.
    round_p50: Vec<f64>,
    /// CPU nanoseconds of the peer process and of the proxy's upstream, summed over the blocks.
    cpu: [Option<u64>; 2],
}

impl Config {
    /// `peer` is a proxy (whose upstream is its child process) or, if not `proxied`, the upstream.
    fn new(name: &'static str, peer: Peer, proxied: bool) -> Self {
        let upstream_pid = proxied
            .then(|| child_of(peer.pid()).expect("the proxy's upstream is its child process"));
        Config {
            name,
            peer,
            upstream_pid,
            samples: Vec::new(),
            round_p50: Vec::new(),
            cpu: [Some(0), Some(0)],
        }
    }

    fn read(&mut self) {
        let result = self.peer.call("read_ledger", json!({}));
        assert_eq!(
            result["structuredContent"]["notes"],
            json!([]),
            "read_ledger of an empty ledger lists no notes: {result}"
        );
    }

    fn pids(&self) -> [Option<u32>; 2] {
        [Some(self.peer.pid()), self.upstream_pid]
    }

    /// `calls` timed calls, one in flight.
    fn block(&mut self, calls: usize) {
        let before = self.pids().map(|pid| pid.and_then(cpu_ns));
        let mut block = Vec::with_capacity(calls);
        for _ in 0..calls {
            let start = Instant::now();
            self.read();
            block.push(start.elapsed().as_secs_f64() * 1e6);
        }
        let after = self.pids().map(|pid| pid.and_then(cpu_ns));
        for i in 0..2 {
            self.cpu[i] = match (self.cpu[i], before[i], after[i]) {
                (Some(sum), Some(b), Some(a)) => Some(sum + a.saturating_sub(b)),
                _ => None,
            };
        }
        self.samples.extend_from_slice(&block);
        self.round_p50.push(percentile(&mut block, 50.0));
    }
}

/// The nearest-rank percentile `p` of `values` (sorts them).
fn percentile(values: &mut [f64], p: f64) -> f64 {
    values.sort_by(f64::total_cmp);
    let rank = ((p / 100.0) * values.len() as f64).ceil() as usize;
    values[rank.clamp(1, values.len()) - 1]
}

fn median(values: &[f64]) -> f64 {
    percentile(&mut values.to_vec(), 50.0)
}

/// `n` timed round trips of a `tools/call` line through `cat` (microseconds).
fn echoes(cat: &mut Peer, n: usize, into: &mut Vec<f64>) {
    for _ in 0..n {
        let start = Instant::now();
        let echoed = cat.request(
            "tools/call",
            json!({"name": "read_ledger", "arguments": {}, "_meta": common::meta()}),
        );
        into.push(start.elapsed().as_secs_f64() * 1e6);
        assert_eq!(echoed["method"], "tools/call");
    }
}

/// `n` timed appends of 300 bytes, each followed by `fdatasync`, to a file in `dir` (microseconds).
fn syncs(dir: &Path, n: usize, into: &mut Vec<f64>) {
    let path = dir.join("sync-probe");
    let mut file = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(&path)
        .unwrap();
    let record = [b'x'; 300];
    for _ in 0..n {
        let start = Instant::now();
        file.write_all(&record).unwrap();
        file.sync_data().unwrap();
        into.push(start.elapsed().as_secs_f64() * 1e6);
    }
    drop(file);
    std::fs::remove_file(&path).unwrap();
}

fn main() {
    let calls = env_usize("PROXY_BENCH_CALLS", 5000);
    let rounds = env_usize("PROXY_BENCH_ROUNDS", 10).max(1);
    let warmup = env_usize("PROXY_BENCH_WARMUP", 500);
    let sync_count = env_usize("PROXY_BENCH_SYNCS", 20);
    let per_round = calls.div_ceil(rounds).max(1);
    let shm_base = std::env::var("PROXY_BENCH_SHM_DIR").unwrap_or_else(|_| "/dev/shm".to_owned());
    let disk_base = std::env::var("PROXY_BENCH_DISK_DIR")
        .unwrap_or_else(|_| env!("CARGO_TARGET_TMPDIR").to_owned());
    std::fs::create_dir_all(&disk_base).unwrap();
    let tmpfs = tempfile::Builder::new()
        .prefix("proxy-bench-")
        .tempdir_in(&shm_base)
        .unwrap();
    let disk = tempfile::Builder::new()
        .prefix("proxy-bench-")
        .tempdir_in(&disk_base)
        .unwrap();
    let (tmpfs_kind, disk_kind) = (fs_type(tmpfs.path()), fs_type(disk.path()));
    println!(
        "toolgate-server proxy overhead, read_ledger (empty ledger), one call in flight, 2026-07-28 flow"
    );
    println!("tmpfs dir {} ({tmpfs_kind})", tmpfs.path().display());
    println!("disk dir  {} ({disk_kind})", disk.path().display());
    if !tmpfs_kind.starts_with("tmpfs") {
        println!("warning: the tmpfs dir is not on tmpfs: set PROXY_BENCH_SHM_DIR");
    }
    if disk_kind.starts_with("tmpfs") || disk_kind.starts_with("ramfs") {
        println!(
            "warning: the disk dir is in memory: set PROXY_BENCH_DISK_DIR to a disk directory"
        );
    }

    let on_tmpfs = ProxyFiles::new(tmpfs.path(), tmpfs.path().join("upstream-of-tmpfs-proxy"));
    let on_disk = ProxyFiles::new(disk.path(), tmpfs.path().join("upstream-of-disk-proxy"));
    for files in [&on_tmpfs, &on_disk] {
        println!("proxy lock: {}", files.lock());
    }

    let mut direct = Peer::spawn({
        let line = upstream(&tmpfs.path().join("upstream-direct"));
        let mut command = Command::new(&line[0]);
        command.args(&line[1..]);
        command
    });
    direct.discover();
    let listed = direct.request("tools/list", json!({"_meta": common::meta()}));
    let schema = listed["result"]["tools"]
        .as_array()
        .and_then(|tools| tools.iter().find(|t| t["name"] == "read_ledger"))
        .map(|tool| tool["inputSchema"].clone())
        .unwrap_or_else(|| panic!("the upstream lists read_ledger: {listed}"));
    println!("read_ledger inputSchema (direct): {schema}");

    let mut configs = vec![Config::new("direct", direct, false)];
    for (name, files) in [
        ("proxy, audit on tmpfs", &on_tmpfs),
        ("proxy, audit on disk", &on_disk),
    ] {
        let mut peer = files.spawn();
        peer.discover();
        let listed = peer.request("tools/list", json!({"_meta": common::meta()}));
        let names: Vec<&Value> = listed["result"]["tools"]
            .as_array()
            .map(|tools| tools.iter().map(|t| &t["name"]).collect())
            .unwrap_or_default();
        assert_eq!(names, [&json!("read_ledger")], "the proxy lists: {listed}");
        configs.push(Config::new(name, peer, true));
    }

    let mut cat = Peer::spawn(Command::new("cat"));

    // Warm-up, alternating, so every process has its threads, caches and files in place.
    for _ in 0..warmup {
        for config in &mut configs {
            config.read();
        }
    }
    echoes(&mut cat, warmup, &mut Vec::new());

    let (mut disk_syncs, mut tmpfs_syncs, mut hops) = (Vec::new(), Vec::new(), Vec::new());
    let started = Instant::now();
    for round in 0..rounds {
        let n = configs.len();
        for k in 0..n {
            configs[(round + k) % n].block(per_round);
        }
        syncs(disk.path(), sync_count, &mut disk_syncs);
        syncs(tmpfs.path(), sync_count, &mut tmpfs_syncs);
        echoes(&mut cat, per_round / 5, &mut hops);
    }
    let elapsed = started.elapsed();

    println!(
        "{rounds} rounds x {per_round} calls per configuration (rotating order), after {warmup} warm-up calls each; {:.1} s",
        elapsed.as_secs_f64()
    );
    println!();
    println!(
        "| {:<22} | {:>6} | {:>8} | {:>8} | {:>12} | {:>12} | {:>11} | {:>11} |",
        "configuration",
        "calls",
        "p50 us",
        "p99 us",
        "added p50 us",
        "added p99 us",
        "p50/direct",
        "p99/direct"
    );
    println!(
        "|{:-<24}|{:->8}|{:->10}|{:->10}|{:->14}|{:->14}|{:->13}|{:->13}|",
        "", "", "", "", "", "", "", ""
    );
    let stats: Vec<(f64, f64)> = configs
        .iter_mut()
        .map(|c| {
            (
                percentile(&mut c.samples, 50.0),
                percentile(&mut c.samples, 99.0),
            )
        })
        .collect();
    let (base50, base99) = stats[0];
    for (config, &(p50, p99)) in configs.iter().zip(&stats) {
        println!(
            "| {:<22} | {:>6} | {p50:>8.1} | {p99:>8.1} | {:>12.1} | {:>12.1} | {:>10.2}x | {:>10.2}x |",
            config.name,
            config.samples.len(),
            p50 - base50,
            p99 - base99,
            p50 / base50,
            p99 / base99,
        );
    }
    println!();
    println!("added p50 per round (the round's block p50 minus direct's in the same round):");
    for config in &configs[1..] {
        let mut added: Vec<f64> = config
            .round_p50
            .iter()
            .zip(&configs[0].round_p50)
            .map(|(p, d)| p - d)
            .collect();
        let med = median(&added);
        added.sort_by(f64::total_cmp);
        println!(
            "  {:<22} median {med:.1} us, min {:.1}, max {:.1}",
            config.name,
            added[0],
            added[added.len() - 1]
        );
    }
    println!();
    println!("CPU per call (us, from schedstat):");
    for config in &configs {
        let per_call = |ns: Option<u64>| {
            ns.map_or_else(
                || "n/a".to_owned(),
                |ns| format!("{:.1}", ns as f64 / 1e3 / config.samples.len() as f64),
            )
        };
        if config.upstream_pid.is_some() {
            println!(
                "  {:<22} proxy {:>6}  its upstream {:>6}",
                config.name,
                per_call(config.cpu[0]),
                per_call(config.cpu[1])
            );
        } else {
            println!(
                "  {:<22} upstream {:>6}",
                config.name,
                per_call(config.cpu[0])
            );
        }
    }
    println!();
    let (t50, d50) = (stats[1].0, stats[2].0);
    for (kind, dir_kind, values) in [
        ("disk", &disk_kind, &mut disk_syncs),
        ("tmpfs", &tmpfs_kind, &mut tmpfs_syncs),
    ] {
        let count = values.len();
        let p50 = percentile(values, 50.0);
        let p99 = percentile(values, 99.0);
        println!(
            "raw 300-byte write + fdatasync, {kind} ({dir_kind}): {count} syncs, p50 {p50:.1} us, p99 {p99:.1} us ({:.0} syncs/s at p50)",
            1e6 / p50
        );
    }
    println!(
        "proxy with its audit on disk minus on tmpfs, p50: {:.1} us (the audit's sync on this disk)",
        d50 - t50
    );
    let count = hops.len();
    let (h50, h99) = (percentile(&mut hops, 50.0), percentile(&mut hops, 99.0));
    println!(
        "one more process hop (the request line echoed by `cat`): {count} round trips, p50 {h50:.1} us, p99 {h99:.1} us"
    );

    for config in configs {
        config.peer.close();
    }
    cat.close();
}
