//! The contract of one tool (four digested sections) and of a whole server.
//!
//! A [`ToolContract`] is derived, never declared: [`ToolContract::build`] computes every section from
//! the tool definition and the handler facts, so the section types have no public constructors and
//! their fields are read through getters. That keeps the digests stored next to the content (schema
//! digests, token economics) consistent by construction; `lockfile::Lockfile::parse` rebuilds the
//! same way and rejects a file whose stored values disagree with the rebuild.
//!
//! Digest layout (documented in `docs/lockfile.md`, so an independent tool can recompute it):
//! - section digest = SHA-256 of the RFC 8785 canonical JSON of the section as written in the lockfile;
//! - tool digest = SHA-256 of canonical `{"behavior":hex,"entitlements":hex,"surface":hex,"tokenEconomics":hex}`;
//! - server digest = SHA-256 of canonical `{"serverName":name,"tools":{tool name: tool digest hex, ...}}`.

use std::collections::BTreeMap;
use std::fmt;

use serde_json::{Map, Value, json};
use toolgate_canon::{Sha256Digest, canonical_value};

use crate::model::{EffectiveAnnotations, Entitlements, HandlerFacts, ToolDefinition};

/// Above this many property definitions a tool's schemas are large enough to cost noticeable context.
const FIELD_COUNT_MEDIUM: u64 = 20;
/// Above this many characters a description costs noticeable context on every `tools/list`.
const DESCRIPTION_CHARS_MEDIUM: usize = 1_000;

/// Why a contract could not be built.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ContractError {
    /// The tool has an empty name.
    #[error("a tool has an empty name; give every tool the name it is listed under in tools/list")]
    EmptyToolName,
    /// The input schema is not a JSON object (MCP requires an object schema for arguments).
    #[error(
        "the input schema of tool `{tool}` is {found}, not a JSON object; declare an object schema such as {{\"type\":\"object\",\"properties\":{{}}}}"
    )]
    InputSchemaNotObject {
        /// The tool.
        tool: String,
        /// The JSON type found instead.
        found: &'static str,
    },
    /// The output schema is present but not a JSON object.
    #[error(
        "the output schema of tool `{tool}` is {found}, not a JSON object; declare an object schema or no output schema"
    )]
    OutputSchemaNotObject {
        /// The tool.
        tool: String,
        /// The JSON type found instead.
        found: &'static str,
    },
    /// A schema does not survive a canonical JSON round trip (for example it nests deeper than
    /// the JSON parser's limit of 128 levels), so a lockfile holding it could not be read back.
    #[error(
        "the {which} schema of tool `{tool}` cannot be stored in toolgate.lock ({reason}); flatten it or move shared parts to $defs"
    )]
    SchemaNotRepresentable {
        /// The tool.
        tool: String,
        /// `"input"` or `"output"`.
        which: &'static str,
        /// The parser's reason.
        reason: String,
    },
    /// The server name is empty.
    #[error("the server name is empty; use the name the server reports in its server info")]
    EmptyServerName,
    /// Two tools share a name.
    #[error(
        "tool `{name}` is defined twice; tool names are unique within a server, rename or remove one"
    )]
    DuplicateTool {
        /// The repeated name.
        name: String,
    },
}

/// The part of a contract the model reads to form a call: name, description, input schema.
#[derive(Debug, Clone, PartialEq)]
pub struct Surface {
    name: String,
    description: String,
    input_schema: Value,
    input_schema_digest: Sha256Digest,
}

impl Surface {
    /// The tool's name.
    pub fn name(&self) -> &str {
        &self.name
    }
    /// The description (`""` when the tool declares none).
    pub fn description(&self) -> &str {
        &self.description
    }
    /// The input JSON Schema, in its canonical-round-trip form.
    pub fn input_schema(&self) -> &Value {
        &self.input_schema
    }
    /// SHA-256 of the canonical input schema.
    pub fn input_schema_digest(&self) -> Sha256Digest {
        self.input_schema_digest
    }

    /// The section as written in toolgate.lock (and hashed).
    pub(crate) fn to_json(&self) -> Value {
        json!({
            "name": self.name,
            "description": self.description,
            "inputSchema": self.input_schema,
            "inputSchemaDigest": prefixed(self.input_schema_digest),
        })
    }
}

/// What the tool does beyond its surface: output shape, annotations, gate stages, policy.
#[derive(Debug, Clone, PartialEq)]
pub struct Behavior {
    output_schema: Option<Value>,
    output_schema_digest: Option<Sha256Digest>,
    annotations: EffectiveAnnotations,
    gate_stages: Vec<String>,
    policy_fingerprint: Sha256Digest,
}

impl Behavior {
    /// The output JSON Schema, when declared.
    pub fn output_schema(&self) -> Option<&Value> {
        self.output_schema.as_ref()
    }
    /// SHA-256 of the canonical output schema, when declared.
    pub fn output_schema_digest(&self) -> Option<Sha256Digest> {
        self.output_schema_digest
    }
    /// The annotations with the spec's conservative defaults applied.
    pub fn annotations(&self) -> EffectiveAnnotations {
        self.annotations
    }
    /// The gate stages that apply to the tool, in order.
    pub fn gate_stages(&self) -> &[String] {
        &self.gate_stages
    }
    /// A digest of the policy rules that apply to the tool.
    pub fn policy_fingerprint(&self) -> Sha256Digest {
        self.policy_fingerprint
    }

    pub(crate) fn to_json(&self) -> Value {
        let a = self.annotations;
        json!({
            "outputSchema": self.output_schema,
            "outputSchemaDigest": self.output_schema_digest.map(prefixed),
            "annotations": {
                "readOnlyHint": a.read_only_hint,
                "destructiveHint": a.destructive_hint,
                "idempotentHint": a.idempotent_hint,
                "openWorldHint": a.open_world_hint,
            },
            "gateStages": self.gate_stages,
            "policyFingerprint": prefixed(self.policy_fingerprint),
        })
    }
}

/// How much context a tool's schemas and results may cost the model.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum InflationRisk {
    /// Bounded output and small schemas.
    Low,
    /// Large schemas, a long description, or no declared output shape.
    Medium,
    /// The output holds a collection without a size bound.
    High,
}

impl InflationRisk {
    /// The lowercase name used in toolgate.lock.
    pub fn as_str(self) -> &'static str {
        match self {
            InflationRisk::Low => "low",
            InflationRisk::Medium => "medium",
            InflationRisk::High => "high",
        }
    }

    pub(crate) fn from_name(name: &str) -> Option<Self> {
        match name {
            "low" => Some(InflationRisk::Low),
            "medium" => Some(InflationRisk::Medium),
            "high" => Some(InflationRisk::High),
            _ => None,
        }
    }
}

impl fmt::Display for InflationRisk {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl serde::Serialize for InflationRisk {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(self.as_str())
    }
}

/// Context cost of a tool, derived from its schemas and description (rule in `docs/lockfile.md`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TokenEconomics {
    schema_field_count: u64,
    unbounded_collections: Vec<String>,
    inflation_risk: InflationRisk,
}

impl TokenEconomics {
    /// Property definitions in the input and output schemas, counted recursively.
    pub fn schema_field_count(&self) -> u64 {
        self.schema_field_count
    }
    /// JSON pointers (RFC 6901) into the output schema of collections without a size bound.
    pub fn unbounded_collections(&self) -> &[String] {
        &self.unbounded_collections
    }
    /// The resulting risk level.
    pub fn inflation_risk(&self) -> InflationRisk {
        self.inflation_risk
    }

    /// The rule, in one place: see `docs/lockfile.md` ("Token economics").
    fn derive(description: &str, input: &Value, output: Option<&Value>) -> Self {
        let mut schema_field_count = 0u64;
        walk_schema(input, &mut String::new(), &mut |node, _| {
            schema_field_count += property_count(node);
        });
        let mut unbounded_collections = Vec::new();
        if let Some(output) = output {
            walk_schema(output, &mut String::new(), &mut |node, pointer| {
                schema_field_count += property_count(node);
                if is_unbounded_collection(node) {
                    unbounded_collections.push(pointer.to_owned());
                }
            });
        }
        unbounded_collections.sort();
        let inflation_risk = if !unbounded_collections.is_empty() {
            InflationRisk::High
        } else if output.is_none()
            || schema_field_count > FIELD_COUNT_MEDIUM
            || description.chars().count() > DESCRIPTION_CHARS_MEDIUM
        {
            // A tool without an output schema may return anything; its size cannot be bounded
            // from the contract, so it is not rated low.
            InflationRisk::Medium
        } else {
            InflationRisk::Low
        };
        TokenEconomics {
            schema_field_count,
            unbounded_collections,
            inflation_risk,
        }
    }

    pub(crate) fn to_json(&self) -> Value {
        json!({
            "schemaFieldCount": self.schema_field_count,
            "unboundedCollections": self.unbounded_collections,
            "inflationRisk": self.inflation_risk.as_str(),
        })
    }
}

/// The capability families the handler uses, and the evasion signals found in its reach.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EntitlementsSection {
    families: Entitlements,
    evasion_signals: Vec<String>,
    unresolved: Vec<String>,
}

impl EntitlementsSection {
    /// The capability families.
    pub fn families(&self) -> Entitlements {
        self.families
    }
    /// The evasion signal kinds, sorted and deduplicated.
    pub fn evasion_signals(&self) -> &[String] {
        &self.evasion_signals
    }
    /// The calls the scanner could not follow, sorted and deduplicated.
    pub fn unresolved(&self) -> &[String] {
        &self.unresolved
    }

    pub(crate) fn to_json(&self) -> Value {
        let mut map = Map::new();
        for (name, value) in self.families.families() {
            map.insert(name.to_owned(), Value::Bool(value));
        }
        map.insert("evasionSignals".to_owned(), json!(self.evasion_signals));
        // Absent when empty, so the sections of handlers with nothing unresolved keep the form
        // (and the digests) they had before the scanner reported unresolved calls.
        if !self.unresolved.is_empty() {
            map.insert("unresolved".to_owned(), json!(self.unresolved));
        }
        Value::Object(map)
    }
}

/// The four section digests of a tool.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct SectionDigests {
    /// Digest of the surface section.
    pub surface: Sha256Digest,
    /// Digest of the behavior section.
    pub behavior: Sha256Digest,
    /// Digest of the token economics section.
    pub token_economics: Sha256Digest,
    /// Digest of the entitlements section.
    pub entitlements: Sha256Digest,
}

impl SectionDigests {
    /// The digests with their lockfile names, in lockfile key order.
    pub fn named(&self) -> [(&'static str, Sha256Digest); 4] {
        [
            ("behavior", self.behavior),
            ("entitlements", self.entitlements),
            ("surface", self.surface),
            ("tokenEconomics", self.token_economics),
        ]
    }
}

/// The arguments a tool accepts, as a model needs them to correct a call.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct InputContract {
    /// Top-level argument names the schema requires, sorted.
    pub required: Vec<String>,
    /// Top-level argument names the schema declares (required ones included), sorted.
    pub allowed: Vec<String>,
}

/// The contract of one tool.
///
/// The sections are valid by construction (built by [`ToolContract::build`] or read back by
/// `Lockfile::parse`). The fields are public so callers can read them directly; replacing one with
/// a section of another tool produces a contract whose lockfile will not parse back.
#[derive(Debug, Clone, PartialEq)]
pub struct ToolContract {
    /// Name, description and input schema.
    pub surface: Surface,
    /// Output schema, annotations, gate stages and policy fingerprint.
    pub behavior: Behavior,
    /// Context cost.
    pub token_economics: TokenEconomics,
    /// Capabilities and evasion signals.
    pub entitlements: EntitlementsSection,
}

impl ToolContract {
    /// Builds the contract of `def` with the facts about its handler.
    ///
    /// Schemas are stored in the form they take after a canonical JSON round trip (for example
    /// `2.0` becomes `2`), so a contract read back from toolgate.lock compares equal to the one built
    /// from the live definition whenever their digests are equal.
    pub fn build(def: &ToolDefinition, facts: &HandlerFacts) -> Result<Self, ContractError> {
        if def.name.is_empty() {
            return Err(ContractError::EmptyToolName);
        }
        if !def.input_schema.is_object() {
            return Err(ContractError::InputSchemaNotObject {
                tool: def.name.clone(),
                found: json_type(&def.input_schema),
            });
        }
        if let Some(output) = &def.output_schema
            && !output.is_object()
        {
            return Err(ContractError::OutputSchemaNotObject {
                tool: def.name.clone(),
                found: json_type(output),
            });
        }
        let input_schema = normalize(&def.input_schema).map_err(|reason| {
            ContractError::SchemaNotRepresentable {
                tool: def.name.clone(),
                which: "input",
                reason,
            }
        })?;
        let output_schema =
            match &def.output_schema {
                Some(schema) => Some(normalize(schema).map_err(|reason| {
                    ContractError::SchemaNotRepresentable {
                        tool: def.name.clone(),
                        which: "output",
                        reason,
                    }
                })?),
                None => None,
            };
        let description = def.description.clone().unwrap_or_default();
        let token_economics =
            TokenEconomics::derive(&description, &input_schema, output_schema.as_ref());
        let mut evasion_signals = facts.evasion.clone();
        evasion_signals.sort();
        evasion_signals.dedup();
        let mut unresolved = facts.unresolved.clone();
        unresolved.sort();
        unresolved.dedup();
        Ok(ToolContract {
            surface: Surface {
                name: def.name.clone(),
                description,
                input_schema_digest: Sha256Digest::of_json(&input_schema),
                input_schema,
            },
            behavior: Behavior {
                output_schema_digest: output_schema.as_ref().map(Sha256Digest::of_json),
                output_schema,
                annotations: def.annotations.effective(),
                gate_stages: facts.gate_stages.clone(),
                policy_fingerprint: facts.policy_fingerprint,
            },
            token_economics,
            entitlements: EntitlementsSection {
                families: facts.entitlements,
                evasion_signals,
                unresolved,
            },
        })
    }

    /// The tool's name.
    pub fn name(&self) -> &str {
        &self.surface.name
    }

    /// SHA-256 of the canonical JSON of each section.
    pub fn section_digests(&self) -> SectionDigests {
        SectionDigests {
            surface: Sha256Digest::of_json(&self.surface.to_json()),
            behavior: Sha256Digest::of_json(&self.behavior.to_json()),
            token_economics: Sha256Digest::of_json(&self.token_economics.to_json()),
            entitlements: Sha256Digest::of_json(&self.entitlements.to_json()),
        }
    }

    /// SHA-256 of canonical `{"behavior":hex,"entitlements":hex,"surface":hex,"tokenEconomics":hex}`.
    pub fn digest(&self) -> Sha256Digest {
        let mut map = Map::new();
        for (name, digest) in self.section_digests().named() {
            map.insert(name.to_owned(), Value::String(digest.to_hex()));
        }
        Sha256Digest::of_json(&Value::Object(map))
    }

    /// The top-level argument names the input schema requires and declares.
    pub fn input_contract(&self) -> InputContract {
        let schema = &self.surface.input_schema;
        let mut required: Vec<String> = schema
            .get("required")
            .and_then(Value::as_array)
            .map(|names| {
                names
                    .iter()
                    .filter_map(Value::as_str)
                    .map(str::to_owned)
                    .collect()
            })
            .unwrap_or_default();
        required.sort();
        required.dedup();
        let mut allowed: Vec<String> = schema
            .get("properties")
            .and_then(Value::as_object)
            .map(|props| props.keys().cloned().collect())
            .unwrap_or_default();
        // A name the schema requires is accepted even if `properties` forgets to declare it.
        allowed.extend(required.iter().cloned());
        allowed.sort();
        allowed.dedup();
        InputContract { required, allowed }
    }

    /// The four sections as written in toolgate.lock, by lockfile name.
    pub(crate) fn sections_json(&self) -> [(&'static str, Value); 4] {
        [
            ("behavior", self.behavior.to_json()),
            ("entitlements", self.entitlements.to_json()),
            ("surface", self.surface.to_json()),
            ("tokenEconomics", self.token_economics.to_json()),
        ]
    }
}

/// The contracts of all tools of one server.
#[derive(Debug, Clone, PartialEq)]
pub struct ServerContract {
    /// The server's name.
    pub server_name: String,
    /// The tool contracts by tool name.
    pub tools: BTreeMap<String, ToolContract>,
}

impl ServerContract {
    /// Collects the tools of a server; a repeated tool name or an empty server name is an error.
    pub fn new(
        server_name: impl Into<String>,
        tools: impl IntoIterator<Item = ToolContract>,
    ) -> Result<Self, ContractError> {
        let server_name = server_name.into();
        if server_name.is_empty() {
            return Err(ContractError::EmptyServerName);
        }
        let mut map = BTreeMap::new();
        for tool in tools {
            let name = tool.name().to_owned();
            if map.contains_key(&name) {
                return Err(ContractError::DuplicateTool { name });
            }
            map.insert(name, tool);
        }
        Ok(ServerContract {
            server_name,
            tools: map,
        })
    }

    /// SHA-256 of canonical `{"serverName":name,"tools":{tool name: tool digest hex, ...}}`.
    ///
    /// Canonical JSON sorts the tool names, so the digest does not depend on registration order.
    /// The server name is included so that an attestation for one server cannot be replayed for
    /// another whose tools happen to be identical.
    pub fn digest(&self) -> Sha256Digest {
        let tools: Map<String, Value> = self
            .tools
            .iter()
            .map(|(name, tool)| (name.clone(), Value::String(tool.digest().to_hex())))
            .collect();
        Sha256Digest::of_json(&json!({
            "serverName": self.server_name,
            "tools": tools,
        }))
    }
}

/// `sha256:<hex>`, the form every digest takes inside toolgate.lock.
pub(crate) fn prefixed(digest: Sha256Digest) -> String {
    format!("sha256:{}", digest.to_hex())
}

/// The JSON type of a value, for error messages.
pub(crate) fn json_type(value: &Value) -> &'static str {
    match value {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

/// How deep a schema may nest. serde_json refuses documents deeper than 128 levels, and a schema
/// sits four levels deep in toolgate.lock, so a deeper schema could be written but never read back.
const MAX_SCHEMA_DEPTH: usize = 100;

/// The value after a canonical JSON round trip, so that equal digests imply equal values.
fn normalize(value: &Value) -> Result<Value, String> {
    if depth(value) > MAX_SCHEMA_DEPTH {
        return Err(format!("it nests deeper than {MAX_SCHEMA_DEPTH} levels"));
    }
    serde_json::from_slice(&canonical_value(value)).map_err(|e| e.to_string())
}

/// Nesting depth of a value, computed without recursion so that no input can exhaust the stack.
fn depth(value: &Value) -> usize {
    let mut deepest = 0;
    let mut stack = vec![(value, 1usize)];
    while let Some((node, level)) = stack.pop() {
        deepest = deepest.max(level);
        match node {
            Value::Array(items) => stack.extend(items.iter().map(|v| (v, level + 1))),
            Value::Object(map) => stack.extend(map.values().map(|v| (v, level + 1))),
            _ => {}
        }
    }
    deepest
}

/// Appends one RFC 6901 reference token to `pointer`.
pub(crate) fn push_token(pointer: &mut String, token: &str) {
    pointer.push('/');
    pointer.push_str(&token.replace('~', "~0").replace('/', "~1"));
}

/// Keywords whose value is one subschema.
const SINGLE_SCHEMA_KEYWORDS: &[&str] = &[
    "additionalItems",
    "additionalProperties",
    "contains",
    "else",
    "if",
    "items",
    "not",
    "propertyNames",
    "then",
    "unevaluatedItems",
    "unevaluatedProperties",
];
/// Keywords whose value is an array of subschemas.
const SCHEMA_ARRAY_KEYWORDS: &[&str] = &["allOf", "anyOf", "items", "oneOf", "prefixItems"];
/// Keywords whose value is a map of subschemas.
const SCHEMA_MAP_KEYWORDS: &[&str] = &[
    "$defs",
    "definitions",
    "dependentSchemas",
    "patternProperties",
    "properties",
];

/// Calls `visit` on every schema object reachable from `node` through schema keywords (never
/// through `enum`, `const`, `default` or `examples`, which hold data, not schemas).
fn walk_schema(node: &Value, pointer: &mut String, visit: &mut dyn FnMut(&Value, &str)) {
    let Some(object) = node.as_object() else {
        return;
    };
    visit(node, pointer);
    let len = pointer.len();
    for (keyword, value) in object {
        let single = SINGLE_SCHEMA_KEYWORDS.contains(&keyword.as_str()) && value.is_object();
        let array = SCHEMA_ARRAY_KEYWORDS.contains(&keyword.as_str()) && value.is_array();
        let map = SCHEMA_MAP_KEYWORDS.contains(&keyword.as_str()) && value.is_object();
        if single {
            push_token(pointer, keyword);
            walk_schema(value, pointer, visit);
        } else if array {
            for (i, item) in value.as_array().into_iter().flatten().enumerate() {
                push_token(pointer, keyword);
                push_token(pointer, &i.to_string());
                walk_schema(item, pointer, visit);
                pointer.truncate(len);
            }
        } else if map {
            for (name, sub) in value.as_object().into_iter().flatten() {
                push_token(pointer, keyword);
                push_token(pointer, name);
                walk_schema(sub, pointer, visit);
                pointer.truncate(len);
            }
        }
        pointer.truncate(len);
    }
}

fn property_count(node: &Value) -> u64 {
    node.get("properties")
        .and_then(Value::as_object)
        .map_or(0, |props| props.len() as u64)
}

/// Whether `types` (a `type` keyword value) admits `name`.
fn type_includes(types: Option<&Value>, name: &str) -> bool {
    match types {
        Some(Value::String(t)) => t == name,
        Some(Value::Array(ts)) => ts.iter().any(|t| t.as_str() == Some(name)),
        _ => false,
    }
}

/// An array without `maxItems`, or a map (`additionalProperties` true or a schema, or
/// `patternProperties`) without `maxProperties`. An object schema that merely omits
/// `additionalProperties` is not counted: the output is what the server writes, and its declared
/// properties describe it.
fn is_unbounded_collection(node: &Value) -> bool {
    let types = node.get("type");
    let is_array = type_includes(types, "array")
        || (types.is_none() && (node.get("items").is_some() || node.get("prefixItems").is_some()));
    if is_array && node.get("maxItems").is_none() {
        return true;
    }
    let open_map = match node.get("additionalProperties") {
        Some(Value::Bool(true)) | Some(Value::Object(_)) => true,
        _ => node
            .get("patternProperties")
            .and_then(Value::as_object)
            .is_some_and(|p| !p.is_empty()),
    };
    open_map && node.get("maxProperties").is_none()
}
