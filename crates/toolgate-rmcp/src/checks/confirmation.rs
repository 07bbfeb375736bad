//! Two-step confirmation for tools whose effect class (the policy's `effects`) is notify, wake,
//! alert or delete.
//!
//! The first call never executes: the check asks the server's [`Preflight`] to prepare the call
//! (a summary that names the concrete operation, and a hash of the content that would be sent or
//! changed), stores a pending action bound to the principal and the canonical arguments
//! (`toolgate_state::PendingActions`), and answers with a PREVIEW carrying a single-use `confirm_token` and the
//! `confirm_summary`. The gate's own tools ([`confirmation_tool`], answered in `gate/confirm.rs`) then answer
//! `confirm_action(confirm_token, confirm_summary)`: same principal, unused, unexpired, not
//! rejected, the exact summary, and the kill switch off; the confirmed call then goes through
//! the whole check sequence again against the state now (rights, policy, arguments, ...), and this
//! check prepares it afresh: a content hash that changed since the preview answers
//! `changed_since_preview` with a new preview (the old token is spent). `reject_action` kills a
//! token.

use std::borrow::Cow;
use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};

use rmcp::model::{
    CallToolResponse, CallToolResult, ContentBlock, JsonObject, Tool, ToolAnnotations,
};
use serde_json::{Map, Value, json};
use toolgate_audit::{AuditDecision, Outcome, Reason};
use toolgate_canon::Sha256Digest;

use super::{Answer, Call, Check, Verdict};
use crate::state::GateState;
use crate::world::{CONFIRM_ACTION, Preflight, Preparation, REJECT_ACTION};
use toolgate_state::{PendingAction, PendingActions};

/// How the summary of a call without a preflight is written: the tool and its canonical
/// arguments, cut to this many characters.
const MAX_DEFAULT_SUMMARY_CHARS: usize = 600;

/// The confirmation check: the pending actions and the server's preparer.
pub(crate) struct Confirmation {
    pub(crate) pending: PendingActions,
    pub(crate) preflight: Option<Arc<dyn Preflight>>,
}

impl Check for Confirmation {
    fn admit<'a>(&'a self, call: &'a Call<'a>) -> Verdict<'a> {
        let needs = call
            .policy()
            .effect_class(call.name)
            .is_some_and(|class| class.needs_confirmation());
        if !needs {
            return Verdict::Pass;
        }
        Verdict::Later(Box::pin(async move {
            // The pending action keeps the arguments as sent (those a check owns included), so
            // the confirmed call goes through every check as the original did; the server
            // prepares the tool's own arguments.
            let arguments = call.sent.cloned().unwrap_or_default();
            let prepared = self
                .prepare(
                    call.caller,
                    call.name,
                    call.arguments.cloned().unwrap_or_default(),
                    &arguments,
                    call.args_digest,
                )
                .await;
            match (call.confirmed, prepared) {
                (None, Ok(preparation)) => {
                    self.preview(call, arguments, preparation, Reason::ConfirmationRequired)
                }
                (Some(action), Ok(fresh)) if fresh.content_hash == action.content_hash => {
                    Verdict::Pass
                }
                // What would be sent changed since the person saw it: a new preview (the old
                // token is spent).
                (Some(_), Ok(fresh)) => {
                    self.preview(call, arguments, fresh, Reason::ChangedSincePreview)
                }
                (confirmed, Err(why)) => {
                    let text = if confirmed.is_some() {
                        format!(
                            "Error: the confirmed action could not be prepared again ({why}); nothing was executed. Call the tool again for a new preview"
                        )
                    } else {
                        format!(
                            "Error: `{}` could not be prepared for confirmation ({why}); nothing was executed. Fix the arguments and call it again",
                            call.name
                        )
                    };
                    Verdict::Answer(Answer {
                        decision: AuditDecision::Deny,
                        outcome: Outcome::NotExecuted,
                        reason: Reason::Confirm("prepare_failed"),
                        result: error_call_result(
                            &text,
                            json!({"error": "prepare_failed", "tool": call.name}),
                        ),
                        needs_record: false,
                    })
                }
            }
        }))
    }
}

impl Confirmation {
    /// Prepares `name` with the tool's `arguments` (through the preflight on the blocking pool),
    /// or describes it generically with the arguments as `sent`.
    async fn prepare(
        &self,
        caller: &crate::world::Caller,
        name: &str,
        arguments: JsonObject,
        sent: &JsonObject,
        args_digest: Sha256Digest,
    ) -> Result<Preparation, String> {
        let Some(preflight) = self.preflight.clone() else {
            let mut bytes = Vec::new();
            toolgate_canon::write_canonical_object(&mut bytes, sent);
            let canonical = String::from_utf8_lossy(&bytes);
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
        let (tool, caller) = (name.to_owned(), caller.clone());
        tokio::task::spawn_blocking(move || preflight.prepare(&caller, &tool, &arguments))
            .await
            .map_err(|_| "the preparation task failed".to_owned())?
    }

    /// Stores a pending action and answers with its preview. Nothing is executed.
    fn preview<'a>(
        &self,
        call: &Call<'_>,
        arguments: JsonObject,
        preparation: Preparation,
        reason: Reason,
    ) -> Verdict<'a> {
        let name = call.name;
        let action = PendingAction {
            principal: call.principal.to_owned(),
            tool: name.to_owned(),
            arguments,
            args_digest: call.args_digest,
            content_hash: preparation.content_hash,
            summary: preparation.summary.clone(),
            idempotency_key: call
                .meta
                .0
                .0
                .get(crate::IDEMPOTENCY_KEY_META)
                .and_then(Value::as_str)
                .map(str::to_owned),
        };
        let issued = match self.pending.prepare(action, SystemTime::now()) {
            Ok(issued) => issued,
            Err(error) => {
                return Verdict::Answer(Answer {
                    decision: AuditDecision::Deny,
                    outcome: Outcome::NotExecuted,
                    reason: Reason::Confirm(error.code()),
                    result: error_call_result(
                        &format!("Error: {error}"),
                        json!({"error": error.code(), "tool": name}),
                    ),
                    needs_record: false,
                });
            }
        };
        let expires_ns = issued
            .expires_at
            .duration_since(UNIX_EPOCH)
            .map(|d| d.as_nanos().to_string())
            .unwrap_or_default();
        let preview = json!({
            "status": if reason == Reason::ChangedSincePreview { "changed_since_preview" } else { "preview" },
            "tool": name,
            "confirm_token": issued.token.as_str(),
            "confirm_summary": preparation.summary,
            "expires_at_ns": expires_ns,
            "next": format!("Nothing was executed. To execute exactly this, call {CONFIRM_ACTION} with confirm_token and confirm_summary exactly as given; to cancel, call {REJECT_ACTION}"),
        });
        let text = serde_json::to_string(&preview).unwrap_or_default();
        let mut result = CallToolResult::success(vec![ContentBlock::text(text)]);
        // The tool's listed output schema admits the preview (`refusal::admit_gate_results`).
        result.structured_content = Some(preview);
        Verdict::Answer(Answer {
            decision: AuditDecision::Allow,
            outcome: Outcome::Preview,
            reason,
            result,
            // The token exists from here on: the preview is given only with its record.
            needs_record: true,
        })
    }

    /// Whether some tool that needs confirmation is `listed` (then the gate lists and accepts
    /// `confirm_action` and `reject_action`).
    pub(crate) fn offered(&self, state: &GateState, listed: impl Fn(&str) -> bool) -> bool {
        state
            .policy
            .effect_classes()
            .any(|(tool, class)| class.needs_confirmation() && listed(tool))
    }
}

/// An error result whose last text line is `details` (JSON), repeated as `structuredContent`
/// (see `refusal.rs`).
fn error_call_result(text: &str, details: Value) -> CallToolResult {
    let line = serde_json::to_string(&details).unwrap_or_default();
    let mut result = CallToolResult::error(vec![ContentBlock::text(format!("{text}\n{line}"))]);
    result.structured_content = Some(details);
    result
}

/// [`error_call_result`] as a response.
pub(crate) fn error_result(text: &str, details: Value) -> CallToolResponse {
    error_call_result(text, details).into()
}

/// The definitions of the gate's own confirmation tools.
pub fn confirmation_tool(name: &str) -> Tool {
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
