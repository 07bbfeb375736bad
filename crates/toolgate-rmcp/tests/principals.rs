//! Per-request principals: one gate, two callers whose verified identities arrive in the request
//! extensions (as an authenticating transport puts them there). Each caller sees and may call
//! only what the policy gives that principal, a request without an identity is refused, and every
//! audit record names the principal of its request.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::sync::Arc;

use rmcp::model::{
    CallToolRequestParams, CallToolResponse, CallToolResult, ContentBlock, ErrorCode,
    ListToolsResult, PaginatedRequestParams, RequestId, ServerCapabilities, ServerConfig, Tool,
};
use rmcp::service::{Peer, RequestContext, RunningService};
use rmcp::{ErrorData, RoleServer, ServerHandler, ServiceExt as _};
use serde_json::{Value, json};
use toolgate_audit::MemoryAuditLog;
use toolgate_policy::Policy;
use toolgate_rmcp::{FromExtensions, Gated, VerifiedPrincipal};

#[derive(Clone)]
struct Tools;

fn tool(name: &str) -> Tool {
    Tool::new(
        name.to_owned(),
        "test tool",
        json!({"type": "object"}).as_object().unwrap().clone(),
    )
}

impl ServerHandler for Tools {
    fn get_info(&self) -> ServerConfig {
        ServerConfig::new(ServerCapabilities::builder().enable_tools().build())
    }

    async fn list_tools(
        &self,
        _request: Option<PaginatedRequestParams>,
        _context: RequestContext<RoleServer>,
    ) -> Result<ListToolsResult, ErrorData> {
        Ok(ListToolsResult::with_all_items(vec![
            tool("read"),
            tool("purge"),
        ]))
    }

    fn get_tool(&self, name: &str) -> Option<Tool> {
        ["read", "purge"].contains(&name).then(|| tool(name))
    }

    async fn call_tool(
        &self,
        request: CallToolRequestParams,
        _context: RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, ErrorData> {
        Ok(
            CallToolResult::success(vec![ContentBlock::text(format!("ran {}", request.name))])
                .into(),
        )
    }
}

/// A peer for hand-made request contexts: a served idle handler's.
async fn peer() -> (
    Peer<RoleServer>,
    RunningService<RoleServer, Tools>,
    impl Sized,
) {
    let (server_half, client_half) = tokio::io::duplex(64 * 1024);
    let server = tokio::spawn(Tools.serve(server_half));
    let client = ().serve(client_half).await.unwrap();
    let server = server.await.unwrap().unwrap();
    (server.peer().clone(), server, client)
}

fn context(peer: &Peer<RoleServer>, id: i64, who: Option<&str>) -> RequestContext<RoleServer> {
    let mut context = RequestContext::new(RequestId::Number(id), peer.clone());
    if let Some(who) = who {
        context
            .extensions
            .insert(VerifiedPrincipal::new(who).unwrap());
    }
    context
}

#[tokio::test]
async fn each_request_is_gated_as_its_own_principal() {
    let (peer, _server, _client) = peer().await;
    let audit = Arc::new(MemoryAuditLog::new());
    let policy = Policy::from_json(
        r#"{"version":1,"allow":["read"],"principals":{"admin":{"allow":["purge"]}}}"#,
    )
    .unwrap();
    let gated = Gated::builder(Tools)
        .policy(policy)
        .audit(audit.clone())
        .principal_source(FromExtensions)
        .build()
        .unwrap();

    let names = |result: ListToolsResult| -> Vec<String> {
        result.tools.iter().map(|t| t.name.to_string()).collect()
    };
    let listed = gated
        .list_tools(None, context(&peer, 1, Some("alice")))
        .await
        .unwrap();
    assert_eq!(names(listed), ["read"]);
    let listed = gated
        .list_tools(None, context(&peer, 2, Some("admin")))
        .await
        .unwrap();
    assert_eq!(names(listed), ["read", "purge"]);

    let call = |name: &str| CallToolRequestParams::new(name.to_owned());
    let refused = gated
        .call_tool(call("purge"), context(&peer, 3, Some("alice")))
        .await
        .unwrap_err();
    assert_eq!(refused.code, ErrorCode::INVALID_PARAMS);
    let ran = gated
        .call_tool(call("purge"), context(&peer, 4, Some("admin")))
        .await
        .unwrap();
    assert!(matches!(ran, CallToolResponse::Complete(r) if r.is_error != Some(true)));

    // No identity: refused, never run as anyone.
    let anonymous = gated
        .call_tool(call("read"), context(&peer, 5, None))
        .await
        .unwrap_err();
    assert_eq!(anonymous.code, ErrorCode::INVALID_REQUEST);
    let anonymous = gated.list_tools(None, context(&peer, 6, None)).await;
    assert_eq!(anonymous.unwrap_err().code, ErrorCode::INVALID_REQUEST);
    // Without a request, a per-request source answers from the policy's top level only.
    assert!(gated.get_tool("read").is_some());
    assert!(gated.get_tool("purge").is_none());

    let text = String::from_utf8(audit.bytes()).unwrap();
    let records: Vec<Value> = text
        .lines()
        .map(|line| serde_json::from_str(line).unwrap())
        .collect();
    let calls: Vec<(&str, &str)> = records
        .iter()
        .take(2)
        .map(|r| {
            (
                r["principal"].as_str().unwrap(),
                r["decision"].as_str().unwrap(),
            )
        })
        .collect();
    assert_eq!(calls[..2], [("alice", "deny"), ("admin", "allow")]);
    let anonymous = &records[2];
    assert!(anonymous.get("principal").is_none(), "{anonymous}");
    assert_eq!(anonymous["reason"], "no_principal");
    assert_eq!(anonymous["decision"], "deny");
    assert_eq!(records.len(), 3);
}

#[tokio::test]
async fn a_fixed_principal_is_checked_and_recorded() {
    let policy = || Policy::from_json(r#"{"version":1,"allow":["read"]}"#).unwrap();
    let invalid = Gated::builder(Tools)
        .policy(policy())
        .audit(Arc::new(MemoryAuditLog::new()))
        .principal("not a name")
        .build();
    assert!(invalid.is_err());

    let (peer, _server, _client) = peer().await;
    let audit = Arc::new(MemoryAuditLog::new());
    let gated = Gated::builder(Tools)
        .policy(policy())
        .audit(audit.clone())
        .principal("ci-bot")
        .build()
        .unwrap();
    // The configured principal answers whatever the extensions say.
    gated
        .call_tool(
            CallToolRequestParams::new("read".to_owned()),
            context(&peer, 1, Some("admin")),
        )
        .await
        .unwrap();
    let text = String::from_utf8(audit.bytes()).unwrap();
    let record: Value = serde_json::from_str(text.lines().next().unwrap()).unwrap();
    assert_eq!(record["principal"], "ci-bot");
}
