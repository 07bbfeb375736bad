//! What the gate costs per tools/call: one cheap tool (`echo`) served in process over
//! `tokio::io::duplex` to an rmcp client, called sequentially (one request in flight), measured
//!
//! - `ungated`: the bare handler, the baseline (rmcp client + server + transport);
//! - `gated_shm`: the same handler inside `Gated`, audit log on tmpfs (`/dev/shm`), where fsync is
//!   nearly free, so `gated_shm - ungated` is the gate's own work;
//! - `gated_disk`: the audit log on the normal disk (a tempdir under the working directory, or
//!   `GATE_BENCH_DIR`), so `gated_disk - gated_shm` is what the audit record's fsync costs.
//!
//! Two context rows: `audit_append_shm` (`FileAuditLog::append` alone on tmpfs) and
//! `raw_fdatasync_disk` (a 300-byte write + fdatasync in the disk directory).
//!
//! Run: `cargo bench -p toolgate-rmcp --bench gate_cost`. After criterion's report the bench
//! prints a summary measured separately, the variants interleaved round by round so that load
//! changes on a shared machine hit them alike, with the medians and the two differences.

// A bench reports to stdout by design.
#![allow(clippy::print_stdout)]
// Set-up failures in a bench should stop it loudly with the cause.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::fs::File;
use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use criterion::Criterion;
use rmcp::handler::server::router::tool::ToolRouter;
use rmcp::handler::server::wrapper::Parameters;
use rmcp::model::{CallToolRequestParams, ServerCapabilities, ServerConfig};
use rmcp::service::{RoleClient, RunningService};
use rmcp::{ServerHandler, ServiceExt as _, tool, tool_handler, tool_router};
use schemars::JsonSchema;
use serde::Deserialize;
use serde_json::{Map, Value, json};
use tokio::runtime::Runtime;
use toolgate_audit::{AuditEntry, AuditSink as _, Decision, FileAuditLog};
use toolgate_canon::Sha256Digest;
use toolgate_policy::Policy;
use toolgate_rmcp::Gated;

/// `echo` allowed with the same kind of argument rules as the reference server's `write_note`.
const POLICY: &str = r#"{
    "version": 1,
    "allow": ["echo"],
    "deny": ["rm_rf"],
    "arg_rules": {"echo": {"request_id": {"min_len": 8}, "text": {"max_len": 2000}}},
    "effects": {"echo": "read"}
}"#;

#[derive(Debug, Deserialize, JsonSchema)]
struct EchoArgs {
    /// Recorded as the audit line's request id (by the gate; the handler does not read it).
    #[allow(dead_code)]
    request_id: String,
    /// Returned as is.
    text: String,
}

#[derive(Debug, Clone)]
struct Tools {
    tool_router: ToolRouter<Self>,
}

#[tool_router]
impl Tools {
    fn new() -> Self {
        Tools {
            tool_router: Self::tool_router(),
        }
    }

    /// Returns its text.
    #[tool(annotations(read_only_hint = true))]
    async fn echo(&self, Parameters(args): Parameters<EchoArgs>) -> String {
        args.text
    }
}

#[tool_handler(router = self.tool_router)]
impl ServerHandler for Tools {
    fn get_info(&self) -> ServerConfig {
        ServerConfig::new(ServerCapabilities::builder().enable_tools().build())
    }
}

type Client = RunningService<RoleClient, ()>;

/// Serves `handler` over an in-process duplex pipe and connects a client to it.
async fn connect<H: ServerHandler>(handler: H) -> Client {
    let (server_half, client_half) = tokio::io::duplex(64 * 1024);
    tokio::spawn(async move {
        let server = handler.serve(server_half).await.unwrap();
        let _ = server.waiting().await;
    });
    ().serve(client_half).await.unwrap()
}

fn arguments() -> Map<String, Value> {
    json!({"request_id": "bench-00000001", "text": "hello from the gate bench"})
        .as_object()
        .cloned()
        .unwrap()
}

async fn call(client: &Client, arguments: &Map<String, Value>) {
    let mut params = CallToolRequestParams::new("echo");
    params.arguments = Some(arguments.clone());
    let result = client.call_tool(params).await.unwrap();
    assert_ne!(result.is_error, Some(true), "echo failed: {result:?}");
}

/// CPU time used so far by this process's live threads (client, server, runtime workers and
/// blocking pool alike), from `/proc/self/task/*/schedstat`, in nanoseconds; 0 where unavailable.
fn cpu_ns() -> u64 {
    let Ok(tasks) = std::fs::read_dir("/proc/self/task") else {
        return 0;
    };
    tasks
        .filter_map(Result::ok)
        .filter_map(|task| std::fs::read_to_string(task.path().join("schedstat")).ok())
        .filter_map(|stat| stat.split_whitespace().next()?.parse::<u64>().ok())
        .sum()
}

/// `iters` sequential calls; the elapsed time.
fn run(rt: &Runtime, client: &Client, iters: u64) -> Duration {
    let arguments = arguments();
    rt.block_on(async {
        let start = Instant::now();
        for _ in 0..iters {
            call(client, &arguments).await;
        }
        start.elapsed()
    })
}

/// One served handler and the directory its audit log lives in (kept until dropped).
struct Variant {
    name: &'static str,
    client: Client,
    _dir: Option<tempfile::TempDir>,
}

fn ungated(rt: &Runtime) -> Variant {
    Variant {
        name: "ungated",
        client: rt.block_on(connect(Tools::new())),
        _dir: None,
    }
}

fn gated(rt: &Runtime, name: &'static str, dir: tempfile::TempDir) -> Variant {
    let audit = FileAuditLog::open(dir.path().join("audit.jsonl")).unwrap();
    let gated = Gated::builder(Tools::new())
        .policy(Policy::from_json(POLICY).unwrap())
        .audit(Arc::new(audit))
        .build()
        .unwrap();
    Variant {
        name,
        client: rt.block_on(connect(gated)),
        _dir: Some(dir),
    }
}

fn shm_available() -> bool {
    Path::new("/dev/shm").is_dir() && tempfile::tempdir_in("/dev/shm").is_ok()
}

fn disk_base() -> PathBuf {
    std::env::var_os("GATE_BENCH_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| std::env::current_dir().unwrap())
}

fn variants(rt: &Runtime) -> Vec<Variant> {
    let mut all = vec![ungated(rt)];
    if shm_available() {
        all.push(gated(
            rt,
            "gated_shm",
            tempfile::tempdir_in("/dev/shm").unwrap(),
        ));
    } else {
        println!(
            "/dev/shm is absent or not writable: skipping gated_shm (gate work not separated)"
        );
    }
    all.push(gated(
        rt,
        "gated_disk",
        tempfile::tempdir_in(disk_base()).unwrap(),
    ));
    all
}

fn entry(i: u64) -> AuditEntry {
    AuditEntry::tool_call(
        format!("bench-{i:08}"),
        "echo",
        Decision::Allow,
        "executed",
        Sha256Digest::of(b"{}"),
    )
    .with_policy_digest(Sha256Digest::of(b"policy"))
}

fn criterion_groups(c: &mut Criterion, rt: &Runtime, variants: &[Variant]) {
    let mut group = c.benchmark_group("gate_cost");
    for variant in variants {
        if variant.name == "gated_disk" {
            // Each call waits for an fsync: fewer, longer samples keep the run in bounds.
            group.sample_size(20);
        }
        group.bench_function(variant.name, |b| {
            b.iter_custom(|iters| run(rt, &variant.client, iters))
        });
    }
    group.sample_size(100);
    if shm_available() {
        let dir = tempfile::tempdir_in("/dev/shm").unwrap();
        let log = FileAuditLog::open(dir.path().join("audit.jsonl")).unwrap();
        let mut i = 0;
        group.bench_function("audit_append_shm", |b| {
            b.iter(|| {
                i += 1;
                log.append(&entry(i)).unwrap()
            })
        });
    }
    let dir = tempfile::tempdir_in(disk_base()).unwrap();
    let mut file = File::create(dir.path().join("probe")).unwrap();
    group.sample_size(20);
    group.bench_function("raw_fdatasync_disk", |b| {
        b.iter(|| {
            file.write_all(&[b'x'; 300]).unwrap();
            file.sync_data().unwrap();
        })
    });
    group.finish();
}

fn median(samples: &mut [f64]) -> f64 {
    samples.sort_by(f64::total_cmp);
    let n = samples.len();
    if n % 2 == 1 {
        samples[n / 2]
    } else {
        (samples[n / 2 - 1] + samples[n / 2]) / 2.0
    }
}

fn load_average() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .map(|s| s.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
        .unwrap_or_else(|_| "unknown".into())
}

/// Interleaved rounds: each round runs `calls` sequential calls on every variant in turn.
fn summary(rt: &Runtime, variants: &[Variant], rounds: usize, calls: u64) {
    println!("load average before the summary: {}", load_average());
    for variant in variants {
        run(rt, &variant.client, calls.min(50));
    }
    // Per variant: (wall us/call, CPU us/call) of each round.
    let mut wall: Vec<Vec<f64>> = vec![Vec::new(); variants.len()];
    let mut cpu: Vec<Vec<f64>> = vec![Vec::new(); variants.len()];
    for _ in 0..rounds {
        for (i, variant) in variants.iter().enumerate() {
            let cpu_before = cpu_ns();
            let elapsed = run(rt, &variant.client, calls);
            let cpu_used = cpu_ns().saturating_sub(cpu_before);
            wall[i].push(elapsed.as_secs_f64() * 1e6 / calls as f64);
            cpu[i].push(cpu_used as f64 / 1e3 / calls as f64);
        }
    }
    println!(
        "gate cost summary: {rounds} interleaved rounds x {calls} sequential calls, medians per call"
    );
    println!(
        "  (CPU = time on CPU of all this process's threads: client, server and gate together)"
    );
    let mut medians = Vec::new();
    for (i, variant) in variants.iter().enumerate() {
        let lo = wall[i].iter().copied().fold(f64::INFINITY, f64::min);
        let hi = wall[i].iter().copied().fold(0.0, f64::max);
        let (w, c) = (median(&mut wall[i]), median(&mut cpu[i]));
        println!(
            "  {:<11} wall {w:>8.1} us (rounds {lo:.1} .. {hi:.1})  CPU {c:>7.1} us",
            variant.name
        );
        medians.push((variant.name, w, c));
    }
    let of = |name: &str| {
        medians
            .iter()
            .find(|(n, _, _)| *n == name)
            .map(|(_, w, c)| (*w, *c))
    };
    if let (Some(ungated), Some(shm)) = (of("ungated"), of("gated_shm")) {
        println!(
            "  gate work (gated_shm - ungated): wall {:.1} us/call, CPU {:.1} us/call (target <= 20 us)",
            shm.0 - ungated.0,
            shm.1 - ungated.1
        );
    }
    if let (Some(shm), Some(disk)) = (of("gated_shm"), of("gated_disk")) {
        println!(
            "  audit fsync (gated_disk - gated_shm): wall {:.1} us/call, CPU {:.1} us/call",
            disk.0 - shm.0,
            disk.1 - shm.1
        );
    }
    println!("load average after the summary: {}", load_average());
}

fn main() {
    // `cargo bench` passes `--bench`; `cargo test --benches` runs this binary without it, and then
    // criterion runs each function once and the summary is a short smoke run.
    let full = std::env::args().any(|a| a == "--bench");
    // Under `--profile-time` (a profiler attached) only the criterion functions run.
    let profiling = std::env::args().any(|a| a == "--profile-time");
    let rt = Runtime::new().unwrap();
    let variants = variants(&rt);
    let mut c = Criterion::default().configure_from_args();
    criterion_groups(&mut c, &rt, &variants);
    c.final_summary();
    if !profiling {
        let (rounds, calls) = if full { (7, 500) } else { (1, 3) };
        summary(&rt, &variants, rounds, calls);
    }
    for variant in variants {
        rt.block_on(variant.client.cancel()).unwrap();
    }
}
