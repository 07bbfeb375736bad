//! What the gate costs per tools/call: one cheap tool (`echo`) served in process over
//! `tokio::io::duplex` to an rmcp client, called sequentially (one request in flight), measured
//!
//! - `ungated`: the bare handler, the baseline (rmcp client + server + transport);
//! - `gated_mem`: the same handler inside `Gated` with a `MemoryAuditLog` (every record sealed and
//!   chained exactly as in the file, kept in memory; it never blocks, so the gate appends from the
//!   calling task), so `gated_mem - ungated` is the gate's own work;
//! - `gated_shm`: the file audit log on tmpfs (`/dev/shm`), where fsync is nearly free, so
//!   `gated_shm - gated_mem` is the file log's system calls plus the hand-off of each append to
//!   tokio's blocking pool (the file log may block, so it is never called on a runtime thread);
//! - `gated_disk`: the audit log on the normal disk (a tempdir under the working directory, or
//!   `GATE_BENCH_DIR`), so `gated_disk - gated_shm` is what the audit record's fsync costs.
//!
//! The difference `gated_mem - ungated` is that of two end-to-end times of about 140 us, each
//! mostly rmcp, the transport and thread wake-ups, and on a shared 2-core machine it moves by as
//! much as the gate costs. So two more rows call the handler's `ServerHandler::call_tool` directly,
//! on one thread, with no transport and no other task (the same request, a fresh
//! `RequestContext` each call):
//!
//! - `direct_handler`: `Tools` itself;
//! - `direct_gated`: the same `Tools` inside `Gated` with a `MemoryAuditLog`;
//!
//! - `direct_cedar` (feature `cedar`): the same, under the same policy naming 1,000 Cedar
//!   policies, 50 of which apply to the caller's call of `echo` (10 permits, 20 forbids that read
//!   the call's context, 20 decided without it), the shapes of the Cedar bench of
//!   `toolgate-policy`;
//!
//! and `direct_gated - direct_handler` is the gate's own work per call, everything it does before
//! the audit record would be written to a file: policy, argument checks, JSON Schema, permit, the
//! sealed and chained audit record.
//!
//! Two context rows: `audit_append_shm` (`FileAuditLog::append` alone on tmpfs) and
//! `raw_fdatasync_disk` (a 300-byte write + fdatasync in the disk directory).
//!
//! Run: `cargo bench -p toolgate-rmcp --bench gate_cost` (with `GATE_COST_CALLS=ROW:N`, only N
//! calls of one `direct_*` row, for a profiler). After criterion's report the bench
//! prints a summary measured separately, the variants interleaved round by round so that load
//! changes on a shared machine hit them alike, with the medians, the differences, and the number of
//! thread wake-ups per call (which, unlike times, does not depend on the machine's load).

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
use rmcp::model::{
    CallToolRequestParams, CallToolResponse, RequestId, ServerCapabilities, ServerConfig,
};
use rmcp::service::{Peer, RequestContext, RoleClient, RoleServer, RunningService};
use rmcp::{ServerHandler, ServiceExt as _, tool, tool_handler, tool_router};
use schemars::JsonSchema;
use serde::Deserialize;
use serde_json::{Map, Value, json};
use tokio::runtime::Runtime;
use toolgate_audit::{AuditDecision, AuditEntry, AuditSink, FileAuditLog, MemoryAuditLog};
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

/// The measured request: `echo` with `arguments`.
fn echo_params(arguments: &Map<String, Value>) -> CallToolRequestParams {
    let mut params = CallToolRequestParams::new("echo");
    params.arguments = Some(arguments.clone());
    params
}

async fn call(client: &Client, arguments: &Map<String, Value>) {
    let result = client.call_tool(echo_params(arguments)).await.unwrap();
    assert_ne!(result.is_error, Some(true), "echo failed: {result:?}");
}

/// CPU time used so far by this process's live threads (client, server, runtime workers and
/// blocking pool alike), in nanoseconds, and how many times they were scheduled onto a CPU (each
/// wake-up of a sleeping thread is one), from `/proc/self/task/*/schedstat`; 0 where unavailable.
/// The second count does not depend on the machine's load, so it shows thread hand-offs even when
/// times are noisy.
fn cpu_ns() -> (u64, u64) {
    let Ok(tasks) = std::fs::read_dir("/proc/self/task") else {
        return (0, 0);
    };
    tasks
        .filter_map(Result::ok)
        .filter_map(|task| std::fs::read_to_string(task.path().join("schedstat")).ok())
        .filter_map(|stat| {
            let mut fields = stat.split_whitespace();
            let ns = fields.next()?.parse::<u64>().ok()?;
            let slices = fields.nth(1)?.parse::<u64>().ok()?;
            Some((ns, slices))
        })
        .fold((0, 0), |(ns, sl), (n, s)| (ns + n, sl + s))
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
    gated_with(rt, name, Arc::new(audit), Some(dir))
}

fn gated_with(
    rt: &Runtime,
    name: &'static str,
    audit: Arc<dyn AuditSink>,
    dir: Option<tempfile::TempDir>,
) -> Variant {
    let gated = Gated::builder(Tools::new())
        .policy(Policy::from_json(POLICY).unwrap())
        .audit(audit)
        .build()
        .unwrap();
    Variant {
        name,
        client: rt.block_on(connect(gated)),
        _dir: dir,
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
    let mut all = vec![
        ungated(rt),
        gated_with(rt, "gated_mem", Arc::new(MemoryAuditLog::new()), None),
    ];
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
        AuditDecision::Allow,
        toolgate_audit::Outcome::Committed,
        Sha256Digest::of(b"{}"),
    )
    .with_policy_digest(Sha256Digest::of(b"policy"))
}

/// A handler called without a transport: `ServerHandler::call_tool` on this thread, with a
/// `RequestContext` carrying the peer of a served (idle) handler.
struct Direct {
    rt: Runtime,
    handler: Tools,
    gated: Gated<Tools>,
    /// The gate with Cedar policies, and the directory of its policy files.
    #[cfg(feature = "cedar")]
    cedar: (Gated<Tools>, tempfile::TempDir),
    peer: Peer<RoleServer>,
    _server: RunningService<RoleServer, Tools>,
    _client: Client,
}

impl Direct {
    fn new() -> Self {
        // One thread: the calls are measured alone, with no hand-off between threads.
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        let (server_half, client_half) = tokio::io::duplex(64 * 1024);
        let (server, client) = rt.block_on(async {
            let server = tokio::spawn(Tools::new().serve(server_half));
            let client = ().serve(client_half).await.unwrap();
            (server.await.unwrap().unwrap(), client)
        });
        let gated = Gated::builder(Tools::new())
            .policy(Policy::from_json(POLICY).unwrap())
            .audit(Arc::new(MemoryAuditLog::new()))
            .build()
            .unwrap();
        Direct {
            rt,
            handler: Tools::new(),
            gated,
            #[cfg(feature = "cedar")]
            cedar: cedar_gate(),
            peer: server.peer().clone(),
            _server: server,
            _client: client,
        }
    }

    /// The handlers called directly: the bare one, the gated one and, with Cedar, the one gated
    /// with Cedar policies.
    fn which(&self) -> Vec<(&'static str, Option<&Gated<Tools>>)> {
        #[allow(unused_mut)]
        let mut which = vec![
            ("direct_handler", None),
            ("direct_gated", Some(&self.gated)),
        ];
        #[cfg(feature = "cedar")]
        which.push(("direct_cedar", Some(&self.cedar.0)));
        which
    }

    /// `iters` calls of `gated` (`None`: the bare handler); the elapsed time.
    fn run(&self, gated: Option<&Gated<Tools>>, iters: u64) -> Duration {
        let arguments = arguments();
        self.rt.block_on(async {
            let start = Instant::now();
            for i in 0..iters {
                let params = echo_params(&arguments);
                let id = RequestId::Number(i64::try_from(i).unwrap_or(i64::MAX));
                let context = RequestContext::new(id, self.peer.clone());
                let response = match gated {
                    Some(gated) => gated.call_tool(params, context).await,
                    None => self.handler.call_tool(params, context).await,
                };
                match response {
                    Ok(CallToolResponse::Complete(result)) => {
                        assert_ne!(result.is_error, Some(true), "echo failed: {result:?}");
                    }
                    other => panic!("echo failed: {other:?}"),
                }
            }
            start.elapsed()
        })
    }
}

/// A gate over `Tools` under [`POLICY`] naming 1,000 Cedar policies, validated against the
/// tools' contract, for the configured principal `local` over stdio. 950 policies are other
/// principals'; the 50 that apply to `local`'s call of `echo` cycle through five shapes: a permit,
/// a forbid on the text, a tenant forbid, a forbid on the time, a forbid off stdio.
#[cfg(feature = "cedar")]
fn cedar_gate() -> (Gated<Tools>, tempfile::TempDir) {
    use toolgate_contract::contract::{ServerContract, ToolContract};
    use toolgate_contract::lockfile::Lockfile;
    use toolgate_contract::model::{Annotations, HandlerFacts, ToolDefinition};

    let dir = tempfile::tempdir().unwrap();
    let mut cedar = String::from(
        "@id(\"lists\")\npermit(principal, action == Toolgate::Action::\"tools/list\", resource);\n",
    );
    let echo = "action == Toolgate::Action::\"echo\"";
    for i in 0..999 {
        let rule = if i % 20 != 0 {
            format!("permit(principal == Toolgate::Caller::\"user-{i}\", {echo}, resource);")
        } else {
            match (i / 20) % 5 {
                0 => format!("permit(principal == Toolgate::Caller::\"local\", {echo}, resource);"),
                1 => format!(
                    "forbid(principal, {echo}, resource) when {{ context.arguments.text like \"*forbidden-{i}*\" }};"
                ),
                2 => format!(
                    "forbid(principal, {echo}, resource) when {{ principal has tenant && principal.tenant == \"tenant-{i}\" }};"
                ),
                3 => format!("forbid(principal, {echo}, resource) when {{ context.now < {i} }};"),
                _ => format!(
                    "forbid(principal, {echo}, resource) unless {{ principal.channel == \"stdio\" }};"
                ),
            }
        };
        cedar.push_str(&format!("@id(\"p{i}\")\n{rule}\n"));
    }
    std::fs::write(dir.path().join("bench.cedar"), cedar).unwrap();
    let mut policy: Value = serde_json::from_str(POLICY).unwrap();
    policy["cedar"] = json!("bench.cedar");
    std::fs::write(dir.path().join("policy.json"), policy.to_string()).unwrap();
    let policy = Policy::load(&dir.path().join("policy.json")).unwrap();

    let tools = Tools::tool_router().list_all();
    let contracts: Vec<ToolContract> = tools
        .iter()
        .map(|tool| {
            let name = tool.name.to_string();
            let definition = ToolDefinition {
                name: name.clone(),
                description: tool.description.as_ref().map(|d| d.to_string()),
                input_schema: Value::Object((*tool.input_schema).clone()),
                output_schema: None,
                annotations: Annotations {
                    read_only: tool.annotations.as_ref().and_then(|a| a.read_only_hint),
                    ..Annotations::default()
                },
            };
            let facts = HandlerFacts {
                gate_stages: toolgate_rmcp::contract::gate_stages(&policy, &name),
                policy_fingerprint: policy.fingerprint(&name),
                entitlements: Default::default(),
                evasion: Vec::new(),
                unresolved: Vec::new(),
            };
            ToolContract::build(&definition, &facts).unwrap()
        })
        .collect();
    let live = Lockfile::new(ServerContract::new("bench", contracts).unwrap(), "bench");
    let gated = Gated::builder(Tools::new())
        .policy(policy)
        .audit(Arc::new(MemoryAuditLog::new()))
        .contract(&live)
        .build()
        .unwrap();
    (gated, dir)
}

fn criterion_groups(c: &mut Criterion, rt: &Runtime, variants: &[Variant], direct: &Direct) {
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
    for (name, gated) in direct.which() {
        group.bench_function(name, |b| b.iter_custom(|iters| direct.run(gated, iters)));
    }
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

/// Interleaved rounds: each round runs `calls` sequential calls on every variant in turn, then on
/// the two direct rows.
fn summary(rt: &Runtime, variants: &[Variant], direct: &Direct, rounds: usize, calls: u64) {
    println!("load average before the summary: {}", load_average());
    for variant in variants {
        run(rt, &variant.client, calls.min(50));
    }
    // Per variant: (wall us/call, CPU us/call) of each round.
    let mut wall: Vec<Vec<f64>> = vec![Vec::new(); variants.len()];
    let mut cpu: Vec<Vec<f64>> = vec![Vec::new(); variants.len()];
    let mut wakes: Vec<Vec<f64>> = vec![Vec::new(); variants.len()];
    // us/call of each round of each handler called directly (bare, gated, gated with Cedar).
    let which = direct.which();
    let mut direct_us: Vec<Vec<f64>> = vec![Vec::new(); which.len()];
    for (_, gated) in &which {
        direct.run(*gated, calls.min(50));
    }
    for _ in 0..rounds {
        for (i, (_, gated)) in which.iter().enumerate() {
            let elapsed = direct.run(*gated, calls);
            direct_us[i].push(elapsed.as_secs_f64() * 1e6 / calls as f64);
        }
        for (i, variant) in variants.iter().enumerate() {
            let (cpu_before, slices_before) = cpu_ns();
            let elapsed = run(rt, &variant.client, calls);
            let (cpu_after, slices_after) = cpu_ns();
            wall[i].push(elapsed.as_secs_f64() * 1e6 / calls as f64);
            cpu[i].push(cpu_after.saturating_sub(cpu_before) as f64 / 1e3 / calls as f64);
            wakes[i].push(slices_after.saturating_sub(slices_before) as f64 / calls as f64);
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
        let (w, c, s) = (
            median(&mut wall[i]),
            median(&mut cpu[i]),
            median(&mut wakes[i]),
        );
        println!(
            "  {:<11} wall {w:>8.1} us (rounds {lo:.1} .. {hi:.1})  CPU {c:>7.1} us  thread wake-ups {s:>5.1}",
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
    if let (Some(ungated), Some(mem)) = (of("ungated"), of("gated_mem")) {
        println!(
            "  gate work (gated_mem - ungated): wall {:.1} us/call, CPU {:.1} us/call (target <= 20 us)",
            mem.0 - ungated.0,
            mem.1 - ungated.1
        );
    }
    if let (Some(mem), Some(shm)) = (of("gated_mem"), of("gated_shm")) {
        println!(
            "  audit file on tmpfs, thread hand-off included (gated_shm - gated_mem): wall {:.1} us/call, CPU {:.1} us/call",
            shm.0 - mem.0,
            shm.1 - mem.1
        );
    }
    if let (Some(ungated), Some(shm)) = (of("ungated"), of("gated_shm")) {
        println!(
            "  gate with the file log on tmpfs (gated_shm - ungated): wall {:.1} us/call, CPU {:.1} us/call",
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
    let range = |v: &[f64]| {
        let lo = v.iter().copied().fold(f64::INFINITY, f64::min);
        let hi = v.iter().copied().fold(0.0, f64::max);
        format!("rounds {lo:.1} .. {hi:.1}")
    };
    let handler_range = range(&direct_us[0]);
    let gated_range = range(&direct_us[1]);
    let handler = median(&mut direct_us[0]);
    let gated = median(&mut direct_us[1]);
    println!(
        "  called directly, one thread, no transport: handler {handler:.2} us ({handler_range}), gated {gated:.2} us ({gated_range})"
    );
    println!(
        "  gate work measured directly (direct_gated - direct_handler): {:.2} us/call (target <= 20 us)",
        gated - handler
    );
    if which.len() > 2 {
        let cedar_range = range(&direct_us[2]);
        let cedar = median(&mut direct_us[2]);
        println!(
            "  gated with 1,000 Cedar policies, called directly: {cedar:.2} us ({cedar_range}); gate work with Cedar (direct_cedar - direct_handler): {:.2} us/call ({:.2}x the 20 us target), Cedar's part (direct_cedar - direct_gated): {:.2} us/call ({:.2}x the 10 us goal)",
            cedar - handler,
            (cedar - handler) / 20.0,
            cedar - gated,
            (cedar - gated) / 10.0
        );
    }
    #[cfg(feature = "cedar")]
    paired_cedar(direct, if rounds > 1 { 301 } else { 1 }, calls.min(200));
    println!("load average after the summary: {}", load_average());
}

/// Cedar's cost as differences measured side by side: each of `rounds` rounds runs `calls` calls
/// of the bare handler, the gated one and the one gated with Cedar, one after the other, and
/// keeps the differences of that round; the medians of the differences are reported. Short
/// rounds, back to back, leave a shared machine little time to change between the rows compared.
#[cfg(feature = "cedar")]
fn paired_cedar(direct: &Direct, rounds: usize, calls: u64) {
    let which = direct.which();
    let per_call = |gated, calls: u64| direct.run(gated, calls).as_secs_f64() * 1e6 / calls as f64;
    let (mut total, mut part) = (Vec::new(), Vec::new());
    for _ in 0..rounds {
        let [handler, gated, cedar] = [0, 1, 2].map(|i| per_call(which[i].1, calls));
        total.push(cedar - handler);
        part.push(cedar - gated);
    }
    let (total, part) = (median(&mut total), median(&mut part));
    println!(
        "  paired ({rounds} rounds x {calls} calls of each direct row, medians of the differences): gate work with Cedar {total:.2} us/call ({:.2}x the 20 us target), Cedar's part {part:.2} us/call ({:.2}x the 10 us goal)",
        total / 20.0,
        part / 10.0
    );
}

fn main() {
    // `cargo bench` passes `--bench`; `cargo test --benches` runs this binary without it, and then
    // criterion runs each function once and the summary is a short smoke run.
    let full = std::env::args().any(|a| a == "--bench");
    // Under `--profile-time` (a profiler attached) only the criterion functions run.
    let profiling = std::env::args().any(|a| a == "--profile-time");
    let direct = Direct::new();
    // `GATE_COST_CALLS=direct_cedar:N`: only N direct calls of that row, nothing else, for a
    // profiler or an instruction count (`perf stat -e instructions:u` at two N: the difference
    // over the difference of N is per call, set-up excluded).
    if let Ok(only) = std::env::var("GATE_COST_CALLS") {
        let (name, calls) = only.split_once(':').expect("GATE_COST_CALLS=ROW:CALLS");
        let (_, gated) = direct
            .which()
            .into_iter()
            .find(|(row, _)| *row == name)
            .expect("a direct_* row");
        direct.run(gated, calls.parse().expect("a number of calls"));
        return;
    }
    let rt = Runtime::new().unwrap();
    let variants = variants(&rt);
    let mut c = Criterion::default().configure_from_args();
    criterion_groups(&mut c, &rt, &variants, &direct);
    c.final_summary();
    if !profiling {
        let (rounds, calls) = if full { (7, 500) } else { (1, 3) };
        summary(&rt, &variants, &direct, rounds, calls);
    }
    for variant in variants {
        rt.block_on(variant.client.cancel()).unwrap();
    }
}
