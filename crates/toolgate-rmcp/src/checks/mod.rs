//! The gate as a sequence of checks: every governance feature is one module here that owns its
//! runtime state and its check, and [`Checks::sequence`] is the one place that orders them.
//!
//! A tools/call that names a tool the inner handler has is shown to each check in turn, and the
//! first check that does not pass decides the call (and is audited with its rule); a call that
//! passes them all runs under exactly-once (when the policy opts the tool in) with a
//! [`crate::Permit`], and its result goes back through every check's [`Check::present`].
//! tools/list asks every check's [`Check::lists`] and [`Check::describe`].
//!
//! The policy sections these checks read are parsed by toolgate-policy (one file format, loaded
//! and validated in one place); what a section *means* at run time is decided here.
//!
//! Adding a feature: a module with a type implementing [`Check`], a field of [`Checks`], and its
//! place in [`Checks::sequence`].
//!
//! The state that changes while the server runs is consulted again on every call, so that an
//! operator's decision takes effect on the very next call without a restart:
//!
//! - [`kill_switch`]: `<ledger_dir>/halt.json`. While it exists every call is refused. Read fresh
//!   on each call (one failed `open` when running), and fail-closed: an unreadable halt file halts.
//! - [`rights`]: the rights file mapping principals to the tools they may call. Re-read when it
//!   changes, so a revocation applies to the next call; an invalid file refuses every call.
//! - [`rates`]: token buckets (per principal, per tool), taken all-or-nothing per call.
//! - [`confirmation`]: pending two-step actions. A preview issues a one-time token; the confirming
//!   call must present it with the preview's exact summary. In memory, per process.
//! - [`paths`]: whether a path argument, with symbolic links followed, stays inside the allowed
//!   roots.
//!
//! File formats, caching rules and durability assumptions are in `docs/guard.md`.

use std::future::Future;
use std::pin::Pin;

use rmcp::ErrorData as McpError;
use rmcp::model::{CallToolResult, JsonObject, RequestMetaObject, Tool};
use toolgate_audit::{Decision as AuditDecision, Outcome};
use toolgate_canon::Sha256Digest;
use toolgate_policy::{Decision, Policy};

use crate::refusal::Refusal;
use crate::state::GateState;

pub(crate) mod arguments;
pub(crate) mod batch;
pub mod confirmation;
mod error;
pub(crate) mod exactly_once;
pub mod kill_switch;
pub mod paths;
pub mod rates;
pub mod rights;
pub(crate) mod untrusted;
pub(crate) mod visibility;

pub use confirmation::pending::{
    ConfirmError, ConfirmToken, Issued, PendingAction, PendingActions,
};
pub use error::GuardError;
pub use kill_switch::{Halt, KillSwitch, Status};
pub use paths::{PathError, resolve_within};
pub use rates::{Limit, Limited, RateLimiter};
pub use rights::{Rights, RightsFile};

/// One tools/call as the checks see it: a tool the inner handler has, called by a principal the
/// transport vouched for.
pub(crate) struct Call<'a> {
    /// The policy (and contract digests) in force for this whole call.
    pub(crate) state: &'a GateState,
    pub(crate) principal: &'a str,
    pub(crate) name: &'a str,
    /// The inner handler's definition of the tool.
    pub(crate) tool: &'a Tool,
    /// Its input schema's top-level shape.
    pub(crate) input: &'a arguments::InputShape,
    pub(crate) arguments: Option<&'a JsonObject>,
    /// The request's `_meta`.
    pub(crate) meta: &'a RequestMetaObject,
    /// What the policy decided for this principal, tool and arguments.
    pub(crate) decision: &'a Decision,
    /// The digest of the canonical arguments (absent = `{}`).
    pub(crate) args_digest: Sha256Digest,
    /// Set when the call comes back through `confirm_action`: the action the person confirmed.
    pub(crate) confirmed: Option<&'a PendingAction>,
}

impl Call<'_> {
    pub(crate) fn policy(&self) -> &Policy {
        &self.state.policy
    }
}

/// A future a check returns when it must wait (blocking work on the pool, a server hook).
pub(crate) type Pending<'a> = Pin<Box<dyn Future<Output = Verdict<'a>> + Send + 'a>>;

/// What one check says about a call.
pub(crate) enum Verdict<'a> {
    /// This check does not stop the call.
    Pass,
    /// Refused as if the tool did not exist (JSON-RPC -32602 `tool not found`, identical to an
    /// unknown tool); the audit reason names the real cause.
    Hide(String),
    /// Refused with a JSON-RPC error (the call is not a tool's business at all, e.g. halted).
    Fail {
        /// The audit reason.
        reason: String,
        error: McpError,
    },
    /// Refused with an `isError` result naming the rule and the fix; nothing executed.
    Refuse(Refusal),
    /// Answered without executing the tool (a confirmation preview).
    Answer(Answer),
    /// The check must wait for its verdict.
    Later(Pending<'a>),
}

/// A call a check answered itself, with the audit record it must leave.
pub(crate) struct Answer {
    pub(crate) decision: AuditDecision,
    pub(crate) outcome: Outcome,
    pub(crate) reason: String,
    pub(crate) result: CallToolResult,
    /// Whether the answer may only be given once its record is appended (a preview, which issues
    /// a token); otherwise a lost record is logged and the answer still given.
    pub(crate) needs_record: bool,
}

/// One governance feature's part in deciding calls and shaping what clients see.
pub(crate) trait Check: Send + Sync {
    /// Decides `call` before dispatch.
    fn admit<'a>(&'a self, call: &'a Call<'a>) -> Verdict<'a>;

    /// Whether tools/list shows `tool` to `principal` (a tool it would hide on call must not be
    /// listed). Default: shown.
    fn lists(&self, state: &GateState, principal: &str, tool: &str) -> bool {
        let _ = (state, principal, tool);
        true
    }

    /// Rewrites a listed tool's definition. Default: unchanged.
    fn describe(&self, state: &GateState, tool: &mut Tool) {
        let _ = (state, tool);
    }

    /// Rewrites the result of an executed call (or its replay) before it leaves the gate.
    /// Default: unchanged.
    fn present(&self, state: &GateState, name: &str, result: &mut CallToolResult) {
        let _ = (state, name, result);
    }
}

/// Every check of one gate, with its state.
pub(crate) struct Checks {
    pub(crate) visibility: visibility::Visibility,
    pub(crate) rights: rights::RightsCheck,
    pub(crate) kill_switch: kill_switch::KillSwitchCheck,
    pub(crate) arguments: arguments::Arguments,
    pub(crate) paths: paths::PathContainment,
    pub(crate) exactly_once: exactly_once::ExactlyOnce,
    pub(crate) batch: batch::BatchGuard,
    pub(crate) rates: rates::Rates,
    pub(crate) confirmation: confirmation::Confirmation,
    pub(crate) untrusted: untrusted::UntrustedOutput,
}

impl Checks {
    /// THE order of the checks. The first that does not pass decides a call:
    ///
    /// 1. policy allow / deny for this principal, then the rights file: hidden (-32602);
    /// 2. kill switch: a JSON-RPC error (tools the policy exempts keep working);
    /// 3. arguments (input shape, policy argument rules, JSON Schema), then path containment
    ///    through symbolic links, then the idempotency key's limits: an `isError` refusal;
    /// 4. batch guard (explicit ids, or a filter whose match count equals `expected_count`);
    /// 5. rate limits (per tool, per principal);
    /// 6. two-step confirmation: a preview, nothing executed.
    ///
    /// Exactly-once then runs the call once per key (its key check is in step 3 so a bad key is
    /// refused with the other arguments), and every check presents the result.
    pub(crate) fn sequence(&self) -> [&dyn Check; 10] {
        [
            &self.visibility,
            &self.rights,
            &self.kill_switch,
            &self.arguments,
            &self.paths,
            &self.exactly_once,
            &self.batch,
            &self.rates,
            &self.confirmation,
            &self.untrusted,
        ]
    }

    /// Runs the sequence on `call`: the verdict of the first check that does not pass.
    pub(crate) async fn admit<'a>(&'a self, call: &'a Call<'a>) -> Verdict<'a> {
        for check in self.sequence() {
            let mut verdict = check.admit(call);
            while let Verdict::Later(pending) = verdict {
                verdict = pending.await;
            }
            if !matches!(verdict, Verdict::Pass) {
                return verdict;
            }
        }
        Verdict::Pass
    }

    /// Whether every check lets tools/list show `tool` to `principal`.
    pub(crate) fn lists(&self, state: &GateState, principal: &str, tool: &str) -> bool {
        self.sequence()
            .iter()
            .all(|check| check.lists(state, principal, tool))
    }

    /// A listed tool's definition as every check rewrites it.
    pub(crate) fn describe(&self, state: &GateState, tool: &mut Tool) {
        for check in self.sequence() {
            check.describe(state, tool);
        }
    }

    /// An executed call's result as every check presents it.
    pub(crate) fn present(&self, state: &GateState, name: &str, result: &mut CallToolResult) {
        for check in self.sequence() {
            check.present(state, name, result);
        }
    }
}
