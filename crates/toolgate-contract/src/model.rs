//! The inputs of a contract: a tool as declared to clients, and the facts about its handler that
//! the declaration does not say. Plain data, no MCP library types, so any host can build them.

use serde::{Deserialize, Serialize};
use serde_json::Value;
use toolgate_canon::Sha256Digest;

/// A tool as a server declares it in tools/list.
#[derive(Debug, Clone, PartialEq)]
pub struct ToolDefinition {
    /// The tool's name.
    pub name: String,
    /// The description shown to the model (`None` when the tool has none).
    pub description: Option<String>,
    /// The JSON Schema of the arguments (an object schema).
    pub input_schema: Value,
    /// The JSON Schema of `structuredContent`, when declared.
    pub output_schema: Option<Value>,
    /// The annotations as declared; absent hints stay `None`.
    pub annotations: Annotations,
}

/// Tool annotations as declared. They are hints: the server never enforces from them, and the
/// contract reads absent ones with the spec's conservative defaults ([`Annotations::effective`]).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Annotations {
    /// `readOnlyHint`.
    pub read_only: Option<bool>,
    /// `destructiveHint`.
    pub destructive: Option<bool>,
    /// `idempotentHint`.
    pub idempotent: Option<bool>,
    /// `openWorldHint`.
    pub open_world: Option<bool>,
}

/// Annotations with the spec's defaults applied: readOnlyHint=false, destructiveHint=true,
/// idempotentHint=false, openWorldHint=true when absent.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct EffectiveAnnotations {
    /// The tool claims not to modify its environment.
    pub read_only_hint: bool,
    /// The tool may perform destructive updates.
    pub destructive_hint: bool,
    /// Repeating a call with the same arguments has no additional effect.
    pub idempotent_hint: bool,
    /// The tool interacts with an open world of external entities.
    pub open_world_hint: bool,
}

impl Annotations {
    /// The annotations with the spec's conservative defaults applied to absent hints.
    pub fn effective(&self) -> EffectiveAnnotations {
        EffectiveAnnotations {
            read_only_hint: self.read_only.unwrap_or(false),
            destructive_hint: self.destructive.unwrap_or(true),
            idempotent_hint: self.idempotent.unwrap_or(false),
            open_world_hint: self.open_world.unwrap_or(true),
        }
    }
}

/// Capability families a handler uses, as found by the scanner (never declared by the author).
#[derive(
    Debug, Clone, Copy, Default, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize,
)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Entitlements {
    /// Reads files or directories.
    pub filesystem_read: bool,
    /// Creates, writes, renames or removes files or directories.
    pub filesystem_write: bool,
    /// Opens network connections (sockets, HTTP clients).
    pub network: bool,
    /// Spawns processes.
    pub subprocess: bool,
    /// Hashes, signs or encrypts.
    pub crypto: bool,
    /// `unsafe` code, foreign functions or dynamic loading.
    pub unsafe_ffi: bool,
    /// Reads or changes environment variables.
    pub environment: bool,
}

impl Entitlements {
    /// Every family's name as written in toolgate.lock, with its value.
    pub fn families(&self) -> [(&'static str, bool); 7] {
        [
            ("filesystemRead", self.filesystem_read),
            ("filesystemWrite", self.filesystem_write),
            ("network", self.network),
            ("subprocess", self.subprocess),
            ("crypto", self.crypto),
            ("unsafeFfi", self.unsafe_ffi),
            ("environment", self.environment),
        ]
    }

    /// Both sets together.
    pub fn union(self, other: Entitlements) -> Entitlements {
        Entitlements {
            filesystem_read: self.filesystem_read || other.filesystem_read,
            filesystem_write: self.filesystem_write || other.filesystem_write,
            network: self.network || other.network,
            subprocess: self.subprocess || other.subprocess,
            crypto: self.crypto || other.crypto,
            unsafe_ffi: self.unsafe_ffi || other.unsafe_ffi,
            environment: self.environment || other.environment,
        }
    }

    /// Whether the handler changes the world: writes files, spawns processes or opens connections.
    /// A tool that claims `readOnlyHint: true` must have none of these.
    pub fn mutates(&self) -> bool {
        self.filesystem_write || self.subprocess || self.network
    }
}

/// What the contract needs to know about a tool beyond its declaration.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HandlerFacts {
    /// The gate stages that apply to the tool, in order (its "middleware chain"), for example
    /// `["list_filter", "call_decide", "arg_rules", "permit", "audit"]`.
    pub gate_stages: Vec<String>,
    /// A digest of the policy rules that apply to this tool.
    pub policy_fingerprint: Sha256Digest,
    /// The capability families the handler uses.
    pub entitlements: Entitlements,
    /// Evasion signals the scanner found in the handler's reach (sorted, deduplicated kinds such
    /// as `base64_blob`, `char_codes`, `escape_density`, `high_entropy_literal`). They are recorded
    /// in the entitlements section so that a new one is a reviewable change.
    pub evasion: Vec<String>,
    /// Calls in the handler's reach that the scanner could not follow (`self.client.send`):
    /// what they do is unknown, so they are recorded, never read as "no capability". Sorted and
    /// deduplicated in the contract; a new one is a reviewable change.
    pub unresolved: Vec<String>,
}
