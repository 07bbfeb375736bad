//! `toolgate-server proxy -- CMD ARGS…`: the gate in front of an MCP server toolgate did not build.
//!
//! The upstream runs as a child over stdio ([`connect`]); [`Upstream`] is the gate's inner handler
//! and forwards to it everything the gate lets through: tools/list (less the tools its pin does not
//! approve), tools/call, resources, prompts, completions and the log level. [`HostLink`] is the
//! client side towards the upstream: it forwards the upstream's requests (sampling, elicitation,
//! roots) and notifications (progress, log messages, list and resource changes) to the host.
//!
//! The upstream's tools are pinned (`proxy lock`, `toolgate_contract::upstream`): at start the
//! live list is compared with the pin, every difference is logged and audited as `proxy/drift`,
//! and a tool whose record is not exactly the pinned one is hidden and refused (or, with
//! `--on-drift=refuse-start`, the proxy does not start). Without a pin the proxy does not start.

// Sampling, roots and logging are deprecated in the 2026-07-28 protocol (SEP-2577), but upstreams
// of the 2025-11-25 era send them, and a proxy forwards what its upstream speaks.
#![allow(deprecated)]

use std::collections::{HashMap, HashSet};
use std::path::Path;
use std::sync::{Arc, OnceLock, PoisonError, RwLock};

use anyhow::Context as _;
use rmcp::model::{
    CallToolRequestParams, CallToolResponse, ClientCapabilities, ClientConfig,
    CompleteRequestParams, CompleteResult, CreateMessageRequestParams, CreateMessageResult,
    ElicitRequestParams, ElicitResult, GetPromptRequestParams, GetPromptResponse, Implementation,
    ListPromptsResult, ListResourceTemplatesResult, ListResourcesResult, ListRootsResult,
    ListToolsResult, LoggingMessageNotificationParam, PaginatedRequestParams,
    ProgressNotificationParam, ReadResourceRequestParams, ReadResourceResponse,
    ResourceUpdatedNotificationParam, ServerConfig, SetLevelRequestParams, Tool,
};
use rmcp::service::{NotificationContext, Peer, RequestContext, RunningService, ServiceError};
use rmcp::transport::TokioChildProcess;
use rmcp::{ClientHandler, ErrorData as McpError, RoleClient, RoleServer, ServerHandler};
use toolgate::audit::{AuditEntry, AuditSink, Decision, Outcome};
use toolgate::canon::Sha256Digest;
use toolgate::contract::upstream::{UpstreamPin, UpstreamTool};

/// The host side, once known: the peer of the first request the host sent.
#[derive(Debug, Default)]
pub struct Host(OnceLock<Peer<RoleServer>>);

impl Host {
    fn remember(&self, peer: &Peer<RoleServer>) {
        let _first = self.0.set(peer.clone());
    }

    fn peer(&self) -> Result<&Peer<RoleServer>, McpError> {
        self.0.get().ok_or_else(|| {
            McpError::internal_error(
                "the host has not sent a request yet, so the upstream's request cannot be forwarded",
                None,
            )
        })
    }
}

/// The proxy's client towards the upstream: forwards what the upstream asks of the host.
#[derive(Debug, Clone)]
pub struct HostLink {
    host: Arc<Host>,
}

fn host_error(error: ServiceError) -> McpError {
    match error {
        ServiceError::McpError(error) => error,
        other => McpError::internal_error(format!("the host did not answer: {other}"), None),
    }
}

impl ClientHandler for HostLink {
    fn get_info(&self) -> ClientConfig {
        let mut capabilities = ClientCapabilities::default();
        capabilities.sampling = Some(Default::default());
        capabilities.elicitation = Some(Default::default());
        capabilities.roots = Some(Default::default());
        let mut info = ClientConfig::default();
        info.capabilities = capabilities;
        info.client_info = Implementation::new(crate::SERVER_NAME, env!("CARGO_PKG_VERSION"));
        info
    }

    async fn create_message(
        &self,
        params: CreateMessageRequestParams,
        _context: RequestContext<RoleClient>,
    ) -> Result<CreateMessageResult, McpError> {
        self.host
            .peer()?
            .create_message(params)
            .await
            .map_err(host_error)
    }

    async fn create_elicitation(
        &self,
        params: ElicitRequestParams,
        _context: RequestContext<RoleClient>,
    ) -> Result<ElicitResult, McpError> {
        let request =
            rmcp::model::ServerRequest::ElicitRequest(rmcp::model::ElicitRequest::new(params));
        match self.host.peer()?.send_request(request).await {
            Ok(rmcp::model::ClientResult::ElicitResult(result)) => Ok(result),
            Ok(_) => Err(McpError::internal_error(
                "the host answered the elicitation with another kind of result",
                None,
            )),
            Err(error) => Err(host_error(error)),
        }
    }

    async fn list_roots(
        &self,
        _context: RequestContext<RoleClient>,
    ) -> Result<ListRootsResult, McpError> {
        self.host.peer()?.list_roots().await.map_err(host_error)
    }

    async fn on_progress(
        &self,
        params: ProgressNotificationParam,
        _context: NotificationContext<RoleClient>,
    ) {
        if let Ok(host) = self.host.peer() {
            let _ = host.notify_progress(params).await;
        }
    }

    async fn on_logging_message(
        &self,
        params: LoggingMessageNotificationParam,
        _context: NotificationContext<RoleClient>,
    ) {
        if let Ok(host) = self.host.peer() {
            let _ = host.notify_logging_message(params).await;
        }
    }

    async fn on_resource_updated(
        &self,
        params: ResourceUpdatedNotificationParam,
        _context: NotificationContext<RoleClient>,
    ) {
        if let Ok(host) = self.host.peer() {
            let _ = host.notify_resource_updated(params).await;
        }
    }

    async fn on_resource_list_changed(&self, _context: NotificationContext<RoleClient>) {
        if let Ok(host) = self.host.peer() {
            let _ = host.notify_resource_list_changed().await;
        }
    }

    async fn on_prompt_list_changed(&self, _context: NotificationContext<RoleClient>) {
        if let Ok(host) = self.host.peer() {
            let _ = host.notify_prompt_list_changed().await;
        }
    }

    async fn on_tool_list_changed(&self, _context: NotificationContext<RoleClient>) {
        // The host lists again; that list goes through the pin like every other.
        if let Ok(host) = self.host.peer() {
            let _ = host.notify_tool_list_changed().await;
        }
    }
}

/// The upstream as the gate's inner handler.
#[derive(Debug)]
pub struct Upstream {
    client: RunningService<RoleClient, HostLink>,
    host: Arc<Host>,
    info: ServerConfig,
    drift: Arc<Drift>,
}

/// The upstream's tools against their pin: which are approved, why the others are not, and which
/// differences are already in the audit log.
#[derive(Debug)]
pub struct Drift {
    pin: UpstreamPin,
    audit: Arc<dyn AuditSink>,
    state: RwLock<DriftState>,
}

#[derive(Debug, Default)]
struct DriftState {
    /// The approved tools of the last list, by name (the gate resolves calls here).
    approved: HashMap<String, Tool>,
    /// Why each unapproved tool of the last list (and each pinned tool gone from it) is not served.
    notes: HashMap<String, String>,
    /// The differences already recorded, as `rule tool detail`.
    recorded: HashSet<String>,
}

impl Drift {
    /// Drift against `pin`, recorded in `audit`.
    pub fn new(pin: UpstreamPin, audit: Arc<dyn AuditSink>) -> Self {
        Drift {
            pin,
            audit,
            state: RwLock::new(DriftState::default()),
        }
    }

    /// Compares the live list `listed` of the upstream `server` (name, version) with the pin:
    /// keeps the approved tools and the reasons for the others, and returns the audit records of
    /// the differences not recorded yet (the caller appends them). Returns the approved tools too.
    fn observe(&self, server: (&str, &str), listed: &[Tool]) -> (Vec<Tool>, Vec<AuditEntry>) {
        let mut unique = HashSet::new();
        let records: Vec<UpstreamTool> = listed
            .iter()
            .filter(|tool| unique.insert(tool.name.to_string()))
            .map(pinned_record)
            .collect();
        let changes = match UpstreamPin::new(server.0, server.1, records) {
            Ok(live) => self.pin.compare(&live),
            Err(_) => Vec::new(),
        };
        let approved: Vec<Tool> = listed
            .iter()
            .filter(|tool| self.pin.approves(&pinned_record(tool)))
            .cloned()
            .collect();
        let mut state = self.state.write().unwrap_or_else(PoisonError::into_inner);
        state.approved = approved
            .iter()
            .map(|tool| (tool.name.to_string(), tool.clone()))
            .collect();
        state.notes.clear();
        let mut entries = Vec::new();
        for change in &changes {
            if !change.tool.is_empty() {
                let note = state.notes.entry(change.tool.clone()).or_insert_with(|| {
                    format!(
                        "the upstream's `{}` differs from its pin and is not served until a person approves it again (`{} proxy lock`):",
                        change.tool,
                        crate::SERVER_NAME
                    )
                });
                note.push_str(&format!(" {} ({});", change.rule, change.detail));
            }
            if state
                .recorded
                .insert(format!("{} {} {}", change.rule, change.tool, change.detail))
            {
                tracing::warn!(%change, "the upstream differs from its pin");
                let mut entry = AuditEntry::tool_call(
                    "proxy",
                    if change.tool.is_empty() {
                        "upstream"
                    } else {
                        change.tool.as_str()
                    },
                    Decision::Deny,
                    Outcome::Refused,
                    Sha256Digest::of(change.detail.as_bytes()),
                )
                .with_reason(format!("{}: {}", change.rule, change.detail));
                entry.method = "proxy/drift".to_owned();
                entries.push(entry);
            }
        }
        for note in state.notes.values_mut() {
            note.pop();
        }
        (approved, entries)
    }

    /// Observes `listed` and appends the new drift records (off the async threads).
    pub async fn observe_and_record(
        &self,
        server: (&str, &str),
        listed: &[Tool],
    ) -> Result<Vec<Tool>, McpError> {
        let (approved, entries) = self.observe(server, listed);
        if !entries.is_empty() {
            let audit = Arc::clone(&self.audit);
            toolgate::run_blocking(move || {
                entries.iter().try_for_each(|entry| audit.append(entry).map(drop))
            })
            .await
            .map_err(|e| McpError::internal_error(e.to_string(), None))?
            .map_err(|e| {
                McpError::internal_error(
                    format!("the upstream's drift could not be audited ({e}); nothing is served until the audit log is writable"),
                    None,
                )
            })?;
        }
        Ok(approved)
    }
}

impl toolgate::UnavailableTools for Drift {
    fn why(&self, tool: &str) -> Option<String> {
        self.state
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .notes
            .get(tool)
            .cloned()
    }
}

/// Why the upstream's answer is an error for the host.
fn upstream_error(error: ServiceError) -> McpError {
    match error {
        // The upstream's own JSON-RPC error goes to the host as it is.
        ServiceError::McpError(error) => error,
        ServiceError::TransportClosed => McpError::internal_error(
            "the upstream server is gone (its process exited or closed stdout); nothing more can be forwarded",
            None,
        ),
        other => McpError::internal_error(format!("the upstream server failed: {other}"), None),
    }
}

/// The pinned record of an rmcp tool.
pub fn pinned_record(tool: &Tool) -> UpstreamTool {
    UpstreamTool {
        name: tool.name.to_string(),
        title: tool.title.clone(),
        description: tool.description.as_ref().map(|d| d.to_string()),
        input_schema: serde_json::Value::Object((*tool.input_schema).clone()),
        output_schema: tool
            .output_schema
            .as_ref()
            .map(|schema| serde_json::Value::Object((**schema).clone())),
        annotations: tool
            .annotations
            .as_ref()
            .and_then(|a| serde_json::to_value(a).ok()),
    }
}

/// Starts `command` and completes the MCP handshake with it (2025-11-25 `initialize`).
pub async fn connect(
    command: &[String],
) -> anyhow::Result<(RunningService<RoleClient, HostLink>, Arc<Host>)> {
    let (program, args) = command.split_first().context(
        "no upstream command: give it after `--`, e.g. `proxy -- npx server-filesystem /data`",
    )?;
    let mut child = tokio::process::Command::new(program);
    child.args(args);
    let (transport, _stderr) = TokioChildProcess::builder(child)
        .stderr(std::process::Stdio::inherit())
        .spawn()
        .with_context(|| format!("cannot start the upstream `{program}`"))?;
    let host = Arc::new(Host::default());
    let link = HostLink {
        host: Arc::clone(&host),
    };
    let client = rmcp::serve_client(link, transport)
        .await
        .with_context(|| format!("the upstream `{program}` did not complete the MCP handshake"))?;
    Ok((client, host))
}

/// The live pin of the connected upstream: its server info and every tool it lists.
pub async fn live_pin(
    client: &RunningService<RoleClient, HostLink>,
) -> anyhow::Result<UpstreamPin> {
    let info = client.peer_info();
    let (name, version) = info
        .as_ref()
        .and_then(|info| info.server_info.as_ref())
        .map(|server| (server.name.clone(), server.version.clone()))
        .unwrap_or_default();
    let tools = client
        .list_all_tools()
        .await
        .map_err(upstream_error)
        .context("the upstream did not list its tools")?;
    UpstreamPin::new(name, version, tools.iter().map(pinned_record))
        .context("the upstream's tool list cannot be pinned")
}

/// Reads the pin file `path`.
pub fn read_pin(path: &Path) -> anyhow::Result<UpstreamPin> {
    let text = toolgate::storage::read_regular_text(
        path,
        toolgate::contract::MAX_LOCKFILE_BYTES,
        toolgate::storage::Symlinks::Follow,
    )
    .with_context(|| format!("cannot read the upstream pin {}", path.display()))?
    .with_context(|| {
        format!(
            "there is no upstream pin at {}: run `{} proxy lock --lock {} -- CMD ARGS…`, review the file, then start the proxy",
            path.display(),
            crate::SERVER_NAME,
            path.display()
        )
    })?;
    UpstreamPin::parse(&text)
        .with_context(|| format!("the upstream pin {} is invalid", path.display()))
}

impl Upstream {
    /// The gate's inner handler for the connected upstream, serving the tools `drift` approves
    /// (it has observed the first list already).
    pub fn new(
        client: RunningService<RoleClient, HostLink>,
        host: Arc<Host>,
        drift: Arc<Drift>,
    ) -> Self {
        // The upstream's capabilities, name and instructions; the protocol version is the one
        // negotiated with the host.
        let info = match client.peer_info() {
            Some(peer) => {
                let mut info = ServerConfig::new(peer.capabilities.clone());
                if let Some(server) = &peer.server_info {
                    info = info.with_server_info(server.clone());
                }
                if let Some(instructions) = &peer.instructions {
                    info = info.with_instructions(instructions.clone());
                }
                info
            }
            None => ServerConfig::new(Default::default()),
        };
        Upstream {
            client,
            host,
            info,
            drift,
        }
    }

    fn peer(&self) -> &Peer<RoleClient> {
        self.client.peer()
    }

    /// The upstream's name and version as it declared them.
    fn server(&self) -> (String, String) {
        server_of(&self.client)
    }
}

/// The name and version `client`'s upstream declared (empty when it declared none).
fn server_of(client: &RunningService<RoleClient, HostLink>) -> (String, String) {
    client
        .peer_info()
        .as_ref()
        .and_then(|info| info.server_info.as_ref())
        .map(|server| (server.name.clone(), server.version.clone()))
        .unwrap_or_default()
}

impl ServerHandler for Upstream {
    fn get_info(&self) -> ServerConfig {
        self.info.clone()
    }

    fn get_tool(&self, name: &str) -> Option<Tool> {
        self.drift
            .state
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .approved
            .get(name)
            .cloned()
    }

    async fn list_tools(
        &self,
        _request: Option<PaginatedRequestParams>,
        context: RequestContext<RoleServer>,
    ) -> Result<ListToolsResult, McpError> {
        self.host.remember(&context.peer);
        let listed = self.peer().list_all_tools().await.map_err(upstream_error)?;
        let (name, version) = self.server();
        let approved = self
            .drift
            .observe_and_record((&name, &version), &listed)
            .await?;
        Ok(ListToolsResult::with_all_items(approved))
    }

    async fn call_tool(
        &self,
        request: CallToolRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, McpError> {
        self.host.remember(&context.peer);
        tokio::select! {
            answer = self.peer().call_tool_once(request) => answer.map_err(upstream_error),
            () = context.ct.cancelled() => Err(McpError::internal_error(
                "the call was cancelled by the host; the upstream was told to stop",
                None,
            )),
        }
    }

    async fn list_resources(
        &self,
        request: Option<PaginatedRequestParams>,
        context: RequestContext<RoleServer>,
    ) -> Result<ListResourcesResult, McpError> {
        self.host.remember(&context.peer);
        self.peer()
            .list_resources(request)
            .await
            .map_err(upstream_error)
    }

    async fn list_resource_templates(
        &self,
        request: Option<PaginatedRequestParams>,
        context: RequestContext<RoleServer>,
    ) -> Result<ListResourceTemplatesResult, McpError> {
        self.host.remember(&context.peer);
        self.peer()
            .list_resource_templates(request)
            .await
            .map_err(upstream_error)
    }

    async fn read_resource(
        &self,
        request: ReadResourceRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<ReadResourceResponse, McpError> {
        self.host.remember(&context.peer);
        self.peer()
            .read_resource_once(request)
            .await
            .map_err(upstream_error)
    }

    async fn list_prompts(
        &self,
        request: Option<PaginatedRequestParams>,
        context: RequestContext<RoleServer>,
    ) -> Result<ListPromptsResult, McpError> {
        self.host.remember(&context.peer);
        self.peer()
            .list_prompts(request)
            .await
            .map_err(upstream_error)
    }

    async fn get_prompt(
        &self,
        request: GetPromptRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<GetPromptResponse, McpError> {
        self.host.remember(&context.peer);
        self.peer()
            .get_prompt_once(request)
            .await
            .map_err(upstream_error)
    }

    async fn complete(
        &self,
        request: CompleteRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<CompleteResult, McpError> {
        self.host.remember(&context.peer);
        self.peer().complete(request).await.map_err(upstream_error)
    }

    async fn set_level(
        &self,
        request: SetLevelRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<(), McpError> {
        self.host.remember(&context.peer);
        self.peer().set_level(request).await.map_err(upstream_error)
    }
}
