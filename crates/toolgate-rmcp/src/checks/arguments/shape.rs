//! The top-level shape of a tool's input schema (required and allowed argument names), checked by
//! the gate before dispatch so a malformed call is refused, audited and explained in one place.
//!
//! Unknown arguments are refused unless the schema explicitly admits them (`additionalProperties`
//! `true` or a schema): a misspelt optional argument would otherwise be silently ignored. Deeper
//! validation (types, bounds, nested shapes) is the full JSON Schema check in `schema.rs`.

use rmcp::model::JsonObject;
use serde_json::{Map, Value, json};

use crate::refusal::{Refusal, quotable};

/// Required and allowed top-level arguments of one tool.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct InputShape {
    pub(crate) required: Vec<String>,
    pub(crate) allowed: Vec<String>,
    /// Whether arguments outside `allowed` are refused: unless the schema admits them
    /// explicitly (`additionalProperties: true` or a schema object).
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
            closed: !matches!(
                schema.get("additionalProperties"),
                Some(Value::Bool(true) | Value::Object(_))
            ),
        }
    }

    /// The first problem of `arguments` against this shape, as a refusal that names the
    /// argument and the fix and never echoes a value.
    pub(crate) fn problem(
        &self,
        tool: &str,
        arguments: Option<&Map<String, Value>>,
    ) -> Option<Refusal> {
        let empty = Map::new();
        let arguments = arguments.unwrap_or(&empty);
        if let Some(missing) = self.required.iter().find(|f| !arguments.contains_key(*f)) {
            let fix = format!("add `{missing}` (required: {})", self.required.join(", "));
            return Some(Refusal::argument(
                tool,
                missing,
                "input_schema.required".to_owned(),
                json!({"required": self.required}),
                format!(
                    "Error: `{tool}` requires the argument `{missing}`, which the call did not pass (rule input_schema.required); {fix}"
                ),
                &fix,
            ));
        }
        if self.closed
            && let Some(unknown) = arguments.keys().find(|k| !self.allowed.contains(*k))
        {
            // The unknown name is the caller's own input; quote it only when it is short and
            // plain, so the message cannot be used to reflect arbitrary text back to the model.
            let (shown, field) = match quotable(unknown) {
                Some(name) => (format!("`{name}`"), name.to_owned()),
                None => ("an argument".to_owned(), "(unknown argument)".to_owned()),
            };
            let fix = format!("remove it (allowed: {})", self.allowed.join(", "));
            return Some(Refusal::argument(
                tool,
                &field,
                "input_schema.unknown_argument".to_owned(),
                json!({"allowed": self.allowed}),
                format!(
                    "Error: `{tool}` does not accept {shown} (rule input_schema.unknown_argument); {fix}"
                ),
                &fix,
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
        let refusal = s
            .problem("w", Some(&args(json!({"request_id": "a"}))))
            .expect("missing text");
        let (rule, message) = (refusal.rule, refusal.message);
        assert_eq!(rule, "input_schema.required");
        assert!(
            message.starts_with("Error:") && message.contains("`text`"),
            "{message}"
        );
        let refusal = s
            .problem(
                "w",
                Some(&args(json!({"request_id": "a", "text": "b", "txt": "c"}))),
            )
            .expect("unknown txt");
        assert_eq!(
            refusal.details["constraint"]["allowed"],
            json!(["request_id", "text"])
        );
        let (rule, message) = (refusal.rule, refusal.message);
        assert_eq!(rule, "input_schema.unknown_argument");
        assert!(
            message.contains("`txt`") && message.contains("request_id, text"),
            "{message}"
        );
        let weird = "x".repeat(100);
        let message = s
            .problem(
                "w",
                Some(&args(
                    json!({"request_id": "a", "text": "b", weird.clone(): 1}),
                )),
            )
            .expect("unknown long name")
            .message;
        assert!(!message.contains(&weird));
        assert!(s.problem("w", None).is_some());
    }

    #[test]
    fn unknown_arguments_are_refused_unless_the_schema_admits_them() {
        let silent = shape(json!({"type": "object", "properties": {"a": {}}}));
        assert!(
            silent
                .problem("t", Some(&args(json!({"a": 1, "b": 2}))))
                .is_some()
        );
        assert_eq!(silent.problem("t", Some(&args(json!({"a": 1})))), None);
        assert_eq!(silent.problem("t", None), None);
        for admitted in [json!(true), json!({"type": "integer"})] {
            let open = shape(
                json!({"type": "object", "properties": {"a": {}}, "additionalProperties": admitted}),
            );
            assert_eq!(
                open.problem("t", Some(&args(json!({"a": 1, "b": 2})))),
                None
            );
        }
    }
}
