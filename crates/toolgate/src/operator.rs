//! The operator's actions as library calls, each recorded in the audit chain (halting and
//! resuming every server on a ledger or one tenant, pruning and settling the exactly-once store,
//! setting the rights and the Cedar entities, API tokens), and the command line that runs them ([`Cli`], [`Command`],
//! on the stores of a [`GateArgs`]): the reference server's and any embedding server's.
//!
//! Each action happens first and is then recorded, so a record never claims an action that did
//! not take place; if the record cannot be appended the error says so and the action stands.

use std::time::SystemTime;

use serde_json::{Value, json};
use toolgate_audit::{AuditDecision, AuditEntry, AuditError, AuditSink, Outcome};
use toolgate_canon::Sha256Digest;
use toolgate_commit::{EffectBackend, EffectError};
use toolgate_rmcp::checks::{GuardError, Halt, KillSwitch};

mod args;
mod cli;
pub use args::{DEFAULT_LEDGER, DEFAULT_POLICY, GateArgs};
pub use cli::{
    AuditCommand, Cli, Command, EffectsCommand, EntitiesCommand, Format, FormatArgs, NoArgs,
    RightsCommand, TokenCommand, VerifyArgs,
};

/// Why an operator action failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum OperatorError {
    /// The kill switch could not be set or lifted, or the rights or the entities could not be
    /// set.
    #[error(transparent)]
    KillSwitch(#[from] GuardError),
    /// The exactly-once store could not be pruned.
    #[error(transparent)]
    Effects(#[from] EffectError),
    /// The action took place but its audit record could not be appended: fix the audit log
    /// and record it by hand, or repeat the action (halting and resuming are idempotent).
    #[error("the action took place but could not be audited: {0}")]
    Audit(#[from] AuditError),
    /// A key file ([`load_key`]) could not be read.
    #[error("cannot read the key file {}: {cause}", path.display())]
    KeyFile {
        /// The file.
        path: std::path::PathBuf,
        /// What reading it said (in the message, not a source: the message already names it).
        cause: std::io::Error,
    },
    /// A store could not be opened; `what` names it and where it is.
    #[error("{what}")]
    Open {
        /// What could not be opened.
        what: String,
        /// Why.
        #[source]
        cause: Box<dyn std::error::Error + Send + Sync>,
    },
    /// The options ask for something the stores cannot do; the message says what to change.
    #[error("{0}")]
    Refused(String),
    /// The policy file could not be loaded.
    #[error(transparent)]
    Policy(#[from] toolgate_policy::PolicyError),
    /// The audit chain could not be read, verified or exported.
    #[error(transparent)]
    Chain(AuditError),
    /// The API tokens could not be read or changed.
    #[cfg(feature = "http")]
    #[error(transparent)]
    Tokens(#[from] toolgate_http::tokens::TokenError),
    /// A key file holds no usable key.
    #[error("the key in {} is unusable: {cause}", path.display())]
    Key {
        /// The file.
        path: std::path::PathBuf,
        /// Why the key is refused.
        cause: toolgate_canon::KeyError,
    },
}

/// Reads an HMAC key file (an audit checkpoint key, an attestation key): the file's bytes, one
/// trailing line ending removed, at least [`toolgate_canon::MIN_KEY_BYTES`] of them and at most
/// [`toolgate_canon::MAX_KEY_FILE_BYTES`]; a symbolic link is followed. The error names the file.
pub fn load_key(path: &std::path::Path) -> Result<toolgate_canon::HmacKey, OperatorError> {
    let bytes = toolgate_storage::read_regular(
        path,
        toolgate_canon::MAX_KEY_FILE_BYTES,
        toolgate_storage::Symlinks::Follow,
    )
    .and_then(|bytes| bytes.ok_or_else(|| std::io::ErrorKind::NotFound.into()))
    .map_err(|cause| OperatorError::KeyFile {
        path: path.to_owned(),
        cause,
    })?;
    toolgate_canon::HmacKey::from_file_bytes(bytes).map_err(|cause| OperatorError::Key {
        path: path.to_owned(),
        cause,
    })
}

/// An operator's record (`method` such as `admin/halt`), not a tool call.
fn entry(
    method: &str,
    name: &str,
    outcome: Outcome,
    reason: String,
    subject: &Value,
) -> AuditEntry {
    let mut entry = AuditEntry::tool_call(
        "operator",
        name,
        AuditDecision::Allow,
        outcome,
        Sha256Digest::of_json(subject),
    )
    .with_reason(toolgate_audit::Reason::Note(reason));
    entry.method = method.to_owned();
    entry
}

/// `entry` naming the tenant of `switch`, when it is a tenant's switch.
fn of_tenant(entry: AuditEntry, switch: &KillSwitch) -> AuditEntry {
    match switch.tenant() {
        Some(tenant) => entry.with_tenant(tenant),
        None => entry,
    }
}

/// Sets `switch` (every tools/call of every server on its ledger is refused from its next call
/// on; of the switch's tenant only, for [`KillSwitch::for_tenant`]) and records `admin/halt`. Returns the halt it replaced, if any.
pub fn halt(
    switch: &KillSwitch,
    audit: &dyn AuditSink,
    reason: &str,
    by: &str,
) -> Result<Option<Halt>, OperatorError> {
    let (halt, previous) = switch.halt_at(reason, by, SystemTime::now())?;
    audit.append(&of_tenant(
        entry(
            "admin/halt",
            "kill_switch",
            Outcome::Halted,
            format!("halted by {}: {}", halt.by, halt.reason),
            &json!({"by": halt.by, "reason": halt.reason, "since_ns": halt.since_ns.to_string()}),
        ),
        switch,
    ))?;
    Ok(previous)
}

/// Lifts `switch` and records `admin/resume` (`resumed`, or `not_halted` when nothing was in
/// force). Returns the halt that was lifted, if any.
pub fn resume(switch: &KillSwitch, audit: &dyn AuditSink) -> Result<Option<Halt>, OperatorError> {
    let lifted = switch.resume()?;
    let (outcome, reason) = match &lifted {
        Some(halt) => (
            Outcome::Resumed,
            format!("lifted the halt by {}: {}", halt.by, halt.reason),
        ),
        None => (Outcome::NotHalted, "no halt was in force".to_owned()),
    };
    audit.append(&of_tenant(
        entry(
            "admin/resume",
            "kill_switch",
            outcome,
            reason,
            &json!({"lifted": lifted.as_ref().map(|h| h.since_ns.to_string())}),
        ),
        switch,
    ))?;
    Ok(lifted)
}

/// Removes the completed exactly-once records older than their retention window as of `now`, and
/// records `effects/prune` with the count (pruning is explicit and audited). Returns the count.
pub fn prune_effects(
    effects: &dyn EffectBackend,
    audit: &dyn AuditSink,
    now: SystemTime,
) -> Result<u64, OperatorError> {
    let removed = effects.prune(now)?;
    audit.append(&entry(
        "effects/prune",
        "effects",
        Outcome::Pruned,
        format!("removed {removed} completed records"),
        &json!({"removed": removed}),
    ))?;
    Ok(removed)
}

/// Which call an operator settles with [`resolve_effect`]: the key the caller gave (the
/// `key_argument` or `_meta` `io.toolgate/idempotencyKey`), or, for a call that had none, the
/// `args_digest` of its audit record.
#[derive(Debug, Clone)]
pub struct EffectKey(String);

impl EffectKey {
    /// The idempotency key as the caller sent it.
    pub fn given(key: &str) -> Self {
        EffectKey(format!("key:{key}"))
    }

    /// The `args_digest` of the call's audit record (64 lowercase hex digits), for a call that
    /// carried no key; `None` when `hex` is not one.
    pub fn arguments(hex: &str) -> Option<Self> {
        let valid = hex.len() == 64 && hex.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'));
        valid.then(|| EffectKey(format!("args:{hex}")))
    }

    /// The key as the gate stores it (`toolgate_rmcp::checks::exactly_once`).
    fn stored(&self) -> &str {
        &self.0
    }
}

/// Settles an indeterminate exactly-once call of `principal` to `tool` (one whose caller died or
/// whose upstream was lost mid-effect) after the operator inspected the target: with
/// `Resolution::Completed(result)` (a `CallToolResult` as JSON) later calls replay `result`; with
/// `Resolution::Forget` the next call runs. Records `effects/resolve`. Only a record that is
/// indeterminate can be settled (otherwise `EffectError::NotIndeterminate`, nothing changes).
pub fn resolve_effect(
    effects: &dyn EffectBackend,
    audit: &dyn AuditSink,
    principal: &str,
    tool: &str,
    key: &EffectKey,
    resolution: toolgate_commit::Resolution,
) -> Result<(), OperatorError> {
    let scope = toolgate_commit::Scope {
        principal: principal.to_owned(),
        tool: tool.to_owned(),
    };
    let (outcome, what) = match &resolution {
        toolgate_commit::Resolution::Completed(_) => (
            Outcome::Committed,
            "the effect happened: later calls replay the given result",
        ),
        toolgate_commit::Resolution::Forget => (
            Outcome::NotExecuted,
            "the effect did not happen: the next call runs",
        ),
    };
    let stored = key.stored();
    effects.resolve(&scope, stored, resolution)?;
    let mut record = entry(
        "effects/resolve",
        tool,
        outcome,
        format!("resolved the indeterminate call of {principal}: {what}"),
        &json!({"principal": principal, "tool": tool, "key_digest": Sha256Digest::of(stored.as_bytes()).to_hex()}),
    );
    record.principal = Some(principal.to_owned());
    audit.append(&record)?;
    Ok(())
}

/// Sets `rights` (every replica's, in a database: `toolgate::stores::Database::rights`) to the
/// rights file at `file` (validated first: an invalid file changes nothing), or clears them
/// (`None`: only the policy decides), and records `admin/rights` (`reloaded`, the new document's
/// digest in the reason). Returns that digest.
pub fn set_rights(
    rights: &toolgate_state::RightsFile,
    audit: &dyn AuditSink,
    file: Option<&std::path::Path>,
) -> Result<Option<Sha256Digest>, OperatorError> {
    let digest = rights.set_from_file(file)?;
    let reason = match &digest {
        Some(digest) => format!("rights set: sha256:{digest}"),
        None => "rights cleared: only the policy decides".to_owned(),
    };
    audit.append(&entry(
        "admin/rights",
        "rights",
        Outcome::Reloaded,
        reason,
        &json!({"rights": digest.map(|d| d.to_hex())}),
    ))?;
    Ok(digest)
}

/// Sets `entities` (every replica's, in a database: `toolgate::stores::Database::entities`) to
/// the entities file at `file` (validated first: an invalid file changes nothing), or clears
/// them (`None`: principals have only what their credentials carry), and records
/// `admin/entities` (`reloaded`, the new document's digest in the reason). Returns that digest.
pub fn set_entities(
    entities: &toolgate_state::EntitiesFile,
    audit: &dyn AuditSink,
    file: Option<&std::path::Path>,
) -> Result<Option<Sha256Digest>, OperatorError> {
    let digest = entities.set_from_file(file)?;
    let reason = match &digest {
        Some(digest) => format!("entities set: sha256:{digest}"),
        None => "entities cleared: principals have only what their credentials carry".to_owned(),
    };
    audit.append(&entry(
        "admin/entities",
        "entities",
        Outcome::Reloaded,
        reason,
        &json!({"entities": digest.map(|d| d.to_hex())}),
    ))?;
    Ok(digest)
}

/// Creates an API token as `spec` says and records `admin/token` with its id (never the token).
/// Returns the token, to show once.
#[cfg(feature = "http")]
pub fn create_token(
    tokens: &toolgate_http::tokens::ApiTokens,
    audit: &dyn AuditSink,
    spec: &toolgate_http::tokens::TokenSpec,
) -> Result<toolgate_http::tokens::NewToken, OperatorError> {
    let created = tokens.create(spec, SystemTime::now())?;
    let reason = format!("created token {} for {}", created.info.id, spec.principal);
    record_token_change(audit, &created.info.id, reason)?;
    Ok(created)
}

/// Revokes the API token `id` from the next request on, and records `admin/token`.
#[cfg(feature = "http")]
pub fn revoke_token(
    tokens: &toolgate_http::tokens::ApiTokens,
    audit: &dyn AuditSink,
    id: &str,
) -> Result<toolgate_http::tokens::TokenInfo, OperatorError> {
    let revoked = tokens.revoke(id, SystemTime::now())?;
    let reason = format!("revoked token {id} of {}", revoked.principal);
    record_token_change(audit, id, reason)?;
    Ok(revoked)
}

#[cfg(feature = "http")]
fn record_token_change(
    audit: &dyn AuditSink,
    id: &str,
    reason: String,
) -> Result<(), OperatorError> {
    let mut record = AuditEntry::tool_call(
        "operator",
        "tokens",
        AuditDecision::Allow,
        Outcome::Reloaded,
        Sha256Digest::of(id.as_bytes()),
    )
    .with_reason(toolgate_audit::Reason::Note(reason));
    record.method = "admin/token".to_owned();
    audit.append(&record)?;
    audit.checkpoint()?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use toolgate_audit::{MemoryAuditLog, verify_reader};
    use toolgate_commit::MemoryEffects;

    fn records(audit: &MemoryAuditLog) -> Vec<Value> {
        let bytes = audit.bytes();
        assert!(verify_reader(bytes.as_slice()).unwrap().is_intact());
        String::from_utf8(bytes)
            .unwrap()
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect()
    }

    #[test]
    fn halt_resume_and_prune_are_done_then_audited() {
        let dir = tempfile::tempdir().unwrap();
        let switch = KillSwitch::new(dir.path());
        let audit = MemoryAuditLog::new();
        assert!(
            halt(&switch, &audit, "incident 9", "oncall")
                .unwrap()
                .is_none()
        );
        assert!(matches!(switch.status(), crate::checks::Status::Halted(_)));
        let lifted = resume(&switch, &audit).unwrap().unwrap();
        assert_eq!(lifted.reason, "incident 9");
        assert!(resume(&switch, &audit).unwrap().is_none());
        assert_eq!(
            prune_effects(&MemoryEffects::new(), &audit, SystemTime::now()).unwrap(),
            0
        );
        let got: Vec<(String, String)> = records(&audit)
            .iter()
            .map(|r| {
                (
                    r["method"].as_str().unwrap().to_owned(),
                    r["outcome"].as_str().unwrap().to_owned(),
                )
            })
            .collect();
        let want = [
            ("admin/halt", "halted"),
            ("admin/resume", "resumed"),
            ("admin/resume", "not_halted"),
            ("effects/prune", "pruned"),
        ];
        assert_eq!(
            got,
            want.map(|(m, o)| (m.to_owned(), o.to_owned())).to_vec()
        );
        // An invalid reason changes nothing and records nothing.
        assert!(halt(&switch, &audit, "", "oncall").is_err());
        assert_eq!(records(&audit).len(), 4);
    }
}
