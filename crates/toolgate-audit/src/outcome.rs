//! The outcome vocabulary: what happened to a call (or an operator action), one enum shared by the
//! gate that records it, `audit stats` that counts it, and `docs/audit-format.md` that lists it.

use std::fmt;

/// What happened, written as the record's `outcome` string.
///
/// Records read back from a log may carry strings outside this list (written by an older or another
/// writer); readers treat the field as text and use [`Outcome::parse`] to recognise it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Outcome {
    /// An allowed call ran and its effect (if any) is durable: the first execution under its key.
    Committed,
    /// An exactly-once call answered from the stored result of an earlier execution.
    Replay,
    /// A call that only read state (recorded by handlers that say so through their permit).
    Observed,
    /// A denied call: nothing ran.
    NotExecuted,
    /// The handler ran and refused the request itself (for example a decoy tool).
    Refused,
    /// The handler ran and answered `isError`.
    Failed,
    /// The handler or the gate failed with a protocol error.
    Error,
    /// Nothing ran because the call conflicts with the state: its idempotency key was used before
    /// with other arguments, or the version it carries is not the object's current one.
    Conflict,
    /// Another call holds the idempotency key; nothing ran.
    InProgress,
    /// An earlier call with this key stopped mid-effect; nothing ran until it is resolved.
    Indeterminate,
    /// The call ended while a storage step was still running: its effect is in doubt (written by
    /// versions whose handlers stored through their permit; kept so old logs are counted).
    InDoubt,
    /// The call was dropped (the client cancelled) or its handler panicked.
    Cancelled,
    /// The handler could not deserialize the arguments; nothing ran.
    InvalidArguments,
    /// The handler asked the client for input; the permit ended with the call.
    InputRequired,
    /// The handler handed the call to a task.
    TaskCreated,
    /// A two-step confirmation preview was sent; nothing ran.
    Preview,
    /// A pending confirmation was rejected, or a policy reload was refused; nothing changed.
    Rejected,
    /// The audit log repaired a torn tail left by a crash.
    Recovered,
    /// An operator set the kill switch.
    Halted,
    /// An operator lifted the kill switch.
    Resumed,
    /// An operator asked to resume while nothing was halted.
    NotHalted,
    /// An operator pruned expired exactly-once records.
    Pruned,
    /// A new policy was installed in a running server.
    Reloaded,
}

impl Outcome {
    /// Every outcome, in declaration order (for docs and tests).
    pub const ALL: [Outcome; 23] = [
        Outcome::Committed,
        Outcome::Replay,
        Outcome::Observed,
        Outcome::NotExecuted,
        Outcome::Refused,
        Outcome::Failed,
        Outcome::Error,
        Outcome::Conflict,
        Outcome::InProgress,
        Outcome::Indeterminate,
        Outcome::InDoubt,
        Outcome::Cancelled,
        Outcome::InvalidArguments,
        Outcome::InputRequired,
        Outcome::TaskCreated,
        Outcome::Preview,
        Outcome::Rejected,
        Outcome::Recovered,
        Outcome::Halted,
        Outcome::Resumed,
        Outcome::NotHalted,
        Outcome::Pruned,
        Outcome::Reloaded,
    ];

    /// The wire form written in audit records.
    pub fn as_str(self) -> &'static str {
        match self {
            Outcome::Committed => "committed",
            Outcome::Replay => "replay",
            Outcome::Observed => "observed",
            Outcome::NotExecuted => "not_executed",
            Outcome::Refused => "refused",
            Outcome::Failed => "failed",
            Outcome::Error => "error",
            Outcome::Conflict => "conflict",
            Outcome::InProgress => "in_progress",
            Outcome::Indeterminate => "indeterminate",
            Outcome::InDoubt => "in_doubt",
            Outcome::Cancelled => "cancelled",
            Outcome::InvalidArguments => "invalid_arguments",
            Outcome::InputRequired => "input_required",
            Outcome::TaskCreated => "task_created",
            Outcome::Preview => "preview",
            Outcome::Rejected => "rejected",
            Outcome::Recovered => "recovered",
            Outcome::Halted => "halted",
            Outcome::Resumed => "resumed",
            Outcome::NotHalted => "not_halted",
            Outcome::Pruned => "pruned",
            Outcome::Reloaded => "reloaded",
        }
    }

    /// The outcome written as `text`, if it is one of this vocabulary.
    pub fn parse(text: &str) -> Option<Outcome> {
        Outcome::ALL.into_iter().find(|o| o.as_str() == text)
    }

    /// Whether an allowed call with this outcome did not do what was asked (the failure ratio of
    /// `audit stats`).
    pub fn is_failure(self) -> bool {
        matches!(
            self,
            Outcome::Failed
                | Outcome::Error
                | Outcome::Conflict
                | Outcome::InDoubt
                | Outcome::Cancelled
                | Outcome::InvalidArguments
        )
    }
}

impl fmt::Display for Outcome {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn wire_names_are_distinct_and_parse_back() {
        let mut seen = std::collections::HashSet::new();
        for outcome in Outcome::ALL {
            assert!(seen.insert(outcome.as_str()), "{outcome} twice");
            assert_eq!(Outcome::parse(outcome.as_str()), Some(outcome));
        }
        assert_eq!(Outcome::parse("executed"), None);
    }
}
