//! The versioned tool policy and its pure decision function.
//!
//! A [`Policy`] is loaded once (the only I/O this crate does) and is valid by construction: the
//! loader rejects unknown keys, duplicate keys, unsupported versions and contradictory rules, so a
//! typo can never silently weaken what the server enforces. After loading, [`Policy::decide`] and
//! [`Policy::visible`] (and their per-principal forms [`Policy::decide_for`] and
//! [`Policy::visible_for`]) are pure functions of the policy and their inputs.
//!
//! Semantics of version 1 (the complete reference is `docs/policy.md`):
//! - a tool listed in `deny` is denied, even when it is also in `allow` (deny wins);
//! - a tool in neither list is denied (default deny);
//! - an allowed tool whose arguments break one of its `arg_rules` is refused for that call only;
//!   a ruled field that is missing breaks the rule unless the rule is `optional`;
//! - for a principal named under `principals`, a tool is allowed when it is in `allow` or the
//!   principal's `allow` and in neither `deny` nor the principal's `deny`; its arguments must pass
//!   the top-level rules and then the principal's rules. Any other principal gets the top-level
//!   policy.
//!
//! Lengths are counted in Unicode scalar values (what a person calls characters), not bytes.

#![forbid(unsafe_code)]

#[cfg(feature = "cedar")]
pub mod cedar;
pub mod credential;
mod load;
mod principal;
mod raw;
mod results;
mod rules;
mod schema_walk;
mod sections;
mod untrusted;

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};
use toolgate_canon::Sha256Digest;

pub use principal::Principal;
pub use raw::{SCHEMA_ID, json_schema};
pub use results::ResultFields;
pub use rules::{ArgRule, ArgType, ArgViolation, PATTERN_SIZE_LIMIT, PathRule, Violation};
pub use sections::{
    Batch, BatchCall, BatchProblem, BatchViolation, DuplicateGuard, EffectClass, Rate, Versioned,
};
pub use untrusted::{
    DEFAULT_UNTRUSTED_MAX_CHARS, MAX_UNTRUSTED_MAX_CHARS, TRUNCATION_MARK, UNTRUSTED_NOTE,
    UntrustedOutput, untrusted_wrapper,
};

use principal::PrincipalSection;

/// The only policy format version this build understands.
pub const SUPPORTED_VERSION: u64 = 1;

/// The confirmation window when the policy does not set `confirmation.ttl_secs`.
pub const DEFAULT_CONFIRMATION_TTL_SECS: u64 = 300;

/// The longest allowed `confirmation.ttl_secs` (one day).
pub const MAX_CONFIRMATION_TTL_SECS: u64 = 86_400;

/// The largest policy file [`Policy::load`] reads (4 MiB: a 1,000-rule policy is about 100 KiB).
pub const MAX_POLICY_FILE_BYTES: u64 = 4 << 20;

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
    /// The Cedar policies the policy names do not parse, or do not fit the tools.
    #[cfg(feature = "cedar")]
    #[error("{0}")]
    Cedar(Box<cedar::CedarError>),
    /// The file at `path` was read but its text is not a valid policy ([`Policy::load`]): a
    /// syntax, version or validity error, which `error` describes. The message names the file,
    /// so that a server with several policies (or an operator with several copies) knows which
    /// one to fix.
    #[error("policy file {path}: {error}", path = .path.display())]
    File {
        /// The file that was read.
        path: PathBuf,
        /// What is wrong with its text. Shown in this error's message rather than as its
        /// `source`, so that a cause chain printed in full does not repeat it.
        error: Box<PolicyError>,
    },
}

/// A tool name as MCP allows it: 1 to 128 characters from `A-Z a-z 0-9 _ - .`.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct ToolName(String);

impl ToolName {
    /// Checks `name` against the MCP tool-name grammar.
    pub fn new(name: &str) -> Result<Self, PolicyError> {
        if toolgate_canon::names::is_tool_name(name) {
            Ok(ToolName(name.to_owned()))
        } else {
            Err(PolicyError::Invalid {
                reason: format!(
                    "{name:?} is not a valid tool name; use {}",
                    toolgate_canon::names::TOOL_GRAMMAR
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

/// Why a tool is refused as a whole (hidden from tools/list, -32602 on tools/call).
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum ToolDenial {
    /// The tool is listed in `deny`.
    DenyList,
    /// The tool is in neither `allow` nor `deny` (nor the caller's `principals.<p>.allow`).
    NotListed,
    /// The tool is listed in `principals.<principal>.deny`.
    PrincipalDenyList {
        /// The principal whose section denies the tool.
        principal: String,
    },
}

impl ToolDenial {
    /// The rule that decided, as written in audit records: `deny`, `default_deny` or
    /// `principals.<principal>.deny`.
    pub fn rule(&self) -> String {
        match self {
            ToolDenial::DenyList => "deny".to_owned(),
            ToolDenial::NotListed => "default_deny".to_owned(),
            ToolDenial::PrincipalDenyList { principal } => format!("principals.{principal}.deny"),
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

    /// The rule that decided, e.g. `allow`, `deny`, `default_deny`, `principals.bob.deny`,
    /// `arg_rules.write_note.text.max_len`, `principals.bob.arg_rules.write_note.text.pattern`.
    pub fn rule(&self) -> String {
        match self {
            Decision::Allow => "allow".to_owned(),
            Decision::DenyTool(denial) => denial.rule(),
            Decision::DenyArgs(violation) => violation.rule(),
        }
    }
}

/// A loaded, valid policy.
#[derive(Debug, Clone)]
pub struct Policy {
    // Names are validated as `ToolName` at load time and stored as plain strings so lookups by
    // `&str` are ordinary set and map lookups.
    pub(crate) allow: BTreeSet<String>,
    pub(crate) deny: BTreeSet<String>,
    pub(crate) arg_rules: BTreeMap<String, BTreeMap<String, ArgRule>>,
    pub(crate) idempotency: BTreeMap<String, Idempotency>,
    pub(crate) effects: BTreeMap<String, EffectClass>,
    pub(crate) confirmation_ttl_secs: u64,
    pub(crate) batch: BTreeMap<String, Batch>,
    pub(crate) tool_rates: BTreeMap<String, Rate>,
    pub(crate) principal_rates: BTreeMap<String, Rate>,
    pub(crate) halt_exempt: BTreeSet<String>,
    pub(crate) principals: BTreeMap<String, PrincipalSection>,
    pub(crate) untrusted_output: BTreeMap<String, UntrustedOutput>,
    pub(crate) versions: BTreeMap<String, Versioned>,
    pub(crate) duplicates: BTreeMap<String, DuplicateGuard>,
    pub(crate) results: BTreeMap<String, ResultFields>,
    /// Tool -> the OAuth scopes that grant it (any one suffices).
    pub(crate) scopes: BTreeMap<String, BTreeSet<String>>,
    /// What a proxied upstream may ask of the host (`proxy.host_requests`).
    pub(crate) host_requests: BTreeSet<HostRequest>,
    /// Proxied tools whose text reaches the host unwrapped (`proxy.trusted_output`).
    pub(crate) trusted_output: BTreeSet<String>,
    /// The Cedar policies the file names (`cedar`), read with it.
    pub(crate) cedar: Option<CedarSource>,
    /// Each tool's tags (`tags`), which Cedar policies read as `resource.tags`.
    pub(crate) tags: BTreeMap<String, BTreeSet<String>>,
    pub(crate) digest: Sha256Digest,
}

/// The text of the operator's file at `path`: a regular file (a link to one is followed) of at
/// most `max_bytes`, read without blocking on a FIFO or a device; a missing file is `NotFound`.
pub(crate) fn read_text(path: &Path, max_bytes: u64) -> std::io::Result<String> {
    toolgate_storage::read_regular_text(path, max_bytes, toolgate_storage::Symlinks::Follow)?
        .ok_or_else(|| std::io::ErrorKind::NotFound.into())
}

/// The largest Cedar policy file read, in bytes.
pub const MAX_CEDAR_FILE_BYTES: u64 = 4 << 20;

/// The Cedar policies a policy names (its key `cedar`): the file and its text, read when the
/// policy is loaded (and its syntax checked, in a build with the feature `cedar`). A gate
/// validates them against its tools' contracts (`toolgate_policy::cedar::CedarPolicies`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CedarSource {
    path: PathBuf,
    text: std::sync::Arc<str>,
    digest: Sha256Digest,
}

impl CedarSource {
    /// Reads the Cedar file at `path` (at most [`MAX_CEDAR_FILE_BYTES`], a regular file or a
    /// link to one). A build without the feature `cedar` refuses it: a policy whose Cedar step
    /// could not run must not load as if it had none.
    pub(crate) fn read(path: &Path) -> Result<Self, PolicyError> {
        let text = read_text(path, MAX_CEDAR_FILE_BYTES).map_err(|source| PolicyError::Io {
            path: path.to_owned(),
            source,
        })?;
        #[cfg(not(feature = "cedar"))]
        {
            let _ = text;
            Err(PolicyError::Invalid {
                reason: format!(
                    "the policy names Cedar policies ({}) but this build has no Cedar support; build with the feature `cedar` (on by default in toolgate-server), or remove the key \"cedar\"",
                    path.display()
                ),
            })
        }
        #[cfg(feature = "cedar")]
        {
            let source = CedarSource {
                path: path.to_owned(),
                digest: Sha256Digest::of(text.as_bytes()),
                text: text.into(),
            };
            cedar::check_syntax(&source).map_err(|error| PolicyError::Cedar(Box::new(error)))?;
            Ok(source)
        }
    }

    /// The file.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Its text.
    pub fn text(&self) -> &str {
        &self.text
    }

    /// The SHA-256 of its text: the digest of the policy set, in every audit record it decides.
    pub fn digest(&self) -> Sha256Digest {
        self.digest
    }
}

/// A tool as Cedar sees it (from the tool's contract in `toolgate.lock`): its name, the JSON
/// Schema of its arguments (the call action's context), and the attributes of the resource
/// `Toolgate::Tool` (its annotations with the spec's defaults, and its effect class).
#[derive(Debug, Clone, PartialEq)]
pub struct ToolSignature {
    /// The tool's name (the call action's id).
    pub name: String,
    /// The tool's `inputSchema`.
    pub input_schema: Value,
    /// `readOnlyHint` (default false).
    pub read_only: bool,
    /// `destructiveHint` (default true).
    pub destructive: bool,
    /// `idempotentHint` (default false).
    pub idempotent: bool,
    /// `openWorldHint` (default true).
    pub open_world: bool,
    /// Its effect class in the JSON policy's `effects`, if any.
    pub effect: Option<String>,
    /// Its tags in the JSON policy's `tags`.
    pub tags: BTreeSet<String>,
}

impl ToolSignature {
    /// The tool `name` with `input_schema`, its annotations at the spec's defaults and no
    /// effect class.
    pub fn new(name: impl Into<String>, input_schema: Value) -> Self {
        ToolSignature {
            name: name.into(),
            input_schema,
            read_only: false,
            destructive: true,
            idempotent: false,
            open_world: true,
            effect: None,
            tags: BTreeSet::new(),
        }
    }
}

/// A request a proxied upstream sends to the host (`proxy.host_requests`). A proxy forwards one
/// only when the host declared the capability and the policy lists it; by default none is.
#[derive(
    Debug,
    Clone,
    Copy,
    PartialEq,
    Eq,
    PartialOrd,
    Ord,
    Hash,
    Deserialize,
    Serialize,
    schemars::JsonSchema,
)]
#[serde(rename_all = "lowercase")]
#[non_exhaustive]
pub enum HostRequest {
    /// `sampling/createMessage`: the upstream asks the host's model to write a message.
    Sampling,
    /// `elicitation/create`: the upstream asks the person at the host for input.
    Elicitation,
    /// `roots/list`: the upstream asks which directories the host exposes.
    Roots,
}

impl HostRequest {
    /// The name used in the policy file (`sampling`, `elicitation`, `roots`).
    pub fn as_str(self) -> &'static str {
        match self {
            HostRequest::Sampling => "sampling",
            HostRequest::Elicitation => "elicitation",
            HostRequest::Roots => "roots",
        }
    }

    /// The JSON-RPC method of the request.
    pub fn method(self) -> &'static str {
        match self {
            HostRequest::Sampling => "sampling/createMessage",
            HostRequest::Elicitation => "elicitation/create",
            HostRequest::Roots => "roots/list",
        }
    }
}

/// Whether re-running a tool's effect after its caller died mid-effect is harmless.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Serialize, schemars::JsonSchema)]
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
#[derive(Debug, Clone, PartialEq, Eq, Deserialize, Serialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ReplayMarker {
    /// JSON pointer into `structuredContent`, e.g. `/status`.
    pub pointer: String,
    /// The value written there on replays, e.g. `"replay"`.
    pub value: Value,
}

/// Per-tool exactly-once settings (policy key `idempotency`, optional).
#[derive(Debug, Clone, PartialEq, Eq, Deserialize, Serialize, schemars::JsonSchema)]
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

impl Policy {
    /// Reads and parses the policy file at `path`.
    ///
    /// The file must be a regular file (a link to one is followed) of at most
    /// [`MAX_POLICY_FILE_BYTES`]: a FIFO, a device or a larger file is refused without blocking
    /// or reading it whole.
    pub fn load(path: &Path) -> Result<Self, PolicyError> {
        let text = read_text(path, MAX_POLICY_FILE_BYTES).map_err(|source| PolicyError::Io {
            path: path.to_owned(),
            source,
        })?;
        Self::from_json_in(&text, path.parent()).map_err(|error| PolicyError::File {
            path: path.to_owned(),
            error: Box::new(error),
        })
    }

    /// Whether `tool` appears in tools/list for a caller without a `principals` section.
    /// Equivalent to "calls to it are not refused as a whole", so listing and calling can never
    /// disagree.
    pub fn visible(&self, tool: &str) -> bool {
        self.tool_denial(None, tool).is_none()
    }

    /// Whether `tool` appears in tools/list for `principal` (the top-level policy when the
    /// principal has no section). Agrees with [`Policy::decide_for`] refusing the tool as a whole.
    pub fn visible_for(&self, principal: &str, tool: &str) -> bool {
        self.tool_denial(self.section(principal), tool).is_none()
    }

    fn section(&self, principal: &str) -> Option<(&str, &PrincipalSection)> {
        self.principals
            .get_key_value(principal)
            .map(|(name, section)| (name.as_str(), section))
    }

    fn tool_denial(
        &self,
        section: Option<(&str, &PrincipalSection)>,
        tool: &str,
    ) -> Option<ToolDenial> {
        if self.deny.contains(tool) {
            return Some(ToolDenial::DenyList);
        }
        if let Some((name, section)) = section {
            if section.deny.contains(tool) {
                return Some(ToolDenial::PrincipalDenyList {
                    principal: name.to_owned(),
                });
            }
            if section.allow.contains(tool) {
                return None;
            }
        }
        if self.allow.contains(tool) {
            None
        } else {
            Some(ToolDenial::NotListed)
        }
    }

    /// Decides one tools/call of a caller without a `principals` section. `arguments` is the
    /// call's `arguments` object (absent = empty).
    pub fn decide(&self, tool: &str, arguments: Option<&Map<String, Value>>) -> Decision {
        self.decide_in(None, tool, arguments)
    }

    /// Decides one tools/call of `principal`: the top-level policy merged with
    /// `principals.<principal>` when there is such a section.
    pub fn decide_for(
        &self,
        principal: &str,
        tool: &str,
        arguments: Option<&Map<String, Value>>,
    ) -> Decision {
        self.decide_in(self.section(principal), tool, arguments)
    }

    fn decide_in(
        &self,
        section: Option<(&str, &PrincipalSection)>,
        tool: &str,
        arguments: Option<&Map<String, Value>>,
    ) -> Decision {
        if let Some(denial) = self.tool_denial(section, tool) {
            return Decision::DenyTool(denial);
        }
        if let Some(rules) = self.arg_rules.get(tool)
            && let Some(violation) = check_rules(rules, None, tool, arguments)
        {
            return Decision::DenyArgs(violation);
        }
        if let Some((name, section)) = section
            && let Some(rules) = section.arg_rules.get(tool)
            && let Some(violation) = check_rules(rules, Some(name), tool, arguments)
        {
            return Decision::DenyArgs(violation);
        }
        Decision::Allow
    }

    /// The `path` rules that apply to calls of `tool` by `principal` (`None` = a caller without
    /// a section): the top-level ones, then the principal's, as (argument name, rule). The gate
    /// uses them after an `Allow` to resolve symbolic links, which this crate does not do.
    pub fn path_rules(&self, principal: Option<&str>, tool: &str) -> Vec<(&str, &PathRule)> {
        let top = self.arg_rules.get(tool).into_iter();
        let own = principal
            .and_then(|p| self.principals.get(p))
            .and_then(|section| section.arg_rules.get(tool))
            .into_iter();
        top.chain(own)
            .flat_map(|fields| fields.iter())
            .filter_map(|(field, rule)| rule.path().map(|path| (field.as_str(), path)))
            .collect()
    }

    /// The Cedar policies this policy names (`cedar`), if any.
    pub fn cedar(&self) -> Option<&CedarSource> {
        self.cedar.as_ref()
    }

    /// The SHA-256 of the canonical JSON of the policy file as loaded: names the policy in force
    /// independently of whitespace and key order. With Cedar policies (`cedar`) it covers their
    /// text too: the digest of `{"json": <that digest>, "cedar": <the Cedar text's digest>}`.
    pub fn digest(&self) -> Sha256Digest {
        self.digest
    }

    /// A digest of every rule of this policy that applies to `tool`: whether it is allowed, whether
    /// it is denied, and its argument rules; and, only when the policy sets them for the tool, its
    /// idempotency, effect class (with the confirmation window when the class needs confirmation),
    /// batch, rate limit, kill-switch exemption, untrusted-output settings, version argument,
    /// duplicate guard, result allow-list and the principal sections that mention it. Two policies give a tool the same fingerprint exactly when they
    /// treat its calls the same way, whatever else they say about other tools.
    pub fn fingerprint(&self, tool: &str) -> Sha256Digest {
        let rules_json = |fields: &BTreeMap<String, ArgRule>| -> Map<String, Value> {
            fields
                .iter()
                .map(|(field, rule)| (field.clone(), rule.spec()))
                .collect()
        };
        let rules: Map<String, Value> = self.arg_rules(tool).map(rules_json).unwrap_or_default();
        let mut map = Map::new();
        map.insert("version".to_owned(), Value::from(SUPPORTED_VERSION));
        map.insert("tool".to_owned(), Value::from(tool));
        map.insert("allow".to_owned(), Value::from(self.allow.contains(tool)));
        map.insert("deny".to_owned(), Value::from(self.deny.contains(tool)));
        map.insert("arg_rules".to_owned(), Value::Object(rules));
        // Everything below is present only when configured, so policies without these keys keep
        // their fingerprints.
        if let Some(settings) = self.idempotency(tool) {
            map.insert(
                "idempotency".to_owned(),
                serde_json::to_value(settings).unwrap_or(Value::Null),
            );
        }
        if let Some(effect) = self.effect_class(tool) {
            map.insert("effect".to_owned(), Value::from(effect.as_str()));
            if effect.needs_confirmation() {
                map.insert(
                    "confirmation_ttl_secs".to_owned(),
                    Value::from(self.confirmation_ttl_secs),
                );
            }
        }
        if let Some(batch) = self.batch(tool) {
            map.insert(
                "batch".to_owned(),
                serde_json::to_value(batch).unwrap_or(Value::Null),
            );
        }
        if let Some(rate) = self.tool_rate(tool) {
            map.insert(
                "rate_limit".to_owned(),
                serde_json::to_value(rate).unwrap_or(Value::Null),
            );
        }
        if self.halt_exempt(tool) {
            map.insert("halt_exempt".to_owned(), Value::Bool(true));
        }
        if let Some(scopes) = self.required_scopes(tool) {
            map.insert(
                "scopes".to_owned(),
                serde_json::to_value(scopes).unwrap_or(Value::Null),
            );
        }
        if let Some(untrusted) = self.untrusted_output(tool) {
            map.insert(
                "untrusted_output".to_owned(),
                serde_json::json!({
                    "fields": untrusted.fields(),
                    "max_chars": untrusted.max_chars(),
                }),
            );
        }
        if let Some(versioned) = self.versions(tool) {
            map.insert(
                "versions".to_owned(),
                serde_json::to_value(versioned).unwrap_or(Value::Null),
            );
        }
        if let Some(guard) = self.duplicates(tool) {
            map.insert(
                "duplicates".to_owned(),
                serde_json::to_value(guard).unwrap_or(Value::Null),
            );
        }
        if let Some(results) = self.results(tool) {
            map.insert(
                "results".to_owned(),
                serde_json::json!({"fields": results.fields()}),
            );
        }
        let principals: Map<String, Value> = self
            .principals
            .iter()
            .filter(|(_, section)| section.mentions(tool))
            .map(|(name, section)| {
                let rules = section
                    .arg_rules
                    .get(tool)
                    .map(rules_json)
                    .unwrap_or_default();
                (
                    name.clone(),
                    serde_json::json!({
                        "allow": section.allow.contains(tool),
                        "deny": section.deny.contains(tool),
                        "arg_rules": rules,
                    }),
                )
            })
            .collect();
        if !principals.is_empty() {
            map.insert("principals".to_owned(), Value::Object(principals));
        }
        Sha256Digest::of_json(&Value::Object(map))
    }

    /// The exactly-once settings of `tool`, when the policy opts it in.
    pub fn idempotency(&self, tool: &str) -> Option<&Idempotency> {
        self.idempotency.get(tool)
    }

    /// The tools the policy allows at top level (before `deny` is applied; principal sections
    /// not included).
    pub fn allowed(&self) -> impl Iterator<Item = &str> {
        self.allow.iter().map(String::as_str)
    }

    /// The tools the policy denies explicitly at top level.
    pub fn denied(&self) -> impl Iterator<Item = &str> {
        self.deny.iter().map(String::as_str)
    }

    /// The top-level argument rules of `tool`, keyed by argument name.
    pub fn arg_rules(&self, tool: &str) -> Option<&BTreeMap<String, ArgRule>> {
        self.arg_rules.get(tool)
    }

    /// The principals that have a `principals` section.
    pub fn principals(&self) -> impl Iterator<Item = &str> {
        self.principals.keys().map(String::as_str)
    }

    /// The argument rules `principals.<principal>.arg_rules.<tool>` (checked after the top-level
    /// ones).
    pub fn principal_arg_rules(
        &self,
        principal: &str,
        tool: &str,
    ) -> Option<&BTreeMap<String, ArgRule>> {
        self.principals.get(principal)?.arg_rules.get(tool)
    }

    /// The effect class of `tool` (policy key `effects`).
    pub fn effect_class(&self, tool: &str) -> Option<EffectClass> {
        self.effects.get(tool).copied()
    }

    /// The tags of `tool` (policy key `tags`; empty when it has none), which Cedar policies read
    /// as `resource.tags`.
    pub fn tags(&self, tool: &str) -> Option<&BTreeSet<String>> {
        self.tags.get(tool)
    }

    /// `tool` as the policy describes it to Cedar: its effect class and tags added to what the
    /// tool's contract says.
    pub fn signature(&self, tool: &ToolSignature) -> ToolSignature {
        ToolSignature {
            effect: self.effect_class(&tool.name).map(|class| class.to_string()),
            tags: self.tags(&tool.name).cloned().unwrap_or_default(),
            ..tool.clone()
        }
    }

    /// How long a confirmation stays valid (`confirmation.ttl_secs`, default 300 s).
    pub fn confirmation_ttl(&self) -> Duration {
        Duration::from_secs(self.confirmation_ttl_secs)
    }

    /// The batch selector settings of `tool`.
    pub fn batch(&self, tool: &str) -> Option<&Batch> {
        self.batch.get(tool)
    }

    /// The rate limit of `tool` (`rate_limits.tools`).
    pub fn tool_rate(&self, tool: &str) -> Option<Rate> {
        self.tool_rates.get(tool).copied()
    }

    /// The rate limit of `principal` across all its calls (`rate_limits.principals`).
    pub fn principal_rate(&self, principal: &str) -> Option<Rate> {
        self.principal_rates.get(principal).copied()
    }

    /// Every tool with a declared effect class, by name.
    pub fn effect_classes(&self) -> impl Iterator<Item = (&str, EffectClass)> {
        self.effects
            .iter()
            .map(|(tool, class)| (tool.as_str(), *class))
    }

    /// The scopes of which a caller with scoped credentials (an OAuth token, an API token created
    /// with scopes) must hold one to see and call `tool` (`scopes`: scope -> tools). Empty when no
    /// scope names the tool: then the credential's scopes do not matter for it.
    pub fn required_scopes(&self, tool: &str) -> Option<&BTreeSet<String>> {
        self.scopes.get(tool)
    }

    /// Every scope the policy names, sorted (for the protected resource metadata).
    pub fn scopes_supported(&self) -> BTreeSet<&str> {
        self.scopes.values().flatten().map(String::as_str).collect()
    }

    /// Whether `tool` keeps working while the kill switch is engaged (`kill_switch.exempt`; only
    /// tools declared `read` in `effects` can be exempt).
    pub fn halt_exempt(&self, tool: &str) -> bool {
        self.halt_exempt.contains(tool)
    }

    /// Which strings of `tool`'s structured results are third-party text.
    pub fn untrusted_output(&self, tool: &str) -> Option<&UntrustedOutput> {
        self.untrusted_output.get(tool)
    }

    /// Whether a proxied upstream may send `request` to the host (`proxy.host_requests`; none by
    /// default). The proxy also refuses a request whose capability the host did not declare.
    pub fn host_request_allowed(&self, request: HostRequest) -> bool {
        self.host_requests.contains(&request)
    }

    /// Whether the text a proxied upstream's `tool` returns reaches the host as it is
    /// (`proxy.trusted_output`); otherwise the proxy wraps it as untrusted third-party text.
    pub fn trusted_output(&self, tool: &str) -> bool {
        self.trusted_output.contains(tool)
    }

    /// The version argument of `tool`, when the policy says its calls must carry the version of
    /// the object they change (`versions`).
    pub fn versions(&self, tool: &str) -> Option<&Versioned> {
        self.versions.get(tool)
    }

    /// The duplicate guard of the create tool `tool` (`duplicates`).
    pub fn duplicates(&self, tool: &str) -> Option<&DuplicateGuard> {
        self.duplicates.get(tool)
    }

    /// The fields `tool`'s results may carry (`results`); every other field is dropped.
    pub fn results(&self, tool: &str) -> Option<&ResultFields> {
        self.results.get(tool)
    }
}

/// The first rule of `rules` the arguments break, in field-name order.
fn check_rules(
    rules: &BTreeMap<String, ArgRule>,
    principal: Option<&str>,
    tool: &str,
    arguments: Option<&Map<String, Value>>,
) -> Option<ArgViolation> {
    for (field, rule) in rules {
        if let Err(violation) = rule.check(arguments.and_then(|args| args.get(field))) {
            return Some(ArgViolation::new(
                tool,
                field,
                violation,
                principal,
                rule.expected_type(),
            ));
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    const REFERENCE: &str = include_str!("../../../fixtures/policy.json");

    /// Without Cedar support a policy that names Cedar policies is refused, never loaded as if
    /// it had none (`.ci/run` runs this crate's unit tests on their own, without the feature).
    #[cfg(not(feature = "cedar"))]
    #[test]
    fn a_policy_naming_cedar_is_refused_without_cedar_support() {
        let dir = tempfile::tempdir().expect("a temporary directory");
        std::fs::write(
            dir.path().join("p.cedar"),
            "permit(principal, action, resource);",
        )
        .expect("writes");
        std::fs::write(
            dir.path().join("policy.json"),
            r#"{"version": 1, "allow": ["a"], "cedar": "p.cedar"}"#,
        )
        .expect("writes");
        let error = Policy::load(&dir.path().join("policy.json")).expect_err("refused");
        assert!(
            error.to_string().contains("no Cedar support") && error.to_string().contains("p.cedar"),
            "{error}"
        );
    }

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
