//! Edge cases of the gate's bookkeeping: a handler that panics is answered and still leaves an
//! audit record and an expired permit, and a handler that cannot resolve its tools by name
//! (no `get_tool`) lists nothing, since it could call nothing.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use rmcp::handler::server::router::tool::ToolRouter;
use rmcp::handler::server::tool::Extension;
use rmcp::model::{
    CallToolRequestParams, CallToolResponse, ListToolsResult, PaginatedRequestParams,
    ServerCapabilities, ServerConfig, Tool,
};
use rmcp::service::RequestContext;
use rmcp::{
    ErrorData, RoleServer, ServerHandler, ServiceExt as _, tool, tool_handler, tool_router,
};
use serde_json::Value;
use toolgate_audit::{FileAuditLog, Outcome};
use toolgate_policy::Policy;
use toolgate_rmcp::{Gated, Permit, PermitError};

/// The complete (newline-terminated) lines of the audit log: a line being appended right now is
/// not returned until its newline is written.
fn audit_lines(path: &Path) -> Vec<Value> {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let complete = match text.rfind('\n') {
        Some(end) => &text[..=end],
        None => "",
    };
    complete
        .lines()
        .map(|line| serde_json::from_str(line).unwrap())
        .collect()
}

#[derive(Clone)]
struct Boom {
    kept: Arc<Mutex<Option<Permit>>>,
    tool_router: ToolRouter<Self>,
}

#[tool_router]
impl Boom {
    /// Reaches its effect, then panics before returning.
    #[tool]
    async fn boom(&self, Extension(permit): Extension<Permit>) -> String {
        permit.record_outcome(Outcome::Committed).unwrap();
        *self.kept.lock().unwrap() = Some(permit);
        panic!("handler bug after the effect");
    }
}

#[tool_handler(router = self.tool_router)]
impl ServerHandler for Boom {
    fn get_info(&self) -> ServerConfig {
        ServerConfig::new(ServerCapabilities::builder().enable_tools().build())
    }
}

fn gate<H: ServerHandler>(inner: H, audit_path: &Path, allow: &str) -> Gated<H> {
    let policy = Policy::from_json(&format!(r#"{{"version":1,"allow":["{allow}"]}}"#)).unwrap();
    Gated::builder(inner)
        .policy(policy)
        .audit(Arc::new(FileAuditLog::open(audit_path).unwrap()))
        .build()
        .unwrap()
}

#[tokio::test]
async fn a_panicking_handler_is_answered_and_leaves_an_audit_record_and_an_expired_permit() {
    let dir = tempfile::tempdir().unwrap();
    let audit_path: PathBuf = dir.path().join("audit.jsonl");
    let kept = Arc::new(Mutex::new(None));
    let inner = Boom {
        kept: Arc::clone(&kept),
        tool_router: Boom::tool_router(),
    };
    let (server_half, client_half) = tokio::io::duplex(64 * 1024);
    let gated = gate(inner, &audit_path, "boom");
    tokio::spawn(async move {
        let server = gated.serve(server_half).await.unwrap();
        let _ = server.waiting().await;
    });
    let client = ().serve(client_half).await.unwrap();
    let peer = client.peer().clone();
    // The panic is answered -32603, without its message.
    let answered = peer.call_tool(CallToolRequestParams::new("boom")).await;
    match answered {
        Err(rmcp::service::ServiceError::McpError(error)) => {
            assert_eq!(error.code.0, -32603, "{error:?}");
            assert!(!error.message.contains("handler bug"), "{error:?}");
        }
        other => panic!("not an internal error: {other:?}"),
    }

    let deadline = Instant::now() + Duration::from_secs(60);
    let lines = loop {
        let lines = audit_lines(&audit_path);
        if !lines.is_empty() {
            break lines;
        }
        assert!(
            Instant::now() < deadline,
            "no audit record for the abandoned call"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    assert_eq!(lines.len(), 1, "{lines:?}");
    assert_eq!(lines[0]["name"], "boom");
    assert_eq!(lines[0]["decision"], "allow");
    assert_eq!(lines[0]["outcome"], "committed", "what the handler reached");
    assert_eq!(lines[0]["reason"], "handler_panicked");
    assert!(
        toolgate_audit::verify_file(&audit_path)
            .unwrap()
            .problem
            .is_none()
    );

    let permit = kept
        .lock()
        .unwrap()
        .take()
        .expect("the handler kept its permit");
    assert!(matches!(
        permit.record_outcome(Outcome::Replay),
        Err(PermitError::Expired { .. })
    ));
    let _ = client.cancel().await;
}

/// A hand-written handler that lists and calls a tool but does not implement `get_tool`.
struct NoLookup;

impl ServerHandler for NoLookup {
    fn get_info(&self) -> ServerConfig {
        ServerConfig::new(ServerCapabilities::builder().enable_tools().build())
    }

    async fn list_tools(
        &self,
        _request: Option<PaginatedRequestParams>,
        _context: RequestContext<RoleServer>,
    ) -> Result<ListToolsResult, ErrorData> {
        let schema = serde_json::json!({"type": "object"});
        let schema = schema.as_object().unwrap().clone();
        Ok(ListToolsResult::with_all_items(vec![Tool::new(
            "plain",
            "a tool",
            Arc::new(schema),
        )]))
    }

    async fn call_tool(
        &self,
        _request: CallToolRequestParams,
        _context: RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, ErrorData> {
        panic!("the gate must not dispatch a tool it cannot resolve");
    }
}

#[tokio::test]
async fn a_handler_without_get_tool_lists_nothing_because_it_can_call_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let audit_path = dir.path().join("audit.jsonl");
    let (server_half, client_half) = tokio::io::duplex(64 * 1024);
    let gated = gate(NoLookup, &audit_path, "plain");
    tokio::spawn(async move {
        let server = gated.serve(server_half).await.unwrap();
        let _ = server.waiting().await;
    });
    let client = ().serve(client_half).await.unwrap();
    let listed = client.list_tools(None).await.unwrap();
    assert!(listed.tools.is_empty(), "{listed:?}");
    let error = client
        .call_tool(CallToolRequestParams::new("plain"))
        .await
        .expect_err("not callable");
    assert!(format!("{error:?}").contains("tool not found"), "{error:?}");
    assert_eq!(audit_lines(&audit_path)[0]["reason"], "unknown_tool");
    client.cancel().await.unwrap();
}
