//! The versioned tool policy and its pure decision function.
//!
//! A [`Policy`] is loaded once (the only I/O this crate does) and is valid by construction: the
//! loader rejects unknown keys, duplicate keys, unsupported versions and contradictory rules, so a
//! typo can never silently weaken what the server enforces. After loading, [`Policy::decide`] and
//! [`Policy::visible`] are pure functions of the policy and their inputs.
//!
//! Semantics of version 1:
//! - a tool listed in `deny` is denied, even when it is also in `allow` (deny wins);
//! - a tool in neither list is denied (default deny);
//! - an allowed tool whose arguments break one of its `arg_rules` is refused for that call only;
//!   a ruled field that is missing or not a string breaks the rule.
//!
//! Lengths are counted in Unicode scalar values (what a person calls characters), not bytes.

#![forbid(unsafe_code)]

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::path::{Path, PathBuf};

use serde::de::{self, MapAccess, Visitor};
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};
use toolgate_canon::Sha256Digest;

/// The only policy format version this build understands.
pub const SUPPORTED_VERSION: u64 = 1;

/// Why a policy could not be loaded. Every message names the problem and how to fix it.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum PolicyError {
    /// The file could not be read.
    #[error(
        "cannot read policy file {path}: {source}; check the path (--policy or POLICY_PATH) and its permissions"
    )]
    Io {
        /// The file that was read.
        path: PathBuf,
        /// The underlying error.
        source: std::io::Error,
    },
    /// The text is not JSON, or does not have the shape of a version-1 policy (this includes
    /// unknown keys, which serde names together with the allowed ones).
    #[error("invalid policy: {message} at line {line} column {column}; fix the policy file")]
    Syntax {
        /// serde's description of the problem.
        message: String,
        /// 1-based line of the problem.
        line: usize,
        /// 1-based column of the problem.
        column: usize,
    },
    /// The top-level `version` key is absent or not an integer.
    #[error(
        "invalid policy: missing integer \"version\" key; add \"version\": {SUPPORTED_VERSION}"
    )]
    MissingVersion,
    /// The file declares a version this build does not implement.
    #[error(
        "unsupported policy version {found}; this build of toolgate supports version {SUPPORTED_VERSION} only"
    )]
    UnsupportedVersion {
        /// The version found in the file.
        found: u64,
    },
    /// The file parses but states something contradictory or meaningless.
    #[error("invalid policy: {reason}")]
    Invalid {
        /// What is wrong and how to fix it.
        reason: String,
    },
}

/// A tool name as MCP allows it: 1 to 128 characters from `A-Z a-z 0-9 _ - .`.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct ToolName(String);

impl ToolName {
    /// Checks `name` against the MCP tool-name grammar.
    pub fn new(name: &str) -> Result<Self, PolicyError> {
        let ok_len = !name.is_empty() && name.len() <= 128;
        let ok_chars = name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'-' | b'.'));
        if ok_len && ok_chars {
            Ok(ToolName(name.to_owned()))
        } else {
            Err(PolicyError::Invalid {
                reason: format!(
                    "{name:?} is not a valid tool name; use 1 to 128 characters from A-Z, a-z, 0-9, '_', '-' and '.'"
                ),
            })
        }
    }

    /// The name as text.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for ToolName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// Length bounds on one string argument.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ArgRule {
    /// Minimum length in characters, inclusive.
    #[serde(default)]
    pub min_len: Option<u64>,
    /// Maximum length in characters, inclusive.
    #[serde(default)]
    pub max_len: Option<u64>,
}

/// Which kind of argument rule a call broke.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum Violation {
    /// The ruled field is absent from the arguments.
    Missing,
    /// The ruled field is present but not a string.
    NotString,
    /// The string is shorter than `min_len`.
    TooShort {
        /// The rule's minimum.
        min_len: u64,
        /// The length received.
        actual: u64,
    },
    /// The string is longer than `max_len`.
    TooLong {
        /// The rule's maximum.
        max_len: u64,
        /// The length received.
        actual: u64,
    },
}

/// An allowed tool called with arguments that break one of its rules.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ArgViolation {
    /// The tool.
    pub tool: String,
    /// The argument that broke the rule.
    pub field: String,
    /// How it broke it.
    pub violation: Violation,
}

impl ArgViolation {
    /// The rule's path in the policy file, e.g. `arg_rules.write_note.request_id.min_len`.
    pub fn rule(&self) -> String {
        let key = match self.violation {
            Violation::Missing | Violation::NotString => "type",
            Violation::TooShort { .. } => "min_len",
            Violation::TooLong { .. } => "max_len",
        };
        format!("arg_rules.{}.{}.{}", self.tool, self.field, key)
    }

    /// A message for the caller: starts with `Error:`, names the field, the rule and the fix.
    /// It never echoes the argument's value.
    pub fn message(&self) -> String {
        let Self { tool, field, .. } = self;
        match &self.violation {
            Violation::Missing => format!(
                "Error: argument `{field}` of `{tool}` is required by policy rule {}; pass `{field}` as a string",
                self.rule()
            ),
            Violation::NotString => format!(
                "Error: argument `{field}` of `{tool}` must be a string (policy rule {}); pass `{field}` as a string",
                self.rule()
            ),
            Violation::TooShort { min_len, actual } => format!(
                "Error: argument `{field}` of `{tool}` has {actual} characters but policy rule {} requires at least {min_len}; pass a longer `{field}`",
                self.rule()
            ),
            Violation::TooLong { max_len, actual } => format!(
                "Error: argument `{field}` of `{tool}` has {actual} characters but policy rule {} allows at most {max_len}; shorten `{field}`",
                self.rule()
            ),
        }
    }
}

/// Why a tool is refused as a whole (hidden from tools/list, -32602 on tools/call).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum ToolDenial {
    /// The tool is listed in `deny`.
    DenyList,
    /// The tool is in neither `allow` nor `deny`.
    NotListed,
}

impl ToolDenial {
    /// The rule that decided, as written in audit records.
    pub fn rule(&self) -> &'static str {
        match self {
            ToolDenial::DenyList => "deny",
            ToolDenial::NotListed => "default_deny",
        }
    }
}

/// The outcome of [`Policy::decide`], naming the rule that decided.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum Decision {
    /// The tool is allowed and its arguments satisfy its rules.
    Allow,
    /// The tool is refused whatever its arguments.
    DenyTool(ToolDenial),
    /// The tool is allowed but these arguments break a rule.
    DenyArgs(ArgViolation),
}

impl Decision {
    /// Whether the call may run.
    pub fn is_allow(&self) -> bool {
        matches!(self, Decision::Allow)
    }

    /// The rule that decided, e.g. `allow`, `deny`, `default_deny`,
    /// `arg_rules.write_note.text.max_len`.
    pub fn rule(&self) -> String {
        match self {
            Decision::Allow => "allow".to_owned(),
            Decision::DenyTool(denial) => denial.rule().to_owned(),
            Decision::DenyArgs(violation) => violation.rule(),
        }
    }
}

/// A loaded, valid policy.
#[derive(Debug, Clone)]
pub struct Policy {
    // Names are validated as `ToolName` at load time and stored as plain strings so lookups by
    // `&str` are ordinary set and map lookups.
    allow: BTreeSet<String>,
    deny: BTreeSet<String>,
    arg_rules: BTreeMap<String, BTreeMap<String, ArgRule>>,
    idempotency: BTreeMap<String, Idempotency>,
    digest: Sha256Digest,
}

/// Whether re-running a tool's effect after its caller died mid-effect is harmless.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum EffectSafety {
    /// Re-running is harmless (the effect is itself idempotent): a dead caller's unfinished
    /// execution is taken over.
    Idempotent,
    /// Re-running could duplicate the effect: a dead caller's unfinished execution is reported as
    /// indeterminate and never re-run automatically.
    Unsafe,
}

/// A field of the first result that replays rewrite, so a caller can tell a replay from the
/// first execution (everything else is byte-identical).
#[derive(Debug, Clone, PartialEq, Eq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct ReplayMarker {
    /// JSON pointer into `structuredContent`, e.g. `/status`.
    pub pointer: String,
    /// The value written there on replays, e.g. `"replay"`.
    pub value: Value,
}

/// Per-tool exactly-once settings (policy key `idempotency`, optional).
#[derive(Debug, Clone, PartialEq, Eq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct Idempotency {
    /// The string argument holding the idempotency key. Without it (or when a call omits it) the
    /// request `_meta` key `io.toolgate/idempotencyKey` is used, and without that the key is the
    /// digest of the canonical arguments (a replay window of `window_secs`).
    #[serde(default)]
    pub key_argument: Option<String>,
    /// Whether re-running after a dead caller is harmless. Default `unsafe`.
    #[serde(default = "default_effect")]
    pub effect: EffectSafety,
    /// How long a completed result is kept for replays (default 86,400 s = 24 h).
    #[serde(default)]
    pub window_secs: Option<u64>,
    /// The field rewritten in replayed results.
    #[serde(default)]
    pub replay_marker: Option<ReplayMarker>,
}

fn default_effect() -> EffectSafety {
    EffectSafety::Unsafe
}

/// The on-disk shape of version 1. Unknown keys and duplicate keys are errors.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawPolicy {
    version: u64,
    #[serde(default)]
    allow: Vec<String>,
    #[serde(default)]
    deny: Vec<String>,
    #[serde(default)]
    arg_rules: UniqueMap<UniqueMap<ArgRule>>,
    #[serde(default)]
    idempotency: UniqueMap<Idempotency>,
}

/// A JSON object deserialized into a map that refuses duplicate keys (serde_json keeps the last one
/// silently, which in a policy would let a later entry quietly override an earlier one).
struct UniqueMap<V>(BTreeMap<String, V>);

impl<V> Default for UniqueMap<V> {
    fn default() -> Self {
        UniqueMap(BTreeMap::new())
    }
}

impl<'de, V: Deserialize<'de>> Deserialize<'de> for UniqueMap<V> {
    fn deserialize<D: de::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct UniqueVisitor<V>(std::marker::PhantomData<V>);
        impl<'de, V: Deserialize<'de>> Visitor<'de> for UniqueVisitor<V> {
            type Value = UniqueMap<V>;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a JSON object")
            }
            fn visit_map<A: MapAccess<'de>>(self, mut access: A) -> Result<Self::Value, A::Error> {
                let mut map = BTreeMap::new();
                while let Some((key, value)) = access.next_entry::<String, V>()? {
                    if map.contains_key(&key) {
                        return Err(de::Error::custom(format_args!("duplicate key `{key}`")));
                    }
                    map.insert(key, value);
                }
                Ok(UniqueMap(map))
            }
        }
        deserializer.deserialize_map(UniqueVisitor(std::marker::PhantomData))
    }
}

fn syntax(error: &serde_json::Error) -> PolicyError {
    PolicyError::Syntax {
        message: error
            .to_string()
            .split(" at line ")
            .next()
            .unwrap_or_default()
            .to_owned(),
        line: error.line(),
        column: error.column(),
    }
}

impl Policy {
    /// Reads and parses the policy file at `path`.
    pub fn load(path: &Path) -> Result<Self, PolicyError> {
        let text = std::fs::read_to_string(path).map_err(|source| PolicyError::Io {
            path: path.to_owned(),
            source,
        })?;
        Self::from_json(&text)
    }

    /// Parses a policy from JSON text.
    pub fn from_json(text: &str) -> Result<Self, PolicyError> {
        // Check the version before the strict parse, so that a file written for a newer format
        // reports "unsupported version" rather than an unknown key of that format.
        let loose: Value = serde_json::from_str(text).map_err(|e| syntax(&e))?;
        let Value::Object(top) = &loose else {
            return Err(PolicyError::Invalid {
                reason: "the policy must be a JSON object such as {\"version\":1,\"allow\":[...]}"
                    .to_owned(),
            });
        };
        match top.get("version").and_then(Value::as_u64) {
            None => return Err(PolicyError::MissingVersion),
            Some(SUPPORTED_VERSION) => {}
            Some(found) => return Err(PolicyError::UnsupportedVersion { found }),
        }
        let raw: RawPolicy = serde_json::from_str(text).map_err(|e| syntax(&e))?;
        debug_assert_eq!(raw.version, SUPPORTED_VERSION);

        let names = |list: Vec<String>, key: &str| -> Result<BTreeSet<String>, PolicyError> {
            list.into_iter()
                .map(|name| {
                    ToolName::new(&name)
                        .map(|valid| valid.0)
                        .map_err(|e| PolicyError::Invalid {
                            reason: format!("in \"{key}\": {e}"),
                        })
                })
                .collect()
        };
        let allow = names(raw.allow, "allow")?;
        let deny = names(raw.deny, "deny")?;

        let mut arg_rules = BTreeMap::new();
        for (tool, fields) in raw.arg_rules.0 {
            let tool = ToolName::new(&tool).map_err(|e| PolicyError::Invalid {
                reason: format!("in \"arg_rules\": {e}"),
            })?;
            for (field, rule) in &fields.0 {
                if field.is_empty() {
                    return Err(PolicyError::Invalid {
                        reason: format!(
                            "arg_rules.{tool} has an empty field name; name the argument the rule applies to"
                        ),
                    });
                }
                if let (Some(min), Some(max)) = (rule.min_len, rule.max_len)
                    && min > max
                {
                    return Err(PolicyError::Invalid {
                        reason: format!(
                            "arg_rules.{tool}.{field}: min_len {min} is greater than max_len {max}, so no value could pass; fix the bounds"
                        ),
                    });
                }
            }
            // A rule for a tool the policy never allows is at best dead and at worst a typo of
            // an allowed tool's name, which would silently leave that tool unruled.
            if !allow.contains(tool.as_str()) || deny.contains(tool.as_str()) {
                let allowed: Vec<&str> = allow
                    .iter()
                    .filter(|name| !deny.contains(*name))
                    .map(String::as_str)
                    .collect();
                return Err(PolicyError::Invalid {
                    reason: format!(
                        "arg_rules names `{tool}`, which the policy does not allow; rules apply only to allowed tools ({}): fix the tool name or remove the rule",
                        allowed.join(", ")
                    ),
                });
            }
            arg_rules.insert(tool.0, fields.0);
        }

        let mut idempotency = BTreeMap::new();
        for (tool, settings) in raw.idempotency.0 {
            let tool = ToolName::new(&tool).map_err(|e| PolicyError::Invalid {
                reason: format!("in \"idempotency\": {e}"),
            })?;
            if !allow.contains(tool.as_str()) || deny.contains(tool.as_str()) {
                return Err(PolicyError::Invalid {
                    reason: format!(
                        "idempotency names `{tool}`, which the policy does not allow; fix the tool name or remove the entry"
                    ),
                });
            }
            if settings.key_argument.as_deref() == Some("") {
                return Err(PolicyError::Invalid {
                    reason: format!(
                        "idempotency.{tool}.key_argument is empty; name the argument holding the key or remove it"
                    ),
                });
            }
            if let Some(marker) = &settings.replay_marker
                && !(marker.pointer.starts_with('/') && marker.pointer.len() > 1)
            {
                return Err(PolicyError::Invalid {
                    reason: format!(
                        "idempotency.{tool}.replay_marker.pointer {:?} is not a JSON pointer such as \"/status\"",
                        marker.pointer
                    ),
                });
            }
            if settings.window_secs == Some(0) {
                return Err(PolicyError::Invalid {
                    reason: format!(
                        "idempotency.{tool}.window_secs is 0, so nothing could replay; use at least 1"
                    ),
                });
            }
            idempotency.insert(tool.0, settings);
        }

        Ok(Policy {
            allow,
            deny,
            arg_rules,
            idempotency,
            digest: Sha256Digest::of_json(&loose),
        })
    }

    /// Whether `tool` appears in tools/list. Equivalent to "calls to it are not refused as a whole",
    /// so listing and calling can never disagree.
    pub fn visible(&self, tool: &str) -> bool {
        self.tool_denial(tool).is_none()
    }

    fn tool_denial(&self, tool: &str) -> Option<ToolDenial> {
        if self.deny.contains(tool) {
            Some(ToolDenial::DenyList)
        } else if self.allow.contains(tool) {
            None
        } else {
            Some(ToolDenial::NotListed)
        }
    }

    /// Decides one tools/call. `arguments` is the call's `arguments` object (absent = empty).
    pub fn decide(&self, tool: &str, arguments: Option<&Map<String, Value>>) -> Decision {
        if let Some(denial) = self.tool_denial(tool) {
            return Decision::DenyTool(denial);
        }
        let Some(rules) = self.arg_rules.get(tool) else {
            return Decision::Allow;
        };
        for (field, rule) in rules {
            let violation = match arguments.and_then(|args| args.get(field)) {
                None => Some(Violation::Missing),
                Some(Value::String(text)) => {
                    let actual = u64::try_from(text.chars().count()).unwrap_or(u64::MAX);
                    match (rule.min_len, rule.max_len) {
                        (Some(min_len), _) if actual < min_len => {
                            Some(Violation::TooShort { min_len, actual })
                        }
                        (_, Some(max_len)) if actual > max_len => {
                            Some(Violation::TooLong { max_len, actual })
                        }
                        _ => None,
                    }
                }
                Some(_) => Some(Violation::NotString),
            };
            if let Some(violation) = violation {
                return Decision::DenyArgs(ArgViolation {
                    tool: tool.to_owned(),
                    field: field.clone(),
                    violation,
                });
            }
        }
        Decision::Allow
    }

    /// The SHA-256 of the canonical JSON of the policy file as loaded: names the policy in force
    /// independently of whitespace and key order.
    pub fn digest(&self) -> Sha256Digest {
        self.digest
    }

    /// A digest of every rule of this policy that applies to `tool`: whether it is allowed, whether
    /// it is denied, and its argument rules. Two policies give a tool the same fingerprint exactly
    /// when they treat its calls the same way, whatever else they say about other tools.
    pub fn fingerprint(&self, tool: &str) -> Sha256Digest {
        let rules: Map<String, Value> = self
            .arg_rules(tool)
            .map(|fields| {
                fields
                    .iter()
                    .map(|(field, rule)| {
                        let mut bounds = Map::new();
                        if let Some(min) = rule.min_len {
                            bounds.insert("min_len".to_owned(), Value::from(min));
                        }
                        if let Some(max) = rule.max_len {
                            bounds.insert("max_len".to_owned(), Value::from(max));
                        }
                        (field.clone(), Value::Object(bounds))
                    })
                    .collect()
            })
            .unwrap_or_default();
        let mut rules_of_tool = serde_json::json!({
            "version": SUPPORTED_VERSION,
            "tool": tool,
            "allow": self.allow.contains(tool),
            "deny": self.deny.contains(tool),
            "arg_rules": rules,
        });
        // Present only when configured, so policies without the key keep their fingerprints.
        if let (Some(settings), Value::Object(map)) = (self.idempotency(tool), &mut rules_of_tool) {
            map.insert(
                "idempotency".to_owned(),
                serde_json::to_value(settings).unwrap_or(Value::Null),
            );
        }
        Sha256Digest::of_json(&rules_of_tool)
    }

    /// The exactly-once settings of `tool`, when the policy opts it in.
    pub fn idempotency(&self, tool: &str) -> Option<&Idempotency> {
        self.idempotency.get(tool)
    }

    /// The tools the policy allows (before `deny` is applied).
    pub fn allowed(&self) -> impl Iterator<Item = &str> {
        self.allow.iter().map(String::as_str)
    }

    /// The tools the policy denies explicitly.
    pub fn denied(&self) -> impl Iterator<Item = &str> {
        self.deny.iter().map(String::as_str)
    }

    /// The argument rules of `tool`, keyed by argument name.
    pub fn arg_rules(&self, tool: &str) -> Option<&BTreeMap<String, ArgRule>> {
        self.arg_rules.get(tool)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    const REFERENCE: &str = include_str!("../../../fixtures/policy.json");

    fn reference() -> Policy {
        Policy::from_json(REFERENCE).expect("the reference policy loads")
    }

    fn args_of(value: &Value) -> Map<String, Value> {
        args(value.clone())
    }

    fn args(value: Value) -> Map<String, Value> {
        match value {
            Value::Object(map) => map,
            _ => panic!("test arguments must be an object"),
        }
    }

    /// One data-driven check: (tool, arguments) -> the rule that decided.
    fn check(policy: &Policy, tool: &str, arguments: Value, expected_rule: &str) {
        let decision = policy.decide(tool, Some(&args(arguments.clone())));
        assert_eq!(decision.rule(), expected_rule, "{tool} {arguments}");
    }

    #[test]
    fn seed_policy_loads_unchanged_and_decides() {
        let p = reference();
        // The seed article's file, byte for byte, loads and decides like the reference policy
        // (which adds only exactly-once settings); its digest ignores whitespace.
        let seed = include_str!("../../../fixtures/policies/seed.json");
        let compact = Policy::from_json(seed).expect("seed text loads");
        let reformatted = serde_json::to_string_pretty(
            &serde_json::from_str::<Value>(seed).expect("seed is JSON"),
        )
        .expect("serializes");
        let pretty = Policy::from_json(&reformatted).expect("loads");
        assert_eq!(
            compact.digest(),
            pretty.digest(),
            "digest ignores whitespace"
        );
        assert!(compact.idempotency("write_note").is_none());
        for (tool, args) in [
            (
                "write_note",
                json!({"request_id": "req-0001", "text": "hi"}),
            ),
            ("write_note", json!({"request_id": "short", "text": "hi"})),
            ("rm_rf", json!({"path": "/"})),
            ("read_ledger", json!({})),
            ("other", json!({})),
        ] {
            assert_eq!(
                compact.decide(tool, Some(&args_of(&args))),
                p.decide(tool, Some(&args_of(&args))),
                "{tool} {args}"
            );
        }

        check(
            &p,
            "write_note",
            json!({"request_id": "req-0001", "text": "hi"}),
            "allow",
        );
        check(&p, "read_ledger", json!({}), "allow");
        check(&p, "rm_rf", json!({"path": "/"}), "deny");
        check(&p, "unknown_tool", json!({}), "default_deny");
        check(
            &p,
            "write_note",
            json!({"request_id": "short", "text": "hi"}),
            "arg_rules.write_note.request_id.min_len",
        );
        check(
            &p,
            "write_note",
            json!({"request_id": "req-0001", "text": "x".repeat(2001)}),
            "arg_rules.write_note.text.max_len",
        );
        check(
            &p,
            "write_note",
            json!({"request_id": "req-0001", "text": "x".repeat(2000)}),
            "allow",
        );
        check(
            &p,
            "write_note",
            json!({"text": "hi"}),
            "arg_rules.write_note.request_id.type",
        );
        check(
            &p,
            "write_note",
            json!({"request_id": 12345678, "text": "hi"}),
            "arg_rules.write_note.request_id.type",
        );
        assert!(p.visible("write_note") && p.visible("read_ledger"));
        assert!(!p.visible("rm_rf") && !p.visible("nope"));
        assert_eq!(p.decide("read_ledger", None), Decision::Allow);
        assert_eq!(
            p.decide("write_note", None).rule(),
            "arg_rules.write_note.request_id.type"
        );
    }

    #[test]
    fn lengths_count_characters_not_bytes() {
        let p = reference();
        // Eight two-byte characters satisfy min_len 8; seven do not.
        check(
            &p,
            "write_note",
            json!({"request_id": "éééééééé", "text": ""}),
            "allow",
        );
        check(
            &p,
            "write_note",
            json!({"request_id": "ééééééé", "text": ""}),
            "arg_rules.write_note.request_id.min_len",
        );
    }

    #[test]
    fn deny_wins_over_allow() {
        let p = Policy::from_json(r#"{"version":1,"allow":["a"],"deny":["a"]}"#).expect("loads");
        check(&p, "a", json!({}), "deny");
        assert!(!p.visible("a"));
    }

    #[test]
    fn violation_messages_name_field_rule_and_fix_without_the_value() {
        let p = reference();
        let secret = "s3cret!";
        let Decision::DenyArgs(v) = p.decide(
            "write_note",
            Some(&args(json!({"request_id": secret, "text": ""}))),
        ) else {
            panic!("expected an argument violation");
        };
        let message = v.message();
        assert!(message.starts_with("Error:"), "{message}");
        assert!(
            message.contains("request_id")
                && message.contains("min_len")
                && message.contains("at least 8")
        );
        assert!(
            !message.contains(secret),
            "a message must not echo the argument"
        );
    }

    fn load_error(text: &str) -> String {
        Policy::from_json(text)
            .expect_err("must be rejected")
            .to_string()
    }

    #[test]
    fn strict_loading_names_the_problem() {
        let e = load_error(r#"{"version":1,"alow":["write_note"]}"#);
        assert!(
            e.contains("alow") && e.contains("allow") && e.contains("arg_rules"),
            "{e}"
        );
        let e = load_error(r#"{"version":1,"arg_rules":{"t":{"f":{"minlen":3}}}}"#);
        assert!(e.contains("minlen") && e.contains("min_len"), "{e}");
        let e = load_error(r#"{"version":2,"allow":[]}"#);
        assert!(e.contains("unsupported policy version 2"), "{e}");
        let e = load_error(r#"{"allow":[]}"#);
        assert!(e.contains("version"), "{e}");
        let e = load_error(r#"{"version":"1"}"#);
        assert!(e.contains("version"), "{e}");
        let e = load_error("{not json");
        assert!(e.contains("line 1"), "{e}");
        let e = load_error("[]");
        assert!(e.contains("JSON object"), "{e}");
        let e = load_error(r#"{"version":1,"allow":["has space"]}"#);
        assert!(e.contains("has space") && e.contains("tool name"), "{e}");
        let e = load_error(
            r#"{"version":1,"allow":["write_note"],"arg_rules":{"write_notes":{"text":{"max_len":9}}}}"#,
        );
        assert!(
            e.contains("write_notes") && e.contains("write_note)"),
            "{e}"
        );
        let e = load_error(
            r#"{"version":1,"allow":["a"],"deny":["a"],"arg_rules":{"a":{"f":{"max_len":9}}}}"#,
        );
        assert!(e.contains("does not allow"), "{e}");
        let e = load_error(r#"{"version":1,"arg_rules":{"t":{"f":{"min_len":5,"max_len":2}}}}"#);
        assert!(e.contains("min_len 5") && e.contains("max_len 2"), "{e}");
        let e = load_error(r#"{"version":1,"arg_rules":{"t":{"f":{"min_len":1}},"t":{}}}"#);
        assert!(e.contains("duplicate key `t`"), "{e}");
        let e = load_error(r#"{"version":1,"allow":[],"allow":["rm_rf"]}"#);
        assert!(e.contains("duplicate field"), "{e}");
        let e = load_error(r#"{"version":1,"arg_rules":{"t":{"f":{"min_len":-1}}}}"#);
        assert!(e.contains("invalid value"), "{e}");
    }

    #[test]
    fn load_reports_missing_file_with_path() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("absent.json");
        let e = Policy::load(&path).expect_err("missing file").to_string();
        assert!(
            e.contains("absent.json") && e.contains("POLICY_PATH"),
            "{e}"
        );
    }

    #[test]
    fn fingerprint_changes_only_with_the_tools_own_rules() {
        let p =
            Policy::from_json(include_str!("../../../fixtures/policies/seed.json")).expect("loads");
        let other_tools_changed = Policy::from_json(
            r#"{"version":1,"allow":["write_note","read_ledger","extra"],"deny":["rm_rf","x"],
                "arg_rules":{"write_note":{"request_id":{"min_len":8},"text":{"max_len":2000}}}}"#,
        )
        .expect("loads");
        assert_eq!(
            p.fingerprint("write_note"),
            other_tools_changed.fingerprint("write_note")
        );
        let bound_changed = Policy::from_json(
            r#"{"version":1,"allow":["write_note"],"arg_rules":{"write_note":{"request_id":{"min_len":9},"text":{"max_len":2000}}}}"#,
        )
        .expect("loads");
        assert_ne!(
            p.fingerprint("write_note"),
            bound_changed.fingerprint("write_note")
        );
        assert_ne!(p.fingerprint("write_note"), p.fingerprint("read_ledger"));
        let denied =
            Policy::from_json(r#"{"version":1,"allow":["read_ledger"],"deny":["read_ledger"]}"#)
                .expect("loads");
        assert_ne!(
            p.fingerprint("read_ledger"),
            denied.fingerprint("read_ledger")
        );
    }

    #[test]
    fn idempotency_settings_load_strictly() {
        let p = Policy::from_json(
            r#"{"version":1,"allow":["write_note"],"idempotency":{"write_note":{"key_argument":"request_id","effect":"idempotent","replay_marker":{"pointer":"/status","value":"replay"}}}}"#,
        )
        .expect("loads");
        let settings = p.idempotency("write_note").expect("configured");
        assert_eq!(settings.key_argument.as_deref(), Some("request_id"));
        assert_eq!(settings.effect, EffectSafety::Idempotent);
        assert!(p.idempotency("read_ledger").is_none());
        let plain = Policy::from_json(r#"{"version":1,"allow":["write_note"]}"#).expect("loads");
        assert_ne!(p.fingerprint("write_note"), plain.fingerprint("write_note"));
        let defaults = Policy::from_json(r#"{"version":1,"allow":["t"],"idempotency":{"t":{}}}"#)
            .expect("loads");
        assert_eq!(
            defaults.idempotency("t").expect("set").effect,
            EffectSafety::Unsafe
        );

        let e = load_error(r#"{"version":1,"allow":["t"],"idempotency":{"t":{"efect":"unsafe"}}}"#);
        assert!(e.contains("efect") && e.contains("effect"), "{e}");
        let e = load_error(r#"{"version":1,"allow":["t"],"idempotency":{"u":{}}}"#);
        assert!(e.contains("does not allow"), "{e}");
        let e = load_error(r#"{"version":1,"allow":["t"],"idempotency":{"t":{"effect":"maybe"}}}"#);
        assert!(e.contains("maybe"), "{e}");
        let e = load_error(
            r#"{"version":1,"allow":["t"],"idempotency":{"t":{"replay_marker":{"pointer":"status","value":1}}}}"#,
        );
        assert!(e.contains("JSON pointer"), "{e}");
        let e = load_error(r#"{"version":1,"allow":["t"],"idempotency":{"t":{"window_secs":0}}}"#);
        assert!(e.contains("window_secs"), "{e}");
    }

    #[test]
    fn empty_lists_deny_everything() {
        let p = Policy::from_json(r#"{"version":1}"#).expect("loads");
        check(&p, "write_note", json!({}), "default_deny");
    }
}
