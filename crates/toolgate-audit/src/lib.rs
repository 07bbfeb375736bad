//! Append-only JSONL audit log with a SHA-256 hash chain: the record model, the storage-agnostic
//! [`AuditSink`] trait, the embedded file backend [`FileAuditLog`], and the verifier.
//!
//! Every line of the log is the RFC 8785 canonical JSON of one record, and every record carries the
//! `sha256` of the record before it, so editing, deleting or reordering lines breaks the chain in a
//! way [`verify_file`] reports with a line number. Records carry a consecutive `seq`; the writer
//! group-commits concurrent appends (one write and one fsync per batch), can rotate the log into
//! segments, and with an [`HmacKey`] signs checkpoints of `(count, head)` so that [`verify`] also
//! detects truncation and whole-log replacement. The format is a fixed contract described in
//! `docs/audit-format.md`; an independent verifier written from the lines alone must accept our logs.

#![forbid(unsafe_code)]

mod checkpoint;
mod error;
mod file;
mod memory;
mod outcome;
mod reason;
mod record;
mod segments;
pub mod stats;
mod verify;

use serde::{Deserialize, Serialize};
pub use toolgate_canon::Sha256Digest;

pub use checkpoint::Checkpoint;
pub use error::AuditError;
#[cfg(feature = "fault-injection")]
pub use file::FaultHook;
pub use file::now_ns;
pub use file::{AuditConfig, AuditStats, DEFAULT_CHECKPOINT_EVERY, FileAuditLog, Recovery};
pub use memory::MemoryAuditLog;
pub use outcome::Outcome;
pub use reason::Reason;
pub use record::{MAX_LINE_BYTES, MAX_REASON_BYTES, MAX_TEXT_FIELD_BYTES, Sealed, seal};
pub use segments::read_records;
pub use toolgate_canon::{HmacKey, KeyError};
pub use verify::{
    Problem, ProblemKind, VerifyOptions, VerifyReport, Warning, WarningKind, verify, verify_file,
    verify_reader, verify_sink, verify_sink_with,
};

/// The gate's decision for one call, written as `"allow"` or `"deny"`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum AuditDecision {
    /// The call was permitted.
    Allow,
    /// The call was refused before any handler ran.
    Deny,
}

impl AuditDecision {
    /// The wire form: `"allow"` or `"deny"`.
    pub fn as_str(self) -> &'static str {
        match self {
            AuditDecision::Allow => "allow",
            AuditDecision::Deny => "deny",
        }
    }
}

/// What a caller asks to record; the log adds `ts`, `prev_sha256` and `sha256`.
///
/// It holds names, outcomes and digests only: raw arguments never reach the audit log, which is why
/// the arguments appear as `args_digest`.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct AuditEntry {
    /// The caller's request or idempotency identifier.
    pub request_id: String,
    /// The protocol method, `"tools/call"` for tool calls.
    pub method: String,
    /// The tool name.
    pub name: String,
    /// Allow or deny.
    pub decision: AuditDecision,
    /// What happened (written as its wire form, e.g. `"committed"`).
    pub outcome: Outcome,
    /// SHA-256 of the canonical JSON of the call's arguments.
    pub args_digest: Sha256Digest,
    /// Why, when there is more to say than the decision (written only when present).
    pub reason: Option<String>,
    /// Digest of the policy in force when the decision was made (written as `policy_digest`, hex,
    /// only when present), so a verifier can show which policy produced each decision.
    pub policy_digest: Option<Sha256Digest>,
    /// Digest of the called tool's locked contract (written as `contract_digest`, hex, only when
    /// present; the server sets it once `toolgate.lock` exists).
    pub contract_digest: Option<Sha256Digest>,
    /// Who called (written as `principal`, only when present): the gate's principal of the
    /// request, from configuration or a verified credential.
    pub principal: Option<String>,
    /// Why the caller created an object although the gate's duplicate guard would have refused it
    /// (written as `separate_reason`, only when present): the `reason` the caller passed with
    /// `separate: true`. Caller text, so bounded like the other text fields: longer than
    /// [`MAX_REASON_BYTES`] it is written as its digest with its length in `separate_reason_bytes`.
    pub separate_reason: Option<String>,
    /// How many fields the gate's result allow-list removed from the result this record answers
    /// (written as `dropped_fields`, only when present: the gate sets it, 0 included, on every
    /// allow record of a tool whose results it filters).
    pub dropped_fields: Option<u64>,
    /// The transport the request came through when it authenticates its callers (written as
    /// `channel`, only when present), e.g. `"http"`.
    pub channel: Option<String>,
    /// The caller's tenant, from its verified credential (written as `tenant`, only when present).
    pub tenant: Option<String>,
    /// The name the client declared for itself (`clientInfo.name`; written as `client_name`, only
    /// when present). Caller text: bounded like `principal`, and never an identity.
    pub client_name: Option<String>,
    /// The version the client declared (`clientInfo.version`; written as `client_version`, only
    /// when present). Bounded like `client_name`.
    pub client_version: Option<String>,
    /// The Cedar policies that determined the decision (written as `cedar_policies`, only when
    /// present): their ids, sorted; the `permit`s of an allowed call, the `forbid`s of a refused
    /// one, none when no `permit` matched. The gate sets it whenever Cedar decided the call.
    pub cedar_policies: Option<std::sync::Arc<[String]>>,
    /// The digest of the Cedar policy set in force (written as `cedar_digest`, hex, only when
    /// present): on every call record of a policy with Cedar.
    pub cedar_digest: Option<Sha256Digest>,
}

impl AuditEntry {
    /// An entry for a `tools/call` request.
    pub fn tool_call(
        request_id: impl Into<String>,
        name: impl Into<String>,
        decision: AuditDecision,
        outcome: Outcome,
        args_digest: Sha256Digest,
    ) -> Self {
        AuditEntry {
            request_id: request_id.into(),
            method: "tools/call".to_owned(),
            name: name.into(),
            decision,
            outcome,
            args_digest,
            reason: None,
            policy_digest: None,
            contract_digest: None,
            principal: None,
            separate_reason: None,
            dropped_fields: None,
            channel: None,
            tenant: None,
            client_name: None,
            client_version: None,
            cedar_policies: None,
            cedar_digest: None,
        }
    }

    /// The same entry with a `principal` field.
    pub fn with_principal(mut self, principal: impl Into<String>) -> Self {
        self.principal = Some(principal.into());
        self
    }

    /// The same entry with a `reason` field: why it has its decision, one of the fixed shapes of
    /// [`Reason`].
    pub fn with_reason(mut self, reason: Reason) -> Self {
        self.reason = Some(reason.into());
        self
    }

    /// The same entry with a `policy_digest` field.
    pub fn with_policy_digest(mut self, digest: Sha256Digest) -> Self {
        self.policy_digest = Some(digest);
        self
    }

    /// The same entry with a `contract_digest` field.
    pub fn with_contract_digest(mut self, digest: Sha256Digest) -> Self {
        self.contract_digest = Some(digest);
        self
    }

    /// The same entry with a `separate_reason` field.
    pub fn with_separate_reason(mut self, reason: impl Into<String>) -> Self {
        self.separate_reason = Some(reason.into());
        self
    }

    /// The same entry with a `channel` field.
    pub fn with_channel(mut self, channel: impl Into<String>) -> Self {
        self.channel = Some(channel.into());
        self
    }

    /// The same entry with a `tenant` field.
    pub fn with_tenant(mut self, tenant: impl Into<String>) -> Self {
        self.tenant = Some(tenant.into());
        self
    }

    /// The same entry with `client_name` and `client_version` fields.
    pub fn with_client(mut self, name: impl Into<String>, version: impl Into<String>) -> Self {
        self.client_name = Some(name.into());
        self.client_version = Some(version.into());
        self
    }

    /// Sets `cedar_policies` (the determining policies) and `cedar_digest`.
    pub fn set_cedar(&mut self, policies: Option<std::sync::Arc<[String]>>, digest: Sha256Digest) {
        self.cedar_policies = policies;
        self.cedar_digest = Some(digest);
    }

    /// The same entry with a `dropped_fields` field.
    pub fn with_dropped_fields(mut self, dropped: u64) -> Self {
        self.dropped_fields = Some(dropped);
        self
    }
}

/// Proof that a record is durable: its chain hash, its `seq` and the `ts` written in it.
#[derive(Debug, Clone)]
pub struct AppendReceipt {
    /// The record's `seq`: its 1-based position in the whole log, segments included.
    pub seq: u64,
    /// The record's `sha256`, which the next record will carry as `prev_sha256`.
    pub sha256: Sha256Digest,
    /// The record's `ts` exactly as written (ns since the UNIX epoch, see `docs/audit-format.md` on
    /// its precision).
    pub ts: u64,
}

/// The end of a chain: the last record's `seq` and `sha256` (`0` and all zeros for an empty log).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ChainHead {
    /// How many records the chain holds (the last one's `seq`).
    pub seq: u64,
    /// The last record's `sha256`.
    pub sha256: Sha256Digest,
}

impl<T: AuditSink + ?Sized> AuditSink for std::sync::Arc<T> {
    fn append(&self, entry: &AuditEntry) -> Result<AppendReceipt, AuditError> {
        (**self).append(entry)
    }

    fn head(&self) -> Result<ChainHead, AuditError> {
        (**self).head()
    }

    fn export(&self, out: &mut dyn std::io::Write) -> Result<u64, AuditError> {
        (**self).export(out)
    }

    fn export_checkpoints(&self, out: &mut dyn std::io::Write) -> Result<u64, AuditError> {
        (**self).export_checkpoints(out)
    }

    fn may_block(&self) -> bool {
        (**self).may_block()
    }

    fn checkpoint(&self) -> Result<Option<Checkpoint>, AuditError> {
        (**self).checkpoint()
    }
}

/// Storage-agnostic audit sink.
///
/// The file log is the embedded default and PostgreSQL the one replicas share; this trait says
/// nothing about files, paths or locks: only that a record is chained and durable when `append` returns,
/// what the chain's head is, and how to read the chain back as `audit.jsonl` lines (which
/// [`verify_reader`] and any independent verifier accept). `tests/sink_conformance.rs` runs the
/// same cases against every sink.
pub trait AuditSink: Send + Sync + std::fmt::Debug {
    /// Chains `entry` onto the log. Returns only after the record is durable.
    fn append(&self, entry: &AuditEntry) -> Result<AppendReceipt, AuditError>;

    /// The chain's head as stored now (records appended by other writers of the same log
    /// included).
    fn head(&self) -> Result<ChainHead, AuditError>;

    /// Writes every record, in chain order, as its canonical line followed by `\n`, to `out`
    /// (the bytes of an `audit.jsonl` holding the whole chain). Returns how many records.
    fn export(&self, out: &mut dyn std::io::Write) -> Result<u64, AuditError>;

    /// Writes the signed checkpoints the sink keeps beside the chain, oldest first, one canonical
    /// line each followed by `\n` (the checkpoint file format, docs/audit-format.md), to `out`;
    /// returns how many. A sink without checkpoints writes none (the default).
    fn export_checkpoints(&self, out: &mut dyn std::io::Write) -> Result<u64, AuditError> {
        let _ = out;
        Ok(0)
    }

    /// Whether `append` may block the calling thread on I/O (the file log fsyncs; a database
    /// sink waits for the server). An async caller then runs it off its executor's threads
    /// (toolgate-rmcp uses tokio's blocking pool, at the price of a thread hand-off per record);
    /// a sink that only touches memory says `false` and is called directly. The default is the
    /// safe answer, `true`.
    fn may_block(&self) -> bool {
        true
    }

    /// Seals what was appended with a signed checkpoint now, when the sink signs checkpoints and
    /// records were appended since its newest one; returns the checkpoint written. A server calls
    /// it at clean shutdown. A sink without checkpoints writes none (the default).
    fn checkpoint(&self) -> Result<Option<Checkpoint>, AuditError> {
        Ok(None)
    }
}
