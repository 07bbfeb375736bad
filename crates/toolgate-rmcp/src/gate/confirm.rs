//! Two-step confirmation for tools whose effect class is notify, wake, alert or delete.
//!
//! The first call never executes: the gate asks the server's [`Preflight`](super::Preflight) to
//! prepare the call (a summary that names the concrete operation, and a hash of the content that
//! would be sent or changed), stores a pending action bound to the principal and the canonical
//! arguments, and returns a PREVIEW with a single-use `confirm_token` and the `confirm_summary`.
//! `confirm_action(confirm_token, confirm_summary)` executes it once, after checking: same
//! principal, unused, unexpired, not rejected, the exact summary, rights still held, policy still
//! allowing it, kill switch off, and a fresh preparation whose content hash still matches (if not:
//! `changed_since_preview`, a new preview, and the old token dead). `reject_action` kills a token.

use std::borrow::Cow;
use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};

use crate::checks::PendingAction;
use rmcp::model::{
    CallToolRequestParams, CallToolResponse, CallToolResult, ContentBlock, JsonObject, Tool,
    ToolAnnotations,
};
use rmcp::service::RequestContext;
use rmcp::{ErrorData as McpError, RoleServer, ServerHandler};
use serde_json::{Map, Value, json};
use toolgate_audit::Decision as AuditDecision;
use toolgate_audit::Outcome;
use toolgate_canon::Sha256Digest;
use toolgate_policy::Decision;

use super::call::Admitted;
use super::{CONFIRM_ACTION, Gated, Preparation, REJECT_ACTION, TOOL_NOT_FOUND};
use crate::input::InputShape;
use crate::state::GateState;

/// How the summary of a call without a preflight is written: the tool and its canonical
/// arguments, cut to this many characters.
const MAX_DEFAULT_SUMMARY_CHARS: usize = 600;

impl<H: ServerHandler> Gated<H> {
    /// Prepares `name` with `arguments` (through the preflight, or a generic description) on the
    /// blocking pool.
    async fn prepare(
        &self,
        name: &str,
        arguments: &JsonObject,
        args_digest: Sha256Digest,
    ) -> Result<Preparation, String> {
        let Some(preflight) = self.preflight.clone() else {
            let canonical = toolgate_canon::to_canonical_vec(&Value::Object(arguments.clone()))
                .map(|bytes| String::from_utf8_lossy(&bytes).into_owned())
                .unwrap_or_default();
            let mut summary = format!("call {name} with {canonical}");
            if summary.chars().count() > MAX_DEFAULT_SUMMARY_CHARS {
                summary = summary.chars().take(MAX_DEFAULT_SUMMARY_CHARS).collect();
                summary.push_str(&format!("… (arguments sha256:{args_digest})"));
            }
            return Ok(Preparation {
                summary,
                content_hash: args_digest,
            });
        };
        let tool = name.to_owned();
        let arguments = arguments.clone();
        tokio::task::spawn_blocking(move || preflight.prepare(&tool, &arguments))
            .await
            .map_err(|_| "the preparation task failed".to_owned())?
    }

    /// Stores a pending action and answers with its preview. Nothing is executed.
    #[allow(clippy::too_many_arguments)]
    pub(super) async fn preview(
        &self,
        state: &GateState,
        principal: &str,
        name: &str,
        tool: &Tool,
        arguments: Option<&Map<String, Value>>,
        args_digest: Sha256Digest,
        request_id: String,
        reason: &str,
    ) -> Result<CallToolResponse, McpError> {
        let arguments = arguments.cloned().unwrap_or_default();
        let preparation = match self.prepare(name, &arguments, args_digest).await {
            Ok(preparation) => preparation,
            Err(why) => {
                let entry = self
                    .entry(
                        state,
                        principal,
                        request_id,
                        name,
                        AuditDecision::Deny,
                        Outcome::NotExecuted,
                        args_digest,
                    )
                    .with_reason("confirm.prepare_failed");
                self.record_or_log(entry).await;
                return Ok(error_result_for(
                    &format!(
                        "Error: `{name}` could not be prepared for confirmation ({why}); nothing was executed. Fix the arguments and call it again"
                    ),
                    json!({"error": "prepare_failed", "tool": name}),
                    tool.output_schema.is_some(),
                ));
            }
        };
        let action = PendingAction {
            principal: principal.to_owned(),
            tool: name.to_owned(),
            arguments,
            args_digest,
            content_hash: preparation.content_hash,
            summary: preparation.summary.clone(),
        };
        let issued = match self.pending.prepare(action, SystemTime::now()) {
            Ok(issued) => issued,
            Err(error) => {
                let entry = self
                    .entry(
                        state,
                        principal,
                        request_id,
                        name,
                        AuditDecision::Deny,
                        Outcome::NotExecuted,
                        args_digest,
                    )
                    .with_reason(format!("confirm.{}", error.code()));
                self.record_or_log(entry).await;
                return Ok(error_result_for(
                    &format!("Error: {error}"),
                    json!({"error": error.code(), "tool": name}),
                    tool.output_schema.is_some(),
                ));
            }
        };
        let entry = self
            .entry(
                state,
                principal,
                request_id,
                name,
                AuditDecision::Allow,
                Outcome::Preview,
                args_digest,
            )
            .with_reason(reason);
        if let Err(error) = self.record(entry).await {
            tracing::error!(tool = %name, %error, "could not audit a preview");
            return Err(McpError::internal_error(
                "the preview's audit record could not be written; nothing was executed, call again once the audit log is writable",
                None,
            ));
        }
        let expires_ns = issued
            .expires_at
            .duration_since(UNIX_EPOCH)
            .map(|d| d.as_nanos().to_string())
            .unwrap_or_default();
        let preview = json!({
            "status": if reason == "changed_since_preview" { "changed_since_preview" } else { "preview" },
            "tool": name,
            "confirm_token": issued.token.as_str(),
            "confirm_summary": preparation.summary,
            "expires_at_ns": expires_ns,
            "next": format!("Nothing was executed. To execute exactly this, call {CONFIRM_ACTION} with confirm_token and confirm_summary exactly as given; to cancel, call {REJECT_ACTION}"),
        });
        let text = serde_json::to_string(&preview).unwrap_or_default();
        let mut result = CallToolResult::success(vec![ContentBlock::text(text)]);
        // A tool with an output schema promises that shape for its results; the preview is not
        // that shape, so it travels in the text only.
        if tool.output_schema.is_none() {
            result.structured_content = Some(preview);
        }
        Ok(result.into())
    }

    /// `confirm_action` and `reject_action`.
    pub(super) async fn confirmation_call(
        &self,
        request: CallToolRequestParams,
        context: RequestContext<RoleServer>,
        principal: Arc<str>,
    ) -> Result<CallToolResponse, McpError> {
        let state = self.state.snapshot();
        let name = request.name.to_string();
        let arguments = request.arguments.clone().unwrap_or_default();
        let args_digest = Sha256Digest::of_json_object(&arguments);
        let request_id = format!("rpc:{}", context.id);
        let refuse = |reason: String, outcome: Outcome| {
            self.entry(
                &state,
                &principal,
                request_id.clone(),
                &name,
                AuditDecision::Deny,
                outcome,
                args_digest,
            )
            .with_reason(reason)
        };
        if !self.offers_confirmation(&state, &principal) {
            self.record_or_log(refuse("unknown_tool".to_owned(), Outcome::NotExecuted))
                .await;
            return Err(McpError::invalid_params(TOOL_NOT_FOUND, None));
        }
        let tool = confirmation_tool(&name);
        let input = InputShape::of_schema(&tool.input_schema);
        if let Some(refusal) = input.problem(&name, Some(&arguments)).or_else(|| {
            self.schemas
                .check(&name, &tool.input_schema, Some(&arguments))
                .err()
        }) {
            self.record_or_log(refuse(refusal.rule.clone(), Outcome::NotExecuted))
                .await;
            return Ok(refusal.into_result("", false).into());
        }
        let token = arguments
            .get("confirm_token")
            .and_then(Value::as_str)
            .unwrap_or_default();
        let now = SystemTime::now();

        if name == REJECT_ACTION {
            return match self.pending.reject(token, &principal, now) {
                Ok(action) => {
                    let entry = self
                        .entry(
                            &state,
                            &principal,
                            request_id.clone(),
                            &action.tool,
                            AuditDecision::Deny,
                            Outcome::Rejected,
                            action.args_digest,
                        )
                        .with_reason("confirm.rejected");
                    self.record_or_log(entry).await;
                    let body = json!({"status": "rejected", "tool": action.tool});
                    let mut result = CallToolResult::success(vec![ContentBlock::text(
                        serde_json::to_string(&body).unwrap_or_default(),
                    )]);
                    result.structured_content = Some(body);
                    Ok(result.into())
                }
                Err(error) => {
                    self.record_or_log(refuse(
                        format!("confirm.{}", error.code()),
                        Outcome::NotExecuted,
                    ))
                    .await;
                    Ok(error_result(
                        &format!("Error: {error}"),
                        json!({"error": error.code()}),
                    ))
                }
            };
        }

        if let Some(error) = self.halted() {
            self.record_or_log(refuse("kill_switch".to_owned(), Outcome::NotExecuted))
                .await;
            return Err(error);
        }
        let summary = arguments
            .get("confirm_summary")
            .and_then(Value::as_str)
            .unwrap_or_default();
        let action = match self.pending.confirm(token, summary, &principal, now) {
            Ok(action) => action,
            Err(error) => {
                self.record_or_log(refuse(
                    format!("confirm.{}", error.code()),
                    Outcome::NotExecuted,
                ))
                .await;
                return Ok(error_result(
                    &format!("Error: {error}"),
                    json!({"error": error.code()}),
                ));
            }
        };
        // The token is spent from here on. Everything is checked again against the state now.
        let policy = Arc::clone(&state.policy);
        let tool_name = action.tool.clone();
        let denied = |reason: String| {
            self.entry(
                &state,
                &principal,
                request_id.clone(),
                &tool_name,
                AuditDecision::Deny,
                Outcome::NotExecuted,
                action.args_digest,
            )
            .with_reason(reason)
        };
        let decision = policy.decide_for(&principal, &action.tool, Some(&action.arguments));
        let still = match (&decision, self.inner.get_tool(&action.tool)) {
            (Decision::Allow, Some(tool)) => match self.rights_refusal(&principal, &action.tool) {
                None => Some(tool),
                Some(reason) => {
                    self.record_or_log(denied(format!("confirm.{reason}")))
                        .await;
                    None
                }
            },
            (_, _) => {
                self.record_or_log(denied(format!("confirm.{}", decision.rule())))
                    .await;
                None
            }
        };
        let Some(tool) = still else {
            return Ok(error_result(
                "Error: the confirmed action is no longer allowed (policy or rights changed since the preview); nothing was executed",
                json!({"error": "no_longer_allowed", "tool": action.tool}),
            ));
        };
        let fresh = match self
            .prepare(&action.tool, &action.arguments, action.args_digest)
            .await
        {
            Ok(fresh) => fresh,
            Err(why) => {
                self.record_or_log(denied("confirm.prepare_failed".to_owned()))
                    .await;
                return Ok(error_result(
                    &format!(
                        "Error: the confirmed action could not be prepared again ({why}); nothing was executed. Call the tool again for a new preview"
                    ),
                    json!({"error": "prepare_failed", "tool": action.tool}),
                ));
            }
        };
        if fresh.content_hash != action.content_hash {
            // What would be sent changed since the person saw it: a new preview, the old token dead.
            self.record_or_log(denied("confirm.changed_since_preview".to_owned()))
                .await;
            return self
                .preview(
                    &state,
                    &principal,
                    &action.tool,
                    &tool,
                    Some(&action.arguments),
                    action.args_digest,
                    request_id.clone(),
                    "changed_since_preview",
                )
                .await;
        }
        let mut call = CallToolRequestParams::new(Cow::Owned(action.tool.clone()));
        call.arguments = Some(action.arguments.clone());
        let admitted = Admitted {
            input: InputShape::of_schema(&tool.input_schema),
            state,
            name: action.tool.clone(),
            request_id: self.request_id(Some(&action.arguments), &tool, &context.id),
            tool,
            args_digest: action.args_digest,
            principal,
            rule: "confirmed".to_owned(),
        };
        self.execute(admitted, call, context).await
    }

    /// Whether the principal can see some tool that needs confirmation (then the gate lists and
    /// accepts `confirm_action` and `reject_action`).
    pub(super) fn offers_confirmation(&self, state: &GateState, principal: &str) -> bool {
        let policy = &state.policy;
        policy.effect_classes().any(|(tool, class)| {
            class.needs_confirmation()
                && policy.visible_for(principal, tool)
                && self.inner.get_tool(tool).is_some()
                && self.rights_refusal(principal, tool).is_none()
        })
    }

    async fn record_or_log(&self, entry: toolgate_audit::AuditEntry) {
        if let Err(error) = self.record(entry).await {
            tracing::error!(%error, "could not audit a confirmation step");
        }
    }
}

/// An error result whose last text line is `details` (JSON); `structuredContent` repeats it
/// unless the tool answered for has an output schema (see `refusal.rs`).
fn error_result_for(text: &str, details: Value, has_output_schema: bool) -> CallToolResponse {
    let line = serde_json::to_string(&details).unwrap_or_default();
    let mut result = CallToolResult::error(vec![ContentBlock::text(format!("{text}\n{line}"))]);
    if !has_output_schema {
        result.structured_content = Some(details);
    }
    result.into()
}

/// An error result of the gate's own confirmation tools (which have no output schema).
fn error_result(text: &str, details: Value) -> CallToolResponse {
    error_result_for(text, details, false)
}

/// The definitions of the gate's own confirmation tools.
pub(super) fn confirmation_tool(name: &str) -> Tool {
    let reject = name == REJECT_ACTION;
    let mut properties = Map::new();
    properties.insert(
        "confirm_token".to_owned(),
        json!({"type": "string", "pattern": "^[0-9a-f]{64}$", "description": "The confirm_token of the preview."}),
    );
    if !reject {
        properties.insert(
            "confirm_summary".to_owned(),
            json!({"type": "string", "description": "The confirm_summary of the preview, exactly as given."}),
        );
    }
    let required: Vec<&str> = if reject {
        vec!["confirm_token"]
    } else {
        vec!["confirm_token", "confirm_summary"]
    };
    let mut schema = Map::new();
    schema.insert("type".to_owned(), json!("object"));
    schema.insert("properties".to_owned(), Value::Object(properties));
    schema.insert("required".to_owned(), json!(required));
    schema.insert("additionalProperties".to_owned(), Value::Bool(false));
    let description = if reject {
        "Cancel a previewed action: its confirm_token can no longer be used."
    } else {
        "Execute a previewed action exactly once. Pass the confirm_token and the confirm_summary of the preview exactly as given; show the summary to the person who approves it first."
    };
    let annotations = if reject {
        ToolAnnotations::new()
            .read_only(false)
            .destructive(false)
            .idempotent(true)
            .open_world(false)
    } else {
        ToolAnnotations::new()
            .read_only(false)
            .destructive(true)
            .idempotent(false)
            .open_world(true)
    };
    Tool::new(
        Cow::Owned(name.to_owned()),
        Cow::Borrowed(description),
        Arc::new(schema),
    )
    .annotate(annotations)
}
