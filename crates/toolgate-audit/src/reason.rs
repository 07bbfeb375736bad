//! The `reason` of a record: why it has its decision. The strings are part of the audit format
//! (verifiers, `audit stats` and people's queries read them), so each variant writes exactly one
//! fixed shape; a new reason is a new variant, never a new free string.

use std::borrow::Cow;
use std::fmt;

/// Why a record has its decision, written as the record's `reason` ([`Reason::as_str`]).
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum Reason {
    /// A rule by its id, as the policy or the gate names it: `tools.deny`,
    /// `arg_rules.TOOL.FIELD.CHECK`, `principals.P.…`, `rate_limits.tools.TOOL`,
    /// `idempotency.TOOL.key.CHECK`, `duplicates.TOOL…`, `versions.TOOL`,
    /// `batch.TOOL.expected_count`, `input_schema.invalid`, `handler.invalid_arguments`, … (the
    /// id is written as it is).
    Rule(String),
    /// `no_principal`: no principal was vouched for.
    NoPrincipal,
    /// `unknown_tool`: the server has no such tool.
    UnknownTool,
    /// `unavailable: WHY`: the server reports the tool unavailable now.
    Unavailable(String),
    /// `insufficient_scope`: outside the credential's scopes.
    InsufficientScope,
    /// `kill_switch`: calls are halted.
    KillSwitch,
    /// `rights`: the rights do not grant the tool to the principal.
    Rights,
    /// `rights_unavailable`: the rights cannot be read (every call is refused).
    RightsUnavailable,
    /// `rate_limits.unavailable`: the rate buckets cannot be reached.
    RateLimitsUnavailable,
    /// `confirmation_required`: a preview was answered instead of executing the call.
    ConfirmationRequired,
    /// `changed_since_preview`: a confirmed call's object changed since its preview; a new preview
    /// was answered.
    ChangedSincePreview,
    /// `confirmed`: the allow record of a call confirmed through `confirm_action`.
    Confirmed,
    /// `confirm.REASON`: a confirmed call that `REASON` now refuses.
    NoLongerAllowed(Box<Reason>),
    /// `confirm.CODE`: a confirmation step refused or ended with this code (a `ConfirmError`
    /// code, `rejected`, `prepare_failed`).
    Confirm(&'static str),
    /// `handler_panicked`: the tool's handler panicked.
    HandlerPanicked,
    /// `cancelled`: the caller cancelled the call.
    Cancelled,
    /// `torn_tail`: the log's recovery record of a torn tail left by a crash.
    TornTail,
    /// `CODE`: a request a transport refused before it reached the gate (`origin_forbidden`,
    /// `invalid_token`, …; the front door's refusal codes).
    Refused(&'static str),
    /// Text of a record no rule decided (an operator's `rights set: sha256:…`, a proxy's drift,
    /// a count of refusals not recorded one by one).
    Note(String),
}

impl Reason {
    /// The record's `reason` string.
    pub fn as_str(&self) -> Cow<'_, str> {
        Cow::Borrowed(match self {
            Reason::Rule(id) => id,
            Reason::Note(text) => text,
            Reason::Refused(code) => code,
            Reason::NoPrincipal => "no_principal",
            Reason::UnknownTool => "unknown_tool",
            Reason::InsufficientScope => "insufficient_scope",
            Reason::KillSwitch => "kill_switch",
            Reason::Rights => "rights",
            Reason::RightsUnavailable => "rights_unavailable",
            Reason::RateLimitsUnavailable => "rate_limits.unavailable",
            Reason::ConfirmationRequired => "confirmation_required",
            Reason::ChangedSincePreview => "changed_since_preview",
            Reason::Confirmed => "confirmed",
            Reason::HandlerPanicked => "handler_panicked",
            Reason::Cancelled => "cancelled",
            Reason::TornTail => "torn_tail",
            Reason::Unavailable(why) => return Cow::Owned(format!("unavailable: {why}")),
            Reason::NoLongerAllowed(reason) => {
                return Cow::Owned(format!("confirm.{}", reason.as_str()));
            }
            Reason::Confirm(code) => return Cow::Owned(format!("confirm.{code}")),
        })
    }
}

impl fmt::Display for Reason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.as_str())
    }
}

impl From<Reason> for String {
    fn from(reason: Reason) -> String {
        match reason {
            Reason::Rule(text) | Reason::Note(text) => text,
            other => other.as_str().into_owned(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The strings are the audit format's: these are the ones logs written before the enum hold.
    #[test]
    fn every_reason_writes_its_fixed_string() {
        let cases = [
            (
                Reason::Rule("arg_rules.t.f.max".to_owned()),
                "arg_rules.t.f.max",
            ),
            (Reason::NoPrincipal, "no_principal"),
            (Reason::UnknownTool, "unknown_tool"),
            (
                Reason::Unavailable("maintenance".to_owned()),
                "unavailable: maintenance",
            ),
            (Reason::InsufficientScope, "insufficient_scope"),
            (Reason::KillSwitch, "kill_switch"),
            (Reason::Rights, "rights"),
            (Reason::RightsUnavailable, "rights_unavailable"),
            (Reason::RateLimitsUnavailable, "rate_limits.unavailable"),
            (Reason::ConfirmationRequired, "confirmation_required"),
            (Reason::ChangedSincePreview, "changed_since_preview"),
            (Reason::Confirmed, "confirmed"),
            (
                Reason::NoLongerAllowed(Box::new(Reason::Rights)),
                "confirm.rights",
            ),
            (Reason::Confirm("token_used"), "confirm.token_used"),
            (Reason::HandlerPanicked, "handler_panicked"),
            (Reason::Cancelled, "cancelled"),
            (Reason::TornTail, "torn_tail"),
            (Reason::Refused("origin_forbidden"), "origin_forbidden"),
            (Reason::Note("rights cleared".to_owned()), "rights cleared"),
        ];
        for (reason, text) in cases {
            assert_eq!(reason.to_string(), text);
            assert_eq!(String::from(reason), text);
        }
    }
}
