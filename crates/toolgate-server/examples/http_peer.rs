//! The peers of the HTTP load benchmark (`benches/http_load.sh`, docs/BENCHMARKS.md "HTTP load"):
//! the reference server's notes served over rmcp's Streamable HTTP service *without* toolgate's
//! HTTP front door, on the same runtime, service configuration and allocator as
//! `toolgate-server serve --http`, so that the difference in a load run is what toolgate adds.
//!
//! ```text
//! http_peer --mode ungated      --ledger DIR [--addr 127.0.0.1:0]
//! http_peer --mode gated-noauth --ledger DIR [--policy P] [--addr 127.0.0.1:0]
//! ```
//!
//! - `ungated`: no gate, no authentication, no audit, no effect store. The reference tools'
//!   handlers take a `Permit`, which only the gate issues (rmcp refuses a call whose handler
//!   lacks its extension before the handler runs), so they cannot be served without the gate.
//!   This mode registers `read_ledger` and `write_note` with the same argument and result types
//!   and the same `Notes` store calls as `toolgate_server::tools::NotesServer`, minus the permit:
//!   the work a call does is the same notes I/O (two syncs for a new note, a read for a replay, a
//!   directory listing for `read_ledger`).
//! - `gated-noauth`: the reference server exactly as `toolgate-server` builds it
//!   (`toolgate_server::build`: policy, contract, audit log, effect store, fixed principal
//!   `local`), served by rmcp's service directly, without the API-token check and the front
//!   door's body screening. Between `ungated` and `serve --http`, it splits what the gate and its
//!   stores cost from what authentication costs.
//!
//! It says where it listens on stderr, as `serve --http` does:
//! `http_peer: serving Streamable HTTP at http://HOST:PORT/mcp`, and stops on SIGINT or SIGTERM.

// The one line the driver reads, and usage errors, go to stderr by design.
#![allow(clippy::print_stderr)]

use std::path::PathBuf;
use std::sync::Arc;

use anyhow::Context as _;
use rmcp::handler::server::router::tool::ToolRouter;
use rmcp::handler::server::wrapper::Parameters;
use rmcp::model::{CallToolResult, ServerCapabilities, ServerConfig};
use rmcp::transport::streamable_http_server::session::local::LocalSessionManager;
use rmcp::transport::streamable_http_server::{StreamableHttpServerConfig, StreamableHttpService};
use rmcp::{Json, ServerHandler, tool, tool_handler, tool_router};
use toolgate_server::notes::{Notes, Written};
use toolgate_server::tools::{ReadLedgerResult, WriteNoteArgs, WriteNoteResult, blocking};

/// The same allocator as the server binary (`src/main.rs`), so memory and allocation costs match.
#[global_allocator]
static ALLOCATOR: dlmalloc::GlobalDlmalloc = dlmalloc::GlobalDlmalloc;

/// The reference tools' notes work without the gate (see the module's documentation).
#[derive(Debug, Clone)]
struct UngatedNotes {
    tool_router: ToolRouter<Self>,
    notes: Arc<Notes>,
}

#[tool_router]
impl UngatedNotes {
    fn new(notes: Arc<Notes>) -> Self {
        UngatedNotes {
            tool_router: Self::tool_router(),
            notes,
        }
    }

    /// Write one note per request_id (no gate: no effect store, no audit record).
    #[tool]
    async fn write_note(
        &self,
        Parameters(args): Parameters<WriteNoteArgs>,
    ) -> Result<Json<WriteNoteResult>, String> {
        let notes = Arc::clone(&self.notes);
        let (request_id, text) = (args.request_id.clone(), args.text);
        let written = blocking(move || notes.write(&request_id, &text)).await?;
        let status = match written {
            Written::Created => "committed",
            Written::AlreadyThere => "replay",
        };
        Ok(Json(WriteNoteResult {
            request_id: args.request_id,
            status: status.to_owned(),
        }))
    }

    /// Observe every committed note (no gate: no audit record).
    #[tool(output_schema = rmcp::handler::server::tool::schema_for_output::<ReadLedgerResult>())]
    async fn read_ledger(&self) -> Result<CallToolResult, String> {
        let notes = Arc::clone(&self.notes);
        let payloads = blocking(move || notes.list()).await?;
        let mut result = serde_json::Map::new();
        result.insert("notes".to_owned(), serde_json::Value::Array(payloads));
        Ok(CallToolResult::structured(serde_json::Value::Object(
            result,
        )))
    }
}

#[tool_handler(router = self.tool_router)]
impl ServerHandler for UngatedNotes {
    fn get_info(&self) -> ServerConfig {
        ServerConfig::new(ServerCapabilities::builder().enable_tools().build()).with_server_info(
            rmcp::model::Implementation::new("toolgate-http-peer", env!("CARGO_PKG_VERSION")),
        )
    }
}

/// rmcp's service configured as `toolgate::http::router` configures it (loopback hosts and
/// origins, origin validation, the 4 MiB body limit, JSON responses).
fn service_config() -> StreamableHttpServerConfig {
    let defaults = toolgate::http::HttpOptions::new("http://127.0.0.1/mcp");
    let mut config = StreamableHttpServerConfig::default();
    config.allowed_hosts = defaults.allowed_hosts;
    config.allowed_origins = defaults.allowed_origins;
    config = config.enforce_origin_validation();
    config.max_request_body_bytes = defaults.max_body_bytes;
    config.json_response = true;
    config
}

/// Serves `handler` at `/mcp` on `listener` until SIGINT or SIGTERM.
async fn serve<H>(handler: H, listener: tokio::net::TcpListener) -> anyhow::Result<()>
where
    H: ServerHandler + Clone + Send + Sync + 'static,
{
    let service = StreamableHttpService::new(
        move || Ok(handler.clone()),
        Arc::new(LocalSessionManager::default()),
        service_config(),
    );
    let router = axum::Router::new().route_service(toolgate::http::MCP_PATH, service);
    let local = listener.local_addr()?;
    eprintln!(
        "http_peer: serving Streamable HTTP at http://{local}{}",
        toolgate::http::MCP_PATH
    );
    axum::serve(listener, router)
        .with_graceful_shutdown(toolgate::http::shutdown_signal())
        .await
        .context("the HTTP server failed")
}

struct Args {
    mode: String,
    ledger: PathBuf,
    policy: PathBuf,
    addr: std::net::SocketAddr,
}

fn parse_args() -> anyhow::Result<Args> {
    let mut args = Args {
        mode: "ungated".to_owned(),
        ledger: PathBuf::new(),
        policy: PathBuf::from(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../../fixtures/policy.json"
        )),
        addr: ([127, 0, 0, 1], 0).into(),
    };
    let mut argv = std::env::args().skip(1);
    while let Some(flag) = argv.next() {
        let value = argv
            .next()
            .with_context(|| format!("{flag} needs a value"))?;
        match flag.as_str() {
            "--mode" => args.mode = value,
            "--ledger" => args.ledger = value.into(),
            "--policy" => args.policy = value.into(),
            "--addr" => args.addr = value.parse().context("--addr is HOST:PORT")?,
            _ => anyhow::bail!(
                "unknown option {flag}; usage: http_peer --mode ungated|gated-noauth --ledger DIR [--policy P] [--addr 127.0.0.1:0]"
            ),
        }
    }
    anyhow::ensure!(
        !args.ledger.as_os_str().is_empty(),
        "--ledger DIR is required"
    );
    Ok(args)
}

fn run(args: Args) -> anyhow::Result<()> {
    // `toolgate-server serve --http`'s runtime.
    let runtime = toolgate::http::http_runtime(toolgate_server::BLOCKING_THREADS)?;
    runtime.block_on(async {
        let listener = tokio::net::TcpListener::bind(args.addr)
            .await
            .with_context(|| format!("cannot listen on {}", args.addr))?;
        match args.mode.as_str() {
            "ungated" => {
                let storage: Arc<dyn toolgate::storage::Storage> =
                    Arc::new(toolgate::storage::FsStorage);
                let notes = Notes::open(args.ledger.join(toolgate_server::NOTES_DIR), storage)
                    .context("cannot open the notes")?;
                serve(UngatedNotes::new(Arc::new(notes)), listener).await
            }
            "gated-noauth" => {
                let built = toolgate_server::build(&toolgate_server::ServerOptions {
                    gate: toolgate::operator::GateArgs {
                        policy: args.policy,
                        ledger: args.ledger,
                        ..Default::default()
                    },
                    ..Default::default()
                })?;
                serve(Arc::new(built.gated), listener).await
            }
            other => anyhow::bail!("unknown mode {other:?}: ungated or gated-noauth"),
        }
    })
}

fn main() -> std::process::ExitCode {
    match parse_args().and_then(run) {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("http_peer: {error:#}");
            std::process::ExitCode::FAILURE
        }
    }
}
