//! `toolgate_http::router` as a library user mounts it: a gate built with the default fixed principal
//! (`local`) is served per request as each credential's principal, never as `local`.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::sync::Arc;
use std::time::SystemTime;

use rmcp::model::{
    CallToolRequestParams, CallToolResponse, CallToolResult, ContentBlock, ListToolsResult,
    PaginatedRequestParams, ServerCapabilities, ServerConfig, Tool,
};
use rmcp::service::RequestContext;
use rmcp::{ErrorData, RoleServer, ServerHandler};
use serde_json::{Value, json};
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use toolgate_audit::MemoryAuditLog;
use toolgate_http::tokens::{ApiTokens, TokenSpec};
use toolgate_http::{Authentication, HttpOptions, router};
use toolgate_policy::Policy;
use toolgate_rmcp::Gated;

#[derive(Clone)]
struct Tools;

fn tool() -> Tool {
    Tool::new(
        "read".to_owned(),
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
        Ok(ListToolsResult::with_all_items(vec![tool()]))
    }

    fn get_tool(&self, name: &str) -> Option<Tool> {
        (name == "read").then(tool)
    }

    async fn call_tool(
        &self,
        _request: CallToolRequestParams,
        _context: RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, ErrorData> {
        Ok(CallToolResult::success(vec![ContentBlock::text("read")]).into())
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_gate_with_a_fixed_principal_is_served_as_each_credentials_principal() {
    let dir = tempfile::tempdir().unwrap();
    let tokens = ApiTokens::new(dir.path());
    let alice = tokens
        .create(&TokenSpec::new("alice"), SystemTime::now())
        .unwrap()
        .token;
    // Only alice may read; `local`, the builder's default principal, may not.
    let policy =
        Policy::from_json(r#"{"version":1,"allow":[],"principals":{"alice":{"allow":["read"]}}}"#)
            .unwrap();
    let audit = Arc::new(MemoryAuditLog::new());
    let gated = Gated::builder(Tools)
        .policy(policy)
        .audit(audit.clone())
        .build()
        .unwrap();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let app = router(
        gated,
        Authentication::new().api_tokens(tokens),
        audit.clone(),
        &HttpOptions::new(format!("http://127.0.0.1:{port}/mcp")),
    );
    tokio::spawn(async move { axum::serve(listener, app).await });

    let body = json!({"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": {
        "name": "read", "arguments": {}, "_meta": {
            "io.modelcontextprotocol/protocolVersion": "2026-07-28",
            "io.modelcontextprotocol/clientCapabilities": {}}}})
    .to_string();
    let request = format!(
        "POST /mcp HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nAuthorization: Bearer {alice}\r\n\
         Content-Type: application/json\r\nAccept: application/json, text/event-stream\r\n\
         MCP-Protocol-Version: 2026-07-28\r\nMcp-Method: tools/call\r\nMcp-Name: read\r\n\
         Content-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    );
    let mut stream = tokio::net::TcpStream::connect(("127.0.0.1", port))
        .await
        .unwrap();
    stream.write_all(request.as_bytes()).await.unwrap();
    let mut reply = String::new();
    stream.read_to_string(&mut reply).await.unwrap();
    assert!(reply.starts_with("HTTP/1.1 200"), "{reply}");
    assert!(
        !reply.contains("\"error\""),
        "served as another principal: {reply}"
    );

    let text = String::from_utf8(audit.bytes()).unwrap();
    let call: Value = text
        .lines()
        .map(|line| serde_json::from_str::<Value>(line).unwrap())
        .find(|record| record["name"] == "read")
        .unwrap_or_else(|| panic!("{text}"));
    assert_eq!(call["principal"], json!("alice"), "{call}");
    assert_eq!(call["decision"], json!("allow"), "{call}");
}
