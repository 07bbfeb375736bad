//! Validation of every call's arguments against the tool's `inputSchema` (rmcp does not validate),
//! with the `jsonschema` crate. Validators are compiled once per tool and schema and cached.
//!
//! Refusals name the argument (its JSON pointer in the arguments), the schema keyword and the
//! keyword's value from the schema, never the argument's value.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};

use rmcp::model::JsonObject;
use serde_json::{Map, Value, json};

use crate::refusal::{Refusal, quotable};

/// Compiled JSON Schema validators, keyed by tool name; an entry is reused while the tool's
/// schema is equal. The gate checks arguments with it; a proxy checks its upstream's results
/// against their pinned output schemas with the same cache.
#[derive(Default)]
pub struct SchemaCache {
    validators: Mutex<HashMap<String, Compiled>>,
}

impl std::fmt::Debug for SchemaCache {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SchemaCache").finish_non_exhaustive()
    }
}

#[derive(Clone)]
struct Compiled {
    schema: Arc<JsonObject>,
    validator: Result<Arc<jsonschema::Validator>, String>,
}

impl SchemaCache {
    /// Checks `arguments` (absent = `{}`) against `schema`. `Err` is the refusal of the first
    /// violation in the validator's order.
    pub(crate) fn check(
        &self,
        tool: &str,
        schema: &Arc<JsonObject>,
        arguments: Option<&Map<String, Value>>,
    ) -> Result<(), Refusal> {
        let compiled = self.compiled(tool, schema);
        let validator = match compiled.validator {
            Ok(validator) => validator,
            Err(reason) => {
                // The server's own schema is broken: fail closed and say whose fix it is.
                return Err(Refusal {
                    rule: "input_schema.invalid".to_owned(),
                    message: format!(
                        "Error: the input schema of `{tool}` cannot be compiled ({reason}), so no call of it can be validated; nothing was executed. The server's author must fix the tool's inputSchema"
                    ),
                    details: json!({
                        "error": "schema_invalid",
                        "tool": tool,
                        "rule": "input_schema.invalid",
                        "fix": "the server's author must fix the tool's inputSchema",
                    }),
                });
            }
        };
        let instance = Value::Object(arguments.cloned().unwrap_or_default());
        // The boolean check allocates no error iterators; the first error is looked for only
        // when there is one.
        if validator.is_valid(&instance) {
            return Ok(());
        }
        match validator.iter_errors(&instance).next() {
            Some(error) => Err(refusal(tool, schema, &error)),
            // Invalid without a first error would be the validator contradicting itself: the
            // call is refused all the same (fail closed), without a keyword to name.
            None => Err(Refusal {
                rule: "input_schema.invalid".to_owned(),
                message: format!(
                    "Error: the arguments of `{tool}` do not match its input schema; nothing was executed. Check them against the tool's inputSchema"
                ),
                details: json!({
                    "error": "invalid_arguments",
                    "tool": tool,
                    "rule": "input_schema.invalid",
                }),
            }),
        }
    }

    /// The validator of `tool`'s `schema`, compiled on first use; `Err` names why the schema does
    /// not compile.
    pub fn validator(
        &self,
        tool: &str,
        schema: &Arc<JsonObject>,
    ) -> Result<Arc<jsonschema::Validator>, String> {
        self.compiled(tool, schema).validator
    }

    fn compiled(&self, tool: &str, schema: &Arc<JsonObject>) -> Compiled {
        let mut validators = self
            .validators
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        if let Some(found) = validators.get(tool)
            && (Arc::ptr_eq(&found.schema, schema) || *found.schema == **schema)
        {
            return found.clone();
        }
        let validator = jsonschema::validator_for(&Value::Object((**schema).clone()))
            .map(Arc::new)
            .map_err(|e| e.masked().to_string());
        let compiled = Compiled {
            schema: Arc::clone(schema),
            validator,
        };
        validators.insert(tool.to_owned(), compiled.clone());
        compiled
    }
}

/// The argument a violation is about: the instance path without its leading `/` (`(arguments)`
/// for the arguments object itself), quoted only when plain.
fn field_of(error: &jsonschema::ValidationError<'_>) -> String {
    if let jsonschema::error::ValidationErrorKind::Required { property } = error.kind() {
        let parent = error.instance_path().as_str().trim_start_matches('/');
        let name = property.as_str().unwrap_or("(property)");
        let joined = if parent.is_empty() {
            name.to_owned()
        } else {
            format!("{parent}/{name}")
        };
        return quotable(&joined)
            .unwrap_or("(a nested argument)")
            .to_owned();
    }
    let path = error.instance_path().as_str().trim_start_matches('/');
    if path.is_empty() {
        "(arguments)".to_owned()
    } else {
        quotable(path).unwrap_or("(a nested argument)").to_owned()
    }
}

fn refusal(tool: &str, schema: &JsonObject, error: &jsonschema::ValidationError<'_>) -> Refusal {
    let keyword = error.kind().keyword().to_owned();
    let field = field_of(error);
    let schema_path = error.schema_path().as_str().to_owned();
    // The keyword's value as the schema states it (e.g. 2000 for maxLength); large values (a
    // whole sub-schema) are summarised by their path.
    let stated = Value::Object(schema.clone())
        .pointer(&schema_path)
        .cloned()
        .filter(|v| v.to_string().len() <= 512);
    let constraint = json!({ "keyword": keyword, "schema_path": schema_path, "value": stated });
    let rule = format!("input_schema.{keyword}");
    let fix = match keyword.as_str() {
        "required" => format!("add the argument `{field}`"),
        "type" => match &stated {
            Some(expected) => format!("pass `{field}` as JSON type {expected}"),
            None => format!("pass `{field}` with the type the schema states"),
        },
        "additionalProperties" | "unevaluatedProperties" => {
            format!("remove the properties of `{field}` that its schema does not declare")
        }
        _ => match &stated {
            Some(value) => {
                format!("change `{field}` so that it satisfies `{keyword}` = {value}")
            }
            None => format!("change `{field}` so that it satisfies `{keyword}` at {schema_path}"),
        },
    };
    let message = format!(
        "Error: argument `{field}` of `{tool}` breaks input schema rule {rule} (schema path {schema_path}); {fix}"
    );
    Refusal::argument(tool, &field, rule, constraint, message, &fix)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn schema(value: Value) -> Arc<JsonObject> {
        match value {
            Value::Object(map) => Arc::new(map),
            _ => panic!("schema must be an object"),
        }
    }

    fn args(value: Value) -> Map<String, Value> {
        match value {
            Value::Object(map) => map,
            _ => panic!("arguments must be an object"),
        }
    }

    fn notes_schema() -> Arc<JsonObject> {
        schema(json!({
            "type": "object",
            "properties": {
                "request_id": {"type": "string", "minLength": 8},
                "count": {"type": "integer", "maximum": 10},
                "tags": {"type": "array", "items": {"type": "string"}, "maxItems": 2},
                "nested": {"type": "object", "properties": {"x": {"type": "string"}}, "required": ["x"]}
            },
            "required": ["request_id"]
        }))
    }

    fn refused(value: Value) -> Refusal {
        SchemaCache::default()
            .check("notes", &notes_schema(), Some(&args(value)))
            .expect_err("must be refused")
    }

    #[test]
    fn valid_arguments_pass_and_the_validator_is_cached() {
        let cache = SchemaCache::default();
        let s = notes_schema();
        for _ in 0..2 {
            assert_eq!(
                cache.check(
                    "notes",
                    &s,
                    Some(&args(json!({"request_id": "abcdefgh", "count": 3})))
                ),
                Ok(())
            );
        }
        assert_eq!(
            cache
                .validators
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .len(),
            1
        );
    }

    #[test]
    fn each_keyword_names_field_rule_and_fix_without_the_value() {
        let secret = "s3cr3t-value";
        let cases = [
            (json!({"request_id": 5}), "request_id", "input_schema.type"),
            (
                json!({"request_id": "short"}),
                "request_id",
                "input_schema.minLength",
            ),
            (json!({}), "request_id", "input_schema.required"),
            (
                json!({"request_id": "abcdefgh", "count": 11}),
                "count",
                "input_schema.maximum",
            ),
            (
                json!({"request_id": "abcdefgh", "tags": [secret, "b", "c"]}),
                "tags",
                "input_schema.maxItems",
            ),
            (
                json!({"request_id": "abcdefgh", "tags": [secret, 1]}),
                "tags/1",
                "input_schema.type",
            ),
            (
                json!({"request_id": "abcdefgh", "nested": {"y": secret}}),
                "nested/x",
                "input_schema.required",
            ),
        ];
        for (arguments, field, rule) in cases {
            let refusal = refused(arguments.clone());
            assert_eq!(refusal.rule, rule, "{arguments}");
            assert_eq!(refusal.details["field"], field, "{arguments}");
            assert!(refusal.message.starts_with("Error:"), "{}", refusal.message);
            assert!(
                refusal.message.contains(&format!("`{field}`")),
                "{}",
                refusal.message
            );
            let all = format!("{} {}", refusal.message, refusal.details);
            assert!(!all.contains(secret), "{all}");
            assert!(!all.contains("short"), "{all}");
        }
        let refusal = refused(json!({"request_id": "abcdefgh", "count": 11}));
        assert_eq!(refusal.details["constraint"]["value"], 10);
    }

    #[test]
    fn an_uncompilable_schema_fails_closed() {
        let broken = schema(json!({"type": "object", "properties": {"a": {"type": 12}}}));
        let refusal = SchemaCache::default()
            .check("t", &broken, None)
            .expect_err("fails closed");
        assert_eq!(refusal.rule, "input_schema.invalid");
    }

    #[test]
    fn a_changed_schema_is_recompiled() {
        let cache = SchemaCache::default();
        let loose = schema(json!({"type": "object"}));
        let strict = schema(json!({"type": "object", "required": ["a"]}));
        assert_eq!(cache.check("t", &loose, None), Ok(()));
        assert!(cache.check("t", &strict, None).is_err());
    }
}
