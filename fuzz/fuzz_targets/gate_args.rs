//! The gate's argument handling (step 4 of the tools/call pipeline: input shape, policy argument
//! rules, JSON Schema, path containment, and the refusal it renders), through
//! `toolgate_rmcp::fuzzing`, with the reference policy `fixtures/policies/full.json` and fixed tool
//! schemas. The first byte picks the tool, the second the principal (low seven bits) and whether
//! the tool declares an output schema (high bit), the rest is the `arguments` JSON. Properties: no
//! panic; a tool is refused as a whole exactly when the policy hides it; a refusal's text starts
//! with `Error:` and ends with a JSON line whose `rule` is the audited rule, equal to its
//! `structuredContent` when the tool has no output schema and with no `structuredContent` when it
//! has one; refusals never echo argument values (with ASCII policy and
//! schemas, the only non-ASCII character a refusal may contain is the policy's `…`); admitted
//! arguments satisfy the policy and an independently compiled JSON Schema validator; the verdict
//! is the same with a warm validator cache.
#![no_main]

use std::sync::{Arc, OnceLock};

use libfuzzer_sys::fuzz_target;
use serde_json::{Map, Value, json};
use toolgate_contract::lockfile::Lockfile;
use toolgate_policy::Policy;
use toolgate_rmcp::fuzzing::{ArgumentChecker, ArgumentsOutcome};

const POLICY: &str = include_str!("../../fixtures/policies/full.json");
const LOCK: &str = include_str!("../../toolgate.lock");
const PRINCIPALS: &[&str] = &["anonymous", "alice@example.com", "ci-bot"];

/// A tool of the reference contract: its name, input schema and compiled validator.
type FixtureTool = (String, Arc<Map<String, Value>>, jsonschema::Validator);

struct Fixture {
    policy: Policy,
    tools: Vec<FixtureTool>,
    checker: ArgumentChecker,
}

fn as_object(value: Value) -> Map<String, Value> {
    match value {
        Value::Object(map) => map,
        _ => panic!("a schema is an object"),
    }
}

fn fixture() -> &'static Fixture {
    static FIXTURE: OnceLock<Fixture> = OnceLock::new();
    FIXTURE.get_or_init(|| {
        let policy = Policy::from_json(POLICY).expect("the reference policy loads");
        let lock = Lockfile::parse(LOCK).expect("toolgate.lock parses");
        let mut schemas: Vec<(String, Value)> = lock
            .contract()
            .tools
            .iter()
            .map(|(name, tool)| (name.clone(), tool.surface.input_schema().clone()))
            .collect();
        schemas.extend([
            (
                "search_notes".to_owned(),
                json!({
                    "type": "object",
                    "properties": {
                        "query": {"type": "string", "minLength": 1},
                        "limit": {"type": "integer", "minimum": 1, "maximum": 50}
                    },
                    "required": ["query"],
                    "additionalProperties": false
                }),
            ),
            (
                "delete_notes".to_owned(),
                json!({
                    "type": "object",
                    "properties": {
                        "ids": {"type": "array", "items": {"type": ["string", "integer"]}, "maxItems": 100},
                        "filter": {"type": "object", "additionalProperties": {"type": "string"}},
                        "expected_count": {"type": "integer", "minimum": 0}
                    }
                }),
            ),
            (
                "send_reminder".to_owned(),
                json!({
                    "type": "object",
                    "properties": {
                        "minutes": {"type": "integer"},
                        "message": {"type": "string", "maxLength": 280, "pattern": "^[^<>]*$"}
                    },
                    "required": ["minutes"],
                    "additionalProperties": {"type": "string"}
                }),
            ),
            (
                "read_file".to_owned(),
                json!({
                    "type": "object",
                    "properties": {
                        "path": {"type": "string"},
                        "options": {
                            "type": "object",
                            "properties": {"encoding": {"enum": ["utf-8", "base64"]}},
                            "required": ["encoding"],
                            "additionalProperties": false
                        }
                    },
                    "required": ["path"]
                }),
            ),
            (
                "admin_reset".to_owned(),
                json!({
                    "type": "object",
                    "properties": {
                        "scope": {"oneOf": [
                            {"const": "all"},
                            {"type": "array", "items": {"$ref": "#/$defs/id"}, "uniqueItems": true, "minItems": 1}
                        ]},
                        "reason": {"type": "string", "minLength": 3}
                    },
                    "required": ["scope"],
                    "dependentRequired": {"scope": ["reason"]},
                    "$defs": {"id": {"type": "string", "pattern": "^[a-z0-9-]{1,36}$"}}
                }),
            ),
            ("not_a_tool".to_owned(), json!({"type": "object"})),
        ]);
        let tools = schemas
            .into_iter()
            .map(|(name, schema)| {
                let validator = jsonschema::validator_for(&schema).expect("the schema compiles");
                (name, Arc::new(as_object(schema)), validator)
            })
            .collect();
        Fixture {
            policy,
            tools,
            checker: ArgumentChecker::new(),
        }
    })
}

fuzz_target!(|data: &[u8]| {
    let [tool_byte, principal_byte, rest @ ..] = data else {
        return;
    };
    let fixture = fixture();
    let (tool, schema, validator) = &fixture.tools[usize::from(*tool_byte) % fixture.tools.len()];
    let principal = PRINCIPALS[usize::from(*principal_byte & 0x7f) % PRINCIPALS.len()];
    let arguments: Option<Map<String, Value>> = if rest.is_empty() {
        None
    } else {
        match serde_json::from_slice::<Value>(rest) {
            Ok(Value::Object(map)) => Some(map),
            _ => return,
        }
    };
    let arguments = arguments.as_ref();
    let policy = &fixture.policy;

    let verdict = fixture.checker.check(
        policy,
        principal,
        tool,
        schema,
        arguments,
    );
    match &verdict {
        ArgumentsOutcome::ToolRefused(rule) => {
            assert!(
                !policy.visible_for(principal, tool),
                "{tool} refused by {rule} yet visible"
            );
        }
        ArgumentsOutcome::ArgumentsRefused {
            rule,
            text,
            structured,
        } => {
            assert!(policy.visible_for(principal, tool));
            assert!(text.starts_with("Error:"), "{text}");
            let last = text.lines().last().unwrap_or_default();
            let details: Value = serde_json::from_str(last).expect("the last line is JSON");
            assert_eq!(details["rule"].as_str(), Some(rule.as_str()), "{text}");
            let structured = structured
                .as_ref()
                .expect("a refusal carries its details as structuredContent");
            assert_eq!(&details, structured);
            let all = format!("{text}{structured}");
            if let Some(c) = all.chars().find(|c| !c.is_ascii() && *c != '…') {
                panic!("refusal echoes the caller's text ({c:?}): {all}");
            }
        }
        ArgumentsOutcome::Admitted => {
            assert!(policy.visible_for(principal, tool));
            assert!(policy.decide_for(principal, tool, arguments).is_allow());
            let instance = Value::Object(arguments.cloned().unwrap_or_default());
            assert!(validator.is_valid(&instance), "admitted against the schema");
        }
    }
    let again = fixture.checker.check(
        policy,
        principal,
        tool,
        schema,
        arguments,
    );
    assert_eq!(again, verdict, "the verdict changed with a warm cache");
});
