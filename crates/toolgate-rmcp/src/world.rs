//! What the checks know of the world outside the gate: the questions a server answers for them
//! ([`Preflight`], with [`Current`] and [`Preparation`]; [`EffectProbe`] with [`ProbeAnswer`]),
//! who is calling ([`Caller`]), and the names and codes of the gate's own answers. The checks
//! import these from here, never from the gate, so the gate depends on the checks and not the
//! other way round.

use std::sync::Arc;

use rmcp::model::CallToolResult;
use serde_json::Value;
use toolgate_canon::Sha256Digest;
use toolgate_policy::Policy;

/// The message of the JSON-RPC error (-32602) for a tool that is denied or does not exist. The two
/// cases are deliberately identical so a caller cannot probe which hidden tools exist.
pub const TOOL_NOT_FOUND: &str = "tool not found";

/// The gate's own tool that executes a previewed action (two-step confirmation).
pub const CONFIRM_ACTION: &str = "confirm_action";
/// The gate's own tool that cancels a previewed action.
pub const REJECT_ACTION: &str = "reject_action";
/// The JSON-RPC error code of a call refused because the kill switch is set (in the range
/// JSON-RPC reserves for server errors); the message names the reason and how calls resume.
pub const HALTED: i32 = -32001;

/// What the server author supplies for the gate's checks that need to look at the world:
/// preparing a call for two-step confirmation, counting what a batch filter matches, reading the
/// current version of the object a call changes, and finding an existing object with a create
/// call's business key. Every method runs on the blocking pool and must not perform the tool's
/// effect. The checks that need a method the server does not implement fail closed: their calls
/// are refused, naming what the server cannot do.
///
/// Each method is asked for the [`Caller`] of the call being decided, and what it returns reaches
/// that caller before the handler runs: answer for objects this caller may see (as the handler
/// would), and treat another's object as absent or refuse, never describe it.
pub trait Preflight: Send + Sync + 'static {
    /// Describes what `tool` with `arguments` would do, without doing it: a summary written by
    /// the server that names the concrete operation (target, scope, count), and a hash of the
    /// content that would be sent or changed. Confirmation executes only if a fresh preparation
    /// has the same hash. `Err` is a one-line reason (no secrets).
    fn prepare(
        &self,
        caller: &Caller,
        tool: &str,
        arguments: &rmcp::model::JsonObject,
    ) -> Result<Preparation, String>;

    /// The ids of the items `filter` matches now, for a batch tool called with a filter. The
    /// default refuses filters, so batch tools must then be called with explicit ids.
    fn batch_matches(
        &self,
        caller: &Caller,
        tool: &str,
        filter: &Value,
    ) -> Result<Vec<Value>, String> {
        let _ = (caller, tool, filter);
        Err("this server does not evaluate batch filters; pass explicit ids".to_owned())
    }

    /// The object a call of `tool` (named in the policy's `versions`) refers to, as it is now:
    /// its current version and its state as the server would show it to the caller. `Ok(None)`
    /// when the object does not exist (the call then runs and the handler answers not-found).
    /// `arguments` are the tool's own, the version argument included. `Err` is a one-line reason
    /// (no secrets); the call is then refused. The default cannot read versions, so every call
    /// of a tool under `versions` is refused.
    fn current_version(
        &self,
        caller: &Caller,
        tool: &str,
        arguments: &rmcp::model::JsonObject,
    ) -> Result<Option<Current>, String> {
        let _ = (caller, tool, arguments);
        Err("this server does not read the current version of its objects".to_owned())
    }

    /// The id of an existing object that a call of the create tool `tool` (named in the policy's
    /// `duplicates`) would duplicate: one whose business key equals `key` (the key arguments
    /// named in the policy, with the call's values). Read what is committed now (the columns
    /// the create path writes, not an asynchronous log). `Ok(None)` when there is none. `Err`
    /// is a one-line reason (no secrets); the call is then refused. The default cannot look
    /// objects up, so every call of a tool under `duplicates` is refused unless it passes
    /// `separate: true` with a `reason`.
    fn find_existing(
        &self,
        caller: &Caller,
        tool: &str,
        key: &rmcp::model::JsonObject,
    ) -> Result<Option<String>, String> {
        let _ = (caller, tool, key);
        Err("this server does not look up existing objects by their business key".to_owned())
    }
}

/// The object a call refers to, as it is now (see [`Preflight::current_version`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Current {
    /// Its version now (a content hash); a call passes when its version argument is this exact
    /// string.
    pub version: String,
    /// Its state as the server would show it to the caller (through its presenter, without
    /// secrets): returned with a `conflict` so that the caller can retry from it. The gate does
    /// not filter it.
    pub state: Value,
}

/// A call prepared for confirmation (see [`Preflight::prepare`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Preparation {
    /// Names the concrete operation; the caller must echo it exactly to confirm.
    pub summary: String,
    /// Hash of the content that would be sent or changed.
    pub content_hash: Sha256Digest,
}

/// Who makes one request: the principal, the credential it came with (tenant, scopes, channel;
/// none over stdio) and what the client declared of itself (name, version).
///
/// Every [`Preflight`] question is asked for a caller: what a preflight returns reaches that
/// caller before the handler runs (a conflict's current state, a duplicate's id, a preview's
/// summary, the items a batch filter matches), so the server must limit it to what this caller
/// may see, as its handler would.
#[derive(Debug, Clone)]
pub struct Caller {
    pub(crate) principal: Arc<str>,
    pub(crate) credential: Option<crate::VerifiedPrincipal>,
    pub(crate) client: Option<(String, String)>,
}

impl Caller {
    /// The principal the gate decided for (the configured one over stdio, the verified
    /// credential's over HTTP).
    pub fn principal(&self) -> &str {
        &self.principal
    }

    /// The verified credential of the request, when a transport authenticated it (`None` over
    /// stdio).
    pub fn credential(&self) -> Option<&crate::VerifiedPrincipal> {
        self.credential.as_ref()
    }

    /// The credential's tenant, if it names one.
    pub fn tenant(&self) -> Option<&str> {
        self.credential.as_ref().and_then(|c| c.tenant())
    }

    /// The name and version the client declared of itself, if it did. Not verified: for
    /// display and audit only.
    pub fn client(&self) -> Option<(&str, &str)> {
        self.client.as_ref().map(|(n, v)| (n.as_str(), v.as_str()))
    }

    /// Whether the caller's credential reaches `tool` under the policy's `scopes`.
    pub(crate) fn grants(&self, policy: &Policy, tool: &str) -> bool {
        self.credential
            .as_ref()
            .is_none_or(|credential| credential.grants(policy.required_scopes(tool)))
    }
}

/// What a probe found out about an effect whose caller died mid-call.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub enum ProbeAnswer {
    /// The effect happened; this is the result to store and replay.
    Happened(CallToolResult),
    /// The effect did not happen: the call may execute.
    NotHappened,
    /// The probe cannot tell: the call stays indeterminate.
    Unknown,
}

/// Tells whether the effect of a call with these arguments happened, by observing the target (a
/// read, never a write). Runs on the blocking pool.
pub type EffectProbe = Arc<dyn Fn(Option<&rmcp::model::JsonObject>) -> ProbeAnswer + Send + Sync>;
