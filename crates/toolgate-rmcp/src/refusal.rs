//! The one shape of every argument refusal: an `isError` tool result whose text starts with
//! `Error:`, names the field, the rule and the fix, then the tool's current input contract, and
//! ends with one line of JSON details; `structuredContent` carries the same JSON when the tool
//! declares no `outputSchema`. A tool with an output schema promises that shape for its structured
//! results, and clients validate it even on errors (the official TypeScript SDK turns a mismatch
//! into a protocol error that hides the refusal), so there the details travel in the text only.
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
    /// details as the last line; `structuredContent` too unless the tool has an output schema.
    pub(crate) fn into_result(self, note: &str, has_output_schema: bool) -> CallToolResult {
        let line = serde_json::to_string(&self.details).unwrap_or_else(|_| "{}".to_owned());
        let text = if note.is_empty() {
            format!("{}\n{line}", self.message)
        } else {
            format!("{}\n\n{note}\n{line}", self.message)
        };
        let mut result = CallToolResult::error(vec![ContentBlock::text(text)]);
        if !has_output_schema {
            result.structured_content = Some(self.details);
        }
        result
    }
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
        let result = refusal.clone().into_result("<contract_awareness/>", false);
        let typed = refusal.clone().into_result("", true);
        assert_eq!(
            typed.structured_content, None,
            "a tool with an output schema"
        );
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
    fn only_plain_names_are_quoted() {
        assert_eq!(quotable("request_id"), Some("request_id"));
        assert_eq!(quotable("a b"), None);
        assert_eq!(quotable(&"x".repeat(65)), None);
        assert_eq!(quotable(""), None);
    }
}
