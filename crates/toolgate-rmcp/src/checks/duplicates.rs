//! The policy's `duplicates` section: a create tool's business key (e.g. guest and date) and its
//! sibling update tool. Before a create runs, the server's
//! [`Preflight::find_existing`](crate::Preflight::find_existing) is asked for an existing object
//! with the call's key; a hit is refused naming the existing id and the update tool, so a model
//! asked to "improve the text" changes the object instead of creating a second one. Nothing is
//! executed.
//!
//! Creating anyway takes two arguments the gate owns, [`SEPARATE_ARGUMENT`]` = true` and a
//! [`REASON_ARGUMENT`]: the gate lists them in the tool's input schema, takes them out of the
//! arguments before the handler sees them (unless the tool declares them itself), skips the
//! lookup, and writes the reason into the call's allow records (`separate_reason`). A server
//! without a lookup fails closed: only `separate: true` calls run. A retry of a call the effect
//! store already answered (an exactly-once tool) passes, so the client gets the replay of its own
//! creation rather than a duplicate refusal naming it.

use std::sync::Arc;

use rmcp::model::{JsonObject, Tool};
use serde_json::{Value, json};
use toolgate_audit::AuditEntry;
use toolgate_commit::EffectBackend;
use toolgate_policy::{DuplicateGuard, Policy};

use super::exactly_once::{EarlierAnswer, Lookup, unless_answered};
use super::{Call, Check, Verdict};
use crate::refusal::Refusal;
use crate::state::GateState;
use crate::world::Preflight;

/// The argument a caller sets to `true` to create an object although one with the same business
/// key exists (tools under the policy's `duplicates`).
pub const SEPARATE_ARGUMENT: &str = "separate";
/// The argument that says why, required with [`SEPARATE_ARGUMENT`]` = true`; recorded in the
/// call's audit records.
pub const REASON_ARGUMENT: &str = "reason";
/// The longest reason accepted, in characters.
pub const MAX_SEPARATE_REASON_CHARS: usize = 500;

/// The duplicate guard, with the server's lookup.
#[derive(Default)]
pub(crate) struct DuplicateCheck {
    pub(crate) preflight: Option<Arc<dyn Preflight>>,
    /// The exactly-once store, to let retries of answered calls through.
    pub(crate) effects: Option<Arc<dyn EffectBackend>>,
}

impl Check for DuplicateCheck {
    fn admit<'a>(&'a self, call: &'a Call<'a>) -> Verdict<'a> {
        let name = call.name;
        let Some(guard) = call.policy().duplicates(name) else {
            return Verdict::Pass;
        };
        match separate(call) {
            Err(refusal) => return Verdict::Refuse(refusal),
            // The caller states that this is a separate object: no lookup.
            Ok(Some(_)) => return Verdict::Pass,
            Ok(None) => {}
        }
        let mut key = JsonObject::new();
        for field in guard.key() {
            let Some(value) = call.arguments.and_then(|arguments| arguments.get(field)) else {
                let rule = format!("duplicates.{name}.key");
                let fix = format!("pass every argument of the key: {}", guard.key().join(", "));
                return Verdict::Refuse(Refusal::argument(
                    name,
                    field,
                    rule.clone(),
                    json!({"key": guard.key()}),
                    format!(
                        "Error: `{name}` checks for an existing object by {} and needs `{field}`, which the call did not pass (policy rule {rule}); nothing was executed. {fix}",
                        guard.key().join(", ")
                    ),
                    &fix,
                ));
            };
            key.insert(field.clone(), value.clone());
        }
        let Some(preflight) = self.preflight.clone() else {
            return Verdict::Refuse(unavailable(
                name,
                guard,
                "no preflight is configured to look them up",
            ));
        };
        let earlier = EarlierAnswer::of(self.effects.as_ref(), call);
        Verdict::Later(Box::pin(async move {
            let (tool, caller) = (name.to_owned(), call.caller.clone());
            let found = unless_answered(earlier, move || {
                preflight.find_existing(&caller, &tool, &key)
            })
            .await;
            match found {
                Lookup::Answered | Lookup::Found(Ok(None)) => Verdict::Pass,
                Lookup::Found(Ok(Some(existing))) => {
                    Verdict::Refuse(duplicate(name, guard, &existing))
                }
                Lookup::Found(Err(why)) => Verdict::Refuse(unavailable(name, guard, &why)),
                Lookup::Failed => Verdict::Refuse(unavailable(
                    name,
                    guard,
                    "the task that looks them up failed",
                )),
            }
        }))
    }

    fn owned_arguments(&self, policy: &Policy, tool: &str) -> &'static [&'static str] {
        if policy.duplicates(tool).is_some() {
            &[SEPARATE_ARGUMENT, REASON_ARGUMENT]
        } else {
            &[]
        }
    }

    fn describe(&self, state: &GateState, tool: &mut Tool) {
        let Some(guard) = state.policy.duplicates(&tool.name) else {
            return;
        };
        let mut schema = tool.input_schema.as_ref().clone();
        let properties = schema
            .entry("properties")
            .or_insert_with(|| Value::Object(JsonObject::new()));
        let Value::Object(properties) = properties else {
            // A schema whose `properties` is not an object is the server's bug; the argument
            // check refuses its calls anyway.
            return;
        };
        let key = guard.key().join(", ");
        let update = guard.update_tool();
        properties
            .entry(SEPARATE_ARGUMENT)
            .or_insert_with(|| json!({
                "type": "boolean",
                "description": format!("Set to true only to create a new object although one with the same {key} exists (otherwise change that one with {update}); requires `reason`."),
            }));
        properties
            .entry(REASON_ARGUMENT)
            .or_insert_with(|| json!({
                "type": "string",
                "minLength": 1,
                "maxLength": MAX_SEPARATE_REASON_CHARS,
                "description": "Why this is a separate object (with `separate: true`); recorded in the audit log.",
            }));
        tool.input_schema = Arc::new(schema);
    }

    fn annotate(&self, call: &Call<'_>, entry: &mut AuditEntry) {
        if call.policy().duplicates(call.name).is_some()
            && let Ok(Some(reason)) = separate(call)
        {
            entry.separate_reason = Some(reason.to_owned());
        }
    }
}

/// The caller's `separate` and `reason`: `Some(reason)` when the call creates a separate object
/// on purpose, `None` when the duplicate guard applies, or the refusal of a malformed pair.
fn separate<'a>(call: &Call<'a>) -> Result<Option<&'a str>, Refusal> {
    let name = call.name;
    let reason = call.owned_argument(REASON_ARGUMENT);
    let separate = match call.owned_argument(SEPARATE_ARGUMENT) {
        None | Some(Value::Bool(false)) => false,
        Some(Value::Bool(true)) => true,
        Some(_) => {
            return Err(reason_refusal(
                name,
                SEPARATE_ARGUMENT,
                "separate",
                "`separate` must be a boolean",
            ));
        }
    };
    if !separate {
        // A reason the gate owns but nothing reads would make the caller believe it mattered.
        let owned = call.owned.contains_key(REASON_ARGUMENT);
        if owned && reason.is_some() {
            return Err(reason_refusal(
                name,
                REASON_ARGUMENT,
                "reason",
                "`reason` is only read together with `separate: true`",
            ));
        }
        return Ok(None);
    }
    let problem = match reason {
        None => "`separate: true` needs a `reason`",
        Some(Value::String(text)) if text.trim().is_empty() => "`reason` is empty",
        Some(Value::String(text)) if text.chars().count() > MAX_SEPARATE_REASON_CHARS => {
            "`reason` is too long"
        }
        Some(Value::String(text)) if text.chars().any(char::is_control) => {
            "`reason` contains a control character"
        }
        Some(Value::String(text)) => return Ok(Some(text.as_str())),
        Some(_) => "`reason` must be a string",
    };
    Err(reason_refusal(name, REASON_ARGUMENT, "reason", problem))
}

/// The refusal of a malformed `separate` / `reason` pair; never quotes the reason.
fn reason_refusal(name: &str, field: &str, check: &str, problem: &str) -> Refusal {
    let rule = format!("duplicates.{name}.{check}");
    let fix = format!(
        "to create a separate object anyway pass `separate: true` with a `reason` of 1 to {MAX_SEPARATE_REASON_CHARS} characters without control characters; otherwise leave both out"
    );
    Refusal::argument(
        name,
        field,
        rule.clone(),
        json!({"separate": "boolean", "reason": {"min_len": 1, "max_len": MAX_SEPARATE_REASON_CHARS, "control_characters": false}}),
        format!("Error: {problem} (policy rule {rule}); nothing was executed. {fix}"),
        &fix,
    )
}

/// The refusal of a duplicate: the existing id and the tool that changes it.
fn duplicate(name: &str, guard: &DuplicateGuard, existing: &str) -> Refusal {
    let rule = format!("duplicates.{name}");
    let update = guard.update_tool();
    let key = guard.key().join(", ");
    let fix = format!(
        "change the existing object with `{update}` (id {existing}); only if this really is a separate object, call `{name}` again with `separate: true` and a `reason`"
    );
    Refusal {
        message: format!(
            "Error: an object with the same {key} already exists (id {existing}), so `{name}` would create a duplicate (policy rule {rule}); nothing was executed. {fix}"
        ),
        details: json!({
            "error": "duplicate",
            "tool": name,
            "rule": rule,
            "key": guard.key(),
            "existing_id": existing,
            "update_tool": update,
            "fix": fix,
        }),
        rule,
    }
}

/// The refusal of a call whose duplicates cannot be looked up (fail closed).
fn unavailable(name: &str, guard: &DuplicateGuard, why: &str) -> Refusal {
    let rule = format!("duplicates.{name}.unavailable");
    let key = guard.key().join(", ");
    let fix = format!(
        "retry later; to create the object anyway, pass `separate: true` with a `reason` (an existing one would then be duplicated: change it with `{}` instead)",
        guard.update_tool()
    );
    Refusal {
        message: format!(
            "Error: the server cannot look up existing objects with the same {key} ({why}), so `{name}` could create a duplicate (rule {rule}); nothing was executed. {fix}"
        ),
        details: json!({
            "error": "duplicate_check_unavailable",
            "tool": name,
            "rule": rule,
            "fix": fix,
        }),
        rule,
    }
}
