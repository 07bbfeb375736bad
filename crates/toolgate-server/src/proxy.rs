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
//! The comparison runs again on every list and whenever the upstream says its tools changed.
//!
//! The upstream is not trusted to behave: its output is read by toolgate's `UpstreamTransport`,
//! which ends the connection on anything but well-formed answers to requests asked, and a request
//! without an answer in time is cancelled ([`UpstreamOptions::timeout`]). [`supervise`] then
//! audits the end, and restarts the upstream with backoff or ends the proxy; a call lost with its
//! upstream is `indeterminate` (`docs/proxy.md`).
//!
//! Nor is it trusted with what it sends. What it pushes unasked is bounded by the transport
//! ([`UpstreamOptions::limits`]): a flood is dropped and recorded once as `proxy/flood`. Its
//! requests to the host (sampling, elicitation, roots) are refused unless the host declared the
//! capability and the policy's `proxy.host_requests` lists it, and each is audited. Its tool
//! results are bounded ([`UpstreamOptions::max_result_bytes`]), checked against the pinned
//! `outputSchema` (an invalid one is an error to the host, recorded as `proxy/result`), and their
//! text is wrapped as untrusted third-party text unless `proxy.trusted_output` names the tool.

// Sampling, roots and logging are deprecated in the 2026-07-28 protocol (SEP-2577), but upstreams
// of the 2025-11-25 era send them, and a proxy forwards what its upstream speaks.
#![allow(deprecated)]

use std::collections::{HashMap, HashSet};
use std::path::Path;
use std::process::Stdio;
use std::sync::{Arc, Mutex, OnceLock, PoisonError, RwLock};
use std::time::{Duration, Instant};

use anyhow::Context as _;
use rmcp::model::{
    CallToolRequest, CallToolRequestParams, CallToolResponse, CallToolResult,
    CancelledNotificationParam, ClientCapabilities, ClientConfig, ClientRequest, CompleteRequest,
    CompleteRequestParams, CompleteResult, ContentBlock, CreateMessageRequestParams,
    CreateMessageResult, ElicitRequestParams, ElicitResult, GetPromptRequest,
    GetPromptRequestParams, GetPromptResponse, Implementation, ListPromptsRequest,
    ListPromptsResult, ListResourceTemplatesRequest, ListResourceTemplatesResult,
    ListResourcesRequest, ListResourcesResult, ListRootsResult, ListToolsResult,
    LoggingMessageNotificationParam, PaginatedRequestParams, ProgressNotificationParam,
    ProgressToken, ProtocolVersion, ReadResourceRequest, ReadResourceRequestParams,
    ReadResourceResponse, RequestId, ResourceUpdatedNotificationParam, ResultType, ServerConfig,
    ServerNotification, ServerResult, SetLevelRequest, SetLevelRequestParams, SubscriptionFilter,
    Tool,
};
use rmcp::service::{
    ClientLifecycleMode, NotificationContext, Peer, PeerRequestOptions, RequestContext,
    RunningService, ServiceError, serve_client_with_lifecycle,
};
use rmcp::{ClientHandler, ErrorData as McpError, RoleClient, RoleServer, ServerHandler};
use toolgate::audit::{AuditDecision, AuditEntry, AuditSink, Outcome};
use toolgate::canon::Sha256Digest;
use toolgate::contract::upstream::{UpstreamPin, UpstreamTool};
use toolgate::policy::HostRequest;
use toolgate::upstream::{Flood, UpstreamEnd, UpstreamLimits, UpstreamTransport};

/// The host side, once known (the peer of the first request the host sent), the pin's
/// comparison once the proxy serves, and the progress tokens of the calls in flight.
#[derive(Debug, Default)]
pub struct Host {
    peer: OnceLock<Peer<RoleServer>>,
    /// Woken when the host's first request arrives.
    arrived: tokio::sync::Notify,
    drift: OnceLock<Arc<Drift>>,
    /// The upstream's progress token of a forwarded call -> the host's.
    progress: Mutex<HashMap<ProgressToken, ProgressToken>>,
    /// The policy in force and the audit log, once the gate is built.
    governed: OnceLock<Governed>,
    /// The comparisons after the upstream's `list_changed`.
    list_checks: Mutex<ListChecks>,
}

/// What the proxy's own decisions about the upstream are made and recorded with.
#[derive(Debug, Clone)]
struct Governed {
    policy: toolgate::PolicyHandle,
    audit: Arc<dyn AuditSink>,
}

impl Host {
    fn remember(&self, peer: &Peer<RoleServer>) {
        if self.peer.set(peer.clone()).is_ok() {
            self.arrived.notify_waiters();
        }
    }

    /// The host, for a request of the upstream: one made before the host's first request (a
    /// `roots/list` right after the upstream's handshake, while the proxy starts) waits for it,
    /// at most [`HOST_WAIT`].
    async fn requested(&self) -> Result<Peer<RoleServer>, McpError> {
        let deadline = tokio::time::Instant::now() + HOST_WAIT;
        loop {
            let arrived = self.arrived.notified();
            if let Some(peer) = self.peer.get() {
                return Ok(peer.clone());
            }
            if tokio::time::timeout_at(deadline, arrived).await.is_err() {
                return self.peer().cloned();
            }
        }
    }

    /// From now on, a `notifications/tools/list_changed` of the upstream is compared with the
    /// pin at once.
    pub fn watch_drift(&self, drift: Arc<Drift>) {
        let _first = self.drift.set(drift);
    }

    /// From now on, the upstream's requests to the host are decided by `policy` (its
    /// `proxy.host_requests`), its text is wrapped unless `proxy.trusted_output` names the tool,
    /// and the proxy's decisions about what the upstream sends are recorded in `audit`.
    pub fn govern(&self, policy: toolgate::PolicyHandle, audit: Arc<dyn AuditSink>) {
        let _first = self.governed.set(Governed { policy, audit });
    }

    /// Whether the policy in force lets the upstream send `request` (never before it is known).
    fn allows(&self, request: HostRequest) -> bool {
        self.governed
            .get()
            .is_some_and(|g| g.policy.policy().host_request_allowed(request))
    }

    /// Whether the policy in force passes `tool`'s text to the host unwrapped.
    fn trusts_output(&self, tool: &str) -> bool {
        self.governed
            .get()
            .is_some_and(|g| g.policy.policy().trusted_output(tool))
    }

    /// Appends `entry` to the audit log (off the async threads); a failure is logged, since the
    /// decision it records is already made.
    async fn record(&self, entry: AuditEntry) {
        let Some(governed) = self.governed.get() else {
            tracing::warn!(method = %entry.method, reason = ?entry.reason, "not audited: the proxy's audit log is not open yet");
            return;
        };
        let audit = Arc::clone(&governed.audit);
        match toolgate::run_blocking(move || audit.append(&entry)).await {
            Ok(Ok(_)) => {}
            Ok(Err(error)) => {
                tracing::error!(%error, "cannot audit the proxy's decision about its upstream")
            }
            Err(error) => {
                tracing::error!(%error, "cannot audit the proxy's decision about its upstream")
            }
        }
    }

    /// Records a flood of the upstream's pushes, once per flood.
    async fn record_flood(&self, flood: Flood) {
        let how = if flood.answered {
            "until it answered again"
        } else {
            "until its connection ended"
        };
        let reason = format!(
            "upstream_flood: the upstream pushed {} notifications and requests between two answers, over the limit of {}: {} were dropped, not forwarded to the host ({how}; each flood is recorded once)",
            flood.passed + flood.dropped,
            flood.passed,
            flood.dropped
        );
        tracing::warn!("{reason}");
        self.record(proxy_record(
            "proxy/flood",
            AuditDecision::Deny,
            Outcome::Refused,
            Sha256Digest::of(reason.as_bytes()),
            reason,
        ))
        .await;
    }

    fn peer(&self) -> Result<&Peer<RoleServer>, McpError> {
        self.peer.get().ok_or_else(|| {
            McpError::internal_error(
                "the host has not sent a request yet, so the upstream's request cannot be forwarded",
                None,
            )
        })
    }
}

/// How long a request of the upstream waits for the host to connect.
const HOST_WAIT: Duration = Duration::from_secs(60);

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
        let digest = digest_of(&params);
        let host = self.admit(HostRequest::Sampling, digest).await?;
        let answer = host.create_message(params).await.map_err(host_error);
        self.forwarded(HostRequest::Sampling, digest, &answer).await;
        answer
    }

    async fn create_elicitation(
        &self,
        params: ElicitRequestParams,
        _context: RequestContext<RoleClient>,
    ) -> Result<ElicitResult, McpError> {
        let digest = digest_of(&params);
        let host = self.admit(HostRequest::Elicitation, digest).await?;
        let request =
            rmcp::model::ServerRequest::ElicitRequest(rmcp::model::ElicitRequest::new(params));
        let answer = match host.send_request(request).await {
            Ok(rmcp::model::ClientResult::ElicitResult(result)) => Ok(result),
            Ok(_) => Err(McpError::internal_error(
                "the host answered the elicitation with another kind of result",
                None,
            )),
            Err(error) => Err(host_error(error)),
        };
        self.forwarded(HostRequest::Elicitation, digest, &answer)
            .await;
        answer
    }

    async fn list_roots(
        &self,
        _context: RequestContext<RoleClient>,
    ) -> Result<ListRootsResult, McpError> {
        let digest = Sha256Digest::of(b"");
        let host = self.admit(HostRequest::Roots, digest).await?;
        let answer = host.list_roots().await.map_err(host_error);
        self.forwarded(HostRequest::Roots, digest, &answer).await;
        answer
    }

    async fn on_progress(
        &self,
        mut params: ProgressNotificationParam,
        _context: NotificationContext<RoleClient>,
    ) {
        // Only the progress of a call the host gave a token for, under the host's token.
        let host_token = self
            .host
            .progress
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .get(&params.progress_token)
            .cloned();
        if let (Some(token), Ok(host)) = (host_token, self.host.peer()) {
            params.progress_token = token;
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

    async fn on_tool_list_changed(&self, context: NotificationContext<RoleClient>) {
        // The comparison waits for the upstream's answer to a list: the notification's place in
        // flight is given back first, or a reader waiting for places could never read the answer.
        let upstream = context.peer.clone();
        drop(context);
        tool_list_changed(&self.host, &upstream).await;
    }
}

impl HostLink {
    /// Decides a request of the upstream to the host: refused (and audited) unless the host
    /// declared its capability and the policy's `proxy.host_requests` lists it. Returns the host
    /// to forward it to.
    async fn admit(
        &self,
        request: HostRequest,
        digest: Sha256Digest,
    ) -> Result<Peer<RoleServer>, McpError> {
        let host = self.host.requested().await?;
        let refusal = if !declared(&host, request) {
            Some(format!(
                "host_capability_missing: the host did not declare the `{}` capability (a 2026-07-28 host takes no requests from a server at all), so the upstream may not ask it",
                request.as_str()
            ))
        } else if !self.host.allows(request) {
            Some(format!(
                "policy: proxy.host_requests does not list \"{}\" (by default the upstream may ask the host nothing); add it to the policy to forward these requests",
                request.as_str()
            ))
        } else {
            None
        };
        let Some(reason) = refusal else {
            return Ok(host);
        };
        tracing::warn!(method = request.method(), %reason, "refused the upstream's request to the host");
        self.host
            .record(proxy_record(
                request.method(),
                AuditDecision::Deny,
                Outcome::NotExecuted,
                digest,
                reason.clone(),
            ))
            .await;
        Err(McpError::invalid_request(
            format!(
                "the proxy does not forward {} to the host: {reason}",
                request.method()
            ),
            None,
        ))
    }

    /// Records a request of the upstream that was forwarded to the host, and how the host
    /// answered.
    async fn forwarded<T>(
        &self,
        request: HostRequest,
        digest: Sha256Digest,
        answer: &Result<T, McpError>,
    ) {
        let (outcome, how) = match answer {
            Ok(_) => (Outcome::Observed, "the host answered".to_owned()),
            Err(error) => (
                Outcome::Error,
                format!("the host answered with error {}", error.code.0),
            ),
        };
        self.host
            .record(proxy_record(
                request.method(),
                AuditDecision::Allow,
                outcome,
                digest,
                format!(
                    "forwarded: the host declared `{}` and proxy.host_requests lists it; {how}",
                    request.as_str()
                ),
            ))
            .await;
    }
}

/// Whether `host` declared the capability `request` needs. Only a 2025-11-25 host declares
/// capabilities for the session (`initialize`); the 2026-07-28 protocol forbids requests from a
/// server to its client, so a host of that era has none for the upstream.
fn declared(host: &Peer<RoleServer>, request: HostRequest) -> bool {
    let Some(info) = host.peer_info() else {
        return false;
    };
    let capabilities = &info.capabilities;
    match request {
        HostRequest::Sampling => capabilities.sampling.is_some(),
        HostRequest::Elicitation => capabilities.elicitation.is_some(),
        HostRequest::Roots => capabilities.roots.is_some(),
        // A kind this proxy does not know is not declared.
        _ => false,
    }
}

/// The digest of a request's parameters, for its audit record (never the parameters).
fn digest_of(params: &impl serde::Serialize) -> Sha256Digest {
    Sha256Digest::of_json(&serde_json::to_value(params).unwrap_or_default())
}

/// A record of the proxy's own, about its upstream (`method` says which kind).
fn proxy_record(
    method: &str,
    decision: AuditDecision,
    outcome: Outcome,
    digest: Sha256Digest,
    reason: String,
) -> AuditEntry {
    let mut entry = AuditEntry::tool_call("proxy", "upstream", decision, outcome, digest)
        .with_reason(toolgate::audit::Reason::Note(reason));
    entry.method = method.to_owned();
    entry
}

/// The upstream's tools changed (its `notifications/tools/list_changed`, unsolicited from a
/// 2025-11-25 upstream, on the proxy's subscription from a 2026-07-28 one): the new list is
/// compared with the pin at once, so a changed tool is hidden and refused before the host lists
/// again (the host's list goes through the pin too); then the host is told.
///
/// Announcements that arrive while a comparison runs are coalesced into one more comparison, so a
/// flood of `list_changed` costs two lists of the upstream, not one each.
async fn tool_list_changed(host: &Host, upstream: &Peer<RoleClient>) {
    {
        let mut checks = host
            .list_checks
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        if checks.running {
            checks.again = true;
            return;
        }
        checks.running = true;
    }
    loop {
        compare_and_announce(host, upstream).await;
        let mut checks = host
            .list_checks
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        if !std::mem::take(&mut checks.again) {
            checks.running = false;
            return;
        }
    }
}

/// Whether a comparison after `list_changed` runs, and whether another was announced meanwhile.
#[derive(Debug, Default)]
struct ListChecks {
    running: bool,
    again: bool,
}

/// Lists the upstream's tools, compares them with the pin, then tells the host.
async fn compare_and_announce(host: &Host, upstream: &Peer<RoleClient>) {
    if let Some(drift) = host.drift.get() {
        match upstream.list_all_tools().await {
            Ok(listed) => {
                let (name, version) = server_of(upstream);
                if let Err(error) = drift.observe_and_record((&name, &version), &listed).await {
                    tracing::error!(error = %error.message, "cannot record the upstream's drift");
                }
            }
            Err(error) => {
                tracing::warn!(%error, "the upstream announced a new tool list but did not list it");
            }
        }
    }
    if let Ok(host) = host.peer() {
        let _ = host.notify_tool_list_changed().await;
    }
}

/// The upstream as the gate's inner handler.
#[derive(Debug)]
pub struct Upstream {
    link: Arc<Link>,
    info: ServerConfig,
    drift: Arc<Drift>,
    /// The compiled pinned output schemas, by tool (compiled again when the schema differs).
    validators: toolgate::SchemaCache,
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
                note.push_str(&format!(
                    " {} {} ({});",
                    change.verdict, change.rule, change.detail
                ));
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
                    AuditDecision::Deny,
                    Outcome::Refused,
                    Sha256Digest::of(change.detail.as_bytes()),
                )
                .with_reason(toolgate::audit::Reason::Note(format!(
                    "{} {}: {}",
                    change.verdict, change.rule, change.detail
                )));
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

/// How the proxy runs its upstream.
#[derive(Debug, Clone)]
pub struct UpstreamOptions {
    /// The upstream's command line.
    pub command: Vec<String>,
    /// The longest line the upstream may write, in bytes; a longer one ends the connection.
    pub max_line_bytes: usize,
    /// How long a forwarded request (and the handshake) may wait for the upstream's answer.
    pub timeout: Duration,
    /// How many restarts in a row the proxy attempts before it exits (0: exit at the first end).
    pub restarts: u32,
    /// The wait before the first restart, doubled for each further one in a row (at most
    /// [`MAX_BACKOFF`]).
    pub backoff: Duration,
    /// What the upstream may push unasked (notifications, requests to the host).
    pub limits: UpstreamLimits,
    /// The largest tool result forwarded to the host, in bytes (as JSON); a larger one is an
    /// error to the host.
    pub max_result_bytes: usize,
}

/// The default [`UpstreamOptions::max_result_bytes`]: 4 MiB.
pub const DEFAULT_MAX_RESULT_BYTES: usize = 4 * 1024 * 1024;

/// The longest wait between two restarts.
pub const MAX_BACKOFF: Duration = Duration::from_secs(30);

/// An upstream that stayed up this long has recovered: its next end starts a new row of restarts.
pub const RESTART_WINDOW: Duration = Duration::from_secs(60);

/// How long a stopped upstream may take to exit by itself before it is killed.
pub const EXIT_GRACE: Duration = Duration::from_millis(500);

/// One started upstream process and the MCP client session with it.
#[derive(Debug)]
pub struct Connection {
    client: RunningService<RoleClient, HostLink>,
    end: Arc<UpstreamEnd>,
    child: tokio::sync::Mutex<tokio::process::Child>,
    started: Instant,
}

impl Connection {
    fn peer(&self) -> &Peer<RoleClient> {
        self.client.peer()
    }

    /// Stops the session and the process: its stdin is closed, and it is killed unless it exits
    /// within half a second.
    pub async fn close(self) {
        self.end
            .end("the proxy closed the connection to the upstream");
        let _ = self.stop().await;
    }

    /// Stops the session and the process (killed unless it exits within [`EXIT_GRACE`]), and
    /// returns why it ended, with its exit status.
    async fn stop(&self) -> String {
        self.client.cancellation_token().cancel();
        let reason = self
            .end
            .reason()
            .unwrap_or("the proxy stopped the upstream")
            .to_owned();
        let mut child = self.child.lock().await;
        let status = match tokio::time::timeout(EXIT_GRACE, child.wait()).await {
            Ok(status) => status,
            Err(_) => {
                let _ = child.start_kill();
                child.wait().await
            }
        };
        match status {
            Ok(status) => format!("{reason}; the process ended with {status}"),
            Err(error) => format!("{reason}; its exit status cannot be read: {error}"),
        }
    }
}

/// Starts the upstream and completes the MCP handshake with it within `options.timeout`
/// (2026-07-28 `server/discover`, or 2025-11-25 `initialize` for an older server), then, for a
/// 2026-07-28 upstream that announces tool list changes, subscribes to them.
pub async fn connect(options: &UpstreamOptions, host: &Arc<Host>) -> anyhow::Result<Connection> {
    let (program, args) = options.command.split_first().context(
        "no upstream command: give it after `--`, e.g. `proxy -- npx server-filesystem /data`",
    )?;
    let mut child = tokio::process::Command::new(program)
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .kill_on_drop(true)
        .spawn()
        .with_context(|| format!("cannot start the upstream `{program}`"))?;
    let (Some(stdin), Some(stdout)) = (child.stdin.take(), child.stdout.take()) else {
        anyhow::bail!("the upstream `{program}` was started without pipes");
    };
    let (transport, end) = UpstreamTransport::new(stdout, stdin, options.max_line_bytes);
    let mut transport = transport.with_limits(options.limits);
    if let Some(mut floods) = transport.take_floods() {
        let host = Arc::clone(host);
        // Ends with the transport (the sender is dropped with it).
        tokio::spawn(async move {
            while let Some(flood) = floods.recv().await {
                host.record_flood(flood).await;
            }
        });
    }
    let link = HostLink {
        host: Arc::clone(host),
    };
    // The 2026-07-28 `server/discover` first; an upstream that answers it as a 2025-11-25 server
    // would (an error such as -32601) gets `initialize`.
    let lifecycle = ClientLifecycleMode::Auto {
        preferred_versions: vec![ProtocolVersion::V_2026_07_28],
        legacy_version: Some(ProtocolVersion::V_2025_11_25),
    };
    let handshake = tokio::time::timeout(
        options.timeout,
        serve_client_with_lifecycle(link, transport, lifecycle),
    );
    let client = match handshake.await {
        Ok(Ok(client)) => client,
        Ok(Err(error)) => {
            let _ = child.start_kill();
            let why = end.reason().map(|r| format!(" ({r})")).unwrap_or_default();
            return Err(anyhow::Error::new(error).context(format!(
                "the upstream `{program}` did not complete the MCP handshake{why}"
            )));
        }
        Err(_) => {
            let _ = child.start_kill();
            anyhow::bail!(
                "the upstream `{program}` did not complete the MCP handshake within {:?}",
                options.timeout
            );
        }
    };
    subscribe_to_tool_changes(&client, host).await;
    Ok(Connection {
        client,
        end,
        child: tokio::sync::Mutex::new(child),
        started: Instant::now(),
    })
}

/// A 2026-07-28 upstream sends list changes only on a subscription: when it declares them, the
/// proxy opens one (`subscriptions/listen`) for the connection's life.
async fn subscribe_to_tool_changes(
    client: &RunningService<RoleClient, HostLink>,
    host: &Arc<Host>,
) {
    let Some(info) = client.peer_info() else {
        return;
    };
    let modern = info.protocol_version >= ProtocolVersion::V_2026_07_28;
    let announces = info
        .capabilities
        .tools
        .as_ref()
        .and_then(|tools| tools.list_changed)
        == Some(true);
    if !(modern && announces) {
        return;
    }
    let filter = SubscriptionFilter::builder().tools_list_changed().build();
    let mut subscription = match client.peer().listen(filter).await {
        Ok(subscription) => subscription,
        Err(error) => {
            tracing::warn!(%error, "the upstream refused a subscription to its tool list changes; the proxy sees them only when the host lists");
            return;
        }
    };
    let peer = client.peer().clone();
    let host = Arc::clone(host);
    tokio::spawn(async move {
        while let Ok(Some(notification)) = subscription.next().await {
            if let ServerNotification::ToolListChangedNotification(_) = notification {
                // Not awaited here: the subscription is drained at once (rmcp cancels one whose
                // buffer fills), and announcements during a comparison are coalesced.
                let (host, peer) = (Arc::clone(&host), peer.clone());
                tokio::spawn(async move { tool_list_changed(&host, &peer).await });
            }
        }
    });
}

/// The live pin of a connected upstream (its server info and every tool it lists), and the
/// tools as listed.
pub async fn live_pin(connection: &Connection) -> anyhow::Result<(UpstreamPin, Vec<Tool>)> {
    let (name, version) = server_of(connection.peer());
    let tools = connection
        .peer()
        .list_all_tools()
        .await
        .map_err(|e| upstream_error(e, &connection.end))
        .context("the upstream did not list its tools")?;
    let pin = UpstreamPin::new(name, version, tools.iter().map(pinned_record))
        .context("the upstream's tool list cannot be pinned")?;
    Ok((pin, tools))
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

/// The name and version an upstream declared (empty when it declared none).
fn server_of(peer: &Peer<RoleClient>) -> (String, String) {
    peer.peer_info()
        .as_ref()
        .and_then(|info| info.server_info.as_ref())
        .map(|server| (server.name.clone(), server.version.clone()))
        .unwrap_or_default()
}

/// Why the upstream's answer is an error for the host.
fn upstream_error(error: ServiceError, end: &UpstreamEnd) -> McpError {
    match error {
        // The upstream's own JSON-RPC error goes to the host as it is.
        ServiceError::McpError(error) => error,
        ServiceError::TransportClosed | ServiceError::TransportSend(_) => McpError::internal_error(
            format!(
                "the upstream server is gone: {}",
                end.reason()
                    .unwrap_or("its connection closed (the process exited or closed stdout)")
            ),
            None,
        ),
        ServiceError::Timeout { timeout } => McpError::internal_error(
            format!(
                "the upstream server did not answer within {timeout:?}; the request was cancelled upstream"
            ),
            None,
        ),
        other => McpError::internal_error(format!("the upstream server failed: {other}"), None),
    }
}

/// The upstream as it is now.
#[derive(Debug)]
enum LinkState {
    Up(Arc<Connection>),
    /// Down, with what the host is told: why, and whether a restart is coming.
    Down(String),
}

/// The upstream's connection, replaced when it restarts, and the requests forwarded to it.
#[derive(Debug)]
pub struct Link {
    options: UpstreamOptions,
    host: Arc<Host>,
    state: RwLock<LinkState>,
}

impl Link {
    /// The link to the upstream `connection` was started with `options` for `host`.
    pub fn new(options: UpstreamOptions, host: Arc<Host>, connection: Connection) -> Self {
        Link {
            options,
            host,
            state: RwLock::new(LinkState::Up(Arc::new(connection))),
        }
    }

    /// Closes the upstream when the proxy stops: its stdin is closed, and it is killed unless it
    /// exits within [`EXIT_GRACE`]. Nothing is restarted afterwards.
    pub async fn close(&self) {
        let current = std::mem::replace(
            &mut *self.state.write().unwrap_or_else(PoisonError::into_inner),
            LinkState::Down("the proxy is stopping".to_owned()),
        );
        if let LinkState::Up(connection) = current {
            connection
                .end
                .end("the proxy closed the connection to the upstream");
            let _ = connection.stop().await;
        }
    }

    fn connection(&self) -> Result<Arc<Connection>, McpError> {
        match &*self.state.read().unwrap_or_else(PoisonError::into_inner) {
            LinkState::Up(connection) => Ok(Arc::clone(connection)),
            LinkState::Down(why) => Err(McpError::internal_error(why.clone(), None)),
        }
    }

    fn set(&self, state: LinkState) {
        *self.state.write().unwrap_or_else(PoisonError::into_inner) = state;
    }
}

/// Where the proxy's lifecycle records go.
fn lifecycle(decision: AuditDecision, outcome: Outcome, reason: String) -> AuditEntry {
    let digest = Sha256Digest::of(reason.as_bytes());
    proxy_record("proxy/upstream", decision, outcome, digest, reason)
}

/// Watches the upstream: when it ends (exit, crash, a protocol breach, a hang), records why in
/// the audit log, then restarts it with backoff, or, once the restarts in a row are used up,
/// returns the error the proxy exits with.
pub async fn supervise(
    link: Arc<Link>,
    drift: Arc<Drift>,
    audit: Arc<dyn AuditSink>,
) -> anyhow::Error {
    let mut in_a_row: u32 = 0;
    let mut connection = match link.connection() {
        Ok(connection) => connection,
        Err(error) => return anyhow::anyhow!("{}", error.message),
    };
    loop {
        let _ = connection.end.wait().await;
        if connection.started.elapsed() >= RESTART_WINDOW {
            in_a_row = 0;
        }
        let mut why = connection.stop().await;
        loop {
            let restart = in_a_row < link.options.restarts;
            let delay = link
                .options
                .backoff
                .saturating_mul(1 << in_a_row.min(16))
                .min(MAX_BACKOFF);
            let told = if restart {
                format!(
                    "the upstream is not running ({why}); the proxy restarts it in {delay:?} (restart {} of {} in a row): retry the request then; a call in flight when it ended is indeterminate",
                    in_a_row + 1,
                    link.options.restarts
                )
            } else {
                format!(
                    "the upstream is not running ({why}) and the proxy has no restart left ({} in a row); the proxy exits",
                    link.options.restarts
                )
            };
            link.set(LinkState::Down(told.clone()));
            tracing::error!("{told}");
            let entry = lifecycle(
                AuditDecision::Deny,
                Outcome::Error,
                format!("upstream_ended: {told}"),
            );
            let audit_sink = Arc::clone(&audit);
            if let Ok(Err(error)) = toolgate::run_blocking(move || audit_sink.append(&entry)).await
            {
                tracing::error!(%error, "cannot audit the upstream's end");
            }
            if !restart {
                return anyhow::anyhow!("{told}");
            }
            in_a_row += 1;
            tokio::time::sleep(delay).await;
            match restart_upstream(&link, &drift).await {
                Ok(started) => {
                    // Serving before the record is written: whoever reads the record can call.
                    link.set(LinkState::Up(Arc::clone(&started)));
                    let (name, version) = server_of(started.peer());
                    let entry = lifecycle(
                        AuditDecision::Allow,
                        Outcome::Observed,
                        format!(
                            "upstream_restarted: {name} {version} started again (restart {in_a_row} in a row); its tools were compared with the pin"
                        ),
                    );
                    let audit_sink = Arc::clone(&audit);
                    if let Ok(Err(error)) =
                        toolgate::run_blocking(move || audit_sink.append(&entry)).await
                    {
                        tracing::error!(%error, "cannot audit the upstream's restart");
                    }
                    connection = started;
                    break;
                }
                Err(error) => why = format!("its restart failed: {error:#}"),
            }
        }
    }
}

/// Starts the upstream again and compares its tools with the pin before it serves.
async fn restart_upstream(link: &Link, drift: &Drift) -> anyhow::Result<Arc<Connection>> {
    let connection = connect(&link.options, &link.host).await?;
    let listed = connection
        .peer()
        .list_all_tools()
        .await
        .map_err(|e| upstream_error(e, &connection.end))
        .context("the upstream did not list its tools")?;
    let (name, version) = server_of(connection.peer());
    drift
        .observe_and_record((&name, &version), &listed)
        .await
        .map_err(|e| anyhow::anyhow!("{}", e.message))?;
    Ok(Arc::new(connection))
}

/// Sends the host's cancellation of a forwarded request upstream.
async fn cancel_upstream(peer: &Peer<RoleClient>, id: RequestId) {
    let _ = peer
        .notify_cancelled(CancelledNotificationParam::new(
            Some(id),
            Some("cancelled by the host".to_owned()),
        ))
        .await;
}

impl Upstream {
    /// The gate's inner handler for the upstream `link`, serving the tools `drift` approves
    /// (it has observed the first list already).
    pub fn new(link: Arc<Link>, drift: Arc<Drift>) -> Self {
        // The upstream's capabilities, name and instructions; the protocol version is the one
        // negotiated with the host.
        let info = match link.connection().ok().and_then(|c| c.peer().peer_info()) {
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
            link,
            info,
            drift,
            validators: toolgate::SchemaCache::default(),
        }
    }

    /// Sends `request` upstream and waits for its answer within the timeout; the host's
    /// cancellation is passed on. A `tools/call` carries the host's progress token, translated.
    async fn forward(
        &self,
        request: ClientRequest,
        context: &RequestContext<RoleServer>,
    ) -> Result<(ServerResult, Arc<Connection>), Forwarded> {
        self.link.host.remember(&context.peer);
        let connection = self.link.connection().map_err(Forwarded::NotSent)?;
        let options = PeerRequestOptions::with_timeout(self.link.options.timeout);
        let handle = connection
            .peer()
            .send_request_with_option(request, options)
            .await
            .map_err(|e| Forwarded::NotSent(upstream_error(e, &connection.end)))?;
        let id = handle.id.clone();
        let progress = context.meta.get_progress_token().map(|host_token| {
            ProgressRoute::open(&self.link.host, handle.progress_token.clone(), host_token)
        });
        let answer = tokio::select! {
            answer = handle.await_response() => answer,
            () = context.ct.cancelled() => {
                cancel_upstream(connection.peer(), id).await;
                return Err(Forwarded::Lost(McpError::internal_error(
                    "the call was cancelled by the host; the upstream was told to stop",
                    None,
                )));
            }
        };
        drop(progress);
        match answer {
            Ok(result) => Ok((result, connection)),
            Err(ServiceError::McpError(error)) => Err(Forwarded::Refused(error)),
            // The transport refused to send it: nothing reached the upstream.
            Err(error @ ServiceError::TransportSend(_)) => {
                Err(Forwarded::NotSent(upstream_error(error, &connection.end)))
            }
            Err(error) => {
                if matches!(error, ServiceError::Timeout { .. }) {
                    self.check_alive(&connection);
                }
                Err(Forwarded::Lost(upstream_error(error, &connection.end)))
            }
        }
    }

    /// Checks a tool result of the upstream before the gate presents it: bounded in size, and
    /// matching the pinned `outputSchema` (an error to the host otherwise, recorded as
    /// `proxy/result`); then its text is wrapped as untrusted unless the policy trusts the tool.
    async fn vet(&self, tool: &str, result: &mut CallToolResult) -> Result<(), McpError> {
        if let Some(problem) = self.problem(tool, result) {
            let reason = format!("upstream_result_invalid: `{tool}`: {problem}");
            tracing::warn!("{reason}");
            self.link
                .host
                .record(proxy_record(
                    "proxy/result",
                    AuditDecision::Deny,
                    Outcome::Refused,
                    Sha256Digest::of(reason.as_bytes()),
                    reason,
                ))
                .await;
            return Err(McpError::internal_error(
                format!(
                    "the upstream's result of `{tool}` was not forwarded: {problem}; the call ran upstream, so inspect its effect before retrying"
                ),
                None,
            ));
        }
        if !self.link.host.trusts_output(tool) {
            wrap_untrusted(result);
        }
        Ok(())
    }

    /// Why `result` may not reach the host, if it may not.
    fn problem(&self, tool: &str, result: &CallToolResult) -> Option<String> {
        let limit = self.link.options.max_result_bytes;
        let bytes = serde_json::to_vec(result).map_or(usize::MAX, |json| json.len());
        if bytes > limit {
            return Some(format!(
                "it is {bytes} bytes of JSON, over the limit of {limit} (--upstream-max-result-bytes)"
            ));
        }
        // An error result is the tool's refusal; its structured content, if any, is not the
        // result the schema describes.
        if result.is_error == Some(true) {
            return None;
        }
        let schema = self.get_tool(tool)?.output_schema?;
        let Some(structured) = &result.structured_content else {
            return Some(
                "its pinned outputSchema requires structuredContent, and the result has none"
                    .to_owned(),
            );
        };
        let validator = match self.validators.validator(tool, &schema) {
            Ok(validator) => validator,
            Err(error) => {
                return Some(format!(
                    "its pinned outputSchema cannot be compiled ({error}), so no result can be checked"
                ));
            }
        };
        validator.iter_errors(structured).next().map(|error| {
            // The schema's path and keyword, never the value (it may be anything, and huge).
            let at: String = error.instance_path().as_str().chars().take(200).collect();
            format!(
                "its structuredContent breaks the pinned outputSchema (keyword `{}` at schema path {}, instance path {at:?})",
                error.kind().keyword(),
                error.schema_path().as_str()
            )
        })
    }

    /// After a request timed out: pings the upstream, and ends the connection (so that it is
    /// restarted) when the ping is not answered within the timeout either.
    fn check_alive(&self, connection: &Arc<Connection>) {
        let connection = Arc::clone(connection);
        let timeout = self.link.options.timeout;
        tokio::spawn(async move {
            let ping = connection.peer().send_request_with_option(
                ClientRequest::PingRequest(Default::default()),
                PeerRequestOptions::with_timeout(timeout),
            );
            let answered = match ping.await {
                Ok(handle) => handle.await_response().await.is_ok(),
                Err(_) => false,
            };
            if !answered {
                connection.end.end(format!(
                    "the upstream stopped answering: a request and then a ping got no answer within {timeout:?}"
                ));
            }
        });
    }
}

/// What happened to a forwarded request that has no answer for the host.
#[derive(Debug)]
enum Forwarded {
    /// Nothing reached the upstream.
    NotSent(McpError),
    /// The upstream answered with a JSON-RPC error (nothing was done, as far as it says).
    Refused(McpError),
    /// Sent, and then no answer: the upstream may or may not have acted on it.
    Lost(McpError),
}

impl Forwarded {
    fn into_error(self) -> McpError {
        match self {
            Forwarded::NotSent(error) | Forwarded::Refused(error) | Forwarded::Lost(error) => error,
        }
    }
}

/// A progress token of the host, while the upstream reports progress of the request it was
/// given for: the upstream's token (rmcp's own, per request) is translated back.
struct ProgressRoute<'a> {
    host: &'a Host,
    upstream: ProgressToken,
}

impl<'a> ProgressRoute<'a> {
    fn open(host: &'a Host, upstream: ProgressToken, host_token: ProgressToken) -> Self {
        host.progress
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .insert(upstream.clone(), host_token);
        ProgressRoute { host, upstream }
    }
}

impl Drop for ProgressRoute<'_> {
    fn drop(&mut self) {
        self.host
            .progress
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .remove(&self.upstream);
    }
}

/// Wraps every text block of an upstream's result as untrusted third-party text (the shape of the
/// policy's `untrusted_output`, uncut: the result's size is bounded already); structured content
/// keeps its pinned shape (name its text fields in `untrusted_output` to wrap them too).
fn wrap_untrusted(result: &mut CallToolResult) {
    for block in &mut result.content {
        if let ContentBlock::Text(text) = block {
            let wrapped = toolgate::policy::untrusted_wrapper(&text.text, usize::MAX);
            text.text = wrapped.to_string();
        }
    }
}

/// Marks a forwarded result `complete` when the upstream left the discriminator out: a
/// 2025-11-25 upstream never sends it (absent means complete), and a 2026-07-28 host requires it
/// (rmcp removes it again for a host of the older protocol).
fn complete(result_type: &mut Option<ResultType>) {
    result_type.get_or_insert(ResultType::COMPLETE);
}

/// The answer of a forwarded request, or the error to give the host.
macro_rules! expect_result {
    ($answer:expr, $variant:ident) => {
        match $answer {
            Ok((ServerResult::$variant(mut result), _)) => {
                complete(&mut result.result_type);
                Ok(result)
            }
            Ok(_) => Err(McpError::internal_error(
                concat!(
                    "the upstream answered with another kind of result than a ",
                    stringify!($variant)
                ),
                None,
            )),
            Err(forwarded) => Err(forwarded.into_error()),
        }
    };
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
        self.link.host.remember(&context.peer);
        let connection = self.link.connection()?;
        let listed = tokio::time::timeout(
            self.link.options.timeout,
            connection.peer().list_all_tools(),
        )
        .await
        .map_err(|_| {
            upstream_error(
                ServiceError::Timeout {
                    timeout: self.link.options.timeout,
                },
                &connection.end,
            )
        })?
        .map_err(|e| upstream_error(e, &connection.end))?;
        let (name, version) = server_of(connection.peer());
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
        let tool = request.name.to_string();
        let call = ClientRequest::CallToolRequest(CallToolRequest::new(request));
        match self.forward(call, &context).await {
            Ok((ServerResult::CallToolResult(mut result), _)) => {
                complete(&mut result.result_type);
                self.vet(&tool, &mut result).await?;
                Ok(CallToolResponse::Complete(result))
            }
            Ok((ServerResult::InputRequiredResult(result), _)) => {
                Ok(CallToolResponse::InputRequired(result))
            }
            Ok((ServerResult::CreateTaskResult(result), _)) => Ok(CallToolResponse::Task(result)),
            Ok(_) => Err(McpError::internal_error(
                "the upstream answered tools/call with another kind of result",
                None,
            )),
            Err(Forwarded::Lost(error)) => {
                // The call may have run upstream: an exactly-once key is left for an operator.
                if let Some(permit) = context.extensions.get::<toolgate::Permit>() {
                    let _ = permit.record_outcome(Outcome::Indeterminate);
                }
                Err(McpError::internal_error(
                    format!(
                        "{}; the call may or may not have taken effect upstream, so it is indeterminate: inspect the target before retrying (an idempotency key of an unsafe tool stays indeterminate until an operator resolves it)",
                        error.message
                    ),
                    error.data,
                ))
            }
            Err(other) => Err(other.into_error()),
        }
    }

    async fn list_resources(
        &self,
        request: Option<PaginatedRequestParams>,
        context: RequestContext<RoleServer>,
    ) -> Result<ListResourcesResult, McpError> {
        let request = ClientRequest::ListResourcesRequest(ListResourcesRequest {
            method: Default::default(),
            params: request,
            extensions: Default::default(),
        });
        expect_result!(self.forward(request, &context).await, ListResourcesResult)
    }

    async fn list_resource_templates(
        &self,
        request: Option<PaginatedRequestParams>,
        context: RequestContext<RoleServer>,
    ) -> Result<ListResourceTemplatesResult, McpError> {
        let request = ClientRequest::ListResourceTemplatesRequest(ListResourceTemplatesRequest {
            method: Default::default(),
            params: request,
            extensions: Default::default(),
        });
        expect_result!(
            self.forward(request, &context).await,
            ListResourceTemplatesResult
        )
    }

    async fn read_resource(
        &self,
        request: ReadResourceRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<ReadResourceResponse, McpError> {
        let request = ClientRequest::ReadResourceRequest(ReadResourceRequest::new(request));
        match self.forward(request, &context).await {
            Ok((ServerResult::ReadResourceResult(mut result), _)) => {
                complete(&mut result.result_type);
                Ok(ReadResourceResponse::Complete(result))
            }
            Ok((ServerResult::InputRequiredResult(result), _)) => {
                Ok(ReadResourceResponse::InputRequired(result))
            }
            Ok(_) => Err(McpError::internal_error(
                "the upstream answered resources/read with another kind of result",
                None,
            )),
            Err(forwarded) => Err(forwarded.into_error()),
        }
    }

    async fn list_prompts(
        &self,
        request: Option<PaginatedRequestParams>,
        context: RequestContext<RoleServer>,
    ) -> Result<ListPromptsResult, McpError> {
        let request = ClientRequest::ListPromptsRequest(ListPromptsRequest {
            method: Default::default(),
            params: request,
            extensions: Default::default(),
        });
        expect_result!(self.forward(request, &context).await, ListPromptsResult)
    }

    async fn get_prompt(
        &self,
        request: GetPromptRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<GetPromptResponse, McpError> {
        let request = ClientRequest::GetPromptRequest(GetPromptRequest::new(request));
        match self.forward(request, &context).await {
            Ok((ServerResult::GetPromptResult(mut result), _)) => {
                complete(&mut result.result_type);
                Ok(GetPromptResponse::Complete(result))
            }
            Ok((ServerResult::InputRequiredResult(result), _)) => {
                Ok(GetPromptResponse::InputRequired(result))
            }
            Ok(_) => Err(McpError::internal_error(
                "the upstream answered prompts/get with another kind of result",
                None,
            )),
            Err(forwarded) => Err(forwarded.into_error()),
        }
    }

    async fn complete(
        &self,
        request: CompleteRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<CompleteResult, McpError> {
        let request = ClientRequest::CompleteRequest(CompleteRequest::new(request));
        expect_result!(self.forward(request, &context).await, CompleteResult)
    }

    async fn set_level(
        &self,
        request: SetLevelRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<(), McpError> {
        let request = ClientRequest::SetLevelRequest(SetLevelRequest::new(request));
        match self.forward(request, &context).await {
            Ok(_) => Ok(()),
            Err(forwarded) => Err(forwarded.into_error()),
        }
    }
}
