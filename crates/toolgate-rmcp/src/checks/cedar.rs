//! Cedar authorization (feature `cedar`): the Cedar policies a JSON policy names (its key
//! `cedar`) decide lists and calls too, after the JSON policy allowed them. A call runs only when
//! both allow it; `forbid` wins; a policy without `cedar` has no Cedar step (docs/policy.md,
//! "Cedar").
//!
//! Two checks, in two places of the order: [`CedarListing`] next to the JSON policy's visibility
//! (a tool Cedar does not list to the caller is hidden, and a call of it gets the same -32602 as
//! an unknown tool), and [`CedarCall`] after the arguments were checked against the tool's input
//! schema (so Cedar sees typed arguments; a call it does not permit is an `isError` refusal of
//! the usual shape). Every record of a call that Cedar decided names the determining policies
//! (`cedar_policies`); every call record under a policy with Cedar carries the set's digest
//! (`cedar_digest`).

use std::sync::Arc;

use toolgate_audit::AuditEntry;
use toolgate_policy::Policy;

use super::{Call, Check, Verdict};
use crate::state::GateState;
use crate::world::Caller;

/// A validated Cedar policy set (nothing can be, in a build without the feature `cedar`).
#[cfg(feature = "cedar")]
pub(crate) type CedarSet = toolgate_policy::cedar::CedarPolicies;
/// A validated Cedar policy set (nothing can be, in a build without the feature `cedar`).
#[cfg(not(feature = "cedar"))]
pub(crate) type CedarSet = std::convert::Infallible;

type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// What Cedar decides for a call's caller about its tool ([`CedarListing`] looks it up,
/// [`CedarCall`] uses it again): the view, or the denial when there is none.
#[cfg(feature = "cedar")]
pub(crate) type CedarSeen<'a> =
    Result<toolgate_policy::cedar::CedarView<'a>, toolgate_policy::cedar::CedarAnswer>;
/// What Cedar decides for a call's caller about its tool (nothing, in a build without the
/// feature `cedar`).
#[cfg(not(feature = "cedar"))]
pub(crate) type CedarSeen<'a> = std::marker::PhantomData<&'a ()>;

/// The Cedar policies `policy` names, validated against `tools` (the live contract's); `None`
/// when it names none. Refused when the gate has no contract to validate them against, or was
/// built without Cedar: a policy whose Cedar step cannot run must not be served as if it had none.
pub(crate) fn compile(
    policy: &Policy,
    tools: Option<&[toolgate_policy::ToolSignature]>,
) -> Result<Option<Arc<CedarSet>>, BoxError> {
    let Some(source) = policy.cedar() else {
        return Ok(None);
    };
    #[cfg(not(feature = "cedar"))]
    {
        let _ = tools;
        Err(format!(
            "the policy names Cedar policies ({}) but this gate was built without Cedar; enable the feature `cedar` of toolgate (or toolgate-rmcp)",
            source.path().display()
        )
        .into())
    }
    #[cfg(feature = "cedar")]
    {
        let Some(tools) = tools else {
            return Err(format!(
                "the policy's Cedar policies ({}) are validated against the tools' contracts, and this gate was given none; give it the server's live contract (GatedBuilder::contract, or the facade's locked_contract)",
                source.path().display()
            )
            .into());
        };
        let tools: Vec<toolgate_policy::ToolSignature> =
            tools.iter().map(|tool| policy.signature(tool)).collect();
        Ok(Some(Arc::new(CedarSet::from_source(source, &tools)?)))
    }
}

/// Adds to `entry` what Cedar contributed to the call: the set's digest whenever the policy has
/// Cedar, and the determining policies once Cedar decided the call.
pub(crate) fn note(state: &GateState, call: &Call<'_>, entry: &mut AuditEntry) {
    #[cfg(feature = "cedar")]
    if let Some(cedar) = &state.cedar {
        entry.set_cedar(call.cedar_policies.get().cloned(), cedar.digest());
    }
    let _ = (state, call, entry);
}

/// Hides what Cedar does not list to the caller.
#[derive(Debug, Default)]
pub(crate) struct CedarListing {
    /// Roles and attributes of principals, beside their credentials'.
    #[cfg_attr(not(feature = "cedar"), allow(dead_code))]
    pub(crate) entities: Option<toolgate_state::EntitiesFile>,
}

impl Check for CedarListing {
    fn admit<'a>(&'a self, call: &'a Call<'a>) -> Verdict<'a> {
        #[cfg(feature = "cedar")]
        if let Some(cedar) = &call.state.cedar {
            let answer = match view(call, cedar, self.entities.as_ref()) {
                Ok(view) => view.listing(),
                Err(denied) => denied.clone(),
            };
            if !answer.allowed {
                log_errors(call.name, &answer.errors);
                let _ = call.cedar_policies.set(answer.determining);
                return Verdict::Hide(toolgate_audit::Reason::Rule("cedar.list".to_owned()));
            }
        }
        let _ = call;
        Verdict::Pass
    }

    fn lists(&self, state: &GateState, caller: &Caller, tool: &str) -> bool {
        #[cfg(feature = "cedar")]
        if let Some(cedar) = &state.cedar {
            return with_caller(caller, self.entities.as_ref(), |principal| {
                cedar.view(principal, tool)
            })
            .is_ok_and(|view| view.listing().allowed);
        }
        let _ = (state, caller, tool);
        true
    }
}

/// Refuses a call Cedar does not permit with these arguments, now.
#[derive(Debug, Default)]
pub(crate) struct CedarCall {
    /// Roles and attributes of principals, beside their credentials'.
    #[cfg_attr(not(feature = "cedar"), allow(dead_code))]
    pub(crate) entities: Option<toolgate_state::EntitiesFile>,
}

impl Check for CedarCall {
    fn admit<'a>(&'a self, call: &'a Call<'a>) -> Verdict<'a> {
        #[cfg(feature = "cedar")]
        if let Some(cedar) = &call.state.cedar {
            let now = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |since| {
                    i64::try_from(since.as_secs()).unwrap_or(i64::MAX)
                });
            let client = call.caller.client.as_ref().map(|(name, _)| name.as_str());
            let answer = match view(call, cedar, self.entities.as_ref()) {
                Ok(view) => view.call(call.arguments, now, client),
                Err(denied) => denied.clone(),
            };
            let refused = (!answer.allowed).then(|| {
                log_errors(call.name, &answer.errors);
                refusal(call.name, &answer)
            });
            let _ = call.cedar_policies.set(answer.determining);
            if let Some(refusal) = refused {
                return Verdict::Refuse(refusal);
            }
        }
        let _ = call;
        Verdict::Pass
    }

    fn annotate(&self, call: &Call<'_>, entry: &mut AuditEntry) {
        note(call.state, call, entry);
    }
}

/// What Cedar decides for `call`'s caller about its tool, looked up on first use.
#[cfg(feature = "cedar")]
fn view<'a>(
    call: &'a Call<'a>,
    cedar: &'a CedarSet,
    entities: Option<&toolgate_state::EntitiesFile>,
) -> &'a CedarSeen<'a> {
    call.cedar_view.get_or_init(|| {
        with_caller(call.caller, entities, |principal| {
            cedar.view(principal, call.name)
        })
    })
}

/// Runs `decide` with the caller as Cedar's principal: its identity key, and what its credential
/// says (none for a configured stdio principal: channel `stdio`, no scopes or tenant), with the
/// roles and attributes the entities store gives it (roles joined; a credential's attribute wins
/// over the store's). Entities that cannot be read (a broken file, a database that cannot be
/// reached or holds no valid document) deny: `decide` is not run.
#[cfg(feature = "cedar")]
fn with_caller<R>(
    caller: &Caller,
    entities: Option<&toolgate_state::EntitiesFile>,
    decide: impl FnOnce(
        &toolgate_policy::cedar::CedarCaller<'_>,
    ) -> Result<R, toolgate_policy::cedar::CedarAnswer>,
) -> Result<R, toolgate_policy::cedar::CedarAnswer> {
    let document = match entities.map(toolgate_state::EntitiesFile::load).transpose() {
        Ok(document) => document,
        Err(error) => {
            tracing::error!(%error, "the Cedar entities are unusable; refusing what Cedar decides");
            return Err(toolgate_policy::cedar::CedarAnswer {
                allowed: false,
                determining: std::sync::Arc::default(),
                errors: vec![error.to_string()],
            });
        }
    };
    let extra = document
        .as_deref()
        .and_then(|document| document.of(&caller.principal))
        .map(|entity| (&entity.roles, &entity.attributes));
    toolgate_policy::cedar::as_caller(&caller.principal, caller.credential.as_ref(), extra, decide)
}

/// Evaluation errors deny (a `forbid` that could not be evaluated must not let a call through);
/// they go to the log, not to the caller (their text can quote argument values).
#[cfg(feature = "cedar")]
fn log_errors(tool: &str, errors: &[String]) {
    for error in errors {
        tracing::warn!(%tool, %error, "a Cedar policy could not be evaluated; the request is denied");
    }
}

/// The refusal of a call Cedar does not permit: the usual `isError` shape, naming the
/// determining `forbid`s (or that no `permit` matched), never the arguments' values.
#[cfg(feature = "cedar")]
fn refusal(tool: &str, answer: &toolgate_policy::cedar::CedarAnswer) -> crate::refusal::Refusal {
    let why = answer.why_not();
    let fix = "call it with arguments the policies permit, or ask an operator for the permission";
    crate::refusal::Refusal {
        rule: "cedar".to_owned(),
        message: format!(
            "Error: the call of `{tool}` is not permitted: {why}; nothing was executed. Fix: {fix}."
        ),
        details: serde_json::json!({
            "error": "not_permitted",
            "tool": tool,
            "rule": "cedar",
            "policies": &*answer.determining,
            "fix": fix,
        }),
    }
}
