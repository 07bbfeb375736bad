//! What the facade's tests share: `Echo`, a one-tool server to gate.

#![allow(dead_code, clippy::unwrap_used)]

use toolgate::rmcp::model::{
    CallToolRequestParams, CallToolResponse, CallToolResult, ContentBlock, ServerCapabilities,
    ServerConfig, Tool,
};
use toolgate::rmcp::service::RequestContext;
use toolgate::rmcp::{ErrorData, RoleServer, ServerHandler};

/// One tool, `echo`, answering "echo".
#[derive(Clone)]
pub(crate) struct Echo;

impl ServerHandler for Echo {
    fn get_info(&self) -> ServerConfig {
        ServerConfig::new(ServerCapabilities::builder().enable_tools().build())
    }

    fn get_tool(&self, name: &str) -> Option<Tool> {
        (name == "echo").then(|| {
            Tool::new(
                "echo",
                "echo",
                serde_json::json!({"type": "object"})
                    .as_object()
                    .unwrap()
                    .clone(),
            )
        })
    }

    async fn call_tool(
        &self,
        _request: CallToolRequestParams,
        _context: RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, ErrorData> {
        Ok(CallToolResult::success(vec![ContentBlock::text("echo")]).into())
    }
}
