//! The kit opens servers that speak only the 2025-11-25 `initialize` handshake (most servers
//! today, the TypeScript SDK's among them): `server/discover` is refused, the kit falls back to
//! `initialize` and runs the same matrix.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::borrow::Cow;
use std::path::PathBuf;

use rmcp::handler::server::router::tool::ToolRouter;
use rmcp::handler::server::wrapper::Parameters;
use rmcp::model::{DiscoverResult, ProtocolVersion, ServerCapabilities, ServerConfig};
use rmcp::service::RequestContext;
use rmcp::{ErrorData, RoleServer, ServerHandler, tool, tool_handler, tool_router};
use schemars::JsonSchema;
use serde::Deserialize;
use serde_json::json;
use toolgate_kit::{Claim, FsObserver, Kit, Launcher, ToolFixtures, ToolStatus};

#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
struct NameArgs {
    /// A file name under the state directory.
    name: String,
}

/// One honest read-only tool and one that writes while claiming to read.
#[derive(Debug, Clone)]
struct OldServer {
    state: PathBuf,
    tool_router: ToolRouter<Self>,
}

#[tool_router]
impl OldServer {
    /// Reads a file.
    #[tool(annotations(read_only_hint = true))]
    async fn read_file(&self, Parameters(args): Parameters<NameArgs>) -> Result<String, String> {
        std::fs::read_to_string(self.state.join(&args.name)).map_err(|e| e.to_string())
    }

    /// Reads a file. LIES: it also writes a copy next to it.
    #[tool(annotations(read_only_hint = true))]
    async fn read_and_copy(
        &self,
        Parameters(args): Parameters<NameArgs>,
    ) -> Result<String, String> {
        let text =
            std::fs::read_to_string(self.state.join(&args.name)).map_err(|e| e.to_string())?;
        std::fs::write(self.state.join(format!("{}.copy", args.name)), &text)
            .map_err(|e| e.to_string())?;
        Ok(text)
    }
}

#[tool_handler(router = self.tool_router)]
impl ServerHandler for OldServer {
    fn get_info(&self) -> ServerConfig {
        ServerConfig::new(ServerCapabilities::builder().enable_tools().build())
    }

    fn supported_protocol_versions(&self) -> Cow<'static, [ProtocolVersion]> {
        Cow::Owned(vec![ProtocolVersion::V_2025_11_25])
    }

    /// As a server written before 2026-07-28 answers: no such method.
    async fn discover(
        &self,
        _context: RequestContext<RoleServer>,
    ) -> Result<DiscoverResult, ErrorData> {
        Err(ErrorData::method_not_found::<
            rmcp::model::DiscoverRequestMethod,
        >())
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_that_refuses_discover_is_opened_with_initialize() {
    let dir = tempfile::tempdir().unwrap();
    let state = dir.path().to_path_buf();
    std::fs::write(state.join("readme.txt"), "hello\n").unwrap();
    let served = state.clone();
    let report = Kit::new(Launcher::in_process(move || OldServer {
        state: served.clone(),
        tool_router: OldServer::tool_router(),
    }))
    .observer(FsObserver::new([&state]))
    .tool(
        ToolFixtures::new(
            "read_file",
            json!({"name": "readme.txt"}),
            json!({"name": "readme.txt"}),
            json!({"name": 7}),
        )
        .with_missing_resource(json!({"name": "absent.txt"})),
    )
    .tool(
        ToolFixtures::new(
            "read_and_copy",
            json!({"name": "readme.txt"}),
            json!({"name": "readme.txt"}),
            json!({"name": 7}),
        )
        .with_missing_resource(json!({"name": "absent.txt"})),
    )
    .run()
    .await
    .expect("the kit opens the server over initialize and runs the matrix");
    let text = report.to_text();
    assert_eq!(
        report.tool("read_file").unwrap().status,
        ToolStatus::Consistent,
        "{text}"
    );
    assert_eq!(
        report.tool("read_and_copy").unwrap().status,
        ToolStatus::Contradicted,
        "{text}"
    );
    assert!(
        report
            .contradictions()
            .iter()
            .any(|c| c.tool == "read_and_copy" && c.claim == Claim::ReadOnly),
        "{text}"
    );
}
