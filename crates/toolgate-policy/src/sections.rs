//! The smaller per-tool and per-principal sections: `effects`, `batch`, `rate_limits`,
//! `versions`, `duplicates`.

use std::fmt;

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

use crate::raw::{RawBatch, RawDuplicates, RawRate, RawVersion};

/// What a tool's effect on the world is (policy key `effects`).
#[derive(
    Debug,
    Clone,
    Copy,
    PartialEq,
    Eq,
    PartialOrd,
    Ord,
    Hash,
    Deserialize,
    Serialize,
    schemars::JsonSchema,
)]
#[serde(rename_all = "lowercase")]
pub enum EffectClass {
    /// Reads only; no effect.
    Read,
    /// Changes stored state.
    Write,
    /// Sends a message to a person.
    Notify,
    /// Wakes a person or a device.
    Wake,
    /// Raises an alert.
    Alert,
    /// Deletes something.
    Delete,
}

impl EffectClass {
    /// Whether calls need a confirmation before they run: notify, wake, alert and delete.
    pub fn needs_confirmation(self) -> bool {
        matches!(
            self,
            EffectClass::Notify | EffectClass::Wake | EffectClass::Alert | EffectClass::Delete
        )
    }

    /// Whether the tool only reads.
    pub fn is_read(self) -> bool {
        self == EffectClass::Read
    }

    /// The class as written in the policy (`read`, `write`, ...).
    pub fn as_str(self) -> &'static str {
        match self {
            EffectClass::Read => "read",
            EffectClass::Write => "write",
            EffectClass::Notify => "notify",
            EffectClass::Wake => "wake",
            EffectClass::Alert => "alert",
            EffectClass::Delete => "delete",
        }
    }
}

impl fmt::Display for EffectClass {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A token bucket: up to `burst` calls at once, refilled at `per_minute` calls per minute
/// (policy keys `rate_limits.tools.<tool>` and `rate_limits.principals.<principal>`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
pub struct Rate {
    /// The bucket size, at least 1.
    pub burst: u32,
    /// The refill rate in calls per minute, at least 1.
    pub per_minute: u32,
}

impl Rate {
    pub(crate) fn compile(raw: &RawRate, at: &str) -> Result<Self, String> {
        for (key, value) in [("burst", raw.burst), ("per_minute", raw.per_minute)] {
            if value == 0 {
                return Err(format!(
                    "{at}.{key} is 0, so no call could ever run; use at least 1 (deny the tool instead to block it)"
                ));
            }
        }
        Ok(Rate {
            burst: raw.burst,
            per_minute: raw.per_minute,
        })
    }
}

/// How a bulk tool's arguments select what it acts on (policy key `batch.<tool>`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Batch {
    #[serde(skip)]
    tool: String,
    ids_argument: String,
    filter_argument: String,
    expected_count_argument: String,
}

/// A batch call that passed [`Batch::check`].
#[derive(Debug, Clone, PartialEq)]
pub enum BatchCall {
    /// The call names its targets: a non-empty list of strings or integers.
    Ids(Vec<Value>),
    /// The call selects its targets with a filter and states how many it expects to hit.
    Filter {
        /// The filter, as passed.
        filter: Value,
        /// How many targets the caller expects the filter to select.
        expected_count: u64,
    },
}

/// Why a batch call's selector is refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum BatchProblem {
    /// Neither the ids nor the filter argument is present (rule `batch.<tool>.selector`).
    NoSelector,
    /// Both are present (rule `batch.<tool>.selector`).
    BothSelectors,
    /// The ids argument is not a non-empty array of strings or integers (rule `batch.<tool>.ids`).
    BadIds,
    /// A filter call lacks the expected-count argument (rule `batch.<tool>.expected_count`).
    MissingExpectedCount,
    /// The expected count is not a non-negative integer (rule `batch.<tool>.expected_count`).
    BadExpectedCount,
    /// An ids call states an expected count different from the number of ids
    /// (rule `batch.<tool>.expected_count`).
    CountMismatch {
        /// How many ids were passed.
        ids: u64,
        /// The expected count passed.
        expected_count: u64,
    },
}

/// A batch call refused by [`Batch::check`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BatchViolation {
    /// The tool.
    pub tool: String,
    /// What is wrong.
    pub problem: BatchProblem,
    ids_argument: String,
    filter_argument: String,
    expected_count_argument: String,
}

impl BatchViolation {
    /// The rule id: `batch.<tool>.selector`, `batch.<tool>.ids` or `batch.<tool>.expected_count`.
    pub fn rule(&self) -> String {
        let key = match self.problem {
            BatchProblem::NoSelector | BatchProblem::BothSelectors => "selector",
            BatchProblem::BadIds => "ids",
            BatchProblem::MissingExpectedCount
            | BatchProblem::BadExpectedCount
            | BatchProblem::CountMismatch { .. } => "expected_count",
        };
        format!("batch.{}.{key}", self.tool)
    }

    /// A message for the caller: starts with `Error:`, names the rule and the fix, never echoes
    /// the arguments.
    pub fn message(&self) -> String {
        let (tool, ids, filter, count) = (
            &self.tool,
            &self.ids_argument,
            &self.filter_argument,
            &self.expected_count_argument,
        );
        let rule = self.rule();
        match self.problem {
            BatchProblem::NoSelector => format!(
                "Error: `{tool}` acts on many targets and needs `{ids}` or `{filter}` (policy rule {rule}); pass `{ids}` as a list of ids, or `{filter}` together with `{count}`"
            ),
            BatchProblem::BothSelectors => format!(
                "Error: `{tool}` takes either `{ids}` or `{filter}`, not both (policy rule {rule}); pass only one of them"
            ),
            BatchProblem::BadIds => format!(
                "Error: `{ids}` of `{tool}` must be a non-empty list of string or integer ids (policy rule {rule}); pass at least one id"
            ),
            BatchProblem::MissingExpectedCount => format!(
                "Error: a `{filter}` call of `{tool}` must state `{count}` (policy rule {rule}); pass `{count}` as the number of targets you expect the filter to select"
            ),
            BatchProblem::BadExpectedCount => format!(
                "Error: `{count}` of `{tool}` must be a non-negative integer (policy rule {rule}); pass the number of targets you expect"
            ),
            BatchProblem::CountMismatch {
                ids: n,
                expected_count,
            } => format!(
                "Error: `{tool}` was given {n} ids but `{count}` {expected_count} (policy rule {rule}); pass a `{count}` equal to the number of ids or omit it"
            ),
        }
    }
}

impl fmt::Display for BatchViolation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message())
    }
}

impl Batch {
    pub(crate) fn compile(tool: &str, raw: RawBatch) -> Result<Self, String> {
        let batch = Batch {
            tool: tool.to_owned(),
            ids_argument: raw.ids_argument.unwrap_or_else(|| "ids".to_owned()),
            filter_argument: raw.filter_argument.unwrap_or_else(|| "filter".to_owned()),
            expected_count_argument: raw
                .expected_count_argument
                .unwrap_or_else(|| "expected_count".to_owned()),
        };
        let names = [
            ("ids_argument", &batch.ids_argument),
            ("filter_argument", &batch.filter_argument),
            ("expected_count_argument", &batch.expected_count_argument),
        ];
        for (key, name) in names {
            if name.is_empty() {
                return Err(format!(
                    "batch.{tool}.{key} is empty; name the argument or remove the key to use the default"
                ));
            }
        }
        for (i, (key_a, a)) in names.iter().enumerate() {
            for (key_b, b) in &names[i + 1..] {
                if a == b {
                    return Err(format!(
                        "batch.{tool}.{key_a} and batch.{tool}.{key_b} both name `{a}`; give each its own argument name"
                    ));
                }
            }
        }
        Ok(batch)
    }

    /// The argument holding the list of ids (default `ids`).
    pub fn ids_argument(&self) -> &str {
        &self.ids_argument
    }

    /// The argument holding the filter (default `filter`).
    pub fn filter_argument(&self) -> &str {
        &self.filter_argument
    }

    /// The argument holding the expected count of a filter call (default `expected_count`).
    pub fn expected_count_argument(&self) -> &str {
        &self.expected_count_argument
    }

    /// Checks a call's selector: exactly one of the ids argument (a non-empty array of strings or
    /// integers) or the filter argument (any JSON value); a filter call also needs the expected
    /// count (a non-negative integer). An ids call may state the expected count, which must then
    /// equal the number of ids. An argument whose value is JSON `null` counts as absent.
    pub fn check(
        &self,
        arguments: Option<&Map<String, Value>>,
    ) -> Result<BatchCall, BatchViolation> {
        let get = |name: &str| {
            arguments
                .and_then(|args| args.get(name))
                .filter(|value| !value.is_null())
        };
        let fail = |problem| BatchViolation {
            tool: self.tool.clone(),
            problem,
            ids_argument: self.ids_argument.clone(),
            filter_argument: self.filter_argument.clone(),
            expected_count_argument: self.expected_count_argument.clone(),
        };
        let count = match get(&self.expected_count_argument) {
            None => None,
            Some(value) => Some(
                value
                    .as_u64()
                    .ok_or_else(|| fail(BatchProblem::BadExpectedCount))?,
            ),
        };
        match (get(&self.ids_argument), get(&self.filter_argument)) {
            (None, None) => Err(fail(BatchProblem::NoSelector)),
            (Some(_), Some(_)) => Err(fail(BatchProblem::BothSelectors)),
            (Some(ids), None) => {
                let Value::Array(ids) = ids else {
                    return Err(fail(BatchProblem::BadIds));
                };
                let well_formed = ids
                    .iter()
                    .all(|id| id.is_string() || id.is_u64() || id.is_i64());
                if ids.is_empty() || !well_formed {
                    return Err(fail(BatchProblem::BadIds));
                }
                let n = u64::try_from(ids.len()).unwrap_or(u64::MAX);
                if let Some(expected_count) = count
                    && expected_count != n
                {
                    return Err(fail(BatchProblem::CountMismatch {
                        ids: n,
                        expected_count,
                    }));
                }
                Ok(BatchCall::Ids(ids.clone()))
            }
            (None, Some(filter)) => match count {
                None => Err(fail(BatchProblem::MissingExpectedCount)),
                Some(expected_count) => Ok(BatchCall::Filter {
                    filter: filter.clone(),
                    expected_count,
                }),
            },
        }
    }
}

/// A tool whose calls carry the version of the object they change (policy key `versions.<tool>`):
/// the gate refuses a call whose version is not the object's current one.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Versioned {
    argument: String,
}

impl Versioned {
    pub(crate) fn compile(tool: &str, raw: RawVersion) -> Result<Self, String> {
        if raw.argument.is_empty() {
            return Err(format!(
                "versions.{tool}.argument is empty; name the argument that carries the version the caller read (e.g. \"version\")"
            ));
        }
        Ok(Versioned {
            argument: raw.argument,
        })
    }

    /// The argument holding the version the caller read (a string).
    pub fn argument(&self) -> &str {
        &self.argument
    }
}

/// A create tool's duplicate guard (policy key `duplicates.<tool>`): the arguments that form its
/// business key, and the tool that updates an existing object instead.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct DuplicateGuard {
    key: Vec<String>,
    update_tool: String,
}

impl DuplicateGuard {
    pub(crate) fn compile(tool: &str, raw: RawDuplicates) -> Result<Self, String> {
        if raw.key.is_empty() {
            return Err(format!(
                "duplicates.{tool}.key is empty; list the arguments that identify the object, such as [\"guest\", \"date\"]"
            ));
        }
        for (index, field) in raw.key.iter().enumerate() {
            if field.is_empty() {
                return Err(format!(
                    "duplicates.{tool}.key[{index}] is empty; name an argument of `{tool}`"
                ));
            }
            if raw.key[..index].contains(field) {
                return Err(format!(
                    "duplicates.{tool}.key lists `{field}` twice; remove one of them"
                ));
            }
        }
        if raw.update_tool == tool {
            return Err(format!(
                "duplicates.{tool}.update_tool names `{tool}` itself; name the tool that updates an existing object"
            ));
        }
        Ok(DuplicateGuard {
            key: raw.key,
            update_tool: raw.update_tool,
        })
    }

    /// The arguments whose values identify the object, in the order written.
    pub fn key(&self) -> &[String] {
        &self.key
    }

    /// The tool that changes an existing object (named in the refusal of a duplicate).
    pub fn update_tool(&self) -> &str {
        &self.update_tool
    }
}
