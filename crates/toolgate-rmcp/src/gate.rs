//! `Gated<H>`: a `ServerHandler` that decides every tools/list and tools/call before the inner
//! handler sees it, and forwards every other method unchanged.
//!
//! rmcp has no middleware layer, and every `ServerHandler` method has a default body, so a method
//! this wrapper forgot to forward would silently replace the inner handler's behaviour with the
//! default. All 32 methods are therefore written out below, in the order of rmcp's own forwarding
//! impl for `Box<T>`, and the forwarding test calls each one through a real client.

use std::borrow::Cow;
use std::future::Future;
use std::sync::Arc;

#[allow(deprecated)] // Logging (SEP-2577) is deprecated but still part of ServerHandler.
use rmcp::model::SetLevelRequestParams;
use rmcp::model::{
    CallToolRequestParams, CallToolResponse, CallToolResult, CancelTaskParams,
    CancelledNotificationParam, CompleteRequestParams, CompleteResult, ContentBlock,
    CustomNotification, CustomRequest, CustomResult, DiscoverResult, GetPromptRequestParams,
    GetPromptResponse, GetSkillRequestParams, GetSkillResult, GetTaskParams, GetTaskResult,
    InitializeRequestParams, InitializeResult, ListPromptsResult, ListResourceTemplatesResult,
    ListResourcesResult, ListSkillsResult, ListToolsResult, PaginatedRequestParams,
    ProgressNotificationParam, ProtocolVersion, ReadResourceDirectoryRequestParams,
    ReadResourceDirectoryResult, ReadResourceRequestParams, ReadResourceResponse, ServerConfig,
    SubscribeRequestParams, SubscriptionFilter, Tool, UnsubscribeRequestParams, UpdateTaskParams,
};
use rmcp::service::{MaybeSendFuture, NotificationContext, RequestContext, SubscriptionContext};
use rmcp::{ErrorData as McpError, RoleServer, ServerHandler};
use serde_json::{Map, Value};
use toolgate_audit::{AuditEntry, AuditSink, Decision as AuditDecision};
use toolgate_canon::Sha256Digest;
use toolgate_commit::CommitStore;
use toolgate_policy::{Decision, Policy, ToolName};

use crate::permit::Permit;

/// The message of the JSON-RPC error (-32602) for a tool that is denied or does not exist. The two
/// cases are deliberately identical so a caller cannot probe which hidden tools exist.
pub const TOOL_NOT_FOUND: &str = "tool not found";

/// Request ids longer than this are recorded as their digest, so a caller cannot bloat the log.
const MAX_RECORDED_REQUEST_ID: usize = 256;

/// Why a gate could not be built.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum GateError {
    /// `GatedBuilder::policy` was not called.
    #[error(
        "a gate needs a policy: call GatedBuilder::policy with a loaded toolgate_policy::Policy"
    )]
    MissingPolicy,
    /// `GatedBuilder::audit` was not called.
    #[error(
        "a gate needs an audit sink: call GatedBuilder::audit (for example with toolgate_audit::FileAuditLog)"
    )]
    MissingAudit,
}

/// A `ServerHandler` whose tools are decided by a [`Policy`], audited, and reachable only with a
/// [`Permit`].
///
/// The inner handler must implement `get_tool` (the `#[tool_handler]` macro does): the gate uses
/// it to tell unknown tools from known ones, and treats a tool `get_tool` does not know as unknown,
/// so a handler without it fails closed.
pub struct Gated<H> {
    inner: H,
    policy: Arc<Policy>,
    audit: Arc<dyn AuditSink>,
    store: Option<Arc<dyn CommitStore>>,
    request_id_field: String,
}

impl<H> std::fmt::Debug for Gated<H> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Gated")
            .field("policy_digest", &self.policy.digest())
            .field("audit", &self.audit)
            .field("store", &self.store)
            .finish_non_exhaustive()
    }
}

/// Builds a [`Gated`] handler.
#[must_use]
pub struct GatedBuilder<H> {
    inner: H,
    policy: Option<Arc<Policy>>,
    audit: Option<Arc<dyn AuditSink>>,
    store: Option<Arc<dyn CommitStore>>,
    request_id_field: String,
}

impl<H> std::fmt::Debug for GatedBuilder<H> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GatedBuilder").finish_non_exhaustive()
    }
}

impl<H: ServerHandler> GatedBuilder<H> {
    /// The policy that decides every call. Required.
    pub fn policy(mut self, policy: impl Into<Arc<Policy>>) -> Self {
        self.policy = Some(policy.into());
        self
    }

    /// Where decisions are recorded. Required.
    pub fn audit(mut self, audit: Arc<dyn AuditSink>) -> Self {
        self.audit = Some(audit);
        self
    }

    /// The store behind [`Permit::commit`] and [`Permit::observe`]. Optional: without it those
    /// calls fail with `PermitError::NoStore`.
    pub fn commit_store(mut self, store: Arc<dyn CommitStore>) -> Self {
        self.store = Some(store);
        self
    }

    /// The string argument recorded as the audit line's `request_id` (default `request_id`).
    /// Calls without it are recorded as `rpc:<JSON-RPC id>`.
    pub fn request_id_field(mut self, field: impl Into<String>) -> Self {
        self.request_id_field = field.into();
        self
    }

    /// Builds the gate.
    pub fn build(self) -> Result<Gated<H>, GateError> {
        Ok(Gated {
            inner: self.inner,
            policy: self.policy.ok_or(GateError::MissingPolicy)?,
            audit: self.audit.ok_or(GateError::MissingAudit)?,
            store: self.store,
            request_id_field: self.request_id_field,
        })
    }
}

impl<H: ServerHandler> Gated<H> {
    /// Starts building a gate around `inner`.
    pub fn builder(inner: H) -> GatedBuilder<H> {
        GatedBuilder {
            inner,
            policy: None,
            audit: None,
            store: None,
            request_id_field: "request_id".to_owned(),
        }
    }

    /// The wrapped handler.
    pub fn inner(&self) -> &H {
        &self.inner
    }

    /// The policy in force.
    pub fn policy(&self) -> &Policy {
        &self.policy
    }

    fn request_id(
        &self,
        arguments: Option<&Map<String, Value>>,
        rpc_id: &impl std::fmt::Display,
    ) -> String {
        match arguments.and_then(|a| a.get(&self.request_id_field)) {
            Some(Value::String(id)) if id.len() <= MAX_RECORDED_REQUEST_ID => id.clone(),
            Some(Value::String(id)) => format!("sha256:{}", Sha256Digest::of(id.as_bytes())),
            _ => format!("rpc:{rpc_id}"),
        }
    }

    /// Appends one record on the blocking pool (the file sink fsyncs).
    async fn record(&self, entry: AuditEntry) -> Result<(), String> {
        let audit = Arc::clone(&self.audit);
        match tokio::task::spawn_blocking(move || audit.append(&entry)).await {
            Ok(Ok(_)) => Ok(()),
            Ok(Err(error)) => Err(error.to_string()),
            Err(_) => Err("the audit task was cancelled".to_owned()),
        }
    }

    async fn gated_call_tool(
        &self,
        request: CallToolRequestParams,
        mut context: RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, McpError> {
        let name = request.name.to_string();
        // The recorded name is the caller's input: a name no tool could have (too long, odd
        // characters) is recorded as its digest so a caller cannot bloat or forge log content.
        let recorded_name = match ToolName::new(&name) {
            Ok(_) => name.clone(),
            Err(_) => format!("sha256:{}", Sha256Digest::of(name.as_bytes())),
        };
        let arguments = request.arguments.as_ref();
        let args_digest =
            Sha256Digest::of_json(&Value::Object(arguments.cloned().unwrap_or_default()));
        let request_id = self.request_id(arguments, &context.id);
        let deny = |reason: String| {
            AuditEntry::tool_call(
                request_id.clone(),
                recorded_name.clone(),
                AuditDecision::Deny,
                "not_executed",
                args_digest,
            )
            .with_reason(reason)
        };

        let decision = self.policy.decide(&name, arguments);
        // A tool the inner handler does not have is recorded as unknown whatever the policy says;
        // the caller sees the same error either way.
        let hidden_reason = match &decision {
            _ if self.inner.get_tool(&name).is_none() => Some("unknown_tool".to_owned()),
            Decision::DenyTool(denial) => Some(denial.rule().to_owned()),
            _ => None,
        };
        if let Some(reason) = hidden_reason {
            if let Err(error) = self.record(deny(reason)).await {
                // The call is refused either way; losing the record is reported, not hidden.
                tracing::error!(tool = %recorded_name, %error, "could not audit a denied call");
            }
            tracing::info!(tool = %recorded_name, decision = "deny", "tools/call refused before dispatch");
            return Err(McpError::invalid_params(TOOL_NOT_FOUND, None));
        }
        if let Decision::DenyArgs(violation) = &decision {
            if let Err(error) = self.record(deny(violation.rule())).await {
                tracing::error!(tool = %recorded_name, %error, "could not audit a refused call");
            }
            return Ok(CallToolResult::error(vec![ContentBlock::text(violation.message())]).into());
        }

        let permit = Permit::issue(&name, &request_id, self.store.clone());
        context.extensions.insert(permit.clone());
        let response = self.inner.call_tool(request, context).await;
        let recorded = permit.close();
        let outcome = match &response {
            Ok(CallToolResponse::Complete(result)) if result.is_error == Some(true) => {
                recorded.unwrap_or("failed")
            }
            Ok(_) => recorded.unwrap_or("executed"),
            Err(_) => "error",
        };
        let entry = AuditEntry::tool_call(
            request_id,
            name.clone(),
            AuditDecision::Allow,
            outcome,
            args_digest,
        )
        .with_reason(decision.rule());
        if let Err(error) = self.record(entry).await {
            tracing::error!(tool = %name, %error, "could not audit an allowed call");
            return Err(McpError::internal_error(
                "the call ran but its audit record could not be written; any effect is durable, so retry with the same idempotency key to replay it once the audit log is writable",
                None,
            ));
        }
        tracing::info!(tool = %name, decision = "allow", outcome, "tools/call");
        response
    }
}

impl<H: ServerHandler> ServerHandler for Gated<H> {
    fn ping(
        &self,
        context: RequestContext<RoleServer>,
    ) -> impl Future<Output = Result<(), McpError>> + MaybeSendFuture + '_ {
        self.inner.ping(context)
    }

    fn initialize(
        &self,
        request: InitializeRequestParams,
        context: RequestContext<RoleServer>,
    ) -> impl Future<Output = Result<InitializeResult, McpError>> + MaybeSendFuture + '_ {
        self.inner.initialize(request, context)
    }

    fn negotiate_initialize(
        &self,
        request: &InitializeRequestParams,
    ) -> Result<InitializeResult, McpError> {
        self.inner.negotiate_initialize(request)
    }

    fn supported_protocol_versions(&self) -> Cow<'static, [ProtocolVersion]> {
        self.inner.supported_protocol_versions()
    }

    fn discover(
        &self,
        context: RequestContext<RoleServer>,
    ) -> impl Future<Output = Result<DiscoverResult, McpError>> + MaybeSendFuture + '_ {
        self.inner.discover(context)
    }

    fn complete(
        &self,
        request: CompleteRequestParams,
        context: RequestContext<RoleServer>,
    ) -> impl Future<Output = Result<CompleteResult, McpError>> + MaybeSendFuture + '_ {
        self.inner.complete(request, context)
    }

    #[allow(deprecated)] // Forwarded as long as rmcp has it, deprecated or not.
    fn set_level(
        &self,
        request: SetLevelRequestParams,
        context: RequestContext<RoleServer>,
    ) -> impl Future<Output = Result<(), McpError>> + MaybeSendFuture + '_ {
        self.inner.set_level(request, context)
    }

    fn get_prompt(
        &self,
        request: GetPromptRequestParams,
        context: RequestContext<RoleServer>,
    ) -> impl Future<Output = Result<GetPromptResponse, McpError>> + MaybeSendFuture + '_ {
        self.inner.get_prompt(request, context)
    }

    fn list_prompts(
        &self,
        request: Option<PaginatedRequestParams>,
        context: RequestContext<RoleServer>,
    ) -> impl Future<Output = Result<ListPromptsResult, McpError>> + MaybeSendFuture + '_ {
        self.inner.list_prompts(request, context)
    }

    fn list_resources(
        &self,
        request: Option<PaginatedRequestParams>,
        context: RequestContext<RoleServer>,
    ) -> impl Future<Output = Result<ListResourcesResult, McpError>> + MaybeSendFuture + '_ {
        self.inner.list_resources(request, context)
    }

    fn list_resource_templates(
        &self,
        request: Option<PaginatedRequestParams>,
        context: RequestContext<RoleServer>,
    ) -> impl Future<Output = Result<ListResourceTemplatesResult, McpError>> + MaybeSendFuture + '_
    {
        self.inner.list_resource_templates(request, context)
    }

    fn read_resource(
        &self,
        request: ReadResourceRequestParams,
        context: RequestContext<RoleServer>,
    ) -> impl Future<Output = Result<ReadResourceResponse, McpError>> + MaybeSendFuture + '_ {
        self.inner.read_resource(request, context)
    }

    fn accepted_subscription_filter(
        &self,
        requested: &SubscriptionFilter,
    ) -> Option<SubscriptionFilter> {
        self.inner.accepted_subscription_filter(requested)
    }

    fn listen(
        &self,
        context: SubscriptionContext,
    ) -> impl Future<Output = Result<(), McpError>> + MaybeSendFuture + '_ {
        self.inner.listen(context)
    }

    #[allow(deprecated)]
    fn subscribe(
        &self,
        request: SubscribeRequestParams,
        context: RequestContext<RoleServer>,
    ) -> impl Future<Output = Result<(), McpError>> + MaybeSendFuture + '_ {
        self.inner.subscribe(request, context)
    }

    #[allow(deprecated)]
    fn unsubscribe(
        &self,
        request: UnsubscribeRequestParams,
        context: RequestContext<RoleServer>,
    ) -> impl Future<Output = Result<(), McpError>> + MaybeSendFuture + '_ {
        self.inner.unsubscribe(request, context)
    }

    fn call_tool(
        &self,
        request: CallToolRequestParams,
        context: RequestContext<RoleServer>,
    ) -> impl Future<Output = Result<CallToolResponse, McpError>> + MaybeSendFuture + '_ {
        self.gated_call_tool(request, context)
    }

    async fn list_tools(
        &self,
        request: Option<PaginatedRequestParams>,
        context: RequestContext<RoleServer>,
    ) -> Result<ListToolsResult, McpError> {
        let mut result = self.inner.list_tools(request, context).await?;
        result.tools.retain(|tool| self.policy.visible(&tool.name));
        Ok(result)
    }

    fn get_tool(&self, name: &str) -> Option<Tool> {
        self.inner
            .get_tool(name)
            .filter(|_| self.policy.visible(name))
    }

    fn on_custom_request(
        &self,
        request: CustomRequest,
        context: RequestContext<RoleServer>,
    ) -> impl Future<Output = Result<CustomResult, McpError>> + MaybeSendFuture + '_ {
        self.inner.on_custom_request(request, context)
    }

    fn on_cancelled(
        &self,
        notification: CancelledNotificationParam,
        context: NotificationContext<RoleServer>,
    ) -> impl Future<Output = ()> + MaybeSendFuture + '_ {
        self.inner.on_cancelled(notification, context)
    }

    fn on_progress(
        &self,
        notification: ProgressNotificationParam,
        context: NotificationContext<RoleServer>,
    ) -> impl Future<Output = ()> + MaybeSendFuture + '_ {
        self.inner.on_progress(notification, context)
    }

    fn on_initialized(
        &self,
        context: NotificationContext<RoleServer>,
    ) -> impl Future<Output = ()> + MaybeSendFuture + '_ {
        self.inner.on_initialized(context)
    }

    fn on_roots_list_changed(
        &self,
        context: NotificationContext<RoleServer>,
    ) -> impl Future<Output = ()> + MaybeSendFuture + '_ {
        self.inner.on_roots_list_changed(context)
    }

    fn on_custom_notification(
        &self,
        notification: CustomNotification,
        context: NotificationContext<RoleServer>,
    ) -> impl Future<Output = ()> + MaybeSendFuture + '_ {
        self.inner.on_custom_notification(notification, context)
    }

    fn get_info(&self) -> ServerConfig {
        self.inner.get_info()
    }

    fn get_task(
        &self,
        request: GetTaskParams,
        context: RequestContext<RoleServer>,
    ) -> impl Future<Output = Result<GetTaskResult, McpError>> + MaybeSendFuture + '_ {
        self.inner.get_task(request, context)
    }

    fn update_task(
        &self,
        request: UpdateTaskParams,
        context: RequestContext<RoleServer>,
    ) -> impl Future<Output = Result<(), McpError>> + MaybeSendFuture + '_ {
        self.inner.update_task(request, context)
    }

    fn cancel_task(
        &self,
        request: CancelTaskParams,
        context: RequestContext<RoleServer>,
    ) -> impl Future<Output = Result<(), McpError>> + MaybeSendFuture + '_ {
        self.inner.cancel_task(request, context)
    }

    fn list_skills(
        &self,
        request: Option<PaginatedRequestParams>,
        context: RequestContext<RoleServer>,
    ) -> impl Future<Output = Result<ListSkillsResult, McpError>> + MaybeSendFuture + '_ {
        self.inner.list_skills(request, context)
    }

    fn get_skill(
        &self,
        request: GetSkillRequestParams,
        context: RequestContext<RoleServer>,
    ) -> impl Future<Output = Result<GetSkillResult, McpError>> + MaybeSendFuture + '_ {
        self.inner.get_skill(request, context)
    }

    fn read_resource_directory(
        &self,
        request: ReadResourceDirectoryRequestParams,
        context: RequestContext<RoleServer>,
    ) -> impl Future<Output = Result<ReadResourceDirectoryResult, McpError>> + MaybeSendFuture + '_
    {
        self.inner.read_resource_directory(request, context)
    }
}
