//! Execute-verify-stop: a client-side harness that runs one mutation, observes the state that
//! actually remained, and decides what happens next. The harness decides, not the model.
//!
//! The decision table ([`decide`]) is pure and total:
//!
//! | mutation                | observation            | postcondition | compensation | verdict  |
//! |-------------------------|------------------------|---------------|--------------|----------|
//! | JSON-RPC error / failed | (not run)              |               |              | STOP     |
//! | `isError: true`         | (not run)              |               |              | STOP     |
//! | ok                      | error or `isError`     |               |              | STOP     |
//! | ok                      | ok                     | holds         |              | CONTINUE |
//! | ok                      | ok                     | inconclusive  |              | STOP     |
//! | ok                      | ok                     | violated      | registered   | ROLLBACK |
//! | ok                      | ok                     | violated      | none         | STOP     |
//!
//! ROLLBACK is only ever chosen when a compensating call has been registered; the harness then
//! runs it and reports its result. "The tool returned success" is never enough to continue.

use std::fmt;

use rmcp::RoleClient;
use rmcp::model::{CallToolRequestParams, CallToolResult, ContentBlock, JsonObject};
use rmcp::service::{Peer, ServiceError};
use serde_json::Value;

/// One tools/call: a tool name and its arguments.
#[derive(Debug, Clone, PartialEq)]
pub struct ToolCall {
    /// The tool.
    pub name: String,
    /// The arguments object.
    pub arguments: JsonObject,
}

impl ToolCall {
    /// A call of `name` with `arguments` (a JSON object; anything else becomes `{}`).
    pub fn new(name: impl Into<String>, arguments: Value) -> Self {
        let arguments = match arguments {
            Value::Object(map) => map,
            _ => JsonObject::new(),
        };
        ToolCall {
            name: name.into(),
            arguments,
        }
    }

    fn params(&self) -> CallToolRequestParams {
        let mut params = CallToolRequestParams::new(self.name.clone());
        params.arguments = Some(self.arguments.clone());
        params
    }
}

/// What the observation says about the expected state.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Postcondition {
    /// The expected state is observed.
    Holds,
    /// The observed state contradicts the expectation.
    Violated(String),
    /// The observation cannot tell (missing or malformed data).
    Inconclusive(String),
}

/// The harness's decision after one step.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum NextStep {
    /// The postcondition holds: the next mutation may run.
    Continue,
    /// Stop the run: the state is unknown or wrong and no compensation is registered.
    Stop(String),
    /// The state is wrong and a compensating call is registered: run it.
    Rollback(String),
}

impl fmt::Display for NextStep {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            NextStep::Continue => f.write_str("CONTINUE"),
            NextStep::Stop(why) => write!(f, "STOP ({why})"),
            NextStep::Rollback(why) => write!(f, "ROLLBACK ({why})"),
        }
    }
}

/// The result of one tools/call as the harness sees it.
#[derive(Debug, Clone)]
pub enum CallOutcome {
    /// A result (which may carry `isError: true`).
    Result(CallToolResult),
    /// A JSON-RPC error or a transport failure.
    Failed(String),
}

impl CallOutcome {
    fn from_service(result: Result<CallToolResult, ServiceError>) -> Self {
        match result {
            Ok(result) => CallOutcome::Result(result),
            Err(ServiceError::McpError(error)) => CallOutcome::Failed(format!(
                "JSON-RPC error {}: {}",
                error.code.0, error.message
            )),
            Err(error) => CallOutcome::Failed(error.to_string()),
        }
    }

    /// The structured content, or the first text block parsed as JSON.
    pub fn json(&self) -> Option<Value> {
        let CallOutcome::Result(result) = self else {
            return None;
        };
        result.structured_content.clone().or_else(|| {
            result.content.iter().find_map(|block| match block {
                ContentBlock::Text(text) => serde_json::from_str(&text.text).ok(),
                _ => None,
            })
        })
    }

    /// `Some(reason)` when the call failed or returned `isError: true`.
    pub fn failure(&self) -> Option<String> {
        match self {
            CallOutcome::Failed(why) => Some(why.clone()),
            CallOutcome::Result(result) if result.is_error == Some(true) => {
                let text = result
                    .content
                    .iter()
                    .find_map(|block| match block {
                        ContentBlock::Text(text) => Some(text.text.clone()),
                        _ => None,
                    })
                    .unwrap_or_default();
                Some(format!("isError: {text}"))
            }
            CallOutcome::Result(_) => None,
        }
    }
}

/// A check of the observed state; returns whether the expected state holds.
pub type Check = Box<dyn Fn(&Value) -> Postcondition + Send + Sync>;

/// One execute-verify-stop step.
pub struct Step {
    mutation: ToolCall,
    observation: ToolCall,
    check: Check,
    compensation: Option<ToolCall>,
}

impl fmt::Debug for Step {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Step")
            .field("mutation", &self.mutation)
            .field("observation", &self.observation)
            .field("compensation", &self.compensation)
            .finish_non_exhaustive()
    }
}

impl Step {
    /// A step that runs `mutation`, then `observation`, and judges the observation's JSON with
    /// `check`.
    pub fn new(mutation: ToolCall, observation: ToolCall, check: Check) -> Self {
        Step {
            mutation,
            observation,
            check,
            compensation: None,
        }
    }

    /// Registers a tested compensating call. Without one, the harness never chooses ROLLBACK.
    pub fn compensate_with(mut self, compensation: ToolCall) -> Self {
        self.compensation = Some(compensation);
        self
    }
}

/// A ready-made check: the array at JSON pointer `pointer` contains `expected`.
pub fn expect_contains(pointer: &str, expected: Value) -> Check {
    let pointer = pointer.to_owned();
    Box::new(move |observed: &Value| match observed.pointer(&pointer) {
        Some(Value::Array(items)) if items.contains(&expected) => Postcondition::Holds,
        Some(Value::Array(_)) => {
            Postcondition::Violated(format!("{pointer} does not contain the expected value"))
        }
        Some(_) => Postcondition::Inconclusive(format!("{pointer} is not an array")),
        None => Postcondition::Inconclusive(format!("the observation has no {pointer}")),
    })
}

/// The decision table of this module, as a pure function.
pub fn decide(
    mutation: &CallOutcome,
    observation: Option<&CallOutcome>,
    postcondition: Option<&Postcondition>,
    has_compensation: bool,
) -> NextStep {
    if let Some(why) = mutation.failure() {
        return NextStep::Stop(format!("the mutation failed: {why}"));
    }
    let Some(observation) = observation else {
        return NextStep::Stop("the state was not observed".to_owned());
    };
    if let Some(why) = observation.failure() {
        return NextStep::Stop(format!("the observation failed: {why}"));
    }
    match postcondition {
        Some(Postcondition::Holds) => NextStep::Continue,
        Some(Postcondition::Violated(why)) if has_compensation => {
            NextStep::Rollback(format!("postcondition violated: {why}"))
        }
        Some(Postcondition::Violated(why)) => NextStep::Stop(format!(
            "postcondition violated and no compensating action is registered: {why}"
        )),
        Some(Postcondition::Inconclusive(why)) => {
            NextStep::Stop(format!("postcondition inconclusive: {why}"))
        }
        None => NextStep::Stop("the postcondition was not evaluated".to_owned()),
    }
}

/// What happened in one step.
#[derive(Debug, Clone)]
pub struct StepReport {
    /// The mutation's outcome.
    pub mutation: CallOutcome,
    /// The observation's outcome, when it ran.
    pub observation: Option<CallOutcome>,
    /// The postcondition, when it was evaluated.
    pub postcondition: Option<Postcondition>,
    /// The decision.
    pub verdict: NextStep,
    /// The compensating call's outcome, when the verdict was ROLLBACK.
    pub compensation: Option<CallOutcome>,
}

/// Runs `step` against a connected MCP server.
pub async fn run_step(peer: &Peer<RoleClient>, step: &Step) -> StepReport {
    let mutation = CallOutcome::from_service(peer.call_tool(step.mutation.params()).await);
    let (observation, postcondition) = if mutation.failure().is_some() {
        (None, None)
    } else {
        let observation =
            CallOutcome::from_service(peer.call_tool(step.observation.params()).await);
        let postcondition = match (observation.failure(), observation.json()) {
            (Some(_), _) => None,
            (None, Some(json)) => Some((step.check)(&json)),
            (None, None) => Some(Postcondition::Inconclusive(
                "the observation returned no JSON".to_owned(),
            )),
        };
        (Some(observation), postcondition)
    };
    let verdict = decide(
        &mutation,
        observation.as_ref(),
        postcondition.as_ref(),
        step.compensation.is_some(),
    );
    let compensation = match (&verdict, &step.compensation) {
        (NextStep::Rollback(_), Some(call)) => Some(CallOutcome::from_service(
            peer.call_tool(call.params()).await,
        )),
        _ => None,
    };
    StepReport {
        mutation,
        observation,
        postcondition,
        verdict,
        compensation,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn ok(value: Value) -> CallOutcome {
        CallOutcome::Result(CallToolResult::structured(value))
    }

    fn is_error() -> CallOutcome {
        CallOutcome::Result(CallToolResult::error(vec![ContentBlock::text("Error: no")]))
    }

    #[test]
    fn decision_table() {
        let failed = CallOutcome::Failed("JSON-RPC error -32602".into());
        let holds = Postcondition::Holds;
        let violated = Postcondition::Violated("x".into());
        let unsure = Postcondition::Inconclusive("y".into());
        let obs = ok(json!({}));
        let errored = is_error();
        type Row<'a> = (
            &'a CallOutcome,
            Option<&'a CallOutcome>,
            Option<&'a Postcondition>,
            bool,
            &'static str,
        );
        let table: Vec<Row<'_>> = vec![
            (&failed, None, None, true, "STOP"),
            (&errored, None, None, true, "STOP"),
            (&obs, Some(&failed), None, true, "STOP"),
            (&obs, Some(&obs), Some(&holds), false, "CONTINUE"),
            (&obs, Some(&obs), Some(&unsure), true, "STOP"),
            (&obs, Some(&obs), Some(&violated), true, "ROLLBACK"),
            (&obs, Some(&obs), Some(&violated), false, "STOP"),
            (&obs, None, None, true, "STOP"),
        ];
        for (i, (m, o, p, comp, expected)) in table.into_iter().enumerate() {
            let verdict = decide(m, o, p, comp).to_string();
            assert!(
                verdict.starts_with(expected),
                "row {i}: got {verdict}, want {expected}"
            );
        }
    }

    #[test]
    fn expect_contains_judges_the_observation() {
        let check = expect_contains("/notes", json!({"request_id": "a"}));
        assert_eq!(
            check(&json!({"notes": [{"request_id": "a"}]})),
            Postcondition::Holds
        );
        assert!(matches!(
            check(&json!({"notes": []})),
            Postcondition::Violated(_)
        ));
        assert!(matches!(
            check(&json!({"notes": 3})),
            Postcondition::Inconclusive(_)
        ));
        assert!(matches!(check(&json!({})), Postcondition::Inconclusive(_)));
    }

    #[test]
    fn outcome_json_falls_back_to_text() {
        let text = CallOutcome::Result(CallToolResult::success(vec![ContentBlock::text(
            "{\"a\":1}",
        )]));
        assert_eq!(text.json(), Some(json!({"a": 1})));
        assert!(
            is_error()
                .failure()
                .expect("is an error")
                .contains("Error: no")
        );
        assert_eq!(ok(json!({})).failure(), None);
    }
}
