//! An unsafe exactly-once tool whose first execution died mid-effect: without a probe the key is
//! indeterminate and nothing runs again; with a probe, its answer decides (replay the observed
//! result, or execute because the effect did not happen).

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use rmcp::handler::server::router::tool::ToolRouter;
use rmcp::handler::server::tool::Extension;
use rmcp::handler::server::wrapper::Parameters;
use rmcp::model::{
    CallToolRequestParams, CallToolResult, ContentBlock, ServerCapabilities, ServerConfig,
};
use rmcp::service::{RoleClient, RunningService};
use rmcp::{ServerHandler, ServiceExt as _, tool, tool_handler, tool_router};
use schemars::JsonSchema;
use serde::Deserialize;
use serde_json::{Value, json};
use toolgate_audit::FileAuditLog;
use toolgate_commit::{EffectConfig, EffectStore};
use toolgate_policy::Policy;
use toolgate_rmcp::{EffectProbe, Gated, Permit, ProbeAnswer};

#[derive(Debug, Deserialize, JsonSchema)]
struct SendArgs {
    id: String,
}

#[derive(Clone)]
struct Mailer {
    /// Executions of the handler body; the first one dies mid-effect.
    runs: Arc<AtomicU64>,
    tool_router: ToolRouter<Self>,
}

#[tool_router]
impl Mailer {
    /// Sends a message once per id (its effect is not idempotent).
    #[tool]
    async fn send(
        &self,
        Extension(_permit): Extension<Permit>,
        Parameters(args): Parameters<SendArgs>,
    ) -> String {
        if self.runs.fetch_add(1, Ordering::SeqCst) == 0 {
            panic!("the process dies mid-effect");
        }
        format!("sent {}", args.id)
    }
}

#[tool_handler(router = self.tool_router)]
impl ServerHandler for Mailer {
    fn get_info(&self) -> ServerConfig {
        ServerConfig::new(ServerCapabilities::builder().enable_tools().build())
    }
}

const POLICY: &str = r#"{"version":1,"allow":["send"],
  "idempotency":{"send":{"key_argument":"id","effect":"unsafe"}}}"#;

fn lines(path: &Path) -> Vec<Value> {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let complete = text.rfind('\n').map_or("", |end| &text[..=end]);
    complete
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

async fn setup(
    probe: Option<EffectProbe>,
) -> (
    tempfile::TempDir,
    Arc<AtomicU64>,
    RunningService<RoleClient, ()>,
) {
    let dir = tempfile::tempdir().unwrap();
    let runs = Arc::new(AtomicU64::new(0));
    let inner = Mailer {
        runs: Arc::clone(&runs),
        tool_router: Mailer::tool_router(),
    };
    let effects = EffectStore::open(EffectConfig::new(dir.path().join("effects"))).unwrap();
    let mut builder = Gated::builder(inner)
        .policy(Policy::from_json(POLICY).unwrap())
        .audit(Arc::new(
            FileAuditLog::open(dir.path().join("audit.jsonl")).unwrap(),
        ))
        .effect_store(Arc::new(effects));
    if let Some(probe) = probe {
        builder = builder.effect_probe("send", probe);
    }
    let gated = builder.build().unwrap();
    let (server_half, client_half) = tokio::io::duplex(64 * 1024);
    tokio::spawn(async move {
        let server = gated.serve(server_half).await.unwrap();
        let _ = server.waiting().await;
    });
    let client = ().serve(client_half).await.unwrap();

    // The first call dies mid-effect: no reply; wait for its audit record.
    let peer = client.peer().clone();
    let pending = tokio::spawn(async move {
        let mut params = CallToolRequestParams::new("send");
        params.arguments = json!({"id": "m-1"}).as_object().cloned();
        let _ = peer.call_tool(params).await;
    });
    let audit = dir.path().join("audit.jsonl");
    let deadline = Instant::now() + Duration::from_secs(60);
    while lines(&audit).is_empty() {
        assert!(
            Instant::now() < deadline,
            "the abandoned call was not audited"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    pending.abort();
    assert_eq!(runs.load(Ordering::SeqCst), 1);
    (dir, runs, client)
}

async fn retry(client: &RunningService<RoleClient, ()>) -> CallToolResult {
    let mut params = CallToolRequestParams::new("send");
    params.arguments = json!({"id": "m-1"}).as_object().cloned();
    client.call_tool(params).await.unwrap()
}

fn text(result: &CallToolResult) -> String {
    match result.content.first() {
        Some(ContentBlock::Text(t)) => t.text.clone(),
        other => panic!("expected text, got {other:?}"),
    }
}

#[tokio::test]
async fn without_a_probe_the_key_is_indeterminate_and_nothing_runs_again() {
    let (dir, runs, client) = setup(None).await;
    let result = retry(&client).await;
    assert_eq!(result.is_error, Some(true));
    assert!(
        text(&result).contains("may or may not have happened"),
        "{}",
        text(&result)
    );
    assert_eq!(runs.load(Ordering::SeqCst), 1, "never re-run automatically");
    assert_eq!(
        lines(&dir.path().join("audit.jsonl")).last().unwrap()["outcome"],
        "indeterminate"
    );
    client.cancel().await.unwrap();
}

#[tokio::test]
async fn a_probe_that_observes_the_effect_makes_the_retry_a_replay() {
    let observed = CallToolResult::success(vec![ContentBlock::text("sent m-1 (observed)")]);
    let answer = observed.clone();
    let probe: EffectProbe = Arc::new(move |args| {
        assert_eq!(args.and_then(|a| a.get("id")), Some(&json!("m-1")));
        ProbeAnswer::Happened(answer.clone())
    });
    let (dir, runs, client) = setup(Some(probe)).await;
    let result = retry(&client).await;
    assert_eq!(text(&result), "sent m-1 (observed)");
    assert_eq!(runs.load(Ordering::SeqCst), 1, "a replay does not execute");
    assert_eq!(
        lines(&dir.path().join("audit.jsonl")).last().unwrap()["outcome"],
        "replay"
    );
    client.cancel().await.unwrap();
}

#[tokio::test]
async fn a_probe_that_finds_no_effect_lets_the_retry_execute_once() {
    let probe: EffectProbe = Arc::new(|_| ProbeAnswer::NotHappened);
    let (_dir, runs, client) = setup(Some(probe)).await;
    let result = retry(&client).await;
    assert_eq!(text(&result), "sent m-1");
    assert_eq!(runs.load(Ordering::SeqCst), 2);
    let again = retry(&client).await;
    assert_eq!(text(&again), "sent m-1");
    assert_eq!(runs.load(Ordering::SeqCst), 2, "the second retry replays");
    client.cancel().await.unwrap();
}
