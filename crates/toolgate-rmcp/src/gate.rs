//! `Gated<H>`: a `ServerHandler` that decides every tools/list and tools/call before the inner
//! handler sees it, and forwards every other method unchanged.
//!
//! rmcp has no middleware layer, and every `ServerHandler` method has a default body, so a method
//! this wrapper forgot to forward would silently replace the inner handler's behaviour with the
//! default. All 32 methods are therefore written out below, in the order of rmcp's own forwarding
//! impl for `Box<T>`, and the forwarding test calls each one through a real client.

use std::borrow::Cow;
use std::collections::BTreeMap;
use std::future::Future;
use std::sync::Arc;

#[allow(deprecated)] // Logging (SEP-2577) is deprecated but still part of ServerHandler.
use rmcp::model::SetLevelRequestParams;
use rmcp::model::{
    CallToolRequestParams, CallToolResponse, CallToolResult, CancelTaskParams,
    CancelledNotificationParam, CompleteRequestParams, CompleteResult, ContentBlock,
    CustomNotification, CustomRequest, CustomResult, DiscoverResult, ErrorCode,
    GetPromptRequestParams, GetPromptResponse, GetSkillRequestParams, GetSkillResult,
    GetTaskParams, GetTaskResult, InitializeRequestParams, InitializeResult, ListPromptsResult,
    ListResourceTemplatesResult, ListResourcesResult, ListSkillsResult, ListToolsResult,
    PaginatedRequestParams, ProgressNotificationParam, ProtocolVersion,
    ReadResourceDirectoryRequestParams, ReadResourceDirectoryResult, ReadResourceRequestParams,
    ReadResourceResponse, ServerConfig, SubscribeRequestParams, SubscriptionFilter, Tool,
    UnsubscribeRequestParams, UpdateTaskParams,
};
use rmcp::service::{MaybeSendFuture, NotificationContext, RequestContext, SubscriptionContext};
use rmcp::{ErrorData as McpError, RoleServer, ServerHandler};
use serde_json::{Map, Value};
use toolgate_audit::{AuditEntry, AuditSink, Decision as AuditDecision};
use toolgate_canon::Sha256Digest;
use toolgate_commit::CommitStore;
use toolgate_commit::effect::{Begin, EffectError, EffectRequest, EffectStore, Resolution, Scope};
use toolgate_contract::awareness::{InputContract, contract_awareness};
use toolgate_contract::diff::Change;
use toolgate_policy::{Decision, Policy, ToolName};

use crate::exactly_once;
use crate::input::InputShape;
use crate::permit::Permit;
use crate::refusal::Refusal;
use crate::schema::SchemaCache;
use crate::state::{GateState, PolicyHandle};

/// The message of the JSON-RPC error (-32602) for a tool that is denied or does not exist. The two
/// cases are deliberately identical so a caller cannot probe which hidden tools exist.
pub const TOOL_NOT_FOUND: &str = "tool not found";

/// At most this many changes are shown in a refusal's contract note.
const MAX_CONTRACT_CHANGES: usize = 5;

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
    /// The policy opts a tool into exactly-once execution but no effect store was configured.
    #[error(
        "the policy gives `{tool}` idempotency settings but the gate has no effect store; call GatedBuilder::effect_store"
    )]
    MissingEffectStore {
        /// A tool with idempotency settings.
        tool: String,
    },
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
    state: PolicyHandle,
    audit: Arc<dyn AuditSink>,
    store: Option<Arc<dyn CommitStore>>,
    request_id_field: String,
    contract_changes: BTreeMap<String, Vec<Change>>,
    effects: Option<Arc<EffectStore>>,
    principal: String,
    probes: BTreeMap<String, EffectProbe>,
    schemas: SchemaCache,
}

/// What a probe found out about an effect whose caller died mid-call.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub enum ProbeAnswer {
    /// The effect happened; this is the result to store and replay.
    Happened(CallToolResult),
    /// The effect did not happen: the call may execute.
    NotHappened,
    /// The probe cannot tell: the call stays indeterminate.
    Unknown,
}

/// Tells whether the effect of a call with these arguments happened, by observing the target (a
/// read, never a write). Runs on the blocking pool.
pub type EffectProbe = Arc<dyn Fn(Option<&rmcp::model::JsonObject>) -> ProbeAnswer + Send + Sync>;

/// The `_meta` key under which the gate publishes the server's contract digest in the results of
/// `initialize` and `server/discover`, so a host can pin it.
pub const CONTRACT_DIGEST_META_KEY: &str = "io.toolgate/contractDigest";

fn add_contract_meta(meta: &mut Option<rmcp::model::MetaObject>, digest: Option<Sha256Digest>) {
    if let Some(digest) = digest {
        meta.get_or_insert_with(rmcp::model::MetaObject::new)
            .0
            .insert(
                CONTRACT_DIGEST_META_KEY.to_owned(),
                Value::String(format!("sha256:{digest}")),
            );
    }
}

impl<H> std::fmt::Debug for Gated<H> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Gated")
            .field("policy_digest", &self.state.snapshot().policy.digest())
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
    effects: Option<Arc<EffectStore>>,
    principal: String,
    probes: BTreeMap<String, EffectProbe>,
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

    /// The store that makes the tools the policy opts in (`idempotency`) execute exactly once per
    /// key; without it those settings are refused at build time.
    pub fn effect_store(mut self, effects: Arc<EffectStore>) -> Self {
        self.effects = Some(effects);
        self
    }

    /// Who is calling (from configuration or the transport, never from tool arguments); keys are
    /// scoped to it. Default `local`.
    pub fn principal(mut self, principal: impl Into<String>) -> Self {
        self.principal = principal.into();
        self
    }

    /// Registers a probe for `tool`: when a call of it with `effect: unsafe` finds an execution
    /// whose caller died mid-effect, the probe decides instead of leaving it indeterminate.
    pub fn effect_probe(mut self, tool: impl Into<String>, probe: EffectProbe) -> Self {
        self.probes.insert(tool.into(), probe);
        self
    }

    /// Builds the gate.
    pub fn build(self) -> Result<Gated<H>, GateError> {
        let policy = self.policy.ok_or(GateError::MissingPolicy)?;
        if self.effects.is_none()
            && let Some(tool) = policy
                .allowed()
                .find(|tool| policy.idempotency(tool).is_some())
        {
            return Err(GateError::MissingEffectStore {
                tool: tool.to_owned(),
            });
        }
        let audit = self.audit.ok_or(GateError::MissingAudit)?;
        let state = GateState {
            policy,
            contract_digest: None,
            tool_contract_digests: BTreeMap::new(),
        };
        Ok(Gated {
            inner: self.inner,
            state: PolicyHandle::new(state, Arc::clone(&audit), self.effects.is_some()),
            audit,
            store: self.store,
            request_id_field: self.request_id_field,
            contract_changes: BTreeMap::new(),
            effects: self.effects,
            principal: self.principal,
            probes: self.probes,
            schemas: SchemaCache::default(),
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
            effects: None,
            principal: "local".to_owned(),
            probes: BTreeMap::new(),
        }
    }

    /// The wrapped handler.
    pub fn inner(&self) -> &H {
        &self.inner
    }

    /// The policy in force now (a reload through [`Gated::policy_handle`] replaces it).
    pub fn policy(&self) -> Arc<Policy> {
        self.state.policy()
    }

    /// A handle that reads or replaces the policy while the gate serves (for SIGHUP reloads).
    pub fn policy_handle(&self) -> PolicyHandle {
        self.state.clone()
    }

    /// Publishes `digest` (the server's contract digest, see toolgate-contract) in the `_meta` of
    /// the `initialize` and `server/discover` results under [`CONTRACT_DIGEST_META_KEY`].
    pub fn with_contract_digest(self, digest: Sha256Digest) -> Self {
        self.state
            .update(|state| state.contract_digest = Some(digest));
        self
    }

    /// Remembers how each tool's contract changed since a previous lockfile (from
    /// `toolgate_contract::diff::diff`), so that a refused call can tell a model working from the
    /// old contract what changed (at most five BREAKING or RISKY changes of that tool).
    pub fn with_contract_changes(mut self, changes: Vec<Change>) -> Self {
        self.contract_changes.clear();
        for change in changes {
            self.contract_changes
                .entry(change.tool.clone())
                .or_default()
                .push(change);
        }
        self
    }

    /// The text appended to an argument refusal: the tool's current input contract and, when a
    /// previous lockfile was given, what changed since.
    fn contract_note(&self, tool: &str, input: &InputShape) -> String {
        let changes = self
            .contract_changes
            .get(tool)
            .map(Vec::as_slice)
            .unwrap_or_default();
        let current = InputContract {
            required: input.required.clone(),
            allowed: input.allowed.clone(),
        };
        contract_awareness(tool, &current, changes, MAX_CONTRACT_CHANGES)
    }

    /// Records, in every audit line of a tool, that tool's contract digest (from toolgate.lock or
    /// the live contract), so a verifier can show which contract produced each decision.
    pub fn with_tool_contract_digests(self, digests: BTreeMap<String, Sha256Digest>) -> Self {
        self.state
            .update(|state| state.tool_contract_digests = digests);
        self
    }

    /// An audit entry for a call of `name`, carrying the digests of the policy in force and of the
    /// tool's contract (when known).
    fn entry(
        &self,
        state: &GateState,
        request_id: String,
        name: &str,
        decision: AuditDecision,
        outcome: &str,
        args_digest: Sha256Digest,
    ) -> AuditEntry {
        let entry = AuditEntry::tool_call(request_id, name, decision, outcome, args_digest)
            .with_policy_digest(state.policy.digest());
        match state.tool_contract_digests.get(name) {
            Some(digest) => entry.with_contract_digest(*digest),
            None => entry,
        }
    }

    /// The contract digest published to clients, if any.
    pub fn contract_digest(&self) -> Option<Sha256Digest> {
        self.state.snapshot().contract_digest
    }

    /// Whether permits give access to a commit store.
    pub fn has_commit_store(&self) -> bool {
        self.store.is_some()
    }

    /// The audit line's `request_id`: the configured string argument when the resolved tool
    /// declares it in its input schema (so a refused or unknown call cannot write text of the
    /// caller's choosing into the log), else `rpc:<JSON-RPC id>`.
    fn request_id(
        &self,
        arguments: Option<&Map<String, Value>>,
        tool: &Tool,
        rpc_id: &impl std::fmt::Display,
    ) -> String {
        let declared = tool
            .input_schema
            .get("properties")
            .and_then(Value::as_object)
            .is_some_and(|properties| properties.contains_key(&self.request_id_field));
        match arguments.and_then(|a| a.get(&self.request_id_field)) {
            Some(Value::String(id)) if declared && id.len() <= MAX_RECORDED_REQUEST_ID => {
                id.clone()
            }
            Some(Value::String(id)) if declared => {
                format!("sha256:{}", Sha256Digest::of(id.as_bytes()))
            }
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
        let state = self.state.snapshot();
        let policy = Arc::clone(&state.policy);
        let arguments = request.arguments.as_ref();
        let args_digest =
            Sha256Digest::of_json(&Value::Object(arguments.cloned().unwrap_or_default()));
        let deny = |request_id: String, reason: String| {
            self.entry(
                &state,
                request_id,
                &recorded_name,
                AuditDecision::Deny,
                "not_executed",
                args_digest,
            )
            .with_reason(reason)
        };

        let decision = policy.decide(&name, arguments);
        let tool = self.inner.get_tool(&name);
        // A tool the inner handler does not have is recorded as unknown whatever the policy says;
        // the caller sees the same error either way.
        let hidden_reason = match (&tool, &decision) {
            (None, _) => Some("unknown_tool".to_owned()),
            (Some(_), Decision::DenyTool(denial)) => Some(denial.rule().to_owned()),
            _ => None,
        };
        let Some(tool) = tool.filter(|_| hidden_reason.is_none()) else {
            let reason = hidden_reason.unwrap_or_else(|| "unknown_tool".to_owned());
            let entry = deny(format!("rpc:{}", context.id), reason);
            if let Err(error) = self.record(entry).await {
                // The call is refused either way; losing the record is reported, not hidden.
                tracing::error!(tool = %recorded_name, %error, "could not audit a denied call");
            }
            tracing::info!(tool = %recorded_name, decision = "deny", "tools/call refused before dispatch");
            return Err(McpError::invalid_params(TOOL_NOT_FOUND, None));
        };

        // Argument refusals are tool results (isError), not protocol errors: the spec puts input
        // validation there, and the model can correct its call in the same turn.
        let request_id = self.request_id(arguments, &tool, &context.id);
        let input = InputShape::of_schema(&tool.input_schema);
        let refusal = input
            .problem(&name, arguments)
            .or_else(|| match &decision {
                Decision::DenyArgs(violation) => Some(policy_refusal(violation)),
                _ => None,
            })
            .or_else(|| {
                self.schemas
                    .check(&name, &tool.input_schema, arguments)
                    .err()
            });
        if let Some(refusal) = refusal {
            if let Err(error) = self
                .record(deny(request_id.clone(), refusal.rule.clone()))
                .await
            {
                tracing::error!(tool = %recorded_name, %error, "could not audit a refused call");
            }
            let note = self.contract_note(&name, &input);
            return Ok(refusal.into_result(&note).into());
        }

        // Exactly-once: a tool the policy opts in runs at most once per key; replays, conflicts
        // and calls still in progress are answered here without running the handler.
        let mut ticket = None;
        if let (Some(settings), Some(effects)) = (policy.idempotency(&name), &self.effects) {
            let request = EffectRequest {
                scope: Scope {
                    principal: self.principal.clone(),
                    tool: name.clone(),
                },
                key: exactly_once::key_for(settings, arguments, &context.meta, args_digest),
                fingerprint: exactly_once::fingerprint(args_digest, &tool.input_schema),
            };
            let kind = exactly_once::kind(settings);
            let store = Arc::clone(effects);
            let probe = self.probes.get(&name).cloned();
            let probe_args = arguments.cloned();
            let begun = tokio::task::spawn_blocking(move || {
                let first = store.begin(&request, kind);
                // An unsafe effect whose caller died: ask the tool's probe, if it has one, and
                // resolve the record from the answer before deciding again (once).
                let (Err(EffectError::Indeterminate { .. }), Some(probe)) = (&first, probe) else {
                    return first;
                };
                let resolution = match probe(probe_args.as_ref()) {
                    ProbeAnswer::Happened(result) => {
                        Resolution::Completed(exactly_once::stored(&result))
                    }
                    ProbeAnswer::NotHappened => Resolution::Forget,
                    ProbeAnswer::Unknown => return first,
                };
                store.resolve(&request.scope, &request.key, resolution)?;
                store.begin(&request, kind)
            })
            .await;
            let answer: Option<(&str, Result<CallToolResult, McpError>)> = match begun {
                Ok(Ok(Begin::Execute(t))) => {
                    ticket = Some(t);
                    None
                }
                Ok(Ok(Begin::Replay(stored))) => Some(
                    match exactly_once::replayed(stored, settings.replay_marker.as_ref()) {
                        Some(result) => ("replay", Ok(result)),
                        None => (
                            "error",
                            Err(McpError::internal_error(
                                "the stored result of this call cannot be read back; inspect the effect store",
                                None,
                            )),
                        ),
                    },
                ),
                Ok(Ok(Begin::ReplayFailure(text))) => Some((
                    "replay",
                    Ok(CallToolResult::error(vec![ContentBlock::text(text)])),
                )),
                Ok(Err(EffectError::Conflict { .. })) => Some((
                    "conflict",
                    Ok(error_text(
                        "Error: this idempotency key was already used with different arguments; nothing was executed. Retry with the original arguments, or use a new key for a new effect",
                    )),
                )),
                Ok(Err(EffectError::InProgress { retry_after, .. })) => Some((
                    "in_progress",
                    Ok(error_text(&format!(
                        "Error: a call with this idempotency key is still in progress; nothing was executed. Retry after {} s",
                        retry_after.as_secs().max(1)
                    ))),
                )),
                Ok(Err(EffectError::Indeterminate { .. })) => Some((
                    "indeterminate",
                    Ok(error_text(
                        "Error: an earlier call with this idempotency key stopped mid-effect, so the effect may or may not have happened; it is not re-run automatically. An operator must inspect the target and resolve the key",
                    )),
                )),
                Ok(Err(error)) => Some((
                    "error",
                    Err(McpError::internal_error(
                        format!("the effect store failed: {error}"),
                        None,
                    )),
                )),
                Err(_) => Some((
                    "error",
                    Err(McpError::internal_error(
                        "the effect store task was cancelled; retry the call",
                        None,
                    )),
                )),
            };
            if let Some((outcome, response)) = answer {
                let entry = self
                    .entry(
                        &state,
                        request_id.clone(),
                        &name,
                        AuditDecision::Allow,
                        outcome,
                        args_digest,
                    )
                    .with_reason(decision.rule());
                if let Err(error) = self.record(entry).await {
                    tracing::error!(tool = %name, %error, "could not audit an exactly-once answer");
                    return Err(McpError::internal_error(
                        "the call's audit record could not be written; retry once the audit log is writable",
                        None,
                    ));
                }
                return response.map(Into::into);
            }
        }

        let permit = Permit::issue(&name, &request_id, self.store.clone());
        context.extensions.insert(permit.clone());
        // If this future is dropped (the client cancelled) or the handler panics, the guard still
        // expires the permit and records the decision with what the handler reached.
        let mut guard = CallGuard {
            permit: permit.clone(),
            audit: Some(Arc::clone(&self.audit)),
            entry: self
                .entry(
                    &state,
                    request_id.clone(),
                    &name,
                    AuditDecision::Allow,
                    "cancelled",
                    args_digest,
                )
                .with_reason(decision.rule()),
        };
        let response = self.inner.call_tool(request, context).await;
        guard.audit = None;
        let recorded = permit.close();
        // rmcp answers arguments its `Parameters<T>` cannot deserialize with -32602 and serde's
        // message, which quotes the offending value. Turn that into a tool result without values,
        // with the tool's current contract, as for the gate's own argument refusals.
        let (response, invalid_arguments) = match response {
            Err(error) if error.code == ErrorCode::INVALID_PARAMS && recorded.is_none() => {
                let fix = "check each argument against the input schema and retry";
                let refusal = Refusal {
                    rule: "handler.invalid_arguments".to_owned(),
                    message: format!(
                        "Error: the arguments of `{name}` do not match what its handler accepts (an argument has the wrong type or an unexpected value); {fix}"
                    ),
                    details: serde_json::json!({
                        "error": "argument_rejected",
                        "tool": name,
                        "rule": "handler.invalid_arguments",
                        "fix": fix,
                    }),
                };
                let result = refusal.into_result(&self.contract_note(&name, &input));
                (Ok(result.into()), true)
            }
            other => (other, false),
        };
        let outcome = match &response {
            Ok(CallToolResponse::Complete(_)) if invalid_arguments => "invalid_arguments",
            Ok(CallToolResponse::Complete(result)) if result.is_error == Some(true) => {
                recorded.unwrap_or("failed")
            }
            Ok(CallToolResponse::Complete(_)) => recorded.unwrap_or("executed"),
            // The handler handed the call to a task or asked the client for input: the permit
            // ends here, so later work needs a new call through the gate.
            Ok(CallToolResponse::InputRequired(_)) => recorded.unwrap_or("input_required"),
            Ok(_) => recorded.unwrap_or("task_created"),
            Err(_) => recorded.unwrap_or("error"),
        };
        if let (Some(ticket), Some(effects)) = (ticket, &self.effects) {
            // Store the result (or the failure) before the allow record, so that a retry after
            // this point replays instead of running the effect again.
            let settle = match &response {
                Ok(CallToolResponse::Complete(result)) if result.is_error != Some(true) => {
                    Ok(exactly_once::stored(result))
                }
                _ => Err(outcome.to_owned()),
            };
            let store = Arc::clone(effects);
            let settled = tokio::task::spawn_blocking(move || match settle {
                Ok(stored) => store.complete(ticket, &stored),
                Err(why) => store.fail(
                    ticket,
                    &format!("Error: the earlier call ended as {why}"),
                    true,
                ),
            })
            .await;
            if !matches!(settled, Ok(Ok(()))) {
                tracing::error!(tool = %name, "could not record the call in the effect store");
                return Err(McpError::internal_error(
                    "the call ran but the effect store could not record it; retry with the same key: the store reports the call as in progress or indeterminate until resolved",
                    None,
                ));
            }
        }
        let entry = self
            .entry(
                &state,
                request_id,
                &name,
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

/// The refusal of a call whose arguments break a policy rule.
fn policy_refusal(violation: &toolgate_policy::ArgViolation) -> Refusal {
    let details = serde_json::json!({
        "error": "argument_rejected",
        "tool": violation.tool,
        "field": violation.field,
        "rule": violation.rule(),
        "fix": violation.message(),
    });
    Refusal {
        rule: violation.rule(),
        message: violation.message(),
        details,
    }
}

fn error_text(text: &str) -> CallToolResult {
    CallToolResult::error(vec![ContentBlock::text(text)])
}

/// Expires a permit and records an abandoned call when the gate's call future does not complete.
struct CallGuard {
    permit: Permit,
    /// `Some` while the call is in flight; taken when it completes normally.
    audit: Option<Arc<dyn AuditSink>>,
    entry: AuditEntry,
}

impl Drop for CallGuard {
    fn drop(&mut self) {
        let Some(audit) = self.audit.take() else {
            return;
        };
        let mut entry = self.entry.clone();
        // The handler may have reached its effect before being abandoned: record what it reached.
        if let Some(outcome) = self.permit.close() {
            entry.outcome = outcome.to_owned();
        }
        entry = entry.with_reason("cancelled");
        // Synchronous on purpose: this runs when the future is dropped, possibly while the runtime
        // shuts down, when a spawned task might never run. One fsync on a rare path is acceptable.
        if let Err(error) = audit.append(&entry) {
            tracing::error!(%error, "could not audit an abandoned call");
        }
    }
}

impl<H: ServerHandler> ServerHandler for Gated<H> {
    fn ping(
        &self,
        context: RequestContext<RoleServer>,
    ) -> impl Future<Output = Result<(), McpError>> + MaybeSendFuture + '_ {
        self.inner.ping(context)
    }

    async fn initialize(
        &self,
        request: InitializeRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<InitializeResult, McpError> {
        let mut result = self.inner.initialize(request, context).await?;
        add_contract_meta(&mut result.meta, self.contract_digest());
        Ok(result)
    }

    fn negotiate_initialize(
        &self,
        request: &InitializeRequestParams,
    ) -> Result<InitializeResult, McpError> {
        let mut result = self.inner.negotiate_initialize(request)?;
        add_contract_meta(&mut result.meta, self.contract_digest());
        Ok(result)
    }

    fn supported_protocol_versions(&self) -> Cow<'static, [ProtocolVersion]> {
        self.inner.supported_protocol_versions()
    }

    async fn discover(
        &self,
        context: RequestContext<RoleServer>,
    ) -> Result<DiscoverResult, McpError> {
        let mut result = self.inner.discover(context).await?;
        add_contract_meta(&mut result.meta, self.contract_digest());
        Ok(result)
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
        let policy = self.state.policy();
        // Listed exactly when callable: the policy shows it and the inner handler resolves it.
        result
            .tools
            .retain(|tool| policy.visible(&tool.name) && self.inner.get_tool(&tool.name).is_some());
        Ok(result)
    }

    fn get_tool(&self, name: &str) -> Option<Tool> {
        self.inner
            .get_tool(name)
            .filter(|_| self.state.policy().visible(name))
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
        let mut info = self.inner.get_info();
        add_contract_meta(&mut info.meta, self.contract_digest());
        info
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
