//! Entry points for the fuzz targets in `fuzz/` (feature `fuzzing`; not a stable API, see
//! `docs/fuzzing.md`).
//!
//! Building a [`crate::Gated`] needs an MCP session for every call, which is too slow to fuzz;
//! [`ArgumentChecker`] runs the same code the gate runs on a call's arguments once the tool is
//! known and allowed (step 3 of `Checks::new`: the argument, path and idempotency-key
//! checks, in that order) and renders the refusal as the gate would (`refusal.rs`).

use std::sync::Arc;

use rmcp::model::JsonObject;
use serde_json::{Map, Value};
use toolgate_policy::{Decision, Policy};

use crate::checks::arguments::{Arguments, InputShape};
use crate::checks::exactly_once::ExactlyOnce;
use crate::checks::paths::PathContainment;
use crate::checks::{Call, Check, Verdict as CheckVerdict};
use crate::gate::contract_note;

/// What the gate does with a call's arguments.
#[derive(Debug, Clone, PartialEq)]
pub enum ArgumentsOutcome {
    /// The policy refuses the tool as a whole for this principal (the gate answers -32602 before
    /// looking at the arguments); the rule that decided.
    ToolRefused(String),
    /// The arguments are refused: the rule recorded in the audit line, and the `isError` tool
    /// result's text and `structuredContent`.
    ArgumentsRefused {
        /// The audit reason.
        rule: String,
        /// The text content of the tool result.
        text: String,
        /// The result's `structuredContent`.
        structured: Option<Value>,
    },
    /// Nothing about the arguments stops the call here (later steps: batch, rate, confirmation).
    Admitted,
}

/// The gate's argument checks with a validator cache, as one `Gated` holds them.
#[derive(Debug, Default)]
pub struct ArgumentChecker {
    arguments: Arguments,
}

impl ArgumentChecker {
    /// An empty validator cache.
    pub fn new() -> Self {
        Self::default()
    }

    /// Decides the arguments of a call of `tool` (whose input schema is `input_schema`) by
    /// `principal` under `policy`.
    pub fn check(
        &self,
        policy: &Policy,
        principal: &str,
        tool: &str,
        input_schema: &Arc<JsonObject>,
        arguments: Option<&Map<String, Value>>,
    ) -> ArgumentsOutcome {
        let decision = policy.decide_for(principal, tool, arguments);
        if let Decision::DenyTool(denial) = &decision {
            return ArgumentsOutcome::ToolRefused(denial.rule());
        }
        let input = InputShape::of_schema(input_schema);
        let tool_definition =
            rmcp::model::Tool::new(tool.to_owned(), String::new(), Arc::clone(input_schema));
        let state = crate::state::GateState {
            policy: Arc::new(policy.clone()),
            contract_digest: None,
            tool_contract_digests: Default::default(),
            tools: None,
            cedar: None,
        };
        let meta = rmcp::model::RequestMetaObject::default();
        let caller = crate::world::Caller {
            principal: std::sync::Arc::from(principal),
            credential: None,
            client: None,
        };
        let call = Call {
            state: &state,
            principal,
            caller: &caller,
            tenant: None,
            name: tool,
            tool: &tool_definition,
            input: &input,
            arguments,
            owned: &Map::new(),
            sent: arguments,
            meta: &meta,
            decision: &decision,
            cedar_policies: Default::default(),
            cedar_view: Default::default(),
            args_digest: toolgate_canon::Sha256Digest::of_json_object(
                arguments.unwrap_or(&Map::new()),
            ),
            confirmed: None,
        };
        let checks: [&dyn Check; 3] = [&self.arguments, &PathContainment, &ExactlyOnce::default()];
        let Some(refusal) = checks.iter().find_map(|check| match check.admit(&call) {
            CheckVerdict::Refuse(refusal) => Some(refusal),
            _ => None,
        }) else {
            return ArgumentsOutcome::Admitted;
        };
        let rule = refusal.rule.clone();
        let result = refusal.into_result(&contract_note(tool, &input, &[]));
        let text = result
            .content
            .iter()
            .filter_map(|block| block.as_text().map(|t| t.text.clone()))
            .collect::<Vec<_>>()
            .join("\n");
        ArgumentsOutcome::ArgumentsRefused {
            rule,
            text,
            structured: result.structured_content,
        }
    }
}
