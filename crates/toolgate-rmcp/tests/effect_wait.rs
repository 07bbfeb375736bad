//! A call that finds its idempotency key held by another live call waits for that call's outcome
//! without holding a blocking thread: on a runtime whose blocking pool has a single thread, the
//! call it waits for, and calls with other keys, still get that thread and finish.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::sync::Arc;
use std::time::Duration;

use rmcp::handler::server::router::tool::ToolRouter;
use rmcp::handler::server::tool::Extension;
use rmcp::handler::server::wrapper::Parameters;
use rmcp::model::{
    CallToolRequest, CallToolRequestParams, ClientRequest, ServerCapabilities, ServerConfig,
    ServerResult,
};
use rmcp::service::{PeerRequestOptions, RequestHandle, RoleClient, RunningService};
use rmcp::{ServerHandler, ServiceExt as _, tool, tool_handler, tool_router};
use schemars::JsonSchema;
use serde::Deserialize;
use serde_json::{Value, json};
use tokio::sync::{Semaphore, mpsc};
use toolgate_audit::FileAuditLog;
use toolgate_commit::{EffectConfig, EffectStore};
use toolgate_policy::Policy;
use toolgate_rmcp::{Gated, Permit};

#[derive(Debug, Deserialize, JsonSchema)]
struct PutArgs {
    id: String,
    /// Whether the call announces that it runs and then waits for the test's release.
    hold: bool,
}

#[derive(Clone)]
struct Store {
    started: mpsc::UnboundedSender<String>,
    release: Arc<Semaphore>,
    tool_router: ToolRouter<Self>,
}

#[tool_router]
impl Store {
    /// Stores one value per id.
    #[tool]
    async fn put(
        &self,
        Extension(_permit): Extension<Permit>,
        Parameters(args): Parameters<PutArgs>,
    ) -> String {
        if args.hold {
            self.started.send(args.id.clone()).unwrap();
            self.release.acquire().await.unwrap().forget();
        }
        format!("stored {}", args.id)
    }
}

#[tool_handler(router = self.tool_router)]
impl ServerHandler for Store {
    fn get_info(&self) -> ServerConfig {
        ServerConfig::new(ServerCapabilities::builder().enable_tools().build())
    }
}

const POLICY: &str = r#"{"version":1,"allow":["put"],
  "idempotency":{"put":{"key_argument":"id","effect":"idempotent"}}}"#;

async fn send(client: &RunningService<RoleClient, ()>, args: Value) -> RequestHandle<RoleClient> {
    let mut params = CallToolRequestParams::new("put");
    params.arguments = args.as_object().cloned();
    let request = ClientRequest::CallToolRequest(CallToolRequest::new(params));
    client
        .peer()
        .send_request_with_option(request, PeerRequestOptions::no_options())
        .await
        .unwrap()
}

async fn reply(handle: RequestHandle<RoleClient>) -> Value {
    match handle.await_response().await.unwrap() {
        ServerResult::CallToolResult(result) => serde_json::to_value(result).unwrap(),
        other => panic!("expected a tool result, got {other:?}"),
    }
}

#[test]
fn a_waiting_call_leaves_the_only_blocking_thread_to_the_call_it_waits_for() {
    // One blocking thread: the effect store, the audit log and the handler's completion all need
    // it. A wait in that thread (as `EffectStore::begin` with `wait_in_progress` does) would hold
    // it for the whole wait, and neither the owner's completion nor the other key could run.
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .max_blocking_threads(1)
        .build()
        .unwrap();
    runtime.block_on(async {
        let dir = tempfile::tempdir().unwrap();
        let (started, mut started_rx) = mpsc::unbounded_channel();
        let release = Arc::new(Semaphore::new(0));
        let inner = Store {
            started,
            release: Arc::clone(&release),
            tool_router: Store::tool_router(),
        };
        // Long enough that a thread blocked in the wait would hang the test, not time it out.
        let effects = Arc::new(
            EffectStore::open(
                EffectConfig::new(dir.path().join("effects"))
                    .wait_in_progress(Duration::from_secs(3600)),
            )
            .unwrap(),
        );
        let gated = Gated::builder(inner)
            .policy(Policy::from_json(POLICY).unwrap())
            .audit(Arc::new(
                FileAuditLog::open(dir.path().join("audit.jsonl")).unwrap(),
            ))
            .effect_store(effects.clone())
            .build()
            .unwrap();
        let (server_half, client_half) = tokio::io::duplex(64 * 1024);
        tokio::spawn(async move {
            let server = gated.serve(server_half).await.unwrap();
            let _ = server.waiting().await;
        });
        let client = ().serve(client_half).await.unwrap();

        let held = json!({"id": "k-1", "hold": true});
        let owner = send(&client, held.clone()).await;
        assert_eq!(started_rx.recv().await.as_deref(), Some("k-1"));
        // The same key while its owner runs: this call waits. A call with another key, sent after
        // it (so it reaches the store after the waiting call's first attempt), still runs.
        let waiter = send(&client, held).await;
        let other = send(&client, json!({"id": "k-2", "hold": false})).await;
        let other = reply(other).await;
        assert_eq!(other["content"][0]["text"], "stored k-2", "{other}");

        release.add_permits(1);
        let first = reply(owner).await;
        let mut again = reply(waiter).await;
        assert_eq!(first["content"][0]["text"], "stored k-1", "{first}");
        assert_eq!(
            again["_meta"]
                .as_object_mut()
                .unwrap()
                .remove("io.toolgate/replayed"),
            Some(json!(true)),
            "{again}"
        );
        if again["_meta"].as_object().is_some_and(|m| m.is_empty()) {
            again.as_object_mut().unwrap().remove("_meta");
        }
        assert_eq!(again, first, "the waiting call replays the owner's result");
        let counters = effects.counters()["put"];
        assert_eq!(
            (counters.committed, counters.replayed, counters.in_progress),
            (2, 1, 0),
            "the waiting call counts once, as a replay"
        );
        client.cancel().await.unwrap();
    });
}
