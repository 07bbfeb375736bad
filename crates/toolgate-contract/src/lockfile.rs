//! `toolgate.lock`: the server contract written as deterministic, reviewable, self-verifying JSON.
//!
//! The layout is documented in `docs/lockfile.md`. Rendering is RFC 8785 canonical JSON with
//! two-space indentation: keys sorted by UTF-16 code units, scalars in their canonical form, a final
//! newline. Parsing treats the file as untrusted: duplicate and unknown keys are errors, every
//! stored digest is checked against the bytes it covers, and every derived value (schema digests,
//! token economics) against its recomputation, so a hand edit cannot slip through unnoticed.

use std::cell::RefCell;
use std::fmt;

use serde::de::{DeserializeSeed, Deserializer, Error as _, MapAccess, SeqAccess, Visitor};
use serde_json::{Map, Value, json};
use toolgate_canon::{Sha256Digest, canonical_value};

use crate::contract::{
    ContractError, InflationRisk, ServerContract, ToolContract, json_type, prefixed,
};
use crate::model::{Annotations, Entitlements, HandlerFacts, ToolDefinition};

/// The lockfile format version this crate writes and reads.
pub const LOCKFILE_VERSION: u64 = 1;

const TOP_KEYS: &[&str] = &[
    "integrityDigest",
    "lockfileVersion",
    "serverName",
    "toolgateVersion",
    "tools",
];
const TOOL_KEYS: &[&str] = &[
    "behavior",
    "entitlements",
    "integrityDigest",
    "sectionDigests",
    "surface",
    "tokenEconomics",
];
const SECTION_KEYS: &[&str] = &["behavior", "entitlements", "surface", "tokenEconomics"];
const SURFACE_KEYS: &[&str] = &["description", "inputSchema", "inputSchemaDigest", "name"];
const BEHAVIOR_KEYS: &[&str] = &[
    "annotations",
    "gateStages",
    "outputSchema",
    "outputSchemaDigest",
    "policyFingerprint",
];
const ANNOTATION_KEYS: &[&str] = &[
    "destructiveHint",
    "idempotentHint",
    "openWorldHint",
    "readOnlyHint",
];
const ECONOMICS_KEYS: &[&str] = &["inflationRisk", "schemaFieldCount", "unboundedCollections"];
const ENTITLEMENT_KEYS: &[&str] = &[
    "crypto",
    "environment",
    "evasionSignals",
    "filesystemRead",
    "filesystemWrite",
    "network",
    "subprocess",
    "unsafeFfi",
];

/// Why a lockfile was rejected. Every variant says how to recover; the usual fix for a file that
/// was not written by toolgate is to regenerate it and review the diff. The texts name no
/// command: a lock check adds its caller's fix hint (`cargo xtask lock` in this workspace, a
/// `cargo test` with `TOOLGATE_UPDATE_LOCK=1` in a server's own crate).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum LockfileError {
    /// The text is not JSON.
    #[error(
        "toolgate.lock is not valid JSON (line {line}, column {column}: {reason}); regenerate the lockfile"
    )]
    NotJson {
        /// 1-based line of the error.
        line: usize,
        /// 1-based column of the error.
        column: usize,
        /// The parser's message.
        reason: String,
    },
    /// An object has the same key twice (a reviewer would see one value, a parser another).
    #[error(
        "toolgate.lock repeats the key `{key}` (line {line}); keep one value or regenerate the lockfile"
    )]
    DuplicateKey {
        /// The repeated key.
        key: String,
        /// 1-based line where the repetition was found.
        line: usize,
    },
    /// `lockfileVersion` is not one this toolgate reads.
    #[error(
        "toolgate.lock has lockfileVersion {found}, but this toolgate reads version {supported}; upgrade toolgate or regenerate the lockfile"
    )]
    UnsupportedVersion {
        /// The version found, as written.
        found: String,
        /// The version supported.
        supported: u64,
    },
    /// A key the format does not define.
    #[error(
        "unknown key `{key}` in {path} of toolgate.lock (allowed: {allowed}); remove it or regenerate the lockfile"
    )]
    UnknownKey {
        /// Where the key was found (`"tools.write_note.surface"`).
        path: String,
        /// The key.
        key: String,
        /// The keys allowed there, comma-separated.
        allowed: String,
    },
    /// A key the format requires is missing.
    #[error("toolgate.lock lacks `{key}` in {path}; regenerate the lockfile")]
    MissingKey {
        /// Where it was expected.
        path: String,
        /// The missing key.
        key: &'static str,
    },
    /// A value has the wrong JSON type or an invalid value.
    #[error("`{path}` in toolgate.lock must be {expected}, found {found}; regenerate the lockfile")]
    WrongType {
        /// The value's location.
        path: String,
        /// What was expected.
        expected: &'static str,
        /// What was found.
        found: String,
    },
    /// A digest string is not `sha256:` followed by 64 lowercase hex characters.
    #[error(
        "`{path}` in toolgate.lock is not a digest of the form sha256:<64 lowercase hex> ({reason}); regenerate the lockfile"
    )]
    MalformedDigest {
        /// The digest's location.
        path: String,
        /// What is wrong with it.
        reason: String,
    },
    /// A stored digest does not match the content it covers: the file was edited by hand or is
    /// corrupt.
    #[error(
        "digest mismatch in toolgate.lock for tool `{tool}`, {section}: stored sha256:{stored}, recomputed sha256:{computed}; the file was edited or corrupted: regenerate the lockfile and review the diff"
    )]
    DigestMismatch {
        /// The tool (`""` for the server-level integrity digest).
        tool: String,
        /// The section or digest (`"surface"`, `"integrityDigest"`, ...).
        section: String,
        /// The digest written in the file.
        stored: Sha256Digest,
        /// The digest of the content.
        computed: Sha256Digest,
    },
    /// A value that is derived from other content (a schema digest, the token economics) does not
    /// match its derivation, even though the digests over it agree.
    #[error(
        "toolgate.lock is inconsistent for tool `{tool}`: {section} does not match what its schemas and description imply; regenerate the lockfile"
    )]
    InconsistentSection {
        /// The tool.
        tool: String,
        /// The inconsistent section.
        section: &'static str,
    },
    /// A tool is stored under a key that is not its name.
    #[error(
        "toolgate.lock stores tool `{name}` under the key `{key}`; the key must equal surface.name: regenerate the lockfile"
    )]
    NameMismatch {
        /// The key in `tools`.
        key: String,
        /// `surface.name`.
        name: String,
    },
    /// The stored content does not form a valid contract.
    #[error("toolgate.lock holds an invalid contract: {0}")]
    Contract(#[from] ContractError),
}

/// A server contract with the toolgate version that wrote it.
#[derive(Debug, Clone, PartialEq)]
pub struct Lockfile {
    contract: ServerContract,
    toolgate_version: String,
}

impl Lockfile {
    /// A lockfile for `contract`, recording which toolgate wrote it (not part of any digest).
    pub fn new(contract: ServerContract, toolgate_version: &str) -> Self {
        Lockfile {
            contract,
            toolgate_version: toolgate_version.to_owned(),
        }
    }

    /// The deterministic bytes of toolgate.lock: canonical JSON, two-space indent, final newline.
    pub fn render(&self) -> String {
        let mut tools = Map::new();
        for (name, tool) in &self.contract.tools {
            let mut entry = Map::new();
            for (section, value) in tool.sections_json() {
                entry.insert(section.to_owned(), value);
            }
            let mut digests = Map::new();
            for (section, digest) in tool.section_digests().named() {
                digests.insert(section.to_owned(), Value::String(prefixed(digest)));
            }
            entry.insert("sectionDigests".to_owned(), Value::Object(digests));
            entry.insert(
                "integrityDigest".to_owned(),
                Value::String(prefixed(tool.digest())),
            );
            tools.insert(name.clone(), Value::Object(entry));
        }
        let document = json!({
            "lockfileVersion": LOCKFILE_VERSION,
            "serverName": self.contract.server_name,
            "toolgateVersion": self.toolgate_version,
            "integrityDigest": prefixed(self.contract.digest()),
            "tools": tools,
        });
        let mut out = String::new();
        write_pretty(&mut out, &document, 0);
        out.push('\n');
        out
    }

    /// Reads and verifies toolgate.lock. See the module documentation for what is checked.
    pub fn parse(text: &str) -> Result<Self, LockfileError> {
        let document = parse_strict(text)?;
        let top = object(&document, "the top level")?;
        check_version(top)?;
        check_keys(top, "the top level", TOP_KEYS)?;
        let server_name = string(top, "", "serverName")?.to_owned();
        let toolgate_version = string(top, "", "toolgateVersion")?.to_owned();
        let stored_server = digest(field(top, "", "integrityDigest")?, "integrityDigest")?;
        let tools_value = field(top, "", "tools")?;
        let tools_map = object(tools_value, "tools")?;

        let mut tools = Vec::with_capacity(tools_map.len());
        for (key, value) in tools_map {
            tools.push(parse_tool(key, value)?);
        }
        let contract = ServerContract::new(server_name, tools)?;
        let computed = contract.digest();
        if computed != stored_server {
            return Err(LockfileError::DigestMismatch {
                tool: String::new(),
                section: "integrityDigest".to_owned(),
                stored: stored_server,
                computed,
            });
        }
        Ok(Lockfile {
            contract,
            toolgate_version,
        })
    }

    /// The server contract.
    pub fn contract(&self) -> &ServerContract {
        &self.contract
    }

    /// The server contract, consuming the lockfile.
    pub fn into_contract(self) -> ServerContract {
        self.contract
    }

    /// The toolgate version that wrote the file (informational, not digested).
    pub fn toolgate_version(&self) -> &str {
        &self.toolgate_version
    }

    /// The server digest (`integrityDigest` at the top level).
    pub fn integrity_digest(&self) -> Sha256Digest {
        self.contract.digest()
    }
}

impl fmt::Display for Lockfile {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.render())
    }
}

/// Reads one tool entry: structure first (so an unknown or missing key is reported as such), then
/// the digests over the stored bytes, then the derived values against a rebuild.
fn parse_tool(key: &str, value: &Value) -> Result<ToolContract, LockfileError> {
    let path = format!("tools.{key}");
    let entry = object(value, &path)?;
    check_keys(entry, &path, TOOL_KEYS)?;
    let digests_path = format!("{path}.sectionDigests");
    let digests = object(field(entry, &path, "sectionDigests")?, &digests_path)?;
    check_keys(digests, &digests_path, SECTION_KEYS)?;
    let stored_tool = digest(
        field(entry, &path, "integrityDigest")?,
        &format!("{path}.integrityDigest"),
    )?;
    let mut stored_sections = Vec::with_capacity(SECTION_KEYS.len());
    for section in SECTION_KEYS {
        stored_sections.push(digest(
            field(digests, &digests_path, section)?,
            &format!("{digests_path}.{section}"),
        )?);
    }
    let read = read_sections(entry, &path)?;

    // 1. Every section digest is checked against the canonical JSON of the section exactly as
    //    stored, so a tampered section is named even when its content is otherwise well formed.
    let mut section_hex = Map::new();
    for (section, stored) in SECTION_KEYS.iter().zip(stored_sections) {
        let computed = Sha256Digest::of_json(field(entry, &path, section)?);
        if stored != computed {
            return Err(LockfileError::DigestMismatch {
                tool: key.to_owned(),
                section: (*section).to_owned(),
                stored,
                computed,
            });
        }
        section_hex.insert((*section).to_owned(), Value::String(stored.to_hex()));
    }
    let computed_tool = Sha256Digest::of_json(&Value::Object(section_hex));
    if stored_tool != computed_tool {
        return Err(LockfileError::DigestMismatch {
            tool: key.to_owned(),
            section: "integrityDigest".to_owned(),
            stored: stored_tool,
            computed: computed_tool,
        });
    }

    // 2. The derived values: schema digests, then a rebuild of the whole contract, which must
    //    reproduce every stored section. This catches values edited and re-hashed consistently.
    let ReadTool {
        def,
        facts,
        input_digest,
        output_digest,
    } = read;
    check_schema_digest(
        key,
        "surface.inputSchemaDigest",
        input_digest,
        &def.input_schema,
    )?;
    match (&def.output_schema, output_digest) {
        (None, None) => {}
        (Some(schema), Some(stored)) => {
            check_schema_digest(key, "behavior.outputSchemaDigest", stored, schema)?;
        }
        _ => {
            return Err(LockfileError::InconsistentSection {
                tool: key.to_owned(),
                section: "behavior",
            });
        }
    }
    if def.name != key {
        return Err(LockfileError::NameMismatch {
            key: key.to_owned(),
            name: def.name,
        });
    }
    let tool = ToolContract::build(&def, &facts)?;
    for (section, rebuilt) in tool.sections_json() {
        let stored = entry.get(section).unwrap_or(&Value::Null);
        if canonical_value(stored) != canonical_value(&rebuilt) {
            return Err(LockfileError::InconsistentSection {
                tool: key.to_owned(),
                section,
            });
        }
    }
    Ok(tool)
}

/// A tool entry's content, type-checked but not yet verified.
struct ReadTool {
    def: ToolDefinition,
    facts: HandlerFacts,
    input_digest: Sha256Digest,
    output_digest: Option<Sha256Digest>,
}

fn read_sections(entry: &Map<String, Value>, path: &str) -> Result<ReadTool, LockfileError> {
    let surface_path = format!("{path}.surface");
    let surface = object(field(entry, path, "surface")?, &surface_path)?;
    check_keys(surface, &surface_path, SURFACE_KEYS)?;
    let name = string(surface, &surface_path, "name")?.to_owned();
    let description = string(surface, &surface_path, "description")?.to_owned();
    let input_schema = field(surface, &surface_path, "inputSchema")?.clone();
    let input_digest = digest(
        field(surface, &surface_path, "inputSchemaDigest")?,
        &format!("{surface_path}.inputSchemaDigest"),
    )?;

    let behavior_path = format!("{path}.behavior");
    let behavior = object(field(entry, path, "behavior")?, &behavior_path)?;
    check_keys(behavior, &behavior_path, BEHAVIOR_KEYS)?;
    let output_schema = match field(behavior, &behavior_path, "outputSchema")? {
        Value::Null => None,
        schema => Some(schema.clone()),
    };
    let output_digest_path = format!("{behavior_path}.outputSchemaDigest");
    let output_digest = match field(behavior, &behavior_path, "outputSchemaDigest")? {
        Value::Null => None,
        value => Some(digest(value, &output_digest_path)?),
    };
    let annotations_path = format!("{behavior_path}.annotations");
    let annotations = object(
        field(behavior, &behavior_path, "annotations")?,
        &annotations_path,
    )?;
    check_keys(annotations, &annotations_path, ANNOTATION_KEYS)?;
    let annotations = Annotations {
        read_only: Some(boolean(annotations, &annotations_path, "readOnlyHint")?),
        destructive: Some(boolean(annotations, &annotations_path, "destructiveHint")?),
        idempotent: Some(boolean(annotations, &annotations_path, "idempotentHint")?),
        open_world: Some(boolean(annotations, &annotations_path, "openWorldHint")?),
    };
    let gate_stages = strings(behavior, &behavior_path, "gateStages")?;
    let policy_fingerprint = digest(
        field(behavior, &behavior_path, "policyFingerprint")?,
        &format!("{behavior_path}.policyFingerprint"),
    )?;

    // Token economics are derived, so they are only type-checked here; step 3 of `parse_tool`
    // compares them with the derivation.
    let economics_path = format!("{path}.tokenEconomics");
    let economics = object(field(entry, path, "tokenEconomics")?, &economics_path)?;
    check_keys(economics, &economics_path, ECONOMICS_KEYS)?;
    let count = field(economics, &economics_path, "schemaFieldCount")?;
    if count.as_u64().is_none() {
        return Err(wrong(
            &format!("{economics_path}.schemaFieldCount"),
            "a non-negative integer",
            count,
        ));
    }
    strings(economics, &economics_path, "unboundedCollections")?;
    let risk = field(economics, &economics_path, "inflationRisk")?;
    if risk.as_str().and_then(InflationRisk::from_name).is_none() {
        return Err(wrong(
            &format!("{economics_path}.inflationRisk"),
            "one of \"low\", \"medium\", \"high\"",
            risk,
        ));
    }

    let entitlements_path = format!("{path}.entitlements");
    let entitlements = object(field(entry, path, "entitlements")?, &entitlements_path)?;
    check_keys_optional(
        entitlements,
        &entitlements_path,
        ENTITLEMENT_KEYS,
        &["unresolved"],
    )?;
    let flag = |name: &'static str| boolean(entitlements, &entitlements_path, name);
    let families = Entitlements {
        filesystem_read: flag("filesystemRead")?,
        filesystem_write: flag("filesystemWrite")?,
        network: flag("network")?,
        subprocess: flag("subprocess")?,
        crypto: flag("crypto")?,
        unsafe_ffi: flag("unsafeFfi")?,
        environment: flag("environment")?,
    };
    let evasion = strings(entitlements, &entitlements_path, "evasionSignals")?;
    let unresolved = if entitlements.contains_key("unresolved") {
        strings(entitlements, &entitlements_path, "unresolved")?
    } else {
        Vec::new()
    };

    let def = ToolDefinition {
        name,
        // An empty description and an absent one are the same contract.
        description: Some(description),
        input_schema,
        output_schema,
        annotations,
    };
    let facts = HandlerFacts {
        gate_stages,
        policy_fingerprint,
        entitlements: families,
        evasion,
        unresolved,
    };
    Ok(ReadTool {
        def,
        facts,
        input_digest,
        output_digest,
    })
}

fn check_schema_digest(
    tool: &str,
    section: &str,
    stored: Sha256Digest,
    schema: &Value,
) -> Result<(), LockfileError> {
    let computed = Sha256Digest::of_json(schema);
    if stored == computed {
        Ok(())
    } else {
        Err(LockfileError::DigestMismatch {
            tool: tool.to_owned(),
            section: section.to_owned(),
            stored,
            computed,
        })
    }
}

/// `lockfileVersion` is the one this crate reads. Checked before the keys, so that a newer format
/// reports its version instead of its first new key.
pub(crate) fn check_version(top: &Map<String, Value>) -> Result<(), LockfileError> {
    match top.get("lockfileVersion") {
        None => Err(LockfileError::MissingKey {
            path: "the top level".to_owned(),
            key: "lockfileVersion",
        }),
        Some(Value::Number(n)) if n.as_u64() == Some(LOCKFILE_VERSION) => Ok(()),
        Some(Value::Number(n)) => Err(LockfileError::UnsupportedVersion {
            found: n.to_string(),
            supported: LOCKFILE_VERSION,
        }),
        Some(other) => Err(wrong("lockfileVersion", "the integer 1", other)),
    }
}

pub(crate) fn object<'a>(
    value: &'a Value,
    path: &str,
) -> Result<&'a Map<String, Value>, LockfileError> {
    value
        .as_object()
        .ok_or_else(|| wrong(path, "an object", value))
}

pub(crate) fn check_keys(
    map: &Map<String, Value>,
    path: &str,
    allowed: &[&'static str],
) -> Result<(), LockfileError> {
    check_keys_optional(map, path, allowed, &[])
}

/// Every key of `map` is in `required` or `optional`, and every `required` key is present.
pub(crate) fn check_keys_optional(
    map: &Map<String, Value>,
    path: &str,
    allowed: &[&'static str],
    optional: &[&'static str],
) -> Result<(), LockfileError> {
    if let Some(key) = map
        .keys()
        .find(|k| !allowed.contains(&k.as_str()) && !optional.contains(&k.as_str()))
    {
        let mut names: Vec<&str> = allowed.iter().chain(optional).copied().collect();
        names.sort_unstable();
        return Err(LockfileError::UnknownKey {
            path: path.to_owned(),
            key: key.clone(),
            allowed: names.join(", "),
        });
    }
    if let Some(key) = allowed.iter().find(|k| !map.contains_key(**k)) {
        return Err(LockfileError::MissingKey {
            path: path.to_owned(),
            key,
        });
    }
    Ok(())
}

fn join(path: &str, key: &str) -> String {
    if path.is_empty() {
        key.to_owned()
    } else {
        format!("{path}.{key}")
    }
}

pub(crate) fn field<'a>(
    map: &'a Map<String, Value>,
    path: &str,
    key: &'static str,
) -> Result<&'a Value, LockfileError> {
    map.get(key).ok_or_else(|| LockfileError::MissingKey {
        path: if path.is_empty() {
            "the top level".to_owned()
        } else {
            path.to_owned()
        },
        key,
    })
}

pub(crate) fn string<'a>(
    map: &'a Map<String, Value>,
    path: &str,
    key: &'static str,
) -> Result<&'a str, LockfileError> {
    let value = field(map, path, key)?;
    value
        .as_str()
        .ok_or_else(|| wrong(&join(path, key), "a string", value))
}

fn boolean(map: &Map<String, Value>, path: &str, key: &'static str) -> Result<bool, LockfileError> {
    let value = field(map, path, key)?;
    value
        .as_bool()
        .ok_or_else(|| wrong(&join(path, key), "a boolean", value))
}

fn strings(
    map: &Map<String, Value>,
    path: &str,
    key: &'static str,
) -> Result<Vec<String>, LockfileError> {
    let value = field(map, path, key)?;
    let items = value
        .as_array()
        .ok_or_else(|| wrong(&join(path, key), "an array of strings", value))?;
    items
        .iter()
        .map(|item| {
            item.as_str()
                .map(str::to_owned)
                .ok_or_else(|| wrong(&join(path, key), "an array of strings", item))
        })
        .collect()
}

pub(crate) fn digest(value: &Value, path: &str) -> Result<Sha256Digest, LockfileError> {
    let malformed = |reason: String| LockfileError::MalformedDigest {
        path: path.to_owned(),
        reason,
    };
    let text = value
        .as_str()
        .ok_or_else(|| malformed(format!("found {}", json_type(value))))?;
    let hex = text
        .strip_prefix("sha256:")
        .ok_or_else(|| malformed("missing the `sha256:` prefix".to_owned()))?;
    hex.parse().map_err(|e| malformed(format!("{e}")))
}

pub(crate) fn wrong(path: &str, expected: &'static str, found: &Value) -> LockfileError {
    LockfileError::WrongType {
        path: path.to_owned(),
        expected,
        found: json_type(found).to_owned(),
    }
}

/// Parses JSON, rejecting duplicate keys (serde_json would silently keep the last one).
pub(crate) fn parse_strict(text: &str) -> Result<Value, LockfileError> {
    let duplicate = RefCell::new(None);
    let mut deserializer = serde_json::Deserializer::from_str(text);
    let result = StrictSeed {
        duplicate: &duplicate,
    }
    .deserialize(&mut deserializer)
    .and_then(|value| deserializer.end().map(|()| value));
    result.map_err(|e| match duplicate.into_inner() {
        Some(key) => LockfileError::DuplicateKey {
            key,
            line: e.line(),
        },
        None => LockfileError::NotJson {
            line: e.line(),
            column: e.column(),
            reason: e.to_string(),
        },
    })
}

/// A `serde_json::Value` deserializer that records the first duplicate key and fails on it.
#[derive(Clone, Copy)]
struct StrictSeed<'a> {
    duplicate: &'a RefCell<Option<String>>,
}

impl<'de> DeserializeSeed<'de> for StrictSeed<'_> {
    type Value = Value;

    fn deserialize<D: Deserializer<'de>>(self, deserializer: D) -> Result<Value, D::Error> {
        deserializer.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for StrictSeed<'_> {
    type Value = Value;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a JSON value")
    }
    fn visit_bool<E: serde::de::Error>(self, v: bool) -> Result<Value, E> {
        Ok(Value::Bool(v))
    }
    fn visit_i64<E: serde::de::Error>(self, v: i64) -> Result<Value, E> {
        Ok(Value::from(v))
    }
    fn visit_u64<E: serde::de::Error>(self, v: u64) -> Result<Value, E> {
        Ok(Value::from(v))
    }
    fn visit_f64<E: serde::de::Error>(self, v: f64) -> Result<Value, E> {
        serde_json::Number::from_f64(v)
            .map(Value::Number)
            .ok_or_else(|| E::custom("non-finite number"))
    }
    fn visit_str<E: serde::de::Error>(self, v: &str) -> Result<Value, E> {
        Ok(Value::String(v.to_owned()))
    }
    fn visit_string<E: serde::de::Error>(self, v: String) -> Result<Value, E> {
        Ok(Value::String(v))
    }
    fn visit_unit<E: serde::de::Error>(self) -> Result<Value, E> {
        Ok(Value::Null)
    }
    fn visit_none<E: serde::de::Error>(self) -> Result<Value, E> {
        Ok(Value::Null)
    }
    fn visit_some<D: Deserializer<'de>>(self, deserializer: D) -> Result<Value, D::Error> {
        deserializer.deserialize_any(self)
    }
    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Value, A::Error> {
        let mut items = Vec::new();
        while let Some(item) = seq.next_element_seed(self)? {
            items.push(item);
        }
        Ok(Value::Array(items))
    }
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Value, A::Error> {
        let mut out = Map::new();
        while let Some(key) = map.next_key::<String>()? {
            if out.contains_key(&key) {
                let message = format!("duplicate key `{key}`");
                *self.duplicate.borrow_mut() = Some(key);
                return Err(A::Error::custom(message));
            }
            let value = map.next_value_seed(self)?;
            out.insert(key, value);
        }
        Ok(Value::Object(out))
    }
}

/// Writes `value` as canonical JSON with two-space indentation.
///
/// Keys are sorted by UTF-16 code units as RFC 8785 requires (explicitly, so the order does not
/// depend on whether serde_json's `preserve_order` feature is enabled somewhere in the build), and
/// scalars are written in their canonical form, so removing the whitespace yields exactly the
/// canonical bytes the digests are computed over.
pub(crate) fn write_pretty(out: &mut String, value: &Value, depth: usize) {
    match value {
        Value::Object(map) if !map.is_empty() => {
            let mut entries: Vec<(&String, &Value)> = map.iter().collect();
            entries.sort_by(|a, b| a.0.encode_utf16().cmp(b.0.encode_utf16()));
            out.push_str("{\n");
            let last = entries.len() - 1;
            for (i, (key, item)) in entries.into_iter().enumerate() {
                indent(out, depth + 1);
                out.push_str(&scalar(&Value::String(key.clone())));
                out.push_str(": ");
                write_pretty(out, item, depth + 1);
                if i != last {
                    out.push(',');
                }
                out.push('\n');
            }
            indent(out, depth);
            out.push('}');
        }
        Value::Array(items) if !items.is_empty() => {
            out.push_str("[\n");
            let last = items.len() - 1;
            for (i, item) in items.iter().enumerate() {
                indent(out, depth + 1);
                write_pretty(out, item, depth + 1);
                if i != last {
                    out.push(',');
                }
                out.push('\n');
            }
            indent(out, depth);
            out.push(']');
        }
        // Scalars, `{}` and `[]`.
        other => out.push_str(&scalar(other)),
    }
}

fn scalar(value: &Value) -> String {
    // Canonical JSON is UTF-8 by definition, so the lossy conversion never replaces anything.
    String::from_utf8_lossy(&canonical_value(value)).into_owned()
}

fn indent(out: &mut String, depth: usize) {
    for _ in 0..depth {
        out.push_str("  ");
    }
}
