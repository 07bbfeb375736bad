//! `Gated<H>`: a `ServerHandler` that decides every tools/list and tools/call before the inner
//! handler sees it, and forwards every other method unchanged.
//!
//! rmcp has no middleware layer, and every `ServerHandler` method has a default body, so a method
//! this wrapper forgot to forward would silently replace the inner handler's behaviour with the
//! default. All 32 methods are therefore written out below: those the gate changes by hand, the
//! others through `forward!` (each named with its MCP method), and the forwarding test calls each
//! one through a real client.

use std::borrow::Cow;
use std::collections::BTreeMap;
use std::future::Future;
use std::path::{Path, PathBuf};
use std::sync::Arc;

#[allow(deprecated)] // Logging (SEP-2577) is deprecated but still part of ServerHandler.
use rmcp::model::SetLevelRequestParams;
use rmcp::model::{
    CallToolRequestParams, CallToolResponse, CancelTaskParams, CancelledNotificationParam,
    CompleteRequestParams, CompleteResult, CustomNotification, CustomRequest, CustomResult,
    DiscoverResult, GetPromptRequestParams, GetPromptResponse, GetSkillRequestParams,
    GetSkillResult, GetTaskParams, GetTaskResult, InitializeRequestParams, InitializeResult,
    ListPromptsResult, ListResourceTemplatesResult, ListResourcesResult, ListSkillsResult,
    ListToolsResult, PaginatedRequestParams, ProgressNotificationParam, ProtocolVersion,
    ReadResourceDirectoryRequestParams, ReadResourceDirectoryResult, ReadResourceRequestParams,
    ReadResourceResponse, ServerConfig, SubscribeRequestParams, SubscriptionFilter, Tool,
    UnsubscribeRequestParams, UpdateTaskParams,
};
use rmcp::service::{MaybeSendFuture, NotificationContext, RequestContext, SubscriptionContext};
use rmcp::{ErrorData as McpError, RoleServer, ServerHandler};
use serde_json::{Map, Value};
use toolgate_audit::{AuditDecision, AuditEntry, AuditSink, Outcome};
use toolgate_canon::{HmacKey, Sha256Digest};
use toolgate_commit::EffectBackend;
use toolgate_contract::awareness::{InputContract, contract_awareness};
use toolgate_contract::diff::Change;
use toolgate_policy::Policy;

mod call;
mod confirm;
mod tasks;
use crate::checks::arguments::InputShape;
use crate::checks::{Checks, KillSwitch, PendingActions, PendingStore, RateStore, RightsFile};
use crate::permit::Permit;
use crate::principal::{FixedPrincipal, FromExtensions, PrincipalSource};
use crate::state::{GateState, PolicyHandle};
use crate::world::{CONFIRM_ACTION, Caller, EffectProbe, Preflight, REJECT_ACTION, TOOL_NOT_FOUND};

type BoxError = Box<dyn std::error::Error + Send + Sync>;
type Lockfile = toolgate_contract::lockfile::Lockfile;
/// How [`GatedBuilder::contract_at_build`] computes the contract from the loaded policy.
type ContractAtBuild = Box<dyn FnOnce(&Policy) -> Result<Lockfile, BoxError> + Send>;

/// At most this many changes are shown in a refusal's contract note.
const MAX_CONTRACT_CHANGES: usize = 5;

/// Why a gate could not be built.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum GateError {
    /// Required parts were not given; every missing one is named.
    #[error("a gate cannot be built without {}: {}", .parts.join(" and "), missing_fix(.parts))]
    Missing {
        /// The missing parts, by builder method: `policy` and/or `audit`.
        parts: Vec<&'static str>,
    },
    /// Two settings were given of which the gate could use only one: the other would be
    /// silently ignored, so the build refuses both and names them (by builder method).
    #[error(
        "GatedBuilder::{first} and GatedBuilder::{second} were both given, and the gate would ignore one of them: {}",
        conflict_fix(.first, .second)
    )]
    Conflict {
        /// The first of the two settings, by builder method (`policy`, `checkpoint_key`).
        first: &'static str,
        /// The second, by builder method (`policy_file`, `audit`).
        second: &'static str,
    },
    /// The policy opts a tool into exactly-once execution but no effect store was configured.
    #[error(
        "the policy gives `{tool}` idempotency settings but the gate has no effect store; call GatedBuilder::effect_store"
    )]
    MissingEffectStore {
        /// A tool with idempotency settings.
        tool: String,
    },
    /// `GatedBuilder::principal` was given a name the policy and rights file cannot name.
    #[error(
        "invalid principal {name:?}: use 1 to 128 characters from A-Z, a-z, 0-9, '_', '.', '@', ':' and '-'"
    )]
    InvalidPrincipal {
        /// The name given.
        name: String,
    },
    /// The policy file given to `GatedBuilder::policy_file` could not be loaded.
    #[error(transparent)]
    Policy(#[from] toolgate_policy::PolicyError),
    /// The ledger's audit log could not be opened.
    #[error("cannot open the ledger's audit log: {0}")]
    Audit(#[from] toolgate_audit::AuditError),
    /// The contract given to `GatedBuilder::contract_at_build` (the facade's `locked_contract`)
    /// could not be computed.
    #[error("cannot compute the server's contract from its toolgate.lock: {0}")]
    Contract(Box<dyn std::error::Error + Send + Sync>),
    /// The policy's Cedar policies do not fit the tools, or cannot be enforced here.
    #[error("{0}")]
    Cedar(Box<dyn std::error::Error + Send + Sync>),
    /// The ledger's exactly-once store could not be opened.
    #[error("cannot open the ledger's effect store: {0}")]
    Effects(#[from] toolgate_commit::EffectError),
}

/// How to supply each missing part, for [`GateError::Missing`].
fn missing_fix(parts: &[&'static str]) -> String {
    parts
        .iter()
        .map(|part| match *part {
            "policy" => "call GatedBuilder::policy_file (or ::policy with a loaded toolgate_policy::Policy)",
            "audit" => "call GatedBuilder::ledger (or ::audit with a sink such as toolgate_audit::FileAuditLog)",
            "checkpoint_key" => "call GatedBuilder::checkpoint_key: checkpoint_every only sets how often that key signs",
            other => other,
        })
        .collect::<Vec<_>>()
        .join("; ")
}

/// How to resolve a [`GateError::Conflict`] between `first` and `second`.
fn conflict_fix(first: &str, second: &str) -> &'static str {
    match (first, second) {
        ("policy", "policy_file") => {
            "give the policy once, either loaded (::policy) or as a file read at build (::policy_file)"
        }
        ("checkpoint_key", "audit") => {
            "the key signs only an audit log the builder opens itself (::ledger); give it to your own sink instead (toolgate_audit::AuditConfig::checkpoint_key) or leave out ::audit"
        }
        ("checkpoint_every", "audit") => {
            "the interval applies only to an audit log the builder opens itself (::ledger); give it to your own sink instead (toolgate_audit::AuditConfig::checkpoint_every) or leave out ::audit"
        }
        _ => "leave out one of them",
    }
}

/// Why a tool the inner handler does not resolve is unavailable, when the server knows: a proxy's
/// upstream tool that changed since a person approved it. For a caller the policy and the rights
/// let call the tool, the reason replaces the plain unknown-tool error and is recorded in the audit
/// line; to any other caller the tool stays as unknown as one that never existed.
pub trait UnavailableTools: Send + Sync + std::fmt::Debug + 'static {
    /// Why `tool` cannot be called now (one line, no secrets), or `None` for a tool the server has
    /// never heard of.
    fn why(&self, tool: &str) -> Option<String>;
}

/// A `ServerHandler` whose tools are decided by a [`Policy`], audited, and reachable only with a
/// [`Permit`].
///
/// The inner handler must implement `get_tool` (the `#[tool_handler]` macro does): the gate uses
/// it to tell unknown tools from known ones, and treats a tool `get_tool` does not know as unknown,
/// so a handler without it fails closed.
pub struct Gated<H> {
    pub(crate) inner: H,
    pub(crate) state: PolicyHandle,
    audit: Arc<dyn AuditSink>,
    request_id_field: String,
    contract_changes: BTreeMap<String, Vec<Change>>,
    pub(crate) principals: Arc<dyn PrincipalSource>,
    /// Every governance check, with its state, in the order of [`Checks::new`] (shared with
    /// the blocking tasks that answer replays, which present them).
    pub(crate) checks: Arc<Checks>,
    /// Why tools the inner handler does not resolve are unavailable, when it knows.
    pub(crate) unavailable: Option<Arc<dyn UnavailableTools>>,
    /// The tasks gated calls created, with their tool and caller.
    pub(crate) tasks: tasks::Tasks,
}

/// The `_meta` key under which the gate publishes the server's contract digest in the results of
/// `initialize` and `server/discover`, so a host can pin it.
pub const CONTRACT_DIGEST_META_KEY: &str = "io.toolgate/contractDigest";

fn add_contract_meta(meta: &mut Option<rmcp::model::MetaObject>, digest: Option<Sha256Digest>) {
    if let Some(digest) = digest {
        meta.get_or_insert_with(rmcp::model::MetaObject::new)
            .0
            .insert(
                CONTRACT_DIGEST_META_KEY.to_owned(),
                Value::String(format!("sha256:{digest}")),
            );
    }
}

impl<H> std::fmt::Debug for Gated<H> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Gated")
            .field("policy_digest", &self.state.snapshot().policy.digest())
            .field("audit", &self.audit)
            .finish_non_exhaustive()
    }
}

/// The audit log's file name inside a ledger directory ([`GatedBuilder::ledger`]).
pub const LEDGER_AUDIT_FILE: &str = "audit.jsonl";
/// The exactly-once store's directory inside a ledger directory ([`GatedBuilder::ledger`]).
pub const LEDGER_EFFECTS_DIR: &str = "effects";

/// How long a call waits for another call with the same idempotency key to finish before it is
/// answered "in progress": long enough for most effects, short of a client's usual timeout.
pub const LEDGER_WAIT_IN_PROGRESS: std::time::Duration = std::time::Duration::from_secs(30);

/// The exactly-once store of the ledger `dir` as [`GatedBuilder::ledger`] opens it: in
/// `dir/effects/`, a call waits up to [`LEDGER_WAIT_IN_PROGRESS`] for a live call holding its key,
/// and completed results are kept for the longest `window_secs` the policy gives any tool (24 h
/// when none does).
pub fn ledger_effect_config(dir: &Path, policy: &Policy) -> toolgate_commit::EffectConfig {
    effect_config(dir.join(LEDGER_EFFECTS_DIR), policy)
}

/// The exactly-once settings every store of a gate gets from the policy (see
/// [`ledger_effect_config`]); `dir` only matters to the file store.
fn effect_config(dir: PathBuf, policy: &Policy) -> toolgate_commit::EffectConfig {
    let window = policy
        .allowed()
        .filter_map(|tool| policy.idempotency(tool).and_then(|s| s.window_secs))
        .max()
        .unwrap_or(24 * 60 * 60);
    toolgate_commit::EffectConfig::new(dir)
        .wait_in_progress(LEDGER_WAIT_IN_PROGRESS)
        .completed_ttl(std::time::Duration::from_secs(window))
}

/// Builds a [`Gated`] handler.
#[must_use]
pub struct GatedBuilder<H> {
    inner: H,
    policy: Option<Arc<Policy>>,
    policy_file: Option<PathBuf>,
    ledger: Option<PathBuf>,
    checkpoint_key: Option<HmacKey>,
    checkpoint_every: Option<u64>,
    storage: Option<Arc<dyn toolgate_storage::Storage>>,
    server_name: Option<String>,
    audit: Option<Arc<dyn AuditSink>>,
    request_id_field: String,
    effects: Option<Arc<dyn EffectBackend>>,
    principals: Principals,
    probes: BTreeMap<String, EffectProbe>,
    kill_switch: Option<KillSwitch>,
    rights: Option<RightsFile>,
    entities: Option<toolgate_state::EntitiesFile>,
    rates: Option<Arc<dyn RateStore>>,
    pending: Option<Arc<dyn PendingStore>>,
    preflight: Option<Arc<dyn Preflight>>,
    unavailable: Option<Arc<dyn UnavailableTools>>,
    contract_digest: Option<Sha256Digest>,
    tool_contract_digests: BTreeMap<String, Sha256Digest>,
    /// The tools as the live contract describes them, for Cedar.
    tools: Option<Arc<[toolgate_policy::ToolSignature]>>,
    contract_changes: BTreeMap<String, Vec<Change>>,
    /// The server's tools and the text of its committed lockfile, for the live contract.
    contract_at_build: Option<ContractAtBuild>,
}

/// The builder's principal setting: a configured name (checked at build) or a source.
enum Principals {
    Named(String),
    Source(Arc<dyn PrincipalSource>),
}

impl<H> std::fmt::Debug for GatedBuilder<H> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GatedBuilder").finish_non_exhaustive()
    }
}

impl<H: ServerHandler> GatedBuilder<H> {
    /// The policy that decides every call. Required, unless [`GatedBuilder::policy_file`] is
    /// given; both together are refused at build ([`GateError::Conflict`]).
    pub fn policy(mut self, policy: impl Into<Arc<Policy>>) -> Self {
        self.policy = Some(policy.into());
        self
    }

    /// Reads the policy from `path` at [`GatedBuilder::build`] (a load error is the build's
    /// error, naming the file). Together with [`GatedBuilder::policy`] it is refused at build
    /// ([`GateError::Conflict`]), in either order: one of them would be ignored.
    pub fn policy_file(mut self, path: impl AsRef<Path>) -> Self {
        self.policy_file = Some(path.as_ref().to_owned());
        self
    }

    /// Where decisions are recorded (a `FileAuditLog`, a `MemoryAuditLog`, an `Arc` of either, or
    /// any other sink). Required unless [`GatedBuilder::ledger`] is given.
    pub fn audit(mut self, audit: impl AuditSink + 'static) -> Self {
        self.audit = Some(Arc::new(audit));
        self
    }

    /// The ledger directory, opened at [`GatedBuilder::build`] in the documented layout for every
    /// part not given explicitly: the audit log `dir/audit.jsonl` (signed checkpoints with
    /// [`GatedBuilder::checkpoint_key`]), the exactly-once store `dir/effects/`, and the kill
    /// switch `dir/halt.json`. The rights file is never implied: pass it with
    /// [`GatedBuilder::rights`].
    pub fn ledger(mut self, dir: impl AsRef<Path>) -> Self {
        self.ledger = Some(dir.as_ref().to_owned());
        self
    }

    /// The name of the server's binary (e.g. `bookings-mcp`), used in every message that names an
    /// operator command (`<name> resume` when calls are halted). Without it messages name no
    /// command.
    pub fn server_name(mut self, name: impl Into<String>) -> Self {
        self.server_name = Some(name.into());
        self
    }

    /// The storage the parts [`GatedBuilder::ledger`] opens write through (default: the real
    /// filesystem); tests pass a `toolgate_storage::FaultyStorage` to count or fail its steps.
    pub fn storage(mut self, storage: Arc<dyn toolgate_storage::Storage>) -> Self {
        self.storage = Some(storage);
        self
    }

    /// The HMAC key that signs the audit log's checkpoints when the builder opens that log
    /// itself, the ledger's file ([`GatedBuilder::ledger`]; a database's chain is opened with its
    /// key by `toolgate::stores::Stores::database`), a checkpoint every
    /// `toolgate_audit::DEFAULT_CHECKPOINT_EVERY` records. Keep it outside the ledger. With an
    /// explicit [`GatedBuilder::audit`] the builder opens no log, so the two together are refused
    /// at build ([`GateError::Conflict`]): configure the sink's own key instead.
    pub fn checkpoint_key(mut self, key: HmacKey) -> Self {
        self.checkpoint_key = Some(key);
        self
    }

    /// How many records the [`GatedBuilder::checkpoint_key`] signs a checkpoint after (default
    /// `toolgate_audit::DEFAULT_CHECKPOINT_EVERY`; at least 1), in the log the builder opens
    /// itself. Without a checkpoint key it is refused at build ([`GateError::Missing`]), and
    /// with an explicit [`GatedBuilder::audit`] too ([`GateError::Conflict`]).
    pub fn checkpoint_every(mut self, records: u64) -> Self {
        self.checkpoint_every = Some(records.max(1));
        self
    }

    /// The string argument recorded as the audit line's `request_id` (default `request_id`).
    /// Calls without it are recorded as `rpc:<JSON-RPC id>`.
    pub fn request_id_field(mut self, field: impl Into<String>) -> Self {
        self.request_id_field = field.into();
        self
    }

    /// The exactly-once backend (the file `EffectStore`, or `MemoryEffects`) that makes the tools
    /// the policy opts in (`idempotency`) execute exactly once per key; without it those settings
    /// are refused at build time.
    ///
    /// A call that finds its key held by another live call waits for it up to the store's
    /// `wait_in_progress`, polling from tokio timers rather than a blocking thread, so the runtime
    /// that serves the gate needs its time driver enabled (`enable_all`, or `enable_time`).
    pub fn effect_store(mut self, effects: Arc<dyn EffectBackend>) -> Self {
        self.effects = Some(effects);
        self
    }

    /// One principal for every request (a stdio server's configured caller; never from tool
    /// arguments); `build` fails if it is not a valid principal name. Default `local`.
    pub fn principal(mut self, principal: impl Into<String>) -> Self {
        self.principals = Principals::Named(principal.into());
        self
    }

    /// Where each request's principal comes from, asked on every `tools/list` and `tools/call`
    /// (for example [`crate::FromExtensions`] behind a transport that authenticates callers).
    /// Replaces [`GatedBuilder::principal`].
    pub fn principal_source(mut self, source: impl PrincipalSource) -> Self {
        self.principals = Principals::Source(Arc::new(source));
        self
    }

    /// Registers a probe for `tool`: when a call of it with `effect: unsafe` finds an execution
    /// whose caller died mid-effect, the probe decides instead of leaving it indeterminate.
    pub fn effect_probe(mut self, tool: impl Into<String>, probe: EffectProbe) -> Self {
        self.probes.insert(tool.into(), probe);
        self
    }

    /// The kill switch consulted on every call (`toolgate-server halt` sets it): while it is set
    /// every tools/call gets a JSON-RPC error, except tools the policy exempts.
    pub fn kill_switch(mut self, switch: KillSwitch) -> Self {
        self.kill_switch = Some(switch);
        self
    }

    /// The rights file consulted on every call: a tool the principal has no right to is hidden
    /// and refused like a denied one; an unreadable file refuses everything (fail closed).
    pub fn rights(mut self, rights: RightsFile) -> Self {
        self.rights = Some(rights);
        self
    }

    /// Roles and attributes of principals for the policy's Cedar policies, from an entities
    /// store (docs/policy.md, "Cedar"): a file re-read when it changes
    /// (`EntitiesFile::new(path)`), or any `EntitiesStore` such as a database's every replica
    /// shares (`Arc::new(toolgate_postgres::PgEntities::open(store)?)`), joined with what each
    /// caller's credential says. Entities that cannot be read refuse what Cedar decides.
    pub fn entities(mut self, entities: impl Into<toolgate_state::EntitiesFile>) -> Self {
        self.entities = Some(entities.into());
        self
    }

    /// Where the rate-limit buckets are kept (default: this process's memory, a
    /// `toolgate_state::RateLimiter`); a database's buckets count calls across every replica.
    pub fn rate_store(mut self, rates: Arc<dyn RateStore>) -> Self {
        self.rates = Some(rates);
        self
    }

    /// Where pending confirmations are kept (default: this process's memory); a database's let a
    /// preview issued by one replica be confirmed once on any. Tokens live as long as the
    /// policy's `confirmation_ttl` says.
    pub fn pending_store(mut self, pending: Arc<dyn PendingStore>) -> Self {
        self.pending = Some(pending);
        self
    }

    /// Prepares calls for two-step confirmation, evaluates batch filters, reads current versions
    /// and finds existing duplicates. Without it, a confirmation summary is the tool name with
    /// its canonical arguments, and batch filters, calls of tools under `versions` and calls of
    /// tools under `duplicates` (without `separate: true`) are refused.
    pub fn preflight(mut self, preflight: Arc<dyn Preflight>) -> Self {
        self.preflight = Some(preflight);
        self
    }

    /// Explains the tools the inner handler does not resolve (see [`UnavailableTools`]).
    pub fn unavailable_tools(mut self, unavailable: Arc<dyn UnavailableTools>) -> Self {
        self.unavailable = Some(unavailable);
        self
    }

    /// The server's live contract (its `toolgate.lock` as computed now): its integrity digest is
    /// published in the `_meta` of the `initialize` and `server/discover` results under
    /// [`CONTRACT_DIGEST_META_KEY`] so a host can pin it, and each tool's contract digest is
    /// recorded in that tool's audit lines, so a verifier can show which contract produced each
    /// decision.
    pub fn contract(mut self, live: &toolgate_contract::lockfile::Lockfile) -> Self {
        self.contract_at_build = None;
        self.set_contract(live);
        self
    }

    /// A contract given as digests, for a server whose tools are not described by a
    /// `toolgate.lock` (the proxy's upstream pin): `integrity` is published as
    /// [`contract`](Self::contract)'s integrity digest is, and `tools[name]` is recorded in that
    /// tool's audit lines.
    pub fn contract_digests(
        mut self,
        integrity: Sha256Digest,
        tools: BTreeMap<String, Sha256Digest>,
    ) -> Self {
        self.contract_at_build = None;
        self.contract_digest = Some(integrity);
        self.tool_contract_digests = tools;
        self.tools = None;
        self
    }

    fn set_contract(&mut self, live: &toolgate_contract::lockfile::Lockfile) {
        let (digest, digests, tools) = crate::state::contract_parts(live);
        self.contract_digest = Some(digest);
        self.tool_contract_digests = digests;
        self.tools = Some(tools);
    }

    /// The contract computed at [`GatedBuilder::build`] under the policy loaded there, by
    /// `compute` (the facade's `locked_contract`: a server's tools as compiled with the
    /// entitlements its committed `toolgate.lock` records). Published and recorded as
    /// [`GatedBuilder::contract`] does; an error of `compute` is the build's
    /// ([`GateError::Contract`]). Replaces [`GatedBuilder::contract`].
    pub fn contract_at_build(
        mut self,
        compute: impl FnOnce(&Policy) -> Result<Lockfile, BoxError> + Send + 'static,
    ) -> Self {
        self.contract_at_build = Some(Box::new(compute));
        self
    }

    /// How each tool's contract changed since a previous lockfile (from
    /// `toolgate_contract::diff::diff`), so that a refused call can tell a model working from the
    /// old contract what changed (at most five BREAKING or RISKY changes of that tool).
    pub fn contract_changes(mut self, changes: Vec<Change>) -> Self {
        self.contract_changes.clear();
        for change in changes {
            self.contract_changes
                .entry(change.tool.clone())
                .or_default()
                .push(change);
        }
        self
    }

    /// `switch` naming this server's resume command, when the server is named (unless the switch
    /// names one already).
    fn named(&self, switch: KillSwitch) -> KillSwitch {
        match &self.server_name {
            Some(name) if !switch.has_resume_command() => {
                switch.resume_command(format!("{name} resume"))
            }
            _ => switch,
        }
    }

    /// Builds the gate: loads the policy file and opens the ledger's parts if they were given,
    /// then checks that every required part is there.
    pub fn build(mut self) -> Result<Gated<H>, GateError> {
        // Settings of which only one could take effect are refused before anything is opened.
        for (first, second, both) in [
            (
                "policy",
                "policy_file",
                self.policy.is_some() && self.policy_file.is_some(),
            ),
            (
                "checkpoint_key",
                "audit",
                self.checkpoint_key.is_some() && self.audit.is_some(),
            ),
            (
                "checkpoint_every",
                "audit",
                self.checkpoint_every.is_some() && self.audit.is_some(),
            ),
        ] {
            if both {
                return Err(GateError::Conflict { first, second });
            }
        }
        if let Some(path) = self.policy_file.take() {
            self.policy = Some(Arc::new(Policy::load(&path)?));
        }
        let missing: Vec<&'static str> = [
            ("policy", self.policy.is_none()),
            ("audit", self.audit.is_none() && self.ledger.is_none()),
            (
                "checkpoint_key",
                self.checkpoint_every.is_some() && self.checkpoint_key.is_none(),
            ),
        ]
        .into_iter()
        .filter_map(|(part, absent)| absent.then_some(part))
        .collect();
        let Some(policy) = self.policy.take().filter(|_| missing.is_empty()) else {
            return Err(GateError::Missing { parts: missing });
        };
        if let Some(compute) = self.contract_at_build.take() {
            self.set_contract(&compute(&policy).map_err(GateError::Contract)?);
        }
        let pending_ttl = policy.confirmation_ttl();
        let rates = match self.rates.take() {
            Some(store) => crate::checks::rates::Rates::with_store(store),
            None => crate::checks::rates::Rates::default(),
        };
        let pending = match self.pending.take() {
            Some(store) => PendingActions::with_store(pending_ttl, store),
            None => PendingActions::new(pending_ttl),
        };
        if let Some(dir) = &self.ledger {
            let storage = self
                .storage
                .clone()
                .unwrap_or_else(|| Arc::new(toolgate_storage::FsStorage));
            if self.audit.is_none() {
                let mut config = toolgate_audit::AuditConfig::new(dir.join(LEDGER_AUDIT_FILE))
                    .storage(Arc::clone(&storage));
                if let Some(key) = self.checkpoint_key.take() {
                    config = config.checkpoint_key(key);
                }
                if let Some(records) = self.checkpoint_every {
                    config = config.checkpoint_every(records);
                }
                self.audit = Some(Arc::new(toolgate_audit::FileAuditLog::open_with(config)?));
            }
            if self.effects.is_none() {
                self.effects = Some(Arc::new(toolgate_commit::EffectStore::open_with_storage(
                    ledger_effect_config(dir, &policy),
                    Arc::clone(&storage),
                )?));
            }
            if self.kill_switch.is_none() {
                self.kill_switch = Some(KillSwitch::on_storage(dir, storage));
            }
        }
        let kill_switch = self.kill_switch.take().map(|switch| self.named(switch));
        if self.effects.is_none()
            && let Some(tool) = policy
                .allowed()
                .find(|tool| policy.idempotency(tool).is_some())
        {
            return Err(GateError::MissingEffectStore {
                tool: tool.to_owned(),
            });
        }
        let Some(audit) = self.audit else {
            return Err(GateError::Missing {
                parts: vec!["audit"],
            });
        };
        let principals: Arc<dyn PrincipalSource> = match self.principals {
            Principals::Named(name) => Arc::new(
                FixedPrincipal::new(&name).map_err(|_| GateError::InvalidPrincipal { name })?,
            ),
            Principals::Source(source) => source,
        };
        let cedar = crate::checks::cedar::compile(&policy, self.tools.as_deref())
            .map_err(GateError::Cedar)?;
        let state = GateState {
            policy,
            contract_digest: self.contract_digest,
            tool_contract_digests: self.tool_contract_digests,
            tools: self.tools,
            cedar,
        };
        let checks = Checks::new(crate::checks::Parts {
            rights: self.rights,
            entities: self.entities,
            kill_switch,
            server_name: self.server_name,
            effects: self.effects.clone(),
            probes: self.probes,
            preflight: self.preflight,
            rates,
            pending,
        });
        Ok(Gated {
            inner: self.inner,
            state: PolicyHandle::new(state, Arc::clone(&audit), self.effects.is_some()),
            audit,
            request_id_field: self.request_id_field,
            contract_changes: self.contract_changes,
            principals,
            checks: Arc::new(checks),
            tasks: tasks::Tasks::default(),
            unavailable: self.unavailable,
        })
    }
}

impl<H: ServerHandler> Gated<H> {
    /// Starts building a gate around `inner`.
    pub fn builder(inner: H) -> GatedBuilder<H> {
        GatedBuilder {
            inner,
            policy: None,
            policy_file: None,
            ledger: None,
            checkpoint_key: None,
            checkpoint_every: None,
            storage: None,
            server_name: None,
            audit: None,
            request_id_field: "request_id".to_owned(),
            effects: None,
            principals: Principals::Named("local".to_owned()),
            probes: BTreeMap::new(),
            kill_switch: None,
            rights: None,
            entities: None,
            rates: None,
            pending: None,
            preflight: None,
            unavailable: None,
            contract_digest: None,
            tool_contract_digests: BTreeMap::new(),
            tools: None,
            contract_changes: BTreeMap::new(),
            contract_at_build: None,
        }
    }

    /// The wrapped handler.
    pub fn inner(&self) -> &H {
        &self.inner
    }

    /// The policy in force now (a reload through [`Gated::policy_handle`] replaces it).
    pub fn policy(&self) -> Arc<Policy> {
        self.state.policy()
    }

    /// A handle that reads or replaces the policy while the gate serves (for SIGHUP reloads).
    pub fn policy_handle(&self) -> PolicyHandle {
        self.state.clone()
    }

    /// The gate for a transport that verifies a credential on every request (Streamable HTTP):
    /// a fixed principal (the builder's [`GatedBuilder::principal`], `local` by default) is
    /// replaced by [`FromExtensions`], so no caller is ever served as the fixed name; a
    /// per-request source is kept. Whether the fixed principal was replaced is the second value.
    pub fn with_verified_principals(mut self) -> (Self, bool) {
        let replaced = self.principals.without_request().is_some();
        if replaced {
            self.principals = Arc::new(FromExtensions);
        }
        (self, replaced)
    }

    /// The text appended to an argument refusal: the tool's current input contract and, when a
    /// previous lockfile was given, what changed since.
    fn contract_note(&self, tool: &str, input: &InputShape) -> String {
        let changes = self
            .contract_changes
            .get(tool)
            .map(Vec::as_slice)
            .unwrap_or_default();
        contract_note(tool, input, changes)
    }

    /// An audit entry for a call of `name`, carrying the digests of the policy in force and of the
    /// tool's contract (when known).
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn entry(
        &self,
        state: &GateState,
        caller: &Caller,
        request_id: String,
        name: &str,
        decision: AuditDecision,
        outcome: Outcome,
        args_digest: Sha256Digest,
    ) -> AuditEntry {
        let mut entry = AuditEntry::tool_call(request_id, name, decision, outcome, args_digest)
            .with_policy_digest(state.policy.digest())
            .with_principal(&*caller.principal);
        if let Some(credential) = &caller.credential {
            entry.channel = credential.channel().map(str::to_owned);
            entry.tenant = credential.tenant().map(str::to_owned);
        }
        if let Some((name, version)) = &caller.client {
            entry = entry.with_client(name, version);
        }
        match state.tool_contract_digests.get(name) {
            Some(digest) => entry.with_contract_digest(*digest),
            None => entry,
        }
    }

    /// Whether tools/list shows `tool` to `caller`: the inner handler resolves it, the caller's
    /// credential holds a scope it needs, and every check lists it.
    pub(crate) fn listed(&self, state: &GateState, caller: &Caller, tool: &str) -> bool {
        self.inner.get_tool(tool).is_some()
            && caller.grants(&state.policy, tool)
            && self.checks.lists(state, caller, tool)
    }

    /// Who makes a request, or the JSON-RPC error refusing a request without a principal.
    pub(crate) fn caller_of(
        &self,
        context: &RequestContext<RoleServer>,
    ) -> Result<Caller, McpError> {
        let principal = self.principals.principal(&context.extensions).ok_or_else(|| {
            McpError::invalid_request(
                "the request carries no verified principal; the transport must authenticate the caller",
                None,
            )
        })?;
        let credential = self.principals.credential(&context.extensions);
        // What the client says of itself, recorded with the calls of authenticated transports:
        // the request's own `_meta` (2026-07-28), else the session's `initialize` (2025-11-25).
        // rmcp stands in its own identity for a stateless request's missing one: not the client's.
        let client = credential.as_ref().and_then(|_| {
            context.meta.client_info().or_else(|| {
                context
                    .peer
                    .peer_info()
                    .map(|info| info.client_info.clone())
                    .filter(|info| *info != rmcp::model::Implementation::default())
            })
        });
        Ok(Caller {
            principal,
            credential,
            client: client.map(|info| (info.name, info.version)),
        })
    }

    /// The JSON-RPC error that refuses a call of `tool` now because the kill switch (or the switch
    /// of `tenant`) is on; `None` when the call may go on (no halt, or the policy exempts the
    /// tool). A transport asks it before the call reaches rmcp (the HTTP front door answers 503).
    /// Reads the switch (a file or the database): call it off the async threads.
    pub fn halted_for(&self, tool: &str, tenant: Option<&str>) -> Option<McpError> {
        if self.state.snapshot().policy.halt_exempt(tool) {
            return None;
        }
        self.checks.kill_switch.halted(tenant)
    }

    /// tools/list, gated: the inner handler's list, less what this caller may not see.
    async fn gated_list_tools(
        &self,
        request: Option<PaginatedRequestParams>,
        context: RequestContext<RoleServer>,
    ) -> Result<ListToolsResult, McpError> {
        let caller = self.caller_of(&context)?;
        let mut result =
            crate::unwind::answered("tools/list", self.inner.list_tools(request, context)).await?;
        let state = self.state.snapshot();
        // Listed exactly when callable: the inner handler resolves it and every check shows it
        // to this caller.
        result.tools.retain(|tool| {
            !self.confirmations_offered(&tool.name) && self.listed(&state, &caller, &tool.name)
        });
        for tool in &mut result.tools {
            self.checks.describe(&state, tool);
            // The gate's own answers (refusals, previews) carry structured content too.
            crate::refusal::admit_gate_results(tool);
        }
        if self.offers_confirmation(&state, &caller) {
            result
                .tools
                .push(crate::checks::confirmation::confirmation_tool(
                    CONFIRM_ACTION,
                ));
            result
                .tools
                .push(crate::checks::confirmation::confirmation_tool(
                    REJECT_ACTION,
                ));
        }
        // With a principal per request the list is this caller's: no shared cache may serve it
        // to another (2026-07-28 `cacheScope`).
        if self.principals.without_request().is_none() {
            result.cache_scope = Some(rmcp::model::CacheScope::Private);
        }
        Ok(result)
    }

    /// The contract digest published to clients, if any.
    pub fn contract_digest(&self) -> Option<Sha256Digest> {
        self.state.snapshot().contract_digest
    }

    /// The audit line's `request_id`: the configured string argument when the resolved tool
    /// declares it in its input schema (so a refused or unknown call cannot write text of the
    /// caller's choosing into the log), else `rpc:<JSON-RPC id>`.
    fn request_id(
        &self,
        arguments: Option<&Map<String, Value>>,
        tool: &Tool,
        rpc_id: &impl std::fmt::Display,
    ) -> String {
        let declared = tool
            .input_schema
            .get("properties")
            .and_then(Value::as_object)
            .is_some_and(|properties| properties.contains_key(&self.request_id_field));
        match arguments.and_then(|a| a.get(&self.request_id_field)) {
            // However long: the audit record keeps a long one as its digest and length.
            Some(Value::String(id)) if declared => id.clone(),
            _ => format!("rpc:{rpc_id}"),
        }
    }

    /// Appends one record: through [`crate::blocking::run`] when the sink may block (the file sink
    /// fsyncs), directly otherwise (no thread hand-off for a sink that never waits on I/O).
    async fn record(&self, entry: AuditEntry) -> Result<(), String> {
        if !self.audit.may_block() {
            return self
                .audit
                .append(&entry)
                .map(drop)
                .map_err(|error| error.to_string());
        }
        let audit = Arc::clone(&self.audit);
        match crate::blocking::run(move || audit.append(&entry)).await {
            Ok(Ok(_)) => Ok(()),
            Ok(Err(error)) => Err(error.to_string()),
            Err(_) => Err("the audit task was cancelled".to_owned()),
        }
    }
}

/// The contract block of an argument refusal of `tool`: its input contract and the `changes` since
/// the previous lockfile.
pub(crate) fn contract_note(tool: &str, input: &InputShape, changes: &[Change]) -> String {
    let current = InputContract {
        required: input.required.clone(),
        allowed: input.allowed.clone(),
    };
    contract_awareness(tool, &current, changes, MAX_CONTRACT_CHANGES)
}

/// Expires a permit and records an abandoned call when the gate's call future does not complete.
struct CallGuard<'a> {
    permit: Permit,
    /// `Some` while the call is in flight; taken when it completes normally.
    audit: Option<Arc<dyn AuditSink>>,
    /// The call's allow record (copied only when the call is abandoned).
    allow: &'a AuditEntry,
}

impl Drop for CallGuard<'_> {
    fn drop(&mut self) {
        let Some(audit) = self.audit.take() else {
            return;
        };
        let mut entry = self.allow.clone();
        // The handler may have reached its effect before being abandoned: record what it reached.
        entry.outcome = self
            .permit
            .close()
            .unwrap_or(toolgate_audit::Outcome::Cancelled);
        entry = entry.with_reason(toolgate_audit::Reason::Cancelled);
        // Synchronous on purpose: this runs when the future is dropped, possibly while the runtime
        // shuts down, when a spawned task might never run. One fsync on a rare path is acceptable.
        if let Err(error) = audit.append(&entry) {
            tracing::error!(%error, "could not audit an abandoned call");
        }
    }
}

/// Writes out `ServerHandler` methods that forward to the inner handler unchanged, each polled
/// through `unwind`: `answered`, a request's panic becomes -32603; `notified`, a notification's is
/// logged. The literal names the method in the log.
macro_rules! forward {
    ($($(#[$attr:meta])* $unwind:ident $name:ident($($arg:ident: $ty:ty),* $(,)?) -> $out:ty, $method:literal;)*) => {$(
        $(#[$attr])*
        fn $name(&self, $($arg: $ty),*) -> impl Future<Output = $out> + MaybeSendFuture + '_ {
            crate::unwind::$unwind($method, self.inner.$name($($arg),*))
        }
    )*};
}

impl<H: ServerHandler> ServerHandler for Gated<H> {
    async fn initialize(
        &self,
        request: InitializeRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<InitializeResult, McpError> {
        let mut result =
            crate::unwind::answered("initialize", self.inner.initialize(request, context)).await?;
        add_contract_meta(&mut result.meta, self.contract_digest());
        Ok(result)
    }

    fn negotiate_initialize(
        &self,
        request: &InitializeRequestParams,
    ) -> Result<InitializeResult, McpError> {
        let mut result = self.inner.negotiate_initialize(request)?;
        add_contract_meta(&mut result.meta, self.contract_digest());
        Ok(result)
    }

    fn supported_protocol_versions(&self) -> Cow<'static, [ProtocolVersion]> {
        self.inner.supported_protocol_versions()
    }

    async fn discover(
        &self,
        context: RequestContext<RoleServer>,
    ) -> Result<DiscoverResult, McpError> {
        let mut result =
            crate::unwind::answered("server/discover", self.inner.discover(context)).await?;
        add_contract_meta(&mut result.meta, self.contract_digest());
        Ok(result)
    }

    fn accepted_subscription_filter(
        &self,
        requested: &SubscriptionFilter,
    ) -> Option<SubscriptionFilter> {
        self.inner.accepted_subscription_filter(requested)
    }

    fn call_tool(
        &self,
        request: CallToolRequestParams,
        context: RequestContext<RoleServer>,
    ) -> impl Future<Output = Result<CallToolResponse, McpError>> + MaybeSendFuture + '_ {
        #[cfg(feature = "otel")]
        {
            let tool = Some(request.name.to_string());
            let (id, meta) = (context.id.to_string(), context.meta.clone());
            async move {
                crate::telemetry::traced(
                    "tools/call",
                    tool,
                    id,
                    &meta,
                    self.gated_call_tool(request, context),
                )
                .await
            }
        }
        #[cfg(not(feature = "otel"))]
        self.gated_call_tool(request, context)
    }

    async fn list_tools(
        &self,
        request: Option<PaginatedRequestParams>,
        context: RequestContext<RoleServer>,
    ) -> Result<ListToolsResult, McpError> {
        #[cfg(feature = "otel")]
        {
            let (id, meta) = (context.id.to_string(), context.meta.clone());
            crate::telemetry::traced(
                "tools/list",
                None,
                id,
                &meta,
                self.gated_list_tools(request, context),
            )
            .await
        }
        #[cfg(not(feature = "otel"))]
        self.gated_list_tools(request, context).await
    }

    fn get_tool(&self, name: &str) -> Option<Tool> {
        // No request here: a fixed principal answers as for its calls; a per-request source is
        // answered from the policy's top level (no principal's section or rights).
        let state = self.state.snapshot();
        let Some(principal) = self.principals.without_request() else {
            if self.confirmations_offered(name) {
                return None;
            }
            return self
                .inner
                .get_tool(name)
                .filter(|_| state.policy.visible(name));
        };
        let caller = Caller {
            principal,
            credential: None,
            client: None,
        };
        if self.confirmations_offered(name) {
            return self
                .offers_confirmation(&state, &caller)
                .then(|| crate::checks::confirmation::confirmation_tool(name));
        }
        self.inner
            .get_tool(name)
            .filter(|_| self.checks.lists(&state, &caller, name))
    }

    fn get_info(&self) -> ServerConfig {
        let mut info = self.inner.get_info();
        add_contract_meta(&mut info.meta, self.contract_digest());
        info
    }

    async fn get_task(
        &self,
        request: GetTaskParams,
        context: RequestContext<RoleServer>,
    ) -> Result<GetTaskResult, McpError> {
        let caller = self.caller_of(&context)?;
        let tool = self.tasks.tool_of(&request.task_id, &caller)?;
        let mut result =
            crate::unwind::answered("tasks/get", self.inner.get_task(request, context)).await?;
        let state = self.state.snapshot();
        tasks::present(&self.checks, &state, &tool, &mut result.task.payload);
        Ok(result)
    }

    async fn update_task(
        &self,
        request: UpdateTaskParams,
        context: RequestContext<RoleServer>,
    ) -> Result<(), McpError> {
        let caller = self.caller_of(&context)?;
        self.tasks.tool_of(&request.task_id, &caller)?;
        crate::unwind::answered("tasks/update", self.inner.update_task(request, context)).await
    }

    async fn cancel_task(
        &self,
        request: CancelTaskParams,
        context: RequestContext<RoleServer>,
    ) -> Result<(), McpError> {
        let caller = self.caller_of(&context)?;
        self.tasks.tool_of(&request.task_id, &caller)?;
        crate::unwind::answered("tasks/cancel", self.inner.cancel_task(request, context)).await
    }

    // Forwarded unchanged (a panic answered or logged by `unwind`); the methods above change
    // something on the way.
    forward! {
        answered ping(context: RequestContext<RoleServer>) -> Result<(), McpError>, "ping";
        answered complete(
            request: CompleteRequestParams,
            context: RequestContext<RoleServer>,
        ) -> Result<CompleteResult, McpError>, "completion/complete";
        #[allow(deprecated)]
        answered set_level(
            request: SetLevelRequestParams,
            context: RequestContext<RoleServer>,
        ) -> Result<(), McpError>, "logging/setLevel";
        answered get_prompt(
            request: GetPromptRequestParams,
            context: RequestContext<RoleServer>,
        ) -> Result<GetPromptResponse, McpError>, "prompts/get";
        answered list_prompts(
            request: Option<PaginatedRequestParams>,
            context: RequestContext<RoleServer>,
        ) -> Result<ListPromptsResult, McpError>, "prompts/list";
        answered list_resources(
            request: Option<PaginatedRequestParams>,
            context: RequestContext<RoleServer>,
        ) -> Result<ListResourcesResult, McpError>, "resources/list";
        answered list_resource_templates(
            request: Option<PaginatedRequestParams>,
            context: RequestContext<RoleServer>,
        ) -> Result<ListResourceTemplatesResult, McpError>, "resources/templates/list";
        answered read_resource(
            request: ReadResourceRequestParams,
            context: RequestContext<RoleServer>,
        ) -> Result<ReadResourceResponse, McpError>, "resources/read";
        answered listen(
            context: SubscriptionContext,
        ) -> Result<(), McpError>, "subscriptions/listen";
        #[allow(deprecated)]
        answered subscribe(
            request: SubscribeRequestParams,
            context: RequestContext<RoleServer>,
        ) -> Result<(), McpError>, "resources/subscribe";
        #[allow(deprecated)]
        answered unsubscribe(
            request: UnsubscribeRequestParams,
            context: RequestContext<RoleServer>,
        ) -> Result<(), McpError>, "resources/unsubscribe";
        answered on_custom_request(
            request: CustomRequest,
            context: RequestContext<RoleServer>,
        ) -> Result<CustomResult, McpError>, "a custom request";
        answered list_skills(
            request: Option<PaginatedRequestParams>,
            context: RequestContext<RoleServer>,
        ) -> Result<ListSkillsResult, McpError>, "skills/list";
        answered get_skill(
            request: GetSkillRequestParams,
            context: RequestContext<RoleServer>,
        ) -> Result<GetSkillResult, McpError>, "skills/get";
        answered read_resource_directory(
            request: ReadResourceDirectoryRequestParams,
            context: RequestContext<RoleServer>,
        ) -> Result<ReadResourceDirectoryResult, McpError>, "a resource directory read";
        notified on_cancelled(
            notification: CancelledNotificationParam,
            context: NotificationContext<RoleServer>,
        ) -> (), "notifications/cancelled";
        notified on_progress(
            notification: ProgressNotificationParam,
            context: NotificationContext<RoleServer>,
        ) -> (), "notifications/progress";
        notified on_initialized(
            context: NotificationContext<RoleServer>,
        ) -> (), "notifications/initialized";
        notified on_roots_list_changed(
            context: NotificationContext<RoleServer>,
        ) -> (), "notifications/roots/list_changed";
        notified on_custom_notification(
            notification: CustomNotification,
            context: NotificationContext<RoleServer>,
        ) -> (), "a custom notification";
    }
}
