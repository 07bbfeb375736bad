//! Cedar policies checked against the tools they govern (feature `cedar`).
//!
//! toolgate generates a Cedar schema from the tools' input schemas (the ones `toolgate.lock`
//! holds), so a Cedar policy that names an argument a tool does not have, compares a string with
//! a number or names a tool that does not exist is refused when it is loaded, naming the policy
//! and its line, instead of silently never matching. The entity model, in the namespace
//! `Toolgate`:
//!
//! - principal `Toolgate::Caller`: the verified caller, with `channel` (`stdio`, `http`),
//!   `scopes` (a set of strings) and, when its credential names one, `tenant`; a member of
//!   `Toolgate::Role` entities (`principal in Toolgate::Role::"admin"`);
//! - resource `Toolgate::Tool`: the tool, with `read_only` and `destructive` (its annotations, the
//!   spec's defaults when absent) and, when the policy declares one, `effect` (its effect class);
//! - actions: `Toolgate::Action::"tools/list"` (listing a tool: no arguments are known) and one
//!   action per tool, named by the tool (`Toolgate::Action::"delete_booking"`), each a member of
//!   `Toolgate::Action::"tools/call"`; a call's context is `{arguments, now}`: the arguments typed
//!   from the tool's input schema (`context.arguments.amount`; a property the schema does not
//!   require is optional, so a policy tests it with `has` first) and `now`, the time of the call
//!   in seconds since the Unix epoch.
//!
//! JSON Schema types map to Cedar's: `string` (and a string `enum`) to `String`, `integer` to
//! `Long`, `boolean` to `Bool`, `array` to `Set` of its items, `object` to a `Record` of its
//! properties, `$ref` to what it names in the schema's `$defs` / `definitions`, a type list with
//! `null` to the other type. What has no Cedar type (`number`, unions, a schema without a type)
//! is left out of the context, so a policy that reads it is refused as naming an attribute that
//! does not exist.

use std::path::{Path, PathBuf};
use std::str::FromStr as _;

use serde_json::{Map, Value, json};
use toolgate_canon::Sha256Digest;

/// The Cedar namespace of toolgate's entity types and actions.
pub const NAMESPACE: &str = "Toolgate";
/// The action of listing a tool.
pub const LIST_ACTION: &str = "tools/list";
/// The action group every tool's call action belongs to.
pub const CALL_ACTION: &str = "tools/call";

/// The largest Cedar policy file read, in bytes.
pub const MAX_CEDAR_FILE_BYTES: u64 = 4 << 20;

/// How deep `$ref`s and nested objects are followed when typing a tool's arguments; deeper parts
/// are left out of the context.
const MAX_DEPTH: usize = 16;

/// A tool as the Cedar schema sees it: its name and the JSON Schema of its arguments.
#[derive(Debug, Clone, PartialEq)]
pub struct ToolSignature {
    /// The tool's name (the call action's id).
    pub name: String,
    /// The tool's `inputSchema`.
    pub input_schema: Value,
}

/// The Cedar schema (JSON form) of toolgate's entity model for `tools`; see the module
/// documentation. `toolgate-server policy schema` prints it for editors.
pub fn cedar_schema(tools: &[ToolSignature]) -> Value {
    let caller = json!({
        "memberOfTypes": ["Role"],
        "shape": {"type": "Record", "attributes": {
            "channel": {"type": "String"},
            "scopes": {"type": "Set", "element": {"type": "String"}},
            "tenant": {"type": "String", "required": false},
        }},
    });
    let tool = json!({
        "shape": {"type": "Record", "attributes": {
            "read_only": {"type": "Boolean"},
            "destructive": {"type": "Boolean"},
            "effect": {"type": "String", "required": false},
        }},
    });
    let applies = |context: Value| json!({"principalTypes": ["Caller"], "resourceTypes": ["Tool"], "context": context});
    let mut actions = Map::new();
    actions.insert(
        LIST_ACTION.to_owned(),
        json!({"appliesTo": applies(json!({"type": "Record", "attributes": {}}))}),
    );
    actions.insert(CALL_ACTION.to_owned(), json!({}));
    for tool in tools {
        let arguments = record(&tool.input_schema, &tool.input_schema, 0);
        let context = json!({"type": "Record", "attributes": {
            "arguments": arguments,
            "now": {"type": "Long"},
        }});
        actions.insert(
            tool.name.clone(),
            json!({"memberOf": [{"id": CALL_ACTION}], "appliesTo": applies(context)}),
        );
    }
    json!({NAMESPACE: {
        "entityTypes": {"Caller": caller, "Role": {}, "Tool": tool},
        "actions": actions,
    }})
}

/// The Cedar type of the JSON Schema `schema` (inside the tool schema `root`), if it has one.
fn cedar_type(root: &Value, schema: &Value, depth: usize) -> Option<Value> {
    if depth > MAX_DEPTH {
        return None;
    }
    if let Some(reference) = schema.get("$ref").and_then(Value::as_str) {
        let target = reference
            .strip_prefix("#/$defs/")
            .map(|name| ("$defs", name))
            .or_else(|| {
                reference
                    .strip_prefix("#/definitions/")
                    .map(|name| ("definitions", name))
            })
            .and_then(|(section, name)| root.get(section)?.get(name))?;
        return cedar_type(root, target, depth + 1);
    }
    let kind = match schema.get("type") {
        Some(Value::String(kind)) => kind.as_str(),
        // `["integer", "null"]`: the non-null type (a null argument is left out of the context).
        Some(Value::Array(kinds)) => {
            let mut others = kinds
                .iter()
                .filter_map(Value::as_str)
                .filter(|k| *k != "null");
            match (others.next(), others.next()) {
                (Some(kind), None) => kind,
                _ => return None,
            }
        }
        _ if schema
            .get("enum")
            .and_then(Value::as_array)
            .is_some_and(|values| !values.is_empty() && values.iter().all(Value::is_string)) =>
        {
            "string"
        }
        _ => return None,
    };
    Some(match kind {
        "string" => json!({"type": "String"}),
        "integer" => json!({"type": "Long"}),
        "boolean" => json!({"type": "Boolean"}),
        "array" => {
            let items = schema.get("items")?;
            json!({"type": "Set", "element": cedar_type(root, items, depth + 1)?})
        }
        "object" => record(root, schema, depth + 1),
        _ => return None,
    })
}

/// The Cedar record of the JSON Schema object `schema`: its typed properties, each optional
/// unless `required`.
fn record(root: &Value, schema: &Value, depth: usize) -> Value {
    let required: Vec<&str> = schema
        .get("required")
        .and_then(Value::as_array)
        .map(|names| names.iter().filter_map(Value::as_str).collect())
        .unwrap_or_default();
    let mut attributes = Map::new();
    if let Some(properties) = schema.get("properties").and_then(Value::as_object) {
        for (name, property) in properties {
            if let Some(mut kind) = cedar_type(root, property, depth + 1) {
                if !required.contains(&name.as_str()) {
                    kind["required"] = Value::Bool(false);
                }
                attributes.insert(name.clone(), kind);
            }
        }
    }
    json!({"type": "Record", "attributes": attributes})
}

/// One reason a Cedar policy was refused.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CedarProblem {
    /// The policy: its `@id("...")` annotation, else Cedar's positional id (`policy0`, ...).
    pub policy: String,
    /// The line of the file the problem is on, when Cedar points at one.
    pub line: Option<usize>,
    /// What is wrong.
    pub message: String,
}

impl std::fmt::Display for CedarProblem {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.line {
            Some(line) => write!(f, "policy {} (line {line}): {}", self.policy, self.message),
            None => write!(f, "policy {}: {}", self.policy, self.message),
        }
    }
}

/// Why a Cedar policy set could not be loaded. Nothing was loaded; each message names the file.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum CedarError {
    /// The file could not be read.
    #[error("cannot read the Cedar policies {}: {cause}", path.display())]
    Read {
        /// The file.
        path: PathBuf,
        /// What reading it said.
        cause: std::io::Error,
    },
    /// The text is not Cedar.
    #[error("{source_name}: not valid Cedar: {}", join(.problems))]
    Syntax {
        /// The file (or what the text was given as).
        source_name: String,
        /// Each syntax error, with its line.
        problems: Vec<CedarProblem>,
    },
    /// Policies that do not hold for the tools they govern (Cedar's strict validation against
    /// the schema of [`cedar_schema`]).
    #[error(
        "{source_name}: the Cedar policies do not fit the tools ({} problem{}): {}; fix each (the entity model is in docs/policy.md)",
        problems.len(),
        if problems.len() == 1 { "" } else { "s" },
        join(.problems)
    )]
    Invalid {
        /// The file (or what the text was given as).
        source_name: String,
        /// Every problem found, in the order of the file.
        problems: Vec<CedarProblem>,
    },
    /// The schema generated from the tools was refused by Cedar (a tool name Cedar cannot take).
    #[error("cannot build the Cedar schema of the tools: {0}")]
    Schema(String),
}

fn join(problems: &[CedarProblem]) -> String {
    problems
        .iter()
        .map(ToString::to_string)
        .collect::<Vec<_>>()
        .join("; ")
}

/// A Cedar policy set validated against the tools it governs.
#[derive(Debug, Clone)]
pub struct CedarPolicies {
    policies: cedar_policy::PolicySet,
    schema: cedar_policy::Schema,
    digest: Sha256Digest,
}

impl CedarPolicies {
    /// Reads the Cedar policies at `path` (at most [`MAX_CEDAR_FILE_BYTES`]) and validates them
    /// against `tools` ([`CedarPolicies::from_text`]); errors name the file.
    pub fn load(path: &Path, tools: &[ToolSignature]) -> Result<Self, CedarError> {
        let read_error = |cause| CedarError::Read {
            path: path.to_owned(),
            cause,
        };
        let text = toolgate_storage::read_regular_text(
            path,
            MAX_CEDAR_FILE_BYTES,
            toolgate_storage::Symlinks::Follow,
        )
        .map_err(read_error)?
        .ok_or_else(|| read_error(std::io::ErrorKind::NotFound.into()))?;
        Self::from_text(&text, &path.display().to_string(), tools)
    }

    /// Parses `text` (named `source_name` in errors) and validates every policy with Cedar's
    /// strict validator against the schema of `tools`: all problems are reported together, each
    /// with its policy and line.
    pub fn from_text(
        text: &str,
        source_name: &str,
        tools: &[ToolSignature],
    ) -> Result<Self, CedarError> {
        let schema = cedar_policy::Schema::from_json_value(cedar_schema(tools))
            .map_err(|error| CedarError::Schema(error.to_string()))?;
        let policies =
            cedar_policy::PolicySet::from_str(text).map_err(|errors| CedarError::Syntax {
                source_name: source_name.to_owned(),
                problems: errors
                    .iter()
                    .map(|error| CedarProblem {
                        policy: "?".to_owned(),
                        line: first_line(text, error),
                        message: error.to_string(),
                    })
                    .collect(),
            })?;
        let validator = cedar_policy::Validator::new(schema.clone());
        let result = validator.validate(&policies, cedar_policy::ValidationMode::Strict);
        let mut problems: Vec<CedarProblem> = result
            .validation_errors()
            .map(|error| CedarProblem {
                policy: policy_name(&policies, error.policy_id()),
                line: first_line(text, error),
                message: error.to_string(),
            })
            .collect();
        if !problems.is_empty() {
            problems.sort_by_key(|problem| problem.line);
            return Err(CedarError::Invalid {
                source_name: source_name.to_owned(),
                problems,
            });
        }
        Ok(CedarPolicies {
            policies,
            schema,
            digest: Sha256Digest::of(text.as_bytes()),
        })
    }

    /// The SHA-256 of the policy text.
    pub fn digest(&self) -> Sha256Digest {
        self.digest
    }

    /// How many policies the set holds.
    pub fn len(&self) -> usize {
        self.policies.policies().count()
    }

    /// Whether the set holds no policy.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The ids of the policies (their `@id` annotation, else Cedar's positional id), sorted.
    pub fn ids(&self) -> Vec<String> {
        let mut ids: Vec<String> = self
            .policies
            .policies()
            .map(|policy| policy_name(&self.policies, policy.id()))
            .collect();
        ids.sort();
        ids
    }

    /// The schema the policies were validated against.
    pub fn schema(&self) -> &cedar_policy::Schema {
        &self.schema
    }
}

/// A policy's `@id` annotation, else its positional id.
fn policy_name(policies: &cedar_policy::PolicySet, id: &cedar_policy::PolicyId) -> String {
    policies
        .annotation(id, "id")
        .map_or_else(|| id.to_string(), str::to_owned)
}

/// The 1-based line of the first place `error` points at in `text`.
fn first_line(text: &str, error: &dyn miette::Diagnostic) -> Option<usize> {
    let offset = error.labels()?.map(|label| label.offset()).min()?;
    let before = text.get(..offset.min(text.len()))?;
    Some(before.bytes().filter(|b| *b == b'\n').count() + 1)
}
