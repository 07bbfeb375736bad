//! The gate as a sequence of checks: every governance feature is one module here that owns its
//! runtime state and its check, and `Checks::new` is the one place that orders them.
//!
//! A tools/call that names a tool the inner handler has is shown to each check in turn, and the
//! first check that does not pass decides the call (and is audited with its rule); a call that
//! passes them all runs under exactly-once (when the policy opts the tool in) with a
//! [`crate::Permit`], and the handler's result (first run or replay) goes through every check's
//! `Check::present` before its allow record is written, so a presenter can annotate the record.
//! Results the gate produces itself (refusals, previews, exactly-once conflicts) are not
//! presented. tools/list asks every check's `Check::lists` and `Check::describe`.
//!
//! Arguments a check owns (`Check::owned_arguments`, e.g. the duplicate guard's `separate` and
//! `reason`) are taken out of the caller's arguments before the sequence runs, unless the tool's
//! own input schema declares them: the checks read them from `Call::owned`, while the argument
//! checks and the handler see the tool's arguments only. The audit digest, exactly-once
//! fingerprints and a pending confirmation cover the arguments as the caller sent them.
//!
//! The policy sections these checks read are parsed by toolgate-policy (one file format, loaded
//! and validated in one place); what a section *means* at run time is decided here.
//!
//! Adding a feature: a module with a type implementing `Check`, and its place in the one ordered
//! list of `Checks::new` (a unit test below adds a check that way).
//!
//! The state that changes while the server runs is consulted again on every call, so that an
//! operator's decision takes effect on the very next call without a restart:
//!
//! The stores of that state are `toolgate-state`'s traits (file, memory) and `toolgate-postgres`'s
//! (the database every replica shares); the checks here read them:
//!
//! - `kill_switch`: `<ledger_dir>/halt.json`. While it exists every call is refused. Read fresh
//!   on each call (one failed `open` when running), and fail-closed: an unreadable halt file halts.
//! - `rights`: the rights file mapping principals to the tools they may call. Re-read when it
//!   changes, so a revocation applies to the next call; an invalid file refuses every call. Or
//!   the same document in the database every replica shares.
//! - `rates`: token buckets (per principal, per tool), taken all-or-nothing per call. In
//!   memory, or in the database every replica shares (`GatedBuilder::rate_store`).
//! - `confirmation`: pending two-step actions. A preview issues a one-time token; the confirming
//!   call must present it with the preview's exact summary. In memory, per process, or in the
//!   database every replica shares.
//! - `paths`: whether a path argument (`toolgate_storage::paths::resolve_within`), with symbolic links followed, stays inside the allowed
//!   roots.
//! - `versions` and `duplicates`: the object as it is now, asked of the server's
//!   [`crate::Preflight`] on every call (its current version; an existing object with the same
//!   business key). Nothing is cached.
//!
//! File formats, caching rules and durability assumptions are in `docs/checks.md`.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

use rmcp::ErrorData as McpError;
use rmcp::model::{CallToolResult, JsonObject, RequestMetaObject, Tool};
use serde_json::Value;
use toolgate_audit::{AuditDecision, AuditEntry, Outcome, Reason};
use toolgate_canon::Sha256Digest;
use toolgate_policy::{Decision, Policy};

use crate::refusal::Refusal;
use crate::state::GateState;

pub(crate) mod arguments;
pub(crate) mod batch;
pub(crate) mod cedar;
pub(crate) mod confirmation;
pub(crate) mod duplicates;
pub(crate) mod exactly_once;
pub(crate) mod kill_switch;
pub(crate) mod paths;
pub(crate) mod rates;
pub(crate) mod results;
pub(crate) mod rights;
pub(crate) mod untrusted;
pub(crate) mod versions;
pub(crate) mod visibility;

pub use confirmation::confirmation_tool;
pub use duplicates::{MAX_SEPARATE_REASON_CHARS, REASON_ARGUMENT, SEPARATE_ARGUMENT};
pub use toolgate_state::{
    ConfirmError, ConfirmToken, EntitiesFile, EntitiesStore, EntityDocument, FileEntities,
    FileHalts, FileRights, GuardError, Halt, HaltStore, InvalidRights, Issued, KillSwitch, Limit,
    Limited, MemoryEntities, MemoryHalts, MemoryPending, MemoryRights, PendingAction,
    PendingActions, PendingStore, PrincipalEntity, RateLimiter, RateStore, Rights, RightsDocument,
    RightsFile, RightsStore, Status,
};
pub use toolgate_storage::paths::{PathError, resolve_within};

/// One tools/call as the checks see it: a tool the inner handler has, called by a principal the
/// transport vouched for.
pub(crate) struct Call<'a> {
    /// The policy (and contract digests) in force for this whole call.
    pub(crate) state: &'a GateState,
    pub(crate) principal: &'a str,
    /// Who calls: what every [`crate::Preflight`] question is asked for.
    pub(crate) caller: &'a crate::world::Caller,
    /// The caller's tenant, when its credential names one (the per-tenant kill switch).
    pub(crate) tenant: Option<&'a str>,
    pub(crate) name: &'a str,
    /// The inner handler's definition of the tool.
    pub(crate) tool: &'a Tool,
    /// Its input schema's top-level shape.
    pub(crate) input: &'a arguments::InputShape,
    /// The tool's arguments: the caller's, without the ones a check owns (what the handler gets).
    pub(crate) arguments: Option<&'a JsonObject>,
    /// The arguments checks own that the caller passed and the tool does not declare, taken out
    /// of [`Call::arguments`] (see [`Check::owned_arguments`]).
    pub(crate) owned: &'a JsonObject,
    /// The arguments exactly as the caller sent them (what `args_digest` covers).
    pub(crate) sent: Option<&'a JsonObject>,
    /// The request's `_meta`.
    pub(crate) meta: &'a RequestMetaObject,
    /// What the policy decided for this principal, tool and arguments.
    pub(crate) decision: &'a Decision,
    /// The Cedar policies that determined the call, once Cedar decided it (`checks::cedar`).
    #[cfg_attr(not(feature = "cedar"), allow(dead_code))]
    pub(crate) cedar_policies: std::sync::OnceLock<std::sync::Arc<[String]>>,
    /// What Cedar decides for this caller about this tool, looked up once (`checks::cedar`).
    #[cfg_attr(not(feature = "cedar"), allow(dead_code))]
    pub(crate) cedar_view: std::sync::OnceLock<cedar::CedarSeen<'a>>,
    /// The digest of the canonical arguments as sent (absent = `{}`).
    pub(crate) args_digest: Sha256Digest,
    /// Set when the call comes back through `confirm_action`: the action the person confirmed.
    pub(crate) confirmed: Option<&'a PendingAction>,
}

impl<'a> Call<'a> {
    pub(crate) fn policy(&self) -> &Policy {
        &self.state.policy
    }

    /// An argument a check owns: from [`Call::owned`], or from the tool's arguments when the
    /// tool declares it itself (its value then serves both).
    pub(crate) fn owned_argument(&self, name: &str) -> Option<&'a Value> {
        self.owned
            .get(name)
            .or_else(|| self.arguments.and_then(|arguments| arguments.get(name)))
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
    Hide(Reason),
    /// Refused with a JSON-RPC error (the call is not a tool's business at all, e.g. halted).
    Fail {
        /// The audit reason.
        reason: Reason,
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
    pub(crate) reason: Reason,
    pub(crate) result: CallToolResult,
    /// Whether the answer may only be given once its record is appended (a preview, which issues
    /// a token); otherwise a lost record is logged and the answer still given.
    pub(crate) needs_record: bool,
}

/// One governance feature's part in deciding calls and shaping what clients see.
pub(crate) trait Check: Send + Sync {
    /// Decides `call` before dispatch.
    fn admit<'a>(&'a self, call: &'a Call<'a>) -> Verdict<'a>;

    /// Whether tools/list shows `tool` to `caller` (a tool it would hide on call must not be
    /// listed). Default: shown.
    fn lists(&self, state: &GateState, caller: &crate::world::Caller, tool: &str) -> bool {
        let _ = (state, caller, tool);
        true
    }

    /// Rewrites a listed tool's definition. Default: unchanged.
    fn describe(&self, state: &GateState, tool: &mut Tool) {
        let _ = (state, tool);
    }

    /// The arguments of `tool` that belong to this check rather than to the tool: the gate takes
    /// them out of a call's arguments into [`Call::owned`] before the sequence runs (unless the
    /// tool's input schema declares them), so neither the input-shape check nor the handler sees
    /// them. A check that owns arguments lists them in [`Check::describe`]. Default: none.
    fn owned_arguments(&self, policy: &Policy, tool: &str) -> &'static [&'static str] {
        let _ = (policy, tool);
        &[]
    }

    /// Adds what this check wants recorded to the allow records of `call`, which every check
    /// passed. Default: nothing.
    fn annotate(&self, call: &Call<'_>, entry: &mut AuditEntry) {
        let _ = (call, entry);
    }

    /// Rewrites the result the handler returned for a call of `name` (a first execution, or its
    /// replay from the effect store) before it leaves the gate, and may annotate `entry`, the
    /// allow record that will be written for it. Default: unchanged.
    fn present(
        &self,
        state: &GateState,
        name: &str,
        result: &mut CallToolResult,
        entry: &mut AuditEntry,
    ) {
        let _ = (state, name, result, entry);
    }
}

/// What the checks are made of: the gate's configuration, handed to each check's constructor in
/// [`Checks::new`].
pub(crate) struct Parts {
    pub(crate) rights: Option<RightsFile>,
    /// Roles and attributes of principals for Cedar policies (`checks::cedar`).
    pub(crate) entities: Option<toolgate_state::EntitiesFile>,
    pub(crate) kill_switch: Option<KillSwitch>,
    pub(crate) server_name: Option<String>,
    pub(crate) effects: Option<Arc<dyn toolgate_commit::EffectBackend>>,
    pub(crate) probes: std::collections::BTreeMap<String, crate::world::EffectProbe>,
    pub(crate) preflight: Option<Arc<dyn crate::world::Preflight>>,
    pub(crate) rates: rates::Rates,
    pub(crate) pending: PendingActions,
}

/// Every check of one gate, in THE order, with its state.
pub(crate) struct Checks {
    /// The sequence: [`Checks::new`] builds it, and nothing else runs a check.
    list: Vec<Arc<dyn Check>>,
    /// The checks whose state the gate answers with itself (its own tools' arguments and
    /// tokens, the exactly-once store, the kill switch for a transport's early answer): the same
    /// objects as in `list`.
    pub(crate) kill_switch: Arc<kill_switch::KillSwitchCheck>,
    pub(crate) arguments: Arc<arguments::Arguments>,
    pub(crate) exactly_once: Arc<exactly_once::ExactlyOnce>,
    pub(crate) confirmation: Arc<confirmation::Confirmation>,
}

impl Checks {
    /// THE order of the checks. The first that does not pass decides a call:
    ///
    /// 1. policy allow / deny for this principal, then Cedar's listing (when the policy names
    ///    Cedar policies), then the rights file: hidden (-32602);
    /// 2. kill switch: a JSON-RPC error (tools the policy exempts keep working);
    /// 3. arguments (input shape, policy argument rules, JSON Schema), then path containment
    ///    through symbolic links, then Cedar's decision on the call with its typed arguments,
    ///    then the idempotency key's limits: an `isError` refusal;
    /// 4. batch guard (explicit ids, or a filter whose match count equals `expected_count`);
    /// 5. rate limits (per tool, per principal);
    /// 6. stale version: the version the call carries must be the object's current one (else a
    ///    `conflict` with the current state);
    /// 7. duplicate guard: no existing object with the call's business key, unless the caller
    ///    passes `separate: true` with a `reason`;
    /// 8. two-step confirmation: a preview, nothing executed. Versions and duplicates come first,
    ///    so nothing stale or duplicate is previewed, and a confirmed call (which runs the whole
    ///    sequence again) is checked against the object as it is at confirmation.
    ///
    /// Exactly-once then runs the call once per key (its key check is in step 3 so a bad key is
    /// refused with the other arguments), and every check presents the handler's result in this
    /// order: the result allow-list drops the fields the policy does not list, then untrusted
    /// output wraps third-party text (in what remains).
    ///
    /// Adding a check is a module with a type implementing [`Check`] and one entry in this list
    /// (and a field of [`Parts`] if it needs configuration): the gate runs, lists, describes and
    /// presents through the list alone.
    pub(crate) fn new(parts: Parts) -> Checks {
        let kill_switch = Arc::new(kill_switch::KillSwitchCheck {
            switch: parts.kill_switch,
            server_name: parts.server_name,
        });
        let exactly_once = Arc::new(exactly_once::ExactlyOnce {
            effects: parts.effects.clone(),
            probes: parts.probes,
        });
        let confirmation = Arc::new(confirmation::Confirmation {
            pending: parts.pending,
            preflight: parts.preflight.clone(),
        });
        let arguments = Arc::new(arguments::Arguments::default());
        let list: Vec<Arc<dyn Check>> = vec![
            Arc::new(visibility::Visibility),
            Arc::new(cedar::CedarListing {
                entities: parts.entities.clone(),
            }),
            Arc::new(rights::RightsCheck { file: parts.rights }),
            kill_switch.clone(),
            arguments.clone(),
            Arc::new(paths::PathContainment),
            Arc::new(cedar::CedarCall {
                entities: parts.entities,
            }),
            exactly_once.clone(),
            Arc::new(batch::BatchGuard {
                preflight: parts.preflight.clone(),
            }),
            Arc::new(parts.rates),
            Arc::new(versions::VersionCheck {
                preflight: parts.preflight.clone(),
                effects: parts.effects.clone(),
            }),
            Arc::new(duplicates::DuplicateCheck {
                preflight: parts.preflight,
                effects: parts.effects,
            }),
            confirmation.clone(),
            Arc::new(results::ResultFilter),
            Arc::new(untrusted::UntrustedOutput),
        ];
        Checks {
            list,
            kill_switch,
            arguments,
            exactly_once,
            confirmation,
        }
    }

    /// The sequence, in order.
    fn sequence(&self) -> impl Iterator<Item = &dyn Check> {
        self.list.iter().map(|check| check.as_ref())
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

    /// Whether every check lets tools/list show `tool` to `caller`.
    pub(crate) fn lists(
        &self,
        state: &GateState,
        caller: &crate::world::Caller,
        tool: &str,
    ) -> bool {
        self.sequence()
            .all(|check| check.lists(state, caller, tool))
    }

    /// A listed tool's definition as every check rewrites it.
    pub(crate) fn describe(&self, state: &GateState, tool: &mut Tool) {
        for check in self.sequence() {
            check.describe(state, tool);
        }
    }

    /// The arguments of `tool` that some check owns.
    pub(crate) fn owned_arguments(&self, policy: &Policy, tool: &str) -> Vec<&'static str> {
        let mut owned: Vec<&'static str> = self
            .sequence()
            .flat_map(|check| check.owned_arguments(policy, tool).iter().copied())
            .collect();
        owned.sort_unstable();
        owned.dedup();
        owned
    }

    /// The allow record of an admitted call as every check annotates it.
    pub(crate) fn annotate(&self, call: &Call<'_>, entry: &mut AuditEntry) {
        for check in self.sequence() {
            check.annotate(call, entry);
        }
    }

    /// The handler's result (first run or replay) as every check presents it, with its allow
    /// record annotated.
    pub(crate) fn present(
        &self,
        state: &GateState,
        name: &str,
        result: &mut CallToolResult,
        entry: &mut AuditEntry,
    ) {
        for check in self.sequence() {
            check.present(state, name, result, entry);
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use rmcp::model::{CallToolResult, ContentBlock, JsonObject, RequestMetaObject, Tool};
    use toolgate_audit::{AuditDecision, AuditEntry, Outcome, Reason};
    use toolgate_policy::Policy;

    use super::*;

    /// A check defined here, as a new governance feature would be: refuses calls of `deploy`,
    /// hides `deploy` from lists, marks every result it presents.
    struct NoDeploys;

    impl Check for NoDeploys {
        fn admit<'a>(&'a self, call: &'a Call<'a>) -> Verdict<'a> {
            if call.name == "deploy" {
                Verdict::Fail {
                    reason: Reason::Rule("test.no_deploys".to_owned()),
                    error: McpError::invalid_request("no deploys today", None),
                }
            } else {
                Verdict::Pass
            }
        }

        fn lists(&self, _: &GateState, _: &crate::world::Caller, tool: &str) -> bool {
            tool != "deploy"
        }

        fn present(&self, _: &GateState, _: &str, result: &mut CallToolResult, _: &mut AuditEntry) {
            result.content.push(ContentBlock::text("seen by NoDeploys"));
        }
    }

    fn parts() -> Parts {
        Parts {
            rights: None,
            entities: None,
            kill_switch: None,
            server_name: None,
            effects: None,
            probes: Default::default(),
            preflight: None,
            rates: rates::Rates::default(),
            pending: PendingActions::new(std::time::Duration::from_secs(60)),
        }
    }

    /// The verdict of `checks` on a call of `tool` (no arguments) by `alice` under `policy`.
    async fn admit(checks: &Checks, policy: &Policy, tool: &str) -> String {
        let state = GateState {
            policy: Arc::new(policy.clone()),
            contract_digest: None,
            tool_contract_digests: Default::default(),
            tools: None,
            cedar: None,
        };
        let definition = Tool::new(tool.to_owned(), String::new(), Arc::new(JsonObject::new()));
        let input = arguments::InputShape::of_schema(&definition.input_schema);
        let caller = crate::world::Caller {
            principal: Arc::from("alice"),
            credential: None,
            client: None,
        };
        let decision = policy.decide_for("alice", tool, None);
        let meta = RequestMetaObject::default();
        let owned = JsonObject::new();
        let call = Call {
            state: &state,
            principal: "alice",
            caller: &caller,
            tenant: None,
            name: tool,
            tool: &definition,
            input: &input,
            arguments: None,
            owned: &owned,
            sent: None,
            meta: &meta,
            decision: &decision,
            cedar_policies: Default::default(),
            cedar_view: Default::default(),
            args_digest: Sha256Digest::of_json_object(&JsonObject::new()),
            confirmed: None,
        };
        match checks.admit(&call).await {
            Verdict::Pass => "pass".to_owned(),
            Verdict::Hide(reason) => format!("hide {reason}"),
            Verdict::Fail { reason, .. } => format!("fail {reason}"),
            Verdict::Refuse(refusal) => format!("refuse {}", refusal.rule),
            Verdict::Answer(answer) => format!("answer {}", answer.reason),
            Verdict::Later(_) => unreachable!("admit resolves pending verdicts"),
        }
    }

    #[tokio::test]
    async fn a_check_added_to_the_one_list_decides_lists_and_presents_in_its_place() {
        let policy =
            Policy::from_json(r#"{"version":1,"allow":["deploy","status"],"deny":["drop"]}"#)
                .unwrap();
        let state = GateState {
            policy: Arc::new(policy.clone()),
            contract_digest: None,
            tool_contract_digests: Default::default(),
            tools: None,
            cedar: None,
        };
        let without = Checks::new(parts());
        assert_eq!(admit(&without, &policy, "deploy").await, "pass");

        // The one step of adding it: an entry in the ordered list, here right after visibility.
        let mut with = Checks::new(parts());
        with.list.insert(1, Arc::new(NoDeploys));

        assert_eq!(
            admit(&with, &policy, "deploy").await,
            "fail test.no_deploys"
        );
        assert_eq!(admit(&with, &policy, "status").await, "pass");
        // Checks earlier in the list decide first: a denied tool is hidden by visibility.
        assert!(admit(&with, &policy, "drop").await.starts_with("hide "));
        // tools/list asks it too; the gate's lists are the checks' lists.
        let alice = crate::world::Caller {
            principal: Arc::from("alice"),
            credential: None,
            client: None,
        };
        assert!(without.lists(&state, &alice, "deploy"));
        assert!(!with.lists(&state, &alice, "deploy"));
        assert!(with.lists(&state, &alice, "status"));
        // And it presents results in its place in the order.
        let mut result = CallToolResult::success(vec![ContentBlock::text("ok")]);
        let mut entry = AuditEntry::tool_call(
            "r",
            "status",
            AuditDecision::Allow,
            Outcome::Committed,
            Sha256Digest::of(b""),
        );
        with.present(&state, "status", &mut result, &mut entry);
        assert_eq!(result.content.len(), 2, "{result:?}");
    }
}
