//! `harness::run_step` end to end: a gated in-process server over `tokio::io::duplex`, a
//! 2025-11-25 client, and a key-value store whose `put` can lie (answer success, write nothing).
//! Each test checks the verdict and, through counters kept by the handlers, which calls the
//! harness actually made: the observation only after a successful mutation, the compensation
//! only on ROLLBACK.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use rmcp::handler::server::router::tool::ToolRouter;
use rmcp::handler::server::wrapper::Parameters;
use rmcp::model::{ServerCapabilities, ServerConfig};
use rmcp::service::{RoleClient, RunningService};
use rmcp::{Json, ServerHandler, ServiceExt as _, tool, tool_handler, tool_router};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};
use toolgate::Gated;
use toolgate::audit::FileAuditLog;
use toolgate::harness::{
    CallOutcome, NextStep, Postcondition, Step, ToolCall, expect_contains, run_step,
};
use toolgate::policy::Policy;

/// Every tool of the store is allowed except `wipe`, which is on the deny list.
const POLICY: &str = r#"{
    "version": 1,
    "allow": ["put", "get", "undo", "fail", "status"],
    "deny": ["wipe"]
}"#;

/// The store and what its handlers observed. Counters are incremented only inside bodies.
#[derive(Default)]
struct Store {
    map: Mutex<BTreeMap<String, String>>,
    /// When set, `put` answers success without writing.
    lie: AtomicBool,
    put_calls: AtomicUsize,
    get_calls: AtomicUsize,
    undo_calls: AtomicUsize,
    fail_calls: AtomicUsize,
    status_calls: AtomicUsize,
    wipe_calls: AtomicUsize,
}

#[derive(Debug, Deserialize, JsonSchema)]
struct PutArgs {
    key: String,
    value: String,
}

#[derive(Debug, Deserialize, JsonSchema)]
struct KeyArgs {
    key: String,
}

#[derive(Debug, Serialize, JsonSchema)]
struct Item {
    key: String,
    value: String,
}

#[derive(Debug, Serialize, JsonSchema)]
struct Items {
    items: Vec<Item>,
}

#[derive(Clone)]
struct Tools {
    store: Arc<Store>,
    tool_router: ToolRouter<Self>,
}

#[tool_router]
impl Tools {
    fn new(store: Arc<Store>) -> Self {
        Tools {
            store,
            tool_router: Self::tool_router(),
        }
    }

    /// Stores `value` under `key`, unless the store is lying.
    #[tool]
    async fn put(&self, Parameters(args): Parameters<PutArgs>) -> String {
        self.store.put_calls.fetch_add(1, Ordering::SeqCst);
        if !self.store.lie.load(Ordering::SeqCst) {
            self.store
                .map
                .lock()
                .unwrap()
                .insert(args.key.clone(), args.value);
        }
        format!("stored {}", args.key)
    }

    /// Every stored item, sorted by key.
    #[tool]
    async fn get(&self) -> Json<Items> {
        self.store.get_calls.fetch_add(1, Ordering::SeqCst);
        let items = self
            .store
            .map
            .lock()
            .unwrap()
            .iter()
            .map(|(key, value)| Item {
                key: key.clone(),
                value: value.clone(),
            })
            .collect();
        Json(Items { items })
    }

    /// Removes `key`; the compensation of `put`.
    #[tool]
    async fn undo(&self, Parameters(args): Parameters<KeyArgs>) -> String {
        self.store.undo_calls.fetch_add(1, Ordering::SeqCst);
        let removed = self.store.map.lock().unwrap().remove(&args.key);
        format!("undone {} (was present: {})", args.key, removed.is_some())
    }

    /// Always a tool error (`isError: true`).
    #[tool]
    async fn fail(&self) -> Result<String, String> {
        self.store.fail_calls.fetch_add(1, Ordering::SeqCst);
        Err("Error: the mutation failed".to_owned())
    }

    /// An observation that answers prose, not JSON.
    #[tool]
    async fn status(&self) -> String {
        self.store.status_calls.fetch_add(1, Ordering::SeqCst);
        "everything looks fine".to_owned()
    }

    /// Denied by the policy.
    #[tool]
    async fn wipe(&self) -> String {
        self.store.wipe_calls.fetch_add(1, Ordering::SeqCst);
        self.store.map.lock().unwrap().clear();
        "wiped".to_owned()
    }
}

#[tool_handler(router = self.tool_router)]
impl ServerHandler for Tools {
    fn get_info(&self) -> ServerConfig {
        ServerConfig::new(ServerCapabilities::builder().enable_tools().build())
    }
}

type Client = RunningService<RoleClient, ()>;

struct Setup {
    _dir: tempfile::TempDir,
    audit_path: PathBuf,
    store: Arc<Store>,
    client: Client,
}

/// A gated store served over an in-process duplex pipe, with a 2025-11-25 client connected.
async fn setup() -> Setup {
    let dir = tempfile::tempdir().unwrap();
    let audit_path = dir.path().join("audit.jsonl");
    let store = Arc::new(Store::default());
    let gated = Gated::builder(Tools::new(Arc::clone(&store)))
        .policy(Policy::from_json(POLICY).unwrap())
        .audit(Arc::new(FileAuditLog::open(&audit_path).unwrap()))
        .build()
        .unwrap();
    let (server_half, client_half) = tokio::io::duplex(64 * 1024);
    tokio::spawn(async move {
        let server = gated.serve(server_half).await.unwrap();
        let _ = server.waiting().await;
    });
    let client = ().serve(client_half).await.unwrap();
    Setup {
        _dir: dir,
        audit_path,
        store,
        client,
    }
}

fn audit_names(path: &std::path::Path) -> Vec<(String, String)> {
    std::fs::read_to_string(path)
        .unwrap_or_default()
        .lines()
        .map(|line| {
            let line: Value = serde_json::from_str(line).expect("every audit line is JSON");
            (
                line["name"].as_str().unwrap_or_default().to_owned(),
                line["decision"].as_str().unwrap_or_default().to_owned(),
            )
        })
        .collect()
}

fn count(counter: &AtomicUsize) -> usize {
    counter.load(Ordering::SeqCst)
}

fn put_a() -> ToolCall {
    ToolCall::new("put", json!({"key": "a", "value": "1"}))
}

fn get() -> ToolCall {
    ToolCall::new("get", json!({}))
}

fn undo_a() -> ToolCall {
    ToolCall::new("undo", json!({"key": "a"}))
}

fn item_a() -> Value {
    json!({"key": "a", "value": "1"})
}

fn stop_reason(verdict: &NextStep) -> &str {
    match verdict {
        NextStep::Stop(why) => why,
        other => panic!("expected STOP, got {other}"),
    }
}

#[tokio::test]
async fn an_honest_mutation_that_is_observed_continues() {
    let s = setup().await;
    let step =
        Step::new(put_a(), get(), expect_contains("/items", item_a())).compensate_with(undo_a());

    let report = run_step(s.client.peer(), &step).await;

    assert_eq!(report.verdict, NextStep::Continue, "{report:?}");
    assert_eq!(report.mutation.failure(), None);
    let observation = report.observation.as_ref().expect("the state was observed");
    assert_eq!(observation.failure(), None);
    assert_eq!(observation.json(), Some(json!({"items": [item_a()]})));
    assert_eq!(report.postcondition, Some(Postcondition::Holds));
    assert!(report.compensation.is_none());
    assert_eq!(count(&s.store.put_calls), 1);
    assert_eq!(count(&s.store.get_calls), 1);
    assert_eq!(count(&s.store.undo_calls), 0, "no compensation on CONTINUE");
    assert_eq!(
        s.store.map.lock().unwrap().get("a").map(String::as_str),
        Some("1")
    );
    assert_eq!(
        audit_names(&s.audit_path),
        [
            ("put".to_owned(), "allow".to_owned()),
            ("get".to_owned(), "allow".to_owned())
        ]
    );
    s.client.cancel().await.unwrap();
}

#[tokio::test]
async fn a_lying_mutation_without_compensation_stops() {
    let s = setup().await;
    s.store.lie.store(true, Ordering::SeqCst);
    let step = Step::new(put_a(), get(), expect_contains("/items", item_a()));

    let report = run_step(s.client.peer(), &step).await;

    // The mutation itself claims success: only the observation reveals the lie.
    assert_eq!(report.mutation.failure(), None, "{report:?}");
    assert_eq!(count(&s.store.put_calls), 1);
    assert!(s.store.map.lock().unwrap().is_empty());
    assert_eq!(
        report.observation.as_ref().and_then(CallOutcome::json),
        Some(json!({"items": []}))
    );
    assert!(matches!(
        report.postcondition,
        Some(Postcondition::Violated(_))
    ));
    let why = stop_reason(&report.verdict);
    assert!(why.contains("postcondition violated"), "{why}");
    assert!(why.contains("no compensating action"), "{why}");
    assert!(why.contains("/items"), "{why}");
    assert!(report.compensation.is_none());
    assert_eq!(count(&s.store.undo_calls), 0);
    s.client.cancel().await.unwrap();
}

#[tokio::test]
async fn a_lying_mutation_with_compensation_rolls_back_once() {
    let s = setup().await;
    s.store.lie.store(true, Ordering::SeqCst);
    let step =
        Step::new(put_a(), get(), expect_contains("/items", item_a())).compensate_with(undo_a());

    let report = run_step(s.client.peer(), &step).await;

    match &report.verdict {
        NextStep::Rollback(why) => assert!(why.contains("postcondition violated"), "{why}"),
        other => panic!("expected ROLLBACK, got {other}"),
    }
    let compensation = report
        .compensation
        .as_ref()
        .expect("the compensation ran and was reported");
    match compensation {
        CallOutcome::Result(result) => assert_eq!(result.is_error, Some(false), "{result:?}"),
        CallOutcome::Failed(why) => panic!("the compensation failed: {why}"),
    }
    assert_eq!(compensation.failure(), None);
    assert_eq!(count(&s.store.undo_calls), 1);
    assert_eq!(count(&s.store.get_calls), 1);
    assert_eq!(
        audit_names(&s.audit_path)
            .iter()
            .map(|(name, _)| name.as_str())
            .collect::<Vec<_>>(),
        ["put", "get", "undo"]
    );
    s.client.cancel().await.unwrap();
}

#[tokio::test]
async fn a_mutation_with_is_error_stops_before_observing() {
    let s = setup().await;
    let step = Step::new(
        ToolCall::new("fail", json!({})),
        get(),
        expect_contains("/items", item_a()),
    )
    .compensate_with(undo_a());

    let report = run_step(s.client.peer(), &step).await;

    assert_eq!(count(&s.store.fail_calls), 1, "the mutation ran");
    let why = stop_reason(&report.verdict);
    assert!(
        why.contains("the mutation failed: isError: Error: the mutation failed"),
        "{why}"
    );
    assert!(report.observation.is_none());
    assert!(report.postcondition.is_none());
    assert_eq!(count(&s.store.get_calls), 0, "the observation must not run");
    assert!(report.compensation.is_none());
    assert_eq!(count(&s.store.undo_calls), 0, "no compensation on STOP");
    s.client.cancel().await.unwrap();
}

#[tokio::test]
async fn a_mutation_denied_by_the_policy_stops_with_the_json_rpc_error() {
    let s = setup().await;
    let step = Step::new(
        ToolCall::new("wipe", json!({})),
        get(),
        expect_contains("/items", item_a()),
    )
    .compensate_with(undo_a());

    let report = run_step(s.client.peer(), &step).await;

    match &report.mutation {
        CallOutcome::Failed(why) => assert!(why.contains("-32602"), "{why}"),
        other => panic!("a denied call must be a JSON-RPC error, got {other:?}"),
    }
    let why = stop_reason(&report.verdict);
    assert!(why.contains("-32602"), "{why}");
    assert!(why.contains("tool not found"), "{why}");
    assert_eq!(count(&s.store.wipe_calls), 0, "the denied handler ran");
    assert!(report.observation.is_none());
    assert_eq!(count(&s.store.get_calls), 0);
    assert!(report.compensation.is_none());
    assert_eq!(count(&s.store.undo_calls), 0);
    assert_eq!(
        audit_names(&s.audit_path),
        [("wipe".to_owned(), "deny".to_owned())]
    );
    s.client.cancel().await.unwrap();
}

#[tokio::test]
async fn an_observation_without_json_is_inconclusive_and_stops() {
    let s = setup().await;
    let step = Step::new(
        put_a(),
        ToolCall::new("status", json!({})),
        expect_contains("/items", item_a()),
    )
    .compensate_with(undo_a());

    let report = run_step(s.client.peer(), &step).await;

    assert_eq!(count(&s.store.put_calls), 1);
    assert_eq!(count(&s.store.status_calls), 1, "the observation ran");
    let observation = report.observation.as_ref().expect("the observation ran");
    assert_eq!(observation.failure(), None);
    assert_eq!(observation.json(), None);
    assert!(matches!(
        report.postcondition,
        Some(Postcondition::Inconclusive(_))
    ));
    let why = stop_reason(&report.verdict);
    assert!(why.contains("inconclusive"), "{why}");
    assert!(why.contains("no JSON"), "{why}");
    // Inconclusive is not Violated: even with a compensation registered, nothing is rolled back.
    assert!(report.compensation.is_none());
    assert_eq!(count(&s.store.undo_calls), 0);
    s.client.cancel().await.unwrap();
}
