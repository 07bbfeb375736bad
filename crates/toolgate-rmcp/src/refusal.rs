//! The one shape of every argument refusal: an `isError` tool result whose text starts with
//! `Error:`, names the field, the rule and the fix, then the tool's current input contract, and
//! ends with one line of JSON details; `structuredContent` carries the same JSON. Clients validate
//! structured results against the tool's listed `outputSchema` even on errors (the official
//! TypeScript SDK turns a mismatch into a protocol error that hides the refusal, the Python SDK
//! raises), so the gate lists every output schema extended with the shapes of its own results
//! ([`admit_gate_results`]).
//!
//! Refusals never echo argument values: the caller already has them, and a refusal that quotes
//! them would let a model reflect arbitrary text through the server (and into logs).

use rmcp::model::{CallToolResult, ContentBlock};
use serde_json::{Value, json};

/// A call refused before dispatch because of its arguments (or a guard), with the rule that
/// decided (recorded as the audit line's `reason`).
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Refusal {
    /// The rule id, e.g. `arg_rules.write_note.text.max_len` or `input_schema.type`.
    pub(crate) rule: String,
    /// Starts with `Error:`; names the field, the rule and the fix; no values.
    pub(crate) message: String,
    /// A JSON object with at least `error`, `rule` and `fix`.
    pub(crate) details: Value,
}

impl Refusal {
    /// A refusal whose details are `{"error": kind, "tool", "field", "rule", "constraint", "fix"}`.
    pub(crate) fn argument(
        tool: &str,
        field: &str,
        rule: String,
        constraint: Value,
        message: String,
        fix: &str,
    ) -> Self {
        let details = json!({
            "error": "argument_rejected",
            "tool": tool,
            "field": field,
            "rule": rule,
            "constraint": constraint,
            "fix": fix,
        });
        Refusal {
            rule,
            message,
            details,
        }
    }

    /// The tool result: message, a blank line, `note` (the contract block, may be empty), and the
    /// details as the last line; `structuredContent` is the details.
    pub(crate) fn into_result(self, note: &str) -> CallToolResult {
        let line = serde_json::to_string(&self.details).unwrap_or_else(|_| "{}".to_owned());
        let text = if note.is_empty() {
            format!("{}\n{line}", self.message)
        } else {
            format!("{}\n\n{note}\n{line}", self.message)
        };
        let mut result = CallToolResult::error(vec![ContentBlock::text(text)]);
        result.structured_content = Some(self.details);
        result
    }
}

/// The shapes of the results the gate itself answers for a tool (see `GATE_RESULTS` below).
fn gate_results_schema() -> Value {
    json!({
        "type": "object",
        "description": "An answer of the toolgate gate instead of the tool's own result: a refusal or error (`error` names it, `fix` says what to do), or a confirmation preview (`status`, `confirm_token`, `confirm_summary`).",
        "properties": {
            "error": {"type": "string"},
            "rule": {"type": "string"},
            "fix": {"type": "string"},
            "status": {"type": "string"},
            "confirm_token": {"type": "string"},
            "confirm_summary": {"type": "string"},
        },
        "anyOf": [{"required": ["error"]}, {"required": ["status", "confirm_token"]}],
    })
}

/// Applies `rewrite` to `tool`'s output schema, if it has one (for `Check::describe`).
pub(crate) fn rewrite_output_schema(
    tool: &mut rmcp::model::Tool,
    rewrite: impl FnOnce(&mut serde_json::Value),
) {
    if let Some(schema) = tool.output_schema.as_mut() {
        let mut rewritten = serde_json::Value::Object(schema.as_ref().clone());
        rewrite(&mut rewritten);
        if let serde_json::Value::Object(map) = rewritten {
            *schema = std::sync::Arc::new(map);
        }
    }
}

/// Extends a listed tool's `outputSchema` so it also admits the gate's own answers (refusals,
/// previews, exactly-once conflicts), which carry their JSON as `structuredContent` too:
/// `{"type": "object", "anyOf": [<the tool's schema>, <the gate's shapes>]}`, with the tool's
/// `$schema`, `$defs` and `definitions` kept at the root so its `$ref`s still resolve. A tool
/// without an output schema is left alone.
pub(crate) fn admit_gate_results(tool: &mut rmcp::model::Tool) {
    rewrite_output_schema(tool, |schema| {
        let Value::Object(own) = schema else {
            return;
        };
        let mut own = std::mem::take(own);
        let mut root = serde_json::Map::new();
        for key in ["$schema", "$defs", "definitions"] {
            if let Some(value) = own.remove(key) {
                root.insert(key.to_owned(), value);
            }
        }
        root.insert("type".to_owned(), json!("object"));
        root.insert(
            "anyOf".to_owned(),
            json!([Value::Object(own), gate_results_schema()]),
        );
        *schema = Value::Object(root);
    });
}

/// `name` when it is short and plain enough to quote back safely, else a neutral description.
/// Argument names are the caller's input when a schema allows arbitrary keys.
pub(crate) fn quotable(name: &str) -> Option<&str> {
    let plain = !name.is_empty()
        && name.len() <= 64
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.' | '/'));
    plain.then_some(name)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn result_ends_with_the_details_line_and_carries_them_structured() {
        let refusal = Refusal::argument(
            "t",
            "f",
            "arg_rules.t.f.max_len".to_owned(),
            json!({"max_len": 3}),
            "Error: argument `f` of `t` is too long (policy rule arg_rules.t.f.max_len); shorten it"
                .to_owned(),
            "shorten `f` to at most 3 characters",
        );
        let result = refusal.clone().into_result("<contract_awareness/>");
        assert_eq!(result.is_error, Some(true));
        assert_eq!(result.structured_content.as_ref(), Some(&refusal.details));
        let text = result.content[0]
            .as_text()
            .map(|t| t.text.clone())
            .unwrap_or_default();
        assert!(text.starts_with("Error:"), "{text}");
        let last: Value =
            serde_json::from_str(text.lines().last().unwrap_or_default()).unwrap_or(Value::Null);
        assert_eq!(last, refusal.details);
        assert!(text.contains("<contract_awareness/>"));
    }

    #[test]
    fn the_listed_output_schema_admits_the_tools_results_and_the_gates_answers() {
        // As schemars writes a `Json<Booking>` tool: a `$ref` into `$defs`, closed objects.
        let schema = json!({
            "$schema": "https://json-schema.org/draft/2020-12/schema",
            "type": "object",
            "properties": {"id": {"type": "string"}, "status": {"$ref": "#/$defs/Status"}},
            "required": ["id", "status"],
            "additionalProperties": false,
            "$defs": {"Status": {"type": "string", "enum": ["confirmed", "cancelled"]}},
        });
        let mut tool = rmcp::model::Tool::new(
            "cancel_booking",
            "",
            std::sync::Arc::new(serde_json::Map::new()),
        );
        tool.output_schema = Some(std::sync::Arc::new(schema.as_object().unwrap().clone()));
        admit_gate_results(&mut tool);
        let listed = Value::Object(tool.output_schema.as_deref().unwrap().clone());
        assert_eq!(
            listed["type"], "object",
            "MCP requires an object schema at the root"
        );
        let validator = jsonschema::validator_for(&listed).unwrap();
        let refusal = Refusal::argument(
            "cancel_booking",
            "id",
            "arg_rules.cancel_booking.id.pattern".to_owned(),
            json!({}),
            "Error: no".to_owned(),
            "fix it",
        )
        .into_result("");
        let preview = json!({"status": "preview", "tool": "cancel_booking", "confirm_token": "ab", "confirm_summary": "s"});
        for admitted in [
            json!({"id": "bk-1", "status": "cancelled"}),
            refusal.structured_content.clone().unwrap(),
            preview,
            json!({"error": "conflict", "fix": "retry"}),
        ] {
            assert!(validator.is_valid(&admitted), "{admitted} against {listed}");
        }
        for refused in [
            json!({"id": "bk-1", "status": "gone"}),
            json!({"id": "bk-1"}),
            json!({"status": "preview"}),
        ] {
            assert!(!validator.is_valid(&refused), "{refused} against {listed}");
        }
        // A tool without an output schema stays without one.
        let mut plain =
            rmcp::model::Tool::new("t", "", std::sync::Arc::new(serde_json::Map::new()));
        admit_gate_results(&mut plain);
        assert!(plain.output_schema.is_none());
    }

    #[test]
    fn only_plain_names_are_quoted() {
        assert_eq!(quotable("request_id"), Some("request_id"));
        assert_eq!(quotable("a b"), None);
        assert_eq!(quotable(&"x".repeat(65)), None);
        assert_eq!(quotable(""), None);
    }
}
