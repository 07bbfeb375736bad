//! The tools/call pipeline: every check that can refuse a call runs before any handler code, in
//! this order (the first that refuses decides, and is audited with its rule):
//!
//! 1. the gate's own `confirm_action` / `reject_action` (two-step confirmation, `confirm.rs`);
//! 2. unknown tool, policy deny (for this principal), rights file: the same -32602 error;
//! 3. kill switch (a JSON-RPC error; tools the policy exempts keep working);
//! 4. input shape (required, unknown arguments), policy argument rules, JSON Schema, path
//!    containment through symbolic links: an `isError` refusal;
//! 5. batch guard (explicit ids, or a filter whose match count must equal `expected_count`);
//! 6. rate limits (per tool, per principal);
//! 7. two-step confirmation for notify / wake / alert / delete tools: a preview, nothing executed;
//! 8. exactly-once, then the handler with a `Permit`; the result's untrusted fields are wrapped.

use std::sync::Arc;
use std::time::Instant;

use crate::checks::{Limit, Status};
use rmcp::model::{
    CallToolRequestParams, CallToolResponse, CallToolResult, ContentBlock, ErrorCode, JsonObject,
    Tool,
};
use rmcp::service::RequestContext;
use rmcp::{ErrorData as McpError, RoleServer, ServerHandler};
use serde_json::{Map, Value, json};
use toolgate_audit::{Decision as AuditDecision, Outcome};
use toolgate_canon::Sha256Digest;
use toolgate_commit::effect::{
    Attempt, Begin, EffectBackend, EffectError, EffectKind, EffectRequest, Resolution, Scope,
};
use toolgate_policy::{BatchCall, Decision, Policy, ToolName};

use super::{
    CONFIRM_ACTION, CallGuard, EffectProbe, Gated, HALTED, ProbeAnswer, REJECT_ACTION,
    TOOL_NOT_FOUND, error_text, policy_refusal,
};
use crate::exactly_once;
use crate::input::InputShape;
use crate::permit::Permit;
use crate::refusal::Refusal;
use crate::schema::SchemaCache;
use crate::state::GateState;

/// At most this many batch matches are returned with a count mismatch.
const MAX_BATCH_MATCHES_SHOWN: usize = 100;

/// Everything the execution step needs about a call that passed every check.
pub(super) struct Admitted {
    pub(super) state: Arc<GateState>,
    pub(super) name: String,
    pub(super) tool: Tool,
    pub(super) args_digest: Sha256Digest,
    pub(super) request_id: String,
    /// Who is calling (from the gate's principal source, for this request).
    pub(super) principal: Arc<str>,
    /// The rule recorded as the allow line's reason (`allow`, or `confirmed`).
    pub(super) rule: String,
    pub(super) input: InputShape,
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

impl<H: ServerHandler> Gated<H> {
    pub(super) async fn gated_call_tool(
        &self,
        request: CallToolRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, McpError> {
        let name = request.name.to_string();
        let principal = match self.principal_of(&context.extensions) {
            Ok(principal) => principal,
            Err(error) => {
                // Audited without a principal (there is none).
                let recorded = recorded_tool_name(&name);
                let digest = Sha256Digest::of_json_object(
                    request.arguments.as_ref().unwrap_or(&JsonObject::new()),
                );
                let entry = toolgate_audit::AuditEntry::tool_call(
                    format!("rpc:{}", context.id),
                    recorded,
                    AuditDecision::Deny,
                    Outcome::NotExecuted,
                    digest,
                )
                .with_policy_digest(self.state.snapshot().policy.digest())
                .with_reason("no_principal");
                if let Err(e) = self.record(entry).await {
                    tracing::error!(error = %e, "could not audit a call without a principal");
                }
                return Err(error);
            }
        };
        if self.confirmations_offered(&name) {
            return self.confirmation_call(request, context, principal).await;
        }
        let recorded_name = recorded_tool_name(&name);
        let state = self.state.snapshot();
        let policy = Arc::clone(&state.policy);
        let arguments = request.arguments.as_ref();
        // The digest of the canonical arguments (absent = `{}`), from the request's own map.
        let args_digest = Sha256Digest::of_json_object(arguments.unwrap_or(&JsonObject::new()));
        let deny = |request_id: String, reason: String| {
            self.entry(
                &state,
                &principal,
                request_id,
                &recorded_name,
                AuditDecision::Deny,
                Outcome::NotExecuted,
                args_digest,
            )
            .with_reason(reason)
        };

        let decision = policy.decide_for(&principal, &name, arguments);
        let tool = self.inner.get_tool(&name);
        // A tool the inner handler does not have is recorded as unknown whatever the policy says;
        // the caller sees the same error either way.
        let hidden_reason = match (&tool, &decision) {
            (None, _) => Some("unknown_tool".to_owned()),
            (Some(_), Decision::DenyTool(denial)) => Some(denial.rule().to_owned()),
            (Some(_), _) => self.rights_refusal(&principal, &name),
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
        let request_id = self.request_id(arguments, &tool, &context.id);

        if !policy.halt_exempt(&name)
            && let Some(error) = self.halted()
        {
            if let Err(e) = self
                .record(deny(request_id, "kill_switch".to_owned()))
                .await
            {
                tracing::error!(tool = %name, error = %e, "could not audit a halted call");
            }
            return Err(error);
        }

        // Argument refusals are tool results (isError), not protocol errors: the spec puts input
        // validation there, and the model can correct its call in the same turn.
        let input = InputShape::of_schema(&tool.input_schema);
        let mut refusal = argument_refusal(
            &self.schemas,
            &policy,
            &decision,
            &principal,
            &name,
            &input,
            &tool.input_schema,
            arguments,
            &context.meta,
        );
        if refusal.is_none() {
            refusal = self.batch_refusal(&policy, &name, arguments).await;
        }
        if refusal.is_none() {
            refusal = self.rate_refusal(&policy, &principal, &name);
        }
        if let Some(refusal) = refusal {
            if let Err(error) = self
                .record(deny(request_id.clone(), refusal.rule.clone()))
                .await
            {
                tracing::error!(tool = %recorded_name, %error, "could not audit a refused call");
            }
            let note = self.contract_note(&name, &input);
            return Ok(refusal
                .into_result(&note, tool.output_schema.is_some())
                .into());
        }

        if policy
            .effect_class(&name)
            .is_some_and(|class| class.needs_confirmation())
        {
            return self
                .preview(
                    &state,
                    &principal,
                    &name,
                    &tool,
                    arguments,
                    args_digest,
                    request_id,
                    "confirmation_required",
                )
                .await;
        }

        let admitted = Admitted {
            state,
            name,
            tool,
            args_digest,
            request_id,
            principal,
            rule: decision.rule(),
            input,
        };
        self.execute(admitted, request, context).await
    }

    /// Whether `name` is one of the gate's own confirmation tools and the gate offers them (the
    /// inner handler's own tool of that name, if any, wins).
    pub(super) fn confirmations_offered(&self, name: &str) -> bool {
        (name == CONFIRM_ACTION || name == REJECT_ACTION) && self.inner.get_tool(name).is_none()
    }

    /// The hidden-tool reason when the rights file does not grant `name` to the principal (or
    /// cannot be read: fail closed). `None` without a rights file.
    pub(super) fn rights_refusal(&self, principal: &str, name: &str) -> Option<String> {
        let rights = self.rights.as_ref()?;
        match rights.rights(principal) {
            Ok(granted) if granted.allows(name) => None,
            Ok(_) => Some("rights".to_owned()),
            Err(error) => {
                tracing::error!(%error, "the rights file is unusable; refusing every call");
                Some("rights_unavailable".to_owned())
            }
        }
    }

    /// The JSON-RPC error of a halted server, if the kill switch is set.
    pub(super) fn halted(&self) -> Option<McpError> {
        let switch = self.kill_switch.as_ref()?;
        match switch.status() {
            Status::Running => None,
            Status::Halted(halt) => Some(McpError::new(
                ErrorCode(HALTED),
                match &self.server_name {
                    Some(server) => format!(
                        "calls are halted by an operator ({}); nothing was executed. Retry after the operator runs `{server} resume`",
                        halt.reason
                    ),
                    None => format!(
                        "calls are halted by an operator ({}); nothing was executed. Retry after the operator lifts the halt",
                        halt.reason
                    ),
                },
                Some(
                    json!({"halted": true, "reason": halt.reason, "by": halt.by, "since_ns": halt.since_ns.to_string()}),
                ),
            )),
        }
    }

    /// A batch tool's shape check, and for a filter call the match count against
    /// `expected_count` (asking the preflight for the current matches).
    async fn batch_refusal(
        &self,
        policy: &Policy,
        name: &str,
        arguments: Option<&Map<String, Value>>,
    ) -> Option<Refusal> {
        let batch = policy.batch(name)?;
        let call = match batch.check(arguments) {
            Ok(call) => call,
            Err(violation) => {
                return Some(Refusal {
                    rule: violation.rule(),
                    message: violation.message(),
                    details: json!({
                        "error": "batch_rejected",
                        "tool": name,
                        "rule": violation.rule(),
                        "fix": violation.message(),
                    }),
                });
            }
        };
        let BatchCall::Filter {
            filter,
            expected_count,
        } = call
        else {
            return None;
        };
        let rule = format!("batch.{name}.expected_count");
        let Some(preflight) = self.preflight.clone() else {
            let fix = "pass explicit ids instead of a filter";
            return Some(Refusal {
                message: format!(
                    "Error: `{name}` cannot be called with a filter on this server (no batch matcher is configured; rule {rule}); nothing was executed. {fix}"
                ),
                details: json!({"error": "batch_rejected", "tool": name, "rule": rule, "fix": fix}),
                rule,
            });
        };
        let tool = name.to_owned();
        let matched =
            tokio::task::spawn_blocking(move || preflight.batch_matches(&tool, &filter)).await;
        let matches = match matched {
            Ok(Ok(matches)) => matches,
            failed => {
                let why = match failed {
                    Ok(Err(why)) => why,
                    _ => "the matcher task failed".to_owned(),
                };
                let fix = "fix the filter or pass explicit ids";
                return Some(Refusal {
                    message: format!(
                        "Error: the filter of `{name}` could not be evaluated ({why}); nothing was executed. {fix}"
                    ),
                    details: json!({"error": "batch_rejected", "tool": name, "rule": rule, "fix": fix}),
                    rule,
                });
            }
        };
        let count = u64::try_from(matches.len()).unwrap_or(u64::MAX);
        if count == expected_count {
            return None;
        }
        let fix = "check the matches; call again with explicit ids, or with a narrower filter and the right expected_count";
        let shown: Vec<Value> = matches.into_iter().take(MAX_BATCH_MATCHES_SHOWN).collect();
        Some(Refusal {
            message: format!(
                "Error: the filter of `{name}` matches {count} items but expected_count is {expected_count} (rule {rule}); nothing was executed. {fix}"
            ),
            details: json!({
                "error": "batch_count_mismatch",
                "tool": name,
                "rule": rule,
                "expected_count": expected_count,
                "matched": count,
                "matches": shown,
                "fix": fix,
            }),
            rule,
        })
    }

    /// Takes a token from the tool's and the principal's buckets, or refuses with retry-after.
    fn rate_refusal(&self, policy: &Policy, principal: &str, name: &str) -> Option<Refusal> {
        let mut keys = Vec::new();
        let mut rules = Vec::new();
        if let Some(rate) = policy.tool_rate(name) {
            keys.push((format!("tool:{name}"), limit(rate)));
            rules.push(format!("rate_limits.tools.{name}"));
        }
        if let Some(rate) = policy.principal_rate(principal) {
            keys.push((format!("principal:{principal}"), limit(rate)));
            rules.push(format!("rate_limits.principals.{principal}"));
        }
        if keys.is_empty() {
            return None;
        }
        let limited = self.rates.check(&keys, Instant::now()).err()?;
        let rule = rules
            .get(limited.key_index)
            .cloned()
            .unwrap_or_else(|| "rate_limits".to_owned());
        let retry_after = limited.retry_after_secs();
        let fix = format!("retry after {retry_after} s");
        Some(Refusal {
            message: format!(
                "Error: `{name}` is over its rate limit (rule {rule}); nothing was executed. Retry after {retry_after} s"
            ),
            details: json!({
                "error": "rate_limited",
                "tool": name,
                "rule": rule,
                "retry_after_secs": retry_after,
                "fix": fix,
            }),
            rule,
        })
    }

    /// Runs an admitted call: exactly-once when the policy opts the tool in, then the handler
    /// with a permit, then the audit record, and the untrusted-output wrapping.
    pub(super) async fn execute(
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
            rule,
            input,
        } = admitted;
        let policy = Arc::clone(&state.policy);
        let response = self
            .execute_inner(
                &state,
                &policy,
                &principal,
                &name,
                &tool,
                args_digest,
                request_id,
                rule,
                &input,
                request,
                &mut context,
            )
            .await;
        match (response, policy.untrusted_output(&name)) {
            (Ok(CallToolResponse::Complete(mut result)), Some(untrusted)) => {
                wrap_untrusted(&mut result, untrusted);
                Ok(result.into())
            }
            (other, _) => other,
        }
    }

    #[allow(clippy::too_many_arguments)]
    async fn execute_inner(
        &self,
        state: &GateState,
        policy: &Policy,
        principal: &str,
        name: &str,
        tool: &Tool,
        args_digest: Sha256Digest,
        request_id: String,
        rule: String,
        input: &InputShape,
        request: CallToolRequestParams,
        context: &mut RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, McpError> {
        let name = name.to_owned();
        let arguments = request.arguments.as_ref();
        // Exactly-once: a tool the policy opts in runs at most once per key; replays, conflicts
        // and calls still in progress are answered here without running the handler.
        let mut ticket = None;
        if let (Some(settings), Some(effects)) = (policy.idempotency(&name), &self.effects) {
            let request = EffectRequest {
                scope: Scope {
                    principal: principal.to_owned(),
                    tool: name.clone(),
                },
                key: exactly_once::key_for(settings, arguments, &context.meta, args_digest),
                fingerprint: exactly_once::fingerprint(args_digest, &tool.input_schema),
            };
            let kind = exactly_once::kind(settings);
            let probe = self.probes.get(&name).map(|probe| ProbeCall {
                probe: Arc::clone(probe),
                arguments: arguments.cloned(),
            });
            // The allow record of an answer given without the handler, appended in the same
            // blocking task that decided it (one hand-off per replay instead of two).
            let entry = self
                .entry(
                    state,
                    principal,
                    request_id.clone(),
                    &name,
                    AuditDecision::Allow,
                    Outcome::Error,
                    args_digest,
                )
                .with_reason(rule.clone());
            let decided = begin_effect(
                Arc::clone(effects),
                request,
                kind,
                probe,
                Answering {
                    marker: settings.replay_marker.clone(),
                    audit: Arc::clone(&self.audit),
                    entry,
                },
            )
            .await;
            match decided {
                EffectAnswer::Execute(t) => ticket = Some(t),
                EffectAnswer::Answered { response, recorded } => {
                    if let Err(error) = recorded {
                        tracing::error!(tool = %name, %error, "could not audit an exactly-once answer");
                        return Err(McpError::internal_error(
                            "the call's audit record could not be written; retry once the audit log is writable",
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
            entry: self
                .entry(
                    state,
                    principal,
                    request_id.clone(),
                    &name,
                    AuditDecision::Allow,
                    Outcome::Cancelled,
                    args_digest,
                )
                .with_reason(rule.clone()),
        };
        let response = self.inner.call_tool(request, context.clone()).await;
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
                let result = refusal.into_result(
                    &self.contract_note(&name, input),
                    tool.output_schema.is_some(),
                );
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
        let entry = self
            .entry(
                state,
                principal,
                request_id,
                &name,
                AuditDecision::Allow,
                outcome,
                args_digest,
            )
            .with_reason(rule.clone());
        let audit_failed = |error: String| {
            tracing::error!(tool = %name, %error, "could not audit an allowed call");
            Err(McpError::internal_error(
                "the call ran but its audit record could not be written; any effect is durable, so retry with the same idempotency key to replay it once the audit log is writable",
                None,
            ))
        };
        if let (Some(ticket), Some(effects)) = (ticket, &self.effects) {
            // Store the result (or the failure) before the allow record, so that a retry after
            // this point replays instead of running the effect again; both in one blocking task
            // (one hand-off to the pool per call instead of two).
            let settle = match &response {
                Ok(CallToolResponse::Complete(result)) if result.is_error != Some(true) => {
                    Ok(exactly_once::stored(result))
                }
                _ => Err(outcome),
            };
            let store = Arc::clone(effects);
            let audit = Arc::clone(&self.audit);
            let settled = crate::blocking::run(move || {
                let stored = match settle {
                    Ok(stored) => store.complete(ticket, &stored),
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

/// A tool's probe with the arguments of the call that asks it.
struct ProbeCall {
    probe: EffectProbe,
    arguments: Option<JsonObject>,
}

/// What the exactly-once step decided for a call.
enum EffectAnswer {
    /// Run the handler; store its outcome with the ticket.
    Execute(toolgate_commit::effect::Ticket),
    /// Answered without the handler (replay, conflict, in progress, indeterminate, a store
    /// failure); `recorded` says whether its allow record was appended.
    Answered {
        response: Result<CallToolResult, McpError>,
        recorded: Result<(), String>,
    },
}

/// How to answer and audit a call the store does not let execute.
struct Answering {
    marker: Option<toolgate_policy::ReplayMarker>,
    audit: Arc<dyn toolgate_audit::AuditSink>,
    /// The allow record, its outcome set once the answer is known.
    entry: toolgate_audit::AuditEntry,
}

impl Answering {
    /// The answer to `begun`, with its allow record appended (blocking work), or the ticket to
    /// execute with.
    fn settle(&self, begun: Result<Begin, EffectError>) -> EffectAnswer {
        let (outcome, response) = match begun {
            Ok(Begin::Execute(ticket)) => return EffectAnswer::Execute(ticket),
            Ok(Begin::Replay(stored)) => match exactly_once::replayed(stored, self.marker.as_ref())
            {
                Some(result) => (Outcome::Replay, Ok(result)),
                None => (
                    Outcome::Error,
                    Err(McpError::internal_error(
                        "the stored result of this call cannot be read back; inspect the effect store",
                        None,
                    )),
                ),
            },
            Ok(Begin::ReplayFailure(text)) => (
                Outcome::Replay,
                Ok(CallToolResult::error(vec![ContentBlock::text(text)])),
            ),
            Err(EffectError::Conflict { .. }) => (
                Outcome::Conflict,
                Ok(error_text(
                    "Error: this idempotency key was already used with different arguments; nothing was executed. Retry with the original arguments, or use a new key for a new effect",
                )),
            ),
            Err(EffectError::InProgress { retry_after, .. }) => (
                Outcome::InProgress,
                Ok(error_text(&format!(
                    "Error: a call with this idempotency key is still in progress; nothing was executed. Retry after {} s",
                    retry_after.as_secs().max(1)
                ))),
            ),
            Err(EffectError::Indeterminate { .. }) => (
                Outcome::Indeterminate,
                Ok(error_text(
                    "Error: an earlier call with this idempotency key stopped mid-effect, so the effect may or may not have happened; it is not re-run automatically. An operator must inspect the target and resolve the key",
                )),
            ),
            Err(error) => (
                Outcome::Error,
                Err(McpError::internal_error(
                    format!("the effect store failed: {error}"),
                    None,
                )),
            ),
        };
        let mut entry = self.entry.clone();
        entry.outcome = outcome;
        let recorded = self
            .audit
            .append(&entry)
            .map(drop)
            .map_err(|e| e.to_string());
        EffectAnswer::Answered { response, recorded }
    }
}

/// One blocking step of [`begin_effect`].
enum Step {
    Done(EffectAnswer),
    Pause(std::time::Duration),
    /// Indeterminate, with a probe still to ask.
    Probe(EffectError),
}

/// Asks the effect store what to do with a call of an exactly-once tool, as
/// [`EffectBackend::begin`] would, without holding a thread while another live call holds the key,
/// and answers (and audits) a call it does not let execute.
///
/// Each attempt is blocking work (it takes the store's lock and may wait for an fdatasync; it
/// runs in place on a multi-thread runtime, else on the blocking pool: see `crate::blocking`);
/// an answer that is not `Execute` is audited in the same blocking task. The pauses between
/// attempts (1 ms doubling to 50 ms, for at most the store's `wait_in_progress`) are timers on
/// the runtime. A waiting call therefore holds no blocking thread, so the pool can stay small and
/// many concurrent retries of one key cannot starve the call they wait for. The store counts the
/// call once, whatever the number of attempts.
///
/// An unsafe effect whose caller died is `Indeterminate`: the tool's probe, if it has one, is
/// asked (once per call, as blocking work: it reads the effect's target), the record is
/// resolved from its answer, and the call is decided again.
async fn begin_effect(
    store: Arc<dyn EffectBackend>,
    request: EffectRequest,
    kind: EffectKind,
    mut probe: Option<ProbeCall>,
    answering: Answering,
) -> EffectAnswer {
    let request = Arc::new(request);
    let answering = Arc::new(answering);
    let cancelled = |answering: &Answering| {
        let mut entry = answering.entry.clone();
        entry.outcome = Outcome::Error;
        // The task that would have recorded the answer did not run to its end: record here.
        let recorded = answering
            .audit
            .append(&entry)
            .map(drop)
            .map_err(|e| e.to_string());
        EffectAnswer::Answered {
            response: Err(McpError::internal_error(
                "the effect store task was cancelled; retry the call",
                None,
            )),
            recorded,
        }
    };
    let mut wait = store.in_progress_wait();
    loop {
        let probing = probe.is_some();
        let step = {
            let (store, request, task) = (
                Arc::clone(&store),
                Arc::clone(&request),
                Arc::clone(&answering),
            );
            let ran = crate::blocking::run(move || {
                let step = match store.begin_attempt(&request, kind, &mut wait) {
                    Ok(Attempt::Pause(pause)) => Step::Pause(pause),
                    Err(error @ EffectError::Indeterminate { .. }) if probing => Step::Probe(error),
                    Ok(Attempt::Ready(begin)) => Step::Done(task.settle(Ok(begin))),
                    Err(error) => Step::Done(task.settle(Err(error))),
                };
                (step, wait)
            })
            .await;
            match ran {
                Ok((step, waited)) => {
                    wait = waited;
                    step
                }
                Err(_) => return cancelled(&answering),
            }
        };
        let indeterminate = match step {
            Step::Done(answer) => return answer,
            Step::Pause(pause) => {
                tokio::time::sleep(pause).await;
                continue;
            }
            Step::Probe(error) => error,
        };
        let Some(ProbeCall { probe, arguments }) = probe.take() else {
            unreachable!("a step asks for the probe only while there is one");
        };
        let (store, request) = (Arc::clone(&store), Arc::clone(&request));
        let task = Arc::clone(&answering);
        let resolved = crate::blocking::run(move || {
            let resolution = match probe(arguments.as_ref()) {
                ProbeAnswer::Happened(result) => {
                    Resolution::Completed(exactly_once::stored(&result))
                }
                ProbeAnswer::NotHappened => Resolution::Forget,
                ProbeAnswer::Unknown => return Some(task.settle(Err(indeterminate))),
            };
            match store.resolve(&request.scope, &request.key, resolution) {
                // Decided again with the same wait: the record is now completed or absent.
                Ok(()) => None,
                Err(error) => Some(task.settle(Err(error))),
            }
        })
        .await;
        match resolved {
            Ok(None) => {}
            Ok(Some(answer)) => return answer,
            Err(_) => return cancelled(&answering),
        }
    }
}

fn limit(rate: toolgate_policy::Rate) -> Limit {
    Limit {
        burst: rate.burst,
        per_minute: rate.per_minute,
    }
}

/// Step 4 of the pipeline: the first refusal of a call's arguments, in this order: the input
/// schema's top-level shape (required and unknown arguments), the policy's argument rules (from
/// `decision`), the full JSON Schema, path containment through symbolic links, then the
/// idempotency key's limits (for a tool the policy makes exactly-once).
#[allow(clippy::too_many_arguments)]
pub(crate) fn argument_refusal(
    schemas: &SchemaCache,
    policy: &Policy,
    decision: &Decision,
    principal: &str,
    name: &str,
    input: &InputShape,
    input_schema: &Arc<JsonObject>,
    arguments: Option<&Map<String, Value>>,
    meta: &rmcp::model::RequestMetaObject,
) -> Option<Refusal> {
    input
        .problem(name, arguments)
        .or_else(|| match decision {
            Decision::DenyArgs(violation) => Some(policy_refusal(violation)),
            _ => None,
        })
        .or_else(|| schemas.check(name, input_schema, arguments).err())
        .or_else(|| path_refusal(policy, principal, name, arguments))
        .or_else(|| {
            policy.idempotency(name).and_then(|settings| {
                crate::exactly_once::key_refusal(settings, name, arguments, meta)
            })
        })
}

/// The refusal of a path argument that lies inside its roots lexically but leaves them through a
/// symbolic link (checked now, on the real filesystem).
fn path_refusal(
    policy: &Policy,
    principal: &str,
    name: &str,
    arguments: Option<&Map<String, Value>>,
) -> Option<Refusal> {
    for (field, rule) in policy.path_rules(Some(principal), name) {
        let Some(Value::String(value)) = arguments.and_then(|a| a.get(field)) else {
            continue;
        };
        let Ok(normalised) = rule.normalise(value) else {
            continue; // the policy's own decision already refused it
        };
        let roots: Vec<std::path::PathBuf> = rule.roots().iter().map(Into::into).collect();
        if let Err(error) = crate::checks::resolve_within(&roots, &normalised) {
            let top_level = policy
                .arg_rules(name)
                .and_then(|rules| rules.get(field))
                .is_some_and(|r| r.path().is_some());
            let rule_id = if top_level {
                format!("arg_rules.{name}.{field}.path")
            } else {
                format!("principals.{principal}.arg_rules.{name}.{field}.path")
            };
            let fix = format!(
                "pass a path that stays inside {} without following links out of it",
                rule.roots().join(", ")
            );
            return Some(Refusal::argument(
                name,
                field,
                rule_id.clone(),
                json!({"roots": rule.roots(), "check": error.code()}),
                format!(
                    "Error: argument `{field}` of `{name}` resolves outside its allowed roots (policy rule {rule_id}: {}); {fix}",
                    error.code()
                ),
                &fix,
            ));
        }
    }
    None
}

/// Replaces the tool's third-party text fields with the `untrusted_text` wrapper, in
/// `structuredContent` and in the text content (which is regenerated from it, so the raw text
/// cannot slip through a second copy).
fn wrap_untrusted(result: &mut CallToolResult, untrusted: &toolgate_policy::UntrustedOutput) {
    let Some(structured) = result.structured_content.as_mut() else {
        // Without structured content the fields cannot be located: drop the text rather than
        // pass third-party text through unmarked.
        if !result.content.is_empty() {
            result.content = vec![ContentBlock::text(
                "Error: this tool's output contains third-party text that the server could not isolate; it was withheld",
            )];
            result.is_error = Some(true);
        }
        return;
    };
    untrusted.apply(structured);
    let text = serde_json::to_string(structured).unwrap_or_default();
    result.content = vec![ContentBlock::text(text)];
}
