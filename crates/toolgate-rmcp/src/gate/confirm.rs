//! The gate's own tools `confirm_action` and `reject_action`: a previewed action confirmed (run
//! through the whole check sequence again, under the preview's idempotency key) or rejected.

use std::borrow::Cow;
use std::sync::Arc;
use std::time::SystemTime;

use rmcp::model::{CallToolRequestParams, CallToolResponse, CallToolResult, ContentBlock};
use rmcp::service::RequestContext;
use rmcp::{ErrorData as McpError, RoleServer, ServerHandler};
use serde_json::{Value, json};
use toolgate_audit::{AuditDecision, Outcome, Reason};
use toolgate_canon::Sha256Digest;

use crate::Gated;
use crate::checks::arguments::InputShape;
use crate::checks::confirmation::{confirmation_tool, error_result};
use crate::state::GateState;
use crate::world::Caller;
use crate::world::{REJECT_ACTION, TOOL_NOT_FOUND};

impl<H: ServerHandler> Gated<H> {
    /// `confirm_action` and `reject_action`.
    pub(crate) async fn confirmation_call(
        &self,
        request: CallToolRequestParams,
        context: RequestContext<RoleServer>,
        caller: Caller,
    ) -> Result<CallToolResponse, McpError> {
        let principal = Arc::clone(&caller.principal);
        let state = self.state.snapshot();
        let name = request.name.to_string();
        let arguments = request.arguments.clone().unwrap_or_default();
        let args_digest = Sha256Digest::of_json_object(&arguments);
        let request_id = format!("rpc:{}", context.id);
        let refuse = |reason: Reason| {
            self.entry(
                &state,
                &caller,
                request_id.clone(),
                &name,
                AuditDecision::Deny,
                Outcome::NotExecuted,
                args_digest,
            )
            .with_reason(reason)
        };
        if !self.offers_confirmation(&state, &caller) {
            self.record_or_log(refuse(Reason::UnknownTool)).await;
            return Err(McpError::invalid_params(TOOL_NOT_FOUND, None));
        }
        let tool = confirmation_tool(&name);
        let input = InputShape::of_schema(&tool.input_schema);
        if let Some(refusal) = input.problem(&name, Some(&arguments)).or_else(|| {
            self.checks
                .arguments
                .schemas
                .check(&name, &tool.input_schema, Some(&arguments))
                .err()
        }) {
            self.record_or_log(refuse(Reason::Rule(refusal.rule.clone())))
                .await;
            return Ok(refusal.into_result("").into());
        }
        let token = arguments
            .get("confirm_token")
            .and_then(Value::as_str)
            .unwrap_or_default();
        let now = SystemTime::now();
        let pending = &self.checks.confirmation.pending;

        if name == REJECT_ACTION {
            return match pending.reject(token, &principal, now) {
                Ok(action) => {
                    let entry = self
                        .entry(
                            &state,
                            &caller,
                            request_id.clone(),
                            &action.tool,
                            AuditDecision::Deny,
                            Outcome::Rejected,
                            action.args_digest,
                        )
                        .with_reason(Reason::Confirm("rejected"));
                    self.record_or_log(entry).await;
                    let body = json!({"status": "rejected", "tool": action.tool});
                    let mut result = CallToolResult::success(vec![ContentBlock::text(
                        serde_json::to_string(&body).unwrap_or_default(),
                    )]);
                    result.structured_content = Some(body);
                    Ok(result.into())
                }
                Err(error) => {
                    self.record_or_log(refuse(Reason::Confirm(error.code())))
                        .await;
                    Ok(error_result(
                        &format!("Error: {error}"),
                        json!({"error": error.code()}),
                    ))
                }
            };
        }

        // Checked before the token is spent, so a halt does not cost the person their preview.
        if let Some(error) = self
            .checks
            .kill_switch
            .halted(caller.credential.as_ref().and_then(|c| c.tenant()))
        {
            self.record_or_log(refuse(Reason::KillSwitch)).await;
            return Err(error);
        }
        let summary = arguments
            .get("confirm_summary")
            .and_then(Value::as_str)
            .unwrap_or_default();
        let action = match pending.confirm(token, summary, &principal, now) {
            Ok(action) => action,
            Err(error) => {
                self.record_or_log(refuse(Reason::Confirm(error.code())))
                    .await;
                return Ok(error_result(
                    &format!("Error: {error}"),
                    json!({"error": error.code()}),
                ));
            }
        };
        // The token is spent from here on. The call goes through every check again, against
        // the state now.
        let Some(tool) = self.inner.get_tool(&action.tool) else {
            self.record_or_log(refuse(Reason::NoLongerAllowed(Box::new(
                Reason::UnknownTool,
            ))))
            .await;
            return Ok(error_result(
                "Error: the confirmed action is no longer allowed (the tool is gone); nothing was executed",
                json!({"error": "no_longer_allowed", "tool": action.tool}),
            ));
        };
        let mut call = CallToolRequestParams::new(Cow::Owned(action.tool.clone()));
        call.arguments = Some(action.arguments.clone());
        // The confirmed call runs under the idempotency key its preview was asked with, not
        // under one the confirmer picks: a key in confirm_action's own `_meta` is dropped.
        let mut context = context;
        let meta = &mut context.meta.0.0;
        meta.remove(crate::IDEMPOTENCY_KEY_META);
        if let Some(key) = &action.idempotency_key {
            meta.insert(
                crate::IDEMPOTENCY_KEY_META.to_owned(),
                Value::String(key.clone()),
            );
        }
        self.decide(state, &caller, tool, call, context, Some(&action))
            .await
    }

    /// Whether the principal can see some tool that needs confirmation (then the gate lists and
    /// accepts `confirm_action` and `reject_action`).
    pub(crate) fn offers_confirmation(&self, state: &GateState, caller: &Caller) -> bool {
        self.checks
            .confirmation
            .offered(state, |tool| self.listed(state, caller, tool))
    }
}
