//! What a gate decides from, swappable while the server runs (policy reload on SIGHUP): the
//! policy and the contract digests derived from it. Each call takes one snapshot at its start and
//! decides everything from it, so a reload never mixes two policies within one call.

use std::collections::BTreeMap;
use std::sync::{Arc, PoisonError, RwLock};

use toolgate_audit::{AuditDecision, AuditEntry, AuditSink, Outcome};
use toolgate_canon::Sha256Digest;
use toolgate_policy::Policy;

/// One consistent view of the gate's configuration.
#[derive(Debug, Clone)]
pub struct GateState {
    /// The policy in force.
    pub policy: Arc<Policy>,
    /// The server's contract digest published in `initialize` / `server/discover`, if any.
    pub contract_digest: Option<Sha256Digest>,
    /// Each tool's contract digest, recorded in its audit lines.
    pub tool_contract_digests: BTreeMap<String, Sha256Digest>,
    /// The tools as their contract describes them (`None`: the gate was given no contract with
    /// schemas): what the policy's Cedar policies are validated against, at build and reload.
    pub(crate) tools: Option<Arc<[toolgate_policy::ToolSignature]>>,
    /// The policy's Cedar policies, validated against `tools` (`None`: the policy names none).
    pub(crate) cedar: Option<Arc<crate::checks::cedar::CedarSet>>,
}

impl GateState {
    /// Takes the contract digests and the tools' signatures from `live`.
    pub(crate) fn set_contract(&mut self, live: &toolgate_contract::lockfile::Lockfile) {
        let (digest, tools_digests, tools) = contract_parts(live);
        self.contract_digest = Some(digest);
        self.tool_contract_digests = tools_digests;
        self.tools = Some(tools);
    }
}

/// What a gate takes from `live`, the server's live contract (its `toolgate.lock` as computed
/// now): the integrity digest it publishes, each tool's contract digest, and the tools as Cedar
/// sees them (name, input schema, annotations with the spec's defaults).
pub(crate) fn contract_parts(
    live: &toolgate_contract::lockfile::Lockfile,
) -> (
    Sha256Digest,
    BTreeMap<String, Sha256Digest>,
    Arc<[toolgate_policy::ToolSignature]>,
) {
    let digests = live
        .contract()
        .tools
        .iter()
        .map(|(name, contract)| (name.clone(), contract.digest()))
        .collect();
    let signatures = crate::contract::tool_signatures(live).into();
    (live.integrity_digest(), digests, signatures)
}

/// A replacement for the gate's state, checked and installed by [`PolicyHandle::install`].
#[derive(Debug)]
pub struct Reload {
    /// The new policy, already parsed completely.
    pub policy: Policy,
    /// The live contract under the new policy (`None` keeps the current one): its digest is
    /// published from now on, each tool's is recorded in its audit lines, and the policy's
    /// Cedar policies are validated against its tools.
    pub contract: Option<toolgate_contract::lockfile::Lockfile>,
}

/// What a successful reload changed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Reloaded {
    /// Digest of the policy that was in force.
    pub old: Sha256Digest,
    /// Digest of the policy now in force.
    pub new: Sha256Digest,
}

/// Why a reload was refused; the old policy stays in force.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ReloadError {
    /// The new policy opts a tool into exactly-once execution but the gate has no effect store.
    #[error(
        "the new policy gives `{tool}` idempotency settings but this gate has no effect store; remove them or restart the server with an effect store"
    )]
    MissingEffectStore {
        /// A tool with idempotency settings.
        tool: String,
    },
    /// The new policy's Cedar policies do not fit the tools (every problem named with its
    /// policy and line), or this gate cannot enforce Cedar.
    #[error("{0}; the old policy stays in force")]
    Cedar(String),
    /// The caller's own check refused the new state (for example: it changes an attested
    /// contract).
    #[error("{0}")]
    Refused(String),
    /// The reload was applied but its audit record could not be written.
    #[error(
        "the policy was reloaded but its audit record could not be written ({0}); check the audit log"
    )]
    Audit(String),
}

/// A cloneable handle on a gate's state: read the policy in force, or replace it while the server
/// runs. Every reload and every refused reload is audited.
#[derive(Clone)]
pub struct PolicyHandle {
    state: Arc<RwLock<Arc<GateState>>>,
    audit: Arc<dyn AuditSink>,
    has_effect_store: bool,
}

impl std::fmt::Debug for PolicyHandle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PolicyHandle")
            .field("policy_digest", &self.snapshot().policy.digest())
            .finish_non_exhaustive()
    }
}

impl PolicyHandle {
    pub(crate) fn new(state: GateState, audit: Arc<dyn AuditSink>, has_effect_store: bool) -> Self {
        PolicyHandle {
            state: Arc::new(RwLock::new(Arc::new(state))),
            audit,
            has_effect_store,
        }
    }

    /// The state in force now.
    pub fn snapshot(&self) -> Arc<GateState> {
        Arc::clone(&self.state.read().unwrap_or_else(PoisonError::into_inner))
    }

    /// The policy in force now.
    pub fn policy(&self) -> Arc<Policy> {
        Arc::clone(&self.snapshot().policy)
    }

    /// Installs `reload` if the gate can enforce it, and records `policy/reload` in the audit log
    /// with both digests. Calls that already started finish under the old policy.
    pub fn install(&self, reload: Reload) -> Result<Reloaded, ReloadError> {
        if !self.has_effect_store
            && let Some(tool) = reload
                .policy
                .allowed()
                .find(|tool| reload.policy.idempotency(tool).is_some())
        {
            let error = ReloadError::MissingEffectStore {
                tool: tool.to_owned(),
            };
            self.record_rejected(&error.to_string());
            return Err(error);
        }
        let new_digest = reload.policy.digest();
        // Everything that can refuse the new state is computed before the swap, so a refused
        // reload leaves the old state whole.
        let current = self.snapshot();
        let mut next = GateState::clone(&current);
        if let Some(live) = &reload.contract {
            next.set_contract(live);
        }
        next.cedar = match crate::checks::cedar::compile(&reload.policy, next.tools.as_deref()) {
            Ok(cedar) => cedar,
            Err(error) => {
                let error = ReloadError::Cedar(error.to_string());
                self.record_rejected(&error.to_string());
                return Err(error);
            }
        };
        next.policy = Arc::new(reload.policy);
        let old_digest = {
            let mut guard = self.state.write().unwrap_or_else(PoisonError::into_inner);
            let old = guard.policy.digest();
            *guard = Arc::new(next);
            old
        };
        let reloaded = Reloaded {
            old: old_digest,
            new: new_digest,
        };
        let entry = reload_entry(
            AuditDecision::Allow,
            Outcome::Reloaded,
            format!("policy {old_digest} replaced by {new_digest}"),
            new_digest,
            &serde_json::json!({"old": old_digest.to_string(), "new": new_digest.to_string()}),
        );
        self.audit
            .append(&entry)
            .map_err(|e| ReloadError::Audit(e.to_string()))?;
        Ok(reloaded)
    }

    /// Records a reload that was refused before [`PolicyHandle::install`] (for example a file that
    /// does not parse): the old policy stays in force. `why` is one line; it must not contain
    /// secrets (policy files do not).
    pub fn record_rejected(&self, why: &str) {
        let current = self.snapshot().policy.digest();
        let one_line: String = why
            .chars()
            .map(|c| if c.is_control() { ' ' } else { c })
            .take(1000)
            .collect();
        let entry = reload_entry(
            AuditDecision::Deny,
            Outcome::Rejected,
            format!("policy reload rejected, {current} stays in force: {one_line}"),
            current,
            &serde_json::json!({"kept": current.to_string()}),
        );
        if let Err(error) = self.audit.append(&entry) {
            tracing::error!(%error, "could not audit a rejected policy reload");
        }
    }
}

fn reload_entry(
    decision: AuditDecision,
    outcome: Outcome,
    reason: String,
    policy_digest: Sha256Digest,
    subject: &serde_json::Value,
) -> AuditEntry {
    let mut entry = AuditEntry::tool_call(
        "operator",
        "policy",
        decision,
        outcome,
        Sha256Digest::of_json(subject),
    )
    .with_reason(toolgate_audit::Reason::Note(reason))
    .with_policy_digest(policy_digest);
    entry.method = "policy/reload".to_owned();
    entry
}
