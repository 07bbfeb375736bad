//! The policy's `versions` section: a call of a tool that changes an object carries the version of
//! the object the caller read (a content hash), and the server's
//! [`Preflight::current_version`](crate::Preflight::current_version) says what the version is now.
//! A stale version is refused as a `conflict` carrying the current version and state, so an agent
//! working from an old read cannot overwrite someone else's change; nothing is executed.
//!
//! The object not existing (`Ok(None)`) passes: the handler answers not-found as it always does.
//! A server that cannot read versions (no preflight, the default method, an error) fails closed:
//! the call is refused. A retry of a call the effect store already answered (an exactly-once tool)
//! passes, so the client gets the replay of its own change rather than a conflict with it.

use std::sync::Arc;

use serde_json::{Value, json};
use toolgate_audit::{AuditDecision, Outcome};
use toolgate_commit::EffectBackend;

use super::exactly_once::{EarlierAnswer, Lookup, unless_answered};
use super::{Answer, Call, Check, Verdict};
use crate::refusal::Refusal;
use crate::world::{Current, Preflight};

/// The version check, with the server's reader of current versions.
#[derive(Default)]
pub(crate) struct VersionCheck {
    pub(crate) preflight: Option<Arc<dyn Preflight>>,
    /// The exactly-once store, to let retries of answered calls through.
    pub(crate) effects: Option<Arc<dyn EffectBackend>>,
}

impl Check for VersionCheck {
    fn admit<'a>(&'a self, call: &'a Call<'a>) -> Verdict<'a> {
        let name = call.name;
        let Some(versioned) = call.policy().versions(name) else {
            return Verdict::Pass;
        };
        let field = versioned.argument();
        let rule = format!("versions.{name}");
        let given = match call.arguments.and_then(|arguments| arguments.get(field)) {
            Some(Value::String(version)) => version.clone(),
            other => {
                let problem = if other.is_some() {
                    "is not a string"
                } else {
                    "is missing"
                };
                let fix = format!(
                    "read the object first and pass its current version as the string argument `{field}`"
                );
                let argument_rule = format!("{rule}.argument");
                return Verdict::Refuse(Refusal::argument(
                    name,
                    field,
                    argument_rule.clone(),
                    json!({"type": "string", "required": true}),
                    format!(
                        "Error: `{name}` changes an object and needs the version you read in `{field}`, which {problem} (policy rule {argument_rule}); nothing was executed. {fix}"
                    ),
                    &fix,
                ));
            }
        };
        let Some(preflight) = self.preflight.clone() else {
            return Verdict::Refuse(unavailable(
                name,
                &rule,
                "no preflight is configured to read it",
            ));
        };
        let earlier = EarlierAnswer::of(self.effects.as_ref(), call);
        let arguments = call.arguments.cloned().unwrap_or_default();
        Verdict::Later(Box::pin(async move {
            let (tool, caller) = (name.to_owned(), call.caller.clone());
            let found = unless_answered(earlier, move || {
                preflight.current_version(&caller, &tool, &arguments)
            })
            .await;
            match found {
                Lookup::Answered | Lookup::Found(Ok(None)) => Verdict::Pass,
                Lookup::Found(Ok(Some(current))) if current.version == given => Verdict::Pass,
                Lookup::Found(Ok(Some(current))) => conflict(call, field, &rule, current),
                Lookup::Found(Err(why)) => Verdict::Refuse(unavailable(name, &rule, &why)),
                Lookup::Failed => {
                    Verdict::Refuse(unavailable(name, &rule, "the task that reads it failed"))
                }
            }
        }))
    }
}

/// The `conflict` answer: the current version and state, nothing executed.
fn conflict<'a>(call: &Call<'_>, field: &str, rule: &str, current: Current) -> Verdict<'a> {
    let name = call.name;
    let fix = format!(
        "re-read the object (its current state is in `current`), decide again from it, and retry with `{field}` set to current_version"
    );
    let refusal = Refusal {
        rule: rule.to_owned(),
        message: format!(
            "Error: the object this call of `{name}` would change was modified since it was read: `{field}` is not its current version (policy rule {rule}); nothing was executed. {fix}"
        ),
        details: json!({
            "error": "conflict",
            "tool": name,
            "rule": rule,
            "field": field,
            "current_version": current.version,
            "current": current.state,
            "fix": fix,
        }),
    };
    // A tool's output schema does not describe this answer; the confirmation tool has none.
    Verdict::Answer(Answer {
        decision: AuditDecision::Deny,
        outcome: Outcome::Conflict,
        reason: toolgate_audit::Reason::Rule(rule.to_owned()),
        result: refusal.into_result(""),
        needs_record: false,
    })
}

/// The refusal of a call whose object's current version cannot be read (fail closed).
fn unavailable(name: &str, rule: &str, why: &str) -> Refusal {
    let rule = format!("{rule}.unavailable");
    let fix = "retry later; if it persists, the server's operator must fix how it reads versions";
    Refusal {
        message: format!(
            "Error: the server cannot read the current version of the object this call of `{name}` would change ({why}), so it cannot tell whether the call is stale (rule {rule}); nothing was executed. {fix}"
        ),
        details: json!({
            "error": "version_unavailable",
            "tool": name,
            "rule": rule,
            "fix": fix,
        }),
        rule,
    }
}
