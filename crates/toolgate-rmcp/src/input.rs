//! The top-level shape of a tool's input schema (required and allowed argument names), checked by
//! the gate before dispatch so a malformed call is refused, audited and explained in one place.
//!
//! Deeper validation (types, formats) stays with the handler's deserialization: this check covers
//! the mistakes a model working from a stale contract makes most (a missing or renamed argument).

use rmcp::model::JsonObject;
use serde_json::{Map, Value};

/// Required and allowed top-level arguments of one tool.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct InputShape {
    pub(crate) required: Vec<String>,
    pub(crate) allowed: Vec<String>,
    /// Whether arguments outside `allowed` are refused (`additionalProperties: false`).
    pub(crate) closed: bool,
}

impl InputShape {
    pub(crate) fn of_schema(schema: &JsonObject) -> Self {
        let names = |value: Option<&Value>| -> Vec<String> {
            let mut names: Vec<String> = match value {
                Some(Value::Array(items)) => items
                    .iter()
                    .filter_map(|item| item.as_str().map(str::to_owned))
                    .collect(),
                Some(Value::Object(map)) => map.keys().cloned().collect(),
                _ => Vec::new(),
            };
            names.sort();
            names.dedup();
            names
        };
        InputShape {
            required: names(schema.get("required")),
            allowed: names(schema.get("properties")),
            closed: schema.get("additionalProperties") == Some(&Value::Bool(false)),
        }
    }

    /// The first problem of `arguments` against this shape: the rule that decided and a message
    /// that starts with `Error:`, names the argument and the fix, and never echoes a value.
    pub(crate) fn problem(
        &self,
        tool: &str,
        arguments: Option<&Map<String, Value>>,
    ) -> Option<(String, String)> {
        let empty = Map::new();
        let arguments = arguments.unwrap_or(&empty);
        if let Some(missing) = self.required.iter().find(|f| !arguments.contains_key(*f)) {
            return Some((
                "input_schema.required".to_owned(),
                format!(
                    "Error: `{tool}` requires the argument `{missing}`, which the call did not pass; add it (required: {})",
                    self.required.join(", ")
                ),
            ));
        }
        if self.closed
            && let Some(unknown) = arguments.keys().find(|k| !self.allowed.contains(*k))
        {
            // The unknown name is the caller's own input; quote it only when it is short and
            // plain, so the message cannot be used to reflect arbitrary text back to the model.
            let shown = if unknown.len() <= 64
                && unknown
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-')
            {
                format!("`{unknown}`")
            } else {
                "an argument".to_owned()
            };
            return Some((
                "input_schema.unknown_argument".to_owned(),
                format!(
                    "Error: `{tool}` does not accept {shown}; remove it (allowed: {})",
                    self.allowed.join(", ")
                ),
            ));
        }
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn shape(schema: Value) -> InputShape {
        match schema {
            Value::Object(map) => InputShape::of_schema(&map),
            _ => panic!("schema must be an object"),
        }
    }

    fn args(value: Value) -> Map<String, Value> {
        match value {
            Value::Object(map) => map,
            _ => panic!("arguments must be an object"),
        }
    }

    #[test]
    fn required_and_unknown_arguments() {
        let s = shape(json!({
            "type": "object",
            "properties": {"request_id": {"type": "string"}, "text": {"type": "string"}},
            "required": ["request_id", "text"],
            "additionalProperties": false
        }));
        assert_eq!(
            s.problem("w", Some(&args(json!({"request_id": "a", "text": "b"})))),
            None
        );
        let (rule, message) = s
            .problem("w", Some(&args(json!({"request_id": "a"}))))
            .expect("missing text");
        assert_eq!(rule, "input_schema.required");
        assert!(
            message.starts_with("Error:") && message.contains("`text`"),
            "{message}"
        );
        let (rule, message) = s
            .problem(
                "w",
                Some(&args(json!({"request_id": "a", "text": "b", "txt": "c"}))),
            )
            .expect("unknown txt");
        assert_eq!(rule, "input_schema.unknown_argument");
        assert!(
            message.contains("`txt`") && message.contains("request_id, text"),
            "{message}"
        );
        let weird = "x".repeat(100);
        let (_, message) = s
            .problem(
                "w",
                Some(&args(
                    json!({"request_id": "a", "text": "b", weird.clone(): 1}),
                )),
            )
            .expect("unknown long name");
        assert!(!message.contains(&weird));
        assert!(s.problem("w", None).is_some());
    }

    #[test]
    fn open_schemas_accept_extra_arguments() {
        let s = shape(json!({"type": "object", "properties": {"a": {}}}));
        assert_eq!(s.problem("t", Some(&args(json!({"a": 1, "b": 2})))), None);
        assert_eq!(s.problem("t", None), None);
    }
}
