//! Issue 19's figures for the PostgreSQL stores in one run: `write_note` and its replay on the
//! file backend against the PostgreSQL backend, 1 replica against 4 on one database, and the
//! database's own commit rate (pgbench, one INSERT per transaction) as the limit.
//!
//! Run with `cargo bench -p toolgate-server --bench replicas` (release build of the server binary;
//! needs PostgreSQL 15+ with `pgbench`, as `toolgate-pgtest` finds them).
//!
//! Every round measures each figure once, in an order that alternates between rounds (file
//! before PostgreSQL, then PostgreSQL before file; 1 replica before 4, then 4 before 1), each on a
//! fresh ledger directory and a fresh database of one cluster this bench starts (`fsync` and
//! `synchronous_commit` on). Ratios are taken within a round and the medians over rounds are
//! reported, because this shared VM's disk rate drifts several-fold within seconds.
//!
//! - **Sequential**: `per_round` new `write_note`s, one at a time, then their replays (the same
//!   `request_id` again), over stdio to one server.
//! - **16 in flight**: `2 * per_round` new `write_note`s with 16 in flight on one connection.
//! - **Replicas**: 4 servers (separate ledger directories, one database), each with 16 in flight
//!   and `2 * per_round` calls of distinct keys, driven from one thread each and started together;
//!   the aggregate rate is all calls over the wall time. The 1-replica figure is the PostgreSQL
//!   16-in-flight run above (the same workload on one server).
//! - **Commit rate**: `pgbench -n -f insert.sql -T secs` with 1 and with 16 clients over TCP
//!   loopback (as the server connects), each transaction one `INSERT` of one row.
//!
//! `REPLICAS_BENCH_ROUNDS` (default 5), `REPLICAS_BENCH_PER_ROUND` (default 100) and
//! `REPLICAS_BENCH_PGBENCH_SECS` (default 2) change the sizes; `REPLICAS_BENCH_SERVER` measures
//! another build of the server; `REPLICAS_BENCH_PGBENCH` names the pgbench binary.

// A bench reports to stdout by design.
#![allow(clippy::print_stdout)]
// Set-up failures in a bench should stop it loudly with the cause.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};
use std::sync::Barrier;
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use toolgate_pgtest::{PASSWORD, PgCluster};

const POLICY: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../../fixtures/policy.json");
const CONCURRENCY: usize = 16;
const REPLICAS: usize = 4;

fn server_binary() -> String {
    std::env::var("REPLICAS_BENCH_SERVER")
        .unwrap_or_else(|_| env!("CARGO_BIN_EXE_toolgate-server").to_owned())
}

fn env_usize(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

fn meta() -> Value {
    json!({
        "io.modelcontextprotocol/protocolVersion": "2026-07-28",
        "io.modelcontextprotocol/clientCapabilities": {}
    })
}

/// A `toolgate-server` child speaking JSON lines on stdin/stdout.
struct Peer {
    child: Child,
    stdin: ChildStdin,
    stdout: BufReader<ChildStdout>,
    stderr: PathBuf,
    next_id: u64,
}

impl Peer {
    /// A server on `ledger`, with its stores in PostgreSQL at `store` or else under `ledger`.
    fn server(ledger: &Path, store: Option<&str>) -> Self {
        let mut command = Command::new(server_binary());
        // Nothing of the caller's environment configures the measured server.
        for (key, _) in std::env::vars_os() {
            if key.to_string_lossy().starts_with("TOOLGATE_") {
                command.env_remove(key);
            }
        }
        command
            .env_remove("RUST_LOG")
            .env_remove("POLICY_PATH")
            .env_remove("LEDGER_DIR")
            .arg("--policy")
            .arg(POLICY)
            .arg("--ledger")
            .arg(ledger);
        if let Some(url) = store {
            command.env("TOOLGATE_STORE", url);
        }
        let stderr = ledger.with_extension("stderr");
        let mut child = command
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(std::fs::File::create(&stderr).unwrap())
            .spawn()
            .expect("the server starts");
        let mut peer = Peer {
            stdin: child.stdin.take().unwrap(),
            stdout: BufReader::new(child.stdout.take().unwrap()),
            child,
            stderr,
            next_id: 0,
        };
        let id = peer.send("server/discover", json!({"_meta": meta()}));
        let reply = peer.read();
        assert!(
            reply.get("id") == Some(&json!(id)) && reply.get("result").is_some(),
            "discover failed: {reply}"
        );
        peer
    }

    fn send(&mut self, method: &str, params: Value) -> u64 {
        self.next_id += 1;
        let id = self.next_id;
        let line = json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params});
        let mut text = serde_json::to_string(&line).unwrap();
        text.push('\n');
        self.stdin.write_all(text.as_bytes()).unwrap();
        self.stdin.flush().unwrap();
        id
    }

    fn read(&mut self) -> Value {
        let mut line = String::new();
        let read = self.stdout.read_line(&mut line).unwrap();
        assert!(
            read > 0,
            "the server closed stdout; its stderr: {}",
            std::fs::read_to_string(&self.stderr).unwrap_or_default()
        );
        serde_json::from_str(&line).expect("JSON lines")
    }

    fn write_note(&mut self, request_id: &str) -> u64 {
        self.send(
            "tools/call",
            json!({"name": "write_note", "arguments": {"request_id": request_id, "text": "a note of the replicas bench"}, "_meta": meta()}),
        )
    }

    /// Asserts that a reply is a `write_note` result with `status`.
    fn expect(message: &Value, status: &str) {
        assert_eq!(
            message["result"]["structuredContent"]["status"], status,
            "{message}"
        );
    }

    /// One write_note (or replay), waited for.
    fn call(&mut self, request_id: &str, status: &str) {
        let id = self.write_note(request_id);
        let message = self.read();
        assert_eq!(message.get("id"), Some(&json!(id)), "{message}");
        Self::expect(&message, status);
    }

    /// `total` new write_notes with 16 in flight: send 16, then one more for every reply.
    fn in_flight(&mut self, prefix: &str, total: usize) {
        let (mut sent, mut done) = (0, 0);
        while done < total {
            while sent < total && sent - done < CONCURRENCY {
                self.write_note(&format!("{prefix}-{sent:06}"));
                sent += 1;
            }
            Self::expect(&self.read(), "committed");
            done += 1;
        }
    }

    fn close(mut self) {
        drop(self.stdin);
        let status = self.child.wait().unwrap();
        assert!(
            status.success(),
            "the server exited with {status}: {}",
            std::fs::read_to_string(&self.stderr).unwrap_or_default()
        );
    }
}

#[derive(Clone, Copy, PartialEq)]
enum Backend {
    File,
    Postgres,
}

/// A fresh ledger directory and, for PostgreSQL, a fresh database: one measurement's stores.
struct Fresh {
    dir: tempfile::TempDir,
    url: Option<String>,
}

impl Fresh {
    fn new(cluster: &PgCluster, backend: Backend) -> Self {
        let dir = tempfile::tempdir_in(std::env::current_dir().unwrap()).unwrap();
        let url = (backend == Backend::Postgres).then(|| cluster.create_database("bench").unwrap());
        Fresh { dir, url }
    }

    fn server(&self, n: usize) -> Peer {
        Peer::server(
            &self.dir.path().join(format!("ledger-{n}")),
            self.url.as_deref(),
        )
    }
}

/// Sequential rates (calls/s) of `per_round` new write_notes and of their replays.
fn sequential(cluster: &PgCluster, backend: Backend, per_round: usize) -> (f64, f64) {
    let fresh = Fresh::new(cluster, backend);
    let mut server = fresh.server(0);
    let start = Instant::now();
    for i in 0..per_round {
        server.call(&format!("req-seq-{i:06}"), "committed");
    }
    let write = start.elapsed();
    let start = Instant::now();
    for i in 0..per_round {
        server.call(&format!("req-seq-{i:06}"), "replay");
    }
    let replay = start.elapsed();
    server.close();
    (rate(per_round, write), rate(per_round, replay))
}

/// The aggregate rate (calls/s) of `servers` servers on `backend`'s fresh stores (one database
/// for all), each with 16 in flight and `calls` calls of its own keys, started together.
fn in_flight(cluster: &PgCluster, backend: Backend, servers: usize, calls: usize) -> f64 {
    let fresh = Fresh::new(cluster, backend);
    let mut peers: Vec<Peer> = (0..servers).map(|n| fresh.server(n)).collect();
    let barrier = Barrier::new(servers + 1);
    let elapsed = std::thread::scope(|scope| {
        for (n, peer) in peers.iter_mut().enumerate() {
            let barrier = &barrier;
            scope.spawn(move || {
                barrier.wait();
                peer.in_flight(&format!("req-r{n}"), calls);
            });
        }
        barrier.wait();
        let start = Instant::now();
        // The scope joins every driver before it returns.
        start
    })
    .elapsed();
    for peer in peers {
        peer.close();
    }
    rate(servers * calls, elapsed)
}

fn rate(calls: usize, elapsed: Duration) -> f64 {
    calls as f64 / elapsed.as_secs_f64()
}

/// The pgbench binary: `REPLICAS_BENCH_PGBENCH`, then PATH, then the newest
/// `/usr/lib/postgresql/*/bin/pgbench`.
fn pgbench_binary() -> PathBuf {
    if let Some(path) = std::env::var_os("REPLICAS_BENCH_PGBENCH") {
        return PathBuf::from(path);
    }
    toolgate_pgtest::program("pgbench").expect(
        "pgbench not found on PATH, in $TOOLGATE_PG_BIN or under /usr/lib/postgresql/*/bin; install postgresql-contrib or set REPLICAS_BENCH_PGBENCH",
    )
}

/// The commit limit: a database with one table and the pgbench script of one INSERT.
struct CommitLimit {
    pgbench: PathBuf,
    port: u16,
    db: String,
    script: PathBuf,
    _dir: tempfile::TempDir,
}

impl CommitLimit {
    fn new(cluster: &PgCluster) -> Self {
        let url = cluster.create_database("commit_limit").unwrap();
        let db = url.rsplit('/').next().unwrap().to_owned();
        cluster
            .psql(
                &db,
                "CREATE TABLE bench_commit (id bigserial PRIMARY KEY, v int NOT NULL, at timestamptz NOT NULL DEFAULT now())",
            )
            .unwrap();
        assert_eq!(cluster.psql(&db, "SHOW synchronous_commit").unwrap(), "on");
        assert_eq!(cluster.psql(&db, "SHOW fsync").unwrap(), "on");
        let dir = tempfile::tempdir().unwrap();
        let script = dir.path().join("insert.sql");
        std::fs::write(&script, "INSERT INTO bench_commit (v) VALUES (1);\n").unwrap();
        CommitLimit {
            pgbench: pgbench_binary(),
            port: cluster.port(),
            db,
            script,
            _dir: dir,
        }
    }

    /// Transactions per second of `clients` pgbench clients for `secs` seconds.
    fn tps(&self, clients: usize, secs: usize) -> f64 {
        let output = Command::new(&self.pgbench)
            .env("PGPASSWORD", PASSWORD)
            .args(["-n", "-h", "127.0.0.1", "-U", "postgres", "-p"])
            .arg(self.port.to_string())
            .arg("-f")
            .arg(&self.script)
            .arg("-c")
            .arg(clients.to_string())
            .arg("-j")
            .arg(clients.min(2).to_string())
            .arg("-T")
            .arg(secs.to_string())
            .arg(&self.db)
            .output()
            .expect("pgbench runs");
        let text = String::from_utf8_lossy(&output.stdout);
        assert!(
            output.status.success(),
            "pgbench failed: {}{text}",
            String::from_utf8_lossy(&output.stderr)
        );
        text.lines()
            .find_map(|l| l.strip_prefix("tps = "))
            .and_then(|l| l.split_whitespace().next())
            .and_then(|v| v.parse().ok())
            .unwrap_or_else(|| panic!("no tps in pgbench's output: {text}"))
    }
}

fn median(values: &[f64]) -> f64 {
    let mut values = values.to_vec();
    values.sort_by(|a, b| a.total_cmp(b));
    values[values.len() / 2]
}

fn range(values: &[f64]) -> String {
    let min = values.iter().copied().fold(f64::INFINITY, f64::min);
    let max = values.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    if max >= 100.0 {
        format!("{min:.0}-{max:.0}")
    } else {
        format!("{min:.2}-{max:.2}")
    }
}

fn loadavg() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .map(|s| s.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
        .unwrap_or_default()
}

/// The figures of one round, as rates in calls (or transactions) per second.
#[derive(Default)]
struct Round {
    file_seq: f64,
    file_replay: f64,
    file_conc: f64,
    pg_seq: f64,
    pg_replay: f64,
    pg_conc: f64,
    pg_four: f64,
    commit_1: f64,
    commit_16: f64,
}

fn main() {
    let rounds = env_usize("REPLICAS_BENCH_ROUNDS", 5);
    let per_round = env_usize("REPLICAS_BENCH_PER_ROUND", 100);
    let secs = env_usize("REPLICAS_BENCH_PGBENCH_SECS", 2);
    let conc_calls = per_round * 2;
    println!("server: {}", server_binary());
    println!("load average at start: {}", loadavg());
    let cluster = PgCluster::start().expect("a PostgreSQL cluster starts");
    let limit = CommitLimit::new(&cluster);
    println!(
        "PostgreSQL cluster on 127.0.0.1:{} (fsync on, synchronous_commit on), pgbench {}",
        cluster.port(),
        limit.pgbench.display()
    );
    println!(
        "{rounds} rounds: {per_round} sequential calls + their replays, {conc_calls} calls with {CONCURRENCY} in flight per server, pgbench {secs} s per client count"
    );

    let mut all: Vec<Round> = Vec::new();
    for round in 0..rounds {
        let mut r = Round::default();
        let backends = if round % 2 == 0 {
            [Backend::File, Backend::Postgres]
        } else {
            [Backend::Postgres, Backend::File]
        };
        r.commit_1 = limit.tps(1, secs);
        for backend in backends {
            let (seq, replay) = sequential(&cluster, backend, per_round);
            match backend {
                Backend::File => (r.file_seq, r.file_replay) = (seq, replay),
                Backend::Postgres => (r.pg_seq, r.pg_replay) = (seq, replay),
            }
        }
        r.commit_16 = limit.tps(16, secs);
        // File, 1 replica, 4 replicas; the reverse in odd rounds. The 1-replica run is the
        // PostgreSQL 16-in-flight figure.
        let conc_order: [usize; 3] = if round % 2 == 0 {
            [0, 1, REPLICAS]
        } else {
            [REPLICAS, 1, 0]
        };
        for servers in conc_order {
            match servers {
                0 => r.file_conc = in_flight(&cluster, Backend::File, 1, conc_calls),
                1 => r.pg_conc = in_flight(&cluster, Backend::Postgres, 1, conc_calls),
                n => r.pg_four = in_flight(&cluster, Backend::Postgres, n, conc_calls),
            }
        }
        println!(
            "round {round} (load {}): calls/s file seq {:.0} replay {:.0} 16-in-flight {:.0} | pg seq {:.0} replay {:.0} 16-in-flight {:.0} 4 replicas {:.0} | pgbench INSERT tps c1 {:.0} c16 {:.0}",
            loadavg(),
            r.file_seq,
            r.file_replay,
            r.file_conc,
            r.pg_seq,
            r.pg_replay,
            r.pg_conc,
            r.pg_four,
            r.commit_1,
            r.commit_16
        );
        all.push(r);
    }

    let col = |f: fn(&Round) -> f64| all.iter().map(f).collect::<Vec<f64>>();
    let row = |name: &str, values: Vec<f64>, goal: &str| {
        println!(
            "  {name:<52} {:>9} {:>15}  {goal}",
            if median(&values) >= 100.0 {
                format!("{:.0}", median(&values))
            } else {
                format!("{:.2}", median(&values))
            },
            range(&values)
        );
    };
    println!();
    println!(
        "medians over {rounds} rounds (ratios taken within each round; load average at end: {}):",
        loadavg()
    );
    println!("  {:<52} {:>9} {:>15}  goal", "figure", "median", "rounds");
    row(
        "file write_note sequential, calls/s",
        col(|r| r.file_seq),
        "",
    );
    row("pg   write_note sequential, calls/s", col(|r| r.pg_seq), "");
    row(
        "file replay sequential, calls/s",
        col(|r| r.file_replay),
        "",
    );
    row("pg   replay sequential, calls/s", col(|r| r.pg_replay), "");
    row(
        "file write_note 16 in flight, calls/s",
        col(|r| r.file_conc),
        "",
    );
    row(
        "pg   write_note 16 in flight (1 replica), calls/s",
        col(|r| r.pg_conc),
        "",
    );
    row(
        "pg   4 replicas x 16 in flight, aggregate calls/s",
        col(|r| r.pg_four),
        "",
    );
    row(
        "pgbench 1-row INSERT, 1 client, tps",
        col(|r| r.commit_1),
        "",
    );
    row(
        "pgbench 1-row INSERT, 16 clients, tps",
        col(|r| r.commit_16),
        "",
    );
    println!("  ratios:");
    row(
        "pg / file, write_note sequential",
        col(|r| r.pg_seq / r.file_seq),
        "",
    );
    row(
        "pg / file, replay sequential",
        col(|r| r.pg_replay / r.file_replay),
        "",
    );
    row(
        "pg / file, write_note 16 in flight",
        col(|r| r.pg_conc / r.file_conc),
        "",
    );
    row(
        "16 in flight / sequential, file",
        col(|r| r.file_conc / r.file_seq),
        "",
    );
    row(
        "16 in flight / sequential, pg",
        col(|r| r.pg_conc / r.pg_seq),
        "",
    );
    row(
        "4 replicas / 1 replica, pg aggregate",
        col(|r| r.pg_four / r.pg_conc),
        ">= 2.5",
    );
    row(
        "pg replay sequential / commit rate (1 client)",
        col(|r| r.pg_replay / r.commit_1),
        ">= 0.8",
    );
    row(
        "pg write_note sequential / commit rate (1 client)",
        col(|r| r.pg_seq / r.commit_1),
        "",
    );
    row(
        "pg 16 in flight / commit rate (16 clients)",
        col(|r| r.pg_conc / r.commit_16),
        "",
    );
    row(
        "pg 4 replicas / commit rate (16 clients)",
        col(|r| r.pg_four / r.commit_16),
        "",
    );
}
