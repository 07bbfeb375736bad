//! `Gated<H>` must forward every `ServerHandler` method it does not gate: rmcp gives every method a
//! default body, so a forward the gate forgot would silently answer with the default instead of the
//! inner handler. A probe handler implements all 32 methods, each recording its name and answering
//! with a value no default produces; each method is then reached through the gate, over a real
//! in-process connection where rmcp 3.11 can route it, and called directly otherwise.
//!
//! Reachability in rmcp 3.11 decides which session exercises what:
//! - the `initialize` session (2025-11-25) carries `initialize`, `ping`, `resources/subscribe` and
//!   `resources/unsubscribe`, which rmcp refuses with -32601 in an inline (2026-07-28) session;
//! - the discover session (2026-07-28) carries `server/discover` and `subscriptions/listen`, which
//!   rmcp refuses in a legacy session;
//! - `get_info`, `supported_protocol_versions`, `negotiate_initialize`,
//!   `accepted_subscription_filter` and `get_tool` are synchronous and are also called by rmcp or
//!   by the gate itself, so their records prove nothing: they are checked by calling them directly
//!   on the `Gated` value and comparing with the probe's distinctive answers.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::borrow::Cow;
use std::collections::BTreeSet;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use rmcp::model::{
    ArgumentInfo, CallToolRequestParams, CallToolResponse, CallToolResult, CancelTaskParams,
    CancelledNotificationParam, ClientCapabilities, ClientConfig, ClientNotification,
    ClientRequest, CompleteRequestParams, CompleteResult, CompletionInfo, ContentBlock,
    CustomNotification, CustomRequest, CustomResult, DetailedTask, DiscoverResult,
    GetPromptRequestParams, GetPromptResponse, GetPromptResult, GetSkillRequestParams,
    GetSkillResult, GetTaskParams, GetTaskResult, Implementation, InitializeRequestParams,
    InitializeResult, ListPromptsResult, ListResourceTemplatesResult, ListResourcesResult,
    ListSkillsResult, ListToolsResult, NumberOrString, PaginatedRequestParams, PingRequest,
    ProgressNotificationParam, ProgressToken, Prompt, ProtocolVersion,
    ReadResourceDirectoryRequestParams, ReadResourceDirectoryResult, ReadResourceRequestParams,
    ReadResourceResponse, ReadResourceResult, Reference, RequestId, Resource, ResourceContents,
    ResourceTemplate, ServerCapabilities, ServerConfig, ServerNotification, ServerResult, Skill,
    SkillFrontmatter, SkillResources, SubscribeRequestParams, SubscriptionFilter, Task,
    TaskPayload, TaskStatus, Tool, UnsubscribeRequestParams, UpdateTaskParams,
};
#[allow(deprecated)] // Logging (SEP-2577) is deprecated but still part of ServerHandler.
use rmcp::model::{LoggingLevel, SetLevelRequestParams};
use rmcp::service::{
    NotificationContext, RequestContext, ServiceError, SubscriptionContext, SubscriptionEnd,
};
use rmcp::{
    ClientLifecycleMode, ClientServiceExt as _, ErrorData, RoleServer, ServerHandler,
    ServiceExt as _,
};
use serde_json::json;
use toolgate_audit::FileAuditLog;
use toolgate_policy::Policy;
use toolgate_rmcp::Gated;

/// Every `ServerHandler` method of rmcp 3.11, in the order of rmcp's own forwarding impl.
const ALL_METHODS: [&str; 32] = [
    "ping",
    "initialize",
    "negotiate_initialize",
    "supported_protocol_versions",
    "discover",
    "complete",
    "set_level",
    "get_prompt",
    "list_prompts",
    "list_resources",
    "list_resource_templates",
    "read_resource",
    "accepted_subscription_filter",
    "listen",
    "subscribe",
    "unsubscribe",
    "call_tool",
    "list_tools",
    "get_tool",
    "on_custom_request",
    "on_cancelled",
    "on_progress",
    "on_initialized",
    "on_roots_list_changed",
    "on_custom_notification",
    "get_info",
    "get_task",
    "update_task",
    "cancel_task",
    "list_skills",
    "get_skill",
    "read_resource_directory",
];

const PROBE_TOOL: &str = "probe_tool";
/// Known to the probe but not allowed by the policy: the gate must hide it.
const HIDDEN_TOOL: &str = "hidden_tool";
const SKILL_URI: &str = "skill://probe/SKILL.md";
const PROBE_URI: &str = "probe://resource";
const TIMEOUT: Duration = Duration::from_secs(10);

/// The names of the probe methods that ran, in order.
#[derive(Clone, Default)]
struct Calls(Arc<Mutex<Vec<&'static str>>>);

impl Calls {
    fn hit(&self, name: &'static str) {
        self.0.lock().unwrap().push(name);
    }

    fn len(&self) -> usize {
        self.0.lock().unwrap().len()
    }

    fn all(&self) -> BTreeSet<&'static str> {
        self.0.lock().unwrap().iter().copied().collect()
    }

    fn since(&self, mark: usize) -> Vec<&'static str> {
        self.0.lock().unwrap()[mark..].to_vec()
    }

    /// Asserts that `name` ran after `mark` (a value of `len()` taken before the call).
    fn assert_ran(&self, mark: usize, name: &'static str) {
        let since = self.since(mark);
        assert!(
            since.contains(&name),
            "the probe's `{name}` did not run; the gate answered with rmcp's default (ran: {since:?})"
        );
    }

    /// Waits for a notification handler: notifications have no reply to wait for.
    async fn wait_for(&self, mark: usize, name: &'static str) {
        let waited = tokio::time::timeout(TIMEOUT, async {
            while !self.since(mark).contains(&name) {
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
        })
        .await;
        assert!(
            waited.is_ok(),
            "the probe's `{name}` never ran: the gate does not forward it (ran: {:?})",
            self.since(mark)
        );
    }
}

/// Implements all 32 methods; each records its name and returns something no default returns.
struct Probe {
    calls: Calls,
}

fn probe_versions() -> Vec<ProtocolVersion> {
    vec![ProtocolVersion::V_2025_11_25, ProtocolVersion::V_2026_07_28]
}

fn probe_config() -> ServerConfig {
    #[allow(deprecated)] // Logging is SEP-2577-deprecated; the probe still declares it.
    let capabilities = ServerCapabilities::builder()
        .enable_logging()
        .enable_completions()
        .enable_prompts()
        .enable_resources()
        .enable_tools()
        .enable_tool_list_changed()
        .enable_tasks()
        .enable_skills_with_directory_read()
        .build();
    ServerConfig::new(capabilities)
        .with_server_info(Implementation::new("probe-server", "9.9.9"))
        .with_instructions("probe-get-info")
}

fn probe_tool(name: &'static str) -> Tool {
    Tool::new(
        name,
        "probe tool",
        json!({"type": "object"}).as_object().unwrap().clone(),
    )
}

fn probe_skill() -> Skill {
    Skill::new(
        SKILL_URI,
        SkillFrontmatter::new("probe", "a probe skill"),
        SkillResources::Dynamic,
    )
}

fn probe_error(what: &str) -> ErrorData {
    ErrorData::internal_error(format!("probe-{what}"), None)
}

#[allow(deprecated)] // set_level, subscribe and unsubscribe are deprecated but still forwarded.
impl ServerHandler for Probe {
    async fn ping(&self, _context: RequestContext<RoleServer>) -> Result<(), ErrorData> {
        self.calls.hit("ping");
        // The default answers Ok(()); only an error can be told apart from it.
        Err(probe_error("ping"))
    }

    async fn initialize(
        &self,
        request: InitializeRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<InitializeResult, ErrorData> {
        self.calls.hit("initialize");
        context.peer.set_peer_info(request.clone());
        Ok(probe_config()
            .with_protocol_version(request.protocol_version)
            .with_instructions("probe-initialize"))
    }

    fn negotiate_initialize(
        &self,
        request: &InitializeRequestParams,
    ) -> Result<InitializeResult, ErrorData> {
        self.calls.hit("negotiate_initialize");
        Ok(probe_config()
            .with_protocol_version(request.protocol_version.clone())
            .with_instructions("probe-negotiate"))
    }

    fn supported_protocol_versions(&self) -> Cow<'static, [ProtocolVersion]> {
        self.calls.hit("supported_protocol_versions");
        Cow::Owned(probe_versions())
    }

    async fn discover(
        &self,
        _context: RequestContext<RoleServer>,
    ) -> Result<DiscoverResult, ErrorData> {
        self.calls.hit("discover");
        let mut result = DiscoverResult::new(probe_versions(), probe_config().capabilities)
            .with_server_info(Implementation::new("probe-server", "9.9.9"));
        result.instructions = Some("probe-discover".to_owned());
        Ok(result)
    }

    async fn complete(
        &self,
        _request: CompleteRequestParams,
        _context: RequestContext<RoleServer>,
    ) -> Result<CompleteResult, ErrorData> {
        self.calls.hit("complete");
        Ok(CompleteResult::new(
            CompletionInfo::new(vec!["probe-complete".to_owned()]).unwrap(),
        ))
    }

    async fn set_level(
        &self,
        _request: SetLevelRequestParams,
        _context: RequestContext<RoleServer>,
    ) -> Result<(), ErrorData> {
        self.calls.hit("set_level");
        Ok(()) // The default answers -32601.
    }

    async fn get_prompt(
        &self,
        _request: GetPromptRequestParams,
        _context: RequestContext<RoleServer>,
    ) -> Result<GetPromptResponse, ErrorData> {
        self.calls.hit("get_prompt");
        Ok(GetPromptResult::new(vec![])
            .with_description("probe-get-prompt")
            .into())
    }

    async fn list_prompts(
        &self,
        _request: Option<PaginatedRequestParams>,
        _context: RequestContext<RoleServer>,
    ) -> Result<ListPromptsResult, ErrorData> {
        self.calls.hit("list_prompts");
        Ok(ListPromptsResult::with_all_items(vec![Prompt::new(
            "probe",
            None::<String>,
            None,
        )]))
    }

    async fn list_resources(
        &self,
        _request: Option<PaginatedRequestParams>,
        _context: RequestContext<RoleServer>,
    ) -> Result<ListResourcesResult, ErrorData> {
        self.calls.hit("list_resources");
        Ok(ListResourcesResult::with_all_items(vec![Resource::new(
            PROBE_URI, "probe",
        )]))
    }

    async fn list_resource_templates(
        &self,
        _request: Option<PaginatedRequestParams>,
        _context: RequestContext<RoleServer>,
    ) -> Result<ListResourceTemplatesResult, ErrorData> {
        self.calls.hit("list_resource_templates");
        Ok(ListResourceTemplatesResult::with_all_items(vec![
            ResourceTemplate::new("probe://{id}", "probe"),
        ]))
    }

    async fn read_resource(
        &self,
        request: ReadResourceRequestParams,
        _context: RequestContext<RoleServer>,
    ) -> Result<ReadResourceResponse, ErrorData> {
        self.calls.hit("read_resource");
        Ok(ReadResourceResult::new(vec![ResourceContents::text(
            "probe-read-resource",
            request.uri,
        )])
        .into())
    }

    fn accepted_subscription_filter(
        &self,
        requested: &SubscriptionFilter,
    ) -> Option<SubscriptionFilter> {
        self.calls.hit("accepted_subscription_filter");
        Some(requested.clone()) // The default answers None (listen unimplemented).
    }

    async fn listen(&self, context: SubscriptionContext) -> Result<(), ErrorData> {
        self.calls.hit("listen");
        // The default sends nothing and waits for cancellation; the probe sends one notification
        // and ends the subscription gracefully.
        context
            .sink()
            .notify_tool_list_changed()
            .await
            .map_err(|e| ErrorData::internal_error(e.to_string(), None))?;
        Ok(())
    }

    async fn subscribe(
        &self,
        _request: SubscribeRequestParams,
        _context: RequestContext<RoleServer>,
    ) -> Result<(), ErrorData> {
        self.calls.hit("subscribe");
        Ok(()) // The default answers -32601.
    }

    async fn unsubscribe(
        &self,
        _request: UnsubscribeRequestParams,
        _context: RequestContext<RoleServer>,
    ) -> Result<(), ErrorData> {
        self.calls.hit("unsubscribe");
        Ok(()) // The default answers -32601.
    }

    async fn call_tool(
        &self,
        request: CallToolRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, ErrorData> {
        self.calls.hit("call_tool");
        // Asked for a task (`_meta` `probe/task`): the one the task methods below are forwarded
        // for (the gate answers them only for a task its caller created through it).
        if context.meta.0.0.get("probe/task") == Some(&json!(true)) {
            return Ok(CallToolResponse::Task(rmcp::model::CreateTaskResult::new(
                Task::new(
                    "probe-task-1",
                    TaskStatus::Working,
                    "2026-01-01T00:00:00Z",
                    "2026-01-01T00:00:00Z",
                ),
            )));
        }
        Ok(CallToolResult::success(vec![ContentBlock::text(format!(
            "probe-call-tool:{}",
            request.name
        ))])
        .into())
    }

    async fn list_tools(
        &self,
        _request: Option<PaginatedRequestParams>,
        _context: RequestContext<RoleServer>,
    ) -> Result<ListToolsResult, ErrorData> {
        self.calls.hit("list_tools");
        Ok(ListToolsResult::with_all_items(vec![
            probe_tool(PROBE_TOOL),
            probe_tool(HIDDEN_TOOL),
        ]))
    }

    fn get_tool(&self, name: &str) -> Option<Tool> {
        self.calls.hit("get_tool");
        [PROBE_TOOL, HIDDEN_TOOL]
            .into_iter()
            .find(|known| *known == name)
            .map(probe_tool)
    }

    async fn on_custom_request(
        &self,
        request: CustomRequest,
        _context: RequestContext<RoleServer>,
    ) -> Result<CustomResult, ErrorData> {
        self.calls.hit("on_custom_request");
        Ok(CustomResult::new(
            json!({"probe": "custom-request", "method": request.method}),
        ))
    }

    async fn on_cancelled(
        &self,
        _notification: CancelledNotificationParam,
        _context: NotificationContext<RoleServer>,
    ) {
        self.calls.hit("on_cancelled");
    }

    async fn on_progress(
        &self,
        _notification: ProgressNotificationParam,
        _context: NotificationContext<RoleServer>,
    ) {
        self.calls.hit("on_progress");
    }

    async fn on_initialized(&self, _context: NotificationContext<RoleServer>) {
        self.calls.hit("on_initialized");
    }

    async fn on_roots_list_changed(&self, _context: NotificationContext<RoleServer>) {
        self.calls.hit("on_roots_list_changed");
    }

    async fn on_custom_notification(
        &self,
        _notification: CustomNotification,
        _context: NotificationContext<RoleServer>,
    ) {
        self.calls.hit("on_custom_notification");
    }

    fn get_info(&self) -> ServerConfig {
        self.calls.hit("get_info");
        probe_config()
    }

    async fn get_task(
        &self,
        request: GetTaskParams,
        _context: RequestContext<RoleServer>,
    ) -> Result<GetTaskResult, ErrorData> {
        self.calls.hit("get_task");
        let task = Task::new(
            request.task_id,
            TaskStatus::Working,
            "2026-01-01T00:00:00Z",
            "2026-01-01T00:00:00Z",
        )
        .with_status_message("probe-get-task");
        Ok(GetTaskResult::new(DetailedTask::new(
            task,
            TaskPayload::Working,
        )))
    }

    async fn update_task(
        &self,
        _request: UpdateTaskParams,
        _context: RequestContext<RoleServer>,
    ) -> Result<(), ErrorData> {
        self.calls.hit("update_task");
        Ok(()) // The default answers -32601.
    }

    async fn cancel_task(
        &self,
        _request: CancelTaskParams,
        _context: RequestContext<RoleServer>,
    ) -> Result<(), ErrorData> {
        self.calls.hit("cancel_task");
        Ok(()) // The default answers -32601.
    }

    async fn list_skills(
        &self,
        _request: Option<PaginatedRequestParams>,
        _context: RequestContext<RoleServer>,
    ) -> Result<ListSkillsResult, ErrorData> {
        self.calls.hit("list_skills");
        Ok(ListSkillsResult::with_all_items(vec![probe_skill()]))
    }

    async fn get_skill(
        &self,
        _request: GetSkillRequestParams,
        _context: RequestContext<RoleServer>,
    ) -> Result<GetSkillResult, ErrorData> {
        self.calls.hit("get_skill");
        Ok(GetSkillResult::new(probe_skill()))
    }

    async fn read_resource_directory(
        &self,
        _request: ReadResourceDirectoryRequestParams,
        _context: RequestContext<RoleServer>,
    ) -> Result<ReadResourceDirectoryResult, ErrorData> {
        self.calls.hit("read_resource_directory");
        Ok(ListResourcesResult::with_all_items(vec![Resource::new(
            "probe://directory/child",
            "probe-directory-child",
        )]))
    }
}

/// The probe behind a gate whose policy allows only the probe's one visible tool.
fn gated(calls: &Calls, ledger: &tempfile::TempDir) -> Gated<Probe> {
    let policy = Policy::from_json(&format!(r#"{{"version": 1, "allow": ["{PROBE_TOOL}"]}}"#))
        .expect("the test policy is valid");
    let audit = FileAuditLog::open(ledger.path().join("audit.jsonl")).expect("audit log opens");
    Gated::builder(Probe {
        calls: calls.clone(),
    })
    .policy(policy)
    .audit(Arc::new(audit))
    .build()
    .expect("policy and audit are set")
}

/// Serves `gate` until the client goes away. In a discover session `serve` itself only returns
/// after the first request that is not `server/discover`, so the server cannot be awaited before
/// the client has started.
async fn serve_until_closed(gate: Gated<Probe>, transport: tokio::io::DuplexStream) {
    let running = gate.serve(transport).await.expect("the session starts");
    let _ = running.waiting().await;
}

async fn finish(server: tokio::task::JoinHandle<()>) {
    tokio::time::timeout(TIMEOUT, server)
        .await
        .expect("the server stops when the client leaves")
        .expect("the server task did not panic");
}

fn text_of(result: &CallToolResult) -> &str {
    match result.content.first() {
        Some(ContentBlock::Text(text)) => &text.text,
        other => panic!("expected a text block, got {other:?}"),
    }
}

fn expect_probe_error(result: Result<ServerResult, ServiceError>, what: &str) {
    match result {
        Err(ServiceError::McpError(error)) => assert_eq!(error.message, format!("probe-{what}")),
        other => panic!("expected the probe's `{what}` error, got {other:?}"),
    }
}

fn check_synchronous_methods(calls: &Calls, ledger: &tempfile::TempDir) {
    let gate = gated(calls, ledger);

    let mark = calls.len();
    let info = gate.get_info();
    assert_eq!(info.server_info.name, "probe-server");
    assert_eq!(info.instructions.as_deref(), Some("probe-get-info"));
    calls.assert_ran(mark, "get_info");

    let mark = calls.len();
    assert_eq!(
        gate.supported_protocol_versions().as_ref(),
        probe_versions()
    );
    assert_ne!(
        gate.supported_protocol_versions().as_ref(),
        ProtocolVersion::KNOWN_VERSIONS,
        "the probe's list must differ from rmcp's default for this check to mean anything"
    );
    calls.assert_ran(mark, "supported_protocol_versions");

    let mark = calls.len();
    let request = InitializeRequestParams::new(
        ClientCapabilities::default(),
        Implementation::new("client", "1"),
    )
    .with_protocol_version(ProtocolVersion::V_2025_11_25);
    let negotiated = gate.negotiate_initialize(&request).unwrap();
    assert_eq!(negotiated.instructions.as_deref(), Some("probe-negotiate"));
    calls.assert_ran(mark, "negotiate_initialize");

    let mark = calls.len();
    let requested = SubscriptionFilter::builder().tools_list_changed().build();
    assert_eq!(
        gate.accepted_subscription_filter(&requested),
        Some(requested.clone())
    );
    calls.assert_ran(mark, "accepted_subscription_filter");

    // get_tool is gated: forwarded for a visible tool, filtered for a hidden one.
    let mark = calls.len();
    let tool = gate
        .get_tool(PROBE_TOOL)
        .expect("the probe's tool is visible");
    assert_eq!(tool.description.as_deref(), Some("probe tool"));
    calls.assert_ran(mark, "get_tool");
    assert!(gate.get_tool(HIDDEN_TOOL).is_none());
    assert!(gate.get_tool("no_such_tool").is_none());
}

/// The 2025-11-25 session: `initialize` and every request and notification it can carry.
#[allow(deprecated)] // set_level, subscribe and unsubscribe are deprecated but still forwarded.
async fn check_initialize_session(calls: &Calls, ledger: &tempfile::TempDir) {
    let (server_half, client_half) = tokio::io::duplex(64 * 1024);
    let gate = gated(calls, ledger);
    let server = tokio::spawn(serve_until_closed(gate, server_half));

    // Tasks need the client to declare the tasks extension (SEP-2663); otherwise this is the plain
    // `initialize` flow of `().serve(..)`.
    let client_config = ClientConfig::new(
        ClientCapabilities::builder().enable_tasks().build(),
        Implementation::new("forwarding-test", "1.0.0"),
    );
    let mark = calls.len();
    let client = client_config.serve(client_half).await.unwrap();
    calls.assert_ran(mark, "initialize");
    let peer_info = client.peer_info().expect("initialized");
    assert_eq!(peer_info.instructions.as_deref(), Some("probe-initialize"));
    calls.wait_for(mark, "on_initialized").await;

    let mark = calls.len();
    let reply = client
        .send_request(ClientRequest::PingRequest(PingRequest::default()))
        .await;
    expect_probe_error(reply, "ping");
    calls.assert_ran(mark, "ping");

    let mark = calls.len();
    let completion = client
        .complete(CompleteRequestParams::new(
            Reference::for_prompt("probe"),
            ArgumentInfo::new("arg", "val"),
        ))
        .await
        .unwrap();
    assert_eq!(completion.completion.values, ["probe-complete"]);
    calls.assert_ran(mark, "complete");

    let mark = calls.len();
    client
        .set_level(SetLevelRequestParams::new(LoggingLevel::Debug))
        .await
        .expect("the probe accepts set_level; the default answers -32601");
    calls.assert_ran(mark, "set_level");

    let mark = calls.len();
    let prompt = client
        .get_prompt(GetPromptRequestParams::new("probe"))
        .await
        .unwrap();
    assert_eq!(prompt.description.as_deref(), Some("probe-get-prompt"));
    calls.assert_ran(mark, "get_prompt");

    let mark = calls.len();
    let prompts = client.list_prompts(None).await.unwrap();
    let names: Vec<_> = prompts.prompts.iter().map(|p| p.name.as_str()).collect();
    assert_eq!(names, ["probe"]);
    calls.assert_ran(mark, "list_prompts");

    let mark = calls.len();
    let resources = client.list_resources(None).await.unwrap();
    let uris: Vec<_> = resources.resources.iter().map(|r| r.uri.as_str()).collect();
    assert_eq!(uris, [PROBE_URI]);
    calls.assert_ran(mark, "list_resources");

    let mark = calls.len();
    let templates = client.list_resource_templates(None).await.unwrap();
    let templates: Vec<_> = templates
        .resource_templates
        .iter()
        .map(|t| t.uri_template.as_str())
        .collect();
    assert_eq!(templates, ["probe://{id}"]);
    calls.assert_ran(mark, "list_resource_templates");

    let mark = calls.len();
    let read = client
        .read_resource(ReadResourceRequestParams::new(PROBE_URI))
        .await
        .unwrap();
    match read.contents.first() {
        Some(ResourceContents::TextResourceContents { text, .. }) => {
            assert_eq!(text, "probe-read-resource");
        }
        other => panic!("expected the probe's text, got {other:?}"),
    }
    calls.assert_ran(mark, "read_resource");

    let mark = calls.len();
    client
        .subscribe(SubscribeRequestParams::new(PROBE_URI))
        .await
        .expect("the probe accepts subscribe; the default answers -32601");
    calls.assert_ran(mark, "subscribe");

    let mark = calls.len();
    client
        .unsubscribe(UnsubscribeRequestParams::new(PROBE_URI))
        .await
        .expect("the probe accepts unsubscribe; the default answers -32601");
    calls.assert_ran(mark, "unsubscribe");

    let mark = calls.len();
    let custom = client
        .send_request(ClientRequest::CustomRequest(CustomRequest::new(
            "probe/custom",
            Some(json!({"x": 1})),
        )))
        .await
        .unwrap();
    match custom {
        ServerResult::CustomResult(result) => assert_eq!(
            result.0,
            json!({"probe": "custom-request", "method": "probe/custom"})
        ),
        other => panic!("expected the probe's custom result, got {other:?}"),
    }
    calls.assert_ran(mark, "on_custom_request");

    // A task the gate did not see created is unknown; the one a gated call created is forwarded.
    let mark = calls.len();
    let unseen = client.get_task(GetTaskParams::new("probe-task-1")).await;
    assert!(unseen.is_err(), "{unseen:?}");
    assert!(
        !calls.since(mark).contains(&"get_task"),
        "{:?}",
        calls.since(mark)
    );
    let mut params = CallToolRequestParams::new(PROBE_TOOL);
    let mut meta = rmcp::model::RequestMetaObject::default();
    meta.0.0.insert("probe/task".to_owned(), json!(true));
    params.meta = Some(meta);
    let created = client.call_tool_once(params).await.unwrap();
    assert!(matches!(created, CallToolResponse::Task(_)), "{created:?}");

    let mark = calls.len();
    let task = client
        .get_task(GetTaskParams::new("probe-task-1"))
        .await
        .unwrap();
    assert_eq!(task.task.task.task_id, "probe-task-1");
    assert_eq!(
        task.task.task.status_message.as_deref(),
        Some("probe-get-task")
    );
    calls.assert_ran(mark, "get_task");

    let mark = calls.len();
    client
        .update_task(UpdateTaskParams::new("probe-task-1", Default::default()))
        .await
        .expect("the probe accepts update_task; the default answers -32601");
    calls.assert_ran(mark, "update_task");

    let mark = calls.len();
    client
        .cancel_task(CancelTaskParams::new("probe-task-1"))
        .await
        .expect("the probe accepts cancel_task; the default answers -32601");
    calls.assert_ran(mark, "cancel_task");

    let mark = calls.len();
    let skills = client.list_skills(None).await.unwrap();
    let skill_uris: Vec<_> = skills.skills.iter().map(|s| s.uri.as_str()).collect();
    assert_eq!(skill_uris, [SKILL_URI]);
    calls.assert_ran(mark, "list_skills");

    let mark = calls.len();
    let skill = client
        .get_skill(GetSkillRequestParams::new(SKILL_URI))
        .await
        .unwrap();
    assert_eq!(skill.skill.uri, SKILL_URI);
    calls.assert_ran(mark, "get_skill");

    let mark = calls.len();
    let children = client
        .read_resource_directory(ReadResourceDirectoryRequestParams::new("probe://directory"))
        .await
        .unwrap();
    let children: Vec<_> = children.resources.iter().map(|r| r.name.as_str()).collect();
    assert_eq!(children, ["probe-directory-child"]);
    calls.assert_ran(mark, "read_resource_directory");

    // The gated methods reach the probe too.
    let mark = calls.len();
    let tools = client.list_tools(None).await.unwrap();
    let tool_names: Vec<_> = tools.tools.iter().map(|t| t.name.as_ref()).collect();
    assert_eq!(tool_names, [PROBE_TOOL], "the hidden tool is filtered out");
    calls.assert_ran(mark, "list_tools");

    let mark = calls.len();
    let result = client
        .call_tool(CallToolRequestParams::new(PROBE_TOOL))
        .await
        .unwrap();
    assert_eq!(text_of(&result), format!("probe-call-tool:{PROBE_TOOL}"));
    calls.assert_ran(mark, "call_tool");

    // Notifications: no reply, so wait for the probe to record them.
    let mark = calls.len();
    client
        .notify_cancelled(CancelledNotificationParam::new(
            Some(RequestId::Number(424_242)),
            Some("probe".to_owned()),
        ))
        .await
        .unwrap();
    calls.wait_for(mark, "on_cancelled").await;

    let mark = calls.len();
    client
        .notify_progress(ProgressNotificationParam::new(
            ProgressToken(NumberOrString::String("probe".into())),
            0.5,
        ))
        .await
        .unwrap();
    calls.wait_for(mark, "on_progress").await;

    // Already received once during the handshake; sent again explicitly.
    let mark = calls.len();
    client.notify_initialized().await.unwrap();
    calls.wait_for(mark, "on_initialized").await;

    let mark = calls.len();
    client.notify_roots_list_changed().await.unwrap();
    calls.wait_for(mark, "on_roots_list_changed").await;

    let mark = calls.len();
    client
        .send_notification(ClientNotification::CustomNotification(
            CustomNotification::new("notifications/probe", Some(json!({"x": 1}))),
        ))
        .await
        .unwrap();
    calls.wait_for(mark, "on_custom_notification").await;

    client.cancel().await.unwrap();
    finish(server).await;
}

/// The 2026-07-28 session: `server/discover` and `subscriptions/listen`.
async fn check_discover_session(calls: &Calls, ledger: &tempfile::TempDir) {
    let (server_half, client_half) = tokio::io::duplex(64 * 1024);
    let gate = gated(calls, ledger);
    let server = tokio::spawn(serve_until_closed(gate, server_half));

    let mark = calls.len();
    let client = ()
        .serve_with_lifecycle(
            client_half,
            ClientLifecycleMode::Discover {
                preferred_versions: vec![ProtocolVersion::V_2026_07_28],
            },
        )
        .await
        .unwrap();
    calls.assert_ran(mark, "discover");
    let peer_info = client.peer_info().expect("discovered");
    assert_eq!(peer_info.instructions.as_deref(), Some("probe-discover"));
    assert_eq!(peer_info.protocol_version, ProtocolVersion::V_2026_07_28);

    let mark = calls.len();
    let mut subscription = tokio::time::timeout(
        TIMEOUT,
        client.listen(SubscriptionFilter::builder().tools_list_changed().build()),
    )
    .await
    .expect("listen is acknowledged")
    .expect("the probe accepts the filter; the default refuses listen with -32601");
    calls.assert_ran(mark, "accepted_subscription_filter");
    let first = tokio::time::timeout(TIMEOUT, subscription.next())
        .await
        .expect("the probe's listen sends one notification; the default sends none")
        .unwrap();
    assert!(
        matches!(
            first,
            Some(ServerNotification::ToolListChangedNotification(_))
        ),
        "got {first:?}"
    );
    let end = tokio::time::timeout(TIMEOUT, subscription.next())
        .await
        .expect("the probe's listen ends gracefully; the default waits for cancellation")
        .unwrap();
    assert!(end.is_none());
    assert!(matches!(
        subscription.end(),
        Some(SubscriptionEnd::Graceful(_))
    ));
    calls.assert_ran(mark, "listen");

    // The gate works the same on the 2026-07-28 path, where rmcp requires per-request `_meta`.
    let mark = calls.len();
    let result = client
        .call_tool(CallToolRequestParams::new(PROBE_TOOL))
        .await
        .unwrap();
    assert_eq!(text_of(&result), format!("probe-call-tool:{PROBE_TOOL}"));
    calls.assert_ran(mark, "call_tool");

    client.cancel().await.unwrap();
    finish(server).await;
}

/// The whole check on one recorder: each method is reached through the gate (directly for the
/// synchronous ones) and answers with the probe's value, and together they cover all 32 methods,
/// so a method left out of this test is noticed as well as one left out of the gate.
#[tokio::test]
async fn gate_forwards_every_server_handler_method() {
    let calls = Calls::default();
    let ledger = tempfile::tempdir().unwrap();

    // A forward that fell back to a default which never answers must fail the test, not hang it.
    let session = Duration::from_secs(120);
    check_synchronous_methods(&calls, &ledger);
    tokio::time::timeout(session, check_initialize_session(&calls, &ledger))
        .await
        .expect("the initialize session finishes");
    tokio::time::timeout(session, check_discover_session(&calls, &ledger))
        .await
        .expect("the discover session finishes");

    let reached = calls.all();
    let missing: Vec<_> = ALL_METHODS
        .iter()
        .filter(|name| !reached.contains(*name))
        .collect();
    assert!(missing.is_empty(), "never reached the probe: {missing:?}");
    assert_eq!(
        reached.len(),
        ALL_METHODS.len(),
        "the probe recorded a name that is not in ALL_METHODS: {reached:?}"
    );
}
