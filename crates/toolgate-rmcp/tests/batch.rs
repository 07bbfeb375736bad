//! The batch guard in process: a batch tool takes explicit ids, or a filter plus an
//! `expected_count`; when the filter matches another number of items, the caller gets the matches
//! and nothing executes. Also the gate's confirmation tools with a preflight that prepares calls.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use rmcp::handler::server::router::tool::ToolRouter;
use rmcp::handler::server::tool::Extension;
use rmcp::handler::server::wrapper::Parameters;
use rmcp::model::{CallToolRequestParams, CallToolResult, ServerCapabilities, ServerConfig};
use rmcp::service::{RoleClient, RunningService};
use rmcp::{ServerHandler, ServiceExt as _, tool, tool_handler, tool_router};
use schemars::JsonSchema;
use serde::Deserialize;
use serde_json::{Value, json};
use toolgate_audit::FileAuditLog;
use toolgate_canon::Sha256Digest;
use toolgate_policy::Policy;
use toolgate_rmcp::{Caller, Gated, Permit, Preflight, Preparation};

const POLICY: &str = r#"{
    "version": 1,
    "allow": ["cancel_bookings", "notify_guest"],
    "effects": {"cancel_bookings": "write", "notify_guest": "notify"},
    "batch": {"cancel_bookings": {}}
}"#;

/// The world: twelve bookings, three of them in room 7.
#[derive(Default)]
struct World {
    cancelled: Mutex<Vec<Value>>,
    sent: AtomicUsize,
    message_version: AtomicUsize,
}

fn bookings() -> Vec<(Value, &'static str)> {
    (1..=12)
        .map(|i| {
            (
                json!(format!("b{i}")),
                if i <= 3 { "room-7" } else { "room-9" },
            )
        })
        .collect()
}

#[derive(Debug, Deserialize, JsonSchema)]
struct CancelArgs {
    ids: Option<Vec<String>>,
    filter: Option<Value>,
    expected_count: Option<u64>,
}

#[derive(Debug, Deserialize, JsonSchema)]
struct NotifyArgs {
    guest: String,
}

#[derive(Clone)]
struct Tools {
    world: Arc<World>,
    tool_router: ToolRouter<Self>,
}

#[tool_router]
impl Tools {
    /// Cancels bookings by id or by filter.
    #[tool]
    async fn cancel_bookings(
        &self,
        Extension(_permit): Extension<Permit>,
        Parameters(args): Parameters<CancelArgs>,
    ) -> String {
        let ids: Vec<Value> = match (args.ids, args.filter) {
            (Some(ids), _) => ids.into_iter().map(Value::String).collect(),
            (None, Some(filter)) => matches(&filter),
            _ => Vec::new(),
        };
        let _ = args.expected_count;
        let count = ids.len();
        self.world.cancelled.lock().unwrap().extend(ids);
        format!("cancelled {count}")
    }

    /// Sends the guest a message.
    #[tool]
    async fn notify_guest(
        &self,
        Extension(_permit): Extension<Permit>,
        Parameters(args): Parameters<NotifyArgs>,
    ) -> String {
        self.world.sent.fetch_add(1, Ordering::SeqCst);
        format!("sent to {}", args.guest)
    }
}

#[tool_handler(router = self.tool_router)]
impl ServerHandler for Tools {
    fn get_info(&self) -> ServerConfig {
        ServerConfig::new(ServerCapabilities::builder().enable_tools().build())
    }
}

fn matches(filter: &Value) -> Vec<Value> {
    let room = filter["room"].as_str().unwrap_or_default();
    bookings()
        .into_iter()
        .filter(|(_, r)| room.is_empty() || *r == room)
        .map(|(id, _)| id)
        .collect()
}

struct Checks(Arc<World>);

impl Preflight for Checks {
    fn prepare(
        &self,
        _caller: &Caller,
        tool: &str,
        arguments: &rmcp::model::JsonObject,
    ) -> Result<Preparation, String> {
        let guest = arguments["guest"].as_str().unwrap_or_default();
        let version = self.0.message_version.load(Ordering::SeqCst);
        Ok(Preparation {
            summary: format!("{tool}: send 1 message (template v{version}) to guest {guest}"),
            content_hash: Sha256Digest::of(format!("{guest}:{version}").as_bytes()),
        })
    }

    fn batch_matches(
        &self,
        _caller: &Caller,
        _tool: &str,
        filter: &Value,
    ) -> Result<Vec<Value>, String> {
        Ok(matches(filter))
    }
}

type Client = RunningService<RoleClient, ()>;

async fn start() -> (tempfile::TempDir, Arc<World>, Client) {
    let ledger = tempfile::tempdir().unwrap();
    let world = Arc::new(World::default());
    let tools = Tools {
        world: Arc::clone(&world),
        tool_router: Tools::tool_router(),
    };
    let gated = Gated::builder(tools)
        .policy(Policy::from_json(POLICY).unwrap())
        .audit(Arc::new(
            FileAuditLog::open(ledger.path().join("audit.jsonl")).unwrap(),
        ))
        .preflight(Arc::new(Checks(Arc::clone(&world))))
        .build()
        .unwrap();
    let (server_half, client_half) = tokio::io::duplex(64 * 1024);
    tokio::spawn(async move {
        let server = gated.serve(server_half).await.unwrap();
        let _ = server.waiting().await;
    });
    (ledger, world, ().serve(client_half).await.unwrap())
}

async fn call(client: &Client, tool: &str, args: Value) -> CallToolResult {
    let mut params = CallToolRequestParams::new(tool.to_owned());
    params.arguments = args.as_object().cloned();
    client.call_tool(params).await.unwrap()
}

#[tokio::test]
async fn a_filter_matching_another_count_returns_the_matches_and_executes_nothing() {
    let (_ledger, world, client) = start().await;

    let wide = call(
        &client,
        "cancel_bookings",
        json!({"filter": {}, "expected_count": 3}),
    )
    .await;
    assert_eq!(wide.is_error, Some(true));
    let details = wide.structured_content.clone().unwrap();
    assert_eq!(details["error"], "batch_count_mismatch");
    assert_eq!(details["matched"], 12);
    assert_eq!(details["matches"].as_array().unwrap().len(), 12);
    assert!(
        world.cancelled.lock().unwrap().is_empty(),
        "nothing executes"
    );

    let missing = call(
        &client,
        "cancel_bookings",
        json!({"filter": {"room": "room-7"}}),
    )
    .await;
    assert_eq!(missing.is_error, Some(true));
    assert!(world.cancelled.lock().unwrap().is_empty());

    let exact = call(
        &client,
        "cancel_bookings",
        json!({"filter": {"room": "room-7"}, "expected_count": 3}),
    )
    .await;
    assert_ne!(exact.is_error, Some(true), "{exact:?}");
    assert_eq!(world.cancelled.lock().unwrap().len(), 3);

    let by_ids = call(&client, "cancel_bookings", json!({"ids": ["b10"]})).await;
    assert_ne!(by_ids.is_error, Some(true), "{by_ids:?}");
    assert_eq!(world.cancelled.lock().unwrap().len(), 4);
    client.cancel().await.unwrap();
}

#[tokio::test]
async fn a_notify_tool_needs_the_exact_confirmation_and_a_changed_message_needs_a_new_one() {
    let (_ledger, world, client) = start().await;
    let listed: Vec<String> = client
        .list_tools(None)
        .await
        .unwrap()
        .tools
        .into_iter()
        .map(|t| t.name.to_string())
        .collect();
    assert!(listed.contains(&"confirm_action".to_owned()), "{listed:?}");

    let preview = call(&client, "notify_guest", json!({"guest": "ana"})).await;
    let body = preview.structured_content.clone().unwrap();
    assert_eq!(body["status"], "preview");
    assert_eq!(
        world.sent.load(Ordering::SeqCst),
        0,
        "a preview sends nothing"
    );
    let summary = body["confirm_summary"].as_str().unwrap().to_owned();
    assert!(summary.contains("guest ana"), "{summary}");

    // The message template changes between the steps: a new preview, nothing sent.
    world.message_version.store(1, Ordering::SeqCst);
    let changed = call(
        &client,
        "confirm_action",
        json!({"confirm_token": body["confirm_token"], "confirm_summary": summary}),
    )
    .await;
    let renewed = changed.structured_content.clone().unwrap();
    assert_eq!(renewed["status"], "changed_since_preview");
    assert_eq!(world.sent.load(Ordering::SeqCst), 0);

    let sent = call(
        &client,
        "confirm_action",
        json!({"confirm_token": renewed["confirm_token"], "confirm_summary": renewed["confirm_summary"]}),
    )
    .await;
    assert_ne!(sent.is_error, Some(true), "{sent:?}");
    assert_eq!(world.sent.load(Ordering::SeqCst), 1);
    client.cancel().await.unwrap();
}
