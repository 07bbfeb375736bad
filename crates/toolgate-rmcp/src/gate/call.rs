//! The tools/call pipeline. Before any handler code runs, a call is refused when the principal
//! source vouches for no caller, when the tool is unknown (the same -32602 as a hidden tool), or
//! by the first check of the sequence (`crate::checks`) that does not pass; the gate's own
//! `confirm_action` / `reject_action` are answered by the confirmation check's tools. A call that
//! passes runs under exactly-once (when the policy opts the tool in) with a `Permit`; the
//! handler's result is stored as it is (for replays), presented by every check, and audited
//! (with what the checks noted) once its effect is durable.

use std::sync::Arc;

use rmcp::model::{CallToolRequestParams, CallToolResponse, ErrorCode, JsonObject, Tool};
use rmcp::service::RequestContext;
use rmcp::{ErrorData as McpError, RoleServer, ServerHandler};
use serde_json::json;
use toolgate_audit::{AuditDecision, AuditEntry, Outcome, Reason};
use toolgate_canon::Sha256Digest;
use toolgate_policy::{Policy, ToolName};

use super::{CallGuard, Caller, Gated, TOOL_NOT_FOUND};
use crate::checks::arguments::InputShape;
use crate::checks::exactly_once::{self, Answering, EffectAnswer, ProbeCall, begin_effect};
use crate::checks::{Call, PendingAction, Verdict};
use crate::permit::Permit;
use crate::refusal::Refusal;
use crate::state::GateState;

/// Everything the execution step needs about a call that passed every check.
pub(crate) struct Admitted {
    pub(crate) state: Arc<GateState>,
    pub(crate) name: String,
    pub(crate) tool: Tool,
    pub(crate) args_digest: Sha256Digest,
    pub(crate) request_id: String,
    /// Who is calling (from the gate's principal source, for this request).
    pub(crate) principal: Arc<str>,
    /// The call's allow record as the checks annotated it, its reason the rule (`allow`, or
    /// `confirmed`); each record written for the call is a copy with its outcome.
    pub(crate) allow: AuditEntry,
    pub(crate) input: InputShape,
}

/// The name an audit line records for a called tool: the caller's input, so a name no tool could
/// have (too long, odd characters) is recorded as its digest and a caller cannot bloat or forge
/// log content with it.
fn recorded_tool_name(name: &str) -> String {
    match ToolName::new(name) {
        Ok(_) => name.to_owned(),
        Err(_) => format!("sha256:{}", Sha256Digest::of(name.as_bytes())),
    }
}

/// `entry` recording `outcome`.
fn with_outcome(mut entry: AuditEntry, outcome: Outcome) -> AuditEntry {
    entry.outcome = outcome;
    entry
}

impl<H: ServerHandler> Gated<H> {
    pub(super) async fn gated_call_tool(
        &self,
        request: CallToolRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, McpError> {
        let name = request.name.to_string();
        let state = self.state.snapshot();
        let args_digest =
            Sha256Digest::of_json_object(request.arguments.as_ref().unwrap_or(&JsonObject::new()));
        let caller = match self.caller_of(&context) {
            Ok(caller) => caller,
            Err(error) => {
                // Audited without a principal (there is none).
                let entry = toolgate_audit::AuditEntry::tool_call(
                    format!("rpc:{}", context.id),
                    recorded_tool_name(&name),
                    AuditDecision::Deny,
                    Outcome::NotExecuted,
                    args_digest,
                )
                .with_policy_digest(state.policy.digest())
                .with_reason(Reason::NoPrincipal);
                self.record_or_log(entry).await;
                return Err(error);
            }
        };
        if self.confirmations_offered(&name) {
            return self.confirmation_call(request, context, caller).await;
        }
        let Some(tool) = self.inner.get_tool(&name) else {
            // Recorded as unknown whatever the policy says; the caller sees the same error as
            // for a hidden tool, unless the server knows why the tool is unavailable and the
            // caller may call it (then the reason names the change: nothing is revealed that the
            // caller's own rights did not already show).
            let why = self
                .unavailable
                .as_ref()
                .and_then(|unavailable| unavailable.why(&name))
                .filter(|_| {
                    caller.grants(&state.policy, &name) && self.checks.lists(&state, &caller, &name)
                });
            let (reason, error) = match &why {
                Some(why) => (
                    Reason::Unavailable(why.clone()),
                    format!("{TOOL_NOT_FOUND}: {why}"),
                ),
                None => (Reason::UnknownTool, TOOL_NOT_FOUND.to_owned()),
            };
            let entry = self
                .entry(
                    &state,
                    &caller,
                    format!("rpc:{}", context.id),
                    &recorded_tool_name(&name),
                    AuditDecision::Deny,
                    Outcome::NotExecuted,
                    args_digest,
                )
                .with_reason(reason);
            self.record_or_log(entry).await;
            return Err(McpError::invalid_params(error, None));
        };
        self.decide(state, &caller, tool, request, context, None)
            .await
    }

    /// Runs the check sequence on a call of `tool` (which the inner handler has), answers the
    /// call when a check does not pass, and executes it otherwise. `confirmed` is the action a
    /// `confirm_action` call confirmed (its token already spent).
    pub(crate) async fn decide(
        &self,
        state: Arc<GateState>,
        caller: &Caller,
        tool: Tool,
        request: CallToolRequestParams,
        context: RequestContext<RoleServer>,
        confirmed: Option<&PendingAction>,
    ) -> Result<CallToolResponse, McpError> {
        let name = request.name.to_string();
        let principal = Arc::clone(&caller.principal);
        let mut request = request;
        let args_digest =
            Sha256Digest::of_json_object(request.arguments.as_ref().unwrap_or(&JsonObject::new()));
        let input = InputShape::of_schema(&tool.input_schema);
        let (sent, owned) =
            self.take_owned_arguments(&state.policy, &name, &input, &mut request.arguments);
        let arguments = request.arguments.as_ref();
        let decision = state.policy.decide_for(&principal, &name, arguments);
        let call = Call {
            state: &state,
            principal: &principal,
            caller,
            tenant: caller.credential.as_ref().and_then(|c| c.tenant()),
            name: &name,
            tool: &tool,
            input: &input,
            arguments,
            owned: &owned,
            sent: sent.as_ref().or(arguments),
            meta: &context.meta,
            decision: &decision,
            cedar_policies: Default::default(),
            cedar_view: Default::default(),
            args_digest,
            confirmed,
        };
        let request_id = self.request_id(arguments, &tool, &context.id);
        let deny = |request_id: String, reason: Reason| {
            let mut entry = self
                .entry(
                    &state,
                    caller,
                    request_id,
                    &name,
                    AuditDecision::Deny,
                    Outcome::NotExecuted,
                    args_digest,
                )
                .with_reason(reason);
            crate::checks::cedar::note(&state, &call, &mut entry);
            entry
        };
        if !caller.grants(&state.policy, &name) {
            // Outside the credential's scopes: as unknown as a hidden tool (an HTTP front door
            // answers 403 insufficient_scope before the call gets here).
            self.record_or_log(deny(
                format!("rpc:{}", context.id),
                Reason::InsufficientScope,
            ))
            .await;
            return Err(McpError::invalid_params(TOOL_NOT_FOUND, None));
        }
        match self.checks.admit(&call).await {
            Verdict::Pass => {}
            Verdict::Hide(reason) if confirmed.is_some() => {
                self.record_or_log(deny(request_id, Reason::NoLongerAllowed(Box::new(reason))))
                    .await;
                return Ok(crate::checks::confirmation::error_result(
                    "Error: the confirmed action is no longer allowed (policy or rights changed since the preview); nothing was executed",
                    json!({"error": "no_longer_allowed", "tool": name}),
                ));
            }
            Verdict::Hide(reason) => {
                // The audit line of a hidden call cannot carry text of the caller's choosing.
                self.record_or_log(deny(format!("rpc:{}", context.id), reason))
                    .await;
                tracing::info!(tool = %name, decision = "deny", "tools/call refused before dispatch");
                return Err(McpError::invalid_params(TOOL_NOT_FOUND, None));
            }
            Verdict::Fail { reason, error } => {
                self.record_or_log(deny(request_id, reason)).await;
                return Err(error);
            }
            Verdict::Refuse(refusal) => {
                // Argument refusals are tool results (isError), not protocol errors: the spec puts
                // input validation there, and the model can correct its call in the same turn.
                self.record_or_log(deny(request_id, Reason::Rule(refusal.rule.clone())))
                    .await;
                let note = self.contract_note(&name, &input);
                return Ok(refusal.into_result(&note).into());
            }
            Verdict::Answer(answer) => {
                let entry = self
                    .entry(
                        &state,
                        caller,
                        request_id,
                        &name,
                        answer.decision,
                        answer.outcome,
                        args_digest,
                    )
                    .with_reason(answer.reason);
                if answer.needs_record {
                    if let Err(error) = self.record(entry).await {
                        tracing::error!(tool = %name, %error, "could not audit an answered call");
                        return Err(McpError::internal_error(
                            format!(
                                "the answer's audit record could not be written ({error}); nothing was executed, call again once the audit log is writable"
                            ),
                            None,
                        ));
                    }
                } else {
                    self.record_or_log(entry).await;
                }
                return Ok(answer.result.into());
            }
            Verdict::Later(_) => unreachable!("Checks::admit resolves every pending verdict"),
        }
        let rule = if confirmed.is_some() {
            Reason::Confirmed
        } else {
            Reason::Rule(decision.rule())
        };
        // The outcome is set on each copy written.
        let mut allow = self
            .entry(
                &state,
                caller,
                request_id.clone(),
                &name,
                AuditDecision::Allow,
                Outcome::Error,
                args_digest,
            )
            .with_reason(rule);
        self.checks.annotate(&call, &mut allow);
        let admitted = Admitted {
            state: Arc::clone(&state),
            name,
            tool,
            args_digest,
            request_id,
            principal: Arc::clone(&principal),
            allow,
            input,
        };
        let tool = admitted.name.clone();
        let response = self.execute(admitted, request, context).await;
        // A task's result comes later through tasks/get, presented there for this caller only.
        if let Ok(CallToolResponse::Task(created)) = &response {
            self.tasks.created(&created.task.task_id, &tool, caller);
        }
        response
    }

    /// Takes the arguments some check owns for `name` out of `arguments` (unless the tool's own
    /// schema declares them, when they stay and serve both): returns the arguments as sent (only
    /// when something was taken) and the owned ones.
    fn take_owned_arguments(
        &self,
        policy: &Policy,
        name: &str,
        input: &InputShape,
        arguments: &mut Option<JsonObject>,
    ) -> (Option<JsonObject>, JsonObject) {
        let mut owned = JsonObject::new();
        let mut sent = None;
        let Some(arguments) = arguments.as_mut() else {
            return (sent, owned);
        };
        for field in self.checks.owned_arguments(policy, name) {
            if input.allowed.iter().any(|declared| declared == field)
                || !arguments.contains_key(field)
            {
                continue;
            }
            if sent.is_none() {
                sent = Some(arguments.clone());
            }
            if let Some(value) = arguments.remove(field) {
                owned.insert(field.to_owned(), value);
            }
        }
        (sent, owned)
    }

    /// Whether `name` is one of the gate's own confirmation tools and the gate offers them (the
    /// inner handler's own tool of that name, if any, wins).
    pub(super) fn confirmations_offered(&self, name: &str) -> bool {
        (name == crate::CONFIRM_ACTION || name == crate::REJECT_ACTION)
            && self.inner.get_tool(name).is_none()
    }

    /// Appends `entry`, logging (not returning) a failure: for refusals, which are refused
    /// whether or not their record could be written.
    pub(crate) async fn record_or_log(&self, entry: toolgate_audit::AuditEntry) {
        if let Err(error) = self.record(entry).await {
            tracing::error!(%error, "could not audit a refused call");
        }
    }

    /// Runs an admitted call: exactly-once when the policy opts the tool in, then the handler
    /// with a permit, the checks' presentation of its result, and the audit record.
    pub(crate) async fn execute(
        &self,
        admitted: Admitted,
        request: CallToolRequestParams,
        mut context: RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, McpError> {
        let Admitted {
            state,
            name,
            tool,
            args_digest,
            request_id,
            principal,
            allow,
            input,
        } = admitted;
        let policy = Arc::clone(&state.policy);
        self.execute_inner(
            &state,
            &policy,
            &principal,
            &name,
            &tool,
            args_digest,
            request_id,
            allow,
            &input,
            request,
            &mut context,
        )
        .await
    }

    #[allow(clippy::too_many_arguments)]
    async fn execute_inner(
        &self,
        state: &Arc<GateState>,
        policy: &Policy,
        principal: &str,
        name: &str,
        tool: &Tool,
        args_digest: Sha256Digest,
        request_id: String,
        allow: AuditEntry,
        input: &InputShape,
        request: CallToolRequestParams,
        context: &mut RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, McpError> {
        let name = name.to_owned();
        let arguments = request.arguments.as_ref();
        // Exactly-once: a tool the policy opts in runs at most once per key; replays, conflicts
        // and calls still in progress are answered here without running the handler.
        let mut ticket = None;
        let effects = self.checks.exactly_once.effects.as_ref();
        if let (Some(settings), Some(effects)) = (policy.idempotency(&name), effects) {
            let request = exactly_once::request_for(
                settings,
                principal,
                &name,
                arguments,
                &context.meta,
                args_digest,
                &tool.input_schema,
            );
            let kind = exactly_once::kind(settings);
            let probe = self
                .checks
                .exactly_once
                .probes
                .get(&name)
                .map(|probe| ProbeCall {
                    probe: Arc::clone(probe),
                    arguments: arguments.cloned(),
                });
            // The allow record of an answer given without the handler, appended in the same
            // blocking task that decided it (one hand-off per replay instead of two), where a
            // replay is also presented.
            let decided = begin_effect(
                Arc::clone(effects),
                request,
                kind,
                probe,
                Answering {
                    marker: settings.replay_marker.clone(),
                    audit: Arc::clone(&self.audit),
                    entry: allow.clone(),
                    checks: Arc::clone(&self.checks),
                    state: Arc::clone(state),
                    tool: name.clone(),
                },
            )
            .await;
            match decided {
                EffectAnswer::Execute(t) => ticket = Some(t),
                EffectAnswer::Answered { response, recorded } => {
                    if let Err(error) = recorded {
                        tracing::error!(tool = %name, %error, "could not audit an exactly-once answer");
                        return Err(McpError::internal_error(
                            format!(
                                "the call's audit record could not be written ({error}); nothing was executed, retry once the audit log is writable"
                            ),
                            None,
                        ));
                    }
                    return response.map(Into::into);
                }
            }
        }

        let permit = Permit::issue(&name, &request_id);
        context.extensions.insert(permit.clone());
        // If this future is dropped (the client cancelled) or the handler panics, the guard still
        // expires the permit and records the decision with what the handler reached.
        let mut guard = CallGuard {
            permit: permit.clone(),
            audit: Some(Arc::clone(&self.audit)),
            allow: &allow,
        };
        // A handler that panics is answered -32603 like any failure (crate::unwind), instead of
        // leaving its request unanswered and its in-flight slot taken.
        let (response, panicked) = match crate::unwind::contained(
            "tools/call",
            self.inner.call_tool(request, context.clone()),
        )
        .await
        {
            Ok(response) => (response, false),
            Err(panicked) => (Err(panicked.into()), true),
        };
        guard.audit = None;
        drop(guard);
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
                let result = refusal.into_result(&self.contract_note(&name, input));
                (Ok(result.into()), true)
            }
            other => (other, false),
        };
        // What the gate infers unless the handler recorded otherwise: a completed call committed
        // its effect (observed, for a tool the policy classes `read`).
        let completed = if policy
            .effect_class(&name)
            .is_some_and(|class| class == toolgate_policy::EffectClass::Read)
        {
            Outcome::Observed
        } else {
            Outcome::Committed
        };
        let outcome = match &response {
            // Whatever the handler recorded before it panicked, nothing stored says how far its
            // effect got: an exactly-once ticket is abandoned (indeterminate), not failed.
            _ if panicked && ticket.is_some() => Outcome::Indeterminate,
            // Otherwise the record says what the handler reached, as for a cancelled call.
            _ if panicked => recorded.unwrap_or(Outcome::Error),
            Ok(CallToolResponse::Complete(_)) if invalid_arguments => Outcome::InvalidArguments,
            Ok(CallToolResponse::Complete(result)) if result.is_error == Some(true) => {
                recorded.unwrap_or(Outcome::Failed)
            }
            Ok(CallToolResponse::Complete(_)) => recorded.unwrap_or(completed),
            // The handler handed the call to a task or asked the client for input: the permit
            // ends here, so later work needs a new call through the gate.
            Ok(CallToolResponse::InputRequired(_)) => recorded.unwrap_or(Outcome::InputRequired),
            Ok(_) => recorded.unwrap_or(Outcome::TaskCreated),
            Err(_) => recorded.unwrap_or(Outcome::Error),
        };
        let mut entry = with_outcome(allow, outcome);
        if panicked {
            entry = entry.with_reason(Reason::HandlerPanicked);
        }
        let audit_failed = |error: String| {
            tracing::error!(tool = %name, %error, "could not audit an allowed call");
            Err(McpError::internal_error(
                format!(
                    "the call ran but its audit record could not be written ({error}); any effect is durable, so retry with the same idempotency key to replay it once the audit log is writable"
                ),
                None,
            ))
        };
        // What the effect store keeps is the handler's result less what the result allow-list
        // withholds; a replay is presented again under the policy in force then.
        let settle = ticket.map(|ticket| {
            let settle = match &response {
                Ok(CallToolResponse::Complete(result)) if result.is_error != Some(true) => {
                    Ok(exactly_once::stored(state, &name, result))
                }
                _ => Err(outcome),
            };
            (ticket, settle)
        });
        // Presented before its record is written, so the checks can note what they did in it.
        // A refusal the gate wrote (invalid arguments) is not the handler's result.
        let mut response = response;
        if let (Some((_, Ok(_))), Ok(CallToolResponse::Complete(result))) = (&settle, &mut response)
        {
            // As its replays will be: byte-identical in any build.
            toolgate_canon::in_key_order(result);
        }
        if !invalid_arguments && let Ok(CallToolResponse::Complete(result)) = &mut response {
            self.checks.present(state, &name, result, &mut entry);
        }
        if let (Some((ticket, settle)), Some(effects)) = (settle, effects) {
            // Store the result (or the failure) before the allow record, so that a retry after
            // this point replays instead of running the effect again; both in one blocking task
            // (one hand-off to the pool per call instead of two).
            let store = Arc::clone(effects);
            let audit = Arc::clone(&self.audit);
            let settled = crate::blocking::run(move || {
                let stored = match settle {
                    Ok(stored) => store.complete(ticket, &stored),
                    // The handler cannot tell whether the effect happened (its upstream died or
                    // stopped answering mid-call): the ticket is abandoned, not failed, so the
                    // record stays `in_progress` under an owner that is dead for every process.
                    // A retry of an `unsafe` effect then gets `Indeterminate` until an operator
                    // resolves it, and an `idempotent` one is taken over (commit-store.md).
                    Err(Outcome::Indeterminate) => store.abandon(ticket),
                    Err(why) => store.fail(
                        ticket,
                        &format!("Error: the earlier call ended as {why}"),
                        true,
                    ),
                };
                match stored {
                    Ok(()) => Ok(audit.append(&entry).map(drop).map_err(|e| e.to_string())),
                    Err(error) => {
                        // The call ran but its outcome is not stored: it still leaves its record,
                        // as an error.
                        let mut failed = entry;
                        failed.outcome = Outcome::Error;
                        if let Err(audit_error) = audit.append(&failed) {
                            tracing::error!(error = %audit_error, "could not audit a call whose outcome the effect store lost");
                        }
                        Err(error)
                    }
                }
            })
            .await;
            match settled {
                Ok(Ok(Ok(()))) => {}
                Ok(Ok(Err(error))) => return audit_failed(error),
                Ok(Err(error)) => {
                    tracing::error!(tool = %name, %error, "could not record the call in the effect store");
                    return Err(McpError::internal_error(
                        "the call ran but the effect store could not record it; retry with the same key: the store reports the call as in progress or indeterminate until resolved",
                        None,
                    ));
                }
                Err(_) => return audit_failed("the storage task was cancelled".to_owned()),
            }
        } else if let Err(error) = self.record(entry).await {
            return audit_failed(error);
        }
        tracing::info!(tool = %name, decision = "allow", outcome = outcome.as_str(), "tools/call");
        response
    }
}
