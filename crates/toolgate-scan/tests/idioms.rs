//! The entitlement scanner on servers written in the idioms of public rmcp servers (issue 18,
//! item 2): each fixture under `fixtures/scan/idioms/` is a small crate (sources only, parsed and
//! never compiled) laid out like one or more public servers, with its state in fields of types
//! declared in other modules, behind `Arc<Mutex<_>>`, in `let` bindings, helper parameters, trait
//! objects and generic parameters.
//!
//! Each row names a tool, the families its handler really has (exactly), and the calls the
//! scanner must report as unresolved (exactly; sorted, deduplicated): method calls on a value
//! whose declared type comes from an external crate that is neither in the rule tables nor known
//! inert, written as the receiver chain and the method (`self.github.orgs`, `client.put_object`,
//! `self.session.lock(..).await.current`). Calls on values whose type cannot be known at all
//! (results of external calls, closure parameters) are not reported.
//!
//! The comment on each row names the public server whose idiom it models.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use toolgate_contract::{Annotations, ToolDefinition};
use toolgate_scan::{HandlerRef, ScanReport, check_claims, find_tool_handlers, scan_handlers};

const READ: &str = "filesystemRead";
const WRITE: &str = "filesystemWrite";
const NET: &str = "network";
const PROC: &str = "subprocess";

/// One tool of one fixture and what its handler must be found to do.
struct Row {
    fixture: &'static str,
    tool: &'static str,
    families: &'static [&'static str],
    unresolved: &'static [&'static str],
}

const fn row(
    fixture: &'static str,
    tool: &'static str,
    families: &'static [&'static str],
    unresolved: &'static [&'static str],
) -> Row {
    Row {
        fixture,
        tool,
        families,
        unresolved,
    }
}

/// Families in [`toolgate_contract::Entitlements::families`] order.
const ROWS: &[Row] = &[
    // kv_store: a store declared in another module and file, as postgres-mcp's `conns: Conns` in
    // pg.rs and the rust-sdk memory example (tyrchen/postgres-mcp,
    // modelcontextprotocol/rust-sdk examples/servers).
    // `self.store.create(..)`, `store: Store` declared in store/mod.rs.
    row("kv_store", "put", &[WRITE], &[]),
    // `let store = &self.store; store.create(..)`.
    row("kv_store", "put_ref", &[WRITE], &[]),
    // `let store: &Store = &self.shared;` (an `Arc<Store>` field).
    row("kv_store", "put_shared", &[WRITE], &[]),
    // `let scratch = Store::new(..); scratch.create(..)`.
    row("kv_store", "put_scratch", &[WRITE], &[]),
    // `persist::save(&self.store, ..)` with `fn save(store: &Store, ..)`: a typed helper
    // parameter, as the sandboxed filesystem servers' `handlers::read_file(&self.sandbox, ..)`.
    row("kv_store", "put_via_helper", &[WRITE], &[]),
    // `self.archive.create(..)`: `Archive::create`, not `Store::create`.
    row("kv_store", "archive_key", &[WRITE, PROC], &[]),
    // read_only_hint = true; `Store::get` -> `self.index.touch(..)` appends to a file (field chain).
    row("kv_store", "peek", &[READ, WRITE], &[]),
    // `self.store.count()`: `Store::count` only, never `Archive::count` (which runs `ls`).
    row("kv_store", "count_keys", &[], &[]),
    // `.clone()` and `.to_string()` on a request field and on our own derived-Clone store.
    row("kv_store", "echo_key", &[], &[]),
    //
    // counter_state: state behind locks: rust-sdk counter (`Arc<tokio::sync::Mutex<i32>>`),
    // video-transcriber-mcp-rs (`Arc<Mutex<TranscriberEngine>>`), mcp-containerd
    // (`Arc<Mutex<Option<Client>>>`) (modelcontextprotocol/rust-sdk,
    // nhatvu148/video-transcriber-mcp-rs, jokemanfire/mcp-containerd).
    // `*self.counter.lock().await += 1` on an `i32`: nothing, and nothing unresolved.
    row("counter_state", "increment", &[], &[]),
    // `self.journal.lock().await.record(1)` (tokio Mutex).
    row("counter_state", "record", &[WRITE], &[]),
    // `let journal = self.journal.lock().await; journal.total()`: `Journal::total`, not the
    // `Ledger::total` that compacts a file.
    row("counter_state", "get_total", &[], &[]),
    // `let history = self.history.lock().unwrap(); history.save(..)` (std Mutex).
    row("counter_state", "save_history", &[WRITE], &[]),
    // `self.snapshots.read().expect(..).load(..)` (std RwLock).
    row("counter_state", "load_snapshot", &[READ], &[]),
    // `self.archive.write().await.save(..)` (tokio RwLock).
    row("counter_state", "archive_value", &[WRITE], &[]),
    //
    // pg_conns: postgres-mcp (tyrchen/postgres-mcp): `conns: Conns` in pg.rs, pools in an
    // `Arc<RwLock<HashMap<String, Conn>>>`, `sqlx::postgres::PgPool` fields (imported by `use`).
    // `PgPool::connect(..)` in `Conns::register`.
    row("pg_conns", "register", &[NET], &[]),
    // Removes a pool from the map: no I/O of its own.
    row("pg_conns", "unregister", &[], &[]),
    // `sqlx::query_as(..).fetch_one(&conn.pool)` in `Conns::query`.
    row("pg_conns", "query", &[NET], &[]),
    // `self.inner.read().await.keys()`: std map, nothing.
    row("pg_conns", "list_connections", &[], &[]),
    // `self.admin.acquire()`, `admin: PgPool`: the family of the field's declared path.
    row("pg_conns", "ping", &[NET], &[]),
    //
    // github_api: mcp-github (mehdig-dev/mcp-github): an SDK client with no rule,
    // `github: Arc<octocrab::Octocrab>`, used in builder chains; an S3 client likewise.
    // `self.github.orgs(..).list_repos().send()`, falling back to `self.github.users(..)..`:
    // the calls on the results are not reported (their type is unknown).
    row(
        "github_api",
        "list_repos",
        &[],
        &["self.github.orgs", "self.github.users"],
    ),
    // `self.github.issues(..)` twice: one entry.
    row("github_api", "get_issue", &[], &["self.github.issues"]),
    // `self.github.get(route, None::<&()>)`: octocrab's raw route.
    row("github_api", "list_runs", &[], &["self.github.get"]),
    // `self.session.lock().await.current()`, `session: Arc<tokio::sync::Mutex<Octocrab>>`.
    row(
        "github_api",
        "whoami",
        &[],
        &["self.session.lock(..).await.current"],
    ),
    // `let gh = octocrab::instance(); gh.current()..`: the result of an external function has no
    // type the scanner can know, so nothing is reported (a blind spot, by definition).
    row("github_api", "whoami_global", &[], &[]),
    // `self.api.get_json(..)` -> `self.http.get(..)`, `http: Client` after `use reqwest::Client`.
    row("github_api", "rate_limit", &[NET], &[]),
    // `crate::storage::put(&self.s3, ..)` with `client: &aws_sdk_s3::Client`.
    row("github_api", "upload_artifact", &[], &["client.put_object"]),
    // `let s3 = &self.s3; s3.delete_object()..`.
    row("github_api", "delete_artifact", &[], &["s3.delete_object"]),
    // `self.s3.list_buckets()`, `s3: aws_sdk_s3::Client`.
    row("github_api", "list_buckets", &[], &["self.s3.list_buckets"]),
    // `self.regional.read().unwrap().list_buckets()`, `Arc<std::sync::RwLock<aws_sdk_s3::Client>>`.
    row(
        "github_api",
        "list_regional_buckets",
        &[],
        &["self.regional.read(..).unwrap(..).list_buckets"],
    ),
    // `Option<String>` fields and parameters: `.clone()`, `.or_else(..)`, `.to_string()`.
    row("github_api", "default_owner", &[], &[]),
    //
    // fs_service: rust-mcp-servers' fs_mcp (sabry-awad97/rust-mcp-servers crates/fs_mcp):
    // `file_operations: Arc<dyn FileOperations>` with one impl in application/, tokio::fs; the
    // path sandbox of the sandboxed filesystem servers.
    // read_only_hint = true; canonicalize in `Sandbox::resolve`, `LocalFiles::read_entire`.
    row("fs_service", "read_text_file", &[READ], &[]),
    // `self.files.write_file(..)` through `Arc<dyn FileOperations>`.
    row("fs_service", "write_file", &[READ, WRITE], &[]),
    // read_only_hint = true; `apply_edits(.., dry_run = true)` writes unless `dry_run`: the
    // scanner cannot know the flag, so the claim is contradicted.
    row("fs_service", "preview_edit", &[READ, WRITE], &[]),
    // `self.files.remove(..)`: `LocalFiles::remove`, not `ShellCache::remove` (`Cache` trait).
    row("fs_service", "delete_file", &[READ, WRITE], &[]),
    // `self.trash.discard(..)` through `Box<dyn Trash>`.
    row("fs_service", "move_to_trash", &[READ, WRITE], &[]),
    // `self.cache.remove(..)` through `Arc<dyn Cache>`: `ShellCache::remove` runs `rm`.
    row("fs_service", "evict", &[PROC], &[]),
    // `handlers::stat(&self.sandbox, ..)` with `sandbox: &Sandbox`, then tokio::fs::metadata.
    row("fs_service", "file_info", &[READ], &[]),
    // The trait's default `describe`: nothing.
    row("fs_service", "describe_backend", &[], &[]),
    // `self.sandbox.roots()`: nothing.
    row("fs_service", "list_allowed_directories", &[], &[]),
    //
    // generic_data: the rust-sdk `GenericService<DS: DataService>` example
    // (modelcontextprotocol/rust-sdk examples/servers/src/common/generic_service.rs).
    // `self.data_service.get_data()`, `data_service: Arc<DS>`, `DS: DataService` on the struct;
    // `FileData::get_data`, not `MetricsSource::get_data` (which opens a TCP connection).
    row("generic_data", "get_data", &[READ], &[]),
    row("generic_data", "set_data", &[WRITE], &[]),
    // The trait's default `label`.
    row("generic_data", "label", &[], &[]),
    // `impl<S: DataService> Mirror<S>`: the bound on the impl only.
    row("generic_data", "mirror_data", &[READ], &[]),
    // `impl<I> Searcher<I> where I: SearchIndex + ..`: a where-clause.
    row("generic_data", "search", &[READ], &[]),
    //
    // ctr_cli: mcp-containerd (jokemanfire/mcp-containerd): `CtrCmd` wraps
    // `std::process::Command` in ctr/cmd.rs, built per call; the runtime client behind
    // `Arc<tokio::sync::Mutex<Option<_>>>`; logs read in a helper.
    // `let ctr = CtrCmd::new(..); ctr.images_list()`.
    row("ctr_cli", "list_images_ctr", &[PROC], &[]),
    // `let ctr: CtrCmd = self.create_ctr_cmd(..); ctr.custom(..)`.
    row("ctr_cli", "run_ctr_command", &[PROC], &[]),
    // `crate::logs::tail(..)`: tokio::fs::read_to_string in a helper module.
    row("ctr_cli", "get_containerd_logs", &[READ], &[]),
    // `let client: &RuntimeClient = lock.as_ref().ok_or_else(..)?; client.version()`: a Unix
    // socket in `RuntimeClient::version`.
    row("ctr_cli", "version", &[NET], &[]),
    //
    // fetch_client: rust-mcp-servers' fetch_mcp (sabry-awad97/rust-mcp-servers crates/fetch_mcp):
    // `service: FetchService`; `build_client` in utils/http.rs, re-exported by utils/mod.rs
    // (`pub use http::build_client`) and imported as `crate::utils::build_client`.
    // Both of the below.
    row("fetch_client", "fetch", &[NET], &[]),
    // `FetchService::fetch_url` -> `build_client(..)` (reqwest::Client::builder) through the
    // re-export: today's scanner looks for `build_client` in a module named `utils` only.
    row("fetch_client", "fetch_page", &[NET], &[]),
    // `FetchService::check_robots` -> `self.robots.allowed(..)` -> `self.http.get(..)` with
    // `http: Client` after `use reqwest::Client`: the field's declared path alone.
    row("fetch_client", "check_robots", &[NET], &[]),
    // `self.service.user_agent().to_string()`.
    row("fetch_client", "user_agent", &[], &[]),
    // tyrchen/postgres-mcp style with a transaction: `tx.commit()` on a sqlx transaction is not
    // the storage floor's `.commit(..)` (its receiver's declared type is sqlx's).
    row("pg_conns", "drop_table", &[NET], &[]),
    // jokemanfire/mcp-containerd: `let ctr = self.create_ctr_cmd(ns); ctr.image_pull(..)`, the
    // local typed by the declared return type of one of our methods.
    row("ctr_cli", "pull_image_ctr", &[PROC], &[]),
    // jokemanfire/mcp-containerd: `let lock = self.runtime.lock().await;
    // if let Some(client) = &*lock { client.version() }` over `Mutex<Option<RuntimeClient>>`.
    row("ctr_cli", "runtime_status", &[NET], &[]),
    // jokemanfire/mcp-containerd: the field's type through a `type` alias
    // (`standby: SharedRuntime`, `type SharedRuntime = Arc<Mutex<Option<RuntimeClient>>>`).
    row("ctr_cli", "standby_version", &[NET], &[]),
    // mehdig-dev/mcp-github style: `self.s3_client()?.list_buckets()` where our
    // `fn s3_client(&self) -> Result<&aws_sdk_s3::Client, ErrorData>`.
    row(
        "github_api",
        "list_buckets_checked",
        &[],
        &["self.s3_client(..)?.list_buckets"],
    ),
];

/// Read-only tools (their `#[tool]` carries `annotations(read_only_hint = true)`): the families of
/// the evidence that contradicts the claim, or none when the claim holds.
const CLAIMS: &[(&str, &str, &[&str])] = &[
    // A write behind a read, two fields down: Store::get -> self.index.touch.
    ("kv_store", "peek", &[WRITE]),
    ("kv_store", "count_keys", &[]),
    // A dry run the scanner cannot tell from a write.
    ("fs_service", "preview_edit", &[WRITE]),
    ("fs_service", "read_text_file", &[]),
];

fn fixture_root(fixture: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../fixtures/scan/idioms")
        .join(fixture)
}

/// Every tool of a fixture, scanned once.
struct Scanned {
    handlers: Vec<HandlerRef>,
    reports: BTreeMap<String, ScanReport>,
}

fn scan(fixture: &str) -> Scanned {
    let roots = [fixture_root(fixture)];
    let handlers = find_tool_handlers(&roots).unwrap();
    let reports = scan_handlers(&roots, &handlers).unwrap();
    Scanned { handlers, reports }
}

fn families(report: &ScanReport) -> Vec<&'static str> {
    report
        .entitlements
        .families()
        .iter()
        .filter(|(_, on)| *on)
        .map(|(name, _)| *name)
        .collect()
}

fn unresolved_calls(report: &ScanReport) -> Vec<&str> {
    let mut calls: Vec<&str> = report.unresolved.iter().map(|u| u.call.as_str()).collect();
    calls.sort_unstable();
    calls.dedup();
    calls
}

/// The rows' differences from what the scanner finds, one line each.
fn differences(rows: &[Row]) -> Vec<String> {
    let mut scanned: BTreeMap<&str, Scanned> = BTreeMap::new();
    let mut out = Vec::new();
    for row in rows {
        let fixture = scanned
            .entry(row.fixture)
            .or_insert_with(|| scan(row.fixture));
        let handlers: Vec<&HandlerRef> = fixture
            .handlers
            .iter()
            .filter(|h| h.tool == row.tool)
            .collect();
        if handlers.len() != 1 {
            out.push(format!(
                "{}/{}: {} #[tool] handlers of that name, expected 1",
                row.fixture,
                row.tool,
                handlers.len()
            ));
            continue;
        }
        let report = &fixture.reports[row.tool];
        let found = families(report);
        if found != row.families {
            let whats: Vec<String> = report
                .evidence
                .iter()
                .map(|e| format!("{} {} via {}", e.family, e.what, e.via.join(" -> ")))
                .collect();
            out.push(format!(
                "{}/{}: families {:?}, expected {:?}; evidence: {:?}",
                row.fixture, row.tool, found, row.families, whats
            ));
        }
        let calls = unresolved_calls(report);
        if calls != row.unresolved {
            out.push(format!(
                "{}/{}: unresolved {:?}, expected {:?}",
                row.fixture, row.tool, calls, row.unresolved
            ));
        }
        if !report.evasion.is_empty() {
            out.push(format!(
                "{}/{}: evasion {:?}, expected none",
                row.fixture,
                row.tool,
                report.evasion_kinds()
            ));
        }
        if let Some(e) = report
            .evidence
            .iter()
            .find(|e| e.via.first() != Some(&handlers[0].function))
        {
            out.push(format!(
                "{}/{}: evidence chain {:?} does not start at the handler",
                row.fixture, row.tool, e.via
            ));
        }
    }
    out
}

#[test]
fn idioms() {
    let diffs = differences(ROWS);
    assert!(
        diffs.is_empty(),
        "{} differences over {} rows:\n{}",
        diffs.len(),
        ROWS.len(),
        diffs.join("\n")
    );
}

/// The tables and the fixtures name the same tools: a tool added to a fixture needs a row.
#[test]
fn every_fixture_tool_has_a_row() {
    let mut fixtures: Vec<&str> = ROWS.iter().map(|r| r.fixture).collect();
    fixtures.sort_unstable();
    fixtures.dedup();
    let mut on_disk: Vec<String> = std::fs::read_dir(fixture_root(""))
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    on_disk.sort_unstable();
    assert_eq!(fixtures, on_disk, "fixtures with rows vs fixtures on disk");
    for fixture in fixtures {
        let mut tools: Vec<String> = find_tool_handlers(&[fixture_root(fixture)])
            .unwrap()
            .into_iter()
            .map(|h| h.tool)
            .collect();
        tools.sort_unstable();
        let mut rows: Vec<&str> = ROWS
            .iter()
            .filter(|r| r.fixture == fixture)
            .map(|r| r.tool)
            .collect();
        rows.sort_unstable();
        assert_eq!(tools, rows, "{fixture}: #[tool]s vs rows");
    }
}

fn read_only(name: &str) -> ToolDefinition {
    ToolDefinition {
        name: name.to_owned(),
        description: None,
        input_schema: serde_json::json!({"type": "object"}),
        output_schema: None,
        annotations: Annotations {
            read_only: Some(true),
            ..Annotations::default()
        },
    }
}

#[test]
fn read_only_claims() {
    for &(fixture, tool, contradicted_by) in CLAIMS {
        let source = std::fs::read_to_string(fixture_root(fixture).join("src/server.rs")).unwrap();
        let at = source
            .find(&format!("async fn {tool}("))
            .unwrap_or_else(|| panic!("{fixture}/{tool}: no handler in server.rs"));
        let attribute = &source[source[..at].rfind("#[tool(").unwrap()..at];
        assert!(
            attribute.contains("read_only_hint = true"),
            "{fixture}/{tool}: the fixture does not claim read_only_hint = true"
        );
        let scanned = scan(fixture);
        let report = &scanned.reports[tool];
        match check_claims(&read_only(tool), report) {
            None => assert!(
                contradicted_by.is_empty(),
                "{fixture}/{tool}: no violation, expected one by {contradicted_by:?}; {:#?}",
                report.evidence
            ),
            Some(violation) => {
                let mut by: Vec<&str> = violation.evidence.iter().map(|e| e.family).collect();
                by.sort_unstable();
                by.dedup();
                assert_eq!(by, contradicted_by, "{fixture}/{tool}: {violation}");
            }
        }
    }
}
